"""Section ``bounds`` (every model): every applicable closed-form bound, vacuous ones flagged."""

from __future__ import annotations

import numpy as np

from jaxbounds.bounds._result import Bound
from jaxbounds.bounds.from_model import from_model
from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row

__all__ = ["bounds_rows", "bounds_section"]

_SECTION = "bounds"


def bounds_rows(bounds: dict[str, Bound]) -> list[Row]:
    """One report row per bound: value, vacuous flag (risk / Rademacher / probability), notes.

    Log covers and proxies have no vacuous flag; a bound whose checkable hypotheses fail says
    which in its note.
    """
    rows = []
    for name, b in bounds.items():
        failing = [k for k, v in b.hypotheses.items() if not bool(np.all(np.asarray(v)))]
        note = f"{b.name} [{b.status}]; {b.kind}"
        if failing:
            note += "; hypotheses FAIL: " + ", ".join(failing)
        vac = None if b.kind in ("log_cover", "proxy") else bool(np.all(np.asarray(b.vacuous)))
        rows.append(Row(_SECTION, name, float(np.asarray(b.value)), vacuous=vac, note=note))
    return rows


def bounds_section(run: Run) -> list[Row]:
    """:func:`jaxbounds.bounds.from_model.from_model` on the run's measured quantities."""
    return bounds_rows(from_model(run.facts.quantities))
