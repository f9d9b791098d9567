"""``jaxbounds rademacher``: the empirical Rademacher complexity of a norm ball, run to a target.

``jaxbounds rademacher INPUTS.npy --norm 2 --radius 1 --target-stderr 1e-4 --max-time 2h
--checkpoint run.json --json out.json`` runs :func:`kernels.rademacher_linear`'s sample stream
block by block (:func:`jaxbounds.longrun.run_blocks`): a progress bar, Ctrl-C/SIGTERM between
blocks (the state reached is saved to the checkpoint; the same command again resumes; a second
Ctrl-C saves it and exits at once, and later ones cannot cut those writes short), and at the end
the estimate with its 95% interval and the samples used, printed after the checkpoint and the
``--json`` file are written (a closed stdout loses only the line). The file's dtype is the
compute dtype: a float64 file runs in float64 (JAX's 64-bit mode is switched on for it), a
float16 one in float32 (exact), with a note. The checkpoint and the ``--json`` file are each
locked while a job runs and may not be the inputs file; a ``--json`` file that holds another
job's result is replaced only with ``--fresh`` (which also starts over an existing checkpoint).
Exit status: 0 when a stopping rule ended the run, 2 for a bad flag or a checkpoint that cannot
be resumed (another problem or block size, damaged), 1 for bad data or a failed block (the
checkpoint and the JSON of the samples finished are written first), 130 (SIGINT) or 143
(SIGTERM) when a signal stopped it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "parse_duration", "run"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SEED_LIMIT = 2**32
# jaxbounds.longrun.MAX_BLOCK_SIZE, the largest block (importing longrun here would import JAX
# before the flags are read)
_MAX_BLOCK_SIZE = 2**24


class UsageError(ValueError):
    """A bad flag value (exit status 2)."""


class InputError(ValueError):
    """An unreadable or unusable inputs file (exit status 1)."""


def parse_duration(text: str, flag: str = "--max-time") -> float:
    """Seconds of ``"90"``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1.5d"``.

    Raises:
      UsageError: naming ``flag`` for anything else or a value <= 0.

    >>> parse_duration("2h"), parse_duration("90"), parse_duration("1.5m")
    (7200.0, 90.0, 90.0)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([smhd]?)\s*", text.lower())
    if match is None or not 0 < float(match.group(1)) < math.inf:
        raise UsageError(f"{flag} {text!r}: expected a duration > 0 such as 90s, 30m or 2h")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds):
        raise UsageError(f"{flag} {text!r}: expected a finite duration")
    return seconds


def _number(value: str) -> float:
    """``float(value)``, but NaN for what Python reads and a user means otherwise (``1_0``)."""
    if "_" in str(value):  # Python's float reads 1_0 as 10: a typo, not a number
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


def _positive_float(flag: str, value: str, allow_zero: bool = False) -> float:
    out = _number(value)
    if not (math.isfinite(out) and (out > 0 or (allow_zero and out == 0))):
        what = ">= 0" if allow_zero else "> 0"
        raise UsageError(f"{flag} {value!r}: expected a finite number {what}")
    return out


def _count(
    flag: str, value: str, minimum: int = 1, limit: int | None = None, what: str | None = None
) -> int:
    """An integer flag: ``1000``, ``1e4`` or ``1E4`` (an exact integer), in ``[minimum, limit)``.

    ``what`` describes the range in the message (default ``an integer in [minimum, limit)``).
    """
    if what is None and limit is None:
        what = f"an integer >= {minimum}"
    elif what is None:
        what = f"an integer in [{minimum}, {limit})"
    text = value.strip()
    try:
        if re.fullmatch(r"[0-9]+", text):
            out = int(text)
        elif re.fullmatch(r"[0-9]*\.?[0-9]+[eE]\+?[0-9]+", text):
            number = float(text)
            if not (math.isfinite(number) and number == int(number)):
                raise ValueError
            out = int(number)
        else:
            raise ValueError
    except (ValueError, OverflowError):
        raise UsageError(f"{flag} {value!r}: expected {what}") from None
    if out < minimum or (limit is not None and out >= limit):
        raise UsageError(f"{flag} {value!r}: expected {what}")
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
    p.add_argument("--max-samples", help="stop at this many sign vectors (>= 2)")
    p.add_argument(
        "--max-time",
        help="stop after this wall time of this run (90s, 30m, 2h; the time of the runs a "
        "checkpoint resumes is not counted)",
    )
    p.add_argument("--min-samples", default="1000", help="the stopping rule's minimum (1000)")
    p.add_argument("--seed", default="0", help="PRNG seed, in [0, 2**32) (default 0)")
    p.add_argument("--chunk-size", default="auto", help="sign vectors per vectorised batch")
    p.add_argument(
        "--block-size",
        help="sign vectors per block, at most 2**24 = 16777216 (default: about 1 s of work). A "
        "block is one compiled loop over chunks of --chunk-size vectors that cannot stop "
        "part-way: Ctrl-C, SIGTERM and --max-time wait for its end. The maximum keeps that wait "
        "to seconds on a CPU (2**24 vectors of a 512 x 16 matrix: about 9 s); a larger block "
        "would save nothing, a block's fixed cost being milliseconds",
    )
    p.add_argument("--checkpoint", help="JSON checkpoint: resumed from if it exists")
    p.add_argument("--checkpoint-every", default="30", help="seconds between checkpoints")
    p.add_argument("--json", dest="json_out", help="write the result as JSON to this path")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: ignore an existing checkpoint and replace a --json file of another job",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _norm(value: str) -> float:
    text = str(value).strip().lower()
    if text in ("inf", "infinity"):
        return math.inf
    norm = _number(text)  # 1e400 overflows to inf: not what was written
    if not (math.isfinite(norm) and norm >= 1):
        raise UsageError(f"--norm {value!r}: expected a finite number >= 1, or inf")
    return norm


def _optional(args: argparse.Namespace, name: str, parse: Any) -> Any:
    value = getattr(args, name)
    return None if value is None else parse(value)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "norm": _norm(args.norm),
        "radius": _positive_float("--radius", args.radius),
        "target_stderr": _optional(
            args, "target_stderr", lambda v: _positive_float("--target-stderr", v)
        ),
        "max_samples": _optional(args, "max_samples", lambda v: _count("--max-samples", v, 2)),
        "max_time": _optional(args, "max_time", parse_duration),
        "min_samples": _count("--min-samples", args.min_samples, 1),
        "seed": _count("--seed", args.seed, 0, _SEED_LIMIT),
        "block_size": _optional(
            args,
            "block_size",
            lambda v: _count(
                "--block-size", v, 1, _MAX_BLOCK_SIZE + 1, "an integer from 1 to 2**24 = 16777216"
            ),
        ),
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
    outputs = [(f, v) for f, v in (("--json", args.json_out), ("--checkpoint", args.checkpoint))]
    for flag, value in outputs:
        if value is not None:
            _check_output_file(flag, value)
            if _same_file(value, args.inputs):  # --fresh would write over the inputs
                raise UsageError(f"{flag} {value}: is the inputs file; give another file")
    if args.json_out and args.checkpoint and _same_file(args.json_out, args.checkpoint):
        raise UsageError(f"--json, --checkpoint: both name {args.json_out}; give two files")
    return opts


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: the same inode where both exist (links included)."""
    with contextlib.suppress(OSError, ValueError):
        return os.path.samefile(a, b)
    return Path(a).resolve() == Path(b).resolve()


def _check_output_file(flag: str, value: str) -> None:
    """Refuse, before any work, a file path that cannot be written at the end of the run.

    The directory is tried with a real temporary file (what the atomic write does at the end),
    so a place that looks writable but is not (``/proc``, a read-only mount) is refused too.
    """
    if not value or value.endswith(("/", os.sep)):
        raise UsageError(f"{flag} {value!r}: expected a file name")
    path = Path(value)
    if path.exists() and not path.is_file():
        raise UsageError(f"{flag} {value}: exists and is not a regular file")
    directory = path.parent
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"{flag} {value}: the directory {directory} {what}")
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise UsageError(f"{flag} {value}: cannot write in {directory} ({reason})") from None


_NPY_MAGIC = b"\x93NUMPY"


def _read_array(path: str) -> Any:
    """The array of a ``.npy`` file, or an :class:`InputError` naming the file and the fault."""
    import numpy as np

    file = Path(path)
    if not file.is_file():
        what = "is not a regular file" if file.exists() else "does not exist"
        raise InputError(f"{path}: {what}")
    try:
        with file.open("rb") as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror})") from None
    if not head:
        raise InputError(f"{path}: the file is empty (expected a .npy array)")
    if head[:2] == b"PK":
        raise InputError(
            f"{path}: a .npz archive (several arrays); save the one (n, d) array with numpy.save"
        )
    if head != _NPY_MAGIC:
        raise InputError(f"{path}: not a .npy file (NumPy's format; write it with numpy.save)")
    try:
        with file.open("rb") as handle:
            _check_npy_size(path, handle, os.fstat(handle.fileno()).st_size)
        return np.load(file, allow_pickle=False)
    except InputError:
        raise
    except ValueError as err:
        if "pickled" in str(err) or "allow_pickle" in str(err):
            raise InputError(f"{path}: holds Python objects, not numbers") from None
        raise InputError(f"{path}: cannot read the .npy array ({err})") from None
    except (OSError, EOFError) as err:
        raise InputError(f"{path}: truncated or damaged .npy file ({err})") from None
    except MemoryError:
        raise InputError(f"{path}: the array does not fit in memory") from None


def _check_npy_size(path: str, handle: Any, size: int) -> None:
    """Compare the data a ``.npy`` header describes with the file's bytes, before reading it.

    A header is a few bytes that can ask for any shape: a ``(10**12, 10**6)`` header before
    64 bytes of data would have ``np.load`` allocate 4 EB first.
    """
    import numpy as np

    fmt = np.lib.format
    version = fmt.read_magic(handle)
    read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
    if read is None:  # version 3.0 (UTF-8 field names): np.load reads and checks it
        return
    shape, _, dtype = read(handle)
    if dtype.hasobject:  # pickled objects: refused by np.load
        return
    need, have = math.prod(shape) * dtype.itemsize, size - handle.tell()
    if need > have:
        raise InputError(
            f"{path}: truncated or damaged .npy file: its header describes a {shape} {dtype} "
            f"array of {need} bytes, but the file holds {have} bytes of data"
        )


def _load_inputs(path: str) -> tuple[Any, str | None]:
    """The (n, d) inputs in a dtype JAX computes in, and a note when the file's was changed."""
    import numpy as np

    x = _read_array(path)
    if not isinstance(x, np.ndarray) or x.ndim != 2 or 0 in x.shape:
        raise InputError(f"{path}: expected a 2-D (n, d) float array, got shape {np.shape(x)}")
    if not np.issubdtype(x.dtype, np.floating):
        raise InputError(f"{path}: expected a float array (float32 or float64), got {x.dtype}")
    note = None
    if x.dtype.byteorder not in ("=", "|"):
        x = x.astype(x.dtype.newbyteorder("="))
    if x.dtype == np.float16:
        x, note = x.astype(np.float32), "float16 inputs run in float32 (every value is exact)"
    elif x.dtype not in (np.float32, np.float64):
        note = f"{path}: {x.dtype} inputs run in float64, the widest dtype JAX computes in"
        x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise InputError(f"{path}: the inputs hold NaN or infinite values")
    return x, note


def _check_radius(radius: float, dtype: Any) -> None:
    import numpy as np

    info = np.finfo(dtype)
    if not float(info.tiny) <= radius <= float(info.max):
        raise UsageError(
            f"--radius {radius:g}: outside the normal range of {np.dtype(dtype).name}, the "
            f"inputs' dtype ([{float(info.tiny):g}, {float(info.max):g}])"
        )


def _lock(held: contextlib.ExitStack, flag: str, value: str) -> None:
    """Hold a lock beside ``value`` (``.NAME.lock``) for the run; busy -> a UsageError."""
    from jaxbounds._atomic import LockBusy, exclusive_lock

    path = Path(value)
    lock = path.with_name(f".{path.name}.lock")
    try:
        held.enter_context(exclusive_lock(lock))
    except LockBusy as busy:
        who = f"process {busy.pid}" if busy.pid is not None else "another process"
        raise UsageError(
            f"{flag} {value}: {who} is running a job on it (lock {lock}); wait for it to end or "
            f"choose another {flag}"
        ) from None


def _check_json_owner(path: str, fingerprint: str, fresh: bool) -> None:
    """Refuse a ``--json`` file of another job (another problem) unless ``--fresh``."""
    file = Path(path)
    if fresh or not file.exists():
        return
    try:
        record = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if isinstance(record, dict) and record.get("fingerprint") == fingerprint:
        return
    if isinstance(record, dict) and record.get("kernel") == "rademacher_linear":
        what = (
            f"the result of another job (inputs {record.get('inputs')}, norm "
            f"{record.get('norm')}, radius {record.get('radius')}, seed {record.get('seed')})"
        )
    else:
        what = "a file that is not a result of this job"
    raise UsageError(f"--json {path}: holds {what}; pass --fresh to replace it")


def _record(
    args: argparse.Namespace, opts: dict[str, Any], result: Any, fingerprint: str, dtype: str
) -> dict[str, Any]:
    lo, hi = result.interval
    est = result.estimate
    lower = None if est is None or est.lower is None else float(est.lower)
    upper = None if est is None or est.upper is None else float(est.upper)
    return {
        "kernel": "rademacher_linear",
        "inputs": str(Path(args.inputs)),
        "dtype": dtype,
        "norm": opts["norm"] if math.isfinite(opts["norm"]) else "inf",
        "radius": opts["radius"],
        "mean": result.mean,
        "stderr": result.stderr,
        "interval_95": [lo, hi],
        "mcdiarmid_lower": lower,
        "mcdiarmid_upper": upper,
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
        "fingerprint": fingerprint,
    }


def _result_line(result: Any) -> str:
    lo, hi = result.interval
    return (
        f"Rademacher complexity: {result.mean:.6g} +- {result.stderr:.3g} (95%: [{lo:.6g}, "
        f"{hi:.6g}]) from {result.num_samples} sign vectors in {result.seconds:.1f} s; "
        f"stopped: {result.reason}"
    )


class _Job:
    """One ``rademacher`` command: its options, inputs, problem and outputs."""

    def __init__(self, args: argparse.Namespace, opts: dict[str, Any]) -> None:
        self.args, self.opts = args, opts
        self.x, self.note = _load_inputs(args.inputs)
        _check_radius(opts["radius"], self.x.dtype)
        self.dtype = str(self.x.dtype)
        self.blocks: Any = None
        self.main_process = True

    def build(self) -> None:
        from jaxbounds import distributed

        info = distributed.initialize()  # JAXBOUNDS_* variables or a cluster launcher
        self.main_process = info.process_index == 0
        if info.process_count > 1 and self.opts["block_size"] is None:
            raise UsageError("--block-size: several processes need one block size")
        import jax

        if self.dtype == "float64":
            jax.config.update("jax_enable_x64", True)  # the file's dtype is the compute dtype
        import jax.numpy as jnp

        import kernels
        from kernels.blocks import MonteCarloBlocks

        inputs = jnp.asarray(self.x)
        assert str(inputs.dtype) == self.dtype, (inputs.dtype, self.dtype)
        self.blocks = MonteCarloBlocks(
            kernels.rademacher_linear, inputs, jax.random.key(self.opts["seed"]),
            norm=self.opts["norm"], radius=self.opts["radius"],
            chunk_size=self.opts["chunk_size"],
        )  # fmt: skip

    def write(self, result: Any) -> None:
        """The ``--json`` record of ``result`` (None: nothing to write)."""
        if self.args.json_out and self.main_process and result is not None:
            from jaxbounds._atomic import write_json_atomic

            record = _record(self.args, self.opts, result, self.blocks.fingerprint, self.dtype)
            write_json_atomic(self.args.json_out, record)

    def report(self, result: Any) -> None:
        """The files first (a closed stdout must not lose them), then the result line."""
        self.write(result)
        if result is not None and self.main_process:
            _print_result(_result_line(result))

    def abort(self, result: Any) -> None:
        """A second signal: the JSON and the result line of the samples finished, then exit."""
        self.report(result)
        _say_interrupted(self.args.checkpoint, started=result is not None)

    def run(self) -> Any:
        from jaxbounds.longrun import run_processes

        return run_processes(
            self.blocks,
            target_stderr=self.opts["target_stderr"], relative=self.args.relative,
            max_samples=self.opts["max_samples"], max_time=self.opts["max_time"],
            min_samples=self.opts["min_samples"], block_size=self.opts["block_size"],
            checkpoint=self.args.checkpoint, checkpoint_every=self.opts["checkpoint_every"],
            progress=not self.args.quiet and self.main_process, resume=not self.args.fresh,
            on_second_signal="exit", on_abort=self.abort,
        )  # fmt: skip


def _print_result(line: str) -> None:
    """Print the result line; a reader that has gone (``... | head``) only loses the line."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # no later write or flush fails again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def _say_interrupted(checkpoint: str | None, *, started: bool = True) -> None:
    where = f"saved to {checkpoint}" if checkpoint else "not saved (no --checkpoint)"
    if not started:
        where = "not saved (no block had finished)"
    print(
        f"jaxbounds rademacher: interrupted; the state is {where}; run the same command again "
        "to resume",
        file=sys.stderr,
        flush=True,
    )


def _error(text: str) -> None:
    print(f"jaxbounds rademacher: error: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the ``rademacher`` subcommand; return the exit status."""
    from jaxbounds._atomic import SignalGuard

    try:
        with contextlib.ExitStack() as held:
            opts = _options(args)
            for flag, value in (("--checkpoint", args.checkpoint), ("--json", args.json_out)):
                if value is not None:
                    _lock(held, flag, value)
            job = _Job(args, opts)
            if job.note:
                print(f"jaxbounds rademacher: {job.note}", file=sys.stderr, flush=True)
            job.build()
            if args.json_out:
                _check_json_owner(args.json_out, job.blocks.fingerprint, args.fresh)
            # SIGINT/SIGTERM from here to the end only ask to stop (the run's own guard acts on
            # them while it runs) and never cut the writes of the outputs short
            with SignalGuard(hold=True) as stop:
                code, result = _run_job(job)
    except UsageError as err:
        _error(str(err))
        return 2
    except InputError as err:
        _error(str(err))
        return 1
    signum = (result.signal if result is not None else None) or stop.requested
    if code == 0 and signum is not None:
        _say_interrupted(args.checkpoint)
        return 128 + signum
    return code


def _run_job(job: _Job) -> tuple[int, Any]:
    """Run the job and write its outputs: ``(exit status, result)``."""
    from jaxbounds._atomic import Interrupted
    from jaxbounds.longrun import CheckpointError, RunFailed

    try:
        result = job.run()
    except CheckpointError as err:
        own = "" if _same_file(err.path, job.args.checkpoint) else f" ({err.path})"  # a process's
        raise UsageError(
            f"--checkpoint {job.args.checkpoint}{own}: {err.reason}; pass --fresh to start over, "
            "or choose another --checkpoint"
        ) from None
    except RunFailed as failed:
        job.write(failed.partial)
        _error(f"{failed} (the samples finished are saved)")
        return 1, None
    except Interrupted as err:  # asked to stop before the first block: nothing to write
        _say_interrupted(None, started=False)
        return err.exit_code, None
    job.report(result)
    return 0, result
