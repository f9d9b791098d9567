r"""Curvature of a loss: Hessian-vector products, trace estimators, Lanczos, spectral density.

All kernels act on a linear operator given as a function ``matvec: v -> A v`` on pytrees shaped
like a template ``like`` (or on vectors of shape ``(n,)`` when ``like`` is an int ``n``). For a
loss, :func:`hvp` builds that operator from ``loss_fn(params)`` by forward-over-reverse
differentiation, linearised once so every probe reuses the same forward pass.

A dataset too large for one batch: write ``loss_fn(params, batch)``, stack equal-size batches
along a leading axis and use :func:`dataset_hvp`; its operator is the Hessian of the mean loss,
accumulated batch by batch with ``lax.scan`` (memory of one batch, no per-example Hessians):

    matvec = dataset_hvp(loss_fn, params, batches)
    estimate = hutchinson_trace(matvec, params, key, num_probes=64)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from kernels._checks import check_finite, check_positive_int, check_scalar_fn, is_concrete
from kernels.estimate import Estimate, estimate_from_samples
from kernels.parallel import map_samples

__all__ = [
    "Estimate",
    "dataset_hvp",
    "hessian_trace",
    "hutchinson_trace",
    "hutchpp_trace",
    "hvp",
    "lanczos",
    "slq_nodes",
    "spectral_density",
    "top_eigenvalues",
]

Matvec = Callable[[Any], Any]


def _template(like: Any) -> Any:
    """Turn ``like`` (pytree or int n) into a pytree template."""
    if isinstance(like, int) and not isinstance(like, bool):
        check_positive_int(like, "like")
        return jnp.zeros((like,), dtype=jnp.result_type(float))
    leaves = jax.tree_util.tree_leaves(like)
    if not leaves:
        raise ValueError("like: expected an int n or a pytree with at least one array leaf")
    for leaf in leaves:
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise ValueError(f"like: leaves must be floating arrays, got {jnp.result_type(leaf)}")
    return like


def _flat(like: Any) -> tuple[int, Any, Callable[[jax.Array], Any]]:
    """Size, dtype and unravel function of a template."""
    flat, unravel = ravel_pytree(jax.tree_util.tree_map(jnp.zeros_like, like))
    return flat.size, flat.dtype, unravel


def _flat_matvec(matvec: Matvec, like: Any) -> tuple[int, Any, Callable[[jax.Array], jax.Array]]:
    size, dtype, unravel = _flat(like)

    def flat_mv(x: jax.Array) -> jax.Array:
        return ravel_pytree(matvec(unravel(x)))[0].astype(dtype)

    return size, dtype, flat_mv


def _chunk(chunk_size: int | None) -> int:
    """Validate ``chunk_size`` (None means one probe at a time)."""
    if chunk_size is None:
        return 1
    return check_positive_int(chunk_size, "chunk_size")


def _probe(key: jax.Array, size: int, dtype: Any, kind: str) -> jax.Array:
    if kind == "rademacher":
        return jax.random.rademacher(key, (size,), dtype=dtype)
    return jax.random.normal(key, (size,), dtype=dtype)


def hvp(loss_fn: Callable[[Any], jax.Array], params: Any) -> Matvec:
    r"""Hessian-vector product operator of a scalar loss at ``params``.

    Returns $v \mapsto \nabla^2 L(\theta) v$ computed forward-over-reverse
    (``jax.linearize`` of ``jax.grad(loss_fn)``): the gradient's forward and backward pass at
    $\theta$ are evaluated once when the operator is built, and each product only runs the
    linearised (tangent) program, so a batch of probes shares the forward work.

    Args:
      loss_fn: ``params -> scalar`` loss, closing over its data batch; must be traceable.
      params: pytree at which the Hessian is taken.

    Returns:
      ``matvec(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``loss_fn`` does not return a real scalar or ``params`` is not finite.

    >>> import jax.numpy as jnp
    >>> mv = hvp(lambda x: jnp.sum(x**3), jnp.array([1.0, 2.0]))
    >>> mv(jnp.array([1.0, 1.0]))
    Array([ 6., 12.], dtype=float64)
    """
    check_scalar_fn(loss_fn, params, "loss_fn")
    check_finite(params, "params")
    _, linear = jax.linearize(jax.grad(loss_fn), params)
    return linear


def dataset_hvp(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batches: Any,
    *,
    weights: jax.Array | None = None,
) -> Matvec:
    r"""Hessian-vector product of a loss averaged over data batches, one batch in memory at a time.

    $$H v = \sum_b w_b \nabla^2 L_b(\theta) v,$$ with $L_b$ = ``loss_fn(params, batch_b)`` and
    $w_b = 1/B$ by default (the dataset mean when batches have equal size). Each product scans
    the batches with ``lax.scan`` (forward-over-reverse per batch), so memory holds one batch and
    no per-example Hessians; pass the result to :func:`hutchinson_trace` and friends.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss on one batch.
      params: pytree at which the Hessian is taken.
      batches: pytree whose leaves have a leading axis of length B indexing batches.
      weights: optional (B,) weights $w_b$ (e.g. batch sizes over the total).

    Returns:
      ``matvec(v)`` for pytrees ``v`` shaped like ``params``.

    Raises:
      ValueError: if ``loss_fn`` does not return a scalar, ``params`` is not finite, or
        ``weights`` does not have shape (B,).
    """
    num_batches = jnp.shape(jax.tree_util.tree_leaves(batches)[0])[0]
    first = jax.tree_util.tree_map(lambda leaf: leaf[0], batches)
    check_scalar_fn(lambda p: loss_fn(p, first), params, "loss_fn")
    check_finite(params, "params")
    dtype = ravel_pytree(params)[0].dtype
    if weights is None:
        weights = jnp.full((num_batches,), 1.0 / num_batches, dtype=dtype)
    elif jnp.shape(weights) != (num_batches,):
        raise ValueError(f"weights: expected shape ({num_batches},), got {jnp.shape(weights)}")

    def matvec(v: Any) -> Any:
        def body(acc: Any, xs: Any) -> tuple[Any, None]:
            batch, weight = xs
            grad_fn = jax.grad(lambda p: loss_fn(p, batch))
            hv = jax.jvp(grad_fn, (params,), (v,))[1]
            acc = jax.tree_util.tree_map(lambda a, h: a + weight.astype(a.dtype) * h, acc, hv)
            return acc, None

        zero = jax.tree_util.tree_map(jnp.zeros_like, v)
        return jax.lax.scan(body, zero, (batches, weights))[0]

    return matvec


def hutchinson_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_probes: int,
    chunk_size: int | None = None,
    probe: Literal["rademacher", "gaussian"] = "rademacher",
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ from products $v \mapsto Av$ (Hutchinson).

    $$\hat t = \frac{1}{m}\sum_{i=1}^m v_i^\top A v_i,$$ unbiased for Rademacher or standard
    Gaussian probes; with Rademacher probes it is exact for diagonal $A$ and its variance is
    $2(\|A\|_F^2 - \sum_i A_{ii}^2)/m$ (Gaussian: $2\|A\|_F^2/m$). The standard error is the
    sample standard deviation of $v_i^\top A v_i$ over $\sqrt m$.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric); must be traceable.
      like: pytree (or int n) fixing probe structure and dtype. Static.
      key: PRNG key; one subkey per probe, so results do not depend on ``chunk_size``.
      num_probes: m >= 2. Static.
      chunk_size: probes per vectorised batch (memory bound); ``None`` (default) runs probes
        sequentially, which on CPU is also fastest for Hessians since the forward is shared.
      probe: ``"rademacher"`` or ``"gaussian"``.

    Returns:
      Estimate(mean, stderr, num_samples=m).

    Raises:
      ValueError: if num_probes < 2, ``probe`` is unknown or ``like`` is not floating.

    References:
      Hutchinson 1989, doi:10.1080/03610918908812806.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> hutchinson_trace(lambda v: d * v, 3, jax.random.key(0), num_probes=4).mean
    Array(6., dtype=float64)
    """
    check_positive_int(num_probes, "num_probes", minimum=2)
    if probe not in ("rademacher", "gaussian"):
        raise ValueError(f"probe: expected 'rademacher' or 'gaussian', got {probe!r}")
    like = _template(like)
    size, dtype, flat_mv = _flat_matvec(matvec, like)

    def one(k: jax.Array) -> jax.Array:
        v = _probe(k, size, dtype, probe)
        return jnp.vdot(v, flat_mv(v))

    values = map_samples(one, jax.random.split(key, num_probes), chunk_size=_chunk(chunk_size))
    return estimate_from_samples(values)


def hutchpp_trace(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_matvecs: int,
    chunk_size: int | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}(A)$ with Hutch++ (low-rank deflation plus Hutchinson).

    With budget $m$ products: a Rademacher sketch $S$ with $s = \lfloor m/3 \rfloor$ columns,
    $Q = \operatorname{orth}(AS)$, and
    $$\hat t = \operatorname{tr}(Q^\top A Q) + \frac{1}{g}\sum_{i=1}^{g}
    g_i^\top (I-QQ^\top) A (I-QQ^\top) g_i,\quad g = m - 2s.$$
    Unbiased; its error falls like $1/m$ instead of $1/\sqrt m$ when $A$ has a few dominant
    eigenvalues. ``stderr`` is the standard error of the Hutchinson part alone (the deflated
    term $\operatorname{tr}(Q^\top A Q)$ is treated as fixed given $S$), so it measures the
    residual variance, not the variability of the sketch.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n) fixing probe structure and dtype. Static.
      key: PRNG key.
      num_matvecs: total products m >= 4 (so s >= 1 and g >= 2). Static.
      chunk_size: products per vectorised batch; ``None`` runs them sequentially.

    Returns:
      Estimate(mean, stderr of the Hutchinson part, num_samples=m).

    Raises:
      ValueError: if num_matvecs < 4.

    References:
      Meyer, Musco, Musco, Woodruff 2021, "Hutch++", arXiv:2010.09649.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0, 3.0])
    >>> round(float(hutchpp_trace(lambda v: d * v, 3, jax.random.key(0), num_matvecs=9).mean), 6)
    6.0
    """
    check_positive_int(num_matvecs, "num_matvecs", minimum=4)
    like = _template(like)
    size, dtype, flat_mv = _flat_matvec(matvec, like)
    num_sketch = min(num_matvecs // 3, size)
    num_hutch = num_matvecs - 2 * num_sketch
    chunk = _chunk(chunk_size)
    key_sketch, key_hutch = jax.random.split(key)

    sketch = jax.vmap(lambda k: _probe(k, size, dtype, "rademacher"))(
        jax.random.split(key_sketch, num_sketch)
    )
    image = map_samples(flat_mv, sketch, chunk_size=chunk)  # rows A s_j
    basis, _ = jnp.linalg.qr(image.T)  # (size, num_sketch)
    a_basis = map_samples(flat_mv, basis.T, chunk_size=chunk)
    low_rank = jnp.sum(basis.T * a_basis)

    def one(k: jax.Array) -> jax.Array:
        g = _probe(k, size, dtype, "rademacher")
        g = g - basis @ (basis.T @ g)
        return jnp.vdot(g, flat_mv(g))

    rest = estimate_from_samples(
        map_samples(one, jax.random.split(key_hutch, num_hutch), chunk_size=chunk)
    )
    return Estimate(mean=low_rank + rest.mean, stderr=rest.stderr, num_samples=num_matvecs)


def hessian_trace(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    num_probes: int,
    method: Literal["hutchinson", "hutchpp"] = "hutchinson",
    chunk_size: int | None = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr}\nabla^2 L(\theta)$ of a loss closing over one batch.

    Builds :func:`hvp` once and runs :func:`hutchinson_trace` (``num_probes`` probes) or
    :func:`hutchpp_trace` (``num_probes`` products). For data that does not fit one batch use
    :func:`dataset_hvp` with :func:`hutchinson_trace` (module docstring).

    Args:
      loss_fn: ``params -> scalar``.
      params: pytree.
      key: PRNG key.
      num_probes: number of Hessian-vector products (>= 2; >= 4 for Hutch++). Static.
      method: ``"hutchinson"`` or ``"hutchpp"``.
      chunk_size: probes per vectorised batch; ``None`` runs them sequentially.

    Returns:
      Estimate of the trace.

    Raises:
      ValueError: for an unknown method, a non-scalar loss, non-finite params, too few probes.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda p: 0.5 * jnp.sum(jnp.array([1.0, 2.0]) * p["w"] ** 2)
    >>> hessian_trace(loss, {"w": jnp.zeros(2)}, jax.random.key(0), num_probes=8).mean
    Array(3., dtype=float64)
    """
    if method not in ("hutchinson", "hutchpp"):
        raise ValueError(f"method: expected 'hutchinson' or 'hutchpp', got {method!r}")
    check_positive_int(num_probes, "num_probes", minimum=2 if method == "hutchinson" else 4)
    matvec = hvp(loss_fn, params)
    if method == "hutchinson":
        return hutchinson_trace(matvec, params, key, num_probes=num_probes, chunk_size=chunk_size)
    return hutchpp_trace(matvec, params, key, num_matvecs=num_probes, chunk_size=chunk_size)


def lanczos(
    matvec: Matvec, like: Any, key: jax.Array, *, num_steps: int, start: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    r"""Lanczos tridiagonalisation with full reorthogonalisation.

    Runs ``num_steps`` steps from a random Rademacher start vector (or ``start``, a flat vector),
    orthogonalising every new vector twice against all previous ones (classical Gram-Schmidt,
    twice). On breakdown (an invariant subspace found) it restarts from a fresh random vector
    orthogonal to the basis, so the tridiagonal matrix stays block-diagonal and its eigenvalues
    remain eigenvalues of $A$.

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n). Static.
      key: PRNG key (start and restart vectors).
      num_steps: steps k, 1 <= k <= n. Static.
      start: optional flat start vector of length n.

    Returns:
      ``(tridiagonal, first)``: the k x k tridiagonal matrix $T$ and the norm of the start
      vector (so $e_1$ of $T$ corresponds to ``start / first``).

    Raises:
      ValueError: if num_steps is not in [1, n] or ``start`` does not have shape (n,).
    """
    like = _template(like)
    size, dtype, flat_mv = _flat_matvec(matvec, like)
    check_positive_int(num_steps, "num_steps")
    if num_steps > size:
        raise ValueError(f"num_steps: expected at most the dimension {size}, got {num_steps}")
    if start is not None and jnp.shape(start) != (size,):
        raise ValueError(
            f"start: expected a flat vector of shape ({size},), got {jnp.shape(start)}"
        )
    key_start, key_restart = jax.random.split(key)
    v0 = _probe(key_start, size, dtype, "rademacher") if start is None else start.astype(dtype)
    norm0 = jnp.linalg.norm(v0)
    basis = jnp.zeros((num_steps + 1, size), dtype).at[0].set(v0 / norm0)
    tiny = jnp.finfo(dtype).eps

    def orth(w: jax.Array, basis: jax.Array) -> jax.Array:
        w = w - basis.T @ (basis @ w)
        return w - basis.T @ (basis @ w)

    def step(j: int, carry: tuple[jax.Array, jax.Array, jax.Array, jax.Array]):
        basis, alphas, betas, scale = carry
        v = basis[j]
        w = flat_mv(v)
        alpha = jnp.vdot(v, w)
        w = orth(w, basis)
        beta = jnp.linalg.norm(w)
        scale = jnp.maximum(scale, jnp.abs(alpha) + beta)
        broke = beta <= 1e3 * tiny * scale
        fresh = orth(_probe(jax.random.fold_in(key_restart, j), size, dtype, "rademacher"), basis)
        fresh_norm = jnp.linalg.norm(fresh)
        nxt = jnp.where(
            broke,
            fresh / jnp.where(fresh_norm > 0, fresh_norm, 1.0),
            w / jnp.where(broke, 1.0, beta),
        )
        basis = basis.at[j + 1].set(nxt)
        return basis, alphas.at[j].set(alpha), betas.at[j].set(jnp.where(broke, 0.0, beta)), scale

    zeros = jnp.zeros((num_steps,), dtype)
    _, alphas, betas, _ = jax.lax.fori_loop(
        0, num_steps, step, (basis, zeros, zeros, jnp.zeros((), dtype))
    )
    off = betas[:-1]
    tri = jnp.diag(alphas) + jnp.diag(off, 1) + jnp.diag(off, -1)
    return tri, norm0


def top_eigenvalues(
    matvec: Matvec, like: Any, key: jax.Array, *, k: int = 1, num_iterations: int
) -> jax.Array:
    r"""The k largest eigenvalues of a symmetric operator by Lanczos (full reorthogonalisation).

    Ritz values of the ``num_iterations``-step Lanczos tridiagonal matrix; the largest converge
    first. They are lower bounds of the true top eigenvalues (Cauchy interlacing) and exact
    once ``num_iterations`` reaches the dimension n (larger values are clipped to n).

    Args:
      matvec: ``v -> A v`` on pytrees shaped like ``like`` (A symmetric).
      like: pytree (or int n). Static.
      key: PRNG key (start vector).
      k: how many eigenvalues, 1 <= k <= n. Static.
      num_iterations: Lanczos steps, >= k. Static.

    Returns:
      Array of shape (k,), largest first.

    Raises:
      ValueError: if k is larger than the dimension or num_iterations < k.

    References:
      Lanczos 1950; Golub & Van Loan, Matrix Computations, section 10.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 5.0, 3.0, 2.0])
    >>> top_eigenvalues(lambda v: d * v, 4, jax.random.key(0), k=2, num_iterations=4)
    Array([5., 3.], dtype=float64)
    """
    like = _template(like)
    size = _flat(like)[0]
    check_positive_int(k, "k")
    if k > size:
        raise ValueError(f"k: expected at most the dimension {size}, got {k}")
    check_positive_int(num_iterations, "num_iterations")
    if num_iterations < k:
        raise ValueError(f"num_iterations: expected >= k = {k}, got {num_iterations}")
    tri, _ = lanczos(matvec, like, key, num_steps=min(num_iterations, size))
    return jnp.linalg.eigvalsh(tri)[::-1][:k]


def slq_nodes(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_probes: int,
    num_steps: int,
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Gauss quadrature nodes and weights of stochastic Lanczos quadrature.

    For each Rademacher probe $v$ (normalised), ``num_steps`` Lanczos steps give nodes
    $\theta_j$ (Ritz values) and weights $\tau_j = (e_1^\top u_j)^2$ with
    $\sum_j \tau_j f(\theta_j) \approx v^\top f(A) v / \|v\|^2$ (exact for polynomials of degree
    < 2 k), so $\frac{1}{P}\sum_p \sum_j \tau_{pj} f(\theta_{pj})$ is an estimate of
    $\frac1n \operatorname{tr} f(A)$.

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n). Static.
      key: PRNG key.
      num_probes: P >= 1. Static.
      num_steps: Lanczos steps k per probe, 1 <= k <= n. Static.
      chunk_size: probes per vectorised batch; ``None`` runs them sequentially.

    Returns:
      ``(nodes, weights)``, each of shape (P, k); weights sum to 1 per probe.

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159; Ubaru, Chen, Saad 2017.
    """
    check_positive_int(num_probes, "num_probes")
    like = _template(like)

    def one(k: jax.Array) -> tuple[jax.Array, jax.Array]:
        tri, _ = lanczos(matvec, like, k, num_steps=num_steps)
        evals, evecs = jnp.linalg.eigh(tri)
        return evals, evecs[0] ** 2

    return map_samples(one, jax.random.split(key, num_probes), chunk_size=_chunk(chunk_size))


def spectral_density(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_probes: int,
    num_steps: int,
    num_points: int = 1024,
    bandwidth: float | None = None,
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Spectral density of a symmetric operator by stochastic Lanczos quadrature.

    $$\phi(t) = \frac{1}{P}\sum_{p=1}^P \sum_{j=1}^k \tau_{pj}\,
    \frac{1}{\sqrt{2\pi}\sigma} e^{-(t-\theta_{pj})^2 / (2\sigma^2)},$$
    a Gaussian-smoothed estimate of the normalised eigenvalue density
    $\frac1n\sum_i \delta(t-\lambda_i)$ (integrates to 1). See :func:`slq_nodes`.

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n). Static.
      key: PRNG key.
      num_probes: P >= 1. Static.
      num_steps: Lanczos steps per probe. Static.
      num_points: grid size. Static.
      bandwidth: smoothing $\sigma$; default 1% of the range of the nodes.
      chunk_size: probes per vectorised batch.

    Returns:
      ``(grid, density)`` of shape (num_points,) each; the grid spans the nodes plus
      5 bandwidths either side.

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159.
    """
    check_positive_int(num_points, "num_points", minimum=2)
    if bandwidth is not None and is_concrete(bandwidth) and not bandwidth > 0:
        raise ValueError(f"bandwidth: expected > 0, got {bandwidth}")
    nodes, weights = slq_nodes(
        matvec, like, key, num_probes=num_probes, num_steps=num_steps, chunk_size=chunk_size
    )
    lo, hi = jnp.min(nodes), jnp.max(nodes)
    width = jnp.maximum(hi - lo, jnp.maximum(jnp.abs(hi), 1.0) * 1e-6)
    sigma = 0.01 * width if bandwidth is None else jnp.asarray(bandwidth, nodes.dtype)
    grid = jnp.linspace(lo - 5 * sigma, hi + 5 * sigma, num_points, dtype=nodes.dtype)
    z = (grid[:, None] - nodes.reshape(-1)[None, :]) / sigma
    kernel = jnp.exp(-0.5 * z**2) / (jnp.sqrt(2 * jnp.pi).astype(nodes.dtype) * sigma)
    density = kernel @ weights.reshape(-1) / num_probes
    return grid, density
