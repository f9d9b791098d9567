"""Stochastic Lanczos quadrature: quadrature nodes of random probes and the spectral density."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_key,
    check_positive,
    check_positive_int,
    describe,
)
from kernels._flat import _check_kept_count, _check_linearize, _indices, _num_bad_rows, _setup
from kernels._hessian import Matvec
from kernels._jit import compile_once
from kernels._lanczos import _check_basis_dtype, _check_steps, _lanczos_run, _tridiagonal_matrix
from kernels._memory import probe_chunk
from kernels._names import renamed_kwargs
from kernels.parallel import (
    map_samples,
    sample_key,
    splits_user_mesh,
)

# --------------------------------------------------------------------------- SLQ


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuadratureNodes:
    r"""Gauss quadrature nodes and weights of stochastic Lanczos quadrature (:func:`slq_nodes`).

    Attributes:
      nodes: Ritz values $\theta_{pj}$, shape (P, k).
      weights: $\tau_{pj} = (e_1^\top u_{pj})^2$, shape (P, k); each row sums to 1.
    """

    nodes: jax.Array
    weights: jax.Array


def _slq(
    matvec: Any,
    like: Any,
    key: Any,
    num_samples: int,
    num_steps: int,
    chunk_size: Any,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
    start: jax.Array | None = None,
) -> QuadratureNodes:
    """Nodes and weights of probes ``0 .. num_samples - 1`` (from ``start`` where given)."""
    key = check_key(key, "key")
    _check_kept_count(num_samples, "num_samples")
    indices = _indices(num_samples)
    if start is not None:  # a block of the probe stream (kernels.blocks): a traced uint32 start
        indices = start + indices
    chunk = probe_chunk(chunk_size)
    # on a user's mesh the probes run inside shard_maps: products recomputed there
    linearize = _check_linearize(linearize)
    if splits_user_mesh():
        linearize = False
    flat = _setup(matvec, like, linearize=linearize)
    _check_steps(num_steps, flat.size)
    store = _check_basis_dtype(basis_dtype, flat.dtype)

    def one(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        alphas, betas, _, _ = _lanczos_run(flat, sample_key(key, i), num_steps, None, store)
        evals, evecs = jnp.linalg.eigh(_tridiagonal_matrix(alphas, betas))
        return evals, evecs[0] ** 2

    nodes, weights = map_samples(one, indices, chunk_size=chunk, key=key)
    flat.check_products(_num_bad_rows(nodes, weights), num_samples, "probes")
    return QuadratureNodes(nodes=nodes, weights=weights)


@compile_once
def _slq_block(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    start: jax.Array,
    count: int,
    *,
    num_steps: int,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
    num_grid: int = 1024,
    bandwidth: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Nodes and weights of probes ``start .. start + count - 1`` of :func:`slq_nodes`.

    ``start`` is a traced uint32 scalar (one program per ``count``); probe $p$ has the key it
    has in the one call (also of :func:`spectral_density`). ``num_grid`` and ``bandwidth`` are
    checked as :func:`spectral_density` does and otherwise unused. Private machinery of
    :mod:`kernels.blocks`.
    """
    _check_density_options(num_grid, bandwidth)
    q = _slq(matvec, like, key, count, num_steps, chunk_size, basis_dtype, linearize, start=start)
    return q.nodes, q.weights


def _check_density_options(num_grid: Any, bandwidth: Any) -> None:
    check_positive_int(num_grid, "num_grid", minimum=2)
    if bandwidth is None:
        return
    if isinstance(bandwidth, np.ndarray | jax.Array) and bandwidth.shape != ():
        raise ValueError(
            f"bandwidth: expected a finite scalar > 0 (or None), got {describe(bandwidth)}"
        )
    check_positive(bandwidth, "bandwidth")


def _default_width(lo: jax.Array, hi: jax.Array) -> jax.Array:
    r"""The range the default bandwidth is 1% of: $\max(hi - lo, f \max(|lo|, |hi|))$.

    The floor $f = \max(10^{-6}, 2^{17}\varepsilon)$ is relative to the nodes' scale (1 where
    all nodes are 0), so a spectrum of one repeated value gets a bandwidth far above the dtype's
    resolution at that value (the default grid's points are distinct and the density integrates
    to 1), and tiny eigenvalues (1e-10) are not smeared by an absolute floor.
    """
    scale = jnp.maximum(jnp.abs(lo), jnp.abs(hi))
    scale = jnp.where(scale > 0, scale, jnp.ones_like(scale))
    floor = max(1e-6, 2**17 * float(jnp.finfo(lo.dtype).eps))
    return jnp.maximum(hi - lo, scale * jnp.asarray(floor, lo.dtype))


def _density(
    nodes: jax.Array, weights: jax.Array, num_grid: int, bandwidth: Any
) -> SpectralDensity:
    """The smoothed density of :func:`spectral_density` from the nodes and weights (P, k)."""
    num_samples = nodes.shape[0]
    lo, hi = jnp.min(nodes), jnp.max(nodes)
    sigma = 0.01 * _default_width(lo, hi) if bandwidth is None else bandwidth
    sigma = jnp.asarray(sigma, nodes.dtype)
    grid = jnp.linspace(lo - 5 * sigma, hi + 5 * sigma, num_grid, dtype=nodes.dtype)
    z = (grid[:, None] - nodes.reshape(-1)[None, :]) / sigma
    kernel = jnp.exp(-0.5 * z**2) / (jnp.sqrt(2 * jnp.pi).astype(nodes.dtype) * sigma)
    density = kernel @ weights.reshape(-1) / num_samples
    return SpectralDensity(grid=grid, density=density)


@compile_once
def _density_finish(
    nodes: jax.Array, weights: jax.Array, num_grid: int = 1024, bandwidth: Any = None
) -> SpectralDensity:
    """:func:`_density` as one program (for :mod:`kernels.blocks`)."""
    _check_density_options(num_grid, bandwidth)
    return _density(nodes, weights, num_grid, bandwidth)


@renamed_kwargs(num_probes="num_samples")
@compile_once
def slq_nodes(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_steps: int,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
) -> QuadratureNodes:
    r"""Gauss quadrature nodes and weights of stochastic Lanczos quadrature.

    For each Rademacher probe $v_p$ (normalised; probe $p$ uses ``fold_in(key, p)``),
    ``num_steps`` Lanczos steps give nodes $\theta_{pj}$ (Ritz values) and weights
    $\tau_{pj} = (e_1^\top u_{pj})^2$ with
    $\sum_j \tau_{pj} f(\theta_{pj}) \approx v_p^\top f(A) v_p / \|v_p\|^2$ (exact for
    polynomials of degree < 2k), so $\frac{1}{P}\sum_p \sum_j \tau_{pj} f(\theta_{pj})$ is an
    unbiased estimate of $\frac1n \operatorname{tr} f(A)$ for such $f$. The output holds
    $P \times k$ nodes; the work memory is that of ``chunk_size`` probes' Lanczos bases.
    :class:`kernels.blocks.MonteCarloBlocks` computes probes ``[start, stop)`` (each as in this
    call) and merges them into this result (also of :func:`spectral_density`).

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key.
      num_samples: probes, P >= 1 (``num_probes`` is its deprecated name). Static.
      num_steps: Lanczos steps k per probe, 1 <= k <= n. Static.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``), recompute each product
        (``False``: less memory, more time per step) or choose by the size of the
        linearisation (``"auto"``, default), as in :func:`lanczos`. Static.

    Returns:
      QuadratureNodes(nodes, weights), each of shape (P, k).

    Raises:
      ValueError: for bad counts, ``key``, ``chunk_size`` or ``like``; (runtime check)
        non-finite inputs or products (with how many of the P probes).

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159; Ubaru, Chen, Saad 2017.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 2.0])
    >>> q = slq_nodes(lambda v: d * v, 2, jax.random.key(0), num_samples=3, num_steps=2)
    >>> jnp.round(q.nodes, 6)
    Array([[1., 2.],
           [1., 2.],
           [1., 2.]], dtype=float32)
    """
    return _slq(matvec, like, key, num_samples, num_steps, chunk_size, basis_dtype, linearize)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpectralDensity:
    """A smoothed eigenvalue density on a grid (:func:`spectral_density`).

    Attributes:
      grid: evaluation points, shape (num_grid,), increasing.
      density: the density at ``grid``, shape (num_grid,); integrates to about 1.
    """

    grid: jax.Array
    density: jax.Array


@renamed_kwargs(num_probes="num_samples")
@compile_once
def spectral_density(
    matvec: Matvec,
    like: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_steps: int,
    num_grid: int = 1024,
    bandwidth: Any = None,
    chunk_size: int | Literal["auto"] | None = None,
    basis_dtype: Any = None,
    linearize: bool | Literal["auto"] = "auto",
) -> SpectralDensity:
    r"""Spectral density of a symmetric operator by stochastic Lanczos quadrature.

    $$\phi(t) = \frac{1}{P}\sum_{p=1}^P \sum_{j=1}^k \tau_{pj}\,
    \frac{1}{\sqrt{2\pi}\sigma} e^{-(t-\theta_{pj})^2 / (2\sigma^2)},$$
    a Gaussian-smoothed estimate of the normalised eigenvalue density
    $\frac1n\sum_i \delta(t-\lambda_i)$ (integrates to 1). See :func:`slq_nodes`.

    Args:
      matvec: ``v -> A v`` (A symmetric).
      like: pytree (or int n).
      key: PRNG key.
      num_samples: probes, P >= 1 (``num_probes`` is its deprecated name). Static.
      num_steps: Lanczos steps per probe. Static.
      num_grid: grid size >= 2. Static.
      bandwidth: smoothing $\sigma > 0$, a scalar (a float is static, an array traced);
        default 1% of the range of the nodes, or of $f\max|\theta|$ where that is larger,
        $f = \max(10^{-6}, 2^{17}\varepsilon)$ (0.016 in float32): a spectrum of one repeated
        value still gets a grid of distinct points and a density that integrates to 1.
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU, 16 on a GPU or TPU. Static.
      basis_dtype: dtype the Lanczos basis is stored in, as in :func:`lanczos`. Static.
      linearize: linearise a loss operator once (``True``), recompute each product
        (``False``: less memory, more time per step) or choose by the size of the
        linearisation (``"auto"``, default), as in :func:`lanczos`. Static.

    Returns:
      SpectralDensity(grid, density), each of shape (num_grid,); the grid spans the nodes plus
      5 bandwidths either side.

    Raises:
      ValueError: as :func:`slq_nodes`, and for num_grid < 2, a ``bandwidth`` that is not a
        scalar or (also at runtime) a non-positive or non-finite one.

    References:
      Ghorbani, Krishnan, Xiao 2019, arXiv:1901.10159.

    >>> import jax, jax.numpy as jnp
    >>> d = jnp.array([1.0, 3.0])
    >>> s = spectral_density(lambda v: d * v, 2, jax.random.key(0), num_samples=2, num_steps=2,
    ...                      num_grid=5, bandwidth=1.0)
    >>> jnp.round(s.grid, 6)
    Array([-4., -1.,  2.,  5.,  8.], dtype=float32)
    """
    _check_density_options(num_grid, bandwidth)
    q = _slq(matvec, like, key, num_samples, num_steps, chunk_size, basis_dtype, linearize)
    return _density(q.nodes, q.weights, num_grid, bandwidth)
