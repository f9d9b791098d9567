r"""A small pre-norm Transformer with attention and MLP blocks of configurable depth.

Layer $l = 1..L$ acts on the residual stream $X \in \mathbb{R}^{T \times d}$ (rows are tokens)
with $H$ heads of width $k$ and an MLP of width $m$:

$$X \leftarrow X + \sum_{h=1}^H \mathrm{RowSoftmax}\big(N(X)\, W_{QK}^{(l,h)} N(X)^\top\big)
  N(X)\, \tilde V^{(l,h)},\qquad
  X \leftarrow X + \phi\big(N(X) M_{in}^{(l)}\big) M_{out}^{(l)},$$

with $W_{QK} = W_Q W_K^\top / \sqrt k$ (rank $\le k$), $\tilde V = W_V W_O$ (rank $\le k$),
$N = $ :func:`~jaxbounds.models.scalar.project_rows` (every row onto the unit ball, a
parameter-free stand-in for LayerNorm), $\phi$ the GELU ($L_\phi \approx 1.13$). No biases.
The output is $w^\top N(X_{[CLS]})$ read from row 0 (scalar score, logistic loss).

These are the matrices of Sakai & Imaizumi's spectrum-adaptive bound (SPEC.md section 6):
:func:`spectral_layers` returns them per layer as :data:`jaxbounds.bounds.spectral.Layer` dicts
(``qk``, ``v`` per head, ``m_in`` (d, m), ``m_out`` (m, d)) in float64.

Parameter names (nnx attributes and keys of the pure dict from
:func:`jaxbounds.models.as_pure`), heads stacked on the leading axis:

===============================  ============  ==========================================
key                              shape         role
===============================  ============  ==========================================
``["layers"][l]["w_q"]``         (H, d, k)     queries
``["layers"][l]["w_k"]``         (H, d, k)     keys
``["layers"][l]["w_v"]``         (H, d, k)     values
``["layers"][l]["w_o"]``         (H, k, d)     head outputs
``["layers"][l]["m_in"]``        (d, m)        MLP input
``["layers"][l]["m_out"]``       (m, d)        MLP output
``["w"]``                        (d,)          readout of the [CLS] row
===============================  ============  ==========================================

References:
  Sakai & Imaizumi 2026 (abstract; form from the authors' code, SPEC.md section 6);
  Vaswani et al. 2017, arXiv:1706.03762; Xiong et al. 2020 (pre-norm), arXiv:2002.04745.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbounds.models.scalar import project_rows
from kernels._checks import check_positive_int

__all__ = ["GELU_LIPSCHITZ", "BlockLayer", "BlockTransformer", "spectral_layers"]

#: Lipschitz constant of the (exact) GELU, as in the authors' code: max_x |GELU'(x)| ~ 1.129.
GELU_LIPSCHITZ = 1.13

CLS_INDEX = 0


class BlockLayer(nnx.Module):
    """One pre-norm layer: multi-head attention, then a GELU MLP, each with a residual.

    Attributes:
      w_q, w_k, w_v: Param (H, d, k).
      w_o: Param (H, k, d).
      m_in: Param (d, m).
      m_out: Param (m, d).
    """

    def __init__(
        self, embed_dim: int, head_dim: int, num_heads: int, mlp_dim: int, *,
        param_dtype: Any, rngs: nnx.Rngs,
    ):  # fmt: skip
        d, k, h, m = embed_dim, head_dim, num_heads, mlp_dim
        normal = jax.nn.initializers.normal
        self.w_q = nnx.Param(normal(d**-0.5)(rngs.params(), (h, d, k), param_dtype))
        self.w_k = nnx.Param(normal(d**-0.5)(rngs.params(), (h, d, k), param_dtype))
        self.w_v = nnx.Param(normal(d**-0.5)(rngs.params(), (h, d, k), param_dtype))
        self.w_o = nnx.Param(normal((h * k) ** -0.5)(rngs.params(), (h, k, d), param_dtype))
        self.m_in = nnx.Param(normal(d**-0.5)(rngs.params(), (d, m), param_dtype))
        self.m_out = nnx.Param(normal(m**-0.5)(rngs.params(), (m, d), param_dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the layer to the residual stream ``x`` of shape (..., T, d)."""
        k = self.w_q.shape[-1]
        n = project_rows(x)
        q = jnp.einsum("...td,hdk->...htk", n, self.w_q[...])
        keys = jnp.einsum("...sd,hdk->...hsk", n, self.w_k[...])
        scores = jnp.einsum("...htk,...hsk->...hts", q, keys) / jnp.asarray(math.sqrt(k), x.dtype)
        values = jnp.einsum("...sd,hdk->...hsk", n, self.w_v[...])
        heads = jnp.einsum("...hts,...hsk->...htk", jax.nn.softmax(scores, axis=-1), values)
        x = x + jnp.einsum("...htk,hkd->...td", heads, self.w_o[...])
        hidden = jax.nn.gelu(project_rows(x) @ self.m_in[...], approximate=False)
        return x + hidden @ self.m_out[...]


class BlockTransformer(nnx.Module):
    r"""L-layer pre-norm Transformer (attention + GELU MLP per layer) with a [CLS] readout.

    See the module docstring for the formula and parameter names. Inputs (T, d) or
    (batch, T, d), row 0 the [CLS] token, are cast to the parameters' dtype; the output is the
    scalar $w^\top N(X^{(L)}_{[CLS]})$, shape () or (batch,).

    Args:
      embed_dim: d >= 1.
      num_layers: L >= 1.
      num_heads: H >= 1.
      head_dim: k >= 1 (default d // H, at least 1): the rank cap of W_QK and V~.
      mlp_dim: m >= 1 (default 2d).
      param_dtype: parameter dtype (default float32).
      rngs: ``nnx.Rngs`` for the initialisation.

    Raises:
      ValueError: naming the argument, for a non-positive size.

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> model = BlockTransformer(4, num_layers=2, num_heads=2, rngs=nnx.Rngs(0))
    >>> model(jnp.ones((3, 5, 4))).shape
    (3,)
    """

    def __init__(
        self, embed_dim: int, *, num_layers: int = 1, num_heads: int = 2,
        head_dim: int | None = None, mlp_dim: int | None = None,
        param_dtype: Any = jnp.float32, rngs: nnx.Rngs,
    ):  # fmt: skip
        for name, value in (("embed_dim", embed_dim), ("num_layers", num_layers),
                            ("num_heads", num_heads)):  # fmt: skip
            check_positive_int(value, name)
        head_dim = max(1, embed_dim // num_heads) if head_dim is None else head_dim
        mlp_dim = 2 * embed_dim if mlp_dim is None else mlp_dim
        check_positive_int(head_dim, "head_dim")
        check_positive_int(mlp_dim, "mlp_dim")
        self.embed_dim = embed_dim
        self.layers = nnx.List(
            [
                BlockLayer(
                    embed_dim, head_dim, num_heads, mlp_dim, param_dtype=param_dtype, rngs=rngs
                )
                for _ in range(num_layers)
            ]
        )
        init = jax.nn.initializers.normal(embed_dim**-0.5)
        self.w = nnx.Param(init(rngs.params(), (embed_dim,), param_dtype))

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Scalar score (...,) read from the normalised [CLS] row of the last layer."""
        x = jnp.asarray(inputs, self.w.dtype)
        if x.ndim < 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"inputs: expected shape (..., T, {self.embed_dim}), got {x.shape}")
        for layer in self.layers:
            x = layer(x)
        cls = project_rows(x[..., CLS_INDEX, :])
        return jnp.einsum("...d,d->...", cls, self.w[...])


def spectral_layers(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    r"""The matrices of the spectrum-adaptive bound per layer, float64 numpy.

    ``{"qk": [W_Q^h W_K^{h\top} / sqrt(k)], "v": [W_V^h W_O^h], "m_in": M_in, "m_out": M_out}``
    per layer (the :data:`jaxbounds.bounds.spectral.Layer` layout), products taken in float64
    so that the rank cap k of the per-head products holds to rounding.

    Args:
      params: the pure parameter dict of a :class:`BlockTransformer` (``as_pure``).

    Returns:
      One dict per layer, in layer order.

    Raises:
      ValueError: for a dict without ``"layers"``.

    >>> from flax import nnx
    >>> from jaxbounds.models import as_pure
    >>> _, p = as_pure(BlockTransformer(6, num_layers=2, num_heads=3, rngs=nnx.Rngs(0)))
    >>> layers = spectral_layers(p)
    >>> len(layers), len(layers[0]["qk"]), layers[0]["qk"][0].shape, layers[1]["m_in"].shape
    (2, 3, (6, 6), (6, 12))
    >>> int(np.linalg.matrix_rank(layers[0]["v"][1]))
    2
    """
    if "layers" not in params:
        raise ValueError("params: expected the pure dict of a BlockTransformer (no 'layers' key)")
    out = []
    layers = params["layers"]
    for i in sorted(layers):
        layer = {name: np.asarray(a, dtype=np.float64) for name, a in layers[i].items()}
        scale = 1.0 / math.sqrt(layer["w_q"].shape[-1])
        out.append({
            "qk": [q @ kk.T * scale for q, kk in zip(layer["w_q"], layer["w_k"], strict=True)],
            "v": [v @ o for v, o in zip(layer["w_v"], layer["w_o"], strict=True)],
            "m_in": layer["m_in"],
            "m_out": layer["m_out"],
        })  # fmt: skip
    return out
