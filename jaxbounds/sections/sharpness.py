r"""Section ``sharpness`` of ``jaxbounds estimate``: average, worst-case and adaptive sharpness.

At the trained parameters $\theta$ of the ``scalar`` model, with ``loss_fn`` the mean training
loss, reports (all from one jitted program, see :mod:`kernels.sharpness`):

- the Gaussian $\sigma$ used (:data:`SIGMA`, the top of the paper's $\sigma$ mesh $10^{-2}$);
- the Theorem 6/12 decomposition at that $\sigma$: the average sharpness
  $\mathbb E_u L(\theta+u) - L(\theta)$, $u \sim N(0, \sigma^2 I)$, with its standard error
  (antithetic pairs), $\frac{\sigma^2}{2}\operatorname{tr}H(\theta)$ and the perturbation term
  $P$;
- adaptive average sharpness, $u \sim N(0, \sigma^2 \operatorname{diag}(\theta^2))$;
- worst-case sharpness over the $\ell_2$ ball of radius :data:`RADIUS` and adaptive worst-case
  sharpness over $\{|\theta| \odot \eta : \|\eta\|_2 \le \rho\}$ (APGD ascent; lower bounds
  of the maxima).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax

from jaxbounds.estimate import EstimateContext, Row, register_section
from kernels.sharpness import (
    Perturbation,
    average_sharpness,
    sharpness_decomposition,
    worst_case_sharpness,
)

__all__ = ["RADIUS", "SIGMA", "sharpness_section"]

#: Gaussian standard deviation of the average sharpness and of the decomposition.
SIGMA = 1e-2
#: Radius of the l2 worst-case balls (plain, and adaptive in units of |θ|).
RADIUS = 0.05
_QUICK = {"num_samples": 128, "num_probes": 64, "num_steps": 20}
_FULL = {"num_samples": 1024, "num_probes": 256, "num_steps": 50}


def _measure(loss_fn: Any, params: Any, key: jax.Array, *, sizes: dict[str, int]) -> dict:
    keys = jax.random.split(key, 4)
    num, steps = sizes["num_samples"], sizes["num_steps"]
    return {
        "decomposition": sharpness_decomposition(
            loss_fn, params, keys[0], sigma=SIGMA, num_samples=num, num_probes=sizes["num_probes"]
        ),
        "adaptive_average": average_sharpness(
            loss_fn,
            params,
            keys[1],
            perturbation=Perturbation("gaussian", SIGMA, adaptive=True),
            num_samples=num,
        ),
        "worst_l2": worst_case_sharpness(
            loss_fn,
            params,
            keys[2],
            perturbation=Perturbation("l2_ball", RADIUS),
            num_steps=steps,
        ).value,
        "worst_adaptive_l2": worst_case_sharpness(
            loss_fn,
            params,
            keys[3],
            perturbation=Perturbation("l2_ball", RADIUS, adaptive=True),
            num_steps=steps,
        ).value,
    }


@register_section("sharpness", models=("scalar",))
def sharpness_section(ctx: EstimateContext) -> list[Row]:
    """Theorem 6/12 terms, average and worst-case sharpness (plain and adaptive)."""
    s = "sharpness"
    sizes = _QUICK if ctx.quick else _FULL
    program = jax.jit(functools.partial(_measure, ctx.loss_fn, sizes=sizes))
    t = time.perf_counter()
    out = jax.block_until_ready(program(ctx.params, ctx.section_key(s)))
    seconds = time.perf_counter() - t
    num, steps = sizes["num_samples"], sizes["num_steps"]
    dec = out["decomposition"]
    mc = f"{num} evaluations in antithetic pairs (u, -u)"
    rows = [
        Row(s, "σ (Gaussian perturbation)", SIGMA, note="u ~ N(0, σ² I) in the rows below"),
        Row.from_estimate(
            s,
            "average sharpness E L(θ+u) - L(θ)",
            dec.average,
            note=f"train loss; {mc}; Thm 6/12 left-hand side",
        ),
        Row.from_estimate(
            s,
            "Thm 6/12: (σ²/2) tr H(θ)",
            dec.trace_term,
            note=f"Hutchinson, {sizes['num_probes']} probes",
        ),
        Row.from_estimate(
            s,
            "Thm 6/12: perturbation term P",
            dec.perturbation,
            note="control variate u^T H u / 2 on the same pairs",
        ),
        Row.from_estimate(
            s,
            "adaptive average sharpness",
            out["adaptive_average"],
            note=f"u ~ N(0, σ² diag(θ²)); {mc}",
        ),
        Row(
            s,
            f"worst-case sharpness (l2, ρ = {RADIUS:g})",
            float(out["worst_l2"]),
            note=f"APGD {steps} steps; lower bound of the max",
        ),
        Row(
            s,
            f"adaptive worst-case sharpness (l2, ρ = {RADIUS:g})",
            float(out["worst_adaptive_l2"]),
            note=f"u = |θ| ⊙ η, ‖η‖_2 ≤ ρ; APGD {steps} steps; lower bound",
        ),
    ]
    ctx.extra.setdefault("meta", {})["sharpness_seconds"] = seconds
    return rows
