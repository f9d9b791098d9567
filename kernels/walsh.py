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

Inputs: integer arrays are exact in :func:`fwht` and read as the default float dtype elsewhere;
float16/bfloat16 arrays and empty arrays are refused with a ``ValueError`` naming the argument.
:func:`spectrum_degree` and :func:`spectrum_sparsity` check that the coefficients are finite
(eagerly and under ``jit``): a NaN coefficient would otherwise silently count as zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_finite, check_positive_int

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


def fwht(x: jax.Array) -> jax.Array:
    r"""Fast Walsh-Hadamard transform along the last axis (unnormalised, Sylvester order).

    $$y_S = \sum_{x=0}^{2^n-1} (-1)^{\mathrm{popcount}(S \wedge x)}\, v_x,$$

    computed exactly (up to floating-point rounding) in $O(n 2^n)$ by $n$ butterfly stages.
    $H^2 = 2^n I$, so applying it twice multiplies by $2^n$. Pure ``jnp``: works under ``jit``,
    ``vmap`` and ``grad``; integer inputs stay integer.

    Args:
      x: array of shape ``(..., 2^n)``; any leading batch shape.

    Returns:
      Array of the same shape and dtype.

    Raises:
      ValueError: if the last axis length is not a power of two, ``x`` is a scalar, empty, or
        float16/bfloat16.

    References:
      Fino & Algazi 1976, "Unified matrix treatment of the fast Walsh-Hadamard transform",
      doi:10.1109/TC.1976.1674569.

    >>> import jax.numpy as jnp
    >>> fwht(jnp.array([1, 0, 0, 0]))
    Array([1, 1, 1, 1], dtype=int32)
    >>> fwht(jnp.array([1.0, 2.0, 3.0, 4.0]))
    Array([10., -2., -4.,  0.], dtype=float32)
    """
    x, n = _cube_array(x, "x", to_float=False)
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
      ValueError: if ``num_bits`` < 0.

    >>> cube_points(2)
    Array([[0, 0],
           [1, 0],
           [0, 1],
           [1, 1]], dtype=int32)
    """
    n = check_positive_int(num_bits, "num_bits", minimum=0)
    idx = np.arange(2**n, dtype=np.int64)
    bits = (idx[:, None] >> np.arange(n, dtype=np.int64)[None, :]) & 1
    return jnp.asarray(bits, dtype=dtype)


def subset_sizes(num_bits: int) -> jax.Array:
    r"""$|S|$ = popcount of each bitmask $S \in \{0, \dots, 2^n - 1\}$, shape ``(2^n,)`` int32.

    >>> subset_sizes(3)
    Array([0, 1, 1, 2, 1, 2, 2, 3], dtype=int32)
    """
    return jnp.sum(cube_points(num_bits, jnp.int32), axis=-1, dtype=jnp.int32)


def _tolerance(coefficients: jax.Array, tol: float | None) -> jax.Array | float:
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 <= tol < np.inf:
            raise ValueError(f"tol: expected a finite number >= 0, got {tol!r}")
        return tol
    return float(np.sqrt(np.finfo(np.dtype(coefficients.dtype)).eps))


def _spectrum_and_tolerance(coefficients: jax.Array, tol: float | None):
    """Coefficients as a finite floating array, the number of bits n, and the threshold."""
    coefficients, n = _cube_array(coefficients, "coefficients", to_float=True)
    check_finite(coefficients, "coefficients")
    return coefficients, n, _tolerance(coefficients, tol)


def spectrum_degree(coefficients: jax.Array, *, tol: float | None = None) -> jax.Array:
    r"""Fourier degree $\max\{|S| : |\hat f(S)| > \mathrm{tol}\}$ of a spectrum.

    Exact for the given tolerance. Returns ``-1`` for the zero function (no coefficient above
    ``tol``), so a constant function has degree 0.

    Args:
      coefficients: array ``(..., 2^n)`` indexed by bitmask (as :func:`walsh_spectrum` returns).
      tol: absolute threshold; default ``sqrt(eps)`` of the dtype. Static.

    Returns:
      int32 array of shape ``coefficients.shape[:-1]``.

    Raises:
      ValueError: if the length is not a power of two, ``coefficients`` is empty or
        float16/bfloat16, ``tol`` is not a finite number >= 0, or a coefficient is NaN/inf
        (eagerly and under ``jit``).

    >>> import jax.numpy as jnp
    >>> spectrum_degree(jnp.array([0.5, 0.0, 0.0, 0.5]))
    Array(2, dtype=int32)
    """
    coefficients, n, tol = _spectrum_and_tolerance(coefficients, tol)
    sizes = jnp.broadcast_to(subset_sizes(n), coefficients.shape)
    return jnp.max(jnp.where(jnp.abs(coefficients) > tol, sizes, -1), axis=-1)


def spectrum_sparsity(coefficients: jax.Array, *, tol: float | None = None) -> jax.Array:
    r"""Fourier sparsity $\#\{S : |\hat f(S)| > \mathrm{tol}\}$ of a spectrum.

    Exact for the given tolerance. Note the 0/1 indicator $\chi_A$ has two nonzero $\pm1$
    coefficients ($\emptyset$ and $A$), see the module docstring.

    Args:
      coefficients: array ``(..., 2^n)`` indexed by bitmask.
      tol: absolute threshold; default ``sqrt(eps)`` of the dtype. Static.

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
