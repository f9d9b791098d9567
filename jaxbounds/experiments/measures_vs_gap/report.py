"""The report, ``measures.csv`` and ``statistics.json`` of ``measures-vs-gap`` (per family)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxbounds.experiments import runner
from jaxbounds.experiments.measures_vs_gap import study as _mvg_study
from jaxbounds.study.report import _band, _f, _u, as_json

__all__ = ["family_sections", "measures_csv", "public_statistics", "tau_psi_figure"]

_SHORT = {"learning_rate": "lr", "batch_size": "batch", "width": "width", "num_train": "N",
          "seq_len": "T", "max_steps": "budget", "weight_decay": "wd", "optimizer": "opt",
          "lr_scale": "lr"}  # fmt: skip


def _differ(axes: Sequence[str]) -> str:
    return f" (identical runs that differ only in {', '.join(axes)})" if axes else ""


def _budget_text(studies: Mapping[str, Any], fr: Any) -> str:
    """The step budget within which the analysed models converged: an outcome, not an axis."""
    counts = _mvg_study.converged_within(studies["rows"], fr)
    if len(counts) < 2:
        return ""
    parts = ", ".join(f"{b}: {c}" for b, c in counts.items())
    return (f" Step budget (recorded as an outcome, not an axis): the analysed models reached "
            f"the threshold within {parts} steps.")  # fmt: skip


def _null_rows(fr: Any, er: Any) -> list[list[str]]:
    n = _mvg_study.ANCHOR_NUM_TEST
    rows = []
    for kind, label in (("random", "null: random measure"), ("gap+noise", "null: gap + noise"),
                        ("constant", "null: constant measure")):  # fmt: skip
        s = fr.nulls[kind].stats if kind in fr.nulls else {}
        e = er.nulls[kind].stats if kind in er.nulls else {}
        if not s and not e:
            continue
        cmi = " / ".join(_band(s[k], False) for k in ("cmi_0", "cmi_1", "cmi_2") if k in s)
        rows.append([f"*{label}*", "", str(fr.num_models),
                     "" if kind == "constant" else _band(s.get("tau")), "", "",
                     "" if kind == "constant" else _band(s.get("psi")), "",
                     "" if kind == "constant" else cmi, _band(e.get("sign_error_mean"), False),
                     "", _band(e.get("sign_error_worst"), False),
                     _band(e.get(f"sign_error_worst@{n}"), False), "", "", ""])  # fmt: skip
    return rows


def _sign(x: float) -> str:
    return "n/a" if not math.isfinite(x) else "+" if x > 0 else "-" if x < 0 else "0"


def _defined(family: str, specs: Sequence[Any]) -> list[Any]:
    return [s for s in specs if family in s.families]


def _ranked(fr: Any, specs: Sequence[Any]) -> list[Any]:
    def key(spec: Any) -> tuple:
        m = fr.measures[spec.name]
        psi = m.psi.psi if math.isfinite(m.psi.psi) else -math.inf
        tau = m.tau.tau if math.isfinite(m.tau.tau) else -math.inf
        return (-psi, -tau, spec.name)

    return sorted(_defined(fr.family, specs), key=key)


def _counts_text(studies: Mapping[str, Any], fr: Any) -> str:
    loss = studies["loss"]
    return (
        f"{fr.num_rows} models; {fr.num_capped} stopped at their step cap (reported apart); "
        f"{fr.num_duplicates} duplicate runs counted once"
        + (" (a run that reached the threshold within a smaller step budget is the same "
           "run at every larger one)" if fr.num_duplicates else "")
        + f"; **{fr.num_models} models analysed**, seeds "
        f"{', '.join(str(s) for s in fr.seeds)}; axes: "
        f"{', '.join(_SHORT.get(a, a) for a in fr.axes)}. Two-way bootstrap: "
        f"{loss.options['num_resamples']} resamples of the configurations and seeds."
        + _budget_text(studies, fr)
    )  # fmt: skip


def _measure_table(fr: Any, er: Any, specs: Sequence[Any], cost: Mapping[str, Any]) -> str:
    """The nulls, then every measure ranked by Psi: tau, Psi, CMI, sign error, cost."""
    header = ["measure", "kind", "n", "tau", "tau-b", "tau interval", "Psi",
              "Psi interval", "CMI 0 / 1 / 2 (tau's sign)", "sign err mean", "p90", "max",
              f"max at n = {_mvg_study.ANCHOR_NUM_TEST}", "envs", "s/model",
              "compile s"]  # fmt: skip
    table = _null_rows(fr, er)
    for spec in _ranked(fr, specs):
        m, se = fr.measures[spec.name], er.measures[spec.name].sign_error
        at = er.measures[spec.name].sign_error_at.get(_mvg_study.ANCHOR_NUM_TEST)
        cmi = m.cmi.by_size if m.cmi is not None else {}
        price = cost.get(spec.program, {})
        table.append([
            f"`{spec.name}`", spec.kind, str(m.num_models), _f(m.tau.tau), _f(m.tau.tau_b),
            m.tau_interval.format(2), _f(m.psi.psi), m.psi_interval.format(2),
            (" / ".join(_u(cmi.get(k)) for k in (0, 1, 2)) + f" ({_sign(m.tau.tau)})"
             if cmi else "n/a"),
            _u(se.mean), _u(se.p90), _u(se.worst), _u(at.worst if at else math.nan),
            str(se.num_environments),
            runner.format_number(price.get("seconds_per_model"), 2),
            runner.format_number(price.get("compile_seconds"), 2),
        ])  # fmt: skip
    return runner.markdown_table(header, table, align="llr" + "r" * 13)


def _per_axis_table(fr: Any, er: Any, specs: Sequence[Any]) -> str:
    header = ["measure", *[_SHORT.get(a, a) for a in fr.axes]]
    table = []
    for spec in _ranked(fr, specs):
        m, se = fr.measures[spec.name], er.measures[spec.name].sign_error
        cells = [f"`{spec.name}`"]
        for a in fr.axes:
            mean, _, top = se.axis_summary(a)
            cells.append(f"{_f(m.psi.per_axis.get(a), 2)}; {_u(mean, 2)} / {_u(top, 2)} "
                         f"({len(se.per_axis.get(a, ()))})")  # fmt: skip
        table.append(cells)
    return runner.markdown_table(header, table, align="l" + "r" * len(fr.axes))


def family_sections(studies: Mapping[str, Any], specs: Sequence[Any],
                    cost: Mapping[str, Any]) -> list[str]:  # fmt: skip
    """Per family: counts, null baselines, every measure's statistics, psi per axis."""
    loss, error = studies["loss"], studies["error"]
    lines: list[str] = []
    for family, fr in loss.families.items():
        er = error.families[family]
        lines += [f"## {family}", "", _counts_text(studies, fr), ""]
        lines += [_measure_table(fr, er, specs, cost), ""]
        lines += ["psi per axis; sign error mean / max over that axis's kept environments "
                  "(count):", "", _per_axis_table(fr, er, specs), ""]  # fmt: skip
        dropped = sum(next(iter(er.measures.values())).sign_error.num_dropped.values())
        lines += [f"Sign error environments dropped for an effective sample size below 12: "
                  f"{dropped} (of each measure's environments, the same for all).", ""]  # fmt: skip
        capped = [(s.name, fr.measures[s.name].tau_capped) for s in _defined(family, specs)
                  if fr.measures[s.name].tau_capped is not None]  # fmt: skip
        if capped:
            lines += [f"Capped models apart ({fr.num_capped}): tau "
                      + ", ".join(f"{n} {_f(t.tau)}" for n, t in capped), ""]  # fmt: skip
    pooled = [[f"`{s.name}`", _f(loss.pooled[s.name].tau), _f(loss.pooled[s.name].tau_b)]
              for s in specs if len(s.families) > 1]  # fmt: skip
    pooled_table = runner.markdown_table(["measure", "tau", "tau-b"], pooled, align="lrr")
    lines += ["## Pooled over both families (not a verdict)", "",
              "Kendall's tau over the analysed models of both families together. The families' "
              "gaps differ in scale, so a pooled coefficient can reverse the within-family ones "
              "(Simpson's paradox); no verdict uses it.", "",
              pooled_table, ""]  # fmt: skip
    return lines


def measures_csv(studies: Mapping[str, Any], specs: Sequence[Any],
                 cost: Mapping[str, Any]) -> str:  # fmt: skip
    """One row per family and measure: every statistic."""
    loss, error = studies["loss"], studies["error"]
    axes = list(_mvg_study.AXES)
    header = ["family", "measure", "kind", "num_models", "tau", "tau_b", "tau_p", "tau_low",
              "tau_high", "psi", "psi_low", "psi_high", *[f"psi[{a}]" for a in axes], "cmi_0",
              "cmi_1", "cmi_2", "sign_error_mean", "sign_error_p90", "sign_error_max",
              "sign_error_environments", "worst_environment", "sign_error_max_n10000",
              "tau_capped", "tau_pooled",
              "seconds_per_model", "compile_seconds"]  # fmt: skip
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for family, fr in loss.families.items():
        for spec in _ranked(fr, specs):
            m = fr.measures[spec.name]
            se = error.families[family].measures[spec.name].sign_error
            cmi = m.cmi.by_size if m.cmi is not None else {}
            price = cost.get(spec.program, {})
            cells = [family, spec.name, spec.kind, m.num_models, m.tau.tau, m.tau.tau_b,
                     m.tau.p_value, m.tau_interval.low, m.tau_interval.high, m.psi.psi,
                     m.psi_interval.low, m.psi_interval.high,
                     *[m.psi.per_axis.get(a, math.nan) for a in axes],
                     *[cmi.get(k, math.nan) for k in (0, 1, 2)], se.mean, se.p90, se.worst,
                     se.num_environments, se.worst_environment,
                     _at(error.families[family].measures[spec.name]),
                     m.tau_capped.tau if m.tau_capped is not None else math.nan,
                     loss.pooled[spec.name].tau, price.get("seconds_per_model"),
                     price.get("compile_seconds")]  # fmt: skip
            writer.writerow([_cell(c) for c in cells])
    return buffer.getvalue()


def _at(m: Any) -> float:
    at = m.sign_error_at.get(_mvg_study.ANCHOR_NUM_TEST)
    return math.nan if at is None else at.worst


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def public_statistics(studies: Mapping[str, Any]) -> dict[str, Any]:
    """The two studies as JSON values, without the per-group taus (measures.csv has the rest)."""
    out = {}
    for key in ("loss", "error"):
        data = as_json(studies[key])
        for fr in data["families"].values():
            for m in fr["measures"].values():
                m["psi"].pop("group_taus", None)
                m["psi"].pop("group_seeds", None)
        out[key] = data
    return out


def tau_psi_figure(studies: Mapping[str, Any], specs: Sequence[Any]) -> Any:
    """Tau and Psi per measure, one panel per family, with the random null's 95% range."""
    loss = studies["loss"]
    figure = runner.new_figure(figsize=(9.0, 7.5))
    if figure is None:
        return None
    for k, (family, fr) in enumerate(loss.families.items()):
        ax = figure.add_subplot(1, len(loss.families), k + 1)
        ranked = _ranked(fr, specs)[::-1]
        y = np.arange(len(ranked))
        tau = np.array([fr.measures[s.name].tau.tau for s in ranked])
        lo = np.array([fr.measures[s.name].tau_interval.low for s in ranked])
        hi = np.array([fr.measures[s.name].tau_interval.high for s in ranked])
        err = np.nan_to_num(np.vstack([tau - lo, hi - tau]), nan=0.0).clip(min=0)
        ax.errorbar(tau, y, xerr=err, fmt="o", ms=3, capsize=2, label="tau")
        ax.plot([fr.measures[s.name].psi.psi for s in ranked], y, "s", ms=3, label="Psi")
        s = fr.nulls["random"].stats["tau"]
        if math.isfinite(s.low):
            ax.axvspan(s.low, s.high, color="0.85", label="random measure (95%)")
        ax.axvline(0.0, color="0.6", lw=0.8)
        ax.set_yticks(y, [s.name for s in ranked], fontsize=6)
        ax.set_title(family, fontsize=9)
        ax.legend(fontsize=6)
    return figure
