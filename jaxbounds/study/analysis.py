"""The study of a table of models: every statistic per family, beside its null baselines.

Protocol (Jiang et al. 2020's by default):

1. Each family is analysed on its own; a pooled tau over all families is reported apart and
   labelled (pooling families of different gap scales can reverse a correlation).
2. Models without a gap are reported and left out (never silently).
3. Only converged models are analysed (``converged_only``); the capped ones are counted and
   their own tau is reported apart.
4. Duplicates count once: models with the same ``run_id``, or without a run id the same seed,
   gap and measure values (a run that converged before the smaller step cap is the same run at
   every cap). The first in table order is kept.
5. The axes of a family are those with at least two values among its kept models.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxbounds._atomic import check_stop
from jaxbounds.study import bootstrap, cmi, nulls, ranking, sign_error
from jaxbounds.study._table import ModelTable, check_gap_range

__all__ = ["FamilyResult", "MeasureResult", "Study", "analyze"]


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """Every statistic of one measure in one family.

    Attributes:
      name: the measure.
      num_models: models with a value (of the family's kept models).
      num_missing: kept models without a finite value (empty, NaN or infinite), left out
        of this measure's statistics.
      tau: :class:`~jaxbounds.study.ranking.Tau` over the family's kept models.
      tau_interval: its two-way bootstrap interval (of Jiang's tau-a; configurations and
        seeds resampled jointly, :mod:`~jaxbounds.study.bootstrap`).
      psi: :class:`~jaxbounds.study.ranking.Psi`.
      psi_interval: the two-way bootstrap interval of Psi.
      cmi: :class:`~jaxbounds.study.cmi.CMI` (None with fewer than two axes... or no pairs).
      sign_error: :class:`~jaxbounds.study.sign_error.SignError` (size-adjusted measure).
      tau_capped: tau over the family's capped (not converged) models, apart; None if none.
      sign_error_at: test-set size -> the sign error with every gap taken as measured on that
        many test examples (``sign_error_num_test`` of :func:`analyze`; empty without
        test-set sizes).
    """

    name: str
    num_models: int
    num_missing: int
    tau: ranking.Tau
    tau_interval: bootstrap.Interval
    psi: ranking.Psi
    psi_interval: bootstrap.Interval
    cmi: cmi.CMI | None
    sign_error: sign_error.SignError
    tau_capped: ranking.Tau | None = None
    sign_error_at: dict[int, sign_error.SignError] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class FamilyResult:
    """The study of one family.

    Attributes:
      family: its label.
      axes: the axes it varies (at least two values among its kept models).
      num_rows: its rows in the table.
      num_no_gap: rows without a gap (left out, reported).
      num_capped: rows not converged (left out with ``converged_only``, reported).
      num_duplicates: rows that repeat an earlier run (counted once).
      duplicate_axes: axes whose values differ between copies of one run.
      num_models: models analysed.
      seeds: the seeds of the analysed models.
      measures: measure -> :class:`MeasureResult`.
      nulls: ``"random"`` / ``"gap+noise"`` / ``"constant"`` ->
        :class:`~jaxbounds.study.nulls.NullBaseline`.
      notes: what a reader must know (a single seed, constant measures, ...).
      rows: the table rows of the analysed models, in analysis order.
      resamples: the two-way bootstrap's resamples of the analysed models (shared by every
        statistic of the family, so differences are paired; not part of the JSON).
    """

    family: str
    axes: tuple[str, ...]
    num_rows: int
    num_no_gap: int
    num_capped: int
    num_duplicates: int
    duplicate_axes: tuple[str, ...]
    num_models: int
    seeds: tuple[Any, ...]
    measures: dict[str, MeasureResult]
    nulls: dict[str, nulls.NullBaseline]
    notes: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    resamples: bootstrap.Resamples | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata={"json": False}
    )


@dataclasses.dataclass(frozen=True)
class Study:
    """The study of a table.

    Attributes:
      families: family -> :class:`FamilyResult`.
      pooled: measure -> tau over every family's kept models (a labelled extra, never a
        verdict).
      options: the options of :func:`analyze`.
    """

    families: dict[str, FamilyResult]
    pooled: dict[str, ranking.Tau]
    options: dict[str, Any]


def _duplicates(t: ModelTable) -> tuple[np.ndarray, tuple[str, ...]]:
    """Keep-mask of first copies, and the axes that differ between copies."""
    keys: dict[Any, int] = {}
    keep = np.ones(t.num_rows, dtype=bool)
    differ: set[str] = set()
    for i in range(t.num_rows):
        if t.run_id is not None:
            key: Any = ("id", t.run_id[i])
        else:
            key = (t.seed[i], repr(float(t.gap[i])),
                   tuple(repr(float(v[i])) for v in t.measures.values()))  # fmt: skip
        first = keys.setdefault(key, i)
        if first != i:
            keep[i] = False
            differ |= {a for a in t.axes if t.settings[a][i] != t.settings[a][first]}
    return keep, tuple(a for a in t.axes if a in differ)


def _log_scale(name: str, log_measures: Sequence[str] | None) -> bool:
    if log_measures is not None:
        return name in log_measures
    return name.lower().startswith("log")


@dataclasses.dataclass(frozen=True)
class _Family:
    """The kept models of a family and what every measure's statistics share."""

    kept: ModelTable
    rows: np.ndarray
    axes: tuple[str, ...]
    configs: list[tuple]
    seeds: list[Any]
    resamples: bootstrap.Resamples
    env: list
    groups: dict[str, list[np.ndarray]]
    layout: ranking.PsiLayout
    pairs: Any
    subsets: Any
    opts: dict[str, Any]


def _select(t: ModelTable, family: str, opts: dict[str, Any]) -> tuple[dict[str, Any], list]:
    """The rows of a family: without a gap, capped and duplicates set apart, with notes."""
    rows = np.flatnonzero(t.family == family)
    ft = t.take(rows)
    notes: list[str] = []
    has_gap = np.isfinite(ft.gap)
    if (~has_gap).any():
        notes.append(f"{int((~has_gap).sum())} row(s) without a gap (NaN) left out")
    capped = has_gap & ~ft.converged
    use = has_gap & (ft.converged if opts["converged_only"] else True)
    if capped.any():
        notes.append(f"{int(capped.sum())} capped (not converged) model(s) "
                     + ("reported apart" if opts["converged_only"] else "included"))  # fmt: skip
    kept = ft.take(np.flatnonzero(use))
    kept_rows = rows[np.flatnonzero(use)]
    dup_axes: tuple[str, ...] = ()
    num_dup = 0
    if opts["collapse_duplicates"] and kept.num_rows:
        keep, dup_axes = _duplicates(kept)
        num_dup = int((~keep).sum())
        kept = kept.take(np.flatnonzero(keep))
        kept_rows = kept_rows[keep]
        if num_dup:
            notes.append(
                f"{num_dup} duplicate run(s) counted once"
                + (f" (they differ only in {', '.join(dup_axes)})" if dup_axes else "")
            )
    counts = {"num_rows": int(rows.size), "num_no_gap": int((~has_gap).sum()),
              "num_capped": int(capped.sum()), "num_duplicates": num_dup,
              "duplicate_axes": dup_axes}  # fmt: skip
    return {"kept": kept, "rows": kept_rows, "capped": ft.take(np.flatnonzero(capped)),
            "counts": counts}, notes  # fmt: skip


def _prepare(kept: ModelTable, rows: np.ndarray, opts: dict[str, Any], notes: list) -> _Family:
    """Axes, configurations, resamples, environments, groups and CMI pairs of a family."""
    axes = tuple(a for a in kept.axes
                 if len({kendall_key(v) for v in kept.settings[a]}) >= 2)  # fmt: skip
    configs = [tuple(kendall_key(kept.settings[a][i]) for a in axes)
               for i in range(kept.num_rows)]  # fmt: skip
    seeds = list(kept.seed)
    if len(set(seeds)) == 1:
        notes.append("one seed: the intervals resample the configurations only")
    if kept.num_test is None:
        notes.append("no test-set size: every pair of the sign error weighs 1 (no noise filter)")
    resamples = bootstrap.two_way_resamples(configs, seeds, num_resamples=opts["num_resamples"],
                                            rng_seed=opts["rng_seed"])  # fmt: skip
    pairs = subsets = None
    if kept.num_rows <= opts["cmi_max_models"] and opts["cmi_max_size"] >= 0:
        pairs = cmi.pair_codes(configs, list(axes))
        subsets = cmi.subset_codes(pairs, min(opts["cmi_max_size"], len(axes)))
    elif opts["cmi_max_size"] >= 0:
        notes.append(f"CMI skipped: {kept.num_rows} models, more than cmi_max_models = "
                     f"{opts['cmi_max_models']} (it uses all n(n-1) ordered pairs)")  # fmt: skip
    groups = ranking.psi_groups(configs, seeds, list(axes))
    return _Family(kept, rows, axes, configs, seeds, resamples,
                   sign_error.environments(configs, list(axes)), groups,
                   ranking.psi_layout(groups), pairs, subsets, opts)  # fmt: skip


def _sign_error(f: _Family, mu: np.ndarray, idx: np.ndarray, name: str | None,
                num_test: Any = "table", adjust: bool = True) -> sign_error.SignError:  # fmt: skip
    """The sign error of ``mu`` (the models ``idx``), size-adjusted when the table has sizes.

    ``name`` None: a null measure, adjusted as a measure off the log scale (``adjust`` False:
    not adjusted, for the gap plus noise). ``num_test``: ``"table"`` for the table's test-set
    sizes, else a number or None.
    """
    kept, axes, opts = f.kept, f.axes, f.opts
    adj = mu
    if kept.train_size is not None and adjust:
        log = name is not None and _log_scale(name, opts["log_measures"])
        adj = sign_error.size_adjusted(mu, kept.train_size[idx], log_scale=log)
    if not axes:
        nan = math.nan
        return sign_error.SignError({}, {}, nan, nan, nan, "", "no axis with two values")
    if np.isnan(adj).any():
        nan = math.nan
        return sign_error.SignError({a: () for a in axes}, dict.fromkeys(axes, 0), nan, nan,
                                    nan, "", "negative values: sqrt(v/m) is undefined")  # fmt: skip
    if isinstance(num_test, str):
        nt = None if kept.num_test is None else kept.num_test[idx]
    else:
        nt = num_test
    full = idx.size == kept.num_rows
    return sign_error.robust_sign_error(
        adj, kept.gap[idx], [f.configs[i] for i in idx], list(axes), nt,
        loss_range=opts["loss_range"], min_ess=opts["min_ess"], env=f.env if full else None,
    )  # fmt: skip


def _cmi(f: _Family, mu: np.ndarray, idx: np.ndarray) -> cmi.CMI | None:
    full = idx.size == f.kept.num_rows
    if not f.axes or idx.size < 2 or f.opts["cmi_max_size"] < 0:
        return None
    if f.pairs is None and idx.size > f.opts["cmi_max_models"]:
        return None
    return cmi.conditional_mutual_information(
        mu, f.kept.gap[idx], [f.configs[i] for i in idx], list(f.axes),
        max_size=f.opts["cmi_max_size"], pairs=f.pairs if full else None,
        subsets=f.subsets if full else None,
    )  # fmt: skip


def _measure(f: _Family, name: str, values: np.ndarray, capped: ModelTable,
             notes: list) -> MeasureResult:  # fmt: skip
    """Every statistic of one measure in a family."""
    kept, opts = f.kept, f.opts
    have = np.isfinite(values)
    idx = np.flatnonzero(have)
    mu, g = values[idx], kept.gap[idx]
    sd = [f.seeds[i] for i in idx]
    groups = (f.groups if have.all()
              else ranking.psi_groups([f.configs[i] for i in idx], sd, list(f.axes)))  # fmt: skip
    tau = ranking.kendall(mu, g)
    if tau.note and idx.size:
        notes.append(f"{name}: tau n/a ({tau.note})")
    psi = ranking.granulated_psi(mu, g, groups, sd, index=idx,
                                 layout=f.layout if have.all() else None)  # fmt: skip
    w = f.resamples.weights
    if tau.note:
        tau_values = np.full(w.shape[0], math.nan)
    else:
        pair = ranking.signs(mu).astype(float) * ranking.signs(g)
        tau_values = bootstrap.tau_resampled(pair, w[:, idx])
    conf = opts["confidence"]
    tau_ci = bootstrap.interval(tau_values, f.resamples, confidence=conf)
    psi_ci = bootstrap.interval(psi.resampled(w), f.resamples, confidence=conf)
    se = _sign_error(f, mu, idx, name)
    alt = {int(n): _sign_error(f, mu, idx, name, num_test=float(n))
           for n in opts["sign_error_num_test"]} if kept.num_test is not None else {}  # fmt: skip
    tc = None
    if capped.num_rows:
        cv = capped.measures[name]
        ok = np.isfinite(cv)
        tc = ranking.kendall(cv[ok], capped.gap[ok])
    return MeasureResult(name, int(idx.size), int((~have).sum()), tau, tau_ci, psi, psi_ci,
                         _cmi(f, mu, idx), se, tc, alt)  # fmt: skip


def _null_stats(f: _Family, with_cmi: bool) -> Any:
    every = np.arange(f.kept.num_rows)

    def stats(m: np.ndarray, kind: str) -> dict[str, float]:
        adjust = kind != "gap+noise"  # the null measures are size-adjusted as the measures
        out = {"tau": ranking.tau_a(m, f.kept.gap),
               "psi": ranking.granulated_psi(m, f.kept.gap, f.groups, f.seeds,
                                             layout=f.layout).psi}  # fmt: skip
        if with_cmi:
            c = _cmi(f, m, every)
            for k in range(f.opts["cmi_max_size"] + 1):
                out[f"cmi_{k}"] = math.nan if c is None else c.by_size.get(k, math.nan)
        if f.axes:
            s = _sign_error(f, m, every, None, adjust=adjust)
            out |= {"sign_error_worst": s.worst, "sign_error_mean": s.mean}
            for n in f.opts["sign_error_num_test"] if f.kept.num_test is not None else ():
                s = _sign_error(f, m, every, None, num_test=float(n), adjust=adjust)
                out |= {f"sign_error_worst@{n}": s.worst, f"sign_error_mean@{n}": s.mean}
        return out

    return stats


def _family(t: ModelTable, family: str, opts: dict[str, Any]) -> tuple[FamilyResult, np.ndarray]:
    sel, notes = _select(t, family, opts)
    f = _prepare(sel["kept"], sel["rows"], opts, notes)
    measures = {}
    for name, values in f.kept.measures.items():
        check_stop()  # a SIGINT / SIGTERM under jaxbounds study stops between two measures
        measures[name] = _measure(f, name, values, sel["capped"], notes)
    with_cmi = opts["null_cmi"] and f.pairs is not None and opts["cmi_max_size"] >= 0
    base = nulls.null_draws(f.kept.gap, f.kept.gap_stderr, _null_stats(f, with_cmi),
                            num_samples=opts["num_null_draws"], rng_seed=opts["rng_seed"],
                            constant=f.kept.train_size is not None)  # fmt: skip
    result = FamilyResult(
        family=family, axes=f.axes, **sel["counts"], num_models=f.kept.num_rows,
        seeds=tuple(sorted(set(f.seeds), key=lambda s: (str(type(s)), s))), measures=measures,
        nulls=base, notes=tuple(notes), rows=tuple(int(i) for i in f.rows),
        resamples=f.resamples,
    )  # fmt: skip
    return result, f.rows


#: The largest draw and resample counts :func:`analyze` takes: each null draw keeps its
#: statistics and each resample a weight per model (100,000 resamples of 1,000 models: 0.8 GB).
MAX_DRAWS = 100_000


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high], refused naming ``name`` (bools and floats too)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name}: expected an int, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high:,}]"
        raise ValueError(f"{name}: expected an int {span}, got {value}")
    return int(value)


def _number(name: str, value: Any, *, positive: bool) -> float:
    """A finite real number (> 0 with ``positive``), refused naming ``name``."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or (positive and value <= 0):
        what = "a finite number > 0" if positive else "a finite number"
        raise ValueError(f"{name}: expected {what}, got {value!r}")
    return float(value)


def _options(**given: Any) -> dict[str, Any]:
    """The options of :func:`analyze`, checked: each refused value names its argument."""
    for name in ("converged_only", "collapse_duplicates", "null_cmi"):
        if not isinstance(given[name], bool | np.bool_):
            raise ValueError(f"{name}: expected True or False, got {given[name]!r}")
    conf = given["confidence"]
    if not (isinstance(conf, float) and 0.0 < conf < 1.0):
        raise ValueError(f"confidence: expected a float in (0, 1), got {conf!r}")
    logs = given["log_measures"]
    if logs is not None and (isinstance(logs, str) or not isinstance(logs, Sequence)
                             or not all(isinstance(m, str) for m in logs)):  # fmt: skip
        raise ValueError(f"log_measures: expected a list of measure names or None, got {logs!r}")
    sizes = given["sign_error_num_test"]
    if isinstance(sizes, str) or not isinstance(sizes, Sequence):
        raise ValueError(f"sign_error_num_test: expected a list of ints, got {sizes!r}")
    return {
        "converged_only": bool(given["converged_only"]),
        "collapse_duplicates": bool(given["collapse_duplicates"]),
        "num_null_draws": _int("num_null_draws", given["num_null_draws"], 1, MAX_DRAWS),
        "num_resamples": _int("num_resamples", given["num_resamples"], 1, MAX_DRAWS),
        "confidence": conf,
        "rng_seed": _int("rng_seed", given["rng_seed"], 0),
        "loss_range": _number("loss_range", given["loss_range"], positive=True),
        "min_ess": _number("min_ess", given["min_ess"], positive=True),
        "log_measures": None if logs is None else tuple(logs),
        "cmi_max_size": _int("cmi_max_size", given["cmi_max_size"], -1),
        "cmi_max_models": _int("cmi_max_models", given["cmi_max_models"], 0),
        "null_cmi": bool(given["null_cmi"]),
        "sign_error_num_test": tuple(_int("sign_error_num_test", n, 1, 2**53) for n in sizes),
    }


def kendall_key(value: Any) -> Any:
    """A hashable setting value (lists and dicts as JSON text)."""
    from jaxbounds.study._table import _hashable

    return _hashable(value)


def analyze(
    table: ModelTable,
    *,
    converged_only: bool = True,
    collapse_duplicates: bool = True,
    num_null_draws: int = 100,
    num_resamples: int = 200,
    confidence: float = 0.95,
    rng_seed: int = 0,
    loss_range: float = 1.0,
    min_ess: float = sign_error.MIN_ESS,
    log_measures: Sequence[str] | None = None,
    cmi_max_size: int = 2,
    cmi_max_models: int = 400,
    null_cmi: bool = True,
    sign_error_num_test: Sequence[int] = (),
) -> Study:
    """Every statistic of every measure, per family, beside its null baselines.

    Args:
      table: the models (:func:`~jaxbounds.study.load_table`).
      converged_only: analyse converged models only (Jiang et al.'s protocol); capped models
        are counted and their tau reported apart. False mixes them in (said in the notes).
      collapse_duplicates: count repeated runs once (module docstring).
      num_null_draws: draws of each null baseline (>= 1; 100 or more for a report).
      num_resamples: two-way bootstrap resamples (configurations and seeds).
      confidence: coverage of the bootstrap intervals, in (0, 1).
      rng_seed: seed of the bootstrap and the nulls.
      loss_range: range of the per-example loss behind the gap (1 for the 0-1 error), for the
        Hoeffding weights of the sign error.
      min_ess: effective sample size an environment of the sign error needs (12 as
        Dziugaite et al.).
      log_measures: the measures on the log scale for the size adjustment; None: the names
        that start with ``log``.
      cmi_max_size: largest conditioning set of the CMI test (Jiang et al.: 2; -1: no CMI).
      cmi_max_models: families with more kept models skip the CMI test (it uses all n(n-1)
        ordered pairs).
      null_cmi: give the null measures' CMI too (``cmi_0`` ... in their statistics).
      sign_error_num_test: test-set sizes at which the sign error is given too, beside the
        table's (``MeasureResult.sign_error_at``; e.g. 10000, the anchors' code's n).

    Returns:
      A :class:`Study`.

    Raises:
      ValueError: naming the argument, for a value of the wrong type or out of range (a
        confidence outside (0, 1), num_null_draws / num_resamples outside [1, MAX_DRAWS], a
        negative rng_seed, ...), or (with test-set sizes) a gap beyond ``loss_range``.

    >>> from jaxbounds.study import load_table
    >>> rows = [{"lr": lr, "seed": s, "gap": lr + s / 10, "m": lr} for lr in (1, 2, 3)
    ...         for s in (0, 1)]
    >>> t = load_table(rows, axes=["lr"], seed="seed", gap="gap", measures=["m"])
    >>> r = analyze(t, num_null_draws=5, num_resamples=10)
    >>> r.families["all"].measures["m"].psi.psi, r.families["all"].axes
    (1.0, ('lr',))
    """
    if not isinstance(table, ModelTable):
        raise ValueError(f"table: expected a ModelTable (load_table), got {type(table).__name__}")
    opts = _options(
        converged_only=converged_only, collapse_duplicates=collapse_duplicates,
        num_null_draws=num_null_draws, num_resamples=num_resamples, confidence=confidence,
        rng_seed=rng_seed, loss_range=loss_range, min_ess=min_ess, log_measures=log_measures,
        cmi_max_size=cmi_max_size, cmi_max_models=cmi_max_models, null_cmi=null_cmi,
        sign_error_num_test=sign_error_num_test,
    )  # fmt: skip
    check_gap_range(table, opts["loss_range"])
    families: dict[str, FamilyResult] = {}
    pooled_rows: list[np.ndarray] = []
    for family in dict.fromkeys(table.family.tolist()):
        result, rows = _family(table, family, opts)
        families[family] = result
        pooled_rows.append(rows)
    every = np.concatenate(pooled_rows) if pooled_rows else np.zeros(0, dtype=int)
    pooled = {}
    for name, values in table.measures.items():
        v, g = values[every], table.gap[every]
        ok = np.isfinite(v)
        pooled[name] = ranking.kendall(v[ok], g[ok])
    return Study(families, pooled, opts)
