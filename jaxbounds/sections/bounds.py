"""Report section ``bounds``: every applicable closed-form bound, one row each, vacuous flagged."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxbounds.bounds import from_model
from jaxbounds.bounds._result import Bound
from jaxbounds.estimate import EstimateContext, Row, register_section

__all__ = ["bounds_rows", "bounds_section"]

_SECTION = "bounds"


def _facts(ctx: EstimateContext) -> dict[str, Any]:
    extra = ctx.extra
    if ctx.name == "shallow" and "shallow" in extra:
        info = extra["shallow"]
        return {
            "init": info["init"],
            "radii": info["radii"],
            "phi0": info["Phi0"],
            "features0": info["features0"],
        }
    if ctx.name == "construction" and "function" in extra:
        f = extra["function"]
        return {"degree": f.degree, "sparsity": f.sparsity, "seq_len": extra["seq_len"]}
    facts = {}
    for key in ("activation_lipschitz", "loss_lipschitz"):
        if key in extra:
            facts[key] = extra[key]
    return facts


def bounds_rows(bounds: dict[str, Bound]) -> list[Row]:
    """One report row per bound: value, vacuous flag (risk / Rademacher / probability), notes."""
    rows = []
    for name, b in bounds.items():
        failing = [k for k, v in b.hypotheses.items() if not bool(np.all(np.asarray(v)))]
        note = f"{b.name} [{b.status}]; {b.kind}"
        if failing:
            note += "; hypotheses FAIL: " + ", ".join(failing)
        vac = None if b.kind in ("log_cover", "proxy") else bool(np.all(np.asarray(b.vacuous)))
        rows.append(Row(_SECTION, name, float(np.asarray(b.value)), vacuous=vac, note=note))
    return rows


@register_section(_SECTION, models=("scalar", "shallow", "construction"))
def bounds_section(ctx: EstimateContext) -> list[Row]:
    """Evaluate :func:`jaxbounds.bounds.from_model` on the trained model and its training data."""
    return bounds_rows(from_model(ctx.model, ctx.train, **_facts(ctx)))
