"""Row.from_estimate, Row.from_bound and the three-state status, JSON round trips."""

import dataclasses
import math

import jax.numpy as jnp
import pytest

from jaxbounds.bounds._result import Bound, Check
from jaxbounds.report.rows import NO_TRIVIAL, NON_VACUOUS, NOT_VALID, VACUOUS, Report, Row
from kernels.estimate import Estimate


def test_row_from_estimate_with_and_without_interval():
    est = Estimate(mean=jnp.asarray(1.5), stderr=jnp.asarray(0.25), num_samples=4)
    row = Row.from_estimate("s", "x", est, note="n")
    assert (row.value, row.stderr, row.lower, row.upper, row.vacuous) == (
        1.5,
        0.25,
        None,
        None,
        None,
    )
    assert isinstance(row.value, float)
    est = dataclasses.replace(est, lower=jnp.asarray(1.0), upper=jnp.asarray(2.0), delta=0.05)
    row = Row.from_estimate("s", "x", est)
    assert (row.lower, row.upper) == (1.0, 2.0)


def test_row_from_bound_has_three_states():
    holds = {"m > d": Check.of(True, m=32, d=16)}
    fails = {"d_m >= N^3": Check.of(False, d_m=64, **{"N^3": 6.4e7})}
    good = Row.from_bound("bounds", "b", Bound(0.3, {}, holds, trivial=1.0), note="Lemma 4")
    assert (good.status, good.vacuous, good.note) == (NON_VACUOUS, False, "Lemma 4")
    big = Row.from_bound("bounds", "b", Bound(3.0, {}, holds, trivial=1.0))
    assert (big.status, big.vacuous) == (VACUOUS, True)
    bad = Row.from_bound("bounds", "b", Bound(8.6e-22, {}, fails, trivial=1.0), note="Lemma 4")
    assert (bad.status, bad.vacuous) == (NOT_VALID, False)
    assert bad.note == "Lemma 4; d_m >= N^3 fails (d_m = 64, N^3 = 6.4e+07)"
    nan = Row.from_bound("bounds", "b", Bound(float("nan"), {}, {}, trivial=1.0))
    assert nan.status == NOT_VALID
    assert "the value is NaN" in nan.note
    cover = Row.from_bound("bounds", "log cover", Bound(12.0, {}, {}, trivial=None))
    assert (cover.status, cover.vacuous) == (NO_TRIVIAL, None)  # never "non-vacuous"


def test_bound_status_of_rows_without_status():
    assert Row("s", "x", 1.0).bound_status is None
    assert Row("b", "x", 1.0, vacuous=False).bound_status == NON_VACUOUS
    assert Row("b", "x", 1.0, vacuous=True).bound_status == VACUOUS
    # What the bounds section writes for a bound whose hypotheses fail: never non-vacuous.
    row = Row("b", "Lemma 4", 8.6e-22, vacuous=False, note="Lemma 4 [not valid]; risk")
    assert row.bound_status == NOT_VALID
    row = Row("b", "Lemma 4", 8.6e-22, vacuous=False, note="x; hypotheses FAIL: alpha")
    assert row.bound_status == NOT_VALID
    assert Row("b", "x", float("nan"), vacuous=False).bound_status == NOT_VALID
    with pytest.raises(ValueError, match=r"Row\.status"):
        Row("b", "x", 1.0, status="valid")


def test_report_to_dict_and_back():
    rows = [
        Row("a", "x", 1.0, note="n"),
        Row("b", "y", "text"),
        Row("c", "z", float("nan"), stderr=float("inf"), lower=-math.inf, upper=2.0),
        Row("bounds", "b", 0.5, vacuous=False, status=NOT_VALID),
    ]
    report = Report("scalar", rows, {"seed": 1, "loss": [0.5, float("nan")]}, False, ["a"])
    d = report.to_dict()
    assert list(d) == ["model", "complete", "sections_done", "meta", "rows"]
    assert (d["model"], d["complete"], d["sections_done"]) == ("scalar", False, ["a"])
    assert d["meta"] == {"seed": 1, "loss": [0.5, None]}
    assert d["rows"][0] == {
        "section": "a",
        "name": "x",
        "value": 1.0,
        "stderr": None,
        "lower": None,
        "upper": None,
        "vacuous": None,
        "note": "n",
        "status": None,
    }
    assert d["rows"][1]["value"] == "text"
    assert d["rows"][2]["nonfinite"] == {"value": "nan", "stderr": "inf", "lower": "-inf"}
    assert (d["rows"][2]["value"], d["rows"][2]["upper"]) == (None, 2.0)
    assert d["rows"][3]["status"] == "not valid"
    back = Report.from_dict(d)
    assert back.rows[:2] == rows[:2]
    assert back.rows[3] == rows[3]
    assert math.isnan(back.rows[2].value)
    assert (back.rows[2].stderr, back.rows[2].lower) == (math.inf, -math.inf)
    assert (back.complete, back.sections_done) == (False, ["a"])


@pytest.mark.parametrize("data", [{}, {"model": "m"}, {"model": "m", "rows": [{"x": 1}]}, []])
def test_report_from_dict_rejects_other_data(data):
    with pytest.raises(ValueError, match="not a jaxbounds report"):
        Report.from_dict(data)
