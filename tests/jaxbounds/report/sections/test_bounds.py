"""Section ``bounds``: a row per bound of from_model on quantities recomputed here, flags right."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.bounds._result import Bound, Check
from jaxbounds.bounds.from_model import from_model
from jaxbounds.models import construction_quantities, scalar_quantities, shallow_quantities
from jaxbounds.report.render import format_table
from jaxbounds.report.rows import Report
from jaxbounds.report.sections import bounds_section
from jaxbounds.report.sections.bounds import NOT_VALID, bounds_rows


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
        assert row.note.startswith(f"{b.name} [{b.provenance}]; {b.kind}")
        failed = [k for k, c in b.hypotheses.items() if not np.all(c.holds)]
        if failed or np.isnan(b.value):  # not valid: never a number, never a vacuous flag
            assert row.value == NOT_VALID
            assert row.vacuous is None
            assert "; not valid: " in row.note
            for k in failed:
                assert f"{k} fails" in row.note
            continue
        assert row.value == pytest.approx(float(b.value), rel=1e-6)
        if b.kind in ("log_cover", "proxy"):
            assert row.vacuous is None
        else:
            assert row.vacuous == bool(float(b.value) >= float(b.trivial))


def test_scalar_gap_vacuous_flag_is_the_loss_range(scalar_run):
    rows = {r.name: r for r in bounds_section(scalar_run)}
    loss_bound = math.log1p(math.exp(float(jnp.linalg.norm(scalar_run.params["w"]))))
    gaps = [r for name, r in rows.items() if name.endswith(" gap") and r.value != NOT_VALID]
    assert gaps  # the multi-layer gaps hold whatever the run
    for gap in gaps:
        assert gap.vacuous == (gap.value >= loss_bound)


def test_failing_hypotheses_make_the_bound_not_valid(shallow_run):
    """Lemma 4 / Theorem 5 under d_m < N^3: "not valid" with the numbers, never "non-vacuous"."""
    rows = {r.name: r for r in bounds_section(shallow_run)}
    n = shallow_run.facts.quantities.num_examples
    for name in ("shallow Lemma 4 empirical", "shallow Theorem 5"):
        row = rows[name]
        assert row.value == NOT_VALID
        assert row.vacuous is None
        assert f"d_m >= N^3 fails (d_m = 24, N^3 = {n**3})" in row.note  # d_m = 24 < 18^3
    table = format_table(Report("shallow", list(rows.values()), {}))
    # the row's line (its note, on the lines below it, names Lemma 4 too)
    (lemma_4,) = [ln for ln in table.splitlines() if ln.startswith("bounds") and "Lemma 4" in ln]
    assert "not valid" in lemma_4
    assert "vacuous" not in lemma_4.lower()


def test_bounds_rows_of_hand_made_bounds():
    good = Bound(0.5, {}, {"h": Check.of(True)}, 1.0, "A", "risk")
    vacuous = Bound(2.0, {}, {}, 1.0, "V", "rademacher", "rebuilt")
    bad = Bound(
        0.2, {}, {"h": Check.of([True, False], m=3), "k": True}, 1.0, "B", "rademacher", "rebuilt"
    )
    nan = Bound(float("nan"), {}, {}, 1.0, "N", "risk")
    cover = Bound(7.0, {}, {}, None, "C", "log_cover")
    rows = bounds_rows({"a": good, "v": vacuous, "b": bad, "n": nan, "c": cover})
    assert [(r.name, r.value, r.vacuous) for r in rows] == [
        ("a", 0.5, False),
        ("v", 2.0, True),
        ("b", NOT_VALID, None),
        ("n", NOT_VALID, None),
        ("c", 7.0, None),
    ]
    assert rows[0].note == "A [paper]; risk"
    assert rows[2].note == "B [rebuilt]; rademacher; not valid: h fails (m = 3)"
    assert rows[3].note == "N [paper]; risk; not valid: the value is NaN"
    assert rows[4].note == "C [paper]; log_cover"
