r"""``pac-bayes-gap``: generalization gap vs degree and sparsity (Section 2.1).

"A Sharper Picture of Generalization in Transformers" (arXiv 2605.20988) trains the 2-layer
1-head Transformer without LayerNorm on random $f = \sum_t c_t\chi_{S_t}$ (|N(0,1)|
coefficients, centred, unit variance) of every class (degree $D_f$, sparsity $\omega$) until
the quadratic training loss is below 0.02, and reports that the generalization gap grows
super-linearly in each complexity parameter, and faster in one when the other is larger.

One unit is one function (the seed) of one class: a random split of $\{0,1\}^T$ into
``num_train`` training strings and the rest as held-out test strings (the test loss is the
exact mean over every held-out input, not a sample), the twin trained by
:func:`jaxbounds.experiments._fourier_training.train_twin` on the centred targets
(``random_fourier_function(..., normalization="centred")``), and the gap = test loss minus
training loss. Beside it, per class, the semi-analytic PAC-Bayes bound
(:func:`jaxbounds.bounds.pac_bayes.semi_analytic`, rebuilt) of the class's flat construction:
$G_u$ = the largest $\|\nabla_\theta f(x)\|^2$ over the training inputs of the constructions of
the class's functions (their unit-norm versions: the construction needs $c_t > 0$), $L$ =
Theorem 10's norm bound, $m$ = ``num_train``, the 20-point sigma mesh with its ln 20, no
perturbation term, and $\Sigma$ estimated from the trained models' held-out per-example losses
(:func:`jaxbounds.bounds.pac_bayes.estimate_subgaussian_scale`, max over the class; an
estimate, not a certified constant). The bound is about the construction (the dominating
reference of the paper's argument) on unit-norm targets, so it sits beside the gap as a scale,
not as a bound on these trained models.

Exponents: ordinary least squares of $\log \mathrm{gap}$ on $[1, \log D_f, \log\omega]$
(:func:`fit_power_law`; classical standard errors), on the class means and per seed (mean ±
std over seeds), and per slice (the degree exponent at each $\omega$, the sparsity exponent at
each $D_f$) for the interaction claim. Classes whose mean gap is not positive cannot enter a
log fit and are listed.

Scale ``cpu``: T = 10, ``num_train`` = 256 of the 1024 strings (768 held out), degrees 1..5,
sparsities {1, 4, 7, 10} (the paper's $\omega/T \approx$ {0.05, 0.35, 0.7, 1} at T = 20),
2 functions per class, Adam steps capped at 2000: measured 240 s user + 4 s sys CPU (11 min
wall on a shared, loaded 2-core machine).

References:
  arXiv 2605.20988, Section 2.1 (rebuilt, SPEC.md section 5).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxbounds.bounds import pac_bayes
from jaxbounds.experiments import _fourier_training as ft
from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale
from jaxbounds.models import as_pure
from jaxbounds.models.construction import construction
from kernels.norms import tree_norm
from kernels.walsh import cube_points

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "PowerLaw",
    "class_bound",
    "fit_power_law",
    "run_unit",
    "split",
    "statistics",
]

NAME = "pac-bayes-gap"
PAPER = "A Sharper Picture of Generalization in Transformers, arXiv 2605.20988, Section 2.1"

_COMMON = {"learning_rate": 3e-2, "loss_threshold": 0.02, "chunk_steps": 200, "delta": 0.05}

#: Config grid per scale; ``degree`` and ``sparsity`` are the axes, seeds are functions.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {**_COMMON, "seq_len": 5, "num_train": 20, "degree": [1, 2], "sparsity": [1, 3],
              "mlp_width": 12, "max_steps": 400},
    "cpu": {**_COMMON, "seq_len": 10, "num_train": 256, "degree": [1, 2, 3, 4, 5],
            "sparsity": [1, 4, 7, 10], "mlp_width": 24, "max_steps": 2000},
    "paper": {**_COMMON, "seq_len": 20, "num_train": 8192, "degree": [1, 2, 3, 4, 5],
              "sparsity": [1, 7, 14, 20], "mlp_width": 24, "max_steps": 50000},
}  # fmt: skip

CLAIMS = (
    "The generalization gap grows super-linearly in the degree",
    "The generalization gap grows super-linearly in the sparsity",
    "The gap grows faster in one complexity parameter when the other is larger",
)

PAPER_NUMBERS = {
    "setting": {"T": 20, "m": 8192, "degrees": "1..5", "sparsities": [1, 7, 14, 20],
                "model": "2 layers, 1 head, no LayerNorm", "loss_threshold": 0.02,
                "targets": "|N(0,1)| coefficients, centred, unit variance"},
    "section_2_1": "gap grows super-linearly in degree and sparsity, faster in one when the "
                   "other is larger (values only in the figure; no exponents reported)",
}  # fmt: skip


# ------------------------------------------------------------------------------ units


def split(seq_len: int, num_train: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (into :func:`kernels.walsh.cube_points`) of the training and held-out strings."""
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.key(seed), 5),
                                             2**seq_len))  # fmt: skip
    return np.sort(perm[:num_train]), np.sort(perm[num_train:])


@functools.cache
def _per_example():
    return jax.jit(lambda p, x, y: (ft.apply(p, x) - y) ** 2)


def run_unit(unit: runner.Unit) -> dict[str, Any]:
    """One function of one class: train on the split, test on the rest, the construction's G_u."""
    cfg, seed = unit.config, unit.seed
    t, d, w = cfg["seq_len"], cfg["degree"], cfg["sparsity"]
    if not 1 <= cfg["num_train"] < 2**t:
        raise ValueError(f"num_train: expected 1 <= num_train < 2^T = {2**t}")
    args = {"num_bits": t, "degree": d, "sparsity": w, "seed": seed}
    f = ft.target_function(**args, normalization="centred")
    train_idx, test_idx = split(t, cfg["num_train"], seed)
    with jax.enable_x64(True):
        cube = cube_points(t)
        x_train, x_test = cube[train_idx], cube[test_idx]
        y_train, y_test = f(x_train), f(x_test)
    trained = ft.train_twin(
        x_train, y_train, seed=seed, mlp_width=cfg["mlp_width"],
        learning_rate=cfg["learning_rate"], loss_threshold=cfg["loss_threshold"],
        max_steps=cfg["max_steps"], chunk_steps=cfg["chunk_steps"],
    )  # fmt: skip
    with jax.enable_x64(True):
        train_losses = np.asarray(_per_example()(trained.params, x_train, y_train))
        test_losses = np.asarray(_per_example()(trained.params, x_test, y_test))
        built = as_pure(construction(ft.target_function(**args, normalization="unit_norm"),
                                     seq_len=t))[1]  # fmt: skip
        G_u = float(np.max(np.asarray(ft.grad_sq(built, x_train))))
    train_loss, test_loss = float(train_losses.mean()), float(test_losses.mean())
    return {
        "train_loss": train_loss, "test_loss": test_loss, "gap": test_loss - train_loss,
        "test_loss_stderr": float(test_losses.std(ddof=1) / np.sqrt(test_losses.size)),
        "target_variance": float(np.var(np.asarray(y_test))),
        "train_steps": trained.num_steps, "reached_threshold": trained.reached,
        "learned_norm": float(tree_norm(trained.params)),
        "subgaussian_scale": float(pac_bayes.estimate_subgaussian_scale(test_losses)),
        "construction_G_u": G_u, "num_test": int(test_idx.size),
    }  # fmt: skip


# ------------------------------------------------------------------------------ statistics


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """OLS fit of ``log y = c + sum_k a_k log x_k`` with classical standard errors.

    Attributes:
      coefficients: ``(c, a_1, ..., a_K)``.
      stderr: their standard errors (NaN without residual degrees of freedom).
      num_points: points used (those with y > 0).
    """

    coefficients: tuple[float, ...]
    stderr: tuple[float, ...]
    num_points: int


def fit_power_law(xs: Sequence[Sequence[float]], y: Sequence[float]) -> PowerLaw:
    """Least squares of ``log y`` on ``[1, log x_1, ..., log x_K]`` over the points with y > 0.

    Args:
      xs: K sequences of positive regressors, each as long as ``y``.
      y: responses; non-positive ones are dropped (a log fit cannot use them).

    Returns:
      A :class:`PowerLaw` (NaN coefficients when fewer than K + 1 points remain).

    Raises:
      ValueError: for regressors of another length than ``y`` or a non-positive regressor.

    >>> fit = fit_power_law([[1, 2, 4]], [3, 12, 48])  # y = 3 x^2
    >>> [round(c, 6) for c in fit.coefficients]
    [1.098612, 2.0]
    """
    y = np.asarray(y, float)
    x = np.asarray(xs, float).reshape(len(xs), -1)
    if x.shape[1] != y.size:
        raise ValueError(f"xs: expected sequences of length {y.size}, got {x.shape[1]}")
    if np.any(x <= 0):
        raise ValueError("xs: expected positive regressors")
    keep = y > 0
    k = x.shape[0] + 1
    if keep.sum() < k:
        nan = (float("nan"),) * k
        return PowerLaw(nan, nan, int(keep.sum()))
    design = np.column_stack([np.ones(keep.sum()), np.log(x[:, keep]).T])
    target = np.log(y[keep])
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    dof = keep.sum() - k
    if dof > 0:
        resid = target - design @ coef
        cov = (resid @ resid / dof) * np.linalg.pinv(design.T @ design)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    else:
        se = np.full(k, np.nan)
    return PowerLaw(tuple(float(c) for c in coef), tuple(float(s) for s in se), int(keep.sum()))


def class_bound(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The class's semi-analytic bound (construction G_u, Theorem 10 L, estimated Sigma)."""
    cfg = group[0]
    G_u = max(r["construction_G_u"] for r in group)
    sigma_sub = max(r["subgaussian_scale"] for r in group)
    L = float(pac_bayes.construction_norm_bound(cfg["sparsity"], cfg["degree"], cfg["seq_len"]))
    bound = pac_bayes.semi_analytic(G_u=G_u, norm_sq=L, subgaussian_scale=sigma_sub,
                                    num_examples=cfg["num_train"], delta=cfg["delta"])  # fmt: skip
    return {"G_u": G_u, "L": L, "subgaussian_scale": sigma_sub, "bound": float(bound.value),
            "bound_sigma": float(bound.sigma), "bound_status": str(bound)}  # fmt: skip


def _fit_dict(fit: PowerLaw, names: Sequence[str]) -> dict[str, Any]:
    out = {n: fit.coefficients[i + 1] for i, n in enumerate(names)}
    out.update({f"{n}_stderr": fit.stderr[i + 1] for i, n in enumerate(names)})
    out["num_points"] = fit.num_points
    return out


def statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-class gaps and bounds, pooled / per-seed / per-slice exponents (statistics.json)."""
    classes = []
    for (d, s), group in runner.group_rows(rows, ["degree", "sparsity"], sort=True).items():
        gap = runner.mean_spread(r["gap"] for r in group)
        classes.append({
            "degree": d, "sparsity": s, "num_functions": len(group),
            "reached": int(sum(bool(r["reached_threshold"]) for r in group)),
            "gap_mean": gap.mean, "gap_std": gap.std,
            "train_loss_mean": float(np.mean([r["train_loss"] for r in group])),
            "test_loss_mean": float(np.mean([r["test_loss"] for r in group])),
            "target_variance_mean": float(np.mean([r["target_variance"] for r in group])),
            **class_bound(group),
        })  # fmt: skip
    deg = [c["degree"] for c in classes]
    spa = [c["sparsity"] for c in classes]
    pooled = fit_power_law([deg, spa], [c["gap_mean"] for c in classes])
    per_seed = []
    for seed in sorted({r["seed"] for r in rows}):
        sel = [r for r in rows if r["seed"] == seed]
        fit = fit_power_law([[r["degree"] for r in sel], [r["sparsity"] for r in sel]],
                            [r["gap"] for r in sel])  # fmt: skip
        per_seed.append(_fit_dict(fit, ["degree_exponent", "sparsity_exponent"]))
    slices: dict[str, list[dict[str, Any]]] = {"degree_at_sparsity": [], "sparsity_at_degree": []}
    for key, axis, other in (("degree_at_sparsity", "degree", "sparsity"),
                             ("sparsity_at_degree", "sparsity", "degree")):  # fmt: skip
        for value in sorted({c[other] for c in classes}):
            sel = [c for c in classes if c[other] == value]
            fit = fit_power_law([[c[axis] for c in sel]], [c["gap_mean"] for c in sel])
            slices[key].append({other: value, **_fit_dict(fit, ["exponent"])})
    reached = [r for r in rows if r["reached_threshold"]]
    reached_fit = fit_power_law([[r["degree"] for r in reached], [r["sparsity"] for r in reached]],
                                [r["gap"] for r in reached])  # fmt: skip
    spread = {n: runner.mean_spread(p[n] for p in per_seed if np.isfinite(p[n]))
              for n in ("degree_exponent", "sparsity_exponent")}  # fmt: skip
    return {
        "classes": classes,
        "pooled": _fit_dict(pooled, ["degree_exponent", "sparsity_exponent"]),
        "per_seed": per_seed,
        "reached_only": _fit_dict(reached_fit, ["degree_exponent", "sparsity_exponent"]),
        "per_seed_spread": {n: {"mean": s.mean, "std": s.std, "n": s.n}
                            for n, s in spread.items()},
        "slices": slices,
        "nonpositive_classes": [[c["degree"], c["sparsity"]] for c in classes
                                if not c["gap_mean"] > 0],
        "num_reached": int(sum(bool(r["reached_threshold"]) for r in rows)),
        "num_functions": len(rows),
    }  # fmt: skip


# ------------------------------------------------------------------------------ report


def _fmt(value: float, digits: int = 3) -> str:
    return runner.format_number(float(value), digits)


def _superlinear(exponent: float, stderr: float) -> bool | None:
    if not np.isfinite(exponent):
        return None
    if exponent - 2 * stderr > 1:
        return True
    return None if exponent + 2 * stderr > 1 else False


def _trend(slices: Sequence[Mapping[str, Any]], other: str) -> runner.KendallTau:
    ok = [s for s in slices if np.isfinite(s["exponent"])]
    return runner.kendall_tau([s[other] for s in ok], [s["exponent"] for s in ok])


def _claims(stats: Mapping[str, Any]) -> list[str]:
    p, spread, lines = stats["pooled"], stats["per_seed_spread"], []
    for claim, name in ((CLAIMS[0], "degree_exponent"), (CLAIMS[1], "sparsity_exponent")):
        e, se = p[name], p[f"{name}_stderr"]
        lines.append(runner.claim_line(claim, _superlinear(e, se), (
            f"fitted exponent {_fmt(e)} ± {_fmt(se, 2)} (OLS s.e., {p['num_points']} class "
            f"means); per seed {_fmt(spread[name]['mean'])} ± {_fmt(spread[name]['std'], 2)} "
            f"(std over {spread[name]['n']} seeds); on the {stats['num_reached']} units that "
            f"reached the loss threshold only (unit gaps): {_fmt(stats['reached_only'][name])} ± "
            f"{_fmt(stats['reached_only'][name + '_stderr'], 2)}; 'super-linear' read as "
            "exponent - 2 s.e. > 1"
        )))  # fmt: skip
    a = _trend(stats["slices"]["degree_at_sparsity"], "sparsity")
    b = _trend(stats["slices"]["sparsity_at_degree"], "degree")
    both = [x.tau for x in (a, b)]
    verdict: bool | None = None
    if not any(np.isnan(both)):
        verdict = (
            True if all(t > 0 for t in both) else (False if all(t <= 0 for t in both) else None)
        )
    lines.append(runner.claim_line(CLAIMS[2], verdict, (
        "degree exponent per sparsity "
        + ", ".join(f"w={s['sparsity']}: {_fmt(s['exponent'])}"
                    for s in stats["slices"]["degree_at_sparsity"])
        + f" ({a}); sparsity exponent per degree "
        + ", ".join(f"D={s['degree']}: {_fmt(s['exponent'])}"
                    for s in stats["slices"]["sparsity_at_degree"])
        + f" ({b}); reproduced if both trends are positive"
    )))  # fmt: skip
    return lines


def _class_table(stats: Mapping[str, Any]) -> str:
    header = ["D_f", "omega", "functions", "reached 0.02", "train loss", "test loss",
              "gap (mean ± std)", "target variance", "G_u (construction)", "Sigma (est.)",
              "semi-analytic bound (construction)", "its status (trivial level 1)"]  # fmt: skip
    table = [
        [c["degree"], c["sparsity"], c["num_functions"], c["reached"], c["train_loss_mean"],
         c["test_loss_mean"], runner.Spread(c["gap_mean"], c["gap_std"], float("nan"),
                                            c["num_functions"]).format(3),
         c["target_variance_mean"], c["G_u"], c["subgaussian_scale"], c["bound"],
         c["bound_status"].split("(")[-1].rstrip(")")]
        for c in stats["classes"]
    ]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header))


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict) -> str:
    g = meta["config_grid"]
    t = g["seq_len"]
    lines = [
        f"# {meta['experiment']}: {meta['paper']}", "", meta["description"], "",
        f"Scale `{meta['scale']}`, seeds (functions per class) {meta['seeds']}, "
        f"{meta['num_finished']} of {meta['num_units']} units. T = {t}: {g['num_train']} "
        f"random training strings, the other {2**t - g['num_train']} of {{0,1}}^{t} held out "
        f"(exact test loss over them); degrees {g['degree']}, sparsities {g['sparsity']}; "
        "centred unit-variance coefficients (the paper's). The twin (2 attention layers, 1 "
        f"head, MLP width {g['mlp_width']}, no LayerNorm) is trained by full-batch Adam (lr "
        f"{g['learning_rate']}) until the training loss is at or below {g['loss_threshold']} (cap "
        f"{g['max_steps']} steps); {stats['num_reached']} of {stats['num_functions']} reached "
        "it: the gaps of the others (mostly the high-degree, high-sparsity classes) are "
        "measured at a training loss above the threshold, so the claims also give the fit on "
        "the units that reached it.", "",
        "The bound column is the semi-analytic PAC-Bayes bound of the class's flat "
        "construction (unit-norm version of the functions, G_u over the training inputs, "
        f"Theorem 10's L, m = {g['num_train']}, 20-point sigma mesh, no P, Sigma estimated from "
        "held-out losses of the trained models): a scale beside the gap, not a certified "
        "bound on the trained models.", "",
        "## Gap per class", "", _class_table(stats), "",
        "![gap](figure_gap.png) ![exponents](figure_exponents.png)", "",
        "## Claims", "", *claims_at_scale(_claims(stats), meta["scale"]), "",
    ]  # fmt: skip
    if stats["nonpositive_classes"]:
        lines += [f"Classes with a non-positive mean gap (left out of the log fits): "
                  f"{stats['nonpositive_classes']}.", ""]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def _gap_figure(stats: Mapping[str, Any]):
    classes = stats["classes"]
    figure = runner.new_figure(figsize=(9.0, 3.4))
    if figure is None or not classes:
        return figure
    for i, (axis, other) in enumerate((("degree", "sparsity"), ("sparsity", "degree"))):
        ax = figure.add_subplot(1, 2, i + 1)
        for value in sorted({c[other] for c in classes}):
            sel = [c for c in classes if c[other] == value]
            ax.errorbar([c[axis] for c in sel], [c["gap_mean"] for c in sel],
                        yerr=[np.nan_to_num(c["gap_std"]) for c in sel], fmt="o-", capsize=2,
                        label=f"{other} = {value}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_xlabel(axis)
        ax.set_ylabel("test - train loss")
        ax.set_title(f"gap vs {axis} (mean ± std over functions)", fontsize=9)
        ax.legend(fontsize=6)
    return figure


def _exponent_figure(stats: Mapping[str, Any]):
    figure = runner.new_figure(figsize=(9.0, 3.2))
    if figure is None:
        return figure
    for i, (key, other) in enumerate((("degree_at_sparsity", "sparsity"),
                                      ("sparsity_at_degree", "degree"))):  # fmt: skip
        ax = figure.add_subplot(1, 2, i + 1)
        sl = stats["slices"][key]
        ax.errorbar(
            [s[other] for s in sl],
            [s["exponent"] for s in sl],
            yerr=[np.nan_to_num(s["exponent_stderr"]) for s in sl],
            fmt="o-",
            capsize=3,
        )
        ax.axhline(1.0, color="k", ls="--", lw=1, label="linear")
        ax.set_xlabel(other)
        ax.set_ylabel(f"{key.split('_')[0]} exponent")
        ax.set_title(f"{key.split('_')[0]} exponent per {other} (± OLS s.e.)", fontsize=9)
        ax.legend(fontsize=7)
    return figure


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """Gap and exponent figures, ``statistics.json`` and ``report.md``."""
    stats = statistics(rows)
    figures = {
        "figure_gap.png": _gap_figure(stats),
        "figure_exponents.png": _exponent_figure(stats),
    }
    runner.write_rendered(out_dir, figures, stats, _report(rows, meta, stats))


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Generalization gap (held-out minus training quadratic loss) of the twin trained to "
        "loss 0.02 on random centred Fourier functions per (degree, sparsity) class, fitted "
        "power-law exponents with their spread, beside the class's semi-analytic bound"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 2, "cpu": 2, "paper": 5},
    default_scale="cpu",
)
