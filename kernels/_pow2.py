"""Exact scaling by powers of two: factors, exponents, and a product that keeps subnormals.

The kernels bring magnitudes into [0.5, 1) by a power of two before squaring or summing them (no
overflow, no underflow, and exact: a product by a power of two rounds nothing), then scale the
result back. Re-exported by :mod:`kernels.norms`, where they were first defined.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["ldexp_exact", "pow2_exponent", "pow2_factors"]


def pow2_factors(m: jax.Array) -> tuple[jax.Array, jax.Array]:
    r"""``(2**-e, 2**e)`` with $2^{e-1} \le m < 2^e$: exact rescaling factors for magnitudes ~m.

    ``e`` is clipped so that both factors are finite normal numbers of ``m``'s dtype
    ($|e| \le 126$ in float32), and is 0 where ``m`` is 0 or not finite. Multiplying by a power
    of two is exact (barring under/overflow), so a sum of squares of ``x * 2**-e`` rounds
    exactly as that of ``x`` would in the normal range, but never overflows or underflows.

    >>> down, up = pow2_factors(jnp.float32(3e19))
    >>> float(up), float(down) * float(up)
    (3.6893488147419103e+19, 1.0)
    """
    m = jax.lax.stop_gradient(jnp.asarray(m))
    info = jnp.finfo(m.dtype)
    _, e = jnp.frexp(m)
    lim = int(info.maxexp) - 2
    e = jnp.where(jnp.logical_and(jnp.isfinite(m), m > 0), jnp.clip(e, -lim, lim), 0)
    one = jnp.ones((), m.dtype)
    return jnp.ldexp(one, -e), jnp.ldexp(one, e)


def pow2_exponent(m: jax.Array) -> jax.Array:
    r"""The int32 exponent $e$ with $2^{e-1} \le m < 2^e$ (0 where ``m`` is 0 or not finite).

    Unlike :func:`pow2_factors` it is not clipped: with :func:`ldexp_exact` it carries scales
    beyond the dtype's normal range (a float32 radius of 1e-37 over 100 examples).

    >>> int(pow2_exponent(jnp.float32(3.0))), int(pow2_exponent(jnp.float32(1e-37)))
    (2, -122)
    """
    m = jax.lax.stop_gradient(jnp.asarray(m))
    _, e = jnp.frexp(m)
    ok = jnp.logical_and(jnp.isfinite(m), m > 0)
    return jnp.where(ok, e, 0).astype(jnp.int32)


def ldexp_exact(x: jax.Array, e: jax.Array) -> jax.Array:
    r"""$x \cdot 2^e$ rounded once, subnormal results included, for finite ``x`` and int ``e``.

    ``jnp.ldexp`` and a product with a power of two lose a result below the smallest normal
    number wherever denormals are flushed to zero (XLA on a CPU): 1.5 * 2**-140 in float32 gives
    0. Here a normal result is two products by normal powers of two (exact), and a subnormal one
    is built from its integer significand (rounded half to even) by a bitcast, so the value is
    the correctly rounded $x 2^e$ in both ranges; beyond the largest finite number it is
    $\pm\infty$. Used to scale the Rademacher kernels' results back from their working units.

    Args:
      x: float32 or float64 array (finite; NaN and inf pass through).
      e: integer exponents, broadcast against ``x``.

    Returns:
      The scaled array, in ``x``'s dtype.

    >>> import numpy as np
    >>> y = ldexp_exact(jnp.float32(1.5), jnp.int32(-140))
    >>> float(np.asarray(y)) == 1.5 * 2.0**-140
    True
    """
    x = jnp.asarray(x)
    dtype = x.dtype
    info = jnp.finfo(dtype)
    e = jnp.asarray(e, jnp.int32)
    mant, ex = jnp.frexp(x)  # x = mant 2^ex, 1/2 <= |mant| < 1
    total = ex.astype(jnp.int32) + e
    lim = int(info.maxexp) - 2
    e1 = jnp.clip(e // 2, -lim, lim)
    e2 = jnp.clip(e - e1, -lim, lim)
    one = jnp.ones((), dtype)
    normal = x * jnp.ldexp(one, e1) * jnp.ldexp(one, e2)
    # subnormal: |x| 2^e = k 2^(minexp - nmant) with k = |mant| 2^(total - minexp + nmant) < 2^nmant
    nmant, minexp = int(info.nmant), int(info.minexp)
    shift = total - minexp + nmant  # <= nmant where the result is below the normal range
    scaled = jnp.abs(mant) * jnp.ldexp(one, jnp.clip(shift, -2, nmant))
    k = jnp.where(shift < -1, 0, jnp.round(scaled))
    itype = jnp.int32 if dtype == jnp.float32 else jnp.int64
    bits = k.astype(itype) | jnp.where(mant < 0, jnp.array(1, itype) << (info.bits - 1), 0)
    tiny = jax.lax.bitcast_convert_type(bits.astype(itype), dtype)
    sub = jnp.logical_and(total - 1 < minexp, jnp.isfinite(x))
    return jnp.where(jnp.logical_and(sub, x != 0), tiny, normal)
