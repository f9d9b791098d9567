r"""Null baselines: what a measure that knows nothing, or knows the gap, scores.

References beside every statistic of a family, each over ``num_samples`` seeded draws:

- ``random``: a positive measure of independent values $e^z$, $z$ standard normal (it predicts
  nothing; positive so that the sign error's size adjustment $\sqrt{v/m}$ applies to it as to
  the measures; every rank statistic is that of $z$);
- ``gap+noise``: the gap itself plus normal noise at the gap's own standard error (the best a
  measure can do when the gap is known only to its standard error);
- ``constant`` (with ``constant=True``, one draw): the measure 1 everywhere. It predicts no
  order, but after the sign error's size adjustment it is $1/\sqrt m$: where that already
  passes, the sign error cannot tell a measure from the training-set size.

Draw ``d`` of a family takes, from ``numpy.random.default_rng(rng_seed)``, first the random
measure's ``standard_normal(n)`` and then the noise ``standard_normal(n)``, in that order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from jaxbounds._atomic import check_stop

__all__ = ["MIN_DRAWS", "NullBaseline", "Summary", "beyond", "null_draws"]

#: Draws a two-sided rank test at level 5% needs: with k draws the smallest p-value is
#: 2 / (k + 1), at most 0.05 from k = 39 on.
MIN_DRAWS = 39


@dataclasses.dataclass(frozen=True)
class Summary:
    """Mean and 2.5 / 50 / 97.5 percentiles of a statistic over the draws of a null.

    Attributes:
      values: the statistic of every draw (NaN where undefined).
      mean: mean of the finite values (NaN if none).
      low: 2.5th percentile.
      median: median.
      high: 97.5th percentile.
    """

    values: tuple[float, ...]
    mean: float
    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        """The summary of ``values``.

        >>> Summary.of([0.0, 1.0, 2.0, math.nan]).median
        1.0
        """
        v = np.asarray(values, dtype=float)
        f = v[np.isfinite(v)]
        if f.size == 0:
            nan = math.nan
            return cls(tuple(v.tolist()), nan, nan, nan, nan)
        lo, med, hi = np.percentile(f, [2.5, 50, 97.5])
        return cls(tuple(v.tolist()), float(f.mean()), float(lo), float(med), float(hi))


@dataclasses.dataclass(frozen=True)
class NullBaseline:
    """The statistics of one null measure over its draws.

    Attributes:
      kind: ``"random"``, ``"gap+noise"`` or ``"constant"``.
      num_samples: draws.
      stats: statistic name (``tau``, ``psi``, ``sign_error_worst``, ``sign_error_mean``) ->
        :class:`Summary`.
      note: why the null is n/a (``""`` when computed).
    """

    kind: str
    num_samples: int
    stats: dict[str, Summary]
    note: str = ""


def null_draws(
    gap: np.ndarray,
    gap_stderr: np.ndarray | None,
    statistics: Callable[[np.ndarray, str], dict[str, float]],
    *,
    num_samples: int,
    rng_seed: int,
    constant: bool = False,
) -> dict[str, NullBaseline]:
    """The nulls: ``statistics(measure, kind)`` of every draw, summarised.

    Args:
      gap: (n,) gaps.
      gap_stderr: (n,) their standard errors, or None (the gap+noise null is then n/a).
      statistics: (measure, kind of null) -> {statistic name: value}.
      num_samples: draws per null (>= 1).
      rng_seed: seed of the generator.
      constant: add the ``constant`` null (one draw).

    Returns:
      ``{"random": NullBaseline, "gap+noise": NullBaseline}`` (and ``"constant"``).

    >>> out = null_draws(np.arange(4.0), None, lambda m, k: {"first": float(m[0])},
    ...                  num_samples=3, rng_seed=0)
    >>> out["random"].num_samples, out["gap+noise"].note
    (3, 'no standard error of the gap')
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples: expected an int >= 1, got {num_samples!r}")
    rng = np.random.default_rng(rng_seed)
    have_se = gap_stderr is not None and bool(np.all(np.isfinite(gap_stderr)))
    random_stats: list[dict[str, float]] = []
    noise_stats: list[dict[str, float]] = []
    for _ in range(num_samples):
        check_stop()  # a SIGINT / SIGTERM under jaxbounds study stops between two draws
        random_measure = np.exp(rng.standard_normal(gap.size))
        noise = rng.standard_normal(gap.size)
        random_stats.append(statistics(random_measure, "random"))
        if have_se:
            noise_stats.append(statistics(gap + np.asarray(gap_stderr) * noise, "gap+noise"))

    def summarise(kind: str, draws: list[dict[str, float]], note: str = "") -> NullBaseline:
        names = list(draws[0]) if draws else []
        stats = {k: Summary.of([d[k] for d in draws]) for k in names}
        return NullBaseline(kind, len(draws), stats, note)

    note = (
        ""
        if have_se
        else ("no standard error of the gap" if gap_stderr is None else "NaN standard errors")
    )
    out = {"random": summarise("random", random_stats),
           "gap+noise": summarise("gap+noise", noise_stats, note)}  # fmt: skip
    if constant:
        out["constant"] = summarise("constant", [statistics(np.ones(gap.size), "constant")])
    return out


def beyond(value: float, draws: Summary, *, level: float = 0.05) -> bool | None:
    r"""Whether ``value`` lies beyond the null's draws: a two-sided Monte Carlo rank test.

    $p = \min(1, 2\min(1 + \#\{d \ge v\}, 1 + \#\{d \le v\}) / (k + 1))$ over the $k$
    finite draws $d$, and ``value`` is beyond the null when $p \le$ ``level``. A value that is
    itself a draw of the null is called beyond with probability at most ``level`` (ties make
    the test conservative). With fewer than :data:`MIN_DRAWS` draws (at 5%) no value can be
    beyond: None, as for a NaN value.

    >>> s = Summary.of(list(np.arange(100.0)))
    >>> beyond(100.5, s), beyond(50.0, s), beyond(2.0, s)
    (True, False, False)
    >>> print(beyond(100.5, Summary.of(list(np.arange(20.0)))))
    None
    """
    d = np.asarray(draws.values, dtype=float)
    d = d[np.isfinite(d)]
    k = d.size
    if not math.isfinite(value) or 2.0 / (k + 1) > level:
        return None
    p = 2.0 * min(1 + int((d >= value).sum()), 1 + int((d <= value).sum())) / (k + 1)
    return min(1.0, p) <= level
