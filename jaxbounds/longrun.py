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
``block_seconds`` of work, measured on the first blocks (the calibration's time is recorded).

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

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxbounds._atomic import Interrupted, SignalGuard, write_json_atomic
from kernels.blocks import MonteCarloBlocks, MonteCarloState, merge_states
from kernels.estimate import Estimate

__all__ = [
    "LongRun",
    "Progress",
    "load_checkpoint",
    "merge_checkpoints",
    "run_blocks",
    "run_processes",
    "target_reached",
]

FORMAT = "jaxbounds.longrun/1"
Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal


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
      ValueError: if the file is not such a checkpoint.
    """
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"checkpoint {path}: not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path}: not a {FORMAT} checkpoint")
    data["state"] = MonteCarloState.from_json(data["state"])
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


def _check_options(
    target_stderr: Any, max_samples: Any, max_time: Any, min_samples: Any, block_size: Any
) -> None:
    if target_stderr is not None and not (
        isinstance(target_stderr, int | float)
        and math.isfinite(target_stderr)
        and target_stderr > 0
    ):
        raise ValueError(f"target_stderr: expected a finite number > 0, got {target_stderr!r}")
    for name, value in (("max_samples", max_samples), ("block_size", block_size)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 2
        ):
            raise ValueError(f"{name}: expected an int >= 2, got {value!r}")
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(f"min_samples: expected an int >= 2, got {min_samples!r}")
    if max_time is not None and not (isinstance(max_time, int | float) and max_time > 0):
        raise ValueError(f"max_time: expected a number of seconds > 0, got {max_time!r}")
    if target_stderr is None and max_samples is None and max_time is None:
        raise ValueError("target_stderr, max_samples, max_time: give at least one stopping rule")


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
) -> LongRun:
    r"""Run a problem's sample stream block by block until a stopping rule, a budget or a signal.

    Blocks are ``[j B, (j + 1) B)`` for a block size $B$ (the first few, of growing sizes, time
    the kernel when ``block_size`` is None). With ``num_workers > 1`` this run takes the blocks
    $j \equiv$ ``worker`` (mod ``num_workers``), so workers given the same ``block_size``
    cover disjoint ranges; their checkpoints merge with :func:`merge_checkpoints`, and each
    worker stops at ``target_stderr`` times $\sqrt{\text{num\_workers}}$ (its share of the
    merged precision) and at its share of ``max_samples``.

    Args:
      blocks: the kernel and its arguments (:class:`kernels.blocks.MonteCarloBlocks`).
      target_stderr: stop when the standard error of the stream's mean (its first element for
        vector samples) is at most this (see :func:`target_reached`).
      relative: the target is relative to ``|mean|``.
      max_samples: stop at this many samples (the last block is cut to fit).
      max_time: stop after this many seconds of wall time (resumed runs included).
      min_samples: the stopping rule's minimum sample count $n_{\min}$.
      block_size: samples per block; None: calibrated to about ``block_seconds``.
      block_seconds: the wall time a calibrated block aims at.
      checkpoint: a JSON file: resumed from when it exists, written atomically every
        ``checkpoint_every`` seconds, at a signal and at the end.
      checkpoint_every: seconds between checkpoint writes.
      worker: this run's index in ``[0, num_workers)``.
      num_workers: runs sharing the stream (disjoint blocks); > 1 needs ``block_size``.
      callback: called with a :class:`Progress` after each block.
      progress: show a tqdm progress bar (samples, samples/s, mean and stderr, ETA).
      handle_signals: SIGINT/SIGTERM stop the run between blocks (a second one stops at once,
        losing only the block in flight).

    Returns:
      A :class:`LongRun` with the estimate, the state and the reason the run stopped.

    Raises:
      ValueError: for bad options, a checkpoint of another problem or block size, or a kernel
        error in a block.
    """
    _check_options(target_stderr, max_samples, max_time, min_samples, block_size)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers: expected an int >= 1, got {num_workers!r}")
    if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < num_workers:
        raise ValueError(f"worker: expected an int in [0, {num_workers}), got {worker!r}")
    if num_workers > 1 and block_size is None:
        raise ValueError("block_size: several workers need one block size given to all")
    if not block_seconds > 0:
        raise ValueError(f"block_seconds: expected a number > 0, got {block_seconds!r}")
    path = None if checkpoint is None else Path(checkpoint)
    state: MonteCarloState | None = None
    seconds_before = 0.0
    calibration = 0.0
    if path is not None and path.exists():
        saved = load_checkpoint(path)
        state = saved["state"]
        try:
            blocks.check(state)
        except ValueError as err:
            raise ValueError(f"checkpoint {path}: {err}") from None
        saved_size = saved.get("block_size")
        if block_size is not None and saved_size not in (None, block_size):
            raise ValueError(
                f"block_size: {block_size}, but checkpoint {path} ran blocks of {saved_size}"
            )
        block_size = saved_size or block_size
        seconds_before = float(saved.get("seconds", 0.0))
        calibration = float(saved.get("calibration_seconds", 0.0))
        if (saved.get("worker", 0), saved.get("num_workers", 1)) != (worker, num_workers):
            raise ValueError(
                f"worker, num_workers: checkpoint {path} belongs to worker "
                f"{saved.get('worker', 0)} of {saved.get('num_workers', 1)}"
            )
    share = 1.0 if num_workers == 1 else math.sqrt(num_workers)
    target = None if target_stderr is None else target_stderr * share
    limit = None if max_samples is None else -(-max_samples // num_workers)

    start_time = time.monotonic()
    last_save = start_time
    done_here = 0

    def elapsed() -> float:
        return seconds_before + time.monotonic() - start_time

    def info() -> dict[str, Any]:
        return {
            "kernel": blocks.name,
            "fingerprint": blocks.fingerprint,
            "block_size": block_size,
            "calibration_seconds": calibration,
            "seconds": elapsed(),
            "worker": worker,
            "num_workers": num_workers,
        }

    units: tuple[float, float] | None = None

    def _stream(state: MonteCarloState) -> tuple[float, float]:
        """The stream's mean and stderr in the units of the kernel's estimate."""
        nonlocal units
        if units is None:
            units = _estimate_map(blocks, state)
        raw_mean, raw_stderr = _raw_stream(state)
        return units[0] * raw_mean + units[1], units[0] * raw_stderr

    def stop_reason() -> str | None:
        if state is None:
            return None
        mean, stderr = _stream(state)
        if target is not None and target_reached(
            state.count, mean, stderr, target_stderr=target, relative=relative,
            min_samples=min_samples,
        ):  # fmt: skip
            return "target"
        if limit is not None and state.count >= limit:
            return "max_samples"
        if max_time is not None and elapsed() >= max_time:
            return "max_time"
        return None

    def next_block(size: int) -> tuple[int, int]:
        """The next block of this worker (of ``size`` samples on the grid of that size)."""
        end = 0 if state is None else max(r[1] for r in state.ranges)
        if num_workers == 1:
            start = end
        else:
            j = -(-end // size)
            j += (worker - j) % num_workers
            start = j * size
        stop = start + size
        if limit is not None and state is not None:
            stop = min(stop, start + limit - state.count)
        elif limit is not None:
            stop = min(stop, start + limit)
        return start, stop

    def add(new: MonteCarloState) -> None:
        nonlocal state, done_here
        state = new if state is None else merge_states(state, new)
        done_here += new.count

    def after_block(size: int, *, calibrating: bool) -> None:
        """Progress (callback, bar) and the periodic checkpoint after a block."""
        nonlocal last_save
        if bar is not None or callback is not None:
            mean, stderr = _stream(state)
            rate = done_here / max(time.monotonic() - run_start, 1e-9)
            eta = None
            if target is not None and math.isfinite(stderr):
                bound = target * abs(mean) if relative else target
                need = max(state.count * (stderr / bound) ** 2, min_samples) if bound else math.inf
                eta = max(need - state.count, 0) / rate
            report = Progress(
                state.count, elapsed(), rate, mean, stderr, eta, size, calibrating=calibrating
            )
            if callback is not None:
                callback(report)
            if bar is not None:
                bar.update(state.count - bar.n)
                bar.set_postfix_str(
                    f"mean={mean:.6g} stderr={stderr:.3g}"
                    + ("" if eta is None else f" eta={eta:.0f}s")
                )
        if path is not None and time.monotonic() - last_save >= checkpoint_every:
            _save(path, state, **info())
            last_save = time.monotonic()

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(unit="sample", unit_scale=True, dynamic_ncols=True, desc=blocks.name)
        if state is not None:
            bar.update(state.count)
    reason = stop_reason()
    guard = SignalGuard() if handle_signals else None
    signum: int | None = None
    run_start = time.monotonic()
    try:
        if guard is not None:
            guard.__enter__()
        try:
            if reason is None and block_size is None:  # calibrate: blocks of growing sizes
                t0 = time.monotonic()
                size = 16
                while True:
                    first_block = blocks.run(*next_block(size))  # compiles for this size
                    jax.block_until_ready(first_block.s2)
                    add(first_block)
                    after_block(size, calibrating=True)
                    a, b = next_block(size)
                    t1 = time.monotonic()
                    timed = blocks.run(a, b)
                    jax.block_until_ready(timed.s2)
                    took = max(time.monotonic() - t1, 1e-6)
                    add(timed)
                    after_block(size, calibrating=True)
                    if stop_reason() is not None or (guard and guard.requested):
                        block_size = size
                        break
                    wanted = size * block_seconds / took
                    if took >= 0.25 * block_seconds or size >= 2**40:
                        # keep the size just compiled when it is near the wanted one
                        near = 0.5 <= wanted / size <= 4
                        block_size = size if near else max(2, 2 ** round(math.log2(wanted)))
                        break
                    # grow towards one block_seconds (by 2x to 256x; the timing of a small
                    # block includes the dispatch overhead, so this errs on the small side)
                    size *= 2 ** min(max(round(math.log2(wanted / size)), 1), 8)
                calibration = time.monotonic() - t0
            while reason is None:
                reason = stop_reason()
                if reason is not None:
                    break
                if guard is not None and guard.requested:
                    reason = "interrupted"
                    break
                add(blocks.run(*next_block(block_size)))
                after_block(block_size, calibrating=False)
        except Interrupted as err:  # a second signal: the block in flight is lost, rest kept
            reason = "interrupted"
            signum = err.signum
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)
            signum = signum or guard.requested
        if bar is not None:
            bar.close()
    if state is None:
        raise ValueError("the run stopped before its first block")
    if reason is None:
        reason = "interrupted"
    if path is not None:
        _save(path, state, **info(), reason=reason)
    estimate = blocks.estimate(state)  # any set of samples: i.i.d. draws of the stream
    mean, stderr = _primary(estimate, state)
    return LongRun(
        estimate=estimate,
        state=state,
        reason=reason,
        mean=mean,
        stderr=stderr,
        num_samples=state.count,
        seconds=elapsed(),
        block_size=block_size,
        calibration_seconds=calibration,
        signal=signum if reason == "interrupted" else None,
    )
