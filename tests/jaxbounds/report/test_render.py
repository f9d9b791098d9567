"""The table and the JSON file of a report."""

import json
import os

import numpy as np
import pytest

from jaxbounds.bounds import Bound
from jaxbounds.report.render import format_table, format_value, to_json, write_json
from jaxbounds.report.rows import NOT_VALID, Report, Row


def test_format_value():
    assert format_value(3.14159265) == "3.1416"
    assert format_value(1234567.0) == "1.2346e+06"
    assert format_value(12.0) == "12"
    assert format_value(float("nan")) == "nan"
    assert format_value(None) == ""
    assert format_value("x") == "x"


def _strict(text):
    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_format_table_and_json(tmp_path):
    rows = [
        Row("bounds", "a bound", 12.5, vacuous=True, note="rebuilt"),
        Row("rademacher", "Rad_S", 0.123456, 0.001, 0.1, 0.15),
        Row("training", "model", "scalar"),
    ]
    meta = {"seed": 1, "quick": False, "timings_s": {"build": 2.0}, "array": np.arange(2)}
    report = Report("scalar", rows, meta)
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0] == "jaxbounds estimate: model scalar, seed 1, full run"
    assert "VACUOUS" in table
    assert "± 0.001" in table
    assert "interval [0.1, 0.15]" in table  # on the note line below its row
    assert lines[-1] == "time (s): build 2.0; total 2.0"
    assert "" in lines  # a blank line between sections
    # Columns are aligned: the value column ends at the same offset in every data row.
    data_lines = [ln for ln in lines[4:-1] if ln and not ln.startswith(" ")]
    ends = {
        ln.index(v) + len(v)
        for ln, v in zip(data_lines, ("12.5", "0.12346", "scalar"), strict=True)
    }
    assert len(ends) == 1
    path = write_json(report, tmp_path / "sub" / "r.json")
    back = _strict(path.read_text())
    assert back["rows"][1] == {
        "section": "rademacher",
        "name": "Rad_S",
        "value": 0.123456,
        "stderr": 0.001,
        "lower": 0.1,
        "upper": 0.15,
        "vacuous": None,
        "note": "",
        "status": None,
    }
    assert back["rows"][0]["vacuous"] is True
    assert back["meta"]["array"] == [0, 1]
    assert back["complete"] is True


def test_not_valid_bounds_never_show_as_a_number():
    rows = [
        Row("bounds", "Lemma 4", 8.6e-22, vacuous=False, note="d_m >= N^3 fails",
            status=NOT_VALID),
        Row("bounds", "old-style row", 0.25, vacuous=False, note="x; hypotheses FAIL: alpha"),
        Row("bounds", "good", 0.5, vacuous=False),
        Row.from_bound("bounds", "proxy", Bound(7.0, {}, {}, kind="proxy")),
    ]  # fmt: skip
    table = format_table(Report("shallow", rows, {"seed": 0}))
    by_name = {ln.split("  ")[1].strip(): ln for ln in table.splitlines()[3:]}
    for name in ("Lemma 4", "old-style row"):
        assert "not valid" in by_name[name]
        assert "NOT VALID" in by_name[name]
        assert "non-vacuous" not in by_name[name]
    assert "8.6e-22" not in table
    assert "0.25" not in table
    assert "non-vacuous" in by_name["good"]
    assert "0.5" in by_name["good"]
    assert "no trivial bound" in by_name["proxy"]  # a proxy has no scale to be non-vacuous on
    assert "non-vacuous" not in by_name["proxy"]


def test_incomplete_report_says_so():
    rows = [Row("first", "x", 1.0)]
    meta = {"seed": 2, "sections": ["first", "second"]}
    report = Report("toy", rows, meta, complete=False, sections_done=["first"])
    title = format_table(report).splitlines()[0]
    assert title.endswith("INCOMPLETE (1 of 2 sections: first)")
    assert _strict(to_json(report))["complete"] is False


def test_json_is_standard_whatever_the_numbers():
    rows = [Row("s", "x", float("nan"), stderr=float("inf"), upper=float("-inf"))]
    meta = {"history": np.array([1.0, np.nan, np.inf]), "scalar": np.float32("nan"),
            "nested": {"t": (np.float64(2.0), float("inf"))}, "flag": np.bool_(True)}  # fmt: skip
    text = to_json(Report("m", rows, meta))
    assert "NaN" not in text
    assert "Infinity" not in text
    data = _strict(text)
    assert data["meta"] == {"history": [1.0, None, None], "scalar": None,
                            "nested": {"t": [2.0, None]}, "flag": True}  # fmt: skip
    row = data["rows"][0]
    assert (row["value"], row["stderr"], row["upper"]) == (None, None, None)
    assert row["nonfinite"] == {"value": "nan", "stderr": "inf", "upper": "-inf"}


def test_write_json_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    write_json(Report("m", [Row("s", "x", 1.0)], {}), path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_json(Report("m", [Row("s", "x", 2.0)], {}), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left
