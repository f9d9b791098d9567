"""Where ``jaxbounds estimate`` writes its report, checked before any work.

The output place (``--out`` / ``--json``): made, probed for writing and locked; the reports
already there: a finished report of another job is replaced only with ``--fresh``, and a
partial report of the same job is resumed. Every refusal is a :class:`_UsageError` (one line,
exit status 2), raised before the command does any work.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class _UsageError(Exception):
    """A bad option found before any work: one line, exit status 2."""


def _partial_path(path: Path) -> Path:
    """``report_x.json`` -> ``report_x.partial.json``."""
    return path.with_name(f"{path.stem}.partial{path.suffix or '.json'}")


def _check_writable_dir(directory: Path, flag: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".jaxbounds-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise _UsageError(f"{flag}: cannot write in {directory} ({err.strerror or err})") from err


def _not_empty(flag: str, value: str | None) -> None:
    """An empty path (``--out ''``) would silently mean the current directory: refuse it."""
    if value is not None and not value.strip():
        raise _UsageError(f"{flag}: expected a path, got an empty string")


def _lock_place(directory: Path, flag: str, what: str, held: contextlib.ExitStack) -> None:
    """Hold the output directory's lock until ``held`` closes; busy -> one line, exit 2."""
    from jaxbounds._atomic import LockBusy, exclusive_lock

    try:
        held.enter_context(exclusive_lock(directory))
    except LockBusy as busy:
        raise _UsageError(
            f"{flag} {directory}: another {what} is writing there (it holds a lock on "
            f"{busy.path}); wait for it to end or choose another {flag}"
        ) from None


def _missing_dirs(directory: Path) -> list[Path]:
    """``directory`` and its ancestors that do not exist yet, deepest first."""
    return [p for p in (directory, *directory.parents) if not p.exists()]


def _remove_created(created: Sequence[Path]) -> None:
    """Remove the directories this run created (deepest first), only where still empty."""
    for directory in created:
        with contextlib.suppress(OSError):
            directory.rmdir()


def _output_paths(
    args: argparse.Namespace, held: contextlib.ExitStack, created: list[Path]
) -> tuple[Path, Path]:
    """The report and partial-report paths, checked (and ``--out`` created) before any work.

    The output directory is locked (``flock``) until ``held`` closes: a second
    ``jaxbounds estimate`` on the same directory stops here instead of doing the work twice.
    The directories created for ``--out`` are appended to ``created`` (deepest first), so
    that a run refused later, before any work, removes them again.
    """
    _not_empty("--out", args.out)
    _not_empty("--json", args.json)
    if args.json is not None:
        if args.json.endswith(("/", os.sep)) or Path(args.json).name in ("", ".", ".."):
            # Path() would drop the slash (a file named DIR); "." names the directory itself
            raise _UsageError(f"--json {args.json}: expected a file name, got a directory path")
        path, flag = Path(args.json), "--json"
        directory = path.parent
        if not directory.is_dir():
            what = "is not a directory" if directory.exists() else "does not exist"
            raise _UsageError(f"--json {path}: the directory {directory} {what}")
    else:
        directory, flag = Path(args.out), "--out"
        if directory.exists() and not directory.is_dir():
            raise _UsageError(f"--out {directory}: exists and is not a directory")
        missing = _missing_dirs(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            _remove_created(missing)
            raise _UsageError(
                f"--out {directory}: cannot create the directory ({err.strerror or err})"
            ) from err
        created.extend(missing)
        path = directory / f"report_{args.model}.json"
    for target in (path, _partial_path(path)):
        if target.exists() and not target.is_file():
            raise _UsageError(f"{flag}: {target} exists and is not a regular file")
    _check_writable_dir(directory, flag)
    _lock_place(directory, flag, "jaxbounds estimate", held)
    return path, _partial_path(path)


def _place_flag(args: argparse.Namespace) -> str:
    return f"--json {args.json}" if args.json is not None else f"--out {args.out}"


def _read_report(path: Path) -> tuple[Any, str | None]:
    """The report at ``path`` and None, or None and why it cannot be read."""
    from jaxbounds.report.rows import Report

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, f"{path} is not a readable JSON file ({err})"
    try:
        return Report.from_dict(data), None
    except ValueError as err:  # "not a jaxbounds report (KeyError: 'rows')"
        return None, f"{path} is {err}"


def _finished_report_check(path: Path, config: Any, args: argparse.Namespace) -> None:
    """A finished report of another job at ``path`` is replaced only with ``--fresh``.

    The same job (model, seed, scale, sections and precision; a newer package version is the
    same job computed again) replaces its own report. Checked before any work: exit 2, nothing
    written.
    """
    if args.fresh or not path.exists():
        return
    report, problem = _read_report(path)
    if report is not None:
        diff = config.differences(report.meta.get("job"), ignore=("version",))
        if not diff:
            return
        problem = f"{path} is the finished report of another job ({'; '.join(diff)})"
    raise _UsageError(
        f"{_place_flag(args)}: {problem}; --fresh replaces it, or choose another "
        f"{_place_flag(args).split()[0]}"
    )


def _saved_partial(path: Path, config: Any, args: argparse.Namespace) -> Any:
    """The partial report to resume from, or None (checked before any work).

    ``--fresh`` ignores it (and the run replaces it). Otherwise a partial report of this job
    is resumed, and a partial report of another job (or an unreadable one) stops the command
    (exit 2): its finished sections are kept until ``--fresh`` says to discard them.
    ``--resume`` without a partial report of this job is an error.
    """
    if args.fresh:
        return None
    if not path.exists():
        if args.resume:
            raise _UsageError(f"--resume: no interrupted run's report at {path}; nothing to resume")
        return None
    report, problem = _read_report(path)
    if report is not None:
        diff = config.differences(report.meta.get("job"))
        if report.complete:
            problem = f"{path} is a complete report, not an interrupted run's"
        elif diff:
            problem = (
                f"{path} holds the finished sections of another job ({'; '.join(diff)}); "
                "run that job's command to resume it"
            )
        else:
            return report
    flag = "--resume" if args.resume else _place_flag(args)
    raise _UsageError(f"{flag}: {problem}; --fresh discards it, or choose another "
                      f"{_place_flag(args).split()[0]}")  # fmt: skip
