r"""Gauss-Newton and Fisher curvature: positive semi-definite operators, traces and spectra.

The loss is split into a model and a loss of its outputs,
$$L(\theta) = \ell(f_\theta(x), y),\qquad f_\theta(x) = \texttt{apply\_fn}(\theta, x),$$
with ``batch = (inputs, targets)``. Three curvature matrices of $L$ are built from it:

- the **generalized Gauss-Newton** $G = J^\top H_{\rm out} J$, with $J$ the Jacobian of the
  outputs in the parameters and $H_{\rm out} = \nabla^2_f \ell$ (:func:`ggn`,
  :func:`dataset_ggn`). It drops the second derivatives of the model from the Hessian, so it is
  positive semi-definite whenever $\ell$ is convex in the outputs, and it is the Hessian for a
  model linear in its parameters;
- the **empirical Fisher** $F_{\rm emp} = \frac1N\sum_i g_i g_i^\top$, $g_i$ the gradient of
  example $i$'s log-likelihood term at its observed label (:func:`empirical_fisher`,
  :func:`empirical_fisher_trace`);
- the **Monte Carlo Fisher** $\hat F$, the same sum with labels drawn from the model's
  predictive distribution (:func:`mc_fisher`, :func:`mc_fisher_trace`). Its expectation over
  the draws is the Fisher, which equals $G$ for the three named losses below.

**Losses.** ``loss`` is a name or a callable. The named losses have analytic output Hessians
(never a $K \times K$ matrix: the softmax Hessian acts as $u \mapsto p\odot(u - p^\top u)$ per
position) and a predictive distribution for the Monte Carlo Fisher. Each is a mean over its $N$
*terms*:

- ``"cross_entropy"``: logits ``(n, ..., K)`` and integer labels ``(n, ...)``; term
  $\ell_j = \log\sum_k e^{f_{jk}} - f_{j y_j}$ per position (all axes but the last);
  $H_j = \frac1N(\operatorname{diag} p_j - p_j p_j^\top)$ with $p_j = \operatorname{softmax} f_j$;
- ``"logistic"``: scores and labels in $[0, 1]$ of one shape ``(n, ...)``; term
  $\ell_j = \log(1 + e^{f_j}) - y_j f_j$ per element; $H_j = \frac1N\sigma(f_j)\sigma(-f_j)$;
- ``"squared_error"``: predictions and targets of one shape; term $\ell_j = (f_j - y_j)^2$ per
  element (no factor 1/2); $H_j = \frac2N$.

A callable ``loss(outputs, targets) -> scalar`` (a mean over the examples on the leading axis)
gets its output Hessian by automatic differentiation on the outputs (cheap: the outputs are
small next to the network); the Gauss-Newton matrix is then positive semi-definite only where
the loss is convex in the outputs. For the Fisher matrices a callable loss counts each example
as one term ($N = n$, $g_i = \nabla_\theta\,$``loss(outputs[i:i+1], targets[i:i+1])``); the
Monte Carlo Fisher needs a named loss (its predictive distribution).

**Fisher normalisation.** Example $i$ (index $i$ on the leading axis of ``inputs``) contributes
$g_i = \nabla_\theta \sum_{j \in i} \ell_j$, the gradient of the log-likelihood of all its
terms, so $F = \frac1N\sum_i g_i g_i^\top$ and $\mathbb E_{\hat y}\hat F = G$. With one term
per example (classification, regression) this is the textbook
$\frac1n\sum_i \nabla\ell_i \nabla\ell_i^\top$; for a sequence model with $T$ positions per
example it is $T$ times the empirical Fisher of the per-sequence mean loss. Examples must be
independent: ``apply_fn(params, inputs)[i]`` must equal ``apply_fn(params, inputs[i:i+1])[0]``.

**Cost.** The product $Gv$ is one Jacobian-vector product, the output Hessian and one
vector-Jacobian product; a kernel that receives the operator linearises ``apply_fn`` once per
program (:meth:`GGNOperator.linearize`), so each product runs the tangent program and its
transpose only. The quadratic form $v^\top G v = (Jv)^\top H_{\rm out} (Jv)$, which
:func:`~kernels.curvature.hutchinson_trace` uses, is one forward-mode pass: no backward pass,
no stored activations. The Fisher operators cost the same (their $H_{\rm out}$ is replaced by
per-example outer products of the output scores). The exact empirical-Fisher trace and the
Monte Carlo Fisher trace take per-example gradients, ``example_chunk_size`` at a time.

**Estimators.** Every operator is a :class:`kernels._operators._LossOperator` (a registered
frozen-dataclass pytree: ``apply_fn`` and ``loss`` static, parameters, data, weights and key
leaves), so :func:`~kernels.curvature.hutchinson_trace`, :func:`~kernels.curvature.hutchpp_trace`,
:func:`~kernels.curvature.lanczos`, :func:`~kernels.curvature.top_eigenvalues`,
:func:`~kernels.curvature.slq_nodes` and :func:`~kernels.curvature.spectral_density` accept them
unchanged and compile once per (callables, shapes). The dataset operators stream stacked
batches with ``lax.scan`` (one batch of activations in memory), like
:func:`~kernels.curvature.dataset_hvp`.

**Checks.** Static checks raise ``ValueError`` naming the argument. Runtime checks (eagerly
``ValueError``, under ``jit`` ``JaxRuntimeError`` with ``"kernels check failed: ..."``):
non-finite ``params``, a non-finite loss at ``params``, cross-entropy labels outside
$[0, K)$, non-finite per-example gradients; the estimators add their own (non-finite products).

References:
  Schraudolph 2002, doi:10.1162/08997660260028683 (Gauss-Newton products); Martens 2020,
  "New insights and perspectives on the natural gradient method", arXiv:1412.1193;
  Kunstner, Hennig, Balles 2019, "Limitations of the empirical Fisher approximation",
  arXiv:1905.12558; Dangel et al., curvlinops (PyTorch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._backend import auto_chunk_size, tree_size
from kernels._checks import (
    check_chunk_size,
    check_finite,
    check_key,
    check_positive_int,
    check_that,
    describe,
)
from kernels._jit import compile_once
from kernels._names import method_count
from kernels._operators import (
    _all_finite,
    _check_floating,
    _check_params,
    _LossOperator,
    _num_batches,
)
from kernels.curvature import hutchinson_trace, hutchpp_trace
from kernels.estimate import Estimate
from kernels.parallel import check_num_samples, map_chunked, map_samples, sample_statistics

__all__ = [
    "DatasetFisherOperator",
    "DatasetGGNOperator",
    "FisherOperator",
    "GGNOperator",
    "dataset_empirical_fisher",
    "dataset_ggn",
    "dataset_mc_fisher",
    "empirical_fisher",
    "empirical_fisher_trace",
    "ggn",
    "ggn_trace",
    "mc_fisher",
    "mc_fisher_trace",
]

Matvec = Callable[[Any], Any]
Loss = Literal["cross_entropy", "logistic", "squared_error"] | Callable[[Any, Any], jax.Array]
NAMED_LOSSES = ("cross_entropy", "logistic", "squared_error")


# --------------------------------------------------------------------------- static checks


def _check_loss(loss: Any, *, named: bool = False) -> None:
    """Static: ``loss`` is a named loss or (unless ``named``) a callable."""
    if isinstance(loss, str) and loss in NAMED_LOSSES:
        return
    if callable(loss) and not isinstance(loss, str) and not named:
        return
    if named:
        raise ValueError(
            f"loss: the Monte Carlo Fisher draws labels from the predictive distribution of a "
            f"named loss, one of {NAMED_LOSSES}; got {loss!r}"
        )
    raise ValueError(
        f"loss: expected one of {NAMED_LOSSES} or a callable (outputs, targets) -> scalar, "
        f"got {loss!r}"
    )


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


def _check_outputs(loss: Any, outputs: Any, targets: Any) -> None:
    """Static: shapes and dtypes of the outputs (an array or its shape) and targets fit the loss."""
    dtype = getattr(outputs, "dtype", None)
    if (
        isinstance(outputs, tuple | list | dict)
        or dtype is None
        or not jnp.issubdtype(dtype, jnp.floating)
    ):
        raise ValueError(
            "apply_fn: must return one floating array of outputs, got "
            f"{dtype if dtype is not None else type(outputs).__name__}"
        )
    shape = tuple(outputs.shape)
    if not shape:
        raise ValueError(
            "apply_fn: outputs must have a leading example axis, got a scalar; " + _LOSS_HINT
        )
    if not isinstance(loss, str):  # the loss's value must be a real scalar (abstractly)
        spec = jax.ShapeDtypeStruct(shape, dtype)
        jax.eval_shape(lambda o, t: _mean_loss(loss, o, t), spec, targets)
        return
    shape_t = jnp.shape(targets)
    if loss == "cross_entropy":
        if len(shape) < 2 or shape_t != shape[:-1]:
            raise ValueError(
                f"batch: cross_entropy takes logits (n, ..., K) and labels (n, ...), got outputs "
                f"{shape} and targets {shape_t}"
            )
        if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
            raise ValueError(
                f"batch: cross_entropy labels must be integers, got {jnp.result_type(targets)}"
            )
    elif shape_t != shape:
        raise ValueError(
            f"batch: {loss} takes outputs and targets of one shape, got outputs {shape} and "
            f"targets {shape_t}"
        )


_LOSS_HINT = (
    "the Gauss-Newton and Fisher kernels take apply_fn(params, inputs) -> outputs (one row per "
    "example) and batch=(inputs, targets); for a loss (params, batch) -> scalar use "
    "hessian_trace / hvp (kernels.curvature)"
)


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


# --------------------------------------------------------------------------- the losses


def _num_terms(loss: Any, shape: tuple[int, ...]) -> int:
    """N: the number of terms the mean loss averages (a callable: the examples)."""
    if loss == "cross_entropy":
        return math.prod(shape[:-1])
    if isinstance(loss, str):
        return math.prod(shape)
    return shape[0]


def _mean_loss(loss: Any, outputs: jax.Array, targets: Any) -> jax.Array:
    r"""The loss $\ell(f, y)$: the mean of its terms (or the callable's value)."""
    if loss == "cross_entropy":
        picked = jnp.take_along_axis(outputs, targets[..., None].astype(jnp.int32), axis=-1)
        return jnp.mean(jax.nn.logsumexp(outputs, axis=-1) - picked[..., 0])
    if loss == "logistic":
        y = jnp.asarray(targets).astype(outputs.dtype)
        return jnp.mean(jnp.logaddexp(jnp.zeros_like(outputs), outputs) - y * outputs)
    if loss == "squared_error":
        return jnp.mean((outputs - jnp.asarray(targets).astype(outputs.dtype)) ** 2)
    value = loss(outputs, targets)
    if jnp.shape(value) != () or not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        raise ValueError(
            f"loss: must return a real floating scalar, got {jnp.result_type(value)} of shape "
            f"{jnp.shape(value)}"
        )
    return value


def _output_hessian(loss: Any, outputs: jax.Array, targets: Any) -> Callable:
    r"""$u \mapsto H_{\rm out} u$, the Hessian of the mean loss in the outputs, set up once."""
    scale = 1.0 / _num_terms(loss, outputs.shape)
    if loss == "cross_entropy":
        p = jax.nn.softmax(outputs, axis=-1)
        return lambda u: scale * p * (u - jnp.sum(p * u, axis=-1, keepdims=True))
    if loss == "logistic":
        w = scale * jax.nn.sigmoid(outputs) * jax.nn.sigmoid(-outputs)
        return lambda u: w * u
    if loss == "squared_error":
        return lambda u: (2 * scale) * u
    grad = jax.grad(lambda o: _mean_loss(loss, o, targets))
    return jax.linearize(grad, outputs)[1]


def _output_form(loss: Any, outputs: jax.Array, targets: Any, u: jax.Array) -> jax.Array:
    r"""$u^\top H_{\rm out} u$ (centred for the softmax: non-negative by construction)."""
    scale = 1.0 / _num_terms(loss, outputs.shape)
    if loss == "cross_entropy":
        p = jax.nn.softmax(outputs, axis=-1)
        centred = u - jnp.sum(p * u, axis=-1, keepdims=True)
        return scale * jnp.sum(p * centred**2)
    if loss == "logistic":
        return scale * jnp.sum(jax.nn.sigmoid(outputs) * jax.nn.sigmoid(-outputs) * u**2)
    if loss == "squared_error":
        return (2 * scale) * jnp.sum(u**2)

    def slope(o: jax.Array) -> jax.Array:
        return jax.jvp(lambda q: _mean_loss(loss, q, targets), (o,), (u,))[1]

    return jax.jvp(slope, (outputs,), (u,))[1]


def _scores(loss: Any, outputs: jax.Array, targets: Any) -> jax.Array:
    r"""Output scores $s_i$ at the observed labels: $g_i = J_i^\top s_i$.

    Named losses: the gradient of example $i$'s summed terms in its outputs; a callable:
    $n \nabla_f \ell$ (the gradient of the example's own loss when $\ell$ is a mean over
    examples).
    """
    if loss == "cross_entropy":
        p = jax.nn.softmax(outputs, axis=-1)
        return p - jax.nn.one_hot(targets, outputs.shape[-1], dtype=outputs.dtype)
    if loss == "logistic":
        return jax.nn.sigmoid(outputs) - jnp.asarray(targets).astype(outputs.dtype)
    if loss == "squared_error":
        return 2 * (outputs - jnp.asarray(targets).astype(outputs.dtype))
    grad = jax.grad(lambda o: _mean_loss(loss, o, targets))(outputs)
    return outputs.shape[0] * grad


def _sampled_scores(loss: str, outputs: jax.Array, key: jax.Array) -> jax.Array:
    """Scores at labels drawn from the predictive distribution of one example's outputs."""
    if loss == "cross_entropy":
        labels = jax.random.categorical(key, outputs, axis=-1)
        return _scores(loss, outputs, labels)
    if loss == "logistic":
        labels = jax.random.bernoulli(key, jax.nn.sigmoid(outputs))
        return _scores(loss, outputs, labels)
    # squared error: y ~ N(f, 1/2) per element, the density exp(-(f - y)^2) normalised
    z = jax.random.normal(key, outputs.shape, outputs.dtype)
    return -jnp.sqrt(jnp.asarray(2.0, outputs.dtype)) * z


def _example_keys(key: jax.Array, sample: Any, num: int) -> jax.Array:
    """Key of example i in label sample m: ``fold_in(fold_in(key, m), i)``."""
    base = jax.random.fold_in(key, sample)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num, dtype=jnp.uint32))


def _draw_scores(loss: str, outputs: jax.Array, key: jax.Array, num_samples: int) -> jax.Array:
    """(M, *outputs.shape) scores of ``num_samples`` label draws, example by example."""

    def one_sample(m: jax.Array) -> jax.Array:
        keys = _example_keys(key, m, outputs.shape[0])
        return map_chunked(  # each example drawn as a batch of one, as the traces draw it
            lambda ko: _sampled_scores(loss, ko[1][None], ko[0])[0],
            (keys, outputs),
            chunk_size=outputs.shape[0],
            key=key,
        )

    return jnp.stack([one_sample(jnp.uint32(m)) for m in range(num_samples)])


def _check_values(loss: Any, params: Any, outputs: jax.Array, targets: Any) -> jax.Array:
    """Runtime checks of finite params, labels in range and a finite loss; the verdict."""
    params_ok = _check_params(params)
    labels_ok = _check_labels(loss, outputs.shape, targets)
    value = _mean_loss(loss, outputs, targets)
    loss_ok = jnp.isfinite(value)
    check_that(
        jnp.logical_or(jnp.logical_not(jnp.logical_and(params_ok, labels_ok)), loss_ok),
        "loss: non-finite loss {} at params",
        value,
    )
    return jnp.logical_and(jnp.logical_and(params_ok, labels_ok), loss_ok)


def _check_labels(loss: Any, shape: tuple[int, ...], targets: Any) -> jax.Array:
    """Runtime check: cross-entropy labels lie in [0, K), logistic labels in [0, 1]."""
    if loss == "logistic":
        ok = jnp.all((targets >= 0) & (targets <= 1))
        check_that(ok, "batch: logistic labels must lie in [0, 1]")
        return ok
    if loss != "cross_entropy":
        return jnp.asarray(True)
    num_classes = shape[-1]
    ok = jnp.all((targets >= 0) & (targets < num_classes))
    check_that(ok, f"batch: cross_entropy labels must lie in [0, {num_classes})")
    return ok


# --------------------------------------------------------------------------- operators


class _BatchOperator(_LossOperator):
    """A one-batch Gauss-Newton or Fisher operator: shared linearisation and checks."""

    apply_fn: Callable[[Any, Any], jax.Array]
    loss: Any
    params: Any
    batch: Any

    def _model(self) -> Callable[[Any], jax.Array]:
        inputs = self.batch[0]
        return lambda p: _apply(self.apply_fn, p, inputs)

    def _middle(self, outputs: jax.Array) -> Callable[[jax.Array], jax.Array]:
        r"""$u \mapsto M u$ on output tangents, set up once at ``outputs``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _products(self) -> tuple[Matvec, jax.Array]:
        r"""``(product, outputs)``: $v \mapsto J^\top M J v$ with ``apply_fn`` linearised once."""
        outputs, jvp_fn = jax.linearize(self._model(), self.params)
        _check_outputs(self.loss, outputs, self.batch[1])
        middle = self._middle(outputs)
        transpose = jax.linear_transpose(jvp_fn, self.params)

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
        outputs = self._model()(self.params)
        _check_outputs(self.loss, outputs, targets)
        return _check_values(self.loss, self.params, outputs, targets)

    def scalar_loss(self) -> Callable[[Any], jax.Array]:
        """``p -> loss(apply_fn(p, inputs), targets)`` (see ``_LossOperator.scalar_loss``)."""
        model, targets = self._model(), self.batch[1]
        return lambda p: _mean_loss(self.loss, model(p), targets)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GGNOperator(_BatchOperator):
    r"""The Gauss-Newton matrix $v \mapsto J^\top H_{\rm out} J v$ as a pytree (see :func:`ggn`).

    Attributes:
      apply_fn: ``(params, inputs) -> outputs``. Static (keyed by identity).
      loss: a named loss or a callable ``(outputs, targets) -> scalar``. Static.
      params: pytree $\theta$.
      batch: ``(inputs, targets)``.
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any

    def _middle(self, outputs: jax.Array) -> Callable[[jax.Array], jax.Array]:
        return _output_hessian(self.loss, outputs, self.batch[1])

    def form(self, v: Any) -> jax.Array:
        r"""$v^\top G v = (Jv)^\top H_{\rm out} (Jv)$: one forward-mode pass, no backward pass."""
        targets = self.batch[1]
        outputs, u = jax.jvp(self._model(), (self.params,), (v,))
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
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batch: Any
    key: Any = None
    num_samples: int = dataclasses.field(default=1, metadata={"static": True})

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
        outputs, u = jax.jvp(self._model(), (self.params,), (v,))
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

        zero = jnp.zeros((), jnp.result_type(*jax.tree_util.tree_leaves(self.params)))
        return jax.lax.scan(body, zero, self._scan())[0]

    def check_inputs(self) -> jax.Array:
        """Runtime checks of finite ``params`` and ``weights`` and of the labels' range."""
        ok = jnp.logical_and(_check_params(self.params), _all_finite(self.weights))
        check_finite(self.weights, "weights")
        if self.loss in ("cross_entropy", "logistic"):
            inputs = jax.tree_util.tree_map(lambda a: a[0], self.batches[0])
            shape = _output_spec(self.apply_fn, self.params, inputs).shape
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
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array

    def _batch_operator(self, batch: Any, index: jax.Array) -> GGNOperator:
        del index
        return GGNOperator(self.apply_fn, self.loss, self.params, batch)


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
    """

    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    loss: Any = dataclasses.field(metadata={"static": True})
    params: Any
    batches: Any
    weights: jax.Array
    key: Any = None
    num_samples: int = dataclasses.field(default=1, metadata={"static": True})

    def _batch_operator(self, batch: Any, index: jax.Array) -> FisherOperator:
        key = None if self.key is None else jax.random.fold_in(self.key, index)
        return FisherOperator(self.apply_fn, self.loss, self.params, batch, key, self.num_samples)


def _output_spec(apply_fn: Callable, params: Any, inputs: Any) -> jax.ShapeDtypeStruct:
    """Shape and dtype of ``apply_fn(params, inputs)`` (an abstract trace)."""
    return jax.eval_shape(lambda p: _apply(apply_fn, p, inputs), params)


# --------------------------------------------------------------------------- constructors


def _dataset_weights(batches: Any, params: Any, weights: Any) -> jax.Array:
    num_batches = _num_batches(batches)
    _num_examples(batches, "batches", axis=1)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    if weights is None:
        return jnp.full((num_batches,), 1.0 / num_batches, dtype=dtype)
    if jnp.shape(weights) != (num_batches,):
        raise ValueError(f"weights: expected shape ({num_batches},), got {jnp.shape(weights)}")
    return jnp.asarray(weights)


def ggn(
    apply_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any, *, loss: Loss
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
      params: pytree $\theta$ of float32/float64 arrays.
      batch: ``(inputs, targets)``; ``inputs`` any pytree for ``apply_fn``, ``targets`` what the
        loss takes (see the module docstring), leaves sharing the example axis.
      loss: ``"cross_entropy"``, ``"logistic"``, ``"squared_error"`` or a callable
        ``(outputs, targets) -> scalar`` (output Hessian by automatic differentiation). Static.

    Returns:
      A :class:`GGNOperator` (a pytree), ``op(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: for a bad ``apply_fn``, ``loss``, ``params`` or ``batch`` (here); when applied,
        outputs that do not fit the loss, or (runtime check) non-finite ``params`` / loss and
        cross-entropy labels out of range.

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
    return GGNOperator(apply_fn=apply_fn, loss=loss, params=params, batch=tuple(batch))


def dataset_ggn(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    loss: Loss,
    weights: jax.Array | None = None,
) -> DatasetGGNOperator:
    r"""The Gauss-Newton matrix of a loss averaged over stacked batches, one batch at a time.

    $$G = \sum_b w_b J_b^\top H_{{\rm out},b} J_b,$$ $w_b = 1/B$ by default (the dataset mean
    for equal batches). Products and quadratic forms scan the batches with ``lax.scan``, so
    memory holds one batch's activations (products) or none (forms); see :func:`ggn`.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` (as :func:`ggn`).
      params: pytree of float32/float64 arrays.
      batches: ``(inputs, targets)`` whose leaves have a leading axis of length B >= 1 indexing
        batches, then the example axis.
      loss: as :func:`ggn`. Static.
      weights: optional (B,) weights $w_b$.

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
        apply_fn=apply_fn, loss=loss, params=params, batches=tuple(batches), weights=weights
    )


def empirical_fisher(
    apply_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any, *, loss: Loss
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
      params: pytree of float32/float64 arrays.
      batch: ``(inputs, targets)``.
      loss: a named loss or a callable (one term per example). Static.

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
    return FisherOperator(apply_fn=apply_fn, loss=loss, params=params, batch=tuple(batch))


def dataset_empirical_fisher(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    loss: Loss,
    weights: jax.Array | None = None,
) -> DatasetFisherOperator:
    r"""The empirical Fisher $\sum_b w_b F_b$ over stacked batches, one batch at a time.

    Each batch's $F_b$ is :func:`empirical_fisher`'s; products and forms scan the batches.

    Args:
      apply_fn: ``(params, inputs) -> outputs``.
      params: pytree of float32/float64 arrays.
      batches: ``(inputs, targets)`` stacked along a leading batch axis of length B >= 1.
      loss: a named loss or a callable. Static.
      weights: optional (B,) weights (default 1/B).

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
        apply_fn=apply_fn, loss=loss, params=params, batches=tuple(batches), weights=weights
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
      params: pytree of float32/float64 arrays.
      batch: ``(inputs, targets)`` (the targets are only checked, not used, by the products).
      key: PRNG key of the label draws.
      loss: ``"cross_entropy"``, ``"logistic"`` or ``"squared_error"``. Static.
      num_samples: M >= 1 independent Monte Carlo samples, each one draw of every label. Static.

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
) -> DatasetFisherOperator:
    r"""The Monte Carlo Fisher $\sum_b w_b \hat F_b$ over stacked batches, one at a time.

    Batch $b$ is :func:`mc_fisher` with the key ``fold_in(key, b)``; unbiased for the
    Gauss-Newton matrix of :func:`dataset_ggn` (named losses).

    Args:
      apply_fn: ``(params, inputs) -> outputs``.
      params: pytree of float32/float64 arrays.
      batches: ``(inputs, targets)`` stacked along a leading batch axis of length B >= 1.
      key: PRNG key of the label draws.
      loss: a named loss. Static.
      num_samples: M >= 1 independent Monte Carlo samples, each one draw of every label. Static.
      weights: optional (B,) weights (default 1/B).

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
    )


# --------------------------------------------------------------------------- traces


def ggn_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Loss,
    num_samples: int | None = None,
    num_matvecs: int | None = None,
    method: Literal["hutchinson", "hutchpp"] = "hutchinson",
    chunk_size: int | Literal["auto"] | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr} G$ of the Gauss-Newton matrix on one batch.

    Builds :func:`ggn` and runs :func:`~kernels.curvature.hutchinson_trace` (``num_samples``
    probes, each a quadratic form $(Jv)^\top H_{\rm out}(Jv)$: one Jacobian-vector product) or
    :func:`~kernels.curvature.hutchpp_trace` (``num_matvecs`` products of the operator
    linearised once). Unbiased. For a dataset of stacked batches use :func:`dataset_ggn` with
    :func:`~kernels.curvature.hutchinson_trace`.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; keep the same object across calls.
      params: pytree of float32/float64 arrays.
      batch: ``(inputs, targets)``.
      key: PRNG key.
      loss: as :func:`ggn`. Static.
      num_samples: Hutchinson probes (>= 2), with ``method="hutchinson"``. Static.
      num_matvecs: Hutch++'s budget of products (>= 4), with ``method="hutchpp"``. (With
        ``method="hutchinson"`` it is the deprecated name of ``num_samples``.) Static.
      method: ``"hutchinson"`` (memory of ``chunk_size`` forward-mode passes) or ``"hutchpp"``
        (holds a sketch, :func:`~kernels.curvature.hutchpp_memory_bytes`).
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU; on a GPU or TPU, Hutchinson's probes under
        the memory budget of :func:`~kernels.curvature.hutchinson_trace` (1.5 gradients),
        Hutch++'s 16. Static.

    Returns:
      Estimate of the trace (fields as the estimator's).

    Raises:
      ValueError: for an unknown method, the count of the other method (or both, or neither),
        too few probes or products, a bad ``key`` or ``chunk_size``,
        and as :func:`ggn`; (runtime check) non-finite ``params``, loss or products.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 2.0]])  # tr G = tr diag(1, 4): exact for a diagonal G
    >>> est = ggn_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)), jax.random.key(0),
    ...                 loss="squared_error", num_samples=4)
    >>> est.mean
    Array(5., dtype=float32)
    """
    name, count = method_count(method, num_samples, num_matvecs, stacklevel=2)
    return _ggn_trace(
        apply_fn,
        params,
        batch,
        key,
        loss=loss,
        count=count,
        count_name=name,
        method=method,
        chunk_size=chunk_size,
    )


@compile_once
def _ggn_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Loss,
    count: int,
    count_name: str,
    method: str,
    chunk_size: int | Literal["auto"] | None,
) -> Estimate:
    """:func:`ggn_trace` once its count is named (``count``: probes or products)."""
    count = check_positive_int(count, count_name, minimum=2 if method == "hutchinson" else 4)
    op = ggn(apply_fn, params, batch, loss=loss)
    if method == "hutchinson":
        return hutchinson_trace(op, params, key, num_samples=count, chunk_size=chunk_size)
    return hutchpp_trace(op, params, key, num_matvecs=count, chunk_size=chunk_size)


def _example_chunk(example_chunk_size: Any) -> int | None:
    if example_chunk_size is None:
        return None
    return check_positive_int(example_chunk_size, "example_chunk_size")


def _trace_setup(apply_fn: Any, params: Any, batch: Any, loss: Any) -> tuple[int, int, tuple]:
    """Static checks of a per-example trace; (n, N, the whole batch's output shape)."""
    _check_apply_fn(apply_fn)
    _check_floating(params, "params")
    num = _num_examples(batch, "batch")
    inputs, targets = jax.tree_util.tree_map(lambda a: a[:1], tuple(batch))
    spec = _output_spec(apply_fn, params, inputs)
    _check_outputs(loss, spec, targets)
    shape = (num, *spec.shape[1:])
    return num, _num_terms(loss, shape), shape


def _example_sq_norm(
    apply_fn: Any, loss: Any, params: Any, example: Any, key: jax.Array | None
) -> jax.Array:
    r"""$\|J_i^\top s_i\|^2$ for one example (its leading axis restored to length 1)."""
    inputs, targets = jax.tree_util.tree_map(lambda a: a[None], example)
    outputs, vjp_fn = jax.vjp(lambda p: _apply(apply_fn, p, inputs), params)
    scores = _scores(loss, outputs, targets) if key is None else _sampled_scores(loss, outputs, key)
    grad = vjp_fn(jax.lax.stop_gradient(scores).astype(outputs.dtype))[0]
    leaves = jax.tree_util.tree_leaves(grad)
    return sum(jnp.sum(leaf.astype(outputs.dtype) ** 2) for leaf in leaves)


def _check_examples(num_bad: jax.Array, valid: jax.Array, num: int) -> None:
    check_that(
        jnp.logical_or(num_bad == 0, jnp.logical_not(valid)),
        f"apply_fn: non-finite per-example gradients at {{}} of the {num} examples",
        num_bad,
    )


@compile_once
def empirical_fisher_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    loss: Loss,
    example_chunk_size: int | None = None,
) -> jax.Array:
    r"""The exact trace of the empirical Fisher: per-example squared gradient norms.

    $$\operatorname{tr} F_{\rm emp} = \frac1N\sum_{i=1}^n \|g_i\|^2,\qquad
    g_i = \nabla_\theta\sum_{j\in i}\ell_j,$$ (:func:`empirical_fisher`; one term per example:
    $\frac1n\sum_i\|\nabla\ell_i\|^2$). Each $g_i$ is a vector-Jacobian product of example $i$
    alone, ``example_chunk_size`` examples vectorised at a time (memory: that many
    parameter-sized gradients and their activations, whatever n is), spread over the devices
    like Monte Carlo samples (:func:`kernels.parallel.map_samples`). Exact: pass a whole dataset
    as one batch, its size only sets the run time.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; examples must be independent (module
        docstring).
      params: pytree of float32/float64 arrays.
      batch: ``(inputs, targets)``.
      loss: a named loss or a callable (one term per example). Static.
      example_chunk_size: examples per vectorised batch of per-example gradients, an int >= 1;
        ``None`` runs them one at a time.

    Returns:
      The trace, a scalar in the outputs' dtype.

    Raises:
      ValueError: as :func:`ggn`, for a bad ``example_chunk_size``; (runtime check) non-finite
        ``params``, cross-entropy labels out of range, non-finite per-example gradients (with
        how many of the n examples).

    References:
      Kunstner, Hennig, Balles 2019, arXiv:1905.12558.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # (1/2)(2^2 + 6^2)
    >>> empirical_fisher_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.array([-1.0, -3.0])),
    ...                        loss="squared_error")
    Array(20., dtype=float32)
    """
    _check_loss(loss)
    chunk = _example_chunk(example_chunk_size)
    num, num_terms, shape = _trace_setup(apply_fn, params, batch, loss)
    inputs, targets = batch
    valid = jnp.logical_and(_check_params(params), _check_labels(loss, shape, targets))
    norms = map_samples(
        lambda example: _example_sq_norm(apply_fn, loss, params, example, None),
        (inputs, targets),
        chunk_size=chunk,
    )
    _check_examples(jnp.sum(~jnp.isfinite(norms)).astype(jnp.int32), valid, num)
    return jnp.sum(norms) / jnp.asarray(num_terms, norms.dtype)


@compile_once
def mc_fisher_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Literal["cross_entropy", "logistic", "squared_error"],
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = None,
    example_chunk_size: int | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr} F$ of the Fisher by labels drawn from the model.

    Sample $k$ draws every label from the predictive distribution (key
    ``sample_key(key, k)``, then as :func:`mc_fisher`) and computes the exact trace of that
    draw's $\hat F_k$, $\frac1N\sum_i\|\hat g_{ik}\|^2$, from per-example gradients; the
    estimate is the mean over the $K$ = ``num_samples`` draws and its standard error the sample
    standard deviation over $\sqrt K$. Unbiased for $\operatorname{tr} F =
    \operatorname{tr} G$ (named losses); no probe vectors, so the only noise is the labels'.
    Sample $k$ equals the trace of ``mc_fisher(..., key=fold_in(key, k), num_samples=1)``.
    Memory: ``chunk_size`` draws times ``example_chunk_size`` per-example gradients.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; examples must be independent.
      params: pytree of float32/float64 arrays.
      batch: ``(inputs, targets)`` (targets checked, not used).
      key: PRNG key.
      loss: ``"cross_entropy"``, ``"logistic"`` or ``"squared_error"``. Static.
      num_samples: K >= 2 independent Monte Carlo samples (label draws). Static.
      chunk_size: samples per vectorised batch, an int >= 1; ``None`` runs them one at a time;
        ``"auto"``: ``None`` on a CPU, on a GPU or TPU
        :func:`kernels._backend.default_chunk_size` ``("probes", size=number of parameters)``.
      example_chunk_size: examples per vectorised batch of per-example gradients within a
        sample, an int >= 1; ``None`` runs them one at a time.

    Returns:
      Estimate(mean, stderr, num_samples=K).

    Raises:
      ValueError: as :func:`mc_fisher`, for num_samples < 2 or a bad chunk size; (runtime
        check) as :func:`empirical_fisher_trace` (non-finite samples, with their count).

    References:
      Martens 2020, arXiv:1412.1193; Jastrzebski et al. 2021, "Catastrophic Fisher explosion",
      arXiv:2012.14193 (the Fisher trace as a measure).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # tr F = tr G = (2/2)(1 + 1)
    >>> est = mc_fisher_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)),
    ...                       jax.random.key(0), loss="squared_error", num_samples=2000)
    >>> abs(float(est.mean) - 2.0) < 4 * float(est.stderr)
    True
    """
    _check_mc(loss, key, num_samples)
    num_samples = check_num_samples(num_samples, "num_samples", minimum=2)
    chunk = check_chunk_size(chunk_size, auto="auto")
    if chunk == "auto":
        size, dtype = tree_size(params)
        chunk = auto_chunk_size(None, "probes", size=size, dtype=dtype)
    example_chunk = _example_chunk(example_chunk_size)
    num, num_terms, shape = _trace_setup(apply_fn, params, batch, loss)
    inputs, targets = batch
    valid = jnp.logical_and(_check_params(params), _check_labels(loss, shape, targets))
    indices = jnp.arange(num, dtype=jnp.uint32)

    def one_draw(draw_key: jax.Array) -> jax.Array:
        base = jax.random.fold_in(draw_key, 0)  # sample m = 0 of mc_fisher(key=draw_key)

        def example_norm(xs: Any) -> jax.Array:
            example, index = xs
            key_i = jax.random.fold_in(base, index)
            return _example_sq_norm(apply_fn, loss, params, example, key_i)

        norms = map_chunked(
            example_norm, ((inputs, targets), indices), chunk_size=example_chunk, key=draw_key
        )
        return jnp.sum(norms) / jnp.asarray(num_terms, norms.dtype)

    stats = sample_statistics(one_draw, key, num_samples=num_samples, chunk_size=chunk)
    check_that(
        jnp.logical_or(stats.num_nonfinite == 0, jnp.logical_not(valid)),
        f"apply_fn: non-finite per-example gradients in {{}} of the {num_samples} samples",
        stats.num_nonfinite,
    )
    return stats.estimate()
