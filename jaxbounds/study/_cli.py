"""``jaxbounds study --from results.csv``: the study of any CSV of trained models.

Flags map the CSV's columns; a missing column, a value that is not a number (or beyond the
float range), an infinite gap, an empty or NaN axis, seed or family cell, one column in two
roles (an axis that is the seed column, an axis named twice), a test-set size below 1, a gap
beyond ``--loss-range`` (with ``--num-test``), a duplicated header, a row of the wrong length, a
file that is not UTF-8 text and a bad option exit 2 with one line naming the flag, the column,
the file and the row (as a spreadsheet counts them: the header is row 1). Negative gaps (with
``--num-test``) and too few null draws for "beyond null" are warned about on stderr at the start.

``--out`` is made, probed for writing and locked before the analysis (a second study into the
same folder stops at once, exit 2), and a folder created for a run that then stops is removed.
The report is written at the end, each file atomically, its record of the job (the CSV's digest
and the flags) last: a first SIGINT or SIGTERM during the analysis stops it at the next step,
with nothing written (exit 130 / 143); a table with no model left to analyse exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

from jaxbounds._report_place import (
    _check_writable_dir,
    _lock_place,
    _missing_dirs,
    _remove_created,
    _UsageError,
)

__all__ = ["add_parser", "run"]

_FLAG = {
    "family": "--family", "axes": "--axes", "seed": "--seed", "gap": "--gap",
    "measures": "--measures", "converged": "--converged", "gap_stderr": "--gap-stderr",
    "run_id": "--run-id", "num_test": "--num-test", "train_size": "--train-size",
    "source": "--from", "loss_range": "--loss-range", "num_null_draws": "--null-draws",
    "num_resamples": "--resamples",
}  # fmt: skip


def _names(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of column names")
    return out


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``study`` subcommand to ``commands`` (an argparse subparsers object)."""
    p = commands.add_parser(
        "study",
        parents=[common],
        allow_abbrev=False,
        help="Kendall tau, Psi, CMI, sign error and null baselines of measures in a CSV",
        description="Read a CSV of trained models (one row per model), analyse every measure "
        "against the gap per family (jaxbounds.study) and write report.md, study.json and "
        "figures under --out.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="CSV", help="the models")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--axes", required=True, type=_names, metavar="A,B", help="axis columns")
    p.add_argument("--seed", required=True, metavar="COL", help="seed column")
    p.add_argument("--gap", required=True, metavar="COL", help="generalization-gap column")
    p.add_argument("--measures", required=True, type=_names, metavar="M,N", help="measures")
    p.add_argument("--family", default=None, metavar="COL", help="family column (default: one)")
    p.add_argument("--converged", default=None, metavar="COL",
                   help="true/false column: the model met the stopping criterion")  # fmt: skip
    p.add_argument("--gap-stderr", default=None, metavar="COL", help="gap standard error column")
    p.add_argument("--run-id", default=None, metavar="COL", help="run identifier column")
    p.add_argument("--num-test", default=None, metavar="COL|N", help="test-set size (column/int)")
    p.add_argument(
        "--train-size",
        default=None,
        metavar="COL",
        help="training-set size column (size-adjusts the sign error's measures)",
    )
    p.add_argument("--loss-range", type=float, default=1.0, help="range of the per-example "
                   "loss behind the gap (default 1: the 0-1 error)")  # fmt: skip
    p.add_argument("--all-models", action="store_true",
                   help="analyse capped (not converged) models too")  # fmt: skip
    p.add_argument("--keep-duplicates", action="store_true", help="count repeated runs each")
    p.add_argument("--null-draws", type=int, default=100, help="draws per null (default 100)")
    p.add_argument("--resamples", type=int, default=200, help="bootstrap resamples")
    p.add_argument("--rng-seed", type=int, default=0, help="seed of the nulls and bootstrap")
    p.add_argument("--title", default="Measures versus the gap", help="report title")
    p.add_argument("--fresh", action="store_true",
                   help="replace the report of another study in --out")  # fmt: skip


class StudyUsageError(ValueError):
    """A flag names a column that is not there, or a value that does not parse."""


_JOB = "study_job.json"  # what made the report in --out: the CSV's digest and the flags
_JOB_FLAGS = ("axes", "seed", "gap", "measures", "family", "converged", "gap_stderr", "run_id",
              "num_test", "train_size", "loss_range", "all_models", "keep_duplicates",
              "null_draws", "resamples", "rng_seed", "title")  # fmt: skip


def _check_flags(args: argparse.Namespace) -> None:
    """The flags that need no file, checked first (exit 2, nothing created)."""
    from jaxbounds.study.analysis import MAX_DRAWS

    if not args.out or not args.out.strip():
        raise StudyUsageError("--out: expected a folder name, got ''")
    for name, value in (("--null-draws", args.null_draws), ("--resamples", args.resamples)):
        if not 1 <= value <= MAX_DRAWS:
            raise StudyUsageError(f"{name}: expected an integer in [1, {MAX_DRAWS:,}], got {value}")
    if args.rng_seed < 0:
        raise StudyUsageError(f"--rng-seed: expected an integer >= 0, got {args.rng_seed}")
    if not (math.isfinite(args.loss_range) and args.loss_range > 0):
        raise StudyUsageError(f"--loss-range: expected a finite number > 0, got {args.loss_range}")


def _digest(args: argparse.Namespace) -> dict[str, Any]:
    """What made a report: the CSV's SHA-256 and the flags (``--from`` checked here)."""
    source = Path(args.source)
    if source.is_dir():
        raise StudyUsageError(f"--from {args.source}: is a directory, not a CSV file")
    if not source.exists():
        raise StudyUsageError(f"--from {args.source}: no such file")
    if not source.is_file():
        raise StudyUsageError(f"--from {args.source}: is not a regular file (a CSV file is read "
                              "twice: give a file, not a pipe or a device)")  # fmt: skip
    try:
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError as err:
        reason = err.strerror or err
        raise StudyUsageError(f"--from {args.source}: cannot read it ({reason})") from None
    return {"csv_sha256": digest, **{k: getattr(args, k) for k in _JOB_FLAGS}}


def _claim_out(
    args: argparse.Namespace, job: dict[str, Any], held: contextlib.ExitStack, created: list
) -> Path:
    """``--out``: made, probed for writing and locked until ``held`` closes.

    A report of another study there is kept without ``--fresh`` (checked under the lock).
    """
    out = Path(args.out)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise StudyUsageError(f"--out {args.out}: {blocker} exists and is not a directory")
    missing = _missing_dirs(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _remove_created(missing)
        reason = err.strerror or err
        raise StudyUsageError(f"--out {args.out}: cannot create it ({reason})") from err
    created.extend(missing)
    _check_writable_dir(out, "--out")
    _lock_place(out, "--out", "jaxbounds study", held)
    if not args.fresh and any((out / n).exists() for n in ("report.md", "study.json")):
        try:
            earlier = json.loads((out / _JOB).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = None
        if earlier != json.loads(json.dumps(job)):
            raise StudyUsageError(
                f"--out {args.out}: holds the report of another study (other CSV or flags); "
                "give --fresh to replace it, or another --out"
            )
    return out


def _usage(err: ValueError) -> StudyUsageError:
    """A library error (``argument: text``) as a usage error naming the flag."""
    argument, _, rest = str(err).partition(": ")
    return StudyUsageError(f"{_FLAG.get(argument, argument)}: {rest}")


def run(args: argparse.Namespace) -> int:
    """Run ``jaxbounds study``; print where the report went.

    Raises:
      StudyUsageError: with the flag named, for a column or value the table lacks.
    """
    from jaxbounds._atomic import Interrupted, SignalGuard, write_text_atomic

    _check_flags(args)
    job = _digest(args)
    table = _load(args)
    created: list[Path] = []
    with contextlib.ExitStack() as held:
        try:
            out = _claim_out(args, job, held, created)
            with SignalGuard():
                study = _analyze(args, table)
        except (ValueError, _UsageError, Interrupted) as err:  # nothing written: no trace left
            _remove_created(created)
            if not isinstance(err, Interrupted):
                raise
            name = signal.Signals(err.signum).name
            print(f"jaxbounds study: interrupted by {name} before the report was written; "
                  "nothing was written (the study writes its report at the end: run the "
                  "command again)", file=sys.stderr)  # fmt: skip
            return err.exit_code
        (out / _JOB).unlink(missing_ok=True)  # a folder with a part of a report is not this job's
        paths = _write(study, out, args.title)
        write_text_atomic(out / _JOB, json.dumps(job, indent=1, sort_keys=True) + "\n")
    for fr in study.families.values():
        print(f"{fr.family}: {fr.num_models} models analysed of {fr.num_rows}", file=sys.stdout)
        for note in fr.notes:
            print(f"  {note}", file=sys.stdout)
    print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stdout)
    return 0


def _load(args: argparse.Namespace) -> Any:
    """The table of ``--from`` and the warnings about it (stderr); a bad value exits 2."""
    from jaxbounds.study import load_table
    from jaxbounds.study._table import check_gap_range
    from jaxbounds.study.nulls import MIN_DRAWS

    num_test: Any = args.num_test
    if isinstance(num_test, str) and num_test.isdigit():
        num_test = int(num_test)
    try:
        table = load_table(
            args.source, family=args.family, axes=args.axes, seed=args.seed, gap=args.gap,
            measures=args.measures, converged=args.converged, gap_stderr=args.gap_stderr,
            run_id=args.run_id, num_test=num_test, train_size=args.train_size,
        )  # fmt: skip
        warnings = check_gap_range(table, args.loss_range)
    except ValueError as err:
        raise _usage(err) from None
    for line in warnings:
        argument, _, rest = line.partition(": ")
        print(f"warning: {_FLAG.get(argument, argument)}: {rest}", file=sys.stderr)
    if args.null_draws < MIN_DRAWS:
        print(f"warning: --null-draws: {args.null_draws} draws are too few for 'beyond null' "
              f"(a two-sided 5% rank test needs {MIN_DRAWS}): that column reads n/a",
              file=sys.stderr)  # fmt: skip
    return table


def _analyze(args: argparse.Namespace, table: Any) -> Any:
    """The study of ``table``; a table with no model to analyse is a data error (exit 1)."""
    from jaxbounds.study import analyze

    try:
        study = analyze(
            table, converged_only=not args.all_models,
            collapse_duplicates=not args.keep_duplicates, num_null_draws=args.null_draws,
            num_resamples=args.resamples, rng_seed=args.rng_seed, loss_range=args.loss_range,
        )  # fmt: skip
    except ValueError as err:
        raise _usage(err) from None
    if not any(fr.num_models for fr in study.families.values()):
        why = "; ".join(
            f"{fr.family}: {fr.num_rows} rows, {fr.num_no_gap} without a gap, {fr.num_capped} "
            "capped"
            for fr in study.families.values()
        )
        hint = "" if args.all_models else " (--all-models analyses capped models too)"
        raise ValueError(f"--from {args.source}: no model left to analyse ({why}){hint}; "
                         "nothing written")  # fmt: skip
    return study


def _write(study: Any, out: Path, title: str) -> list[Path]:
    """report.md, study.json and the figures, each atomically; a failed write names --out."""
    from jaxbounds._atomic import critical_section
    from jaxbounds.study.report import render_report

    try:
        with critical_section():
            return render_report(study, out, title=title)
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        raise OSError(f"--out {out}: cannot write{where} ({err.strerror or err}); the "
                      "folder may hold a part of the report") from None  # fmt: skip
