r"""The losses and the accuracy of the training loops, one implementation each.

All take model outputs first and labels / targets second and return a mean over examples:

- :func:`logistic_loss`: scalar scores $f$, labels $y \in \{0, 1\}$,
  $\frac1n\sum_i \log(1 + e^{-s_i f_i})$ with $s_i = 2y_i - 1$ (1-Lipschitz in $f$);
- :func:`cross_entropy_loss`: logits $f \in \mathbb{R}^{n \times K}$, labels in $\{0..K-1\}$;
- :func:`squared_loss`: $\frac1n\sum_i (f_i - y_i)^2$;
- :func:`classification_loss`: the logistic loss for scalar outputs, the cross-entropy for logits;
- :func:`accuracy`: the fraction of correct predictions ($f > 0$, or $\arg\max_k f_k$).

The cross-entropy and the squared error are the kernels' loss library's
(``kernels.gauss_newton``'s ``loss="cross_entropy"`` and ``"squared_error"``), so a model trained
here and measured there uses one definition. The logistic loss here takes hard labels in
{0, 1} through signs, ``log(1 + e^{-s f})``; the library's takes labels in [0, 1],
``log(1 + e^f) - y f``: equal on hard labels, rounded differently, so training keeps its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels._losses import LOSSES, Logistic

__all__ = [
    "accuracy",
    "classification_loss",
    "cross_entropy_loss",
    "logistic_loss",
    "squared_loss",
]


def logistic_loss(scores: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Mean logistic loss $\frac1n\sum_i \log(1 + e^{-s_i f_i})$, $s_i = 2y_i - 1$.

    Args:
      scores: (n,) real scores $f_i$.
      labels: (n,) labels in {0, 1}.

    Returns:
      The mean loss, a scalar of the scores' dtype.

    >>> import jax.numpy as jnp
    >>> logistic_loss(jnp.array([0.0, 0.0]), jnp.array([0, 1]))  # log 2
    Array(0.6931472, dtype=float32)
    """
    return Logistic.mean_of_labels(scores, labels)


def cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Mean softmax cross-entropy $\frac1n\sum_i (\log\sum_k e^{f_{ik}} - f_{i y_i})$.

    Args:
      logits: (n, K) logits.
      labels: (n,) ints in {0..K-1}.

    Returns:
      The mean loss.

    >>> import jax.numpy as jnp
    >>> round(float(cross_entropy_loss(jnp.zeros((2, 4)), jnp.array([0, 3]))), 6)  # log 4
    1.386294
    """
    return LOSSES["cross_entropy"].mean(logits, labels)


def squared_loss(preds: jax.Array, targets: jax.Array) -> jax.Array:
    r"""Mean squared error $\frac1n\sum_i (f_i - y_i)^2$ (no factor 1/2).

    >>> import jax.numpy as jnp
    >>> squared_loss(jnp.array([1.0, 3.0]), jnp.array([0.0, 0.0]))
    Array(5., dtype=float32)
    """
    return LOSSES["squared_error"].mean(preds, targets)


def classification_loss(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """:func:`logistic_loss` for scalar outputs (n,), :func:`cross_entropy_loss` for logits (n, K).

    >>> import jax.numpy as jnp
    >>> classification_loss(jnp.array([0.0, 0.0]), jnp.array([0, 1]))
    Array(0.6931472, dtype=float32)
    """
    if outputs.ndim == labels.ndim:
        return logistic_loss(outputs, labels)
    return cross_entropy_loss(outputs, labels)


def accuracy(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of correct predictions: ``outputs > 0`` (scalar outputs) or ``argmax`` (logits).

    >>> import jax.numpy as jnp
    >>> accuracy(jnp.array([1.0, -1.0, 2.0]), jnp.array([1, 1, 1]))
    Array(0.6666667, dtype=float32)
    """
    preds = (outputs > 0) if outputs.ndim == labels.ndim else jnp.argmax(outputs, axis=-1)
    return jnp.mean((preds.astype(labels.dtype) == labels).astype(jnp.result_type(float)))
