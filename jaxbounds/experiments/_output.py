"""Outputs of a run: deterministic ``results.csv``, machine metadata, optional matplotlib.

``results.csv`` has one row per finished unit, columns ``<config keys in grid order>, seed,
<result keys in first-seen order>``, rows sorted by the configuration values (numbers
numerically, then strings) and then the seed, floats written with ``repr`` (shortest text that
reads back to the same double), LF line endings. It depends only on the unit files, so an
interrupted-and-resumed run writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxbounds._atomic import write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = [
    "announce_no_figures", "csv_text", "figures_available", "machine_info", "new_figure",
    "save_figure", "sort_records", "versions", "write_rendered",
]  # fmt: skip


def _sort_value(value: Any) -> tuple:
    if value is None:
        return (0,)
    if isinstance(value, bool | int | float):
        return (1, float(value))
    if isinstance(value, str):
        return (2, value)
    return (3, json.dumps(value, sort_keys=True))


def sort_records(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list:
    """Unit records (``config``, ``seed``, ...) sorted by config values in ``columns``, seed."""

    def key(record: Mapping[str, Any]) -> tuple:
        config = record["config"]
        values = tuple(_sort_value(config.get(c)) for c in columns)
        return (*values, record["seed"], json.dumps(config, sort_keys=True))

    return sorted(records, key=key)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """CSV text of ``rows`` (dicts) in ``columns`` order; missing cells are empty.

    >>> print(csv_text([{"T": 20, "seed": 0, "gap": 0.1}], ["T", "seed", "gap"]), end="")
    T,seed,gap
    20,0,0.1
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buffer.getvalue()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of Python, numpy, jax and jaxlib (None where not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    out.update({name: _version(name) for name in ("numpy", "jax", "jaxlib")})
    return out


def machine_info() -> dict[str, Any]:
    """Platform, CPU count and the JAX backend and devices of this process."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import jax

        info["jax_backend"] = jax.default_backend()
        info["jax_devices"] = [str(device) for device in jax.devices()]
    except Exception as exc:  # metadata only: never fail a run for it
        info["jax_devices"] = f"unavailable: {type(exc).__name__}: {exc}"
    return info


_SAID_NO_MATPLOTLIB = False
_NO_FIGURES = (
    "matplotlib is not installed: no figures will be drawn (pip install 'jaxbounds[plot]');\n"
    "  tables, summary and report are still written; the report says which figures are missing"
)


def figures_available() -> bool:
    """Whether matplotlib can be found (nothing is imported).

    >>> isinstance(figures_available(), bool)
    True
    """
    from jaxbounds._deps import missing

    return not missing(["matplotlib"])


def announce_no_figures() -> bool:
    """Say once per process, before any work, that no figures will be drawn; True if drawn.

    Returns:
      Whether matplotlib is installed.
    """
    global _SAID_NO_MATPLOTLIB
    if figures_available():
        return True
    if not _SAID_NO_MATPLOTLIB:
        _SAID_NO_MATPLOTLIB = True
        print(_NO_FIGURES, file=sys.stderr, flush=True)
    return False


def new_figure(**kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure`` (no pyplot, no global backend), or None without matplotlib.

    When matplotlib cannot be imported, one line says so on stderr (once per process) and the
    caller skips its figures; everything else is still written.

    Args:
      **kwargs: passed to ``Figure`` (e.g. ``figsize=(4, 3)``).

    Returns:
      The figure, or None.
    """
    global _SAID_NO_MATPLOTLIB
    try:
        from matplotlib.figure import Figure
    except ImportError:
        if not _SAID_NO_MATPLOTLIB:
            _SAID_NO_MATPLOTLIB = True
            print(_NO_FIGURES, file=sys.stderr, flush=True)
        return None
    return Figure(**kwargs)


def save_figure(figure: Any, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Save a matplotlib figure atomically (format from the suffix, default dpi 120).

    Args:
      figure: a ``matplotlib.figure.Figure``.
      path: the target file, e.g. ``out_dir / "figure1.png"``.
      **kwargs: passed to ``savefig``.

    Returns:
      The path written.
    """
    path = Path(path)
    buffer = io.BytesIO()
    kwargs = {"dpi": 120, "bbox_inches": "tight", **kwargs}
    figure.savefig(buffer, format=path.suffix.lstrip(".") or "png", **kwargs)
    return write_bytes_atomic(path, buffer.getvalue())


def write_rendered(
    out_dir: str | os.PathLike[str], figures: Mapping[str, Any], stats: Any, report: str
) -> None:
    """The usual end of an experiment's ``render``: figures, ``statistics.json``, ``report.md``.

    Args:
      out_dir: the run's output folder.
      figures: file name -> figure; a None figure (matplotlib missing, or nothing to draw) is
        skipped.
      stats: the JSON-ready statistics.
      report: the text of ``report.md``.
    """
    out_dir = Path(out_dir)
    for name, figure in figures.items():
        if figure is not None:
            save_figure(figure, out_dir / name)
    write_json_atomic(out_dir / "statistics.json", stats)
    write_text_atomic(out_dir / "report.md", report)
