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


def _grid(**cells):
    """Four models on two learning rates and two seeds; ``cells`` replaces columns' values."""
    rows = [{"lr": lr, "seed": s, "gap": 0.1 * lr + 0.01 * s, "m": lr, "se": 0.01}
            for lr in (1, 2) for s in (0, 1)]  # fmt: skip
    for column, values in cells.items():
        for row, value in zip(rows, values, strict=True):
            row[column] = value
    return rows


SPEC = {"axes": ["lr"], "seed": "seed", "gap": "gap", "measures": ["m"]}


@pytest.mark.parametrize(
    ("over", "says"),
    [({"axes": ["lr", "lr"]}, r"^axes: a column is named twice in \['lr', 'lr'\]"),
     ({"axes": ["lr", "seed"]}, r"^seed: column 'seed' is the axes column already"),
     ({"family": "lr"}, r"^axes: column 'lr' is the family column already"),
     ({"axes": ["gap"]}, r"^gap: column 'gap' is the axes column already"),
     ({"axes": ["lr", None]}, r"^axes: expected column names")],
)  # fmt: skip
def test_one_column_in_two_roles_is_refused(over, says):
    # an axis named twice lost its psi (None) and Psi averaged the other axes only; the seed
    # column as an axis made every sign-error environment a pair of seeds
    with pytest.raises(ValueError, match=says):
        load_table(_grid(), **(SPEC | over))


def test_a_nan_design_cell_is_an_empty_cell():
    # csv.writer writes float("nan") as "nan": each such row became a level of its own
    for nan in (math.nan, "nan", " NaN ", np.float32("nan")):
        with pytest.raises(ValueError, match=r"^axes: column 'lr', row 2, is empty while"):
            load_table(_grid(lr=[1, nan, 2, 2]), **SPEC)
        with pytest.raises(ValueError, match=r"^seed: column 'seed', row 3, is empty"):
            load_table(_grid(seed=[0, 1, nan, 1]), **SPEC)
    t = load_table(_grid(lr=[math.nan] * 4), **SPEC)  # an axis no model has: not an axis
    assert t.settings["lr"].tolist() == [None] * 4


@pytest.mark.parametrize(
    ("column", "cell", "says"),
    [("gap", math.inf, r"^gap: column 'gap', row 2, is inf: expected a finite number"),
     ("gap", "-inf", r"^gap: column 'gap', row 2, is -inf"),
     ("m", 10**400, r"^measures: column 'm', row 2, is a number beyond the float range"),
     ("gap", "1" + "0" * 400, r"^gap: column 'gap', row 2, is a number beyond the float range"),
     ("m", "1_000", r"^measures: column 'm', row 2, is not a number: '1_000'"),
     ("se", -0.003, r"^gap_stderr: column 'se', row 2, is -0.003: a standard error is >= 0"),
     ("se", math.inf, r"^gap_stderr: column 'se', row 2, is inf")],
)  # fmt: skip
def test_cells_a_float_cannot_hold_are_refused_naming_row_and_column(column, cell, says):
    values = [1.0, cell, 1.0, 1.0]
    with pytest.raises(ValueError, match=says):
        load_table(_grid(**{column: values}), **SPEC, gap_stderr="se")


def test_an_infinite_measure_is_a_missing_value():
    t = load_table(_grid(m=[1.0, math.inf, 2.0, -math.inf]), **SPEC)
    assert t.measures["m"].tolist() == [1.0, math.inf, 2.0, -math.inf]


def test_the_columns_of_a_missing_one_are_listed_quoted(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text('lr,seed,"mag, per param",gap \n1,0,2,0.1\n')
    with pytest.raises(ValueError, match=r"\(columns: 'lr', 'seed', 'mag, per param', 'gap '\)"):
        load_table(path, **SPEC)


def test_num_test_as_one_int_in_range():
    t = load_table(_grid(), **SPEC, num_test=np.int64(1000))
    assert t.num_test.tolist() == [1000.0] * 4
    for bad in (0, 10**400, 1.5, True):
        with pytest.raises(ValueError, match=r"^num_test: expected a column name or an int in"):
            load_table(_grid(), **SPEC, num_test=bad)
