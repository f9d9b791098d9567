"""Gauss-Newton and Fisher operators: one batch, or a dataset streamed in chunks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._checks import (
    check_finite,
    check_key,
    describe,
)
from kernels._losses import (
    _LOSS_HINT,
    Loss,
    _check_labels,
    _check_loss,
    _check_outputs,
    _check_values,
    _draw_scores,
    _mean_loss,
    _num_terms,
    _output_form,
    _output_hessian,
    _scores,
)
from kernels._operators import (
    _all_finite,
    _check_floating,
    _check_params,
    _LossOperator,
    _num_batches,
)
from kernels._precision import (
    check_compute_dtype,
    in_compute,
    work_like,
    work_params,
    work_result_type,
)
from kernels.parallel import check_num_samples

Matvec = Callable[[Any], Any]


def _check_apply_fn(apply_fn: Any) -> None:
    if not callable(apply_fn):
        raise ValueError(
            f"apply_fn: expected a callable (params, inputs) -> outputs, got {apply_fn!r}"
        )


def _split(batch: Any, name: str) -> tuple[Any, Any]:
    """Static: ``batch`` is a pair ``(inputs, targets)``."""
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        got = (
            f"{type(batch).__name__} of length {len(batch)}"
            if isinstance(batch, tuple | list)
            else describe(batch)
        )
        raise ValueError(f"{name}: expected a pair (inputs, targets), got {got}")
    return batch[0], batch[1]


def _num_examples(batch: Any, name: str, axis: int = 0) -> int:
    """Static: the leaves of ``(inputs, targets)`` share an example axis of length n >= 1."""
    inputs, targets = _split(batch, name)
    leaves = jax.tree_util.tree_leaves((inputs, targets))
    if not jax.tree_util.tree_leaves(inputs) or not jax.tree_util.tree_leaves(targets):
        raise ValueError(f"{name}: inputs and targets must each hold at least one array")
    sizes = {jnp.shape(leaf)[axis] if jnp.ndim(leaf) > axis else None for leaf in leaves}
    what = "example axis" if axis == 0 else "example axis (axis 1, after the batch axis)"
    if None in sizes or len(sizes) != 1:
        raise ValueError(f"{name}: the leaves of inputs and targets must share one {what}")
    (num,) = sizes
    if num < 1:
        raise ValueError(f"{name}: expected at least one example, got an {what} of length 0")
    return num


def _apply(apply_fn: Callable, params: Any, inputs: Any) -> jax.Array:
    """``apply_fn(params, inputs)``; a failing call (e.g. a loss given inputs) names apply_fn."""
    try:
        return apply_fn(params, inputs)
    except (TypeError, ValueError, IndexError) as err:
        if str(err).startswith("apply_fn: "):
            raise
        raise ValueError(
            f"apply_fn: apply_fn(params, inputs) failed ({type(err).__name__}: {err}); "
            + _LOSS_HINT
        ) from err


# --------------------------------------------------------------------------- operators


class _BatchOperator(_LossOperator):
    """A one-batch Gauss-Newton or Fisher operator: shared linearisation and checks."""

    apply_fn: Callable[[Any, Any], jax.Array]
    loss: Any
    params: Any
    batch: Any

    def _model(self) -> Callable[[Any], jax.Array]:
        """``p -> apply_fn(p, inputs)`` of working-dtype parameters (in ``compute_dtype``)."""
        inputs = self.batch[0]
        model = self.in_compute(lambda p, x: _apply(self.apply_fn, p, x))
        return lambda p: model(p, inputs)

    def _middle(self, outputs: jax.Array) -> Callable[[jax.Array], jax.Array]:
        r"""$u \mapsto M u$ on output tangents, set up once at ``outputs``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _products(self) -> tuple[Matvec, jax.Array]:
        r"""``(product, outputs)``: $v \mapsto J^\top M J v$ with ``apply_fn`` linearised once."""
        primal = self.primal()
        outputs, jvp_fn = jax.linearize(self._model(), primal)
        _check_outputs(self.loss, outputs, self.batch[1])
        middle = self._middle(outputs)
        transpose = jax.linear_transpose(jvp_fn, primal)

        def product(v: Any) -> Any:
            return transpose(middle(jvp_fn(v)).astype(outputs.dtype))[0]

        return product, outputs

    def linearize(self) -> tuple[Matvec, jax.Array]:
        """Linearise once: the product function and whether the inputs were finite.

        Runs ``jax.linearize`` of ``apply_fn`` at ``params`` (one forward pass, its residuals
        kept), sets up the middle factor once (the softmax of the outputs, the label draws) and
        runs the runtime checks; each product then runs the tangent program, the middle factor
        and the transposed tangent program.

        Returns:
          ``(product, valid)``: ``product(v)`` is the operator applied to ``v``; ``valid`` is
          true when ``params`` and the loss are finite and the labels in range (kernels report
          non-finite products only when it holds, so one cause gives one message).

        Raises:
          ValueError: (static) outputs that do not fit the loss; (runtime) non-finite
            ``params`` or loss, cross-entropy labels out of range.
        """
        product, outputs = self._products()
        return product, _check_values(self.loss, self.params, outputs, self.batch[1])

    def recomputed(self) -> tuple[Matvec, jax.Array]:
        """Products recomputed: ``apply_fn`` linearised afresh in each product.

        No residuals are kept between products (see ``_LossOperator.recomputed``).
        """

        def product(v: Any) -> Any:
            # tied to the input so that XLA cannot hoist the forward pass out of a kernel's loop
            params, v = jax.lax.optimization_barrier((self.params, v))
            return dataclasses.replace(self, params=params)._products()[0](v)

        return product, self.check_inputs()

    def check_inputs(self) -> jax.Array:
        """The runtime checks of :meth:`linearize` (one forward pass)."""
        targets = self.batch[1]
        outputs = self._model()(self.primal())
        _check_outputs(self.loss, outputs, targets)
        return _check_values(self.loss, self.params, outputs, targets)

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """``p -> loss(apply_fn(p, inputs), targets)`` (see ``_LossOperator.scalar_loss``)."""
        model, targets = self._model(), self.batch[1]
        return lambda p: _mean_loss(self.loss, model(work_params(p)), targets)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GGNOperator(_BatchOperator):
    r"""The Gauss-Newton matrix $v \mapsto J^\top H_{\rm out} J v$ as a pytree (see :func:`ggn`).

    Attributes:
      apply_fn: ``(params, inputs) -> outputs``. Static (keyed by identity).
      loss: a named loss or a callable ``(outputs, targets) -> scalar``. Static.
      params: pytree $\theta$.
      batch: ``(inputs, targets)``.
      compute_dtype: the dtype the model is evaluated in (:func:`ggn`). Static.
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

    def _middle(self, outputs: jax.Array) -> Callable[[jax.Array], jax.Array]:
        return _output_hessian(self.loss, outputs, self.batch[1])

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top G v = (Jv)^\top H_{\rm out} (Jv)$: one forward-mode pass, no backward pass."""
        targets = self.batch[1]
        outputs, u = jax.jvp(self._model(), (self.primal(),), (work_params(v),))
        _check_outputs(self.loss, outputs, targets)
        return _output_form(self.loss, outputs, targets, u)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FisherOperator(_BatchOperator):
    r"""The Fisher $v \mapsto \frac1N \sum_i g_i (g_i^\top v)$ as a pytree.

    Built by :func:`empirical_fisher` and :func:`mc_fisher`: $g_i = J_i^\top s_i$ with output
    scores $s_i$ at the observed labels (``key`` None) or averaged over ``num_samples`` label
    draws from the model (``key`` a PRNG key).

    Attributes:
      apply_fn: ``(params, inputs) -> outputs``. Static.
      loss: a named loss or (empirical Fisher only) a callable. Static.
      params: pytree $\theta$.
      batch: ``(inputs, targets)``.
      key: PRNG key of the label draws, or None for the empirical Fisher.
      num_samples: label draws per example (Monte Carlo Fisher). Static.
      compute_dtype: the dtype the model is evaluated in (:func:`ggn`). Static.
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any
    key: Any = None
    num_samples: int = dataclasses.field(default=1, metadata={"static": True})
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

    def _score_samples(self, outputs: jax.Array) -> tuple[jax.Array, float]:
        """Scores (M, *outputs.shape) and the factor 1 / (N M)."""
        targets = self.batch[1]
        _check_outputs(self.loss, outputs, targets)
        if self.key is None:
            scores = _scores(self.loss, outputs, targets)[None]
        else:
            scores = _draw_scores(self.loss, outputs, self.key, self.num_samples)
        scale = 1.0 / (_num_terms(self.loss, outputs.shape) * scores.shape[0])
        return jax.lax.stop_gradient(scores).astype(outputs.dtype), scale

    def _middle(self, outputs: jax.Array) -> Callable[[jax.Array], jax.Array]:
        scores, scale = self._score_samples(outputs)

        def middle(u: jax.Array) -> jax.Array:
            dots = _per_example_dots(scores, u)  # (M, n): s_i . (J v)_i
            dots = dots.reshape(dots.shape + (1,) * (scores.ndim - 2))
            return scale * jnp.sum(scores * dots, axis=0)

        return middle

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top F v = \frac1N\sum_i (s_i^\top J_i v)^2$: one forward-mode pass."""
        outputs, u = jax.jvp(self._model(), (self.primal(),), (work_params(v),))
        scores, scale = self._score_samples(outputs)
        return scale * jnp.sum(_per_example_dots(scores, u) ** 2)


def _per_example_dots(scores: jax.Array, u: jax.Array) -> jax.Array:
    """(M, n) inner products of each sample's scores with ``u`` per example."""
    m, n = scores.shape[:2]
    return jnp.sum((scores * u[None]).reshape(m, n, -1), axis=-1)


class _DatasetOperator(_LossOperator):
    """Stacked batches streamed with ``lax.scan``: products, forms and checks."""

    apply_fn: Callable[[Any, Any], jax.Array]
    loss: Any
    params: Any
    batches: Any
    weights: jax.Array

    def _batch_operator(self, batch: Any, index: jax.Array) -> _BatchOperator:
        raise NotImplementedError  # pragma: no cover - abstract

    def _scan(self) -> tuple[Any, jax.Array, jax.Array]:
        indices = jnp.arange(self.weights.shape[0], dtype=jnp.uint32)
        return self.batches, self.weights, indices

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """The first batch's loss (see ``_LossOperator.scalar_loss``)."""
        first = jax.tree_util.tree_map(lambda a: a[0], self.batches)
        return self._batch_operator(first, jnp.uint32(0)).scalar_loss()

    def linearize(self) -> tuple[Matvec, jax.Array]:
        """The product (a ``lax.scan`` over batches) and whether the inputs were finite.

        Each product linearises every batch in turn (one batch's residuals alive at a time;
        nothing is shared between products, which would hold every batch's residuals).

        Returns:
          ``(product, valid)``; ``valid`` covers ``params``, ``weights`` and the labels (the
          loss is not evaluated: a non-finite loss shows as non-finite products).
        """

        def product(v: Any) -> Any:
            def body(acc: Any, xs: Any) -> tuple[Any, None]:
                batch, weight, index = xs
                out = self._batch_operator(batch, index)._products()[0](v)
                acc = jax.tree_util.tree_map(lambda a, h: a + weight.astype(a.dtype) * h, acc, out)
                return acc, None

            zero = jax.tree_util.tree_map(jnp.zeros_like, v)
            return jax.lax.scan(body, zero, self._scan())[0]

        return product, self.check_inputs()

    def form(self, v: Any) -> jax.Array:
        r"""$\sum_b w_b\, v^\top A_b v$, one forward-mode pass per batch (a scalar scan)."""

        def body(total: jax.Array, xs: Any) -> tuple[jax.Array, None]:
            batch, weight, index = xs
            term = self._batch_operator(batch, index).form(v)
            return total + (weight.astype(term.dtype) * term).astype(total.dtype), None

        zero = jnp.zeros((), work_result_type(self.params))
        return jax.lax.scan(body, zero, self._scan())[0]

    def check_inputs(self) -> jax.Array:
        """Runtime checks of finite ``params`` and ``weights`` and of the labels' range."""
        ok = jnp.logical_and(_check_params(self.params), _all_finite(self.weights))
        check_finite(self.weights, "weights")
        if self.loss in ("cross_entropy", "logistic"):
            inputs = jax.tree_util.tree_map(lambda a: a[0], self.batches[0])
            shape = _output_spec(self.apply_fn, self.params, inputs, self.compute_dtype).shape
            ok = jnp.logical_and(ok, _check_labels(self.loss, shape, self.batches[1]))
        return ok


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DatasetGGNOperator(_DatasetOperator):
    r"""$v \mapsto \sum_b w_b G_b v$ over stacked batches as a pytree (:func:`dataset_ggn`).

    Attributes:
      apply_fn: ``(params, inputs) -> outputs``. Static.
      loss: a named loss or a callable. Static.
      params: pytree $\theta$.
      batches: ``(inputs, targets)`` whose leaves have a leading axis of length B.
      weights: (B,) weights $w_b$.
      compute_dtype: the dtype the model is evaluated in (:func:`ggn`). Static.
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

    def _batch_operator(self, batch: Any, index: jax.Array) -> GGNOperator:
        del index
        return GGNOperator(self.apply_fn, self.loss, self.params, batch, self.compute_dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DatasetFisherOperator(_DatasetOperator):
    r"""The Fisher $v \mapsto \sum_b w_b F_b v$ over stacked batches as a pytree.

    Built by :func:`dataset_empirical_fisher` and :func:`dataset_mc_fisher`; batch b draws its
    labels from ``fold_in(key, b)``.

    Attributes:
      apply_fn: ``(params, inputs) -> outputs``. Static.
      loss: a named loss or (empirical Fisher only) a callable. Static.
      params: pytree $\theta$.
      batches: ``(inputs, targets)`` whose leaves have a leading axis of length B.
      weights: (B,) weights $w_b$.
      key: PRNG key of the label draws, or None for the empirical Fisher.
      num_samples: label draws per example. Static.
      compute_dtype: the dtype the model is evaluated in (:func:`ggn`). Static.
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array
    key: Any = None
    num_samples: int = dataclasses.field(default=1, metadata={"static": True})
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})

    def _batch_operator(self, batch: Any, index: jax.Array) -> FisherOperator:
        key = None if self.key is None else jax.random.fold_in(self.key, index)
        return FisherOperator(
            self.apply_fn, self.loss, self.params, batch, key, self.num_samples, self.compute_dtype
        )


def _output_spec(
    apply_fn: Callable, params: Any, inputs: Any, compute_dtype: Any = None
) -> jax.ShapeDtypeStruct:
    """Shape and dtype of ``apply_fn(params, inputs)`` as the kernels evaluate it (abstractly).

    ``params`` in their working dtypes, ``apply_fn`` evaluated in ``compute_dtype``.
    """
    model = in_compute(lambda p, x: _apply(apply_fn, p, x), params, compute_dtype)
    return jax.eval_shape(lambda p: model(p, inputs), work_like(params))


# --------------------------------------------------------------------------- constructors


def _dataset_weights(batches: Any, params: Any, weights: Any) -> jax.Array:
    num_batches = _num_batches(batches)
    _num_examples(batches, "batches", axis=1)
    dtype = work_result_type(params)
    if weights is None:
        return jnp.full((num_batches,), 1.0 / num_batches, dtype=dtype)
    if jnp.shape(weights) != (num_batches,):
        raise ValueError(f"weights: expected shape ({num_batches},), got {jnp.shape(weights)}")
    return jnp.asarray(weights)


def ggn(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    loss: Loss,
    compute_dtype: Any = None,
) -> GGNOperator:
    r"""The generalized Gauss-Newton matrix of a loss of a model's outputs, as an operator.

    $$G = J^\top H_{\rm out} J,\qquad J = \partial f_\theta(x) / \partial\theta,\quad
    H_{\rm out} = \nabla^2_f \ell(f, y),$$ so $Gv$ is one Jacobian-vector product, the output
    Hessian (analytic for the named losses, see the module docstring) and one vector-Jacobian
    product, and $v^\top G v = (Jv)^\top H_{\rm out}(Jv)$ one Jacobian-vector product. Exact;
    positive semi-definite for the named losses (and any loss convex in the outputs); equal to
    the Hessian $\nabla^2_\theta \ell(f_\theta(x), y)$ when $f_\theta$ is linear in $\theta$.
    Pass it to :func:`~kernels.curvature.hutchinson_trace`, :func:`~kernels.curvature.lanczos`
    and friends; called directly, ``op(v)`` linearises for that one product.

    Args:
      apply_fn: ``(params, inputs) -> outputs``, one floating array with the examples on its
        leading axis; traceable and differentiable in forward mode (no ``jax.custom_vjp``).
        Keep the same function object across calls (it keys the compilation cache).
      params: pytree $\theta$ of float16/bfloat16/float32/float64 arrays (half precision is
        worked on in float32).
      batch: ``(inputs, targets)``; ``inputs`` any pytree for ``apply_fn``, ``targets`` what the
        loss takes (see the module docstring), leaves sharing the example axis.
      loss: ``"cross_entropy"``, ``"logistic"``, ``"squared_error"`` or a callable
        ``(outputs, targets) -> scalar`` (output Hessian by automatic differentiation). Static.
      compute_dtype: the dtype ``apply_fn`` is evaluated in: ``None`` (default) float32 for
        half-precision leaves (cast inside the program), float32/float64 leaves as they are;
        ``"params"`` each leaf's own dtype; or a floating dtype for every leaf
        (:mod:`kernels._precision`). Static.

    Returns:
      A :class:`GGNOperator` (a pytree), ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: for a bad ``apply_fn``, ``loss``, ``params``, ``batch`` or ``compute_dtype``
        (here); when applied, outputs that do not fit the loss, or (runtime check) non-finite
        ``params`` / loss and cross-entropy labels out of range.

    References:
      Schraudolph 2002, doi:10.1162/08997660260028683; Martens 2020, arXiv:1412.1193.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 2.0]])  # linear model: G = (2/N) X^T X = diag(1, 4)
    >>> op = ggn(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)), loss="squared_error")
    >>> op(jnp.ones(2))
    Array([1., 4.], dtype=float32)
    """
    _check_apply_fn(apply_fn)
    _check_loss(loss)
    _check_floating(params, "params")
    _num_examples(batch, "batch")
    return GGNOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batch=tuple(batch),
        compute_dtype=check_compute_dtype(compute_dtype),
    )


def dataset_ggn(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    loss: Loss,
    weights: jax.Array | None = None,
    compute_dtype: Any = None,
) -> DatasetGGNOperator:
    r"""The Gauss-Newton matrix of a loss averaged over stacked batches, one batch at a time.

    $$G = \sum_b w_b J_b^\top H_{{\rm out},b} J_b,$$ $w_b = 1/B$ by default (the dataset mean
    for equal batches). Products and quadratic forms scan the batches with ``lax.scan``, so
    memory holds one batch's activations (products) or none (forms); see :func:`ggn`.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` (as :func:`ggn`).
      params: pytree of floating arrays (half precision worked on in float32).
      batches: ``(inputs, targets)`` whose leaves have a leading axis of length B >= 1 indexing
        batches, then the example axis.
      loss: as :func:`ggn`. Static.
      weights: optional (B,) weights $w_b$.
      compute_dtype: as :func:`ggn`. Static.

    Returns:
      A :class:`DatasetGGNOperator`.

    Raises:
      ValueError: as :func:`ggn`, and for ``batches`` without a shared batch axis or
        ``weights`` not of shape (B,); (runtime check) non-finite ``weights``.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[[1.0, 0.0]], [[0.0, 2.0]]])  # two batches of one example
    >>> op = dataset_ggn(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros((2, 1))),
    ...                  loss="squared_error")
    >>> op(jnp.ones(2))  # (1/2) (2 diag(1, 0) + 2 diag(0, 4)) v
    Array([1., 4.], dtype=float32)
    """
    _check_apply_fn(apply_fn)
    _check_loss(loss)
    _check_floating(params, "params")
    weights = _dataset_weights(batches, params, weights)
    return DatasetGGNOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batches=tuple(batches),
        weights=weights,
        compute_dtype=check_compute_dtype(compute_dtype),
    )


def empirical_fisher(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    loss: Loss,
    compute_dtype: Any = None,
) -> FisherOperator:
    r"""The empirical Fisher $\frac1N\sum_i g_i g_i^\top$ at the observed labels, as an operator.

    $g_i = \nabla_\theta \sum_{j\in i}\ell_j$ is example $i$'s log-likelihood gradient and $N$
    the number of loss terms (module docstring; with one term per example,
    $\frac1n\sum_i\nabla\ell_i\nabla\ell_i^\top$). The product is
    $J^\top\big(\frac1N s_i\, s_i^\top (Jv)_i\big)_i$: one Jacobian-vector product and one
    vector-Jacobian product, with the output scores $s_i = \nabla_{f_i}\sum_{j\in i}\ell_j$;
    the quadratic form $\frac1N\sum_i (s_i^\top (Jv)_i)^2$ one Jacobian-vector product. Exact,
    positive semi-definite, rank at most $n$. Its exact trace: :func:`empirical_fisher_trace`.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` (as :func:`ggn`).
      params: pytree of floating arrays (half precision worked on in float32).
      batch: ``(inputs, targets)``.
      loss: a named loss or a callable (one term per example). Static.
      compute_dtype: as :func:`ggn`. Static.

    Returns:
      A :class:`FisherOperator` with ``key=None``.

    Raises:
      ValueError: as :func:`ggn`.

    References:
      Kunstner, Hennig, Balles 2019, arXiv:1905.12558.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # residuals 1 and 3: g_i = 2 r_i x_i
    >>> op = empirical_fisher(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.array([-1.0, -3.0])),
    ...                       loss="squared_error")
    >>> op(jnp.ones(2))  # (1/2) diag(4, 36)
    Array([ 2., 18.], dtype=float32)
    """
    _check_apply_fn(apply_fn)
    _check_loss(loss)
    _check_floating(params, "params")
    _num_examples(batch, "batch")
    return FisherOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batch=tuple(batch),
        compute_dtype=check_compute_dtype(compute_dtype),
    )


def dataset_empirical_fisher(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    loss: Loss,
    weights: jax.Array | None = None,
    compute_dtype: Any = None,
) -> DatasetFisherOperator:
    r"""The empirical Fisher $\sum_b w_b F_b$ over stacked batches, one batch at a time.

    Each batch's $F_b$ is :func:`empirical_fisher`'s; products and forms scan the batches.

    Args:
      apply_fn: ``(params, inputs) -> outputs``.
      params: pytree of floating arrays (half precision worked on in float32).
      batches: ``(inputs, targets)`` stacked along a leading batch axis of length B >= 1.
      loss: a named loss or a callable. Static.
      weights: optional (B,) weights (default 1/B).
      compute_dtype: as :func:`ggn`. Static.

    Returns:
      A :class:`DatasetFisherOperator` with ``key=None``.

    Raises:
      ValueError: as :func:`dataset_ggn`.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two batches of one example
    >>> op = dataset_empirical_fisher(lambda w, x: x @ w, jnp.zeros(2),
    ...                               (x, jnp.array([[-1.0], [-3.0]])), loss="squared_error")
    >>> op(jnp.ones(2))  # (1/2) (diag(4, 0) + diag(0, 36)), as empirical_fisher's example
    Array([ 2., 18.], dtype=float32)
    """
    _check_apply_fn(apply_fn)
    _check_loss(loss)
    _check_floating(params, "params")
    weights = _dataset_weights(batches, params, weights)
    return DatasetFisherOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batches=tuple(batches),
        weights=weights,
        compute_dtype=check_compute_dtype(compute_dtype),
    )


def _check_mc(loss: Any, key: Any, num_samples: Any) -> int:
    _check_loss(loss, named=True)
    check_key(key, "key")
    return check_num_samples(num_samples, "num_samples")


def mc_fisher(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Literal["cross_entropy", "logistic", "squared_error"],
    num_samples: int = 1,
    compute_dtype: Any = None,
) -> FisherOperator:
    r"""The Monte Carlo Fisher: labels drawn from the model, $\mathbb E\hat F = G$.

    $$\hat F = \frac{1}{NM}\sum_{m=1}^M\sum_i \hat g_{im}\hat g_{im}^\top,\qquad
    \hat g_{im} = \nabla_\theta \sum_{j\in i}\ell_j(f_\theta, \hat y_{jm}),$$
    with every label $\hat y_{jm}$ drawn from the predictive distribution of the outputs
    (categorical softmax, Bernoulli sigmoid, or Gaussian $\mathcal N(f, \tfrac12)$ for the
    squared error); example $i$ of sample $m$ draws from ``fold_in(fold_in(key, m), i)``.
    Unbiased for the Fisher, which for the named losses is the Gauss-Newton matrix $G$ of
    :func:`ggn`. For a fixed ``key`` the operator is one fixed positive semi-definite matrix
    (rank at most $nM$): the estimators treat it as any other. The $M$ draws share one
    Jacobian-vector and one vector-Jacobian product per product.

    Args:
      apply_fn: ``(params, inputs) -> outputs``.
      params: pytree of floating arrays (half precision worked on in float32).
      batch: ``(inputs, targets)`` (the targets are only checked, not used, by the products).
      key: PRNG key of the label draws.
      loss: ``"cross_entropy"``, ``"logistic"`` or ``"squared_error"``. Static.
      num_samples: M >= 1 independent Monte Carlo samples, each one draw of every label. Static.
      compute_dtype: as :func:`ggn`. Static.

    Returns:
      A :class:`FisherOperator` holding ``key``.

    Raises:
      ValueError: as :func:`ggn`, for a callable ``loss``, a bad ``key`` or ``num_samples``.

    References:
      Martens 2020, arXiv:1412.1193, section 9; Kunstner, Hennig, Balles 2019,
      arXiv:1905.12558.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> op = mc_fisher(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)), jax.random.key(0),
    ...                loss="squared_error", num_samples=4)
    >>> bool(op.form(jnp.ones(2)) >= 0), op(jnp.ones(2)).shape  # one PSD draw; E = G = I
    (True, (2,))
    """
    _check_apply_fn(apply_fn)
    num_samples = _check_mc(loss, key, num_samples)
    _check_floating(params, "params")
    _num_examples(batch, "batch")
    return FisherOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batch=tuple(batch),
        key=key,
        num_samples=num_samples,
        compute_dtype=check_compute_dtype(compute_dtype),
    )


def dataset_mc_fisher(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    key: jax.Array,
    *,
    loss: Literal["cross_entropy", "logistic", "squared_error"],
    num_samples: int = 1,
    weights: jax.Array | None = None,
    compute_dtype: Any = None,
) -> DatasetFisherOperator:
    r"""The Monte Carlo Fisher $\sum_b w_b \hat F_b$ over stacked batches, one at a time.

    Batch $b$ is :func:`mc_fisher` with the key ``fold_in(key, b)``; unbiased for the
    Gauss-Newton matrix of :func:`dataset_ggn` (named losses).

    Args:
      apply_fn: ``(params, inputs) -> outputs``.
      params: pytree of floating arrays (half precision worked on in float32).
      batches: ``(inputs, targets)`` stacked along a leading batch axis of length B >= 1.
      key: PRNG key of the label draws.
      loss: a named loss. Static.
      num_samples: M >= 1 independent Monte Carlo samples, each one draw of every label. Static.
      weights: optional (B,) weights (default 1/B).
      compute_dtype: as :func:`ggn`. Static.

    Returns:
      A :class:`DatasetFisherOperator` holding ``key``.

    Raises:
      ValueError: as :func:`dataset_ggn` and :func:`mc_fisher`.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # two batches of one example
    >>> op = dataset_mc_fisher(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros((2, 1))),
    ...                        jax.random.key(0), loss="squared_error")
    >>> bool(op.form(jnp.ones(2)) >= 0)
    True
    """
    _check_apply_fn(apply_fn)
    num_samples = _check_mc(loss, key, num_samples)
    _check_floating(params, "params")
    weights = _dataset_weights(batches, params, weights)
    return DatasetFisherOperator(
        apply_fn=apply_fn,
        loss=loss,
        params=params,
        batches=tuple(batches),
        weights=weights,
        key=key,
        num_samples=num_samples,
        compute_dtype=check_compute_dtype(compute_dtype),
    )
