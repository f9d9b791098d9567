"""Section ``bounds`` (every model): every applicable closed-form bound with its status.

A valid bound is shown as a number with its vacuous flag (risk / Rademacher / probability bounds;
log covers and proxies have none). A bound whose hypotheses fail on the run (status
``NOT_VALID``) is never shown as a number: its value column reads ``"not valid"`` and the note
lists the failed hypotheses with the numbers they failed on.
"""

from __future__ import annotations

import numpy as np

from jaxbounds.bounds._result import Bound
from jaxbounds.bounds.from_model import from_model
from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row

__all__ = ["NOT_VALID", "bounds_rows", "bounds_section"]

_SECTION = "bounds"
#: The value column of a bound that does not apply to the run.
NOT_VALID = "not valid"


def bounds_rows(bounds: dict[str, Bound]) -> list[Row]:
    """One report row per bound: value and vacuous flag when valid, else "not valid" + reasons.

    >>> from jaxbounds.bounds._result import Check
    >>> rows = bounds_rows({"b": Bound(0.3, {}, {"m > d": Check.of(False, m=8)}, trivial=1.0)})
    >>> rows[0].value, rows[0].vacuous, rows[0].note
    ('not valid', None, ' [paper]; ; not valid: m > d fails (m = 8)')
    """
    rows = []
    for name, b in bounds.items():
        note = f"{b.name} [{b.provenance}]; {b.kind}"
        if not bool(np.all(b.is_valid)):
            note += "; not valid: " + "; ".join(b.failed)
            rows.append(Row(_SECTION, name, NOT_VALID, note=note))
            continue
        vacuous = None if b.trivial is None else bool(np.all(b.is_vacuous))
        rows.append(Row(_SECTION, name, float(b.value), vacuous=vacuous, note=note))
    return rows


def bounds_section(run: Run) -> list[Row]:
    """:func:`jaxbounds.bounds.from_model.from_model` on the run's measured quantities."""
    return bounds_rows(from_model(run.facts.quantities))
