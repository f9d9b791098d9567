"""The table and the JSON file of a report."""

import json

import numpy as np

from jaxbounds.report.render import format_table, format_value, write_json
from jaxbounds.report.rows import Report, Row


def test_format_value():
    assert format_value(3.14159265) == "3.1416"
    assert format_value(1234567.0) == "1.2346e+06"
    assert format_value(12.0) == "12"
    assert format_value(float("nan")) == "nan"
    assert format_value(None) == ""
    assert format_value("x") == "x"


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
    assert "[0.1, 0.15]" in table
    assert lines[-1] == "time (s): build 2.0; total 2.0"
    assert "" in lines  # a blank line between sections
    # Columns are aligned: the value column ends at the same offset in every data row.
    data_lines = [ln for ln in lines[3:-1] if ln]
    ends = {
        ln.index(v) + len(v)
        for ln, v in zip(data_lines, ("12.5", "0.12346", "scalar"), strict=True)
    }
    assert len(ends) == 1
    path = write_json(report, tmp_path / "sub" / "r.json")
    back = json.loads(path.read_text())
    assert back["rows"][1] == {
        "section": "rademacher",
        "name": "Rad_S",
        "value": 0.123456,
        "stderr": 0.001,
        "lower": 0.1,
        "upper": 0.15,
        "vacuous": None,
        "note": "",
    }
    assert back["rows"][0]["vacuous"] is True
    assert back["meta"]["array"] == [0, 1]
