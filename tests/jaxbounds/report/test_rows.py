"""Row.from_estimate and Report.to_dict."""

import dataclasses

import jax.numpy as jnp

from jaxbounds.report.rows import Report, Row
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


def test_report_to_dict():
    rows = [Row("a", "x", 1.0, note="n"), Row("b", "y", "text")]
    d = Report("scalar", rows, {"seed": 1}).to_dict()
    assert d["model"] == "scalar"
    assert d["meta"] == {"seed": 1}
    assert d["rows"][0] == {
        "section": "a",
        "name": "x",
        "value": 1.0,
        "stderr": None,
        "lower": None,
        "upper": None,
        "vacuous": None,
        "note": "n",
    }
    assert d["rows"][1]["value"] == "text"
