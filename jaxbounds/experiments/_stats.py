"""Statistics and markdown helpers for the ``report.md`` of a reproduced experiment.

Kendall's tau-b with its two-sided p-value (``scipy.stats.kendalltau`` when scipy is
importable, else the same computation in numpy: the exact null distribution without ties for
n <= 33, the normal approximation with tie corrections otherwise), the mean and spread of a
quantity over seeds, a markdown table writer and the one-line verdict of a claim.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxbounds.study._stats import (  # noqa: F401  (re-exported)
    KendallTau,
    _dense_ranks,
    _kendall_p_exact,
    _kendall_tau_numpy,
    _tie_terms,
    format_number,
    kendall_tau,
)

__all__ = [
    "Granulated",
    "Interval",
    "KendallTau",
    "SignError",
    "Spread",
    "claim_line",
    "format_interval",
    "format_mean_std",
    "format_number",
    "granulated_tau",
    "group_rows",
    "hoeffding_weight",
    "json_value",
    "kendall_tau",
    "kendall_tau_a",
    "markdown_table",
    "mean_spread",
    "normal_weight",
    "resample_index",
    "seed_bootstrap",
    "sign_error",
]


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
        """``mean ± std`` with ``digits`` significant digits.

        One value gives ``mean (n=1, no spread)``, no value ``n/a``.

        >>> mean_spread([2.0]).format(), mean_spread([]).format()
        ('2 (n=1, no spread)', 'n/a')
        """
        if self.n == 0 or math.isnan(self.mean):
            return "n/a"
        if self.n < 2:
            return f"{format_number(self.mean, digits)} (n=1, no spread)"
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


def markdown_table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    align: Sequence[str] | None = None,
    digits: int = 4,
) -> str:
    """A GitHub markdown table; cells through :func:`format_number`, ``|`` escaped.

    An empty or undefined cell (None, ``""``, NaN) reads ``n/a``, in every report.

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
    if value is None or (isinstance(value, str) and not value.strip()):
        return "n/a"
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


# --------------------------------------------------------------------------------------------
# Measures versus the generalization gap (Jiang et al. 2020; Dziugaite et al. 2020)


def _sample(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sample, got shape {array.shape}")
    return array


def _paired(measure: Any, gap: Any) -> tuple[np.ndarray, np.ndarray]:
    mu, g = _sample(measure, "measure"), _sample(gap, "gap")
    if mu.shape != g.shape:
        raise ValueError(f"measure and gap differ in size ({mu.size} != {g.size})")
    return mu, g


def kendall_tau_a(x: Any, y: Any) -> float:
    r"""Kendall's tau as Jiang et al. write it (tau-a: ties count as 0, no tie correction).

    $$\tau = \frac{1}{n(n-1)}\sum_{i \ne j}\operatorname{sign}(x_i - x_j)
    \operatorname{sign}(y_i - y_j).$$

    Without ties it equals tau-b (:func:`kendall_tau`); with ties it is smaller in magnitude, and
    a constant sample gives 0 (a measure that does not move along an axis predicts nothing
    there), where tau-b is undefined.

    Args:
      x: 1-D sample.
      y: 1-D sample of the same size.

    Returns:
      tau in [-1, 1]; NaN when n < 2 or a value is NaN.

    Raises:
      ValueError: for samples that are not 1-D or differ in size.

    References:
      Jiang, Neyshabur, Mobahi, Krishnan, Bengio 2020, "Fantastic generalization measures and
      where to find them", arXiv:1912.02178, section 4 (eq. 3).

    >>> kendall_tau_a([1, 2, 3], [1, 3, 2]), kendall_tau_a([1, 1, 1], [1, 2, 3])
    (0.3333333333333333, 0.0)
    """
    a, b = _paired(x, y)
    n = a.size
    if n < 2 or np.isnan(a).any() or np.isnan(b).any():
        return math.nan
    s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
    return float(s.sum() / (n * (n - 1)))


@dataclasses.dataclass(frozen=True)
class Granulated:
    r"""Jiang et al.'s granulated Kendall coefficient of one measure.

    Attributes:
      psi: $\Psi$, the mean of ``per_axis`` over the axes where it is defined (NaN if none).
      per_axis: axis -> $\psi_i$, the mean tau over the groups of models that differ only in
        that axis (NaN when the axis has no group with two models).
      num_groups: axis -> number of groups averaged.
      group_taus: axis -> ``[(seed, tau), ...]`` of its groups (with ``seed_key``; the seed
        as :func:`json_value` text), for :meth:`resampled`.
    """

    psi: float
    per_axis: dict[str, float]
    num_groups: dict[str, int]
    group_taus: dict[str, list[tuple[str, float]]] = dataclasses.field(default_factory=dict)

    def resampled(self, drawn: Sequence[Any]) -> float:
        r"""$\Psi$ when the seeds ``drawn`` (repeats allowed) replace the seeds of the models.

        Every group lies within one seed, so a resample of seeds weighs each group by the
        number of times its seed was drawn: the bootstrap of :func:`seed_bootstrap` without
        recomputing a tau. Needs ``group_taus`` (``granulated_tau(..., seed_key=...)``).

        >>> s = [{"lr": lr, "seed": k} for k in (0, 1) for lr in (1, 2)]
        >>> g = granulated_tau([1, 2, 2, 1], [1, 2, 1, 2], s, ["lr"], seed_key="seed")
        >>> g.psi, g.resampled([0, 0]), g.resampled([1, 1])
        (0.0, 1.0, -1.0)
        """
        if not self.group_taus:
            raise ValueError("resampled: needs group_taus (granulated_tau with seed_key)")
        labels, per_axis = self._arrays
        counts = collections.Counter(json_value(s) for s in drawn)
        draws = np.array([counts.get(label, 0) for label in labels], dtype=float)
        values = []
        for codes, taus in per_axis:
            weights = draws[codes]
            if weights.sum() > 0:
                values.append(float(weights @ taus / weights.sum()))
        return float(np.mean(values)) if values else math.nan

    @functools.cached_property
    def _arrays(self) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
        """The seeds of the groups as codes into one label list, and the taus, per axis."""
        labels = sorted({seed for groups in self.group_taus.values() for seed, _ in groups})
        code = {label: k for k, label in enumerate(labels)}
        per_axis = [
            (np.array([code[seed] for seed, _ in groups], dtype=int),
             np.array([tau for _, tau in groups], dtype=float))
            for groups in self.group_taus.values()
        ]  # fmt: skip
        return labels, per_axis


def _label(value: Any) -> Any:
    """A hashable stand-in for a JSON value: scalars tagged with their type, else JSON text."""
    if value is None or isinstance(value, bool | int | float | str):
        return (type(value).__name__, value)
    return json_value(value)


def _group_key(setting: Mapping[str, Any], skip: str) -> tuple:
    return tuple((k, _label(v)) for k, v in sorted(setting.items()) if k != skip)


def granulated_tau(
    measure: Any,
    gap: Any,
    settings: Sequence[Mapping[str, Any]],
    axes: Sequence[str],
    *,
    seed_key: str | None = None,
) -> Granulated:
    r"""Jiang et al.'s granulated Kendall coefficient $\Psi$ and its per-axis terms $\psi_i$.

    For axis $i$ the models are grouped by their values of every other key of ``settings``
    (the other hyperparameters and, when it is a key, the seed), so the models of a group
    differ only in axis $i$. Then
    $$\psi_i = \frac{1}{|G_i|}\sum_{g \in G_i} \tau_a(\mu_g, \text{gap}_g),\qquad
    \Psi = \frac1A\sum_{i=1}^A \psi_i,$$
    with $\tau_a$ :func:`kendall_tau_a` (Jiang et al.'s formula) and $G_i$ the groups with at
    least two models holding at least two values of axis $i$. Axes without such a group are
    left out of the mean (their $\psi_i$ is NaN).

    Args:
      measure: (n,) values of the measure, one per model.
      gap: (n,) generalization gaps.
      settings: n mappings, each model's hyperparameters (and seed), JSON values.
      axes: the hyperparameter axes (keys of ``settings``).
      seed_key: the key of the seed in ``settings``, to record each group's seed
        (:attr:`Granulated.group_taus`); None records nothing.

    Returns:
      A :class:`Granulated`.

    Raises:
      ValueError: for samples of different sizes, ``settings`` of another length, no axes, or
        an axis that is not a key of every setting.

    References:
      Jiang et al. 2020, arXiv:1912.02178, section 4 (eq. 4).

    >>> settings = [{"lr": lr, "bs": bs} for lr in (1, 2) for bs in (1, 2)]
    >>> r = granulated_tau([1, 2, 3, 4], [1, 2, 4, 3], settings, ["lr", "bs"])
    >>> r.per_axis, r.psi
    ({'lr': 1.0, 'bs': 0.0}, 0.5)
    """
    mu, g = _paired(measure, gap)
    if len(settings) != mu.size:
        raise ValueError(f"settings: expected {mu.size} mappings, got {len(settings)}")
    if not axes:
        raise ValueError("axes: expected at least one hyperparameter axis")
    for axis in axes:
        if not all(axis in s for s in settings):
            raise ValueError(f"axes: {axis!r} is not a key of every setting")
    if seed_key is not None and not all(seed_key in s for s in settings):
        raise ValueError(f"seed_key: {seed_key!r} is not a key of every setting")
    per_axis, counts, group_taus = {}, {}, {}
    for axis in axes:
        groups: dict[str, list[int]] = {}
        for i, setting in enumerate(settings):
            groups.setdefault(_group_key(setting, axis), []).append(i)
        taus = []
        for members in groups.values():
            values = {_label(settings[i][axis]) for i in members}
            if len(members) >= 2 and len(values) >= 2:
                tau = kendall_tau_a(mu[members], g[members])
                seed = "" if seed_key is None else json_value(settings[members[0]][seed_key])
                if not math.isnan(tau):
                    taus.append((seed, tau))
        per_axis[axis] = float(np.mean([t for _, t in taus])) if taus else math.nan
        counts[axis] = len(taus)
        if seed_key is not None and taus:
            group_taus[axis] = taus
    defined = [v for v in per_axis.values() if not math.isnan(v)]
    psi = float(np.mean(defined)) if defined else math.nan
    return Granulated(psi, per_axis, counts, group_taus)


def json_value(value: Any) -> str:
    """A hashable canonical text of a JSON value (for grouping settings).

    >>> json_value([1, 2]) == json_value([1, 2]), json_value(1) == json_value("1")
    (True, False)
    """
    return json.dumps(value, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class SignError:
    """Dziugaite et al.'s robust sign error of a measure over environments.

    Attributes:
      worst: the largest weighted sign error over the environments (the robust error).
      p90: its 90th percentile over the environments.
      mean: its mean over the environments.
      num_environments: environments with positive total weight.
      worst_environment: a description of the worst environment (``axis: a -> b`` with the
        other settings), ``""`` if there is none.
      per_axis: axis -> the worst error over the environments of that axis.
    """

    worst: float
    p90: float
    mean: float
    num_environments: int
    worst_environment: str
    per_axis: dict[str, float]


def hoeffding_weight(delta_gap: Any, *, num_test: int, loss_range: float = 1.0) -> np.ndarray:
    r"""How surely a difference of two test-set estimates has its observed sign (Hoeffding).

    The gaps of two models are estimated on the same $n$ test examples; the per-example
    differences lie in $[-c, c]$, so the observed difference $\hat\Delta$ is within $t$ of its
    mean except with probability $2e^{-nt^2/(2c^2)}$. The weight is
    $w = \max(0, 1 - 2e^{-n\hat\Delta^2/(2c^2)})$: 0 for a difference within the noise, near 1
    for a clear one (Dziugaite et al.'s weighting of environments).

    Args:
      delta_gap: observed differences of the gaps.
      num_test: n >= 1 test examples.
      loss_range: c > 0, the range of the per-example loss (1 for the 0-1 error).

    Returns:
      Weights in [0, 1], the shape of ``delta_gap``.

    Raises:
      ValueError: for num_test < 1 or loss_range <= 0.

    References:
      Dziugaite, Drouin, Neal, Rajkumar, Caballero, Wang, Mitliagkas, Roy 2020, "In search of
      robust measures of generalization", arXiv:2010.11924, section 4.

    >>> [round(float(w), 4) for w in hoeffding_weight([0.0, 0.1, 0.3], num_test=1000)]
    [0.0, 0.9865, 1.0]
    """
    if isinstance(num_test, bool) or not isinstance(num_test, int | np.integer) or num_test < 1:
        raise ValueError(f"num_test: expected an int >= 1, got {num_test!r}")
    if not (isinstance(loss_range, int | float) and loss_range > 0 and math.isfinite(loss_range)):
        raise ValueError(f"loss_range: expected a finite number > 0, got {loss_range!r}")
    d = np.asarray(delta_gap, dtype=float)
    return np.maximum(0.0, 1.0 - 2.0 * np.exp(-num_test * d**2 / (2.0 * loss_range**2)))


def normal_weight(delta_gap: Any, stderr: Any) -> np.ndarray:
    r"""How surely a difference has its observed sign, from its standard error (normal).

    $w = 2\Phi(|\hat\Delta|/s) - 1 = \operatorname{erf}(|\hat\Delta| / (\sqrt2 s))$, the
    normal-approximation counterpart of :func:`hoeffding_weight` for unbounded losses (such as
    the cross-entropy), with $s$ the standard error of the difference; $s = 0$ gives 1 for a
    non-zero difference and 0 for none.

    Args:
      delta_gap: observed differences.
      stderr: their standard errors (>= 0), broadcastable.

    Returns:
      Weights in [0, 1].

    Raises:
      ValueError: for a negative or NaN standard error.

    >>> [round(float(w), 4) for w in normal_weight([0.0, 0.1, 0.2], 0.1)]
    [0.0, 0.6827, 0.9545]
    """
    d = np.abs(np.asarray(delta_gap, dtype=float))
    s = np.asarray(stderr, dtype=float)
    if np.isnan(s).any() or (s < 0).any():
        raise ValueError("stderr: expected standard errors >= 0")
    safe = np.where(s > 0, s, 1.0)
    ratio = np.where(s > 0, d / (math.sqrt(2.0) * safe), np.where(d > 0, np.inf, 0.0))
    return np.vectorize(math.erf, otypes=[float])(ratio)


def sign_error(
    measure: Any,
    gap: Any,
    settings: Sequence[Mapping[str, Any]],
    axes: Sequence[str],
    *,
    seed_key: str = "seed",
    pair_weight: Callable[[int, int], float] | None = None,
    min_weight: float = 0.0,
) -> SignError:
    r"""Dziugaite et al.'s weighted sign error of a measure in every environment; the worst.

    An environment is a pair of hyperparameter settings $(\omega, \omega')$ that differ in
    exactly one axis. For every seed $s$ trained at both, the pair of models $(i, j)$ has the
    sign error $e_{ij} = \frac12(1 - \operatorname{sign}(\mu_i - \mu_j)\operatorname{sign}(
    g_i - g_j))$ (0 when the measure orders the two gaps right, 1 when wrong, 1/2 on a tie) and
    the weight $w_{ij}$ (``pair_weight(i, j)``, default 1). The environment's error is
    $\sum_s w e / \sum_s w$; environments whose total weight is not above ``min_weight`` are
    left out (an environment whose gap differences are all within the noise says nothing). The
    robust sign error is the largest over the environments ($\max$), with the 90th percentile
    and the mean beside it.

    Args:
      measure: (n,) measure values.
      gap: (n,) gaps.
      settings: n mappings of hyperparameters, each with the seed under ``seed_key``.
      axes: the hyperparameter axes.
      seed_key: the key of the seed in ``settings``.
      pair_weight: ``(i, j) -> w >= 0`` for models i and j (e.g. from
        :func:`hoeffding_weight`); None weighs every pair 1.
      min_weight: the total weight an environment needs (>= 0).

    Returns:
      A :class:`SignError` (NaN fields when no environment has weight).

    Raises:
      ValueError: for samples of different sizes, settings of another length, no axes, an
        axis or seed key missing from a setting, or a negative / NaN weight.

    References:
      Dziugaite et al. 2020, arXiv:2010.11924, sections 3-4.

    >>> settings = [{"lr": lr, "seed": s} for lr in (1, 2) for s in (0, 1)]
    >>> r = sign_error([1, 1, 2, 0], [1, 1, 2, 2], settings, ["lr"])
    >>> r.worst, r.num_environments, r.worst_environment
    (0.5, 1, 'lr: 1 -> 2')
    """
    mu, g = _paired(measure, gap)
    if len(settings) != mu.size:
        raise ValueError(f"settings: expected {mu.size} mappings, got {len(settings)}")
    if not axes:
        raise ValueError("axes: expected at least one hyperparameter axis")
    for key in (*axes, seed_key):
        if not all(key in s for s in settings):
            raise ValueError(f"settings: {key!r} is not a key of every setting")
    if not (isinstance(min_weight, int | float) and min_weight >= 0 and math.isfinite(min_weight)):
        raise ValueError(f"min_weight: expected a finite number >= 0, got {min_weight!r}")
    keys = sorted({k for setting in settings for k in setting if k != seed_key})
    index: dict[tuple, dict[Any, int]] = {}
    for i, setting in enumerate(settings):
        config = tuple(_label(setting.get(k)) for k in keys)
        index.setdefault(config, {})[_label(setting[seed_key])] = i
    configs = list(index)
    first = [settings[next(iter(index[c].values()))] for c in configs]
    columns: list[dict] = [{} for _ in keys]
    codes = np.array(
        [[col.setdefault(v, len(col)) for col, v in zip(columns, c, strict=True)] for c in configs],
        dtype=int,
    ).reshape(len(configs), len(keys))
    differ = codes[:, None, :] != codes[None, :, :]
    one_apart = np.triu(differ.sum(axis=-1) == 1, 1)
    errors: list[tuple[float, str, str]] = []
    for a, b in zip(*np.nonzero(one_apart), strict=True):
        axis = keys[int(np.argmax(differ[a, b]))]
        if axis not in axes:
            continue
        num = den = 0.0
        for seed in sorted(set(index[configs[a]]) & set(index[configs[b]])):
            i, j = index[configs[a]][seed], index[configs[b]][seed]
            if math.isnan(mu[i]) or math.isnan(mu[j]) or math.isnan(g[i]) or math.isnan(g[j]):
                continue
            w = 1.0 if pair_weight is None else float(pair_weight(i, j))
            if not w >= 0.0:
                raise ValueError(f"pair_weight: expected a weight >= 0, got {w} for ({i}, {j})")
            e = 0.5 * (1.0 - np.sign(mu[i] - mu[j]) * np.sign(g[i] - g[j]))
            num, den = num + w * e, den + w
        if den > min_weight:
            ca, cb = first[a], first[b]
            lo, hi = sorted([ca[axis], cb[axis]], key=_sort_key)
            where = f"{axis}: {_show(lo)} -> {_show(hi)}"
            rest = ", ".join(
                f"{k}={_show(ca[k])}" for k in axes if k != axis and ca.get(k) is not None
            )
            errors.append((float(num / den), axis, f"{where} ({rest})" if rest else where))
    if not errors:
        nan = math.nan
        return SignError(nan, nan, nan, 0, "", {a: nan for a in axes})
    values = np.array([e for e, _, _ in errors])
    worst = int(np.argmax(values))
    per_axis = {a: max((e for e, ax, _ in errors if ax == a), default=math.nan) for a in axes}
    return SignError(
        float(values[worst]), float(np.quantile(values, 0.9)), float(values.mean()),
        len(errors), errors[worst][2], per_axis,
    )  # fmt: skip


def _sort_key(value: Any) -> tuple:
    return (0, float(value)) if isinstance(value, int | float) else (1, json_value(value))


def _show(value: Any) -> str:
    return format_number(value, 4) if value is not None else "None"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval of a statistic.

    Attributes:
      low: lower end.
      high: upper end.
      confidence: its nominal coverage, e.g. 0.95.
      num_resamples: resamples with a finite value (the interval is NaN if none).
    """

    low: float
    high: float
    confidence: float
    num_resamples: int

    def format(self, digits: int = 2) -> str:
        """``[low, high]`` with ``digits`` decimals (see :func:`format_interval`).

        >>> Interval(-0.123, 0.456, 0.95, 100).format()
        '[-0.12, 0.46]'
        >>> Interval(0.5, 0.5, 0.95, 100).format(), Interval(math.nan, math.nan, 0.95, 0).format()
        ('0.50 (no spread over resamples)', 'n/a')
        """
        return format_interval(self.low, self.high, digits)


def format_mean_std(mean: Any, std: Any, digits: int = 3, std_digits: int | None = None) -> str:
    """``mean ± std`` of a report, ``digits`` (``std_digits``) significant digits.

    The rule of :func:`format_interval`: an undefined mean gives ``n/a``, and an undefined
    spread (one value, e.g. one seed) gives the mean and says so instead of ``± nan``.

    >>> format_mean_std(0.8815, 0.0123), format_mean_std(0.8815, math.nan)
    ('0.881 ± 0.0123', '0.881 (n=1, no spread)')
    >>> format_mean_std(None, 1.0), format_mean_std(2.0, 0.25, std_digits=1)
    ('n/a', '2 ± 0.2')
    """
    if mean is None or math.isnan(float(mean)):
        return "n/a"
    text = f"{float(mean):.{digits}g}"
    if std is None or math.isnan(float(std)):
        return f"{text} (n=1, no spread)"
    return f"{text} ± {float(std):.{digits if std_digits is None else std_digits}g}"


def format_interval(low: Any, high: Any, digits: int = 2, *, signed: bool = False) -> str:
    """An interval ``[low, high]`` of a report, with ``digits`` decimals.

    One rule for every report: an undefined end (None or NaN) gives ``n/a``, and an interval
    of no width (one value, or resamples that all agree, e.g. over one seed) gives the value
    and says so instead of printing ``[x, x]``.

    Args:
      low: lower end.
      high: upper end.
      digits: decimals.
      signed: print a ``+`` on non-negative numbers.

    >>> format_interval(-0.123, 0.456), format_interval(0.666, 0.666, signed=True)
    ('[-0.12, 0.46]', '+0.67 (no spread over resamples)')
    >>> format_interval(None, 1.0), format_interval(math.nan, 1.0)
    ('n/a', 'n/a')
    """
    if any(v is None or not math.isfinite(float(v)) for v in (low, high)):
        if low is not None and high is not None and float(low) == float(high):  # +-inf alike
            return f"{float(low):{'+' if signed else ''}.{digits}f}"
        return "n/a"
    spec = f"{'+' if signed else ''}.{digits}f"
    if float(low) == float(high):
        return f"{float(low):{spec}} (no spread over resamples)"
    return f"[{float(low):{spec}}, {float(high):{spec}}]"


def resample_index(seeds: Sequence[Any], drawn: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The models of a resample of seeds: their indices and the draw each came from.

    Args:
      seeds: the seed of each model (n values).
      drawn: the resampled seeds, with repeats (e.g. from :func:`seed_bootstrap`).

    Returns:
      ``(index, copy)``: the indices of the models of every drawn seed, in draw order, and for
      each the number of its draw (0, 1, ...), to use in place of the seed where the models of
      one draw must stay together (a seed drawn twice gives two copies of its models).

    >>> resample_index([0, 1, 0, 1], [1, 1])
    (array([1, 3, 1, 3]), array([0, 0, 1, 1]))
    """
    members: dict[Any, list[int]] = {}
    for i, seed in enumerate(seeds):
        members.setdefault(_label(seed), []).append(i)
    index, copy = [], []
    for c, seed in enumerate(drawn):
        found = members.get(_label(seed), [])
        index += found
        copy += [c] * len(found)
    return np.asarray(index, dtype=int), np.asarray(copy, dtype=int)


def seed_bootstrap(
    seeds: Sequence[Any],
    statistic: Callable[[list], float],
    *,
    num_resamples: int = 200,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of a statistic of models, resampling whole seeds.

    Each resample draws as many seeds as there are distinct ones, uniformly with replacement,
    and calls ``statistic(drawn)`` with the drawn seeds (repeats included; a seed drawn twice
    weighs its models twice, see :func:`resample_index`). The interval is the ``(1 -
    confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the finite values. The draws
    depend only on ``rng_seed``, the number of distinct seeds and ``num_resamples``, so
    statistics bootstrapped with the same arguments use the same resamples (their differences
    are paired).

    Args:
      seeds: the seeds (e.g. the seed of each model; repeats are merged, order is sorted).
      statistic: ``drawn -> float``.
      num_resamples: B >= 1 resamples.
      confidence: in (0, 1).
      rng_seed: seed of the ``numpy.random.default_rng`` that draws the resamples.

    Returns:
      An :class:`Interval`.

    Raises:
      ValueError: for no seeds, num_resamples < 1 or a confidence outside (0, 1).

    References:
      Efron & Tibshirani 1993, An Introduction to the Bootstrap (percentile interval).

    >>> r = seed_bootstrap([0, 1, 1], lambda drawn: float(len(drawn)), num_resamples=20)
    >>> r.low, r.high, r.num_resamples
    (2.0, 2.0, 20)
    """
    if isinstance(num_resamples, bool) or not isinstance(num_resamples, int) or num_resamples < 1:
        raise ValueError(f"num_resamples: expected an int >= 1, got {num_resamples!r}")
    if not (isinstance(confidence, float) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence: expected a float in (0, 1), got {confidence!r}")
    distinct = {json_value(s): s for s in seeds}
    if not distinct:
        raise ValueError("seeds: expected at least one seed")
    labels = [distinct[k] for k in sorted(distinct)]
    rng = np.random.default_rng(rng_seed)
    values = []
    for _ in range(num_resamples):
        drawn = rng.integers(0, len(labels), size=len(labels))
        values.append(float(statistic([labels[k] for k in drawn])))
    finite = np.array([v for v in values if math.isfinite(v)])
    if finite.size == 0:
        return Interval(math.nan, math.nan, confidence, 0)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return Interval(float(low), float(high), confidence, int(finite.size))
