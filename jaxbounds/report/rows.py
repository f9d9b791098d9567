"""The result of ``jaxbounds estimate``: rows (one measured quantity each) and the report."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Report", "Row"]


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
    """

    section: str
    name: str
    value: float | str
    stderr: float | None = None
    lower: float | None = None
    upper: float | None = None
    vacuous: bool | None = None
    note: str = ""

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


@dataclasses.dataclass
class Report:
    """The job's result: rows plus metadata (model, sizes, timings, training record)."""

    model: str
    rows: list[Row]
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary ``{"model", "meta", "rows"}``."""
        return {
            "model": self.model,
            "meta": self.meta,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }
