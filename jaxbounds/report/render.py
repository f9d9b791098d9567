"""Render a :class:`~jaxbounds.report.rows.Report`: an aligned text table and a JSON file.

The table has one line per :class:`~jaxbounds.report.rows.Row`: section, quantity, value, its
standard error (``± s``) for Monte Carlo estimates, a confidence interval ``[lo, hi]`` where a
kernel gives one, ``VACUOUS`` for bounds at or above the trivial bound, and the note (method,
assumptions, status). The JSON file is ``Report.to_dict()``: ``{"model", "meta", "rows"}``
with one object per row (the :class:`Row` fields) and the run's metadata (seed, timings,
configuration, training record).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from jaxbounds.report.rows import Report, Row

__all__ = ["format_table", "format_value", "write_json"]

_HEADERS = ("section", "quantity", "value", "± stderr", "interval", "", "note")


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


def _cells(row: Row) -> tuple[str, ...]:
    interval = ""
    if row.lower is not None or row.upper is not None:
        interval = f"[{format_value(row.lower)}, {format_value(row.upper)}]"
    vacuous = {None: "", True: "VACUOUS", False: "non-vacuous"}[row.vacuous]
    stderr = "" if row.stderr is None else f"± {format_value(row.stderr)}"
    return (
        row.section,
        row.name,
        format_value(row.value),
        stderr,
        interval,
        vacuous,
        row.note,
    )


def format_table(report: Report) -> str:
    """The report as an aligned text table with a one-line header and the timings.

    Args:
      report: the result of :func:`jaxbounds.report.job.run_estimate`.

    Returns:
      The table as one string (no trailing newline).
    """
    rows = [_cells(r) for r in report.rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(_HEADERS)]
    right = {2, 3}  # numbers right-aligned

    def line(cells: tuple[str, ...]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    meta = report.meta
    mode = "quick" if meta.get("quick", True) else "full"
    title = f"jaxbounds estimate: model {report.model}, seed {meta.get('seed')}, {mode} run"
    out = [title, line(_HEADERS), line(tuple("-" * w for w in widths))]
    previous = None
    for cells in rows:
        if previous is not None and cells[0] != previous:
            out.append("")
        out.append(line(cells))
        previous = cells[0]
    timings = meta.get("timings_s", {})
    if timings:
        total = sum(float(t) for t in timings.values())
        parts = ", ".join(f"{k} {float(t):.1f}" for k, t in timings.items())
        out.append(f"time (s): {parts}; total {total:.1f}")
    return "\n".join(out)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return np.asarray(obj).tolist()
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def write_json(report: Report, path: str | Path) -> Path:
    """Write ``report.to_dict()`` as indented JSON (parent directories are created).

    Arrays and numpy scalars become lists / numbers; anything else unknown is ``repr``-ed.

    Returns:
      The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        json.dump(report.to_dict(), f, indent=2, default=_json_default)
        f.write("\n")
    return path
