"""Compile once: a second eager call of each kernel vs the same call inside a user's jax.jit.

For every public kernel that runs a program, on the reference Transformer (``bench/_reference.py``,
a smaller batch by default) or on a small data set:

- ``first_s``: first eager call (trace + compile + run);
- ``second_s``: median eager call with the same callable and NEW data of the same shapes;
- ``jit_s``: median call of the user's ``jax.jit`` of the same kernel (compiled beforehand);
- ``ratio`` = second_s / jit_s (target <= 1.1: the entry point adds no recompile and little
  dispatch overhead); ``compiles_second``: XLA compilations during the second calls (target 0).

Prints one JSON record per kernel, then a summary. ``--quick`` uses fewer probes and repeats.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels
from bench import _reference as ref


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Finished XLA compilation"):
            self.count += 1


def timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure(name: str, eager, jitted, datas, repeats: int) -> dict:
    """``eager(data)`` / ``jitted(data)`` run the kernel; ``datas`` are same-shape inputs."""
    first = timed(lambda: eager(datas[0]))
    handler = _Count()
    logger = logging.getLogger("jax._src.dispatch")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    with jax.log_compiles(True):
        second = [timed(lambda d=d: eager(d)) for d in datas[1 : 1 + repeats]]
    logger.removeHandler(handler)
    timed(lambda: jitted(datas[0]))  # compile the user's jit
    user = [timed(lambda d=d: jitted(d)) for d in datas[1 : 1 + repeats]]
    record = {
        "kernel": name,
        "first_s": round(first, 4),
        "second_s": round(statistics.median(second), 5),
        "jit_s": round(statistics.median(user), 5),
        "compiles_second": handler.count,
    }
    record["ratio"] = round(record["second_s"] / record["jit_s"], 3)
    emit(record)
    return record


def transformer_cases(args) -> list:
    params = {k: jnp.asarray(v) for k, v in ref.init_params(0).items()}

    def loss_fn(p, batch):
        return ref.jax_loss(p, batch[0][: args.batch], batch[1][: args.batch])

    datas = []
    for i in range(args.repeats + 1):
        inputs, targets = ref.make_batch(seed=10 + i)
        datas.append((params, (jnp.asarray(inputs), jnp.asarray(targets)), jax.random.key(i)))
    m = args.num_probes
    pert = kernels.Perturbation("gaussian", 1e-2)
    cases = {
        "hessian_trace": lambda p, b, k: kernels.hessian_trace(loss_fn, p, b, k, num_samples=m),
        "hutchpp": lambda p, b, k: kernels.hessian_trace(
            loss_fn, p, b, k, num_matvecs=3 * m, method="hutchpp"
        ),
        "top_eigenvalues": lambda p, b, k: kernels.top_eigenvalues(
            kernels.hvp(loss_fn, p, b), p, k, k=1, num_steps=m
        ),
        "average_sharpness": lambda p, b, k: kernels.average_sharpness(
            loss_fn, p, b, k, perturbation=pert, num_samples=m
        ),
        "sharpness_decomposition": lambda p, b, k: kernels.sharpness_decomposition(
            loss_fn, p, b, k, perturbation=pert, num_samples=m, num_probes=m
        ),
        "worst_case_sharpness": lambda p, b, k: kernels.worst_case_sharpness(
            loss_fn, p, b, k, perturbation=kernels.Perturbation("l2_ball", 0.05), num_steps=5
        ),
    }
    return [(name, fn, datas) for name, fn in cases.items()]


def rademacher_cases(args) -> list:
    rng = np.random.default_rng(0)
    datas = [
        (jnp.asarray(rng.normal(size=(1024, 64)).astype(np.float32)), jax.random.key(i))
        for i in range(args.repeats + 1)
    ]
    draws = 64 * args.num_probes
    linear = lambda x, k: kernels.rademacher_linear(  # noqa: E731
        x, k, norm=2, radius=1.0, num_samples=draws, chunk_size=256
    )
    return [("rademacher_linear", linear, datas)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", action="append", metavar="KERNEL", help="measure only these")
    args = parser.parse_args()
    args.num_probes = 4 if args.quick else 16
    args.repeats = 3 if args.quick else 7
    records = []
    for name, fn, datas in transformer_cases(args) + rademacher_cases(args):
        if args.only and name not in args.only:
            continue
        jitted = jax.jit(fn)
        records.append(
            measure(name, lambda d, fn=fn: fn(*d), lambda d, j=jitted: j(*d), datas, args.repeats)
        )
    worst = max(r["ratio"] for r in records)
    emit(
        {
            "summary": "second eager call / user-jitted call",
            "max_ratio": worst,
            "target": 1.1,
            "met": worst <= 1.1,
            "compiles_on_second_calls": sum(r["compiles_second"] for r in records),
        }
    )


if __name__ == "__main__":
    main()
