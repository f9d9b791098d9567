r"""``pac-bayes-perturbation``: the perturbation term P of the flat construction (Section 2.3, E.3).

"A Sharper Picture of Generalization in Transformers" (arXiv 2605.20988) bounds the expected
perturbed training loss of its hard-coded construction by the Theorem 6/12 decomposition
$$\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr}H(\theta)
  + \underbrace{\tfrac12\mathbb E_u[u^\top(H(\theta+\tilde u) - H(\theta))u]}_{P_{raw}},
  \qquad u \sim N(0, \sigma^2 I),$$
and measures the last term empirically (Section 2.3) to build its semi-analytic bound
(:func:`jaxbounds.bounds.pac_bayes.semi_analytic`, where it enters as $\sigma^2 (G_u + P)$, so
$P = P_{raw}/\sigma^2$).

One unit is one target function (the seed) of one class (degree $D_f$, sparsity $\omega$) at one
sequence length T: the construction :func:`jaxbounds.models.construction.construction` of a
random $f = \sum_t c_t\chi_{S_t}$ (``normalization="unit_norm"``: the construction needs
$c_t > 0$, so not the experiments' centred coefficients), evaluated on every input of
$\{0,1\}^T$ (or a random subsample when ``num_inputs`` is set), labelled by **the
construction's own outputs** so that $\theta$ interpolates exactly (the theory's setting:
$L(\theta) = 0$, $\operatorname{tr} H = 2\,\mathrm{mean}\|\nabla f\|^2$, and no cancellation
against $L(\theta)$ in float64). For each $\sigma$ of the paper's 20-point mesh
(1e-2 .. 1e-5) it records $P$ with its Monte Carlo standard error
(:func:`kernels.sharpness.sharpness_decomposition`, antithetic pairs with the control variate
$\frac12 u^\top H u$, float64), the trace term, $G_u = \max_x\|\nabla_\theta f(x)\|^2$, and the
semi-analytic bound of that function with and without P (ln 20 union cost included).

The check-case units (``target="tiling"``, T = 20, $\omega = 10$, $D_f = 2$) measure P on random
subsamples of $\{0,1\}^{20}$ at the mesh and at the continuous $\sigma^* \approx 2.27\cdot10^{-3}$
of E.3, where the paper reports 0.239 without P, 0.327 with its empirical P and 1.01 for an
Edelman-style covering bound.

References:
  arXiv 2605.20988, Section 2.3 and Appendix E.3 (rebuilt, SPEC.md section 5).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbounds.bounds import pac_bayes
from jaxbounds.data.boolean import random_fourier_function, tiling_parities
from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale
from jaxbounds.models import as_pure
from jaxbounds.models.construction import construction
from jaxbounds.models.ntk import ntk_diagonal
from kernels.norms import tree_norm
from kernels.sharpness import Perturbation, sharpness_decomposition
from kernels.walsh import cube_points

__all__ = [
    "CLAIMS",
    "E3",
    "EXPERIMENT",
    "SCALES",
    "check_case",
    "class_bounds",
    "forward",
    "grad_sq",
    "loss",
    "run_unit",
    "statistics",
    "unit_sigmas",
]

NAME = "pac-bayes-perturbation"
PAPER = (
    "A Sharper Picture of Generalization in Transformers, arXiv 2605.20988, Section 2.3 and "
    "Appendix E.3"
)

#: The E.3 check case: tiling of 2-parities on T = 20 and the paper's reported numbers.
E3 = {
    "omega": 10, "D_f": 2, "T": 20, "num_examples": 10**6, "subgaussian_scale": 0.01,
    "G_u": 15524.0, "delta": 0.05, "bound_without_P": 0.239, "semi_analytic": 0.327,
    "edelman": 1.01,
}  # fmt: skip

_SIGMA_STAR = float(
    pac_bayes.optimal_sigma(
        G_u=E3["G_u"],
        norm_sq=pac_bayes.construction_norm_bound(10, 2, 20),
        subgaussian_scale=E3["subgaussian_scale"],
        num_examples=E3["num_examples"],
    )
)

_COMMON = {
    "num_sigmas": 20, "sigma_max": 1e-2, "sigma_min": 1e-5, "labels": "construction",
    "num_examples": E3["num_examples"], "subgaussian_scale": E3["subgaussian_scale"],
    "delta": E3["delta"],
}  # fmt: skip

#: Config grid per scale: ``classes`` ([degree, sparsity]) x ``seq_len`` x functions (seeds),
#: plus ``check_seeds`` input subsamples of the E.3 check case.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {
        **_COMMON, "seq_len": [6], "classes": [[2, 3]], "num_samples": 8,
        "num_probes": 8, "check_num_inputs": 256, "check_seeds": 1,
    },
    "cpu": {
        **_COMMON, "seq_len": [7, 8], "classes": [[1, 1], [1, 7], [2, 1], [2, 7], [3, 7]],
        "num_samples": 32, "num_probes": 32, "check_num_inputs": 512, "check_seeds": 2,
    },
    "paper": {
        **_COMMON, "seq_len": [10, 15, 20],
        "classes": [[d, s] for d in (1, 2, 3, 4, 5) for s in (1, 7, 14, 20)],
        "num_samples": 128, "num_probes": 128, "check_num_inputs": 16384, "check_seeds": 5,
    },
}  # fmt: skip

CLAIMS = (
    "At the E.3 check case the bound without the perturbation term is 0.239",
    "At the E.3 check case the semi-analytic bound with the empirical worst-case P is 0.327",
    "The perturbation term is small relative to the unperturbed sharpness, so the "
    "semi-analytic bound stays close to the bound without P",
    "The Edelman-style covering-number bound at the E.3 check case is 1.01 (vacuous)",
)

PAPER_NUMBERS = {
    "E3": {"sigma_star": 2.27e-3, "bound_without_P": 0.239, "semi_analytic": 0.327,
           "edelman": 1.01, "G_u": 15524, "L": 1303.93},
    "section_2_3": "P over the sigma mesh and several T, 10 functions per class, worst case = "
                   "max over the 10 (values only in the figures)",
}  # fmt: skip


# ------------------------------------------------------------------------------ units


def _units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[runner.Unit]:
    fixed = {k: v for k, v in grid.items() if k not in ("seq_len", "classes", "check_seeds",
                                                      "check_num_inputs")}  # fmt: skip
    units = []
    for t in grid["seq_len"]:
        for degree, sparsity in grid["classes"]:
            config = {"target": "random", "degree": degree, "sparsity": sparsity,
                      "seq_len": t, "num_inputs": None, **fixed}  # fmt: skip
            units.extend(runner.Unit(config, seed) for seed in seeds)
    check = {"target": "tiling", "degree": E3["D_f"], "sparsity": E3["omega"],
             "seq_len": E3["T"], "num_inputs": grid["check_num_inputs"], **fixed}  # fmt: skip
    units.extend(runner.Unit(check, seed) for seed in range(grid["check_seeds"]))
    return units


def unit_sigmas(cfg: Mapping[str, Any]) -> np.ndarray:
    """The sigma mesh of a unit (plus E.3's continuous sigma* for the check case)."""
    mesh = np.geomspace(cfg["sigma_max"], cfg["sigma_min"], cfg["num_sigmas"])
    return np.append(mesh, _SIGMA_STAR) if cfg["target"] == "tiling" else mesh


# ------------------------------------------------------------------------------ model


def forward(params: Mapping[str, jax.Array], bits: jax.Array) -> jax.Array:
    """The construction's output on ``bits`` (batch, T), one-hot positions, no LayerNorm.

    The same function as :class:`~jaxbounds.models.construction.ConstructionTransformer`
    (checked in the tests), written on the parameter dict so one compiled program serves every
    function of a shape.
    """
    batch, t = bits.shape
    dtype = params["w_v2"].dtype
    codes = jnp.broadcast_to(jnp.eye(t + 1, dtype=dtype)[None], (batch, t + 1, t + 1))
    b = jnp.concatenate([bits.astype(dtype), jnp.zeros((batch, 1), dtype)], axis=1)
    x = jnp.concatenate([codes, b[:, :, None], jnp.zeros((batch, t + 1, 1), dtype)], axis=2)
    logits1 = jnp.einsum("bid,de,bje->bij", x, params["w_qk1"], x)
    y = jax.nn.softmax(logits1, axis=-1) @ (x @ params["w_v1"])
    h = x + jax.nn.relu(y @ params["w_in"] + params["b_in"][None, None, :]) @ params["w_out"]
    logits2 = jnp.einsum("bd,de,bje->bj", h[:, t, :], params["w_qk2"], h)
    return jnp.einsum("bj,bj->b", jax.nn.softmax(logits2, axis=-1), h @ params["w_v2"])


def loss(params: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean quadratic loss of :func:`forward` on ``batch["bits"]`` against ``batch["labels"]``."""
    return jnp.mean((forward(params, batch["bits"]) - batch["labels"]) ** 2)


def _function(cfg: Mapping[str, Any], seed: int):
    if cfg["target"] == "tiling":
        return tiling_parities(cfg["seq_len"], cfg["degree"])
    key = jax.random.fold_in(jax.random.key(seed), 1000 * cfg["degree"] + cfg["sparsity"])
    return random_fourier_function(
        jax.random.fold_in(key, cfg["seq_len"]), num_bits=cfg["seq_len"], degree=cfg["degree"],
        sparsity=cfg["sparsity"], normalization="unit_norm",
    )  # fmt: skip


def _inputs(cfg: Mapping[str, Any], seed: int) -> jax.Array:
    t = cfg["seq_len"]
    if cfg["num_inputs"] is None:
        return cube_points(t)
    key = jax.random.fold_in(jax.random.key(seed), 7)
    return jax.random.bernoulli(key, 0.5, (cfg["num_inputs"], t)).astype(jnp.int32)


@jax.jit
def grad_sq(params: Mapping[str, jax.Array], bits: jax.Array) -> jax.Array:
    r"""$\|\nabla_\theta f_\theta(x)\|^2$ for every row $x$ of ``bits``.

    The NTK diagonal of :func:`forward`: its max is $G_u$, twice its mean the Gauss-Newton trace.
    One compiled program per shape, shared by every experiment on this model.
    """
    return ntk_diagonal(forward, params, bits)


@functools.cache
def _labels():
    return jax.jit(forward)


def run_unit(unit: runner.Unit) -> dict[str, Any]:
    """P over the sigma mesh, G_u, norms and the function's semi-analytic bounds (float64)."""
    cfg, seed = unit.config, unit.seed
    with jax.enable_x64(True):
        f = _function(cfg, seed)
        f = type(f)(f.subsets, jnp.asarray(f.coefficients, jnp.float64))
        params = as_pure(construction(f, seq_len=cfg["seq_len"]))[1]
        bits = _inputs(cfg, seed)
        out = _labels()(params, bits)
        target = f(bits)
        labels = out if cfg["labels"] == "construction" else target
        batch = {"bits": bits, "labels": labels}
        grad_norms_sq = np.asarray(grad_sq(params, bits))
        sigmas = unit_sigmas(cfg)
        key = jax.random.fold_in(jax.random.key(seed), 99)
        p_raw, p_se, trace_term, average = [], [], [], []
        for i, sigma in enumerate(sigmas):
            dec = sharpness_decomposition(
                loss, params, batch, jax.random.fold_in(key, i),
                perturbation=Perturbation("gaussian", jnp.asarray(sigma, jnp.float64)),
                num_samples=cfg["num_samples"], num_probes=cfg["num_probes"], chunk_size=None,
            )  # fmt: skip
            p_raw.append(float(dec.remainder.mean))
            p_se.append(float(dec.remainder.stderr))
            trace_term.append(float(dec.trace_term.mean))
            average.append(float(dec.average.mean))
        base_loss = float(loss(params, batch))
        norm_sq = float(tree_norm(params) ** 2)
        max_error = float(jnp.max(jnp.abs(out - target)))
    p_raw, p_se = np.asarray(p_raw), np.asarray(p_se)
    P, P_se = p_raw / sigmas**2, p_se / sigmas**2
    L = float(pac_bayes.construction_norm_bound(cfg["sparsity"], cfg["degree"], cfg["seq_len"]))
    G_u = float(grad_norms_sq.max())
    k = cfg["num_sigmas"]
    bounds = _bounds(cfg, G_u, L, P[:k])
    return {
        "omega": f.sparsity,
        "sigmas": sigmas.tolist(),
        "P": P.tolist(),
        "P_stderr": P_se.tolist(),
        "P_raw": p_raw.tolist(),
        "trace_term": trace_term,
        "average": average,
        "G_u": G_u,
        "grad_sq_mean": float(grad_norms_sq.mean()),
        "norm_sq": norm_sq,
        "L": L,
        "max_error": max_error,
        "loss_at_theta": base_loss,
        "num_inputs_used": int(bits.shape[0]),
        **bounds,
    }


def _bounds(cfg: Mapping[str, Any], G_u: float, L: float, P: np.ndarray) -> dict[str, Any]:
    """The function's semi-analytic bound on the mesh with P (per sigma) and without P."""
    common = {
        "G_u": G_u, "norm_sq": L, "subgaussian_scale": cfg["subgaussian_scale"],
        "num_examples": cfg["num_examples"], "delta": cfg["delta"],
        "sigmas": np.geomspace(cfg["sigma_max"], cfg["sigma_min"], cfg["num_sigmas"]),
    }  # fmt: skip
    with_p = pac_bayes.semi_analytic(remainder=P, **common)
    without = pac_bayes.semi_analytic(**common)
    return {
        "bound_with_P": float(with_p.value), "bound_with_P_sigma": float(with_p.sigma),
        "bound_without_P": float(without.value), "bound_without_P_sigma": float(without.sigma),
    }  # fmt: skip


# ------------------------------------------------------------------------------ statistics


def _classes(rows: Sequence[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    random = [r for r in rows if r["target"] == "random"]
    return runner.group_rows(random, ["seq_len", "degree", "sparsity"], sort=True)


def class_bounds(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per class: worst case over functions (max of P per sigma, of G_u) and the bounds.

    ``P_worst`` is the paper's statistic (the max over the functions of each sigma's estimate);
    ``P_worst_upper`` the max of estimate + 2 standard errors (the Monte Carlo error included).
    """
    cfg = group[0]
    k = cfg["num_sigmas"]
    P = np.asarray([r["P"][:k] for r in group])
    se = np.asarray([r["P_stderr"][:k] for r in group])
    G_u = max(r["G_u"] for r in group)
    common = {
        "G_u": G_u, "norm_sq": cfg["L"], "subgaussian_scale": cfg["subgaussian_scale"],
        "num_examples": cfg["num_examples"], "delta": cfg["delta"],
        "sigmas": np.asarray(cfg["sigmas"][:k]),
    }  # fmt: skip
    worst, upper = P.max(axis=0), (P + 2 * se).max(axis=0)
    with_p = pac_bayes.semi_analytic(remainder=worst, **common)
    with_upper = pac_bayes.semi_analytic(remainder=upper, **common)
    without = pac_bayes.semi_analytic(**common)
    idx = int(np.argmin(np.abs(common["sigmas"] - float(with_p.sigma))))
    return {
        "num_functions": len(group), "G_u": G_u, "L": cfg["L"],
        "P_mean": P.mean(axis=0).tolist(), "P_worst": worst.tolist(),
        "P_worst_upper": upper.tolist(), "P_stderr_mean": se.mean(axis=0).tolist(),
        "bound_without_P": float(without.value), "sigma_without_P": float(without.sigma),
        "bound_with_P": float(with_p.value), "sigma_with_P": float(with_p.sigma),
        "bound_with_P_upper": float(with_upper.value),
        "P_worst_at_sigma": float(worst[idx]),
        "P_over_G_u_at_sigma": float(worst[idx] / G_u),
    }  # fmt: skip


def check_case(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The E.3 numbers: 0.239 reproduced, ours with our P (at sigma* and on the mesh)."""
    check = [r for r in rows if r["target"] == "tiling"]
    if not check:
        return None
    L = float(pac_bayes.construction_norm_bound(E3["omega"], E3["D_f"], E3["T"]))
    common = {"norm_sq": L, "subgaussian_scale": E3["subgaussian_scale"],
              "num_examples": E3["num_examples"], "delta": E3["delta"]}  # fmt: skip
    s = _SIGMA_STAR
    without = float(pac_bayes.semi_analytic(G_u=E3["G_u"], sigmas=[s], **common).value)
    P_star = [r["P"][-1] for r in check]  # the last sigma of a check unit is sigma*
    se_star = [r["P_stderr"][-1] for r in check]
    P_ours = max(P_star)
    ours = float(pac_bayes.semi_analytic(G_u=E3["G_u"], sigmas=[s], remainder=P_ours,
                                         **common).value)  # fmt: skip
    G_ours = max(r["G_u"] for r in check)
    ours_own_G = float(pac_bayes.semi_analytic(G_u=G_ours, sigmas=[s], remainder=P_ours,
                                               **common).value)  # fmt: skip
    k = check[0]["num_sigmas"]
    mesh = np.asarray(check[0]["sigmas"][:k])
    worst = np.asarray([r["P"][:k] for r in check]).max(axis=0)
    mesh_with = pac_bayes.semi_analytic(G_u=E3["G_u"], sigmas=mesh, remainder=worst, **common)
    mesh_without = pac_bayes.semi_analytic(G_u=E3["G_u"], sigmas=mesh, **common)
    return {
        "sigma_star": s, "L": L, "bound_without_P": without,
        "P_at_sigma_star": P_star, "P_stderr_at_sigma_star": se_star, "P_ours": P_ours,
        "semi_analytic_ours": ours, "semi_analytic_ours_own_G_u": ours_own_G,
        "G_u_measured": G_ours, "num_inputs": check[0]["num_inputs_used"],
        "P_implied_by_0.327": (E3["semi_analytic"] - without) / s**2,
        "mesh_without_P": float(mesh_without.value), "mesh_without_P_sigma":
        float(mesh_without.sigma), "mesh_with_P": float(mesh_with.value),
        "mesh_with_P_sigma": float(mesh_with.sigma),
        "max_error": max(r["max_error"] for r in check),
    }  # fmt: skip


def statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-class worst cases and bounds, and the E.3 check case (written to statistics.json)."""
    return {
        "classes": [
            {"seq_len": t, "degree": d, "sparsity": s, **class_bounds(group)}
            for (t, d, s), group in _classes(rows).items()
        ],
        "check_case": check_case(rows),
    }


# ------------------------------------------------------------------------------ report


def _fmt(value: float, digits: int = 3) -> str:
    return runner.format_number(float(value), digits)


def _class_table(stats: Mapping[str, Any]) -> str:
    header = ["T", "D_f", "omega", "functions", "G_u (max)", "L (Thm 10)", "bound without P",
              "its sigma", "worst P at the chosen sigma", "P / G_u", "semi-analytic (worst P)",
              "its sigma", "with P + 2 s.e."]  # fmt: skip
    table = [
        [c["seq_len"], c["degree"], c["sparsity"], c["num_functions"], c["G_u"], c["L"],
         c["bound_without_P"], c["sigma_without_P"], c["P_worst_at_sigma"],
         c["P_over_G_u_at_sigma"], c["bound_with_P"], c["sigma_with_P"],
         c["bound_with_P_upper"]]
        for c in stats["classes"]
    ]  # fmt: skip
    return runner.markdown_table(header, table, align="r" * len(header), digits=4)


def _sigma_table(rows: Sequence[Mapping[str, Any]], stats: Mapping[str, Any]) -> str:
    """P (mean ± std over functions, worst case) at every fourth sigma of the mesh."""
    classes = stats["classes"]
    if not classes:
        return ""
    k = rows[0]["num_sigmas"]
    mesh = np.geomspace(rows[0]["sigma_max"], rows[0]["sigma_min"], k)
    picks = list(range(0, k, max(1, k // 5)))
    header = ["T", "D_f", "omega"] + [f"P at sigma={mesh[i]:.2g}: mean ± std / max" for i in picks]
    groups = _classes(rows)
    table = []
    for c, group in zip(classes, groups.values(), strict=True):
        cells = [c["seq_len"], c["degree"], c["sparsity"]]
        for i in picks:
            spread = runner.mean_spread(r["P"][i] for r in group)
            cells.append(f"{spread.format(3)} / {_fmt(c['P_worst'][i])}")
        table.append(cells)
    return runner.markdown_table(header, table, align="r" * len(header))


def _claims(stats: Mapping[str, Any]) -> list[str]:
    e3, lines = stats["check_case"], []
    if e3 is not None:
        ok = abs(e3["bound_without_P"] - E3["bound_without_P"]) < 5e-4
        lines.append(runner.claim_line(CLAIMS[0], ok, (
            f"ours {e3['bound_without_P']:.4f} at sigma* = {e3['sigma_star']:.4g} with G_u = "
            f"15524, L = {e3['L']:.2f}, Sigma = 0.01, m = 1e6, delta = 0.05, no mesh"
        )))  # fmt: skip
        close = abs(e3["semi_analytic_ours"] - E3["semi_analytic"]) < 5e-3
        lines.append(runner.claim_line(CLAIMS[1], close, (
            f"with our worst-case P = {e3['P_ours']:.4g} at sigma* (max over "
            f"{len(e3['P_at_sigma_star'])} input subsamples of {e3['num_inputs']} inputs; "
            f"standard errors {', '.join(_fmt(x, 2) for x in e3['P_stderr_at_sigma_star'])}) "
            f"the bound at sigma* is {e3['semi_analytic_ours']:.4f}; 0.327 implies P = "
            f"{e3['P_implied_by_0.327']:.4g}; on the 20-point mesh with ln 20 the bound is "
            f"{e3['mesh_with_P']:.4f} (sigma {e3['mesh_with_P_sigma']:.3g}) against "
            f"{e3['mesh_without_P']:.4f} without P"
        )))  # fmt: skip
    else:  # a partial run: the check case's unit has not finished
        lines += [runner.claim_line(c, None, "the E.3 check case has not finished")
                  for c in CLAIMS[:2]]  # fmt: skip
    if stats["classes"]:
        ratios = [abs(c["P_over_G_u_at_sigma"]) for c in stats["classes"]]
        gaps = [c["bound_with_P"] - c["bound_without_P"] for c in stats["classes"]]
        small = max(ratios) < 0.1
        lines.append(runner.claim_line(CLAIMS[2], small, (
            f"over {len(ratios)} (T, class) groups the worst-case |P| / G_u at the chosen sigma "
            f"is at most {max(ratios):.3g} (median {np.median(ratios):.3g}), and the "
            f"semi-analytic bound exceeds the bound without P by at most {max(gaps):.3g} "
            f"(median {np.median(gaps):.3g})"
        )))  # fmt: skip
    else:
        lines.append(runner.claim_line(CLAIMS[2], None, "no (T, class) group has finished"))
    lines.append(runner.claim_line(CLAIMS[3], None, (
        "not computed: Eq. (12) of E.3 and its per-matrix (2,1)-norm budgets lost their "
        "formulas in extraction; matching 1.01 needs that exact form (Edelman et al.'s "
        "constants, the norm conversion of Theorem 10's Frobenius bounds and the log factor "
        "used), which jaxbounds.bounds.edelman does not pin for this architecture"
    )))  # fmt: skip
    return lines


def _check_table(e3: Mapping[str, Any]) -> str:
    header = ["quantity", "paper (E.3)", "ours"]
    table = [
        ["sigma*", "2.27e-3", _fmt(e3["sigma_star"], 4)],
        ["L(10, 2, 20)", "1303.93", _fmt(e3["L"], 6)],
        ["G_u", "15524 (analytic)", f"15524 used; measured max over inputs "
                                    f"{_fmt(e3['G_u_measured'], 5)}"],
        ["bound without P (sigma*)", "0.239", _fmt(e3["bound_without_P"], 4)],
        ["P at sigma*", f"{e3['P_implied_by_0.327']:.4g} (implied by 0.327)",
         _fmt(e3["P_ours"], 4) + " (worst over subsamples)"],
        ["semi-analytic (sigma*, no re-optimisation)", "0.327",
         _fmt(e3["semi_analytic_ours"], 4)],
        ["semi-analytic with our measured G_u", "", _fmt(e3["semi_analytic_ours_own_G_u"], 4)],
        ["20-point mesh + ln 20, without P", "", _fmt(e3["mesh_without_P"], 4)],
        ["20-point mesh + ln 20, with worst P", "", _fmt(e3["mesh_with_P"], 4)],
        ["Edelman-style bound", "1.01", "not computed (see claims)"],
    ]  # fmt: skip
    return runner.markdown_table(header, table)


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict) -> str:
    g = meta["config_grid"]
    e3 = stats["check_case"]
    lines = [
        f"# {meta['experiment']}: {meta['paper']}", "", meta["description"], "",
        f"Scale `{meta['scale']}`, seeds (functions per class) {meta['seeds']}, "
        f"{meta['num_finished']} of {meta['num_units']} units. T = {g['seq_len']} with every "
        f"input of {{0,1}}^T; classes [D_f, omega] = {g['classes']}; "
        f"{g['num_sigmas']}-point sigma mesh {g['sigma_max']:g} .. {g['sigma_min']:g}; "
        f"{g['num_samples']} antithetic pairs and {g['num_probes']} Hutchinson probes per "
        f"sigma; bound settings m = {g['num_examples']:g}, Sigma = {g['subgaussian_scale']}, "
        f"delta = {g['delta']}. The E.3 check case uses {g['check_seeds']} random subsamples "
        f"of {g['check_num_inputs']} inputs of {{0,1}}^20 (P is a training-set average; the "
        "full cube has 2^20 inputs).", "",
        "Labels are the construction's own outputs (an exact interpolator, the theory's "
        "setting); the construction's largest error against the target f is recorded per "
        "unit (`max_error`). Coefficients are unit-norm and positive (the construction needs "
        "c_t > 0), not the experiments' centred ones. P is the Theorem 6/12 remainder "
        "divided by sigma^2, as it enters sigma^2 (G_u + P). The paper's worst case is the "
        "max over the functions of a class; we also give the max of estimate + 2 standard "
        "errors.", "",
    ]  # fmt: skip
    if e3 is not None:
        lines += ["## E.3 check case (tiling of 2-parities, T = 20)", "", _check_table(e3), ""]
    if stats["classes"]:
        lines += [
            "## Semi-analytic bound per class (worst case over functions)", "",
            _class_table(stats), "",
            "## P per class over sigma (mean ± std over functions / max)", "",
            _sigma_table(rows, stats), "",
            "![P vs sigma](figure_P_vs_sigma.png) ![bounds](figure_bounds.png)", "",
        ]  # fmt: skip
    lines += ["## Claims", "", *claims_at_scale(_claims(stats), meta["scale"])]
    return "\n".join(lines).rstrip("\n") + "\n"


def _p_figure(rows: Sequence[Mapping[str, Any]]):
    groups = _classes(rows)
    lengths = sorted({t for t, _, _ in groups})
    figure = runner.new_figure(figsize=(4.4 * max(1, len(lengths)), 3.4))
    if figure is None or not groups:
        return figure
    for i, t in enumerate(lengths):
        ax = figure.add_subplot(1, len(lengths), i + 1)
        for (tt, d, s), group in groups.items():
            if tt != t:
                continue
            k = group[0]["num_sigmas"]
            mesh = np.asarray(group[0]["sigmas"][:k])
            P = np.asarray([r["P"][:k] for r in group])
            (line,) = ax.plot(mesh, P.mean(axis=0), "o-", ms=3, label=f"D={d}, w={s}")
            ax.fill_between(mesh, P.min(axis=0), P.max(axis=0), color=line.get_color(),
                            alpha=0.15)  # fmt: skip
            ax.plot(mesh, P.max(axis=0), ":", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_xlabel("sigma")
        ax.set_ylabel("P = remainder / sigma^2")
        ax.set_title(f"T = {t}: mean over functions, min-max band, max dotted", fontsize=8)
        ax.legend(fontsize=6)
    return figure


def _bounds_figure(stats: Mapping[str, Any]):
    classes = stats["classes"]
    figure = runner.new_figure(figsize=(6.0, 3.4))
    if figure is None or not classes:
        return figure
    ax = figure.add_subplot()
    x = np.arange(len(classes))
    labels = [f"T{c['seq_len']} D{c['degree']} w{c['sparsity']}" for c in classes]
    ax.bar(x - 0.2, [c["bound_without_P"] for c in classes], 0.4, label="without P")
    ax.bar(x + 0.2, [c["bound_with_P"] for c in classes], 0.4, label="semi-analytic (worst P)")
    ax.set_xticks(x, labels, rotation=60, fontsize=6)
    ax.set_ylabel("bound on E L_D (m = 1e6)")
    ax.legend(fontsize=7)
    return figure


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """The P-vs-sigma and bounds figures, ``statistics.json`` and ``report.md``."""
    stats = statistics(rows)
    figures = {"figure_P_vs_sigma.png": _p_figure(rows), "figure_bounds.png": _bounds_figure(stats)}
    runner.write_rendered(out_dir, figures, stats, _report(rows, meta, stats))


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "The perturbation term P of the flat construction's Theorem 6/12 decomposition over the "
        "paper's sigma mesh, several T and random functions per class, the semi-analytic bound "
        "per class with the measured worst case, and the E.3 check case"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    units=_units,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 2, "cpu": 10, "paper": 10},
    default_scale="cpu",
)
