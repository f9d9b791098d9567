"""The loss library of the Gauss-Newton and Fisher kernels: values, output Hessians, scores."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._checks import (
    check_that,
)
from kernels._operators import (
    _check_params,
)
from kernels.parallel import map_chunked

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
