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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxbounds import study as st
from jaxbounds.study import bootstrap, ranking

__all__ = ["RULES", "claim_lines", "run_studies"]

#: The axes of the results (None where a family has no such axis, or a run predates it). The
#: learning-rate axis is ``lr_scale`` (a multiple of each optimizer's base rate, so it is crossed
#: with ``optimizer``); ``learning_rate`` itself is an axis only of runs that predate it.
AXES = ("width", "num_train", "seq_len", "batch_size", "optimizer", "lr_scale",
        "learning_rate", "max_steps", "weight_decay")  # fmt: skip


def _axes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """:data:`AXES` for these rows: ``learning_rate`` only when no row has ``lr_scale``."""
    scaled = any(r.get("lr_scale") not in (None, "") for r in rows)
    return [a for a in AXES if not (scaled and a == "learning_rate")]


def _lr_axis(axes: Sequence[str]) -> str | None:
    """The learning-rate axis among ``axes``: ``lr_scale``, else ``learning_rate``."""
    return next((a for a in ("lr_scale", "learning_rate") if a in axes), None)


WEAK_TAU = 0.3
FAIL_ERROR = 0.5

#: The verdict rule of each claim (printed beside it).
RULES = (
    "reproduced if the seed-bootstrap interval of mean Psi(sharpness, PAC-Bayes) - mean "
    "Psi(norm, bound) lies above 0, not reproduced if below 0, inconclusive if it holds 0",
    "reproduced if the interval of Psi(pacbayes_mag_flatness) - Psi(best other measure) lies "
    "above 0, not reproduced if below 0, inconclusive if it holds 0",
    "reproduced if the tau intervals of log_prod_frobenius and log_prod_spectral both lie "
    "below 0, not reproduced if either lies above 0, inconclusive otherwise",
    f"reproduced if every sharpness measure's tau interval lies below {WEAK_TAU}, not "
    f"reproduced if one lies above {WEAK_TAU}, inconclusive otherwise",
    "on the learning-rate axis, per sharpness measure the interval of |psi with the learning "
    "rate| - |psi with the gap|; reproduced if most sharpness measures have it above 0, not "
    "reproduced if most have it below 0, inconclusive otherwise",
    f"reproduced if every measure's largest sign error is at least {FAIL_ERROR} while the gap "
    f"plus noise stays below {FAIL_ERROR} (median over its draws), not reproduced if a measure "
    f"stays below {FAIL_ERROR} there; inconclusive if no environment is kept or the gap plus "
    "noise itself fails",
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
        "error": st.analyze(error_t, **common, cmi_max_size=-1),
        "loss_table": loss_t,
    }


def _resamples(fr: Any, opts: Mapping[str, Any]) -> list[dict]:
    return bootstrap.seed_resamples(list(fr.seeds) or [0], num_resamples=opts["num_resamples"],
                                    rng_seed=opts["rng_seed"])  # fmt: skip


def _interval(fr: Any, opts: Mapping[str, Any], stat: Any) -> bootstrap.Interval:
    return bootstrap.seed_interval(list(fr.seeds), stat, _resamples(fr, opts),
                                   confidence=opts["confidence"])  # fmt: skip


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


def _claim_rank_best(fr, opts, kinds) -> tuple[bool | None, str]:
    ms = {n: m for n, m in fr.measures.items() if math.isfinite(m.psi.psi)}
    group = [n for n in ms if kinds[n] in ("sharpness", "pac-bayes")]
    rest = [n for n in ms if kinds[n] in ("norm", "bound")]
    if not group or not rest:
        return None, "Psi undefined for one of the two groups"

    def diff(counts: dict) -> float:
        a = [v for n in group if math.isfinite(v := ms[n].psi.resampled(counts))]
        b = [v for n in rest if math.isfinite(v := ms[n].psi.resampled(counts))]
        return float(np.mean(a) - np.mean(b)) if a and b else math.nan

    value = float(np.mean([ms[n].psi.psi for n in group]) - np.mean([ms[n].psi.psi
                                                                    for n in rest]))  # fmt: skip
    iv = _interval(fr, opts, diff)
    top = sorted(ms, key=lambda n: -ms[n].psi.psi)[:3]
    return _verdict(iv), (
        f"mean Psi of {len(group)} sharpness and PAC-Bayes measures minus that of {len(rest)} "
        f"norm and bound measures {_f(value)}, interval {iv.format()}; top three by Psi: "
        + ", ".join(f"{n} ({kinds[n]}, {_f(ms[n].psi.psi)})" for n in top)
    )


def _claim_magnitude(fr, opts, kinds) -> tuple[bool | None, str]:
    mag = "pacbayes_mag_flatness"
    ms = {n: m for n, m in fr.measures.items() if math.isfinite(m.psi.psi)}
    if mag not in ms or len(ms) < 2:
        return None, f"Psi of {mag} undefined"
    best = max((n for n in ms if n != mag), key=lambda n: ms[n].psi.psi)
    rank = 1 + sum(ms[n].psi.psi > ms[mag].psi.psi for n in ms)
    iv = _interval(fr, opts, lambda c: ms[mag].psi.resampled(c) - ms[best].psi.resampled(c))
    return _verdict(iv), (
        f"{mag} ranks {rank} of {len(ms)} by Psi ({_f(ms[mag].psi.psi)}); the best other, "
        f"{best}, {_f(ms[best].psi.psi)}; difference interval {iv.format()}"
    )


def _claim_norm_products(fr, opts, kinds) -> tuple[bool | None, str]:
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


def _claim_sharpness_weak(fr, opts, kinds) -> tuple[bool | None, str]:
    sharp = [n for n in fr.measures if kinds[n] == "sharpness"]
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
    for n in (n for n in fr.measures if kinds[n] == "sharpness"):
        mu = table.measures[n][idx]
        keep = np.flatnonzero(np.isfinite(mu))
        if keep.size < 2:
            continue
        cfg = [configs[k] for k in keep]
        sd = [seeds[k] for k in keep]
        groups = ranking.psi_groups(cfg, sd, list(table.axes))
        only = {axis: groups[axis]}
        with_lr = ranking.granulated_psi(mu[keep], lr[keep], only, sd)
        with_gap = ranking.granulated_psi(mu[keep], table.gap[idx][keep], only, sd)
        iv = _interval(fr, opts, lambda c, a=with_lr, b=with_gap:
                       abs(a.resampled(c)) - abs(b.resampled(c)))  # fmt: skip
        votes.append(_verdict(iv))
        parts.append(f"{n} {_f(with_lr.psi)} vs {_f(with_gap.psi)} {iv.format()}")
    if not votes:
        return None, "no sharpness measure"
    yes, no = votes.count(True), votes.count(False)
    ok = True if yes > len(votes) / 2 else False if no > len(votes) / 2 else None
    return ok, (f"psi with the learning rate vs with the gap, interval of the difference of "
                f"their sizes: {'; '.join(parts)} ({yes} above 0, {no} below 0 of "
                f"{len(votes)})")  # fmt: skip


def _claim_every_fails(fr, opts, kinds) -> tuple[bool | None, str]:
    worst = {n: m.sign_error.worst for n, m in fr.measures.items()
             if math.isfinite(m.sign_error.worst)}  # fmt: skip
    noise = fr.nulls["gap+noise"].stats.get("sign_error_worst")
    rand = fr.nulls["random"].stats.get("sign_error_worst")
    null_text = (f"gap plus noise: largest sign error {_f(noise.median)} (median over "
                 f"{len(noise.values)} draws); random measure {_f(rand.median)}"
                 if noise is not None and rand is not None else "no null")  # fmt: skip
    if not worst:
        return None, f"no environment has an effective sample size >= 12; {null_text}"
    failing = sum(v >= FAIL_ERROR for v in worst.values())
    least = min(worst, key=worst.get)
    text = (
        f"largest sign error at least {FAIL_ERROR} for {failing} of {len(worst)} measures "
        f"with a kept environment; least: {least} {worst[least]:.3f}; {null_text}"
    )
    if noise is None or not math.isfinite(noise.median) or noise.median >= FAIL_ERROR:
        return None, text
    return failing == len(worst), text


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
                ok, evidence = _CLAIMS[k](fr, loss.options, kinds)
            evidence = f"{evidence}; rule: {rule}"
            text = f"[{family}] {claim}"
            if small:
                lines.append(f"- **not tested at this scale**: {text} ({evidence})")
            else:
                lines.append(runner.claim_line(text, ok, evidence))
    return lines
