r"""The ``jaxbounds`` command (thin: parse flags, call the engine, print, write files).

``jaxbounds estimate [--model NAME] [--seed N] [--out DIR | --json FILE] [--sections A B ...]
[--full] [--quiet | --progress] [--resume | --fresh] [--debug]`` runs
:func:`jaxbounds.report.run_estimate`, prints the table of
:func:`jaxbounds.report.format_table` on stdout and writes the report as JSON to
``DIR/report_<model>.json`` (default ``jaxbounds_report/``) or ``FILE``. ``--list`` prints the
models and sections of :mod:`jaxbounds.report.registry`.

``jaxbounds reproduce NAME [--scale smoke|cpu|paper] [--out DIR] [--seeds N] [--from DIR]
[--fresh] ...``
runs a paper's experiment with :func:`jaxbounds.experiments.runner.run_experiment`;
``jaxbounds reproduce --list`` lists them. ``jaxbounds --version`` prints the version.

Many processes: both commands first call :func:`jaxbounds.distributed.initialize`, so the same
command started in N processes with ``JAXBOUNDS_COORDINATOR``, ``JAXBOUNDS_NUM_PROCESSES`` and
``JAXBOUNDS_PROCESS_ID`` set (or under SLURM and the other launchers JAX detects) runs as one
program; with none of them set, the command runs alone and starts no distributed runtime.
``estimate`` then runs every process through the same sections, its Monte Carlo kernels sharded
over all processes' devices, and only process 0 prints the table and writes the report (the
others are silent); a stop requested on any process stops all at the same step, and process 0's
saved partial report decides what every process resumes. ``reproduce`` gives each process a
disjoint share of the units (run on its own devices), every process waits until all units'
files are in the shared ``--out`` directory, and process 0 alone writes the tables, figures and
report, byte for byte those of a one-process run. ``--process-index`` / ``--process-count``
are then optional and must agree with the runtime (exit 2 otherwise); without the runtime they
split a run by hand as before (process 0 renders what exists when its share is done).

What both commands guarantee:

- The optional packages a command needs (an experiment's ``requires``, see
  ``jaxbounds/_deps.py``) are checked before any work: a missing one stops it with one line
  naming the package and the ``pip`` command, exit status 2. ``reproduce`` refuses, the same
  way, to replace the report of another run (another scale or other seeds) in ``DIR/NAME``
  unless ``--fresh`` is given.

- No flag is guessed from a prefix (``allow_abbrev=False`` on every parser): ``reproduce NAME
  --seed 3`` is an error, not ``--seeds 3``. Unknown or malformed flags exit with status 2
  (argparse's usage line and one error line).
- Every check that can fail runs before any work and fails with one line on stderr and exit
  status 2, naming the flag: ``estimate``'s model, sections (a selection that selects nothing,
  such as ``--sections ,`` or ``--model construction --sections training``, is an error), seed
  (an integer in ``[0, 2**32)``) and output place (``--out`` must be a directory that can be
  created and written in; ``--json`` a file, not a directory, in an existing writable
  directory); ``reproduce``'s experiment, ``--seeds`` / ``--scale`` size (at most
  :data:`jaxbounds.experiments.runner.MAX_UNITS` units per run, refused with the estimated
  number of units and memory) and output place (``--out DIR`` a directory in which
  ``DIR/NAME/units`` can be created and written, ``--from DIR`` a finished run). An empty path
  (``--out ''``, ``--json ''``, ``--from ''``) is refused instead of meaning the current
  directory.
- One run at a time per output place: ``estimate`` holds an ``flock`` on its output directory
  (``--out``, or the directory of ``--json``), ``reproduce`` on ``DIR/NAME/units/.lock.process<i>``
  (one per process share), until its files are written. A second run on the same place stops
  at once, before any work, with one line naming the lock (and the holder's process id where
  known) and exit status 2. The kernel releases an ``flock`` when its process ends, however it
  ends (SIGKILL, a crash), so a lock never outlives its run.
- Signals, the Unix convention, the same in both commands: SIGINT (Ctrl-C) and SIGTERM stop
  the run between two steps (``estimate``: the build, each section; ``reproduce``: each batch
  of units), exit with 130 / 143 and one line on stderr, and keep what was finished (the
  sections in a partial report, the units' files) for the same command to resume. A signal
  that was *ignored* when the command started (``SIG_IGN``: a job started with ``&`` by a
  non-interactive shell, or under ``nohup``) stays ignored, as in every Unix tool that
  catches signals; stop such a job with SIGTERM (``kill PID``) unless that is ignored too.

What ``estimate`` guarantees besides:

- The JSON report is standard JSON (no ``NaN``/``Infinity`` tokens: a non-finite number is
  ``null`` and its row names it in ``"nonfinite"``; see :mod:`jaxbounds.report.render`), and
  every file is written atomically (temporary file in the same directory, fsync, rename): a crash
  or a full disk never leaves a truncated or missing report where a good one was.
- SIGINT (Ctrl-C) or SIGTERM stop the job between two steps (the build, each section), never
  inside XLA: the handlers only set a flag, and the previous handlers are restored on exit. A
  second signal stops at once. Each finished section is saved as it finishes in
  ``<report>.partial.json``, marked ``"complete": false`` (the earlier complete report is left
  as it was); the command exits with 130 (SIGINT) or 143 (SIGTERM) and one line on stderr, no
  traceback. Running the same command again resumes from the partial report (by default when
  the job matches: model, seed, scale, sections and package version; ``--resume`` insists,
  ``--fresh`` starts over), skipping the finished sections, and ends with the same numbers as an
  uninterrupted run.
- Nothing finished is replaced by another job without ``--fresh``: a finished report of another
  model, seed, scale or sections, or a partial report of another job, at the output place
  stops the command before any work (exit status 2, naming what differs). ``--resume`` with
  nothing to resume is an error, and removes the ``--out`` directories it created.
- Progress bars go to stderr only when it is a terminal (``--progress`` forces them, ``--quiet``
  silences every progress message), so redirected output has no ``\r`` lines.
- Errors from bad data (:class:`jaxbounds.data.mnist.DataError`, other ``ValueError`` and
  ``OSError``) print one line and exit with status 1; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxbounds import __version__, _compile_cache, cli_rademacher
from jaxbounds._report_place import (
    _check_writable_dir,
    _finished_report_check,
    _missing_dirs,
    _not_empty,
    _output_paths,
    _remove_created,
    _saved_partial,
    _UsageError,
)
from jaxbounds._startup import release_startup
from jaxbounds.study import _cli as study_cli

__all__ = ["main", "script"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StartError(Exception):
    """JAX's distributed runtime did not start (e.g. no coordinator): one line, exit status 1."""


def _bounded_int(minimum: int, limit: int | None, describe: str) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` and, unless None, < ``limit``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {describe}, got {text!r}") from None
        if value < minimum or (limit is not None and value >= limit):
            raise argparse.ArgumentTypeError(f"expected {describe}, got {text}")
        return value

    return parse


_seed = _bounded_int(0, 2**32, "an integer in [0, 2**32)")
_positive_int = _bounded_int(1, None, "an integer >= 1")
_nonnegative_int = _bounded_int(0, None, "an integer >= 0")


def _estimate_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    est = commands.add_parser(
        "estimate",
        parents=[common],
        allow_abbrev=False,
        help="train (or build) a model on its default data and report every estimate",
        description="Build the model's default data and weights, run every report section "
        "that applies to it, print the table and write it as JSON.",
    )
    est.add_argument("--model", default="scalar", help="registered model (default: scalar)")
    est.add_argument(
        "--seed", type=_seed, default=0, help="seed of every random choice, in [0, 2**32)"
    )
    where = est.add_mutually_exclusive_group()
    where.add_argument(
        "--out", default="jaxbounds_report", help="output directory (default: jaxbounds_report)"
    )
    where.add_argument(
        "--json", metavar="FILE", help="write the JSON report to this file instead of --out"
    )
    est.add_argument(
        "--sections",
        nargs="+",
        default=None,
        metavar="NAME",
        help="only these sections (space or comma separated; default: all that apply)",
    )
    est.add_argument("--full", action="store_true", help="the paper-sized run (slow on CPU)")
    shown = est.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress messages at all")
    shown.add_argument(
        "--progress", action="store_true", help="progress bars on stderr even if not a terminal"
    )
    again = est.add_mutually_exclusive_group()
    again.add_argument(
        "--resume", action="store_true", help="resume an interrupted run (error if there is none)"
    )
    again.add_argument(
        "--fresh", action="store_true",
        help="start over: replace the earlier report (partial or finished) of another job",
    )  # fmt: skip
    est.add_argument("--list", action="store_true", help="list models and sections, then exit")


def _reproduce_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    rep = commands.add_parser(
        "reproduce",
        parents=[common],
        allow_abbrev=False,
        help="rerun a paper's experiment (resumable; tables, figures, report.md)",
        description="Run the units of an experiment that are not finished yet, then write "
        "results.csv, summary.json, the figures and report.md under DIR/NAME.",
    )
    rep.add_argument("name", nargs="?", metavar="NAME", help="the experiment (see --list)")
    rep.add_argument("--list", action="store_true", help="list the experiments, then exit")
    rep.add_argument(
        "--scale", choices=("smoke", "cpu", "paper"), default=None, help="sizes (default: cpu)"
    )
    rep.add_argument("--out", default=None, metavar="DIR", help="output root (default: "
                     "jaxbounds_reproduce, or the --from run)")  # fmt: skip
    rep.add_argument("--seeds", type=_positive_int, default=None, metavar="N", help="seeds 0..N-1")
    rep.add_argument("--jobs", type=_positive_int, default=1, metavar="N", help="local jobs")
    rep.add_argument(
        "--from", dest="from_dir", default=None, metavar="DIR",
        help="re-render tables and figures from the finished units under DIR, running nothing",
    )  # fmt: skip
    rep.add_argument(
        "--process-index", type=_nonnegative_int, default=None, metavar="I",
        help="this process's share (default: from the distributed runtime, else 0)",
    )  # fmt: skip
    rep.add_argument(
        "--process-count", type=_positive_int, default=None, metavar="N",
        help="processes sharing the run (default: from the distributed runtime, else 1)",
    )  # fmt: skip
    rep.add_argument(
        "--fresh", action="store_true",
        help="replace the report of another run (other scale or seeds) in DIR/NAME",
    )  # fmt: skip
    shown = rep.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="no progress messages")
    shown.add_argument("--progress", action="store_true", help="progress bar even if no terminal")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxbounds",
        description="Measure curvature, sharpness, Rademacher complexity and generalization "
        "bounds of Transformers.",
        allow_abbrev=False,  # --seed is not --seeds: no flag is ever guessed from a prefix
    )
    parser.add_argument("--version", action="version", version=f"jaxbounds {__version__}")
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    commands = parser.add_subparsers(dest="command", required=True)
    _estimate_parser(commands, common)
    _reproduce_parser(commands, common)
    study_cli.add_parser(commands, common)
    cli_rademacher.add_parser(commands, common)
    return parser


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _StopOnSignal:
    """SIGINT/SIGTERM set a flag (checked between steps); a second one exits at once.

    The handlers never raise, so no exception is thrown into a JAX callback or a compilation
    (a ``KeyboardInterrupt`` there is what used to end in a traceback and, on interpreter
    shutdown with XLA work in flight, a segmentation fault). A signal whose disposition is
    ``SIG_IGN`` (a background job) stays ignored. The previous handlers come back on exit.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.saved = "nothing was saved"
        self._previous: dict[int, Any] = {}
        self._writing = 0
        self._hard: int | None = None

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def requested(self) -> bool:
        """Whether a signal asked the job to stop."""
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        del frame
        if self.signum is None:
            self.signum = signum
            if sys.stderr.isatty():
                _err(f"\njaxbounds: {signal.Signals(signum).name}: stopping after the current "
                     "step (send it again to stop at once)")  # fmt: skip
            return
        if self._writing:
            self._hard = signum
            return
        self._exit_now(signum)

    def _exit_now(self, signum: int) -> None:
        _err(f"jaxbounds: stopped at once by a second {signal.Signals(signum).name}; "
             f"{self.saved}")  # fmt: skip
        os._exit(128 + signum)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold a second signal's immediate exit until a file is written."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if not self._writing and self._hard is not None:
            self._exit_now(self._hard)


class _NoBars:
    r"""A text stream that drops progress-bar redraws (writes starting with ``\r``).

    The training loops draw their bar as ``\r``-led writes closed by a lone ``"\n"``; both are
    dropped, everything else passes through.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._in_bar = False

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            self._in_bar = True
            return len(text)
        if self._in_bar and text == "\n":
            self._in_bar = False
            return len(text)
        self._in_bar = False
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _progress_shown(show: bool) -> Iterator[None]:
    if show:
        yield
        return
    saved, sys.stderr = sys.stderr, _NoBars(sys.stderr)
    try:
        yield
    finally:
        sys.stderr = saved


def _split_sections(items: Sequence[str] | None) -> list[str] | None:
    if items is None:
        return None
    return [s.strip() for item in items for s in item.split(",") if s.strip()]


def _start_processes() -> Any:
    """Join the distributed runtime if the environment or a cluster launcher configures one."""
    from jaxbounds import distributed

    try:
        info = distributed.initialize()
    except ValueError as err:
        raise _UsageError(str(err)) from err
    except RuntimeError as err:
        raise _StartError(str(err)) from err
    if info.process_count > 1:
        _handshake(info)
    return info


def _handshake(info: Any) -> None:
    """A first collective, with file descriptor 1 sent to stderr while it runs.

    Gloo prints a line on the process's standard output when it first connects the processes;
    the command's stdout is for its own output (the table), so that line goes to stderr.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        _all_agree(info, True)
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _all_agree(info: Any, ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective; just ``ok`` for one process)."""
    if info.process_count == 1:
        return ok
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _checked_everywhere(info: Any, check: Callable[[], Any]) -> Any:
    """``check()`` on this process; if it or another process's check fails, all stop (exit 2).

    With several processes every process must reach the same collective steps, so a usage
    error found on one process (say, only process 0 checks the output place) stops them all
    before any work instead of leaving the others waiting for it.
    """
    try:
        value, problem = check(), None
    except _UsageError as err:
        value, problem = None, err
    if not _all_agree(info, problem is None):
        raise problem or _UsageError("another process refused its options (see its error)")
    return value


def _say_missing_packages(model: str) -> None:
    """One line per optional package the model uses that is missing (before any work)."""
    from jaxbounds import _deps
    from jaxbounds.report import registry

    if model == "shallow" and os.environ.get("JAXBOUNDS_MNIST_DIR"):
        return  # real MNIST files: scikit-learn's digits are not used
    uses = registry.MODEL_PACKAGES.get(model, {})
    for module in _deps.missing(uses):
        name = _deps.EXTRAS.get(module, (module,))[0]
        _err(f"[jaxbounds] {name} is not installed: model {model} {uses[module]} "
             f"({_deps.pip_command([module])})")  # fmt: skip


def _list_estimate() -> int:
    from jaxbounds.report import registry

    print("models:", ", ".join(registry.model_names()))
    for section in registry.SECTIONS:
        print(f"section {section.name}: models {', '.join(section.models)}")
    return 0


def _estimate(args: argparse.Namespace) -> int:
    # the signal guard comes before the imports (a Ctrl-C there stops cleanly too); the output
    # directory's lock is held until the report is written
    with _StopOnSignal() as stop, contextlib.ExitStack() as held:
        import jaxbounds.report as report
        from jaxbounds.report.job import job_config, run_estimate

        if args.list:
            return _list_estimate()
        try:
            config = job_config(
                args.model, seed=args.seed, quick=not args.full,
                sections=_split_sections(args.sections),
            )  # fmt: skip
        except ValueError as err:
            raise _UsageError(str(err)) from err
        info = _start_processes()
        if not info.is_main:
            return _estimate_follower(args, config, info, stop, run_estimate)
        if not args.quiet:
            _say_missing_packages(config.model)
        created: list[Path] = []
        say = (lambda _msg: None) if args.quiet else _err
        try:
            path, partial = _checked_everywhere(info, lambda: _output_paths(args, held, created))
            resume = _checked_everywhere(info, lambda: _saved_partial(partial, config, args))
            if resume is None:  # resuming continues a job that started here after this check
                _checked_everywhere(info, lambda: _finished_report_check(path, config, args))
            else:
                _checked_everywhere(info, lambda: None)
        except _UsageError:
            _remove_created(created)  # refused before any work: leave no empty --out behind
            raise
        _share_resumed(info, config, resume)
        if resume is not None:
            stop.saved = f"finished sections ({len(resume.sections_done or [])}) are in {partial}"

        def save(part: Any) -> None:
            with stop.writing():
                report.write_json(part, partial)
            stop.saved = f"finished sections ({len(part.sections_done)}) are in {partial}"

        show = args.progress or (not args.quiet and sys.stderr.isatty())
        with _progress_shown(show):
            result = run_estimate(
                config.model, seed=config.seed, quick=config.quick, sections=config.sections,
                log=None if args.quiet else say, resume=resume, on_section=save,
                should_stop=_stop_everywhere(info, stop),
            )  # fmt: skip
        if not result.complete:
            code = _stopped(stop.signum or signal.SIGINT, result, partial, report.format_table)
            _remove_created(created)  # only if nothing was written there
            return code
        with stop.writing():
            report.write_json(result, path)
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
    print(report.format_table(result))
    print(f"wrote {path}")
    return 0


def _stop_everywhere(info: Any, stop: _StopOnSignal) -> Callable[[], bool]:
    """``should_stop`` of the job: a stop requested on any process stops every process."""
    if info.process_count == 1:
        return stop.requested
    return lambda: not _all_agree(info, not stop.requested())


def _share_resumed(info: Any, config: Any, resume: Any) -> list[str]:
    """Process 0's resumed sections, sent to every process (a collective when several)."""
    done = [] if resume is None else list(resume.sections_done or [])
    if info.process_count == 1:
        return done
    import numpy as np
    from jax.experimental import multihost_utils

    mask = np.array([name in done for name in config.sections], np.int32)
    mask = multihost_utils.broadcast_one_to_all(mask)
    return [name for name, flag in zip(config.sections, mask, strict=True) if flag]


def _estimate_follower(
    args: argparse.Namespace, config: Any, info: Any, stop: _StopOnSignal, run_estimate: Callable
) -> int:
    """A process other than 0: the same steps (every kernel is collective), silently."""
    _checked_everywhere(info, lambda: None)  # process 0 checks the output place,
    _checked_everywhere(info, lambda: None)  # the report to resume from
    _checked_everywhere(info, lambda: None)  # and the finished report it would replace
    done = _share_resumed(info, config, None)
    todo = [name for name in config.sections if name not in done]
    with _progress_shown(False):
        result = run_estimate(
            config.model, seed=config.seed, quick=config.quick, sections=todo, log=None,
            should_stop=_stop_everywhere(info, stop),
        )  # fmt: skip
    return 0 if result.complete else 128 + (stop.signum or signal.SIGINT)


def _stopped(signum: int, result: Any, partial: Path, format_table: Callable) -> int:
    name = signal.Signals(signum).name
    done, total = len(result.sections_done or []), len(result.meta.get("sections", []))
    if done:
        print(format_table(result))
        _err(f"jaxbounds: interrupted by {name}: {done} of {total} sections saved in {partial} "
             "(incomplete); run the same command again to resume")  # fmt: skip
    else:
        _err(f"jaxbounds: interrupted by {name} before any section finished; nothing written")
    return 128 + signum


def _reproduce(args: argparse.Namespace) -> int:
    from jaxbounds.experiments import runner
    from jaxbounds.experiments.registry import REGISTRY

    if args.list:
        if args.name is not None:
            raise _UsageError(f"--list takes no NAME (got {args.name!r})")
        print(REGISTRY.listing())
        return 0
    if args.name is None:
        raise _UsageError("give an experiment NAME, or --list to see them")
    index = 0 if args.process_index is None else args.process_index
    count = 1 if args.process_count is None else args.process_count
    if index >= count:
        raise _UsageError(f"--process-index must be < --process-count ({count})")
    try:
        experiment = REGISTRY.get(args.name)
    except ValueError as err:
        raise _UsageError(str(err)) from err
    _not_empty("--out", args.out)
    _not_empty("--from", args.from_dir)
    info = _start_processes()
    many = info.process_count > 1
    if many:
        _checked_everywhere(info, lambda: _agrees_with_runtime(args, info))
        index, count = info.process_index, info.process_count
    # a collective with several processes: every process checks, before any returns
    _checked_everywhere(info, lambda: _reproduce_checks(args, experiment, runner))
    if many and args.from_dir is not None and not info.is_main:
        return 0  # re-rendering runs nothing: process 0 does it alone
    try:
        summary = runner.run_experiment(
            experiment, scale=args.scale, out_dir=args.out, seeds=args.seeds, jobs=args.jobs,
            quiet=args.quiet or not info.is_main, from_dir=args.from_dir, process_index=index,
            process_count=count, progress=True if args.progress else None,
            wait_for_shares=many, fresh=args.fresh,
        )  # fmt: skip
    except runner.Interrupted as exc:
        _err(f"jaxbounds: {exc}")
        return exc.exit_code
    except FileNotFoundError as err:
        if args.from_dir is None:
            raise
        raise _UsageError(str(err)) from err
    except runner.LockBusy as busy:
        raise _UsageError(_busy_text(args, busy)) from None
    except runner.RunTooLarge as err:
        raise _UsageError(_size_text(args, err)) from None
    except runner.OtherRunThere as err:
        raise _UsageError(_other_run_text(args, err)) from None
    except runner.MissingPackages as err:
        raise _UsageError(str(err)) from None
    if info.is_main:
        print(f"{summary.experiment}: {summary.num_finished} of {summary.num_units} units in "
              f"{summary.out_dir}")  # fmt: skip
    return 0


def _reproduce_checks(args: argparse.Namespace, experiment: Any, runner: Any) -> None:
    """The run's size and the output place, checked before any work (one line, exit 2).

    ``--out DIR`` (default ``jaxbounds_reproduce``) must be a directory in which ``DIR/NAME``
    and ``DIR/NAME/units`` can be created and written; with ``--from`` alone the outputs go
    to the source run, which must be writable. The run's size is estimated from one seed
    (:func:`jaxbounds.experiments.runner.check_size`). The experiment's optional packages
    are checked first (:func:`jaxbounds.experiments.runner.check_packages`).
    """
    try:
        runner.check_packages(experiment, rendering_only=args.from_dir is not None)
    except runner.MissingPackages as err:
        raise _UsageError(str(err)) from None
    if args.from_dir is None:
        scale = args.scale or experiment.default_scale
        if scale not in experiment.scales:
            known = ", ".join(experiment.scales)
            raise _UsageError(f"--scale {scale}: {experiment.name} has the scales {known}")
        seeds = args.seeds if args.seeds is not None else experiment.seeds_for(scale)
        try:
            runner.check_size(experiment, scale, seeds)
        except runner.RunTooLarge as err:
            raise _UsageError(_size_text(args, err)) from None
    if args.from_dir is not None and args.out is None:
        try:
            run_dir = runner.resolve_from(args.from_dir, experiment.name)
        except FileNotFoundError as err:
            raise _UsageError(str(err)) from err
        flag, where = "--from", run_dir
    else:
        flag = "--out"
        root = Path(args.out if args.out is not None else runner.DEFAULT_OUT)
        run_dir = root / experiment.name
        if root.exists() and not root.is_dir():
            raise _UsageError(f"--out {root}: exists and is not a directory")
        if run_dir.exists() and not run_dir.is_dir():
            raise _UsageError(f"--out {root}: {run_dir} exists and is not a directory")
        _refuse_odd_outputs(run_dir, flag)  # before any directory is made for the run
        where = run_dir if args.from_dir is not None else run_dir / "units"
        missing = _missing_dirs(where)
        try:
            where.mkdir(parents=True, exist_ok=True)
            _check_writable_dir(where, flag)
        except (OSError, _UsageError) as err:
            _remove_created(missing)
            if isinstance(err, _UsageError):
                raise
            raise _UsageError(
                f"--out {root}: cannot create the directory {where} ({err.strerror or err})"
            ) from err
    _check_writable_dir(run_dir, flag)
    _refuse_odd_outputs(run_dir, flag)


def _refuse_odd_outputs(run_dir: Path, flag: str) -> None:
    """A report file of the run that exists but is not a regular file (a directory): exit 2."""
    for name in ("results.csv", "summary.json", "report.md"):
        target = run_dir / name
        if target.exists() and not target.is_file():
            raise _UsageError(f"{flag}: {target} exists and is not a regular file")


def _other_run_text(args: argparse.Namespace, err: Any) -> str:
    flag = "--out" if args.out is not None or args.from_dir is None else "--from"
    place = args.out if flag == "--out" and args.out is not None else err.run_dir
    return (
        f"{flag} {place}: {err.run_dir} holds the report of another run "
        f"({'; '.join(err.differences)}); --fresh replaces it (finished unit files are kept), "
        f"or choose another {flag}"
    )


def _size_text(args: argparse.Namespace, err: Any) -> str:
    flag = f"--seeds {args.seeds}" if args.seeds is not None else f"--scale {args.scale}"
    return f"{flag}: {err}"


def _busy_text(args: argparse.Namespace, busy: Any) -> str:
    who = f"process {busy.pid}" if busy.pid is not None else "another process"
    flag = "--out" if args.out is not None or args.from_dir is None else "--from"
    return (
        f"{flag}: {who} is already running {args.name} there (it holds the lock {busy.path}); "
        f"wait for it to end or choose another {flag}"
    )


def _agrees_with_runtime(args: argparse.Namespace, info: Any) -> None:
    """Explicit --process-index/--process-count must be the distributed runtime's own."""
    for flag, given, running in (
        ("--process-count", args.process_count, info.process_count),
        ("--process-index", args.process_index, info.process_index),
    ):
        if given is not None and given != running:
            raise _UsageError(
                f"{flag} {given}: this process runs as process {info.process_index} of "
                f"{info.process_count} under JAX's distributed runtime (JAXBOUNDS_* variables "
                "or a cluster launcher); leave the flag out or give the runtime's value"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxbounds`` console script.

    Args:
      argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
      The exit status: 0 on success, 1 for an error in the data or the files (one line; the
      traceback with ``--debug``), 2 for bad options (argparse's own errors raise
      ``SystemExit(2)``), 128 + signal number when SIGINT (130) or SIGTERM (143) stopped it.
    """
    release_startup()  # a Ctrl-C from here on is the command's to handle
    parser = _parser()
    args = parser.parse_args(argv)
    # JAX's persistent compilation cache (docs/large-models.md): a second run of the same job
    # reads its compiled programs from disk; JAXBOUNDS_COMPILE_CACHE=off turns it off
    _compile_cache.enable()
    try:
        if args.command == "estimate":
            return _estimate(args)
        if args.command == "study":
            return study_cli.run(args)
        if args.command == "rademacher":
            return cli_rademacher.run(args)
        return _reproduce(args)
    except (_UsageError, study_cli.StudyUsageError) as err:
        _err(f"jaxbounds {args.command}: error: {err}")
        return 2
    except _StartError as err:
        _err(f"jaxbounds {args.command}: error: {err}")
        return 1
    except (ValueError, OSError, ImportError) as err:  # DataError is a ValueError
        if args.debug:
            raise
        _err(f"jaxbounds {args.command}: error: {err} (--debug shows the traceback)")
        return 1
    except KeyboardInterrupt:
        # Ctrl-C before the command's own handlers were in place (reproduce: while its
        # experiment module is imported or its grid planned): the same one line, no traceback
        if args.debug:
            raise
        _err(f"jaxbounds {args.command}: interrupted by SIGINT; finished work is kept, run the "
             "same command again to resume")  # fmt: skip
        return 128 + signal.SIGINT


def script() -> None:
    """The console script: :func:`main`, then exit with its status.

    The work is finished and written when :func:`main` returns; a Ctrl-C during the
    interpreter's shutdown (JAX's clean-up takes a moment, and Python resets a handled SIGINT to
    the default action then) would turn the exit status into a kill by SIGINT, so SIGINT is
    ignored from here on.
    """
    code = main()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    script()
