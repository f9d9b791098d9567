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

:func:`maurey_sparsify` is compiled once per (shapes, static options) (see
:mod:`kernels._jit`); bad input (an int key, integer, half-precision, empty or non-finite ``v``,
a non-positive ``radius``, $\|v\|_1 > B$) raises a ``ValueError`` naming the argument, eagerly
and (for values) inside ``jax.jit``.

References:
  Pisier 1981, Séminaire d'analyse fonctionnelle, exp. 5; Zhang 2002, JMLR 2:527-550;
  Trauger & Tewari 2024, arXiv:2312.06786 (Lemmas 3.2-3.6, Theorem 4.1).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_key, check_positive, check_positive_int
from kernels._jit import compile_once
from kernels._ordered import CheckChain
from kernels._signs import _check_float_array, _check_float_dtype

__all__ = [
    "WQKCover",
    "maurey_cover",
    "maurey_cover_log_size",
    "maurey_cover_point",
    "maurey_cover_size",
    "maurey_error_bound",
    "maurey_expected_error",
    "maurey_sparsify",
    "wqk_cover_outputs",
]

_INT32_MAX = int(np.iinfo(np.int32).max)


def _check_l1_ball(v: Any, radius: Any) -> tuple[jax.Array, jax.Array]:
    """``v`` flattened and ``radius`` as an array, after checking ``||v||_1 <= radius``.

    The three runtime checks (v finite, radius > 0, the ball) form an ordered chain
    (:mod:`kernels._ordered`): the first failing one is named on every backend.
    """
    chain = CheckChain()
    flat = _check_float_array(v, "v", chain=chain).reshape(-1)
    chain.positive(radius, "radius")
    r = jnp.asarray(radius, flat.dtype)
    l1 = jnp.sum(jnp.abs(flat))
    chain.require(
        l1 <= r * (1 + 1e-6), "v: expected ||v||_1 <= radius, got ||v||_1 = {} > {}", l1, r
    )
    return flat, r


@compile_once
def maurey_sparsify(v: jax.Array, key: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""One Maurey sparsification $v_k$ of ``v`` (any shape, entries as one vector).

    Draws ``num_atoms`` atoms from $\{\pm B e_j, 0\}$ with probabilities $|v_j|/B$ and
    $1 - \|v\|_1/B$ and returns their average, an unbiased estimate of $v$ with
    $\mathbb E\|v - v_k\|_2^2 = (B\|v\|_1 - \|v\|_2^2)/k$. Pure function of ``key``: vmap it
    over keys for many draws.

    The atom counts $c$ are int32 (exact up to $k = 2^{31} - 1$; float32 counts stopped at
    $2^{24}$), converted to the dtype of ``v`` once at the end.

    Args:
      v: float32/float64 array with $\|v\|_1 \le$ ``radius`` (entries as one vector).
      key: PRNG key.
      num_atoms: k in ``[1, 2**31 - 1]``. Static.
      radius: B > 0.

    Returns:
      Array shaped like ``v``: $(B/k) \cdot c$ with $c$ integer, $\|c\|_1 \le k$.

    Raises:
      ValueError: if ``num_atoms`` is not in ``[1, 2**31 - 1]``, on a bad key, an integer,
        half-precision, empty or non-finite ``v``, ``radius`` <= 0 or $\|v\|_1 > B$ (the value
        checks also under ``jit``).

    References:
      Pisier 1981; Zhang 2002, Lemma 1.

    >>> import jax, jax.numpy as jnp
    >>> v = jnp.array([0.0, 2.0, 0.0])  # a vertex of the radius-2 ball is reproduced exactly
    >>> maurey_sparsify(v, jax.random.key(0), num_atoms=3, radius=2.0).tolist()
    [0.0, 2.0, 0.0]
    """
    k = check_positive_int(num_atoms, "num_atoms")
    if k > _INT32_MAX:
        raise ValueError(f"num_atoms: at most 2**31 - 1 atoms (int32 counts), got {k}")
    check_key(key)
    flat, r = _check_l1_ball(v, radius)
    l1 = jnp.sum(jnp.abs(flat))
    probs = jnp.concatenate([jnp.abs(flat) / r, jnp.maximum(1 - l1 / r, 0)[None]])
    draws = jax.random.categorical(key, jnp.log(probs), shape=(k,))
    counts = jnp.zeros(flat.shape[0] + 1, jnp.int32).at[draws].add(1)[:-1]
    return (jnp.sign(flat) * counts.astype(flat.dtype) * (r / k)).reshape(jnp.shape(v))


def maurey_expected_error(v: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""Exact $\mathbb E\|v - v_k\|_2^2 = (B\|v\|_1 - \|v\|_2^2)/k$ of :func:`maurey_sparsify`.

    Raises:
      ValueError: on a bad ``num_atoms``, ``v`` or ``radius``, or if $\|v\|_1 > B$.

    >>> import jax.numpy as jnp
    >>> float(maurey_expected_error(jnp.array([0.5, 0.5]), num_atoms=2, radius=1.0))
    0.25
    """
    k = check_positive_int(num_atoms, "num_atoms")
    v, r = _check_l1_ball(v, radius)
    return (r * jnp.sum(jnp.abs(v)) - jnp.sum(v * v)) / k


def maurey_error_bound(v: jax.Array, *, num_atoms: int, radius: Any) -> jax.Array:
    r"""Maurey's bound $\mathbb E\|v - v_k\|_2^2 \le (B^2 - \|v\|_2^2)/k$ for $\|v\|_1 \le B$.

    Equal to :func:`maurey_expected_error` when $\|v\|_1 = B$ (tight on the sphere).

    Raises:
      ValueError: on a bad ``num_atoms``, ``v`` or ``radius``, or if $\|v\|_1 > B$.

    >>> import jax.numpy as jnp
    >>> float(maurey_error_bound(jnp.array([0.5, 0.5]), num_atoms=2, radius=1.0))
    0.25
    """
    k = check_positive_int(num_atoms, "num_atoms")
    v, r = _check_l1_ball(v, radius)
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

    Raises:
      ValueError: on bad sizes, a non-integer ``index``, a dtype other than float32/float64, or
        ``radius`` <= 0 (also under ``jit``).

    >>> maurey_cover_point(7, dim=2, num_atoms=2, radius=1.0).tolist()  # digits (2, 1)
    [0.5, 0.5]
    """
    d = check_positive_int(dim, "dim")
    k = check_positive_int(num_atoms, "num_atoms")
    if np.ndim(radius) != 0:
        raise ValueError(f"radius: expected a scalar, got an array of shape {np.shape(radius)}")
    check_positive(radius, "radius")
    base = 2 * d + 1
    dtype = _check_float_dtype(jnp.result_type(float) if dtype is None else dtype, "dtype")
    index = jnp.asarray(index)
    if not jnp.issubdtype(index.dtype, jnp.integer):
        raise ValueError(f"index: expected integers, got {index.dtype}")
    powers = jnp.asarray([base**t for t in range(k)], index.dtype)
    digits = (index[..., None] // powers.reshape((1,) * index.ndim + (k,))) % base
    j = jnp.arange(1, d + 1, dtype=index.dtype).reshape((1,) * (index.ndim + 1) + (d,))
    dig = digits[..., None]
    counts = jnp.sum((dig == j).astype(dtype) - (dig == j + d).astype(dtype), axis=-2)
    return counts * jnp.asarray(radius, dtype) / k


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class WQKCover:
    r"""The finite class of Theorem 4.1's proof over a Maurey cover of the $W_{QK}$ ball.

    An ``outputs_fn`` for :func:`kernels.rademacher.rademacher_finite`: ``cover(indices, batch)``
    with ``batch = (inputs [m, T, d], cls_tokens [m, d])`` returns ``[len(indices), m]`` member
    outputs (see :func:`wqk_cover_outputs`). A registered pytree (``radius`` is a leaf), compared
    and hashed by identity.

    Attributes:
      radius: B, the $\|W_{QK}\|_{1,1}$ radius (leaf).
      dim: d, the token dimension. Static.
      num_atoms: k atoms per cover point. Static.
    """

    radius: Any
    dim: int = dataclasses.field(metadata={"static": True})
    num_atoms: int = dataclasses.field(metadata={"static": True})

    @property
    def num_members(self) -> int:
        """$M = 2 d (2 d^2 + 1)^k$."""
        return 2 * self.dim * (2 * self.dim * self.dim + 1) ** self.num_atoms

    def __call__(self, indices: jax.Array, batch: Any) -> jax.Array:
        """Outputs ``[len(indices), m]`` of the members ``indices`` on ``batch``."""
        inputs, cls_tokens = _check_wqk_batch(batch, self.dim)
        d, dtype = self.dim, inputs.dtype
        idx = jnp.asarray(indices).astype(jnp.int32)
        sign = jnp.where(idx % 2 == 0, jnp.ones((), dtype), -jnp.ones((), dtype))
        j = (idx // 2) % d
        w = maurey_cover_point(
            idx // (2 * d), dim=d * d, num_atoms=self.num_atoms, radius=self.radius, dtype=dtype
        ).reshape(-1, d, d)  # [c, d, d]
        q = jnp.einsum("cab,mb->cma", w, cls_tokens)  # W x_cls per member and sample
        att = jax.nn.softmax(jnp.einsum("mtd,cmd->cmt", inputs, q), axis=-1)
        pooled = jnp.einsum("cmt,mtd->cmd", att, inputs)  # X^T softmax(...)
        picked = jnp.sum(pooled * jax.nn.one_hot(j, d, dtype=dtype)[:, None, :], axis=-1)
        return sign[:, None] * picked


def _check_wqk_batch(batch: Any, dim: int) -> tuple[jax.Array, jax.Array]:
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise ValueError("batch: expected a pair (inputs [m, T, d], cls_tokens [m, d])")
    inputs = _check_float_array(batch[0], "inputs", ndim=3)
    cls_tokens = _check_float_array(batch[1], "cls_tokens", ndim=2)
    if inputs.shape[2] != dim or cls_tokens.shape != (inputs.shape[0], dim):
        raise ValueError(
            f"inputs, cls_tokens: expected [m, T, {dim}] and [m, {dim}], got {inputs.shape}, "
            f"{cls_tokens.shape}"
        )
    return inputs, cls_tokens.astype(inputs.dtype)


def wqk_cover_outputs(*, dim: int, num_atoms: int, radius: Any) -> WQKCover:
    r"""The finite class of Theorem 4.1's proof over a Maurey cover of the $W_{QK}$ ball.

    The ball is $\{W_{QK} \in \mathbb R^{d\times d} : \|W_{QK}\|_{1,1} \le B\}$. Members are
    triples $(\hat W, j, s)$ with $\hat W$ a cover point of the $\|\cdot\|_{1,1}$ ball of
    $d\times d$ matrices (:func:`maurey_cover_point` with $D = d^2$), $j \in [d]$,
    $s \in \{\pm1\}$:

    $$f_{\hat W, j, s}(X) = s\, e_j^\top X^\top \mathrm{softmax}(X \hat W x_{[CLS]}).$$

    Trauger & Tewari (2024, Theorem 4.1 proof) bound the single-layer Rademacher complexity by
    $2 B_w B_{W_c} L_\sigma B_{W_v}$ times the Rademacher complexity of this class (for exact
    $W_{QK}$); evaluating it on a cover with :func:`kernels.rademacher.rademacher_finite` puts a
    measured number beside the theoretical bound. Members are generated on demand from their
    index ``((cover_index * d + j) * 2 + (s < 0))``. The data is the ``batch`` argument
    ``(inputs [m, T, d], cls_tokens [m, d])`` of ``rademacher_finite``, so new sequences of the
    same shapes reuse the compiled program.

    Args:
      dim: d, the token dimension. Static.
      num_atoms: k atoms per cover point. Static.
      radius: B > 0, the $\|W_{QK}\|_{1,1}$ radius.

    Returns:
      :class:`WQKCover`, with ``num_members = 2 d (2 d^2 + 1)^k``.

    Raises:
      ValueError: on bad sizes or radius, or if the member count overflows int32 indices.

    >>> import jax, jax.numpy as jnp
    >>> cover = wqk_cover_outputs(dim=2, num_atoms=1, radius=1.0)
    >>> x = jnp.ones((3, 4, 2))
    >>> cover.num_members, cover(jnp.arange(2), (x, x[:, 0])).tolist()  # uniform attention
    (36, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    """
    d = check_positive_int(dim, "dim")
    k = check_positive_int(num_atoms, "num_atoms")
    check_positive(radius, "radius")
    cover = WQKCover(radius=radius, dim=d, num_atoms=k)
    if cover.num_members > np.iinfo(np.int32).max:
        raise ValueError(f"num_atoms: {cover.num_members} members overflow int32 indices")
    return cover
