"""Benchmark of kernels.sharpness on the reference Transformer (float32, any device).

Measured in one run, variants interleaved (A B C A B C ...), compile time reported separately,
medians over repeats:

- ``average``: ``average_sharpness`` with K loss evaluations (``num_samples`` = K/2 pairs)
  against (a) the floor, K plain forward evaluations of the loss at K different pre-drawn
  parameter vectors in one vmapped batch (``jit(vmap(loss))``), (b) the same K forwards as a
  sequential ``lax.map``, and (c) the common PyTorch research-script loop: for each sample, add
  Gaussian noise to every weight in place (``p.add_(noise)``), evaluate the loss under
  ``no_grad``, subtract the noise again. Same weights, same K.
- ``worst``: ``worst_case_sharpness`` with S ascent steps (l2 ball) against S gradient
  evaluations (S calls of a jitted gradient, and S gradients in one compiled ``fori_loop``).
- ``memory``: peak RSS of a fresh process running ``average_sharpness`` with 4096 and with 64
  perturbations (each in its own subprocess; the RSS includes the compiler's).

Runs unchanged on whatever ``jax.devices()`` holds: the PyTorch loop runs on ``cuda`` when
PyTorch sees a GPU, and memory is the device's peak (``memory_stats()``) on an accelerator
instead of the host's RSS. The worst-case run also reports XLA's cost and memory analysis of
its program against one gradient's (issue 22: <= 1.1 gradients per ascent step, <= 1.3x a
gradient's memory). ``main(argv)`` returns the ratios (for ``bench/accelerator.py``).

Usage (one command, prints one JSON record per configuration, then the ratios):

    python bench/sharpness.py            # full: K = 256, S = 20, memory 4096 vs 64
    python bench/sharpness.py --quick    # K = 64, memory 1024 vs 64, fewer repeats

Writes each part's records, conditions and table to ``bench/results/sharpness[_quick].json``
and the tables to ``.md`` through the quiet-machine guard (``bench/_quiet.py``): the timed parts
(``average``, ``worst``) only on a quiet machine unless ``--allow-load``; ``memory`` always.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import _quiet as quiet  # noqa: E402
import _reference as ref  # noqa: E402

SIGMA = 1e-2


_RECORDS: list[dict] = []  # every record this run printed, for the results file


def emit(record: dict) -> None:
    _RECORDS.append(record)
    print(json.dumps(record), flush=True)


def jax_setup():
    """Weights and batch as device arrays; everything is passed to jit as arguments (closing over
    them would make XLA constant-fold the unperturbed forward pass at compile time)."""
    import jax
    import jax.numpy as jnp

    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    inputs, targets = (jnp.asarray(a) for a in ref.make_batch())
    return jax, params, (inputs, targets)


def make_loss(data):
    inputs, targets = data
    return lambda p: ref.jax_loss(p, inputs, targets)


def batch_loss(params, batch):
    """The reference loss as ``loss_fn(params, batch)``: one callable for every batch."""
    return ref.jax_loss(params, *batch)


def timed(fn, *args):
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def bench_average(num: int, repeats: int, chunks: list[int]) -> dict:
    import numpy as np
    import torch

    from kernels.sharpness import Perturbation, average_sharpness

    jax, params, data = jax_setup()
    pert = Perturbation("gaussian", SIGMA)
    variants = {}
    for chunk in chunks:
        variants[f"jax_average_sharpness_chunk{chunk}"] = (
            jax.jit(
                lambda params, data, key, chunk=chunk: average_sharpness(
                    batch_loss,
                    params,
                    data,
                    key,
                    perturbation=pert,
                    num_samples=num // 2,
                    chunk_size=chunk,
                )
            ),
            (params, data, jax.random.key(0)),
        )
    # the floor: num forwards at different (pre-drawn) parameters, one vmapped batch
    keys = jax.random.split(jax.random.key(1), len(params))
    stacked = {
        name: value[None] + SIGMA * jax.random.normal(k, (num, *value.shape), value.dtype)
        for (name, value), k in zip(params.items(), keys, strict=True)
    }
    variants["jax_floor_vmap_forwards"] = (
        jax.jit(lambda s, data: jax.vmap(make_loss(data))(s)),
        (stacked, data),
    )
    variants["jax_sequential_forwards"] = (
        jax.jit(lambda s, data: jax.lax.map(make_loss(data), s)),
        (stacked, data),
    )

    # PyTorch: perturb in place, evaluate under no_grad, restore
    device = ref.torch_device()
    model = ref.torch_model(ref.init_params()).to(device)
    t_inputs, t_targets = (torch.as_tensor(a).to(device) for a in ref.make_batch())
    gen = torch.Generator(device=device).manual_seed(0)

    def torch_loop(count=num):
        values = []
        with torch.no_grad():
            base = ref.torch_criterion(model(t_inputs), t_targets)
            for _ in range(count):
                noises = []
                for p in model.parameters():
                    noise = torch.randn(p.shape, generator=gen, device=device) * SIGMA
                    p.add_(noise)
                    noises.append(noise)
                values.append(ref.torch_criterion(model(t_inputs), t_targets) - base)
                for p, noise in zip(model.parameters(), noises, strict=True):
                    p.sub_(noise)
        out = torch.stack(values).mean()
        ref.torch_sync(device)
        return out

    compile_s = {}
    for name, (fn, args) in variants.items():
        compile_s[name] = timed(fn, *args)
    torch_loop(4)  # warm-up
    times = {name: [] for name in [*variants, "torch_inplace_loop"]}
    for _ in range(repeats):
        for name, (fn, args) in variants.items():
            times[name].append(timed(fn, *args))
        t0 = time.perf_counter()
        torch_loop()
        times["torch_inplace_loop"].append(time.perf_counter() - t0)
    fn, args = variants[f"jax_average_sharpness_chunk{chunks[0]}"]
    est = fn(*args)
    out = {}
    for name, ts in times.items():
        rec = {
            "bench": "average",
            "variant": name,
            "num_evaluations": num,
            "sigma": SIGMA,
            "median_s": statistics.median(ts),
            "times_s": [round(t, 4) for t in ts],
            "compile_s": compile_s.get(name),
        }
        emit(rec)
        out[name] = rec["median_s"]
    emit(
        {
            "bench": "average",
            "estimate": float(est.mean),
            "stderr": float(est.stderr),
            "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__,
        }
    )
    return out


def bench_worst(steps: int, repeats: int) -> dict:
    from kernels.sharpness import Perturbation, worst_case_sharpness

    jax, params, data = jax_setup()
    pert = Perturbation("l2_ball", 0.05)
    worst = jax.jit(
        lambda params, data, key: worst_case_sharpness(
            batch_loss, params, data, key, perturbation=pert, num_steps=steps
        )
    )
    grad = jax.jit(lambda params, data: jax.grad(make_loss(data))(params))

    def grads_loop(p, data):
        def body(_, q):
            g = jax.grad(make_loss(data))(q)
            return jax.tree_util.tree_map(lambda a, b: a + 1e-4 * b, q, g)

        return jax.lax.fori_loop(0, steps, body, p)

    grads_loop = jax.jit(grads_loop)
    key = jax.random.key(0)
    compile_s = {
        "jax_worst_case": timed(worst, params, data, key),
        "jax_grad_x_steps": timed(grad, params, data),
        "jax_grad_fori_loop": timed(grads_loop, params, data),
    }
    times = {name: [] for name in compile_s}
    for _ in range(repeats):
        times["jax_worst_case"].append(timed(worst, params, data, key))
        times["jax_grad_x_steps"].append(sum(timed(grad, params, data) for _ in range(steps)))
        times["jax_grad_fori_loop"].append(timed(grads_loop, params, data))
    res = worst(params, data, key)
    value_grad = jax.jit(lambda params, data: jax.value_and_grad(make_loss(data))(params))
    costs = {
        "worst": ref.xla_costs(worst.lower(params, data, key).compile()),
        "grad": ref.xla_costs(value_grad.lower(params, data).compile()),
    }
    emit({"bench": "worst", "xla_costs": costs})
    out = {f"{name}_{k}": v for name, c in costs.items() for k, v in c.items()}
    for name, ts in times.items():
        rec = {
            "bench": "worst",
            "variant": name,
            "num_steps": steps,
            "median_s": statistics.median(ts),
            "times_s": [round(t, 4) for t in ts],
            "compile_s": compile_s[name],
        }
        emit(rec)
        out[name] = rec["median_s"]
    emit({"bench": "worst", "value": float(res.value), "radius": 0.05})
    return out


_MEMORY_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {here!r}); sys.path.insert(0, {root!r})
import jax
import _reference as ref
from kernels.sharpness import Perturbation, average_sharpness
params = {{k: jax.numpy.asarray(v) for k, v in ref.init_params().items()}}
data = tuple(jax.numpy.asarray(a) for a in ref.make_batch())
def loss(p, batch):
    return ref.jax_loss(p, *batch)
def run(params, data, key):
    pert = Perturbation("gaussian", {sigma})
    return average_sharpness(loss, params, data, key, perturbation=pert, num_samples={num} // 2)
t0 = time.perf_counter()
est = jax.jit(run)(params, data, jax.random.key(0))
jax.block_until_ready(est.mean)
peak = ref.device_peak_mb() if ref.on_accelerator() else None
print(json.dumps({{"num_evaluations": {num}, "peak_rss_mb":
    peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "wall_s": time.perf_counter() - t0, "mean": float(est.mean)}}))
"""


def bench_memory(nums: list[int]) -> dict:
    out = {}
    for num in nums:
        code = _MEMORY_CHILD.format(here=HERE, root=ROOT, sigma=SIGMA, num=num)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        rec["bench"] = "memory"
        emit(rec)
        out[num] = rec["peak_rss_mb"]
    return out


def average_table(s: dict) -> str:
    k = s["num_evaluations"]
    return "\n".join([
        "| what | median | ratio |",
        "|---|---|---|",
        f"| `average_sharpness`, K = {k} ({k // 2} antithetic pairs, chunk {s['chunk']}) | "
        f"{s['ours_s']:.2f} s | |",
        f"| floor: {k} forwards at pre-drawn parameters, one `jit(vmap(loss))` batch | "
        f"{s['jax_floor_vmap_forwards_s']:.2f} s | ours / floor "
        f"**{s['average_vs_vmap_floor']:.2f}** (target <= 1.3) |",
        f"| {k} forwards at pre-drawn parameters, sequential `lax.map` | "
        f"{s['jax_sequential_forwards_s']:.2f} s | ours / these "
        f"{s['average_vs_sequential_forwards']:.2f} |",
        f"| PyTorch loop: `p.add_(noise)`, loss under `no_grad`, `p.sub_(noise)`, "
        f"{s['torch_threads']} threads | {s['torch_inplace_loop_s']:.2f} s | torch / ours "
        f"**{s['torch_loop_over_ours']:.2f}** (target >= 5) |",
    ])  # fmt: skip


def worst_table(s: dict) -> str:
    n = s["num_steps"]
    rows = [
        "| what | median | ratio |",
        "|---|---|---|",
        f"| `worst_case_sharpness`, l2 ball, {n} steps ({n + 1} value-and-grads) | "
        f"{s['jax_worst_case_s']:.2f} s | per ascent step / one gradient "
        f"**{s['worst_per_ascent_step_over_grad']:.2f}** (target <= 1.1) |",
        f"| {n} calls of a jitted gradient | {s['jax_grad_x_steps_s']:.2f} s | worst / these "
        f"**{s['worst_vs_grad_calls']:.2f}** (target <= 1.5) |",
        f"| {n} gradients in one compiled `fori_loop` | {s['jax_grad_fori_loop_s']:.2f} s | "
        f"worst / these **{s['worst_vs_grads_fori_loop']:.2f}** |",
    ]
    if "worst_xla_temp_over_grad" in s:
        rows.append(
            f"| XLA temporaries of the worst case / a gradient's | | "
            f"**{s['worst_xla_temp_over_grad']:.2f}** (target <= 1.3) |"
        )
    return "\n".join(rows)


def memory_table(s: dict) -> str:
    small, large = s["nums"]
    return (
        "| what | peak | ratio |\n|---|---|---|\n"
        f"| peak memory of a fresh process, `average_sharpness` with {large} vs {small} "
        f"perturbations | {s['peak_mb'][1]:,.0f} vs {s['peak_mb'][0]:,.0f} MB | "
        f"**{s['ratio']:.2f}** (target <= 1.5) |"
    )


def main(argv: list[str] | None = None) -> dict:
    """Run the benches named by ``--only``; returns the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--only", default="average,worst,memory", help="comma-separated benches")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--chunks", default="1", help="chunk sizes of average_sharpness, e.g. 1,8")
    quiet.add_arguments(parser)
    args = parser.parse_args(argv)
    monitor = quiet.Monitor()
    only = set(args.only.split(","))
    num = 64 if args.quick else 256
    repeats = args.repeats or (3 if args.quick else 5)
    chunks = [int(c) for c in args.chunks.split(",")]
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    import jax

    emit(
        {
            "bench": "setup",
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "device": str(jax.devices()[0]),
            "cpu_count": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "num_params": ref.num_params(),
        }
    )
    ratios, parts = {}, {}
    if "average" in only:
        start = len(_RECORDS)
        t = bench_average(num, repeats, chunks)
        best = min(chunks, key=lambda c: t[f"jax_average_sharpness_chunk{c}"])
        ours = t[f"jax_average_sharpness_chunk{best}"]
        ratios["average_vs_vmap_floor (target <= 1.3)"] = ours / t["jax_floor_vmap_forwards"]
        ratios["average_vs_sequential_forwards"] = ours / t["jax_sequential_forwards"]
        ratios["torch_loop_vs_average (target >= 5)"] = t["torch_inplace_loop"] / ours
        summary = {
            "num_evaluations": num,
            "chunk": best,
            "ours_s": ours,
            **{f"{k}_s": v for k, v in t.items()},
            "torch_threads": _RECORDS[-1].get("torch_threads"),
            "average_vs_vmap_floor": ours / t["jax_floor_vmap_forwards"],
            "average_vs_sequential_forwards": ours / t["jax_sequential_forwards"],
            "torch_loop_over_ours": t["torch_inplace_loop"] / ours,
        }
        parts["average"] = quiet.Section(summary, average_table(summary), _RECORDS[start:])
    if "worst" in only:
        start = len(_RECORDS)
        steps = 20
        t = bench_worst(steps, repeats)
        ratios["worst_vs_20_grad_calls (target <= 1.5)"] = (
            t["jax_worst_case"] / t["jax_grad_x_steps"]
        )
        ratios["worst_vs_20_grads_fori_loop"] = t["jax_worst_case"] / t["jax_grad_fori_loop"]
        # issue 22: per ascent step (steps + 1 value-and-grads) over one gradient call
        ratios["worst_per_ascent_step_over_grad (target <= 1.1)"] = (
            t["jax_worst_case"] / (steps + 1) / (t["jax_grad_x_steps"] / steps)
        )
        summary = {
            "num_steps": steps,
            **{k: v for k, v in t.items() if k not in ("jax_worst_case", "jax_grad_x_steps",
                                                       "jax_grad_fori_loop")},
            **{f"{k}_s": t[k] for k in ("jax_worst_case", "jax_grad_x_steps",
                                        "jax_grad_fori_loop")},
            "worst_vs_grad_calls": t["jax_worst_case"] / t["jax_grad_x_steps"],
            "worst_vs_grads_fori_loop": t["jax_worst_case"] / t["jax_grad_fori_loop"],
            "worst_per_ascent_step_over_grad": (
                t["jax_worst_case"] / (steps + 1) / (t["jax_grad_x_steps"] / steps)
            ),
        }  # fmt: skip
        if t.get("worst_xla_temp_mb") and t.get("grad_xla_temp_mb"):
            ratios["worst_xla_temp_over_grad (target <= 1.3)"] = (
                t["worst_xla_temp_mb"] / t["grad_xla_temp_mb"]
            )
            summary["worst_xla_temp_over_grad"] = t["worst_xla_temp_mb"] / t["grad_xla_temp_mb"]
        parts["worst"] = quiet.Section(summary, worst_table(summary), _RECORDS[start:])
    if "memory" in only:
        start = len(_RECORDS)
        nums = [64, 1024] if args.quick else [64, 4096]
        m = bench_memory(nums)
        ratios[f"peak_rss_{nums[1]}_vs_{nums[0]} (target <= 1.5)"] = m[nums[1]] / m[nums[0]]
        summary = {"nums": nums, "peak_mb": [m[n] for n in nums], "ratio": m[nums[1]] / m[nums[0]]}
        parts["memory"] = quiet.Section(summary, memory_table(summary), _RECORDS[start:],
                                        timed=False)  # fmt: skip
    emit({"bench": "ratios", **{k: round(v, 3) for k, v in ratios.items()}})
    conditions = monitor.stop()
    emit({"bench": "conditions", **conditions.to_dict()})
    for part in parts.values():
        print(part.table, flush=True)
    quiet.finish("sharpness", parts, conditions, args)
    return ratios


if __name__ == "__main__":
    main()
