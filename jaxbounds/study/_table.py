"""A table of trained models: one row per model, columns named by the caller.

The input is a list of row mappings, a mapping of column -> sequence, or the path of a CSV file
(read with the standard library; pandas is not needed). The caller says which columns are the
family, the hyperparameter axes, the seed, the gap, the measures, the converged flag and
(optionally) the gap's standard error, a run identifier, the test-set size and the training-set
size. Every named column must exist; numbers must parse; a flag must be true/false.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ModelTable", "load_table"]

_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n"}


@dataclasses.dataclass(frozen=True, eq=False)
class ModelTable:
    """Models as columns (numpy arrays of length ``num_rows``), as :func:`load_table` reads them.

    Attributes:
      family: (n,) family label of each model (``"all"`` when no family column is named).
      axes: the hyperparameter axes, in the order given.
      settings: axis -> (n,) object array of its values (None where a model has no value).
      seed: (n,) object array of seeds.
      gap: (n,) generalization gaps (NaN where missing).
      measures: measure name -> (n,) float values (NaN where missing).
      converged: (n,) bool, True where the model reached the stopping criterion (all True when
        no converged column is named).
      gap_stderr: (n,) standard errors of the gaps, or None.
      run_id: (n,) run identifiers (equal ids are one run), or None.
      num_test: (n,) test-set sizes (for Hoeffding weights), or None.
      train_size: (n,) training-set sizes (for the size adjustment), or None.
      columns: argument -> column name, as given (for messages).
    """

    family: np.ndarray
    axes: tuple[str, ...]
    settings: dict[str, np.ndarray]
    seed: np.ndarray
    gap: np.ndarray
    measures: dict[str, np.ndarray]
    converged: np.ndarray
    gap_stderr: np.ndarray | None = None
    run_id: np.ndarray | None = None
    num_test: np.ndarray | None = None
    train_size: np.ndarray | None = None
    columns: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """The number of models."""
        return int(self.gap.size)

    def take(self, index: Any) -> ModelTable:
        """The table of the models ``index`` (an index or boolean array)."""
        index = np.asarray(index)

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]

        return dataclasses.replace(
            self,
            family=self.family[index],
            settings={a: v[index] for a, v in self.settings.items()},
            seed=self.seed[index],
            gap=self.gap[index],
            measures={m: v[index] for m, v in self.measures.items()},
            converged=self.converged[index],
            gap_stderr=cut(self.gap_stderr),
            run_id=cut(self.run_id),
            num_test=cut(self.num_test),
            train_size=cut(self.train_size),
        )

    def config(self, i: int) -> tuple:
        """The hyperparameter values of model ``i`` as a hashable tuple (axes order)."""
        return tuple(_hashable(self.settings[a][i]) for a in self.axes)


def _hashable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def _parse_cell(text: Any) -> Any:
    """A CSV cell to a number where it is one, None where empty, else the text."""
    if not isinstance(text, str):
        return text
    s = text.strip()
    if s == "":
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def _columns_of(source: Any) -> dict[str, list]:
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"source: no such CSV file {str(path)!r}")
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None:
                raise ValueError(f"source: {str(path)!r} has no header line")
            names = list(reader.fieldnames)
            rows = list(reader)
        return {c: [_parse_cell(r.get(c)) for r in rows] for c in names}
    if isinstance(source, Mapping):
        out = {str(c): list(np.asarray(v, dtype=object).reshape(-1)) for c, v in source.items()}
        sizes = {len(v) for v in out.values()}
        if len(sizes) > 1:
            raise ValueError(f"source: columns differ in length ({sorted(sizes)})")
        return out
    if isinstance(source, Sequence):
        rows = list(source)
        if not all(isinstance(r, Mapping) for r in rows):
            raise ValueError("source: expected a list of row mappings")
        names: dict[str, None] = {}
        for r in rows:
            names.update(dict.fromkeys(r))
        return {c: [r.get(c) for r in rows] for c in names}
    raise ValueError(
        "source: expected a list of row mappings, a mapping of column -> values or a CSV path, "
        f"got {type(source).__name__}"
    )


def _need(columns: Mapping[str, list], argument: str, name: Any) -> list:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{argument}: expected a column name, got {name!r}")
    if name not in columns:
        shown = ", ".join(list(columns)[:30]) + (", ..." if len(columns) > 30 else "")
        raise ValueError(f"{argument}: column {name!r} is not in the table (columns: {shown})")
    return columns[name]


def _floats(values: list, argument: str, name: str) -> np.ndarray:
    out = np.empty(len(values), dtype=float)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and v.strip().lower() in ("", "nan")):
            out[i] = math.nan
        elif isinstance(v, bool):
            raise ValueError(f"{argument}: column {name!r} row {i} is a flag ({v}), not a number")
        else:
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{argument}: column {name!r} row {i} is not a number: {v!r}"
                ) from None
    return out


def _flags(values: list, argument: str, name: str) -> np.ndarray:
    out = np.empty(len(values), dtype=bool)
    for i, v in enumerate(values):
        if isinstance(v, bool | np.bool_) or (isinstance(v, int | float) and v in (0, 1)):
            out[i] = bool(v)
        elif isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
            out[i] = v.strip().lower() in _TRUE
        else:
            raise ValueError(f"{argument}: column {name!r} row {i} is not true/false: {v!r}")
    return out


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [_parse_cell(v) for v in values]
    return out


def load_table(
    source: Any,
    *,
    axes: Sequence[str],
    seed: str,
    gap: str,
    measures: Sequence[str],
    family: str | None = None,
    converged: str | None = None,
    gap_stderr: str | None = None,
    run_id: str | None = None,
    num_test: str | int | None = None,
    train_size: str | None = None,
) -> ModelTable:
    """Read a table of trained models.

    Args:
      source: a list of row mappings, a mapping of column -> sequence, or a CSV path.
      axes: the hyperparameter columns (at least one).
      seed: the seed column.
      gap: the generalization-gap column.
      measures: the measure columns (at least one).
      family: the family column (a family is analysed on its own), or None for one family.
      converged: a true/false column, True where the model met the stopping criterion; None
        counts every model as converged.
      gap_stderr: the column of the gap's standard error (for the gap-plus-noise null), or None.
      run_id: a column identifying runs (equal ids are one run, counted once), or None.
      num_test: the test-set size, a column or one int (for Hoeffding weights), or None.
      train_size: the training-set size column (for the size adjustment), or None.

    Returns:
      A :class:`ModelTable`.

    Raises:
      ValueError: naming the argument, for a missing column, a value that is not a number
        or a flag, an empty table, no axes or no measures.

    >>> t = load_table([{"lr": 1, "s": 0, "g": 0.1, "m": 2.0}], axes=["lr"], seed="s",
    ...                gap="g", measures=["m"])
    >>> t.num_rows, t.family[0], bool(t.converged[0])
    (1, 'all', True)
    """
    cols = _columns_of(source)
    if not cols or not any(len(v) for v in cols.values()):
        raise ValueError("source: the table has no rows")
    if isinstance(axes, str) or not list(axes):
        raise ValueError(f"axes: expected a list of at least one column, got {axes!r}")
    if isinstance(measures, str) or not list(measures):
        raise ValueError(f"measures: expected a list of at least one column, got {measures!r}")
    if len(set(measures)) != len(list(measures)):
        raise ValueError(f"measures: a column is named twice in {list(measures)!r}")
    settings = {a: _objects(_need(cols, "axes", a)) for a in axes}
    seeds = _objects(_need(cols, "seed", seed))
    n = len(seeds)
    if n == 0:
        raise ValueError("source: the table has no rows")
    gaps = _floats(_need(cols, "gap", gap), "gap", gap)
    values = {m: _floats(_need(cols, "measures", m), "measures", m) for m in measures}
    fam = (np.array(["all"] * n, dtype=object) if family is None
           else _objects(_need(cols, "family", family)))  # fmt: skip
    fam = np.array([str(f) for f in fam], dtype=object)
    conv = (np.ones(n, dtype=bool) if converged is None
            else _flags(_need(cols, "converged", converged), "converged", converged))  # fmt: skip
    se = None if gap_stderr is None else _floats(
        _need(cols, "gap_stderr", gap_stderr), "gap_stderr", gap_stderr)  # fmt: skip
    rid = None if run_id is None else _objects(_need(cols, "run_id", run_id))
    if num_test is None or isinstance(num_test, str):
        nt = None if num_test is None else _floats(
            _need(cols, "num_test", num_test), "num_test", num_test)  # fmt: skip
    elif isinstance(num_test, int) and not isinstance(num_test, bool) and num_test >= 1:
        nt = np.full(n, float(num_test))
    else:
        raise ValueError(f"num_test: expected a column name or an int >= 1, got {num_test!r}")
    ts = None if train_size is None else _floats(
        _need(cols, "train_size", train_size), "train_size", train_size)  # fmt: skip
    given = {"family": family, "axes": list(axes), "seed": seed, "gap": gap,
             "measures": list(measures), "converged": converged, "gap_stderr": gap_stderr,
             "run_id": run_id, "num_test": num_test, "train_size": train_size}  # fmt: skip
    return ModelTable(
        family=fam, axes=tuple(axes), settings=settings, seed=seeds, gap=gaps, measures=values,
        converged=conv, gap_stderr=se, run_id=rid, num_test=nt, train_size=ts, columns=given,
    )  # fmt: skip
