"""A real run on a CPU: the 1B decoder in bfloat16, a Hessian trace to 5% and one sharpness.

One command (about 20 GB of host memory at batch 1 x 32; minutes per probe on 2 cores)::

    python bench/llm_cpu_run.py                      # 1B decoder, batch 1 x 32 tokens
    python bench/llm_cpu_run.py --config tiny        # the same steps in seconds (a smoke run)

The decoder is :class:`jaxbounds.models.Decoder` with its initial weights in bfloat16 (no
checkpoint is downloaded; the weights are the decoder's own initialisation, standard deviation
0.02), on one CPU device, and a batch of random tokens. The kernels take the bfloat16 weights as
they are and evaluate the loss in float32 (``compute_dtype=None``, the default). Steps:

1. the gradient of the float32 loss, compiled and then timed (the unit of cost);
2. ``hessian_trace`` through the anytime driver :func:`jaxbounds.longrun.run_blocks`, one probe
   per block, until its relative standard error is at most ``--target`` (5%) or ``--max-time``
   passes, with a progress bar;
3. one ``average_sharpness`` call (Gaussian, ``--sigma``, ``--pairs`` antithetic pairs),
   compiled first: where XLA's memory plan for it exceeds the memory available, the plan is
   recorded and the call is not run.

The record (``bench/results/llm_cpu_run.json``) gives each step's compile and run seconds, the
time per unit in gradients (a probe, a pair) and the process's peak resident memory
(``ru_maxrss``) after each step, with the machine's load average: the seconds on a shared
machine grow with its load, the ratios less so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peak_gib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _available_gib() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _timed(fn, *args):
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


def build(name: str, batch: int, seq: int, seed: int):
    """``(loss, params, tokens, num_params)``: the decoder at its bfloat16 initialisation."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxbounds.models import Decoder, as_pure, decoder_config, next_token_loss
    from jaxbounds.models.decoder import decoder_num_params

    config = decoder_config(name)
    model = Decoder(config, rngs=nnx.Rngs(seed))
    apply_fn, params = as_pure(model)
    del model
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.bfloat16), params)
    key = jax.random.key(seed + 1)
    tokens = jax.random.randint(key, (batch, seq + 1), 0, config.vocab_size, jnp.int32)
    return next_token_loss(apply_fn), params, tokens, decoder_num_params(config)


def gradient_step(loss, params, tokens, repeats: int) -> dict:
    """Compile and time the gradient of the float32 loss at the bfloat16 weights."""
    import jax
    import jax.numpy as jnp

    def grad(p, b):
        wide = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), p)
        return jax.value_and_grad(loss)(wide, b)

    start = time.perf_counter()
    compiled = jax.jit(grad).lower(params, tokens).compile()
    compile_s = time.perf_counter() - start
    runs = []
    for _ in range(repeats):
        (value, _), seconds = _timed(compiled, params, tokens)
        runs.append(seconds)
    return {
        "step": "gradient",
        "compile_s": round(compile_s, 2),
        "run_s": [round(s, 3) for s in runs],
        "per_unit_s": round(min(runs), 6),
        "loss": float(value),
        "peak_rss_gib": round(_peak_gib(), 2),
        "load": _load(),
    }


def trace_step(loss, params, tokens, args, grad_s: float) -> dict:
    """``hessian_trace`` block by block to the target relative standard error."""
    import jax

    import kernels
    from jaxbounds.longrun import run_blocks
    from kernels.blocks import MonteCarloBlocks

    blocks = MonteCarloBlocks(
        kernels.hessian_trace, loss, params, tokens, jax.random.key(args.seed + 2), chunk_size=1
    )
    times: list[float] = []
    last = [time.perf_counter()]

    def callback(progress) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    run = run_blocks(
        blocks,
        target_stderr=args.target,
        relative=True,
        min_samples=args.min_probes,
        max_time=args.max_time,
        block_size=1,
        checkpoint=args.checkpoint,
        checkpoint_every=0,
        callback=callback,
        progress=True,
    )
    steady = times[1:] or times  # the first block compiles
    # seconds of one probe after the compiling block (none when a resumed run's time was up
    # before its first block)
    per_probe = min(steady) if steady else None
    return {
        "step": "hessian_trace",
        "reason": run.reason,
        "num_probes": run.num_samples,
        "trace": run.mean,
        "stderr": run.stderr,
        "relative_stderr": run.stderr / abs(run.mean) if run.mean else None,
        "first_block_s": round(times[0], 2) if times else None,
        "block_s": [round(t, 2) for t in times],
        "per_unit_s": None if per_probe is None else round(per_probe, 6),
        "per_unit_in_grads": None if per_probe is None else round(per_probe / grad_s, 3),
        "seconds": round(run.seconds, 1),
        "peak_rss_gib": round(_peak_gib(), 2),
        "load": _load(),
    }


def sharpness_step(loss, params, tokens, args, grad_s: float) -> dict:
    """One ``average_sharpness`` call: compiled, then run and timed."""
    import jax

    import kernels

    perturbation = kernels.Perturbation("gaussian", args.sigma)
    key = jax.random.key(args.seed + 3)

    def call(p, b):
        return kernels.average_sharpness(
            loss, p, b, key, perturbation=perturbation, num_samples=args.pairs, chunk_size=1
        )

    start = time.perf_counter()
    compiled = jax.jit(call).lower(params, tokens).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    need = (mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**30
    record = {"step": "average_sharpness", "sigma": args.sigma, "pairs": args.pairs,
              "compile_s": round(compile_s, 2), "xla_gib": round(need, 2)}  # fmt: skip
    free = _available_gib()
    if free is not None and need - mem.argument_size_in_bytes / 2**30 > free:
        # XLA's plan for the program does not fit the memory left: running it would only
        # swap or be killed; the plan is the result
        record.update(not_run=f"XLA plans {need:.1f} GiB, {free:.1f} GiB available",
                      peak_rss_gib=round(_peak_gib(), 2), load=_load())  # fmt: skip
        return record
    est, seconds = _timed(compiled, params, tokens)
    return {
        **record,
        "mean": float(est.mean),
        "stderr": float(est.stderr),
        "run_s": round(seconds, 2),
        "per_unit_s": round(seconds / args.pairs, 3),
        "per_unit_in_grads": round(seconds / args.pairs / grad_s, 3),
        "peak_rss_gib": round(_peak_gib(), 2),
        "load": _load(),
    }


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
        return value

    return parse


def _check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming the flag unless ``--out`` and ``--checkpoint`` can be written, before any work.

    The record is written after each step: a bad place found then would lose the steps done.
    """
    for flag, value in (("--out", args.out), ("--checkpoint", args.checkpoint)):
        if value is None:
            continue
        path = Path(value)
        if path.is_dir():
            parser.error(f"{flag}: expected a file, got the folder {path}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"{flag}: cannot create the folder {path.parent} ({err.strerror})")
        if not os.access(path.parent, os.W_OK):
            parser.error(f"{flag}: cannot write in {path.parent}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="1b", choices=("tiny", "1b"))
    parser.add_argument("--batch", type=_positive(int), default=1)
    parser.add_argument("--seq", type=_positive(int), default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=_positive(float), default=0.05,
                        help="relative standard error of the trace (default 0.05)")  # fmt: skip
    parser.add_argument("--min-probes", type=_positive(int), default=8)
    parser.add_argument("--max-time", type=_positive(float), default=3600.0)
    parser.add_argument("--sigma", type=_positive(float), default=1e-2)
    parser.add_argument("--pairs", type=_positive(int), default=2)
    parser.add_argument("--repeats", type=_positive(int), default=3)
    parser.add_argument("--checkpoint", default=None, help="resume the trace from this file")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "llm_cpu_run.json"))
    args = parser.parse_args(argv)
    _check_paths(parser, args)
    sys.path.insert(0, str(ROOT))
    import jax

    start = time.perf_counter()
    loss, params, tokens, n = build(args.config, args.batch, args.seq, args.seed)
    record = {
        "decoder": args.config,
        "num_params": n,
        "param_dtype": "bfloat16",
        "compute_dtype": "float32 (the kernels' default)",
        "batch": [args.batch, args.seq],
        "platform": jax.devices()[0].platform,
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "build_s": round(time.perf_counter() - start, 1),
        "steps": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(step: dict) -> None:
        record["steps"].append(step)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(step), flush=True)

    grad = gradient_step(loss, params, tokens, args.repeats)
    save(grad)
    save(trace_step(loss, params, tokens, args, grad["per_unit_s"]))
    save(sharpness_step(loss, params, tokens, args, grad["per_unit_s"]))
    return record


if __name__ == "__main__":
    main()
