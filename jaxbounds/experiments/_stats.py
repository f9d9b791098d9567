"""Statistics and markdown helpers for the ``report.md`` of a reproduced experiment.

Kendall's tau-b with its two-sided p-value (``scipy.stats.kendalltau`` when scipy is
importable, else the same computation in numpy: the exact null distribution without ties for
n <= 33, the normal approximation with tie corrections otherwise), the mean and spread of a
quantity over seeds, a markdown table writer and the one-line verdict of a claim.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "KendallTau",
    "Spread",
    "claim_line",
    "format_number",
    "group_rows",
    "kendall_tau",
    "markdown_table",
    "mean_spread",
]


@dataclasses.dataclass(frozen=True)
class KendallTau:
    """Kendall's tau-b of two samples and its two-sided p-value under independence.

    Attributes:
      tau: tau-b in [-1, 1] (NaN when a sample is constant, has NaN, or n < 2).
      p_value: two-sided p-value (NaN with tau).
      n: number of pairs of observations.
      method: ``"exact"`` (no ties, small n), ``"asymptotic"`` (normal approximation with tie
        corrections) or ``"undefined"``.
    """

    tau: float
    p_value: float
    n: int
    method: str

    def __str__(self) -> str:
        return f"Kendall's tau = {self.tau:+.3f} (p = {self.p_value:.3g}, n = {self.n})"


def _dense_ranks(values: np.ndarray) -> np.ndarray:
    return np.unique(values, return_inverse=True)[1].reshape(-1)


def _tie_terms(ranks: np.ndarray) -> tuple[int, int, int]:
    counts = [int(c) for c in np.bincount(ranks) if c > 1]
    return (
        sum(c * (c - 1) // 2 for c in counts),
        sum(c * (c - 1) * (c - 2) for c in counts),
        sum(c * (c - 1) * (2 * c + 5) for c in counts),
    )


def _kendall_p_exact(n: int, c: int) -> float:
    """Two-sided exact p-value: 2 P(K <= c), K = inversions of a uniform permutation of n."""
    counts = [1] + [0] * c  # Mahonian numbers of permutations of 1..j, truncated at c
    for j in range(2, n + 1):
        prefix = list(itertools.accumulate(counts))
        counts = [prefix[k] - (prefix[k - j] if k >= j else 0) for k in range(c + 1)]
    return min(1.0, 2 * sum(counts) / math.factorial(n))


def _kendall_tau_numpy(x: Any, y: Any) -> tuple[float, float, str]:
    """Kendall's tau-b and p-value as ``scipy.stats.kendalltau(x, y)`` computes them."""
    x = np.asarray(x, dtype=float).reshape(-1)
    y = np.asarray(y, dtype=float).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"kendall_tau: x and y differ in size ({x.size} != {y.size})")
    n = x.size
    if n < 2 or np.isnan(x).any() or np.isnan(y).any():
        return math.nan, math.nan, "undefined"
    rx, ry = _dense_ranks(x), _dense_ranks(y)
    upper = np.triu_indices(n, 1)
    product = (np.sign(rx[:, None] - rx[None, :]) * np.sign(ry[:, None] - ry[None, :]))[upper]
    s, dis = int(product.sum()), int((product < 0).sum())
    total = n * (n - 1) // 2
    (xtie, x0, x1), (ytie, y0, y1) = _tie_terms(rx), _tie_terms(ry)
    if xtie == total or ytie == total:
        return math.nan, math.nan, "undefined"
    tau = min(1.0, max(-1.0, s / math.sqrt(total - xtie) / math.sqrt(total - ytie)))
    if xtie == 0 and ytie == 0 and (n <= 33 or min(dis, total - dis) <= 1):
        return tau, _kendall_p_exact(n, min(dis, total - dis)), "exact"
    m = n * (n - 1.0)
    var = (m * (2 * n + 5) - x1 - y1) / 18 + 2 * xtie * ytie / m + x0 * y0 / (9 * m * (n - 2))
    return tau, math.erfc(abs(s) / math.sqrt(var) / math.sqrt(2.0)), "asymptotic"


def kendall_tau(x: Any, y: Any, *, backend: str = "auto") -> KendallTau:
    """Kendall's tau-b between ``x`` and ``y`` with its two-sided p-value.

    Typical use: is there a monotone trend of a measured quantity ``y`` along a grid ``x``?
    ``tau = (C - D) / sqrt((P - X)(P - Y))`` with C/D concordant/discordant pairs, P all pairs,
    X/Y pairs tied in x/y. p-value: exact null distribution when there are no ties and
    n <= 33, else the normal approximation of ``C - D`` with tie corrections (as scipy).

    Args:
      x: 1-D sample.
      y: 1-D sample of the same size.
      backend: ``"auto"`` (scipy if importable, else numpy), ``"scipy"`` or ``"numpy"``.

    Returns:
      A :class:`KendallTau`.

    Raises:
      ValueError: for samples of different sizes or an unknown backend.

    References:
      M. G. Kendall, Rank Correlation Methods, 4th ed., Griffin, 1970.

    >>> r = kendall_tau([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], backend="numpy")
    >>> round(r.tau, 3), round(r.p_value, 4), r.method
    (0.6, 0.2333, 'exact')
    """
    if backend not in ("auto", "scipy", "numpy"):
        raise ValueError(f"kendall_tau: backend must be auto, scipy or numpy, got {backend!r}")
    tau, p_value, method = _kendall_tau_numpy(x, y)
    if backend != "numpy" and method != "undefined":
        try:
            from scipy import stats
        except ImportError:
            if backend == "scipy":
                raise
        else:
            result = stats.kendalltau(np.asarray(x, float), np.asarray(y, float))
            tau, p_value = float(result.statistic), float(result.pvalue)
    return KendallTau(float(tau), float(p_value), int(np.size(x)), method)


@dataclasses.dataclass(frozen=True)
class Spread:
    """Mean of a quantity over seeds with its sample standard deviation and standard error.

    Attributes:
      mean: the mean.
      std: sample standard deviation (``ddof=1``; NaN for one value).
      stderr: ``std / sqrt(n)``.
      n: number of values.
    """

    mean: float
    std: float
    stderr: float
    n: int

    def to_dict(self) -> dict[str, float]:
        """The fields as a JSON-ready dict (``statistics.json``).

        >>> mean_spread([1.0, 3.0]).to_dict()
        {'mean': 2.0, 'std': 1.4142135623730951, 'stderr': 1.0, 'n': 2}
        """
        return dataclasses.asdict(self)

    def format(self, digits: int = 3) -> str:
        """``mean ± std`` with ``digits`` significant digits (``mean (n=1)`` for one value)."""
        if self.n < 2:
            return f"{format_number(self.mean, digits)} (n={self.n})"
        return f"{format_number(self.mean, digits)} ± {format_number(self.std, digits)}"

    def __str__(self) -> str:
        return self.format()


def mean_spread(values: Iterable[float]) -> Spread:
    """Mean, sample standard deviation and standard error of ``values`` (e.g. over seeds).

    Args:
      values: the numbers (non-finite values propagate into the mean).

    Returns:
      A :class:`Spread`.

    >>> str(mean_spread([1.0, 2.0, 3.0]))
    '2 ± 1'
    """
    array = np.asarray(list(values), dtype=float)
    n = int(array.size)
    mean = float(array.mean()) if n else math.nan
    std = float(array.std(ddof=1)) if n > 1 else math.nan
    return Spread(mean, std, std / math.sqrt(n) if n > 1 else math.nan, n)


def format_number(value: Any, digits: int = 4) -> str:
    """A cell of a markdown table: ints as they are, floats with ``digits`` significant digits.

    >>> format_number(3), format_number(0.000123456), format_number(None), format_number("a|b")
    ('3', '0.0001235', '', 'a|b')
    """
    if value is None:
        return ""
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.{digits}g}"
    return str(value)


def markdown_table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    align: Sequence[str] | None = None,
    digits: int = 4,
) -> str:
    """A GitHub markdown table; cells through :func:`format_number`, ``|`` escaped.

    Args:
      header: column names.
      rows: one sequence of cells per row, as long as ``header``.
      align: per column ``"l"``, ``"r"`` or ``"c"`` (default: left).
      digits: significant digits of float cells.

    Returns:
      The table, one line per row, ending with a newline.

    Raises:
      ValueError: for a row or ``align`` of the wrong length, or an unknown alignment.

    >>> print(markdown_table(["T", "gap"], [[20, 0.12345], [40, 0.5]], align="rr"), end="")
    | T | gap |
    | ---: | ---: |
    | 20 | 0.1235 |
    | 40 | 0.5 |
    """
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    align = "l" * len(header) if align is None else align
    if len(align) != len(header) or not set(align) <= set(marks):
        raise ValueError(f"markdown_table: align must be {len(header)} of l/r/c, got {align!r}")

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    out = [line([_cell(h, digits) for h in header]), line([marks[a] for a in align])]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"markdown_table: row {i} has {len(row)} cells, header {len(header)}")
        out.append(line([_cell(c, digits) for c in row]))
    return "\n".join(out) + "\n"


def _cell(value: Any, digits: int) -> str:
    text = value if isinstance(value, str) else format_number(value, digits)
    return text.replace("|", "\\|").replace("\n", " ")


def claim_line(claim: str, reproduced: bool | None, evidence: str) -> str:
    """One markdown bullet: the claim, the verdict and the measurement behind it.

    Args:
      claim: the paper's claim, one sentence.
      reproduced: True (reproduced), False (not reproduced) or None (inconclusive).
      evidence: the numbers, e.g. ``str(kendall_tau(...))``.

    Returns:
      ``"- **<verdict>**: <claim> (<evidence>)"`` without a trailing newline.

    >>> claim_line("No trend of the gap in T", False, "Kendall's tau = +0.600 (p = 0.017)")
    "- **not reproduced**: No trend of the gap in T (Kendall's tau = +0.600 (p = 0.017))"
    """
    verdict = {True: "reproduced", False: "not reproduced", None: "inconclusive"}[reproduced]
    return f"- **{verdict}**: {claim.rstrip('.')} ({evidence})"


def group_rows(
    rows: Iterable[Mapping[str, Any]],
    by: Sequence[str] | Callable[[Mapping[str, Any]], Any],
    *,
    sort: bool = False,
) -> dict[Any, list[Mapping[str, Any]]]:
    """Group result rows (e.g. the seeds of each configuration) in first-seen order.

    Args:
      rows: result rows (dicts).
      by: column names (the group key is the tuple of their values) or a function of a row.
      sort: order the groups by their keys instead of first-seen.

    Returns:
      ``{group key: [rows]}``.

    >>> rows = [{"T": 20, "seed": 0}, {"T": 40, "seed": 0}, {"T": 20, "seed": 1}]
    >>> {k: len(v) for k, v in group_rows(rows, ["T"]).items()}
    {(20,): 2, (40,): 1}
    >>> list(group_rows(rows[::-1], ["T"], sort=True))
    [(20,), (40,)]
    """
    key = by if callable(by) else (lambda row: tuple(row.get(c) for c in by))
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return dict(sorted(groups.items())) if sort else groups
