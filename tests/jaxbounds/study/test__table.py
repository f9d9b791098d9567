"""Reading a table of models: rows, columns or CSV; errors name the argument."""

import math

import numpy as np
import pytest

from jaxbounds.study import load_table

ROWS = [
    {"fam": "a", "lr": 0.1, "seed": 0, "gap": 0.2, "m": 1.0, "ok": "true"},
    {"fam": "a", "lr": 0.2, "seed": 0, "gap": "", "m": 2.0, "ok": "false"},
]
ARGS = {"family": "fam", "axes": ["lr"], "seed": "seed", "gap": "gap", "measures": ["m"],
        "converged": "ok"}  # fmt: skip


def test_rows_columns_and_csv_agree(tmp_path):
    path = tmp_path / "models.csv"
    path.write_text("fam,lr,seed,gap,m,ok\na,0.1,0,0.2,1.0,true\na,0.2,0,,2.0,false\n")
    columns = {k: [r[k] for r in ROWS] for k in ROWS[0]}
    for source in (ROWS, columns, path, str(path)):
        t = load_table(source, **ARGS)
        assert t.num_rows == 2
        assert t.gap[0] == 0.2
        assert math.isnan(t.gap[1])
        assert t.converged.tolist() == [True, False]
        assert t.settings["lr"].tolist() == [0.1, 0.2]


@pytest.mark.parametrize("argument", ["family", "seed", "gap", "converged"])
def test_missing_column_names_the_argument(argument):
    with pytest.raises(ValueError, match=rf"^{argument}: column 'nope' is not in the table"):
        load_table(ROWS, **(ARGS | {argument: "nope"}))


def test_missing_measure_and_axis():
    with pytest.raises(ValueError, match="measures: column 'x'"):
        load_table(ROWS, **(ARGS | {"measures": ["m", "x"]}))
    with pytest.raises(ValueError, match="axes: column 'x'"):
        load_table(ROWS, **(ARGS | {"axes": ["x"]}))


def test_bad_values_name_the_column_and_row():
    with pytest.raises(ValueError, match=r"^measures: column 'm', row 2, is not a number: 'abc'"):
        load_table([ROWS[0], ROWS[1] | {"m": "abc"}], **ARGS)
    with pytest.raises(ValueError, match=r"^converged: column 'ok', row 1, is not true/false"):
        load_table([ROWS[0] | {"ok": "maybe"}], **ARGS)


def test_empty_and_no_measures():
    with pytest.raises(ValueError, match="source"):
        load_table([], **ARGS)
    with pytest.raises(ValueError, match="measures"):
        load_table(ROWS, **(ARGS | {"measures": []}))
    with pytest.raises(ValueError, match="source"):
        load_table(42, **ARGS)


def test_num_test_as_an_int_and_take():
    t = load_table(ROWS, **ARGS, num_test=50)
    assert t.num_test.tolist() == [50.0, 50.0]
    sub = t.take(np.array([1]))
    assert sub.num_rows == 1
    assert sub.measures["m"].tolist() == [2.0]
