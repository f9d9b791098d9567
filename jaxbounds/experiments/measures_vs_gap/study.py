"""The statistics and verdicts of ``measures-vs-gap``, through :mod:`jaxbounds.study`.

Two studies of the same ``results.csv`` rows, each per family (never pooled in a verdict),
converged models only (``reached``; the capped ones reported apart), duplicate runs counted once
(identical gap and measure values: a run that reached the loss threshold before the smaller
step cap is the same run at every cap):

- the **loss gap** (test minus training cross-entropy, standard error ``gap_stderr``): Kendall's
  tau, Jiang's Psi and per-axis psi, the CMI test, and their null baselines;
- the **0-1 error gap** (``error_gap``, standard error of the test error
  ``sqrt(e (1 - e) / num_test)``): Dziugaite et al.'s sign error, whose Hoeffding weights need
  a loss in [0, 1] (their ``gen.gap`` is the error gap), with its null baselines; measures
  size-adjusted with ``num_train``.

Each claim gets one verdict per family by a rule that can fail both ways, written beside it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxbounds import study as st
from jaxbounds.study import bootstrap, ranking

__all__ = ["RULES", "claim_lines", "run_studies"]

#: The axes of the results (None where a family has no such axis, or a run predates it). The
#: learning-rate axis is ``lr_scale`` (a multiple of each optimizer's base rate, so it is crossed
#: with ``optimizer``); ``learning_rate`` itself is an axis only of runs that predate it. The
#: step budget ``max_steps`` is not an axis: a model is kept where it reached the loss threshold,
#: so the budget of a kept model records when it converged (an outcome, :data:`OUTCOME`), and an
#: outcome as an axis would split Psi's groups, condition the CMI on the result and make
#: Dziugaite et al.'s environments out of it.
AXES = ("width", "num_train", "seq_len", "batch_size", "optimizer", "lr_scale",
        "learning_rate", "weight_decay")  # fmt: skip
#: The recorded outcome that a design may vary but no statistic uses as an axis.
OUTCOME = "max_steps"
#: The anchors' code weighs the sign error's pairs as if every gap were measured on this many
#: test examples (Dziugaite et al.'s ``hoeffding_weight(..., n=10000)``).
ANCHOR_NUM_TEST = 10000


def _axes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """:data:`AXES` for these rows: ``learning_rate`` only when no row has ``lr_scale``."""
    scaled = any(r.get("lr_scale") not in (None, "") for r in rows)
    return [a for a in AXES if not (scaled and a == "learning_rate")]


def _lr_axis(axes: Sequence[str]) -> str | None:
    """The learning-rate axis among ``axes``: ``lr_scale``, else ``learning_rate``."""
    return next((a for a in ("lr_scale", "learning_rate") if a in axes), None)


WEAK_TAU = 0.3
FAIL_ERROR = 0.5

#: Andriushchenko et al.'s claims are about adaptive sharpness (their abstract: "a detailed
#: study of various definitions of adaptive sharpness"): the measures tested for them.
ADAPTIVE = ("adaptive_sharpness_", "worst_adaptive_")

#: The verdict rule of each claim (printed beside it).
RULES = (
    "reproduced if the two-way bootstrap interval of mean Psi(sharpness, PAC-Bayes) - mean "
    "Psi(norm, bound) lies above 0, not reproduced if below 0, inconclusive if it holds 0 "
    "(measures that rank the models identically, tau 1 between them, count once)",
    "reproduced if the interval of Psi(pacbayes_mag_flatness) - Psi(best other measure) reaches "
    "0 (no measure ranks clearly better), not reproduced if it lies below 0",
    "reproduced if the tau intervals of log_prod_frobenius and log_prod_spectral both lie "
    "below 0, not reproduced if either lies above 0, inconclusive otherwise",
    f"reproduced if every adaptive sharpness measure's tau interval lies below {WEAK_TAU}, not "
    f"reproduced if one lies above {WEAK_TAU}, inconclusive otherwise",
    "on the learning-rate axis, per adaptive sharpness measure the interval of |psi with the "
    "learning rate| - |psi with the gap|; reproduced if most have it above 0, not reproduced "
    "if most have it below 0, inconclusive otherwise",
    f"at the test-set size: reproduced if every measure's largest sign error is at least "
    f"{FAIL_ERROR} while the gap plus noise stays below {FAIL_ERROR} (median over its draws), "
    f"not reproduced if a measure stays below {FAIL_ERROR}; inconclusive if no environment is "
    f"kept or the gap plus noise itself fails; not testable on the family where the "
    f"size-adjusted constant measure (1/sqrt(N)) stays below {FAIL_ERROR}: there the kept "
    "environments do not tell a measure from the training-set size",
)


def _table(rows: Sequence[Mapping[str, Any]], names: Sequence[str], *, error: bool) -> Any:
    axes = _axes(rows)
    cols: dict[str, list] = {c: [r.get(c) for r in rows]
                             for c in dict.fromkeys(("family", "seed", "reached", "num_test",
                                                     "num_train", *axes, *names))}  # fmt: skip
    if error:
        cols["_gap"] = [r.get("error_gap") for r in rows]
        se = []
        for r in rows:
            acc, n = r.get("test_accuracy"), r.get("num_test")
            ok = isinstance(acc, int | float) and isinstance(n, int | float) and n > 0
            se.append(math.sqrt(max(acc * (1 - acc), 0.0) / n) if ok else None)
        cols["_se"] = se
    else:
        cols["_gap"] = [r.get("gap") for r in rows]
        cols["_se"] = [r.get("gap_stderr") for r in rows]
    cols["reached"] = [bool(v) for v in cols["reached"]]
    return st.load_table(
        cols, family="family", axes=axes, seed="seed", gap="_gap", measures=list(names),
        converged="reached", gap_stderr="_se", num_test="num_test" if error else None,
        train_size="num_train" if error else None,
    )  # fmt: skip


def converged_within(rows: Sequence[Mapping[str, Any]], fr: Any) -> dict[Any, int]:
    """Budget -> analysed models that converged within it (the outcome, not an axis).

    A model's budget is the smallest step budget at which its run reached the threshold.
    """
    axes = _axes(rows)
    first: dict[tuple, Any] = {}
    for r in rows:
        if r.get("reached") and r.get(OUTCOME) is not None:
            key = (r.get("family"), r.get("seed"), *(r.get(a) for a in axes))
            first[key] = min(first.get(key, r[OUTCOME]), r[OUTCOME])
    counts: dict[Any, int] = {}
    for i in fr.rows:
        r = rows[i]
        b = first.get((r.get("family"), r.get("seed"), *(r.get(a) for a in axes)))
        counts[b] = counts.get(b, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0])))


def run_studies(
    rows: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    *,
    num_resamples: int,
    num_null_draws: int,
    confidence: float,
) -> dict[str, Any]:
    """The loss-gap study (``"loss"``) and the error-gap study (``"error"``) of the rows."""
    loss_t = _table(rows, names, error=False)
    error_t = _table(rows, names, error=True)
    common = {"num_resamples": num_resamples, "num_null_draws": num_null_draws,
              "confidence": confidence}  # fmt: skip
    return {
        "loss": st.analyze(loss_t, **common),
        "error": st.analyze(
            error_t, **common, cmi_max_size=-1, sign_error_num_test=(ANCHOR_NUM_TEST,)
        ),
        "loss_table": loss_t,
        "rows": rows,
    }


def _interval(fr: Any, opts: Mapping[str, Any], values: Any) -> bootstrap.Interval:
    """The two-way bootstrap interval of a statistic's values over the family's resamples."""
    return bootstrap.interval(values, fr.resamples, confidence=opts["confidence"])


def _distinct(names: Sequence[str], table: Any, fr: Any) -> list[str]:
    """``names`` without the measures that rank the family's models as an earlier one does.

    Kendall's tau 1 between two measures: the same pairs ordered, the same pairs tied.
    """
    idx = np.asarray(fr.rows)
    kept: list[tuple[str, np.ndarray]] = []
    for n in names:
        v = table.measures[n][idx]
        s = ranking.signs(np.where(np.isfinite(v), v, np.nan))
        if not any(np.array_equal(s, t) for _, t in kept):
            kept.append((n, s))
    return [n for n, _ in kept]


def _verdict(iv: bootstrap.Interval, threshold: float = 0.0) -> bool | None:
    if math.isnan(iv.low):
        return None
    if iv.low > threshold:
        return True
    if iv.high < threshold:
        return False
    return None


def _f(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.{digits}f}"


def _group_psi(fr: Any, names: Sequence[str]) -> tuple[float, np.ndarray]:
    """Mean Psi of ``names`` and its value in every resample (NaN-skipping)."""
    w = fr.resamples.weights
    values = np.array([fr.measures[n].psi.resampled(w) for n in names])
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        resampled = np.nanmean(values, axis=0)
    return float(np.mean([fr.measures[n].psi.psi for n in names])), resampled


def _claim_rank_best(fr, opts, kinds, table) -> tuple[bool | None, str]:
    ms = {n: m for n, m in fr.measures.items() if math.isfinite(m.psi.psi)}
    group = _distinct([n for n in ms if kinds[n] in ("sharpness", "pac-bayes")], table, fr)
    rest = _distinct([n for n in ms if kinds[n] in ("norm", "bound")], table, fr)
    if not group or not rest:
        return None, "Psi undefined for one of the two groups"
    a, ra = _group_psi(fr, group)
    b, rb = _group_psi(fr, rest)
    iv = _interval(fr, opts, ra - rb)
    twins = [n for n in ms if kinds[n] in ("sharpness", "pac-bayes", "norm", "bound")
             and n not in group and n not in rest]  # fmt: skip
    top = sorted(ms, key=lambda n: -ms[n].psi.psi)[:3]
    return _verdict(iv), (
        f"mean Psi of {len(group)} sharpness and PAC-Bayes measures minus that of {len(rest)} "
        f"norm and bound measures {_f(a - b)}, interval {iv.format()}"
        + (f" ({', '.join(twins)} counted with the measure that ranks identically)"
           if twins else "")
        + "; top three by Psi: "
        + ", ".join(f"{n} ({kinds[n]}, {_f(ms[n].psi.psi)})" for n in top)
    )  # fmt: skip


def _claim_magnitude(fr, opts, kinds, table) -> tuple[bool | None, str]:
    mag = "pacbayes_mag_flatness"
    ms = {n: m for n, m in fr.measures.items() if math.isfinite(m.psi.psi)}
    if mag not in ms or len(ms) < 2:
        return None, f"Psi of {mag} undefined"
    best = max((n for n in ms if n != mag), key=lambda n: ms[n].psi.psi)
    rank = 1 + sum(ms[n].psi.psi > ms[mag].psi.psi for n in ms)
    w = fr.resamples.weights
    iv = _interval(fr, opts, ms[mag].psi.resampled(w) - ms[best].psi.resampled(w))
    ok = None if math.isnan(iv.low) else iv.high >= 0
    return ok, (
        f"{mag} ranks {rank} of {len(ms)} by Psi ({_f(ms[mag].psi.psi)}); the best other, "
        f"{best}, {_f(ms[best].psi.psi)}; difference interval {iv.format()}"
    )


def _claim_norm_products(fr, opts, kinds, table) -> tuple[bool | None, str]:
    prods = ["log_prod_frobenius", "log_prod_spectral"]
    ivs = [fr.measures[n].tau_interval for n in prods]
    if any(math.isnan(iv.low) for iv in ivs):
        return None, "tau interval undefined"
    if all(iv.high < 0 for iv in ivs):
        ok: bool | None = True
    elif any(iv.low > 0 for iv in ivs):
        ok = False
    else:
        ok = None
    return ok, "; ".join(
        f"{n}: tau {_f(fr.measures[n].tau.tau)} {iv.format()}, Psi {_f(fr.measures[n].psi.psi)}"
        for n, iv in zip(prods, ivs, strict=True)
    )


def _adaptive(fr: Any, kinds: Mapping[str, str]) -> list[str]:
    return [n for n in fr.measures if kinds[n] == "sharpness" and n.startswith(ADAPTIVE)]


def _claim_sharpness_weak(fr, opts, kinds, table) -> tuple[bool | None, str]:
    sharp = _adaptive(fr, kinds)
    ivs = {n: fr.measures[n].tau_interval for n in sharp}
    if not sharp or any(math.isnan(iv.low) for iv in ivs.values()):
        return None, "tau interval undefined"
    if all(iv.high < WEAK_TAU for iv in ivs.values()):
        ok: bool | None = True
    elif any(iv.low > WEAK_TAU for iv in ivs.values()):
        ok = False
    else:
        ok = None
    return ok, ", ".join(f"{n} {_f(fr.measures[n].tau.tau)} {iv.format()}"
                         for n, iv in ivs.items())  # fmt: skip


def _claim_learning_rate(fr, opts, kinds, table) -> tuple[bool | None, str]:
    axis = _lr_axis(fr.axes)
    if axis is None:
        return None, "no learning-rate axis"
    idx = np.asarray(fr.rows)
    lr = np.array([float(table.settings[axis][i]) for i in idx])
    configs = [table.config(int(i)) for i in idx]
    seeds = [table.seed[int(i)] for i in idx]
    votes, parts = [], []
    w = fr.resamples.weights
    for n in _adaptive(fr, kinds):
        mu = table.measures[n][idx]
        keep = np.flatnonzero(np.isfinite(mu))
        if keep.size < 2:
            continue
        cfg = [configs[k] for k in keep]
        sd = [seeds[k] for k in keep]
        groups = ranking.psi_groups(cfg, sd, list(table.axes))
        only = {axis: groups[axis]}
        with_lr = ranking.granulated_psi(mu[keep], lr[keep], only, sd, index=keep)
        with_gap = ranking.granulated_psi(mu[keep], table.gap[idx][keep], only, sd, index=keep)
        iv = _interval(fr, opts, np.abs(with_lr.resampled(w)) - np.abs(with_gap.resampled(w)))
        votes.append(_verdict(iv))
        parts.append(f"{n} {_f(with_lr.psi)} vs {_f(with_gap.psi)} {iv.format()}")
    if not votes:
        return None, "no adaptive sharpness measure"
    yes, no = votes.count(True), votes.count(False)
    ok = True if yes > len(votes) / 2 else False if no > len(votes) / 2 else None
    return ok, (f"psi with the learning rate vs with the gap, interval of the difference of "
                f"their sizes: {'; '.join(parts)} ({yes} above 0, {no} below 0 of "
                f"{len(votes)})")  # fmt: skip


def _failing(fr: Any, n: int | None) -> dict[str, float]:
    """Measure -> its largest sign error (at the test size, or at ``n`` test examples)."""
    out = {}
    for name, m in fr.measures.items():
        se = m.sign_error if n is None else m.sign_error_at.get(n)
        if se is not None and math.isfinite(se.worst):
            out[name] = se.worst
    return out


def _null_worst(fr: Any, kind: str, n: int | None) -> float:
    nb = fr.nulls.get(kind)
    key = "sign_error_worst" if n is None else f"sign_error_worst@{n}"
    s = None if nb is None else nb.stats.get(key)
    return math.nan if s is None else s.median


def _sign_error_text(fr: Any, n: int | None) -> str:
    worst = _failing(fr, n)
    where = "at the test size" if n is None else f"at n = {n}"
    nulls = (f"gap plus noise {_f(_null_worst(fr, 'gap+noise', n))}, size-adjusted random "
             f"positive measure {_f(_null_worst(fr, 'random', n))} (medians), size-adjusted "
             f"constant {_f(_null_worst(fr, 'constant', n))}")  # fmt: skip
    if not worst:
        return f"{where}: no environment kept; {nulls}"
    failing = sum(v >= FAIL_ERROR for v in worst.values())
    least = min(worst, key=worst.get)
    return (f"{where}: largest sign error at least {FAIL_ERROR} for {failing} of {len(worst)} "
            f"measures (least: {least} {worst[least]:.3f}); {nulls}")  # fmt: skip


def _claim_every_fails(fr, opts, kinds) -> tuple[bool | str | None, str]:
    worst = _failing(fr, None)
    text = (f"{_sign_error_text(fr, None)}; {_sign_error_text(fr, ANCHOR_NUM_TEST)}; the "
            "verdict uses the test size: the Hoeffding weights say which gap differences the "
            "test set resolves, and n = 10000 (the anchors' code, their test-set size) "
            "weighs differences our test set does not resolve")  # fmt: skip
    if not worst:
        return None, f"no environment has an effective sample size >= 12; {text}"
    constant = _null_worst(fr, "constant", None)
    if math.isfinite(constant) and constant < FAIL_ERROR:
        return "not testable", (f"not testable on this family: the size-adjusted constant "
                                f"measure's largest sign error is {constant:.3f}, below "
                                f"{FAIL_ERROR}; {text}")  # fmt: skip
    noise = _null_worst(fr, "gap+noise", None)
    if not math.isfinite(noise) or noise >= FAIL_ERROR:
        return None, text
    return all(v >= FAIL_ERROR for v in worst.values()), text


_CLAIMS = (_claim_rank_best, _claim_magnitude, _claim_norm_products, _claim_sharpness_weak,
           None, _claim_every_fails)  # fmt: skip


def claim_lines(
    studies: Mapping[str, Any],
    claims: Sequence[str],
    kinds: Mapping[str, str],
    small: bool,
) -> list[str]:
    """One verdict line per claim and family, the rule beside it."""
    from jaxbounds.experiments import runner

    loss, error = studies["loss"], studies["error"]
    lines = []
    for k, (claim, rule) in enumerate(zip(claims, RULES, strict=True)):
        for family, fr in loss.families.items():
            if k == 5:
                ok, evidence = _claim_every_fails(error.families[family], error.options, kinds)
            elif k == 4:
                ok, evidence = _claim_learning_rate(fr, loss.options, kinds,
                                                    studies["loss_table"])  # fmt: skip
            else:
                ok, evidence = _CLAIMS[k](fr, loss.options, kinds, studies["loss_table"])
            evidence = f"{evidence}; rule: {rule}"
            text = f"[{family}] {claim}"
            if small:
                lines.append(f"- **not tested at this scale**: {text} ({evidence})")
            elif ok == "not testable":
                lines.append(f"- **not testable on this family**: {text} ({evidence})")
            else:
                lines.append(runner.claim_line(text, ok, evidence))
    return lines
