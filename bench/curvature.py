"""Benchmark of the curvature kernels on the reference Transformer (bench/_reference.py).

Measures in one run, interleaving the variants and reporting medians:

- the gradient (JAX jitted, PyTorch backward), the baseline every ratio is relative to;
- Hutchinson per probe: ``hutchinson_trace(hvp(loss, params, batch), ...)`` jitted (target
  <= 2.0 x one JAX gradient), PyHessian's double-backprop loop (``hessian(...).trace``, one
  graph with ``create_graph`` then one backward per probe; target: ours >= 1.3 x faster per
  probe) and matfree's Monte Carlo estimator on the same HVP (target: ours no slower);
- the JAX and PyTorch HVPs on the same vector (agreement to float32 precision, against a
  PyTorch float64 reference);
- peak resident memory of the jitted Hutchinson program with many vs 16 probes, each in a fresh
  subprocess (target <= 1.5 x);
- Hutch++ vs Hutchinson median relative error at 99 products on a synthetic matrix with 10
  dominant eigenvalues plus a noisy bulk (target >= 10 x lower);
- ``kernels`` (issue 22's ratios at this size): Hutchinson per probe with each way of forming
  $v^\top H v$ (``mode="auto"``, ``"forms"``, ``"products"``), Lanczos per step
  (``top_eigenvalues``, 10 steps, full and float16 basis), worst-case sharpness per ascent
  step (5 steps) and the sharpness decomposition per pair + probe (forms vs products), each
  against one gradient: interleaved timings in one process, each kernel call beside the
  median of five gradient calls timed just before it (``paired_times``), plus XLA's
  load-independent ``cost_analysis()`` (GFLOP, bytes accessed; a loop body counted once) and
  ``memory_analysis()`` temporaries of each compiled program.

Runs unchanged on whatever ``jax.devices()`` holds: on a GPU the PyTorch twin and PyHessian run
on ``cuda`` (when PyTorch sees one), and memory is the device's peak (``memory_stats()``)
instead of the host's RSS. ``main(argv)`` returns the summary (for ``bench/accelerator.py``).

Prints one JSON record per configuration, then a JSON summary of the ratios.

Run:  .venv/bin/python bench/curvature.py            (full: 64 probes, 1024-probe memory run)
      .venv/bin/python bench/curvature.py --quick    (fewer repeats/probes, a couple of minutes)
      .venv/bin/python bench/curvature.py --only kernels   (issue 22's ratios alone)
Needs the ``bench`` extra (torch, matfree, psutil); pyhessian is used when installed, else
its loop is reproduced verbatim (``_pyhessian_trace``).

Writes each part's records, conditions and table to ``bench/results/curvature[_quick].json``
and the tables to ``.md`` through the quiet-machine guard (``bench/_quiet.py``): the timed
parts (``speed``, ``kernels``) only on a quiet machine unless ``--allow-load``; the untimed ones
(``hvp``, ``hutchpp``, ``memory``) always.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from bench import _quiet as quiet
from bench import _reference as ref
from kernels.curvature import hutchinson_trace, hutchpp_trace, hvp, top_eigenvalues
from kernels.sharpness import Perturbation, sharpness_decomposition, worst_case_sharpness

_RECORDS: list[dict] = []  # every record this run printed, for the results file


def emit(record: dict) -> None:
    _RECORDS.append(record)
    print(json.dumps(record), flush=True)


def timed(fn, *args):
    """Seconds for one call, blocking on JAX results."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


# --------------------------------------------------------------------------- JAX programs


def jax_inputs():
    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    inputs, targets = (jnp.asarray(a, dtype=jnp.int32) for a in ref.make_batch())
    return params, inputs, targets


@jax.jit
def jax_grad(params, inputs, targets):
    return jax.grad(ref.jax_loss)(params, inputs, targets)


def batch_loss(params, batch):
    """The reference loss as ``loss_fn(params, batch)`` (one function object for every call)."""
    inputs, targets = batch
    return ref.jax_loss(params, inputs, targets)


@partial(jax.jit, static_argnames=("num_probes", "chunk_size"))
def ours_trace(params, inputs, targets, key, *, num_probes, chunk_size=None):
    matvec = hvp(batch_loss, params, (inputs, targets))
    return hutchinson_trace(matvec, params, key, num_samples=num_probes, chunk_size=chunk_size)


@jax.jit
def jax_hvp(params, inputs, targets, v):
    return hvp(batch_loss, params, (inputs, targets))(v)


def matfree_trace_fn(num_probes):
    from matfree import stochtrace

    integrand = stochtrace.monte_carlo_trace()

    @jax.jit
    def run(params, inputs, targets, key):
        sampler = stochtrace.sampler_signs(params, num=num_probes)
        estimate = stochtrace.estimator_monte_carlo(integrand, sampler)
        # linearised once, as our kernels do with the operator (op(v) would linearise per probe)
        product, _ = hvp(batch_loss, params, (inputs, targets)).linearize()
        return estimate(product, key)

    return run


# --------------------------------------------------------------------------- PyTorch


def torch_setup():
    import torch

    torch.manual_seed(0)
    device = ref.torch_device()
    model = ref.torch_model(ref.init_params()).to(device)
    inputs, targets = (torch.as_tensor(a).to(device) for a in ref.make_batch())
    return model, inputs, targets


def torch_grad(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    ref.torch_criterion(model(inputs), targets).backward()
    ref.torch_sync(inputs.device.type)
    return model.wq.grad


def _pyhessian_trace(model, inputs, targets, num_probes):
    """PyHessian 0.1's ``hessian(...).trace`` single-batch path, line for line."""
    import torch

    model.eval()
    loss = ref.torch_criterion(model(inputs), targets)
    loss.backward(create_graph=True)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [0.0 if p.grad is None else p.grad + 0.0 for p in params]
    trace_vhv = []
    for _ in range(num_probes):
        model.zero_grad()
        v = [torch.randint_like(p, high=2) for p in params]
        for v_i in v:
            v_i[v_i == 0] = -1
        hv = torch.autograd.grad(grads, params, grad_outputs=v, only_inputs=True, retain_graph=True)
        trace_vhv.append(sum(torch.sum(x * y) for x, y in zip(hv, v, strict=True)).cpu().item())
    return trace_vhv


def pyhessian_trace(model, inputs, targets, num_probes):
    """PyHessian's Hutchinson: build the create_graph gradient once, one backward per probe."""
    for p in model.parameters():  # stale .grad would be added into the graph
        p.grad = None
    try:
        from pyhessian import hessian
    except ImportError:
        out = _pyhessian_trace(model, inputs, targets, num_probes)
    else:
        cuda = inputs.device.type == "cuda"
        h = hessian(model, ref.torch_criterion, data=(inputs, targets), cuda=cuda)
        out = h.trace(maxIter=num_probes, tol=-float("inf"))  # tol=-inf: exactly maxIter probes
    for p in model.parameters():
        p.grad = None
    assert len(out) == num_probes
    return float(np.mean(out))


def torch_hvp(model, inputs, targets, v_np):
    import torch

    params = list(model.parameters())
    loss = ref.torch_criterion(model(inputs), targets)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    dtype, device = params[0].dtype, params[0].device
    vs = [torch.as_tensor(v_np[name], dtype=dtype, device=device) for name, _ in ref.SHAPES]
    hv = torch.autograd.grad(grads, params, grad_outputs=vs)
    return {
        name: h.detach().double().cpu().numpy() for (name, _), h in zip(ref.SHAPES, hv, strict=True)
    }


# --------------------------------------------------------------------------- sections


def bench_speed(args) -> dict:
    import torch

    torch.set_num_threads(2)
    params, inputs, targets = jax_inputs()
    model, t_inputs, t_targets = torch_setup()
    probes, mf_probes = args.probes, args.matfree_probes
    key = jax.random.key(0)
    matfree_run = matfree_trace_fn(mf_probes)

    # compile (separately reported)
    compile_s = {}
    for name, fn, fargs in [
        ("jax_grad", jax_grad, (params, inputs, targets)),
        ("ours_trace", partial(ours_trace, num_probes=probes), (params, inputs, targets, key)),
        (
            "ours_trace_matfree_probes",
            partial(ours_trace, num_probes=mf_probes),
            (params, inputs, targets, key),
        ),
        ("matfree_trace", matfree_run, (params, inputs, targets, key)),
    ]:
        compile_s[name] = timed(fn, *fargs)
    emit({"record": "compile_and_first_call_s", **compile_s})
    torch_grad(model, t_inputs, t_targets)
    pyhessian_trace(model, t_inputs, t_targets, 2)

    # interleaved timings
    times: dict[str, list[float]] = {
        k: [] for k in ("jax_grad", "torch_grad", "ours_trace", "pyhessian", "ours_mf", "matfree")
    }
    for rep in range(args.reps):
        k = jax.random.fold_in(key, rep + 1)
        # PyTorch first, then a pause so its spinning OpenMP threads park before XLA runs
        start = time.perf_counter()
        torch_grad(model, t_inputs, t_targets)
        times["torch_grad"].append(time.perf_counter() - start)
        start = time.perf_counter()
        pyhessian_trace(model, t_inputs, t_targets, probes)
        times["pyhessian"].append(time.perf_counter() - start)
        time.sleep(0.5)
        times["jax_grad"].append(
            statistics.median(timed(jax_grad, params, inputs, targets) for _ in range(3))
        )
        times["ours_trace"].append(
            timed(partial(ours_trace, num_probes=probes), params, inputs, targets, k)
        )
        times["ours_mf"].append(
            timed(partial(ours_trace, num_probes=mf_probes), params, inputs, targets, k)
        )
        times["matfree"].append(timed(matfree_run, params, inputs, targets, k))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        emit({"record": "time_s", "variant": k, "median": med[k], "all": [round(x, 4) for x in v]})

    # both estimators see the same problem: the traces agree within their Monte Carlo error
    ours = ours_trace(params, inputs, targets, key, num_probes=probes)
    theirs = pyhessian_trace(model, t_inputs, t_targets, probes)
    emit(
        {
            "record": "trace_values",
            "ours_mean": float(ours.mean),
            "ours_stderr": float(ours.stderr),
            "pyhessian_mean": theirs,
        }
    )

    grad = med["jax_grad"]
    return {
        "num_params": ref.num_params(),
        "num_probes": probes,
        "jax_grad_ms": 1e3 * grad,
        "torch_grad_ms": 1e3 * med["torch_grad"],
        "compile_and_first_call_s": compile_s,
        "ours_per_probe_ms": 1e3 * med["ours_trace"] / probes,
        "ours_per_probe_over_jax_grad": med["ours_trace"] / probes / grad,
        "pyhessian_per_probe_ms": 1e3 * med["pyhessian"] / probes,
        "pyhessian_per_probe_over_ours": med["pyhessian"] / med["ours_trace"],
        "matfree_probes": mf_probes,
        "matfree_per_probe_ms": 1e3 * med["matfree"] / mf_probes,
        "ours_per_probe_ms_at_matfree_probes": 1e3 * med["ours_mf"] / mf_probes,
        "matfree_over_ours": med["matfree"] / med["ours_mf"],
    }


def bench_hvp_agreement() -> dict:
    import torch

    params, inputs, targets = jax_inputs()
    rng = np.random.default_rng(2)
    v = {n: rng.choice([-1.0, 1.0], size=s).astype(np.float32) for n, s in ref.SHAPES}
    ours = jax_hvp(params, inputs, targets, {n: jnp.asarray(a) for n, a in v.items()})
    ours = np.concatenate([np.asarray(ours[n], np.float64).ravel() for n, _ in ref.SHAPES])
    model, t_inputs, t_targets = torch_setup()
    t32 = torch_hvp(model, t_inputs, t_targets, v)
    model64 = ref.torch_model(ref.init_params(), dtype=torch.float64).to(t_inputs.device)
    t64 = torch_hvp(model64, t_inputs, t_targets, v)
    t32 = np.concatenate([t32[n].ravel() for n, _ in ref.SHAPES])
    t64 = np.concatenate([t64[n].ravel() for n, _ in ref.SHAPES])

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    out = {
        "jax32_vs_torch32": rel(ours, t32),
        "jax32_vs_torch64": rel(ours, t64),
        "torch32_vs_torch64": rel(t32, t64),
        "hvp_norm": float(np.linalg.norm(t64)),
    }
    emit({"record": "hvp_agreement_rel_l2", **out})
    return out


MEMORY_CHILD = """
import resource, sys, json
sys.path.insert(0, {root!r})
import jax
from bench import _quiet as quiet
from bench import _reference as ref
from bench.curvature import jax_inputs, ours_trace
params, inputs, targets = jax_inputs()
est = ours_trace(params, inputs, targets, jax.random.key(0), num_probes={probes})
jax.block_until_ready(est)
# on an accelerator the device's peak, on a CPU the process's peak RSS
peak = ref.device_peak_mb() if ref.on_accelerator() else None
rss = peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"probes": {probes}, "maxrss_mb": rss, "mean": float(est.mean)}}))
"""


def bench_memory(args) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rss = {}
    for probes in (16, args.memory_probes):
        code = MEMORY_CHILD.format(root=root, probes=probes)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        rec["wall_s"] = time.perf_counter() - start
        emit({"record": "peak_memory", **rec})
        rss[probes] = rec["maxrss_mb"]
    return {
        "maxrss_mb_16": rss[16],
        f"maxrss_mb_{args.memory_probes}": rss[args.memory_probes],
        "memory_ratio": rss[args.memory_probes] / rss[16],
        "memory_probes": args.memory_probes,
    }


def bench_hutchpp(args) -> dict:
    n, budget, trials = 2000, 99, args.trials
    key_q, key_bulk, key_trials = jax.random.split(jax.random.key(3), 3)
    dominant = 100.0 * jnp.arange(10, 0, -1, dtype=jnp.float32)  # 1000, 900, ..., 100
    bulk = 1.0 + 0.5 * jax.random.normal(key_bulk, (n - 10,), dtype=jnp.float32)
    eigs = jnp.concatenate([dominant, bulk])
    q, _ = jnp.linalg.qr(jax.random.normal(key_q, (n, n), dtype=jnp.float32))
    a = (q * eigs) @ q.T
    a = 0.5 * (a + a.T)
    exact = float(jnp.sum(eigs))

    def mv(v):
        return a @ v

    keys = jax.random.split(key_trials, trials)
    pp = jax.jit(jax.vmap(lambda k: hutchpp_trace(mv, n, k, num_matvecs=budget).mean))
    hu = jax.jit(jax.vmap(lambda k: hutchinson_trace(mv, n, k, num_samples=budget).mean))
    err_pp = np.abs(np.asarray(pp(keys)) - exact) / abs(exact)
    err_hu = np.abs(np.asarray(hu(keys)) - exact) / abs(exact)
    out = {
        "n": n,
        "num_matvecs": budget,
        "trials": trials,
        "hutchinson_median_rel_err": float(np.median(err_hu)),
        "hutchpp_median_rel_err": float(np.median(err_pp)),
        "hutchpp_improvement": float(np.median(err_hu) / np.median(err_pp)),
    }
    emit({"record": "hutchpp_vs_hutchinson", **out})
    return out


# --------------------------------------------------------------------------- issue 22's ratios

WORST_RADIUS = 0.05
DECOMP_SIGMA = 1e-2


def kernel_programs(args) -> dict:
    """``name -> (fn(params, batch, key), units)``: each kernel and how many gradient-sized
    units it runs (probes, Lanczos steps, value-and-grads of the ascent, pairs + probes)."""
    probes, steps, ascent, pairs = args.probes, 10, 5, 8

    def hutch(mode):
        return lambda p, b, k: (
            hutchinson_trace(hvp(batch_loss, p, b), p, k, num_samples=probes, mode=mode).mean
        )

    def lanczos(basis_dtype):
        return lambda p, b, k: top_eigenvalues(
            hvp(batch_loss, p, b), p, k, k=1, num_steps=steps, basis_dtype=basis_dtype
        )

    def decomposition(mode):
        return lambda p, b, k: (
            sharpness_decomposition(
                batch_loss,
                p,
                b,
                k,
                perturbation=Perturbation("gaussian", DECOMP_SIGMA),
                num_samples=pairs,
                num_probes=pairs,
                mode=mode,
            ).remainder.mean
        )

    return {
        "grad": (lambda p, b, k: jax.value_and_grad(batch_loss)(p, b), 1),
        "hutchinson_auto": (hutch("auto"), probes),
        "hutchinson_forms": (hutch("forms"), probes),
        "hutchinson_products": (hutch("products"), probes),
        "lanczos": (lanczos(None), steps),
        "lanczos_float16_basis": (lanczos("float16"), steps),
        "worst_case": (
            lambda p, b, k: (
                worst_case_sharpness(
                    batch_loss,
                    p,
                    b,
                    k,
                    perturbation=Perturbation("l2_ball", WORST_RADIUS),
                    num_steps=ascent,
                ).value
            ),
            ascent + 1,
        ),
        "decomposition_forms": (decomposition("forms"), 2 * pairs),
        "decomposition_products": (decomposition("products"), 2 * pairs),
    }


#: Gradient calls timed right before each kernel call; their median is that call's unit.
GRAD_CALLS = 5


def paired_times(compiled: dict, args: tuple, key, *, reps: int):
    """Per program (``"grad"`` excluded), its call times and beside each the median of
    :data:`GRAD_CALLS` gradient calls timed just before it, for ``reps`` rounds.

    A gradient here takes tens of milliseconds and a kernel seconds: one gradient call per round
    made the gradient, not the kernels, the noisy side of every ratio (33-39 ms from run to run
    while the kernels' own seconds stayed put). Timing the unit beside each kernel call, several
    times, lets each ratio see the machine the kernel saw.
    """
    times = {name: [] for name in compiled if name != "grad"}
    grads = {name: [] for name in times}
    for rep in range(reps):
        k = jax.random.fold_in(key, rep + 1)
        for name in times:
            unit = [timed(compiled["grad"], *args, k) for _ in range(GRAD_CALLS)]
            grads[name].append(statistics.median(unit))
            times[name].append(timed(compiled[name], *args, k))
    return times, grads


def paired_ratio(times, grads, units: int) -> float:
    """Median over rounds of (call seconds / units / that round's gradient seconds)."""
    return statistics.median(t / units / g for t, g in zip(times, grads, strict=True))


def bench_kernels(args) -> dict:
    """Per-unit time over one gradient (each kernel call beside its own gradient timings,
    medians) and XLA's costs of each program."""
    params, inputs, targets = jax_inputs()
    batch, key = (inputs, targets), jax.random.key(0)
    programs = kernel_programs(args)
    compiled, costs = {}, {}
    for name, (fn, units) in programs.items():
        start = time.perf_counter()
        compiled[name] = jax.jit(fn).lower(params, batch, key).compile()
        jax.block_until_ready(compiled[name](params, batch, key))
        costs[name] = {"units": units, "compile_and_first_s": time.perf_counter() - start}
        costs[name].update(ref.xla_costs(compiled[name]))
        emit({"record": "kernel_program", "name": name, **costs[name]})
    times, grads = paired_times(compiled, (params, batch), key, reps=args.reps)
    grad = statistics.median(t for ts in grads.values() for t in ts)
    grad_costs = costs["grad"]
    out = {"kernels_grad_ms": 1e3 * grad}
    for name, (_, units) in programs.items():
        if name == "grad":
            continue
        rec = {
            "record": "kernel_ratio",
            "name": name,
            "units": units,
            "per_unit_over_grad": paired_ratio(times[name], grads[name], units),
            "all_s": [round(t, 4) for t in times[name]],
            "grad_s": [round(t, 5) for t in grads[name]],
        }
        for field in ("gflop", "gb_accessed", "xla_temp_mb"):
            if field in costs[name] and grad_costs.get(field):
                rec[f"{field}_over_grad"] = costs[name][field] / grad_costs[field]
        emit(rec)
        out[f"{name}_per_unit_over_grad"] = rec["per_unit_over_grad"]
        if "xla_temp_mb_over_grad" in rec:
            out[f"{name}_xla_temp_over_grad"] = rec["xla_temp_mb_over_grad"]
    return out


# --------------------------------------------------------------------------- tables


def speed_table(s: dict) -> str:
    """Per-probe times against one gradient and against the peers (interleaved, medians)."""
    c = s.get("compile_and_first_call_s", {})
    rows = [
        "| what | target | measured |",
        "|---|---|---|",
        f"| one JAX gradient (jitted) / one PyTorch `backward` | | {s['jax_grad_ms']:.1f} ms / "
        f"{s['torch_grad_ms']:.1f} ms |",
        f"| Hutchinson per probe, jitted `hutchinson_trace(hvp(...))`, {s['num_probes']} probes "
        f"/ one JAX gradient | <= 2.0 | {s['ours_per_probe_ms']:.1f} / {s['jax_grad_ms']:.1f} ms "
        f"= **{s['ours_per_probe_over_jax_grad']:.2f}** |",
        f"| PyHessian `hessian(...).trace` per probe ({s['num_probes']} probes, incl. its "
        f"create_graph setup) / ours | >= 1.3 | {s['pyhessian_per_probe_ms']:.1f} / "
        f"{s['ours_per_probe_ms']:.1f} ms = **{s['pyhessian_per_probe_over_ours']:.2f}** |",
        f"| matfree `estimator_monte_carlo` on the same HVP / ours, {s['matfree_probes']} probes "
        f"each | >= 1.0 | {s['matfree_per_probe_ms']:.1f} / "
        f"{s['ours_per_probe_ms_at_matfree_probes']:.1f} ms = **{s['matfree_over_ours']:.2f}** |",
    ]
    if "jax_grad" in c and "ours_trace" in c:
        rows.append(
            f"| compile + first call: gradient / {s['num_probes']}-probe Hutchinson program | | "
            f"{c['jax_grad']:.1f} s / {c['ours_trace']:.1f} s |"
        )
    return "\n".join(rows)


def memory_table(s: dict) -> str:
    p = s["memory_probes"]
    return (
        "| what | target | measured |\n|---|---|---|\n"
        f"| peak memory, {p:,} probes / 16 probes (fresh processes) | <= 1.5 | "
        f"{s[f'maxrss_mb_{p}']:,.0f} / {s['maxrss_mb_16']:,.0f} MB = **{s['memory_ratio']:.2f}** |"
    )


def hvp_table(s: dict) -> str:
    return (
        "| what | target | measured |\n|---|---|---|\n"
        "| HVP, JAX f32 vs PyTorch f32 on one Rademacher vector (relative L2) | f32 precision | "
        f"{s['jax32_vs_torch32']:.1e} (vs PyTorch f64: JAX {s['jax32_vs_torch64']:.1e}, "
        f"PyTorch f32 {s['torch32_vs_torch64']:.1e}) |"
    )


def hutchpp_table(s: dict) -> str:
    return (
        "| what | target | measured |\n|---|---|---|\n"
        f"| Hutch++ / Hutchinson median relative error, {s['num_matvecs']} products, "
        f"n = {s['n']}, eigenvalues 1000, 900, ..., 100 plus a bulk 1 + 0.5 N(0,1), "
        f"{s['trials']} trials | >= 10x lower | {100 * s['hutchpp_median_rel_err']:.3f}% vs "
        f"{100 * s['hutchinson_median_rel_err']:.1f}%: **{s['hutchpp_improvement']:.0f}x** |"
    )


KERNEL_ROWS = {
    "hutchinson_auto": 'Hutchinson per probe, `mode="auto"`',
    "hutchinson_forms": 'Hutchinson per probe, `mode="forms"`',
    "hutchinson_products": 'Hutchinson per probe, `mode="products"`',
    "lanczos": "Lanczos (`top_eigenvalues`) per step, 10 steps",
    "lanczos_float16_basis": "the same, float16 basis",
    "worst_case": "worst-case sharpness per ascent step (5 steps)",
    "decomposition_forms": "sharpness decomposition per pair + probe, forms",
    "decomposition_products": "sharpness decomposition per pair + probe, products",
}


def kernels_table(s: dict) -> str:
    """Issue 22's ratios: time per unit over one gradient (interleaved) and XLA's temporaries."""
    rows = [
        f"One gradient {s['kernels_grad_ms']:.1f} ms.",
        "",
        "| kernel | time per unit / one gradient | XLA temporaries / gradient's |",
        "|---|---|---|",
    ]
    for name, label in KERNEL_ROWS.items():
        if f"{name}_per_unit_over_grad" not in s:
            continue
        temp = s.get(f"{name}_xla_temp_over_grad")
        rows.append(
            f"| {label} | **{s[f'{name}_per_unit_over_grad']:.2f}** | "
            f"{'' if temp is None else f'{temp:.2f}'} |"
        )
    return "\n".join(rows)


TABLES = {  # section -> (table, timed)
    "speed": (speed_table, True),
    "kernels": (kernels_table, True),
    "hvp": (hvp_table, False),
    "hutchpp": (hutchpp_table, False),
    "memory": (memory_table, False),
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and probes")
    parser.add_argument(
        "--only", choices=["speed", "hvp", "memory", "hutchpp", "kernels"], action="append"
    )
    parser.add_argument("--memory-probes", type=int, help="probes of the large memory run")
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    monitor = quiet.Monitor()
    args.reps = 3 if args.quick else 7
    args.probes = 32 if args.quick else 64
    args.matfree_probes = 16
    args.memory_probes = args.memory_probes or (128 if args.quick else 1024)
    args.trials = 50 if args.quick else 200
    sections = args.only or ["hvp", "hutchpp", "speed", "kernels", "memory"]
    emit(
        {
            "record": "setup",
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "device": str(jax.devices()[0]),
            "cpu_count": os.cpu_count(),
            "load_avg_1min": os.getloadavg()[0],
            "quick": args.quick,
        }
    )
    runs = {
        "hvp": bench_hvp_agreement,
        "hutchpp": lambda: bench_hutchpp(args),
        "speed": lambda: bench_speed(args),
        "kernels": lambda: bench_kernels(args),
        "memory": lambda: bench_memory(args),
    }
    summary, parts = {}, {}
    for name, run in runs.items():
        if name not in sections:
            continue
        start = len(_RECORDS)
        out = run()
        summary.update(out)
        table, timed = TABLES[name]
        parts[name] = quiet.Section(out, table(out), _RECORDS[start:], timed=timed)
    summary["load_avg_1min_end"] = os.getloadavg()[0]
    summary["maxrss_mb_this_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conditions = monitor.stop()
    summary["conditions"] = conditions.to_dict()
    print(json.dumps({"record": "summary", **summary}, indent=1), flush=True)
    for part in parts.values():
        print(part.table, flush=True)
    quiet.finish("curvature", parts, conditions, args)
    return summary


if __name__ == "__main__":
    main()
