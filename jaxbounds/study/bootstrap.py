r"""Percentile bootstrap over seeds (whole seeds are resampled, with their models).

A resample draws as many seeds as there are, uniformly with replacement; a seed drawn $c$
times weighs each of its models $c$ times. With $k$ seeds there are only
$\binom{2k-1}{k}$ distinct resamples (35 for 4 seeds, 6,435 for 8): the interval says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Interval", "distinct_resamples", "seed_interval", "seed_resamples", "tau_weighted"]

#: Fewer distinct resamples than this are flagged in :attr:`Interval.note`.
FEW_RESAMPLES = 100


@dataclasses.dataclass(frozen=True)
class Interval:
    """A seed-bootstrap percentile interval.

    Attributes:
      low: lower end (NaN when undefined).
      high: upper end.
      confidence: nominal coverage.
      num_resamples: resamples with a finite value.
      distinct_resamples: the number of distinct resamples of the seeds.
      note: why the interval is n/a, or that its resamples are few (``""`` otherwise).
    """

    low: float
    high: float
    confidence: float
    num_resamples: int
    distinct_resamples: int
    note: str = ""

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (False when it is undefined)."""
        return bool(self.low <= value <= self.high)

    def format(self, digits: int = 3) -> str:
        """``[low, high]``, ``n/a`` when undefined, the value alone when it has no width.

        >>> Interval(-0.1234, 0.5, 0.95, 200, 35).format(2)
        '[-0.12, +0.50]'
        >>> Interval(0.666, 0.666, 0.95, 200, 1).format(2)
        '+0.67 (no spread over resamples)'
        """
        if math.isnan(self.low) or math.isnan(self.high):
            return "n/a"
        if self.low == self.high:
            return f"{self.low:+.{digits}f} (no spread over resamples)"
        return f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def distinct_resamples(num_seeds: int) -> int:
    """The number of multisets of ``num_seeds`` seeds drawn from ``num_seeds``.

    >>> distinct_resamples(4), distinct_resamples(8)
    (35, 6435)
    """
    return math.comb(2 * num_seeds - 1, num_seeds) if num_seeds > 0 else 0


def seed_resamples(
    seeds: Sequence[Any], *, num_resamples: int, rng_seed: int
) -> list[dict[Any, int]]:
    """The resamples: each a mapping seed -> times drawn.

    The draws come from ``numpy.random.default_rng(rng_seed)``: ``integers(0, k, size=k)``
    per resample over the distinct seeds in sorted order, so statistics bootstrapped with the
    same arguments use the same resamples (their differences are paired).

    >>> seed_resamples([0, 1, 1], num_resamples=2, rng_seed=0)
    [{1: 2}, {1: 1, 0: 1}]
    """
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples: expected an int >= 1, got {num_resamples!r}")
    labels = sorted(set(seeds), key=lambda s: (str(type(s)), s))
    rng = np.random.default_rng(rng_seed)
    out = []
    for _ in range(num_resamples):
        counts: dict[Any, int] = {}
        for k in rng.integers(0, len(labels), size=len(labels)):
            counts[labels[int(k)]] = counts.get(labels[int(k)], 0) + 1
        out.append(counts)
    return out


def seed_interval(
    seeds: Sequence[Any],
    statistic: Callable[[dict[Any, int]], float],
    resamples: Sequence[dict[Any, int]],
    *,
    confidence: float = 0.95,
) -> Interval:
    """The percentile interval of ``statistic(counts)`` over the resamples.

    One seed gives no interval (n/a); fewer than 100 distinct resamples are flagged.

    >>> r = seed_interval([0, 1], lambda c: float(c.get(0, 0)),
    ...                   seed_resamples([0, 1], num_resamples=50, rng_seed=0))
    >>> r.low, r.high, r.distinct_resamples, r.note
    (0.0, 2.0, 3, 'only 3 distinct resamples of 2 seeds')
    """
    k = len(set(seeds))
    distinct = distinct_resamples(k)
    if k < 2:
        return Interval(math.nan, math.nan, confidence, 0, distinct,
                        f"{k} seed: no bootstrap over seeds")  # fmt: skip
    values = np.array([statistic(c) for c in resamples], dtype=float)
    finite = values[np.isfinite(values)]
    note = f"only {distinct} distinct resamples of {k} seeds" if distinct < FEW_RESAMPLES else ""
    if finite.size == 0:
        return Interval(math.nan, math.nan, confidence, 0, distinct, "undefined in every resample")
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return Interval(float(low), float(high), confidence, int(finite.size), distinct, note)


def tau_weighted(pairs: np.ndarray, weights: np.ndarray) -> float:
    r"""Jiang's tau of a resample: $\sum_{i\ne j} c_i c_j s_{ij} / ((\sum c)^2 - \sum c^2)$.

    ``pairs`` is the matrix $s_{ij} = \operatorname{sign}(\mu_i-\mu_j)\operatorname{sign}(g_i-g_j)$
    and $c$ the times each model was drawn; a model is never paired with its own copy.

    >>> s = np.array([[0, 1], [1, 0]])
    >>> tau_weighted(s, np.array([1.0, 1.0])), tau_weighted(s, np.array([2.0, 0.0]))
    (1.0, nan)
    """
    c = np.asarray(weights, dtype=float)
    den = c.sum() ** 2 - (c**2).sum()
    if den <= 0:
        return math.nan
    return float(c @ pairs @ c / den)
