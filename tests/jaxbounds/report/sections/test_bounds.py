"""Section ``bounds``: a row per bound of from_model on quantities recomputed here, flags right."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.bounds._result import Bound
from jaxbounds.bounds.from_model import from_model
from jaxbounds.models import construction_quantities, scalar_quantities, shallow_quantities
from jaxbounds.report.sections import bounds_section
from jaxbounds.report.sections.bounds import bounds_rows


def _independent_quantities(run):
    x, y = run.train["inputs"], run.train["labels"]
    if run.name == "scalar":
        return scalar_quantities(run.params, x, activation_lipschitz=1.0)
    if run.name == "shallow":
        return shallow_quantities(run.facts.params0, x, y, radii=run.record.radius)
    risk = jnp.mean((run.apply_fn(run.params, x) - y) ** 2)
    return construction_quantities(
        run.apply_fn, run.params, x, empirical_risk=risk, function=run.facts.function,
        seq_len=run.facts.seq_len,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["scalar_run", "shallow_run", "construction_run"])
def test_rows_are_the_bounds_of_the_run(request, name):
    run = request.getfixturevalue(name)
    rows = bounds_section(run)
    expected = from_model(_independent_quantities(run))
    assert [r.name for r in rows] == list(expected)
    for row in rows:
        b = expected[row.name]
        assert row.section == "bounds"
        assert row.value == pytest.approx(float(b.value), rel=1e-6)
        assert row.note.startswith(f"{b.name} [{b.status}]; {b.kind}")
        if b.kind in ("log_cover", "proxy"):
            assert row.vacuous is None
        else:
            assert row.vacuous == bool(b.vacuous)


def test_scalar_gap_vacuous_flag_is_the_loss_range(scalar_run):
    rows = {r.name: r for r in bounds_section(scalar_run)}
    gap = rows["T&T Corollary 4.1.1 gap"]
    loss_bound = math.log1p(math.exp(float(jnp.linalg.norm(scalar_run.params["w"]))))
    assert gap.vacuous == (gap.value >= loss_bound)


def test_failing_hypotheses_are_named(shallow_run):
    rows = {r.name: r for r in bounds_section(shallow_run)}
    assert "hypotheses FAIL: " in rows["shallow Theorem 5"].note
    assert "d_m >= N^3" in rows["shallow Theorem 5"].note  # d_m = 24 < 18^3


def test_bounds_rows_of_hand_made_bounds():
    good = Bound(jnp.asarray(0.5), {}, {"h": jnp.asarray(True)}, jnp.asarray(False), "A", "risk")
    bad = Bound(
        jnp.asarray(2.0), {}, {"h": jnp.asarray([True, False]), "k": True}, jnp.asarray(True),
        "B", "rademacher", "rebuilt",
    )  # fmt: skip
    cover = Bound(jnp.asarray(7.0), {}, {}, jnp.asarray(True), "C", "log_cover")
    rows = bounds_rows({"a": good, "b": bad, "c": cover})
    assert [(r.name, r.value, r.vacuous) for r in rows] == [
        ("a", 0.5, False),
        ("b", 2.0, True),
        ("c", 7.0, None),
    ]
    assert rows[0].note == "A [paper]; risk"
    assert rows[1].note == "B [rebuilt]; rademacher; hypotheses FAIL: h"
    assert np.isfinite(rows[2].value)
