r"""The sparse-majority data set of Trauger & Tewari (2024), section 6.

A sample is a bit string $S \in \{0, 1\}^T$ (i.i.d. fair bits) and its label is the majority
of the bits on a fixed subset $I \subset \{0, \dots, T-1\}$, $|I| = s$:

$$y = \mathbb{1}\Big\{\sum_{t \in I} S_t > s / 2\Big\}$$

(a tie, possible for even $s$, is labelled 0). The input fed to the Transformer is a
$(T + 1) \times d$ matrix $X$ whose row 0 is the [CLS] token and whose row $1 + t$ encodes bit
$t$:

$$X_0 = e_2 + p(0), \qquad X_{1+t} = e_{S_t} + p(1 + t),$$

with $e_0, e_1, e_2$ the first three standard basis vectors of $\mathbb{R}^d$ (so the
embeddings of 0, 1 and [CLS] are orthonormal) and $p$ the sinusoidal positional encoding of
Vaswani et al. (2017): $p(j)_{2i} = \sin(j / 10000^{2i/d})$,
$p(j)_{2i+1} = \cos(j / 10000^{2i/d})$. For even d, $\|p(j)\|_2^2 = d/2$, so
$\|X_j\|_2^2 = 1 + d/2 + 2\langle e, p(j)\rangle$ with $e$ the row's token embedding (a bound
$B_x$ should use the exact row norms of the data).

References:
  Trauger & Tewari 2024, arXiv:2310.13088, section 6; Vaswani et al. 2017, arXiv:1706.03762.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_positive_int

__all__ = ["positional_encoding", "sparse_majority"]

CLS_TOKEN = 2


def positional_encoding(num_positions: int, embed_dim: int, *, dtype: Any = None) -> jax.Array:
    r"""Sinusoidal positional encodings $p(0), \dots, p(n-1)$, shape (n, d).

    $p(j)_{2i} = \sin(j / 10000^{2i/d})$, $p(j)_{2i+1} = \cos(j / 10000^{2i/d})$ (for odd d
    the last coordinate is a sine).

    >>> import jax.numpy as jnp
    >>> positional_encoding(2, 4)[0]
    Array([0., 1., 0., 1.], dtype=float32)
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    pos = np.arange(num_positions, dtype=np.float64)[:, None]
    dims = np.arange(embed_dim)
    freq = 10000.0 ** (-(2 * (dims // 2)) / embed_dim)
    angles = pos * freq[None, :]
    enc = np.where(dims[None, :] % 2 == 0, np.sin(angles), np.cos(angles))
    return jnp.asarray(enc, dtype=dtype)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _draw(
    key: jax.Array, subset: jax.Array, num_examples: int, seq_len: int, embed_dim: int, dtype: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Bits, labels and encoded inputs in one compiled call."""
    bits = jax.random.bernoulli(key, 0.5, (num_examples, seq_len)).astype(jnp.int32)
    votes = jnp.sum(bits[:, subset], axis=1)
    labels = (2 * votes > subset.shape[0]).astype(jnp.int32)
    tokens = jnp.concatenate([jnp.full((num_examples, 1), CLS_TOKEN, jnp.int32), bits], axis=1)
    onehot = jax.nn.one_hot(tokens, embed_dim, dtype=dtype)
    inputs = onehot + positional_encoding(seq_len + 1, embed_dim, dtype=dtype)[None]
    return inputs, labels, bits


def _check_subset(subset: Any, sparsity: int, seq_len: int) -> np.ndarray:
    """``subset`` sorted, as int64; raise unless it holds ``sparsity`` distinct ints < T."""
    subset_np = np.sort(np.asarray(subset).astype(np.int64).reshape(-1))
    if (
        subset_np.size != sparsity
        or np.unique(subset_np).size != sparsity
        or subset_np.min() < 0
        or subset_np.max() >= seq_len
    ):
        raise ValueError(
            f"subset: expected {sparsity} distinct ints in [0, {seq_len}), got {subset_np}"
        )
    return subset_np


def sparse_majority(
    key: jax.Array,
    *,
    num_examples: int,
    seq_len: int,
    sparsity: int,
    embed_dim: int,
    subset: Any = None,
    dtype: Any = None,
) -> dict[str, jax.Array]:
    r"""Draw a sparse-majority data set (encoding in the module docstring).

    To make a train and a test set with the same rule, pass the first set's ``"subset"`` to
    the second call.

    Args:
      key: PRNG key (subset, then bits).
      num_examples: n >= 1. Static.
      seq_len: T >= 1 bits per sample. Static.
      sparsity: s = |I|, 1 <= s <= T. Static.
      embed_dim: d >= 3 (three orthogonal token embeddings). Static.
      subset: optional fixed I (s distinct ints in [0, T)); drawn uniformly from ``key`` when
        None.
      dtype: float dtype of ``"inputs"`` (default: JAX's default float).

    Returns:
      dict with ``"inputs"`` (n, T + 1, d) float, ``"labels"`` (n,) int32 in {0, 1},
      ``"bits"`` (n, T) int32, ``"subset"`` (s,) int32 sorted bit indices (row ``1 + t`` of
      the inputs holds bit ``t``).

    Raises:
      ValueError: for sizes out of range or a subset of the wrong size / range / with repeats.

    >>> import jax
    >>> data = sparse_majority(jax.random.key(0), num_examples=4, seq_len=5, sparsity=3,
    ...                        embed_dim=8)
    >>> data["inputs"].shape, data["labels"].shape, data["subset"].shape
    ((4, 6, 8), (4,), (3,))
    """
    for name, value, lo in (
        ("num_examples", num_examples, 1),
        ("seq_len", seq_len, 1),
        ("sparsity", sparsity, 1),
        ("embed_dim", embed_dim, 3),
    ):
        check_positive_int(value, name, lo)
    if sparsity > seq_len:
        raise ValueError(f"sparsity: expected <= seq_len = {seq_len}, got {sparsity}")
    key_subset, key_bits = jax.random.split(key)
    if subset is None:
        # A uniform random s-subset: the s smallest of T i.i.d. uniform scores.
        scores = np.asarray(jax.random.uniform(key_subset, (seq_len,)))
        subset = np.argsort(scores, kind="stable")[:sparsity]
    subset_np = _check_subset(subset, sparsity, seq_len)
    dtype = jnp.result_type(float) if dtype is None else dtype
    subset_arr = jnp.asarray(subset_np, dtype=jnp.int32)
    inputs, labels, bits = _draw(key_bits, subset_arr, num_examples, seq_len, embed_dim, dtype)
    return {"inputs": inputs, "labels": labels, "bits": bits, "subset": subset_arr}
