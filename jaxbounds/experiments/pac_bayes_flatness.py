r"""``pac-bayes-flatness``: learned vs constructed interpolators (Section 2.2, Figure 2).

"A Sharper Picture of Generalization in Transformers" (arXiv 2605.20988) compares, for random
$f = \sum_t c_t\chi_{S_t}$ of every class (degree $D_f$, sparsity $\omega$), its hard-coded
flat construction with a learned interpolator, and reports that the learned solutions are
about 100x flatter (Hessian trace of the training loss) and about 100x smaller in norm. Its
PAC-Bayes argument then *assumes* the learned solution is dominated by the construction in both
quantities ("domination assumption").

One unit is one function (the seed) of one class. It builds, on every input of $\{0,1\}^T$
(the training set, $m = 2^T$):

- the construction :func:`jaxbounds.models.construction.construction` (default logit scale
  $2\ln T$, MLP width $4(D_f+1)$);
- the learnable twin (:mod:`jaxbounds.experiments._fourier_training`: same layers, no
  LayerNorm, one-hot positions, MLP width ``mlp_width`` for every class, full-batch Adam until
  the quadratic training loss is at or below ``loss_threshold``, or ``max_steps``);

and for both, on the quadratic training loss against $f$'s values: the Hessian trace by
Hutch++ (:func:`kernels.curvature.hessian_trace`, ``num_matvecs`` products, with its standard
error), the exact Gauss-Newton trace $2\,\mathrm{mean}_x\|\nabla_\theta f_\theta(x)\|^2$ (the
Theorem 13 value at an exact interpolator; the difference is the residual term), the top
Hessian eigenvalue (Lanczos, :func:`kernels.curvature.top_eigenvalues`), the Frobenius norm
$\|\theta\|$ of all weights and of every matrix, and the training loss.

Targets (a documented choice). The construction needs $c_t > 0$, while the paper trains on
centred coefficients. For a like-for-like comparison both models fit **the same** function,
the ``"unit_norm"`` one ($c = |z|/\|z\|_2$; the centred function of the same (class, seed)
has the same subsets and $|z|$), labelled by its exact values $f(x)$. The construction is
exact only up to $O(1/T)$ at the $2\ln T$ scale, so its training loss is small but not zero
(recorded per unit, ``constructed_loss``).

Scale ``cpu``: T = 8 (256 inputs, every one a training input), degrees 1..5, sparsities
{1, 3, 6, 8} (the paper's $\omega/T \in \{0.05, 0.35, 0.7, 1\}$ at T = 20; $\omega \le T$ is
needed by the construction), 5 functions per class. T = 10 costs ~10x more per Adam step on
2 cores (measured 50 ms vs 4.7 ms per full-batch step), which does not fit 15 CPU minutes.
The cpu run measured 493 s user + 7 s sys CPU (17 min wall on a shared, loaded machine).

References:
  arXiv 2605.20988, Section 2.2 and Figure 2 (rebuilt, SPEC.md section 5).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxbounds.bounds import pac_bayes
from jaxbounds.experiments import _fourier_training as ft
from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale
from jaxbounds.models import as_pure
from jaxbounds.models.construction import construction
from kernels.curvature import hessian_trace, hvp, top_eigenvalues
from kernels.norms import tree_norm
from kernels.walsh import cube_points

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "class_ratios",
    "measure",
    "run_unit",
    "statistics",
]

NAME = "pac-bayes-flatness"
PAPER = (
    "A Sharper Picture of Generalization in Transformers, arXiv 2605.20988, Section 2.2 (Figure 2)"
)

_COMMON = {
    "learning_rate": 3e-2, "loss_threshold": 0.02, "chunk_steps": 200,
    "num_matvecs": 48, "lanczos_steps": 30,
}  # fmt: skip

#: Config grid per scale; ``degree`` and ``sparsity`` are the axes, seeds are functions.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {**_COMMON, "seq_len": 5, "degree": [2], "sparsity": [3], "mlp_width": 12,
              "max_steps": 400, "num_matvecs": 12, "lanczos_steps": 12},
    "cpu": {**_COMMON, "seq_len": 8, "degree": [1, 2, 3, 4, 5], "sparsity": [1, 3, 6, 8],
            "mlp_width": 24, "max_steps": 4000},
    "paper": {**_COMMON, "seq_len": 20, "degree": [1, 2, 3, 4, 5], "sparsity": [1, 7, 14, 20],
              "mlp_width": 24, "max_steps": 50000, "num_matvecs": 120, "lanczos_steps": 60},
}  # fmt: skip

CLAIMS = (
    "Learned interpolators are about 100x flatter (Hessian trace of the training loss) than "
    "the flat construction (Figure 2a)",
    "Learned interpolators have about 100x smaller weight norm than the construction (Figure 2b)",
    "Domination assumption: every learned interpolator is dominated by the construction of "
    "its function in both norm and Hessian trace",
)

PAPER_NUMBERS = {
    "setting": {"T": 20, "m": 8192, "degrees": "1..5", "sparsities": [1, 7, 14, 20],
                "model": "2 layers, 1 head, no LayerNorm", "loss_threshold": 0.02,
                "targets": "|N(0,1)| coefficients, centred, unit variance"},
    "figure2": "learned solutions ~100x flatter (Hessian trace) and ~100x smaller in norm "
               "than the construction (values only in the figure)",
}  # fmt: skip

#: "About 100x": the ratio's order of magnitude, log10 within 2 +- 0.5.
_ORDER = (10**1.5, 10**2.5)
_MODELS = ("constructed", "learned")


# ------------------------------------------------------------------------------ measurements


@functools.cache
def _jitted():
    def trace(params, batch, key, num_matvecs):
        return hessian_trace(ft.loss, params, batch, key, num_matvecs=num_matvecs,
                             method="hutchpp")  # fmt: skip

    def top(params, batch, key, num_steps):
        return top_eigenvalues(hvp(ft.loss, params, batch), params, key, k=1,
                               num_steps=num_steps)[0]  # fmt: skip

    return {
        "trace": jax.jit(trace, static_argnums=3),
        "top": jax.jit(top, static_argnums=3),
        "loss": jax.jit(ft.loss),
    }


def measure(
    params: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], key: jax.Array, *,
    num_matvecs: int, lanczos_steps: int,
) -> dict[str, Any]:  # fmt: skip
    """Hessian trace (Hutch++ ± s.e.), Gauss-Newton trace, top eigenvalue, norms, loss (float64).

    Args:
      params: the model's parameter dict (keys of :func:`ft.apply`).
      batch: ``{"bits": (m, T), "labels": (m,)}``; the loss is the mean quadratic loss.
      key: PRNG key (Hutch++ probes, Lanczos start).
      num_matvecs: Hutch++ Hessian-vector products (>= 4).
      lanczos_steps: Lanczos steps of the top eigenvalue (>= 1).

    Returns:
      ``trace``, ``trace_stderr``, ``gn_trace``, ``G_u``, ``top_eigenvalue``, ``norm``,
      ``norm_sq``, ``loss``, ``num_params`` and ``matrix_norm_<leaf>`` per matrix.
    """
    fns = _jitted()
    with jax.enable_x64(True):
        k1, k2 = jax.random.split(key)
        est = fns["trace"](params, batch, k1, num_matvecs)
        grad_sq = np.asarray(ft.grad_sq(params, batch["bits"]))
        out = {
            "trace": float(est.mean), "trace_stderr": float(est.stderr),
            "gn_trace": float(2 * grad_sq.mean()), "G_u": float(grad_sq.max()),
            "top_eigenvalue": float(fns["top"](params, batch, k2, lanczos_steps)),
            "norm": float(tree_norm(params)), "norm_sq": float(tree_norm(params) ** 2),
            "loss": float(fns["loss"](params, batch)),
            "num_params": int(ravel_pytree(params)[0].size),
        }  # fmt: skip
        out.update(
            {f"matrix_norm_{k}": float(jnp.linalg.norm(v)) for k, v in sorted(params.items())}
        )
    return out


def run_unit(unit: runner.Unit) -> dict[str, Any]:
    """One function of one class: the construction and a trained twin, both measured."""
    cfg, seed = unit.config, unit.seed
    t, d, w = cfg["seq_len"], cfg["degree"], cfg["sparsity"]
    f = ft.target_function(num_bits=t, degree=d, sparsity=w, seed=seed,
                           normalization="unit_norm")  # fmt: skip
    with jax.enable_x64(True):
        bits = cube_points(t)
        batch = {"bits": bits, "labels": f(bits)}
        built = as_pure(construction(f, seq_len=t))[1]
    trained = ft.train_twin(
        bits, batch["labels"], seed=seed, mlp_width=cfg["mlp_width"],
        learning_rate=cfg["learning_rate"], loss_threshold=cfg["loss_threshold"],
        max_steps=cfg["max_steps"], chunk_steps=cfg["chunk_steps"],
    )  # fmt: skip
    key = jax.random.fold_in(jax.random.key(seed), 1000 * d + w)
    row: dict[str, Any] = {
        "num_examples": int(bits.shape[0]),
        "train_steps": trained.num_steps,
        "reached_threshold": trained.reached,
        "L_bound": float(pac_bayes.construction_norm_bound(w, d, t)),
    }
    for i, (name, params) in enumerate((("constructed", built), ("learned", trained.params))):
        m = measure(params, batch, jax.random.fold_in(key, i), num_matvecs=cfg["num_matvecs"],
                    lanczos_steps=cfg["lanczos_steps"])  # fmt: skip
        row.update({f"{name}_{k}": v for k, v in m.items()})
    row["learned_init_norm"] = float(tree_norm(ft.init_params(t, cfg["mlp_width"], seed)))
    row.update(_domination(row))
    return row


def _domination(row: Mapping[str, Any]) -> dict[str, Any]:
    """Learned <= constructed in norm and in trace; the failing coordinates, if any."""
    fails = [q for q in ("norm", "trace") if row[f"learned_{q}"] > row[f"constructed_{q}"]]
    prefix = "learned_matrix_norm_"
    matrices = sorted(
        k[len(prefix) :]
        for k in row
        if k.startswith(prefix) and row[k] > row["constructed_matrix_norm_" + k[len(prefix) :]]
    )
    return {
        "trace_ratio": row["constructed_trace"] / row["learned_trace"],
        "norm_ratio": row["constructed_norm"] / row["learned_norm"],
        "top_eigenvalue_ratio": row["constructed_top_eigenvalue"] / row["learned_top_eigenvalue"],
        "dominated": not fails,
        "domination_fails": "+".join(fails) or "none",
        "matrices_above_construction": "+".join(matrices) or "none",
    }


# ------------------------------------------------------------------------------ statistics


def _geo(values: Sequence[float]) -> float:
    v = np.asarray(values, float)
    return float(np.exp(np.mean(np.log(v)))) if np.all(v > 0) else float("nan")


def class_ratios(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per class: constructed / learned ratios (mean ± std, geometric mean, min), domination."""
    out: dict[str, Any] = {
        "num_functions": len(group),
        "reached": int(sum(bool(r["reached_threshold"]) for r in group)),
    }
    for q in ("trace", "norm", "top_eigenvalue"):
        ratios = [r[f"{q}_ratio"] for r in group]
        s = runner.mean_spread(ratios)
        out[f"{q}_ratio"] = {"mean": s.mean, "std": s.std, "geomean": _geo(ratios),
                             "min": float(min(ratios)), "max": float(max(ratios))}  # fmt: skip
        for model in _MODELS:
            s = runner.mean_spread(r[f"{model}_{q}"] for r in group)
            out[f"{model}_{q}"] = {"mean": s.mean, "std": s.std}
    out["dominated"] = int(sum(bool(r["dominated"]) for r in group))
    out["fails"] = sorted({r["domination_fails"] for r in group} - {"none"})
    return out


def statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-class ratios and domination, and the pooled ratios (written to statistics.json)."""
    pooled = {q: {"geomean": _geo([r[f"{q}_ratio"] for r in rows]),
                  "median": float(np.median([r[f"{q}_ratio"] for r in rows])),
                  "min": float(min(r[f"{q}_ratio"] for r in rows)),
                  "max": float(max(r[f"{q}_ratio"] for r in rows)),
                  "log10_std": float(np.std(np.log10(np.abs([r[f"{q}_ratio"] for r in rows])),
                                            ddof=1)) if len(rows) > 1 else float("nan")}
              for q in ("trace", "norm", "top_eigenvalue")}  # fmt: skip
    fails: dict[str, int] = {}
    for r in rows:
        fails[r["domination_fails"]] = fails.get(r["domination_fails"], 0) + 1
    classes = runner.group_rows(rows, ["degree", "sparsity"], sort=True)
    return {
        "classes": [{"degree": d, "sparsity": s, **class_ratios(g)}
                    for (d, s), g in classes.items()],
        "pooled": pooled,
        "num_functions": len(rows),
        "num_dominated": int(sum(bool(r["dominated"]) for r in rows)),
        "domination_fails": fails,
        "num_reached": int(sum(bool(r["reached_threshold"]) for r in rows)),
        "max_learned_loss": float(max(r["learned_loss"] for r in rows)),
        "max_constructed_loss": float(max(r["constructed_loss"] for r in rows)),
        "learned_init_norm": float(np.mean([r["learned_init_norm"] for r in rows])),
        "learned_norm": float(np.mean([r["learned_norm"] for r in rows])),
        "max_trace_rel_stderr": float(max(abs(r[f"{m}_trace_stderr"] / r[f"{m}_trace"])
                                          for r in rows for m in _MODELS)),
    }  # fmt: skip


# ------------------------------------------------------------------------------ report


def _fmt(value: float, digits: int = 3) -> str:
    return runner.format_number(float(value), digits)


def _pm(s: Mapping[str, float]) -> str:
    return runner.Spread(s["mean"], s["std"], float("nan"), 2).format(3)


def _class_table(stats: Mapping[str, Any]) -> str:
    header = ["D_f", "omega", "functions", "reached 0.02", "trace constructed", "trace learned",
              "trace ratio (mean ± std)", "geo-mean", "norm constructed", "norm learned",
              "norm ratio (mean ± std)", "top eig. ratio (mean ± std)", "dominated"]  # fmt: skip
    table = [
        [c["degree"], c["sparsity"], c["num_functions"], c["reached"],
         _pm(c["constructed_trace"]), _pm(c["learned_trace"]), _pm(c["trace_ratio"]),
         _fmt(c["trace_ratio"]["geomean"]), _pm(c["constructed_norm"]), _pm(c["learned_norm"]),
         _pm(c["norm_ratio"]), _pm(c["top_eigenvalue_ratio"]),
         f"{c['dominated']}/{c['num_functions']}"]
        for c in stats["classes"]
    ]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header))


def _order(ratio: float) -> bool:
    return _ORDER[0] <= ratio <= _ORDER[1]


def _claims(stats: Mapping[str, Any]) -> list[str]:
    p, lines = stats["pooled"], []
    for claim, q, what in ((CLAIMS[0], "trace", "Hessian trace"), (CLAIMS[1], "norm", "norm")):
        r = p[q]
        lines.append(runner.claim_line(claim, _order(r["geomean"]), (
            f"constructed / learned {what} over {stats['num_functions']} functions: geometric "
            f"mean {_fmt(r['geomean'])} (spread of log10: {_fmt(r['log10_std'], 2)}), median "
            f"{_fmt(r['median'])}, range {_fmt(r['min'])} .. {_fmt(r['max'])}; 'about 100x' "
            f"read as a geometric mean in [{_ORDER[0]:.3g}, {_ORDER[1]:.3g}]"
        )))  # fmt: skip
    n, k = stats["num_functions"], stats["num_dominated"]
    fails = ", ".join(f"{v} fail on {c}" for c, v in sorted(stats["domination_fails"].items())
                      if c != "none") or "no failures"  # fmt: skip
    lines.append(runner.claim_line(CLAIMS[2], k == n, (
        f"{k} of {n} functions dominated in both coordinates; {fails}"
    )))  # fmt: skip
    return lines


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict) -> str:
    g = meta["config_grid"]
    t = g["seq_len"]
    fail_rows = [r for r in rows if not r["dominated"]]
    lines = [
        f"# {meta['experiment']}: {meta['paper']}", "", meta["description"], "",
        f"Scale `{meta['scale']}`, seeds (functions per class) {meta['seeds']}, "
        f"{meta['num_finished']} of {meta['num_units']} units. T = {t}, every input of "
        f"{{0,1}}^{t} is a training input (m = {2**t}); degrees {g['degree']}, sparsities "
        f"{g['sparsity']}. Learned model: the construction's twin (2 attention layers, 1 head, "
        f"MLP width {g['mlp_width']}, no LayerNorm, one-hot positions), full-batch Adam "
        f"(lr {g['learning_rate']}) until the quadratic training loss is at or below "
        f"{g['loss_threshold']} (checked every {g['chunk_steps']} steps, cap "
        f"{g['max_steps']}); {stats['num_reached']} of {stats['num_functions']} reached it "
        f"(largest final loss {_fmt(stats['max_learned_loss'])}). Hessian traces: Hutch++ with "
        f"{g['num_matvecs']} products (largest relative standard error "
        f"{_fmt(stats['max_trace_rel_stderr'], 2)}); top eigenvalue: {g['lanczos_steps']} "
        "Lanczos steps.", "",
        "Both models fit the same target, the unit-norm function (c = |z| / ||z||, all c_t > 0, "
        "as the construction needs; the paper's centred function of the same seed has the same "
        "subsets and |z|), labelled by its exact values; the construction (logit scale 2 ln T) "
        "is exact only up to O(1/T): its largest training loss is "
        f"{_fmt(stats['max_constructed_loss'])}. Ratios are constructed / learned per function; "
        "'norm' is the Frobenius norm of all weights together. The twin starts at "
        f"norm {_fmt(stats['learned_init_norm'])} (mean over functions; N(0, 1/fan-in) "
        f"entries) and ends at {_fmt(stats['learned_norm'])}: at this width the learned norm "
        "is set mostly by the initialisation scale, which bounds how far below the "
        "construction's norm it can be.", "",
        "## Figure 2: per class (mean ± std over functions)", "", _class_table(stats), "",
        "![Figure 2](figure2_trace_norm.png) ![domination](domination.png)", "",
        "## Claims", "", *claims_at_scale(_claims(stats), meta["scale"]), "",
        "## Domination per function (past the paper)", "",
    ]  # fmt: skip
    lines += _domination_lines(fail_rows)
    lines += ["", "Per-matrix Frobenius norms of both models, Gauss-Newton traces (2 mean "
              "||grad f||^2, exact) and top eigenvalues are in results.csv."]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def _domination_lines(fail_rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-function domination section: the functions that fail, or one sentence."""
    if not fail_rows:
        return ["Every learned interpolator is dominated in both norm and trace."]
    header = [
        "D_f",
        "omega",
        "seed",
        "fails on",
        "trace constructed",
        "trace learned",
        "norm constructed",
        "norm learned",
        "matrices above the construction",
    ]
    keys = ("degree", "sparsity", "seed", "domination_fails", "constructed_trace",
            "learned_trace", "constructed_norm", "learned_norm",
            "matrices_above_construction")  # fmt: skip
    table = [[r[k] for k in keys] for r in fail_rows]
    return ["Functions where the learned interpolator is not dominated:", "",
            runner.markdown_table(header, table, align="rrrlrrrrl")]  # fmt: skip


def _figure2(stats: Mapping[str, Any]):
    classes = stats["classes"]
    figure = runner.new_figure(figsize=(9.6, 3.6))
    if figure is None or not classes:
        return figure
    x = np.arange(len(classes))
    labels = [f"D{c['degree']} w{c['sparsity']}" for c in classes]
    for i, (q, title) in enumerate((("trace", "(a) Hessian trace"), ("norm", "(b) ||theta||_F"))):
        ax = figure.add_subplot(1, 2, i + 1)
        for j, model in enumerate(_MODELS):
            means = [c[f"{model}_{q}"]["mean"] for c in classes]
            stds = [np.nan_to_num(c[f"{model}_{q}"]["std"]) for c in classes]
            ax.bar(x + (j - 0.5) * 0.4, means, 0.4, yerr=stds, capsize=2, label=model)
        ax.set_yscale("log")
        ax.set_xticks(x, labels, rotation=70, fontsize=6)
        ax.set_title(f"{title}: mean ± std over functions", fontsize=9)
        ax.legend(fontsize=7)
    return figure


def _domination_figure(rows: Sequence[Mapping[str, Any]]):
    figure = runner.new_figure(figsize=(9.0, 3.6))
    if figure is None or not rows:
        return figure
    for i, q in enumerate(("trace", "norm")):
        ax = figure.add_subplot(1, 2, i + 1)
        for d in sorted({r["degree"] for r in rows}):
            sel = [r for r in rows if r["degree"] == d]
            ax.scatter([r[f"constructed_{q}"] for r in sel], [abs(r[f"learned_{q}"]) for r in sel],
                       s=12, label=f"D_f = {d}")  # fmt: skip
        lo = min(min(abs(r[f"learned_{q}"]), r[f"constructed_{q}"]) for r in rows)
        hi = max(max(abs(r[f"learned_{q}"]), r[f"constructed_{q}"]) for r in rows)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="learned = constructed")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"constructed {q}")
        ax.set_ylabel(f"learned {q}")
        ax.set_title(f"domination in {q}: below the line = dominated", fontsize=9)
        ax.legend(fontsize=6)
    return figure


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """Figure 2 analogue, the domination scatter, ``statistics.json`` and ``report.md``."""
    stats = statistics(rows)
    figures = {
        "figure2_trace_norm.png": _figure2(stats),
        "domination.png": _domination_figure(rows),
    }
    runner.write_rendered(out_dir, figures, stats, _report(rows, meta, stats))


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Hessian trace (Hutch++), top eigenvalue and weight norm of the flat construction and of "
        "a learned interpolator of the same random Fourier function, per (degree, sparsity) "
        "class: flatness and norm ratios and the domination assumption per function"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 2, "cpu": 5, "paper": 10},
    default_scale="cpu",
)
