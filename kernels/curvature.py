r"""Curvature of a loss: Hessian-vector products, trace estimators, Lanczos, spectral density.

**Operators.** Every kernel acts on a symmetric linear operator ``matvec: v -> A v`` on pytrees
shaped like a template ``like`` (or on vectors of shape ``(n,)`` when ``like`` is an int ``n``).
:func:`hvp` and :func:`dataset_hvp` build the Hessian of ``loss_fn(params, batch)`` as a
registered pytree operator (a frozen dataclass: ``loss_fn`` is static, ``params`` and the data
are leaves), so a kernel called again with new parameters or a new batch of the same shapes
compiles nothing. A kernel that receives such an operator linearises it once per program
(:meth:`HessianOperator.linearize`): the gradient's forward and backward pass at ``params`` run
once and every probe only runs the tangent program. Hutchinson needs only the quadratic forms
$v^\top H v$, which it can take from such an operator by forward over forward mode (the
second derivative of $t \mapsto L(\theta + tv)$, :meth:`HessianOperator.form`): no
linearisation, no backward pass, memory of about a forward pass, and on a dataset operator one
scalar accumulated over the batches. ``hutchinson_trace(..., mode="auto")`` chooses per
problem: for a one-batch :func:`hvp` probed one at a time, the linearised product
$v \cdot Hv$ while its memory fits 1.5 gradients' temporaries (at least 128 MiB, at most
1 GiB of residuals: :mod:`kernels._backend`'s memory budget; its tangent program
costs 0.86-0.90x a quadratic form's arithmetic and 0.63-0.90x its memory traffic per probe in XLA's
cost analysis, at 54k and 26M parameters), quadratic forms beyond (at 124M parameters the
linearisation holds 3.4 GB, 2.5x a gradient's peak memory; at 4.2M parameters its plan is
3.7 gradients' temporaries, the quadratic forms' 0.54) and for chunks of probes (which
then share their primal pass); quadratic forms for dataset and Gauss-Newton operators. Products
are used whenever the loss has no second forward-mode derivative (e.g. a ``jax.custom_vjp``
inside it). A plain callable (``lambda v: d * v``) works too; it is part of the compilation key
by identity, so keep the same object across calls.

**Lanczos.** Full reorthogonalisation against the stored basis, which holds ``num_steps``
vectors ($k n$ numbers): each step runs the three-term recurrence, one classical Gram-Schmidt
pass (two matrix-vector products with the basis; rows not yet written are zero) and a second
pass only when the first removed more than $1 - 1/\sqrt2$ of the vector's norm
(Daniel-Gragg-Kaufman-Stewart), so the basis is read twice per step where it was read four
times (two unconditional passes); a lower-precision basis is read block by block, only the
blocks that hold vectors so far. A step whose $\beta$ falls below $16\,\epsilon\,\|A\|$
(the running estimate $\max_j |\alpha_j| + \beta_{j-1} + \beta_j$) is an invariant subspace
and restarts.
Accuracy: finite-precision Lanczos returns the Ritz values of some $A + E$ with
$\|E\| \approx \epsilon \|A\|$, so eigenvalues are accurate to a few $\epsilon\|A\|$
**absolute**: in float32 beside an outlier $\lambda_{max} = 10^4$ the bulk is resolved to about
$10^{-3}$ (tested); eigenvalues closer than that, or much smaller than $\epsilon\|A\|$, need
float64. ``basis_dtype`` stores the basis in a lower precision (the recurrence stays in the
working dtype): Ritz values then move by at most about $0.1\,u\,\|A\|$ for the basis's unit
roundoff $u$ (measured 0.005-0.05 u; tested at 0.1 u): float32 for float64 work ($\sim
10^{-8}\|A\|$), float16 ($\sim 5\times10^{-5}\|A\|$) or bfloat16 ($\sim
4\times10^{-4}\|A\|$), halving or quartering the basis's memory and traffic.
Memory beside the basis: a loss operator is linearised once and each step runs the tangent
program, so the linearisation's residuals (the forward and backward pass's intermediates)
stay alive for the whole run; ``linearize=False`` recomputes every product from scratch (a
forward-over-reverse ``jax.jvp(jax.grad)``, behind an ``optimization_barrier`` so that XLA
cannot hoist the forward pass out of the loop), which keeps none. Measured in XLA's plan on a
26.4M-parameter decoder, 10 steps: the basis plus 2.55 gradients' temporaries linearised, plus
1.89 recomputed, at 1.65 and 2.06 gradients of time per step; at 124M parameters plus 4.84 and
3.09, at 2.24 and 2.69 (peak memory 11.4 and 9.5 GB).

A dataset too large for one batch: stack equal-size batches along a leading axis and use
:func:`dataset_hvp`; its operator is the Hessian of the mean loss, accumulated batch by batch
with ``lax.scan`` (memory of one batch, no per-example Hessians):

    op = dataset_hvp(loss_fn, params, batches)
    estimate = hutchinson_trace(op, params, key, num_samples=64)

**Compile once.** The program-running kernels are wrapped by :func:`kernels._jit.compile_once`:
array leaves of the arguments are traced, everything else (callables, counts, strings) is static.
Inside a user's ``jax.jit`` / ``vmap`` they are inlined.

**Checks.** Static checks (counts, ``chunk_size``, ``key``, dtypes, sizes) raise ``ValueError``
naming the argument. Runtime checks hold eagerly (``ValueError``) and inside ``jax.jit``
(``JaxRuntimeError`` containing ``"kernels check failed: ..."``): non-finite ``params``, a
non-finite loss at ``params`` (:func:`hvp`), and non-finite products at the probes (with their
count). ``kernels._checks.runtime_checks(False)`` turns the runtime checks off.

**Randomness and memory.** Probe ``i`` uses the key ``jax.random.fold_in(key, i)``, derived inside
the program (:func:`kernels.parallel.sample_statistics`), so memory is that of ``chunk_size``
probes whatever their number, and results depend on neither ``chunk_size`` nor the device count.
Rademacher probes are unpacked from raw 32-bit words (:mod:`kernels._random`: one random bit
per entry, ~9x cheaper to draw than ``jax.random.rademacher`` at 10^8 parameters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

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
    check_finite,
    check_key,
    check_positive,
    check_positive_int,
    check_that,
    describe,
)
from kernels._devices import keep_sharding
from kernels._jit import compile_once
from kernels._names import method_count, renamed_kwargs
from kernels._operators import (
    _all_finite,
    _as_scalar,
    _check_floating,
    _check_params,
    _LossOperator,
    _num_batches,
)
from kernels._random import sign_block, sign_vector
from kernels.estimate import Estimate
from kernels.parallel import (
    check_num_samples,
    map_samples,
    num_leading,
    sample_key,
    sample_layout,
    sample_statistics,
    splits_user_mesh,
    vmap_safe_key,
)

__all__ = [
    "DatasetHessianOperator",
    "DatasetLoss",
    "Estimate",
    "HessianOperator",
    "QuadratureNodes",
    "SpectralDensity",
    "Tridiagonal",
    "dataset_hvp",
    "dataset_loss",
    "hessian_trace",
    "hutchinson_trace",
    "hutchpp_memory_bytes",
    "hutchpp_trace",
    "hvp",
    "lanczos",
    "slq_nodes",
    "spectral_density",
    "top_eigenvalues",
]

Matvec = Callable[[Any], Any]
_MODES = ("auto", "forms", "products")


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


# --------------------------------------------------------------------------- operators


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HessianOperator(_LossOperator):
    r"""The Hessian $v \mapsto \nabla^2_\theta L(\theta, b)\, v$ as a pytree (see :func:`hvp`).

    Attributes:
      loss_fn: ``(params, batch) -> scalar``. Static (part of the compilation key by identity).
      params: pytree $\theta$ at which the Hessian is taken.
      batch: the data pytree $b$ passed to ``loss_fn`` (``()`` or ``None`` for none).
    """

    loss_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any

    def linearize(self) -> tuple[Matvec, jax.Array]:
        """Linearise once: the product function and whether the inputs were finite.

        Runs ``jax.linearize`` of the gradient (one trace of ``loss_fn``, one forward and
        backward pass at ``params``) and the runtime checks of ``params`` and of the loss at
        ``params``.

        Returns:
          ``(product, valid)``: ``product(v)`` $= Hv$ runs only the tangent program; ``valid``
          is a boolean scalar, true when ``params`` and the loss are finite (kernels report
          non-finite products only when it holds, so one cause gives one message).

        Raises:
          ValueError: (runtime check) for non-finite ``params`` or loss; (static) when
            ``loss_fn`` does not return a real floating scalar.
        """
        grad_fn = jax.grad(_as_scalar(self.loss_fn, self.batch), has_aux=True)
        _, product, value = jax.linearize(grad_fn, self.params, has_aux=True)
        return product, _check_loss_at(self.params, value)

    def recomputed(self) -> tuple[Matvec, jax.Array]:
        """Products recomputed: each a forward-over-reverse ``jax.jvp(jax.grad)`` from scratch.

        No linearisation is kept between products (see :meth:`_LossOperator.recomputed`).
        """
        grad_fn = jax.grad(_as_scalar(self.loss_fn, self.batch), has_aux=True)

        def product(v: Any) -> Any:
            # the barrier ties the parameters to each product's input, so that XLA cannot hoist
            # the forward and backward pass out of a kernel's loop (which would keep them alive)
            params, v = jax.lax.optimization_barrier((self.params, v))
            return jax.jvp(grad_fn, (params,), (v,), has_aux=True)[1]

        return product, self.check_inputs()

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top H v$ by forward over forward mode.

        The second derivative of $t \mapsto L(\theta + t v)$ at 0 (two nested ``jax.jvp``): no
        backward pass, so no activations are kept (memory of about one forward pass with two
        tangents).
        """
        value = _as_scalar(self.loss_fn, self.batch)

        def slope(p: Any) -> jax.Array:
            return jax.jvp(lambda q: value(q)[0], (p,), (v,))[1]

        return jax.jvp(slope, (self.params,), (v,))[1]

    def check_inputs(self) -> jax.Array:
        """The runtime checks of :meth:`linearize` (one forward pass for the loss at ``params``)."""
        return _check_loss_at(self.params, _as_scalar(self.loss_fn, self.batch)(self.params)[0])

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """``p -> loss_fn(p, batch)`` (see :meth:`_LossOperator.scalar_loss`)."""
        return lambda p: _as_scalar(self.loss_fn, self.batch)(p)[0]


def _check_loss_at(params: Any, value: jax.Array) -> jax.Array:
    """Runtime checks of finite ``params`` and loss ``value`` at them; returns the verdict."""
    params_ok = _check_params(params)
    loss_ok = jnp.isfinite(value)
    check_that(
        jnp.logical_or(jnp.logical_not(params_ok), loss_ok),
        "loss_fn: non-finite loss {} at params",
        value,
    )
    return jnp.logical_and(params_ok, loss_ok)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DatasetHessianOperator(_LossOperator):
    r"""$v \mapsto \sum_b w_b \nabla^2_\theta L(\theta, b)\, v$ as a pytree (:func:`dataset_hvp`).

    Attributes:
      loss_fn: ``(params, batch) -> scalar``. Static.
      params: pytree $\theta$.
      batches: pytree whose leaves have a leading axis of length B indexing batches.
      weights: (B,) weights $w_b$.
    """

    loss_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array

    def linearize(self) -> tuple[Matvec, jax.Array]:
        """The product function (a ``lax.scan`` over batches) and whether the inputs were finite.

        Each product runs forward-over-reverse on every batch in turn; nothing is shared between
        products (that would hold every batch's residuals). The loss itself is not evaluated: a
        non-finite loss shows as non-finite products, which the kernels count and report.

        Returns:
          ``(product, valid)`` as :meth:`HessianOperator.linearize`.

        Raises:
          ValueError: (runtime check) for non-finite ``params`` or ``weights``.
        """
        valid = self.check_inputs()
        loss_fn, params = self.loss_fn, self.params

        def product(v: Any) -> Any:
            def body(acc: Any, xs: Any) -> tuple[Any, None]:
                batch, weight = xs
                grad_fn = jax.grad(_as_scalar(loss_fn, batch), has_aux=True)
                hv = jax.jvp(grad_fn, (params,), (v,), has_aux=True)[1]
                acc = jax.tree_util.tree_map(lambda a, h: a + weight.astype(a.dtype) * h, acc, hv)
                return acc, None

            zero = jax.tree_util.tree_map(jnp.zeros_like, v)
            return jax.lax.scan(body, zero, (self.batches, self.weights))[0]

        return product, valid

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top H v = \sum_b w_b\, v^\top \nabla^2 L_b v$ by forward over forward mode.

        One batch at a time (a ``lax.scan`` accumulating a scalar): no parameter-sized
        accumulator, no backward pass.
        """

        def body(total: jax.Array, xs: Any) -> tuple[jax.Array, None]:
            batch, weight = xs
            term = HessianOperator(self.loss_fn, self.params, batch).form(v)
            return total + (weight.astype(term.dtype) * term).astype(total.dtype), None

        zero = jnp.zeros((), jnp.result_type(*jax.tree_util.tree_leaves(self.params)))
        return jax.lax.scan(body, zero, (self.batches, self.weights))[0]

    def check_inputs(self) -> jax.Array:
        """Runtime checks of finite ``params`` and ``weights`` (the loss is not evaluated)."""
        params_ok = _check_params(self.params)
        check_finite(self.weights, "weights")
        return jnp.logical_and(params_ok, _all_finite(self.weights))

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """The first batch's loss (see :meth:`_LossOperator.scalar_loss`)."""
        first = jax.tree_util.tree_map(lambda a: a[0], self.batches)
        return HessianOperator(self.loss_fn, self.params, first).scalar_loss()


def hvp(loss_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any) -> HessianOperator:
    r"""Hessian-vector product operator of a scalar loss at ``params`` on one batch.

    Returns the operator $v \mapsto \nabla^2_\theta L(\theta, b)\, v$, computed
    forward-over-reverse. Kernels receiving it linearise it once per program (the gradient's
    forward and backward pass at $\theta$ run once; each probe runs only the tangent program);
    called directly, ``op(v)`` linearises for that one product.

    Args:
      loss_fn: ``(params, batch) -> scalar`` loss; must be traceable. Keep the same function
        object across calls (it keys the compilation cache).
      params: pytree $\theta$ of float32/float64 arrays at which the Hessian is taken.
      batch: data pytree passed to ``loss_fn`` (``()`` or ``None`` when there is none).

    Returns:
      A :class:`HessianOperator` (a pytree), ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``params`` is empty or not float32/float64 (here); when applied, if
        ``loss_fn`` does not return a real scalar, or (runtime check) ``params`` or the loss
        at ``params`` is not finite.

    >>> import jax.numpy as jnp
    >>> op = hvp(lambda x, batch: jnp.sum(x**3), jnp.array([1.0, 2.0]), ())
    >>> op(jnp.array([1.0, 1.0]))
    Array([ 6., 12.], dtype=float32)
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    _check_floating(params, "params")
    return HessianOperator(loss_fn=loss_fn, params=params, batch=batch)


def dataset_hvp(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    weights: jax.Array | None = None,
) -> DatasetHessianOperator:
    r"""Hessian-vector product of a loss averaged over data batches, one batch in memory at a time.

    $$H v = \sum_b w_b \nabla^2 L_b(\theta) v,$$ with $L_b$ = ``loss_fn(params, batch_b)`` and
    $w_b = 1/B$ by default (the dataset mean when batches have equal size). Each product scans
    the batches with ``lax.scan`` (forward-over-reverse per batch), so memory holds one batch and
    no per-example Hessians; pass the result to :func:`hutchinson_trace` and friends.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss on one batch.
      params: pytree of float32/float64 arrays at which the Hessian is taken.
      batches: pytree whose leaves have a leading axis of length B >= 1 indexing batches.
      weights: optional (B,) weights $w_b$ (e.g. batch sizes over the total).

    Returns:
      A :class:`DatasetHessianOperator`, ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``params`` is empty or not float32/float64, ``batches`` has no leaves, no
        batch or disagreeing leading axes, ``weights`` does not have shape (B,); when applied,
        for a non-scalar loss or (runtime check) non-finite ``params`` / ``weights``.

    >>> import jax.numpy as jnp
    >>> loss = lambda p, b: 0.5 * jnp.sum(b * p**2)
    >>> op = dataset_hvp(loss, jnp.zeros(2), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> op(jnp.ones(2))
    Array([2., 3.], dtype=float32)
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    _check_floating(params, "params")
    num_batches = _num_batches(batches)
    dtype = ravel_pytree(params)[0].dtype
    if weights is None:
        weights = jnp.full((num_batches,), 1.0 / num_batches, dtype=dtype)
    elif jnp.shape(weights) != (num_batches,):
        raise ValueError(f"weights: expected shape ({num_batches},), got {jnp.shape(weights)}")
    return DatasetHessianOperator(
        loss_fn=loss_fn, params=params, batches=batches, weights=jnp.asarray(weights)
    )


def _streamed_mean(loss_fn: Callable[[Any, Any], jax.Array], params: Any, batches: Any) -> Any:
    """Mean of ``loss_fn(params, batch_b)`` over the batches' leading axis (a ``lax.scan``)."""

    def body(total: jax.Array, batch: Any) -> tuple[jax.Array, None]:
        return total + loss_fn(params, batch), None

    first = jax.eval_shape(loss_fn, params, jax.tree_util.tree_map(lambda a: a[0], batches))
    _check_loss(first)
    total = jax.lax.scan(body, jnp.zeros((), first.dtype), batches)[0]
    return total / jnp.asarray(num_leading(batches), first.dtype)


def _check_loss(value: Any) -> None:
    shape, dtype = jnp.shape(value), jnp.result_type(value)
    if shape != () or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"loss_fn: must return a real floating scalar, got {dtype} of shape {shape}"
        )


def _streamed_fwd(loss_fn: Callable[[Any, Any], jax.Array], params: Any, batches: Any):
    """Value and gradient accumulated batch by batch (one batch's residuals alive at a time)."""
    value_grad = jax.value_and_grad(loss_fn)

    def body(carry: tuple[Any, Any], batch: Any) -> tuple[tuple[Any, Any], None]:
        total, grads = carry
        value, grad = value_grad(params, batch)
        return (total + value, jax.tree_util.tree_map(jnp.add, grads, grad)), None

    first = jax.eval_shape(loss_fn, params, jax.tree_util.tree_map(lambda a: a[0], batches))
    _check_loss(first)
    zero = (jnp.zeros((), first.dtype), jax.tree_util.tree_map(jnp.zeros_like, params))
    total, grads = jax.lax.scan(body, zero, batches)[0]
    count = num_leading(batches)
    mean_grad = jax.tree_util.tree_map(lambda g: g / jnp.asarray(count, g.dtype), grads)
    return total / jnp.asarray(count, first.dtype), (mean_grad, batches)


def _streamed_bwd(loss_fn: Callable[[Any, Any], jax.Array], res: Any, cotangent: jax.Array):
    del loss_fn
    mean_grad, batches = res
    zero_batches = jax.tree_util.tree_map(_zero_cotangent, batches)
    return jax.tree_util.tree_map(lambda g: cotangent.astype(g.dtype) * g, mean_grad), zero_batches


def _zero_cotangent(leaf: jax.Array) -> jax.Array:
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
        return jnp.zeros_like(leaf)
    return np.zeros(jnp.shape(leaf), jax.dtypes.float0)


_streamed = jax.custom_vjp(_streamed_mean, nondiff_argnums=(0,))
_streamed.defvjp(_streamed_fwd, _streamed_bwd)


@dataclasses.dataclass(frozen=True)
class DatasetLoss:
    r"""The mean loss over stacked batches, streamed (see :func:`dataset_loss`).

    Attributes:
      loss_fn: ``(params, batch) -> scalar`` mean loss on one batch.
    """

    loss_fn: Callable[[Any, Any], jax.Array]

    def __call__(self, params: Any, batches: Any) -> jax.Array:
        r"""$\frac1B \sum_b$ ``loss_fn(params, batches[b])``, one batch at a time."""
        _num_batches(batches)
        return _streamed(self.loss_fn, params, batches)


def dataset_loss(loss_fn: Callable[[Any, Any], jax.Array]) -> DatasetLoss:
    r"""The mean of a loss over a dataset of stacked batches, one batch in memory at a time.

    Returns ``dataset_fn(params, batches)`` $= \frac1B \sum_{b=1}^B L(\theta, \text{batch}_b)$,
    where ``batches`` is a pytree whose leaves have a leading axis of length B (equal-size
    batches, so this is the mean over the whole dataset). The value is a ``lax.scan`` of
    forward passes; its gradient (a ``jax.custom_vjp``) is gradient accumulation: one
    value-and-gradient per batch, summed, so reverse mode costs B batch gradients and holds the
    activations of one batch, never of all B. Pass it as the ``loss_fn`` of
    :func:`~kernels.sharpness.average_sharpness`, :func:`~kernels.sharpness.worst_case_sharpness`
    and friends with ``batch=batches``. Equal callables compare equal (a frozen dataclass), so
    ``dataset_loss(f)`` made twice keys the same compiled program.

    Forward-mode differentiation (``jax.jvp``, hence Hessian-vector products) of the result is
    not defined (a ``custom_vjp``): for dataset-level curvature use :func:`dataset_hvp`.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss on one batch; traceable.

    Returns:
      A :class:`DatasetLoss`, ``dataset_fn(params, batches) -> scalar``.

    Raises:
      ValueError: if ``loss_fn`` is not callable; when called, if ``batches`` has no leaves or
        leaves with different leading axes, or ``loss_fn`` does not return a real scalar.

    >>> import jax, jax.numpy as jnp
    >>> mean_loss = dataset_loss(lambda w, b: jnp.mean((b - w) ** 2))
    >>> batches = jnp.array([[0.0, 2.0], [4.0, 6.0]])  # two batches of two examples
    >>> float(mean_loss(1.0, batches)), float(jax.grad(mean_loss)(1.0, batches))
    (9.0, -4.0)
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    return DatasetLoss(loss_fn)


# --------------------------------------------------------------------------- flat problem


@dataclasses.dataclass(frozen=True)
class _Flat:
    """An operator on flat vectors of one dtype, linearised once, with its input verdict."""

    size: int
    dtype: Any
    matvec: Callable[[jax.Array], jax.Array] | None  # None when only ``form`` is set up
    valid: jax.Array
    name: str  # the argument a non-finite product is blamed on
    form: Callable[[jax.Array], jax.Array] | None = None  # x -> x^T A x (set by _setup_forms)
    # x -> x^T A x on pytrees shaped like ``template`` (forms of a loss operator only)
    tree_form: Callable[[Any], jax.Array] | None = None
    template: Any = None

    def leafwise(self, key: jax.Array, kind: str) -> bool:
        """Whether Rademacher probes are drawn leaf by leaf (:func:`_leaf_probe`).

        On a user's mesh a flat probe would be split into the parameters' leaves, which
        gathers sharded leaves; the leaves of the same probe are drawn where they live instead
        (threefry keys with JAX's partitionable threefry, up to 2**32 parameters).
        """
        return (
            self.tree_form is not None
            and kind == "rademacher"
            and sample_layout() is not None
            and vmap_safe_key(key)
            and bool(jax.config.jax_threefry_partitionable)
            and self.size <= 2**32
        )

    def leaf_probe(self, key: jax.Array) -> Any:
        """The Rademacher probe of ``key`` as a pytree: ``unravel(probe(key))``, leaf by leaf."""
        leaves, treedef = jax.tree_util.tree_flatten(self.template)
        out, start = [], 0
        for leaf in leaves:
            shape = tuple(np.shape(leaf))
            out.append(sign_block(key, start, shape, jnp.result_type(leaf)))
            start += int(np.prod(shape))
        return keep_sharding(jax.tree_util.tree_unflatten(treedef, out), self.template)

    def probe(self, key: jax.Array, kind: str = "rademacher") -> jax.Array:
        if kind == "rademacher":
            return sign_vector(key, self.size, self.dtype)
        return jax.random.normal(key, (self.size,), dtype=self.dtype)

    def check_products(self, num_bad: jax.Array, total: int, unit: str) -> None:
        """Runtime check: no non-finite product (reported only when the inputs were finite)."""
        check_that(
            jnp.logical_or(num_bad == 0, jnp.logical_not(self.valid)),
            f"{self.name}: non-finite products at {{}} of the {total} {unit}",
            num_bad,
        )


def _template(like: Any) -> Any:
    """Turn ``like`` (pytree or int n) into a pytree template."""
    if isinstance(like, int | np.integer) and not isinstance(like, bool):
        check_positive_int(like, "like")
        return jnp.zeros((int(like),), dtype=jnp.result_type(float))
    _check_floating(like, "like")
    return like


def _check_like(matvec: _LossOperator, like: Any) -> None:
    """Static: ``like`` has the pytree structure and shapes of the operator's ``params``."""

    def shapes(tree: Any) -> tuple[Any, list[tuple[int, ...]]]:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, [jnp.shape(leaf) for leaf in leaves]

    if shapes(like) != shapes(matvec.params):
        raise ValueError("like: expected the pytree structure and shapes of the operator's params")


def _linear(matvec: Any, like: Any, linearize: bool = True) -> tuple[Matvec, jax.Array, str]:
    """Linearise a loss operator once (checking ``like`` against it); pass a callable through.

    With ``linearize`` false a loss operator's products are recomputed each time instead.
    """
    if isinstance(matvec, _LossOperator):
        _check_like(matvec, like)
        product, valid = matvec.linearize() if linearize else matvec.recomputed()
        return product, valid, "loss_fn"
    if not callable(matvec):
        raise ValueError(f"matvec: expected a callable v -> A v, got {type(matvec).__name__}")
    return matvec, jnp.asarray(True), "matvec"


def _forward_mode_ok(form: Callable[[Any], jax.Array], params: Any) -> bool:
    """Whether a loss operator's ``form`` (jitted) traces at ``params``.

    It does when the loss has second forward-mode derivatives; a ``jax.custom_vjp`` inside the
    loss has none, and the kernels then use Hessian-vector products.
    """
    try:
        jax.eval_shape(form, params)
    except (TypeError, NotImplementedError):  # what JAX raises for a custom_vjp under jvp
        return False
    return True


def _setup_forms(matvec: Any, like: Any, mode: str = "auto", chunk: int = 1) -> _Flat:
    """The flat problem of a quadratic-form estimator (Hutchinson).

    ``form``: ``x -> x^T A x``, either by forward over forward mode (a loss operator whose
    loss has forward-mode derivatives: no linearisation, no Hessian-vector product) or as
    ``x . (A x)`` from the products of :func:`_setup` (the operator linearised once). Which
    one: ``mode`` (``"auto"``: :func:`_auto_uses_products`).
    """
    # on a user's mesh, quadratic forms on the parameters' leaves (products would flatten
    # them: gathers), and any products are recomputed inside the shard_maps of the samples
    inside = not splits_user_mesh()
    placed = sample_layout() is not None
    if not isinstance(matvec, _LossOperator) or mode == "products":
        return _with_product_forms(_setup(matvec, like, linearize=inside))
    form = jax.jit(matvec.form)
    valid = None
    if mode == "auto" and isinstance(matvec, HessianOperator) and chunk == 1 and not placed:
        like = _template(like)
        _check_like(matvec, like)
        product, valid = matvec.linearize()
        if _products_fit(matvec, product):
            return _with_product_forms(_setup(matvec, like, (product, valid, "loss_fn")))
    if not _forward_mode_ok(form, matvec.params):  # e.g. a custom_vjp in the loss
        return _with_product_forms(_setup(matvec, like, linearize=inside))
    like = _template(like)
    _check_like(matvec, like)
    valid = matvec.check_inputs() if valid is None else valid
    size, dtype, unravel = _flat_space(like)

    def flat_form(x: jax.Array) -> jax.Array:
        return form(unravel(x)).astype(dtype)

    def tree_form(tree: Any) -> jax.Array:
        return form(tree).astype(dtype)

    return _Flat(size, dtype, None, valid, "loss_fn", flat_form, tree_form, matvec.params)


def _with_product_forms(flat: _Flat) -> _Flat:
    return dataclasses.replace(flat, form=lambda x: jnp.vdot(x, flat.matvec(x)))


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


def _flat_space(like: Any) -> tuple[int, Any, Callable[[jax.Array], Any]]:
    """Size, dtype and unravel function of the flat vectors of the pytree template ``like``."""
    flat, unravel = ravel_pytree(jax.tree_util.tree_map(jnp.zeros_like, like))
    return flat.size, flat.dtype, unravel


def _setup(matvec: Any, like: Any, linear: tuple | None = None, linearize: bool = True) -> _Flat:
    """The flat problem of ``matvec``: linearised once unless ``linearize`` is false.

    ``linear``: the operator already linearised, ``(product, valid, name)``.
    """
    like = _template(like)
    if linear is None:
        linear = _linear(matvec, like, _check_linearize(linearize))
    product, valid, name = linear
    size, dtype, unravel = _flat_space(like)

    def flat_mv(x: jax.Array) -> jax.Array:
        out = ravel_pytree(product(unravel(x)))[0]
        if out.shape != (size,):
            raise ValueError(
                f"like: has {size} elements but {name} returns {out.size}: pass a template of "
                "the operator's input and output shape"
            )
        if not jnp.issubdtype(out.dtype, jnp.floating):
            raise ValueError(f"{name}: must return floating values, got {out.dtype}")
        return out.astype(dtype)

    return _Flat(size, dtype, flat_mv, valid, name)


def _check_linearize(linearize: Any) -> bool:
    if not isinstance(linearize, (bool, np.bool_)):
        raise ValueError(f"linearize: expected True or False, got {describe(linearize)}")
    return bool(linearize)


def _num_bad_rows(*arrays: jax.Array) -> jax.Array:
    """Number of leading-axis rows with a non-finite element in any of ``arrays``."""
    finite = [jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1) for a in arrays]
    return jnp.sum(jnp.logical_not(jnp.all(jnp.stack(finite), axis=0))).astype(jnp.int32)


# kernels that keep one output per probe (SLQ's nodes, Hutch++'s sketch) index their probes
# with uint32 and count them in int32: at most this many (their outputs would need 2**31 rows)
_MAX_KEPT = 2**31 - 1


def _check_kept_count(value: Any, name: str) -> int:
    """An int in ``[1, 2**31 - 1]``: a count of probes whose outputs are all kept."""
    num = check_positive_int(value, name)
    if num > _MAX_KEPT:
        raise ValueError(
            f"{name}: at most 2**31 - 1 (every probe's output is kept in memory, one row "
            f"each), got {num}"
        )
    return num


def _indices(num: int) -> jax.Array:
    """Probe indices ``0 .. num - 1`` (``num`` checked by :func:`_check_kept_count`)."""
    return jnp.arange(num, dtype=jnp.uint32)


def _check_basis_dtype(basis_dtype: Any, work: Any) -> Any:
    """The dtype the Lanczos basis is stored in: ``None`` is the working dtype ``work``."""
    if basis_dtype is None:
        return np.dtype(work)
    try:
        dtype = np.dtype(jnp.dtype(basis_dtype))
    except TypeError:
        raise ValueError(
            f"basis_dtype: expected None or one of {_BASIS_DTYPES}, got {basis_dtype!r}"
        ) from None
    if dtype.name not in _BASIS_DTYPES or dtype.itemsize > np.dtype(work).itemsize:
        size = np.dtype(work).itemsize
        allowed = [d for d in _BASIS_DTYPES if np.dtype(jnp.dtype(d)).itemsize <= size]
        raise ValueError(
            f"basis_dtype: expected None or one of {allowed} (at most the working precision "
            f"{np.dtype(work).name}), got {dtype.name}"
        )
    return dtype


# --------------------------------------------------------------------------- trace estimators


def _hutchinson(
    matvec: Any,
    like: Any,
    key: Any,
    num_samples: int,
    chunk_size: Any,
    probe: str,
    mode: str = "auto",
) -> Estimate:
    check_key(key, "key")
    check_num_samples(num_samples, "num_samples", minimum=2)
    chunk = _hutchinson_chunk(chunk_size, matvec)
    if probe not in ("rademacher", "gaussian"):
        raise ValueError(f"probe: expected 'rademacher' or 'gaussian', got {probe!r}")
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    flat = _setup_forms(matvec, like, mode, chunk)

    def one(k: jax.Array) -> jax.Array:
        if flat.leafwise(key, probe):  # a sharded model: the probe's leaves where they live
            return flat.tree_form(flat.leaf_probe(k))
        return flat.form(flat.probe(k, probe))

    stats = sample_statistics(one, key, num_samples=num_samples, chunk_size=chunk)
    flat.check_products(stats.num_nonfinite, num_samples, "probes")
    return stats.estimate()


@renamed_kwargs(num_probes="num_samples")
@compile_once
def hutchinson_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = "auto",
    probe: Literal["rademacher", "gaussian"] = "rademacher",
    mode: Literal["auto", "forms", "products"] = "auto",
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ from products $v \mapsto Av$ (Hutchinson).

    $$\hat t = \frac{1}{m}\sum_{i=1}^m v_i^\top A v_i,$$ unbiased for Rademacher or standard
    Gaussian probes; with Rademacher probes it is exact for diagonal $A$ and its variance is
    $2(\|A\|_F^2 - \sum_i A_{ii}^2)/m$ (Gaussian: $2\|A\|_F^2/m$). The standard error is the
    sample standard deviation of $v_i^\top A v_i$ over $\sqrt m$. Probe $i$ is drawn from
    ``jax.random.fold_in(key, i)`` inside the program and the mean and variance are streamed
    (:func:`kernels.parallel.sample_statistics`), so memory is that of ``chunk_size`` probes.
    For a :func:`hvp` / :func:`dataset_hvp` operator $v_i^\top A v_i$ is computed directly by
    forward over forward mode (module docstring), without the product $A v_i$.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric): a :func:`hvp` /
        :func:`dataset_hvp` operator or any traceable callable.
      like: pytree of float32/float64 arrays (or int n) fixing probe structure and dtype; for a
        loss operator, shaped like its ``params``.
      key: PRNG key (``jax.random.key``).
      num_samples: probes, $2 \le m \le 2^{53}$ (``num_probes`` is its deprecated name). Static.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` runs probes one at a
        time (the least memory); ``"auto"`` (default) is ``None`` on a CPU, where one at a
        time is also fastest for Hessians; on a GPU or TPU, which wants vectorised chunks
        (:func:`kernels._backend.is_accelerator`), for a loss operator the largest power of
        two up to 16 whose probes' estimated memory stays within 1.5 gradients' temporaries
        of its loss (at least 128 MiB; :func:`kernels._backend.memory_budget`,
        :func:`kernels._backend.budgeted_chunk_size`), for a plain callable (no gradient to
        compare with) 16. An int is used as given. It never changes the result beyond float
        reassociation. Static.
      probe: ``"rademacher"`` or ``"gaussian"``.
      mode: how $v^\top A v$ is formed for a loss operator: ``"forms"`` (forward over forward
        mode: no linearisation, memory of about a forward pass), ``"products"``
        ($v \cdot Av$, the operator linearised once: its residuals stay in memory, each probe
        runs the tangent program) or ``"auto"`` (default): products for a one-batch
        :func:`hvp` probed one at a time whose estimated memory (1.6 times the
        linearisation's residuals) stays within 1.5 gradients' temporaries (at least
        128 MiB), else forms (module docstring). ``"products"`` and ``"forms"`` are used as
        given. The two agree to rounding. A plain callable always uses products;
        a loss without forward-mode derivatives (a ``jax.custom_vjp`` inside) falls back to
        products. Static.

    Returns:
      Estimate(mean, stderr, num_samples=m).

    Raises:
      ValueError: for num_samples < 2, a bad ``chunk_size``, ``key`` or ``probe``, a ``like``
        that is not floating or whose size differs from the operator's; (runtime check)
        non-finite ``params`` / loss of a loss operator, or non-finite $v_i^\top A v_i$
        (with how many of the m probes).

    References:
      Hutchinson 1989, doi:10.1080/03610918908812806.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> hutchinson_trace(lambda v: d * v, 3, jax.random.key(0), num_samples=4).mean
    Array(6., dtype=float32)
    """
    return _hutchinson(matvec, like, key, num_samples, chunk_size, probe, mode)


def hutchpp_memory_bytes(num_matvecs: int, size: int, dtype: Any) -> int:
    r"""Memory of the Hutch++ sketch: $3\,s\,n\,b$ bytes with $s = \min(\lfloor m/3\rfloor, n)$.

    The sketch holds $s$ images $A s_j$ of the parameter size $n$ ($b$ bytes per element), the
    QR factorisation's working copy and the basis $Q$: at most three $s \times n$ arrays (XLA
    on CPU reuses one of them: its compiled program measures about $2\,s\,n\,b$). This comes on
    top of what ``chunk_size`` products need, which Hutchinson needs too.

    Args:
      num_matvecs: the budget m of :func:`hutchpp_trace`.
      size: the number of parameters n.
      dtype: the parameters' dtype.

    Returns:
      The number of bytes, a Python int.

    >>> hutchpp_memory_bytes(300, 1_000_000, "float32")  # 100 vectors per copy: 1.2 GB
    1200000000
    """
    num_sketch = min(check_positive_int(num_matvecs, "num_matvecs") // 3, size)
    return 3 * num_sketch * int(size) * np.dtype(dtype).itemsize


def _sketch_basis(flat: _Flat, key: jax.Array, num_sketch: int, chunk: int):
    """Orthonormal basis Q of A S (S Rademacher, row j from fold_in(key, j)) and tr(Q'AQ) terms."""
    images = map_samples(
        lambda j: flat.matvec(flat.probe(sample_key(key, j))),
        _indices(num_sketch),
        chunk_size=chunk,
        key=key,  # an rbg key's draws change under vmap: such a map runs one at a time
    )  # (s, n): rows A s_j
    basis = jnp.linalg.qr(images.T)[0]  # (n, s)

    def column(j: jax.Array) -> jax.Array:
        q = basis[:, j]
        return jnp.vdot(q, flat.matvec(q))

    quad = map_samples(column, _indices(num_sketch), chunk_size=chunk)
    return basis, quad, _num_bad_rows(images) + _num_bad_rows(quad)


def _hutchpp(matvec: Any, like: Any, key: Any, num_matvecs: int, chunk_size: Any) -> Estimate:
    key = check_key(key, "key")
    check_num_samples(num_matvecs, "num_matvecs", minimum=4)
    chunk = _auto_chunk(chunk_size)
    # on a user's mesh the products run inside shard_maps: recomputed there (splits_user_mesh)
    flat = _setup(matvec, like, linearize=not splits_user_mesh())
    num_sketch = min(num_matvecs // 3, flat.size)
    if num_sketch > _MAX_KEPT:
        raise ValueError(
            f"num_matvecs: Hutch++ keeps a sketch of min(num_matvecs // 3, n) vectors, at most "
            f"2**31 - 1; got num_matvecs={num_matvecs} ({num_sketch} sketch vectors)"
        )
    num_hutch = num_matvecs - 2 * num_sketch
    key_sketch, key_hutch = jax.random.split(key)
    # one program may not mix shard_maps over different device sets, and in a multi-process
    # program a subset such as jax.devices()[:k] may leave out every device of some process
    # (whose result would then not be addressable there): every map and statistic below uses
    # the kernel's one placement (all devices, or the parameters' mesh)
    basis, quad, bad = _sketch_basis(flat, key_sketch, num_sketch, chunk)

    def one(k: jax.Array) -> jax.Array:
        g = flat.probe(k)
        g = g - basis @ (basis.T @ g)
        return jnp.vdot(g, flat.matvec(g))

    stats = sample_statistics(one, key_hutch, num_samples=num_hutch, chunk_size=chunk)
    flat.check_products(bad + stats.num_nonfinite, num_matvecs, "products")
    rest = stats.estimate(num_evaluations=num_matvecs)
    return dataclasses.replace(rest, mean=jnp.sum(quad) + rest.mean)


@compile_once
def hutchpp_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_matvecs: int,
    chunk_size: int | Literal["auto"] | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ with Hutch++ (low-rank deflation plus Hutchinson).

    With budget $m$ products: a Rademacher sketch $S$ with $s = \min(\lfloor m/3 \rfloor, n)$
    columns, $Q = \operatorname{orth}(AS)$, and
    $$\hat t = \operatorname{tr}(Q^\top A Q) + \frac{1}{g}\sum_{i=1}^{g}
    g_i^\top (I-QQ^\top) A (I-QQ^\top) g_i,\quad g = m - 2s.$$
    Unbiased; its error falls like $1/m$ instead of $1/\sqrt m$ when $A$ has a few dominant
    eigenvalues. ``stderr`` is the standard error of the Hutchinson part alone (the deflated
    term is treated as fixed given $S$), so it measures the residual variance, not the
    variability of the sketch.

    Memory: unlike Hutchinson, Hutch++ holds its sketch by design: about
    :func:`hutchpp_memory_bytes` $= 3\,s\,n\,b$ bytes ($n$ parameters of $b$ bytes: the $s$
    images $AS$, the QR's working copy and $Q$), i.e. $m/3$ vectors of the parameter size per
    copy, beside the memory of ``chunk_size`` products. The residual probes are streamed.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric); a loss operator is
        linearised once.
      like: pytree of float32/float64 arrays (or int n) fixing probe structure and dtype.
      key: PRNG key.
      num_matvecs: total products m >= 4 (so s >= 1 and g >= 2). Static.
      chunk_size: products per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU (as
        :func:`hutchinson_trace`). Static.

    Returns:
      Estimate(mean, stderr of the Hutchinson part, num_samples=g, num_evaluations=m).

    Raises:
      ValueError: as :func:`hutchinson_trace`, with num_matvecs < 4 in place of num_samples < 2.

    References:
      Meyer, Musco, Musco, Woodruff 2021, "Hutch++", arXiv:2010.09649.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> round(float(hutchpp_trace(lambda v: d * v, 3, jax.random.key(0), num_matvecs=9).mean), 6)
    6.0
    """
    return _hutchpp(matvec, like, key, num_matvecs, chunk_size)


def hessian_trace(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    num_samples: int | None = None,
    num_matvecs: int | None = None,
    method: Literal["hutchinson", "hutchpp"] = "hutchinson",
    chunk_size: int | Literal["auto"] | None = "auto",
    max_memory_bytes: int | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}\nabla^2_\theta L(\theta, b)$ of a loss on one batch.

    Builds :func:`hvp` and runs :func:`hutchinson_trace` (``num_samples`` probes, each
    $v^\top H v$ formed as ``mode="auto"`` chooses: a linearised product or a quadratic form
    by forward over forward mode) or :func:`hutchpp_trace` (``num_matvecs`` products of the
    operator linearised once). For data that does not fit one
    batch use :func:`dataset_hvp` with :func:`hutchinson_trace` (module docstring).

    Args:
      loss_fn: ``(params, batch) -> scalar``; keep the same object across calls.
      params: pytree of float32/float64 arrays.
      batch: data pytree passed to ``loss_fn`` (``()`` or ``None`` for none).
      key: PRNG key.
      num_samples: Hutchinson probes (>= 2), with ``method="hutchinson"``. Static.
      num_matvecs: Hutch++'s budget of Hessian-vector products (>= 4), with
        ``method="hutchpp"``. (With ``method="hutchinson"`` it is the deprecated name of
        ``num_samples``.) Static.
      method: ``"hutchinson"`` (memory of ``chunk_size`` probes) or ``"hutchpp"`` (holds a
        sketch of :func:`hutchpp_memory_bytes` bytes).
      chunk_size: products per vectorised batch, an int >= 1; ``None`` runs them one at a time;
        ``"auto"`` (default): one at a time on a CPU; on an accelerator Hutchinson's probes
        under the memory budget of :func:`hutchinson_trace` (the largest power of two up to 16
        within 1.5 gradients' temporaries, at least 128 MiB), Hutch++'s 16. An int is used
        as given.
      max_memory_bytes: refuse Hutch++ when its sketch would need more bytes than this (an
        int >= 1; ``None``: no limit). Hutchinson's memory does not grow with ``num_samples``.

    Returns:
      Estimate of the trace (see the two estimators for its fields).

    Raises:
      ValueError: for an unknown method, the count of the other method (or both, or neither),
        too few probes or products, a Hutch++ sketch over
        ``max_memory_bytes``, a non-scalar loss, int/float16/empty ``params``, a bad ``key``
        or ``chunk_size``; (runtime check) non-finite ``params``, loss at ``params`` or
        products at the probes.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda p, b: 0.5 * jnp.sum(b * p["w"] ** 2)
    >>> est = hessian_trace(
    ...     loss, {"w": jnp.zeros(2)}, jnp.array([1.0, 2.0]), jax.random.key(0), num_samples=8
    ... )
    >>> est.mean
    Array(3., dtype=float32)
    """
    name, count = method_count(method, num_samples, num_matvecs, stacklevel=2)
    return _hessian_trace(
        loss_fn,
        params,
        batch,
        key,
        count=count,
        count_name=name,
        method=method,
        chunk_size=chunk_size,
        max_memory_bytes=max_memory_bytes,
    )


@compile_once
def _hessian_trace(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    count: int,
    count_name: str,
    method: str,
    chunk_size: int | Literal["auto"] | None,
    max_memory_bytes: int | None,
) -> Estimate:
    """:func:`hessian_trace` once its count is named (``count``: probes or products)."""
    check_positive_int(count, count_name, minimum=2 if method == "hutchinson" else 4)
    if max_memory_bytes is not None:
        check_positive_int(max_memory_bytes, "max_memory_bytes")
    op = hvp(loss_fn, params, batch)
    if method == "hutchinson":
        return _hutchinson(op, params, key, count, chunk_size, "rademacher")
    _check_sketch_memory(params, count, max_memory_bytes)
    return _hutchpp(op, params, key, count, _auto_chunk(chunk_size))


def _check_sketch_memory(params: Any, num_matvecs: int, max_memory_bytes: int | None) -> None:
    """Refuse a Hutch++ sketch larger than ``max_memory_bytes`` (static)."""
    if max_memory_bytes is None:
        return
    leaves = jax.tree_util.tree_leaves(params)
    size = sum(int(np.prod(jnp.shape(leaf))) for leaf in leaves)
    itemsize = max(np.dtype(jnp.result_type(leaf)).itemsize for leaf in leaves)
    need = hutchpp_memory_bytes(num_matvecs, size, f"float{8 * itemsize}")
    if need > max_memory_bytes:
        raise ValueError(
            f"max_memory_bytes: Hutch++ with num_matvecs={num_matvecs} on {size} parameters "
            f"needs a sketch of {need} bytes (3 s n b), more than max_memory_bytes="
            f"{max_memory_bytes}: lower num_matvecs or use method='hutchinson'"
        )


# --------------------------------------------------------------------------- Lanczos


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tridiagonal:
    r"""The Lanczos tridiagonal matrix $T = V^\top A V$ of :func:`lanczos`.

    Attributes:
      diagonal: $(\alpha_1, \dots, \alpha_k)$, shape (k,).
      off_diagonal: $(\beta_1, \dots, \beta_{k-1})$, shape (k-1,); zero where Lanczos broke
        down and restarted (then $T$ is block diagonal).
      start_norm: $\|v_0\|$ of the start vector, so $e_1$ of $T$ is $v_0 / \|v_0\|$ and
        $v_0^\top p(A) v_0 \approx \|v_0\|^2 e_1^\top p(T) e_1$.
    """

    diagonal: jax.Array
    off_diagonal: jax.Array
    start_norm: jax.Array

    def matrix(self) -> jax.Array:
        """The dense k x k matrix $T$ (of an unbatched result)."""
        return _tridiagonal_matrix(self.diagonal, self.off_diagonal)


def _tridiagonal_matrix(diagonal: jax.Array, off: jax.Array) -> jax.Array:
    return jnp.diag(diagonal) + jnp.diag(off, 1) + jnp.diag(off, -1)


# the second Gram-Schmidt pass runs when the first removed more than 1 - _DGKS of w's norm
# (Daniel, Gragg, Kaufman, Stewart 1976: with 1/sqrt(2) the result is orthogonal to working
# precision); a breakdown is a beta below _BREAKDOWN * eps * (running estimate of ||A||)
_DGKS = 0.7071067811865476
_BREAKDOWN = 16.0
_BASIS_DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class _Basis:
    """The Lanczos basis: ``rows`` stored in ``dtype``, scaled; rows not yet written are zero.

    Row i holds ``scale * v_i``: a unit vector's entries are about ``1/sqrt(n)``, below
    float16's normal range at 10^8 parameters, so a float16 basis stores them times
    ``sqrt(n)``. (Holding the basis and the vectors leaf by leaf instead of raveled measured
    the same temporaries and compiled 35-50% slower.)
    """

    rows: jax.Array  # (num_rows, n)
    scale: float
    work: Any  # the working dtype

    @staticmethod
    def create(num_rows: int, size: int, work: Any, dtype: Any) -> _Basis:
        scale = float(np.sqrt(size)) if np.dtype(dtype) == np.float16 else 1.0
        return _Basis(jnp.zeros((num_rows, size), dtype), scale, work)

    def set(self, index: Any, v: jax.Array) -> _Basis:
        """Row ``index`` set to ``v`` (an index past the last row writes nothing)."""
        stored = (v * jnp.asarray(self.scale, v.dtype)).astype(self.rows.dtype)
        return dataclasses.replace(self, rows=self.rows.at[index].set(stored, mode="drop"))

    def project_out(self, w: jax.Array, used: Any) -> jax.Array:
        r"""$w - \sum_{i<used} (v_i^\top w) v_i$ against the stored rows.

        A full-precision basis: classical Gram-Schmidt as two matrix-vector products with
        the whole basis (rows not yet written are zero and change nothing; a loop over the rows
        in use, one sliced row at a time, measured 5-20x slower on CPU at 10^6 parameters).
        A lower-precision basis: block by block (at most 8 blocks, a loop over the blocks in
        use), each block converted to the working dtype, used and dropped (a product with the
        whole converted basis would hold it in full precision).
        """
        rows, work = self.rows, self.work
        inv = jnp.asarray(1.0 / self.scale**2, work)
        if rows.dtype == work:
            return w - jnp.matmul(jnp.matmul(rows, w) * inv, rows)
        num = rows.shape[0]
        block = -(-num // 8)
        pad = -num % block
        if pad:  # whole blocks for the dynamic slices (zero rows change nothing)
            rows = jnp.concatenate([rows, jnp.zeros((pad, rows.shape[1]), rows.dtype)])

        def body(b: jax.Array, w: jax.Array) -> jax.Array:
            blk = jax.lax.dynamic_slice_in_dim(rows, b * block, block).astype(work)
            return w - jnp.matmul(jnp.matmul(blk, w) * inv, blk)

        used_blocks = (jnp.asarray(used, jnp.int32) + (block - 1)) // block
        return jax.lax.fori_loop(0, used_blocks, body, w)

    def orthogonalize(self, w: jax.Array, used: Any) -> tuple[jax.Array, jax.Array]:
        """Gram-Schmidt against the rows in use, a second pass only if the first cancelled.

        Returns ``(w', ||w'||)``. The second pass (DGKS) runs when ``||w'|| < ||w|| / sqrt(2)``.
        """
        before = jnp.linalg.norm(w)
        w = self.project_out(w, used)
        after = jnp.linalg.norm(w)

        def again(w: jax.Array) -> tuple[jax.Array, jax.Array]:
            w = self.project_out(w, used)
            return w, jnp.linalg.norm(w)

        return jax.lax.cond(after < _DGKS * before, again, lambda w: (w, after), w)


def _lanczos_run(
    flat: _Flat,
    key: jax.Array,
    num_steps: int,
    v0: jax.Array | None,
    basis_dtype: Any = None,
):
    r"""Lanczos with full reorthogonalisation and random restarts: (alphas, betas, |v0|).

    Step j: $w = A v_j - \alpha_j v_j - \beta_{j-1} v_{j-1}$ (the three-term recurrence, in
    the working dtype), then Gram-Schmidt against the stored $v_0 \dots v_j$ (one pass, a
    second one only when the first cancelled, :meth:`_Basis.orthogonalize`). A $\beta_j$ at the
    rounding level of $\|A\|$ is an invariant subspace: $\beta_j$ is set to 0 and the next
    vector is a fresh random one orthogonalised against the basis (a restart).
    """
    key_start, key_restart = jax.random.split(key)
    dtype = flat.dtype
    v0 = flat.probe(key_start) if v0 is None else v0.astype(dtype)
    norm0 = jnp.linalg.norm(v0)
    v = v0 / norm0
    store = dtype if basis_dtype is None else basis_dtype
    basis = _Basis.create(num_steps, flat.size, dtype, store).set(0, v)
    eps = jnp.finfo(dtype).eps

    # v_{j-1} for the three-term recurrence: read back from a full-precision basis (a copy
    # that lives only for the subtraction), carried in the working dtype beside a
    # lower-precision one (its rounded row would leave u beta_{j-1} behind, which hides a
    # breakdown and loses orthogonality)
    carry_prev = np.dtype(store) != np.dtype(dtype)

    def step(j: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        if carry_prev:
            rows, v, v_prev, beta_prev, alphas, betas, scale = carry
        else:
            rows, v, beta_prev, alphas, betas, scale = carry
            v_prev = jax.lax.dynamic_index_in_dim(rows, jnp.maximum(j - 1, 0), keepdims=False)
        basis_j = dataclasses.replace(basis, rows=rows)
        w = flat.matvec(v)
        alpha = jnp.vdot(v, w)
        w = w - alpha * v - beta_prev * v_prev
        w, beta = basis_j.orthogonalize(w, j + 1)
        scale = jnp.maximum(scale, jnp.abs(alpha) + beta_prev + beta)
        broke = beta <= _BREAKDOWN * eps * scale

        def restart(w: jax.Array) -> jax.Array:
            fresh = flat.probe(jax.random.fold_in(key_restart, j))
            fresh = basis_j.orthogonalize(fresh, j + 1)[0]
            fresh_norm = jnp.linalg.norm(fresh)
            return fresh / jnp.where(fresh_norm > 0, fresh_norm, 1.0)

        # the restart vector only on breakdown: its Gram-Schmidt reads the basis again
        nxt = jax.lax.cond(broke, restart, lambda w: w / beta, w)
        beta = jnp.where(broke, jnp.zeros_like(beta), beta)
        rows = basis_j.set(j + 1, nxt).rows  # v_k (after the last step) is not kept
        rest = (beta, alphas.at[j].set(alpha), betas.at[j].set(beta), scale)
        return (rows, nxt, v, *rest) if carry_prev else (rows, nxt, *rest)

    zeros = jnp.zeros((num_steps,), dtype)
    zero = jnp.zeros((), dtype)
    prev = (jnp.zeros_like(v),) if carry_prev else ()
    init = (basis.rows, v, *prev, zero, zeros, zeros, zero)
    out = jax.lax.fori_loop(0, num_steps, step, init)
    alphas, betas = out[-3], out[-2]
    return alphas, betas[:-1], norm0


def _bad_steps(alphas: jax.Array, betas: jax.Array) -> jax.Array:
    """Number of Lanczos steps whose alpha or (kept) beta is not finite."""
    return _num_bad_rows(alphas, jnp.concatenate([betas, jnp.zeros((1,), betas.dtype)]))


def _check_steps(num_steps: int, size: int) -> int:
    _check_kept_count(num_steps, "num_steps")
    if num_steps > size:
        raise ValueError(f"num_steps: expected at most the dimension {size}, got {num_steps}")
    return num_steps


@compile_once
def lanczos(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_steps: int,
    start: jax.Array | None = None,
    basis_dtype: Any = None,
    linearize: bool = True,
) -> Tridiagonal:
    r"""Lanczos tridiagonalisation with full reorthogonalisation.

    Runs $k$ = ``num_steps`` steps from a random Rademacher start vector (or ``start``, a flat
    vector): the three-term recurrence, then Gram-Schmidt against all previous vectors (one
    classical pass, a second only when the first cancelled; module docstring, "Lanczos"). On
    breakdown (an invariant subspace found) it restarts from a fresh random vector orthogonal
    to the basis, so $T$ stays block-diagonal and its eigenvalues
    remain eigenvalues of $A$. Gauss quadrature: $e_1^\top T^p e_1 \|v_0\|^2 = v_0^\top A^p v_0$
    for $p < 2k$ (exact in exact arithmetic). Memory: the basis, $k \times n$ numbers of
    ``basis_dtype``, beside the operator's (a linearised Hessian keeps its residuals) and about
    four vectors. Accuracy: a few $\epsilon \|A\|$ absolute (module docstring).

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key (start and restart vectors).
      num_steps: steps k, 1 <= k <= n. Static.
      start: optional flat start vector of shape (n,), finite and nonzero.
      basis_dtype: dtype the Lanczos basis is stored in: ``None`` (the working dtype, default)
        or a lower precision (``"float32"`` for float64 work, ``"float16"`` / ``"bfloat16"``),
        which divides the basis's memory and the traffic of its Gram-Schmidt; accuracy in the
        module docstring ("Lanczos"). Static.
      linearize: for a loss operator (:func:`hvp`, :func:`kernels.ggn`, ...): ``True``
        (default) linearises it once and every step runs only the tangent program, keeping the
        linearisation's residuals (a forward and backward pass's intermediates) for the whole
        run; ``False`` recomputes each product from scratch (for a Hessian a
        forward-over-reverse ``jax.jvp(jax.grad)``), keeping nothing between steps: less memory
        at more time per step (module docstring, "Lanczos"). Ignored for a plain callable and for
        operators over stacked batches, which recompute already. Static.

    Returns:
      Tridiagonal(diagonal, off_diagonal, start_norm).

    Raises:
      ValueError: if num_steps is not in [1, n], ``start`` does not have shape (n,), bad
        ``key`` / ``like``; (runtime check) non-finite inputs, a zero or non-finite ``start``,
        non-finite products (with how many of the k steps).

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> tri = lanczos(lambda v: d * v, 3, jax.random.key(0), num_steps=3)
    >>> [round(x, 3) for x in jnp.linalg.eigvalsh(tri.matrix()).tolist()]  # to a few eps ||A||
    [1.0, 2.0, 3.0]
    """
    check_key(key, "key")
    flat = _setup(matvec, like, linearize=linearize)
    _check_steps(num_steps, flat.size)
    if start is not None:
        if jnp.shape(start) != (flat.size,):
            raise ValueError(
                f"start: expected a flat vector of shape ({flat.size},), got {jnp.shape(start)}"
            )
        norm = jnp.linalg.norm(jnp.asarray(start))
        check_that(
            jnp.logical_and(jnp.isfinite(norm), norm > 0),
            "start: expected a finite nonzero vector",
        )
    store = _check_basis_dtype(basis_dtype, flat.dtype)
    alphas, betas, norm0 = _lanczos_run(flat, key, num_steps, start, store)
    flat.check_products(_bad_steps(alphas, betas), num_steps, "steps")
    return Tridiagonal(diagonal=alphas, off_diagonal=betas, start_norm=norm0)


@compile_once
def top_eigenvalues(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    k: int = 1,
    num_steps: int,
    basis_dtype: Any = None,
    linearize: bool = True,
) -> jax.Array:
    r"""The k largest eigenvalues of a symmetric operator by Lanczos (full reorthogonalisation).

    Ritz values (eigenvalues of $T$) of the ``num_steps``-step :func:`lanczos` matrix; the
    largest converge first. They are lower bounds of the true top eigenvalues (Cauchy
    interlacing, up to rounding) and exact once ``num_steps`` reaches the dimension n (larger
    values are clipped to n), to a few $\epsilon \|A\|$ absolute: float32 cannot separate
    eigenvalues closer than about $10^{-7}\lambda_{max}$ nor resolve ones below it (module
    docstring, "Lanczos"; use float64 parameters there). Memory: the :func:`lanczos` basis.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key (start vector).
      k: how many eigenvalues, 1 <= k <= n. Static.
      num_steps: Lanczos steps, >= k. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``, default) or recompute each product
        (``False``: less memory, more time per step), as in :func:`lanczos`. Static.

    Returns:
      Array of shape (k,), largest first.

    Raises:
      ValueError: if k is not in [1, n], num_steps < k, bad ``key`` / ``like``; (runtime
        check) non-finite inputs or products.

    References:
      Lanczos 1950; Golub & Van Loan, Matrix Computations, section 10.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 5.0, 3.0, 2.0])
    >>> top = top_eigenvalues(lambda v: d * v, 4, jax.random.key(0), k=2, num_steps=4)
    >>> [round(x, 3) for x in top.tolist()]
    [5.0, 3.0]
    """
    check_key(key, "key")
    flat = _setup(matvec, like, linearize=linearize)
    check_positive_int(k, "k")
    if k > flat.size:
        raise ValueError(f"k: expected at most the dimension {flat.size}, got {k}")
    check_positive_int(num_steps, "num_steps")
    if num_steps < k:
        raise ValueError(f"num_steps: expected >= k = {k}, got {num_steps}")
    steps = min(num_steps, flat.size)
    store = _check_basis_dtype(basis_dtype, flat.dtype)
    alphas, betas, _ = _lanczos_run(flat, key, steps, None, store)
    flat.check_products(_bad_steps(alphas, betas), steps, "steps")
    return jnp.linalg.eigvalsh(_tridiagonal_matrix(alphas, betas))[::-1][:k]


# --------------------------------------------------------------------------- SLQ


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuadratureNodes:
    r"""Gauss quadrature nodes and weights of stochastic Lanczos quadrature (:func:`slq_nodes`).

    Attributes:
      nodes: Ritz values $\theta_{pj}$, shape (P, k).
      weights: $\tau_{pj} = (e_1^\top u_{pj})^2$, shape (P, k); each row sums to 1.
    """

    nodes: jax.Array
    weights: jax.Array


def _slq(
    matvec: Any,
    like: Any,
    key: Any,
    num_samples: int,
    num_steps: int,
    chunk_size: Any,
    basis_dtype: Any = None,
    linearize: bool = True,
    start: jax.Array | None = None,
) -> QuadratureNodes:
    """Nodes and weights of probes ``0 .. num_samples - 1`` (from ``start`` where given)."""
    key = check_key(key, "key")
    _check_kept_count(num_samples, "num_samples")
    indices = _indices(num_samples)
    if start is not None:  # a block of the probe stream (kernels.blocks): a traced uint32 start
        indices = start + indices
    chunk = _auto_chunk(chunk_size)
    # on a user's mesh the probes run inside shard_maps: products recomputed there
    linearize = _check_linearize(linearize) and not splits_user_mesh()
    flat = _setup(matvec, like, linearize=linearize)
    _check_steps(num_steps, flat.size)
    store = _check_basis_dtype(basis_dtype, flat.dtype)

    def one(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        alphas, betas, _ = _lanczos_run(flat, sample_key(key, i), num_steps, None, store)
        evals, evecs = jnp.linalg.eigh(_tridiagonal_matrix(alphas, betas))
        return evals, evecs[0] ** 2

    nodes, weights = map_samples(one, indices, chunk_size=chunk, key=key)
    flat.check_products(_num_bad_rows(nodes, weights), num_samples, "probes")
    return QuadratureNodes(nodes=nodes, weights=weights)


@compile_once
def _slq_block(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    start: jax.Array,
    count: int,
    *,
    num_steps: int,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool = True,
    num_grid: int = 1024,
    bandwidth: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Nodes and weights of probes ``start .. start + count - 1`` of :func:`slq_nodes`.

    ``start`` is a traced uint32 scalar (one program per ``count``); probe $p$ has the key it
    has in the one call (also of :func:`spectral_density`). ``num_grid`` and ``bandwidth`` are
    checked as :func:`spectral_density` does and otherwise unused. Private machinery of
    :mod:`kernels.blocks`.
    """
    _check_density_options(num_grid, bandwidth)
    q = _slq(matvec, like, key, count, num_steps, chunk_size, basis_dtype, linearize, start=start)
    return q.nodes, q.weights


def _check_density_options(num_grid: Any, bandwidth: Any) -> None:
    check_positive_int(num_grid, "num_grid", minimum=2)
    if bandwidth is not None:
        check_positive(bandwidth, "bandwidth")


def _density(
    nodes: jax.Array, weights: jax.Array, num_grid: int, bandwidth: Any
) -> SpectralDensity:
    """The smoothed density of :func:`spectral_density` from the nodes and weights (P, k)."""
    num_samples = nodes.shape[0]
    lo, hi = jnp.min(nodes), jnp.max(nodes)
    width = jnp.maximum(hi - lo, jnp.maximum(jnp.abs(hi), 1.0) * 1e-6)
    sigma = 0.01 * width if bandwidth is None else jnp.asarray(bandwidth, nodes.dtype)
    grid = jnp.linspace(lo - 5 * sigma, hi + 5 * sigma, num_grid, dtype=nodes.dtype)
    z = (grid[:, None] - nodes.reshape(-1)[None, :]) / sigma
    kernel = jnp.exp(-0.5 * z**2) / (jnp.sqrt(2 * jnp.pi).astype(nodes.dtype) * sigma)
    density = kernel @ weights.reshape(-1) / num_samples
    return SpectralDensity(grid=grid, density=density)


@compile_once
def _density_finish(
    nodes: jax.Array, weights: jax.Array, num_grid: int = 1024, bandwidth: Any = None
) -> SpectralDensity:
    """:func:`_density` as one program (for :mod:`kernels.blocks`)."""
    _check_density_options(num_grid, bandwidth)
    return _density(nodes, weights, num_grid, bandwidth)


@renamed_kwargs(num_probes="num_samples")
@compile_once
def slq_nodes(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_steps: int,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool = True,
) -> QuadratureNodes:
    r"""Gauss quadrature nodes and weights of stochastic Lanczos quadrature.

    For each Rademacher probe $v_p$ (normalised; probe $p$ uses ``fold_in(key, p)``),
    ``num_steps`` Lanczos steps give nodes $\theta_{pj}$ (Ritz values) and weights
    $\tau_{pj} = (e_1^\top u_{pj})^2$ with
    $\sum_j \tau_{pj} f(\theta_{pj}) \approx v_p^\top f(A) v_p / \|v_p\|^2$ (exact for
    polynomials of degree < 2k), so $\frac{1}{P}\sum_p \sum_j \tau_{pj} f(\theta_{pj})$ is an
    unbiased estimate of $\frac1n \operatorname{tr} f(A)$ for such $f$. The output holds
    $P \times k$ nodes; the work memory is that of ``chunk_size`` probes' Lanczos bases.
    :class:`kernels.blocks.MonteCarloBlocks` computes probes ``[start, stop)`` (each as in this
    call) and merges them into this result (also of :func:`spectral_density`).

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key.
      num_samples: probes, P >= 1 (``num_probes`` is its deprecated name). Static.
      num_steps: Lanczos steps k per probe, 1 <= k <= n. Static.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``, default) or recompute each product
        (``False``: less memory, more time per step), as in :func:`lanczos`. Static.

    Returns:
      QuadratureNodes(nodes, weights), each of shape (P, k).

    Raises:
      ValueError: for bad counts, ``key``, ``chunk_size`` or ``like``; (runtime check)
        non-finite inputs or products (with how many of the P probes).

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159; Ubaru, Chen, Saad 2017.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0])
    >>> q = slq_nodes(lambda v: d * v, 2, jax.random.key(0), num_samples=3, num_steps=2)
    >>> jnp.round(q.nodes, 6)
    Array([[1., 2.],
           [1., 2.],
           [1., 2.]], dtype=float32)
    """
    return _slq(matvec, like, key, num_samples, num_steps, chunk_size, basis_dtype, linearize)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpectralDensity:
    """A smoothed eigenvalue density on a grid (:func:`spectral_density`).

    Attributes:
      grid: evaluation points, shape (num_grid,), increasing.
      density: the density at ``grid``, shape (num_grid,); integrates to about 1.
    """

    grid: jax.Array
    density: jax.Array


@renamed_kwargs(num_probes="num_samples")
@compile_once
def spectral_density(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_steps: int,
    num_grid: int = 1024,
    bandwidth: Any = None,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool = True,
) -> SpectralDensity:
    r"""Spectral density of a symmetric operator by stochastic Lanczos quadrature.

    $$\phi(t) = \frac{1}{P}\sum_{p=1}^P \sum_{j=1}^k \tau_{pj}\,
    \frac{1}{\sqrt{2\pi}\sigma} e^{-(t-\theta_{pj})^2 / (2\sigma^2)},$$
    a Gaussian-smoothed estimate of the normalised eigenvalue density
    $\frac1n\sum_i \delta(t-\lambda_i)$ (integrates to 1). See :func:`slq_nodes`.

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key.
      num_samples: probes, P >= 1 (``num_probes`` is its deprecated name). Static.
      num_steps: Lanczos steps per probe. Static.
      num_grid: grid size >= 2. Static.
      bandwidth: smoothing $\sigma > 0$ (a float is static, an array traced); default 1% of
        the range of the nodes.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``, default) or recompute each product
        (``False``: less memory, more time per step), as in :func:`lanczos`. Static.

    Returns:
      SpectralDensity(grid, density), each of shape (num_grid,); the grid spans the nodes plus
      5 bandwidths either side.

    Raises:
      ValueError: as :func:`slq_nodes`, and for num_grid < 2 or (also at runtime) a
        non-positive or non-finite ``bandwidth``.

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 3.0])
    >>> s = spectral_density(lambda v: d * v, 2, jax.random.key(0), num_samples=2, num_steps=2,
    ...                      num_grid=5, bandwidth=1.0)
    >>> jnp.round(s.grid, 6)
    Array([-4., -1.,  2.,  5.,  8.], dtype=float32)
    """
    _check_density_options(num_grid, bandwidth)
    q = _slq(matvec, like, key, num_samples, num_steps, chunk_size, basis_dtype, linearize)
    return _density(q.nodes, q.weights, num_grid, bandwidth)
