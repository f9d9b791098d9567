r"""Random sign vectors from packed bits, shared by the Rademacher and curvature kernels.

A vector of $n$ signs is unpacked from $\lceil n/32\rceil$ random 32-bit words: entry $i$ gets
bit $i \bmod 32$ of word $w = \lfloor i/32\rfloor$, bit 1 meaning $-1$. For a threefry key (JAX's
default) the words come in groups of 4: word $w$ is entry $w \bmod 4$ of
``jax.random.bits(jax.random.fold_in(key, w // 4), (4,), uint32)``, so any range of entries
(:func:`sign_block`: the block of one parameter leaf, where its shards live) is computed from
public ``jax.random`` calls alone, without the rest of the vector, under either setting of
``jax_threefry_partitionable`` (a group of 4 costs about what the same words cost drawn at
once; one fold per word measured 1.2x slower). Keys whose draws change under ``vmap`` ("rbg",
"unsafe_rbg") draw their words in one ``jax.random.bits(key, (W,))`` call instead. Each sign
costs a shift, a mask and a bitcast instead of the 32 random bits ``jax.random.rademacher``
draws per entry: at $1.2 \times 10^8$ entries (a GPT-2-small-sized model) 0.27 s instead of
2.5 s on a 2-core CPU, where a Hessian-vector product takes ~12 s.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

WORD_BITS = 32
_GROUP = 4  # sign words per folded key
# key implementations whose draws are unchanged under vmap (words are derived word by word)
_WORDWISE = ("threefry2x32",)


def unpack_signs(words: jax.Array, size: int, dtype: Any) -> jax.Array:
    """Words ``[..., W]`` (uint32) -> signs ``[..., size]``: bit i%32 of word i//32 (1 -> -1).

    >>> import numpy as np
    >>> np.asarray(unpack_signs(jnp.array([0b101], jnp.uint32), 4, jnp.float32))
    array([-1.,  1., -1.,  1.], dtype=float32)
    """
    dtype = jnp.dtype(dtype)
    lead = words.shape[:-1]
    shifts = jnp.arange(WORD_BITS, dtype=jnp.uint32).reshape((1,) * words.ndim + (WORD_BITS,))
    if dtype == jnp.float32:
        # move bit k to the IEEE sign bit and OR in the bits of 1.0: a shift, a mask, a bitcast.
        top = (words[..., None] << (jnp.uint32(WORD_BITS - 1) - shifts)) & jnp.uint32(0x80000000)
        out = jax.lax.bitcast_convert_type(top | jnp.uint32(0x3F800000), jnp.float32)
    else:
        bit = (words[..., None] >> shifts) & jnp.uint32(1)
        one = jnp.ones((), dtype)
        out = jnp.where(bit == jnp.uint32(1), -one, one)
    return out.reshape(*lead, -1)[..., :size]


def wordwise(key: jax.Array) -> bool:
    """Whether ``key``'s sign words are derived word by word (threefry keys, typed or raw).

    >>> wordwise(jax.random.key(0)), wordwise(jax.random.key(0, impl="rbg"))
    (True, False)
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key)) in _WORDWISE
    return True  # a raw uint32 key is a threefry key


def _group(key: jax.Array, group: jax.Array) -> jax.Array:
    """Sign words ``4 group ... 4 group + 3`` of a threefry key: ``[4]`` uint32."""
    return jax.random.bits(jax.random.fold_in(key, group), (_GROUP,), jnp.uint32)


# the Threefry-2x32 hash's rotations and key-schedule constant (Salmon et al. 2011), the one
# jax.random's threefry keys use
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotl(x: jax.Array, d: int) -> jax.Array:
    return (x << jnp.uint32(d)) | (x >> jnp.uint32(WORD_BITS - d))


def _threefry(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple:
    """The Threefry-2x32 hash (20 rounds) of counts ``(x1, x2)`` under key words ``(k1, k2)``.

    The hash of ``jax.random``'s threefry keys, written out in elementwise ``jnp`` operations:
    XLA fuses it into the kernel that uses it, where JAX's own lowering on a CPU emits a loop
    per call (a sharded probe drew two loops per parameter leaf inside each sample's loop, which
    more than doubled the compile time of ``hessian_trace`` on a decoder). Same bits.
    """
    ks = (k1, k2, k1 ^ k2 ^ jnp.uint32(_PARITY))
    x = [x1 + ks[0], x2 + ks[1]]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x[0] = x[0] + x[1]
            x[1] = x[0] ^ _rotl(x[1], r)
        x = [x[0] + ks[(i + 1) % 3], x[1] + ks[(i + 2) % 3] + jnp.uint32(i + 1)]
    return x[0], x[1]


def _key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two uint32 words of a threefry key (typed or raw)."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return data[0], data[1]


def _words_at(key: jax.Array, index: jax.Array) -> jax.Array:
    """Sign words at the uint32 indices ``index`` (any shape), elementwise: shape kept.

    Word ``w`` is entry ``w % 4`` of ``jax.random.bits(jax.random.fold_in(key, w // 4), (4,),
    uint32)`` (:func:`_group`), computed by :func:`_threefry` entry by entry: ``fold_in`` is the
    hash of the counts ``(0, g)``; ``bits`` under ``jax_threefry_partitionable`` the xor of the
    two words of the hash of ``(0, slot)``, otherwise word ``slot // 2`` of the hash of
    ``(slot % 2, slot % 2 + 2)``.
    """
    k1, k2 = _key_words(key)
    g1, g2 = _threefry(k1, k2, jnp.zeros_like(index), index // jnp.uint32(_GROUP))
    slot = index % jnp.uint32(_GROUP)
    if jax.config.jax_threefry_partitionable:
        a, b = _threefry(g1, g2, jnp.zeros_like(slot), slot)
        return a ^ b
    pair = slot % jnp.uint32(2)
    a, b = _threefry(g1, g2, pair, pair + jnp.uint32(2))
    return jnp.where(slot < jnp.uint32(2), a, b)


def sign_vector(key: jax.Array, size: int, dtype: Any) -> jax.Array:
    """The Rademacher vector ``[size]`` of ``key``, unpacked from ``ceil(size / 32)`` words.

    >>> v = sign_vector(jax.random.key(0), 1000, jnp.float32)
    >>> v.shape, bool(jnp.all(jnp.abs(v) == 1)), abs(float(v.mean())) < 0.15
    ((1000,), True, True)
    """
    num_words = -(-size // WORD_BITS)
    if wordwise(key):
        groups = jnp.arange(-(-num_words // _GROUP), dtype=jnp.uint32)
        words = jax.vmap(lambda g: _group(key, g))(groups).reshape(-1)[:num_words]
    else:
        words = jax.random.bits(key, (num_words,), jnp.uint32)
    return unpack_signs(words, size, dtype)


def sign_block(key: jax.Array, start: int, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Entries ``start .. start + prod(shape) - 1`` of a threefry key's :func:`sign_vector`.

    Shaped ``shape`` (row-major), computed entry by entry from the word indices, so the block of
    a sharded parameter is drawn where its shards live, without the whole vector. Each entry
    hashes its own word again (two Threefry hashes an entry, :func:`_words_at`: 51 times the
    hashing of :func:`sign_vector`, in elementwise code that XLA fuses with the block's use);
    for threefry keys (:func:`wordwise`). The block is indexed from the word holding entry
    ``start``, so ``start`` may lie past ``2**32`` (vectors of up to ``2**37`` entries, whose
    word indices fit 32 bits) and one block holds up to ``2**32 - 32`` entries.

    Raises:
      ValueError: for a key that is not :func:`wordwise`, a negative ``start``, a block of
        ``2**32 - 31`` entries or more, or one past ``2**37`` entries.

    >>> key = jax.random.key(1)
    >>> full = sign_vector(key, 100, jnp.float32)
    >>> bool(jnp.all(sign_block(key, 37, (3, 7), jnp.float32).ravel() == full[37:58]))
    True
    """
    size = int(np.prod(shape))
    if not wordwise(key):
        raise ValueError(f"key: sign blocks need a threefry key, got {jax.random.key_impl(key)}")
    first_word, offset = divmod(int(start), WORD_BITS)
    if start < 0 or offset + size > 2**32 or start + size > WORD_BITS * 2**32:
        raise ValueError(
            f"start: expected a block of under 2**32 - 31 entries within [0, 2**37), got "
            f"{start} + {size}"
        )
    local = (jnp.uint32(offset) + jax.lax.iota(jnp.uint32, max(1, size)))[:size].reshape(shape)
    word = jnp.uint32(first_word) + local // jnp.uint32(WORD_BITS)
    bits = _words_at(key, word) >> (local % jnp.uint32(WORD_BITS))
    one = jnp.ones((), dtype)
    return jnp.where((bits & jnp.uint32(1)) == jnp.uint32(1), -one, one)


def leaf_keys(key: jax.Array, count: int) -> list[jax.Array]:
    """``[fold_in(key, 0), ..., fold_in(key, count - 1)]``: the keys of a vector's leaves.

    For a threefry key (:func:`wordwise`) the hash of the counts ``(0, i)`` written out
    (:func:`_threefry`: the same keys), so a program derives its leaves' keys without a hash
    loop per leaf.
    """
    if not wordwise(key) or count == 1:
        return [jax.random.fold_in(key, i) for i in range(count)]
    # fold_in of a threefry key is the hash of the count (0, i) (:func:`_threefry`)
    k1, k2 = _key_words(key)
    index = jnp.arange(count, dtype=jnp.uint32)
    a, b = _threefry(k1, k2, jnp.zeros_like(index), index)
    data = jnp.stack([a, b], axis=-1)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        keys = jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))
    else:
        keys = data
    return [keys[i] for i in range(count)]


def draw_leaf(key: jax.Array, shape: tuple[int, ...], dtype: Any, kind: str) -> jax.Array:
    """One leaf's standard draw of ``kind`` from its own key (:func:`leaf_keys`).

    ``kind``: ``"rademacher"`` (the leaf's :func:`sign_vector`, reshaped), ``"gaussian"``
    (standard normals) or ``"uniform"`` (uniform on ``[-1, 1)``). Each leaf is one draw of its
    own shape, so on a mesh it is computed where the leaf's shards live (partitionable threefry)
    and no vector of every parameter exists. The curvature kernels' Gaussian / rbg probes and
    the sharpness kernels' perturbations are drawn so. Float32 Gaussian and uniform draws of a
    threefry key under ``jax_threefry_partitionable`` are computed with the hash written out
    (:func:`_float_draw`: ``jax.random``'s numbers, without a loop per leaf in the program).

    >>> key = jax.random.key(0)
    >>> a = draw_leaf(leaf_keys(key, 2)[1], (2, 3), jnp.float32, "gaussian")
    >>> bool(jnp.all(a == jax.random.normal(jax.random.fold_in(key, 1), (2, 3))))
    True
    """
    if kind == "rademacher":
        return sign_vector(key, int(np.prod(shape)), dtype).reshape(shape)
    if kind not in ("gaussian", "uniform"):
        raise ValueError(f"kind: expected 'rademacher', 'gaussian' or 'uniform', got {kind!r}")
    if _elementwise(key, shape, dtype):
        return _float_draw(key, shape, kind)
    if kind == "gaussian":
        return jax.random.normal(key, shape, dtype)
    return jax.random.uniform(key, shape, dtype, -1.0, 1.0)


def _elementwise(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether :func:`_float_draw` gives ``jax.random``'s float32 draw of ``key`` and ``shape``.

    A threefry key under ``jax_threefry_partitionable`` (entry ``i``'s bits hash the count
    ``(0, i)``), float32, and fewer than ``2**32`` entries.
    """
    return (
        wordwise(key)
        and bool(jax.config.jax_threefry_partitionable)
        and np.dtype(dtype) == np.float32
        and 0 < int(np.prod(shape)) < 2**32
    )


def _float_draw(key: jax.Array, shape: tuple[int, ...], kind: str) -> jax.Array:
    """``jax.random.normal`` or ``jax.random.uniform(..., -1, 1)`` of ``key`` (float32).

    The hash is written out (:func:`_threefry`): the same numbers, fused into the kernel that
    uses them instead of one loop per call. The count of each entry is built from one iota per
    axis, so a sharded leaf's draw is computed where its shards live.
    """
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    k1, k2 = _key_words(key)
    a, b = _threefry(k1, k2, jnp.zeros_like(index), index)
    bits = a ^ b
    # jax.random's float32 uniform: 23 random mantissa bits under the exponent of 1.0
    unit = jax.lax.bitcast_convert_type(
        (bits >> jnp.uint32(WORD_BITS - 23)) | jnp.uint32(0x3F800000), jnp.float32
    ) - jnp.float32(1.0)
    if kind == "uniform":
        lo, hi = np.float32(-1.0), np.float32(1.0)
    else:  # jax.random.normal: sqrt(2) erfinv of a uniform draw on (-1, 1)
        lo, hi = np.nextafter(np.float32(-1.0), np.float32(0.0)), np.float32(1.0)
    u = jnp.maximum(lo, unit * (hi - lo) + lo)
    if kind == "uniform":
        return u
    return np.float32(np.sqrt(2)) * jax.lax.erf_inv(u)
