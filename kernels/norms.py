r"""Group, operator and Schatten norms of matrices and parameter trees, and ball projections.

Conventions follow the papers (Trauger & Tewari 2024; Edelman et al. 2022):
$\|W\|_{q,p}$ is the $p$-norm of the vector of column $q$-norms,

$$\|W\|_{q,p} = \Big\|\big(\|W_{:,1}\|_q, \dots, \|W_{:,k}\|_q\big)\Big\|_p,$$

so $\|W\|_{1,\infty}$ is the largest column $\ell_1$ norm, $\|W\|_{2,1}$ the sum of column
$\ell_2$ norms, $\|W\|_{2,2}$ the Frobenius norm. Operator norms are the induced
$\|W\|_{p\to p} = \sup_{x\ne0}\|Wx\|_p/\|x\|_p$ for $p \in \{1, 2, \infty\}$; Schatten norms are
$\ell_p$ norms of the singular values (rank at $p = 0$).

Tree versions apply a matrix norm to every leaf of a parameter pytree and return a pytree of
scalars. A leaf with ``ndim < 2`` is read as one column (shape ``(n, 1)``); a leaf with
``ndim > 2`` as the matrix ``(prod(shape[:split_axis]), prod(shape[split_axis:]))``
(``split_axis=1`` by default: the input axis against all the rest, e.g. a Flax attention
kernel ``(in, heads, head_dim)`` becomes ``(in, heads * head_dim)``).

Projections are Euclidean (nearest point in Frobenius distance), exact, and jit/vmap friendly.
Each projection is compiled once per (shape, dtype, static options): a Python float ``radius``
is static (a new value compiles again), an array ``radius`` is traced.

Inputs: norms take real arrays (integer and boolean arrays are read in the default float
dtype); projections take float32/float64 arrays (their output has the input's dtype). Empty
arrays and float16/bfloat16 inputs are refused with a ``ValueError`` naming the argument (their
sums overflow and round too early for a norm to mean anything). A projection's ``radius`` may be
traced: a non-positive or non-finite radius, and NaN or infinite entries of the projected array,
raise an error eagerly and inside ``jax.jit`` (see :mod:`kernels._checks`; turned off with
``kernels.set_runtime_checks(False)``). The spectral and Schatten norms (the rank at ``p=0``
included) also check their input the same way: an SVD of a NaN or infinite matrix gives NaN, and
a NaN matrix would count as rank 0.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from kernels._checks import check_finite, check_that, describe, is_concrete, real_number
from kernels._devices import keep_sharding
from kernels._jit import compile_once
from kernels._names import warn_renamed
from kernels._ordered import CheckChain
from kernels._pow2 import ldexp_exact as ldexp_exact
from kernels._pow2 import pow2_exponent as pow2_exponent
from kernels._pow2 import pow2_factors

__all__ = [
    "as_matrix",
    "dual_exponent",
    "group_norm",
    "operator_norm",
    "project_group_ball",
    "project_l1_ball",
    "project_lp_ball",
    "project_schatten_ball",
    "project_spectral_ball",
    "schatten_norm",
    "spectral_norm",
    "tree_group_norms",
    "tree_norm",
    "tree_operator_norms",
    "tree_project_lp_ball",
    "tree_schatten_norms",
    "vector_norm",
]


def _check_exponent(p: Any, name: str, *, allow_zero: bool = False) -> float:
    """``p`` as a float in [1, inf] (or 0): a Python or NumPy real number, never an array."""
    value = real_number(p)
    lo = "{0} or [1, inf]" if allow_zero else "[1, inf]"
    if value is None:
        raise ValueError(
            f"{name}: expected a Python or NumPy number in {lo}, got {describe(p)} (an exponent "
            "is static: not a string, nor an array)"
        )
    if math.isnan(value) or not (value >= 1 or (allow_zero and value == 0)):
        raise ValueError(f"{name}: expected a number in {lo}, got {describe(p)}")
    return value


def _real_dtype_error(name: str, dtype: Any) -> ValueError:
    return ValueError(
        f"{name}: expected a real float32 or float64 array, got dtype {dtype} (float16 and "
        "bfloat16 lose too much precision in sums; cast to float32)"
    )


def _norm_input(x: Any, name: str) -> jax.Array:
    """``x`` as a non-empty real floating array (ints and bools in the default float dtype)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.bool_):
        x = x.astype(jnp.result_type(float))
    if x.dtype not in (jnp.float32, jnp.float64):
        raise _real_dtype_error(name, x.dtype)
    if x.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {x.shape}")
    return x


def _projection_input(v: Any, name: str, chain: CheckChain) -> jax.Array:
    """``v`` as a non-empty float32/float64 array with finite entries (runtime check in ``chain``).

    The checks of a projection (its input, then its radius) form an ordered chain
    (:mod:`kernels._ordered`): when both are bad, the input is the one named on every backend.
    """
    v = jnp.asarray(v)
    if v.dtype not in (jnp.float32, jnp.float64):
        raise _real_dtype_error(name, v.dtype)
    if v.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {v.shape}")
    chain.finite(v, name)
    return v


def _radius(radius: Any, dtype: Any, chain: CheckChain) -> jax.Array:
    """The radius in ``dtype``, checked > 0 and finite (eagerly, under jit, once under vmap)."""
    chain.positive(radius, "radius")
    return jnp.asarray(radius, dtype=dtype)


def dual_exponent(p: float) -> float:
    r"""The Hölder conjugate $p^*$ with $1/p + 1/p^* = 1$ ($1^* = \infty$, $\infty^* = 1$).

    Raises:
      ValueError: if ``p`` is not in [1, inf].

    >>> dual_exponent(1), dual_exponent(2), dual_exponent(float("inf")), dual_exponent(4)
    (inf, 2.0, 1.0, 1.3333333333333333)
    """
    p = _check_exponent(p, "p")
    if p == 1:
        return math.inf
    if math.isinf(p):
        return 1.0
    return p / (p - 1)


def _scaled_l2_norm(a: jax.Array, axis: Any = None) -> jax.Array:
    """Euclidean norm of ``a`` along ``axis``, scaled by a power of two: no overflow/underflow."""
    down, up = pow2_factors(jnp.max(jnp.abs(a), axis=axis, keepdims=True))
    s = a * down
    out = jnp.sqrt(jnp.sum(s * s, axis=axis, keepdims=True)) * up
    return out.reshape(()) if axis is None else jnp.squeeze(out, axis=axis)


def _plain_sum_is_safe(total: jax.Array, size: int) -> jax.Array:
    """Whether a plain sum of ``size`` squares is accurate.

    It is when finite and so far above the smallest normal number that squares flushed to zero
    weigh below its rounding.
    """
    info = jnp.finfo(total.dtype)
    floor = float(info.tiny) / float(info.eps) * size
    return jnp.logical_and(jnp.isfinite(total), total >= jnp.asarray(floor, total.dtype))


def _l2_norm(a: jax.Array, axis: Any = None) -> jax.Array:
    """Euclidean norm of ``a`` along ``axis`` that neither overflows nor underflows.

    Over all entries (``axis=None``): the plain ``sqrt(sum(a * a))`` (one pass) unless that sum
    overflowed or came near the underflow range, then the power-of-two-scaled norm (the branch
    is a ``lax.cond``: under ``vmap`` both are computed). The scaled norm rounds exactly like
    the plain one in the normal range, so the branch changes nothing but the boundary cases.
    """
    if axis is not None:
        return _scaled_l2_norm(a, axis)
    return _whole_l2_norm(a)


@jax.jit
def _whole_l2_norm(a: jax.Array) -> jax.Array:
    """:func:`_l2_norm` over all entries, jitted.

    An eager call compiles once per shape (an eager ``lax.cond`` of fresh closures compiled anew
    on every call).
    """
    total = jnp.sum(a * a)
    safe = _plain_sum_is_safe(total, a.size)
    return jax.lax.cond(safe, lambda: jnp.sqrt(total), lambda: _scaled_l2_norm(a))


def _lp(x: jax.Array, p: float, axis: Any = None) -> jax.Array:
    """p-norm of ``x`` along ``axis`` (all entries when None), p in [1, inf]."""
    a = jnp.abs(x)
    if math.isinf(p):
        return jnp.max(a, axis=axis)
    if p == 1:
        return jnp.sum(a, axis=axis)
    if p == 2:
        return _l2_norm(a, axis=axis)
    # scale by the max entry so large p does not overflow
    m = jnp.max(a, axis=axis, keepdims=True)
    safe = jnp.where(m > 0, m, jnp.ones_like(m))
    s = jnp.sum((a / safe) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    return jnp.squeeze(s * m, axis=axis) if axis is not None else (s * m).reshape(())


def vector_norm(x: jax.Array, p: float = 2, *, axis: int | None = None) -> jax.Array:
    r"""$\|x\|_p = (\sum_i |x_i|^p)^{1/p}$ over all entries of ``x`` ($\max_i |x_i|$ at $p=\infty$).

    Scaled so that it neither overflows nor underflows where the norm itself is representable:
    at $p = 2$ by a power of two (exact: the same rounding as the plain formula where that does
    not overflow), for other $1 < p < \infty$ by the largest entry. In float32,
    $\|(3\cdot10^{19}, 4\cdot10^{19})\|_2 = 5\cdot10^{19}$ (the plain sum of squares is inf) and
    $\|(3\cdot10^{-20}, 4\cdot10^{-20})\|_2 = 5\cdot10^{-20}$ (not 0).

    Args:
      x: array of any shape (all entries are one vector unless ``axis`` is given).
      p: exponent in [1, inf]. Static.
      axis: if given, the norm is taken along this axis only (one norm per slice).

    Returns:
      Scalar (or array without ``axis``) in the dtype of ``x``.

    Raises:
      ValueError: if ``p`` is not in [1, inf], ``x`` is empty or float16/bfloat16, or ``axis``
        is not an axis of ``x``.

    >>> import jax.numpy as jnp
    >>> float(vector_norm(jnp.array([3.0, -4.0]), 2)), float(vector_norm(jnp.array([3.0, -4.0]), 1))
    (5.0, 7.0)
    >>> vector_norm(jnp.array([3e19, 4e19])), vector_norm(jnp.array([3e-20, 4e-20]))
    (Array(5.e+19, dtype=float32), Array(5.e-20, dtype=float32))
    """
    x = _norm_input(x, "x")
    p = _check_exponent(p, "p")
    if axis is not None:
        if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
            raise ValueError(f"axis: expected an int or None, got {describe(axis)}")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis: expected an axis of x in [-{x.ndim}, {x.ndim}), got {axis}")
        axis = int(axis)
    return _lp(x, p, axis=axis)


def as_matrix(w: jax.Array, *, split_axis: int = 1) -> jax.Array:
    """View ``w`` as a matrix: ``ndim < 2`` as one column, ``ndim > 2`` split at ``split_axis``.

    Raises:
      ValueError: if ``split_axis`` is not in [1, ndim - 1] for ``ndim > 2``.
    """
    w = jnp.asarray(w)
    if w.ndim == 2:
        return w
    if w.ndim < 2:
        return w.reshape(-1, 1)
    if not 1 <= split_axis < w.ndim:
        raise ValueError(f"split_axis: expected 1 <= split_axis < {w.ndim}, got {split_axis}")
    return w.reshape(math.prod(w.shape[:split_axis]), -1)


def _check_matrix(w: Any, name: str = "w") -> jax.Array:
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {w.shape}")
    return _norm_input(w, name)


def group_norm(w: jax.Array, *, q: float, p: float) -> jax.Array:
    r"""Group norm $\|W\|_{q,p}$: the $p$-norm of the column $q$-norms of ``w``.

    $$\|W\|_{q,p} = \Big(\sum_j \big(\sum_i |W_{ij}|^q\big)^{p/q}\Big)^{1/p}.$$

    Args:
      w: matrix ``(n, k)``; its k columns are the groups.
      q: within-column exponent in [1, inf]. Static.
      p: across-column exponent in [1, inf]. Static.

    Returns:
      Scalar.

    Raises:
      ValueError: if ``w`` is not a non-empty 2-D real matrix or an exponent is not in [1, inf].

    References:
      Trauger & Tewari 2024, arXiv:2312.06786 (notation); Bartlett, Foster, Telgarsky 2017.

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1.0, -2.0], [3.0, 4.0]])
    >>> float(group_norm(w, q=1, p=float("inf"))), float(group_norm(w, q=1, p=1))
    (6.0, 10.0)
    """
    w = _check_matrix(w)
    q = _check_exponent(q, "q")
    p = _check_exponent(p, "p")
    return _lp(_lp(w, q, axis=0), p)


def spectral_norm(w: jax.Array) -> jax.Array:
    r"""Spectral norm $\|W\|_2 = \sigma_{\max}(W)$ (exact, by SVD).

    Raises:
      ValueError: if ``w`` is not 2-D, or has a NaN or infinite entry (eagerly and under
        ``jit``).

    >>> import jax.numpy as jnp
    >>> float(spectral_norm(jnp.diag(jnp.array([3.0, -5.0]))))
    5.0
    """
    w = _check_matrix(w)
    check_finite(w, "w")
    return jnp.linalg.svd(w, compute_uv=False)[0]


def operator_norm(w: jax.Array, *, p: float) -> jax.Array:
    r"""Induced norm $\|W\|_{p\to p} = \sup_{x \ne 0} \|Wx\|_p / \|x\|_p$, $p \in \{1, 2, \infty\}$.

    $p=1$: largest absolute column sum; $p=2$: largest singular value; $p=\infty$: largest
    absolute row sum. All exact. ``p=2`` is deprecated: the spectral norm has one name,
    :func:`spectral_norm` (``p=2`` warns and is removed in 0.3).

    Raises:
      ValueError: if ``w`` is not 2-D or ``p`` is not 1, 2 or inf.

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1.0, -2.0], [3.0, 4.0]])
    >>> float(operator_norm(w, p=1)), float(operator_norm(w, p=float("inf")))
    (6.0, 7.0)
    """
    w = _check_matrix(w)
    p = _check_exponent(p, "p")
    _warn_spectral("operator_norm", p, 2.0)
    return _operator_norm(w, p)


def _warn_spectral(name: str, p: float, spectral: float, stacklevel: int = 2) -> None:
    """Warn that ``name(w, p=spectral)`` is :func:`spectral_norm` under another name."""
    if p == spectral:
        shown = "inf" if math.isinf(spectral) else f"{spectral:g}"
        warn_renamed(f"{name}(w, p={shown})", "spectral_norm(w)", stacklevel + 1)


def _operator_norm(w: jax.Array, p: float) -> jax.Array:
    if p == 1:
        return jnp.max(jnp.sum(jnp.abs(w), axis=0))
    if p == 2:
        return spectral_norm(w)
    if math.isinf(p):
        return jnp.max(jnp.sum(jnp.abs(w), axis=1))
    raise ValueError(f"p: operator norms are implemented for p in (1, 2, inf), got {p!r}")


def schatten_norm(w: jax.Array, *, p: float, rtol: float | None = None) -> jax.Array:
    r"""Schatten-$p$ norm $(\sum_i \sigma_i(W)^p)^{1/p}$; the rank at $p = 0$.

    $p=1$ nuclear, $p=2$ Frobenius, $p=\infty$ spectral (deprecated at ``p=inf``: use
    :func:`spectral_norm`; it warns and is removed in 0.3). At $p=0$ returns the number of
    singular values above ``rtol * sigma_max`` (default ``rtol = max(n, k) * eps``, numpy's
    ``matrix_rank`` rule) as an integer array.

    Args:
      w: matrix.
      p: 0 or a number in [1, inf]. Static.
      rtol: relative threshold for the rank, finite and >= 0 (only used at p = 0; may be
        traced).

    Raises:
      ValueError: if ``w`` is not 2-D, ``p`` is out of range, ``rtol`` is not a finite number
        >= 0, or ``w`` has a NaN or infinite entry (the last two also under ``jit``).

    >>> import jax.numpy as jnp
    >>> w = jnp.diag(jnp.array([3.0, 4.0, 0.0]))
    >>> float(schatten_norm(w, p=1)), float(schatten_norm(w, p=2)), int(schatten_norm(w, p=0))
    (7.0, 5.0, 2)
    """
    w = _check_matrix(w)
    p = _check_exponent(p, "p", allow_zero=True)
    _check_rtol(rtol)
    _warn_spectral("schatten_norm", p, math.inf)
    return _schatten_norm(w, p, rtol)


def _check_rtol(rtol: Any) -> None:
    """``rtol`` is None or a real scalar, finite and >= 0 (a traced one checked at run time)."""
    if rtol is None:
        return
    expected = "rtol: expected None or a finite number >= 0, got"
    real = isinstance(rtol, int | float | np.integer | np.floating | np.ndarray | jax.Array)
    if (
        isinstance(rtol, bool | np.bool_)
        or not real
        or jnp.shape(rtol) != ()
        or jnp.result_type(rtol).kind not in "iuf"
    ):
        raise ValueError(f"{expected} {describe(rtol)}")
    if is_concrete(rtol):
        value = float(rtol)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{expected} {describe(rtol)}")
        return
    check_that(
        jnp.logical_and(jnp.isfinite(rtol), rtol >= 0), f"{expected} a negative or non-finite value"
    )


def _schatten_norm(w: jax.Array, p: float, rtol: float | None) -> jax.Array:
    check_finite(w, "w")
    s = jnp.linalg.svd(w, compute_uv=False)
    if p == 0:
        tol = rtol if rtol is not None else max(w.shape) * float(jnp.finfo(w.dtype).eps)
        return jnp.sum(s > jnp.asarray(tol, s.dtype) * s[0])
    return _lp(s, p)


def _tree_matrix_map(fn: Any, tree: Any, split_axis: int) -> Any:
    return jax.tree_util.tree_map(lambda leaf: fn(as_matrix(leaf, split_axis=split_axis)), tree)


def tree_norm(tree: Any, *, p: float = 2) -> jax.Array:
    r"""$\ell_p$ norm of all entries of a parameter pytree taken as one vector.

    Leaves of size 0 contribute nothing. At $p = 2$: one pass, the plain sum of the leaves'
    squares, unless it overflows or nears the underflow range; then all leaves are rescaled by
    one power of two (exact) first, so the norm is right wherever it is representable.

    Raises:
      ValueError: if ``p`` is not in [1, inf], the tree has no entries, or a leaf is
        float16/bfloat16.

    >>> import jax.numpy as jnp
    >>> float(tree_norm({"a": jnp.array([3.0]), "b": jnp.array([[4.0]])}))
    5.0
    >>> tree_norm({"a": jnp.array([3e20]), "b": jnp.array([4e20])})  # squares overflow float32
    Array(5.e+20, dtype=float32)
    """
    p = _check_exponent(p, "p")
    leaves = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
    leaves = [_norm_input(leaf, "tree") for leaf in leaves if leaf.size > 0]
    if not leaves:
        raise ValueError("tree: expected at least one non-empty array leaf")
    if p == 2 and len({leaf.dtype for leaf in leaves}) == 1:
        return _tree_l2(leaves)
    parts = jnp.stack([_lp(leaf, p) for leaf in leaves])
    return _lp(parts, p)


@jax.jit
def _tree_l2(leaves: list[jax.Array]) -> jax.Array:
    """Euclidean norm of all entries of ``leaves`` (one dtype): one fused pass in the safe range.

    Jitted, so an eager call compiles once per structure and shapes.
    """
    total = sum(jnp.sum(leaf * leaf) for leaf in leaves)
    size = sum(leaf.size for leaf in leaves)

    def scaled() -> jax.Array:
        top = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)) for leaf in leaves]))
        down, up = pow2_factors(top)
        return jnp.sqrt(sum(jnp.sum(jnp.square(leaf * down)) for leaf in leaves)) * up

    return jax.lax.cond(_plain_sum_is_safe(total, size), lambda: jnp.sqrt(total), scaled)


def tree_group_norms(tree: Any, *, q: float, p: float, split_axis: int = 1) -> Any:
    r"""$\|W\|_{q,p}$ of every leaf (see the module docstring for how leaves become matrices).

    >>> import jax.numpy as jnp
    >>> tree_group_norms({"w": jnp.ones((2, 3)), "b": jnp.ones(4)}, q=1, p=1)["w"].item()
    6.0
    """
    return _tree_matrix_map(lambda m: group_norm(m, q=q, p=p), tree, split_axis)


def tree_operator_norms(tree: Any, *, p: float, split_axis: int = 1) -> Any:
    r"""$\|W\|_{p\to p}$ of every leaf (see the module docstring for how leaves become matrices)."""
    p = _check_exponent(p, "p")
    return _tree_matrix_map(lambda m: _operator_norm(_check_matrix(m), p), tree, split_axis)


def tree_schatten_norms(
    tree: Any, *, p: float, rtol: float | None = None, split_axis: int = 1
) -> Any:
    r"""Schatten-$p$ norm (rank at $p=0$) of every leaf, leaves read as matrices."""
    p = _check_exponent(p, "p", allow_zero=True)
    _check_rtol(rtol)
    return _tree_matrix_map(lambda m: _schatten_norm(_check_matrix(m), p, rtol), tree, split_axis)


# --------------------------------------------------------------------------- projections


def _l1(v: jax.Array, r: jax.Array) -> jax.Array:
    r"""Projection of all entries of ``v`` onto the l1 ball of radius ``r`` (unchecked).

    Sorted magnitudes $u_0 \ge u_1 \ge \dots$ are taken relative to the largest,
    $d_j = u_j - u_0 \le 0$, so the threshold $\theta = u_0 + \theta'$ with
    $\theta' = (\sum_{j \le \rho} d_j - r)/(\rho + 1)$ and the result
    $|x_i| = \max(|v_i| - u_0 - \theta', 0)$ keep ``r`` even when it is below the rounding
    of $u_0$ (``[5e30, 1]`` onto the unit ball is ``[1, 0]``, not ``[0, 0]``).
    """
    flat = v.reshape(-1)
    a = jnp.abs(flat)
    u = jnp.sort(a)[::-1]
    d = u - u[0]
    csd = jnp.cumsum(d)
    j = jnp.arange(1, u.shape[0] + 1, dtype=v.dtype)
    cond = d - (csd - r) / j > 0
    rho = jnp.max(jnp.where(cond, jnp.arange(u.shape[0]), 0))
    shift = (csd[rho] - r) / (rho + 1).astype(v.dtype)  # theta - u_0
    shift = jnp.maximum(shift, -u[0])  # theta >= 0
    out = jnp.sign(flat) * jnp.maximum((a - u[0]) - shift, jnp.zeros((), v.dtype))
    out = jnp.where(jnp.sum(a) <= r, flat, out)
    return out.reshape(v.shape)


def _l2(v: jax.Array, r: jax.Array) -> jax.Array:
    """Projection of all entries of ``v`` onto the l2 ball: ``v * min(1, r / ||v||_2)``.

    With ``v = 2**e u`` (exact power-of-two scaling): ``min(1, (r 2**-e) / ||u||_2)``, so a
    norm above the dtype's range still projects (the plain formula gave ``v * 0``). The square
    root is of a sum made positive where it is 0 (the double ``where``), so at ``v = 0`` the
    gradient is that of the identity, not NaN (both branches are differentiated under ``vmap``).
    """
    one = jnp.ones((), v.dtype)

    def factor(squares: jax.Array, radius: jax.Array) -> jax.Array:
        positive = squares > 0
        nrm = jnp.sqrt(jnp.where(positive, squares, one))
        return jnp.where(positive, jnp.minimum(one, radius / nrm), one)

    def plain() -> jax.Array:
        return factor(total, r)

    def scaled() -> jax.Array:
        down, _ = pow2_factors(jnp.max(jnp.abs(v)))
        u = v * down
        return factor(jnp.sum(u * u), r * down)

    total = jnp.sum(v * v)  # one pass; the scaled branch only past the safe range (lax.cond)
    return v * jax.lax.cond(_plain_sum_is_safe(total, v.size), plain, scaled)


def _lp_projection(v: jax.Array, p: float, r: jax.Array) -> jax.Array:
    """Projection onto the l_p ball, p in {1, 2, inf} (unchecked; ``p`` already validated)."""
    if p == 1:
        return _l1(v, r)
    if p == 2:
        return _l2(v, r)
    return jnp.clip(v, -r, r)


def _check_projection_exponent(p: Any, name: str, what: str) -> float:
    p = _check_exponent(p, name)
    if p not in (1.0, 2.0) and not math.isinf(p):
        raise ValueError(f"{name}: {what} are implemented for p in (1, 2, inf), got {p!r}")
    return p


@compile_once
def project_l1_ball(v: jax.Array, *, radius: Any) -> jax.Array:
    r"""Euclidean projection of ``v`` (all entries) onto $\{x : \|x\|_1 \le r\}$.

    $x_i = \mathrm{sign}(v_i)\max(|v_i| - \theta, 0)$ with $\theta \ge 0$ the smallest value
    making $\|x\|_1 \le r$, found exactly by sorting ($O(n \log n)$). ``v`` is returned
    unchanged when already inside.

    Args:
      v: float32/float64 array of any non-empty shape, finite.
      radius: r > 0, finite (may be traced).

    Returns:
      Array shaped like ``v``, in its dtype.

    Raises:
      ValueError: if ``v`` is empty or not float32/float64; if ``radius`` is not a finite
        value > 0 or ``v`` has a NaN/inf entry (runtime checks, also under ``jit``).

    References:
      Duchi, Shalev-Shwartz, Singer, Chandra 2008, doi:10.1145/1390156.1390191.

    >>> import jax.numpy as jnp
    >>> project_l1_ball(jnp.array([3.0, -1.0, 0.5]), radius=2.0).tolist()
    [2.0, -0.0, 0.0]
    """
    chain = CheckChain()
    v = _projection_input(v, "v", chain)
    return _l1(v, _radius(radius, v.dtype, chain))


@compile_once
def project_lp_ball(v: jax.Array, *, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection of ``v`` (all entries) onto the $\ell_p$ ball, p in {1, 2, inf}.

    $p=1$: :func:`project_l1_ball`; $p=2$: $v \min(1, r/\|v\|_2)$; $p=\infty$: clip to $[-r, r]$.

    Args:
      v: float32/float64 array of any non-empty shape, finite.
      p: 1, 2 or inf. Static.
      radius: r > 0, finite (may be traced).

    Returns:
      Array shaped like ``v``, in its dtype.

    Raises:
      ValueError: if ``p`` is not 1, 2 or inf, ``v`` is empty or not float32/float64; if
        ``radius`` is not a finite value > 0 or ``v`` has a NaN/inf entry (runtime checks).

    >>> import jax.numpy as jnp
    >>> project_lp_ball(jnp.array([3.0, 4.0]), p=2, radius=1.0)
    Array([0.6, 0.8], dtype=float32)
    """
    p = _check_projection_exponent(p, "p", "projections")
    chain = CheckChain()
    v = _projection_input(v, "v", chain)
    return _lp_projection(v, p, _radius(radius, v.dtype, chain))


_GROUP_CASES = "(1,inf), (2,inf), (inf,inf), (1,1), (2,2), (2,1)"


def _group_projection(w: jax.Array, q: float, p: float, r: jax.Array) -> jax.Array:
    """Projection onto the ||.||_{q,p} ball (unchecked; the case is known to be implemented)."""
    if math.isinf(p):
        return jax.vmap(lambda col: _lp_projection(col, q, r), in_axes=1, out_axes=1)(w)
    if (q, p) == (1.0, 1.0):
        return _l1(w, r)
    if (q, p) == (2.0, 2.0):
        return _l2(w, r)
    c = _l2_norm(w, axis=0)  # (q, p) == (2, 1): group lasso
    c_new = _l1(c, r)
    scale = jnp.where(c > 0, c_new / jnp.where(c > 0, c, jnp.ones_like(c)), jnp.zeros_like(c))
    return w * scale[None, :]


@compile_once
def project_group_ball(w: jax.Array, *, q: float, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection of a matrix onto $\{W : \|W\|_{q,p} \le r\}$.

    Implemented (exact) cases:

    - $(q,p) = (1,\infty)$, $(2,\infty)$, $(\infty,\infty)$: each column onto its $\ell_q$ ball;
    - $(1,1)$, $(2,2)$: entrywise $\ell_1$ / Frobenius ball;
    - $(2,1)$: the column norms $c$ are projected onto the $\ell_1$ ball, giving $c'$, and
      each column is rescaled by $c'_j / c_j$ (group-lasso projection).

    Args:
      w: float32/float64 matrix ``(n, k)``, non-empty and finite.
      q: within-column exponent. Static.
      p: across-column exponent. Static.
      radius: r > 0, finite (may be traced).

    Returns:
      Matrix shaped like ``w``, in its dtype.

    Raises:
      ValueError: for other $(q, p)$, if ``w`` is not a non-empty 2-D float32/float64 matrix;
        if ``radius`` is not a finite value > 0 or ``w`` has a NaN/inf entry (runtime checks).

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[3.0, 0.0], [0.0, 1.0]])
    >>> project_group_ball(w, q=1, p=float("inf"), radius=2.0).tolist()
    [[2.0, 0.0], [0.0, 1.0]]
    """
    if jnp.ndim(w) != 2:
        raise ValueError(f"w: expected a 2-D matrix, got shape {jnp.shape(w)}")
    q = _check_exponent(q, "q")
    p = _check_exponent(p, "p")
    cases = {(1.0, math.inf), (2.0, math.inf), (math.inf, math.inf), (1.0, 1.0), (2.0, 2.0)}
    if (q, p) not in cases | {(2.0, 1.0)}:
        raise ValueError(
            f"(q, p): projection onto the ||.||_{{q,p}} ball is implemented for {_GROUP_CASES}; "
            f"got ({q:g}, {p:g})"
        )
    chain = CheckChain()
    w = _projection_input(w, "w", chain)
    return _group_projection(w, q, p, _radius(radius, w.dtype, chain))


@compile_once
def project_schatten_ball(w: jax.Array, *, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection onto the Schatten-$p$ ball, $p \in \{1, 2, \infty\}$.

    With $W = U \operatorname{diag}(s) V^\top$: $W' = U \operatorname{diag}(P(s)) V^\top$, $P$ the
    projection of $s$ onto the $\ell_p$ ball (exact: unitarily invariant norms).

    Args:
      w: float32/float64 matrix, non-empty and finite.
      p: 1, 2 or inf. Static.
      radius: r > 0, finite (may be traced).

    Returns:
      Matrix shaped like ``w``, in its dtype.

    Raises:
      ValueError: if ``p`` is not 1, 2 or inf, ``w`` is not a non-empty 2-D float32/float64
        matrix; if ``radius`` is not a finite value > 0 or ``w`` has a NaN/inf entry (runtime
        checks).

    References:
      Lewis 1995, "The convex analysis of unitarily invariant matrix functions",
      J. Convex Anal. 2(1/2).

    >>> import jax.numpy as jnp
    >>> project_schatten_ball(jnp.diag(jnp.array([3.0, 1.0])), p=1, radius=2.0).round(6).tolist()
    [[2.0, 0.0], [0.0, 0.0]]
    """
    if jnp.ndim(w) != 2:
        raise ValueError(f"w: expected a 2-D matrix, got shape {jnp.shape(w)}")
    p = _check_projection_exponent(p, "p", "Schatten projections")
    chain = CheckChain()
    w = _projection_input(w, "w", chain)
    r = _radius(radius, w.dtype, chain)
    u, s, vt = jnp.linalg.svd(w, full_matrices=False)
    return (u * _lp_projection(s, p, r)[None, :]) @ vt


@compile_once
def project_spectral_ball(w: jax.Array, *, radius: Any) -> jax.Array:
    r"""Euclidean projection onto $\{W : \|W\|_2 \le r\}$: singular values clipped at $r$.

    Same arguments and errors as :func:`project_schatten_ball` with ``p=inf``.

    >>> import jax.numpy as jnp
    >>> project_spectral_ball(jnp.diag(jnp.array([3.0, 0.5])), radius=1.0).round(6).tolist()
    [[1.0, 0.0], [0.0, 0.5]]
    """
    return project_schatten_ball(w, p=math.inf, radius=radius)


@compile_once
def tree_project_lp_ball(tree: Any, *, p: float, radius: Any) -> Any:
    r"""Project a whole parameter pytree (all entries as one vector) onto the $\ell_p$ ball.

    Same arguments and errors as :func:`project_lp_ball`, with the pytree's leaves (one dtype)
    read as one vector ``v``.

    >>> import jax.numpy as jnp
    >>> out = tree_project_lp_ball({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, p=2, radius=1.0)
    >>> round(float(out["a"][0]), 6), round(float(out["b"][0]), 6)
    (0.6, 0.8)
    """
    flat, unravel = ravel_pytree(tree)
    # the projection keeps the sharding of placed leaves (an eager call on a user's mesh)
    return keep_sharding(unravel(project_lp_ball(flat, p=p, radius=radius)), tree)
