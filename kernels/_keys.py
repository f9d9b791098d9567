"""Keys of a Monte Carlo sample stream, derived through ``jax.random`` alone.

Sample $i$ of a stream drawn from ``key`` has the key :func:`sample_key` ``(key, i)``:
``jax.random.fold_in(key, i)`` below $2^{32}$, two public folds from a root key past it. A
kernel's draws therefore do not depend on its chunk size, device count, block or process, and
any PRNG implementation JAX offers (threefry2x32, rbg, unsafe_rbg) gives one stream per key.
:func:`reserved_key` gives keys apart from every sample's (a search's restarts). Re-exported by
:mod:`kernels.parallel`, where the samplers that use them live.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_key, check_positive_int, describe

__all__ = ["MAX_SAMPLES", "check_num_samples", "reserved_key", "sample_key", "vmap_safe_key"]

MAX_SAMPLES = 2**53
"""The most Monte Carlo samples a kernel runs (indices are two uint32 words; the count is exact
in float64)."""


_WORD = 2**32
_MASK = _WORD - 1
# implementations whose keys can be vmapped without changing their draws
_VMAP_SAFE = ("threefry2x32",)


def check_num_samples(value: Any, name: str = "num_samples", minimum: int = 1) -> int:
    """Return ``value`` as an int in ``[minimum, MAX_SAMPLES]``; else a ValueError naming it.

    >>> check_num_samples(2**40)
    1099511627776
    >>> check_num_samples(2**54, "num_samples")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: num_samples: at most 2**53 Monte Carlo samples ..., got 18014398509481984
    """
    num = check_positive_int(value, name, minimum)
    if num > MAX_SAMPLES:
        raise ValueError(
            f"{name}: at most 2**53 Monte Carlo samples (sample indices and counts are exact up "
            f"to there), got {num}"
        )
    return num


def _impl_name(key: jax.Array) -> str:
    """The PRNG implementation of a checked key ("threefry2x32" for a raw uint32 key)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key))
    return "threefry2x32"


def vmap_safe_key(key: jax.Array) -> bool:
    """Whether draws from ``key`` (and keys folded from it) are unchanged under ``jax.vmap``.

    True for threefry2x32 keys (typed or raw). False for "rbg" and "unsafe_rbg" (and any other
    implementation): ``vmap`` of their ``rng_bit_generator`` draws the whole batch from the
    batch's first key, so a kernel maps their samples one at a time.

    >>> vmap_safe_key(jax.random.key(0)), vmap_safe_key(jax.random.key(0, impl="rbg"))
    (True, False)
    """
    return _impl_name(key) in _VMAP_SAFE


def _fold(key: jax.Array, data: jax.Array) -> jax.Array:
    """``jax.random.fold_in(key, data)`` for a uint32 scalar ``data`` (typed or raw ``key``)."""
    return jax.random.fold_in(key, data)


def _wide_root(key: jax.Array) -> jax.Array:
    """The root of the keys past ``2**32``: ``fold_in(fold_in(key, 2**32 - 1), 2**32 - 1)``."""
    top = jnp.asarray(np.uint32(_MASK))
    return _fold(_fold(key, top), top)


def _derive(key: jax.Array, hi: jax.Array, lo: jax.Array, wide: bool = True) -> jax.Array:
    """The key of the 64-bit index ``hi * 2**32 + lo`` (uint32 scalars), by ``jax.random`` alone.

    ``fold_in(key, lo)`` when ``hi == 0``; else ``fold_in(fold_in(root, hi), lo)`` with the root
    :func:`_wide_root` (see :func:`sample_key`). ``wide=False`` (static) says ``hi`` is 0: the
    two folds of the other branch are not computed.
    """
    hi = jnp.asarray(hi, jnp.uint32)
    lo = jnp.asarray(lo, jnp.uint32)
    low = _fold(key, lo)
    if not wide:
        return low
    high = _fold(_fold(_wide_root(key), hi), lo)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # a raw uint32 key
        return jnp.where(hi == 0, low, high)
    data = jnp.where(hi == 0, jax.random.key_data(low), jax.random.key_data(high))
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def _words(index: int) -> tuple[np.uint32, np.uint32]:
    return np.uint32(index // _WORD), np.uint32(index % _WORD)


def sample_key(key: jax.Array, index: Any) -> jax.Array:
    r"""The key of Monte Carlo sample ``index``, derived with ``jax.random.fold_in`` alone.

    For ``index < 2**32`` this is ``jax.random.fold_in(key, index)``. For a larger index
    $i = h\,2^{32} + l$ (``fold_in`` reads its datum as uint32, so one fold would repeat the
    draws of $i \bmod 2^{32}$) it is two folds, ``fold_in(fold_in(root, h), l)``, from the root
    ``fold_in(fold_in(key, 2**32 - 1), 2**32 - 1)``: a key that is no sample's key and no key
    a kernel folds from one (see the module docstring).

    Args:
      key: a PRNG key (typed, of any implementation, or a raw uint32 key).
      index: a Python int in ``[0, MAX_SAMPLES)`` or a traced integer scalar (read as uint32).

    Returns:
      A key of the same kind as ``key``.

    Raises:
      ValueError: on a bad key or index.

    >>> import jax
    >>> key = jax.random.key(0)
    >>> bool((jax.random.key_data(sample_key(key, 5))
    ...       == jax.random.key_data(jax.random.fold_in(key, 5))).all())
    True
    >>> k32 = jax.random.key_data(sample_key(key, 2**32 + 5))  # not fold_in(key, 5)
    >>> bool((k32 == jax.random.key_data(jax.random.fold_in(key, 5))).all())
    False
    """
    key = check_key(key)
    if isinstance(index, int | np.integer) and not isinstance(index, bool):
        index = check_num_samples(int(index) + 1, "index") - 1
        hi, lo = (jnp.asarray(w) for w in _words(index))
        if index < _WORD:
            return _fold(key, lo)
        return _fold(_fold(_wide_root(key), hi), lo)
    index = jnp.asarray(index)
    if not jnp.issubdtype(index.dtype, jnp.integer) or index.shape != ():
        raise ValueError(f"index: expected an int or an integer scalar, got {describe(index)}")
    return _fold(key, index.astype(jnp.uint32))


def reserved_key(key: jax.Array, slot: int = 0) -> jax.Array:
    """A key derived from ``key`` that no Monte Carlo sample gets, for a kernel's other draws.

    ``fold_in(fold_in(key, 2**32 - 1), 2**32 - 2 - slot)``: two folds, like the keys of samples
    past ``2**32``, whose high word never reaches ``2**32 - 1`` (:data:`MAX_SAMPLES`), and
    distinct from their root (a salt folded in once, ``fold_in(key, salt)``, would be sample
    ``salt``'s key).

    Args:
      key: a PRNG key.
      slot: which reserved key, an int in ``[0, 1024)``.

    Raises:
      ValueError: on a bad key or slot.

    >>> import jax
    >>> key = jax.random.key(0)
    >>> bool((jax.random.key_data(reserved_key(key)) == jax.random.key_data(sample_key(key, 0))
    ...       ).all())
    False
    """
    key = check_key(key)
    slot = check_positive_int(slot, "slot", minimum=0)
    if slot >= 1024:
        raise ValueError(f"slot: expected an int in [0, 1024), got {slot}")
    top = jnp.asarray(np.uint32(_MASK))
    return _fold(_fold(key, top), jnp.asarray(np.uint32(_MASK - 1 - slot)))
