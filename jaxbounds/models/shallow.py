r"""The shallow Transformer of the GD generalization paper (one attention layer, ReLU, pooling).

$$f(X) = \frac{1}{d_s} w_O^\top \sum_{i=1}^{d_s}
    \sigma_r\Big(W_V X^\top \sigma_s\big(X W_K^\top W_Q x_i^\top / \sqrt{d_m}\big)\Big),$$

with $X \in \mathbb{R}^{d_s \times d}$ (rows $x_i$ are the tokens), $W_Q, W_K, W_V \in
\mathbb{R}^{d_m \times d}$, $w_O \in \mathbb{R}^{d_m}$, $\sigma_s$ the softmax over the keys,
$\sigma_r$ the ReLU (the paper's feed-forward matrix is fixed to $W_H = I$) and average pooling
over the $d_s$ positions. The last hidden features are
$f_{pre}(X) = \frac{1}{d_s}\sum_i \sigma_r(z_i)$, so $f(X) = w_O^\top f_{pre}(X)$.

LeCun initialisation as in the paper: $W_Q, W_K, W_V$ entries $\sim N(0, 1/d)$, $w_O$ entries
$\sim N(0, 1/d_m)$. No biases, no LayerNorm, no residual connection.

References:
  "Generalization bound for a Shallow Transformer trained using Gradient Descent" (anonymous,
  under review; ``shared/papers/shallow_transformer_gd_generalization.md``), section 3.1;
  Wu et al. 2024, "On the convergence of encoder-only shallow Transformers", arXiv:2311.01575.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["PARAM_NAMES", "ShallowTransformer", "shallow_apply", "shallow_features"]

#: Parameter names, in the paper's order theta = {W_Q, W_K, W_V, w_O}.
PARAM_NAMES = ("W_Q", "W_K", "W_V", "w_O")


def shallow_features(params: Any, inputs: jax.Array) -> jax.Array:
    r"""Last hidden features $f_{pre}(X) = \frac{1}{d_s}\sum_i \mathrm{relu}(z_i)$.

    Args:
      params: mapping with ``"W_Q"``, ``"W_K"``, ``"W_V"`` of shape (d_m, d) (``"w_O"`` unused).
      inputs: (d_s, d) or (batch, d_s, d).

    Returns:
      (d_m,) or (batch, d_m) features.
    """
    w_q, w_k, w_v = params["W_Q"], params["W_K"], params["W_V"]
    d_m = w_q.shape[0]
    q = jnp.einsum("...sd,md->...sm", inputs, w_q)
    k = jnp.einsum("...sd,md->...sm", inputs, w_k)
    v = jnp.einsum("...sd,md->...sm", inputs, w_v)
    scale = jnp.asarray(1.0 / math.sqrt(d_m), dtype=q.dtype)
    scores = jnp.einsum("...im,...jm->...ij", q, k) * scale  # query i, key j
    beta = jax.nn.softmax(scores, axis=-1)
    z = jnp.einsum("...ij,...jm->...im", beta, v)
    return jnp.mean(jax.nn.relu(z), axis=-2)


def shallow_apply(params: Any, inputs: jax.Array) -> jax.Array:
    """Model output ``f(X) = w_O^T f_pre(X)`` from a parameter mapping (pure function).

    Args:
      params: mapping with ``"W_Q"``, ``"W_K"``, ``"W_V"`` (d_m, d) and ``"w_O"`` (d_m,).
      inputs: (d_s, d) or (batch, d_s, d).

    Returns:
      A scalar, or (batch,) outputs.
    """
    return shallow_features(params, inputs) @ params["w_O"]


class ShallowTransformer(nnx.Module):
    r"""One-layer self-attention Transformer with ReLU, average pooling and a scalar readout.

    ``model(X)`` maps (d_s, d) or (batch, d_s, d) tokens to a scalar or (batch,) outputs;
    ``model.features(X)`` returns the last hidden features $f_{pre}$ (used for
    ``alpha = sigma_min(F_pre^0)``). Parameters are ``nnx.Param`` attributes named as in the
    paper: ``W_Q``, ``W_K``, ``W_V`` (d_m, d) and ``w_O`` (d_m,).

    Args:
      d: token dimension (64 for the paper's MNIST tokens).
      d_m: model dimension.
      rngs: ``nnx.Rngs``; the ``params`` stream draws the initialisation.
      dtype: parameter dtype (default float32).

    Raises:
      ValueError: if ``d`` or ``d_m`` is not a positive int.

    References:
      Shallow-Transformer GD paper, section 3.1.2-3.1.3 (model and LeCun initialisation).
    """

    def __init__(self, d: int, d_m: int, *, rngs: nnx.Rngs, dtype: Any = jnp.float32):
        for name, value in (("d", d), ("d_m", d_m)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.d = d
        self.d_m = d_m
        kq, kk, kv, ko = jax.random.split(rngs.params(), 4)
        std_in = 1.0 / math.sqrt(d)
        std_out = 1.0 / math.sqrt(d_m)
        self.W_Q = nnx.Param(jax.random.normal(kq, (d_m, d), dtype) * std_in)
        self.W_K = nnx.Param(jax.random.normal(kk, (d_m, d), dtype) * std_in)
        self.W_V = nnx.Param(jax.random.normal(kv, (d_m, d), dtype) * std_in)
        self.w_O = nnx.Param(jax.random.normal(ko, (d_m,), dtype) * std_out)

    def params_dict(self) -> dict[str, jax.Array]:
        """The parameters as a plain dict ``{"W_Q", "W_K", "W_V", "w_O"}`` of arrays."""
        return {name: getattr(self, name)[...] for name in PARAM_NAMES}

    def features(self, inputs: jax.Array) -> jax.Array:
        """Last hidden features f_pre, (batch, d_m) for (batch, d_s, d) inputs."""
        return shallow_features(self.params_dict(), inputs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Outputs f(X), (batch,) for (batch, d_s, d) inputs (a scalar for one (d_s, d))."""
        if inputs.ndim not in (2, 3) or inputs.shape[-1] != self.d:
            raise ValueError(
                f"inputs: expected shape (d_s, {self.d}) or (batch, d_s, {self.d}), "
                f"got {inputs.shape}"
            )
        return shallow_apply(self.params_dict(), inputs)
