r"""Section ``sharpness`` (model ``scalar``): average, worst-case and adaptive sharpness.

At the trained parameters $\theta$ of the ``scalar`` model, with ``loss_fn`` the mean training
loss, reports (all from one jitted program, see :mod:`kernels.sharpness`):

- the Gaussian $\sigma$ used (:data:`SIGMA`, the top of the paper's $\sigma$ mesh $10^{-2}$);
- the Theorem 6/12 decomposition at that $\sigma$: the average sharpness
  $\mathbb E_u L(\theta+u) - L(\theta)$, $u \sim N(0, \sigma^2 I)$, with its standard error
  (antithetic pairs $(u, -u)$), $\frac{\sigma^2}{2}\operatorname{tr}H(\theta)$ and the
  remainder $P$;
- adaptive average sharpness, $u \sim N(0, \sigma^2 \operatorname{diag}(\theta^2))$;
- worst-case sharpness over the $\ell_2$ ball of radius :data:`RADIUS` and adaptive worst-case
  sharpness over $\{|\theta| \odot \eta : \|\eta\|_2 \le \rho\}$ (APGD ascent; lower bounds
  of the maxima).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax

from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row
from kernels.sharpness import (
    Perturbation,
    average_sharpness,
    sharpness_decomposition,
    worst_case_sharpness,
)

__all__ = ["FULL", "QUICK", "RADIUS", "SIGMA", "SharpnessSizes", "sharpness_section"]

#: Gaussian standard deviation of the average sharpness and of the decomposition.
SIGMA = 1e-2
#: Radius of the l2 worst-case balls (plain, and adaptive in units of |θ|).
RADIUS = 0.05
_SECTION = "sharpness"


@dataclasses.dataclass(frozen=True)
class SharpnessSizes:
    """Monte Carlo budgets of the section.

    Attributes:
      num_samples: antithetic pairs $(u, -u)$ of the average sharpness and of the
        decomposition (twice as many loss evaluations).
      num_probes: Hutchinson probes of the trace term.
      num_steps: APGD ascent steps of the worst-case sharpness.
    """

    num_samples: int
    num_probes: int
    num_steps: int


#: Budgets of the default run.
QUICK = SharpnessSizes(num_samples=64, num_probes=64, num_steps=20)
#: Budgets of ``--full``.
FULL = SharpnessSizes(num_samples=512, num_probes=256, num_steps=50)


@functools.partial(jax.jit, static_argnames=("loss_fn", "sizes"))
def _measure(
    loss_fn: Any, params: Any, batch: Any, key: jax.Array, *, sizes: SharpnessSizes
) -> dict:
    """Every number of the section in one program (``loss_fn``, the run's loss, is static)."""
    keys = jax.random.split(key, 4)
    num, steps = sizes.num_samples, sizes.num_steps
    gaussian = Perturbation("gaussian", SIGMA)
    out = {
        "decomposition": sharpness_decomposition(
            loss_fn, params, batch, keys[0], perturbation=gaussian, num_samples=num,
            num_probes=sizes.num_probes,
        ),
        "adaptive_average": average_sharpness(
            loss_fn, params, batch, keys[1],
            perturbation=dataclasses.replace(gaussian, adaptive=True), num_samples=num,
        ),
    }  # fmt: skip
    for name, k, adaptive in (("worst_l2", keys[2], False), ("worst_adaptive_l2", keys[3], True)):
        ball = Perturbation("l2_ball", RADIUS, adaptive=adaptive)
        out[name] = worst_case_sharpness(
            loss_fn, params, batch, k, perturbation=ball, num_steps=steps
        ).value
    return out


def _rows(out: dict, sizes: SharpnessSizes) -> list[Row]:
    s = _SECTION
    dec = out["decomposition"]
    mc = f"{sizes.num_samples} antithetic pairs (u, -u), {2 * sizes.num_samples} loss evaluations"
    steps = sizes.num_steps
    return [
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
            note=f"Hutchinson, {sizes.num_probes} probes",
        ),
        Row.from_estimate(
            s,
            "Thm 6/12: remainder P",
            dec.remainder,
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


def sharpness_section(run: Run, *, sizes: SharpnessSizes | None = None) -> list[Row]:
    """Theorem 6/12 terms, average and worst-case sharpness (plain and adaptive).

    Args:
      run: the trained model and its training loss.
      sizes: Monte Carlo budgets (default :data:`QUICK` or :data:`FULL` after ``run.quick``).
    """
    sizes = sizes or (QUICK if run.quick else FULL)
    t = time.perf_counter()
    out = jax.block_until_ready(
        _measure(run.loss_fn, run.params, run.train, run.section_key(_SECTION), sizes=sizes)
    )
    run.meta["sharpness_seconds"] = time.perf_counter() - t
    return _rows(out, sizes)
