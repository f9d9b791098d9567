r"""Empirical Rademacher complexity by Monte Carlo over sign vectors.

$$\mathrm{Rad}_S(\mathcal F) = \mathbb E_\sigma \sup_{f\in\mathcal F}
\frac1n\sum_{i=1}^n \sigma_i f(x_i), \qquad \sigma \sim \mathrm{Unif}\{\pm1\}^n.$$

Every kernel here is built from a *sup function* ``signs[c, n] -> values[c]`` (one value
$\sup_f \frac1n\langle\sigma, f(S)\rangle$ per sign vector) and one Monte Carlo driver:

- :func:`linear_sup`: exact sup for norm-ball linear classes (dual norm);
- :func:`finite_sup`: exact sup for a finite class whose outputs are produced on demand;
- :func:`search_sup`: a *lower bound* of the sup over a constrained parameter set (projected
  gradient ascent).

:func:`rademacher_linear`, :func:`rademacher_finite` and :func:`rademacher_search` average
them over ``num_draws`` random sign vectors; :func:`rademacher_exact` enumerates all $2^n$.

Sign vectors and determinism
----------------------------
Draw $k$ uses its own key ``fold_in(key, k)`` and is unpacked from
$\lceil n/32\rceil$ raw 32-bit words (``jax.random.bits``): sample $i$ gets bit $i \bmod 32$ of
word $\lfloor i/32\rfloor$, bit 1 meaning $-1$. Unpacking costs a shift, a mask and a bitcast
per sign, several times cheaper than ``jax.random.rademacher``. Because every draw has its own
key, any chunk of draws can be regenerated alone from the key and its indices
(:func:`sign_chunk`), and neither ``chunk_size`` nor the device count changes which sign vector
draw $k$ is (results differ only by floating-point reassociation of the final sums).

Memory and devices
------------------
Draws are processed ``chunk_size`` at a time in one fused pass: generate the chunk's signs, apply
the sup function (for linear classes one GEMM ``signs @ inputs`` and a row-wise dual norm),
reduce the chunk to (count, mean, M2) (Chan et al.'s pairwise update). Peak memory is bounded by
the chunk, never by ``num_draws``: a million draws hold one chunk of signs at a time. The chunks
are spread over ``jax.devices()`` with :func:`kernels.parallel.map_samples` (``shard_map`` over
a one-axis mesh); chunk $c$ computes the same numbers on any device, so the sharded result equals
the single-device result for the same key.

Many hosts: call ``jax.distributed.initialize()`` on every process, then call the kernel *inside*
``jax.jit`` with the same arguments (same key, same replicated inputs) on every process.
``jax.devices()`` then lists the devices of all hosts, the chunk indices are created inside the
jitted program and sharded over the global mesh, and the final (count, mean, M2) reduction is a
cross-device collective, so every process receives the same replicated Estimate.

Confidence intervals
--------------------
Flipping one sign changes $\sup_f \frac1n\langle\sigma, f\rangle$ by at most $2b/n$ when
$|f(x_i)| \le b$; McDiarmid's inequality over the $nK$ independent signs of $K$ draws gives the
$(1-\delta)$ interval $\bar Y \pm 2b\sqrt{\ln(2/\delta)/(2nK)}$ for $\mathrm{Rad}_S$ around the
$K$-draw average $\bar Y$ of exact sups (SPEC.md section 1).

References:
  Bartlett & Mendelson 2002, JMLR 3:463-482 (Rademacher complexity);
  McDiarmid 1989, "On the method of bounded differences";
  Chan, Golub, LeVeque 1979 (pairwise variance update).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_finite, check_positive, check_positive_int
from kernels.estimate import Estimate
from kernels.norms import dual_exponent, vector_norm
from kernels.parallel import map_samples

__all__ = [
    "finite_sup",
    "linear_sup",
    "mcdiarmid_halfwidth",
    "rademacher_exact",
    "rademacher_finite",
    "rademacher_linear",
    "rademacher_search",
    "search_sup",
    "sign_chunk",
    "sign_vectors",
]

SupFn = Callable[[jax.Array], jax.Array]

_WORD_BITS = 32
# Default sign entries (draws x samples) per chunk: 2**20 float32 = 4 MiB, cache-sized.
_CHUNK_ENTRIES = 2**20
# Default sign vectors per vmapped chunk in rademacher_search (CPU cache friendly).
_SEARCH_CHUNK = 8


# --------------------------------------------------------------------------- sign vectors


def _unpack_signs(words: jax.Array, num_samples: int, dtype: Any) -> jax.Array:
    """Words ``[..., W]`` (uint32) -> signs ``[..., num_samples]``: bit i%32 of word i//32."""
    dtype = jnp.dtype(dtype)
    lead = words.shape[:-1]
    shifts = jnp.arange(_WORD_BITS, dtype=jnp.uint32).reshape((1,) * words.ndim + (_WORD_BITS,))
    if dtype == jnp.float32:
        # move bit k to the IEEE sign bit and OR in the bits of 1.0: a shift, a mask, a bitcast.
        top = (words[..., None] << (jnp.uint32(_WORD_BITS - 1) - shifts)) & jnp.uint32(0x80000000)
        out = jax.lax.bitcast_convert_type(top | jnp.uint32(0x3F800000), jnp.float32)
    else:
        bit = (words[..., None] >> shifts) & jnp.uint32(1)
        one = jnp.ones((), dtype)
        out = jnp.where(bit == jnp.uint32(1), -one, one)
    return out.reshape(*lead, -1)[..., :num_samples]


def _signs_at(key: jax.Array, indices: jax.Array, num_samples: int, dtype: Any) -> jax.Array:
    """Sign vectors of the draws ``indices`` (any shape) -> ``[*indices.shape, num_samples]``."""
    num_words = -(-num_samples // _WORD_BITS)
    flat = indices.reshape(-1)
    words = jax.vmap(
        lambda i: jax.random.bits(jax.random.fold_in(key, i), (num_words,), jnp.uint32)
    )(flat)
    return _unpack_signs(words, num_samples, dtype).reshape(*indices.shape, num_samples)


def sign_chunk(
    key: jax.Array, chunk_index: Any, *, chunk_size: int, num_samples: int, dtype: Any = jnp.float32
) -> jax.Array:
    r"""Rows ``chunk_index * chunk_size ... + chunk_size - 1`` of :func:`sign_vectors`, alone.

    Regenerates one chunk of draws from the key and the chunk index without drawing the others
    (draw $k$ has key ``fold_in(key, k)``). ``chunk_index`` may be traced.

    Args:
      key: PRNG key.
      chunk_index: which chunk (int or int array scalar).
      chunk_size: draws per chunk. Static.
      num_samples: n, the length of each sign vector. Static.
      dtype: floating dtype of the signs.

    Returns:
      ``[chunk_size, num_samples]`` array of +-1.

    >>> import jax, jax.numpy as jnp
    >>> key = jax.random.key(0)
    >>> full = sign_vectors(key, num_draws=6, num_samples=5)
    >>> bool(jnp.all(sign_chunk(key, 1, chunk_size=3, num_samples=5) == full[3:]))
    True
    """
    check_positive_int(chunk_size, "chunk_size")
    check_positive_int(num_samples, "num_samples")
    start = jnp.asarray(chunk_index, jnp.uint32) * jnp.uint32(chunk_size)
    idx = start + jnp.arange(chunk_size, dtype=jnp.uint32)
    return _signs_at(key, idx, num_samples, dtype)


def sign_vectors(
    key: jax.Array, *, num_draws: int, num_samples: int, dtype: Any = jnp.float32
) -> jax.Array:
    r"""``num_draws`` i.i.d. uniform sign vectors in $\{\pm1\}^n$, as a ``[num_draws, n]`` array.

    Row $k$ depends only on ``(key, k)``, so any chunk of rows can be regenerated alone with
    :func:`sign_chunk`. The kernels never call this for all draws at once; it is for tests and
    small problems.

    Args:
      key: PRNG key.
      num_draws: number of sign vectors. Static.
      num_samples: n. Static.
      dtype: floating dtype of the signs.

    Raises:
      ValueError: if a size is not a positive int.

    >>> import jax
    >>> s = sign_vectors(jax.random.key(1), num_draws=2, num_samples=3)
    >>> s.shape, s.dtype, bool(((s == 1) | (s == -1)).all())
    ((2, 3), dtype('float32'), True)
    """
    check_positive_int(num_draws, "num_draws")
    check_positive_int(num_samples, "num_samples")
    return _signs_at(key, jnp.arange(num_draws, dtype=jnp.uint32), num_samples, dtype)


# --------------------------------------------------------------------------- sup functions


def _parse_norm(norm: Any, readout: Any) -> tuple[float, float | None]:
    """Return (p, q): p the (across-column) exponent, q the within-column one or None."""
    if isinstance(norm, tuple | list):
        if len(norm) != 2:
            raise ValueError(f"norm: expected p or a pair (q, p), got {norm!r}")
        if readout is None:
            raise ValueError("readout: a matrix class norm=(q, p) needs a readout vector u")
        q, p = (float(v) for v in norm)
        dual_exponent(q)
        dual_exponent(p)
        return p, q
    dual_exponent(norm)
    if readout is not None:
        raise ValueError("readout: only used with a matrix class norm=(q, p)")
    return float(norm), None


def linear_sup(
    inputs: jax.Array, *, norm: Any, radius: Any, readout: jax.Array | None = None
) -> SupFn:
    r"""Exact sup function of a norm-ball linear class, ``signs[c, n] -> values[c]``.

    Vector class $\{x \mapsto \langle w, x\rangle : \|w\|_p \le B\}$ (``norm=p``):
    $\sup = \frac{B}{n}\|\sum_i \sigma_i x_i\|_{p^*}$ (Hölder, attained).

    Matrix class $\{x \mapsto u^\top W x : W \in \mathbb R^{k\times d}, \|W\|_{q,p} \le B\}$
    (``norm=(q, p)``, group norm = p-norm of the column q-norms, fixed readout $u \in \mathbb R^k$):
    with $v = \sum_i \sigma_i x_i$, $u^\top W v = \langle W, u v^\top\rangle$ and the dual of
    $\|\cdot\|_{q,p}$ is $\|\cdot\|_{q^*,p^*}$, so $\sup = \frac{B}{n}\|u\|_{q^*}\|v\|_{p^*}$.

    Args:
      inputs: ``[n, d]`` sample.
      norm: p in [1, inf] for the vector class, or a pair (q, p) for the matrix class.
      radius: B > 0.
      readout: ``[k]`` vector u, required for (and only for) the matrix class.

    Returns:
      A function of ``signs[c, n]`` returning ``[c]`` sups; its ``.bound`` attribute is
      $b = \sup_{f, i} |f(x_i)| = B \|u\|_{q^*} \max_i \|x_i\|_{p^*}$ (for McDiarmid).

    Raises:
      ValueError: on bad shapes, exponents, non-positive radius or non-finite inputs.
    """
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 2 or not jnp.issubdtype(inputs.dtype, jnp.floating):
        raise ValueError(f"inputs: expected a float [n, d] array, got {inputs.dtype}{inputs.shape}")
    check_finite(inputs, "inputs")
    check_positive(radius, "radius")
    p, q = _parse_norm(norm, readout)
    p_dual = dual_exponent(p)
    scale = jnp.asarray(radius, inputs.dtype) / jnp.asarray(inputs.shape[0], inputs.dtype)
    if q is not None:
        readout = jnp.asarray(readout)
        if readout.ndim != 1:
            raise ValueError(f"readout: expected a vector [k], got shape {readout.shape}")
        check_finite(readout, "readout")
        scale = scale * vector_norm(readout.astype(inputs.dtype), dual_exponent(q))

    def sup(signs: jax.Array) -> jax.Array:
        v = jnp.dot(signs, inputs, preferred_element_type=inputs.dtype)
        return scale * vector_norm(v, p_dual, axis=-1)

    sup.bound = jnp.max(vector_norm(inputs, p_dual, axis=1)) * scale * inputs.shape[0]
    sup.num_samples = inputs.shape[0]
    sup.dtype = inputs.dtype
    return sup


def _check_outputs_fn(outputs_fn: Callable, num_members: int, member_chunk: int) -> Any:
    idx = jax.ShapeDtypeStruct((member_chunk,), jnp.int32)
    try:
        out = jax.eval_shape(outputs_fn, idx)
    except Exception as err:  # re-raised naming the argument
        raise ValueError(
            f"outputs_fn: could not be evaluated on {member_chunk} indices: {err}"
        ) from err
    if len(out.shape) != 2 or out.shape[0] != member_chunk:
        raise ValueError(
            f"outputs_fn: indices[{member_chunk}] must give outputs [{member_chunk}, n], "
            f"got shape {out.shape}"
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"outputs_fn: must return floating outputs, got {out.dtype}")
    return out


def finite_sup(
    outputs_fn: Callable[[jax.Array], jax.Array],
    num_members: int,
    *,
    member_chunk: int | None = None,
) -> SupFn:
    r"""Exact sup function of a finite class, ``signs[c, n] -> values[c]``.

    $\sup = \max_{j < M} \frac1n \langle \sigma, V_j\rangle$ where ``outputs_fn(indices)``
    returns the member outputs $V_j = (f_j(x_1), \dots, f_j(x_n))$ for an int32 index vector
    of length ``member_chunk``. Members are visited ``member_chunk`` at a time (a
    ``lax.fori_loop``), so memory holds ``c x member_chunk`` scores and ``member_chunk x n``
    outputs, never the whole output matrix. The last chunk's indices past ``M - 1`` are clamped
    to ``M - 1`` before the call and masked after.

    Args:
      outputs_fn: int32 ``[member_chunk]`` indices -> ``[member_chunk, n]`` outputs; traceable.
      num_members: M. Static.
      member_chunk: members per block (default min(M, 1024)). Static.

    Returns:
      The sup function; its ``.bound`` attribute is a function computing
      $b = \max_{j,i} |V_{ji}|$ (one extra pass over the members).

    Raises:
      ValueError: on bad counts or if ``outputs_fn`` does not return ``[member_chunk, n]``.
    """
    num_members = check_positive_int(num_members, "num_members")
    mc = min(num_members, 1024) if member_chunk is None else member_chunk
    mc = min(check_positive_int(mc, "member_chunk"), num_members)
    out = _check_outputs_fn(outputs_fn, num_members, mc)
    num_samples, dtype = out.shape[1], out.dtype
    num_blocks = -(-num_members // mc)

    def block(b: Any) -> tuple[jax.Array, jax.Array]:
        idx = b * mc + jnp.arange(mc, dtype=jnp.int32)
        valid = idx < num_members
        return outputs_fn(jnp.minimum(idx, num_members - 1)), valid

    def sup(signs: jax.Array) -> jax.Array:
        def body(b: Any, best: jax.Array) -> jax.Array:
            vals, valid = block(b)
            scores = jnp.dot(signs, vals.T, preferred_element_type=dtype)
            scores = jnp.where(valid[None, :], scores, -jnp.inf)
            return jnp.maximum(best, jnp.max(scores, axis=1))

        init = jnp.full(signs.shape[:1], -jnp.inf, dtype)
        best = jax.lax.fori_loop(0, num_blocks, body, init)
        return best / jnp.asarray(num_samples, dtype)

    def bound() -> jax.Array:
        def body(b: Any, acc: jax.Array) -> jax.Array:
            vals, valid = block(b)
            return jnp.maximum(acc, jnp.max(jnp.where(valid[:, None], jnp.abs(vals), 0)))

        return jax.lax.fori_loop(0, num_blocks, body, jnp.zeros((), dtype))

    sup.bound = bound
    sup.num_samples = num_samples
    sup.dtype = dtype
    return sup


def _tree_global_norm(tree: Any) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(leaf * leaf) for leaf in jax.tree_util.tree_leaves(tree)))


def search_sup(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_steps: int,
    step_size: float,
    num_restarts: int = 1,
    init_scale: float = 1.0,
) -> SupFn:
    r"""Lower-bound sup function of a constrained parametric class, ``signs[c, n] -> values[c]``.

    For each sign vector, projected gradient ascent on
    $g_\sigma(\theta) = \frac1n\sum_i \sigma_i f_\theta(x_i)$ over $\Theta$ = the range of
    ``project``: $\theta_{t+1} = P(\theta_t + \eta_t\, \nabla g_\sigma(\theta_t) /
    \|\nabla g_\sigma(\theta_t)\|_2)$ (normalised steps, so ``step_size`` is in parameter units;
    $\eta_t$ decays geometrically from ``step_size`` to ``step_size / 100``),
    started from ``project(params)`` and from ``num_restarts - 1`` random points
    ``project(params + init_scale * z)``, z Gaussian with each leaf's RMS scale (shared by all
    sign vectors, drawn from ``key``). The value is the best $g_\sigma$ seen over all iterates and
    restarts. Every iterate is feasible, so each value is a **lower bound** of
    $\sup_{\theta\in\Theta} g_\sigma(\theta)$. Sign vectors and restarts are vmapped: one
    batched program, not a loop.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` of shape ``[n]`` or ``[n, 1]``.
      params: parameter pytree (a point of the class; the first start).
      inputs: the sample (any pytree ``apply_fn`` accepts).
      key: PRNG key for the random restarts.
      project: Euclidean projection onto the constraint set (params -> params).
      num_steps: ascent steps per start. Static.
      step_size: first step length eta_0 > 0, in parameter (global l2) units; about the
        diameter of the constraint set is a good choice.
      num_restarts: starts per sign vector (>= 1). Static.
      init_scale: scale of the random restarts relative to each leaf's RMS.

    Returns:
      The sup function (lower bound).

    Raises:
      ValueError: on bad counts / step size or if ``apply_fn`` does not give ``[n]`` outputs.
    """
    check_positive_int(num_steps, "num_steps")
    check_positive_int(num_restarts, "num_restarts")
    check_positive(step_size, "step_size")
    try:
        out = jax.eval_shape(apply_fn, params, inputs)
    except Exception as err:  # re-raised naming the argument
        raise ValueError(f"apply_fn: could not be evaluated at params, inputs: {err}") from err
    if len(out.shape) not in (1, 2) or (len(out.shape) == 2 and out.shape[1] != 1):
        raise ValueError(f"apply_fn: must return outputs [n] or [n, 1], got shape {out.shape}")
    num_samples, dtype = out.shape[0], out.dtype

    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))

    def random_start(r: Any) -> Any:
        new = []
        for leaf, k in zip(leaves, keys, strict=True):
            leaf = jnp.asarray(leaf)
            rms = jnp.sqrt(jnp.mean(leaf * leaf))
            rms = jnp.where(rms > 0, rms, jnp.ones_like(rms))
            z = jax.random.normal(jax.random.fold_in(k, r), leaf.shape, leaf.dtype)
            new.append(leaf + jnp.asarray(init_scale, leaf.dtype) * rms * z)
        return project(jax.tree_util.tree_unflatten(treedef, new))

    starts = [project(params)] + [random_start(r) for r in range(1, num_restarts)]
    starts = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *starts)
    # geometric decay eta_t = step_size * 0.01 ** (t / (T - 1)): big first steps reach the
    # boundary / the best vertex, small last steps settle.
    decay = 0.01 ** (np.arange(num_steps) / max(num_steps - 1, 1))
    etas = jnp.asarray(np.append(step_size * decay, 0.0), dtype)
    tiny = jnp.asarray(jnp.finfo(dtype).tiny, dtype)

    def ascend(signs: jax.Array, theta0: Any) -> jax.Array:
        def g(theta: Any) -> jax.Array:
            f = apply_fn(theta, inputs).reshape(num_samples).astype(dtype)
            return jnp.dot(signs, f) / jnp.asarray(num_samples, dtype)

        def step(carry: Any, eta: jax.Array) -> Any:
            theta, best = carry
            val, grad = jax.value_and_grad(g)(theta)
            gnorm = jnp.maximum(_tree_global_norm(grad), tiny)
            theta = project(
                jax.tree_util.tree_map(
                    lambda t, d: t + (eta / gnorm).astype(t.dtype) * d, theta, grad
                )
            )
            return (theta, jnp.maximum(best, val)), None

        init = (theta0, jnp.full((), -jnp.inf, dtype))
        # one extra scan step evaluates the last iterate (its update is discarded): the
        # compiled program holds one copy of the model's forward and backward pass, not two
        (_, best), _ = jax.lax.scan(step, init, etas)
        return best

    def sup(signs: jax.Array) -> jax.Array:
        per_start = jax.vmap(jax.vmap(ascend, in_axes=(None, 0)), in_axes=(0, None))
        return jnp.max(per_start(signs.astype(dtype), starts), axis=1)

    sup.num_samples = num_samples
    sup.dtype = dtype
    return sup


# --------------------------------------------------------------------------- Monte Carlo driver


def mcdiarmid_halfwidth(bound: Any, *, num_samples: int, num_draws: int, delta: float) -> Any:
    r"""Half-width $2b\sqrt{\ln(2/\delta)/(2nK)}$ of the McDiarmid interval for $\mathrm{Rad}_S$.

    Valid around the average of $K$ exact sups over i.i.d. sign vectors when $|f(x_i)| \le b$.

    >>> round(float(mcdiarmid_halfwidth(1.0, num_samples=50, num_draws=2, delta=0.05)), 6)
    0.27162
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta: expected 0 < delta < 1, got {delta!r}")
    return 2 * bound * math.sqrt(math.log(2 / delta) / (2 * num_samples * num_draws))


def _combine(counts: jax.Array, means: jax.Array, m2s: jax.Array) -> tuple[Any, Any, Any]:
    """Chan et al.: merge per-chunk (count, mean, M2) into totals."""
    total = jnp.sum(counts)
    mean = jnp.sum(counts * means) / total
    m2 = jnp.sum(m2s) + jnp.sum(counts * (means - mean) ** 2)
    return total, mean, m2


def _default_chunk(num_draws: int, num_samples: int) -> int:
    return max(1, min(num_draws, _CHUNK_ENTRIES // max(num_samples, 1)))


def _monte_carlo(
    sup: SupFn,
    key: jax.Array,
    *,
    num_samples: int,
    dtype: Any,
    num_draws: int,
    chunk_size: int | None,
) -> tuple[jax.Array, jax.Array]:
    """Mean and stderr of ``sup`` over ``num_draws`` sign vectors, one fused pass per chunk."""
    check_positive_int(num_draws, "num_draws", minimum=2)
    chunk = _default_chunk(num_draws, num_samples) if chunk_size is None else chunk_size
    chunk = min(check_positive_int(chunk, "chunk_size"), num_draws)
    num_chunks = -(-num_draws // chunk)

    def one_chunk(c: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        idx = c.astype(jnp.uint32) * jnp.uint32(chunk) + jnp.arange(chunk, dtype=jnp.uint32)
        vals = sup(_signs_at(key, idx, num_samples, dtype))
        valid = idx < jnp.uint32(num_draws)
        cnt = jnp.sum(valid).astype(dtype)
        mean = jnp.sum(jnp.where(valid, vals, 0)) / cnt
        m2 = jnp.sum(jnp.where(valid, (vals - mean) ** 2, 0))
        return cnt, mean, m2

    counts, means, m2s = map_samples(
        one_chunk, jnp.arange(num_chunks, dtype=jnp.int32), chunk_size=1
    )
    total, mean, m2 = _combine(counts, means, m2s)
    stderr = jnp.sqrt(m2 / (total - 1) / total)
    return mean, stderr


def _with_interval(
    mean: Any,
    stderr: Any,
    bound: Any,
    *,
    num_samples: int,
    num_draws: int,
    delta: float | None,
    one_sided: bool = False,
) -> Estimate:
    if delta is None or bound is None:
        return Estimate(mean=mean, stderr=stderr, num_samples=num_draws)
    hw = mcdiarmid_halfwidth(bound, num_samples=num_samples, num_draws=num_draws, delta=delta)
    upper = jnp.full_like(mean, jnp.inf) if one_sided else mean + hw
    return Estimate(
        mean=mean, stderr=stderr, num_samples=num_draws, lower=mean - hw, upper=upper, delta=delta
    )


def rademacher_linear(
    inputs: jax.Array,
    key: jax.Array,
    *,
    norm: Any,
    radius: Any,
    num_draws: int,
    chunk_size: int | None = None,
    readout: jax.Array | None = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a norm-ball linear class (exact sups).

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_{k=1}^K \frac{B}{n}\Big\|\sum_i\sigma^{(k)}_i x_i
    \Big\|_{p^*}$$ (times $\|u\|_{q^*}$ for the matrix class, see :func:`linear_sup`): an
    unbiased estimate of $\mathrm{Rad}_S$. Chunks of ``chunk_size`` draws are generated from raw
    random bits, multiplied by ``inputs`` (one GEMM) and reduced in one pass, sharded over
    ``jax.devices()``; memory is bounded by the chunk, not by ``num_draws``.

    Args:
      inputs: ``[n, d]`` sample (its dtype is the compute dtype).
      key: PRNG key.
      norm: p in [1, inf] (vector class) or a pair (q, p) (matrix class, needs ``readout``).
      radius: B > 0.
      num_draws: K >= 2 sign vectors. Static.
      chunk_size: draws per fused chunk (default: about 2**20 / n); does not change the draws.
      readout: u for the matrix class.
      delta: confidence of the McDiarmid interval (None for no interval).

    Returns:
      Estimate(mean, stderr, K, lower, upper, delta) with the McDiarmid $(1-\delta)$ interval.

    Raises:
      ValueError: on bad shapes, exponents, sizes, or non-finite inputs.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.eye(4)  # ||sum_i s_i e_i||_2 = 2 for every sign vector: Rad = B * 2 / 4
    >>> est = rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, num_draws=8)
    >>> float(est.mean), float(est.stderr)
    (0.5, 0.0)
    """
    sup = linear_sup(inputs, norm=norm, radius=radius, readout=readout)
    n = inputs.shape[0]
    mean, stderr = _monte_carlo(
        sup, key, num_samples=n, dtype=inputs.dtype, num_draws=num_draws, chunk_size=chunk_size
    )
    return _with_interval(mean, stderr, sup.bound, num_samples=n, num_draws=num_draws, delta=delta)


def rademacher_finite(
    outputs_fn: Callable[[jax.Array], jax.Array],
    num_members: int,
    key: jax.Array,
    *,
    num_draws: int,
    member_chunk: int | None = None,
    draw_chunk: int | None = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a finite class given by its outputs.

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_k \max_{j<M}\frac1n\langle\sigma^{(k)}, V_j\rangle,$$
    unbiased for $\mathrm{Rad}_S$, with $V_j$ = ``outputs_fn(indices)[row]`` produced on demand
    ``member_chunk`` members at a time, so a class of $10^6$ members never needs its output
    matrix in memory (see :func:`finite_sup`). Draws go ``draw_chunk`` at a time, sharded over
    devices.

    Args:
      outputs_fn: int32 ``[member_chunk]`` indices -> ``[member_chunk, n]`` member outputs.
      num_members: M. Static.
      key: PRNG key.
      num_draws: K >= 2. Static.
      member_chunk: members per block (default min(M, 1024)).
      draw_chunk: sign vectors per chunk (default about 2**20 / n); does not change the draws.
      delta: confidence of the McDiarmid interval (b = max |V|), None for none.

    Returns:
      Estimate with the McDiarmid $(1-\delta)$ interval.

    Raises:
      ValueError: on bad sizes or outputs.

    >>> import jax, jax.numpy as jnp
    >>> V = jnp.array([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])  # all of {+-1}^2
    >>> est = rademacher_finite(lambda i: V[i], 4, jax.random.key(0), num_draws=4)
    >>> float(est.mean)  # max_j <s, V_j> / 2 = 1 for every s
    1.0
    """
    sup = finite_sup(outputs_fn, num_members, member_chunk=member_chunk)
    n = sup.num_samples
    mean, stderr = _monte_carlo(
        sup, key, num_samples=n, dtype=sup.dtype, num_draws=num_draws, chunk_size=draw_chunk
    )
    bound = sup.bound() if delta is not None else None
    return _with_interval(mean, stderr, bound, num_samples=n, num_draws=num_draws, delta=delta)


def rademacher_search(
    apply_fn: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_draws: int,
    num_steps: int,
    step_size: float,
    num_restarts: int = 1,
    chunk_size: int | None = None,
    init_scale: float = 1.0,
    output_bound: Any = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""A Monte Carlo **lower bound** on the Rademacher complexity of a constrained network class.

    $$\widehat{\mathrm{Rad}}_{\mathrm{search}} = \frac1K\sum_k \max_{t,r}\,
    \frac1n\sum_i\sigma^{(k)}_i f_{\theta^{(k)}_{t,r}}(x_i) \;\le\;
    \frac1K\sum_k\sup_{\theta\in\Theta}\frac1n\sum_i\sigma^{(k)}_i f_\theta(x_i),$$
    where $\theta^{(k)}_{t,r}$ are the (feasible) iterates of projected gradient ascent from
    restart $r$ (see :func:`search_sup`). Its expectation is therefore **at most**
    $\mathrm{Rad}_S(\{f_\theta : \theta\in\Theta\})$; the stderr is over sign vectors only. All
    ``chunk_size`` sign vectors of a chunk ascend at once, vmapped (one program for all
    ``num_draws``; chunks run in a ``lax.map`` and shard over devices).

    With ``output_bound`` $b \ge \sup_{\theta\in\Theta,i}|f_\theta(x_i)|$ the Estimate carries a
    one-sided $(1-\delta)$ McDiarmid lower confidence bound ``lower`` for $\mathrm{Rad}_S$
    (``upper`` is $+\infty$): the search average is below the exact-sup average, which is within
    the McDiarmid half-width of $\mathrm{Rad}_S$.

    Args:
      apply_fn: ``(params, inputs) -> [n]`` (or ``[n, 1]``) outputs.
      params: parameters; the first start and the structure of the class.
      inputs: the sample.
      key: PRNG key (sign vectors and random restarts).
      project: Euclidean projection onto the constraint set.
      num_draws: K >= 2 sign vectors. Static.
      num_steps: ascent steps. Static.
      step_size: first normalised step length eta_0 > 0 (parameter units), decaying
        geometrically to eta_0 / 100 over the steps; about the constraint set's diameter.
      num_restarts: starts per sign vector. Static.
      chunk_size: sign vectors vmapped at once (default min(num_draws, 8)). On CPU small
        chunks are fastest (each sign vector's activations stay in cache: bench/rademacher.py
        measured chunks of 8 faster than all 1,024 at once); on accelerators use hundreds.
      init_scale: relative scale of random restarts.
      output_bound: b for the McDiarmid lower confidence bound (optional).
      delta: its confidence.

    Returns:
      Estimate of the lower bound.

    Raises:
      ValueError: on bad sizes or outputs.

    >>> import jax, jax.numpy as jnp
    >>> from kernels.norms import project_lp_ball
    >>> x = jnp.eye(4)
    >>> est = rademacher_search(lambda w, x: x @ w, jnp.zeros(4), x, jax.random.key(0),
    ...     project=lambda w: project_lp_ball(w, p=2, radius=1.0), num_draws=4, num_steps=5,
    ...     step_size=2.0)
    >>> round(float(est.mean), 6)  # the exact sup is ||s||_2 / 4 = 0.5 for every s
    0.5
    """
    sup = search_sup(
        apply_fn,
        params,
        inputs,
        jax.random.fold_in(key, 0x5EA4C4),
        project=project,
        num_steps=num_steps,
        step_size=step_size,
        num_restarts=num_restarts,
        init_scale=init_scale,
    )
    n = sup.num_samples
    chunk = min(num_draws, _SEARCH_CHUNK) if chunk_size is None else chunk_size
    mean, stderr = _monte_carlo(
        sup, key, num_samples=n, dtype=sup.dtype, num_draws=num_draws, chunk_size=chunk
    )
    return _with_interval(
        mean, stderr, output_bound, num_samples=n, num_draws=num_draws, delta=delta, one_sided=True
    )


def rademacher_exact(
    sup: SupFn, num_samples: int, *, chunk_size: int | None = None, dtype: Any = None
) -> Estimate:
    r"""Exact empirical Rademacher average by enumerating all $2^n$ sign vectors ($n \le 20$).

    $$\mathrm{Rad}_S = 2^{-n}\sum_{\sigma\in\{\pm1\}^n} \mathrm{sup}(\sigma)$$ for any sup
    function of this module (:func:`linear_sup`, :func:`finite_sup`; with :func:`search_sup` it
    is the exact average of the search lower bound). Sign vector $t$ has $\sigma_i = -1$ iff bit
    $i$ of $t$ is set. The reference the Monte Carlo tests use.

    Args:
      sup: ``signs[c, n] -> values[c]``.
      num_samples: n <= 20. Static.
      chunk_size: sign vectors per batch (default min(2^n, 4096)).
      dtype: dtype of the signs (default: ``sup.dtype`` if set, else the default float dtype).

    Returns:
      Estimate(mean, stderr=0, num_samples=2^n).

    Raises:
      ValueError: if n > 20 or not positive.

    >>> import jax.numpy as jnp
    >>> est = rademacher_exact(linear_sup(jnp.eye(3), norm=1, radius=1.0), 3)
    >>> float(est.mean)  # ||s||_inf / 3
    0.3333333333333333
    """
    n = check_positive_int(num_samples, "num_samples")
    if n > 20:
        raise ValueError(f"num_samples: enumeration needs n <= 20, got {n}")
    if dtype is None:
        dtype = getattr(sup, "dtype", None)
        dtype = jnp.result_type(float) if dtype is None else dtype
    total = 2**n
    chunk = (
        min(total, 4096)
        if chunk_size is None
        else min(check_positive_int(chunk_size, "chunk_size"), total)
    )
    num_chunks = -(-total // chunk)
    bits = jnp.arange(n, dtype=jnp.uint32)
    one = jnp.ones((), dtype)

    def one_chunk(c: jax.Array) -> jax.Array:
        t = c.astype(jnp.uint32) * jnp.uint32(chunk) + jnp.arange(chunk, dtype=jnp.uint32)
        signs = jnp.where(((t[:, None] >> bits[None, :]) & jnp.uint32(1)) == 1, -one, one)
        vals = sup(signs)
        return jnp.sum(jnp.where(t < jnp.uint32(total), vals, 0))

    sums = jax.lax.map(one_chunk, jnp.arange(num_chunks, dtype=jnp.int32))
    mean = jnp.sum(sums) / jnp.asarray(total, dtype)
    return Estimate(mean=mean, stderr=jnp.zeros_like(mean), num_samples=total)
