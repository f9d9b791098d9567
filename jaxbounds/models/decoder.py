r"""A Llama-style decoder of today's shape, for benchmarks and tests of the kernels at scale.

Pre-norm decoder-only Transformer as in Llama 3 (Grattafiori et al. 2024):

$$x \leftarrow x + \mathrm{Attn}(\mathrm{RMSNorm}(x)),\qquad
  x \leftarrow x + W_\text{down}\big(\mathrm{silu}(W_\text{gate} n) \odot W_\text{up} n\big),
  \; n = \mathrm{RMSNorm}(x),$$

with grouped-query causal attention ($H$ query heads share $K$ key/value heads, query head
$h$ reads key/value head $\lfloor h / (H/K) \rfloor$), rotary position embeddings on queries
and keys (the "rotate half" layout: coordinate $i$ pairs with $i + d_h/2$, frequency
$\theta^{-2i/d_h}$), RMSNorm $x / \sqrt{\mathrm{mean}(x^2) + \epsilon} \odot w$, no biases,
and next-token logits from the final RMSNorm times the embedding (tied, as Llama 3.2 1B) or
a separate head (untied, as Llama 3.1 8B). Llama 3.1's long-context frequency scaling is left
out (it changes no shape or count).

The layers' weights are stacked on a leading axis of length ``num_layers`` and applied with
``jax.lax.scan`` (one layer compiled, whatever the depth); each layer is rematerialised
(``jax.checkpoint``), so the backward pass keeps one residual stream per layer.

Weights are stored in ``param_dtype`` (bfloat16 by default). ``dtype`` is the compute dtype:
``None`` computes in the dtype the parameters arrive in (a kernel handed float32 parameters
computes in float32), otherwise every weight is cast to ``dtype`` where it is used. Norms,
rotary angles, attention softmax and the logits are computed in float32 whatever the compute
dtype (float64 when computing in float64).

Parameters (keys of the pure dict from :func:`jaxbounds.models.as_pure`; $L$ layers,
$d$ ``dim``, $d_h$ ``head_dim``, $F$ ``hidden_dim``, $V$ ``vocab_size``):

=======================  ===================  ===========================================
key                      shape                role
=======================  ===================  ===========================================
``embed``                (V, d)               token embedding (also the head when tied)
``layers/attn_norm``     (L, d)               RMSNorm before attention
``layers/wq``            (L, d, H d_h)        queries
``layers/wk``            (L, d, K d_h)        keys
``layers/wv``            (L, d, K d_h)        values
``layers/wo``            (L, H d_h, d)        attention output
``layers/mlp_norm``      (L, d)               RMSNorm before the MLP
``layers/w_gate``        (L, d, F)            SwiGLU gate
``layers/w_up``          (L, d, F)            SwiGLU input
``layers/w_down``        (L, F, d)            SwiGLU output
``final_norm``           (d,)                 RMSNorm before the head
``lm_head``              (d, V)               head (untied configs only)
=======================  ===================  ===========================================

References:
  Grattafiori et al. 2024, The Llama 3 Herd of Models, arXiv:2407.21783;
  Ainslie et al. 2023 (grouped-query attention), arXiv:2305.13245;
  Su et al. 2021 (RoPE), arXiv:2104.09864; Shazeer 2020 (SwiGLU), arXiv:2002.05202;
  Zhang & Sennrich 2019 (RMSNorm), arXiv:1910.07467.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxbounds.models.pure import as_pure

__all__ = [
    "Decoder",
    "DecoderConfig",
    "abstract_decoder",
    "decoder_batch_sharding",
    "decoder_config",
    "decoder_num_params",
    "decoder_shardings",
    "next_token_loss",
]

#: Standard deviation of the normal initialisation of every weight matrix.
INIT_SCALE = 0.02


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Shape and dtypes of a :class:`Decoder`.

    Attributes:
      vocab_size: V, tokens.
      dim: d, width of the residual stream.
      num_layers: L.
      num_heads: H, query heads.
      num_kv_heads: K, key/value heads; must divide ``num_heads`` (K = H is multi-head).
      head_dim: d_h, width of a head (even: RoPE rotates pairs).
      hidden_dim: F, width of the SwiGLU MLP.
      tie_embeddings: the head is the embedding's transpose (no ``lm_head`` parameter).
      rope_theta: RoPE base.
      norm_eps: RMSNorm epsilon.
      param_dtype: dtype the weights are stored in (bfloat16 by default).
      dtype: compute dtype; ``None`` computes in the dtype the parameters arrive in.
      remat: rematerialise each layer in the backward pass (``jax.checkpoint``).
    """

    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_dim: int
    tie_embeddings: bool
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    param_dtype: Any = jnp.bfloat16
    dtype: Any = None
    remat: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "hidden_dim"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: must divide num_heads={self.num_heads}, got {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even (RoPE rotates pairs), got {self.head_dim}")


_CONFIGS = {
    # a few thousand parameters: the tests' model (runs in milliseconds on a CPU)
    "tiny": DecoderConfig(
        vocab_size=64,
        dim=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        hidden_dim=64,
        tie_embeddings=True,
    ),
    # GPT-2 small's size and widths (V=50304 = 50257 padded to a multiple of 64, d=768, 12
    # layers of 12 heads) in this architecture: SwiGLU of width 2048 has GPT-2's 2 x 768 x 3072
    # MLP weights; 123,587,328 parameters
    "124m": DecoderConfig(
        vocab_size=50304,
        dim=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=12,
        head_dim=64,
        hidden_dim=2048,
        tie_embeddings=True,
    ),
    # the shapes of Llama 3.2 1B: 1,235,814,400 parameters
    "1b": DecoderConfig(
        vocab_size=128256,
        dim=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        hidden_dim=8192,
        tie_embeddings=True,
    ),
    # the shapes of Llama 3.1 8B: 8,030,261,248 parameters
    "8b": DecoderConfig(
        vocab_size=128256,
        dim=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        hidden_dim=14336,
        tie_embeddings=False,
    ),
}


def decoder_config(name: str, **overrides: Any) -> DecoderConfig:
    """One of the named decoder configurations, with fields replaced.

    ``"tiny"`` (V=64, d=32, 2 layers, 4 heads over 2 key/value heads, tied; 20,640 parameters)
    is for tests; ``"124m"`` has GPT-2 small's size (V=50304, d=768, 12 layers of 12 heads,
    SwiGLU width 2048, tied; 123,587,328 parameters); ``"1b"`` has Llama 3.2 1B's shapes (tied,
    1,235,814,400 parameters) and ``"8b"`` Llama 3.1 8B's (untied, 8,030,261,248 parameters).

    Args:
      name: ``"tiny"``, ``"124m"``, ``"1b"`` or ``"8b"``.
      **overrides: :class:`DecoderConfig` fields to replace (e.g. ``dtype=jnp.float32``).

    Returns:
      The configuration.

    Raises:
      ValueError: for an unknown name.

    >>> decoder_num_params(decoder_config("1b"))
    1235814400
    """
    if name not in _CONFIGS:
        raise ValueError(f"name: expected one of {sorted(_CONFIGS)}, got {name!r}")
    return dataclasses.replace(_CONFIGS[name], **overrides)


def decoder_num_params(config: DecoderConfig) -> int:
    r"""Number of parameters of a decoder, from its configuration.

    $$V d\,(1 + [\text{untied}]) + d + L\,\big(2d + 2 d H d_h + 2 d K d_h + 3 d F\big).$$

    >>> decoder_num_params(decoder_config("8b"))
    8030261248
    """
    c = config
    per_layer = (
        2 * c.dim
        + 2 * c.dim * c.num_heads * c.head_dim
        + 2 * c.dim * c.num_kv_heads * c.head_dim
        + 3 * c.dim * c.hidden_dim
    )
    embed = c.vocab_size * c.dim * (1 if c.tie_embeddings else 2)
    return embed + c.dim + c.num_layers * per_layer


def _wide(dtype: Any) -> Any:
    """float32, or float64 for float64 inputs: the dtype of norms, angles and softmax."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    acc = _wide(x.dtype)
    xw = x.astype(acc)
    scale = jax.lax.rsqrt(jnp.mean(xw * xw, axis=-1, keepdims=True) + eps)
    w = weight.astype(acc).reshape((1,) * (x.ndim - 1) + weight.shape)
    return (xw * scale * w).astype(x.dtype)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of ``x`` (..., T, heads, d_h), position t = 0..T-1.

    Coordinate i < d_h/2 pairs with i + d_h/2 and the pair turns by the angle
    ``t * theta**(-2 i / d_h)``. Computed in float32 (float64 for float64 ``x``); returns
    ``x``'s dtype.
    """
    t, d = x.shape[-3], x.shape[-1]
    acc = _wide(x.dtype)
    inv_freq = theta ** (-jnp.arange(0, d // 2, dtype=acc) * (2.0 / d))
    angles = jnp.arange(t, dtype=acc)[:, None] * inv_freq[None, :]  # (T, d/2)
    lead = (1,) * (x.ndim - 3)
    cos = jnp.cos(angles).reshape(*lead, t, 1, d // 2)
    sin = jnp.sin(angles).reshape(*lead, t, 1, d // 2)
    xw = x.astype(acc)
    x1, x2 = xw[..., : d // 2], xw[..., d // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _layer(config: DecoderConfig, x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """One decoder layer on the residual stream ``x`` (B, T, d) in the compute dtype."""
    c = config
    cd = x.dtype
    w = {k: v.astype(cd) for k, v in p.items()}
    b, t, _ = x.shape
    groups = c.num_heads // c.num_kv_heads

    n = _rms_norm(x, w["attn_norm"], c.norm_eps)
    q = (n @ w["wq"]).reshape(b, t, c.num_heads, c.head_dim)
    k = (n @ w["wk"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    v = (n @ w["wv"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    q = rope(q, c.rope_theta).reshape(b, t, c.num_kv_heads, groups, c.head_dim)
    k = rope(k, c.rope_theta)
    acc = _wide(cd)
    scores = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=acc)
    scores = scores * (1.0 / math.sqrt(c.head_dim))
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))[None, None, None]
    scores = jnp.where(causal, scores, jnp.asarray(-1e30, acc))
    probs = jax.nn.softmax(scores, axis=-1).astype(cd)
    att = jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(b, t, c.num_heads * c.head_dim)
    x = x + att @ w["wo"]

    n = _rms_norm(x, w["mlp_norm"], c.norm_eps)
    return x + (jax.nn.silu(n @ w["w_gate"]) * (n @ w["w_up"])) @ w["w_down"]


_LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


class DecoderLayers(nnx.Module):
    """The decoder's layers, weights stacked on a leading layer axis and scanned."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = config
        dt = jnp.dtype(c.param_dtype)
        hq, hkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def normal(*shape):
            w = INIT_SCALE * jax.random.normal(rngs.params(), (c.num_layers, *shape), jnp.float32)
            return nnx.Param(w.astype(dt))

        self.attn_norm = nnx.Param(jnp.ones((c.num_layers, c.dim), dt))
        self.wq = normal(c.dim, hq)
        self.wk = normal(c.dim, hkv)
        self.wv = normal(c.dim, hkv)
        self.wo = normal(hq, c.dim)
        self.mlp_norm = nnx.Param(jnp.ones((c.num_layers, c.dim), dt))
        self.w_gate = normal(c.dim, c.hidden_dim)
        self.w_up = normal(c.dim, c.hidden_dim)
        self.w_down = normal(c.hidden_dim, c.dim)

    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        stacked = {k: getattr(self, k)[...] for k in _LAYER_KEYS}

        def body(x, p):
            return _layer(c, x, p)

        if c.remat:
            body = jax.checkpoint(body, prevent_cse=False)
        return jax.lax.scan(lambda x, p: (body(x, p), None), x, stacked)[0]


class Decoder(nnx.Module):
    """Llama-style decoder: int32 tokens (B, T) -> next-token logits (B, T, V).

    The logits are float32 (float64 when computing in float64), whatever the weights' dtype.

    See the module docstring for the architecture and the parameter names.

    Args:
      config: a :class:`DecoderConfig` (e.g. ``decoder_config("tiny")``).
      rngs: ``nnx.Rngs`` for the initialisation (normal, std 0.02; norms start at 1).

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> model = Decoder(decoder_config("tiny"), rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 5), jnp.int32)).shape
    (2, 5, 64)
    """

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config: expected a DecoderConfig, got {type(config).__name__}")
        c = config
        self.config = config
        dt = jnp.dtype(c.param_dtype)
        key = rngs.params()
        self.embed = nnx.Param(
            (INIT_SCALE * jax.random.normal(key, (c.vocab_size, c.dim), jnp.float32)).astype(dt)
        )
        self.layers = DecoderLayers(c, rngs=rngs)
        self.final_norm = nnx.Param(jnp.ones((c.dim,), dt))
        if not c.tie_embeddings:
            key = rngs.params()
            self.lm_head = nnx.Param(
                (INIT_SCALE * jax.random.normal(key, (c.dim, c.vocab_size), jnp.float32)).astype(dt)
            )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits (B, T, V) of the next token after each of ``tokens`` (B, T) int32."""
        c = self.config
        embed = self.embed[...]
        cd = jnp.dtype(c.dtype) if c.dtype is not None else embed.dtype
        x = jnp.take(embed, tokens, axis=0).astype(cd)
        x = self.layers(x)
        x = _rms_norm(x, self.final_norm[...].astype(cd), c.norm_eps)
        head = embed.T if c.tie_embeddings else self.lm_head[...]
        return jnp.matmul(x, head.astype(cd), preferred_element_type=_wide(cd))


def next_token_loss(apply_fn: Callable[[Any, Any], jax.Array]) -> Callable[[Any, Any], jax.Array]:
    r"""The next-token cross-entropy ``loss_fn(params, tokens)`` of a decoder.

    For int32 ``tokens`` (B, T+1), the mean over B x T positions of
    $-\log \mathrm{softmax}(f(\text{tokens}_{:, :T}))_{b, t, \text{tokens}_{b, t+1}}$, in
    float32 (float64 when the logits are). The loss is a pure function of ``(params, batch)``,
    the form every loss kernel takes.

    Args:
      apply_fn: ``(params, tokens (B, T)) -> logits (B, T, V)``, e.g. from
        ``as_pure(Decoder(...))``.

    Returns:
      ``loss_fn(params, tokens) -> scalar``.
    """

    def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
        logits = apply_fn(params, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
        return -jnp.mean(picked)

    return loss_fn


def abstract_decoder(config: DecoderConfig) -> tuple[Callable[[Any, Any], jax.Array], Any]:
    """``as_pure`` of a decoder without allocating it.

    Returns ``(apply_fn, params)`` with ``jax.ShapeDtypeStruct`` leaves in
    ``config.param_dtype``, for compiling programs of models too large to create
    (``jax.jit(f).lower(params, ...)``); place the leaves with :func:`decoder_shardings`.
    """
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    apply_fn, params = as_pure(model)
    params = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    return apply_fn, params


def decoder_shardings(params: Any, mesh: Mesh, *, axis: str = "fsdp") -> Any:
    """FSDP placement of a decoder's parameters: one ``NamedSharding`` per leaf.

    Every weight matrix is split over ``axis`` on its largest axis whose size the axis's
    device count divides (the first such axis on a tie), never the stacked layer axis (the
    scan takes one layer at a time); vectors (norm weights) and matrices with no divisible
    axis are replicated. Other mesh axes (``"data"``) replicate the parameters.

    Args:
      params: the decoder's parameter pytree (arrays or ``jax.ShapeDtypeStruct``).
      mesh: a mesh with an axis named ``axis``.
      axis: the FSDP axis name.

    Returns:
      A pytree of ``NamedSharding`` shaped like ``params``.

    Raises:
      ValueError: if ``mesh`` has no axis named ``axis``.
    """
    if axis not in mesh.shape:
        raise ValueError(f"mesh: expected an axis named {axis!r}, got axes {tuple(mesh.shape)}")
    ways = mesh.shape[axis]

    def place(path, leaf) -> NamedSharding:
        shape = tuple(leaf.shape)
        first = 1 if getattr(path[0], "key", None) == "layers" else 0
        if len(shape) - first < 2:
            return NamedSharding(mesh, P())
        fits = [i for i in range(first, len(shape)) if shape[i] % ways == 0]
        if not fits:
            return NamedSharding(mesh, P())
        best = max(fits, key=lambda i: (shape[i], -i))
        parts = [None] * len(shape)
        parts[best] = axis
        return NamedSharding(mesh, P(*parts))

    return jax.tree_util.tree_map_with_path(place, params)


def decoder_batch_sharding(mesh: Mesh) -> NamedSharding:
    """The token batch's placement: its leading (batch) axis over ``"data"`` and ``"fsdp"``.

    FSDP shards the batch over the same devices as the parameters, so on an ``("fsdp",)``
    mesh the batch is split 1/k per device; on ``("data", "fsdp")`` over both axes.

    Raises:
      ValueError: if ``mesh`` has neither a ``"data"`` nor an ``"fsdp"`` axis.
    """
    axes = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    if not axes:
        raise ValueError(f"mesh: expected a 'data' or 'fsdp' axis, got {tuple(mesh.shape)}")
    return NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0]))
