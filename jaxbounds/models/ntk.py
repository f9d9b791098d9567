r"""Linearisation around initialisation and the empirical neural tangent kernel.

For a scalar-output model $f(\theta; x)$ and parameters $\theta_0$:

- the linearised model $f^{lin}(\theta; x) = f(\theta_0; x) + \langle \nabla_\theta f(\theta_0; x),
  \theta - \theta_0\rangle$ (one ``jax.jvp``, no Jacobian is stored);
- the empirical NTK Gram matrix $K_{ab} = \langle \nabla_\theta f(\theta; x_a),
  \nabla_\theta f(\theta; x_b)\rangle$ on a data set, computed tile by tile: tiles $A, B$ of
  ``tile_size`` examples give $K_{AB} = J_A J_B^\top$ from the two tiles' per-example gradients,
  so memory holds two tiles of Jacobian rows (``2 * tile_size * num_params`` numbers), never all
  $N$ of them; only the tiles $A \le B$ are computed, $K$ is symmetric;
- its diagonal $K_{aa} = \|\nabla_\theta f(\theta; x_a)\|^2$ alone (:func:`ntk_diagonal`);
- $\alpha = \sigma_{\min}(F_{pre}^0)$, the smallest singular value of the (N, d_m) matrix of last
  hidden features at initialisation (Lemma 4 / Theorem 5 of the shallow-Transformer GD paper, after
  Wu et al. 2024).

The NTK-regime comparison (the model and its linearisation trained side by side) runs a training
loop, so it lives one floor up, in :mod:`jaxbounds.training.ntk_regime`.

References:
  Jacot, Gabriel, Hongler 2018, "Neural tangent kernel", arXiv:1806.07572;
  Lee et al. 2019, "Wide neural networks of any depth evolve as linear models under gradient
  descent", arXiv:1902.06720; Novak et al. 2022, "Fast finite width neural tangent kernel",
  arXiv:2206.08720; Wu et al. 2024, arXiv:2311.01575.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_positive_int
from kernels._precision import check_compute_dtype, in_compute, work_params, work_result_type
from kernels.parallel import map_samples

__all__ = [
    "empirical_ntk",
    "feature_alpha",
    "linearize_model",
    "linearized_apply",
    "ntk_diagonal",
    "ntk_min_eigenvalue",
]


def linearized_apply(
    apply_fn: Callable[[Any, Any], jax.Array], params: Any, params0: Any, inputs: Any
) -> jax.Array:
    r"""The first-order Taylor model of ``apply_fn`` around ``params0``, evaluated at ``params``.

    $$f^{lin}(\theta; x) = f(\theta_0; x) + J_{\theta_0}(x)(\theta - \theta_0),$$

    exact at $\theta = \theta_0$ and equal to $f$ up to $O(\|\theta - \theta_0\|^2)$. Evaluated with
    one ``jax.jvp`` (forward mode), so no Jacobian is materialised; it is linear in ``params``.
    ``params0`` is an argument (not a closure), so inside a compiled training step it stays an
    input of the program rather than a folded constant.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; must be traceable.
      params: where to evaluate (pytree shaped like ``params0``).
      params0: the expansion point.
      inputs: the model inputs.

    Returns:
      Outputs shaped like ``apply_fn(params0, inputs)``.

    >>> import jax.numpy as jnp
    >>> f = lambda p, x: p["w"] ** 2 * x
    >>> float(linearized_apply(f, {"w": jnp.array(4.0)}, {"w": jnp.array(3.0)}, jnp.array(1.0)))
    15.0
    """
    delta = jax.tree_util.tree_map(jnp.subtract, params, params0)
    out, tangent = jax.jvp(lambda p: apply_fn(p, inputs), (params0,), (delta,))
    return out + tangent


def linearize_model(
    apply_fn: Callable[[Any, Any], jax.Array], params0: Any
) -> Callable[[Any, Any], jax.Array]:
    r"""The Taylor model of :func:`linearized_apply` as a function ``(params, inputs) -> outputs``.

    It can be trained with the same optimiser as the model.

    >>> import jax.numpy as jnp
    >>> lin = linearize_model(lambda p, x: p["w"] ** 2 * x, {"w": jnp.array(3.0)})
    >>> float(lin({"w": jnp.array(4.0)}, jnp.array(1.0)))  # 9 + 2*3*(4-3)
    15.0
    """
    return lambda params, inputs: linearized_apply(apply_fn, params, params0, inputs)


def _per_example_jacobian(apply_fn: Callable, params: Any, tile: jax.Array) -> jax.Array:
    """(tile, num_params) matrix of per-example gradients of the scalar output.

    ``params`` are in their working dtypes (:func:`kernels._precision.work_params`), so the
    rows are too: float32 for half-precision weights.
    """
    dtype = work_result_type(params)

    def one(x: jax.Array) -> jax.Array:
        grads = jax.grad(lambda p: apply_fn(p, x[None])[0])(params)
        leaves = jax.tree_util.tree_leaves(grads)
        return jnp.concatenate([jnp.ravel(g).astype(dtype) for g in leaves])

    return jax.vmap(one)(tile)


def _tiles(inputs: jax.Array, tile: int) -> jax.Array:
    """(num_tiles, tile, ...) examples; the last tile padded with copies of example 0."""
    num = inputs.shape[0]
    num_tiles = -(-num // tile)
    padded = num_tiles * tile
    if padded > num:  # their rows and columns of the Gram matrix are dropped
        filler = jnp.repeat(inputs[:1], padded - num, axis=0)
        inputs = jnp.concatenate([inputs, filler], axis=0)
    return inputs.reshape((num_tiles, tile, *inputs.shape[1:]))


def _assemble_gram(
    blocks: jax.Array, rows: np.ndarray, cols: np.ndarray, num_tiles: int
) -> jax.Array:
    """The symmetric Gram matrix from its upper tile blocks ``K[rows[k], cols[k]] = blocks[k]``."""
    tile = blocks.shape[-1]
    gram = jnp.zeros((num_tiles, num_tiles, tile, tile), dtype=blocks.dtype)
    gram = gram.at[rows, cols].set(blocks)
    upper = rows < cols
    gram = gram.at[cols[upper], rows[upper]].set(jnp.swapaxes(blocks[upper], -1, -2))
    return jnp.swapaxes(gram, 1, 2).reshape((num_tiles * tile, num_tiles * tile))


def empirical_ntk(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: jax.Array,
    *,
    tile_size: int | None = None,
    compute_dtype: Any = None,
) -> jax.Array:
    r"""Empirical NTK Gram matrix $K = J J^\top$ of a scalar-output model on a data set.

    $K_{ab} = \sum_p \partial_p f(\theta; x_a)\, \partial_p f(\theta; x_b)$, exact (no sampling).
    Computed in tiles of ``tile_size`` examples: for each pair of tiles $A \le B$ the two
    tiles' per-example gradients are formed (``vmap`` of ``grad``), multiplied, and dropped, so
    peak memory is two tiles of Jacobian rows rather than the full (N, num_params) Jacobian.
    Costs about ``N * (num_tiles + 1)`` per-example gradients. The tile pairs are mapped
    sequentially (and sharded over ``jax.devices()`` when there are several); the result does
    not depend on ``tile_size`` beyond floating-point rounding. Traceable (can be jitted).

    Args:
      apply_fn: ``(params, inputs) -> (batch,)`` outputs for a batch of inputs; must be
        traceable. It is called on batches of one example.
      params: parameters (any pytree of arrays); half-precision leaves are worked on in
        float32 (the gradients and the Gram matrix are float32).
      inputs: (N, ...) array of examples (leading axis = examples).
      tile_size: examples per tile (static); None puts all N in one tile.
      compute_dtype: the dtype ``apply_fn`` is evaluated in: ``None`` (default) float32 for
        half-precision leaves (each cast inside the program), float32/float64 as they are;
        ``"params"`` each leaf's own dtype; or a floating dtype
        (:mod:`kernels._precision`). Static.

    Returns:
      (N, N) symmetric positive semi-definite Gram matrix, in the parameters' working dtype
      (float32 for half precision).

    Raises:
      ValueError: if ``tile_size`` is not a positive int, ``inputs`` has no leading axis, or
        ``compute_dtype`` is not one of the above.

    References:
      Jacot et al. 2018, arXiv:1806.07572; Novak et al. 2022, arXiv:2206.08720.

    >>> import jax.numpy as jnp
    >>> apply = lambda p, x: x @ p["w"]  # linear model: K = X X^T
    >>> x = jnp.array([[1.0, 0.0], [1.0, 2.0], [0.0, 3.0]])
    >>> empirical_ntk(apply, {"w": jnp.zeros(2)}, x, tile_size=2)
    Array([[1., 1., 0.],
           [1., 5., 6.],
           [0., 6., 9.]], dtype=float32)
    """
    if jnp.ndim(inputs) < 1:
        raise ValueError(f"inputs: expected an array with a leading example axis, got {inputs!r}")
    num = inputs.shape[0]
    if tile_size is not None:
        check_positive_int(tile_size, "tile_size")
    apply = in_compute(apply_fn, params, check_compute_dtype(compute_dtype))
    params = work_params(params)
    tiles = _tiles(inputs, num if tile_size is None else min(tile_size, num))
    num_tiles = tiles.shape[0]
    rows, cols = np.triu_indices(num_tiles)
    pairs = jnp.asarray(np.stack([rows, cols], axis=1), dtype=jnp.int32)

    def block(pair: jax.Array) -> jax.Array:
        j_a = _per_example_jacobian(apply, params, tiles[pair[0]])
        j_b = _per_example_jacobian(apply, params, tiles[pair[1]])
        return j_a @ j_b.T

    blocks = map_samples(block, pairs, chunk_size=1)  # (num_pairs, tile, tile)
    return _assemble_gram(blocks, rows, cols, num_tiles)[:num, :num]


def ntk_diagonal(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: jax.Array,
    *,
    chunk_size: int = 256,
    compute_dtype: Any = None,
) -> jax.Array:
    r"""Diagonal of the empirical NTK: $K_{aa} = \|\nabla_\theta f(\theta; x_a)\|_2^2$ per example.

    Exact; one per-example gradient each, ``chunk_size`` examples vectorised at a time (memory:
    ``chunk_size * num_params`` numbers). Its maximum is the $G_u$ of the PAC-Bayes paper's
    semi-analytic bound, its mean half the Hessian trace of the quadratic loss at an
    interpolator (Theorem 13). Traceable.

    Args:
      apply_fn: ``(params, inputs) -> (batch,)`` scalar outputs; called on batches of one.
      params: parameters (pytree); half precision is worked on in float32.
      inputs: (N, ...) examples.
      chunk_size: examples per vectorised chunk, >= 1. Static.
      compute_dtype: the dtype ``apply_fn`` is evaluated in, as :func:`empirical_ntk`. Static.

    Returns:
      (N,) squared gradient norms, in the parameters' working dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [1.0, 2.0]])
    >>> ntk_diagonal(lambda p, x: x @ p["w"], {"w": jnp.zeros(2)}, x)  # ||x_a||^2
    Array([1., 5.], dtype=float32)
    """
    check_positive_int(chunk_size, "chunk_size")
    apply = in_compute(apply_fn, params, check_compute_dtype(compute_dtype))
    params = work_params(params)
    dtype = work_result_type(params)

    def sq_norm(x: jax.Array) -> jax.Array:
        g = jax.grad(lambda p: apply(p, x[None])[0])(params)
        flat = jnp.concatenate(
            [jnp.ravel(leaf).astype(dtype) for leaf in jax.tree_util.tree_leaves(g)]
        )
        return jnp.sum(flat**2)

    return jax.lax.map(sq_norm, inputs, batch_size=chunk_size)


def ntk_min_eigenvalue(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: jax.Array,
    *,
    tile_size: int | None = None,
    compute_dtype: Any = None,
) -> jax.Array:
    r"""Smallest eigenvalue $\lambda_{\min}(K)$ of the empirical NTK Gram matrix (exact, dense).

    Args:
      apply_fn: ``(params, inputs) -> (batch,)``.
      params: parameters (pytree).
      inputs: (N, ...) examples.
      tile_size: see :func:`empirical_ntk`.
      compute_dtype: see :func:`empirical_ntk`. Static.

    Returns:
      A scalar; 0 up to rounding when N exceeds the number of parameters.
    """
    gram = empirical_ntk(apply_fn, params, inputs, tile_size=tile_size, compute_dtype=compute_dtype)
    return jnp.linalg.eigvalsh(gram)[0]


def feature_alpha(features: jax.Array) -> jax.Array:
    r"""$\alpha = \sigma_{\min}(F_{pre}^0)$ for an (N, d_m) matrix of last hidden features.

    The paper's convergence argument needs $F_{pre}^0 (F_{pre}^0)^\top \succ 0$ and uses
    $\alpha^2 = \lambda_{\min}(F_{pre}^0 (F_{pre}^0)^\top)$, i.e. $\alpha$ is the N-th singular
    value. When N > d_m that N x N matrix is singular and $\alpha = 0$ exactly (the theory needs
    $d_m \ge N$); this function then returns 0 rather than the d_m-th singular value.

    Args:
      features: (N, d_m) matrix (rows = examples).

    Returns:
      A scalar, exact up to the SVD's rounding.

    Raises:
      ValueError: if ``features`` is not 2-D.

    References:
      Shallow-Transformer GD paper, section 4.3; Wu et al. 2024, arXiv:2311.01575, Theorem 1.

    >>> import jax.numpy as jnp
    >>> round(float(feature_alpha(jnp.array([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))), 12)
    2.0
    """
    if jnp.ndim(features) != 2:
        raise ValueError(f"features: expected an (N, d_m) matrix, got shape {jnp.shape(features)}")
    num, width = features.shape
    if num > width:
        return jnp.zeros((), dtype=features.dtype)
    return jnp.linalg.svd(features, compute_uv=False)[num - 1]
