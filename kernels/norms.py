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
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

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
    try:
        value = float(p)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number in [1, inf], got {p!r}") from None
    low_ok = value >= 1 or (allow_zero and value == 0)
    if math.isnan(value) or not low_ok:
        lo = "{0} or [1, inf]" if allow_zero else "[1, inf]"
        raise ValueError(f"{name}: expected a number in {lo}, got {p!r}")
    return value


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


def _lp(x: jax.Array, p: float, axis: Any = None) -> jax.Array:
    """p-norm of ``x`` along ``axis`` (all entries when None), p in [1, inf]."""
    a = jnp.abs(x)
    if math.isinf(p):
        return jnp.max(a, axis=axis)
    if p == 1:
        return jnp.sum(a, axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axis))
    # scale by the max entry so large p does not overflow
    m = jnp.max(a, axis=axis, keepdims=True)
    safe = jnp.where(m > 0, m, jnp.ones_like(m))
    s = jnp.sum((a / safe) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    return jnp.squeeze(s * m, axis=axis) if axis is not None else (s * m).reshape(())


def vector_norm(x: jax.Array, p: float = 2, *, axis: int | None = None) -> jax.Array:
    r"""$\|x\|_p = (\sum_i |x_i|^p)^{1/p}$ over all entries of ``x`` ($\max_i |x_i|$ at $p=\infty$).

    Args:
      x: array of any shape (all entries are one vector unless ``axis`` is given).
      p: exponent in [1, inf]. Static.
      axis: if given, the norm is taken along this axis only (one norm per slice).

    Returns:
      Scalar (or array without ``axis``) in the dtype of ``x``.

    Raises:
      ValueError: if ``p`` is not in [1, inf].

    >>> import jax.numpy as jnp
    >>> float(vector_norm(jnp.array([3.0, -4.0]), 2)), float(vector_norm(jnp.array([3.0, -4.0]), 1))
    (5.0, 7.0)
    """
    return _lp(jnp.asarray(x), _check_exponent(p, "p"), axis=axis)


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
    return w


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
      ValueError: if ``w`` is not 2-D or an exponent is not in [1, inf].

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
      ValueError: if ``w`` is not 2-D.

    >>> import jax.numpy as jnp
    >>> float(spectral_norm(jnp.diag(jnp.array([3.0, -5.0]))))
    5.0
    """
    w = _check_matrix(w)
    return jnp.linalg.svd(w, compute_uv=False)[0]


def operator_norm(w: jax.Array, *, p: float) -> jax.Array:
    r"""Induced norm $\|W\|_{p\to p} = \sup_{x \ne 0} \|Wx\|_p / \|x\|_p$, $p \in \{1, 2, \infty\}$.

    $p=1$: largest absolute column sum; $p=2$: largest singular value; $p=\infty$: largest
    absolute row sum. All exact.

    Raises:
      ValueError: if ``w`` is not 2-D or ``p`` is not 1, 2 or inf.

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[1.0, -2.0], [3.0, 4.0]])
    >>> float(operator_norm(w, p=1)), float(operator_norm(w, p=float("inf")))
    (6.0, 7.0)
    """
    w = _check_matrix(w)
    p = _check_exponent(p, "p")
    if p == 1:
        return jnp.max(jnp.sum(jnp.abs(w), axis=0))
    if p == 2:
        return spectral_norm(w)
    if math.isinf(p):
        return jnp.max(jnp.sum(jnp.abs(w), axis=1))
    raise ValueError(f"p: operator norms are implemented for p in (1, 2, inf), got {p!r}")


def schatten_norm(w: jax.Array, *, p: float, rtol: float | None = None) -> jax.Array:
    r"""Schatten-$p$ norm $(\sum_i \sigma_i(W)^p)^{1/p}$; the rank at $p = 0$.

    $p=1$ nuclear, $p=2$ Frobenius, $p=\infty$ spectral. At $p=0$ returns the number of
    singular values above ``rtol * sigma_max`` (default ``rtol = max(n, k) * eps``, numpy's
    ``matrix_rank`` rule) as an integer array.

    Args:
      w: matrix.
      p: 0 or a number in [1, inf]. Static.
      rtol: relative threshold for the rank (only used at p = 0).

    Raises:
      ValueError: if ``w`` is not 2-D or ``p`` is out of range.

    >>> import jax.numpy as jnp
    >>> w = jnp.diag(jnp.array([3.0, 4.0, 0.0]))
    >>> float(schatten_norm(w, p=1)), float(schatten_norm(w, p=2)), int(schatten_norm(w, p=0))
    (7.0, 5.0, 2)
    """
    w = _check_matrix(w)
    p = _check_exponent(p, "p", allow_zero=True)
    s = jnp.linalg.svd(w, compute_uv=False)
    if p == 0:
        tol = rtol if rtol is not None else max(w.shape) * float(jnp.finfo(w.dtype).eps)
        return jnp.sum(s > tol * s[0])
    return _lp(s, p)


def _tree_matrix_map(fn: Any, tree: Any, split_axis: int) -> Any:
    return jax.tree_util.tree_map(lambda leaf: fn(as_matrix(leaf, split_axis=split_axis)), tree)


def tree_norm(tree: Any, *, p: float = 2) -> jax.Array:
    r"""$\ell_p$ norm of all entries of a parameter pytree taken as one vector.

    Raises:
      ValueError: if ``p`` is not in [1, inf] or the tree has no leaves.

    >>> import jax.numpy as jnp
    >>> float(tree_norm({"a": jnp.array([3.0]), "b": jnp.array([[4.0]])}))
    5.0
    """
    p = _check_exponent(p, "p")
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError("tree: expected at least one array leaf")
    parts = jnp.stack([_lp(jnp.asarray(leaf), p) for leaf in leaves])
    return _lp(parts, p)


def tree_group_norms(tree: Any, *, q: float, p: float, split_axis: int = 1) -> Any:
    r"""$\|W\|_{q,p}$ of every leaf (see the module docstring for how leaves become matrices).

    >>> import jax.numpy as jnp
    >>> tree_group_norms({"w": jnp.ones((2, 3)), "b": jnp.ones(4)}, q=1, p=1)["w"].item()
    6.0
    """
    return _tree_matrix_map(lambda m: group_norm(m, q=q, p=p), tree, split_axis)


def tree_operator_norms(tree: Any, *, p: float, split_axis: int = 1) -> Any:
    r"""$\|W\|_{p\to p}$ of every leaf (see the module docstring for how leaves become matrices)."""
    return _tree_matrix_map(lambda m: operator_norm(m, p=p), tree, split_axis)


def tree_schatten_norms(
    tree: Any, *, p: float, rtol: float | None = None, split_axis: int = 1
) -> Any:
    r"""Schatten-$p$ norm (rank at $p=0$) of every leaf, leaves read as matrices."""
    return _tree_matrix_map(lambda m: schatten_norm(m, p=p, rtol=rtol), tree, split_axis)


# --------------------------------------------------------------------------- projections


def project_l1_ball(v: jax.Array, *, radius: Any) -> jax.Array:
    r"""Euclidean projection of ``v`` (all entries) onto $\{x : \|x\|_1 \le r\}$.

    $x_i = \mathrm{sign}(v_i)\max(|v_i| - \theta, 0)$ with $\theta \ge 0$ the smallest value
    making $\|x\|_1 \le r$, found exactly by sorting ($O(n \log n)$). ``v`` is returned
    unchanged when already inside.

    Args:
      v: array of any shape.
      radius: r > 0 (may be traced).

    Returns:
      Array shaped like ``v``.

    References:
      Duchi, Shalev-Shwartz, Singer, Chandra 2008, doi:10.1145/1390156.1390191.

    >>> import jax.numpy as jnp
    >>> project_l1_ball(jnp.array([3.0, -1.0, 0.5]), radius=2.0).tolist()
    [2.0, -0.0, 0.0]
    """
    v = jnp.asarray(v)
    flat = v.reshape(-1)
    a = jnp.abs(flat)
    r = jnp.asarray(radius, dtype=v.dtype)
    u = jnp.sort(a)[::-1]
    css = jnp.cumsum(u)
    j = jnp.arange(1, u.shape[0] + 1, dtype=v.dtype)
    cond = u - (css - r) / j > 0
    rho = jnp.max(jnp.where(cond, jnp.arange(u.shape[0]), 0))
    theta = jnp.maximum((css[rho] - r) / (rho + 1).astype(v.dtype), jnp.zeros((), v.dtype))
    out = jnp.sign(flat) * jnp.maximum(a - theta, jnp.zeros((), v.dtype))
    out = jnp.where(jnp.sum(a) <= r, flat, out)
    return out.reshape(v.shape)


def project_lp_ball(v: jax.Array, *, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection of ``v`` (all entries) onto the $\ell_p$ ball, p in {1, 2, inf}.

    $p=1$: :func:`project_l1_ball`; $p=2$: $v \min(1, r/\|v\|_2)$; $p=\infty$: clip to $[-r, r]$.

    Raises:
      ValueError: if ``p`` is not 1, 2 or inf.

    >>> import jax.numpy as jnp
    >>> project_lp_ball(jnp.array([3.0, 4.0]), p=2, radius=1.0).tolist()
    [0.6000000000000001, 0.8]
    """
    v = jnp.asarray(v)
    p = _check_exponent(p, "p")
    r = jnp.asarray(radius, dtype=v.dtype)
    if p == 1:
        return project_l1_ball(v, radius=r)
    if p == 2:
        nrm = jnp.sqrt(jnp.sum(v * v))
        return v * jnp.minimum(jnp.ones((), v.dtype), r / jnp.maximum(nrm, jnp.finfo(v.dtype).tiny))
    if math.isinf(p):
        return jnp.clip(v, -r, r)
    raise ValueError(f"p: projections are implemented for p in (1, 2, inf), got {p!r}")


def project_group_ball(w: jax.Array, *, q: float, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection of a matrix onto $\{W : \|W\|_{q,p} \le r\}$.

    Implemented (exact) cases:

    - $(q,p) = (1,\infty)$, $(2,\infty)$, $(\infty,\infty)$: each column onto its $\ell_q$ ball;
    - $(1,1)$, $(2,2)$: entrywise $\ell_1$ / Frobenius ball;
    - $(2,1)$: the column norms $c$ are projected onto the $\ell_1$ ball, giving $c'$, and
      each column is rescaled by $c'_j / c_j$ (group-lasso projection).

    Raises:
      ValueError: for other $(q, p)$, or if ``w`` is not 2-D.

    >>> import jax.numpy as jnp
    >>> w = jnp.array([[3.0, 0.0], [0.0, 1.0]])
    >>> project_group_ball(w, q=1, p=float("inf"), radius=2.0).tolist()
    [[2.0, 0.0], [0.0, 1.0]]
    """
    w = _check_matrix(w)
    q = _check_exponent(q, "q")
    p = _check_exponent(p, "p")
    r = jnp.asarray(radius, dtype=w.dtype)
    if (math.isinf(p) and q in (1.0, 2.0)) or (math.isinf(p) and math.isinf(q)):
        return jax.vmap(lambda col: project_lp_ball(col, p=q, radius=r), in_axes=1, out_axes=1)(w)
    if (q, p) == (1.0, 1.0):
        return project_l1_ball(w, radius=r)
    if (q, p) == (2.0, 2.0):
        return project_lp_ball(w, p=2, radius=r)
    if (q, p) == (2.0, 1.0):
        c = jnp.sqrt(jnp.sum(w * w, axis=0))
        c_new = project_l1_ball(c, radius=r)
        scale = jnp.where(c > 0, c_new / jnp.where(c > 0, c, jnp.ones_like(c)), jnp.zeros_like(c))
        return w * scale[None, :]
    raise ValueError(
        f"(q, p): projection onto the ||.||_{{q,p}} ball is implemented for (1,inf), (2,inf), "
        f"(inf,inf), (1,1), (2,2), (2,1); got ({q:g}, {p:g})"
    )


def project_schatten_ball(w: jax.Array, *, p: float, radius: Any) -> jax.Array:
    r"""Euclidean projection onto the Schatten-$p$ ball, $p \in \{1, 2, \infty\}$.

    With $W = U \operatorname{diag}(s) V^\top$: $W' = U \operatorname{diag}(P(s)) V^\top$, $P$ the
    projection of $s$ onto the $\ell_p$ ball (exact: unitarily invariant norms).

    Raises:
      ValueError: if ``p`` is not 1, 2 or inf, or ``w`` is not 2-D.
    """
    w = _check_matrix(w)
    p = _check_exponent(p, "p")
    if p not in (1.0, 2.0) and not math.isinf(p):
        raise ValueError(f"p: Schatten projections are implemented for p in (1, 2, inf), got {p!r}")
    u, s, vt = jnp.linalg.svd(w, full_matrices=False)
    s_new = project_lp_ball(s, p=p, radius=radius)
    return (u * s_new[None, :]) @ vt


def project_spectral_ball(w: jax.Array, *, radius: Any) -> jax.Array:
    r"""Euclidean projection onto $\{W : \|W\|_2 \le r\}$: singular values clipped at $r$.

    >>> import jax.numpy as jnp
    >>> project_spectral_ball(jnp.diag(jnp.array([3.0, 0.5])), radius=1.0).round(6).tolist()
    [[1.0, 0.0], [0.0, 0.5]]
    """
    return project_schatten_ball(w, p=math.inf, radius=radius)


def tree_project_lp_ball(tree: Any, *, p: float, radius: Any) -> Any:
    r"""Project a whole parameter pytree (all entries as one vector) onto the $\ell_p$ ball.

    >>> import jax.numpy as jnp
    >>> out = tree_project_lp_ball({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, p=2, radius=1.0)
    >>> round(float(out["a"][0]), 6), round(float(out["b"][0]), 6)
    (0.6, 0.8)
    """
    flat, unravel = ravel_pytree(tree)
    return unravel(project_lp_ball(flat, p=p, radius=radius))
