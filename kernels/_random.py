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

import math
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


def _words(key: jax.Array, first_word: int, num_words: int) -> jax.Array:
    """Sign words ``first_word .. first_word + num_words - 1`` of a threefry key, by groups of 4."""
    first_group, skip = divmod(first_word, _GROUP)
    num_groups = max(1, -(-(skip + num_words) // _GROUP))
    groups = jnp.uint32(first_group) + jax.lax.iota(jnp.uint32, num_groups)
    return jax.vmap(lambda g: _group(key, g))(groups).reshape(-1)[skip : skip + num_words]


def sign_vector(key: jax.Array, size: int, dtype: Any) -> jax.Array:
    """The Rademacher vector ``[size]`` of ``key``, unpacked from ``ceil(size / 32)`` words.

    >>> v = sign_vector(jax.random.key(0), 1000, jnp.float32)
    >>> v.shape, bool(jnp.all(jnp.abs(v) == 1)), abs(float(v.mean())) < 0.15
    ((1000,), True, True)
    """
    num_words = -(-size // WORD_BITS)
    if wordwise(key):
        words = _words(key, 0, num_words)
    else:
        words = jax.random.bits(key, (num_words,), jnp.uint32)
    return unpack_signs(words, size, dtype)


def sign_block(key: jax.Array, start: int, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Entries ``start .. start + prod(shape) - 1`` of a threefry key's :func:`sign_vector`.

    Shaped ``shape`` (row-major), without the rest of the vector: the block's words are drawn
    by groups of 4 as :func:`sign_vector` draws them (on a mesh every device draws the block's
    words, 1/32 of its float32 bytes), and each entry takes its bit from them by its index, so
    the signs of a sharded parameter are made where its shards live; for threefry keys
    (:func:`wordwise`). The block is indexed from the word holding entry
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
    # the block's words, drawn once by groups of 4 (every device draws them all: 1/32 of the
    # block's float32 bytes), then each entry's bit taken where the entry lives
    words = _words(key, first_word, -(-(offset + size) // WORD_BITS))
    return _unpack_block(words, offset, shape, dtype)


def _unpack_block(words: jax.Array, offset: int, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Signs of entries ``offset ..`` of the words ``words``, shaped ``shape``: each by index."""
    size = math.prod(shape)
    local = (jnp.uint32(offset) + jax.lax.iota(jnp.uint32, max(1, size)))[:size].reshape(shape)
    bits = words[local // jnp.uint32(WORD_BITS)] >> (local % jnp.uint32(WORD_BITS))
    one = jnp.ones((), dtype)
    return jnp.where((bits & jnp.uint32(1)) == jnp.uint32(1), -one, one)


def sign_leaves(key: jax.Array, shapes: list[tuple[int, ...]], dtype: Any) -> list[jax.Array]:
    """:func:`sign_vector` of all the leaves' entries, cut into leaves of ``shapes``.

    Consecutive leaves are drawn in groups, each group's words in one hash
    (:func:`sign_vector`'s words from the group's first), and each leaf takes its entries' bits
    from its own words by index, as :func:`sign_block` does: on a mesh, where the leaf's shards
    live. A group holds at most :data:`GROUP_WORDS` words (or one leaf's, if more), so the words
    every device draws and holds until they are unpacked stay bounded on any mesh, while a
    program drawing many leaves has a few hashes instead of one per leaf (on a CPU, JAX lowers
    each hash as a loop): it compiles faster. For vectors of up to ``2**37`` entries, leaves of
    under ``2**32 - 31``.

    >>> key = jax.random.key(0)
    >>> a, b = sign_leaves(key, [(3,), (2, 40)], jnp.float32)
    >>> full = sign_vector(key, 83, jnp.float32)
    >>> bool(jnp.all(a == full[:3])), bool(jnp.all(b.ravel() == full[3:]))
    (True, True)
    """
    sizes = [math.prod(shape) for shape in shapes]
    if sum(sizes) > WORD_BITS * 2**32 or any(size >= 2**32 - 31 for size in sizes):
        raise ValueError(
            f"shapes: expected at most 2**37 entries in leaves of under 2**32 - 31, got {sizes}"
        )
    limit = max([GROUP_WORDS, *(-(-size // WORD_BITS) + 1 for size in sizes)])
    every = None
    if not wordwise(key):  # these keys' words are not drawn by index: one draw for all
        every = jax.random.bits(key, (max(1, -(-sum(sizes) // WORD_BITS)),), jnp.uint32)
    out: list[jax.Array] = []
    start = 0
    for group in _groups(sizes, limit):
        first_word = start // WORD_BITS
        end = start + sum(sizes[i] for i in group)
        num_words = max(1, -(-end // WORD_BITS) - first_word)
        if every is None:
            words = _words(key, first_word, num_words)
        else:
            words = every[first_word : first_word + num_words]
        for i in group:
            first, offset = divmod(start, WORD_BITS)
            count = -(-(offset + sizes[i]) // WORD_BITS)
            block = words[first - first_word : first - first_word + count]
            out.append(_unpack_block(block, offset, shapes[i], dtype))
            start += sizes[i]
    return out


GROUP_WORDS = 2**26
"""The words one hash of :func:`sign_leaves` draws at most (256 MiB), unless one leaf needs more.

Every device draws and holds a group's words whole until its leaves are unpacked, whatever
the leaves' sharding: the cap keeps that to a fixed size on any mesh (one group for models of
up to 2**31 parameters, so one hash), instead of 1/32 of every parameter.
"""


def _groups(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive leaves (their indices) in groups whose words fit ``limit`` words each."""
    groups: list[list[int]] = []
    start = group_word = 0
    for i, size in enumerate(sizes):
        end = start + size
        if not groups or -(-end // WORD_BITS) - group_word > limit:
            groups.append([])
            group_word = start // WORD_BITS
        groups[-1].append(i)
        start = end
    return groups


def leaf_keys(key: jax.Array, count: int) -> list[jax.Array]:
    """``[fold_in(key, 0), ..., fold_in(key, count - 1)]``: the keys of a vector's leaves.

    For a threefry key (:func:`wordwise`) one vectorised fold (the same keys: threefry is
    elementwise), so a program draws its leaves' keys in one hash loop, not one per leaf.
    """
    if not wordwise(key) or count == 1:
        return [jax.random.fold_in(key, i) for i in range(count)]
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(count, dtype=jnp.uint32))
    return [keys[i] for i in range(count)]


SLICED_DRAW_ENTRIES = 2**22
"""A Gaussian or uniform leaf of 3 or more axes and more entries than this is drawn in slices.

Slice ``j`` of its leading axis (a layer of a model whose layers are stacked for a scan) comes
from ``fold_in(key, j)`` (:func:`draw_leaf`). XLA's CPU plan of one threefry draw holds three
times the draw's size in uint32 words (the counters and the two halves of the hash: 3 GiB of
temporaries for a 1 GiB leaf), so drawn whole, a layer-stacked leaf costs three times its own
size; drawn in slices, three times a slice's (``average_sharpness`` of the 1B reference decoder
on one device: 24.7 -> 18.6 GiB; at 8B, FSDP over 8 devices: 19.95 -> 14.50 GiB per device).
"""


def draw_leaf(key: jax.Array, shape: tuple[int, ...], dtype: Any, kind: str) -> jax.Array:
    """One leaf's standard draw of ``kind`` from its own key (:func:`leaf_keys`).

    ``kind``: ``"rademacher"`` (the leaf's :func:`sign_vector`, reshaped), ``"gaussian"``
    (standard normals) or ``"uniform"`` (uniform on ``[-1, 1)``). Each leaf is one draw of its
    own shape, so on a mesh it is computed where the leaf's shards live (partitionable threefry)
    and no vector of every parameter exists. The curvature kernels' Gaussian / rbg probes and
    the sharpness kernels' perturbations are drawn so. A Gaussian or uniform leaf of 3 or more
    axes and more than :data:`SLICED_DRAW_ENTRIES` entries (a layer-stacked weight) is drawn
    slice by slice along its leading axis, slice ``j`` from ``fold_in(key, j)``: the same
    distribution, with the temporaries of one slice's draw instead of the whole leaf's.

    >>> key = jax.random.key(0)
    >>> a = draw_leaf(leaf_keys(key, 2)[1], (2, 3), jnp.float32, "gaussian")
    >>> bool(jnp.all(a == jax.random.normal(jax.random.fold_in(key, 1), (2, 3))))
    True
    """
    if kind == "rademacher":
        return sign_vector(key, int(np.prod(shape)), dtype).reshape(shape)
    if kind not in ("gaussian", "uniform"):
        raise ValueError(f"kind: expected 'rademacher', 'gaussian' or 'uniform', got {kind!r}")
    shape = tuple(int(d) for d in shape)
    if len(shape) >= 3 and int(np.prod(shape)) > SLICED_DRAW_ENTRIES:
        slices = jnp.arange(shape[0], dtype=jnp.uint32)
        return jax.lax.map(
            lambda j: _draw(jax.random.fold_in(key, j), shape[1:], dtype, kind), slices
        )
    return _draw(key, shape, dtype, kind)


def _draw(key: jax.Array, shape: tuple[int, ...], dtype: Any, kind: str) -> jax.Array:
    if kind == "gaussian":
        return jax.random.normal(key, shape, dtype)
    return jax.random.uniform(key, shape, dtype, -1.0, 1.0)
