"""The ``jaxbounds`` command (thin: parse flags, call the engine, print, write files).

``jaxbounds estimate [--model NAME] [--seed N] [--out DIR] [--sections A B ...] [--full]``
runs :func:`jaxbounds.report.run_estimate`, prints the table of
:func:`jaxbounds.report.format_table` on stdout and writes ``DIR/report_<model>.json``
(default ``jaxbounds_report/``). ``jaxbounds estimate --list`` prints the models and sections
of :mod:`jaxbounds.report.registry`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxbounds",
        description="Measure curvature, sharpness, Rademacher complexity and generalization "
        "bounds of Transformers.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    est = commands.add_parser(
        "estimate",
        help="train (or build) a model on its default data and report every estimate",
        description="Build the model's default data and weights, run every report section "
        "that applies to it, print the table and write it as JSON.",
    )
    est.add_argument("--model", default="scalar", help="registered model (default: scalar)")
    est.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    est.add_argument(
        "--out", default="jaxbounds_report", help="output directory (default: jaxbounds_report)"
    )
    est.add_argument(
        "--sections",
        nargs="+",
        default=None,
        metavar="NAME",
        help="only these sections (space or comma separated; default: all that apply)",
    )
    est.add_argument("--full", action="store_true", help="the paper-sized run (slow on CPU)")
    est.add_argument("--quiet", action="store_true", help="no progress messages")
    est.add_argument("--list", action="store_true", help="list models and sections, then exit")
    return parser


def _estimate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import jaxbounds.report as report

    if args.list:
        print("models:", ", ".join(report.model_names()))
        for section in report.SECTIONS:
            print(f"section {section.name}: models {', '.join(section.models)}")
        return 0
    sections = None
    if args.sections is not None:
        sections = [s for item in args.sections for s in item.split(",") if s]
    if args.model not in report.model_names():
        parser.error(f"--model: expected one of {report.model_names()}, got {args.model!r}")
    known = set(report.section_names())
    if sections is not None and not set(sections) <= known:
        parser.error(f"--sections: unknown {sorted(set(sections) - known)}; known {sorted(known)}")
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = report.run_estimate(
        args.model, seed=args.seed, quick=not args.full, sections=sections, log=log
    )
    print(report.format_table(result))
    path = report.write_json(result, Path(args.out) / f"report_{args.model}.json")
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxbounds`` console script.

    Args:
      argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
      The exit status (0 on success; bad flags exit with status 2 via argparse).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "estimate":
        return _estimate(args, parser)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
