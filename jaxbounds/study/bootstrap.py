r"""The two-way bootstrap: configurations and seeds resampled jointly (the pigeonhole bootstrap).

A study's models are crossed: each configuration (a setting of the hyperparameter axes) is
trained with each seed, and both the configurations and the seeds are samples. A resample draws
as many configurations as there are, uniformly with replacement, and, independently, as many
seeds as there are; a model whose configuration was drawn $a$ times and whose seed was drawn
$b$ times weighs $ab$ (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2)).

Why not the seeds alone: a statistic over all pairs of models varies with the configurations
as much as with the seeds, and resampling the seeds alone leaves that variation out. On the
committed measures-vs-gap grid (budget not an axis), a random measure's 95% seed-bootstrap
interval of Kendall's tau excluded 0 for 11.7% (sparse majority) and 13.0% (MNIST 0/1) of the
measures drawn, the configuration bootstrap for 7.7% and 5.7%, the two-way bootstrap for 0.7%
and 0.0%; for Psi 3.7% / 5.7%, 0.3% / 2.3% and 0% (300 measures per family, 200 resamples
each). The two-way
bootstrap is conservative: for crossed factors no resampling scheme is exactly unbiased, and
this one counts the models' own variation twice (once through each factor; McCullagh 2000,
"Resampling and exchangeable arrays", Bernoulli 6(2)); its intervals are wider than the
nominal level needs, never narrower in that simulation. ``tests/jaxbounds/study/
test_coverage.py`` checks the rate on the committed grid in the default test run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "Interval",
    "Resamples",
    "distinct_resamples",
    "interval",
    "tau_resampled",
    "tau_weighted",
    "two_way_resamples",
]

#: Fewer distinct resamples than this are flagged in :attr:`Interval.note`.
FEW_RESAMPLES = 100


@dataclasses.dataclass(frozen=True)
class Interval:
    """A two-way bootstrap percentile interval.

    Attributes:
      low: lower end (NaN when undefined).
      high: upper end.
      confidence: nominal coverage.
      num_resamples: resamples with a finite value.
      distinct_resamples: the number of distinct resamples (of the configurations times those
        of the seeds).
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


def distinct_resamples(num: int) -> int:
    """The number of multisets of ``num`` items drawn from ``num``.

    >>> distinct_resamples(4), distinct_resamples(8)
    (35, 6435)
    """
    return math.comb(2 * num - 1, num) if num > 0 else 0


@dataclasses.dataclass(frozen=True)
class Resamples:
    """The resamples of a set of models.

    Attributes:
      weights: (R, n) the weight of each model in each resample.
      num_configs: distinct configurations.
      num_seeds: distinct seeds.
    """

    weights: np.ndarray
    num_configs: int
    num_seeds: int

    @property
    def distinct(self) -> int:
        """Distinct resamples: of the configurations times of the seeds."""
        return distinct_resamples(self.num_configs) * distinct_resamples(self.num_seeds)

    def take(self, index: Any) -> Resamples:
        """The weights of the models ``index`` (a measure's models with a value)."""
        return dataclasses.replace(self, weights=self.weights[:, np.asarray(index)])


def _codes(labels: Sequence[Any]) -> tuple[np.ndarray, int]:
    order = sorted(set(labels), key=lambda s: (str(type(s)), str(s)))
    code = {x: k for k, x in enumerate(order)}
    return np.array([code[x] for x in labels], dtype=np.int64), len(order)


def two_way_resamples(
    configs: Sequence[Any], seeds: Sequence[Any], *, num_resamples: int, rng_seed: int
) -> Resamples:
    """The two-way bootstrap's resamples of the models ``(configs[i], seeds[i])``.

    From ``numpy.random.default_rng(rng_seed)``, per resample: ``integers(0, C, size=C)`` over
    the C distinct configurations, then ``integers(0, S, size=S)`` over the S distinct seeds
    (each in sorted order). Statistics resampled with the same arguments use the same
    resamples, so their differences are paired.

    >>> r = two_way_resamples([(1,), (2,), (1,), (2,)], [0, 0, 1, 1], num_resamples=1,
    ...                       rng_seed=0)
    >>> r.weights.tolist(), r.distinct
    ([[0.0, 2.0, 0.0, 2.0]], 9)
    """
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples: expected an int >= 1, got {num_resamples!r}")
    cid, nc = _codes(list(configs))
    sid, ns = _codes(list(seeds))
    rng = np.random.default_rng(rng_seed)
    w = np.empty((num_resamples, cid.size))
    for r in range(num_resamples):
        a = np.bincount(rng.integers(0, nc, size=nc), minlength=nc) if nc else np.zeros(0)
        b = np.bincount(rng.integers(0, ns, size=ns), minlength=ns) if ns else np.zeros(0)
        w[r] = a[cid] * b[sid] if cid.size else 0.0
    return Resamples(w, nc, ns)


def interval(values: Any, resamples: Resamples, *, confidence: float = 0.95) -> Interval:
    """The percentile interval of a statistic's values over the resamples.

    Fewer than two models (one configuration and one seed) give no interval (n/a); fewer
    than 100 distinct resamples are flagged.

    >>> r = two_way_resamples([1, 2, 1, 2], [0, 0, 1, 1], num_resamples=50, rng_seed=0)
    >>> iv = interval(r.weights[:, 0], r)
    >>> iv.low, iv.high, iv.distinct_resamples, iv.note
    (0.0, 4.0, 9, 'only 9 distinct resamples of 2 configurations and 2 seeds')
    """
    distinct = resamples.distinct
    nc, ns = resamples.num_configs, resamples.num_seeds
    if nc * ns < 2:
        return Interval(math.nan, math.nan, confidence, 0, distinct,
                        "one configuration and one seed: no bootstrap")  # fmt: skip
    v = np.asarray(values, dtype=float).reshape(-1)
    finite = v[np.isfinite(v)]
    note = (f"only {distinct} distinct resamples of {nc} configurations and {ns} seeds"
            if distinct < FEW_RESAMPLES else "")  # fmt: skip
    if finite.size == 0:
        return Interval(math.nan, math.nan, confidence, 0, distinct, "undefined in every resample")
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return Interval(float(low), float(high), confidence, int(finite.size), distinct, note)


def tau_weighted(pairs: np.ndarray, weights: np.ndarray) -> float:
    r"""Jiang's tau of a resample: $\sum_{i\ne j} c_i c_j s_{ij} / ((\sum c)^2 - \sum c^2)$.

    ``pairs`` is the matrix $s_{ij} = \operatorname{sign}(\mu_i-\mu_j)\operatorname{sign}(g_i-g_j)$
    and $c$ the weight of each model; a model is never paired with its own copy.

    >>> s = np.array([[0, 1], [1, 0]])
    >>> tau_weighted(s, np.array([1.0, 1.0])), tau_weighted(s, np.array([2.0, 0.0]))
    (1.0, nan)
    """
    c = np.asarray(weights, dtype=float)
    den = c.sum() ** 2 - (c**2).sum()
    if den <= 0:
        return math.nan
    return float(c @ pairs @ c / den)


def tau_resampled(pairs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`tau_weighted` of every row of ``weights`` (R, n): (R,), NaN where undefined.

    >>> s = np.array([[0, 1], [1, 0]])
    >>> tau_resampled(s, np.array([[1.0, 1.0], [2.0, 0.0]])).tolist()
    [1.0, nan]
    """
    w = np.asarray(weights, dtype=float)
    num = np.einsum("ri,ri->r", w @ np.asarray(pairs, dtype=float), w)
    den = w.sum(axis=1) ** 2 - (w**2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), math.nan)
