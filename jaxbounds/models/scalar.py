r"""The scalar-output Transformer of Trauger & Tewari (2024) / Edelman et al. (2022).

One layer $i$ with input $X \in \mathbb{R}^{T \times d}$ (rows are tokens) and $H$ heads:

$$f_h(X) = \mathrm{RowSoftmax}\big(X W_{QK}^{(i,h)} X^\top\big)\, X W_v^{(i,h)}
\in \mathbb{R}^{T \times k},$$
$$g^{(i+1)} = \Pi_{norm}\Big(\sum_{h=1}^{H} \sigma\big(\Pi_{norm}(f_h(g^{(i)}))\big)
W_c^{(i,h)}\Big) \in \mathbb{R}^{T \times d},\qquad g^{(1)} = X,$$

where $\Pi_{norm}$ projects every row onto the unit Euclidean ball ($r \mapsto r / \max(1,
\|r\|_2)$), $\sigma$ is applied elementwise, is $L_\sigma$-Lipschitz and has $\sigma(0) = 0$,
and the heads are summed (the paper's section 2.6). There are no biases, no residual
connections and no LayerNorm. The output reads the [CLS] row (row 0) of the last layer:
$w^\top Y_{[CLS]}$ (scalar), or $Y_{[CLS]} W$ with $W \in \mathbb{R}^{d \times K}$ (K-class
logits, the paper's section 5 / 6 readout).

Parameter names (nnx attributes and keys of the pure dict from
:func:`jaxbounds.models.as_pure`), heads stacked on the leading axis:

===================================  =================  =========================================
key                                  shape              paper
===================================  =================  =========================================
``["layers"][i]["w_qk"]``            (H, d, d)          $W_{QK}^{(i,h)} = W_Q W_K^\top$
``["layers"][i]["w_v"]``             (H, d, k)          $W_v^{(i,h)}$
``["layers"][i]["w_c"]``             (H, k, d)          $W_c^{(i,h)}$
``["w"]``                            (d,) or (d, K)     readout $w$ (scalar) / $W$ (K classes)
===================================  =================  =========================================

:meth:`ScalarTransformer.named_matrices` turns a parameter dict into one 2-D matrix per head
(``"layer0.head1.W_QK"``, ...) for per-matrix norms; :func:`scalar_quantities` measures what
the papers' bounds take (:class:`ScalarQuantities`: the heads' matrices, the readout, the token
norms of the data and the sizes).

References:
  Trauger & Tewari 2024, arXiv:2310.13088, sections 2.6 and 4;
  Edelman, Goel, Kakade, Zhang 2022, arXiv:2110.10090.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from kernels._checks import check_positive_int

__all__ = [
    "ACTIVATIONS",
    "AttentionHead",
    "AttentionLayer",
    "ScalarQuantities",
    "ScalarTransformer",
    "project_rows",
    "scalar_quantities",
    "scale_by_radii",
]

#: Built-in activations: name -> (function with sigma(0) = 0, Lipschitz constant L_sigma).
ACTIVATIONS: dict[str, tuple[Callable[[jax.Array], jax.Array], float]] = {
    "relu": (jax.nn.relu, 1.0),
    "tanh": (jnp.tanh, 1.0),
    "identity": (lambda x: x, 1.0),
    "leaky_relu": (lambda x: jax.nn.leaky_relu(x, 0.01), 1.0),
}

CLS_INDEX = 0


def scale_by_radii(theta: Any, radii: Any) -> dict:
    """The one-layer scalar model's parameters with each head's matrices scaled by a radius.

    ``theta`` holds ``layers[0]`` (``w_qk``, ``w_v``, ``w_c`` of shape ``(heads, ...)``) and the
    readout ``w``; ``radii`` holds per-head radii ``qk``, ``v``, ``c`` (shape ``(heads,)``) and a
    scalar ``w``. Used by the Rademacher searches over norm balls of given radii.

    >>> import jax.numpy as jnp
    >>> theta = {"layers": {0: {k: jnp.ones((2, 1, 1)) for k in ("w_qk", "w_v", "w_c")}},
    ...          "w": jnp.ones(1)}
    >>> radii = {"qk": jnp.array([1.0, 2.0]), "v": jnp.ones(2), "c": jnp.ones(2), "w": 3.0}
    >>> out = scale_by_radii(theta, radii)
    >>> out["layers"][0]["w_qk"].ravel().tolist(), out["w"].tolist()
    ([1.0, 2.0], [3.0])
    """
    layer = theta["layers"][0]
    return {
        "layers": {0: {
            "w_qk": layer["w_qk"] * radii["qk"][:, None, None],
            "w_v": layer["w_v"] * radii["v"][:, None, None],
            "w_c": layer["w_c"] * radii["c"][:, None, None],
        }},
        "w": theta["w"] * radii["w"],
    }  # fmt: skip


def project_rows(x: jax.Array) -> jax.Array:
    r"""$\Pi_{norm}$: project every row (last axis) onto the unit Euclidean ball.

    $r \mapsto r / \max(1, \|r\|_2)$; rows already inside the ball are unchanged. Written as
    ``r * rsqrt(max(1, |r|^2))`` so the gradient is finite at ``r = 0``.

    >>> import jax.numpy as jnp
    >>> project_rows(jnp.array([[3.0, 4.0], [0.3, 0.4]]))
    Array([[0.6, 0.8],
           [0.3, 0.4]], dtype=float32)
    """
    sq = jnp.sum(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(jnp.maximum(sq, jnp.ones_like(sq)))


def _resolve_activation(
    activation: str | Callable[[jax.Array], jax.Array], lipschitz: float | None
) -> tuple[Callable[[jax.Array], jax.Array], float]:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)} or a callable")
        fn, lip = ACTIVATIONS[activation]
        return fn, float(lip if lipschitz is None else lipschitz)
    if not callable(activation):
        raise ValueError(f"activation: expected a name or a callable, got {activation!r}")
    if lipschitz is None:
        raise ValueError("activation_lipschitz: required when activation is a callable")
    return activation, float(lipschitz)


class AttentionLayer(nnx.Module):
    r"""One layer: $H$ summed heads $\sigma(\Pi_{norm}(f_h(X))) W_c^{(h)}$, then $\Pi_{norm}$.

    Attributes:
      w_qk: Param (H, d, d), combined query-key matrices $W_{QK} = W_Q W_K^\top$.
      w_v: Param (H, d, k), value matrices.
      w_c: Param (H, k, d), output matrices.
    """

    def __init__(
        self,
        embed_dim: int,
        hidden_dim: int,
        num_heads: int,
        *,
        activation: Callable[[jax.Array], jax.Array],
        param_dtype: Any,
        rngs: nnx.Rngs,
    ):
        d, k, h = embed_dim, hidden_dim, num_heads
        normal = jax.nn.initializers.normal
        # W_QK ~ N(0, 1/d^2): scores x^T W_QK x' are O(1) for |x|^2 ~ d.
        self.w_qk = nnx.Param(normal(1.0 / d)(rngs.params(), (h, d, d), param_dtype))
        self.w_v = nnx.Param(normal(d**-0.5)(rngs.params(), (h, d, k), param_dtype))
        self.w_c = nnx.Param(normal(k**-0.5)(rngs.params(), (h, k, d), param_dtype))
        self.activation = activation

    def __call__(self, x: jax.Array, *, query_rows: slice | None = None) -> jax.Array:
        """Apply the layer to ``x`` of shape (..., T, d).

        Args:
          x: token rows, (..., T, d).
          query_rows: compute only these output rows (e.g. the [CLS] row of the last layer);
            all rows by default. Keys and values always use every row.

        Returns:
          (..., T', d) with every row in the unit ball (T' = rows selected).
        """
        queries = x if query_rows is None else x[..., query_rows, :]
        scores = jnp.einsum("...td,hde,...se->...hts", queries, self.w_qk[...], x)
        attn = jax.nn.softmax(scores, axis=-1)
        values = jnp.einsum("...sd,hdk->...hsk", x, self.w_v[...])
        heads = jnp.einsum("...hts,...hsk->...htk", attn, values)
        hidden = self.activation(project_rows(heads))
        out = jnp.einsum("...htk,hkd->...td", hidden, self.w_c[...])
        return project_rows(out)


class ScalarTransformer(nnx.Module):
    r"""L-layer Transformer with summed heads, row projections and a [CLS] readout.

    See the module docstring for the formula and parameter names. Inputs of shape (T, d) or
    (batch, T, d) (row 0 is the [CLS] token) are cast to the parameters' dtype. The output is
    $w^\top Y_{[CLS]}$, shape () or (batch,), or with ``num_classes=K`` the logits
    $Y_{[CLS]} W$, shape (K,) or (batch, K). Since $\|Y_{[CLS]}\|_2 \le 1$, the scalar output
    satisfies $|f(X)| \le \|w\|_2$.

    Args:
      embed_dim: d.
      num_layers: L >= 1.
      num_heads: H >= 1.
      hidden_dim: k (default d).
      num_classes: None for the scalar output, else K >= 2 logits.
      activation: ``"relu"`` (default), ``"tanh"``, ``"identity"``, ``"leaky_relu"`` or a
        callable with sigma(0) = 0.
      activation_lipschitz: $L_\sigma$; required for a callable, else the built-in value.
      param_dtype: parameter dtype (default float32).
      rngs: ``nnx.Rngs`` for the initialisation.

    Attributes:
      layers: ``nnx.List`` of :class:`AttentionLayer`.
      w: Param (d,) scalar readout or (d, K) class readout.
      activation_lipschitz: $L_\sigma$ (a float, not a parameter).

    Raises:
      ValueError: for non-positive sizes, num_classes < 2, an unknown activation, or a callable
        activation without ``activation_lipschitz``.

    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> model = ScalarTransformer(4, num_layers=2, num_heads=2, rngs=nnx.Rngs(0))
    >>> model(jnp.ones((3, 5, 4))).shape
    (3,)
    """

    def __init__(
        self,
        embed_dim: int,
        *,
        num_layers: int = 1,
        num_heads: int = 2,
        hidden_dim: int | None = None,
        num_classes: int | None = None,
        activation: str | Callable[[jax.Array], jax.Array] = "relu",
        activation_lipschitz: float | None = None,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        for name, value in (
            ("embed_dim", embed_dim),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
        ):
            check_positive_int(value, name)
        hidden_dim = embed_dim if hidden_dim is None else hidden_dim
        check_positive_int(hidden_dim, "hidden_dim")
        if num_classes is not None:
            check_positive_int(num_classes, "num_classes", 2)
        fn, lip = _resolve_activation(activation, activation_lipschitz)
        self.embed_dim = embed_dim
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.num_classes = num_classes
        self.activation_lipschitz = lip
        self.layers = nnx.List(
            [
                AttentionLayer(
                    embed_dim,
                    hidden_dim,
                    num_heads,
                    activation=fn,
                    param_dtype=param_dtype,
                    rngs=rngs,
                )
                for _ in range(num_layers)
            ]
        )
        shape = (embed_dim,) if num_classes is None else (embed_dim, num_classes)
        init = jax.nn.initializers.normal(embed_dim**-0.5)
        self.w = nnx.Param(init(rngs.params(), shape, param_dtype))

    def features(self, inputs: jax.Array) -> jax.Array:
        """The last block's output $g^{(L+1)}(X)$ for every row, (..., T, d)."""
        x = jnp.asarray(inputs, self.w.dtype)
        for layer in self.layers:
            x = layer(x)
        return x

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Scalar output (...,) or logits (..., K) read from the [CLS] row (row 0)."""
        x = jnp.asarray(inputs, self.w.dtype)
        if x.ndim < 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"inputs: expected shape (..., T, {self.embed_dim}), got {x.shape}")
        for layer in self.layers[:-1]:
            x = layer(x)
        cls = self.layers[-1](x, query_rows=slice(CLS_INDEX, CLS_INDEX + 1))[..., 0, :]
        if self.num_classes is None:
            return jnp.einsum("...d,d->...", cls, self.w[...])
        return jnp.einsum("...d,dk->...k", cls, self.w[...])

    @staticmethod
    def named_matrices(params: Mapping[str, Any]) -> dict[str, jax.Array]:
        """One 2-D matrix per head and layer from a pure parameter dict (see module docstring).

        Names: ``"layer{i}.head{h}.W_QK"`` (d, d), ``"layer{i}.head{h}.W_v"`` (d, k),
        ``"layer{i}.head{h}.W_c"`` (k, d), and ``"w"`` ((d,) or (d, K)).

        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from jaxbounds.models import as_pure
        >>> _, p = as_pure(ScalarTransformer(3, num_heads=2, rngs=nnx.Rngs(0)))
        >>> {k: v.shape for k, v in ScalarTransformer.named_matrices(p).items()}["layer0.head1.W_v"]
        (3, 3)
        """
        out: dict[str, jax.Array] = {}
        layers = params["layers"]
        for i in sorted(layers):
            layer = layers[i]
            for h in range(jnp.shape(layer["w_qk"])[0]):
                out[f"layer{i}.head{h}.W_QK"] = layer["w_qk"][h]
                out[f"layer{i}.head{h}.W_v"] = layer["w_v"][h]
                out[f"layer{i}.head{h}.W_c"] = layer["w_c"][h]
        out["w"] = params["w"]
        return out


@dataclasses.dataclass(frozen=True)
class AttentionHead:
    """The three matrices of one head: $W_{QK}$ (d, d), $W_v$ (d, k), $W_c$ (k, d)."""

    w_qk: jax.Array
    w_v: jax.Array
    w_c: jax.Array


@dataclasses.dataclass(frozen=True)
class ScalarQuantities:
    r"""What the bounds of Trauger & Tewari and Edelman et al. take, measured on one model.

    Built by :func:`scalar_quantities`; read by :func:`jaxbounds.bounds.from_model.scalar_bounds`.

    Attributes:
      heads: ``heads[i][h]`` is head ``h`` of layer ``i``.
      readout: the readout as a (d, K) matrix of columns (K = 1 for the scalar output).
      num_examples: m, the number of training sequences.
      seq_len: T, tokens per sequence (the [CLS] row included).
      embed_dim: d.
      hidden_dim: k.
      input_l2: $B_x = \max_{i,t} \|x_{i,t}\|_2$ over all tokens of the data.
      input_l1: $\max_{i,t} \|x_{i,t}\|_1$.
      activation_lipschitz: $L_\sigma$.
      loss_lipschitz: Lipschitz constant of the loss in the model output.
    """

    heads: tuple[tuple[AttentionHead, ...], ...]
    readout: jax.Array
    num_examples: int
    seq_len: int
    embed_dim: int
    hidden_dim: int
    input_l2: jax.Array
    input_l1: jax.Array
    activation_lipschitz: float
    loss_lipschitz: float = 1.0

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.heads)

    @property
    def num_heads(self) -> int:
        """H."""
        return len(self.heads[0])

    @property
    def num_classes(self) -> int:
        """K (1 for the scalar output)."""
        return int(self.readout.shape[1])


def scalar_quantities(
    params: Mapping[str, Any],
    inputs: jax.Array,
    *,
    activation_lipschitz: float,
    loss_lipschitz: float = 1.0,
) -> ScalarQuantities:
    r"""The :class:`ScalarQuantities` of a :class:`ScalarTransformer`'s pure params on ``inputs``.

    Args:
      params: the pure parameter dict (``as_pure(model)[1]``).
      inputs: (m, T, d) training sequences.
      activation_lipschitz: $L_\sigma$ (``model.activation_lipschitz``).
      loss_lipschitz: Lipschitz constant of the loss in the output (1 for the logistic loss).

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxbounds.models import as_pure
    >>> _, p = as_pure(ScalarTransformer(3, num_heads=2, rngs=nnx.Rngs(0)))
    >>> q = scalar_quantities(p, jnp.ones((5, 4, 3)), activation_lipschitz=1.0)
    >>> q.num_layers, q.num_heads, q.num_examples, q.seq_len, float(q.input_l1)
    (1, 2, 5, 4, 3.0)
    """
    inputs = jnp.asarray(inputs)
    m, seq_len, d = inputs.shape[-3:]
    rows = inputs.reshape(-1, d)
    layers = params["layers"]
    heads = tuple(
        tuple(
            AttentionHead(layers[i]["w_qk"][h], layers[i]["w_v"][h], layers[i]["w_c"][h])
            for h in range(int(jnp.shape(layers[i]["w_qk"])[0]))
        )
        for i in sorted(layers)
    )
    w = jnp.asarray(params["w"])
    return ScalarQuantities(
        heads=heads,
        readout=w[:, None] if w.ndim == 1 else w,
        num_examples=int(m),
        seq_len=int(seq_len),
        embed_dim=int(d),
        hidden_dim=int(heads[0][0].w_v.shape[-1]),
        input_l2=jnp.max(jnp.linalg.norm(rows, axis=1)),
        input_l1=jnp.max(jnp.sum(jnp.abs(rows), axis=1)),
        activation_lipschitz=float(activation_lipschitz),
        loss_lipschitz=float(loss_lipschitz),
    )
