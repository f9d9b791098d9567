r"""Jiang et al.'s conditional-mutual-information test of a measure.

Jiang et al. 2020 (arXiv:1912.02178), section 6: over the ordered pairs of models $(i, j)$,
$i \ne j$, $V_\mu = \operatorname{sign}(\mu_i - \mu_j)$, $V_g = \operatorname{sign}(g_i - g_j)$
in $\{+1, -1\}$ (a tie counts $-1$, as the first author's scoring code does) and, for
a set $S$ of hyperparameter axes, $U_S$ the values of the axes in $S$ of both models. The
normalised conditional mutual information is
$$\hat I(V_\mu, V_g \mid U_S) = \frac{I(V_\mu; V_g \mid U_S)}{H(V_g \mid U_S)},$$
estimated with the empirical (plug-in) distribution of the pairs, and the score of $|S| = k$
is its minimum over the sets of $k$ axes (a measure that only rides on one hyperparameter loses
its information once that hyperparameter is conditioned on). $k = 0$ is the unconditional
normalised mutual information.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["CMI", "conditional_mutual_information", "pair_codes", "subset_codes"]


@dataclasses.dataclass(frozen=True)
class CMI:
    """The normalised conditional mutual information of a measure with the gap.

    Attributes:
      by_size: k -> the minimum over the sets of k axes (NaN when none is defined).
      argmin: k -> the set of axes that attains it.
      per_set: the value for every conditioning set (a tuple of axes).
    """

    by_size: dict[int, float]
    argmin: dict[int, tuple[str, ...]]
    per_set: dict[tuple[str, ...], float]


def _entropy(codes: np.ndarray, size: int) -> float:
    counts = np.bincount(codes, minlength=size)
    p = counts[counts > 0] / codes.size
    return float(-(p * np.log(p)).sum())


def subset_codes(
    pairs: tuple[np.ndarray, np.ndarray, list[np.ndarray]], max_size: int
) -> dict[tuple[int, ...], tuple[np.ndarray, int]]:
    """Per set of at most ``max_size`` axes (positions), the code of $U_S$ of every pair.

    Codes are compact (0 .. U-1); they depend on the configurations only, so a family computes
    them once for all its measures.

    >>> i, j, codes = pair_codes([(1, 5), (2, 5), (1, 6)], ["lr", "bs"])
    >>> {s: (c.tolist(), u) for s, (c, u) in subset_codes((i, j, codes), 1).items()}
    {(): ([0, 0, 0, 0, 0, 0], 1), (0,): ([1, 0, 2, 2, 0, 1], 3), (1,): ([0, 1, 0, 1, 2, 2], 3)}
    """
    ii, _, codes = pairs
    out: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
    for k in range(max_size + 1):
        for subset in itertools.combinations(range(len(codes)), k):
            u = np.zeros(ii.size, dtype=np.int64)
            for a in subset:
                _, u = np.unique(u * (int(codes[a].max(initial=0)) + 1) + codes[a],
                                 return_inverse=True)  # fmt: skip
                u = u.reshape(-1).astype(np.int64)
            out[subset] = (u, int(u.max(initial=-1)) + 1)
    return out


def pair_codes(
    configs: Sequence[tuple], axes: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The ordered pairs ``(i, j)``, ``i != j``, and per axis the code of (value_i, value_j).

    >>> i, j, codes = pair_codes([(1,), (2,)], ["lr"])
    >>> i.tolist(), j.tolist(), codes[0].tolist()
    ([0, 1], [1, 0], [1, 2])
    """
    n = len(configs)
    ii, jj = np.nonzero(~np.eye(n, dtype=bool))
    codes = []
    for k in range(len(axes)):
        values = {}
        col = np.array([values.setdefault(c[k], len(values)) for c in configs], dtype=np.int64)
        codes.append(col[ii] * len(values) + col[jj])
    return ii, jj, codes


def conditional_mutual_information(
    measure: Any,
    gap: Any,
    configs: Sequence[tuple],
    axes: Sequence[str],
    *,
    max_size: int = 2,
    pairs: tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None = None,
    subsets: dict[tuple[int, ...], tuple[np.ndarray, int]] | None = None,
) -> CMI:
    r"""$\min_{|S| = k}\hat I(V_\mu, V_g \mid U_S)$ for $k = 0, \dots,$ ``max_size``.

    Args:
      measure: (n,) finite values.
      gap: (n,) finite gaps.
      configs: (n,) hyperparameter tuples (axes order).
      axes: the axes.
      max_size: the largest conditioning set (2 as Jiang et al.).
      pairs: :func:`pair_codes` of ``configs`` (computed when None).
      subsets: :func:`subset_codes` of ``pairs`` (computed when None).

    Returns:
      A :class:`CMI`; a set whose $H(V_g \mid U_S)$ is 0 is undefined (NaN).

    References:
      Jiang et al. 2020, arXiv:1912.02178, section 6.

    >>> c = conditional_mutual_information([1, 2, 3], [1, 2, 3], [(1,), (2,), (3,)], ["lr"])
    >>> c.by_size[0], c.by_size[1]
    (1.0, nan)
    """
    mu = np.asarray(measure, dtype=float)
    g = np.asarray(gap, dtype=float)
    pairs = pair_codes(configs, axes) if pairs is None else pairs
    ii, jj, _ = pairs
    subsets = subset_codes(pairs, max_size) if subsets is None else subsets
    vm = (mu[ii] > mu[jj]).astype(np.int64)
    vg = (g[ii] > g[jj]).astype(np.int64)
    per_set: dict[tuple[str, ...], float] = {}
    for k in range(max_size + 1):
        for subset in itertools.combinations(range(len(axes)), k):
            u, size = subsets[subset]
            h_u = _entropy(u, size)
            h_gu = _entropy(u * 2 + vg, 2 * size)
            h_mu = _entropy(u * 2 + vm, 2 * size)
            h_mgu = _entropy((u * 2 + vm) * 2 + vg, 4 * size)
            h_g_given_u = h_gu - h_u
            info = h_mu + h_gu - h_mgu - h_u
            name = tuple(axes[a] for a in subset)
            per_set[name] = info / h_g_given_u if h_g_given_u > 1e-12 else math.nan
    by_size, argmin = {}, {}
    for k in range(max_size + 1):
        values = {s: v for s, v in per_set.items() if len(s) == k and not math.isnan(v)}
        if values:
            best = min(values, key=values.get)
            by_size[k], argmin[k] = max(0.0, values[best]), best
        else:
            by_size[k], argmin[k] = math.nan, ()
    return CMI(by_size, argmin, per_set)
