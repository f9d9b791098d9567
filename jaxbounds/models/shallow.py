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

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from kernels._checks import check_positive_int

__all__ = [
    "PARAM_NAMES",
    "ShallowQuantities",
    "ShallowTransformer",
    "shallow_apply",
    "shallow_features",
    "shallow_quantities",
]

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
            check_positive_int(value, name)
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


@dataclasses.dataclass(frozen=True)
class ShallowQuantities:
    r"""What the shallow-Transformer GD bounds (Lemma 1, Lemma 4, Theorem 5) take from a run.

    Built by :func:`shallow_quantities`; read by
    :func:`jaxbounds.bounds.from_model.shallow_bounds`.

    Attributes:
      num_examples: N.
      d_s: tokens per input.
      d_m: model dimension.
      input_radius: $R_X = \max_n \|X_n\|_F / \sqrt{d_s}$.
      init: the initial matrices keyed ``Q, K, V, O``.
      radii: $R_*$ = the largest distance from initialisation over training, keyed ``Q, K, V, O``.
      phi0: $\Phi(\theta^0) = \frac12\|f(\theta^0) - s\|^2$, targets $s = 2y - 1 \in \{-1, 1\}$.
      features0: $F_{pre}^0$, the (N, d_m) last hidden features at initialisation.
    """

    num_examples: int
    d_s: int
    d_m: int
    input_radius: float
    init: dict[str, jax.Array]
    radii: dict[str, float]
    phi0: float
    features0: jax.Array


def shallow_quantities(
    params0: Any, inputs: jax.Array, labels: jax.Array, *, radii: dict[str, float]
) -> ShallowQuantities:
    r"""The :class:`ShallowQuantities` of a GD run from ``params0`` on ``(inputs, labels)``.

    Args:
      params0: initial parameters ``{"W_Q", "W_K", "W_V", "w_O"}``.
      inputs: (N, d_s, d) training inputs.
      labels: (N,) labels in {0, 1}.
      radii: max over training of $\|W_t - W_0\|_F$ per parameter, keyed by the names of
        :data:`PARAM_NAMES` (e.g. ``TrainingRecord.radius``).

    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> p0 = ShallowTransformer(2, 4, rngs=nnx.Rngs(0)).params_dict()
    >>> q = shallow_quantities(p0, jnp.ones((3, 4, 2), jnp.float32), jnp.array([0, 1, 1]),
    ...                        radii=dict.fromkeys(PARAM_NAMES, 0.1))
    >>> q.num_examples, q.d_s, q.d_m, round(q.input_radius, 6), sorted(q.init)
    (3, 4, 4, 1.414214, ['K', 'O', 'Q', 'V'])
    """
    num, d_s, _ = inputs.shape
    f0 = shallow_apply(params0, inputs)
    signs = 2 * labels.astype(f0.dtype) - 1
    r_x = float(jnp.max(jnp.linalg.norm(inputs.reshape(num, -1), axis=1))) / math.sqrt(d_s)
    return ShallowQuantities(
        num_examples=int(num),
        d_s=int(d_s),
        d_m=int(params0["W_Q"].shape[0]),
        input_radius=r_x,
        init={name[-1]: params0[name] for name in PARAM_NAMES},
        radii={name[-1]: float(radii[name]) for name in PARAM_NAMES},
        phi0=float(0.5 * jnp.sum((f0 - signs) ** 2)),
        features0=shallow_features(params0, inputs),
    )
