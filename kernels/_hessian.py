"""Hessian operators of a loss: one batch, a dataset streamed in chunks, and the dataset loss."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_finite,
    check_that,
)
from kernels._operators import (
    _all_finite,
    _as_scalar,
    _check_floating,
    _check_params,
    _LossOperator,
    _num_batches,
)
from kernels._precision import check_compute_dtype, work_params, work_result_type
from kernels.parallel import (
    num_leading,
)

Matvec = Callable[[Any], Any]


# --------------------------------------------------------------------------- operators


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HessianOperator(_LossOperator):
    r"""The Hessian $v \mapsto \nabla^2_\theta L(\theta, b)\, v$ as a pytree (see :func:`hvp`).

    Attributes:
      loss_fn: ``(params, batch) -> scalar``. Static (part of the compilation key by identity).
      params: pytree $\theta$ at which the Hessian is taken.
      batch: the data pytree $b$ passed to ``loss_fn`` (``()`` or ``None`` for none).
      compute_dtype: the dtype the loss is evaluated in (:func:`hvp`). Static.
    """

    loss_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

    def _value(self) -> Callable[[Any], tuple[jax.Array, jax.Array]]:
        """``p -> (loss, loss)`` of working-dtype parameters (evaluated in ``compute_dtype``)."""
        return _as_scalar(self.in_compute(self.loss_fn), self.batch)

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
        grad_fn = jax.grad(self._value(), has_aux=True)
        _, product, value = jax.linearize(grad_fn, self.primal(), has_aux=True)
        return product, _check_loss_at(self.params, value)

    def recomputed(self) -> tuple[Matvec, jax.Array]:
        """Products recomputed: each a forward-over-reverse ``jax.jvp(jax.grad)`` from scratch.

        No linearisation is kept between products (see :meth:`_LossOperator.recomputed`).
        """
        with_loss = self.recomputed_with_loss()
        return (lambda v: with_loss(v)[0]), self.check_inputs()

    def recomputed_with_loss(self) -> Callable[[Any], tuple[Any, jax.Array]]:
        """Products as :meth:`recomputed`, each with the loss at ``params``: ``v -> (Hv, loss)``.

        The loss is the product's own forward pass's value (the gradient's auxiliary output), so
        a kernel that keeps it runs the checks of :meth:`check_loss` without a forward pass of
        its own (and compiles none).
        """
        grad_fn = jax.grad(self._value(), has_aux=True)

        def product(v: Any) -> tuple[Any, jax.Array]:
            # the barrier ties the parameters to each product's input, so that XLA cannot hoist
            # the forward and backward pass out of a kernel's loop (which would keep them alive)
            params, v = jax.lax.optimization_barrier((self.params, v))
            _, hv, loss = jax.jvp(grad_fn, (work_params(params),), (v,), has_aux=True)
            return hv, loss

        return product

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top H v$ by forward over forward mode.

        The second derivative of $t \mapsto L(\theta + t v)$ at 0 (two nested ``jax.jvp``): no
        backward pass, so no activations are kept (memory of about one forward pass with two
        tangents).
        """
        return self.form_and_loss(v)[0]

    def form_and_loss(self, v: Any) -> tuple[jax.Array, jax.Array]:
        r"""The quadratic form of :meth:`form` and the loss at ``params``, in one program.

        The loss is the value the nested ``jax.jvp`` computes on the way (an auxiliary output),
        so the kernels check it without a forward pass of its own.
        """
        value = self._value()
        v = work_params(v)

        def slope(p: Any) -> tuple[jax.Array, jax.Array]:
            _, tangent, loss = jax.jvp(value, (p,), (v,), has_aux=True)
            return tangent, loss

        _, second, loss = jax.jvp(slope, (self.primal(),), (v,), has_aux=True)
        return second, loss

    def check_loss(self, loss: jax.Array) -> jax.Array:
        """The runtime checks of :meth:`check_inputs` given the loss at ``params`` (no pass)."""
        return _check_loss_at(self.params, loss)

    def check_inputs(self) -> jax.Array:
        """The runtime checks of :meth:`linearize` (one forward pass for the loss at ``params``)."""
        return _check_loss_at(self.params, self._value()(self.primal())[0])

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """``p -> loss_fn(p, batch)`` (see :meth:`_LossOperator.scalar_loss`)."""
        return lambda p: self._value()(work_params(p))[0]


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
      compute_dtype: the dtype the loss is evaluated in (:func:`hvp`). Static.
    """

    loss_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

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
        loss_fn, params = self.in_compute(self.loss_fn), self.primal()

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
            term = HessianOperator(self.loss_fn, self.params, batch, self.compute_dtype).form(v)
            return total + (weight.astype(term.dtype) * term).astype(total.dtype), None

        zero = jnp.zeros((), work_result_type(self.params))
        return jax.lax.scan(body, zero, (self.batches, self.weights))[0]

    def check_inputs(self) -> jax.Array:
        """Runtime checks of finite ``params`` and ``weights`` (the loss is not evaluated)."""
        params_ok = _check_params(self.params)
        check_finite(self.weights, "weights")
        return jnp.logical_and(params_ok, _all_finite(self.weights))

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """The first batch's loss (see :meth:`_LossOperator.scalar_loss`)."""
        first = jax.tree_util.tree_map(lambda a: a[0], self.batches)
        return HessianOperator(self.loss_fn, self.params, first, self.compute_dtype).scalar_loss()


def hvp(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    compute_dtype: Any = None,
) -> HessianOperator:
    r"""Hessian-vector product operator of a scalar loss at ``params`` on one batch.

    Returns the operator $v \mapsto \nabla^2_\theta L(\theta, b)\, v$, computed
    forward-over-reverse. Kernels receiving it linearise it once per program (the gradient's
    forward and backward pass at $\theta$ run once; each probe runs only the tangent program);
    called directly, ``op(v)`` linearises for that one product.

    Args:
      loss_fn: ``(params, batch) -> scalar`` loss; must be traceable. Keep the same function
        object across calls (it keys the compilation cache).
      params: pytree $\theta$ of float16/bfloat16/float32/float64 arrays at which the Hessian
        is taken. Half-precision leaves are worked on in float32 (the Hessian of the loss at
        the stored values; probes and products in float32).
      batch: data pytree passed to ``loss_fn`` (``()`` or ``None`` when there is none).
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program, float32/float64 leaves as they
        are; ``"params"`` each leaf's own dtype (a bfloat16 model in bfloat16: faster, less
        accurate); or a floating dtype for every leaf (:mod:`kernels._precision`). Static.

    Returns:
      A :class:`HessianOperator` (a pytree), ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``params`` is empty or not floating, or ``compute_dtype`` is not one of
        the above (here); when applied, if
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
    compute_dtype = check_compute_dtype(compute_dtype)
    return HessianOperator(loss_fn=loss_fn, params=params, batch=batch, compute_dtype=compute_dtype)


def dataset_hvp(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    weights: jax.Array | None = None,
    compute_dtype: Any = None,
) -> DatasetHessianOperator:
    r"""Hessian-vector product of a loss averaged over data batches, one batch in memory at a time.

    $$H v = \sum_b w_b \nabla^2 L_b(\theta) v,$$ with $L_b$ = ``loss_fn(params, batch_b)`` and
    $w_b = 1/B$ by default (the dataset mean when batches have equal size). Each product scans
    the batches with ``lax.scan`` (forward-over-reverse per batch), so memory holds one batch and
    no per-example Hessians; pass the result to :func:`hutchinson_trace` and friends.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss on one batch.
      params: pytree of floating arrays (half precision worked on in float32, as :func:`hvp`).
      batches: pytree whose leaves have a leading axis of length B >= 1 indexing batches.
      weights: optional (B,) weights $w_b$ (e.g. batch sizes over the total).
      compute_dtype: the dtype the loss is evaluated in, as :func:`hvp`. Static.

    Returns:
      A :class:`DatasetHessianOperator`, ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``params`` is empty or not floating, ``compute_dtype`` is bad,
        ``batches`` has no leaves, no batch or disagreeing leading axes, ``weights`` does not
        have shape (B,); when applied, for a non-scalar loss or (runtime check) non-finite
        ``params`` / ``weights``.

    >>> import jax.numpy as jnp
    >>> loss = lambda p, b: 0.5 * jnp.sum(b * p**2)
    >>> op = dataset_hvp(loss, jnp.zeros(2), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> op(jnp.ones(2))
    Array([2., 3.], dtype=float32)
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    _check_floating(params, "params")
    compute_dtype = check_compute_dtype(compute_dtype)
    num_batches = _num_batches(batches)
    dtype = work_result_type(params)
    if weights is None:
        weights = jnp.full((num_batches,), 1.0 / num_batches, dtype=dtype)
    elif jnp.shape(weights) != (num_batches,):
        raise ValueError(f"weights: expected shape ({num_batches},), got {jnp.shape(weights)}")
    return DatasetHessianOperator(
        loss_fn=loss_fn,
        params=params,
        batches=batches,
        weights=jnp.asarray(weights),
        compute_dtype=compute_dtype,
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
