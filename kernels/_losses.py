r"""The loss library of the Gauss-Newton and Fisher kernels: one object per named loss.

Each named loss is a small frozen dataclass (:class:`CrossEntropy`, :class:`Logistic`,
:class:`SquaredError`) holding everything the kernels need of it: the mean loss
$\ell(f, y)$, the number $N$ of terms it averages, its Hessian in the outputs
$H_{\rm out}$ (as a product and as a quadratic form), the output scores $s_i$ with
$g_i = J_i^\top s_i$, the scores at labels drawn from its predictive distribution (the Monte
Carlo Fisher), and its static and runtime label checks. :data:`LOSSES` maps each name to its
object; a user's callable ``(outputs, targets) -> scalar`` is wrapped in :class:`CallableLoss`,
which derives the same quantities by automatic differentiation. :func:`loss_object` resolves
either; the module-level helpers the operators call look the object up once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._checks import check_that
from kernels._operators import _check_params
from kernels.parallel import map_chunked

__all__ = [
    "LOSSES",
    "NAMED_LOSSES",
    "CallableLoss",
    "CrossEntropy",
    "Logistic",
    "Loss",
    "SquaredError",
    "loss_object",
]

Loss = Literal["cross_entropy", "logistic", "squared_error"] | Callable[[Any, Any], jax.Array]

_LOSS_HINT = (
    "the Gauss-Newton and Fisher kernels take apply_fn(params, inputs) -> outputs (one row per "
    "example) and batch=(inputs, targets); for a loss (params, batch) -> scalar use "
    "hessian_trace / hvp (kernels.curvature)"
)


def _as_float(targets: Any, outputs: jax.Array) -> jax.Array:
    return jnp.asarray(targets).astype(outputs.dtype)


@dataclasses.dataclass(frozen=True)
class CrossEntropy:
    r"""Softmax cross-entropy of logits $(n, \dots, K)$ and integer labels $(n, \dots)$.

    $\ell = \frac1N\sum (\log\sum_k e^{f_k} - f_y)$ over the $N$ label positions;
    $H_{\rm out} = \frac1N(\mathrm{diag}(p) - pp^\top)$ per position, $p$ the softmax.

    >>> import jax.numpy as jnp
    >>> round(float(CrossEntropy().mean(jnp.zeros((2, 4)), jnp.array([0, 3]))), 6)  # log 4
    1.386294
    """

    name: str = "cross_entropy"

    def num_terms(self, shape: tuple[int, ...]) -> int:
        """N: the label positions (every axis but the last)."""
        return math.prod(shape[:-1])

    def mean(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """The mean loss."""
        picked = jnp.take_along_axis(outputs, targets[..., None].astype(jnp.int32), axis=-1)
        return jnp.mean(jax.nn.logsumexp(outputs, axis=-1) - picked[..., 0])

    def hessian(self, outputs: jax.Array, scale: float) -> Callable:
        """``u -> scale * H u`` per position (``H = diag(p) - p p^T``)."""
        p = jax.nn.softmax(outputs, axis=-1)
        return lambda u: scale * p * (u - jnp.sum(p * u, axis=-1, keepdims=True))

    def form(self, outputs: jax.Array, u: jax.Array, scale: float) -> jax.Array:
        """``scale * u^T H u``, centred: non-negative by construction."""
        p = jax.nn.softmax(outputs, axis=-1)
        centred = u - jnp.sum(p * u, axis=-1, keepdims=True)
        return scale * jnp.sum(p * centred**2)

    def scores(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """``softmax(f) - onehot(y)``."""
        p = jax.nn.softmax(outputs, axis=-1)
        return p - jax.nn.one_hot(targets, outputs.shape[-1], dtype=outputs.dtype)

    def sample_scores(self, outputs: jax.Array, key: jax.Array) -> jax.Array:
        """Scores at labels drawn from the softmax."""
        return self.scores(outputs, jax.random.categorical(key, outputs, axis=-1))

    def check_shapes(self, shape: tuple[int, ...], targets: Any) -> None:
        """Static: logits ``(n, ..., K)`` and integer labels ``(n, ...)``."""
        shape_t = jnp.shape(targets)
        if len(shape) < 2 or shape_t != shape[:-1]:
            raise ValueError(
                f"batch: cross_entropy takes logits (n, ..., K) and labels (n, ...), got outputs "
                f"{shape} and targets {shape_t}"
            )
        if not jnp.issubdtype(jnp.result_type(targets), jnp.integer):
            raise ValueError(
                f"batch: cross_entropy labels must be integers, got {jnp.result_type(targets)}"
            )

    def check_labels(self, shape: tuple[int, ...], targets: Any) -> jax.Array:
        """Runtime check: labels lie in ``[0, K)``."""
        num_classes = shape[-1]
        ok = jnp.all((targets >= 0) & (targets < num_classes))
        check_that(ok, f"batch: cross_entropy labels must lie in [0, {num_classes})")
        return ok


@dataclasses.dataclass(frozen=True)
class _Elementwise:
    """A loss with one term per output element and targets shaped like the outputs."""

    name: str

    def num_terms(self, shape: tuple[int, ...]) -> int:
        """N: every output element."""
        return math.prod(shape)

    def check_shapes(self, shape: tuple[int, ...], targets: Any) -> None:
        """Static: targets of the outputs' shape."""
        shape_t = jnp.shape(targets)
        if shape_t != shape:
            raise ValueError(
                f"batch: {self.name} takes outputs and targets of one shape, got outputs {shape} "
                f"and targets {shape_t}"
            )

    def check_labels(self, shape: tuple[int, ...], targets: Any) -> jax.Array:
        """Runtime check of the targets: none by default."""
        del shape, targets
        return jnp.asarray(True)


@dataclasses.dataclass(frozen=True)
class Logistic(_Elementwise):
    r"""Logistic loss of scores $f$ and labels $y \in [0, 1]$, elementwise.

    $\ell = \frac1N\sum (\log(1 + e^f) - y f)$; $H_{\rm out} = \frac1N\sigma(f)\sigma(-f)$.

    >>> import jax.numpy as jnp
    >>> round(float(Logistic().mean(jnp.zeros(2), jnp.array([0.0, 1.0]))), 6)  # log 2
    0.693147
    """

    name: str = "logistic"

    def mean(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """The mean loss."""
        y = _as_float(targets, outputs)
        return jnp.mean(jnp.logaddexp(jnp.zeros_like(outputs), outputs) - y * outputs)

    @staticmethod
    def mean_of_labels(scores: jax.Array, labels: jax.Array) -> jax.Array:
        r"""The mean loss for hard labels $y \in \{0, 1\}$ as $\log(1 + e^{-s f})$, $s = 2y - 1$.

        The same loss as :meth:`mean` written with the labels' signs (it rounds differently);
        the training engine's ``logistic_loss`` is this form.
        """
        signs = (2 * labels - 1).astype(scores.dtype)
        return jnp.mean(jnp.logaddexp(jnp.zeros_like(scores), -signs * scores))

    def hessian(self, outputs: jax.Array, scale: float) -> Callable:
        """``u -> scale * sigma(f) sigma(-f) u``."""
        w = scale * jax.nn.sigmoid(outputs) * jax.nn.sigmoid(-outputs)
        return lambda u: w * u

    def form(self, outputs: jax.Array, u: jax.Array, scale: float) -> jax.Array:
        """``scale * sum(sigma(f) sigma(-f) u^2)``."""
        return scale * jnp.sum(jax.nn.sigmoid(outputs) * jax.nn.sigmoid(-outputs) * u**2)

    def scores(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """``sigma(f) - y``."""
        return jax.nn.sigmoid(outputs) - _as_float(targets, outputs)

    def sample_scores(self, outputs: jax.Array, key: jax.Array) -> jax.Array:
        """Scores at labels drawn as Bernoulli(sigma(f))."""
        return self.scores(outputs, jax.random.bernoulli(key, jax.nn.sigmoid(outputs)))

    def check_labels(self, shape: tuple[int, ...], targets: Any) -> jax.Array:
        """Runtime check: labels lie in ``[0, 1]``."""
        ok = jnp.all((targets >= 0) & (targets <= 1))
        check_that(ok, "batch: logistic labels must lie in [0, 1]")
        return ok


@dataclasses.dataclass(frozen=True)
class SquaredError(_Elementwise):
    r"""Squared error $\frac1N\sum (f - y)^2$ (no factor 1/2); $H_{\rm out} = \frac2N I$.

    >>> import jax.numpy as jnp
    >>> float(SquaredError().mean(jnp.array([1.0, 3.0]), jnp.array([0.0, 0.0])))
    5.0
    """

    name: str = "squared_error"

    def mean(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """The mean loss."""
        return jnp.mean((outputs - _as_float(targets, outputs)) ** 2)

    def hessian(self, outputs: jax.Array, scale: float) -> Callable:
        """``u -> 2 scale u``."""
        del outputs
        return lambda u: (2 * scale) * u

    def form(self, outputs: jax.Array, u: jax.Array, scale: float) -> jax.Array:
        """``2 scale |u|^2``."""
        del outputs
        return (2 * scale) * jnp.sum(u**2)

    def scores(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """``2 (f - y)``."""
        return 2 * (outputs - _as_float(targets, outputs))

    def sample_scores(self, outputs: jax.Array, key: jax.Array) -> jax.Array:
        """Scores at y ~ N(f, 1/2) per element (the density exp(-(f - y)^2) normalised)."""
        z = jax.random.normal(key, outputs.shape, outputs.dtype)
        return -jnp.sqrt(jnp.asarray(2.0, outputs.dtype)) * z


LOSSES: dict[str, Any] = {loss.name: loss for loss in (CrossEntropy(), Logistic(), SquaredError())}
"""The named losses, by name."""

NAMED_LOSSES = tuple(LOSSES)


@dataclasses.dataclass(frozen=True)
class CallableLoss:
    r"""A user's loss ``(outputs, targets) -> scalar``; its curvature by autodiff.

    $N$ is the number of examples; the scores are $n \nabla_f \ell$ (the gradient of the
    example's own loss when $\ell$ is a mean over examples). It has no predictive
    distribution, so no Monte Carlo Fisher.
    """

    fn: Callable[[Any, Any], jax.Array]

    def num_terms(self, shape: tuple[int, ...]) -> int:
        """N: the examples."""
        return shape[0]

    def mean(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """The callable's value, checked to be a real floating scalar."""
        value = self.fn(outputs, targets)
        if jnp.shape(value) != () or not jnp.issubdtype(jnp.result_type(value), jnp.floating):
            raise ValueError(
                f"loss: must return a real floating scalar, got {jnp.result_type(value)} of "
                f"shape {jnp.shape(value)}"
            )
        return value

    def output_hessian(self, outputs: jax.Array, targets: Any) -> Callable:
        """``u -> H_out u`` by linearising the gradient in the outputs."""
        grad = jax.grad(lambda o: self.mean(o, targets))
        return jax.linearize(grad, outputs)[1]

    def output_form(self, outputs: jax.Array, targets: Any, u: jax.Array) -> jax.Array:
        """``u^T H_out u`` by forward over forward mode."""

        def slope(o: jax.Array) -> jax.Array:
            return jax.jvp(lambda q: self.mean(q, targets), (o,), (u,))[1]

        return jax.jvp(slope, (outputs,), (u,))[1]

    def scores(self, outputs: jax.Array, targets: Any) -> jax.Array:
        """``n * grad_f loss``."""
        grad = jax.grad(lambda o: self.mean(o, targets))(outputs)
        return outputs.shape[0] * grad

    def check_shapes(self, shape: tuple[int, ...], targets: Any, dtype: Any) -> None:
        """Static: the loss's value is a real scalar (abstractly)."""
        spec = jax.ShapeDtypeStruct(shape, dtype)
        jax.eval_shape(lambda o, t: self.mean(o, t), spec, targets)

    def check_labels(self, shape: tuple[int, ...], targets: Any) -> jax.Array:
        """Runtime check of the targets: none."""
        del shape, targets
        return jnp.asarray(True)


def loss_object(loss: Any) -> Any:
    """The library's object of ``loss``: a named loss's, or a callable wrapped."""
    if isinstance(loss, str):
        return LOSSES[loss]
    return CallableLoss(loss)


# --------------------------------------------------------------------------- static checks


def _check_loss(loss: Any, *, named: bool = False) -> None:
    """Static: ``loss`` is a named loss or (unless ``named``) a callable."""
    if isinstance(loss, str) and loss in LOSSES:
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
    obj = loss_object(loss)
    if isinstance(obj, CallableLoss):
        obj.check_shapes(shape, targets, dtype)
    else:
        obj.check_shapes(shape, targets)


# --------------------------------------------------------------------------- the operators' view


def _num_terms(loss: Any, shape: tuple[int, ...]) -> int:
    """N: the number of terms the mean loss averages (a callable: the examples)."""
    return loss_object(loss).num_terms(shape)


def _mean_loss(loss: Any, outputs: jax.Array, targets: Any) -> jax.Array:
    r"""The loss $\ell(f, y)$: the mean of its terms (or the callable's value)."""
    return loss_object(loss).mean(outputs, targets)


def _output_hessian(loss: Any, outputs: jax.Array, targets: Any) -> Callable:
    r"""$u \mapsto H_{\rm out} u$, the Hessian of the mean loss in the outputs, set up once."""
    obj = loss_object(loss)
    if isinstance(obj, CallableLoss):
        return obj.output_hessian(outputs, targets)
    return obj.hessian(outputs, 1.0 / obj.num_terms(outputs.shape))


def _output_form(loss: Any, outputs: jax.Array, targets: Any, u: jax.Array) -> jax.Array:
    r"""$u^\top H_{\rm out} u$ (centred for the softmax: non-negative by construction)."""
    obj = loss_object(loss)
    if isinstance(obj, CallableLoss):
        return obj.output_form(outputs, targets, u)
    return obj.form(outputs, u, 1.0 / obj.num_terms(outputs.shape))


def _scores(loss: Any, outputs: jax.Array, targets: Any) -> jax.Array:
    r"""Output scores $s_i$ at the observed labels: $g_i = J_i^\top s_i$.

    Named losses: the gradient of example $i$'s summed terms in its outputs; a callable:
    $n \nabla_f \ell$ (the gradient of the example's own loss when $\ell$ is a mean over
    examples).
    """
    return loss_object(loss).scores(outputs, targets)


def _sampled_scores(loss: str, outputs: jax.Array, key: jax.Array) -> jax.Array:
    """Scores at labels drawn from the predictive distribution of one example's outputs."""
    return LOSSES[loss].sample_scores(outputs, key)


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
    return loss_object(loss).check_labels(shape, targets)
