r"""Section ``construction`` (model ``construction``): the flat construction against its theorems.

Rows: the squared parameter norm per matrix against Theorem 10's $L(\omega, D_f, T)$, the largest
error over all inputs against the derived error bound, $G_u = \max_x \|\nabla_\theta
f_\theta(x)\|^2$ (Theorem 14's quantity, computed from the model as SPEC.md asks), and Theorem 13
at an interpolator: a Hutch++ estimate of the Hessian trace of the quadratic loss with the
model's own outputs as labels (an exact interpolator) against the exact
$2\,\frac{1}{m}\sum_x \|\nabla_\theta f_\theta(x)\|^2$; plus the Hessian trace of the loss with
the true labels, where the construction is only approximately interpolating.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.bounds.pac_bayes import construction_norm_bound
from jaxbounds.models.construction import (
    construction_error_bound,
    construction_norm_paper_terms,
    construction_norm_terms,
)
from jaxbounds.report.facts import ConstructionFacts, Run
from jaxbounds.report.rows import Row
from kernels.curvature import hessian_trace

__all__ = ["construction_section"]

_SECTION = "construction"
_MATRICES = ("w_qk1", "w_v1", "w_in", "b_in", "w_out", "w_qk2", "w_v2")


def _norm_rows(run: Run, facts: ConstructionFacts) -> list[Row]:
    """The squared norm, Theorem 10's L and each matrix's term beside the paper's."""
    f, seq_len, s = facts.function, facts.seq_len, _SECTION
    terms = construction_norm_terms(run.model)
    paper = construction_norm_paper_terms(f.sparsity, f.degree, seq_len)
    bound = float(construction_norm_bound(f.sparsity, f.degree, seq_len))
    rows = [
        Row(
            s,
            "squared parameter norm ||theta||^2",
            terms["total"],
            note=f"Theorem 10 [checked]: L(omega={f.sparsity}, D_f={f.degree}, T={seq_len}) = "
            f"{bound:.2f}",
        ),
        Row(s, "norm bound L(omega, D_f, T)", bound, note="Theorem 10"),
    ]
    for name in _MATRICES:
        rows.append(Row(s, f"||{name}||_F^2", terms[name], note=f"paper's term {paper[name]:.4g}"))
    return rows


def _trace_rows(run: Run, outputs: jax.Array, mean_grad_sq: float, num_matvecs: int) -> list:
    """Theorem 13: Hutch++ trace at an interpolator against 2 mean ||grad f||^2; true labels."""
    s, labels = _SECTION, run.train["labels"]
    k_self, k_true = jax.random.split(run.section_key(s))
    # both label sets in the model's output dtype: the second trace reuses the first's program
    dtype = outputs.dtype

    def trace(targets: jax.Array, key: jax.Array) -> Any:
        """Hutch++ trace of the run's quadratic loss with these targets (compiled once)."""
        batch = {**run.train, "labels": jnp.asarray(targets, dtype)}
        return hessian_trace(
            run.loss_fn, run.params, batch, key, num_matvecs=num_matvecs, method="hutchpp",
            chunk_size=8,
        )  # fmt: skip

    # The model's own outputs as labels: an exact interpolator (Theorem 13 holds exactly).
    est = trace(outputs, k_self)
    est_true = trace(labels, k_true)  # the Hessian of the run's loss
    return [
        Row.from_estimate(
            s,
            "tr H at an interpolator (labels = model outputs), Hutch++",
            est,
            note=f"{num_matvecs} products; stderr of the Hutchinson part only",
        ),
        Row(
            s,
            "2 mean_x ||grad_theta f(x)||^2 (Theorem 13, exact)",
            2 * mean_grad_sq,
            note="equals tr H at an interpolator; compare with the row above",
        ),
        Row.from_estimate(
            s,
            "tr H of the loss with the true labels, Hutch++",
            est_true,
            note="the construction is only approximately interpolating at 2 ln T",
        ),
    ]


def construction_section(run: Run, *, num_matvecs: int | None = None) -> list[Row]:
    """Norm vs Theorem 10, exactness, G_u and the Theorem 13 identity for the construction.

    Args:
      run: a ``construction`` run.
      num_matvecs: Hessian-vector products of each Hutch++ trace (default 60, or 300 when the
        run is not quick).
    """
    facts: ConstructionFacts = run.facts
    seq_len, s = facts.seq_len, _SECTION
    inputs, labels = run.train["inputs"], run.train["labels"]
    rows = _norm_rows(run, facts)
    outputs = jax.jit(run.apply_fn)(run.params, inputs)
    err_bound = construction_error_bound(facts.function, seq_len=seq_len)
    rows.append(
        Row(
            s,
            f"max |f_theta(x) - f(x)| over all 2^{seq_len} inputs",
            float(jnp.max(jnp.abs(outputs - labels))),
            note=f"derived bound {err_bound:.4g} at logit scale 2 ln T [rebuilt]",
        )
    )
    loss = float(run.loss_fn(run.params, run.train))
    rows.append(Row(s, "training loss (quadratic, all inputs)", loss))
    rows.append(
        Row(
            s,
            "G_u = max_x ||grad_theta f(x)||^2",
            float(facts.quantities.G_u),
            note="from the model over all inputs (authors report G_u(10, 2) = 15524 at T = 20 "
            "for theirs)",
        )
    )
    num_matvecs = num_matvecs or (60 if run.quick else 300)
    mean_grad_sq = float(jnp.mean(facts.grad_sq))
    return rows + _trace_rows(run, outputs, mean_grad_sq, num_matvecs)
