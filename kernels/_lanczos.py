"""Lanczos tridiagonalisation with selective reorthogonalisation, and the top eigenvalues."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_key,
    check_positive_int,
    check_that,
)
from kernels._flat import (
    _check_kept_count,
    _Flat,
    _num_bad_rows,
    _setup,
    _split,
    contract,
    leaf_shardings,
    place,
    stacked_sharding,
    tree_dot,
    tree_norm2,
)
from kernels._hessian import Matvec
from kernels._jit import compile_once


def _check_basis_dtype(basis_dtype: Any, work: Any) -> Any:
    """The dtype the Lanczos basis is stored in: ``None`` is the working dtype ``work``."""
    if basis_dtype is None:
        return np.dtype(work)
    try:
        dtype = np.dtype(jnp.dtype(basis_dtype))
    except TypeError:
        raise ValueError(
            f"basis_dtype: expected None or one of {_BASIS_DTYPES}, got {basis_dtype!r}"
        ) from None
    if dtype.name not in _BASIS_DTYPES or dtype.itemsize > np.dtype(work).itemsize:
        size = np.dtype(work).itemsize
        allowed = [d for d in _BASIS_DTYPES if np.dtype(jnp.dtype(d)).itemsize <= size]
        raise ValueError(
            f"basis_dtype: expected None or one of {allowed} (at most the working precision "
            f"{np.dtype(work).name}), got {dtype.name}"
        )
    return dtype


# --------------------------------------------------------------------------- Lanczos


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tridiagonal:
    r"""The Lanczos tridiagonal matrix $T = V^\top A V$ of :func:`lanczos`.

    Attributes:
      diagonal: $(\alpha_1, \dots, \alpha_k)$, shape (k,).
      off_diagonal: $(\beta_1, \dots, \beta_{k-1})$, shape (k-1,); zero where Lanczos broke
        down and restarted (then $T$ is block diagonal).
      start_norm: $\|v_0\|$ of the start vector, so $e_1$ of $T$ is $v_0 / \|v_0\|$ and
        $v_0^\top p(A) v_0 \approx \|v_0\|^2 e_1^\top p(T) e_1$.
    """

    diagonal: jax.Array
    off_diagonal: jax.Array
    start_norm: jax.Array

    def matrix(self) -> jax.Array:
        """The dense k x k matrix $T$ (of an unbatched result)."""
        return _tridiagonal_matrix(self.diagonal, self.off_diagonal)


def _tridiagonal_matrix(diagonal: jax.Array, off: jax.Array) -> jax.Array:
    return jnp.diag(diagonal) + jnp.diag(off, 1) + jnp.diag(off, -1)


# the second Gram-Schmidt pass runs when the first removed more than 1 - _DGKS of w's norm
# (Daniel, Gragg, Kaufman, Stewart 1976: with 1/sqrt(2) the result is orthogonal to working
# precision); a breakdown is a beta below _BREAKDOWN * eps * (running estimate of ||A||)
_DGKS = 0.7071067811865476
_BREAKDOWN = 16.0
_BASIS_DTYPES = ("float64", "float32", "float16", "bfloat16")


@jax.custom_batching.custom_vmap
def _any_in_batch(pred: jax.Array) -> jax.Array:
    """``pred`` itself; under ``vmap``, whether it holds for any member of the batch (unbatched).

    The predicate of the Lanczos branches (the second Gram-Schmidt pass, the restart): probes
    vmapped together (``slq_nodes``'s chunks) take a branch when any of them needs it, and each
    probe keeps its own result by a select inside the branch. The predicate stays unbatched, so
    the ``lax.cond`` stays a branch under ``vmap`` (a batched predicate turns it into a
    ``select_n`` that runs both sides at every step) and the results equal the unbatched run's.
    """
    return pred


@_any_in_batch.def_vmap
def _any_in_batch_vmap(axis_size: int, in_batched: list[bool], pred: jax.Array) -> tuple:
    del axis_size
    return (jnp.any(pred) if in_batched[0] else pred), False


@dataclasses.dataclass(frozen=True)
class _Basis:
    """The Lanczos basis, leaf by leaf: ``rows`` stored in ``dtype``, scaled; unwritten rows zero.

    One array of shape ``(num_rows, *leaf.shape)`` per leaf of the parameters, so row i is the
    vector ``v_i`` in the parameters' layout; on a mesh each array is placed like its leaf on
    the trailing axes (``shardings``), so a device holds its share of the basis (off a mesh
    the vectors are one raveled leaf: :meth:`_Flat.for_bases`). Row i holds
    ``scale * v_i``: a unit vector's entries are about ``1/sqrt(n)``, below float16's normal
    range at 10^8 parameters, so a float16 basis stores them times ``sqrt(n)``.
    """

    rows: list  # [(num_rows, *shape_l)] per leaf
    scale: float
    work: Any  # the working dtype
    shardings: tuple = ()  # per leaf: the stacked leaf's NamedSharding, or None

    @staticmethod
    def create(
        num_rows: int,
        shapes: Any,
        work: Any,
        dtype: Any,
        shardings: Any = None,
        anchors: Any = None,
    ) -> _Basis:
        """A zero basis of ``num_rows`` rows; ``shapes``: the leaves' shapes (an int n: one leaf).

        ``shardings``: per leaf, the parameter leaf's ``NamedSharding`` (or None); ``anchors``:
        per leaf, zeros placed like the parameter leaf (:meth:`_Flat.anchors`), broadcast into
        the rows so that the partitioner splits them like the leaf.
        """
        shapes = [(int(shapes),)] if isinstance(shapes, int | np.integer) else list(shapes)
        size = sum(int(np.prod(shape)) for shape in shapes)
        scale = float(np.sqrt(size)) if np.dtype(dtype) == np.float16 else 1.0
        stacked = tuple(stacked_sharding(sh) for sh in (shardings or [None] * len(shapes)))
        if anchors is None:
            rows = [jnp.zeros((num_rows, *shape), dtype) for shape in shapes]
        else:
            rows = [
                jnp.broadcast_to(z.astype(dtype)[None], (num_rows, *shape))
                for z, shape in zip(anchors, shapes, strict=True)
            ]
        return _Basis(rows, scale, work, stacked).placed()

    def placed(self) -> _Basis:
        """The rows constrained to their shardings (where known)."""
        if not any(sh is not None for sh in self.shardings):
            return self
        rows = [place(r, sh) for r, sh in zip(self.rows, self.shardings, strict=True)]
        return dataclasses.replace(self, rows=rows)

    def with_rows(self, rows: list) -> _Basis:
        return dataclasses.replace(self, rows=list(rows)).placed()

    def row(self, index: Any) -> list[jax.Array]:
        """Row ``index`` as leaves (stored dtype, scaled)."""
        return [jax.lax.dynamic_index_in_dim(r, index, keepdims=False) for r in self.rows]

    def set(self, index: Any, v: Any) -> _Basis:
        """Row ``index`` set to ``v`` (leaves; an index past the last row writes nothing)."""
        v = _leaves(v)
        rows = [
            r.at[index].set((x * jnp.asarray(self.scale, x.dtype)).astype(r.dtype), mode="drop")
            for r, x in zip(self.rows, v, strict=True)
        ]
        return self.with_rows(rows)

    def project_out(self, w: Any, used: Any) -> Any:
        r"""$w - \sum_{i<used} (v_i^\top w) v_i$ against the stored rows (``w``: leaves).

        A full-precision basis: classical Gram-Schmidt as two contractions per leaf with the
        whole basis (the coefficients summed over the leaves; rows not yet written are zero and
        change nothing; a loop over the rows in use, one sliced row at a time, measured 5-20x
        slower on CPU at 10^6 parameters). A lower-precision basis: block by block (at most 8
        blocks, a loop over the blocks in use), each block converted to the working dtype, used
        and dropped (a product with the whole converted basis would hold it in full precision).
        A flat array ``w`` (one leaf) gives a flat array.
        """
        flat = not isinstance(w, list | tuple)
        w = _leaves(w)
        rows, work = self.rows, self.work
        inv = jnp.asarray(1.0 / self.scale**2, work)
        if rows[0].dtype == work:
            out = _subtract(rows, w, inv)
            return out[0] if flat else out
        num = rows[0].shape[0]
        block = -(-num // 8)
        pad = -num % block
        if pad:  # whole blocks for the dynamic slices (zero rows change nothing)
            rows = [jnp.concatenate([r, jnp.zeros((pad, *r.shape[1:]), r.dtype)]) for r in rows]
            rows = self.with_rows(rows).rows

        def body(b: jax.Array, w: list) -> list:
            blk = [jax.lax.dynamic_slice_in_dim(r, b * block, block).astype(work) for r in rows]
            return _subtract(blk, w, inv)

        used_blocks = (jnp.asarray(used, jnp.int32) + (block - 1)) // block
        out = jax.lax.fori_loop(0, used_blocks, body, w)
        return out[0] if flat else out

    def orthogonalize(self, w: Any, used: Any) -> tuple[Any, jax.Array]:
        """Gram-Schmidt against the rows in use, a second pass only if the first cancelled.

        Returns ``(w', ||w'||)``. The second pass (DGKS) runs when ``||w'|| < ||w|| / sqrt(2)``
        (probes vmapped together: when it holds for any, each keeping its own result,
        :func:`_any_in_batch`).
        """
        before = tree_norm2(_leaves(w))
        w = self.project_out(w, used)
        after = tree_norm2(_leaves(w))
        needs = after < _DGKS * before

        def again(w: Any) -> tuple[Any, jax.Array]:
            second = self.project_out(w, used)
            kept = jax.tree_util.tree_map(lambda s, x: jnp.where(needs, s, x), second, w)
            return kept, jnp.where(needs, tree_norm2(_leaves(second)), after)

        return jax.lax.cond(_any_in_batch(needs), again, lambda w: (w, after), w)


def _leaves(v: Any) -> list[jax.Array]:
    """A vector as its list of leaves (a flat array is one leaf)."""
    return list(v) if isinstance(v, list | tuple) else [v]


def _subtract(rows: list, w: list, inv: jax.Array) -> list:
    """``w - rows^T (inv * rows w)`` with the coefficients summed over the leaves."""
    coef = sum(contract(r, x, x.ndim) for r, x in zip(rows, w, strict=True)) * inv
    return [x - contract(coef, r, 1, like=x) for r, x in zip(rows, w, strict=True)]


def _divided(v: list, c: jax.Array) -> list:
    return [x / c for x in v]


def _first_vector(flat: _Flat, key: jax.Array, v0: list | None) -> list:
    """The start vector as the basis's leaves, in the working dtype.

    A random probe, or the given leaves (raveled into one when the basis is one raveled leaf).
    """
    if v0 is None:
        return flat.probe_leaves(key)
    if flat.draw is not None:
        v0 = [jnp.concatenate([jnp.ravel(a) for a in v0])]
    return [a.astype(flat.dtype) for a in v0]


# a restart probe gets at most _RESTART_PASSES Gram-Schmidt passes to come out orthogonal (a
# pass that keeps 1/sqrt(2) of its input's norm, as DGKS), else another probe is drawn, at most
# _RESTART_PROBES of them. A sign vector lies in the basis's span with a probability of 1/4 and
# more in a small dimension, and normalising what Gram-Schmidt leaves of a vector in (or near)
# the span gives one that is not orthogonal to the basis (Ritz values above the largest
# eigenvalue) or zero (a spurious eigenvalue 0): a restart probe's signs are weighted off the
# lattice of sign vectors (:func:`_off_lattice`)
_RESTART_PASSES = 3
_RESTART_PROBES = 4


_GOLDEN = 0.6180339887498949


def _off_lattice(probe: list) -> list:
    """Sign leaves times weights in [1, 2): entry i of leaf l times ``1 + frac((i + l/7) phi)``.

    Distinct weights (phi the golden ratio's fraction) take the probe off the lattice of sign
    vectors, in whose span a small Krylov basis often lies (one sign vector cancels another's
    part); a Gaussian draw would do the same but takes one Threefry hash per leaf (a loop each
    in a CPU program: 25 more loops and 15% more compile time for the 124M decoder), where the
    signs take one for the whole vector.
    """
    out = []
    for leaf, signs in enumerate(probe):
        index = jnp.arange(signs.size, dtype=jnp.float32).reshape(signs.shape)
        out.append(signs * (1 + jnp.mod((index + leaf / 7) * _GOLDEN, 1.0)).astype(signs.dtype))
    return out


def _next_vector(
    flat: _Flat,
    basis: _Basis,
    w: list,
    j: jax.Array,
    restart_key: jax.Array,
    alpha: jax.Array,
    beta_prev: jax.Array,
    scale: jax.Array,
) -> tuple[list, jax.Array, jax.Array, jax.Array]:
    r"""Lanczos step j's next vector from ``w``: orthogonalised, normalised, or a restart.

    ``w`` is orthogonalised against the basis's rows ``0 .. j`` (one pass, a second when the
    first cancelled), giving $\beta_j$; a $\beta_j$ at the rounding level of the running
    estimate ``scale`` of $\|A\|$ is a breakdown, and the next vector is then a probe (the
    signs of ``fold_in(restart_key, i)``, i = 0, 1, ..., weighted by :func:`_off_lattice`)
    orthogonalised against the same rows until a
    pass keeps $1/\sqrt 2$ of its input's norm (:data:`_RESTART_PASSES` passes per probe, then
    the next probe), and normalised. Every pass is the one Gram-Schmidt call of a loop (probes
    vmapped together: the loop runs while any of them has a pass to do, each keeping its own
    result, :func:`_any_in_batch`), so the program holds that code once; a branch of its own
    for the restart measured 3.5 s of 14 s compiling ``top_eigenvalues`` for the tiny
    reference decoder on 8 CPU devices.

    Returns:
      ``(next vector, beta_j (0 on breakdown), scale, whether it broke down)``; the next vector
      is zero where no probe came out orthogonal (the basis spans the space to working
      precision).
    """
    eps = jnp.finfo(flat.dtype).eps
    done = 3  # stages: 0 w's first pass, 1 its second, 2 a restart probe's pass, 3 done

    def verdict(beta: jax.Array) -> tuple[jax.Array, jax.Array]:
        new_scale = jnp.maximum(scale, jnp.abs(alpha) + beta_prev + beta)
        return new_scale, beta <= _BREAKDOWN * eps * new_scale

    def more(state: tuple) -> jax.Array:
        t, stage = state[0], state[4]
        limit = 2 + _RESTART_PASSES * _RESTART_PROBES
        return jnp.logical_and(t < limit, _any_in_batch(stage < done))

    def fresh_probe(vec: list, fresh: jax.Array, probes: jax.Array) -> list:
        probe = _off_lattice(flat.probe_leaves(jax.random.fold_in(restart_key, probes)))
        return [jnp.where(fresh, p, a) for p, a in zip(probe, vec, strict=True)]

    def attempt(state: tuple) -> tuple:
        t, vec, norm, beta, stage, passes, probes = state
        fresh = jnp.logical_and(stage == 2, passes == 0)
        candidate = jax.lax.cond(
            _any_in_batch(fresh), fresh_probe, lambda v, f, p: list(v), vec, fresh, probes
        )
        before = jnp.where(fresh, tree_norm2(candidate), norm)
        out = basis.project_out(candidate, j + 1)
        after = tree_norm2(out)
        kept = after >= _DGKS * before  # this pass left w orthogonal to working precision
        # w: its norm after its passes is beta_j; a breakdown turns to a restart probe
        w_final = jnp.logical_or(stage == 1, jnp.logical_and(stage == 0, kept))
        beta = jnp.where(w_final, after, beta)
        w_next = jnp.where(w_final, jnp.where(verdict(after)[1], 2, done), 1)
        # a restart probe: accepted, another pass, or (after _RESTART_PASSES) the next probe
        accepted = jnp.logical_and(kept, after > 0)
        last = jnp.logical_and(passes + 1 >= _RESTART_PASSES, probes + 1 >= _RESTART_PROBES)
        probe_next = jnp.where(jnp.logical_or(accepted, last), done, 2)
        new_stage = jnp.where(stage == 2, probe_next, w_next)
        new_passes = jnp.where(stage == 2, (passes + 1) % _RESTART_PASSES, 0)
        new_probes = probes + jnp.logical_and(stage == 2, new_passes == 0).astype(probes.dtype)
        failed = jnp.logical_and(stage == 2, jnp.logical_and(last, ~accepted))
        active = stage < done
        out = [jnp.where(failed, jnp.zeros_like(o), o) for o in out]
        vec = [jnp.where(active, o, a) for o, a in zip(out, vec, strict=True)]
        norm = jnp.where(active, jnp.where(failed, 0.0, after), norm).astype(norm.dtype)
        return (
            t + 1,
            vec,
            norm,
            beta,
            jnp.where(active, new_stage, stage),
            jnp.where(active, new_passes, passes),
            jnp.where(active, new_probes, probes),
        )

    zero, first = jnp.zeros((), flat.dtype), jnp.zeros((), jnp.int32)
    init = (first, list(w), tree_norm2(list(w)), zero, first, first, first)
    _, out, norm, beta, _, _, _ = jax.lax.while_loop(more, attempt, init)
    scale, broke = verdict(beta)
    fresh_norm = jnp.where(norm > 0, norm, 1.0)
    nxt = [a / jnp.where(broke, fresh_norm, beta) for a in out]
    return nxt, jnp.where(broke, jnp.zeros_like(beta), beta), scale, broke


def _lanczos_run(
    flat: _Flat,
    key: jax.Array,
    num_steps: int,
    v0: list | None,
    basis_dtype: Any = None,
):
    r"""Lanczos with full reorthogonalisation and random restarts: (alphas, betas, |v0|).

    Step j: $w = A v_j - \alpha_j v_j - \beta_{j-1} v_{j-1}$ (the three-term recurrence, in
    the working dtype), then Gram-Schmidt against the stored $v_0 \dots v_j$ (one pass, a
    second one only when the first cancelled, :meth:`_Basis.orthogonalize`). A $\beta_j$ at the
    rounding level of $\|A\|$ is an invariant subspace: $\beta_j$ is set to 0 and the next
    vector is a fresh random one orthogonalised against the basis (a restart). Every vector is
    a list of leaves shaped like the parameters' on a user's mesh (``flat.tree_matvec``; one
    raveled leaf off a mesh, :meth:`_Flat.for_bases`): dot products are sums of per-leaf
    contractions, and the basis is placed like the parameters (:class:`_Basis`).
    """
    key_start, key_restart = jax.random.split(key)
    flat = flat.for_bases()
    dtype = flat.dtype
    matvec = flat.tree_matvec
    # the loss at the parameters, from the products where they give it (:meth:`_Flat.with_loss`),
    # carried in the widest float enabled (cast without rounding)
    loss_dtype = jnp.result_type(float)
    with_loss = flat.tree_matvec_loss
    if with_loss is None:

        def with_loss(v: list) -> tuple[list, jax.Array]:
            return matvec(v), jnp.zeros((), loss_dtype)

    v0 = _first_vector(flat, key_start, v0)
    norm0 = tree_norm2(v0)
    v = _divided(v0, norm0)
    store = dtype if basis_dtype is None else basis_dtype
    shapes = [tuple(np.shape(a)) for a in v]
    shardings = leaf_shardings(flat.template)
    basis = _Basis.create(num_steps, shapes, dtype, store, shardings, flat.anchors()).set(0, v)

    # v_{j-1} for the three-term recurrence: read back from a full-precision basis (a copy
    # that lives only for the subtraction), carried in the working dtype beside a
    # lower-precision one (its rounded row would leave u beta_{j-1} behind, which hides a
    # breakdown and loses orthogonality)
    carry_prev = np.dtype(store) != np.dtype(dtype)

    def step(j: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        if carry_prev:
            rows, v, v_prev, beta_prev, alphas, betas, scale, _ = carry
            basis_j = basis.with_rows(rows)
        else:
            rows, v, beta_prev, alphas, betas, scale, _ = carry
            basis_j = basis.with_rows(rows)
            v_prev = basis_j.row(jnp.maximum(j - 1, 0))
        w, loss = with_loss(v)
        alpha = tree_dot(v, w)
        w = [a - alpha * b - beta_prev * c for a, b, c in zip(w, v, v_prev, strict=True)]
        nxt, beta, scale, broke = _next_vector(
            flat, basis_j, w, j, jax.random.fold_in(key_restart, j), alpha, beta_prev, scale
        )
        del broke
        rows = basis_j.set(j + 1, nxt).rows  # v_k (after the last step) is not kept
        rest = (
            beta,
            alphas.at[j].set(alpha),
            betas.at[j].set(beta),
            scale,
            loss.astype(loss_dtype),
        )
        return (rows, nxt, v, *rest) if carry_prev else (rows, nxt, *rest)

    zeros = jnp.zeros((num_steps,), dtype)
    zero = jnp.zeros((), dtype)
    prev = ([jnp.zeros_like(a) for a in v],) if carry_prev else ()
    init = (basis.rows, v, *prev, zero, zeros, zeros, zero, jnp.zeros((), loss_dtype))
    out = jax.lax.fori_loop(0, num_steps, step, init)
    alphas, betas, loss = out[-4], out[-3], out[-1]
    return alphas, betas[:-1], norm0, loss


def _bad_steps(alphas: jax.Array, betas: jax.Array) -> jax.Array:
    """Number of Lanczos steps whose alpha or (kept) beta is not finite."""
    return _num_bad_rows(alphas, jnp.concatenate([betas, jnp.zeros((1,), betas.dtype)]))


def _start_leaves(start: Any, flat: _Flat) -> list[jax.Array]:
    """``start`` (a flat vector of shape (n,), or a pytree shaped like ``like``) as leaves."""
    leaves, treedef = jax.tree_util.tree_flatten(flat.template)
    shapes = [tuple(np.shape(leaf)) for leaf in leaves]
    given, given_def = jax.tree_util.tree_flatten(start)
    if given_def == treedef and [tuple(np.shape(a)) for a in given] == shapes:
        return [jnp.asarray(a) for a in given]
    if len(given) == 1 and jnp.shape(given[0]) == (flat.size,):
        return _split(jnp.asarray(given[0]), shapes)
    raise ValueError(
        f"start: expected a flat vector of shape ({flat.size},) or a pytree shaped like "
        f"`like`, got {jax.tree_util.tree_map(jnp.shape, start)}"
    )


def _check_steps(num_steps: int, size: int) -> int:
    _check_kept_count(num_steps, "num_steps")
    if num_steps > size:
        raise ValueError(f"num_steps: expected at most the dimension {size}, got {num_steps}")
    return num_steps


@compile_once
def lanczos(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_steps: int,
    start: Any = None,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
) -> Tridiagonal:
    r"""Lanczos tridiagonalisation with full reorthogonalisation.

    Runs $k$ = ``num_steps`` steps from a random Rademacher start vector (or ``start``): the
    three-term recurrence, then Gram-Schmidt against all previous vectors (one
    classical pass, a second only when the first cancelled; module docstring, "Lanczos"). On
    breakdown (an invariant subspace found) it restarts from a fresh random vector orthogonal
    to the basis, so $T$ stays block-diagonal and its eigenvalues
    remain eigenvalues of $A$. Gauss quadrature: $e_1^\top T^p e_1 \|v_0\|^2 = v_0^\top A^p v_0$
    for $p < 2k$ (exact in exact arithmetic). Memory: the basis, $k \times n$ numbers of
    ``basis_dtype`` held leaf by leaf in the parameters' layout (on a mesh each device holds its
    share), beside the operator's (a linearised Hessian keeps its residuals) and about four
    vectors. Accuracy: a few $\epsilon \|A\|$ absolute (module docstring).

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key (start and restart vectors).
      num_steps: steps k, 1 <= k <= n. Static.
      start: optional start vector, finite and nonzero: a pytree shaped like ``like`` (on a
        mesh, placed like the parameters: the basis is kept leaf by leaf) or a flat vector of
        shape (n,) in the order of ``jax.flatten_util.ravel_pytree(like)`` (split into the
        leaves once).
      basis_dtype: dtype the Lanczos basis is stored in: ``None`` (the working dtype, default)
        or a lower precision (``"float32"`` for float64 work, ``"float16"`` / ``"bfloat16"``),
        which divides the basis's memory and the traffic of its Gram-Schmidt; accuracy in the
        module docstring ("Lanczos"). Static.
      linearize: for a loss operator (:func:`hvp`, :func:`kernels.ggn`, ...): ``True``
        linearises it once and every step runs only the tangent program, keeping the
        linearisation's residuals (a forward and backward pass's intermediates) for the whole
        run; ``False`` recomputes each product from scratch (for a Hessian a
        forward-over-reverse ``jax.jvp(jax.grad)``), keeping nothing between steps: less memory
        at more time per step (module docstring, "Lanczos"). ``"auto"`` (default) linearises
        while the residuals take at most 1 GiB (traced sizes, the whole model's:
        :data:`kernels._memory.PRODUCT_RESIDUAL_BYTES`), as Hutchinson's ``mode="auto"`` does,
        and recomputes beyond: at 1.2 billion parameters (FSDP over 8 devices) the residuals
        took 8.5 GiB per device, against 5.8 for the basis of 10 steps. Ignored for a plain
        callable and for operators over stacked batches, which recompute already. Static.

    Returns:
      Tridiagonal(diagonal, off_diagonal, start_norm).

    Raises:
      ValueError: if num_steps is not in [1, n], ``start`` is neither of shape (n,) nor
        shaped like ``like``, bad
        ``key`` / ``like``; (runtime check) non-finite inputs, a zero or non-finite ``start``,
        non-finite products (with how many of the k steps).

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> tri = lanczos(lambda v: d * v, 3, jax.random.key(0), num_steps=3)
    >>> [round(x, 3) for x in jnp.linalg.eigvalsh(tri.matrix()).tolist()]  # to a few eps ||A||
    [1.0, 2.0, 3.0]
    """
    check_key(key, "key")
    flat = _setup(matvec, like, linearize=linearize, loss=True)
    _check_steps(num_steps, flat.size)
    if start is not None:
        start = _start_leaves(start, flat)
        norm = tree_norm2(start)
        check_that(
            jnp.logical_and(jnp.isfinite(norm), norm > 0),
            "start: expected a finite nonzero vector",
        )
    store = _check_basis_dtype(basis_dtype, flat.dtype)
    alphas, betas, norm0, loss = _lanczos_run(flat, key, num_steps, start, store)
    flat.with_loss(loss).check_products(_bad_steps(alphas, betas), num_steps, "steps")
    return Tridiagonal(diagonal=alphas, off_diagonal=betas, start_norm=norm0)


@compile_once
def top_eigenvalues(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    k: int = 1,
    num_steps: int,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
) -> jax.Array:
    r"""The k largest eigenvalues of a symmetric operator by Lanczos (full reorthogonalisation).

    Ritz values (eigenvalues of $T$) of the ``num_steps``-step :func:`lanczos` matrix; the
    largest converge first. They are lower bounds of the true top eigenvalues (Cauchy
    interlacing, up to rounding) and exact once ``num_steps`` reaches the dimension n (larger
    values are clipped to n), to a few $\epsilon \|A\|$ absolute: float32 cannot separate
    eigenvalues closer than about $10^{-7}\lambda_{max}$ nor resolve ones below it (module
    docstring, "Lanczos"; use float64 parameters there). Memory: the :func:`lanczos` basis.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key (start vector).
      k: how many eigenvalues, 1 <= k <= n. Static.
      num_steps: Lanczos steps, >= k. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``), recompute each product
        (``False``: less memory, more time per step) or choose by the size of the
        linearisation (``"auto"``, default), as in :func:`lanczos`. Static.

    Returns:
      Array of shape (k,), largest first.

    Raises:
      ValueError: if k is not in [1, n], num_steps < k, bad ``key`` / ``like``; (runtime
        check) non-finite inputs or products.

    References:
      Lanczos 1950; Golub & Van Loan, Matrix Computations, section 10.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 5.0, 3.0, 2.0])
    >>> top = top_eigenvalues(lambda v: d * v, 4, jax.random.key(0), k=2, num_steps=4)
    >>> [round(x, 3) for x in top.tolist()]
    [5.0, 3.0]
    """
    check_key(key, "key")
    flat = _setup(matvec, like, linearize=linearize, loss=True)
    check_positive_int(k, "k")
    if k > flat.size:
        raise ValueError(f"k: expected at most the dimension {flat.size}, got {k}")
    check_positive_int(num_steps, "num_steps")
    if num_steps < k:
        raise ValueError(f"num_steps: expected >= k = {k}, got {num_steps}")
    steps = min(num_steps, flat.size)
    store = _check_basis_dtype(basis_dtype, flat.dtype)
    alphas, betas, _, loss = _lanczos_run(flat, key, steps, None, store)
    flat.with_loss(loss).check_products(_bad_steps(alphas, betas), steps, "steps")
    return jnp.linalg.eigvalsh(_tridiagonal_matrix(alphas, betas))[::-1][:k]
