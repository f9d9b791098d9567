"""Section ``curvature`` (model ``scalar``): Hessian trace, top eigenvalues and weight norms.

At the trained parameters, with the mean training loss: the Hessian trace by Hutchinson
(Rademacher probes) and Hutch++ (same budget of Hessian-vector products), the top Hessian
eigenvalues by Lanczos with full reorthogonalisation, and the weight norms (Frobenius norm of
every matrix, total l1 and l2 norms, distance from the initialisation). All curvature numbers
come from one jitted program on the Hessian operator of ``run.loss_fn`` on the training batch
(:func:`kernels.curvature.hvp`). Budgets come from the run's
:class:`~jaxbounds.report.facts.ScalarConfig`.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.models import ScalarTransformer
from jaxbounds.report.facts import Run, ScalarConfig
from jaxbounds.report.rows import Row
from kernels.curvature import hutchinson_trace, hutchpp_trace, hvp, top_eigenvalues
from kernels.norms import tree_norm

__all__ = ["curvature_section"]

_SECTION = "curvature"


@functools.partial(
    jax.jit, static_argnames=("loss_fn", "num_probes", "hutchpp_matvecs", "lanczos_steps", "top_k")
)
def _curvature(
    loss_fn: Any,
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    num_probes: int,
    hutchpp_matvecs: int,
    lanczos_steps: int,
    top_k: int,
) -> tuple[Any, Any, jax.Array]:
    """Hutchinson, Hutch++ and Lanczos on one Hessian operator, in one program.

    ``loss_fn`` is static (keyed by identity: the run's loss, built once), ``params`` and
    ``batch`` are arguments, so a second run of the same model compiles nothing.
    """
    k_hutch, k_pp, k_lanczos = jax.random.split(key, 3)
    op = hvp(loss_fn, params, batch)
    hutch = hutchinson_trace(op, params, k_hutch, num_probes=num_probes)
    hpp = hutchpp_trace(op, params, k_pp, num_matvecs=hutchpp_matvecs)
    top = top_eigenvalues(op, params, k_lanczos, k=top_k, num_steps=lanczos_steps)
    return hutch, hpp, top


def _norm_rows(params: Any, init: Any) -> list[Row]:
    """Frobenius norm of every matrix, total l1 / l2 norms and the distance from init."""
    s = _SECTION
    rows = [
        Row(s, f"‖{name}‖_F", float(jnp.linalg.norm(mat.reshape(-1))), note="norm")
        for name, mat in ScalarTransformer.named_matrices(params).items()
    ]
    rows.append(
        Row(
            s,
            "‖θ‖_1 (all weights)",
            float(tree_norm(params, p=1)),
            note="norm; T&T Fig. 1 quantity",
        )
    )
    rows.append(Row(s, "‖θ‖_2 (all weights)", float(tree_norm(params)), note="norm"))
    dist = float(tree_norm(jax.tree_util.tree_map(jnp.subtract, params, init)))
    rows.append(Row(s, "‖θ - θ_0‖_2", dist, note="norm; distance from initialisation"))
    return rows


def curvature_section(run: Run) -> list[Row]:
    """Hessian trace (Hutchinson, Hutch++), top eigenvalues (Lanczos) and weight norms."""
    s = _SECTION
    cfg: ScalarConfig = run.facts.config
    sizes = {
        "num_probes": cfg.num_probes,
        "hutchpp_matvecs": cfg.hutchpp_matvecs,
        "lanczos_steps": cfg.lanczos_steps,
        "top_k": cfg.top_k,
    }
    t = time.perf_counter()
    hutch, hpp, top = jax.block_until_ready(
        _curvature(run.loss_fn, run.params, run.train, run.section_key(s), **sizes)
    )
    run.meta["curvature_seconds"] = time.perf_counter() - t
    rows = [
        Row.from_estimate(
            s, "Hessian trace (Hutchinson)", hutch,
            note=f"{cfg.num_probes} Rademacher probes, train loss",
        ),
        Row.from_estimate(
            s, "Hessian trace (Hutch++)", hpp,
            note=f"{cfg.hutchpp_matvecs} matvecs; stderr of the Hutchinson part",
        ),
    ]  # fmt: skip
    rows += [
        Row(
            s,
            f"Hessian eigenvalue λ{i}",
            float(v),
            note=f"Lanczos {cfg.lanczos_steps} steps (Ritz value)",
        )
        for i, v in enumerate(top.tolist(), start=1)
    ]
    return rows + _norm_rows(run.params, run.facts.init_params)
