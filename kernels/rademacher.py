r"""Empirical Rademacher complexity by Monte Carlo over sign vectors.

$$\mathrm{Rad}_S(\mathcal F) = \mathbb E_\sigma \sup_{f\in\mathcal F}
\frac1n\sum_{i=1}^n \sigma_i f(x_i), \qquad \sigma \sim \mathrm{Unif}\{\pm1\}^n,$$

with $n$ = ``num_examples``, the size of the sample $S$. Every estimator here averages a *sup
object* ``sup(signs[..., n]) -> values[...]`` (one value
$\sup_f \frac1n\langle\sigma, f(S)\rangle$ per sign vector), a registered frozen dataclass whose
arrays are pytree leaves and whose configuration (callables, sizes) is static:

- :class:`LinearSup` (:func:`linear_sup`): exact sup of a norm-ball linear class (dual norm);
- :class:`FiniteSup` (:func:`finite_sup`): exact sup of a finite class whose outputs
  ``outputs_fn(indices, batch)`` are produced on demand;
- :class:`SearchSup` (:func:`search_sup`): a *lower bound* of the sup over a constrained
  parameter set (projected gradient ascent);
- :class:`ReadoutSearchSup` (:func:`readout_search_sup`): the same lower bound for a class
  ending in a norm-bounded linear readout $w^\top\phi_V(x)$, $\|w\|_q \le B$, whose sup over
  $w$ is closed-form ($\frac Bn\|\sum_i\sigma_i\phi_V(x_i)\|_{q^*}$): the ascent runs over
  the inner parameters $V$ only.

:func:`rademacher_linear`, :func:`rademacher_finite`, :func:`rademacher_search` and
:func:`rademacher_readout_search` average them over ``num_samples`` random sign vectors;
:func:`rademacher_exact` enumerates all $2^n$.

Sign vectors and determinism
----------------------------
Draw $k$ uses its own key :func:`kernels.parallel.sample_key` ``(key, k)`` (``fold_in(key, k)``
for $k < 2^{32}$; past $2^{32}$ the hash of the 64-bit counter, so draws never repeat) and is
unpacked from $\lceil n/32\rceil$ raw 32-bit words (``jax.random.bits``): example $i$ gets bit
$i \bmod 32$ of word $\lfloor i/32\rfloor$, bit 1 meaning $-1$ (a shift, a mask and a bitcast
per sign, several times cheaper than ``jax.random.rademacher``). The key of a draw is derived
from its index inside the program (:func:`kernels.parallel.sample_statistics`), so neither
``chunk_size`` nor the device count changes which sign vector draw $k$ is (results differ only
by floating-point reassociation), and any chunk can be regenerated alone (:func:`sign_chunk`).
Up to $2^{53}$ draws, with JAX's x64 on or off; the means are accumulated in double-word
arithmetic, so a float32 estimate keeps its accuracy at $2^{30}$ draws and beyond. Random
restarts of the searches draw from :func:`kernels.parallel.reserved_key`, a key no sign vector
gets. "rbg" / "unsafe_rbg" keys work with the same invariances, their draws one at a time.

Chunks and memory
-----------------
Draws are processed ``chunk_size`` at a time (vectorised), each chunk reduced at once to a running
(count, mean, M2), so memory is that of one chunk whatever ``num_samples`` is; ``chunk_size=None``
runs one draw at a time (least memory). Chunks are spread over ``jax.devices()``. Defaults and
the memory of one chunk ($c$ = ``chunk_size``, $n$ examples, $d$ features, $s$ = itemsize):

========================= ======= ==============================================================
kernel                    default memory of one chunk
========================= ======= ==============================================================
rademacher_linear         "auto"  $c\,n\,s$ signs + $c\,d\,s$ products (1 MiB at n = 1024,
                                  float32); "auto" is 256 on a CPU, on a GPU/TPU the largest
                                  power of two up to 4096 with $c(n + d)s \le$ 1 GiB
rademacher_finite         256     $c\,n\,s$ signs + $c\,m\,s$ scores + $m\,n\,s$ outputs
                                  ($m$ = ``member_chunk_size``)
rademacher_search         8       $c\,R$ copies of the parameters and of one forward/backward
                                  pass of ``apply_fn`` on all $n$ examples ($R$ =
                                  ``num_restarts``)
rademacher_readout_search 8       $c\,R$ copies of the inner parameters and of one
                                  forward/backward pass of ``features_fn`` on all $n$ examples
rademacher_exact          4096    $c\,n\,s$ signs + what the sup object needs for $c$ sign
                                  vectors
========================= ======= ==============================================================

Compile once
------------
The entry points are compiled once per (callables, static options, shapes and dtypes)
(:func:`kernels._jit.compile_once`): data (``inputs``, ``batch``, ``params``), keys and array-valued
radii are dynamic arguments, so a second call with new data of the same shapes compiles nothing.
Callables (``apply_fn``, ``project``, ``outputs_fn``) are keyed by identity: create them once
and pass data through ``inputs`` / ``batch``. A Python float option (``radius``, ``step_size``,
``output_bound``) is static; pass ``jnp.asarray(value)`` to vary it without recompiling.

Checks
------
Non-finite data or parameters, a non-positive ``radius`` / ``readout_radius`` / ``step_size`` /
``output_bound`` and a sup that is non-finite on some sign vector raise an error naming the
argument, eagerly (``ValueError``) and inside ``jax.jit`` (``JaxRuntimeError``); see
:mod:`kernels._checks` for the switch that turns these runtime checks off. Integer or
half-precision data, an int ``key`` and empty samples raise ``ValueError`` at once. The body of the
searches' ascent loop is traced with the runtime checks off (a host callback per step, such as the
finiteness check of :func:`kernels.norms.project_lp_ball`, costs more than a step of a small
network on CPU): the starts are checked, and a NaN iterate makes its sign vector's value NaN,
reported as a non-finite sup. The runtime checks of one call form an ordered chain
(:mod:`kernels._ordered`): when several arguments are bad, the first in argument order is the
one named, on every backend, and ``project`` never sees a value that an argument's check refused.

Precision
---------
On a GPU, JAX's default float32 matmul is TF32 (about 10 significand bits). The searches' values
certify lower bounds, so their own products (the sign-weighted sum of outputs, the closed-form
readout sup $\frac Bn\|\Phi^\top\sigma\|_{q^*}$) run at ``Precision.HIGHEST`` whatever the
default; ``apply_fn`` / ``features_fn`` run at the user's precision. :func:`rademacher_linear`
(an unbiased estimate, whose TF32 rounding is zero-mean to first order) follows JAX's default
unless ``precision="highest"``, or ``"bf16x2"`` (two bfloat16 matmuls, 16 significand bits).

Confidence intervals
--------------------
Flipping one sign changes $\sup_f \frac1n\langle\sigma, f\rangle$ by at most $2b/n$ when
$|f(x_i)| \le b$; McDiarmid's inequality over the $nK$ independent signs of $K$ draws gives the
$(1-\delta)$ interval $\bar Y \pm 2b\sqrt{\ln(2/\delta)/(2nK)}$ for $\mathrm{Rad}_S$ around the
$K$-draw average $\bar Y$ of exact sups (:func:`mcdiarmid_halfwidth`).

References:
  Bartlett & Mendelson 2002, JMLR 3:463-482 (Rademacher complexity);
  McDiarmid 1989, "On the method of bounded differences";
  Chan, Golub, LeVeque 1979 (pairwise variance update);
  Joldes, Muller, Popescu 2017, doi:10.1145/3121432 (double-word sums).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._backend import auto_chunk_size, is_accelerator, tree_size
from kernels._checks import (
    check_array_leaves,
    check_chunk_size,
    check_finite,
    check_key,
    check_positive_int,
    check_that,
    describe,
    runtime_checks,
    runtime_checks_enabled,
)
from kernels._jit import compile_once
from kernels._names import renamed_kwargs
from kernels._ordered import CheckChain
from kernels._random import sign_vector as _draw_signs
from kernels.estimate import Estimate
from kernels.norms import dual_exponent, ldexp_exact, pow2_exponent, pow2_factors, vector_norm
from kernels.parallel import (
    MAX_SAMPLES,
    SampleStats,
    _derive,
    _words,
    check_num_samples,
    map_chunked,
    reserved_key,
    sample_statistics,
)

__all__ = [
    "FiniteSup",
    "LinearSup",
    "ReadoutSearchSup",
    "SearchSup",
    "finite_sup",
    "linear_sup",
    "mcdiarmid_halfwidth",
    "rademacher_exact",
    "rademacher_finite",
    "rademacher_linear",
    "rademacher_readout_search",
    "rademacher_search",
    "readout_search_sup",
    "search_sup",
    "sign_chunk",
    "sign_vectors",
]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# the random restarts of the searches draw from reserved_key(key, _RESTART_SLOT), a key that no
# sign vector gets (the signs of draw k use sample_key(key, k)); until 2026-11 they used
# fold_in(key, 0x5EA4C4), the key of sign draw 6,202,564
_RESTART_SLOT = 0
_MAX_EXACT_EXAMPLES = 20
_MAX_MEMBERS = int(np.iinfo(np.int32).max)  # member indices are int32
_PRECISIONS = (None, "highest", "bf16x2")
# rademacher_linear's default chunk: 256 draws on a CPU (measured best there); on an accelerator
# the largest power of two up to 4096 whose signs and products fit _ACCEL_CHUNK_BYTES
_CPU_CHUNK = 256
_ACCEL_CHUNK = 4096
_ACCEL_CHUNK_BYTES = 1 << 30
_HIGHEST = jax.lax.Precision.HIGHEST


def _restart_key(key: jax.Array) -> jax.Array:
    """The key of the searches' random restarts (no sign vector's key)."""
    return reserved_key(key, _RESTART_SLOT)


# runtime checks inside the ascent's loop body (host callbacks every step); off by default,
# see _ascend. bench/rademacher.py turns it on to measure what they cost.
_CHECKS_IN_ASCENT = False


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
    problems (memory ``num_samples * num_examples * itemsize``).

    Args:
      key: PRNG key.
      num_samples: number of sign vectors (``num_draws`` is its deprecated name). Static.
      num_examples: n. Static.
      dtype: float32 or float64, the dtype of the signs.

    Raises:
      ValueError: on a bad key, size or dtype.

    >>> import jax
    >>> s = sign_vectors(jax.random.key(1), num_samples=2, num_examples=3)
    >>> s.shape, s.dtype, bool(((s == 1) | (s == -1)).all())
    ((2, 3), dtype('float32'), True)
    """
    num = check_positive_int(num_samples, "num_samples")
    start = np.zeros(2, np.uint32)
    return _sign_rows(key, start, num_rows=num, num_examples=num_examples, dtype=dtype)


# --------------------------------------------------------------------------- linear classes


def _check_exponent(value: Any, prefix: str) -> float:
    """``value`` as a float in [1, inf]; else a ValueError starting with ``prefix``."""
    try:
        exponent = float(value)
    except (TypeError, ValueError):
        exponent = math.nan
    if isinstance(value, bool) or math.isnan(exponent) or exponent < 1:
        raise ValueError(f"{prefix}expected an exponent in [1, inf], got {describe(value)}")
    return exponent


def _parse_norm(norm: Any, readout: Any) -> tuple[float, float | None]:
    """Return (p, q): p the (across-column) exponent, q the within-column one or None."""
    if isinstance(norm, tuple | list):
        if len(norm) != 2:
            raise ValueError(f"norm: expected p or a pair (q, p), got {norm!r}")
        if readout is None:
            raise ValueError("readout: a matrix class norm=(q, p) needs a readout vector u")
        q, p = (_check_exponent(v, f"norm: the pair (q, p) = {tuple(norm)!r}: ") for v in norm)
        return p, q
    _check_exponent(norm, "norm: ")
    if readout is not None:
        raise ValueError("readout: only used with a matrix class norm=(q, p)")
    return float(norm), None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LinearSup:
    r"""Exact sup of a norm-ball linear class (see :func:`linear_sup`), ``signs[..., n] -> [...]``.

    $\sup = s\,\|\sum_i \sigma_i x_i\|_{p^*}$ with $s = B\|u\|_{q^*}/n$ ($B/n$ for the vector
    class).

    The product is formed from ``inputs * down``, a power of two $2^{-e}$ that brings the largest
    entry into [0.5, 1) (exact); $B$ and $\|u\|_{q^*}$ are split the same way into a significand
    and a power of two. The values are computed in *working units* ($2^{-E}$ times the sup,
    :meth:`unit`, of order $B/n$'s significand) and scaled back by ``exponent`` $E$ with
    :func:`kernels.norms.ldexp_exact`, so the dual norm of each draw neither overflows nor
    underflows and neither does the scale (in float32, ``1e20 * eye(4)`` gave inf, ``1e-20 *
    eye(4)`` gave 0, and inputs of 1e-37 over 100 examples gave a flushed scale of 0), while the
    values equal the plain formula's bit for bit in the normal range.

    Attributes:
      inputs: ``[n, d]`` sample (leaf).
      scale: the significand part of $s$ (leaf).
      down: $2^{-e}$ (leaf).
      exponent: $E$, the int32 power of two of the working units (leaf).
      dual: $p^*$, the exponent of the dual norm. Static.
      precision: how the product $\sigma^\top X$ is computed (see :func:`linear_sup`). Static.
    """

    inputs: jax.Array
    scale: jax.Array
    down: jax.Array
    exponent: jax.Array
    dual: float = dataclasses.field(metadata={"static": True})
    precision: str | None = dataclasses.field(default=None, metadata={"static": True})

    @property
    def num_examples(self) -> int:
        """n, the sample size."""
        return self.inputs.shape[0]

    @property
    def dtype(self) -> Any:
        """The compute dtype (that of ``inputs``)."""
        return self.inputs.dtype

    @property
    def unit_bound(self) -> jax.Array:
        r""":attr:`bound` in working units ($2^{-E} b$)."""
        norms = vector_norm(self.inputs * self.down, self.dual, axis=1)
        return jnp.max(norms) * self.scale * self.num_examples

    @property
    def bound(self) -> jax.Array:
        r"""$b = \sup_{f, i} |f(x_i)| = B \|u\|_{q^*} \max_i \|x_i\|_{p^*}$ (for McDiarmid)."""
        return ldexp_exact(self.unit_bound, self.exponent)

    def unit(self, signs: jax.Array) -> jax.Array:
        r"""Sups for sign vectors ``[..., n]`` in working units ($2^{-E}$ times the sups)."""
        signs = _check_signs(signs, self.num_examples)
        v = _signed_sum(signs, self.inputs * self.down, self.precision)
        return self.scale * _dual_norm(v, self.dual)

    def __call__(self, signs: jax.Array) -> jax.Array:
        """Sups for sign vectors ``[..., n]``."""
        return ldexp_exact(self.unit(signs), self.exponent)


def _dual_norm(v: jax.Array, p: float) -> jax.Array:
    r"""$\|v\|_p$ along the last axis of a product of pre-scaled inputs (entries at most n).

    $p = 2$ is the plain ``sqrt(sum(v * v))``: one fused pass (a scaled norm's extra pass cost
    1.6x of ``rademacher_linear``'s run time at n = 1024, d = 64 on CPU); its range is safe
    because the inputs were scaled to [0.5, 1). Other $p$ are :func:`kernels.norms.vector_norm`.
    """
    if p == 2:
        return jnp.sqrt(jnp.sum(v * v, axis=-1))
    return vector_norm(v, p, axis=-1)


def _signed_sum(signs: jax.Array, x: jax.Array, precision: str | None) -> jax.Array:
    r"""$\sigma^\top X$ for sign vectors ``[..., n]`` and ``x`` ``[n, d]``, in ``x``'s dtype.

    ``None``: one matmul at JAX's default precision (TF32 for float32 on a GPU); ``"highest"``:
    full precision; ``"bf16x2"`` (float32 only): $X = H + L$ with $H$ = bfloat16(X) and
    $L$ = bfloat16(X - H), two bfloat16 matmuls accumulated in float32. The signs are exact in
    bfloat16 and $H + L$ keeps 16 of float32's 24 significand bits ($|X - H - L| \le
    2^{-17}|X|$ elementwise), so each entry of the product is off by at most
    $2^{-17}\sum_i |x_{ij}|$ plus float32 accumulation rounding.
    """
    dtype = x.dtype
    if precision == "bf16x2":
        hi = x.astype(jnp.bfloat16)
        lo = (x - hi.astype(dtype)).astype(jnp.bfloat16)
        s = signs.astype(jnp.bfloat16)
        return jnp.dot(s, hi, preferred_element_type=dtype) + jnp.dot(
            s, lo, preferred_element_type=dtype
        )
    prec = _HIGHEST if precision == "highest" else None
    return jnp.dot(signs.astype(dtype), x, precision=prec, preferred_element_type=dtype)


def _check_precision(precision: Any, dtype: Any) -> str | None:
    """A valid ``precision`` option for inputs of ``dtype``; else a ValueError naming it."""
    if isinstance(precision, str | None) and precision in _PRECISIONS:
        if precision == "bf16x2" and np.dtype(dtype) != np.float32:
            raise ValueError(f"precision: 'bf16x2' splits float32 inputs, got dtype {dtype}")
        return precision
    raise ValueError(f"precision: expected None, 'highest' or 'bf16x2', got {precision!r}")


def linear_sup(
    inputs: jax.Array,
    *,
    norm: Any,
    radius: Any,
    readout: jax.Array | None = None,
    precision: str | None = None,
) -> LinearSup:
    r"""Exact sup object of a norm-ball linear class, ``signs[..., n] -> values[...]``.

    Vector class $\{x \mapsto \langle w, x\rangle : \|w\|_p \le B\}$ (``norm=p``):
    $\sup = \frac{B}{n}\|\sum_i \sigma_i x_i\|_{p^*}$ (Hölder, attained).

    Matrix class $\{x \mapsto u^\top W x : W \in \mathbb R^{k\times d}, \|W\|_{q,p} \le B\}$
    (``norm=(q, p)``, group norm = p-norm of the column q-norms, fixed readout $u \in \mathbb R^k$):
    with $v = \sum_i \sigma_i x_i$, $u^\top W v = \langle W, u v^\top\rangle$ and the dual of
    $\|\cdot\|_{q,p}$ is $\|\cdot\|_{q^*,p^*}$, so $\sup = \frac{B}{n}\|u\|_{q^*}\|v\|_{p^*}$.

    The norms are scaled (exactly, by powers of two), so they neither overflow nor underflow
    where the result is representable (:func:`kernels.norms.vector_norm`).

    Args:
      inputs: ``[n, d]`` float32/float64 sample.
      norm: p in [1, inf] for the vector class, or a pair (q, p) for the matrix class.
      radius: B > 0 (float or array scalar).
      readout: ``[k]`` vector u, required for (and only for) the matrix class.
      precision: how $\sigma^\top X$ is computed: ``None`` (JAX's default matmul precision:
        full float32 on a CPU, TF32 on a GPU at JAX's defaults), ``"highest"`` (full
        precision), or ``"bf16x2"`` (float32 only: $X$ split into two bfloat16 parts, two
        bfloat16 matmuls with float32 accumulation; about 16 significand bits, error at most
        $2^{-17}\sum_i|x_{ij}|$ per entry, for accelerators whose bfloat16 matmuls are faster
        than float32's). Static.

    Returns:
      :class:`LinearSup`; its ``bound`` is $b = B\|u\|_{q^*}\max_i\|x_i\|_{p^*}$.

    Raises:
      ValueError: on bad shapes, dtypes, exponents or precision, empty or non-finite inputs, a
        non-positive radius (also under ``jit``, checked in this order), or sign vectors whose
        length is not n.

    >>> import jax.numpy as jnp
    >>> sup = linear_sup(jnp.eye(2), norm=2, radius=1.0)
    >>> round(float(sup(jnp.array([1.0, -1.0]))), 6), float(sup.bound)  # sqrt(2) / 2, B max ||x_i||
    (0.707107, 1.0)
    """
    return _linear_sup(inputs, norm, radius, readout, precision, CheckChain())


def _linear_sup(
    inputs: Any, norm: Any, radius: Any, readout: Any, precision: Any, chain: CheckChain
) -> LinearSup:
    """:func:`linear_sup` with its runtime checks in ``chain`` (inputs, radius, readout)."""
    inputs = _check_float_array(inputs, "inputs", ndim=2, chain=chain)
    precision = _check_precision(precision, inputs.dtype)
    chain.positive(radius, "radius")
    p, q = _parse_norm(norm, readout)
    radius = jnp.asarray(radius, inputs.dtype)
    factors = [radius]
    if q is not None:
        u = _check_float_array(readout, "readout", ndim=1, chain=chain).astype(inputs.dtype)
        factors.append(vector_norm(chain.clean(u), dual_exponent(q)))
    inputs, factors = chain.clean((inputs, factors))
    # each factor as significand * 2^e (exact), the powers of two kept apart in `exponent`
    exps = [pow2_exponent(f) for f in factors]
    scale = jnp.ones((), inputs.dtype) / inputs.shape[0]
    for f, e in zip(factors, exps, strict=True):
        scale = scale * ldexp_exact(f, -e)
    down, up = pow2_factors(jnp.max(jnp.abs(inputs)))
    exponent = pow2_exponent(up) - 1 + sum(exps)
    return LinearSup(inputs, scale, down, exponent, dual_exponent(p), precision)


# --------------------------------------------------------------------------- finite classes


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FiniteSup:
    r"""Exact sup of a finite class (see :func:`finite_sup`), ``signs[..., n] -> values[...]``.

    $\sup = \max_{j < M}\frac1n\langle\sigma, V_j\rangle$, members visited
    ``member_chunk_size`` at a time in a ``lax.fori_loop``.

    Attributes:
      batch: the data ``outputs_fn`` reads (leaves).
      outputs_fn: ``(indices[member_chunk_size], batch) -> [member_chunk_size, n]`` outputs.
        Static (keyed by identity).
      num_members: M. Static.
      member_chunk_size: members per block. Static.
      num_examples: n. Static.
      dtype: dtype of the outputs. Static.
    """

    batch: Any
    outputs_fn: Callable[[jax.Array, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    num_members: int = dataclasses.field(metadata={"static": True})
    member_chunk_size: int = dataclasses.field(metadata={"static": True})
    num_examples: int = dataclasses.field(metadata={"static": True})
    dtype: Any = dataclasses.field(metadata={"static": True})

    @property
    def num_blocks(self) -> int:
        """Number of member blocks."""
        return -(-self.num_members // self.member_chunk_size)

    def block(self, b: Any) -> tuple[jax.Array, jax.Array]:
        """Outputs ``[member_chunk_size, n]`` of block ``b`` and which rows are real members.

        Indices past ``M - 1`` (last block) are clamped to ``M - 1`` and marked invalid. The
        arithmetic never forms an index above ``M - 1`` (so int32 indices do not wrap, even
        for ``M = 2**31 - 1``).
        """
        mc = self.member_chunk_size
        first = jnp.asarray(b, jnp.int32) * jnp.int32(mc)  # <= M - 1: the block exists
        offset = jnp.arange(mc, dtype=jnp.int32)
        left = jnp.int32(self.num_members - 1) - first  # members after the first, >= 0
        vals = self.outputs_fn(first + jnp.minimum(offset, left), self.batch)
        return vals, offset <= left

    def __call__(self, signs: jax.Array) -> jax.Array:
        """Sups for sign vectors ``[..., n]``."""
        signs = _check_signs(signs, self.num_examples).astype(self.dtype)

        def body(b: Any, best: jax.Array) -> jax.Array:
            vals, valid = self.block(b)
            scores = jnp.dot(signs, vals.T, preferred_element_type=self.dtype)
            valid = valid.reshape((1,) * (scores.ndim - 1) + valid.shape)
            return jnp.maximum(best, jnp.max(jnp.where(valid, scores, -jnp.inf), axis=-1))

        init = jnp.full(signs.shape[:-1], -jnp.inf, self.dtype)
        best = jax.lax.fori_loop(0, self.num_blocks, body, init)
        return best / self.num_examples

    def bound_from(self, first: jax.Array) -> jax.Array:
        r"""$b = \max_{j,i}|V_{ji}|$, given the outputs ``first`` of block 0 (one more pass)."""

        def body(b: Any, acc: jax.Array) -> jax.Array:
            vals, valid = self.block(b)
            return jnp.maximum(acc, jnp.max(jnp.where(valid[:, None], jnp.abs(vals), 0)))

        return jax.lax.fori_loop(1, self.num_blocks, body, jnp.max(jnp.abs(first)))

    @property
    def bound(self) -> jax.Array:
        r"""$b = \max_{j,i} |V_{ji}|$ (one pass over the members, for McDiarmid)."""
        return self.bound_from(self.block(0)[0])


def _finite_sup(
    outputs_fn: Callable[[jax.Array, Any], jax.Array],
    batch: Any,
    num_members: Any,
    member_chunk_size: Any,
    chain: CheckChain,
) -> tuple[FiniteSup, jax.Array]:
    """The sup object and the outputs of block 0 (computed once; they fix n and the dtype)."""
    if num_members is None:
        num_members = getattr(outputs_fn, "num_members", None)
        if num_members is None:
            raise ValueError("num_members: required unless outputs_fn has a num_members attribute")
    m = check_positive_int(num_members, "num_members")
    if m > _MAX_MEMBERS:
        raise ValueError(
            f"num_members: at most 2**31 - 1 members (outputs_fn receives int32 indices), got {m}"
        )
    mc = min(m, 1024) if member_chunk_size is None else member_chunk_size
    mc = min(check_positive_int(mc, "member_chunk_size"), m)
    if jax.tree_util.tree_leaves(batch):
        _check_float_tree(batch, "batch", allow_int=True, chain=chain)
        batch = chain.clean(batch)
    first = outputs_fn(jnp.arange(mc, dtype=jnp.int32), batch)
    shape = getattr(first, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != mc or shape[1] == 0:
        raise ValueError(
            f"outputs_fn: indices[{mc}] must give outputs [{mc}, n] with n >= 1, got shape {shape}"
        )
    dtype = _check_float_dtype(first.dtype, "outputs_fn")
    sup = FiniteSup(
        batch=batch,
        outputs_fn=outputs_fn,
        num_members=m,
        member_chunk_size=mc,
        num_examples=int(shape[1]),
        dtype=dtype,
    )
    return sup, first


def finite_sup(
    outputs_fn: Callable[[jax.Array, Any], jax.Array],
    batch: Any,
    *,
    num_members: int | None = None,
    member_chunk_size: int | None = None,
) -> FiniteSup:
    r"""Exact sup object of a finite class, ``signs[..., n] -> values[...]``.

    $\sup = \max_{j < M} \frac1n \langle \sigma, V_j\rangle$ where ``outputs_fn(indices, batch)``
    returns the member outputs $V_j = (f_j(x_1), \dots, f_j(x_n))$ for an int32 index vector of
    length ``member_chunk_size``. Members are visited ``member_chunk_size`` at a time, so memory
    holds ``c x member_chunk_size`` scores and ``member_chunk_size x n`` outputs, never the whole
    output matrix.
    This evaluates ``outputs_fn`` once on the first block to learn n and the dtype.

    Args:
      outputs_fn: ``(int32 indices[member_chunk_size], batch) -> [member_chunk_size, n]``
        float32/float64 outputs; traceable. Keyed by identity when compiled: pass data through
        ``batch``.
      batch: the data ``outputs_fn`` reads (any pytree, ``None`` for none).
      num_members: M, at most ``2**31 - 1`` (default ``outputs_fn.num_members``). Static.
      member_chunk_size: members per block (default min(M, 1024)). Static.

    Returns:
      :class:`FiniteSup`; its ``bound`` is $b = \max_{j,i}|V_{ji}|$ (one more pass).

    Raises:
      ValueError: on bad counts (M above ``2**31 - 1``: int32 indices), non-finite or
        half-precision data, if ``outputs_fn`` does not return ``[member_chunk_size, n]`` float
        outputs, or on sign vectors whose length is not n.

    >>> import jax.numpy as jnp
    >>> sup = finite_sup(lambda i, v: v[i], jnp.array([[1.0, 0.0], [0.0, 1.0]]), num_members=2)
    >>> float(sup(jnp.array([1.0, -1.0]))), float(sup.bound)
    (0.5, 1.0)
    """
    return _finite_sup(outputs_fn, batch, num_members, member_chunk_size, CheckChain())[0]


# --------------------------------------------------------------------------- search


def _ascent_decay(num_steps: int) -> np.ndarray:
    """Step factors 0.01 ** (t / (T - 1)) for t < T, then 0 (the extra step evaluates the end)."""
    return np.append(0.01 ** (np.arange(num_steps) / max(num_steps - 1, 1)), 0.0)


def _ascend(sup: Any, signs: jax.Array, theta0: Any) -> tuple[jax.Array, jax.Array]:
    r"""Best ``sup._objective`` value and largest output bound over the iterates from ``theta0``.

    Projected ascent with normalised steps $\eta_t$ = ``sup.step_size`` times
    :func:`_ascent_decay`; every iterate is ``sup.project``-ed, so every value is attained.
    The step direction $g/\|g\|$ is formed from $g$ rescaled by a power of two (exact), so a
    gradient whose squares underflow (or are flushed to zero, as on GPUs) takes a unit step,
    and a zero gradient takes none (never ``eta / tiny`` times a tiny gradient).
    """
    objective = functools.partial(sup._objective, signs)

    def step(carry: Any, eta: jax.Array) -> Any:
        theta, best, top = carry
        (val, f_max), grad = jax.value_and_grad(objective, has_aux=True)(theta)
        scale, grad = _unit_step(grad, eta)
        theta = sup.project(
            jax.tree_util.tree_map(lambda t, d: t + (scale * d).astype(t.dtype), theta, grad)
        )
        return (theta, jnp.maximum(best, val), jnp.maximum(top, f_max)), None

    etas = sup.step_size.astype(sup.dtype) * jnp.asarray(_ascent_decay(sup.num_steps), sup.dtype)
    init = (theta0, jnp.full((), -jnp.inf, sup.dtype), jnp.zeros((), sup.dtype))
    # one extra scan step evaluates the last iterate (its update is discarded): the
    # compiled program holds one copy of the model's forward and backward pass, not two.
    # The loop body is traced without runtime checks: a check is a host callback, and one per
    # step (e.g. the finiteness check of kernels.norms' projections) costs more than the step
    # itself on CPU. Nothing goes unchecked: the starts were projected with checks on, and a
    # NaN iterate makes its value NaN (max propagates NaN), which the Monte Carlo driver counts
    # and reports as a non-finite sup.
    with runtime_checks(_CHECKS_IN_ASCENT and runtime_checks_enabled()):
        (_, best, top), _ = jax.lax.scan(step, init, etas)
    return best, top


def _unit_step(grad: Any, eta: jax.Array) -> tuple[jax.Array, Any]:
    r"""``(eta / ||u||_2, u)``, ``u = grad * 2**-e`` (exact) with ``||u||`` in [0.5, sqrt(size)].

    ``eta * u / ||u||`` is the step $\eta\, g/\|g\|$; a zero gradient gives a zero scale.
    """
    leaves = jax.tree_util.tree_leaves(grad)
    dtype = jnp.result_type(*leaves)
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))
    down, _ = pow2_factors(top)
    grad = jax.tree_util.tree_map(lambda g: g * down.astype(g.dtype), grad)
    total = sum(jnp.sum(jnp.square(g)).astype(dtype) for g in jax.tree_util.tree_leaves(grad))
    norm = jnp.sqrt(total)
    positive = norm > 0
    scale = jnp.where(positive, eta.astype(dtype) / jnp.where(positive, norm, 1), 0)
    return scale, grad


def _search_all(sup: Any, signs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Best value and largest output bound over restarts, for sign vectors ``[..., n]``."""
    lead = signs.shape[:-1]
    flat = signs.astype(sup.dtype).reshape(-1, sup.num_examples)
    one = functools.partial(_ascend, sup)
    per_start = jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None))
    best, top = per_start(flat, sup.starts)
    return jnp.max(best, axis=1).reshape(lead), jnp.max(top, axis=1).reshape(lead)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SearchSup:
    r"""Lower-bound sup of a constrained parametric class (see :func:`search_sup`).

    Attributes:
      starts: the ascent's starting points, each leaf stacked ``[num_restarts, ...]`` (leaves).
      inputs: the sample ``apply_fn`` reads (leaves).
      step_size: $\eta_0$ (leaf).
      apply_fn: ``(params, inputs) -> [n]`` or ``[n, 1]`` outputs. Static.
      project: Euclidean projection onto the constraint set. Static.
      num_steps: ascent steps per start. Static.
      num_examples: n. Static.
      dtype: dtype of the outputs. Static.
    """

    starts: Any
    inputs: Any
    step_size: jax.Array
    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    project: Callable[[Any], Any] = dataclasses.field(metadata={"static": True})
    num_steps: int = dataclasses.field(metadata={"static": True})
    num_examples: int = dataclasses.field(metadata={"static": True})
    dtype: Any = dataclasses.field(metadata={"static": True})

    def _objective(self, signs: jax.Array, theta: Any) -> tuple[jax.Array, jax.Array]:
        r"""$g_\sigma(\theta)$ and $\max_i |f_\theta(x_i)|$."""
        n = self.num_examples
        f = self.apply_fn(theta, self.inputs).reshape(n).astype(self.dtype)
        # the value certifies a lower bound: full precision whatever the default (TF32)
        return jnp.dot(signs, f, precision=_HIGHEST) / n, jnp.max(jnp.abs(f))

    def search(self, signs: jax.Array) -> tuple[jax.Array, jax.Array]:
        r"""Values ``[...]`` for sign vectors ``[..., n]`` and the largest $|f_\theta(x_i)|$ seen.

        The second output is $\max |f_\theta(x_i)|$ over every parameter the search visited for
        that sign vector (all iterates of all restarts): what an ``output_bound`` must cover.
        """
        return _search_all(self, signs)

    def __call__(self, signs: jax.Array) -> jax.Array:
        """Search values (lower bounds of the sups) for sign vectors ``[..., n]``."""
        return self.search(signs)[0]


def _random_starts(
    params: Any, key: jax.Array, project: Callable, num_restarts: int, init_scale: Any
) -> Any:
    """``project(params)`` and ``num_restarts - 1`` projected Gaussian restarts, stacked."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))

    def random_start(r: int) -> Any:
        new = []
        for leaf, k in zip(leaves, keys, strict=True):
            leaf = jnp.asarray(leaf)
            rms = jnp.sqrt(jnp.mean(leaf * leaf)) if leaf.size else jnp.ones((), leaf.dtype)
            rms = jnp.where(rms > 0, rms, jnp.ones_like(rms))
            z = jax.random.normal(jax.random.fold_in(k, r), leaf.shape, leaf.dtype)
            new.append(leaf + jnp.asarray(init_scale, leaf.dtype) * rms * z)
        return project(jax.tree_util.tree_unflatten(treedef, new))

    starts = [project(params)] + [random_start(r) for r in range(1, num_restarts)]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *starts)


def _check_projection(project: Callable, params: Any) -> None:
    """``project(params)`` keeps the structure, shapes and dtypes of ``params`` (abstractly)."""
    try:
        out = jax.eval_shape(project, params)
    except Exception as err:  # re-raised with the argument named
        raise ValueError(f"project: could not be evaluated at params: {err}") from err
    want = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), params)
    got = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), out)
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(params) or got != want:
        raise ValueError(
            "project: must return parameters of the structure, shapes and dtypes of params "
            f"(a projection onto the constraint set), got {got} for {want}"
        )


def _search_starts(
    params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
):
    """Checked ascent options: the step count, the projected random starts and the first start.

    Runtime checks join ``chain`` in argument order (step_size, init_scale, params, inputs);
    ``project`` and the starts see the cleaned values, so a bad argument is reported by its
    own check, never by one inside ``project``.
    """
    steps = check_positive_int(num_steps, "num_steps")
    restarts = check_positive_int(num_restarts, "num_restarts")
    check_key(key)
    chain.positive(step_size, "step_size")
    chain.positive(init_scale, "init_scale")
    _check_float_tree(params, "params", chain=chain)
    if jax.tree_util.tree_leaves(inputs):
        _check_float_tree(inputs, "inputs", allow_int=True, chain=chain)
    _check_projection(project, params)
    params, inputs = chain.clean((params, inputs))
    if isinstance(init_scale, jax.Array):
        init_scale = chain.clean(init_scale)
    starts = _random_starts(params, key, project, restarts, init_scale)
    first = jax.tree_util.tree_map(lambda leaf: leaf[0], starts)
    return steps, starts, first, inputs


def _search_sup(
    apply_fn: Callable,
    params: Any,
    inputs: Any,
    key: jax.Array,
    project: Callable,
    num_steps: Any,
    step_size: Any,
    num_restarts: Any,
    init_scale: Any,
    chain: CheckChain,
) -> SearchSup:
    """The search object; ``apply_fn`` runs once at ``project(params)`` (n, dtype, finite)."""
    steps, starts, first, inputs = _search_starts(
        params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
    )
    out = apply_fn(first, inputs)
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValueError(f"apply_fn: must return outputs [n] or [n, 1], got shape {shape}")
    if shape[0] == 0:
        raise ValueError("inputs: empty sample (apply_fn returned 0 outputs)")
    dtype = _check_float_dtype(out.dtype, "apply_fn")
    chain.finite(out, "apply_fn: outputs at project(params)")
    step = chain.clean(jnp.asarray(step_size, dtype))
    return SearchSup(starts, inputs, step, apply_fn, project, steps, int(shape[0]), dtype)


def search_sup(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    init_scale: Any = 1.0,
) -> SearchSup:
    r"""Lower-bound sup object of a constrained parametric class, ``signs[..., n] -> [...]``.

    For each sign vector, projected gradient ascent on
    $g_\sigma(\theta) = \frac1n\sum_i \sigma_i f_\theta(x_i)$ over $\Theta$ = the range of
    ``project``: $\theta_{t+1} = P(\theta_t + \eta_t\, \nabla g_\sigma(\theta_t) /
    \|\nabla g_\sigma(\theta_t)\|_2)$ (normalised steps, so ``step_size`` is in parameter units;
    $\eta_t$ decays geometrically from ``step_size`` to ``step_size / 100``), started from
    ``project(params)`` and from ``num_restarts - 1`` random points
    ``project(params + init_scale * z)``, z Gaussian with each leaf's RMS scale (shared by all
    sign vectors, drawn from ``key``). The value is the best $g_\sigma$ over all iterates and
    restarts. Every iterate is feasible, so each value is a **lower bound** of
    $\sup_{\theta\in\Theta} g_\sigma(\theta)$. Sign vectors and restarts are vmapped. This
    evaluates ``apply_fn`` once at ``project(params)`` to learn n and the dtype.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` of shape ``[n]`` or ``[n, 1]`` (float32/64).
      params: float32/float64 parameter pytree (a point of the class; the first start).
      inputs: the sample (any pytree ``apply_fn`` accepts; integer leaves such as token ids are
        allowed).
      key: PRNG key for the random restarts.
      project: Euclidean projection onto the constraint set (params -> params).
      num_steps: ascent steps per start. Static.
      step_size: first step length eta_0 > 0 (global l2 units), about the set's diameter.
      num_restarts: starts per sign vector (>= 1). Static.
      init_scale: scale > 0 of the random restarts relative to each leaf's RMS.

    Returns:
      :class:`SearchSup` (lower bound); ``.search(signs)`` also returns the largest
      $|f_\theta(x_i)|$ the search saw.

    Raises:
      ValueError: on bad counts, key, dtypes, non-finite data or parameters, a non-positive step
        size, or if ``apply_fn`` does not give ``[n]`` outputs.
    """
    return _search_sup(
        apply_fn, params, inputs, key, project, num_steps, step_size, num_restarts, init_scale,
        CheckChain(),
    )  # fmt: skip


def _smooth_lp(v: jax.Array, p: float) -> jax.Array:
    r"""$\|v\|_p$ along the last axis, with a zero (not NaN) gradient at $v = 0$; NaN stays NaN.

    For $1 < p < \infty$ computed as $m\,\|v/m\|_p$, $m = \max_j|v_j|$ (no overflow for large p,
    and a finite derivative everywhere); $p = 1$ and $p = \infty$ have subgradients already.
    """
    if p == 1 or math.isinf(p):
        return vector_norm(v, p, axis=-1)
    a = jnp.abs(v)
    m = jnp.max(a, axis=-1, keepdims=True)
    zero = m == 0  # false for NaN: a NaN v gives a NaN norm, never a silent 0
    m = jnp.where(zero, jnp.ones_like(m), m)
    total = jnp.sum((a / m) ** jnp.asarray(p, v.dtype), axis=-1, keepdims=True)
    total = jnp.where(zero, jnp.ones_like(total), total)  # >= 1 otherwise: the largest term is 1
    out = m * total ** jnp.asarray(1 / p, v.dtype)
    return jnp.where(zero, jnp.zeros_like(out), out)[..., 0]


def _readout_exponent(readout_norm: Any) -> float:
    """The dual exponent $q^*$ of ``readout_norm`` = q in [1, inf]; else raise naming it."""
    if isinstance(readout_norm, bool) or not isinstance(readout_norm, int | float | np.number):
        raise ValueError(f"readout_norm: expected a number q in [1, inf], got {readout_norm!r}")
    if math.isnan(readout_norm) or readout_norm < 1:
        raise ValueError(f"readout_norm: expected a number q in [1, inf], got {readout_norm!r}")
    return dual_exponent(float(readout_norm))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReadoutSearchSup:
    r"""Lower-bound sup of a class ending in a norm-bounded readout (:func:`readout_search_sup`).

    Attributes:
      starts: the ascent's starting points of the inner parameters, each leaf stacked
        ``[num_restarts, ...]`` (leaves).
      inputs: the sample ``features_fn`` reads (leaves).
      step_size: $\eta_0$ (leaf).
      readout_radius: $B$, the radius of the readout ball (leaf).
      features_fn: ``(params, inputs) -> [n, k]`` features $\phi_V(x_i)$. Static.
      project: Euclidean projection of the inner parameters onto their constraint set. Static.
      num_steps: ascent steps per start. Static.
      num_examples: n. Static.
      dual: $q^*$, the exponent of the dual norm of the readout norm $q$. Static.
      dtype: dtype of the features. Static.
    """

    starts: Any
    inputs: Any
    step_size: jax.Array
    readout_radius: jax.Array
    features_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    project: Callable[[Any], Any] = dataclasses.field(metadata={"static": True})
    num_steps: int = dataclasses.field(metadata={"static": True})
    num_examples: int = dataclasses.field(metadata={"static": True})
    dual: float = dataclasses.field(metadata={"static": True})
    dtype: Any = dataclasses.field(metadata={"static": True})

    def _objective(self, signs: jax.Array, theta: Any) -> tuple[jax.Array, jax.Array]:
        r"""$\frac Bn\|\Phi_V^\top\sigma\|_{q^*}$ and $B\max_i\|\phi_V(x_i)\|_{q^*}$."""
        n = self.num_examples
        phi = self.features_fn(theta, self.inputs).reshape(n, -1).astype(self.dtype)
        # the closed-form readout sup certifies a lower bound: full precision whatever the
        # default matmul precision (TF32 on a GPU)
        v = jnp.dot(signs, phi, precision=_HIGHEST, preferred_element_type=self.dtype)
        radius = self.readout_radius.astype(self.dtype)
        value = radius / n * _smooth_lp(v, self.dual)
        return value, radius * jnp.max(vector_norm(phi, self.dual, axis=1))

    def search(self, signs: jax.Array) -> tuple[jax.Array, jax.Array]:
        r"""Values ``[...]`` for sign vectors ``[..., n]`` and the largest output bound seen.

        The second output is $B\max_i\|\phi_V(x_i)\|_{q^*} = \sup_{\|w\|_q\le B}
        \max_i |w^\top\phi_V(x_i)|$, maximised over every V the search visited for that sign
        vector: what an ``output_bound`` must cover.
        """
        return _search_all(self, signs)

    def __call__(self, signs: jax.Array) -> jax.Array:
        """Search values (lower bounds of the sups) for sign vectors ``[..., n]``."""
        return self.search(signs)[0]


def _readout_search_sup(
    features_fn: Callable,
    params: Any,
    inputs: Any,
    key: jax.Array,
    project: Callable,
    readout_norm: Any,
    readout_radius: Any,
    num_steps: Any,
    step_size: Any,
    num_restarts: Any,
    init_scale: Any,
    chain: CheckChain,
) -> ReadoutSearchSup:
    """The search object; ``features_fn`` runs once at ``project(params)`` (n, dtype, finite)."""
    dual = _readout_exponent(readout_norm)
    chain.positive(readout_radius, "readout_radius")
    steps, starts, first, inputs = _search_starts(
        params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
    )
    out = features_fn(first, inputs)
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] == 0:
        raise ValueError(f"features_fn: must return features [n, k] with k >= 1, got shape {shape}")
    if shape[0] == 0:
        raise ValueError("inputs: empty sample (features_fn returned 0 rows)")
    dtype = _check_float_dtype(out.dtype, "features_fn")
    chain.finite(out, "features_fn: features at project(params)")
    return ReadoutSearchSup(
        starts=starts,
        inputs=inputs,
        step_size=chain.clean(jnp.asarray(step_size, dtype)),
        readout_radius=chain.clean(jnp.asarray(readout_radius, dtype)),
        features_fn=features_fn,
        project=project,
        num_steps=steps,
        num_examples=int(shape[0]),
        dual=dual,
        dtype=dtype,
    )


def readout_search_sup(
    features_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    readout_norm: float,
    readout_radius: Any,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    init_scale: Any = 1.0,
) -> ReadoutSearchSup:
    r"""Lower-bound sup object of a class ending in a norm-bounded linear readout.

    The class is $\{x \mapsto w^\top\phi_V(x) : V \in \mathcal V, \|w\|_q \le B\}$ with
    features $\phi_V$ = ``features_fn(V, inputs)`` $\in\mathbb R^{n\times k}$. For a fixed V the
    sup over the readout is closed-form (Hölder, attained):

    $$\sup_{\|w\|_q\le B}\frac1n\sum_i\sigma_i w^\top\phi_V(x_i)
    = \frac Bn\Big\|\sum_i\sigma_i\phi_V(x_i)\Big\|_{q^*},\qquad \frac1q+\frac1{q^*}=1,$$

    so only V is searched: projected gradient ascent on
    $h_\sigma(V) = \frac Bn\|\Phi_V^\top\sigma\|_{q^*}$ over $\mathcal V$ = the range of
    ``project``, with the steps, decay, starts and restarts of :func:`search_sup`. Each value is
    the best $h_\sigma$ over all iterates and restarts; every iterate is feasible and its readout
    sup attained, so each value is a **lower bound** of the class's sup, and **exact** when the
    features do not depend on V (a linear class: :class:`LinearSup`'s value). This evaluates
    ``features_fn`` once at ``project(params)`` to learn n and the dtype.

    Args:
      features_fn: ``(params, inputs) -> [n, k]`` float32/float64 features (the network up to
        its readout).
      params: float32/float64 inner parameters V (a point of $\mathcal V$; the first start). The
        readout w is not a parameter: its sup is closed-form.
      inputs: the sample (any pytree ``features_fn`` accepts; integer leaves allowed).
      key: PRNG key for the random restarts.
      project: Euclidean projection of the inner parameters onto $\mathcal V$.
      readout_norm: q in [1, inf], the norm of the readout ball (its dual $q^*$ is used). Static.
      readout_radius: B > 0, the radius of the readout ball (float or array scalar).
      num_steps: ascent steps per start. Static.
      step_size: first step length eta_0 > 0 (global l2 units of V).
      num_restarts: starts per sign vector (>= 1). Static.
      init_scale: scale > 0 of the random restarts relative to each leaf's RMS.

    Returns:
      :class:`ReadoutSearchSup` (lower bound); ``.search(signs)`` also returns the largest
      $B\max_i\|\phi_V(x_i)\|_{q^*}$ the search saw.

    Raises:
      ValueError: on a readout norm outside [1, inf], a non-positive readout radius or step size,
        bad counts, key, dtypes, non-finite data or parameters, or if ``features_fn`` does not
        give ``[n, k]`` features.

    >>> import jax, jax.numpy as jnp, kernels.norms as kn
    >>> sup = readout_search_sup(lambda v, x: x, jnp.zeros(1), jnp.eye(2), jax.random.key(0),
    ...     project=lambda v: v, readout_norm=2, readout_radius=1.0, num_steps=1, step_size=1.0)
    >>> # fixed features: exact, B ||s||_2 / n = sqrt(2) / 2
    >>> round(float(sup(jnp.array([1.0, -1.0]))), 6)
    0.707107
    """
    return _readout_search_sup(
        features_fn,
        params,
        inputs,
        key,
        project,
        readout_norm,
        readout_radius,
        num_steps,
        step_size,
        num_restarts,
        init_scale,
        CheckChain(),
    )


# --------------------------------------------------------------------------- Monte Carlo driver


def _halfwidth_factor(num_examples: Any, num_samples: Any, delta: Any) -> float:
    r"""$2\sqrt{\ln(2/\delta)/(2nK)}$ with $\ln(2/\delta) = \ln 2 - \ln\delta$.

    (No overflow of $2/\delta$ for a subnormal $\delta$.)
    """
    n = check_positive_int(num_examples, "num_examples")
    k = check_num_samples(num_samples, "num_samples")
    delta = _check_delta(delta)
    if delta is None:
        raise ValueError("delta: expected a Python float in (0, 1), got None")
    return 2 * math.sqrt((math.log(2) - math.log(delta)) / (2 * n * k))


@renamed_kwargs(num_draws="num_samples")
def mcdiarmid_halfwidth(bound: Any, *, num_examples: int, num_samples: int, delta: float) -> Any:
    r"""Half-width $2b\sqrt{\ln(2/\delta)/(2nK)}$ of the McDiarmid interval for $\mathrm{Rad}_S$.

    Valid around the average of $K$ exact sups over i.i.d. sign vectors when $|f(x_i)| \le b$.
    $\ln(2/\delta)$ is computed as $\ln 2 - \ln\delta$, so any $\delta > 0$ down to the
    smallest subnormal double gives a finite width ($2/\delta$ overflowed at $\delta = 10^{-308}$).

    Args:
      bound: b >= 0 (float or array).
      num_examples: n. Static.
      num_samples: K in ``[1, 2**53]`` (``num_draws`` is its deprecated name). Static.
      delta: the interval has confidence $1 - \delta$, $\delta \in (0, 1)$.

    Raises:
      ValueError: on bad counts, delta, or a negative / non-finite bound (also under ``jit``).

    >>> round(float(mcdiarmid_halfwidth(1.0, num_examples=50, num_samples=2, delta=0.05)), 6)
    0.27162
    >>> round(float(mcdiarmid_halfwidth(1.0, num_examples=10_000, num_samples=1, delta=1e-308)), 6)
    0.3768
    """
    factor = _halfwidth_factor(num_examples, num_samples, delta)
    check_that(
        jnp.logical_and(jnp.isfinite(bound), jnp.asarray(bound) >= 0),
        "bound: expected a finite value >= 0",
    )
    return bound * factor


def _draw_statistics(
    per_draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    sup: LinearSup | FiniteSup | SearchSup | ReadoutSearchSup,
    *,
    num_samples: int,
    chunk_size: int | None,
    name: str,
    chain: CheckChain,
) -> SampleStats:
    """Streaming statistics of ``per_draw(signs of draw k)`` over k < num_samples, checked."""

    def sample(draw_key: jax.Array) -> jax.Array:
        return per_draw(_draw_signs(draw_key, sup.num_examples, sup.dtype))

    stats = sample_statistics(sample, key, num_samples=num_samples, chunk_size=chunk_size)
    chain.require(
        stats.num_nonfinite == 0,
        f"{name}: non-finite value at {{}} of the {num_samples} sign vectors (NaN, or beyond "
        f"the range of {np.dtype(sup.dtype).name})",
        stats.num_nonfinite,
    )
    return stats


def _estimate(stats: SampleStats, index: int | None = None) -> Estimate:
    est = stats.estimate()
    if index is None:
        return est
    return Estimate(mean=est.mean[index], stderr=est.stderr[index], num_samples=est.num_samples)


def _with_interval(
    est: Estimate,
    bound: Any,
    *,
    num_examples: int,
    delta: float | None,
    one_sided: bool = False,
    valid: Any = None,
) -> Estimate:
    """Attach the McDiarmid interval; where ``valid`` is false the lower end is -inf."""
    if delta is None or bound is None:
        return est
    factor = _halfwidth_factor(num_examples, est.num_samples, delta)
    hw = jnp.asarray(bound, est.mean.dtype) * factor
    lower = est.mean - hw
    if valid is not None:
        lower = jnp.where(valid, lower, -jnp.inf)
    upper = jnp.full_like(est.mean, jnp.inf) if one_sided else est.mean + hw
    return dataclasses.replace(est, lower=lower, upper=upper, delta=delta)


def _exact_sup_estimate(
    sup: LinearSup | FiniteSup,
    key: jax.Array,
    bound: Callable[[], jax.Array],
    *,
    num_samples: int,
    chunk_size: int | None,
    delta: float | None,
    name: str,
    chain: CheckChain,
) -> Estimate:
    r"""Mean of exact sups over sign vectors, with the McDiarmid interval of b = ``bound()``.

    Every sup lies in [-b, b]: the statistics are those of the sups times $2^{-e}$ with
    $2^{e-1} \le b < 2^e$ (exact), so their squares neither overflow nor underflow (float32
    inputs of 1e20 gave a NaN standard error), and the mean and standard error are scaled back
    by $2^e$ (bit for bit the unscaled result where that one did not overflow). A
    :class:`LinearSup` is sampled in its working units and the mean, standard error and interval
    are scaled back by its ``exponent`` last (:func:`kernels.norms.ldexp_exact`: a result below
    the normal range keeps its subnormal value). A mean or standard error beyond the dtype's
    range raises naming ``name``.
    """
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, name=name, chain=chain)
    linear = isinstance(sup, LinearSup)
    b = sup.unit_bound if linear else bound()
    per_draw = sup.unit if linear else sup
    down, up = pow2_factors(b)
    stats = _draw_statistics(lambda signs: per_draw(signs) * down, key, sup, **kw)
    est = _estimate(stats)
    est = dataclasses.replace(est, mean=est.mean * up, stderr=est.stderr * up)
    est = _with_interval(est, None if delta is None else b, num_examples=sup.num_examples,
                         delta=delta)  # fmt: skip
    if linear:
        est = _scale_estimate(est, sup.exponent)
    chain.require(
        jnp.logical_and(jnp.isfinite(est.mean), jnp.isfinite(est.stderr)),
        f"{name}: the Rademacher average or its standard error exceeds the range of "
        f"{np.dtype(sup.dtype).name} (scale the {name} or the radius down)",
    )
    return est


def _scale_estimate(est: Estimate, exponent: jax.Array) -> Estimate:
    r"""``est`` (mean, stderr and interval ends) times $2^{\text{exponent}}$, exactly."""
    out = {"mean": ldexp_exact(est.mean, exponent), "stderr": ldexp_exact(est.stderr, exponent)}
    for end in ("lower", "upper"):
        value = getattr(est, end)
        if value is not None:
            out[end] = ldexp_exact(value, exponent)
    return dataclasses.replace(est, **out)


def _check_counts(key: Any, num_samples: Any, chunk_size: Any, delta: Any) -> tuple[Any, ...]:
    check_key(key)
    return (
        check_num_samples(num_samples, "num_samples", minimum=2),
        _check_chunk(chunk_size),
        _check_delta(delta),
    )


# --------------------------------------------------------------------------- public estimators


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_linear(
    inputs: jax.Array,
    key: jax.Array,
    *,
    norm: Any,
    radius: Any,
    num_samples: int,
    chunk_size: int | str | None = "auto",
    readout: jax.Array | None = None,
    delta: float | None = 0.05,
    precision: str | None = None,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a norm-ball linear class (exact sups).

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_{k=1}^K \frac{B}{n}\Big\|\sum_i\sigma^{(k)}_i x_i
    \Big\|_{p^*}$$ (times $\|u\|_{q^*}$ for the matrix class, see :func:`linear_sup`): unbiased
    for $\mathrm{Rad}_S$. Each chunk of draws is generated from raw random bits, multiplied by
    ``inputs`` (one GEMM) and reduced in one pass, sharded over ``jax.devices()``.

    Args:
      inputs: ``[n, d]`` float32/float64 sample (its dtype is the compute dtype).
      key: PRNG key.
      norm: p in [1, inf] (vector class) or a pair (q, p) (matrix class, needs ``readout``).
      radius: B > 0 (float, or array scalar to vary it without recompiling).
      num_samples: $2 \le K \le 2^{53}$ sign vectors (draw $k$ uses
        :func:`kernels.parallel.sample_key` ``(key, k)``, distinct for every k); ``num_draws``
        is its deprecated name. Static.
      chunk_size: draws per vectorised chunk (memory ``chunk_size * (n + d) * itemsize``); None
        for one at a time; ``"auto"`` (default): 256 on a CPU (the fastest measured there), and
        on a GPU/TPU the largest power of two up to 4096 whose chunk fits 1 GiB (an H100 ran
        chunk 4096 2.9x faster than 256 at n = 4096, d = 512). Does not change the draws.
      readout: u for the matrix class.
      delta: confidence of the McDiarmid interval (None for no interval).
      precision: how each chunk's product $\sigma^\top X$ is computed: ``None`` (JAX's default
        matmul precision), ``"highest"``, or ``"bf16x2"`` (float32 inputs split into two
        bfloat16 parts, see :func:`linear_sup`; its error is far below the Monte Carlo error).
        Static.

    Returns:
      Estimate(mean, stderr, K, lower, upper, delta) with the McDiarmid $(1-\delta)$ interval.
      The mean is accumulated in double-word arithmetic (:mod:`kernels.parallel`): its
      summation error stays far below the standard error at any K, in float32 too.

    Raises:
      ValueError: on bad shapes, dtypes, exponents, sizes, key, empty or non-finite inputs, a
        non-positive radius (eagerly; ``JaxRuntimeError`` naming it inside ``jit``; the first
        bad argument is the one named), ``num_samples`` above ``2**53``, or a bad precision.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.eye(4)  # ||sum_i s_i e_i||_2 = 2 for every sign vector: Rad = B * 2 / 4
    >>> est = rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, num_samples=8)
    >>> float(est.mean), float(est.stderr)
    (0.5, 0.0)
    >>> tiny = rademacher_linear(1e-20 * x, jax.random.key(0), norm=2, radius=1e20, num_samples=8)
    >>> tiny.mean, (float(tiny.lower) < 0.5 < float(tiny.upper))  # norms scaled: no underflow
    (Array(0.5, dtype=float32), True)
    """
    chunk_size = _linear_chunk(chunk_size, inputs)
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    chain = CheckChain()
    sup = _linear_sup(inputs, norm, radius, readout, precision, chain)
    kw = dict(
        num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="inputs", chain=chain
    )
    return _exact_sup_estimate(sup, key, lambda: sup.bound, **kw)


def _linear_chunk(chunk_size: Any, inputs: Any) -> Any:
    """``chunk_size`` with ``"auto"`` resolved for the backend and the problem (see the docs)."""
    if not (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if not is_accelerator():
        return _CPU_CHUNK
    shape = jnp.shape(inputs)
    if len(shape) != 2:
        return _CPU_CHUNK  # the inputs check reports the shape
    per_draw = (shape[0] + shape[1]) * jnp.dtype(jnp.result_type(inputs)).itemsize
    chunk = _ACCEL_CHUNK
    while chunk > 1 and chunk * per_draw > _ACCEL_CHUNK_BYTES:
        chunk //= 2
    return chunk


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_finite(
    outputs_fn: Callable[[jax.Array, Any], jax.Array],
    batch: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_members: int | None = None,
    member_chunk_size: int | None = None,
    chunk_size: int | Literal["auto"] | None = 256,
    delta: float | None = 0.05,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a finite class given by its outputs.

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_k \max_{j<M}\frac1n\langle\sigma^{(k)}, V_j\rangle,$$
    unbiased for $\mathrm{Rad}_S$, with $V_j$ = ``outputs_fn(indices, batch)[row]`` produced on
    demand ``member_chunk_size`` members at a time, so a class of $10^6$ members never needs its
    output matrix in memory (see :func:`finite_sup`). ``outputs_fn`` is traced three times on a
    first call (the first block, the bound pass, the sup pass) plus once by the Monte Carlo driver.

    Args:
      outputs_fn: ``(int32 indices[member_chunk_size], batch) -> [member_chunk_size, n]`` member
        outputs (a plain function, keyed by identity, or a registered pytree callable such as
        :func:`kernels.maurey.wqk_cover_outputs`, whose arrays are dynamic).
      batch: the data ``outputs_fn`` reads (any pytree, ``None`` for none).
      key: PRNG key.
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_members: M (default ``outputs_fn.num_members``). Static.
      member_chunk_size: members per block (default min(M, 1024)). Static.
      chunk_size: sign vectors per chunk (memory ``chunk_size * (n + member_chunk_size) * itemsize``
        plus ``member_chunk_size * n`` outputs); None for one at a time; ``"auto"``: the default on
        a CPU; on a GPU or TPU :func:`kernels._backend.default_chunk_size`
        ``("signs", size=n + member_chunk_size)``. Does not change the draws.
      delta: confidence of the McDiarmid interval (b = max |V|), None for none.

    Returns:
      Estimate with the McDiarmid $(1-\delta)$ interval.

    Raises:
      ValueError: on bad sizes, key, data or outputs, or non-finite outputs (also under ``jit``).

    >>> import jax, jax.numpy as jnp
    >>> V = jnp.array([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])  # all of {+-1}^2
    >>> est = rademacher_finite(lambda i, v: v[i], V, jax.random.key(0), num_samples=4,
    ...     num_members=4)
    >>> float(est.mean)  # max_j <s, V_j> / 2 = 1 for every s
    1.0
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    chain = CheckChain()
    sup, first = _finite_sup(outputs_fn, batch, num_members, member_chunk_size, chain)
    size = sup.num_examples + sup.member_chunk_size
    chunk_size = _auto_chunk(chunk_size, 256, "signs", size, sup.dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="outputs_fn")
    return _exact_sup_estimate(sup, key, lambda: sup.bound_from(first), chain=chain, **kw)


def _search_estimate(
    sup: SearchSup | ReadoutSearchSup,
    key: jax.Array,
    output_bound: Any,
    *,
    num_samples: int,
    chunk_size: int | None,
    delta: float | None,
    name: str = "apply_fn",
    chain: CheckChain,
) -> Estimate:
    """Search estimate; with ``output_bound``, its interval if no visited |f(x_i)| exceeds it."""
    if output_bound is not None:
        chain.positive(output_bound, "output_bound")
    b = None if output_bound is None or delta is None else jnp.asarray(output_bound, sup.dtype)

    def per_draw(signs: jax.Array) -> jax.Array:
        value, top = sup.search(signs)
        return value[None] if b is None else jnp.stack([value, (top > b).astype(sup.dtype)])

    kw = dict(num_samples=num_samples, chunk_size=chunk_size, name=name, chain=chain)
    stats = _draw_statistics(per_draw, key, sup, **kw)
    est = _estimate(stats, 0)
    if b is None:
        return est
    # the fraction of draws that exceeded b, as a count (exact up to 2**24 draws in float32,
    # clipped to int32 for the message; zero exactly when no draw exceeded it)
    count = jnp.minimum(jnp.round(stats.mean[1] * num_samples), jnp.asarray(2.0**31 - 1, sup.dtype))
    exceeded = jnp.where(stats.mean[1] > 0, jnp.maximum(count, 1), 0).astype(jnp.int32)
    chain.require(
        exceeded == 0,
        "output_bound: {} is exceeded by |f(x_i)| at parameters the search visited, for {} of "
        f"the {num_samples} sign vectors; it must bound every output of the class",
        b,
        exceeded,
    )
    valid = jnp.logical_and(exceeded == 0, jnp.logical_and(jnp.isfinite(b), b > 0))
    return _with_interval(
        est, b, num_examples=sup.num_examples, delta=delta, one_sided=True, valid=valid
    )


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_search(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_samples: int,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    chunk_size: int | Literal["auto"] | None = 8,
    init_scale: Any = 1.0,
    output_bound: Any = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""A Monte Carlo **lower bound** on the Rademacher complexity of a constrained network class.

    Averages over K sign vectors the best $\frac1n\sum_i\sigma_i f_\theta(x_i)$ over the feasible
    iterates of projected gradient ascent (:func:`search_sup`): **at most** $\mathrm{Rad}_S$ in
    expectation; stderr over sign vectors. ``lower`` (given ``output_bound`` $b \ge |f_\theta(x_i)|$
    on $\Theta$): one-sided $(1-\delta)$ McDiarmid bound, ``upper`` $= \infty$; a visited
    $|f_\theta(x_i)| > b$ raises (also in ``jit``); runtime checks off: ``lower = -inf``.

    Args:
      apply_fn: ``(params, inputs) -> [n]`` (or ``[n, 1]``) outputs; keyed by identity.
      params: float32/float64 parameters; the first start and the structure of the class.
      inputs: the sample (any pytree; integer leaves allowed).
      key: PRNG key (sign vectors and random restarts).
      project: Euclidean projection onto the constraint set; keyed by identity.
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_steps: ascent steps. Static.
      step_size: first normalised step length eta_0 > 0, decaying to eta_0 / 100.
      num_restarts: starts per sign vector. Static.
      chunk_size: sign vectors vmapped at once (memory: ``chunk_size * num_restarts`` parameter
        copies and forward/backward passes on all n examples); None: one at a time; ``"auto"``: the
        default on a CPU; on a GPU or TPU :func:`kernels._backend.default_chunk_size`
        ``("probes", size=parameters * num_restarts)``.
      init_scale: relative scale > 0 of random restarts.
      output_bound: b > 0 for the McDiarmid lower confidence bound (optional).
      delta: its confidence (None for no interval).

    Returns:
      Estimate (``lower`` with ``output_bound`` and ``delta``).

    Raises:
      ValueError: bad sizes, key, dtypes, outputs; non-finite data; step_size/output_bound <= 0.

    >>> import jax, jax.numpy as jnp, kernels.norms as kn
    >>> est = rademacher_search(lambda w, x: x @ w, jnp.zeros(4), jnp.eye(4), jax.random.key(0),
    ...     project=lambda w: kn.project_lp_ball(w, p=2, radius=1.0), num_samples=4, num_steps=5,
    ...     step_size=2.0)
    >>> round(float(est.mean), 6)  # the exact sup is ||s||_2 / 4 = 0.5 for every s
    0.5
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    options = (project, num_steps, step_size, num_restarts, init_scale)
    chain = CheckChain()
    sup = _search_sup(apply_fn, params, inputs, _restart_key(key), *options, chain)
    size, dtype = tree_size(params)
    chunk_size = _auto_chunk(chunk_size, 8, "probes", size * num_restarts, dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, chain=chain)
    return _search_estimate(sup, key, output_bound, **kw)


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_readout_search(
    features_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    readout_norm: float,
    readout_radius: Any,
    num_samples: int,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    chunk_size: int | Literal["auto"] | None = 8,
    init_scale: Any = 1.0,
    output_bound: Any = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""A Monte Carlo **lower bound** on Rademacher complexity, readout sup in closed form.

    For the class $\{x \mapsto w^\top\phi_V(x) : V\in\mathcal V, \|w\|_q\le B\}$ averages
    over K sign vectors

    $$\max_{\text{iterates } V}\ \frac Bn\Big\|\sum_{i=1}^n\sigma_i\phi_V(x_i)\Big\|_{q^*}
    \;\le\; \sup_{V, \|w\|_q\le B}\frac1n\sum_i\sigma_i w^\top\phi_V(x_i)$$

    ($q^*$ the dual exponent), ascending over the inner parameters V only
    (:func:`readout_search_sup`): the same lower-bound semantics, standard error over sign
    vectors, interval, chunking and checks as :func:`rademacher_search` on
    ``apply_fn = lambda (V, w), x: features_fn(V, x) @ w``, with one parameter block fewer to
    search and the best readout for every V visited. **At most** $\mathrm{Rad}_S$ in
    expectation; exact (unbiased) when the features do not depend on V. ``lower`` (given
    ``output_bound`` $b \ge B\|\phi_V(x_i)\|_{q^*}$ on $\mathcal V$): one-sided $(1-\delta)$
    McDiarmid bound; a visited $B\|\phi_V(x_i)\|_{q^*} > b$ raises (also in ``jit``).

    Args:
      features_fn: ``(params, inputs) -> [n, k]`` features; keyed by identity.
      params: float32/float64 inner parameters V; the first start and the structure of
        $\mathcal V$.
      inputs: the sample (any pytree; integer leaves allowed).
      key: PRNG key (sign vectors and random restarts).
      project: Euclidean projection of V onto $\mathcal V$; keyed by identity.
      readout_norm: q in [1, inf], the norm of the readout ball. Static.
      readout_radius: B > 0, its radius (float, or array scalar to vary it without recompiling).
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_steps: ascent steps. Static.
      step_size: first normalised step length eta_0 > 0, decaying to eta_0 / 100.
      num_restarts: starts per sign vector. Static.
      chunk_size: sign vectors vmapped at once (memory: ``chunk_size * num_restarts`` copies of
        V and forward/backward passes of ``features_fn`` on all n examples); None: one at a
        time; ``"auto"``: the default on a CPU; on a GPU or TPU
        :func:`kernels._backend.default_chunk_size`
        ``("probes", size=parameters * num_restarts)``.
      init_scale: relative scale > 0 of random restarts.
      output_bound: b > 0 for the McDiarmid lower confidence bound (optional).
      delta: its confidence (None for no interval).

    Returns:
      Estimate (``lower`` with ``output_bound`` and ``delta``).

    Raises:
      ValueError: readout_norm not in [1, inf]; readout_radius, step_size or output_bound
        <= 0; bad sizes, key, dtypes, features; non-finite data.

    >>> import jax, jax.numpy as jnp
    >>> est = rademacher_readout_search(lambda v, x: x, jnp.zeros(1), jnp.eye(4),
    ...     jax.random.key(0), project=lambda v: v, readout_norm=2, readout_radius=1.0,
    ...     num_samples=4, num_steps=1, step_size=1.0)
    >>> float(est.mean)  # fixed features: the exact sup ||s||_2 / 4 = 0.5 for every s
    0.5
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    options = (project, readout_norm, readout_radius, num_steps, step_size, num_restarts)
    chain = CheckChain()
    sup = _readout_search_sup(
        features_fn, params, inputs, _restart_key(key), *options, init_scale, chain
    )
    size, dtype = tree_size(params)
    chunk_size = _auto_chunk(chunk_size, 8, "probes", size * num_restarts, dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="features_fn")
    return _search_estimate(sup, key, output_bound, chain=chain, **kw)


def _exact_size(sup: Any, num_examples: Any) -> int:
    known = getattr(sup, "num_examples", None)
    if num_examples is None:
        if known is None:
            raise ValueError("num_examples: required when sup has no num_examples attribute")
        num_examples = known
    n = check_positive_int(num_examples, "num_examples")
    if known is not None and known != n:
        raise ValueError(f"num_examples: sup has {known} examples, got num_examples={n}")
    if n > _MAX_EXACT_EXAMPLES:
        raise ValueError(f"num_examples: enumeration needs n <= {_MAX_EXACT_EXAMPLES}, got {n}")
    return n


@compile_once
def rademacher_exact(
    sup: Callable[[jax.Array], jax.Array],
    *,
    num_examples: int | None = None,
    chunk_size: int | Literal["auto"] | None = 4096,
    dtype: Any = None,
) -> Estimate:
    r"""Exact empirical Rademacher average by enumerating all $2^n$ sign vectors ($n \le 20$).

    $$\mathrm{Rad}_S = 2^{-n}\sum_{\sigma\in\{\pm1\}^n} \mathrm{sup}(\sigma)$$ for any sup object
    of this module (:class:`LinearSup`, :class:`FiniteSup`; with :class:`SearchSup` it is the
    exact average of the search lower bound) or a function ``signs[c, n] -> values[c]``. Sign
    vector $t$ has $\sigma_i = -1$ iff bit $i$ of $t$ is set. The reference of the tests.

    Args:
      sup: a sup object or function of ``signs[c, n]``.
      num_examples: n <= 20 (default ``sup.num_examples``). Static.
      chunk_size: sign vectors per batch (memory ``chunk_size * n * itemsize`` signs plus the
        sup's own); None for one at a time; ``"auto"``: the default on a CPU; on a GPU or TPU
        :func:`kernels._backend.default_chunk_size`
        ``("signs", size=n)``.
      dtype: float32/float64 dtype of the signs (default ``sup.dtype``, else the default float).

    Returns:
      Estimate(mean, stderr=0, num_samples=2^n).

    Raises:
      ValueError: if n > 20 or not positive, on a bad chunk size or dtype, or if the sup is
        non-finite at some sign vector (also under ``jit``).

    >>> import jax.numpy as jnp
    >>> est = rademacher_exact(linear_sup(jnp.eye(3), norm=1, radius=1.0))
    >>> round(float(est.mean), 6)  # ||s||_inf / 3
    0.333333
    """
    n = _exact_size(sup, num_examples)
    dtype = getattr(sup, "dtype", None) if dtype is None else dtype
    dtype = _check_float_dtype(jnp.result_type(float) if dtype is None else dtype, "dtype")
    total = 2**n
    chunk = _auto_chunk(_check_chunk(chunk_size), 4096, "signs", n, dtype)
    chunk = min(1 if chunk is None else chunk, total)
    bits = jnp.arange(n, dtype=jnp.uint32)
    one = jnp.ones((), dtype)

    def one_chunk(c: jax.Array) -> tuple[jax.Array, jax.Array]:
        t = c.astype(jnp.uint32) * jnp.uint32(chunk) + jnp.arange(chunk, dtype=jnp.uint32)
        signs = jnp.where(((t[:, None] >> bits[None, :]) & jnp.uint32(1)) == 1, -one, one)
        vals = jnp.asarray(sup(signs)).astype(dtype)
        real = t < jnp.uint32(total)
        bad = jnp.sum(jnp.logical_and(real, ~jnp.isfinite(vals)))
        return jnp.sum(jnp.where(real, vals, 0)), bad

    sums, bad = jax.lax.map(one_chunk, jnp.arange(-(-total // chunk), dtype=jnp.int32))
    check_that(
        jnp.sum(bad) == 0, f"sup: non-finite at {{}} of the {total} sign vectors", jnp.sum(bad)
    )
    mean = jnp.sum(sums) / jnp.asarray(total, dtype)
    return Estimate(mean=mean, stderr=jnp.zeros_like(mean), num_samples=total)
