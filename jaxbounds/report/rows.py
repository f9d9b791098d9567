"""The result of ``jaxbounds estimate``: rows (one measured quantity each) and the report.

A bound's row carries its three-state :attr:`Row.status` (``"valid, non-vacuous"``,
``"valid, vacuous"`` or ``"not valid"``, the strings of :class:`jaxbounds.bounds.Status`);
:meth:`Row.from_bound` fills it from a :class:`~jaxbounds.bounds._result.Bound`.

:meth:`Report.to_dict` is standard JSON (no ``NaN``/``Infinity`` tokens): a non-finite number
anywhere becomes ``null``; in a row, the fields that were non-finite are named in
``"nonfinite"`` (``{"value": "nan", "upper": "inf"}``), so :meth:`Report.from_dict` gives the
same report back. A report also says whether it is ``complete`` and which sections it holds
(``sections_done``): an interrupted ``jaxbounds estimate`` saves the finished sections as an
incomplete report and resumes from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "NON_VACUOUS", "NOT_VALID", "NO_TRIVIAL", "STATUSES", "VACUOUS", "Report", "Row", "json_safe",
]  # fmt: skip

#: The states of a bound's row (``Bound.label``: ``str(jaxbounds.bounds.Status)``, and
#: ``NO_TRIVIAL`` for a valid log cover / proxy / unbounded-loss bound, which is never vacuous).
NON_VACUOUS = "valid, non-vacuous"
VACUOUS = "valid, vacuous"
NOT_VALID = "not valid"
NO_TRIVIAL = "valid, no trivial bound"
STATUSES = (NON_VACUOUS, VACUOUS, NOT_VALID, NO_TRIVIAL)

_NUMBER_FIELDS = ("value", "stderr", "lower", "upper")


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the report.

    Attributes:
      section: the section it belongs to (``"curvature"``, ``"sharpness"``, ...).
      name: what was measured.
      value: the number (float), or a string for descriptive rows.
      stderr: its standard error for Monte Carlo estimates, else None.
      lower: lower end of a confidence interval, else None.
      upper: upper end of a confidence interval, else None.
      vacuous: for bounds, whether the bound is vacuous (>= the trivial bound), else None.
      note: method, assumptions, status ("rebuilt"), units.
      status: for bounds, one of :data:`STATUSES` (``"not valid"`` when a hypothesis of the
        theorem fails on this run, an input is outside its domain or the value is NaN); None
        for other rows. Without it, a bound row's state is read from ``vacuous`` and from a
        ``"[not valid]"`` or ``"hypotheses FAIL"`` mark in the note (see :attr:`bound_status`).

    Raises:
      ValueError: for a ``status`` outside :data:`STATUSES`.
    """

    section: str
    name: str
    value: float | str
    stderr: float | None = None
    lower: float | None = None
    upper: float | None = None
    vacuous: bool | None = None
    note: str = ""
    status: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"Row.status: expected one of {STATUSES} or None, got {self.status!r}")

    @property
    def bound_status(self) -> str | None:
        """The row's three-state status, or None for a row that is not a bound's.

        >>> row = Row("bounds", "b", 0.3, vacuous=False, note="Lemma 4; hypotheses FAIL: d_m")
        >>> row.bound_status
        'not valid'
        >>> Row("bounds", "b", 2.0, vacuous=True).bound_status
        'valid, vacuous'
        """
        if self.status is not None:
            return self.status
        note = self.note.lower()
        if "[not valid]" in note or "hypotheses fail" in note:
            return NOT_VALID
        if self.vacuous is None:
            return None
        if isinstance(self.value, float) and math.isnan(self.value):
            return NOT_VALID
        return VACUOUS if self.vacuous else NON_VACUOUS

    @classmethod
    def from_estimate(cls, section: str, name: str, est: Any, note: str = "") -> Row:
        """A row from a kernels ``Estimate`` (mean, stderr and interval if any).

        >>> from kernels.estimate import Estimate
        >>> Row.from_estimate("s", "x", Estimate(mean=1.5, stderr=0.25, num_samples=4)).value
        1.5
        """
        lower = None if getattr(est, "lower", None) is None else float(est.lower)
        upper = None if getattr(est, "upper", None) is None else float(est.upper)
        return cls(section, name, float(est.mean), float(est.stderr), lower, upper, None, note)

    @classmethod
    def from_bound(cls, section: str, name: str, bound: Any, note: str = "") -> Row:
        """A row from a scalar :class:`~jaxbounds.bounds._result.Bound` with its status.

        The note gets the failed hypotheses (with their numbers) of a not-valid bound.
        Log covers and proxies (``trivial`` None) are never vacuous.

        >>> from jaxbounds.bounds._result import Bound, Check
        >>> bad = Bound(0.3, {}, {"m > d": Check.of(False, m=8, d=16)}, trivial=1.0)
        >>> row = Row.from_bound("bounds", "b", bad)
        >>> row.status, row.note
        ('not valid', 'm > d fails (m = 8, d = 16)')
        >>> Row.from_bound("bounds", "proxy", Bound(5.0, {}, {}, kind="proxy")).status
        'valid, no trivial bound'
        """
        status = bound.label
        failed = "; ".join(bound.failed) if status == NOT_VALID else ""
        note = "; ".join(part for part in (note, failed) if part)
        vacuous = None if bound.trivial is None else status == VACUOUS
        return cls(section, name, float(bound.value), vacuous=vacuous, note=note, status=status)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; non-finite numbers are ``null`` and named in ``"nonfinite"``."""
        out = dataclasses.asdict(self)
        nonfinite = {}
        for field in _NUMBER_FIELDS:
            value = out[field]
            if isinstance(value, float) and not math.isfinite(value):
                nonfinite[field] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
                out[field] = None
        if nonfinite:
            out["nonfinite"] = nonfinite
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Row:
        """The row of :meth:`to_dict` (non-finite numbers restored).

        >>> row = Row("s", "x", float("inf"), note="n")
        >>> Row.from_dict(row.to_dict()) == row
        True
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        for field, text in dict(data.get("nonfinite") or {}).items():
            values[field] = float(text)
        return cls(**values)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (for standard JSON).

    >>> json_safe({"a": [1.0, float("nan")], "b": (float("-inf"), "x")})
    {'a': [1.0, None], 'b': [None, 'x']}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclasses.dataclass
class Report:
    """The job's result: rows plus metadata (model, sizes, timings, training record).

    Attributes:
      model: the model name.
      rows: the rows, in report order.
      meta: JSON metadata (seed, timings, configuration, training record).
      complete: False for the saved part of an interrupted run.
      sections_done: the sections whose rows are in ``rows`` (None: not recorded).
    """

    model: str
    rows: list[Row]
    meta: dict[str, Any]
    complete: bool = True
    sections_done: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"model", "complete", "sections_done", "meta", "rows"}``.

        ``meta`` must hold JSON-ready values already (see
        :func:`jaxbounds.report.render.write_json`, which converts arrays).
        """
        out: dict[str, Any] = {"model": self.model, "complete": self.complete}
        if self.sections_done is not None:
            out["sections_done"] = list(self.sections_done)
        out["meta"] = json_safe(self.meta)
        out["rows"] = [r.to_dict() for r in self.rows]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """The report of :meth:`to_dict` (as read back from its JSON file).

        Raises:
          ValueError: if ``data`` is not a report (missing or mistyped keys).
        """
        try:
            rows = [Row.from_dict(r) for r in data["rows"]]
            done = data.get("sections_done")
            return cls(
                model=str(data["model"]),
                rows=rows,
                meta=dict(data.get("meta") or {}),
                complete=bool(data.get("complete", True)),
                sections_done=None if done is None else [str(s) for s in done],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"not a jaxbounds report ({type(err).__name__}: {err})") from err
