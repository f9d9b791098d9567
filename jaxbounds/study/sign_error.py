r"""Dziugaite et al.'s robust sign error over environments, as their code computes it.

Dziugaite, Drouin, Neal, Rajkumar, Caballero, Wang, Mitliagkas, Roy 2020, "In search of robust
measures of generalization", arXiv:2010.11924; code nitarshan/robust-generalization-measures,
``experiments/coupled_networks/{common,create_environments,figure_cdf_all_measures}.py``:

- an environment is a pair of hyperparameter settings $(\omega, \omega')$ that differ in exactly
  one axis; every model (seed) trained at $\omega$ is paired with every model trained at
  $\omega'$;
- a pair has the sign error $e = \frac12(1 - \operatorname{sign}(\mu - \mu')
  \operatorname{sign}(g - g'))$ and the weight $w = (h - \frac12)_+$ with the Hoeffding weight
  $h = \max(0, 1 - 2e^{-2n(|g - g'|/2)^2/c^2})^2$ ($n$ test examples, $c$ the loss range; their
  ``hoeffding_weight`` with ``shift=0`` and ``min_weight=0.5``);
- the environment's error is $\sum w e / \sum w$, kept when its effective sample size
  $(\sum w)^2 / \sum w^2$ is at least 12 (``min_ess``);
- the measures are adjusted for the training-set size $m$ (``adjust_measure``):
  $\frac12(\mu - \log m)$ for a measure on the log scale, $\sqrt{\mu/m}$ otherwise.

Their code lists each environment twice (once per direction, with the same value); here each is
listed once, which leaves the mean and the maximum unchanged, and the 90th percentile is taken
on the doubled list as theirs (numpy's linear interpolation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "MIN_ESS",
    "MIN_WEIGHT",
    "SignError",
    "environments",
    "hoeffding_weight",
    "robust_sign_error",
    "size_adjusted",
]

#: Their ``min_ess`` default (figure_cdf_all_measures.py).
MIN_ESS = 12.0
#: Their ``min_weight`` (create_environments.py): weights below it are set to 0.
MIN_WEIGHT = 0.5


def hoeffding_weight(delta_gap: Any, num_test: Any, *, loss_range: float = 1.0) -> np.ndarray:
    r"""Dziugaite et al.'s Hoeffding weight $\max(0, 1 - 2e^{-2n(|\Delta|/2)^2/c^2})^2$.

    Their ``common.hoeffding_weight(delta_gen, n, shift=0)``; $c$ generalises their loss range
    of 1 (the 0-1 error).

    Args:
      delta_gap: differences of two gaps.
      num_test: n, test examples behind each gap (broadcastable).
      loss_range: c > 0.

    Returns:
      Weights in [0, 1].

    Raises:
      ValueError: for num_test < 1 or loss_range <= 0.

    >>> [round(float(w), 4) for w in hoeffding_weight([0.0, 0.05, 0.2], 1000)]
    [0.0, 0.1823, 1.0]
    """
    n = np.asarray(num_test, dtype=float)
    if np.isnan(n).any() or (n < 1).any():
        low = "NaN" if np.isnan(n).any() else f"{float(n.min()):g}"
        raise ValueError(f"num_test: expected test-set sizes >= 1, got {low}")
    if not (math.isfinite(loss_range) and loss_range > 0):
        raise ValueError(f"loss_range: expected a finite number > 0, got {loss_range!r}")
    d = np.abs(np.asarray(delta_gap, dtype=float)) / loss_range
    return np.maximum(0.0, 1.0 - 2.0 * np.exp(-2.0 * n * (d / 2.0) ** 2)) ** 2


def size_adjusted(values: Any, train_size: Any, *, log_scale: bool) -> np.ndarray:
    r"""Their ``adjust_measure``: $\frac12(\mu - \log m)$ on the log scale, else $\sqrt{\mu/m}$.

    A negative value off the log scale has no square root: NaN there (their code would drop the
    model).

    >>> size_adjusted([4.0, 9.0], [1.0, 9.0], log_scale=False).tolist()
    [2.0, 1.0]
    >>> size_adjusted([1.0], [math.e], log_scale=True).tolist()
    [0.0]
    """
    v = np.asarray(values, dtype=float)
    m = np.asarray(train_size, dtype=float)
    if log_scale:
        return 0.5 * (v - np.log(m))
    with np.errstate(invalid="ignore"):
        return np.where(v >= 0, np.sqrt(np.where(v >= 0, v, 0.0) / m), np.nan)


def environments(configs: Sequence[tuple], axes: Sequence[str]) -> list[tuple[str, tuple, tuple]]:
    """The environments: pairs of distinct settings that differ in exactly one axis.

    Returns:
      ``[(axis, setting_a, setting_b)]``, each unordered pair once, ``setting_a`` first seen.

    >>> environments([(1, 1), (2, 1), (2, 2), (1, 1)], ["lr", "bs"])
    [('lr', (1, 1), (2, 1)), ('bs', (2, 1), (2, 2))]
    """
    distinct = list(dict.fromkeys(configs))
    out = []
    for a in range(len(distinct)):
        for b in range(a + 1, len(distinct)):
            ca, cb = distinct[a], distinct[b]
            differ = [k for k in range(len(axes)) if not _same(ca[k], cb[k])]
            if len(differ) == 1:
                out.append((axes[differ[0]], ca, cb))
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y)  # their isclose on float-valued axes
    return x == y


@dataclasses.dataclass(frozen=True)
class SignError:
    """The robust sign error of one measure: its distribution over environments, per axis.

    Attributes:
      per_axis: axis -> the errors of its kept environments (each environment once).
      num_dropped: axis -> environments dropped for an effective sample size below ``min_ess``.
      worst: the largest error over all kept environments (NaN if none).
      mean: the mean over all kept environments.
      p90: the 90th percentile over all kept environments, each counted twice as in their code.
      worst_environment: the worst environment, ``"axis: a -> b (other settings)"``.
      note: why the error is n/a (``""`` when defined).
    """

    per_axis: dict[str, tuple[float, ...]]
    num_dropped: dict[str, int]
    worst: float
    mean: float
    p90: float
    worst_environment: str = ""
    note: str = ""

    @property
    def num_environments(self) -> int:
        """Kept environments over all axes."""
        return sum(len(v) for v in self.per_axis.values())

    def axis_summary(self, axis: str) -> tuple[float, float, float]:
        """``(mean, p90, max)`` of the errors of one axis (NaN if it kept none)."""
        v = np.asarray(self.per_axis.get(axis, ()), dtype=float)
        if v.size == 0:
            return math.nan, math.nan, math.nan
        return float(v.mean()), float(np.percentile(np.repeat(v, 2), 90)), float(v.max())


def robust_sign_error(
    measure: Any,
    gap: Any,
    configs: Sequence[tuple],
    axes: Sequence[str],
    num_test: Any,
    *,
    loss_range: float = 1.0,
    min_ess: float = MIN_ESS,
    min_weight: float = MIN_WEIGHT,
    env: list[tuple[str, tuple, tuple]] | None = None,
) -> SignError:
    r"""Dziugaite et al.'s sign error in every environment (module docstring), per axis.

    Args:
      measure: (n,) finite measure values (size-adjusted by the caller where wanted).
      gap: (n,) finite gaps, in units of the loss whose range is ``loss_range``.
      configs: (n,) hashable hyperparameter tuples (the seed is not part of them).
      axes: the axes, in the order of the tuples.
      num_test: test-set size behind each gap, (n,) or one number; None weighs every pair 1
        (their ``filter_noise=False``).
      loss_range: c, the range of the per-example loss (1 for the 0-1 error).
      min_ess: the effective sample size an environment needs (12 in their code).
      min_weight: Hoeffding weights at or below it count 0, above it ``w - min_weight``.
      env: the environments (:func:`environments` of ``configs``), computed when None.

    Returns:
      A :class:`SignError`.

    Raises:
      ValueError: for samples of different sizes.

    References:
      Dziugaite et al. 2020, arXiv:2010.11924, section 4; their code (module docstring).

    >>> cfg = [(1,), (1,), (2,), (2,)]
    >>> r = robust_sign_error([1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.5, 0.5], cfg, ["lr"], 100,
    ...                       min_ess=1.0)
    >>> r.per_axis["lr"], r.worst
    ((0.5,), 0.5)
    """
    mu = np.asarray(measure, dtype=float).reshape(-1)
    g = np.asarray(gap, dtype=float).reshape(-1)
    if mu.size != g.size or len(configs) != mu.size:
        raise ValueError(f"measure, gap and configs differ in size ({mu.size}, {g.size}, "
                         f"{len(configs)})")  # fmt: skip
    nt = None if num_test is None else np.broadcast_to(np.asarray(num_test, float), mu.shape)
    members: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        members.setdefault(c, []).append(i)
    env = environments(configs, axes) if env is None else env
    per_axis: dict[str, list[float]] = {a: [] for a in axes}
    dropped = dict.fromkeys(axes, 0)
    where: list[str] = []
    errors: list[float] = []
    for axis, ca, cb in env:
        i = np.asarray(members[ca])[:, None]
        j = np.asarray(members[cb])[None, :]
        if nt is None:
            w = np.ones((i.size, j.size))
        else:
            h = hoeffding_weight(g[i] - g[j], np.minimum(nt[i], nt[j]), loss_range=loss_range)
            w = np.where(h > min_weight, h - min_weight, 0.0)
        with np.errstate(over="ignore"):  # a difference beyond the float range keeps its sign
            e = 0.5 * (1.0 - np.sign(mu[i] - mu[j]) * np.sign(g[i] - g[j]))
        total, squares = float(w.sum()), float((w**2).sum())
        ess = total**2 / squares if squares > 0 else 0.0
        if not (ess > min_ess or math.isclose(ess, min_ess)) or total == 0:
            dropped[axis] += 1
            continue
        value = float((w * e).sum() / total)
        per_axis[axis].append(value)
        errors.append(value)
        k = axes.index(axis)
        rest = ", ".join(f"{a}={ca[n]}" for n, a in enumerate(axes) if n != k)
        where.append(f"{axis}: {ca[k]} -> {cb[k]}" + (f" ({rest})" if rest else ""))
    frozen = {a: tuple(v) for a, v in per_axis.items()}
    if not errors:
        nan = math.nan
        note = f"no environment has an effective sample size >= {min_ess:g}"
        return SignError(frozen, dropped, nan, nan, nan, "", note)
    v = np.asarray(errors)
    k = int(np.argmax(v))
    return SignError(frozen, dropped, float(v.max()), float(v.mean()),
                     float(np.percentile(np.repeat(v, 2), 90)), where[k])  # fmt: skip
