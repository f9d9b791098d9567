r"""Maurey sparsification and the covers it builds (Pisier 1981; Zhang 2002).

For $v \in \mathbb R^D$ with $\|v\|_1 \le B$ take the $2D+1$ atoms $\{\pm B e_j\} \cup \{0\}$,
draw $k$ of them i.i.d. with probabilities $|v_j|/B$ for $\mathrm{sign}(v_j) B e_j$ and
$1 - \|v\|_1/B$ for $0$, and average: $v_k = \frac1k\sum_{t=1}^k a_t$. Then $\mathbb E v_k = v$ and

$$\mathbb E\|v - v_k\|_2^2 = \frac{B\|v\|_1 - \|v\|_2^2}{k} \le \frac{B^2 - \|v\|_2^2}{k},$$

(exact; the right side is the classical bound $(\gamma b^2 - \|f\|^2)/k$ with $\gamma \le 1$,
$b = B$), tight when $\|v\|_1 = B$. Every $v_k$ is $\frac Bk c$ for an integer vector
$c$ with $\|c\|_1 \le k$, so these points form a cover of the $\ell_1$ ball of log size at most
$k\log(2D+1)$ at squared $\ell_2$ resolution $B^2/k$.

A matrix is sparsified as the vector of its entries (the $\|W\|_{1,1}$ ball, Lemma 3.6 of
Trauger & Tewari 2024). Cover members can be addressed by an integer index (the $k$ base-$(2D+1)$
digits are the atoms), so :func:`kernels.rademacher.rademacher_finite` can evaluate covers of
millions of members on demand (:func:`wqk_cover_outputs`).

References:
  Pisier 1981, Séminaire d'analyse fonctionnelle, exp. 5; Zhang 2002, JMLR 2:527-550;
  Trauger & Tewari 2024, arXiv:2312.06786 (Lemmas 3.2-3.6, Theorem 4.1).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_finite, check_positive, check_positive_int

__all__ = [
    "maurey_cover",
    "maurey_cover_log_size",
    "maurey_cover_point",
    "maurey_cover_size",
    "maurey_error_bound",
    "maurey_expected_error",
    "maurey_sparsify",
    "wqk_cover_outputs",
]


def maurey_sparsify(v: jax.Array, key: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""One Maurey sparsification $v_k$ of ``v`` (any shape, entries as one vector).

    Draws ``num_atoms`` atoms from $\{\pm B e_j, 0\}$ with probabilities $|v_j|/B$ and
    $1 - \|v\|_1/B$ and returns their average, an unbiased estimate of $v$ with
    $\mathbb E\|v - v_k\|_2^2 = (B\|v\|_1 - \|v\|_2^2)/k$. Pure function of ``key``: vmap it
    over keys for many draws.

    Args:
      v: array with $\|v\|_1 \le$ ``radius`` (entries as one vector).
      key: PRNG key.
      num_atoms: k. Static.
      radius: B > 0.

    Returns:
      Array shaped like ``v``: $(B/k) \cdot c$ with $c$ integer, $\|c\|_1 \le k$.

    Raises:
      ValueError: if ``num_atoms`` < 1, ``radius`` <= 0, or (concretely) $\|v\|_1 > B$.

    References:
      Pisier 1981; Zhang 2002, Lemma 1.

    >>> import jax, jax.numpy as jnp
    >>> v = jnp.array([0.0, 2.0, 0.0])  # a vertex of the radius-2 ball is reproduced exactly
    >>> maurey_sparsify(v, jax.random.key(0), num_atoms=3, radius=2.0).tolist()
    [0.0, 2.0, 0.0]
    """
    k = check_positive_int(num_atoms, "num_atoms")
    check_positive(radius, "radius")
    v = jnp.asarray(v)
    check_finite(v, "v")
    flat = v.reshape(-1)
    r = jnp.asarray(radius, flat.dtype)
    l1 = jnp.sum(jnp.abs(flat))
    if not isinstance(l1, jax.core.Tracer) and float(l1) > float(r) * (1 + 1e-6):
        raise ValueError(f"v: expected ||v||_1 <= radius = {float(r)}, got {float(l1)}")
    probs = jnp.concatenate([jnp.abs(flat) / r, jnp.maximum(1 - l1 / r, 0)[None]])
    draws = jax.random.categorical(key, jnp.log(probs), shape=(k,))
    counts = jnp.zeros(flat.shape[0] + 1, flat.dtype).at[draws].add(1)[:-1]
    return (jnp.sign(flat) * counts * (r / k)).reshape(v.shape)


def maurey_expected_error(v: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""Exact $\mathbb E\|v - v_k\|_2^2 = (B\|v\|_1 - \|v\|_2^2)/k$ of :func:`maurey_sparsify`.

    >>> import jax.numpy as jnp
    >>> float(maurey_expected_error(jnp.array([0.5, 0.5]), num_atoms=2, radius=1.0))
    0.25
    """
    v = jnp.asarray(v).reshape(-1)
    k = check_positive_int(num_atoms, "num_atoms")
    r = jnp.asarray(radius, v.dtype)
    return (r * jnp.sum(jnp.abs(v)) - jnp.sum(v * v)) / k


def maurey_error_bound(v: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""Maurey's bound $\mathbb E\|v - v_k\|_2^2 \le (B^2 - \|v\|_2^2)/k$ for $\|v\|_1 \le B$.

    Equal to :func:`maurey_expected_error` when $\|v\|_1 = B$ (tight on the sphere).

    >>> import jax.numpy as jnp
    >>> float(maurey_error_bound(jnp.array([0.5, 0.5]), num_atoms=2, radius=1.0))
    0.25
    """
    v = jnp.asarray(v).reshape(-1)
    k = check_positive_int(num_atoms, "num_atoms")
    r = jnp.asarray(radius, v.dtype)
    return (r * r - jnp.sum(v * v)) / k


def maurey_cover_log_size(dim: int, num_atoms: int) -> float:
    r"""$k \log(2D + 1)$: log of the number of atom sequences, a bound on the log cover size.

    >>> round(maurey_cover_log_size(2, 3), 6)  # 3 log 5
    4.828314
    """
    d = check_positive_int(dim, "dim")
    k = check_positive_int(num_atoms, "num_atoms")
    return k * math.log(2 * d + 1)


def maurey_cover_size(dim: int, num_atoms: int) -> int:
    r"""Exact number of distinct Maurey cover points, at most $(2D+1)^k$.

    $\#\{c \in \mathbb Z^D : \|c\|_1 \le k\} = \sum_i 2^i \binom{D}{i}\binom{k}{i}$.

    >>> maurey_cover_size(2, 1), maurey_cover_size(2, 2)
    (5, 13)
    """
    d = check_positive_int(dim, "dim")
    k = check_positive_int(num_atoms, "num_atoms")
    return sum(2**i * math.comb(d, i) * math.comb(k, i) for i in range(min(d, k) + 1))


def maurey_cover(
    dim: int, num_atoms: int, radius: float, *, max_size: int = 2_000_000
) -> np.ndarray:
    r"""All distinct Maurey cover points $\frac Bk c$, $c \in \mathbb Z^D$, $\|c\|_1 \le k$.

    Every $v$ with $\|v\|_1 \le B$ has a point within squared distance
    $(B^2 - \|v\|_2^2)/k$ (the expectation bound implies existence). Built with numpy (the sizes
    are static); for small ``(dim, num_atoms)`` only.

    Args:
      dim: D.
      num_atoms: k.
      radius: B > 0.
      max_size: refuse covers with more points than this.

    Returns:
      numpy array ``[maurey_cover_size(D, k), D]`` (float64).

    Raises:
      ValueError: if the cover would exceed ``max_size`` points.

    >>> maurey_cover(1, 2, 1.0).ravel().tolist()
    [-1.0, -0.5, 0.0, 0.5, 1.0]
    """
    check_positive(radius, "radius")
    size = maurey_cover_size(dim, num_atoms)
    if size > max_size:
        raise ValueError(f"(dim, num_atoms): the cover has {size} points > max_size={max_size}")
    points = []
    for support_size in range(min(dim, num_atoms) + 1):
        for support in itertools.combinations(range(dim), support_size):
            # positive magnitudes summing to at most k, then every sign pattern
            for mags in itertools.product(range(1, num_atoms + 1), repeat=support_size):
                if sum(mags) > num_atoms:
                    continue
                for signs in itertools.product((-1, 1), repeat=support_size):
                    c = np.zeros(dim)
                    c[list(support)] = np.multiply(mags, signs)
                    points.append(c)
    out = np.array(points).reshape(-1, dim) * (radius / num_atoms)
    return out[np.lexsort(out.T[::-1])]


def maurey_cover_point(
    index: Any, *, dim: int, num_atoms: int, radius: Any, dtype: Any = None
) -> jax.Array:
    r"""The cover point addressed by an integer ``index`` in $[0, (2D+1)^k)$ (traceable).

    The $k$ base-$(2D+1)$ digits of ``index`` are the atoms: digit 0 is $0$, digit $j \in [1, D]$
    is $+B e_{j}$, digit $D + j$ is $-B e_j$; the point is their average. Every cover point has at
    least one index (several, since order and $\pm$ cancellation are not removed), so a max over
    all indices equals the max over the cover.

    Args:
      index: int scalar or array (traced or not), ``< (2D+1)^k``.
      dim: D. Static.
      num_atoms: k. Static.
      radius: B.
      dtype: float dtype of the point (default: the default float dtype).

    Returns:
      ``[*index.shape, D]``.

    >>> maurey_cover_point(7, dim=2, num_atoms=2, radius=1.0).tolist()  # digits (2, 1)
    [0.5, 0.5]
    """
    d = check_positive_int(dim, "dim")
    k = check_positive_int(num_atoms, "num_atoms")
    base = 2 * d + 1
    dtype = jnp.result_type(float) if dtype is None else dtype
    index = jnp.asarray(index)
    powers = jnp.asarray([base**t for t in range(k)], index.dtype)
    digits = (index[..., None] // powers.reshape((1,) * index.ndim + (k,))) % base
    j = jnp.arange(1, d + 1, dtype=index.dtype).reshape((1,) * (index.ndim + 1) + (d,))
    dig = digits[..., None]
    counts = jnp.sum((dig == j).astype(dtype) - (dig == j + d).astype(dtype), axis=-2)
    return counts * jnp.asarray(radius, dtype) / k


def wqk_cover_outputs(
    inputs: jax.Array, cls_tokens: jax.Array, *, num_atoms: int, radius: Any
) -> tuple[Callable[[jax.Array], jax.Array], int]:
    r"""The finite class of Theorem 4.1's proof over a Maurey cover of the W_QK ball.

    The ball is $\{W_{QK} \in \mathbb R^{d\times d} : \|W_{QK}\|_{1,1} \le B\}$.

    Members are triples $(\hat W, j, s)$ with $\hat W$ a cover point of the $\|\cdot\|_{1,1}$ ball
    of $d\times d$ matrices (:func:`maurey_cover_point` with $D = d^2$), $j \in [d]$,
    $s \in \{\pm1\}$:

    $$f_{\hat W, j, s}(X) = s\, e_j^\top X^\top \mathrm{softmax}(X \hat W x_{[CLS]}).$$

    Trauger & Tewari (2024, Theorem 4.1 proof) bound the single-layer Rademacher complexity by
    $2 B_w B_{W_c} L_\sigma B_{W_v}$ times the Rademacher complexity of this class (for exact
    $W_{QK}$); evaluating it on a cover with :func:`kernels.rademacher.rademacher_finite` puts a
    measured number beside the theoretical bound. Members are generated on demand from their
    index ``((cover_index * d + j) * 2 + (s < 0))``.

    Args:
      inputs: ``[m, T, d]`` sequences $X_i$.
      cls_tokens: ``[m, d]`` the query token $x_{[CLS]}$ of each sequence.
      num_atoms: k atoms per cover point. Static.
      radius: B, the $\|W_{QK}\|_{1,1}$ radius.

    Returns:
      ``(outputs_fn, num_members)`` for :func:`kernels.rademacher.rademacher_finite`;
      ``num_members = 2 d (2 d^2 + 1)^k``.

    Raises:
      ValueError: on bad shapes, or if the member count overflows the index dtype.
    """
    inputs = jnp.asarray(inputs)
    cls_tokens = jnp.asarray(cls_tokens)
    if inputs.ndim != 3 or cls_tokens.shape != (inputs.shape[0], inputs.shape[2]):
        raise ValueError(
            f"inputs, cls_tokens: expected [m, T, d] and [m, d], got {inputs.shape}, "
            f"{cls_tokens.shape}"
        )
    check_finite(inputs, "inputs")
    check_finite(cls_tokens, "cls_tokens")
    check_positive(radius, "radius")
    k = check_positive_int(num_atoms, "num_atoms")
    d = inputs.shape[2]
    num_cover = (2 * d * d + 1) ** k
    num_members = num_cover * d * 2
    if num_members > np.iinfo(np.int32).max:
        raise ValueError(f"num_atoms: {num_members} members overflow int32 indices; use fewer")
    dtype = inputs.dtype

    def outputs_fn(idx: jax.Array) -> jax.Array:
        idx = idx.astype(jnp.int32)
        sign = jnp.where(idx % 2 == 0, jnp.ones((), dtype), -jnp.ones((), dtype))
        j = (idx // 2) % d
        w = maurey_cover_point(idx // (2 * d), dim=d * d, num_atoms=k, radius=radius, dtype=dtype)
        w = w.reshape(-1, d, d)  # [c, d, d]
        q = jnp.einsum("cab,mb->cma", w, cls_tokens)  # W x_cls per member and sample
        att = jax.nn.softmax(jnp.einsum("mtd,cmd->cmt", inputs, q), axis=-1)
        pooled = jnp.einsum("cmt,mtd->cmd", att, inputs)  # X^T softmax(...)
        picked = jnp.sum(pooled * jax.nn.one_hot(j, d, dtype=dtype)[:, None, :], axis=-1)
        return sign[:, None] * picked

    return outputs_fn, num_members
