"""The report of the tt-sequence-length reproduction: trend tests, claims, tables, figures.

Its rows come from :func:`jaxbounds.experiments.tt_sequence_length.run_batch`: per sequence
length they are summarised with their spread over seeds, tested for trends (Kendall's tau),
compared with the claims of :mod:`._tt_design`, and drawn.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale
from jaxbounds.experiments._tt_design import (
    _ALPHA,
    _PLATEAU_BAND,
    CLAIMS,
    EPOCH_CHOICE,
    SCALES,
    _budget,
    _plateau_line,
    _split_rows,
)

# ------------------------------------------------------------------------------------ render

#: Figure file -> (column, axis label, paper's figure).
FIGURES = {
    "figure1_l1_norm.png": ("l1_norm", "total l1 norm of the weights", "Figure 1"),
    "figure2_gen_gap.png": ("gen_gap", "generalization gap (cross-entropy)", "Figure 2"),
    "figure3_val_accuracy.png": ("val_accuracy", "validation accuracy", "Figure 3"),
}


def per_length(rows: Sequence[Mapping[str, Any]], column: str) -> dict[int, list[float]]:
    """``{T: [value of column per seed]}`` in increasing T (rows with a missing value skipped).

    >>> per_length([{"seq_len": 40, "x": 1.0}, {"seq_len": 20, "x": 2.0}], "x")
    {20: [2.0], 40: [1.0]}
    """
    out: dict[int, list[float]] = {}
    for row in rows:
        if row.get(column) is not None:
            out.setdefault(int(row["seq_len"]), []).append(float(row[column]))
    return dict(sorted(out.items()))


def statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The numbers behind the claims of ``report.md`` (also written to ``statistics.json``).

    Per quantity: the max and mean over seeds per T, Kendall's tau of the per-T max against T
    (the paper's statistic) and of every unit's value against T.
    """
    out: dict[str, Any] = {}
    for column in ("l1_norm", "gen_gap", "val_accuracy", "edelman_cover", "tt42_cover",
                   "tt_rad", "edelman_rad", "rad_search"):  # fmt: skip
        groups = per_length(rows, column)
        lengths = list(groups)
        maxima = [max(v) for v in groups.values()]
        units_t = [t for t, v in groups.items() for _ in v]
        units_v = [x for v in groups.values() for x in v]
        out[column] = {
            "T": lengths,
            "max": maxima,
            "mean": [float(np.mean(v)) for v in groups.values()],
            "std": [float(np.std(v, ddof=1)) if len(v) > 1 else math.nan for v in groups.values()],
            "tau_max": dataclasses.asdict(runner.kendall_tau(lengths, maxima)),
            "tau_units": dataclasses.asdict(runner.kendall_tau(units_t, units_v)),
        }
    ratio = per_length([{**r, "g": r["edelman_cover"] / r["edelman_cover_ref"]} for r in rows], "g")
    out["edelman_T_growth"] = {"T": list(ratio), "ratio": [float(np.mean(v)) for v in
                                                             ratio.values()]}  # fmt: skip
    acc = out["val_accuracy"]
    half = (len(acc["T"]) - 1) // 2
    out["plateau"] = {
        "T": acc["T"][half:],
        "range_of_max": float(np.ptp(acc["max"][half:])) if acc["max"] else math.nan,
        "band": _PLATEAU_BAND,
    }
    return out


def width_check_statistics(main: Sequence[Mapping[str, Any]],
                           check: Sequence[Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The width and budget check beside the main grid at the check's T.

    Per T of the check grid: max and mean ± std over seeds of the validation accuracy, the mean
    training accuracy and best epoch, for the check's runs and the main runs; the plateau
    criterion of the main claim applied to the check's runs (the per-T max over the longer half
    of its T within :data:`_PLATEAU_BAND`), and Kendall's tau of its per-T max against T.
    """
    out: dict[str, Any] = {"embed_dim": check[0]["embed_dim"], "num_epochs": check[0]["num_epochs"]}
    for name, rows in (("check", check), ("main", main)):
        acc, train_acc = per_length(rows, "val_accuracy"), per_length(rows, "train_accuracy")
        best = per_length(rows, "best_epoch")
        lengths = [t for t in per_length(check, "val_accuracy") if t in acc]
        out[name] = {
            "T": lengths,
            "max": [max(acc[t]) for t in lengths],
            "mean": [float(np.mean(acc[t])) for t in lengths],
            "std": [float(np.std(acc[t], ddof=1)) if len(acc[t]) > 1 else math.nan
                    for t in lengths],
            "train_accuracy": [float(np.mean(train_acc[t])) for t in lengths],
            "best_epoch": [float(np.mean(best[t])) for t in lengths],
        }  # fmt: skip
    c = out["check"]
    half = (len(c["T"]) - 1) // 2
    out["plateau"] = {"T": c["T"][half:], "range_of_max": float(np.ptp(c["max"][half:])),
                      "band": _PLATEAU_BAND}  # fmt: skip
    out["tau_max"] = dataclasses.asdict(runner.kendall_tau(c["T"], c["max"]))
    return out


def _tau_text(tau: Mapping[str, Any]) -> str:
    return str(runner.KendallTau(**tau))


def _increasing(tau: Mapping[str, Any]) -> bool:
    return bool(tau["tau"] > 0 and tau["p_value"] < _ALPHA)


def _trend_claim(claim: str, stats: Mapping[str, Any], what: str) -> str:
    """No increasing trend of the per-T max: verdict from its Kendall tau.

    The per-unit tau (more pairs, more power) makes it inconclusive when only it is
    significantly increasing.
    """
    by_max, by_unit = stats["tau_max"], stats["tau_units"]
    verdict: bool | None = not _increasing(by_max)
    if verdict and _increasing(by_unit):
        verdict = None
    maxima = ", ".join(f"{t}: {runner.format_number(v, 3)}" for t, v in
                       zip(stats["T"], stats["max"], strict=True))  # fmt: skip
    evidence = (
        f"max {what} per T {{{maxima}}}; over the per-T maxima {_tau_text(by_max)}; over all "
        f"units {_tau_text(by_unit)}"
    )
    return runner.claim_line(claim, verdict, evidence)


def _plateau_parts(
    plateau: Mapping[str, Any], per_t: Mapping[str, Any], embed_dim: int, num_epochs: int
) -> tuple[bool, bool, str, str]:
    """``(plateau held, the paper's budget reached, budget text, per-T maxima)`` of a verdict."""
    ok = bool(plateau["range_of_max"] <= plateau["band"])
    full, budget = _budget(embed_dim, num_epochs)
    maxima = ", ".join(f"{t}: {v:.3f}" for t, v in zip(per_t["T"], per_t["max"], strict=True))
    return ok, full, budget, maxima


def _plateau_claim(stats: Mapping[str, Any], grid: Mapping[str, Any]) -> str:
    plateau, acc = stats["plateau"], stats["val_accuracy"]
    ok, full, budget, maxima = _plateau_parts(plateau, acc, grid["embed_dim"], grid["num_epochs"])
    evidence = (
        f"max validation accuracy per T {{{maxima}}}; over the longer half of the grid "
        f"T = {plateau['T']} it spans {plateau['range_of_max']:.3f} (plateau: within "
        f"{plateau['band']}); over all T the per-T max has {_tau_text(acc['tau_max'])}"
    )
    return _plateau_line(CLAIMS[2], ok, full, budget, evidence)


def _width_claim(check: Mapping[str, Any]) -> str:
    """The plateau claim again, on the wider model trained longer."""
    plateau = check["plateau"]
    ok, full, budget, maxima = _plateau_parts(
        plateau, check["check"], check["embed_dim"], check["num_epochs"]
    )
    evidence = (
        f"d = {check['embed_dim']}, {check['num_epochs']} epochs: max validation accuracy per T "
        f"{{{maxima}}}; over the longer half T = {plateau['T']} it spans "
        f"{plateau['range_of_max']:.3f} (plateau: within {plateau['band']}); the per-T max has "
        f"{_tau_text(check['tau_max'])}"
    )
    claim = f"{CLAIMS[2].rstrip('.')}: width and budget check"
    return _plateau_line(claim, ok, full, budget, evidence)


def _width_table(check: Mapping[str, Any], grid: Mapping[str, Any]) -> str:
    c, m = check["check"], check["main"]
    table = []
    for t in c["T"]:
        cells = [t]
        for part in (m, c):
            if t in part["T"]:
                j = part["T"].index(t)
                cells += [part["max"][j], runner.format_mean_std(part["mean"][j], part["std"][j]),
                          part["train_accuracy"][j], part["best_epoch"][j]]  # fmt: skip
            else:
                cells += ["", "", "", ""]
        table.append(cells)
    d0, e0, d1, e1 = grid["embed_dim"], grid["num_epochs"], check["embed_dim"], check["num_epochs"]
    header = ["T"] + [f"{h} (d = {d}, {e} ep.)" for d, e in ((d0, e0), (d1, e1)) for h in
                      ("max val. acc.", "val. acc.", "train acc.", "best epoch")]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header), digits=3)


def _bound_claim(stats: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    growth = stats["edelman_T_growth"]
    ratios = growth["ratio"]
    monotone = all(b > a for a, b in itertools.pairwise(ratios)) and ratios[-1] > 1
    saturated = sum(bool(r["edelman_dudley_saturated"]) for r in rows)
    ed, tt = stats["edelman_cover"], stats["tt42_cover"]
    evidence = (
        f"on the same weights, the Edelman log cover at T over the one at T = "
        f"{rows[0]['edelman_ref_T']} is "
        + ", ".join(f"{t}: {v:.3f}" for t, v in zip(growth["T"], ratios, strict=True))
        + " (the log(d m T) factor alone), while the T&T covers take no T; across trained "
        f"units the measured Edelman cover has {_tau_text(ed['tau_units'])} and the T&T "
        f"Corollary 4.2.1 cover {_tau_text(tt['tau_units'])} (norms move both); the Edelman "
        f"Dudley bound is saturated at its trivial branch 4 ||w||_2 in {saturated} of "
        f"{len(rows)} units, where T no longer shows in the Rademacher value"
    )
    return runner.claim_line(CLAIMS[3], monotone, evidence)


def _spread(values: Sequence[float]) -> str:
    return runner.mean_spread(values).format(3)


def _results_table(rows: Sequence[Mapping[str, Any]]) -> str:
    cols = ("l1_norm", "gen_gap", "val_accuracy", "best_epoch", "train_accuracy")
    groups = {c: per_length(rows, c) for c in cols}
    rise = per_length([{**r, "rise": r["final_val_loss"] - r["val_loss"]} for r in rows], "rise")
    table = []
    for t in groups["l1_norm"]:
        cells = [t, len(groups["l1_norm"][t])]
        for c in cols[:3]:
            cells += [max(groups[c][t]), _spread(groups[c][t])]
        cells += [_spread(groups[c][t]) for c in cols[3:]] + [_spread(rise[t])]
        table.append(cells)
    header = [
        "T", "runs", "max l1 norm", "l1 norm", "max gen. gap", "gen. gap", "max val. acc.",
        "val. acc.", "best epoch", "train acc.", "val. loss rise after best",
    ]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header), digits=4)


def _status_cell(values: Sequence[float], statuses: Sequence[str]) -> str:
    if any(s == "NOT_VALID" for s in statuses):
        return f"not valid ({sum(s == 'NOT_VALID' for s in statuses)}/{len(statuses)})"
    kinds = sorted({"vacuous" if s == "VACUOUS" else "non-vacuous" for s in statuses})
    return f"{_spread(values)} ({', '.join(kinds)})"


def _bounds_table(rows: Sequence[Mapping[str, Any]]) -> str:
    by_t = runner.group_rows(rows, ["seq_len"])
    table = []
    for (t,), group in sorted(by_t.items()):
        col = lambda c, g=group: [r[c] for r in g]  # noqa: E731
        table.append([
            t, _spread(col("gen_gap")),
            _status_cell(col("tt_rad"), col("tt_rad_status")),
            _status_cell(col("tt_gap_bound"), col("tt_gap_bound_status")),
            _spread(col("tt42_cover")),
            _spread(col("edelman_cover")),
            _status_cell(col("edelman_rad"), col("edelman_rad_status")),
            _status_cell(col("edelman_gap_bound"), col("edelman_gap_bound_status")),
            _spread(col("rad_search")), _spread(col("rad_search_lower")),
        ])  # fmt: skip
    header = [
        "T", "measured gap", "T&T Thm 4.1 Rad", "T&T gap bound", "T&T Cor 4.2.1 cover C",
        "Edelman cover C", "Edelman Rad (Dudley)", "Edelman gap bound", "Rad lower (search)",
        "its McDiarmid lower end",
    ]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header), digits=4)


def _settings(meta: Mapping[str, Any]) -> list[str]:
    g = meta["config_grid"]
    return [
        f"Scale `{meta['scale']}`, seeds {meta['seeds']} ({meta['num_finished']} of "
        f"{meta['num_units']} units). T = {g['seq_len']}, |I| = {g['sparsity']}, "
        f"{g['num_train']} training and {g['num_val']} validation sequences, d = "
        f"{g['embed_dim']}, {g['num_heads']} heads, Adam (learning rate {g['learning_rate']}), "
        f"batch {g['batch_size']}, {g['num_epochs']} epochs, validation every "
        f"{g['eval_every']} epochs; the best epoch is the one of lowest validation loss. The "
        "paper: 10000 validation sequences, d = 64, 200000 epochs.",
        "",
        EPOCH_CHOICE.get(meta["scale"], ""),
        "",
        "Model: the one-layer Transformer of the theory (jaxbounds.models.ScalarTransformer: "
        "summed heads, row projections onto the unit ball, ReLU, no biases or residuals, [CLS] "
        "readout to 2 logits), not TensorFlow's MultiHeadAttention that the paper trained. "
        f"Rademacher search: {g['rad_draws']} sign vectors, {g['rad_steps']} projected ascent "
        "steps. Bounds use the hidden constant 1 of their O(.) and delta = "
        f"{g['delta']}.",
    ]


def _reading(rows: Sequence[Mapping[str, Any]], stats: Mapping[str, Any]) -> list[str]:
    """Remarks from the numbers: how much the runs fit, and what the Rademacher search says."""
    train = per_length(rows, "train_accuracy")
    gap, rad = stats["gen_gap"], stats["rad_search"]
    (t0, a0), (t1, a1) = next(iter(train.items())), list(train.items())[-1]
    below = sum(r["rad_search"] <= r["tt_rad"] for r in rows)
    return [
        "## Reading", "",
        f"- Training accuracy at the best epoch falls from {_spread(a0)} (T = {t0}) to "
        f"{_spread(a1)} (T = {t1}): at this scale the longer sequences are fitted less, so a "
        "gap that does not grow (or shrinks) with T comes with less learning, not only with "
        "better generalization.",
        "- The Rademacher search (a Monte Carlo lower bound, standard error about "
        f"{np.mean([r['rad_search_stderr'] for r in rows]):.2g}) finds, on the training "
        f"sequences, an empirical Rademacher complexity of at least {min(rad['mean']):.3g} to "
        f"{max(rad['mean']):.3g} (mean per T) for the class of the T&T Theorem 4.1 bound "
        "(every matrix in the ball of its trained norm): any bound through that class's "
        "complexity exceeds twice this, "
        f"while the measured gaps are {min(gap['mean']):.3g} to {max(gap['mean']):.3g}. The "
        f"search lies below the T&T bound in {below} of {len(rows)} units, as it must if that "
        "bound (hidden constant 1) holds.",
    ]  # fmt: skip


def _width_section(stats: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
    """The width and budget check: its table (nothing when the scale has no check)."""
    if "width_check" not in stats:
        return []
    check, grid = stats["width_check"], meta["config_grid"]
    return [
        "## Width and budget check: a wider model trained longer, still far below the paper's "
        "budget", "",
        f"The same experiment at T = {check['check']['T']} with d = {check['embed_dim']} (the "
        f"main grid: {grid['embed_dim']}) and {check['num_epochs']} epochs (main: "
        f"{grid['num_epochs']}), other settings and seeds unchanged; mean ± std over runs at "
        "the best epoch (lowest validation loss). The paper trained d = "
        f"{SCALES['paper']['embed_dim']} for {SCALES['paper']['num_epochs']:,} epochs, "
        f"{SCALES['paper']['num_epochs'] // check['num_epochs']}x this check's budget: the "
        "check shows how the accuracy moves with width and epochs here, not what it does at "
        "the paper's budget.", "",
        _width_table(check, grid), "",
    ]  # fmt: skip


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict) -> str:
    lines = [
        f"# {meta['experiment']}: {meta['paper']}", "", meta["description"], "",
        *_settings(meta), "",
        "## Figures 1-3: our runs beside the paper's trends", "",
        "The paper prints no numbers for these figures, only their trends (last row); ours are "
        "the max over runs per T (the paper's statistic) and mean ± std over runs.", "",
        _results_table(rows).rstrip("\n"),
        "| paper | 5 | no increasing trend | | no discernible trend | | plateaus | | | | |",
        "",
        "![Figure 1](figure1_l1_norm.png) ![Figure 2](figure2_gen_gap.png) "
        "![Figure 3](figure3_val_accuracy.png)", "",
        "## Bounds on the same weights (mean ± std over runs, with status)", "",
        _bounds_table(rows), "",
        "![bounds](figure4_bounds.png)", "",
        "## Claims", "",
        *claims_at_scale([
            _trend_claim(CLAIMS[0], stats["gen_gap"], "gap"),
            _trend_claim(CLAIMS[1], stats["l1_norm"], "l1 norm"),
            _plateau_claim(stats, meta["config_grid"]),
            *([_width_claim(stats["width_check"])] if "width_check" in stats else []),
            _bound_claim(stats, rows),
        ], meta["scale"]), "",
        *_width_section(stats, meta),
        *_reading(rows, stats),
    ]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def _trend_figure(rows: Sequence[Mapping[str, Any]], column: str, label: str, title: str):
    figure = runner.new_figure(figsize=(4.2, 3.0))
    if figure is None:
        return None
    ax = figure.add_subplot()
    groups = per_length(rows, column)
    lengths = list(groups)
    for t, values in groups.items():
        ax.plot([t] * len(values), values, ".", color="0.7", zorder=1)
    stats = [runner.mean_spread(v) for v in groups.values()]
    ax.errorbar(lengths, [s.mean for s in stats], yerr=[np.nan_to_num(s.std) for s in stats],
                fmt="s--", color="tab:blue", capsize=3, label="mean ± std")  # fmt: skip
    ax.plot(lengths, [max(v) for v in groups.values()], "o-", color="tab:red",
            label="max over runs (paper)")  # fmt: skip
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return figure


def _band(ax, rows: Sequence[Mapping[str, Any]], column: str, label: str, style: str = "o-"):
    """Mean over runs per T with the min-max band of the runs (log-axis safe)."""
    groups = per_length(rows, column)
    lengths = list(groups)
    (line,) = ax.plot(lengths, [np.mean(v) for v in groups.values()], style, label=label)
    ax.fill_between(lengths, [min(v) for v in groups.values()], [max(v) for v in
                    groups.values()], color=line.get_color(), alpha=0.15)  # fmt: skip
    return line


def _bounds_figure(rows: Sequence[Mapping[str, Any]]):
    figure = runner.new_figure(figsize=(8.8, 3.4))
    if figure is None:
        return None
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    ed = _band(left, rows, "edelman_cover", "Edelman cover C (log dmT)")
    tt = _band(left, rows, "tt42_cover", "T&T Cor. 4.2.1 cover C")
    # The same weights moved along T: the first T's runs, their covers at every T of the grid.
    lengths = list(per_length(rows, "edelman_cover"))
    first = [r for r in rows if r["seq_len"] == lengths[0]]
    d, m = first[0]["embed_dim"], first[0]["num_train"]
    ref = np.mean([r["edelman_cover"] / r["edelman_log_factor"] for r in first])
    left.plot(
        lengths,
        [ref * math.log(d * m * (t + 1)) for t in lengths],
        "--",
        color=ed.get_color(),
        label=f"Edelman, T = {lengths[0]} weights at every T",
    )
    left.plot(
        lengths,
        [np.mean([r["tt42_cover"] for r in first])] * len(lengths),
        "--",
        color=tt.get_color(),
        label=f"T&T, T = {lengths[0]} weights at every T",
    )
    for column, label in (("tt_rad", "T&T Thm 4.1 Rad bound"),
                          ("edelman_rad", "Edelman Rad (Dudley)"),
                          ("rad_search", "Rad lower bound (search)"),
                          ("gen_gap", "measured gap")):  # fmt: skip
        _band(right, rows, column, label)
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.legend(fontsize=6)
    left.set_title("log covering coefficients (mean, min-max band)", fontsize=9)
    right.set_title("Rademacher bounds vs measured gap (mean, min-max)", fontsize=9)
    return figure


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """Figures 1-3 analogues, the bounds figure, ``statistics.json`` and ``report.md``.

    Figures, tables and the paper's claims use the main grid; the width check has its own
    table and claim line.
    """
    rows, check = _split_rows(rows, meta["config_grid"])
    figures = {
        name: _trend_figure(rows, column, label, f"{paper_figure} analogue ({meta['scale']})")
        for name, (column, label, paper_figure) in FIGURES.items()
    }
    figures["figure4_bounds.png"] = _bounds_figure(rows)
    stats = statistics(rows)
    if check:
        stats["width_check"] = width_check_statistics(rows, check)
    runner.write_rendered(out_dir, figures, stats, _report(rows, meta, stats))
