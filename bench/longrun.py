"""Benchmark of the long-run driver: throughput of blocks against one big call.

    .venv/bin/python bench/longrun.py [--num-samples 100000000] [--out PATH]

``rademacher_linear`` on a 512 x 16 float32 matrix (the ``jaxbounds rademacher`` acceptance
case), ``num_samples`` sign vectors: one kernel call against ``jaxbounds.longrun.run_blocks``
with ``max_samples=num_samples`` (block size calibrated to about one second). Prints one JSON
record (and writes it to ``--out``): the one call's compile and run times, the driver's
calibration time (compilation of its block sizes included), the time of its blocks after
calibration, and the ratios: ``steady_ratio`` = driver samples/s after calibration over the one
call's samples/s after compilation (goal >= 0.97), ``end_to_end_ratio`` = both with compilation.
The issue's reference count is 10^8 on a quiet machine; a loaded machine gives noisy ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels
from jaxbounds.longrun import run_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-samples", type=float, default=1e8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    num = int(args.num_samples)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(512, 16)), jnp.float32)
    key = jax.random.key(0)
    kw = dict(norm=2, radius=1.0)

    t0 = time.perf_counter()
    lowered = jax.jit(lambda x, k: kernels.rademacher_linear(x, k, num_samples=num, **kw)).lower(
        x, key
    )
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    one = jax.block_until_ready(compiled(x, key))
    one_s = time.perf_counter() - t0

    blocks = kernels.MonteCarloBlocks(kernels.rademacher_linear, x, key, **kw)
    t0 = time.perf_counter()
    reports = []
    run = run_blocks(blocks, max_samples=num, handle_signals=False, callback=reports.append)
    driver_s = time.perf_counter() - t0
    calibration_s = run.calibration_seconds
    # the blocks after calibration: from the first block report to the last
    steady = [r for r in reports if not r.calibrating]
    first, last = steady[0], steady[-1]
    steady_rate = (last.num_samples - first.num_samples) / max(last.seconds - first.seconds, 1e-9)
    record = {
        "bench": "longrun",
        "device": str(jax.devices()[0]),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "num_samples": num,
        "one_call_compile_s": compile_s,
        "one_call_run_s": one_s,
        "one_call_samples_per_s": num / one_s,
        "driver_total_s": driver_s,
        "driver_calibration_s": calibration_s,
        "driver_block_size": run.block_size,
        "driver_blocks_after_calibration": len(steady) - 1,
        "driver_samples_per_s_after_calibration": steady_rate,
        "steady_ratio": steady_rate / (num / one_s),
        "driver_samples_per_s_end_to_end": num / driver_s,
        "end_to_end_ratio": (compile_s + one_s) / driver_s,
        "mean_difference_in_stderr": float(abs(run.mean - float(one.mean)) / float(one.stderr)),
    }
    emit = json.dumps(record)
    print(emit, flush=True)
    if args.out:
        Path(args.out).write_text(emit + "\n")


if __name__ == "__main__":
    main()
