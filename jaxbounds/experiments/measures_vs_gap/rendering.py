"""The render of ``measures-vs-gap``: results.csv without timings, seconds.csv, the report."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxbounds.experiments import runner
from jaxbounds.experiments.measures_vs_gap import report as _mvg_render
from jaxbounds.experiments.measures_vs_gap import study as _mvg_study
from jaxbounds.experiments.measures_vs_gap.grid import (
    AXIS_KEYS,
    BOOTSTRAP_RESAMPLES,
    CLAIM_SOURCES,
    CLAIMS,
    CONFIDENCE,
    NAME,
    NULL_DRAWS,
)
from jaxbounds.experiments.measures_vs_gap.programs import measure_specs

# ------------------------------------------------------------------------------ statistics


def _is_timing(column: str) -> bool:
    return column.startswith(("seconds_", "compile_seconds_"))


def _values(rows: Sequence[Mapping[str, Any]], column: str) -> np.ndarray:
    return np.array([math.nan if r.get(column) is None else float(r[column]) for r in rows])


def measure_cost(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per measure program: the median run seconds per model and the total compile seconds.

    From the rows' ``seconds_<program>`` and ``compile_seconds_<program>`` columns (the unit
    files; results.csv has none); None where no row has the column.

    >>> measure_cost([{"seconds_norms": 0.1, "compile_seconds_norms": 0.0},
    ...               {"seconds_norms": 0.3, "compile_seconds_norms": 2.0},
    ...               {"seconds_norms": 0.2, "compile_seconds_norms": 0.0}])
    {'norms': {'seconds_per_model': 0.2, 'compile_seconds': 2.0}}
    """
    programs = dict.fromkeys(c.removeprefix("seconds_") for c in rows[0]
                             if c.startswith("seconds_"))  # fmt: skip
    out: dict[str, dict[str, float | None]] = {}
    for program in programs:
        run = _values(rows, f"seconds_{program}")
        comp = _values(rows, f"compile_seconds_{program}")
        out[program] = {
            "seconds_per_model": float(np.nanmedian(run)) if np.isfinite(run).any() else None,
            "compile_seconds": float(np.nansum(comp)) if np.isfinite(comp).any() else None,
        }
    return out


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def _paper_numbers_text(numbers: Mapping[str, Any]) -> list[str]:
    """The anchors' published statements checked against the papers, with where they are."""
    checked = [(v["paper"], c) for v in numbers.values() if isinstance(v, Mapping)
               for c in v.get("checked", ())]  # fmt: skip
    unchecked = sum(len(v.get("not_checked", ())) if isinstance(v, Mapping) else 1
                    for v in numbers.values())  # fmt: skip
    if not checked and not unchecked:
        return []
    lines = ["The anchors' published statements, as checked against the papers:", ""]
    lines += [f"- {paper}, {c['where']}: {c['statement']}." for paper, c in checked]
    if unchecked:
        lines += [f"- Not quoted: {unchecked} further statements (summary.json, "
                  "`paper_numbers`) that were not checked against the papers."]  # fmt: skip
    return [*lines, ""]


def _sources_text() -> list[str]:
    """Each claim's source: the anchor's sentence, or that the sentence is not available."""
    lines = ["Each claim as its anchor states it:", ""]
    for claim, source in zip(CLAIMS, CLAIM_SOURCES, strict=True):
        missing = ("the paper's own sentence is not available to this project (its text is not "
                   "among the papers the project holds); the claim is our paraphrase of its "
                   "results, not a quotation")  # fmt: skip
        lines.append(f"- {claim}: {source or missing}.")
    return [*lines, ""]


def _untested_axes(grid: Mapping[str, Any]) -> str:
    """Jiang et al.'s axes that no family of the grid varies (dropout and depth always)."""
    varied = {a for spec in grid["families"].values() for a, v in spec["axes"].items()
              if len(v) > 1}  # fmt: skip
    missing = ["dropout", "depth"]
    missing += [
        label
        for axis, label in (("optimizer", "optimizer"), ("weight_decay", "weight decay"))
        if axis not in varied
    ]
    return ", ".join(missing[:-1]) + " and " + missing[-1]


def _optimizer_text(spec: Mapping[str, Any]) -> str:
    """The optimizer of a family: fixed (a run before the optimizer axis) or its base rates."""
    base = spec.get("base_learning_rate")
    if not base:
        return str(spec["fixed"].get("optimizer"))
    rates = ", ".join(f"{name} {rate:g}" for name, rate in base.items())
    return f"learning rate = lr_scale x the optimizer's base rate ({rates})"


def _settings_text(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[str]:
    grid = meta["config_grid"]
    lines = [
        f"Scale `{meta['scale']}`, seeds {meta['seeds']} ({meta['num_finished']} of "
        f"{meta['num_units']} models).", "",
    ]  # fmt: skip
    for family, spec in grid["families"].items():
        fixed = spec["fixed"]
        axes = ", ".join(f"{a} {v}" for a, v in spec["axes"].items())
        design = "crossed: " + ", ".join(spec["crossed"])
        lines.append(
            f"- `{family}`: {axes} ({design}; the other axes as a star around the middle "
            f"value); {_optimizer_text(spec)}, stop at training cross-entropy "
            f"{fixed['loss_threshold']} (checked every {fixed['eval_every']} steps) or at the "
            f"step cap; measures on {_measure_set(fixed)}; "
            f"{fixed['num_test']} test examples."
        )
    g = grid
    lines += [
        "",
        f"Measures: Hutchinson {g['hessian_probes']} probes, Lanczos {g['lanczos_steps']} "
        f"steps, average sharpness {g['sharpness_pairs']} antithetic pairs at sigma "
        f"{g['sharpness_sigmas']} (plain) and {g['adaptive_sigmas']} (adaptive), worst case "
        f"{g['worst_steps']} APGD steps at rho {g['worst_rho_linf']} (l-inf) and "
        f"{g['worst_rho_l2']} (l2) over {g['worst_batches']} batches, sigma search "
        f"{g['sigma_pairs']} pairs x {g['sigma_steps']} bisections to a 0-1 error increase of "
        f"{g['sigma_target']}, GGN {g['ggn_probes']} probes, Monte Carlo Fisher "
        f"{g['fisher_samples']} draws, Rademacher search {g['rad_draws']} sign vectors x "
        f"{g['rad_steps']} steps; vmap widths {g['lanes']} (training) and "
        f"{g['measure_lanes']} (measures).",
    ]  # fmt: skip
    return lines


def _measure_set(fixed: Mapping[str, Any]) -> str:
    if fixed.get("measure_examples"):
        return f"the first {fixed['measure_examples']} training examples"
    return "the whole training set (its first 1024 examples when larger)"


def _command_text(meta: Mapping[str, Any]) -> str:
    """The command that makes this run and the units' summed wall time (from summary.json).

    >>> _command_text({"scale": "cpu", "seeds": [0, 1], "total_unit_time_s": 90.0})
    'Made by `jaxbounds reproduce measures-vs-gap --scale cpu --seeds 2 --out DIR`; the units took 1.5 min of wall time in all (`total_unit_time_s` in summary.json: training, measures and their compilation).'
    """  # noqa: E501
    seeds = list(meta["seeds"])
    command = f"jaxbounds reproduce {NAME} --scale {meta['scale']}"
    if seeds == list(range(len(seeds))):
        command = f"`{command} --seeds {len(seeds)} --out DIR`"
    else:
        command = f"`{command} --out DIR` (seeds {seeds})"
    total = meta.get("total_unit_time_s")
    took = "" if total is None else (
        f"; the units took {total / 60:.1f} min of wall time in all (`total_unit_time_s` in "
        "summary.json: training, measures and their compilation)"
    )  # fmt: skip
    return f"Made by {command}{took}."


def _strip_timing(out_dir: Path) -> None:
    """Rewrite results.csv without the timing columns."""
    path = Path(out_dir) / "results.csv"
    reader = csv.reader(io.StringIO(path.read_text(encoding="utf-8")))
    table = list(reader)
    keep = [j for j, c in enumerate(table[0]) if not _is_timing(c)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for line in table:
        writer.writerow([line[j] for j in keep])
    runner.write_text_atomic(path, buffer.getvalue())


def _seconds_csv(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str]) -> str:
    timing = [c for c in rows[0] if _is_timing(c)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*grid_keys, "seed", *timing])
    for row in rows:
        writer.writerow([_csv_cell(row.get(c)) if isinstance(row.get(c), float)
                         else row.get(c) for c in (*grid_keys, "seed", *timing)])  # fmt: skip
    return buffer.getvalue()


def _report(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], sections: list[str],
            claims: list[str]) -> str:  # fmt: skip
    lines = [
        f"# {meta['experiment']}", "", meta["description"], "", f"Anchors: {meta['paper']}.",
        "", _command_text(meta), "", *_settings_text(rows, meta), "",
        f"Models: {len(rows)}; {sum(bool(r['reached']) for r in rows)} reached the loss "
        f"threshold, {sum(bool(r['hit_cap']) for r in rows)} stopped at their step cap, "
        f"{sum(bool(r['diverged']) for r in rows)} diverged (no measures).", "",
        "Protocol (jaxbounds.study): each family on its own; the models that reached the loss "
        "threshold (Jiang et al.'s protocol; the capped ones reported apart); a run that "
        "appears more than once (same seed, gap and measure values) counted once; the axes are "
        "design choices only: the step budget within which a model converged is an outcome, "
        "reported per family, never an axis of Psi, a conditioning variable of the CMI or an "
        "environment of the sign error. tau: "
        "Jiang et al.'s eq. (3) with the loss gap (test minus training cross-entropy), tau-b "
        "beside it; Psi: the mean over the family's axes of psi (the mean tau over the groups "
        "of models that differ only in that axis); CMI: Jiang et al.'s normalised conditional "
        "mutual information, the minimum over conditioning sets of 0, 1 and 2 axes; sign "
        "error: Dziugaite et al.'s, with the 0-1 error gap (every seed paired with every seed, "
        "Hoeffding weights over the test set, environments of effective sample size >= 12, "
        "measures size-adjusted with N; a tied pair counts 1/2, so a measure that orders no "
        "pair of an environment scores 0.5 there and the rule's 'at least 0.5' counts it as "
        "failing; given at the test size, which the verdict uses, and at n = 10000, the "
        "anchors' code's test-set size); the null rows: a random positive measure (e^z, z "
        "standard normal; size-adjusted as the measures in the sign error), the gap plus noise "
        "at its standard error, median [2.5%, 97.5%] over "
        f"{NULL_DRAWS} draws, and the constant measure 1 (size-adjusted: 1/sqrt(N), for the "
        "sign error only); CMI with tau's sign beside it (the CMI ignores direction); "
        f"intervals: {CONFIDENCE:.0%} two-way bootstrap, configurations and seeds resampled "
        "jointly (conservative: in simulation on this grid a random measure's interval "
        "excluded 0 in at most 1% of draws; jaxbounds.study.bootstrap); s/model and compile "
        "s: the measure program's median run seconds per model and total compile seconds.", "",
        *sections,
        "## The anchors' claims, per family", "",
        *_sources_text(),
        *claims, "",
        *_paper_numbers_text(meta.get("paper_numbers") or {}),
        f"Not tested here: Jiang et al.'s axes {_untested_axes(meta['config_grid'])}, and "
        "their CNNs; Andriushchenko et al.'s ViT and BERT fine-tuning; Dziugaite et al.'s "
        "environments over data sets.",
    ]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """results.csv without timings, seconds.csv, measures.csv, figures, statistics, report.

    The rows of a run carry the timing columns (from the unit files): their
    :func:`measure_cost` goes into ``summary.json`` (key ``measure_cost``, beside the runner's
    wall times), the columns into ``seconds.csv``, and results.csv loses them. Rows without
    timing columns (results.csv read back) take the cost from ``meta["measure_cost"]``, so the
    committed report is rendered again from results.csv and summary.json alone, byte for byte.
    """
    out_dir = Path(out_dir)
    if any(_is_timing(c) for c in rows[0]):
        cost = measure_cost(rows)
        runner.write_text_atomic(out_dir / "seconds.csv",
                                 _seconds_csv(rows, ["family", *AXIS_KEYS]))  # fmt: skip
        if (out_dir / "summary.json").exists():
            runner.write_json_atomic(out_dir / "summary.json", {**meta, "measure_cost": cost})
    else:
        cost = meta.get("measure_cost", {})
    if (out_dir / "results.csv").exists():
        _strip_timing(out_dir)
    specs = measure_specs(rows[0])
    studies = _mvg_study.run_studies(rows, [s.name for s in specs],
                                     num_resamples=BOOTSTRAP_RESAMPLES,
                                     num_null_draws=NULL_DRAWS, confidence=CONFIDENCE)  # fmt: skip
    small = meta["scale"] == "smoke" or len({r["seed"] for r in rows}) < 2
    kinds = {s.name: s.kind for s in specs}
    claims = _mvg_study.claim_lines(studies, CLAIMS, kinds, small)
    report = _report(meta, rows, _mvg_render.family_sections(studies, specs, cost), claims)
    runner.write_text_atomic(out_dir / "measures.csv",
                             _mvg_render.measures_csv(studies, specs, cost))  # fmt: skip
    figures = {"figure_tau.png": _mvg_render.tau_psi_figure(studies, specs)}
    public = _mvg_render.public_statistics(studies)
    runner.write_rendered(out_dir, figures, _json_ready(public), report)


def _json_ready(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else value
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value
