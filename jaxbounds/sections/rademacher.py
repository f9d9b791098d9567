r"""Section ``rademacher`` of ``jaxbounds estimate``: measured Rademacher complexities.

For the trained ``scalar`` model on its training sample $S = (X_1, \dots, X_m)$:

- **search lower bound**: $\mathrm{Rad}_S$ of the class $\{f_\theta : \|\theta_\ell\|_F \le
  \|\hat\theta_\ell\|_F$ for every parameter array $\ell\}$, the norm ball the trained weights
  $\hat\theta$ define, bounded *below* by :func:`kernels.rademacher.rademacher_search`
  (projected gradient ascent per sign vector, from $\hat\theta$ and one random start). Since
  $\|Y_{[CLS]}\|_2 \le 1$, $|f_\theta| \le \|w\|_2 \le \|\hat w\|_2 = b$, which gives the
  one-sided McDiarmid lower confidence bound reported as ``lower``.
- **linear class on the inputs**: $\mathrm{Rad}_S\{X \mapsto \langle W, X\rangle_F :
  \|W\|_F \le 1\}$ on the flattened input sequences, exact sups by the dual norm
  (:func:`kernels.rademacher.rademacher_linear`), with its two-sided McDiarmid interval, and
  the Jensen upper bound $\sqrt{\sum_i\|X_i\|_F^2}/m$ beside it.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.estimate import EstimateContext, Row, register_section
from kernels.norms import project_lp_ball, tree_norm
from kernels.rademacher import rademacher_linear, rademacher_search

__all__ = ["FULL", "QUICK", "rademacher_section"]

#: Monte Carlo sizes of the default run (about 10-20 s on 2 CPU cores).
QUICK: dict[str, Any] = {
    "search_draws": 8,
    "search_steps": 12,
    "search_restarts": 2,
    "search_chunk": 4,
    "linear_draws": 4096,
}
#: Sizes of ``--full``.
FULL: dict[str, Any] = {
    "search_draws": 64,
    "search_steps": 40,
    "search_restarts": 3,
    "search_chunk": 8,
    "linear_draws": 65536,
}


def _ball_projection(params: Any) -> Any:
    """Projection onto the product of per-leaf Frobenius balls of radius ||leaf||."""
    radii = jax.tree_util.tree_map(lambda x: jnp.sqrt(jnp.sum(jnp.square(x))), params)

    def project(p: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x, r: project_lp_ball(x, p=2, radius=r) if x.size > 0 else x, p, radii
        )

    return project


@register_section("rademacher", models=("scalar",))
def rademacher_section(ctx: EstimateContext) -> list[Row]:
    """Search lower bound on the trained-norm ball and the linear-class value of the inputs."""
    cfg = QUICK if ctx.quick else FULL
    s = "rademacher"
    key = ctx.section_key(s)
    k_search, k_linear = jax.random.split(key)
    inputs = jnp.asarray(ctx.train["inputs"])
    m = int(inputs.shape[0])
    params = ctx.params
    total = float(tree_norm(params))
    readout = params.get("w") if isinstance(params, dict) else None
    bound = None if readout is None else float(jnp.linalg.norm(readout))

    # params and inputs enter the compiled program as arguments, not as folded constants
    def search(k: jax.Array, params: Any, inputs: jax.Array) -> Any:
        return rademacher_search(
            ctx.apply_fn,
            params,
            inputs,
            k,
            project=_ball_projection(params),
            num_draws=cfg["search_draws"],
            num_steps=cfg["search_steps"],
            step_size=0.5 * total,
            num_restarts=cfg["search_restarts"],
            chunk_size=cfg["search_chunk"],
            output_bound=bound,
        )

    est = jax.jit(search)(k_search, params, inputs)
    note = (
        f"lower bound: projected gradient ascent over {{||theta_l||_F <= ||trained_l||_F}}, "
        f"{cfg['search_draws']} sign vectors x {cfg['search_restarts']} starts x "
        f"{cfg['search_steps']} steps, m = {m}"
    )
    extra = f"; lower: one-sided 95% McDiarmid, |f| <= ||w||_2 = {bound:.4g}" if bound else ""
    rows = [
        Row(
            s,
            "Rad_S lower bound (search, trained-norm ball)",
            float(est.mean),
            float(est.stderr),
            None if est.lower is None else float(est.lower),
            None,
            note=note + extra,
        )
    ]
    flat = inputs.reshape(m, -1)
    lin = jax.jit(
        lambda k, x: rademacher_linear(x, k, norm=2, radius=1.0, num_draws=cfg["linear_draws"])
    )(k_linear, flat)
    rows.append(
        Row.from_estimate(
            s,
            "Rad_S linear class {<W, X>_F : ||W||_F <= 1} on the inputs",
            lin,
            note=f"exact sups (dual norm), {cfg['linear_draws']} sign vectors; 95% McDiarmid "
            "interval",
        )
    )
    jensen = math.sqrt(float(jnp.sum(jnp.square(flat)))) / m
    name = "linear class Jensen upper bound sqrt(sum ||X_i||_F^2) / m"
    rows.append(Row(s, name, jensen, note="closed form"))
    return rows
