r"""Kendall's rank correlation of a measure with the gap, and Jiang et al.'s granulated $\Psi$.

Jiang et al. 2020 (arXiv:1912.02178), section 4: eq. (3) is Kendall's coefficient over the
pairs of models, $\tau = \frac{1}{n(n-1)}\sum_{i\ne j}\operatorname{sign}(\mu_i - \mu_j)
\operatorname{sign}(g_i - g_j)$ (tau-a: a tied pair counts 0), and eq. (4) the granulated
coefficient $\psi_k$, the mean of eq. (3) over the groups of models that differ only in axis
$k$, and $\Psi$, the mean of $\psi_k$ over the axes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxbounds.study import _stats

__all__ = [
    "Psi",
    "PsiLayout",
    "PsiTerms",
    "Tau",
    "granulated_psi",
    "kendall",
    "psi_groups",
    "psi_layout",
    "signs",
    "tau_a",
]


def signs(values: Any) -> np.ndarray:
    """The matrix ``sign(v_i - v_j)`` (int8).

    >>> signs([1.0, 3.0, 2.0]).tolist()
    [[0, -1, -1], [1, 0, 1], [1, -1, 0]]
    """
    v = np.asarray(values, dtype=float).reshape(-1)
    with np.errstate(over="ignore"):  # 1e308 - (-1e308) is inf: its sign is still right
        return np.sign(v[:, None] - v[None, :]).astype(np.int8)


def tau_a(measure: Any, gap: Any) -> float:
    r"""Jiang et al.'s Kendall coefficient, eq. (3) (tau-a: a tied pair counts 0).

    $\frac{1}{n(n-1)}\sum_{i\ne j}\operatorname{sign}(\mu_i-\mu_j)\operatorname{sign}(g_i-g_j)$.

    Args:
      measure: (n,) values.
      gap: (n,) gaps.

    Returns:
      tau in [-1, 1]; NaN for n < 2 or a NaN value.

    Raises:
      ValueError: for samples of different sizes.

    References:
      Jiang et al. 2020, arXiv:1912.02178, eq. (3).

    >>> tau_a([1, 2, 3], [1, 3, 2]), tau_a([1, 1, 1], [1, 2, 3])
    (0.3333333333333333, 0.0)
    """
    mu = np.asarray(measure, dtype=float).reshape(-1)
    g = np.asarray(gap, dtype=float).reshape(-1)
    if mu.size != g.size:
        raise ValueError(f"measure and gap differ in size ({mu.size} != {g.size})")
    n = mu.size
    if n < 2 or np.isnan(mu).any() or np.isnan(g).any():
        return math.nan
    s = signs(mu).astype(np.int64) * signs(g)
    return float(s.sum() / (n * (n - 1)))


@dataclasses.dataclass(frozen=True)
class Tau:
    """Kendall's coefficient of a measure with the gap over a set of models.

    Attributes:
      tau: Jiang et al.'s eq. (3) (tau-a); NaN (n/a) when the measure or the gap is constant
        over the models, or fewer than two models have values.
      tau_b: tau-b (``scipy.stats.kendalltau``'s default), NaN with ``tau``.
      p_value: the two-sided p-value of tau-b under independence.
      num_models: models used.
      note: why the coefficient is n/a (``""`` when defined).
    """

    tau: float
    tau_b: float
    p_value: float
    num_models: int
    note: str = ""


def kendall(measure: Any, gap: Any) -> Tau:
    """Kendall's tau-a (Jiang's eq. 3) and tau-b of ``measure`` with ``gap``.

    A constant measure (or gap) predicts no order: its coefficient is n/a, not 0.

    Args:
      measure: (n,) finite values.
      gap: (n,) finite gaps.

    Returns:
      A :class:`Tau`.

    >>> r = kendall([1, 2, 3, 4], [1, 2, 4, 3])
    >>> r.tau, round(r.tau_b, 4), r.num_models
    (0.6666666666666666, 0.6667, 4)
    >>> kendall([2, 2, 2], [1, 2, 3]).note
    'the measure is constant'
    """
    mu = np.asarray(measure, dtype=float).reshape(-1)
    g = np.asarray(gap, dtype=float).reshape(-1)
    n = int(mu.size)
    nan = math.nan
    if n == 0:
        return Tau(nan, nan, nan, n, "no values")
    if n < 2:
        return Tau(nan, nan, nan, n, "one model: needs two")
    if np.isnan(mu).any() or np.isnan(g).any():
        return Tau(nan, nan, nan, n, "NaN values")
    if np.all(mu == mu[0]):
        return Tau(nan, nan, nan, n, "the measure is constant")
    if np.all(g == g[0]):
        return Tau(nan, nan, nan, n, "the gap is constant")
    b = _stats.kendall_tau(mu, g)
    return Tau(tau_a(mu, g), b.tau, b.p_value, n)


@dataclasses.dataclass(frozen=True)
class PsiTerms:
    """The ordered pairs within the groups of a :class:`Psi`, for its resamples.

    Attributes:
      i: (P,) first model of each pair (an index into the resample weights' columns).
      j: (P,) second model.
      sign: (P,) ``sign(mu_i - mu_j) sign(g_i - g_j)``.
      starts: (G,) where each group's pairs start (pairs are sorted by group).
      size: (G,) the pairs of each group.
      axis: (G,) the axis (its position) of each group.
      num_axes: the number of axes.
    """

    i: np.ndarray
    j: np.ndarray
    sign: np.ndarray
    starts: np.ndarray
    size: np.ndarray
    axis: np.ndarray
    num_axes: int


@dataclasses.dataclass(frozen=True)
class Psi:
    r"""Jiang et al.'s granulated coefficient of one measure.

    Attributes:
      psi: $\Psi$, the mean of ``per_axis`` over the axes where it is defined (NaN if none).
      per_axis: axis -> $\psi_k$ (NaN when no group of models differs only in that axis).
      num_groups: axis -> number of groups averaged.
      group_taus: axis -> the tau of each group, in the order of ``group_seeds``.
      group_seeds: axis -> the seed of each group.
      terms: the pairs within the groups (:meth:`resampled`; not part of the JSON).
    """

    psi: float
    per_axis: dict[str, float]
    num_groups: dict[str, int]
    group_taus: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    group_seeds: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    terms: PsiTerms | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )

    def resampled(self, weights: Any) -> np.ndarray:
        r"""$\Psi$ of every resample: ``weights`` (R, n) weighs each model in each resample.

        A group's tau is the weighted tau of its models (:func:`~jaxbounds.study.bootstrap.
        tau_weighted`); $\psi_k = \sum_g (N_g / P_g) / \sum_g (D_g / P_g)$ over the groups of
        axis $k$, with $N_g = \sum_{i \ne j} w_i w_j s_{ij}$, $D_g = \sum_{i \ne j} w_i w_j$
        and $P_g$ its number of ordered pairs: with unit weights, the mean of the groups'
        taus. NaN where no axis keeps a pair.

        >>> groups = {"lr": [np.array([0, 1]), np.array([2, 3])]}
        >>> p = granulated_psi([1, 2, 3, 4], [1, 2, 4, 3], groups, [0, 0, 1, 1])
        >>> p.resampled(np.array([[1.0, 1, 1, 1], [1, 1, 0, 0], [2, 2, 1, 1]])).tolist()
        [0.0, 1.0, 0.6]
        """
        w = np.atleast_2d(np.asarray(weights, dtype=float))
        t = self.terms
        if t is None or t.i.size == 0:
            return np.full(w.shape[0], math.nan)
        prod = w[:, t.i] * w[:, t.j]
        num = np.add.reduceat(prod * t.sign, t.starts, axis=1) / t.size
        den = np.add.reduceat(prod, t.starts, axis=1) / t.size
        onto = np.zeros((t.size.size, t.num_axes))
        onto[np.arange(t.size.size), t.axis] = 1.0
        nk, dk = num @ onto, den @ onto
        with np.errstate(invalid="ignore", divide="ignore"):
            per_axis = np.where(dk > 0, nk / np.where(dk > 0, dk, 1.0), math.nan)
        defined = np.isfinite(per_axis)
        count = defined.sum(axis=1)
        total = np.where(defined, per_axis, 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1), math.nan)


def psi_groups(
    configs: Sequence[tuple], seeds: Sequence[Any], axes: Sequence[str]
) -> dict[str, list[np.ndarray]]:
    """Per axis, the groups of models (index arrays) that differ only in that axis.

    A group holds the models of one seed with equal values of every other axis; only groups of
    at least two models with at least two values of the axis are kept.

    >>> g = psi_groups([(1, 1), (2, 1), (1, 2)], [0, 0, 0], ["lr", "bs"])
    >>> {a: [x.tolist() for x in v] for a, v in g.items()}
    {'lr': [[0, 1]], 'bs': [[0, 2]]}
    """
    out: dict[str, list[np.ndarray]] = {}
    for k, axis in enumerate(axes):
        groups: dict[tuple, list[int]] = {}
        for i, (config, seed) in enumerate(zip(configs, seeds, strict=True)):
            rest = (config[:k] + config[k + 1 :], seed)
            groups.setdefault(rest, []).append(i)
        out[axis] = [
            np.asarray(m)
            for m in groups.values()
            if len(m) >= 2 and len({configs[i][k] for i in m}) >= 2
        ]
    return out


@dataclasses.dataclass(frozen=True)
class PsiLayout:
    """The ordered pairs within the groups of :func:`psi_groups`, measure-free.

    Computed once per set of groups (:func:`psi_layout`) and shared by every measure's
    :func:`granulated_psi`.

    Attributes:
      i: (P,) first model of each pair (a position in the measure).
      j: (P,) second model.
      starts: (G,) where each group's pairs start.
      size: (G,) ordered pairs of each group, n (n - 1).
      axis: (G,) the axis (position) of each group.
      first: (G,) the first model of each group (for its seed).
      axes: the axes, in order.
    """

    i: np.ndarray
    j: np.ndarray
    starts: np.ndarray
    size: np.ndarray
    axis: np.ndarray
    first: np.ndarray
    axes: tuple[str, ...]


def _cat(parts: list) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def psi_layout(groups: dict[str, list[np.ndarray]]) -> PsiLayout:
    """The pairs of every group (:class:`PsiLayout`).

    >>> lay = psi_layout({"lr": [np.array([0, 1, 2])], "bs": [np.array([0, 3])]})
    >>> lay.i.tolist(), lay.j.tolist(), lay.size.tolist(), lay.axis.tolist()
    ([0, 0, 1, 1, 2, 2, 0, 3], [1, 2, 0, 2, 0, 1, 3, 0], [6, 2], [0, 1])
    """
    ii, jj, sizes, gaxis, first = [], [], [], [], []
    for k, members in enumerate(groups.values()):
        for m in members:
            m = np.asarray(m)
            x, y = np.nonzero(~np.eye(m.size, dtype=bool))
            ii.append(m[x])
            jj.append(m[y])
            sizes.append(x.size)
            gaxis.append(k)
            first.append(int(m[0]))
    size = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64) if size.size else size
    return PsiLayout(_cat(ii), _cat(jj), starts, size, np.asarray(gaxis, dtype=np.int64),
                     np.asarray(first, dtype=np.int64), tuple(groups))  # fmt: skip


def granulated_psi(
    measure: Any,
    gap: Any,
    groups: dict[str, list[np.ndarray]],
    seeds: Sequence[Any],
    *,
    index: Any = None,
    layout: PsiLayout | None = None,
) -> Psi:
    r"""Jiang et al.'s $\psi_k$ per axis and $\Psi$ from the groups of :func:`psi_groups`.

    $\psi_k = \frac{1}{|G_k|}\sum_{g\in G_k}\tau_a(\mu_g, g_g)$ (eq. 3 within each group; a
    measure constant within a group scores 0 there, as eq. 3 gives), $\Psi$ the mean over the
    axes with at least one group.

    Args:
      measure: (n,) finite values.
      gap: (n,) finite gaps.
      groups: axis -> index arrays (:func:`psi_groups`).
      seeds: (n,) seed of each model.
      index: (n,) the column of each model in the resample weights that
        :meth:`Psi.resampled` will get (default: its position).
      layout: :func:`psi_layout` of ``groups`` (computed when None).

    Returns:
      A :class:`Psi`.

    References:
      Jiang et al. 2020, arXiv:1912.02178, eq. (4).

    >>> groups = {"lr": [np.array([0, 1]), np.array([2, 3])], "bs": [np.array([0, 2])]}
    >>> r = granulated_psi([1, 2, 3, 4], [1, 2, 4, 3], groups, [0, 0, 0, 0])
    >>> r.per_axis, r.psi
    ({'lr': 0.0, 'bs': 1.0}, 0.5)
    """
    mu = np.asarray(measure, dtype=float)
    g = np.asarray(gap, dtype=float)
    lay = psi_layout(groups) if layout is None else layout
    where = np.arange(mu.size) if index is None else np.asarray(index)
    with np.errstate(over="ignore"):  # a difference beyond the float range keeps its sign
        sign = np.sign(mu[lay.i] - mu[lay.j]) * np.sign(g[lay.i] - g[lay.j])
    group_tau = (np.add.reduceat(sign, lay.starts) / lay.size if lay.size.size
                 else np.zeros(0))  # fmt: skip
    per_axis, counts, taus, gseeds = {}, {}, {}, {}
    for k, axis in enumerate(lay.axes):
        mine = np.flatnonzero(lay.axis == k)
        t = group_tau[mine].tolist()
        per_axis[axis] = float(np.mean(t)) if t else math.nan
        counts[axis] = len(t)
        if t:
            taus[axis] = tuple(t)
            gseeds[axis] = tuple(seeds[int(f)] for f in lay.first[mine])
    defined = [v for v in per_axis.values() if not math.isnan(v)]
    psi = float(np.mean(defined)) if defined else math.nan
    terms = PsiTerms(where[lay.i], where[lay.j], sign, lay.starts, lay.size.astype(float),
                     lay.axis, len(lay.axes))  # fmt: skip
    return Psi(psi, per_axis, counts, taus, gseeds, terms)
