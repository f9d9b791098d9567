"""Render a :class:`~jaxbounds.report.rows.Report`: an aligned text table and a JSON file.

The table fits :data:`WIDTH` (100) columns and every column has a header. It has one line per
:class:`~jaxbounds.report.rows.Row`: section, quantity, value, its standard error (``± s``) for
Monte Carlo estimates and the status of a bound (``non-vacuous``; ``VACUOUS`` at or above the
trivial bound; ``no trivial bound`` for a log cover or complexity proxy, which has no scale to
be vacuous against; ``NOT VALID`` when a hypothesis of its theorem fails on the run, and then
the value cell reads ``not valid`` instead of a number). Below it, indented under the quantity,
come the confidence interval ``[lower, upper]`` where a kernel gives one and the note (method,
assumptions, failed hypotheses), wrapped to the width; a long quantity wraps in its column.
The title of an interrupted run's report says ``INCOMPLETE``.

The JSON file is ``Report.to_dict()``: ``{"model", "complete", "sections_done", "meta",
"rows"}`` with one object per row (the :class:`Row` fields) and the run's metadata (seed,
timings, configuration, training record). It is standard JSON (written with
``allow_nan=False``): a NaN or infinite number is written as ``null``, and a row names its
non-finite fields in ``"nonfinite"`` (e.g. ``{"value": "nan"}``); a bound's row has its
``"status"`` string. Files are written atomically (temporary file in the same directory,
fsync, rename): a crash or a full disk leaves the previous file, never a truncated one.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxbounds._atomic import write_text_atomic
from jaxbounds.report.rows import NO_TRIVIAL, NOT_VALID, VACUOUS, Report, Row

__all__ = ["WIDTH", "format_table", "format_value", "to_json", "write_json"]

_STATUS_CELL = {
    None: "", NOT_VALID: "NOT VALID", VACUOUS: "VACUOUS", NO_TRIVIAL: "no trivial bound",
}  # fmt: skip

#: The widest line of :func:`format_table` (columns); the JSON report keeps every field whole.
WIDTH = 100

_HEADERS = ("section", "quantity", "value", "± stderr", "bound status")
_NOTE_HEADER = "note (and interval [lower, upper] where one is given)"


def format_value(value: Any) -> str:
    """A number with 5 significant digits (strings pass through, None is empty).

    >>> format_value(3.14159265), format_value(1234567.0), format_value(None), format_value("x")
    ('3.1416', '1.2346e+06', '', 'x')
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.5g}"


def _cells(row: Row) -> tuple[tuple[str, ...], str]:
    """The row's cells under :data:`_HEADERS`, and its note line (interval first)."""
    status = row.bound_status
    value = "not valid" if status == NOT_VALID else format_value(row.value)
    stderr = "" if row.stderr is None else f"± {format_value(row.stderr)}"
    note = row.note
    if row.lower is not None or row.upper is not None:
        lower = "(-inf" if row.lower is None else f"[{format_value(row.lower)}"
        upper = "+inf)" if row.upper is None else f"{format_value(row.upper)}]"
        interval = f"interval {lower}, {upper}"
        note = f"{interval}; {note}" if note else interval
    cells = (row.section, row.name, value, stderr, "" if status is None else _status(status))
    return cells, note


def _status(status: str) -> str:
    return _STATUS_CELL.get(status, "non-vacuous")


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(width, 8), break_on_hyphens=False) or [""]


def format_table(report: Report, width: int = WIDTH) -> str:
    """The report as an aligned text table at most ``width`` columns wide, with the timings.

    One line per row under the headers ``section``, ``quantity``, ``value``, ``± stderr`` and
    ``bound status``; the row's note (method, assumptions; the interval first where a kernel
    gives one) on the lines below it, indented under the quantity. A quantity or note too long
    for its column is wrapped; the JSON report keeps every field whole.

    Args:
      report: the result of :func:`jaxbounds.report.job.run_estimate`.
      width: the widest line (default :data:`WIDTH`).

    Returns:
      The table as one string (no trailing newline).
    """
    rows = [_cells(r) for r in report.rows]
    widths = [max([len(h)] + [len(cells[i]) for cells, _ in rows]) for i, h in enumerate(_HEADERS)]
    others = sum(widths) - widths[1] + 2 * (len(_HEADERS) - 1)
    widths[1] = max(min(widths[1], width - others), 16)
    indent = " " * (widths[0] + 2)
    right = {2, 3}  # numbers right-aligned

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    meta = report.meta
    mode = "quick" if meta.get("quick", True) else "full"
    title = f"jaxbounds estimate: model {report.model}, seed {meta.get('seed')}, {mode} run"
    if not report.complete:
        done = report.sections_done or sorted({r.section for r in report.rows})
        total = meta.get("sections")
        of = f" of {len(total)}" if isinstance(total, list) else ""
        title += f" -- INCOMPLETE ({len(done)}{of} sections: {', '.join(done) or 'none'})"
    out = [*_wrap(title, width), line(_HEADERS), indent + _NOTE_HEADER]
    out.append(line(tuple("-" * w for w in widths)))
    previous = None
    for cells, note in rows:
        if previous is not None and cells[0] != previous:
            out.append("")
        names = _wrap(cells[1], widths[1])
        out.append(line((cells[0], names[0], *cells[2:])))
        out += [line(("", name, "", "", "")) for name in names[1:]]
        if note:
            out += [indent + text for text in _wrap(note, width - len(indent))]
        previous = cells[0]
    timings = meta.get("timings_s", {})
    if timings:
        out += textwrap.wrap(
            _time_line(timings, meta.get("build_timings_s") or {}), width,
            subsequent_indent="  ", break_on_hyphens=False,
        )  # fmt: skip
    return "\n".join(out)


def _time_line(timings: dict[str, Any], build_parts: dict[str, Any]) -> str:
    r"""``time (s): build B (training run T, data and model D); sections S (a x, ...); total``.

    The build (data, model and its training run) and the report sections are two sums, each
    listed part by part, and the total is their sum: the training happens in the build, so the
    ``training`` *section* (which only reads the run's record) takes about no time.

    >>> line = _time_line({"build": 42.0, "training": 0.01, "curvature": 8.0},
    ...                   {"training run": 40.0, "data and model": 2.0})
    >>> print(line.replace("; ", ";\n"))
    time (s): build 42.0 (training run 40.0, data and model 2.0);
    sections 8.0 (training 0.0, curvature 8.0);
    total 50.0
    """
    build = float(timings.get("build", 0.0))
    sections = {k: float(t) for k, t in timings.items() if k != "build"}
    parts = []
    if "build" in timings:
        inner = ", ".join(f"{k} {float(t):.1f}" for k, t in build_parts.items())
        parts.append(f"build {build:.1f}" + (f" ({inner})" if inner else ""))
    if sections:
        inner = ", ".join(f"{k} {t:.1f}" for k, t in sections.items())
        parts.append(f"sections {sum(sections.values()):.1f} ({inner})")
    total = build + sum(sections.values())
    return f"time (s): {'; '.join(parts)}; total {total:.1f}"


def _jsonable(value: Any) -> Any:
    """Plain JSON values: arrays and numpy scalars as lists/numbers, non-finite floats None."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(np.asarray(value).tolist())
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def to_json(report: Report) -> str:
    """``report.to_dict()`` as indented standard JSON text (no NaN/Infinity; trailing newline).

    Arrays and numpy scalars become lists / numbers (non-finite entries ``null``); anything else
    unknown is ``repr``-ed.

    >>> print(to_json(Report("m", [Row("s", "x", float("nan"))], {"seed": 0})), end="")
    {
      "model": "m",
      "complete": true,
      "meta": {
        "seed": 0
      },
      "rows": [
        {
          "section": "s",
          "name": "x",
          "value": null,
          "stderr": null,
          "lower": null,
          "upper": null,
          "vacuous": null,
          "note": "",
          "status": null,
          "nonfinite": {
            "value": "nan"
          }
        }
      ]
    }
    """
    return json.dumps(_jsonable(report.to_dict()), indent=2, allow_nan=False) + "\n"


def write_json(report: Report, path: str | Path) -> Path:
    """Write :func:`to_json` of the report to ``path`` atomically (parent directories created).

    Returns:
      The path written.

    Raises:
      OSError: if the file cannot be written (the previous file, if any, is left as it was).
    """
    return write_text_atomic(path, to_json(report))
