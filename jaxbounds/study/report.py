"""The report of a study: ``report.md``, ``study.json`` and figures.

``report.md`` holds every statistic per family beside its null baselines, ``study.json`` the
same numbers, and one figure per family is drawn when matplotlib is installed.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

from jaxbounds._atomic import write_bytes_atomic, write_text_atomic
from jaxbounds.study import nulls
from jaxbounds.study.analysis import FamilyResult, MeasureResult, Study

__all__ = ["as_json", "render_report", "study_json", "study_markdown"]


def _f(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:+.{digits}f}"


def _u(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def _band(summary: Any, signed: bool = True) -> str:
    if summary is None or not math.isfinite(summary.median):
        return "n/a"
    fmt = _f if signed else _u
    if summary.low == summary.high:  # one value, or draws that all agree
        return f"{fmt(summary.median)} (no spread)"
    return f"{fmt(summary.median)} [{fmt(summary.low)}, {fmt(summary.high)}]"


def _cell(text: str) -> str:
    """A table cell: a ``|`` in a name escaped, a line break a space (one row stays one row)."""
    return " ".join(str(text).replace("|", "\\|").split("\n"))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return lines


def _nulls(fr: FamilyResult) -> list[str]:
    rows = []
    labels = (("random", "random measure"), ("gap+noise", "gap + noise at its stderr"),
              ("constant", "constant measure (size-adjusted: 1/sqrt(N))"))  # fmt: skip
    for kind, label in labels:
        nb = fr.nulls.get(kind)
        if nb is None:
            continue
        if nb.note:
            rows.append([label, "0", *(["n/a"] * 5), nb.note])
            continue
        s = nb.stats
        cmi = " / ".join(_band(s[k], False) for k in sorted(s) if k.startswith("cmi_"))
        rows.append([label, str(nb.num_samples), _band(s.get("tau")), _band(s.get("psi")),
                     cmi or "n/a", _band(s.get("sign_error_mean"), False),
                     _band(s.get("sign_error_worst"), False), ""])  # fmt: skip
    return _table(["null", "draws", "tau", "Psi", "CMI", "sign error mean", "sign error max",
                   "note"], rows)  # fmt: skip


def _beyond(value: float, fr: FamilyResult, stat: str) -> str:
    """``yes`` / ``no``: the random null's rank test (:func:`~jaxbounds.study.nulls.beyond`).

    ``n/a`` without a value, or with too few draws (said in the cell).
    """
    s = fr.nulls["random"].stats.get(stat)
    if s is None or not math.isfinite(value):
        return "n/a"
    verdict = nulls.beyond(value, s)
    if verdict is None:
        return f"n/a (too few draws: {fr.nulls['random'].num_samples} < {nulls.MIN_DRAWS})"
    return "yes" if verdict else "no"


def _sign(x: float) -> str:
    """The sign of tau beside the CMI, which ignores direction."""
    if not math.isfinite(x):
        return "n/a"
    return "+" if x > 0 else "-" if x < 0 else "0"


def _measure_row(fr: FamilyResult, m: MeasureResult) -> list[str]:
    cmi = m.cmi.by_size if m.cmi is not None else {}
    se = m.sign_error
    return [
        m.name, str(m.num_models), _f(m.tau.tau), _f(m.tau.tau_b), m.tau_interval.format(),
        _beyond(m.tau.tau, fr, "tau"), _f(m.psi.psi), m.psi_interval.format(),
        _beyond(m.psi.psi, fr, "psi"),
        (" / ".join(_u(cmi.get(k)) for k in sorted(cmi)) + f" (tau {_sign(m.tau.tau)})"
         if cmi else "n/a"),
        _u(se.mean), _u(se.p90), _u(se.worst), str(se.num_environments),
        (m.tau.note or se.note or "") + (f"; {m.num_missing} without a finite value"
                                         if m.num_missing else ""),
    ]  # fmt: skip


def _family_section(fr: FamilyResult) -> list[str]:
    lines = [f"## {fr.family}", ""]
    lines.append(
        f"{fr.num_rows} rows; {fr.num_no_gap} without a gap; {fr.num_capped} capped (not "
        f"converged); {fr.num_duplicates} duplicate runs counted once; **{fr.num_models} models "
        f"analysed**, seeds {', '.join(str(s) for s in fr.seeds) or 'none'}; axes: "
        f"{', '.join(fr.axes) or 'none'}."
    )
    lines.append("")
    lines += [f"- {n}" for n in fr.notes] + ([""] if fr.notes else [])
    lines += ["### Null baselines", "",
              "Median [2.5%, 97.5%] over the draws (a measure must leave the random "
              "measure's range to say anything; the gap plus noise shows the best a measure "
              "can do at this noise).", ""]  # fmt: skip
    lines += [*_nulls(fr), ""]
    lines += ["### Measures", "",
              "tau: Jiang et al.'s eq. (3) (tau-a); tau-b beside it; intervals: two-way "
              "bootstrap (configurations and seeds resampled jointly; conservative); 'beyond "
              "null': the random measure's draws put it beyond them (a "
              "two-sided 5% rank test; n/a with fewer than 39 draws); CMI: "
              "|S| = 0 / 1 / 2, the minimum over conditioning sets of that size, with tau's sign "
              "beside it (the CMI ignores direction: a measure that ranks against the gap scores "
              "as one that ranks with it); sign error: "
              "Dziugaite et al.'s, over the environments kept (mean / p90 / max).", ""]  # fmt: skip
    header = ["measure", "n", "tau", "tau-b", "tau interval", "beyond null", "Psi",
              "Psi interval", "beyond null", "CMI", "sign err mean", "p90", "max", "envs",
              "note"]  # fmt: skip
    lines += [*_table(header, [_measure_row(fr, m) for m in fr.measures.values()]), ""]
    if fr.axes:
        lines += ["### Per axis", "",
                  "psi per axis (Jiang's eq. 4) and the sign error's mean / max over the "
                  "environments of that axis (count).", ""]  # fmt: skip
        rows = []
        for m in fr.measures.values():
            cells = [m.name]
            for a in fr.axes:
                mean, _, top = m.sign_error.axis_summary(a)
                count = len(m.sign_error.per_axis.get(a, ()))
                cells.append(f"{_f(m.psi.per_axis.get(a))}; {_u(mean)} / {_u(top)} ({count})")
            rows.append(cells)
        lines += [*_table(["measure", *fr.axes], rows), ""]
    capped = [m for m in fr.measures.values() if m.tau_capped is not None]
    if capped:
        lines += ["### Capped models (reported apart)", "",
                  f"tau over the {fr.num_capped} models that did not converge: "
                  + ", ".join(f"{m.name} {_f(m.tau_capped.tau)}" for m in capped), ""]  # fmt: skip
    return lines


def study_markdown(study: Study, *, title: str = "Measures versus the gap") -> str:
    """The markdown report of a study.

    >>> from jaxbounds.study import analyze, load_table
    >>> rows = [{"lr": lr, "s": s, "g": lr + s, "m": lr} for lr in (1, 2) for s in (0, 1)]
    >>> t = load_table(rows, axes=["lr"], seed="s", gap="g", measures=["m"])
    >>> "## all" in study_markdown(analyze(t, num_null_draws=3, num_resamples=3))
    True
    """
    o = study.options
    lines = [f"# {title}", ""]
    lines.append(
        "Protocol: each family on its own; "
        + (
            "converged models only (capped ones reported apart)"
            if o["converged_only"]
            else "converged and capped models together"
        )
        + ("; duplicate runs counted once" if o["collapse_duplicates"] else "")
        + f"; {o['num_null_draws']} draws per null (rng seed {o['rng_seed']}); "
        f"{o['num_resamples']} two-way bootstrap resamples (configurations and seeds) at "
        f"{o['confidence']:.0%}; sign error "
        f"with Hoeffding weights (loss range {o['loss_range']:g}) and effective sample size "
        f">= {o['min_ess']:g}."
    )
    lines.append("")
    for fr in study.families.values():
        lines += _family_section(fr)
    if len(study.families) > 1:
        lines += ["## Pooled over families (not a verdict)", "",
                  "Kendall's tau over every family's analysed models together: families with "
                  "different gap scales can reverse a correlation (Simpson's paradox), so no "
                  "claim rests on this column.", ""]  # fmt: skip
        pooled = [[n, str(t.num_models), _f(t.tau), _f(t.tau_b)] for n, t in study.pooled.items()]
        lines += [*_table(["measure", "n", "tau", "tau-b"], pooled), ""]
    return "\n".join(lines)


def as_json(x: Any) -> Any:
    """A study's dataclasses as JSON values (NaN and infinities as None, tuple keys joined).

    >>> as_json({"a": float("nan"), ("x", "y"): (1.0, 2)})
    {'a': None, 'x,y': [1.0, 2]}
    """
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {(k if isinstance(k, str) else ",".join(map(str, k)) if isinstance(k, tuple)
                 else str(k)): as_json(v) for k, v in x.items()}  # fmt: skip
    if isinstance(x, list | tuple):
        return [as_json(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return {k: as_json(getattr(x, k)) for k, f in x.__dataclass_fields__.items()
                if f.metadata.get("json", True)}  # fmt: skip
    if hasattr(x, "item"):
        return as_json(x.item())
    return x


def study_json(study: Study) -> str:
    """Every number of the study as JSON (NaN as null)."""
    return json.dumps(as_json(study), indent=1, sort_keys=True) + "\n"


def _figure(fr: FamilyResult, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(fr.measures)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.3 * len(names) + 1.5), sharey=True)
    for ax, stat in zip(axes, ("tau", "psi"), strict=True):
        values = [getattr(fr.measures[n], stat).tau if stat == "tau"
                  else fr.measures[n].psi.psi for n in names]  # fmt: skip
        ax.barh(range(len(names)), [v if math.isfinite(v) else 0.0 for v in values])
        for kind, color in (("random", "grey"), ("gap+noise", "green")):
            s = fr.nulls[kind].stats.get(stat)
            if s is not None and math.isfinite(s.low):
                ax.axvspan(s.low, s.high, color=color, alpha=0.2, label=f"{kind} null 95%")
        ax.axvline(0.0, color="black", lw=0.5)
        ax.set_title(f"{fr.family}: {stat}")
        ax.set_yticks(range(len(names)), names, fontsize=7)
    if axes[0].get_legend_handles_labels()[0]:  # no null band drawn: no legend
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(path, image.getvalue())
    return True


def render_report(study: Study, out_dir: str | Path, *, title: str = "Measures versus the gap",
                  figures: bool = True) -> list[Path]:  # fmt: skip
    """Write ``report.md``, ``study.json`` and (matplotlib installed) one figure per family.

    Args:
      study: the :class:`~jaxbounds.study.Study`.
      out_dir: the folder (created). Each file is written atomically; figures of an earlier
        study with more families (``figure_<k>_tau_psi.png`` not drawn now) are removed.
      title: the report's title.
      figures: draw the figures (skipped, and said in the report, without matplotlib).

    Returns:
      The paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    text = study_markdown(study, title=title)
    if figures:
        links = []
        for k, fr in enumerate(study.families.values()):
            path = out / f"figure_{k}_tau_psi.png"
            if _figure(fr, path):
                written.append(path)
                links.append(f"![{fr.family}: tau and Psi beside the nulls]({path.name})")
            else:
                links = ["Figures: matplotlib is not installed, none drawn."]
                break
        text += "\n## Figures\n\n" + "\n\n".join(links) + "\n"
    write_text_atomic(out / "report.md", text)
    write_text_atomic(out / "study.json", study_json(study))
    for stale in out.glob("figure_*_tau_psi.png"):  # an earlier study's, with more families
        if stale not in written and re.fullmatch(r"figure_\d+_tau_psi\.png", stale.name):
            stale.unlink()
    return [out / "report.md", out / "study.json", *written]
