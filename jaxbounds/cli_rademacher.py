"""``jaxbounds rademacher``: the empirical Rademacher complexity of a norm ball, run to a target.

``jaxbounds rademacher INPUTS.npy --norm 2 --radius 1 --target-stderr 1e-4 --max-time 2h
--checkpoint run.json --json out.json`` runs :func:`kernels.rademacher_linear`'s sample stream
block by block (:func:`jaxbounds.longrun.run_blocks`): a progress bar, Ctrl-C/SIGTERM between
blocks (the state reached is saved to the checkpoint; the same command again resumes), and at
the end the estimate with its 95% interval and the samples used. Exit status: 0 when a stopping
rule ended the run, 2 for a bad flag, 1 for bad data, 130 (SIGINT) or 143 (SIGTERM) when a
signal stopped it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "parse_duration", "run"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class UsageError(ValueError):
    """A bad flag value (exit status 2)."""


def parse_duration(text: str, flag: str = "--max-time") -> float:
    """Seconds of ``"90"``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1.5d"``.

    Raises:
      UsageError: naming ``flag`` for anything else or a value <= 0.

    >>> parse_duration("2h"), parse_duration("90"), parse_duration("1.5m")
    (7200.0, 90.0, 90.0)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([smhd]?)\s*", text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"{flag} {text!r}: expected a duration > 0 such as 90s, 30m or 2h")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _positive_float(flag: str, value: str, allow_zero: bool = False) -> float:
    try:
        out = float(value)
    except ValueError:
        out = math.nan
    if not (math.isfinite(out) and (out > 0 or (allow_zero and out == 0))):
        what = ">= 0" if allow_zero else "> 0"
        raise UsageError(f"{flag} {value!r}: expected a finite number {what}")
    return out


def _count(flag: str, value: str, minimum: int = 1) -> int:
    try:
        out = int(float(value)) if re.fullmatch(r"[0-9.]+e[0-9]+", value) else int(value)
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected an integer >= {minimum}") from None
    if out < minimum:
        raise UsageError(f"{flag} {value!r}: expected an integer >= {minimum}")
    return out


def add_parser(commands: Any, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``rademacher`` subcommand to the ``jaxbounds`` parser's subcommands."""
    p = commands.add_parser(
        "rademacher",
        parents=[common],
        allow_abbrev=False,
        help="Monte Carlo Rademacher complexity of a norm ball on INPUTS.npy, to a target "
        "standard error or a time budget (resumable)",
        description="Empirical Rademacher complexity of {x -> <w, x> : ||w||_p <= radius} on the "
        "rows of INPUTS.npy, by Monte Carlo over sign vectors, run block by block until the "
        "standard error reaches --target-stderr, --max-samples or --max-time.",
    )
    p.add_argument("inputs", help="an (n, d) float .npy file: n examples in d dimensions")
    p.add_argument("--norm", required=True, help="p of the weight ball (a number >= 1 or inf)")
    p.add_argument("--radius", required=True, help="radius of the weight ball (> 0)")
    p.add_argument("--target-stderr", help="stop when the standard error is at most this")
    p.add_argument("--relative", action="store_true", help="the target is relative to |mean|")
    p.add_argument("--max-samples", help="stop at this many sign vectors")
    p.add_argument("--max-time", help="stop after this wall time (90s, 30m, 2h)")
    p.add_argument("--min-samples", default="1000", help="the stopping rule's minimum (1000)")
    p.add_argument("--seed", default="0", help="PRNG seed (default 0)")
    p.add_argument("--chunk-size", default="auto", help="sign vectors per vectorised batch")
    p.add_argument("--block-size", help="sign vectors per block (default: about 1 s of work)")
    p.add_argument("--checkpoint", help="JSON checkpoint: resumed from if it exists")
    p.add_argument("--checkpoint-every", default="30", help="seconds between checkpoints")
    p.add_argument("--json", dest="json_out", help="write the result as JSON to this path")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _options(args: argparse.Namespace) -> dict[str, Any]:
    norm_text = str(args.norm).lower()
    norm = math.inf if norm_text in ("inf", "infinity") else None
    if norm is None:
        try:
            norm = float(norm_text)
        except ValueError:
            norm = math.nan
        if not norm >= 1:
            raise UsageError(f"--norm {args.norm!r}: expected a number >= 1 or inf")
    opts: dict[str, Any] = {
        "norm": norm,
        "radius": _positive_float("--radius", args.radius),
        "target_stderr": None
        if args.target_stderr is None
        else _positive_float("--target-stderr", args.target_stderr),
        "max_samples": None
        if args.max_samples is None
        else _count("--max-samples", args.max_samples, 2),
        "max_time": None if args.max_time is None else parse_duration(args.max_time),
        "min_samples": _count("--min-samples", args.min_samples, 2),
        "seed": _count("--seed", args.seed, 0),
        "block_size": None
        if args.block_size is None
        else _count("--block-size", args.block_size, 2),
        "checkpoint_every": _positive_float(
            "--checkpoint-every", args.checkpoint_every, allow_zero=True
        ),
    }
    chunk = str(args.chunk_size)
    opts["chunk_size"] = "auto" if chunk == "auto" else _count("--chunk-size", chunk, 1)
    if opts["target_stderr"] is None and opts["max_samples"] is None and opts["max_time"] is None:
        raise UsageError("give --target-stderr, --max-samples or --max-time (when to stop)")
    if args.relative and opts["target_stderr"] is None:
        raise UsageError("--relative: needs --target-stderr")
    for flag, value in (("--json", args.json_out), ("--checkpoint", args.checkpoint)):
        if value is not None:
            _check_output_file(flag, value)
    return opts


def _check_output_file(flag: str, value: str) -> None:
    """Refuse, before any work, a file path that cannot be written at the end of the run."""
    if not value or value.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {value!r}: expected a file name")
    path = Path(value)
    if path.exists() and not path.is_file():
        raise UsageError(f"{flag} {value}: exists and is not a regular file")
    directory = path.parent
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"{flag} {value}: the directory {directory} {what}")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{flag} {value}: the directory {directory} is not writable")


def _load_inputs(path: str) -> Any:
    import numpy as np

    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read a .npy array ({err})") from None
    if x.ndim != 2 or x.shape[0] < 1 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{path}: expected a 2-D float array (n, d), got {x.dtype} {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{path}: the inputs hold NaN or infinite values")
    return x


def run(args: argparse.Namespace) -> int:
    """Run the ``rademacher`` subcommand; return the exit status."""
    try:
        opts = _options(args)
    except UsageError as err:
        print(f"jaxbounds rademacher: error: {err}", file=sys.stderr)
        return 2
    x = _load_inputs(args.inputs)

    from jaxbounds import distributed

    info = distributed.initialize()  # JAXBOUNDS_* variables or a cluster launcher; else alone
    if info.process_count > 1 and opts["block_size"] is None:
        print(
            "jaxbounds rademacher: error: --block-size: several processes need one block size",
            file=sys.stderr,
        )
        return 2

    import jax
    import jax.numpy as jnp

    import kernels
    from jaxbounds.longrun import run_processes
    from kernels.blocks import MonteCarloBlocks

    blocks = MonteCarloBlocks(
        kernels.rademacher_linear,
        jnp.asarray(x),
        jax.random.key(opts["seed"]),
        norm=opts["norm"],
        radius=opts["radius"],
        chunk_size=opts["chunk_size"],
    )
    result = run_processes(
        blocks,
        target_stderr=opts["target_stderr"],
        relative=args.relative,
        max_samples=opts["max_samples"],
        max_time=opts["max_time"],
        min_samples=opts["min_samples"],
        block_size=opts["block_size"],
        checkpoint=args.checkpoint,
        checkpoint_every=opts["checkpoint_every"],
        progress=not args.quiet and info.process_index == 0,
    )
    lo, hi = result.interval
    est = result.estimate
    record = {
        "kernel": "rademacher_linear",
        "inputs": str(Path(args.inputs)),
        "norm": opts["norm"] if math.isfinite(opts["norm"]) else "inf",
        "radius": opts["radius"],
        "mean": result.mean,
        "stderr": result.stderr,
        "interval_95": [lo, hi],
        "mcdiarmid_lower": None if est.lower is None else float(est.lower),
        "mcdiarmid_upper": None if est.upper is None else float(est.upper),
        "num_samples": result.num_samples,
        "num_draws": result.num_samples,
        "seconds": result.seconds,
        "samples_per_second": result.num_samples / max(result.seconds, 1e-9),
        "reason": result.reason,
        "target_stderr": opts["target_stderr"],
        "relative": bool(args.relative),
        "block_size": result.block_size,
        "calibration_seconds": result.calibration_seconds,
        "seed": opts["seed"],
    }
    print(
        f"Rademacher complexity: {result.mean:.6g} +- {result.stderr:.3g} (95%: [{lo:.6g}, "
        f"{hi:.6g}]) from {result.num_samples} sign vectors in {result.seconds:.1f} s; "
        f"stopped: {result.reason}"
    )
    if args.json_out and info.process_index == 0:
        from jaxbounds._atomic import write_json_atomic

        write_json_atomic(args.json_out, record)
    if result.reason == "interrupted":
        where = f"saved to {args.checkpoint}" if args.checkpoint else "not saved (no --checkpoint)"
        print(
            f"jaxbounds rademacher: interrupted; the state is {where}; run the same command again "
            "to resume",
            file=sys.stderr,
        )
        return 128 + (result.signal or signal.SIGINT)
    return 0
