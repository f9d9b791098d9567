"""Rademacher sign streams (sign vectors packed in words) and the family's argument checks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._backend import auto_chunk_size
from kernels._checks import (
    check_array_leaves,
    check_chunk_size,
    check_finite,
    check_key,
    check_positive_int,
    describe,
)
from kernels._jit import compile_once
from kernels._names import renamed_kwargs
from kernels._ordered import CheckChain
from kernels._random import sign_vector as _draw_signs
from kernels.parallel import (
    MAX_SAMPLES,
    _derive,
    _words,
    map_chunked,
)

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# the most entries sign_vectors materialises (8 GiB of float32): beyond, sign_chunk
_MAX_SIGN_ENTRIES = 2**31


# --------------------------------------------------------------------------- argument checks


def _check_float_dtype(dtype: Any, name: str) -> np.dtype:
    """Return ``dtype`` if it is float32 or float64; else raise naming ``name``."""
    dt = np.dtype(dtype)
    if dt not in _FLOAT_DTYPES:
        raise ValueError(
            f"{name}: expected float32 or float64 values, got {dt} (integer and half-precision "
            "values are not supported)"
        )
    return dt


def _check_float_array(
    x: Any, name: str, *, ndim: int | None = None, chain: CheckChain | None = None
) -> jax.Array:
    """``x`` as a finite, non-empty float32/float64 array of ``ndim`` dimensions.

    With ``chain`` the finiteness check joins it (see :mod:`kernels._ordered`).
    """
    x = jnp.asarray(x)
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {x.shape}")
    _check_float_dtype(x.dtype, name)
    if x.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {x.shape}")
    if chain is None:
        check_finite(x, name)
    else:
        chain.finite(x, name)
    return x


def _check_float_tree(
    tree: Any, name: str, *, allow_int: bool = False, chain: CheckChain | None = None
) -> None:
    """Floating leaves of ``tree`` are float32/float64 and finite; integer ones only if allowed."""
    check_array_leaves(tree, name)
    leaves = jax.tree_util.tree_leaves(tree)
    if not any(np.size(leaf) for leaf in leaves):
        raise ValueError(f"{name}: expected at least one non-empty array leaf")
    for leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not (allow_int and jnp.issubdtype(dtype, jnp.integer)):
            _check_float_dtype(dtype, name)
    if chain is None:
        check_finite(tree, name)
    else:
        chain.finite(tree, name)


def _check_signs(signs: Any, num_examples: int) -> jax.Array:
    """``signs`` as an array whose last axis has length n; else a ValueError naming it."""
    signs = jnp.asarray(signs)
    if signs.ndim == 0 or signs.shape[-1] != num_examples:
        raise ValueError(
            f"signs: expected sign vectors [..., {num_examples}] (one sign per example), got "
            f"shape {signs.shape}"
        )
    return signs


def _check_chunk(chunk_size: Any) -> Any:
    """``None``, an int >= 1, or ``"auto"`` (left for :func:`_auto_chunk` to resolve)."""
    return check_chunk_size(chunk_size, auto="auto")


def _auto_chunk(chunk_size: Any, cpu: int, kind: str, size: Any, dtype: Any = np.float32) -> Any:
    """A checked ``chunk_size`` with ``"auto"`` resolved.

    ``cpu`` (the kernel's default) on a CPU, :func:`kernels._backend.default_chunk_size` on an
    accelerator.
    """
    if chunk_size != "auto":
        return chunk_size
    return auto_chunk_size(cpu, kind, size=size, dtype=dtype)


def _check_delta(delta: Any) -> float | None:
    if delta is None:
        return None
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ValueError(f"delta: expected a Python float in (0, 1) or None, got {describe(delta)}")
    return float(delta)


# --------------------------------------------------------------------------- sign vectors


def _mul_words(a: jax.Array, b: int) -> tuple[jax.Array, jax.Array]:
    """The 64-bit product of a uint32 array ``a`` and a Python int ``b < 2**32`` as (hi, lo) words.

    Schoolbook on 16-bit halves, every partial product and carry in uint32 (no int64 needed).
    """
    a = jnp.asarray(a, jnp.uint32)
    half = jnp.uint32(0xFFFF)
    a1, a0 = a >> jnp.uint32(16), a & half
    b1, b0 = jnp.uint32(b >> 16), jnp.uint32(b & 0xFFFF)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = p01 + p10
    mid_carry = (mid < p01).astype(jnp.uint32)
    lo = p00 + (mid << jnp.uint32(16))
    lo_carry = (lo < p00).astype(jnp.uint32)
    hi = p11 + (mid >> jnp.uint32(16)) + (mid_carry << jnp.uint32(16)) + lo_carry
    return hi, lo


@compile_once
def _sign_rows(
    key: jax.Array, start: jax.Array, *, num_rows: int, num_examples: int, dtype: Any
) -> jax.Array:
    """Sign vectors of draws ``start ... start + num_rows - 1`` (``start``: uint32 words [2])."""
    check_key(key)
    check_positive_int(num_rows, "num_rows")
    check_positive_int(num_examples, "num_examples")
    dtype = _check_float_dtype(dtype, "dtype")
    lo = start[1] + jnp.arange(num_rows, dtype=jnp.uint32)
    hi = start[0] + (lo < start[1]).astype(jnp.uint32)

    def row(words: tuple[jax.Array, jax.Array]) -> jax.Array:
        return _draw_signs(_derive(key, *words), num_examples, dtype)

    # vectorised for threefry keys, one row at a time for keys whose draws change under vmap
    return map_chunked(row, (hi, lo), chunk_size=num_rows, key=key)


def sign_chunk(
    key: jax.Array,
    chunk_index: Any,
    *,
    chunk_size: int,
    num_examples: int,
    dtype: Any = jnp.float32,
) -> jax.Array:
    r"""Rows ``chunk_index * chunk_size ... + chunk_size - 1`` of :func:`sign_vectors`, alone.

    Regenerates one chunk of draws from the key and the chunk index without drawing the others
    (draw $k$ has key :func:`kernels.parallel.sample_key` ``(key, k)``, i.e. ``fold_in(key, k)``
    for $k < 2^{32}$). ``chunk_index`` may be traced (read as uint32; the draw index
    ``chunk_index * chunk_size`` is formed in 64 bits, so it does not wrap).

    Args:
      key: PRNG key.
      chunk_index: which chunk (int >= 0 or int array scalar).
      chunk_size: draws per chunk (int in ``[1, 2**31)``). Static.
      num_examples: n, the length of each sign vector. Static.
      dtype: float32 or float64, the dtype of the signs.

    Returns:
      ``[chunk_size, num_examples]`` array of +-1.

    Raises:
      ValueError: on a bad key, size, chunk index or dtype, or draws past ``2**53``.

    >>> import jax, jax.numpy as jnp
    >>> key = jax.random.key(0)
    >>> full = sign_vectors(key, num_samples=6, num_examples=5)
    >>> bool(jnp.all(sign_chunk(key, 1, chunk_size=3, num_examples=5) == full[3:]))
    True
    """
    size = check_positive_int(chunk_size, "chunk_size")
    if size >= 2**31:
        raise ValueError(f"chunk_size: expected an int < 2**31, got {size}")
    if isinstance(chunk_index, int | np.integer) and not isinstance(chunk_index, bool):
        chunk_index = check_positive_int(chunk_index, "chunk_index", minimum=0)
        if (chunk_index + 1) * size > MAX_SAMPLES:
            raise ValueError(
                f"chunk_index: draws up to {(chunk_index + 1) * size} exceed 2**53, the most a "
                "Monte Carlo kernel draws"
            )
        start = jnp.asarray(_words(chunk_index * size), jnp.uint32)
    else:
        index = jnp.asarray(chunk_index)
        if not jnp.issubdtype(index.dtype, jnp.integer) or index.shape != ():
            raise ValueError(
                f"chunk_index: expected an int or an integer scalar, got {describe(index)}"
            )
        start = jnp.stack(_mul_words(index.astype(jnp.uint32), size))
    return _sign_rows(key, start, num_rows=size, num_examples=num_examples, dtype=dtype)


@renamed_kwargs(num_draws="num_samples")
def sign_vectors(
    key: jax.Array, *, num_samples: int, num_examples: int, dtype: Any = jnp.float32
) -> jax.Array:
    r"""``num_samples`` i.i.d. uniform sign vectors in $\{\pm1\}^n$, a ``[num_samples, n]`` array.

    Row $k$ depends only on ``(key, k)``, so any chunk of rows can be regenerated alone with
    :func:`sign_chunk`. The kernels never materialise all draws; this is for tests and small
    problems (memory ``num_samples * num_examples * itemsize``, at most ``2**31`` entries).

    Args:
      key: PRNG key.
      num_samples: number of sign vectors (``num_draws`` is its deprecated name). Static.
      num_examples: n. Static.
      dtype: float32 or float64, the dtype of the signs.

    Raises:
      ValueError: on a bad key, size or dtype, or more than ``2**31`` entries in all
        (``num_samples * num_examples``; draw larger streams in chunks with :func:`sign_chunk`).

    >>> import jax
    >>> s = sign_vectors(jax.random.key(1), num_samples=2, num_examples=3)
    >>> s.shape, s.dtype, bool(((s == 1) | (s == -1)).all())
    ((2, 3), dtype('float32'), True)
    """
    num = check_positive_int(num_samples, "num_samples")
    n = check_positive_int(num_examples, "num_examples")
    if num * n > _MAX_SIGN_ENTRIES:
        raise ValueError(
            f"num_samples: {num} sign vectors of {n} examples are {num * n} entries, more than "
            "the 2**31 one array of sign_vectors holds (draw them in chunks with sign_chunk)"
        )
    start = np.zeros(2, np.uint32)
    return _sign_rows(key, start, num_rows=num, num_examples=num_examples, dtype=dtype)
