"""Benchmark of kernels.rademacher on CPU: fused sign generation + GEMM, memory, batched search.

One command (numpy's BLAS measured without the OPENBLAS_* overrides, see the README):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/rademacher.py [--quick]

Prints one JSON record per configuration, then a summary record with the ratios:

- throughput: ``rademacher_linear`` (n=4096, d=512, float32, sign generation included) against a
  jitted JAX matmul of the same shapes with the signs already in memory (a 4096-draw block,
  timed repeatedly) and numpy's float32 matmul of that block; also ``jax.random.rademacher`` +
  matmul, the naive way. Variants interleaved, compile time separate, medians.
- memory: XLA's compiled temp allocation and the measured peak RSS (fresh subprocess each) of
  ``rademacher_linear`` at 65,536 and 1,048,576 draws (``--quick``: 8,192 and 131,072).
- search: one ``rademacher_search`` call over 1,024 sign vectors (vmapped in chunks of 8 ... all
  1,024 at once) vs a Python loop of a jitted single-sign-vector ascent over the same sign
  vectors (same values), on a tiny (n=64, 8->16) and a small (n=256, 16->32) tanh network; the
  same for ``rademacher_readout_search`` (the same class, the readout's sup in closed form).
- equal_time: the lower bound (mean over 256 sign vectors, chunk 8) against wall time of plain
  and readout search at 5 ... 40 ascent steps, interleaved; for each plain budget, the best
  readout run that took no longer, with the stderr of the paired per-sign-vector difference.

- split: ``rademacher_linear`` with ``precision=None`` (JAX's default: TF32 on a GPU),
  ``"highest"`` and ``"bf16x2"`` (x = hi + lo in bfloat16, float32 accumulation) at several chunk
  sizes, interleaved: draws/s, effective TFLOP/s (2 n d per draw) and the accuracy cost: the
  largest relative error of a sup on a 256-draw block against float64, and the difference of
  the means against the full-precision path in units of its standard error
  (:func:`split_sweep`, which ``bench/accelerator.py`` calls on a GPU; on a CPU bfloat16 matmuls
  are emulated and slow: the CPU run only checks that it works).

``--only PART`` (repeatable) runs some of throughput, memory, search, equal_time, split.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import _searches, norms
from kernels import rademacher as rad

N, D = 4096, 512


def emit(record):
    print(json.dumps(record), flush=True)


def timed(fn, *args):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def blas_info():
    try:
        from threadpoolctl import threadpool_info

        return [
            {k: i.get(k) for k in ("internal_api", "architecture", "num_threads")}
            for i in threadpool_info()
        ]
    except ImportError:
        return "threadpoolctl not installed"


def linear_fn(num_draws, chunk_size):
    def f(key, x):
        return rad.rademacher_linear(
            x, key, norm=2, radius=1.0, num_samples=num_draws, chunk_size=chunk_size
        ).mean

    return jax.jit(f)


def bench_throughput(num_draws, reps, chunk_sizes):
    key = jax.random.key(0)
    x = jax.random.normal(jax.random.key(1), (N, D), jnp.float32)
    block = 4096
    signs = jax.random.rademacher(jax.random.key(2), (block, N), jnp.float32)
    signs_np, x_np = np.asarray(signs), np.asarray(x)
    variants = {}
    for cs in chunk_sizes:
        variants[f"rademacher_linear_chunk{cs}"] = (linear_fn(num_draws, cs), (key, x), num_draws)
    variants["jax_matmul_signs_in_memory"] = (jax.jit(lambda s, x: s @ x), (signs, x), block)
    variants["numpy_matmul_signs_in_memory"] = (lambda s, x: s @ x, (signs_np, x_np), block)
    variants["jax_random_rademacher_plus_matmul"] = (
        jax.jit(lambda k, x: jax.random.rademacher(k, (block, N), jnp.float32) @ x),
        (key, x),
        block,
    )
    compile_s = {}
    for name, (fn, args, _) in variants.items():
        compile_s[name] = timed(fn, *args)
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, (fn, args, _) in variants.items():
            times[name].append(timed(fn, *args))
    out = {}
    for name, (_, _, draws) in variants.items():
        med = float(np.median(times[name]))
        rec = {
            "bench": "throughput",
            "variant": name,
            "n": N,
            "d": D,
            "draws": draws,
            "dtype": "float32",
            "median_s": med,
            "first_call_s": compile_s[name],
            "gflops": 2 * N * D * draws / med / 1e9,
            "draws_per_s": draws / med,
        }
        emit(rec)
        out[name] = rec
    return out


def child_rss(num_draws):
    """Run once in this (fresh) process and report peak RSS and XLA's temp allocation."""
    x = jax.random.normal(jax.random.key(1), (N, D), jnp.float32)
    f = linear_fn(num_draws, 256)  # the default chunk (None would run one draw at a time)
    compiled = f.lower(jax.random.key(0), x).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    t = time.perf_counter()
    mean = float(jax.block_until_ready(compiled(jax.random.key(0), x)))
    emit(
        {
            "num_draws": num_draws,
            "run_s": time.perf_counter() - t,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "xla_temp_mb": temp / 2**20,
            "mean": mean,
        }
    )


def bench_memory(draw_counts):
    out = []
    for num in draw_counts:
        proc = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(num)],
            capture_output=True,
            text=True,
            check=True,
        )
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        rec = {"bench": "memory", "n": N, "d": D, "dtype": "float32", **rec}
        emit(rec)
        out.append(rec)
    return out


def search_problem(n, d, h):
    """A tanh network class {x -> v^T tanh(W^T x) : ||W||_F <= r_W, ||v||_2 <= r_v}, two ways.

    ``plain``: ``rademacher_search`` over (W, v); ``readout``: ``rademacher_readout_search`` over
    W with the sup over v in closed form (q = 2, B = r_v). The same class, the same sign vectors.
    """
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    params = {
        "w": jnp.asarray(rng.normal(size=(d, h)) / np.sqrt(d), jnp.float32),
        "v": jnp.asarray(rng.normal(size=(h,)) / np.sqrt(h), jnp.float32),
    }
    radii = {k: float(jnp.linalg.norm(v)) for k, v in params.items()}

    def apply_fn(p, xs):
        return jnp.tanh(xs @ p["w"]) @ p["v"]

    def project(p):
        return {k: norms.project_lp_ball(v, p=2, radius=radii[k]) for k, v in p.items()}

    def features_fn(w, xs):
        return jnp.tanh(xs @ w)

    def project_w(w):
        return norms.project_lp_ball(w, p=2, radius=radii["w"])

    plain = dict(fn=apply_fn, params=params, project=project, extra={})
    readout = dict(
        fn=features_fn,
        params=params["w"],
        project=project_w,
        extra=dict(readout_norm=2, readout_radius=radii["v"]),
    )
    return x, {"plain": plain, "readout": readout}


KERNELS = {"plain": rad.rademacher_search, "readout": rad.rademacher_readout_search}
SUPS = {"plain": rad.search_sup, "readout": rad.readout_search_sup}


def search_call(kind, spec, x, num_signs, steps, chunk):
    kernel = KERNELS[kind]
    kw = dict(project=spec["project"], num_steps=steps, step_size=1.0, **spec["extra"])

    def f(k):
        est = kernel(
            spec["fn"], spec["params"], x, k, num_samples=num_signs, chunk_size=chunk, **kw
        )
        return est.mean, est.stderr

    return jax.jit(f)


def search_sup_of(kind, spec, x, key, steps):
    """The sup object the kernel builds for ``key`` (same restarts), for per-draw values."""
    kw = dict(project=spec["project"], num_steps=steps, step_size=1.0, **spec["extra"])
    return SUPS[kind](spec["fn"], spec["params"], x, rad._restart_key(key), **kw)


def run_interleaved(variants, arg, reps):
    """First call (compile) of each, then ``reps`` interleaved rounds; medians and values."""
    compile_s = {name: timed(fn, arg) for name, fn in variants.items()}
    times = {name: [] for name in variants}
    values = {}
    for _ in range(reps):
        for name, fn in variants.items():
            t = time.perf_counter()
            values[name] = jax.block_until_ready(fn(arg))
            times[name].append(time.perf_counter() - t)
    return compile_s, {k: float(np.median(v)) for k, v in times.items()}, values


def bench_search(
    num_signs, reps, n, d, h, chunks, kinds=("plain", "readout"), with_loop_checks=True
):
    """Each kind: one call over ``num_signs`` sign vectors vs a Python loop of a jitted ascent."""
    steps = 20
    x, specs = search_problem(n, d, h)
    key = jax.random.key(5)
    signs = rad.sign_vectors(key, num_samples=num_signs, num_examples=n)
    variants = {}
    for kind in kinds:
        for c in chunks:
            call = search_call(kind, specs[kind], x, num_signs, steps, c)
            variants[f"{kind}_one_call_chunk{c}"] = lambda k, call=call: call(k)[0]
        # the same restarts key the kernel derives, so both compute identical values
        sup = search_sup_of(kind, specs[kind], x, key, steps)
        single = jax.jit(lambda s, sup=sup: sup(s[None])[0])

        def loop(_, single=single):
            return np.mean([float(single(signs[i])) for i in range(num_signs)])

        variants[f"{kind}_python_loop_of_jitted_ascent"] = loop
    if with_loop_checks:
        # the behaviour before the ascent's loop body was traced without runtime checks: a
        # host callback per step (project_lp_ball's finiteness check), on both sides; fresh
        # callables so that nothing compiled above is reused, traced here with the checks on
        x2, specs2 = search_problem(n, d, h)
        call = search_call("plain", specs2["plain"], x2, num_signs, steps, 8)
        sup = search_sup_of("plain", specs2["plain"], x2, key, steps)
        single = jax.jit(lambda s, sup=sup: sup(s[None])[0])
        _searches._CHECKS_IN_ASCENT = True
        try:
            traced = {
                "plain_checks_in_loop_one_call_chunk8": timed(lambda k: call(k)[0], key),
                "plain_checks_in_loop_python_loop": timed(single, signs[0]),
            }
        finally:
            _searches._CHECKS_IN_ASCENT = False
        variants["plain_checks_in_loop_one_call_chunk8"] = lambda k, call=call: call(k)[0]
        variants["plain_checks_in_loop_python_loop"] = lambda _, single=single: np.mean(
            [float(single(signs[i])) for i in range(num_signs)]
        )
    compile_s, med, values = run_interleaved(variants, key, reps)
    if with_loop_checks:
        compile_s.update(traced)
    out = {}
    for name in variants:
        kind = name.split("_", 1)[0]
        loop_s = med[f"{kind}_python_loop_of_jitted_ascent"]
        if "checks_in_loop" in name:
            loop_s = med["plain_checks_in_loop_python_loop"]
        rec = {
            "bench": "search",
            "variant": name,
            "num_sign_vectors": num_signs,
            "n": n,
            "d": d,
            "hidden": h,
            "num_steps": steps,
            "median_s": med[name],
            "per_sign_vector_us": med[name] / num_signs * 1e6,
            "first_call_s": compile_s[name],
            "mean": float(values[name]),
            "speedup_vs_loop": loop_s / med[name],
        }
        emit(rec)
        out[name] = rec
    return out


def bench_equal_time(num_signs, reps, n, d, h, step_grid, chunk=8):
    """Lower bound vs wall time of plain and readout search (same sign vectors, same class)."""
    x, specs = search_problem(n, d, h)
    key = jax.random.key(6)
    variants = {
        f"{kind}_steps{t}": search_call(kind, specs[kind], x, num_signs, t, chunk)
        for t in step_grid
        for kind in ("plain", "readout")
    }
    compile_s, med, values = run_interleaved(variants, key, reps)
    recs = {}
    for name in variants:
        kind, steps = name.split("_steps")
        mean, stderr = (float(v) for v in values[name])
        recs[name] = {
            "bench": "equal_time",
            "variant": kind,
            "num_steps": int(steps),
            "num_draws": num_signs,
            "n": n,
            "d": d,
            "hidden": h,
            "chunk_size": chunk,
            "median_s": med[name],
            "first_call_s": compile_s[name],
            "mean": mean,
            "stderr": stderr,
        }
        emit(recs[name])
    # at equal wall time: for each plain budget, the best readout run that took no longer,
    # with the stderr of the paired difference (the same sign vectors: per-draw values)
    signs = rad.sign_vectors(key, num_samples=num_signs, num_examples=n)

    def per_draw(kind, steps):
        sup = search_sup_of(kind, specs[kind], x, key, steps)
        return np.asarray(jax.jit(lambda s: jax.lax.map(sup, s.reshape(-1, chunk, n)))(signs))

    pairs = []
    for t in step_grid:
        plain = recs[f"plain_steps{t}"]
        within = [
            r
            for k, r in recs.items()
            if k.startswith("readout") and r["median_s"] <= plain["median_s"]
        ]
        if not within:
            pairs.append({"plain_steps": t, "readout_steps": None})
            continue
        best = max(within, key=lambda r: r["mean"])
        diff = per_draw("readout", best["num_steps"]).ravel() - per_draw("plain", t).ravel()
        pair = {
            "bench": "equal_time_pair",
            "n": n,
            "hidden": h,
            "plain_steps": t,
            "plain_s": plain["median_s"],
            "plain_mean": plain["mean"],
            "readout_steps": best["num_steps"],
            "readout_s": best["median_s"],
            "readout_mean": best["mean"],
            "difference": float(diff.mean()),
            "difference_stderr": float(diff.std(ddof=1) / np.sqrt(diff.size)),
        }
        emit(pair)
        pairs.append(pair)
    return recs, pairs


def split_sweep(
    chunk_sizes=(256, 1024, 4096),
    *,
    num_draws=131072,
    n=N,
    d=D,
    reps=3,
    precisions=(None, "highest", "bf16x2"),
):
    """Throughput and accuracy of ``rademacher_linear`` per matmul precision and chunk size.

    All variants are compiled first, then timed in ``reps`` interleaved rounds (medians). The
    accuracy is measured per precision on the same 256 sign vectors (largest relative error of
    a sup against float64) and on the estimate (its mean minus the ``"highest"`` mean, over
    the ``"highest"`` stderr, same draws). Returns one record per (precision, chunk) and emits
    them as JSON lines.
    """
    key = jax.random.key(0)
    x = jax.random.normal(jax.random.key(1), (n, d), jnp.float32)
    signs = rad.sign_vectors(key, num_samples=256, num_examples=n)
    exact = np.linalg.norm(np.asarray(signs, np.float64) @ np.asarray(x, np.float64), axis=1) / n
    sup_error = {}
    for prec in precisions:
        vals = np.asarray(rad.linear_sup(x, norm=2, radius=1.0, precision=prec)(signs), np.float64)
        sup_error[prec] = float(np.max(np.abs(vals - exact) / exact))

    def make(prec, chunk):
        def f(k, x):
            est = rad.rademacher_linear(
                x, k, norm=2, radius=1.0, num_samples=num_draws, chunk_size=chunk, precision=prec
            )
            return est.mean, est.stderr

        return jax.jit(f)

    variants = {(p, c): make(p, c) for p in precisions for c in chunk_sizes}
    first, values = {}, {}
    for name, fn in variants.items():
        t = time.perf_counter()
        values[name] = jax.block_until_ready(fn(key, x))
        first[name] = time.perf_counter() - t
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            times[name].append(timed(fn, key, x))
    ref_chunk = chunk_sizes[-1]
    ref_mean, ref_se = (
        (float(v) for v in values[("highest", ref_chunk)])
        if ("highest" in precisions)
        else (float("nan"), float("nan"))
    )
    recs = []
    for (prec, chunk), ts in times.items():
        med = float(np.median(ts))
        mean = float(values[(prec, chunk)][0])
        rec = {
            "bench": "split",
            "precision": str(prec),
            "chunk_size": chunk,
            "n": n,
            "d": d,
            "draws": num_draws,
            "device": str(jax.devices()[0]),
            "median_s": med,
            "first_call_s": first[(prec, chunk)],
            "draws_per_s": num_draws / med,
            "effective_tflops": 2 * n * d * num_draws / med / 1e12,
            "max_sup_rel_error_vs_float64": sup_error[prec],
            "mean": mean,
            "mean_minus_highest_over_stderr": (mean - ref_mean) / ref_se,
        }
        emit(rec)
        recs.append(rec)
    return recs


NETWORKS = {"tiny": dict(n=64, d=8, h=16), "small": dict(n=256, d=16, h=32)}
PARTS = ("throughput", "memory", "search", "equal_time", "split")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws and repetitions")
    parser.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts")
    args = parser.parse_args()
    if args.rss_child is not None:
        child_rss(args.rss_child)
        return
    parts = set(args.only or PARTS) - ({"memory"} if args.skip_memory else set())
    emit(
        {
            "bench": "env",
            "jax": jax.__version__,
            "devices": [str(dv) for dv in jax.devices()],
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "numpy_blas": blas_info(),
        }
    )
    quick = args.quick
    reps = 2 if quick else 3
    summary = {"bench": "summary"}
    if "throughput" in parts:
        thr = bench_throughput(
            num_draws=8192 if quick else 65536,
            reps=3 if quick else 5,
            chunk_sizes=(256,) if quick else (128, 256, 512),
        )
        best = max(
            (r for k, r in thr.items() if k.startswith("rademacher_linear")),
            key=lambda r: r["gflops"],
        )
        jax_mm = thr["jax_matmul_signs_in_memory"]["gflops"]
        np_mm = thr["numpy_matmul_signs_in_memory"]["gflops"]
        summary.update(
            best_linear_variant=best["variant"],
            linear_vs_jax_matmul=best["gflops"] / jax_mm,
            linear_vs_numpy_matmul=best["gflops"] / np_mm,
            jax_matmul_vs_numpy=jax_mm / np_mm,
            naive_rademacher_vs_jax_matmul=thr["jax_random_rademacher_plus_matmul"]["gflops"]
            / jax_mm,
        )
    if "memory" in parts:
        mem = bench_memory((8192, 131072) if quick else (65536, 1048576))
        summary["peak_rss_ratio_large_vs_small"] = mem[1]["peak_rss_mb"] / mem[0]["peak_rss_mb"]
        summary["xla_temp_mb"] = [m["xla_temp_mb"] for m in mem]
    if "search" in parts:
        chunks = (8, 1024) if quick else (1, 8, 64, 1024)
        searches = {
            name: bench_search(1024, reps, chunks=chunks, **size) for name, size in NETWORKS.items()
        }
        summary["search_speedup_vs_loop"] = {
            name: {k: r["speedup_vs_loop"] for k, r in recs.items() if "one_call" in k}
            for name, recs in searches.items()
        }
    if "equal_time" in parts:
        grid = (5, 10, 20) if quick else (5, 10, 20, 40)
        summary["equal_time_readout_minus_plain"] = {
            name: [
                {k: p.get(k) for k in ("plain_steps", "readout_steps", "difference",
                                       "difference_stderr")}
                for p in bench_equal_time(256, reps, step_grid=grid, **size)[1]
            ]
            for name, size in NETWORKS.items()
        }  # fmt: skip
    if "split" in parts:
        recs = split_sweep(
            (64, 256) if quick else (256, 1024, 4096),
            num_draws=1024 if quick else 16384,
            n=512 if quick else N,
            d=64 if quick else D,
            reps=1 if quick else 3,
        )
        summary["split"] = {
            f"{r['precision']}@{r['chunk_size']}": {
                k: r[k] for k in ("draws_per_s", "max_sup_rel_error_vs_float64",
                                  "mean_minus_highest_over_stderr")
            }
            for r in recs
        }  # fmt: skip
    summary["loadavg_end"] = os.getloadavg()
    emit(summary)


if __name__ == "__main__":
    main()
