"""Memory estimates of the kernels' Monte Carlo chunks and linearised products (traced only)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._backend import (
    budgeted_chunk_size,
    gradient_bytes,
    is_accelerator,
    memory_budget,
    program_bytes,
    sample_bytes,
)
from kernels._checks import (
    check_chunk_size,
)
from kernels._operators import (
    _LossOperator,
)

# --------------------------------------------------------------------------- input checks


# Hutchinson's chunk_size="auto": probes one at a time on a CPU (vectorising them measured
# slower there), this many vectorised on an accelerator (the 54k-parameter reference model on
# an H100: 0.53 gradients per probe one at a time, 0.30 in chunks of 16)
_ACCELERATOR_PROBES = 16


def _auto_chunk(chunk_size: Any) -> int:
    """``chunk_size`` with ``"auto"`` resolved for the devices kernels run on (validated)."""
    chunk = check_chunk_size(chunk_size, auto=_ACCELERATOR_PROBES if is_accelerator() else None)
    return 1 if chunk is None else chunk


def _hutchinson_chunk(chunk_size: Any, matvec: Any) -> int:
    """Hutchinson's ``chunk_size``, ``"auto"`` resolved under the memory budget (validated).

    For a loss operator on an accelerator: the largest power of two up to 16 whose probes'
    estimated memory fits ``memory_budget("hutchinson", ...)`` (1.5 gradients, at least
    128 MiB; :func:`kernels._backend.budgeted_chunk_size`); on a CPU one at a time. A plain
    callable has no gradient to compare with: :func:`_auto_chunk` (16 on an accelerator).
    """
    value = check_chunk_size(chunk_size, auto="auto")
    if value != "auto" or not isinstance(matvec, _LossOperator):
        return _auto_chunk(value)
    if not is_accelerator():
        return 1
    params = matvec.params
    try:
        program = program_bytes(matvec.form, params)
    except (TypeError, NotImplementedError):  # no forward-mode derivatives: products
        grad_fn = jax.grad(matvec.scalar_loss())
        program = program_bytes(lambda p: jax.jvp(grad_fn, (p,), (p,))[1], params)
    per_probe = sample_bytes("forms", params=params, program=program)
    budget = memory_budget("hutchinson", gradient_bytes(matvec.scalar_loss(), params))
    chunk = budgeted_chunk_size(
        None, per_sample=per_probe, budget=budget, cap=_ACCELERATOR_PROBES, accelerator=True
    )
    return 1 if chunk is None else chunk


def _products_fit(matvec: Any, product: Any) -> bool:
    """Whether a linearised product, probes one at a time, fits Hutchinson's memory budget.

    Its estimated memory (:func:`kernels._backend.sample_bytes` ``("products", ...)`` of its
    residuals) within ``memory_budget("hutchinson", ...)`` and its residuals within
    ``_PRODUCT_RESIDUAL_BYTES``.
    """
    residuals = _residual_bytes(product)
    if residuals > _PRODUCT_RESIDUAL_BYTES:
        return False
    need = sample_bytes("products", params=matvec.params, residuals=residuals)
    return need <= memory_budget("hutchinson", gradient_bytes(matvec.scalar_loss(), matvec.params))


# Hutchinson's mode="auto" on a one-batch Hessian, probes one at a time: the linearised
# product (its tangent program measured 0.7-1.0x a quadratic form's time per probe, at 54k to
# 124M parameters) while its estimated memory fits the budget of 1.5 gradients (at least
# 128 MiB; kernels._backend.memory_budget: a 4.2M-parameter decoder's product planned 3.7x its
# gradient's temporaries, its quadratic forms 0.54x) and its residuals (the forward and
# backward pass's intermediates) this much at most (3.4 GB at 124M parameters). Chunks of
# probes take quadratic forms, which then share their primal pass: per probe about 4 forward
# passes of matmuls against the tangent program's 6.
_PRODUCT_RESIDUAL_BYTES = 2**30


def _residual_bytes(product: Any) -> int:
    """Bytes a linearised product keeps: the leaves of ``jax.linearize``'s function.

    That function is a ``jax.tree_util.Partial`` whose leaves are its residuals; a function
    that holds none gives 0.
    """
    leaves = jax.tree_util.tree_leaves(product)
    return sum(int(np.prod(jnp.shape(x))) * np.dtype(jnp.result_type(x)).itemsize for x in leaves)
