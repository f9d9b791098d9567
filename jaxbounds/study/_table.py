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
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ModelTable", "check_gap_range", "load_table"]

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
      row_labels: (n,) where each model is in the source, for messages (``"row 3 of
        models.csv"``: a CSV's rows counted as a spreadsheet counts them, the header row 1;
        ``"row 3"`` for a list or mapping, counted from 1); empty when not known.
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
    row_labels: tuple[str, ...] = ()

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
            row_labels=tuple(np.asarray(self.row_labels, dtype=object)[index].tolist())
            if self.row_labels
            else (),
        )

    def where(self, i: int) -> str:
        """Where model ``i`` is in the source (``"row 3 of models.csv"``; ``"model 3"``)."""
        return self.row_labels[i] if self.row_labels else f"model {i + 1}"

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
    if "_" in s:  # Python reads 1_000 as 1000; a spreadsheet does not
        return s
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def _missing(value: Any) -> bool:
    """An empty cell: None, or a NaN (``csv.writer`` writes ``float("nan")`` as ``nan``)."""
    if value is None:
        return True
    if isinstance(value, float | np.floating):
        return bool(np.isnan(value))
    return isinstance(value, str) and value.strip().lower() in ("", "nan")


def _read_csv(path: Path) -> tuple[dict[str, list], list[str]]:
    """The columns of a CSV file and the label of each data row (header = row 1).

    UTF-8 with or without a byte-order mark (a spreadsheet's "CSV UTF-8"); blank lines are
    skipped but counted; a duplicated column name, a row with more or fewer cells than the
    header, a file that is not UTF-8 text or holds NUL bytes is refused, naming the file.
    """
    name = str(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"source: {name} is not UTF-8 text (byte {err.start}: {err.reason}); a binary "
            "file, or a CSV saved in another encoding (save it as CSV UTF-8)"
        ) from None
    except OSError as err:
        raise ValueError(f"source: cannot read {name} ({err.strerror or err})") from None
    if "\x00" in text:
        raise ValueError(f"source: {name} holds NUL bytes: a binary file, not a CSV")
    try:
        records = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as err:
        raise ValueError(f"source: {name} is not a CSV ({err})") from None
    if not records or not records[0]:
        raise ValueError(f"source: {name} has no header line")
    names = records[0]
    seen: dict[str, int] = {}
    for j, c in enumerate(names):
        if c in seen:
            raise ValueError(
                f"source: {name}: column {c!r} appears twice in the header (columns "
                f"{seen[c] + 1} and {j + 1}); rename one"
            )
        seen[c] = j
    rows, labels = [], []
    for k, record in enumerate(records[1:], start=2):
        if not record:
            continue
        if len(record) != len(names):
            raise ValueError(
                f"source: row {k} of {name} has {len(record)} cells, the header {len(names)}"
            )
        rows.append(record)
        labels.append(f"row {k} of {name}")
    cols = {c: [_parse_cell(r[j]) for r in rows] for j, c in enumerate(names)}
    return cols, labels


def _columns_of(source: Any) -> tuple[dict[str, list], list[str]]:
    """The columns of ``source`` and the label of each row (for messages)."""
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"source: no such CSV file {str(path)!r}")
        return _read_csv(path)
    if isinstance(source, Mapping):
        out = {str(c): list(np.asarray(v, dtype=object).reshape(-1)) for c, v in source.items()}
        sizes = {len(v) for v in out.values()}
        if len(sizes) > 1:
            raise ValueError(f"source: columns differ in length ({sorted(sizes)})")
        n = sizes.pop() if sizes else 0
        return out, [f"row {i + 1}" for i in range(n)]
    if isinstance(source, Sequence):
        rows = list(source)
        if not all(isinstance(r, Mapping) for r in rows):
            raise ValueError("source: expected a list of row mappings")
        names: dict[str, None] = {}
        for r in rows:
            names.update(dict.fromkeys(r))
        return {c: [r.get(c) for r in rows] for c in names}, [
            f"row {i + 1}" for i in range(len(rows))
        ]
    raise ValueError(
        "source: expected a list of row mappings, a mapping of column -> values or a CSV path, "
        f"got {type(source).__name__}"
    )


def _need(columns: Mapping[str, list], argument: str, name: Any) -> list:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{argument}: expected a column name, got {name!r}")
    if name not in columns:
        shown = ", ".join(repr(c) for c in list(columns)[:30]) + (
            ", ..." if len(columns) > 30 else ""
        )
        raise ValueError(f"{argument}: column {name!r} is not in the table (columns: {shown})")
    return columns[name]


_NOT_A_NUMBER = object()  # float() of it raises TypeError: "is not a number"


def _floats(
    values: list, argument: str, name: str, where: Sequence[str], *, finite: bool = False
) -> np.ndarray:
    """A column of numbers, NaN where empty; ``finite``: an infinite value is refused."""
    out = np.empty(len(values), dtype=float)
    for i, cell in enumerate(values):
        v = _parse_cell(cell)  # text as a CSV cell is read (a row mapping may hold text)
        if _missing(v):
            out[i] = math.nan
            continue
        if isinstance(v, str):  # neither an int nor a float (or with an underscore)
            v = _NOT_A_NUMBER
        if isinstance(v, bool | np.bool_):
            raise ValueError(
                f"{argument}: column {name!r}, {where[i]}, is a flag ({v}), not a number"
            )
        try:
            out[i] = float(v)
        except OverflowError:
            raise ValueError(
                f"{argument}: column {name!r}, {where[i]}, is a number beyond the float range "
                f"({str(v)[:20]}..., {len(str(v))} digits)"
            ) from None
        except (TypeError, ValueError):
            shown = repr(cell) if len(repr(cell)) <= 60 else repr(cell)[:57] + "..."
            raise ValueError(
                f"{argument}: column {name!r}, {where[i]}, is not a number: {shown}"
            ) from None
        if finite and math.isinf(out[i]):
            raise ValueError(
                f"{argument}: column {name!r}, {where[i]}, is {out[i]:g}: expected a finite "
                "number or an empty cell"
            )
    return out


def _distinct_roles(**roles: Any) -> None:
    """The family, each axis, the seed and the gap are different columns.

    A seed column given as an axis would make every environment of the sign error a pair of
    seeds and break up Psi's groups; a repeated role of one column has no meaning.
    """
    seen: dict[str, str] = {}
    for role, names in roles.items():
        for c in [names] if names is None or isinstance(names, str) else list(names):
            if c is None:
                continue
            if c in seen:
                raise ValueError(
                    f"{role}: column {c!r} is the {seen[c]} column already; the family, the "
                    "axes, the seed and the gap are different columns"
                )
            seen[c] = role


def _stderrs(values: list, name: str, where: Sequence[str]) -> np.ndarray:
    """The gap's standard errors: finite and >= 0 (NaN where empty)."""
    out = _floats(values, "gap_stderr", name, where, finite=True)
    below = np.flatnonzero(out < 0)
    if below.size:
        i = int(below[0])
        raise ValueError(
            f"gap_stderr: column {name!r}, {where[i]}, is {out[i]:g}: a standard error is >= 0"
        )
    return out


def _sizes(
    values: list, argument: str, name: str, where: Sequence[str], used: np.ndarray
) -> np.ndarray:
    """A column of sizes: a number >= 1 in every ``used`` row (the rows with a gap)."""
    out = _floats(values, argument, name, where)
    bad = np.flatnonzero(used & ~(out >= 1))
    if bad.size:
        i = int(bad[0])
        shown = "empty" if math.isnan(out[i]) else f"{values[i]!r}"
        raise ValueError(
            f"{argument}: column {name!r}, {where[i]}, is {shown}: expected a size >= 1"
        )
    return out


def _flags(values: list, argument: str, name: str, where: Sequence[str]) -> np.ndarray:
    out = np.empty(len(values), dtype=bool)
    for i, v in enumerate(values):
        if isinstance(v, bool | np.bool_) or (isinstance(v, int | float) and v in (0, 1)):
            out[i] = bool(v)
        elif isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
            out[i] = v.strip().lower() in _TRUE
        else:
            shown = "empty" if v is None else f"not true/false: {v!r}"
            raise ValueError(f"{argument}: column {name!r}, {where[i]}, is {shown}")
    return out


def _no_empty(values: np.ndarray, argument: str, name: str, where: Sequence[str]) -> None:
    empty = np.flatnonzero([_missing(v) for v in values])
    if empty.size:
        i = int(empty[0])
        raise ValueError(f"{argument}: column {name!r}, {where[i]}, is empty")


def _axis_cells(
    settings: Mapping[str, np.ndarray], family: np.ndarray, where: Sequence[str]
) -> None:
    """Refuse an empty axis cell where other models of its family have a value.

    An axis empty for every model of a family is an axis that family does not have.
    """
    for axis, values in settings.items():
        empty = np.array([v is None for v in values], dtype=bool)  # NaN is None here
        for f in dict.fromkeys(family[empty].tolist()):
            mine = family == f
            if not empty[mine].all():
                i = int(np.flatnonzero(mine & empty)[0])
                label = "" if f == "all" else f" of family {f!r}"
                raise ValueError(
                    f"axes: column {axis!r}, {where[i]}, is empty while other models{label} "
                    "have a value (an empty cell is not a level of the axis)"
                )


def check_gap_range(table: ModelTable, loss_range: float) -> list[str]:
    """Check the gaps against ``loss_range`` where the sign error's Hoeffding weights use it.

    With a test-set size (``num_test``), a gap is a difference of two losses in
    ``[0, loss_range]``: a gap beyond ``loss_range`` (a gap in percent with a loss range of 1)
    is refused; negative gaps are returned as a warning.

    Returns:
      Warnings (one line each; empty when there is nothing to say).

    Raises:
      ValueError: naming ``loss_range``, for a gap of size above it.

    >>> t = load_table([{"a": 1, "s": 0, "g": 35.0, "m": 1.0}], axes=["a"], seed="s",
    ...                gap="g", measures=["m"], num_test=100)
    >>> check_gap_range(t, 100.0)
    []
    """
    if table.num_test is None:
        return []
    g = table.gap
    finite = np.isfinite(g)
    name = table.columns.get("gap")
    over = np.flatnonzero(finite & (np.abs(g) > loss_range))
    if over.size:
        i = int(over[np.argmax(np.abs(g[over]))])
        raise ValueError(
            f"loss_range: the gap column {name!r} holds {g[i]:g} ({table.where(i)}; "
            f"{over.size} gap(s) beyond the loss range {loss_range:g}); a gap is a difference "
            "of losses in [0, loss range]: give the loss range of the gap's loss (100 for an "
            "error in percent), or the gap in the loss's own units"
        )
    below = np.flatnonzero(finite & (g < 0))
    if below.size:
        i = int(below[np.argmin(g[below])])
        return [
            f"gap: {below.size} of {int(finite.sum())} gaps in column {name!r} are below 0 "
            f"(lowest {g[i]:g}, {table.where(i)}): the test loss below the training loss; "
            "check that the column is test minus training"
        ]
    return []


def _objects(values: list) -> np.ndarray:
    """Cells as values (numbers where they parse); an empty or NaN cell as None."""
    out = np.empty(len(values), dtype=object)
    out[:] = [None if _missing(c := _parse_cell(v)) else c for v in values]
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
    cols, where = _columns_of(source)
    if not cols or not any(len(v) for v in cols.values()):
        raise ValueError("source: the table has no rows")
    if isinstance(axes, str) or not list(axes):
        raise ValueError(f"axes: expected a list of at least one column, got {axes!r}")
    if isinstance(measures, str) or not list(measures):
        raise ValueError(f"measures: expected a list of at least one column, got {measures!r}")
    for argument, names in (("axes", axes), ("measures", measures)):
        if not all(isinstance(c, str) and c for c in names):
            raise ValueError(f"{argument}: expected column names, got {list(names)!r}")
        if len(set(names)) != len(list(names)):
            raise ValueError(f"{argument}: a column is named twice in {list(names)!r}")
    _distinct_roles(family=family, axes=axes, seed=seed, gap=gap)
    settings = {a: _objects(_need(cols, "axes", a)) for a in axes}
    seeds = _objects(_need(cols, "seed", seed))
    n = len(seeds)
    if n == 0:
        raise ValueError("source: the table has no rows")
    _no_empty(seeds, "seed", seed, where)
    gaps = _floats(_need(cols, "gap", gap), "gap", gap, where, finite=True)
    values = {m: _floats(_need(cols, "measures", m), "measures", m, where) for m in measures}
    if family is None:
        fam = np.array(["all"] * n, dtype=object)
    else:
        fam = _objects(_need(cols, "family", family))
        _no_empty(fam, "family", family, where)
    fam = np.array([str(f) for f in fam], dtype=object)
    _axis_cells(settings, fam, where)
    conv = (np.ones(n, dtype=bool) if converged is None
            else _flags(_need(cols, "converged", converged), "converged", converged,
                        where))  # fmt: skip
    se = None if gap_stderr is None else _stderrs(
        _need(cols, "gap_stderr", gap_stderr), gap_stderr, where)  # fmt: skip
    rid = None if run_id is None else _objects(_need(cols, "run_id", run_id))
    has_gap = np.isfinite(gaps)
    if num_test is None or isinstance(num_test, str):
        nt = None if num_test is None else _sizes(
            _need(cols, "num_test", num_test), "num_test", num_test, where, has_gap)  # fmt: skip
    elif (isinstance(num_test, int | np.integer) and not isinstance(num_test, bool)
          and 1 <= num_test <= 2**53):  # fmt: skip
        nt = np.full(n, float(num_test))
    else:
        shown = repr(num_test) if len(repr(num_test)) <= 40 else repr(num_test)[:37] + "..."
        raise ValueError(f"num_test: expected a column name or an int in [1, 2**53], got {shown}")
    ts = None if train_size is None else _sizes(
        _need(cols, "train_size", train_size), "train_size", train_size, where,
        has_gap)  # fmt: skip
    given = {"family": family, "axes": list(axes), "seed": seed, "gap": gap,
             "measures": list(measures), "converged": converged, "gap_stderr": gap_stderr,
             "run_id": run_id, "num_test": num_test, "train_size": train_size}  # fmt: skip
    return ModelTable(
        family=fam, axes=tuple(axes), settings=settings, seed=seeds, gap=gaps, measures=values,
        converged=conv, gap_stderr=se, run_id=rid, num_test=nt, train_size=ts, columns=given,
        row_labels=tuple(where),
    )  # fmt: skip
