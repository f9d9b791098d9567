"""One command on an accelerator: the kernel tests there, kernels at 124M parameters at both
matmul precisions against PyTorch / PyHessian, Rademacher throughput by chunk size, the 54k
reference model's chunk sweep, the cost of runtime checks under ``vmap``; one JSON, one table.

Runs on whatever ``jax.devices()`` holds (written for one GPU; a CPU runs it too). Parts, in
this order, each given what is left of a wall-clock budget (``--budget``, default 480 s = the
8 minutes of issue 25 on one H100), so a slow part cannot push the run past it (a part that no
longer fits is recorded as not run):

The kernel tests (last) keep ``--tests-reserve`` seconds (default 40% of the budget) that the
timed parts before them may not use.

1. ``scale``: bench/scale.py's GPT-2-small-sized decoder (123.75M parameters, batch 8 x 128,
   float32, random weights), at JAX's default matmul precision (TF32 on a GPU) and at
   ``"highest"``: the gradient, ``hessian_trace`` (Hutchinson), ``average_sharpness``
   (antithetic pairs), ``worst_case_sharpness`` (ascent steps) and ``top_eigenvalues``
   (Lanczos steps), each compiled ahead of time (compile seconds, XLA's temporaries), run
   ``--reps`` times (median), and reported per probe / pair / step in gradients of the same
   precision; the value of each (what TF32 does to it). Device memory: XLA's allocation plan
   and ``device.memory_stats()`` (peak bytes in use) where the device reports it.
2. ``torch``: the PyTorch twin of the same model and weights (bench/scale.py) on the same
   device: the gradient with TF32 off (PyTorch's default for matmuls) and on, and PyHessian's
   Hutchinson loop (``cuda=True`` on a GPU) per probe. Skipped, with a note in the table, when
   torch or pyhessian is not installed.
3. ``rademacher``: ``rademacher_linear`` (n = 4096, d = 512, float32) at several chunk sizes
   (bench/rademacher.py's ``linear_fn``) against a jitted matmul of stored signs plus the
   norms, draws per second and effective TFLOP/s.
4. ``sweep``: the 54k-parameter reference model (bench/_reference.py): a Hutchinson probe
   (bench/curvature.py's ``ours_trace``) in gradients (``jax_grad``), one probe at a time
   and in chunks.
5. ``checks``: ``hessian_trace`` under ``jax.jit(jax.vmap(...))`` over a batch of parameter
   sets, runtime checks on (one host callback under ``lax.cond`` per check, taken only on
   failure) and off: compile and run seconds.
6. ``tests``: ``pytest tests/kernels kernels`` on the device (``XLA_PYTHON_CLIENT_PREALLOCATE=
   false``, ``-n`` workers), given the rest of the budget: passed / failed counts and the
   failures' names.

Usage (on the GPU machine, the checkout on ``PYTHONPATH`` or installed):

    python bench/accelerator.py                     # everything, at most --budget seconds
    python bench/accelerator.py --smoke --out DIR   # seconds on a CPU: tiny sizes, every part

Writes ``accelerator.json`` (every record, the device, JAX's version) and ``accelerator.md``
(the tables) into ``--out`` (default ``bench/results``); prints one JSON record per
measurement as it goes. The smoke mode (tiny model, few draws, one test file) is what
tests/bench/test_accelerator.py runs in the default test run, so every code path here runs on a
CPU before it runs on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PRECISIONS = ("default", "highest")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What each part runs; ``FULL`` on a GPU, ``SMOKE`` (seconds on a CPU) for the test."""

    scale: str  # "full" (bench/scale.py's 124M decoder) or "tiny"
    batch: int  # sequences per batch of the decoder
    jobs: tuple[tuple[str, str], ...]  # (precision, kernel) pairs, gradient first per precision
    probes: int  # Hutchinson probes, antithetic pairs
    steps: int  # ascent steps, Lanczos steps
    reps: int  # timed repetitions (median)
    rad_n: int
    rad_d: int
    rad_draws: int
    rad_chunks: tuple[int, ...]
    sweep_batch: int  # sequences of the 54k reference model's batch
    sweep_probes: int
    sweep_chunks: tuple[int | None, ...]
    checks_batch: int  # parameter sets under vmap
    checks_model: str  # "reference" (the 54k model) or "tiny" (a quadratic, for the smoke)
    tests: tuple[str, ...]  # what pytest runs
    workers: int


_KERNELS = ("hessian_trace", "average_sharpness", "worst_case_sharpness", "top_eigenvalues")

FULL = Sizes(
    scale="full",
    batch=8,
    jobs=tuple((p, job) for p in PRECISIONS for job in ("grad", *_KERNELS)),
    probes=16,
    steps=10,
    reps=3,
    rad_n=4096,
    rad_d=512,
    rad_draws=131_072,
    rad_chunks=(256, 1024, 4096, 16384),
    sweep_batch=256,
    sweep_probes=64,
    sweep_chunks=(None, 4, 16, 64),
    checks_batch=32,
    checks_model="reference",
    tests=("tests/kernels", "kernels"),
    workers=8,
)
SMOKE = Sizes(  # every code path, each kernel compiled once (compiles dominate on a CPU)
    scale="tiny",
    batch=2,
    jobs=(
        ("default", "grad"),
        *(("default", k) for k in _KERNELS[:2]),
        ("highest", "grad"),
        *(("highest", k) for k in _KERNELS[2:]),
    ),
    probes=2,
    steps=2,
    reps=1,
    rad_n=64,
    rad_d=8,
    rad_draws=256,
    rad_chunks=(16, 64),
    sweep_batch=4,
    sweep_probes=4,
    sweep_chunks=(2,),
    checks_batch=2,
    checks_model="tiny",
    tests=("kernels/_backend.py",),
    workers=0,
)

RECORDS: list[dict] = []


def emit(record: dict) -> dict:
    RECORDS.append(record)
    print(json.dumps(record, default=str), flush=True)
    return record


class Budget:
    """The run's wall-clock budget; each part asks whether it still has ``need`` seconds.

    ``reserve`` seconds are kept for the last part (the kernel tests): the timed parts before it
    may not eat into them.
    """

    def __init__(self, seconds: float, reserve: float = 0.0) -> None:
        self.end = time.monotonic() + seconds
        self.reserve = reserve

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, part: str, need: float) -> bool:
        if self.left() - self.reserve >= need:
            return True
        emit({"part": part, "not_run": f"{self.left():.0f} s left of the budget, needs ~{need}"})
        return False


def timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


@contextlib.contextmanager
def precision(name: str):
    """JAX's default matmul precision for programs traced inside (``default``: unchanged)."""
    if name == "default":
        yield
    else:
        with jax.default_matmul_precision(name):
            yield


def device_memory() -> dict:
    """The device's own memory statistics (GPU / TPU), if it reports them."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # the CPU reports none
        return {}
    keys = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {f"device_{k}_mb": stats[k] / 2**20 for k in keys if k in stats}


def device_info() -> dict:
    dev = jax.devices()[0]
    info = {
        "part": "device",
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "num_devices": jax.device_count(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "default_matmul_precision": str(jax.config.jax_default_matmul_precision),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = bool(torch.cuda.is_available())
    except ImportError:
        info["torch"] = None
    return emit(info)


# --------------------------------------------------------------------------- 1. scale


def _scale_config(sizes: Sizes):
    from bench import scale

    if sizes.scale == "full":
        return dataclasses.replace(scale.FULL, batch=sizes.batch, num_batches=1)
    return scale.Config(
        vocab=64, dim=16, heads=2, hidden=32, layers=1, seq=8, batch=sizes.batch, num_batches=1
    )


def part_scale(sizes: Sizes, budget: Budget) -> None:
    from bench import scale

    cfg = _scale_config(sizes)
    start = time.perf_counter()
    loss_fn, params, batches = scale.build_jax(cfg)
    data = jax.tree_util.tree_map(lambda a: a[0], batches)
    key = jax.random.key(0)
    jax.block_until_ready((params, data))
    emit(
        {
            "part": "scale",
            "setup_s": time.perf_counter() - start,
            "num_params": scale.num_params(cfg),
            "batch": [cfg.batch, cfg.seq],
        }
    )
    counts = {
        "grad": 0,
        "hessian_trace": sizes.probes,
        "average_sharpness": sizes.probes,
        "worst_case_sharpness": sizes.steps,
        "top_eigenvalues": sizes.steps,
    }
    grad_s: dict[str, float] = {}
    for prec, job in sizes.jobs:
        count = counts[job]
        if budget.allows(f"scale/{job}/{prec}", 20 if sizes.scale == "full" else 1):
            fn, _ = scale._program(job, count, 1, loss_fn)
            with precision(prec):
                compiled, rec = scale._compile(fn, params, data, key)
            times = []
            for _ in range(sizes.reps):
                start = time.perf_counter()
                out = jax.block_until_ready(compiled(params, data, key))
                times.append(time.perf_counter() - start)
            run_s = statistics.median(times)
            if job == "grad":
                grad_s[prec] = run_s
            per_unit = run_s / max(count, 1)
            base = grad_s.get(prec)
            record = {
                "part": "scale",
                "job": job,
                "precision": prec,
                "count": count,
                "run_s": run_s,
                "per_unit_s": per_unit,
                "per_unit_in_grads": per_unit / base if base else None,
                **rec,
                **scale._summary_value(out),
                **device_memory(),
            }
            emit(record)
            del compiled, out


# --------------------------------------------------------------------------- 2. torch


def _torch_available() -> str | None:
    """None when torch and pyhessian import, else why not."""
    try:
        import pyhessian  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        return f"not installed ({err.name})"
    return None


def part_torch(sizes: Sizes, budget: Budget) -> None:
    missing = _torch_available()
    if missing is not None:
        emit({"part": "torch", "not_run": f"torch / pyhessian {missing}"})
        return
    if not budget.allows("torch", 30 if sizes.scale == "full" else 1):
        return
    import torch
    from pyhessian import hessian

    from bench import scale

    cfg = _scale_config(sizes)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, params, batches = scale.build_jax(cfg)
    model = scale.torch_model(cfg, scale.params_to_numpy(params)).to(device)
    del params
    inputs, targets = (torch.as_tensor(np.array(a[0])).long().to(device) for a in batches)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        times = []
        for _ in range(sizes.reps + 1):  # the first is a warm-up
            model.zero_grad(set_to_none=True)
            sync()
            start = time.perf_counter()
            scale.torch_criterion(model(inputs), targets).backward()
            sync()
            times.append(time.perf_counter() - start)
        emit(
            {
                "part": "torch",
                "job": "grad",
                "precision": "tf32" if tf32 else "highest",
                "run_s": statistics.median(times[1:]),
            }
        )
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default for matmuls
    for p in model.parameters():
        p.grad = None
    h = hessian(model, scale.torch_criterion, data=(inputs, targets), cuda=device == "cuda")
    sync()
    start = time.perf_counter()
    trace = h.trace(maxIter=sizes.probes, tol=-float("inf"))  # exactly maxIter probes
    sync()
    run_s = time.perf_counter() - start
    emit(
        {
            "part": "torch",
            "job": "pyhessian_trace",
            "precision": "highest",
            "device": device,
            "count": sizes.probes,
            "run_s": run_s,
            "per_unit_s": run_s / sizes.probes,
            "value": float(np.mean(trace)),
        }
    )


# --------------------------------------------------------------------------- 3. rademacher


def part_rademacher(sizes: Sizes, budget: Budget) -> None:
    from bench import rademacher as rad_bench

    n, d, draws = sizes.rad_n, sizes.rad_d, sizes.rad_draws
    x = jax.random.normal(jax.random.key(1), (n, d), jnp.float32)
    key = jax.random.key(0)
    block = min(draws, 4096)
    signs = jax.random.rademacher(jax.random.key(2), (block, n), jnp.float32)
    stored = jax.jit(lambda s, x: jnp.linalg.norm(s @ x, axis=1))
    variants = {"stored_signs_matmul_plus_norms": (stored, (signs, x), block)}
    for chunk in sizes.rad_chunks:
        variants[f"chunk_{chunk}"] = (rad_bench.linear_fn(draws, chunk), (key, x), draws)
    compile_s = {}
    for name, (fn, args, _) in list(variants.items()):
        if not budget.allows(f"rademacher/{name}", 5 if sizes.scale == "full" else 0.5):
            del variants[name]
            continue
        compile_s[name] = timed(fn, *args)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(max(sizes.reps, 2)):  # interleaved
        for name, (fn, args, _) in variants.items():
            times[name].append(timed(fn, *args))
    base = None
    for name, (_, _, count) in variants.items():
        med = statistics.median(times[name])
        rate = count / med
        base = rate if name.startswith("stored") else base
        emit(
            {
                "part": "rademacher",
                "variant": name,
                "n": n,
                "d": d,
                "draws": count,
                "first_call_s": compile_s[name],
                "median_s": med,
                "draws_per_s": rate,
                "tflops": 2 * n * d * rate / 1e12,
                "vs_stored_signs": rate / base if base else None,
            }
        )


# --------------------------------------------------------------------------- 4. sweep


def part_sweep(sizes: Sizes, budget: Budget) -> None:
    from bench import _reference as ref
    from bench import curvature

    ref.BATCH = sizes.sweep_batch  # make_batch reads it (the reference model's batch)
    params, inputs, targets = curvature.jax_inputs()
    key = jax.random.key(0)
    grad = lambda: curvature.jax_grad(params, inputs, targets)  # noqa: E731
    timed(grad)
    variants = {}
    for chunk in sizes.sweep_chunks:
        if not budget.allows(f"sweep/chunk_{chunk}", 15 if sizes.scale == "full" else 0.5):
            continue

        def trace(chunk=chunk):
            return curvature.ours_trace(
                params, inputs, targets, key, num_probes=sizes.sweep_probes, chunk_size=chunk
            )

        variants[chunk] = (trace, timed(trace))
    times: dict = {chunk: [] for chunk in variants}
    grad_times = []
    for _ in range(max(sizes.reps, 2)):  # interleaved with the gradient
        grad_times.append(timed(grad))
        for chunk, (trace, _) in variants.items():
            times[chunk].append(timed(trace))
    grad_s = statistics.median(grad_times)
    for chunk, (_, first) in variants.items():
        per_probe = statistics.median(times[chunk]) / sizes.sweep_probes
        emit(
            {
                "part": "sweep",
                "chunk_size": chunk,
                "num_probes": sizes.sweep_probes,
                "batch": sizes.sweep_batch,
                "first_call_s": first,
                "grad_s": grad_s,
                "per_probe_s": per_probe,
                "per_probe_in_grads": per_probe / grad_s,
            }
        )


# --------------------------------------------------------------------------- 5. checks


def _quadratic(params, batch):
    del batch
    return jnp.sum(params["w"] ** 4)


def part_checks(sizes: Sizes, budget: Budget) -> None:
    import kernels
    from bench import curvature

    if not budget.allows("checks", 20 if sizes.scale == "full" else 1):
        return
    if sizes.checks_model == "reference":
        params, inputs, targets = curvature.jax_inputs()
        loss_fn, batch = curvature.batch_loss, (inputs[:8], targets[:8])
    else:  # a quadratic: the same code path, a program that compiles in a moment
        params, batch = {"w": jnp.linspace(0.5, 1.5, 4, dtype=jnp.float32)}, ()
        loss_fn = _quadratic
    stacked = jax.tree_util.tree_map(
        lambda a: jnp.stack([a * (1 + 0.01 * i) for i in range(sizes.checks_batch)]), params
    )
    key = jax.random.key(0)

    def one(p):
        return kernels.hessian_trace(loss_fn, p, batch, key, num_samples=2).mean

    for enabled in (True, False):
        with kernels.runtime_checks(enabled):
            fn = jax.jit(jax.vmap(one))  # a new function per setting: traced under it
            start = time.perf_counter()
            compiled = fn.lower(stacked).compile()
            compile_s = time.perf_counter() - start
            runs = [timed(compiled, stacked) for _ in range(max(sizes.reps, 3))]
        emit(
            {
                "part": "checks",
                "runtime_checks": enabled,
                "vmap_batch": sizes.checks_batch,
                "compile_s": compile_s,
                "run_s": statistics.median(runs),
                "callbacks_in_program": compiled.as_text().count("xla_ffi_python"),
            }
        )


# --------------------------------------------------------------------------- 6. tests


_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")


def part_tests(sizes: Sizes, budget: Budget) -> None:
    left = budget.left() - 5
    if left < 10:
        emit({"part": "tests", "not_run": f"{budget.left():.0f} s left of the budget"})
        return
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    cmd = [sys.executable, "-m", "pytest", *sizes.tests, "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", str(sizes.workers)] + (["--dist", "loadfile"] if sizes.workers else [])
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left, check=False
        )
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else err.stdout
        output, code = output or "", "timeout"
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
    last = [line for line in output.splitlines() if _SUMMARY.search(line)]
    for number, what in _SUMMARY.findall(last[-1] if last else ""):
        counts["error" if what.startswith("error") else what] = int(number)
    emit(
        {
            "part": "tests",
            "command": " ".join(cmd[1:]),
            "exit_code": code,
            "wall_s": time.perf_counter() - start,
            **counts,
            "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)[:40],
        }
    )


# --------------------------------------------------------------------------- tables


def issue22(records: list[dict], precision_name: str = "default") -> dict:
    """Issue 22's ratios from the scale and torch records at one matmul precision.

    Per unit in gradients of the same precision: Hutchinson per probe, Lanczos per step, the
    worst case per value-and-gradient (``steps + 1`` of them, as bench/scale.py counts); XLA's
    temporaries of the worst case over the gradient's, and of Lanczos beyond its float32 basis
    (``steps`` rows of the parameters) over the gradient's; PyHessian's time per probe over
    ours. A ratio whose records are missing is left out.
    """
    from bench import scale

    setup = next((r for r in records if r.get("part") == "scale" and "num_params" in r), {})
    jobs = [r for r in records if r.get("part") == "scale" and "job" in r]
    by = {r["job"]: r for r in jobs if r.get("precision") == precision_name}
    grad = by.get("grad", {})
    out: dict = {"precision": precision_name}
    trace, lanczos, worst = (by.get(j) for j in ("hessian_trace", "top_eigenvalues",
                                                  "worst_case_sharpness"))  # fmt: skip
    if trace and trace.get("per_unit_in_grads"):
        out["hessian_trace_per_probe_over_grad"] = trace["per_unit_in_grads"]
    if lanczos and lanczos.get("per_unit_in_grads"):
        out["top_eigenvalues_per_step_over_grad"] = lanczos["per_unit_in_grads"]
    if worst and worst.get("per_unit_in_grads"):
        count = worst["count"]
        out["worst_case_per_value_and_grad_over_grad"] = (
            worst["per_unit_in_grads"] * count / (count + 1)
        )
    grad_temp = grad.get("xla_temp_mb")
    if grad_temp:
        if worst and worst.get("xla_temp_mb") is not None:
            out["worst_case_temp_over_grad_temp"] = worst["xla_temp_mb"] / grad_temp
        if lanczos and lanczos.get("xla_temp_mb") is not None and setup.get("num_params"):
            basis = scale.lanczos_basis_mb(lanczos["count"], setup["num_params"])
            out["top_eigenvalues_basis_mb"] = basis
            out["top_eigenvalues_temp_beyond_basis_over_grad_temp"] = (
                lanczos["xla_temp_mb"] - basis
            ) / grad_temp
    pyh = next((r for r in records if r.get("job") == "pyhessian_trace"), None)
    if pyh and trace and trace.get("per_unit_s"):
        out["pyhessian_per_probe_over_ours"] = pyh["per_unit_s"] / trace["per_unit_s"]
    return out


ISSUE22_GOALS = {
    "hessian_trace_per_probe_over_grad": "<= 1.3",
    "top_eigenvalues_per_step_over_grad": "<= 1.3",
    "top_eigenvalues_temp_beyond_basis_over_grad_temp": "<= 2",
    "worst_case_per_value_and_grad_over_grad": "<= 1.1",
    "worst_case_temp_over_grad_temp": "<= 1.3",
    "pyhessian_per_probe_over_ours": ">= 3",
}


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown(records: list[dict], wall_s: float) -> str:
    device = next((r for r in records if r.get("part") == "device"), {})
    lines = [
        f"# Accelerator run: {device.get('device_kind')} ({device.get('platform')}), "
        f"JAX {device.get('jax')}, torch {device.get('torch')}",
        "",
        f"Wall time {wall_s:.0f} s. Ratios are from the same process and precision.",
        "",
        "## Kernels at scale",
        "",
        "| kernel | precision | count | compile s | run s | per unit in gradients | "
        "XLA temp MB | value |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if r.get("part") == "scale" and "job" in r:
            lines.append(
                f"| {r['job']} | {r['precision']} | {r['count']} | {_fmt(r.get('compile_s'))} | "
                f"{_fmt(r['run_s'])} | {_fmt(r.get('per_unit_in_grads'))} | "
                f"{_fmt(r.get('xla_temp_mb'))} | {_fmt(r.get('value'), 6)} |"
            )
    lines += [
        "",
        "## Issue 22's goals",
        "",
        "Against one gradient of the same precision (the worst case per value-and-gradient, "
        "steps + 1 of them; memory from XLA's temporaries; PyHessian at PyTorch's default "
        "precision, matmuls without TF32).",
        "",
        "| ratio | goal | " + " | ".join(PRECISIONS) + " |",
        "|---|---|" + "---|" * len(PRECISIONS),
    ]
    ratios = {prec: issue22(records, prec) for prec in PRECISIONS}
    for name, goal in ISSUE22_GOALS.items():
        cells = " | ".join(_fmt(ratios[prec].get(name)) for prec in PRECISIONS)
        lines.append(f"| {name} | {goal} | {cells} |")
    lines += ["", "## PyTorch / PyHessian on the same device", ""]
    torch_recs = [r for r in records if r.get("part") == "torch"]
    if any("not_run" in r for r in torch_recs):
        lines.append(f"Not run: {next(r['not_run'] for r in torch_recs if 'not_run' in r)}.")
    else:
        lines += ["| job | precision | run s | per probe s | value |", "|---|---|---|---|---|"]
        for r in torch_recs:
            lines.append(
                f"| {r['job']} | {r['precision']} | {_fmt(r['run_s'])} | "
                f"{_fmt(r.get('per_unit_s'))} | {_fmt(r.get('value'), 6)} |"
            )
    lines += [
        "",
        "## rademacher_linear throughput",
        "",
        "| variant | draws/s | TFLOP/s | vs stored signs |",
        "|---|---|---|---|",
    ]
    for r in records:
        if r.get("part") == "rademacher" and "variant" in r:
            lines.append(
                f"| {r['variant']} | {_fmt(r['draws_per_s'])} | {_fmt(r['tflops'])} | "
                f"{_fmt(r['vs_stored_signs'])} |"
            )
    lines += [
        "",
        "## 54k reference model: Hutchinson probe by chunk size",
        "",
        "| chunk_size | per probe in gradients | first call s |",
        "|---|---|---|",
    ]
    for r in records:
        if r.get("part") == "sweep" and "chunk_size" in r:
            lines.append(
                f"| {r['chunk_size']} | {_fmt(r['per_probe_in_grads'])} | "
                f"{_fmt(r['first_call_s'])} |"
            )
    lines += [
        "",
        "## Runtime checks under jit(vmap(hessian_trace))",
        "",
        "| checks | vmap batch | compile s | run s | callbacks in program |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        if r.get("part") == "checks" and "runtime_checks" in r:
            lines.append(
                f"| {'on' if r['runtime_checks'] else 'off'} | {r['vmap_batch']} | "
                f"{_fmt(r['compile_s'])} | {_fmt(r['run_s'])} | {r['callbacks_in_program']} |"
            )
    lines += ["", "## Kernel tests on the device", ""]
    for r in records:
        if r.get("part") == "tests":
            if "not_run" in r:
                lines.append(f"Not run: {r['not_run']}.")
            else:
                lines.append(
                    f"`{r['command']}`: {r['passed']} passed, {r['failed']} failed, "
                    f"{r['error']} errors, {r['skipped']} skipped (exit {r['exit_code']}, "
                    f"{r['wall_s']:.0f} s)."
                )
                lines += [f"- {name}" for name in r["failures"]]
    not_run = [r for r in records if "not_run" in r and r.get("part") not in ("torch", "tests")]
    if not_run:
        lines += ["", "## Not run (budget)", ""]
        lines += [f"- {r['part']}: {r['not_run']}" for r in not_run]
    return "\n".join(lines) + "\n"


PARTS = {
    "scale": part_scale,
    "torch": part_torch,
    "rademacher": part_rademacher,
    "sweep": part_sweep,
    "checks": part_checks,
    "tests": part_tests,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds on a CPU")
    parser.add_argument("--budget", type=float, default=480.0, help="wall-clock seconds (> 0)")
    parser.add_argument(
        "--tests-reserve",
        type=float,
        default=None,
        help="seconds of the budget kept for the kernel tests (default: 40%% of it)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="output folder")
    parser.add_argument("--only", action="append", choices=sorted(PARTS), help="run these parts")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget: expected seconds > 0, got {args.budget}")
    reserve = 0.4 * args.budget if args.tests_reserve is None else args.tests_reserve
    if not 0 <= reserve < args.budget:
        parser.error(f"--tests-reserve: expected seconds in [0, --budget), got {reserve}")
    if args.only and "tests" not in args.only:
        reserve = 0.0
    sizes = SMOKE if args.smoke else FULL
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    RECORDS.clear()
    start = time.perf_counter()
    budget = Budget(args.budget, reserve)
    device_info()
    for name, part in PARTS.items():
        if args.only and name not in args.only:
            continue
        part(sizes, budget)
    wall = time.perf_counter() - start
    stem = "accelerator_smoke" if args.smoke else "accelerator"
    payload = {
        "sizes": dataclasses.asdict(sizes),
        "wall_s": wall,
        "issue22": {prec: issue22(RECORDS, prec) for prec in PRECISIONS},
        "records": RECORDS,
    }
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(RECORDS, wall))
    print(f"wrote {out / stem}.json and .md in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
