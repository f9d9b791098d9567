r"""Fast Walsh-Hadamard transform, Fourier-Walsh spectra of Boolean functions, degree and sparsity.

Conventions (used everywhere in jaxbounds):

- **Index order.** A point $x \in \{0,1\}^n$ is stored at integer index $\sum_i x_i 2^i$
  (little-endian: bit ``i`` of the index is coordinate ``i``). A subset $S \subseteq [n]$ is
  stored the same way, as the bitmask $\sum_{i \in S} 2^i$. So ``values[x]`` is $f(x)$ and
  ``coefficients[S]`` is $\hat f(S)$; :func:`cube_points` lists the points in that order.
- **Characters.** The $\pm 1$ characters $\chi^{\pm}_S(x) = (-1)^{\sum_{i \in S} x_i}$ (inputs
  are 0/1 bits, outputs $\pm 1$).
- **Normalisation.** $f = \sum_S \hat f(S)\,\chi^{\pm}_S$ with
  $\hat f(S) = 2^{-n}\sum_x f(x)\chi^{\pm}_S(x)$ (expectation under the uniform measure), so
  Parseval reads $\sum_S \hat f(S)^2 = 2^{-n}\sum_x f(x)^2$.

:func:`fwht` is the unnormalised transform $y = H x$ with
$H_{ij} = (-1)^{\mathrm{popcount}(i \wedge j)}$ (Sylvester order);
$H^2 = 2^n I$, so ``fwht(fwht(x)) == 2**n * x``.

The even-parity indicator of SPEC.md section 5, $\chi_A(x) = (1 + (-1)^{\sum_{i\in A} x_i})/2$
(values 0/1), has spectrum $1/2$ at $\emptyset$ and $1/2$ at $A$ in this convention, so
$f = \sum_t c_t \chi_{S_t}$ has $\hat f(S_t) = c_t/2$ and $\hat f(\emptyset) = \sum_t c_t / 2$
(when no $S_t$ is empty).

Inputs: integer (and boolean) arrays are exact in :func:`fwht`, computed in a signed type
(int32; int64 for 64-bit or uint32 inputs when x64 is on) after a check that no sum can
overflow it; they are read as the default float dtype elsewhere. float16/bfloat16 arrays and
empty arrays are refused with a ``ValueError`` naming the argument. :func:`spectrum_degree` and
:func:`spectrum_sparsity` check that the coefficients are finite (eagerly and under ``jit``): a
NaN coefficient would otherwise silently count as zero; their default threshold is relative to
the spectrum's norm (an absolute one missed every coefficient of the AND of 12 bits in float32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_finite, check_positive_int, check_that

__all__ = [
    "cube_points",
    "fwht",
    "spectrum_degree",
    "spectrum_sparsity",
    "subset_sizes",
    "walsh_spectrum",
]


def _num_bits(length: int, name: str) -> int:
    if length < 1 or length & (length - 1):
        raise ValueError(f"{name}: last axis must have length 2^n (n >= 0), got {length}")
    return length.bit_length() - 1


def _cube_array(x: jax.Array, name: str, *, to_float: bool) -> tuple[jax.Array, int]:
    """Validate an array ``(..., 2^n)``: not a scalar, not empty, not half precision.

    Returns the array (integers in the default float dtype when ``to_float``) and n.
    """
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError(f"{name}: expected an array with a last axis of length 2^n, got a scalar")
    n = _num_bits(x.shape[-1], name)
    if x.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {x.shape}")
    if x.dtype in (jnp.float16, jnp.bfloat16):
        raise ValueError(
            f"{name}: float16/bfloat16 round the 2^n-term sums too early; use float32 or float64"
        )
    if to_float and not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x, n


def _signed_type(dtype: np.dtype) -> np.dtype:
    """The signed integer type an integer transform is computed in (see the module docstring)."""
    wide = jax.config.jax_enable_x64 and (dtype.itemsize == 8 or dtype == np.uint32)
    return np.dtype(np.int64 if wide else np.int32)


def fwht(x: jax.Array) -> jax.Array:
    r"""Fast Walsh-Hadamard transform along the last axis (unnormalised, Sylvester order).

    $$y_S = \sum_{x=0}^{2^n-1} (-1)^{\mathrm{popcount}(S \wedge x)}\, v_x,$$

    computed exactly (up to floating-point rounding) in $O(n 2^n)$ by $n$ butterfly stages.
    $H^2 = 2^n I$, so applying it twice multiplies by $2^n$. Pure ``jnp``: works under ``jit``,
    ``vmap`` and ``grad``. Integer (and boolean) inputs give exact signed integers: the
    transform runs in int32 (int64 for int64/uint64/uint32 inputs with x64 on), and every entry
    must satisfy $|v_x| \le \lfloor \mathrm{max} / 2^n \rfloor$ of that type, so that no partial
    sum overflows (checked eagerly and under ``jit``; unsigned inputs such as uint8 used to
    wrap: ``[0, 1]`` gave ``[1, 255]``).

    Args:
      x: array of shape ``(..., 2^n)``; any leading batch shape.

    Returns:
      Array of the same shape; floating inputs keep their dtype, integer inputs give the
      signed type above.

    Raises:
      ValueError: if the last axis length is not a power of two, ``x`` is a scalar, empty, or
        float16/bfloat16, or integer entries are too large for an exact transform.

    References:
      Fino & Algazi 1976, "Unified matrix treatment of the fast Walsh-Hadamard transform",
      doi:10.1109/TC.1976.1674569.

    >>> import jax.numpy as jnp
    >>> fwht(jnp.array([1, 0, 0, 0]))
    Array([1, 1, 1, 1], dtype=int32)
    >>> fwht(jnp.array([1.0, 2.0, 3.0, 4.0]))
    Array([10., -2., -4.,  0.], dtype=float32)
    >>> fwht(jnp.array([0, 1], jnp.uint8))
    Array([ 1, -1], dtype=int32)
    """
    x, n = _cube_array(x, "x", to_float=False)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        out = _signed_type(np.dtype(x.dtype))
        limit = int(np.iinfo(out).max) >> n
        if np.dtype(x.dtype) == np.bool_:
            x = x.astype(out)
        else:
            # compare in the input's own type (no wrap): |x| <= limit
            hi = min(limit, int(np.iinfo(x.dtype).max))
            ok = x <= jnp.asarray(hi, x.dtype)
            if jnp.issubdtype(x.dtype, jnp.signedinteger):
                ok = jnp.logical_and(ok, x >= jnp.asarray(max(-limit, np.iinfo(x.dtype).min),
                                                          x.dtype))  # fmt: skip
            check_that(
                ok,
                f"x: an exact transform of 2**{n} integers in {out} needs every |entry| <= {limit} "
                f"(int max / 2**{n}); pass floats or a wider integer type (x64)",
            )
            x = x.astype(out)
    batch = x.shape[:-1]
    for k in range(n):
        # Pair indices that differ in bit k: shape (..., high, 2, low) with low = 2^k.
        y = x.reshape((*batch, 2 ** (n - k - 1), 2, 2**k))
        a, b = y[..., 0, :], y[..., 1, :]
        x = jnp.stack([a + b, a - b], axis=-2).reshape((*batch, 2**n))
    return x


def walsh_spectrum(values: jax.Array) -> jax.Array:
    r"""Fourier-Walsh coefficients of a function given on all $2^n$ points of $\{0,1\}^n$.

    $$\hat f(S) = 2^{-n} \sum_{x \in \{0,1\}^n} f(x)\,(-1)^{\sum_{i \in S} x_i},$$

    exact (the inverse is ``fwht(coefficients)``). ``values[..., x]`` is $f$ at the point with
    index $x = \sum_i x_i 2^i$; ``coefficients[..., S]`` belongs to the bitmask $S$ (see the module
    docstring for the convention).

    Args:
      values: array ``(..., 2^n)``; integer inputs are converted to the default float dtype.

    Returns:
      Coefficients, shape as ``values``, floating dtype.

    Raises:
      ValueError: if the last axis length is not a power of two, ``values`` is a scalar,
        empty, or float16/bfloat16.

    >>> import jax.numpy as jnp
    >>> walsh_spectrum(jnp.array([1.0, 0.0, 0.0, 1.0]))  # chi_{0,1} (0/1 even parity of 2 bits)
    Array([0.5, 0. , 0. , 0.5], dtype=float32)
    """
    values, n = _cube_array(values, "values", to_float=True)
    return fwht(values) / 2**n


def cube_points(num_bits: int, dtype: jnp.dtype = jnp.int32) -> jax.Array:
    r"""All points of $\{0,1\}^n$ as rows, in index order ($x_i$ = bit ``i`` of the row index).

    Args:
      num_bits: n >= 0. Static.
      dtype: integer (or float) dtype of the bits.

    Returns:
      Array of shape ``(2^n, n)``.

    Raises:
      ValueError: if ``num_bits`` is not an int in [0, 32].

    >>> cube_points(2)
    Array([[0, 0],
           [1, 0],
           [0, 1],
           [1, 1]], dtype=int32)
    """
    n = _check_num_bits(num_bits)
    idx = jnp.arange(2**n, dtype=jnp.uint32)
    bits = (idx[:, None] >> jnp.arange(n, dtype=jnp.uint32)[None, :]) & jnp.uint32(1)
    return bits.astype(dtype)


def _check_num_bits(num_bits: int) -> int:
    n = check_positive_int(num_bits, "num_bits", minimum=0)
    if n > 32:
        raise ValueError(f"num_bits: expected at most 32 (points are uint32 indices), got {n}")
    return n


def subset_sizes(num_bits: int) -> jax.Array:
    r"""$|S|$ = popcount of each bitmask $S \in \{0, \dots, 2^n - 1\}$, shape ``(2^n,)`` int32.

    Memory $4 \cdot 2^n$ bytes (a population count of the indices; building the points first
    took $8 n 2^n$: 14 GB at n = 26).

    Raises:
      ValueError: if ``num_bits`` is not an int in [0, 32].

    >>> subset_sizes(3)
    Array([0, 1, 1, 2, 1, 2, 2, 3], dtype=int32)
    """
    n = _check_num_bits(num_bits)
    return jax.lax.population_count(jnp.arange(2**n, dtype=jnp.uint32)).astype(jnp.int32)


def _tolerance(coefficients: jax.Array, n: int, tol: float | None) -> jax.Array | float:
    r"""``tol`` (absolute), or by default $4\max(n, 1)\,\epsilon\,\|\hat f\|_2$ per function.

    The rounding error of :func:`walsh_spectrum` is at most $n\,(\epsilon/2)$ times the mean
    $|f(x)|$, itself at most $\|f\|_2 = \|\hat f\|_2$ (Parseval), so the default sits 8x above
    the rounding of any coefficient that is zero in exact arithmetic.
    """
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 <= tol < np.inf:
            raise ValueError(f"tol: expected a finite number >= 0, got {tol!r}")
        return tol
    eps = float(np.finfo(np.dtype(coefficients.dtype)).eps)
    rms = _row_norm(coefficients)
    return 4 * max(n, 1) * eps * rms


def _row_norm(c: jax.Array) -> jax.Array:
    """Euclidean norm along the last axis (kept), scaled by the largest entry (no overflow)."""
    m = jnp.max(jnp.abs(c), axis=-1, keepdims=True)
    safe = jnp.where(m > 0, m, jnp.ones_like(m))
    return jnp.sqrt(jnp.sum(jnp.square(c / safe), axis=-1, keepdims=True)) * m


def _spectrum_and_tolerance(coefficients: jax.Array, tol: float | None):
    """Coefficients as a finite floating array, the number of bits n, and the threshold."""
    coefficients, n = _cube_array(coefficients, "coefficients", to_float=True)
    check_finite(coefficients, "coefficients")
    return coefficients, n, _tolerance(coefficients, n, tol)


def spectrum_degree(coefficients: jax.Array, *, tol: float | None = None) -> jax.Array:
    r"""Fourier degree $\max\{|S| : |\hat f(S)| > \mathrm{tol}\}$ of a spectrum.

    Exact for the given tolerance. Returns ``-1`` for the zero function (no coefficient above
    ``tol``), so a constant function has degree 0.

    Args:
      coefficients: array ``(..., 2^n)`` indexed by bitmask (as :func:`walsh_spectrum` returns).
      tol: absolute threshold; default $4 n \epsilon \|\hat f\|_2$ for each function (relative
        to its norm, above the rounding error of :func:`walsh_spectrum`; float32's absolute
        ``sqrt(eps)`` = 3.5e-4 missed every coefficient $\pm 2^{-12}$ of the AND of 12 bits).
        Static.

    Returns:
      int32 array of shape ``coefficients.shape[:-1]``.

    Raises:
      ValueError: if the length is not a power of two, ``coefficients`` is empty or
        float16/bfloat16, ``tol`` is not a finite number >= 0, or a coefficient is NaN/inf
        (eagerly and under ``jit``).

    >>> import jax.numpy as jnp
    >>> spectrum_degree(jnp.array([0.5, 0.0, 0.0, 0.5]))
    Array(2, dtype=int32)
    >>> and12 = jnp.zeros(2**12).at[-1].set(1.0)  # AND of 12 bits, float32
    >>> spectrum_degree(walsh_spectrum(and12)), spectrum_sparsity(walsh_spectrum(and12))
    (Array(12, dtype=int32), Array(4096, dtype=int32))
    """
    coefficients, n, tol = _spectrum_and_tolerance(coefficients, tol)
    sizes = subset_sizes(n).reshape((1,) * (coefficients.ndim - 1) + (-1,))
    return jnp.max(jnp.where(jnp.abs(coefficients) > tol, sizes, -1), axis=-1)


def spectrum_sparsity(coefficients: jax.Array, *, tol: float | None = None) -> jax.Array:
    r"""Fourier sparsity $\#\{S : |\hat f(S)| > \mathrm{tol}\}$ of a spectrum.

    Exact for the given tolerance. Note the 0/1 indicator $\chi_A$ has two nonzero $\pm1$
    coefficients ($\emptyset$ and $A$), see the module docstring.

    Args:
      coefficients: array ``(..., 2^n)`` indexed by bitmask.
      tol: absolute threshold; default $4 n \epsilon \|\hat f\|_2$ for each function (see
        :func:`spectrum_degree`). Static.

    Returns:
      int32 array of shape ``coefficients.shape[:-1]``.

    Raises:
      ValueError: if the length is not a power of two, ``coefficients`` is empty or
        float16/bfloat16, ``tol`` is not a finite number >= 0, or a coefficient is NaN/inf
        (eagerly and under ``jit``).

    >>> import jax.numpy as jnp
    >>> spectrum_sparsity(jnp.array([0.5, 0.0, 0.0, 0.5]))
    Array(2, dtype=int32)
    """
    coefficients, _, tol = _spectrum_and_tolerance(coefficients, tol)
    return jnp.sum(jnp.abs(coefficients) > tol, axis=-1, dtype=jnp.int32)
