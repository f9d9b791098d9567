"""Kendall's tau-b with its two-sided p-value, for :mod:`jaxbounds.study` and the reports.

``scipy.stats.kendalltau`` when scipy is importable, else the same computation in numpy: the
exact null distribution without ties for n <= 33, the normal approximation with tie corrections
otherwise. The study floor imports nothing of :mod:`jaxbounds.experiments`; the experiments'
``_stats`` takes these from here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import numpy as np

__all__ = ["KendallTau", "format_number", "kendall_tau"]


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
        """``Kendall's tau = +0.600 (p = 0.233, n = 5)``; ``n/a`` where it is undefined.

        >>> print(KendallTau(math.nan, math.nan, 1, "undefined"))
        Kendall's tau = n/a (undefined for n = 1)
        """
        if math.isnan(self.tau):
            return f"Kendall's tau = n/a (undefined for n = {self.n})"
        p_value = format_number(self.p_value, 3)
        return f"Kendall's tau = {self.tau:+.3f} (p = {p_value}, n = {self.n})"


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


def format_number(value: Any, digits: int = 4) -> str:
    """A cell of a markdown table: ints as they are, floats with ``digits`` significant digits.

    An undefined number (NaN) is ``n/a``, the word every report uses for an empty or undefined
    cell (:func:`markdown_table` writes ``n/a`` for None and empty cells too).

    >>> format_number(3), format_number(0.000123456), format_number(None), format_number("a|b")
    ('3', '0.0001235', '', 'a|b')
    >>> format_number(float("nan")), format_number(float("inf"))
    ('n/a', 'inf')
    """
    if value is None:
        return ""
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return "n/a"
        return f"{float(value):.{digits}g}"
    return str(value)
