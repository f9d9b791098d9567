r"""Double-word ("two-float") arithmetic: sums that keep twice the precision of their dtype.

A double-word number is a pair ``(hi, lo)`` of floats of one dtype with $x = hi + lo$ and
$|lo| \le \mathrm{ulp}(hi)/2$: about 48 significant bits in float32 and 106 in float64, with the
exponent range of the dtype. :mod:`kernels.parallel` accumulates Monte Carlo sums in it, so a
float32 mean over $2^{30}$ samples keeps its accuracy without float64 (JAX's x64 may be off).

The building blocks are error-free transformations: :func:`two_sum` (Knuth) gives $a + b$ and
its rounding error exactly, :func:`two_prod` (Dekker/Veltkamp, with a power-of-two rescaling so
that the splitting never overflows) $a b$ and its error. The double-word operations follow
Joldes, Muller & Popescu 2017 (relative errors below $3u^2$ for sums, $u = \epsilon/2$). They
need IEEE round-to-nearest arithmetic without reassociation, which XLA keeps on every backend
(it does not apply fast-math rewrites to floating point unless told to).

References:
  Knuth, TAOCP vol. 2 (TwoSum); Dekker 1971, doi:10.1007/BF01397083 (TwoProduct);
  Joldes, Muller, Popescu 2017, "Tight and rigorous error bounds for basic building blocks of
  double-word arithmetic", doi:10.1145/3121432.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DoubleWord = tuple[jax.Array, jax.Array]


def two_sum(a: jax.Array, b: jax.Array) -> DoubleWord:
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e == a + b`` exactly (no condition on a, b).

    >>> s, e = two_sum(jnp.float32(1.0), jnp.float32(1e-8))
    >>> float(s), float(e)
    (1.0, 9.99999993922529e-09)
    """
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a: jax.Array, b: jax.Array) -> DoubleWord:
    """``(s, e)`` with ``s + e == a + b`` exactly, provided ``|a| >= |b|`` (or ``a == 0``)."""
    s = a + b
    return s, b - (s - a)


def _split(a: jax.Array) -> DoubleWord:
    """Veltkamp's split ``a = hi + lo`` into two halves of the significand, exactly.

    Large ``|a|`` (where ``factor * a`` would overflow) is scaled down by a power of two first
    and the halves scaled back (both exact).
    """
    info = jnp.finfo(a.dtype)
    half = -(-(info.nmant + 1) // 2)  # 12 for float32, 27 for float64
    factor = jnp.asarray(2.0**half + 1, a.dtype)
    big = jnp.abs(a) > info.max / 2.0 ** (half + 2)
    down = jnp.where(big, jnp.asarray(2.0 ** -(half + 2), a.dtype), jnp.ones((), a.dtype))
    up = jnp.where(big, jnp.asarray(2.0 ** (half + 2), a.dtype), jnp.ones((), a.dtype))
    x = a * down
    t = factor * x
    hi = t - (t - x)
    return hi * up, (x - hi) * up


def two_prod(a: jax.Array, b: jax.Array) -> DoubleWord:
    """``(p, e)`` with ``p = fl(a b)`` and ``p + e == a b`` exactly (barring underflow).

    >>> p, e = two_prod(jnp.float32(1 + 2**-12), jnp.float32(1 + 2**-12))
    >>> float(p) + float(e) == (1 + 2**-12) ** 2
    True
    """
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def add(x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``x + y`` of two double-words (AccurateDWPlusDW, relative error below 3u^2)."""
    sh, sl = two_sum(x[0], y[0])
    th, tl = two_sum(x[1], y[1])
    vh, vl = fast_two_sum(sh, sl + th)
    return fast_two_sum(vh, tl + vl)


def add_float(x: DoubleWord, b: jax.Array) -> DoubleWord:
    """``x + b`` of a double-word and a float (DWPlusFP, relative error below 2u^2).

    >>> x = (jnp.float32(1.0), jnp.float32(0.0))
    >>> for _ in range(1000):
    ...     x = add_float(x, jnp.float32(1e-8))
    >>> round(float(x[0]) + float(x[1]) - 1.0, 12)  # a float32 sum stays at 1.0
    1e-05
    """
    sh, sl = two_sum(x[0], b)
    return fast_two_sum(sh, x[1] + sl)


def mul(x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``x * y`` of two double-words (DWTimesDW1, relative error below 7u^2)."""
    ch, cl1 = two_prod(x[0], y[0])
    cl2 = x[0] * y[1] + x[1] * y[0]
    return fast_two_sum(ch, cl1 + cl2)


def neg(x: DoubleWord) -> DoubleWord:
    """``-x`` (exact)."""
    return -x[0], -x[1]


def of(a: jax.Array) -> DoubleWord:
    """A float as a double-word ``(a, 0)``."""
    return a, jnp.zeros_like(a)


def const(value: int | float | Fraction, dtype: Any) -> DoubleWord:
    """A Python number (e.g. the exact ``Fraction(1, N)``) as the double-word nearest to it."""
    dtype = np.dtype(dtype)
    exact = Fraction(value)
    hi = dtype.type(float(exact))
    lo = dtype.type(float(exact - Fraction(float(hi)))) if math.isfinite(hi) else dtype.type(0)
    return jnp.asarray(hi, dtype), jnp.asarray(lo, dtype)


def value(x: DoubleWord) -> jax.Array:
    """The double-word rounded to its dtype."""
    return x[0] + x[1]
