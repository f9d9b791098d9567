"""Resumable experiment runner: a grid of units (configuration x seed), one JSON file per unit.

An :class:`Experiment` gives config grids per scale (``smoke``, ``cpu``, ``paper``), expands a
grid and seeds into :class:`Unit` s, computes one unit (``run_unit``) or the seeds of one
configuration at once (``run_batch``, e.g. one vmapped training program), and renders
figures and ``report.md`` from the result rows. :func:`run_experiment` runs the units that are
not finished yet and writes, under ``DIR/NAME/``::

    units/<key>.json   one per finished unit: config, seed, result row, wall time
    results.csv        one row per unit, deterministic bytes (no timings)
    summary.json       package/jax versions, scale, seeds, wall time per unit, machine
    report.md, *.png   by the experiment's ``render`` hook

Guarantees: the experiment's optional packages are checked before any work
(:func:`check_packages`); a folder holds one run, and the report of another scale or other seeds
is replaced only with ``fresh=True`` (:func:`check_same_run`); a report links only the figures
that were written; one run at a time per output place (a lock the kernel releases when its process
dies, see :func:`run_experiment`); at most :data:`MAX_UNITS` units per run and at most
``max_batch_size`` units per batch, so memory does not grow with ``--seeds``; a unit's key is
the SHA-256 of its configuration, seed, experiment name and package
version (:func:`unit_key`), so a changed configuration never reuses another's results; every
file is written atomically (temporary file, fsync, ``os.replace``), so a run killed at any
moment (SIGKILL included) and started again skips the finished units and ends with the same
``results.csv`` bytes as an uninterrupted run; a first SIGINT/SIGTERM stops the run after the
batch in progress and a second one at once, both raising :class:`Interrupted` (exit code
``128 + signum`` on the command line) and never leaving half a file; a signal ignored when the
run starts (a background job) stays ignored. Progress: a
``tqdm`` bar on stderr (elapsed, ETA; shown on a terminal unless ``quiet``, or when
``progress=True``) and, unless ``quiet``, one line per finished unit.

The statistics of reports (:func:`kendall_tau`, :func:`mean_spread`, :func:`markdown_table`,
:func:`claim_line`, :func:`group_rows`) and the atomic writers used by ``render`` hooks
(:func:`write_text_atomic`, :func:`save_figure`, :func:`new_figure`) are exported here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import importlib.metadata
import json
import math
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxbounds import _deps
from jaxbounds._atomic import (
    Interrupted,
    LockBusy,
    SignalGuard,
    check_stop,
    critical_section,
    exclusive_lock,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from jaxbounds.experiments._experiment import Experiment, ExperimentRegistry
from jaxbounds.experiments._output import (
    announce_no_figures,
    csv_text,
    figures_available,
    machine_info,
    new_figure,
    save_figure,
    sort_records,
    versions,
    write_rendered,
)
from jaxbounds.experiments._preflight import (
    MAX_UNITS,
    OtherRunThere,
    RunTooLarge,
    check_packages,
    check_same_run,
    check_size,
)
from jaxbounds.experiments._progress import PROGRESS_WIDTH, _bar, _Log, _progress_line
from jaxbounds.experiments._stats import (
    KendallTau,
    Spread,
    claim_line,
    format_interval,
    format_mean_std,
    format_number,
    group_rows,
    kendall_tau,
    markdown_table,
    mean_spread,
)
from jaxbounds.experiments._units import (
    Unit,
    canonical_json,
    config_batch_key,
    grid_units,
    to_jsonable,
    unit_key,
)

__all__ = [
    "DEFAULT_OUT",
    "MAX_UNITS",
    "PROGRESS_WIDTH",
    "Experiment",
    "ExperimentRegistry",
    "Interrupted",
    "KendallTau",
    "LockBusy",
    "MissingPackages",
    "OtherRunThere",
    "RunSummary",
    "RunTooLarge",
    "Spread",
    "Unit",
    "canonical_json",
    "check_packages",
    "check_same_run",
    "check_size",
    "claim_line",
    "config_batch_key",
    "default_render",
    "format_interval",
    "format_mean_std",
    "format_number",
    "grid_units",
    "group_rows",
    "kendall_tau",
    "markdown_table",
    "mean_spread",
    "new_figure",
    "package_version",
    "resolve_from",
    "run_experiment",
    "save_figure",
    "unit_key",
    "unit_labels",
    "unlink_missing_figures",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_rendered",
    "write_text_atomic",
]

DEFAULT_OUT = "jaxbounds_reproduce"
MissingPackages = _deps.MissingPackages


def package_version() -> str:
    """The installed ``jaxbounds`` version, else ``jaxbounds.__version__`` (source checkout).

    >>> isinstance(package_version(), str)
    True
    """
    try:
        return importlib.metadata.version("jaxbounds")
    except importlib.metadata.PackageNotFoundError:
        from jaxbounds import __version__

        return __version__


def _precision_tag() -> str:
    """``"+x64"`` under ``JAX_ENABLE_X64``, else ``""``: a suffix of the version in unit keys.

    A unit computed in float64 is another unit than the float32 one (a run stopped in float32
    and resumed with x64 on would mix their rows); float32 keys are those of earlier versions.
    """
    from jaxbounds.report.job import precision

    return "+x64" if precision() == "float64" else ""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What :func:`run_experiment` did.

    Attributes:
      experiment: the experiment's name.
      scale: the scale run or rendered.
      seeds: the seeds, or their number N (seeds 0..N-1; never expanded, so an absurd N such
        as 10**20 is refused at once).
      out_dir: ``DIR/NAME``, where results, summary, figures and report are.
      num_units: units of the grid.
      num_run: units computed by this call (0 with ``from_dir``).
      num_finished: units whose files exist now.
      num_missing: ``num_units - num_finished`` (other processes' shares, or interrupted).
      rendered: whether results, summary and report were written by this call.
      wall_time_s: wall time of this call.
    """

    experiment: str
    scale: str
    seeds: tuple[int, ...]
    out_dir: Path
    num_units: int
    num_run: int
    num_finished: int
    num_missing: int
    rendered: bool
    wall_time_s: float


def _resolve_seeds(experiment: Experiment, scale: str, seeds: Any, recorded: Mapping) -> tuple:
    if seeds is None:
        seeds = recorded.get("seeds") if recorded.get("scale") == scale else None
    if seeds is None:
        seeds = experiment.seeds_for(scale)
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"seeds: expected a positive number of seeds, got {seeds}")
        check_size(experiment, scale, seeds)  # before range(seeds) is expanded
        return tuple(range(seeds))
    out = tuple(seeds)
    if not out or len(set(out)) != len(out) or not all(isinstance(s, int) for s in out):
        raise ValueError(f"seeds: expected distinct ints, got {seeds!r}")
    return out


def unit_labels(units: Sequence[Unit]) -> list[str]:
    """Short names of ``units`` for progress lines: the config keys that vary, and the seed.

    A unit's whole configuration can be hundreds of characters; the keys whose value is the
    same in every unit of the run say nothing about which unit finished, so they are left out
    (the unit files and ``results.csv`` keep everything).

    >>> units = [Unit({"T": t, "data": "x" * 300}, seed=s) for t in (20, 40) for s in (0, 1)]
    >>> unit_labels(units)
    ['T=20 seed=0', 'T=20 seed=1', 'T=40 seed=0', 'T=40 seed=1']
    """
    keys = _columns(u.config for u in units)
    varying = [k for k in keys if len({canonical_json(u.config.get(k)) for u in units}) > 1]
    return [Unit({k: u.config.get(k) for k in varying}, u.seed).label() for u in units]


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def unlink_missing_figures(report: str, out_dir: Path, drawn: bool | None = None) -> str:
    """``report``'s markdown images whose file was not written, replaced by a note saying so.

    Args:
      report: the text of ``report.md``.
      out_dir: the folder of ``report.md`` (image targets are relative to it).
      drawn: whether this run drew figures (default: whether matplotlib is installed). When
        it did not, every image link is replaced, even where an older run left a file.

    Returns:
      The report with ``*(figure NAME not drawn: ...)*`` in place of each dead link.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     print(unlink_missing_figures("![tau](figure_tau.png) rest", Path(d), drawn=False))
    *(figure figure_tau.png not drawn: matplotlib is not installed)* rest
    """
    drawn = figures_available() if drawn is None else drawn

    def replace(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target:
            return match.group(0)
        if not drawn:
            return f"*(figure {target} not drawn: matplotlib is not installed)*"
        if (Path(out_dir) / target).is_file():
            return match.group(0)
        return f"*(figure {target} not drawn)*"

    return _IMAGE.sub(replace, report)


def _plan(experiment: Experiment, scale: str, seeds: tuple, version: str) -> list:
    units = list(experiment.units(experiment.scales[scale], seeds))
    if not units or not all(isinstance(u, Unit) for u in units):
        raise ValueError(f"{experiment.name}: units() must return a non-empty list of Unit")
    plan = [(unit_key(experiment.name, u, version), u) for u in units]
    if len({key for key, _ in plan}) != len(plan):
        raise ValueError(f"{experiment.name}: units() returned the same config and seed twice")
    return plan


def _groups(experiment: Experiment, items: Sequence[tuple[str, Unit]]) -> list[list]:
    """The batches: units of equal ``batch_key``, in pieces of at most ``max_batch_size``."""
    if experiment.run_batch is None:
        return [[item] for item in items]
    groups: dict[Any, list] = {}
    for item in items:
        groups.setdefault(experiment.batch_key(item[1]), []).append(item)
    size = experiment.max_batch_size
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]


def _share(experiment: Experiment, plan: list, index: int, count: int) -> list:
    """Units of process ``index``: unit i (or batch i with ``run_batch``) if i % count == index."""
    if count == 1:
        return plan
    groups = _groups(experiment, plan)
    return [item for i, group in enumerate(groups) if i % count == index for item in group]


def _unit_path(units_dir: Path, key: str) -> Path:
    return units_dir / f"{key}.json"


def _load_unit(units_dir: Path, key: str, unit: Unit, log: _Log) -> dict | None:
    path = _unit_path(units_dir, key)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        ok = record["key"] == key and record["seed"] == unit.seed
        if ok and record["config"] == unit.config and isinstance(record["result"], dict):
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    log.warn(f"unit file {path} is unreadable or does not match its key: treated as missing")
    return None


def _check_result(experiment: Experiment, unit: Unit, result: Any) -> dict:
    where = f"{experiment.name}: result of {unit.label()}"
    if not isinstance(result, Mapping):
        raise TypeError(f"{where}: expected a dict, got {type(result).__name__}")
    row = to_jsonable(result, where=where)
    clash = sorted(set(row) & {*unit.config, "seed"})
    if clash:
        raise ValueError(f"{where}: result keys {clash} repeat config keys or 'seed'")
    return row


def _compute(experiment: Experiment, group: list) -> tuple[list[dict], float]:
    units = [unit for _, unit in group]
    start = time.perf_counter()
    if experiment.run_batch is None:
        results = [experiment.run_unit(units[0])]
    else:
        results = list(experiment.run_batch(units))
        if len(results) != len(units):
            raise ValueError(
                f"{experiment.name}: run_batch returned {len(results)} rows for {len(units)} units"
            )
    elapsed = time.perf_counter() - start
    return [_check_result(experiment, u, r) for u, r in zip(units, results, strict=True)], elapsed


def _store(units_dir: Path, experiment: Experiment, version: str, group: list, results: list,
           elapsed: float) -> None:  # fmt: skip
    """Write the unit files of one batch (signals held until all of them are in place)."""
    with critical_section():
        for (key, unit), result in zip(group, results, strict=True):
            record = {
                "experiment": experiment.name, "version": version, "key": key,
                "seed": unit.seed, "config": unit.config, "result": result,
                "wall_time_s": elapsed / len(group), "batch_size": len(group),
            }  # fmt: skip
            write_json_atomic(_unit_path(units_dir, key), record)


@contextlib.contextmanager
def _alone_on_local_devices() -> Iterator[None]:
    """Kernels shard over this process's devices only (its units are its own, not collective).

    In a one-process program (or without JAX's distributed runtime) the local devices are all
    devices and nothing changes.
    """
    import jax

    if jax.process_count() == 1:
        yield
        return
    import kernels

    with kernels.using_devices(jax.local_devices()):
        yield


def _run_share(experiment: Experiment, share: list, units_dir: Path, version: str, log: _Log,
               show_bar: bool) -> int:  # fmt: skip
    """Compute the units of ``share`` that have no file yet; return how many were computed."""
    with _alone_on_local_devices():
        return _run_pending(experiment, share, units_dir, version, log, show_bar)


def _run_pending(experiment: Experiment, share: list, units_dir: Path, version: str, log: _Log,
                 show_bar: bool) -> int:  # fmt: skip
    pending = [(k, u) for k, u in share if _load_unit(units_dir, k, u, log) is None]
    done = len(share) - len(pending)
    if done:
        log.info(f"{experiment.name}: {done} of {len(share)} units already finished in "
                 f"{units_dir}; running {len(pending)}")  # fmt: skip
    bar = _bar(len(share), done, experiment.name, show_bar)
    labels = dict(zip([k for k, _ in share], unit_labels([u for _, u in share]), strict=True))
    try:
        for group in _groups(experiment, pending):
            check_stop()  # a first SIGINT/SIGTERM stops here, between two batches
            results, elapsed = _compute(experiment, group)
            _store(units_dir, experiment, version, group, results, elapsed)
            for key, _ in group:
                done += 1
                bar.update(1)
                log.info(_progress_line(f"[{done}/{len(share)}] {experiment.name}", labels[key],
                                        f"{elapsed / len(group):.3g} s"))  # fmt: skip
    except Interrupted as exc:
        raise Interrupted(
            exc.signum,
            f"{experiment.name}: interrupted by {signal.Signals(exc.signum).name} with {done} of "
            f"{len(share)} units finished; rerun the same command to resume",
        ) from None
    finally:
        bar.close()
    return len(pending)


_POLL_S = 0.25


_RESTART_GRACE_S = 60.0  # how long a marker older than our start may be an earlier run's


def _stop_marker(units_dir: Path, process_index: int) -> Path:
    return units_dir / f".stopped.process{process_index}"


def _start_marker(units_dir: Path, process_index: int) -> Path:
    return units_dir / f".started.process{process_index}"


def _mark_started(units_dir: Path, process_index: int) -> None:
    """This process (re)starts: its stop marker is an earlier run's; note the start time."""
    _stop_marker(units_dir, process_index).unlink(missing_ok=True)
    write_text_atomic(_start_marker(units_dir, process_index), f"{time.time()}\n")


def _mark_stopped(units_dir: Path, process_index: int, exc: BaseException) -> None:
    """Leave a marker saying this process stopped (and why), so the waiting ones stop too."""
    with contextlib.suppress(OSError):
        reason = f"{type(exc).__name__}: {exc}".strip()
        write_text_atomic(_stop_marker(units_dir, process_index), reason[:2000] + "\n")


def _stopped_other(units_dir: Path, process_index: int, started: float) -> str | None:
    """The reason another process of this run stopped, if one did.

    A marker counts unless its process has started again since (then it is an earlier run's).
    A marker older than our own start is ambiguous (that process failed before we started, or
    it is an earlier run's and the process has not restarted yet): it counts once its process
    has had ``_RESTART_GRACE_S`` to restart and has not.
    """
    for path in sorted(units_dir.glob(".stopped.process*")):
        other = path.name.removeprefix(".stopped.process")
        if not other.isdigit() or int(other) == process_index:
            continue
        start = _start_marker(units_dir, int(other))
        try:
            stopped_at = path.stat().st_mtime
            if start.exists() and start.stat().st_mtime > stopped_at:
                continue
            if stopped_at >= started or time.time() - started > _RESTART_GRACE_S:
                return f"process {other}: {path.read_text().strip()}"
        except OSError:
            continue
    return None


def _wait_for_units(experiment: Experiment, plan: list, units_dir: Path, log: _Log,
                    process_index: int, started: float) -> None:  # fmt: skip
    """Wait until every unit of ``plan`` has its file (written by whichever process ran it).

    Stops (``Interrupted``, as SIGTERM) when another process of the run left a stop marker: its
    units would never come, and waiting forever is the worse answer.
    """
    missing = [key for key, _ in plan if not _unit_path(units_dir, key).exists()]
    if missing:
        log.info(f"{experiment.name}: waiting for {len(missing)} units of the other processes "
                 f"in {units_dir}")  # fmt: skip
    while missing:
        check_stop()
        stopped = _stopped_other(units_dir, process_index, started)
        if stopped is not None:
            raise Interrupted(
                signal.SIGTERM,
                f"{experiment.name}: another process stopped ({stopped}); {len(missing)} units "
                "are missing; finished units are kept, rerun the same command on every process "
                "to resume",
            )
        time.sleep(_POLL_S)
        missing = [key for key in missing if not _unit_path(units_dir, key).exists()]


def _columns(keys: Iterable[Iterable[str]]) -> list[str]:
    return list(dict.fromkeys(key for group in keys for key in group))


def _meta(experiment: Experiment, scale: str, seeds: tuple, version: str, plan: list,
          records: list) -> dict:  # fmt: skip
    finished = {record["key"] for record in records}
    return {
        "experiment": experiment.name,
        "description": experiment.description,
        "paper": experiment.paper,
        "scale": scale,
        "seeds": list(seeds),
        "config_grid": to_jsonable(experiment.scales[scale]),
        "package": {"name": "jaxbounds", "version": version},
        "versions": versions(),
        "machine": machine_info(),
        "num_units": len(plan),
        "num_finished": len(records),
        "num_missing": len(plan) - len(records),
        "missing": [unit.label() for key, unit in plan if key not in finished],
        "total_unit_time_s": math.fsum(r["wall_time_s"] for r in records),
        "units": [
            {k: r[k] for k in ("key", "config", "seed", "wall_time_s", "batch_size")}
            for r in records
        ],
        "claims": list(experiment.claims),
        "paper_numbers": to_jsonable(experiment.paper_numbers),
    }


def _write_outputs(experiment: Experiment, scale: str, seeds: tuple, version: str, plan: list,
                   units_dir: Path, run_dir: Path, log: _Log) -> bool:  # fmt: skip
    """Write results.csv, summary.json and the rendered report; return whether rendered."""
    loaded = [_load_unit(units_dir, key, unit, log) for key, unit in plan]
    config_columns = _columns(unit.config for _, unit in plan)
    records = sort_records([r for r in loaded if r is not None], config_columns)
    rows = [{**r["config"], "seed": r["seed"], **r["result"]} for r in records]
    columns = [*config_columns, "seed", *_columns(r["result"] for r in records)]
    write_text_atomic(run_dir / "results.csv", csv_text(rows, columns))
    meta = _meta(experiment, scale, seeds, version, plan, records)
    write_json_atomic(run_dir / "summary.json", meta)
    if meta["num_missing"]:
        log.warn(
            f"{experiment.name}: {meta['num_missing']} of {len(plan)} units are missing "
            f"(other processes' shares or an interrupted run): rendering the {len(records)} "
            "that exist; rerun with --from once they are finished"
        )
    if not rows:
        log.warn(f"{experiment.name}: no finished units, nothing to render")
        return False
    (experiment.render or default_render)(rows, meta, run_dir)
    report = run_dir / "report.md"
    if report.is_file():  # link only the figures this run wrote
        text = report.read_text(encoding="utf-8")
        fixed = unlink_missing_figures(text, run_dir)
        if fixed != text:
            write_text_atomic(report, fixed)
    return True


def resolve_from(from_dir: str | Path, name: str) -> Path:
    """The run directory of ``name`` under ``from_dir`` (``from_dir/NAME`` or ``from_dir``).

    Raises:
      FileNotFoundError: when neither holds a ``units`` directory.
    """
    root = Path(from_dir)
    for candidate in (root / name, root):
        if (candidate / "units").is_dir():
            return candidate
    raise FileNotFoundError(f"--from {root}: no {name}/units directory with finished units")


def _read_recorded(source: Path | None) -> dict:
    if source is None or not (source / "summary.json").exists():
        return {}
    return json.loads((source / "summary.json").read_text(encoding="utf-8"))


def run_experiment(
    experiment: Experiment,
    *,
    scale: str | None = None,
    out_dir: str | Path | None = None,
    seeds: int | Sequence[int] | None = None,
    jobs: int = 1,
    quiet: bool = False,
    from_dir: str | Path | None = None,
    process_index: int = 0,
    process_count: int = 1,
    progress: bool | None = None,
    wait_for_shares: bool = False,
    fresh: bool = False,
) -> RunSummary:
    """Run the unfinished units of an experiment, then write results, summary and report.

    Args:
      experiment: the :class:`Experiment`.
      scale: a key of ``experiment.scales`` (default: the scale recorded in ``from_dir``'s
        ``summary.json``, else ``experiment.default_scale``).
      out_dir: the output root; files go to ``out_dir/NAME/`` (default: the ``from_dir`` run,
        else ``jaxbounds_reproduce``).
      seeds: a number of seeds N (seeds 0..N-1) or the seeds themselves (default: recorded in
        ``from_dir``, else ``experiment.default_seeds``).
      jobs: process-local parallelism; units run one at a time in this process whatever its
        value (XLA already uses every core); split a run over processes with
        ``process_index``/``process_count`` instead.
      quiet: no per-unit lines and no progress bar (warnings still print).
      from_dir: re-render from the finished units under ``from_dir/NAME/units`` (or
        ``from_dir/units``) without running anything.
      process_index: this process's share of the units (``0 <= process_index < process_count``).
      process_count: number of processes sharing the run: unit i goes to process
        ``i % process_count`` (with ``run_batch``: batch i, so seeds stay together). Only
        process 0 writes results and renders, from the units that exist when its share is done
        (or, with ``wait_for_shares``, when every unit is done).
      progress: force the progress bar on (True) or off (False); default: on a terminal
        unless ``quiet``.
      wait_for_shares: after its own share, every process waits until each unit of the grid has
        its file in the units directory (the processes share ``out_dir``: one machine or a
        shared filesystem), so that process 0 renders the complete tables, byte for byte those
        of a one-process run. ``jaxbounds reproduce`` sets it under JAX's distributed runtime
        (:func:`jaxbounds.distributed.initialize`), where the units run on each process's own
        devices (:func:`kernels.using_devices`). A process that stops (signal or error) leaves
        a marker ``units/.stopped.process<i>`` with the reason; the waiting processes see it and
        stop too (``Interrupted``, exit status 143) instead of waiting for units that will
        never come.
      fresh: replace the results and report of another run (another scale or other seeds)
        found in ``out_dir/NAME``; without it such a run raises :class:`OtherRunThere` before
        any work. Unit files are never removed: they are keyed by configuration, seed and
        version, so each run uses only its own.

    Returns:
      A :class:`RunSummary`.

    One run at a time per output place and share: the call holds ``units/.lock.process<i>``
    (an ``flock`` the kernel drops when the process ends, however it ends) from before the
    grid is planned until the last file is written; a second call on the same place and share
    raises :class:`~jaxbounds._atomic.LockBusy` at once, before any work. SIGINT/SIGTERM stop
    the run (a signal ignored when the call starts, as in a background job,
    stays ignored; a first one stops after the batch in progress, a second one at once). Runs
    larger than :data:`MAX_UNITS` units are refused (:func:`check_size`).

    Before any work the experiment's optional packages are checked (:func:`check_packages`)
    and, when matplotlib is missing, one line says that no figures will be drawn.

    Raises:
      MissingPackages: (an ``ImportError``) when a package the experiment needs is missing.
      OtherRunThere: (a ``ValueError``) when ``out_dir/NAME`` holds another run's report and
        ``fresh`` is not set.
      Interrupted: on SIGINT/SIGTERM (finished units are kept; rerun to resume).
      LockBusy: when another process runs the same share in the same place.
      RunTooLarge: (a ``ValueError``) above :data:`MAX_UNITS` units.
      ValueError: for an unknown scale, bad seeds, jobs or process share.
      FileNotFoundError: when ``from_dir`` holds no units of this experiment.
    """
    start = time.perf_counter()
    scale, seeds, source, run_dir = _setup(
        experiment, scale, seeds, out_dir, from_dir, jobs, process_index, process_count
    )
    units_dir = (source or run_dir) / "units"
    version, log = package_version() + _precision_tag(), _Log(quiet)
    check_size(experiment, scale, seeds)
    check_packages(experiment, rendering_only=source is not None)
    if not fresh:
        check_same_run(experiment, run_dir, scale, seeds)
    if process_index == 0:
        announce_no_figures()
    if source is None:
        _prepare_units_dir(units_dir)
    with _run_lock(units_dir, process_index, source is not None):
        plan = _plan(experiment, scale, seeds, version)
        return _run_locked(experiment, scale, seeds, source, run_dir, units_dir, version, log,
                           plan, jobs, process_index, process_count, progress, quiet,
                           wait_for_shares, start)  # fmt: skip


def _lock_path(units_dir: Path, process_index: int) -> Path:
    return units_dir / f".lock.process{process_index}"


@contextlib.contextmanager
def _run_lock(units_dir: Path, process_index: int, rendering_only: bool) -> Iterator[None]:
    """Hold ``units/.lock.process<i>`` for the run (see :func:`jaxbounds._atomic.exclusive_lock`).

    Re-rendering (``from_dir``) takes process 0's lock where it can create it; a read-only
    source directory is rendered without it.
    """
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(exclusive_lock(_lock_path(units_dir, process_index)))
        except OSError as err:
            if not rendering_only or err.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
        yield


def _run_locked(experiment: Experiment, scale: str, seeds: tuple, source: Path | None,
                run_dir: Path, units_dir: Path, version: str, log: _Log, plan: list, jobs: int,
                process_index: int, process_count: int, progress: bool | None, quiet: bool,
                wait_for_shares: bool, start: float) -> RunSummary:  # fmt: skip
    num_run, rendered = 0, False
    with SignalGuard():
        if source is None:
            if jobs > 1:
                log.info(f"jobs={jobs}: units run one at a time in this process (XLA uses "
                         "every core); use process_index/process_count to split a run")  # fmt: skip
            started = time.time()
            if wait_for_shares:
                _mark_started(units_dir, process_index)
            share = _share(experiment, plan, process_index, process_count)
            show_bar = progress if progress is not None else (not quiet and sys.stderr.isatty())
            try:
                num_run = _run_share(experiment, share, units_dir, version, log, show_bar)
                if wait_for_shares:
                    _wait_for_units(experiment, plan, units_dir, log, process_index, started)
            except BaseException as exc:
                if wait_for_shares:
                    _mark_stopped(units_dir, process_index, exc)
                raise
        if source is not None or process_index == 0:
            rendered = _write_outputs(
                experiment, scale, seeds, version, plan, units_dir, run_dir, log
            )
    finished = sum(_unit_path(units_dir, key).exists() for key, _ in plan)
    if rendered:
        log.info(f"{experiment.name}: wrote {run_dir} ({finished} of {len(plan)} units)")
    return RunSummary(experiment.name, scale, seeds, run_dir, len(plan), num_run, finished,
                      len(plan) - finished, rendered, time.perf_counter() - start)  # fmt: skip


def _setup(experiment: Experiment, scale: str | None, seeds: Any, out_dir: Any, from_dir: Any,
           jobs: Any, process_index: int, process_count: int) -> tuple:  # fmt: skip
    """Check the options; resolve scale, seeds, the ``--from`` source and the output dir."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, {process_count}), got {process_index}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected an int >= 1, got {jobs!r}")
    source = None if from_dir is None else resolve_from(from_dir, experiment.name)
    recorded = _read_recorded(source)
    scale = scale or recorded.get("scale") or experiment.default_scale
    if scale not in experiment.scales:
        raise ValueError(f"scale: expected one of {sorted(experiment.scales)}, got {scale!r}")
    seeds = _resolve_seeds(experiment, scale, seeds, recorded)
    run_dir = Path(out_dir) / experiment.name if out_dir is not None else source
    run_dir = run_dir if run_dir is not None else Path(DEFAULT_OUT) / experiment.name
    return scale, seeds, source, run_dir


_STALE_S = 3600.0


def _prepare_units_dir(units_dir: Path) -> None:
    """Create the units directory; remove temporaries a killed writer left over an hour ago."""
    units_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for path in units_dir.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > _STALE_S:
                path.unlink()


def default_render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """Write a plain ``report.md``: mean ± std over seeds of every numeric result column.

    Used when an experiment gives no ``render`` hook; experiments with papers write their own
    (the paper's numbers beside ours, one sentence per claim).

    Args:
      rows: result rows (config, seed and result columns).
      meta: the run's ``summary.json`` content.
      out_dir: where ``report.md`` goes.
    """
    config_columns = _columns(u["config"] for u in meta["units"])
    numeric = [
        c for c in _columns(rows) if c not in config_columns and c != "seed"
        and all(isinstance(r.get(c), int | float) and not isinstance(r.get(c), bool) for r in rows)
    ]  # fmt: skip
    table = [
        [*key, len(group), *(mean_spread(r[c] for r in group).format() for c in numeric)]
        for key, group in group_rows(rows, config_columns).items()
    ]
    lines = [
        f"# {meta['experiment']}", "", meta["description"], "", f"Paper: {meta['paper']}", "",
        f"Scale `{meta['scale']}`, seeds {meta['seeds']}, {meta['num_finished']} of "
        f"{meta['num_units']} units.", "", "## Results (mean ± std over seeds)", "",
        markdown_table([*config_columns, "seeds", *numeric], table),
    ]  # fmt: skip
    if meta["claims"]:
        lines += ["## Claims (not evaluated by the default report)", ""]
        lines += [f"- {claim}" for claim in meta["claims"]]
    write_text_atomic(Path(out_dir) / "report.md", "\n".join(lines).rstrip("\n") + "\n")
