r"""Long Monte Carlo runs: a kernel's sample stream block by block, to a precision or a budget.

:func:`run_blocks` runs the blocks of a :class:`kernels.blocks.MonteCarloBlocks` problem (each
block one compiled program of a fixed size, whatever the total) and stops at the first of: the
stopping rule met for a target standard error (absolute, or relative to the mean), a maximum
number of samples, a wall-time budget, or SIGINT/SIGTERM (handled between blocks: the blocks
finished are kept and saved). Progress (samples/s, the mean and its standard error, an ETA for
the target) goes to a callback and, on request, a tqdm bar. A checkpoint (JSON, written
atomically every ``checkpoint_every`` seconds and at the end) holds the merged state; a run
given an existing checkpoint resumes from it, and checkpoints of disjoint runs (other processes
or machines: ``worker``/``num_workers``) merge with :func:`merge_checkpoints`. Memory is that of
one block's chunk, constant in the number of samples. The block size defaults to about
``block_seconds`` of work, measured on the first blocks (the calibration's time is recorded; at
most :data:`MAX_BLOCK_SIZE`; a calibration cut short is not saved and is done again on resume).

Stopping rule (:func:`target_reached`): after at least ``min_samples`` samples, stop at the
first block end where $\hat s_n/\sqrt n \le \varepsilon$ (absolute target $\varepsilon$) or
$\hat s_n/\sqrt n \le \varepsilon\,|\bar Y_n|$ (relative), and report the interval
$\bar Y_N \pm z_{0.975}\,\hat s_N/\sqrt N$. This is the fixed-width sequential rule of Chow &
Robbins (1965): for samples of finite variance its coverage tends to the nominal 95% as the
target shrinks (Chow & Robbins, Theorem 2). Stopping at the *first* time the sample standard
error dips below the target under-covers when few samples are in (the sample variance is then
often low by chance); the minimum sample count removes that regime. The tests simulate 4000
runs of the rule on the Rademacher sups of a small linear class (blocks of 50 samples,
``min_samples=100``, the target reached after 500 to 750 samples) and measure a coverage of the
nominal 95% interval of 95.5% (absolute target) and 95.6% (relative); the naive rule on the same
stream covers 90.1% (``tests/jaxbounds/test_longrun.py``).

References:
  Chow & Robbins 1965, Ann. Math. Statist. 36(2), doi:10.1214/aoms/1177700156; Chan, Golub &
  LeVeque 1979, Stanford report STAN-CS-79-773 (the merges).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import operator
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxbounds._atomic import Interrupted, SignalGuard, write_json_atomic
from kernels.blocks import MonteCarloBlocks, MonteCarloState, merge_states
from kernels.estimate import Estimate
from kernels.parallel import MAX_SAMPLES

__all__ = [
    "MAX_BLOCK_SIZE",
    "CheckpointError",
    "LongRun",
    "Progress",
    "RunFailed",
    "load_checkpoint",
    "merge_checkpoints",
    "run_blocks",
    "run_processes",
    "target_reached",
]

FORMAT = "jaxbounds.longrun/1"
Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal
# the largest block (--block-size's too): a stop waits for a block's end (docs/long-runs.md)
MAX_BLOCK_SIZE = 2**24


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed: unreadable, not a checkpoint, or of another run.

    Attributes:
      path: the checkpoint file; ``reason`` what is wrong with it (the message without the path).
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"checkpoint {path}: {reason}")
        self.path, self.reason = Path(path), reason


@dataclasses.dataclass(frozen=True)
class Progress:
    r"""What :func:`run_blocks` reports after each block.

    Attributes:
      num_samples: samples in the state (this run and the ones it resumed).
      seconds: wall time of the run so far (resumed runs included).
      rate: samples per second over the blocks of this invocation.
      mean: the stream's mean (its first element for vector samples).
      stderr: its standard error.
      eta: seconds until the target is expected to be met (``stderr`` falls as
        $1/\\sqrt n$), or None without a target.
      block_size: samples in the last block.
      calibrating: whether the block was one of the block-size calibration.
    """

    num_samples: int
    seconds: float
    rate: float
    mean: float
    stderr: float
    eta: float | None
    block_size: int
    calibrating: bool = False


@dataclasses.dataclass(frozen=True)
class LongRun:
    """The result of :func:`run_blocks`.

    Attributes:
      estimate: the kernel's result for the samples of ``state`` (an Estimate or the kernel's
        result type).
      state: the merged :class:`~kernels.blocks.MonteCarloState`.
      reason: why the run stopped: ``"target"``, ``"max_samples"``, ``"max_time"`` or
        ``"interrupted"``.
      mean: the stream's mean (first element) and ``stderr`` its standard error, as floats.
      stderr: see ``mean``.
      num_samples: samples in ``state``.
      seconds: wall time, resumed runs included.
      block_size: samples per block.
      calibration_seconds: the time of the block-size calibration (compilation included), 0 when
        the block size was given or resumed.
      signal: the number of the signal that interrupted the run, else None.
    """

    estimate: Any
    state: MonteCarloState
    reason: str
    mean: float
    stderr: float
    num_samples: int
    seconds: float
    block_size: int
    calibration_seconds: float
    signal: int | None = None

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% interval ``mean -+ 1.96 stderr`` of the stopping rule."""
        return self.mean - Z95 * self.stderr, self.mean + Z95 * self.stderr


def target_reached(
    num_samples: Any,
    mean: Any,
    stderr: Any,
    *,
    target_stderr: float,
    relative: bool = False,
    min_samples: int = 1000,
) -> Any:
    r"""The stopping rule: $n \ge n_{\min}$ and $\hat s_n/\sqrt n \le \varepsilon$.

    With ``relative``, the bound is $\varepsilon|\bar Y_n|$.

    Works elementwise on NumPy arrays (the coverage simulation applies it to many runs at once).

    Args:
      num_samples: $n$.
      mean: $\bar Y_n$.
      stderr: $\hat s_n / \sqrt n$.
      target_stderr: $\varepsilon > 0$.
      relative: compare with $\varepsilon |\bar Y_n|$.
      min_samples: $n_{\min}$.

    Returns:
      Whether to stop (a bool or a bool array).

    >>> bool(target_reached(2000, 1.0, 0.001, target_stderr=0.002))
    True
    >>> bool(target_reached(500, 1.0, 0.001, target_stderr=0.002))  # too few samples
    False
    """
    bound = target_stderr * np.abs(mean) if relative else target_stderr
    ok = np.logical_and(np.asarray(num_samples) >= min_samples, np.isfinite(stderr))
    return np.logical_and(ok, np.asarray(stderr) <= bound)


def _raw_stream(state: MonteCarloState) -> tuple[float, float]:
    """Mean and standard error of the stream's values (first element), as the state holds them."""
    stats = state.stats()
    mean = float(np.reshape(np.asarray(stats.mean), (-1,))[0])
    if state.count < 2:
        return mean, math.inf
    m2 = float(np.reshape(np.asarray(stats.m2), (-1,))[0])
    return mean, math.sqrt(m2 / (state.count - 1) / state.count)


def _primary(result: Any, state: MonteCarloState) -> tuple[float, float]:
    r"""Mean and standard error (first element) of a kernel's Estimate (or of its ``average``).

    A result without one (SLQ's nodes, a spectral density) reports the stream's own mean and
    standard error (for SLQ each probe's $v^\top A v / \|v\|^2$, an estimate of
    $\operatorname{tr} A / n$).
    """
    est = result if isinstance(result, Estimate) else getattr(result, "average", None)
    if not isinstance(est, Estimate):
        return _raw_stream(state)
    mean = float(np.reshape(np.asarray(est.mean), (-1,))[0])
    return mean, float(np.reshape(np.asarray(est.stderr), (-1,))[0])


def _estimate_map(blocks: MonteCarloBlocks, state: MonteCarloState) -> tuple[float, float]:
    """``(a, b)`` with the kernel's mean ``a * m + b`` and stderr ``a * s`` from the stream's.

    A kernel may keep its stream in other units than its estimate (the Rademacher kernels hold
    their sups times a power of two, against overflow); the map is read once from the kernel's
    own estimate of one state (one program), so progress and the stopping rule speak the
    estimate's units.
    """
    mean, stderr = _primary(blocks.estimate(state), state)
    raw_mean, raw_stderr = _raw_stream(state)
    if math.isfinite(raw_stderr) and raw_stderr > 0 and math.isfinite(stderr):
        a = stderr / raw_stderr
    elif raw_mean != 0 and math.isfinite(mean):
        a = mean / raw_mean
    else:
        a = 1.0
    return a, mean - a * raw_mean


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint of :func:`run_blocks` (its ``"state"`` as a MonteCarloState).

    Raises:
      CheckpointError: (a ValueError) if the file cannot be read or is not such a checkpoint.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise CheckpointError(path, f"cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(path, f"not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(path, f"not a {FORMAT} checkpoint")
    try:
        if "state" not in data:
            raise ValueError("it holds no state")
        data["state"] = MonteCarloState.from_json(data["state"])
    except ValueError as err:
        raise CheckpointError(path, f"a damaged checkpoint ({err})") from None
    return data


def merge_checkpoints(paths: Sequence[str | os.PathLike[str]]) -> MonteCarloState:
    """Merge the states of checkpoints of disjoint runs (workers, processes, machines).

    Raises:
      ValueError: if a file is not a checkpoint, or the states belong to different problems or
        overlap.
    """
    return merge_states(*[load_checkpoint(p)["state"] for p in paths])


def _allgather_text(text: str) -> list[str]:
    """Every process's ``text`` (JAX's multi-process runtime; one process: ``[text]``)."""
    if jax.process_count() == 1:
        return [text]
    from jax.experimental import multihost_utils

    data = np.frombuffer(text.encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int64))
    longest = int(np.max(sizes))
    padded = np.zeros(longest, np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    sizes = np.asarray(sizes).reshape(-1)
    return [bytes(row[: int(n)]).decode() for row, n in zip(gathered, sizes, strict=True)]


def run_processes(
    blocks: MonteCarloBlocks,
    *,
    block_size: int | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    **options: Any,
) -> LongRun:
    r""":func:`run_blocks` on every process of a multi-process JAX program, merged at the end.

    Call it on every process (after :func:`jaxbounds.distributed.initialize`) with the same
    arguments. Process $p$ of $P$ runs the blocks $j \equiv p \pmod P$ on its own devices
    (``kernels.using_devices(jax.local_devices())``) with its own stopping rule (the target
    times $\sqrt P$, its share of ``max_samples``) and checkpoint (``checkpoint`` with
    ``.{p}of{P}`` before the suffix); then the processes exchange their states (JAX's
    ``process_allgather``) and every process returns the merged run. One process: the same as
    :func:`run_blocks`.

    Args:
      blocks: the problem, the same on every process.
      block_size: samples per block, the same on every process (None: calibrated, with one
        process only).
      checkpoint: the checkpoint path (each process writes and resumes its own file).
      **options: the other options of :func:`run_blocks` (not ``worker``/``num_workers``).

    Returns:
      The merged :class:`LongRun` (its ``reason`` is this process's; ``seconds`` the longest
      process's).
    """
    import kernels

    index, count = jax.process_index(), jax.process_count()
    path = None
    if checkpoint is not None:
        base = Path(checkpoint)
        path = base if count == 1 else base.with_name(f"{base.stem}.{index}of{count}{base.suffix}")
    with kernels.using_devices(jax.local_devices()):
        mine = run_blocks(blocks, block_size=block_size, checkpoint=path, worker=index,
                          num_workers=count, **options)  # fmt: skip
    if count == 1:
        return mine
    record = json.dumps({"seconds": mine.seconds, "state": mine.state.to_json()})
    parts = [json.loads(text) for text in _allgather_text(record)]
    state = merge_states(*[MonteCarloState.from_json(part["state"]) for part in parts])
    with kernels.using_devices(jax.local_devices()):
        estimate = blocks.estimate(state)
    mean, stderr = _primary(estimate, state)
    return dataclasses.replace(
        mine, estimate=estimate, state=state, mean=mean, stderr=stderr,
        num_samples=state.count, seconds=max(part["seconds"] for part in parts),
    )  # fmt: skip


def _save(path: Path, state: MonteCarloState, **info: Any) -> None:
    write_json_atomic(path, {"format": FORMAT, **info, "state": state.to_json()})


class RunFailed(ValueError):
    """A block of :func:`run_blocks` failed; the blocks finished before it were saved first.

    Attributes:
      partial: the :class:`LongRun` of the samples finished before the failure (``reason``
        ``"error"``), or None when none finished (or fewer than the kernel's minimum of 2).
      error: the block's exception.
    """

    def __init__(self, message: str, partial: LongRun | None, error: BaseException) -> None:
        super().__init__(message)
        self.partial = partial
        self.error = error


def _count_option(name: str, value: Any, minimum: int, *, optional: bool = True) -> int | None:
    """``value`` as an int >= ``minimum`` (any integer type: Python, NumPy); else a ValueError."""
    if value is None and optional:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}") from None
    if out < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return out


def _number_option(name: str, value: Any, what: str) -> float | None:
    """``value`` as a finite float > 0 (None stays None); else a ValueError naming ``name``."""
    if value is None:
        return None
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected {what}, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class _Options:
    """The checked options of :func:`run_blocks`."""

    target_stderr: float | None
    relative: bool
    max_samples: int | None
    max_time: float | None
    min_samples: int
    block_size: int | None
    block_seconds: float
    checkpoint_every: float
    worker: int
    num_workers: int
    resume: bool
    on_second_signal: str

    @classmethod
    def check(cls, **kw: Any) -> _Options:
        kw["target_stderr"] = _number_option(
            "target_stderr", kw["target_stderr"], "a finite number > 0"
        )
        kw["max_time"] = _number_option("max_time", kw["max_time"], "a number of seconds > 0")
        kw["block_seconds"] = _number_option("block_seconds", kw["block_seconds"], "a number > 0")
        every = kw["checkpoint_every"]
        if not (isinstance(every, int | float) and not isinstance(every, bool) and every >= 0):
            raise ValueError(f"checkpoint_every: expected a number of seconds >= 0, got {every!r}")
        kw["max_samples"] = _count_option("max_samples", kw["max_samples"], 2)
        kw["block_size"] = _count_option("block_size", kw["block_size"], 1)
        kw["min_samples"] = _count_option("min_samples", kw["min_samples"], 1, optional=False)
        kw["num_workers"] = _count_option("num_workers", kw["num_workers"], 1, optional=False)
        worker = _count_option("worker", kw["worker"], 0, optional=False)
        if worker >= kw["num_workers"]:
            raise ValueError(f"worker: expected an int in [0, {kw['num_workers']}), got {worker!r}")
        kw["worker"] = worker
        if kw["on_second_signal"] not in ("raise", "exit"):
            raise ValueError(
                f"on_second_signal: expected 'raise' or 'exit', got {kw['on_second_signal']!r}"
            )
        if kw["target_stderr"] is None and kw["max_samples"] is None and kw["max_time"] is None:
            raise ValueError(
                "target_stderr, max_samples, max_time: give at least one stopping rule"
            )
        if kw["num_workers"] > 1 and kw["block_size"] is None:
            raise ValueError("block_size: several workers need one block size given to all")
        return cls(**kw)


def run_blocks(
    blocks: MonteCarloBlocks,
    *,
    target_stderr: float | None = None,
    relative: bool = False,
    max_samples: int | None = None,
    max_time: float | None = None,
    min_samples: int = 1000,
    block_size: int | None = None,
    block_seconds: float = 1.0,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: float = 30.0,
    worker: int = 0,
    num_workers: int = 1,
    callback: Callable[[Progress], None] | None = None,
    progress: bool = False,
    handle_signals: bool = True,
    resume: bool = True,
    on_second_signal: str = "raise",
    on_abort: Callable[[LongRun | None], None] | None = None,
) -> LongRun:
    r"""Run a problem's sample stream block by block until a stopping rule, a budget or a signal.

    Blocks are ``[j B, (j + 1) B)`` for a block size $B$ (the first few, of growing sizes, time
    the kernel when ``block_size`` is None; they count towards every rule, which is checked
    after every block). With ``num_workers > 1`` this run takes the blocks
    $j \equiv$ ``worker`` (mod ``num_workers``), so workers given the same ``block_size``
    cover disjoint ranges; their checkpoints merge with :func:`merge_checkpoints`, and each
    worker stops at ``target_stderr`` times $\sqrt{\text{num\_workers}}$ (its share of the
    merged precision) and at its share of ``max_samples``. A run stops at the end of the first
    block where a rule holds, so it overshoots a rule by at most one block (its samples, its
    time). Whatever stops the run (a rule, a signal, a kernel error in a block), the
    checkpoint of the blocks finished is written before it returns or raises.

    Args:
      blocks: the kernel and its arguments (:class:`kernels.blocks.MonteCarloBlocks`).
      target_stderr: stop when the standard error of the stream's mean (its first element for
        vector samples) is at most this (see :func:`target_reached`).
      relative: the target is relative to ``|mean|``.
      max_samples: stop at this many samples, any count >= 2 (the last block is cut to fit).
      max_time: stop after this many seconds of this call's wall time (the time of the runs a
        checkpoint resumes is not counted).
      min_samples: the stopping rule's minimum sample count $n_{\min}$ (>= 1).
      block_size: samples per block (>= 1); None: calibrated to about ``block_seconds``.
      block_seconds: the wall time a calibrated block aims at.
      checkpoint: a JSON file: resumed from when it exists (unless ``resume`` is False), written
        atomically every ``checkpoint_every`` seconds, at a signal, an error and the end.
      checkpoint_every: seconds between checkpoint writes (0: after every block).
      worker: this run's index in ``[0, num_workers)``.
      num_workers: runs sharing the stream (disjoint blocks); > 1 needs ``block_size``.
      callback: called with a :class:`Progress` after each block.
      progress: show a tqdm progress bar (samples, samples/s, mean and stderr, ETA).
      handle_signals: SIGINT/SIGTERM stop the run between blocks; a second one stops at once,
        losing only the block in flight (see ``on_second_signal``).
      resume: False starts afresh over an existing checkpoint (which is then replaced).
      on_second_signal: what a second signal does after the checkpoint is written: ``"raise"``
        (default) returns the interrupted run; ``"exit"`` (the command line) calls ``on_abort``
        and ends the process at once with status 128 + the signal number, without computing
        anything more in JAX.
      on_abort: called with the interrupted :class:`LongRun` (its ``estimate`` None; mean and
        standard error from the stream) before such an exit.

    Returns:
      A :class:`LongRun` with the estimate, the state and the reason the run stopped.

    Raises:
      ValueError: for bad options; its subclass CheckpointError for a checkpoint that cannot be
        resumed (unreadable, damaged, of another problem, block size or worker).
      RunFailed: a kernel error in a block (after the checkpoint of the finished blocks is
        written; its ``partial`` holds their run).
      Interrupted: a stop asked before the first block (nothing to save or return).
    """
    opts = _Options.check(
        target_stderr=target_stderr, relative=bool(relative), max_samples=max_samples,
        max_time=max_time, min_samples=min_samples, block_size=block_size,
        block_seconds=block_seconds, checkpoint_every=checkpoint_every, worker=worker,
        num_workers=num_workers, resume=bool(resume), on_second_signal=on_second_signal,
    )  # fmt: skip
    runner = _Runner(blocks, opts, None if checkpoint is None else Path(checkpoint))
    runner.callback, runner.on_abort = callback, on_abort
    return runner.run(progress=progress, handle_signals=handle_signals)


class _Runner:
    """The state of one :func:`run_blocks` call: blocks in, rules checked, checkpoints out."""

    def __init__(self, blocks: MonteCarloBlocks, opts: _Options, path: Path | None) -> None:
        self.blocks, self.opts, self.path = blocks, opts, path
        self.state: MonteCarloState | None = None
        self.block_size = opts.block_size
        self.calibrated = opts.block_size is not None  # an unfinished calibration is not saved
        self.seconds_before = 0.0
        self.calibration = 0.0
        self.done_here = 0
        self.units: tuple[float, float] | None = None
        self.callback: Callable[[Progress], None] | None = None
        self.on_abort: Callable[[LongRun | None], None] | None = None
        self.bar: Any = None
        share = 1.0 if opts.num_workers == 1 else math.sqrt(opts.num_workers)
        self.target = None if opts.target_stderr is None else opts.target_stderr * share
        self.limit = None if opts.max_samples is None else -(-opts.max_samples // opts.num_workers)
        if path is not None and path.exists() and opts.resume:
            self._resume(path)
        self.start_time = self.last_save = time.monotonic()

    def _resume(self, path: Path) -> None:
        saved = load_checkpoint(path)
        try:
            self.state = self.blocks.check(saved["state"])
        except ValueError as err:
            raise CheckpointError(path, str(err)) from None
        saved_size = saved.get("block_size")
        if self.block_size is not None and saved_size not in (None, self.block_size):
            raise CheckpointError(
                path, f"it ran blocks of {saved_size}, not the block_size {self.block_size} given"
            )
        self.block_size = saved_size or self.block_size
        self.calibrated = self.block_size is not None
        self.seconds_before = float(saved.get("seconds", 0.0))
        self.calibration = float(saved.get("calibration_seconds", 0.0))
        owner = (saved.get("worker", 0), saved.get("num_workers", 1))
        if owner != (self.opts.worker, self.opts.num_workers):
            raise CheckpointError(
                path, f"worker, num_workers: it belongs to worker {owner[0]} of {owner[1]}"
            )

    # -- time, units, rules

    def this_run(self) -> float:
        return time.monotonic() - self.start_time

    def elapsed(self) -> float:
        return self.seconds_before + self.this_run()

    def info(self) -> dict[str, Any]:
        return {
            "kernel": self.blocks.name,
            "fingerprint": self.blocks.fingerprint,
            "block_size": self.block_size if self.calibrated else None,
            "calibration_seconds": self.calibration,
            "seconds": self.elapsed(),
            "worker": self.opts.worker,
            "num_workers": self.opts.num_workers,
        }

    def stream(self) -> tuple[float, float]:
        """The stream's mean and stderr in the units of the kernel's estimate.

        One sample has no standard error, and no kernel estimates from one (NaN, inf).
        """
        if self.units is None and self.state.count < 2:
            return math.nan, math.inf
        if self.units is None:
            self.units = _estimate_map(self.blocks, self.state)
        raw_mean, raw_stderr = _raw_stream(self.state)
        return self.units[0] * raw_mean + self.units[1], self.units[0] * raw_stderr

    def stop_reason(self) -> str | None:
        if self.state is None:
            return None
        if self.target is not None:
            mean, stderr = self.stream()
            if target_reached(
                self.state.count, mean, stderr, target_stderr=self.target,
                relative=self.opts.relative, min_samples=self.opts.min_samples,
            ):  # fmt: skip
                return "target"
        if self.limit is not None and self.state.count >= self.limit:
            return "max_samples"
        if self.opts.max_time is not None and self.this_run() >= self.opts.max_time:
            return "max_time"
        return None

    def samples_to_target(self) -> int | None:
        """Samples still needed for the target as the standard error falls (None: no target)."""
        if self.target is None or self.state is None or self.state.count < 2:
            return None
        mean, stderr = self.stream()
        bound = self.target * abs(mean) if self.opts.relative else self.target
        if not (math.isfinite(stderr) and bound > 0):
            return None
        ratio = min(stderr / bound, 2.0**27)  # a tiny target: the count saturates at 2**53
        need = min(max(self.state.count * ratio**2, self.opts.min_samples), MAX_SAMPLES)
        return max(math.ceil(need) - self.state.count, 1)

    # -- blocks

    def next_block(self, size: int) -> tuple[int, int]:
        """The next block of this worker (of ``size`` samples on the grid of that size)."""
        end = 0 if self.state is None else max(r[1] for r in self.state.ranges)
        if self.opts.num_workers == 1:
            start = end
        else:
            j = -(-end // size)
            j += (self.opts.worker - j) % self.opts.num_workers
            start = j * size
        stop = start + size
        if self.limit is not None:
            stop = min(stop, start + self.limit - (0 if self.state is None else self.state.count))
        return start, stop

    def run_block(self, size: int, *, calibrating: bool = False) -> float:
        """Run and merge the next block; return its wall time (compilation included)."""
        t0 = time.monotonic()
        new = self.blocks.run(*self.next_block(size))
        jax.block_until_ready(new.s2)
        took = time.monotonic() - t0
        self.state = new if self.state is None else merge_states(self.state, new)
        self.done_here += new.count
        if self.units is None and self.state.count >= 2:  # the estimate's units, read once
            self.units = _estimate_map(self.blocks, self.state)  # (an interrupted run reports)
        self.after_block(size, calibrating=calibrating)
        return took

    def after_block(self, size: int, *, calibrating: bool) -> None:
        """Progress (callback, bar) and the periodic checkpoint after a block."""
        if self.bar is not None or self.callback is not None:
            self.report(size, calibrating)
        if (
            self.path is not None
            and time.monotonic() - self.last_save >= self.opts.checkpoint_every
        ):
            _save(self.path, self.state, **self.info())
            self.last_save = time.monotonic()

    def report(self, size: int, calibrating: bool) -> None:
        mean, stderr = self.stream()
        rate = self.done_here / max(self.this_run(), 1e-9)
        need = self.samples_to_target()
        eta = None if need is None else need / rate
        info = Progress(self.state.count, self.elapsed(), rate, mean, stderr, eta, size,
                        calibrating=calibrating)  # fmt: skip
        if self.callback is not None:
            self.callback(info)
        if self.bar is not None:
            self.bar.update(self.state.count - self.bar.n)
            self.bar.set_postfix_str(
                f"mean={mean:.6g} stderr={stderr:.3g}" + ("" if eta is None else f" eta={eta:.0f}s")
            )

    def calibrate(self, guard: SignalGuard | None) -> str | None:
        """Blocks of growing sizes until one takes about ``block_seconds``; they all count.

        One cut short (a rule, a signal, no time left) is not saved: a resumed run calibrates.
        """
        t0 = time.monotonic()
        size, reason = 16, None
        while reason is None:
            self.run_block(size, calibrating=True)  # compiles for this size
            reason = self.stop_reason() or _requested(guard)
            if reason is not None:
                break
            took = max(self.run_block(size, calibrating=True), 1e-6)
            reason = self.stop_reason() or _requested(guard)
            wanted = size * self.opts.block_seconds / took
            if reason is not None:
                break
            if took >= 0.25 * self.opts.block_seconds or size >= MAX_BLOCK_SIZE:
                # keep the size just compiled when it is near the wanted one
                near = 0.5 <= wanted / size <= 4
                wanted = min(max(2, 2 ** round(math.log2(wanted))), MAX_BLOCK_SIZE)
                self.block_size, self.calibrated = size if near else wanted, True
                break
            if self.opts.max_time is not None and self.this_run() + 4 * took > self.opts.max_time:
                self.block_size = size  # no time left to compile a larger block
                break
            # grow towards one block_seconds (by 2x to 256x; a small block's time includes the
            # dispatch overhead, so this errs on the small side), but not past the samples the
            # target is predicted to need (a larger block would overshoot it by that much)
            grown = min(size * 2 ** min(max(round(math.log2(wanted / size)), 1), 8), MAX_BLOCK_SIZE)
            need = self.samples_to_target()
            if need is not None and need <= size:
                self.block_size = size
                break
            size = grown if need is None else min(grown, 2 ** math.ceil(math.log2(need)))
        self.block_size = self.block_size or size
        self.calibration += time.monotonic() - t0  # with an unfinished one that this resumes
        return reason

    def loop(self, guard: SignalGuard | None) -> str:
        reason = self.stop_reason()
        if reason is None and self.block_size is None:
            reason = self.calibrate(guard)
        while reason is None:
            reason = _requested(guard)
            if reason is None:
                self.run_block(self.block_size)
                reason = self.stop_reason()
        return reason

    # -- the run and its ends

    def run(self, *, progress: bool, handle_signals: bool) -> LongRun:
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(unit="sample", unit_scale=True, dynamic_ncols=True,
                            desc=self.blocks.name)  # fmt: skip
            if self.state is not None:
                self.bar.update(self.state.count)
        # a burst of signals: the one that stops at once is the last one acted on
        guard = SignalGuard(raise_once=True) if handle_signals else None
        with guard or contextlib.nullcontext():
            try:
                try:
                    reason = self.loop(guard)
                finally:
                    if self.bar is not None:
                        self.bar.close()
                return self.finish(reason, guard.requested if guard is not None else None)
            except Interrupted as err:  # a second signal: the block in flight is lost
                return self.abort(err.signum)
            except RunFailed:
                raise
            except Exception as err:
                self.fail(err)
                raise  # unreachable: fail raises

    def partial(self, reason: str, signum: int | None, *, estimate: bool) -> LongRun | None:
        if self.state is None:
            return None
        if estimate:
            result = self.blocks.estimate(self.state)  # any set of samples: i.i.d. draws
            mean, stderr = _primary(result, self.state)
        else:
            result = None
            mean, stderr = self.stream() if self.state.count >= 2 else (math.nan, math.nan)
        return LongRun(
            estimate=result, state=self.state, reason=reason, mean=mean, stderr=stderr,
            num_samples=self.state.count, seconds=self.elapsed(),
            block_size=self.block_size or 0, calibration_seconds=self.calibration,
            signal=signum if reason == "interrupted" else None,
        )  # fmt: skip

    def save(self, reason: str) -> None:
        if self.path is not None and self.state is not None:
            _save(self.path, self.state, **self.info(), reason=reason)

    def finish(self, reason: str, signum: int | None) -> LongRun:
        if self.state is None and reason == "interrupted":
            raise Interrupted(signum)  # asked to stop before its first block: nothing to save
        if self.state is None:
            raise ValueError("the run stopped before its first block")
        self.save(reason)  # one sample has no estimate (every kernel takes two or more)
        return self.partial(reason, signum, estimate=self.state.count >= 2)

    def abort(self, signum: int) -> LongRun:
        """A second signal: save, then exit at once (``"exit"``) or return the run.

        Later signals are only recorded (the guard raises once): a burst cannot cut the writes
        short. A run stopped before its first block raises :class:`Interrupted` (``"raise"``).
        """
        self.save("interrupted")
        if self.opts.on_second_signal == "exit":
            if self.on_abort is not None:
                self.on_abort(self.partial("interrupted", signum, estimate=False))
            with contextlib.suppress(OSError, ValueError):  # a closed stdout: nothing to flush
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(128 + signum)
        if self.state is None:
            raise Interrupted(signum)
        return self.finish("interrupted", signum)

    def fail(self, err: Exception) -> None:
        """A block failed: save what finished, then raise :class:`RunFailed` with it."""
        self.save("error")
        partial = None
        if self.state is not None and self.state.count >= 2:
            with contextlib.suppress(Exception):
                partial = self.partial("error", None, estimate=True)
        kept = "none finished" if self.state is None else f"{self.state.count} samples kept"
        where = f" (checkpoint {self.path})" if self.path is not None and self.state else ""
        raise RunFailed(f"{err} [{kept}{where}]", partial, err) from err


def _requested(guard: SignalGuard | None) -> str | None:
    return "interrupted" if guard is not None and guard.requested else None
