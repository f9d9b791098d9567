"""Exact sup oracles of the Rademacher estimators: linear classes under a norm, finite classes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_positive_int,
    describe,
    real_number,
)
from kernels._ordered import CheckChain
from kernels._signs import _check_float_array, _check_float_dtype, _check_float_tree, _check_signs
from kernels.norms import dual_exponent, ldexp_exact, pow2_exponent, pow2_factors, vector_norm

_MAX_MEMBERS = int(np.iinfo(np.int32).max)  # member indices are int32
_PRECISIONS = (None, "highest", "bf16x2")
_HIGHEST = jax.lax.Precision.HIGHEST


# --------------------------------------------------------------------------- linear classes


def _check_exponent(value: Any, prefix: str) -> float:
    """``value`` as a float in [1, inf]; else a ValueError starting with ``prefix``.

    A Python or NumPy real number (:func:`kernels._checks.real_number`): a string or an array
    is refused.
    """
    exponent = real_number(value)
    if exponent is None or math.isnan(exponent) or exponent < 1:
        raise ValueError(
            f"{prefix}expected an exponent in [1, inf] (a Python or NumPy number), got "
            f"{describe(value)}"
        )
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
    p = _check_exponent(norm, "norm: ")
    if readout is not None:
        raise ValueError("readout: only used with a matrix class norm=(q, p)")
    return p, None


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
