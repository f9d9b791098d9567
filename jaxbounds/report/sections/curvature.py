"""Section ``curvature`` (model ``scalar``): Hessian, Gauss-Newton and Fisher traces, norms.

At the trained parameters, with the mean training loss: the Hessian trace by Hutchinson
(Rademacher probes) and Hutch++ (same budget of Hessian-vector products), the top Hessian
eigenvalues by Lanczos with full reorthogonalisation, the traces of the positive semi-definite
curvature matrices of :mod:`kernels.gauss_newton` (the generalized Gauss-Newton matrix by
Hutchinson on forward-mode quadratic forms, the empirical Fisher exactly from per-example
gradients, the Fisher by labels drawn from the model), and the weight norms (Frobenius norm of
every matrix, total l1 and l2 norms, distance from the initialisation). The Hessian numbers come
from one jitted program on the Hessian operator of ``run.loss_fn`` on the training batch
(:func:`kernels.curvature.hvp`), the Gauss-Newton and Fisher numbers from a second one on
``run.apply_fn`` with the loss of the outputs that ``run.loss_fn`` applies (logistic for scalar
scores, softmax cross-entropy for logits). Budgets come from the run's
:class:`~jaxbounds.report.facts.ScalarConfig` (the Gauss-Newton trace uses ``num_probes``
probes; the Monte Carlo Fisher trace 16 label draws).
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
from kernels.gauss_newton import empirical_fisher_trace, ggn, mc_fisher_trace
from kernels.norms import tree_norm

__all__ = ["curvature_section"]

_SECTION = "curvature"

#: Label draws of the Monte Carlo Fisher trace (each is an exact trace given its labels).
_FISHER_SAMPLES = 16
#: At most this many examples per vectorised batch of per-example gradients (the Fisher traces):
#: the run's training set (300 examples) is one chunk, which compiles one copy of the
#: per-example gradient (a chunk that does not divide n compiles a second one for the rest).
_MAX_EXAMPLE_CHUNK = 512


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
    hutch = hutchinson_trace(op, params, k_hutch, num_samples=num_probes)
    hpp = hutchpp_trace(op, params, k_pp, num_matvecs=hutchpp_matvecs)
    top = top_eigenvalues(op, params, k_lanczos, k=top_k, num_steps=lanczos_steps)
    return hutch, hpp, top


@functools.partial(
    jax.jit, static_argnames=("apply_fn", "loss", "num_probes", "num_samples", "example_chunk")
)
def _gauss_newton(
    apply_fn: Any,
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: str,
    num_probes: int,
    num_samples: int,
    example_chunk: int,
) -> tuple[Any, jax.Array, Any]:
    """GGN trace (Hutchinson), exact empirical-Fisher trace and MC Fisher trace, one program.

    ``apply_fn`` is static (the run's, built once): a second run of the same model compiles
    nothing.
    """
    k_ggn, k_fisher = jax.random.split(key)
    op = ggn(apply_fn, params, batch, loss=loss)
    trace = hutchinson_trace(op, params, k_ggn, num_samples=num_probes)
    emp = empirical_fisher_trace(
        apply_fn, params, batch, loss=loss, example_chunk_size=example_chunk
    )
    mc = mc_fisher_trace(
        apply_fn, params, batch, k_fisher, loss=loss, num_samples=num_samples,
        example_chunk_size=example_chunk,
    )  # fmt: skip
    return trace, emp, mc


def _output_loss(run: Run) -> str:
    """The named loss of the outputs ``run.loss_fn`` applies (``classification_loss``)."""
    inputs, labels = run.train["inputs"], run.train["labels"]
    outputs = jax.eval_shape(run.apply_fn, run.params, inputs)
    return "logistic" if len(outputs.shape) == jnp.ndim(labels) else "cross_entropy"


def _gauss_newton_rows(run: Run, cfg: ScalarConfig) -> list[Row]:
    s = _SECTION
    loss = _output_loss(run)
    batch = (run.train["inputs"], run.train["labels"])
    key = jax.random.fold_in(run.section_key(s), 1)
    n = len(run.train["labels"])
    t = time.perf_counter()
    trace, emp, mc = jax.block_until_ready(
        _gauss_newton(run.apply_fn, run.params, batch, key, loss=loss,
                      num_probes=cfg.num_probes, num_samples=_FISHER_SAMPLES,
                      example_chunk=min(n, _MAX_EXAMPLE_CHUNK))
    )  # fmt: skip
    run.meta["gauss_newton_seconds"] = time.perf_counter() - t
    return [
        Row.from_estimate(
            s, "GGN trace (Hutchinson)", trace,
            note=f"{cfg.num_probes} Rademacher probes, one jvp each; {loss} output Hessian",
        ),
        Row(
            s, "Empirical Fisher trace", float(emp),
            note=f"exact: (1/n) Σ‖∇ℓ_i‖² over the n = {n} training examples",
        ),
        Row.from_estimate(
            s, "Fisher trace (Monte Carlo)", mc,
            note=f"{_FISHER_SAMPLES} draws of labels from the model; unbiased for tr GGN",
        ),
    ]  # fmt: skip


@jax.jit
def _norms(params: Any, init: Any) -> tuple[Any, ...]:
    """Frobenius norms of the matrices, l1 / l2 norms and the distance from init, one program."""
    frobenius = {
        name: jnp.linalg.norm(mat.reshape(-1))
        for name, mat in ScalarTransformer.named_matrices(params).items()
    }
    dist = tree_norm(jax.tree_util.tree_map(jnp.subtract, params, init))
    return frobenius, tree_norm(params, p=1), tree_norm(params), dist


def _norm_rows(params: Any, init: Any) -> list[Row]:
    """Frobenius norm of every matrix, total l1 / l2 norms and the distance from init.

    One jitted program (compiled once per parameter shapes; eagerly, a norm's ``lax.cond``
    compiles anew on every call).
    """
    s = _SECTION
    frobenius, l1, l2, dist = _norms(params, init)
    rows = [Row(s, f"‖{name}‖_F", float(value), note="norm") for name, value in frobenius.items()]
    rows.append(Row(s, "‖θ‖_1 (all weights)", float(l1), note="norm; T&T Fig. 1 quantity"))
    rows.append(Row(s, "‖θ‖_2 (all weights)", float(l2), note="norm"))
    rows.append(Row(s, "‖θ - θ_0‖_2", float(dist), note="norm; distance from initialisation"))
    return rows


def curvature_section(run: Run) -> list[Row]:
    """Hessian traces and top eigenvalues, Gauss-Newton and Fisher traces, weight norms."""
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
    rows += _gauss_newton_rows(run, cfg)
    return rows + _norm_rows(run.params, run.facts.init_params)
