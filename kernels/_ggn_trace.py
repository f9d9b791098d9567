"""Traces of the Gauss-Newton and Fisher matrices: Hutchinson, Hutch++, per-example sums."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._backend import auto_chunk_size, tree_size
from kernels._checks import (
    check_chunk_size,
    check_positive_int,
    check_that,
)
from kernels._ggn import _apply, _check_apply_fn, _check_mc, _num_examples, _output_spec, ggn
from kernels._jit import compile_once
from kernels._losses import (
    Loss,
    _check_labels,
    _check_loss,
    _check_outputs,
    _num_terms,
    _sampled_scores,
    _scores,
)
from kernels._names import method_count
from kernels._operators import (
    _check_floating,
    _check_params,
)
from kernels._precision import check_compute_dtype, in_compute, work_dtype, work_params
from kernels._trace import _check_method_count, operator_trace
from kernels.estimate import Estimate
from kernels.parallel import check_num_samples, map_chunked, map_samples, sample_statistics

# --------------------------------------------------------------------------- traces


def ggn_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Loss,
    num_samples: int | None = None,
    num_matvecs: int | None = None,
    method: Literal["hutchinson", "hutchpp"] = "hutchinson",
    chunk_size: int | Literal["auto"] | None = None,
    compute_dtype: Any = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr} G$ of the Gauss-Newton matrix on one batch.

    Builds :func:`ggn` and runs :func:`~kernels.curvature.hutchinson_trace` (``num_samples``
    probes, each a quadratic form $(Jv)^\top H_{\rm out}(Jv)$: one Jacobian-vector product) or
    :func:`~kernels.curvature.hutchpp_trace` (``num_matvecs`` products of the operator
    linearised once). Unbiased. For a dataset of stacked batches use :func:`dataset_ggn` with
    :func:`~kernels.curvature.hutchinson_trace`.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; keep the same object across calls.
      params: pytree of floating arrays (half precision worked on in float32).
      batch: ``(inputs, targets)``.
      key: PRNG key.
      loss: as :func:`ggn`. Static.
      num_samples: Hutchinson probes (>= 2), with ``method="hutchinson"``. Static.
      num_matvecs: Hutch++'s budget of products (>= 4), with ``method="hutchpp"``. (With
        ``method="hutchinson"`` it is the deprecated name of ``num_samples``.) Static.
      method: ``"hutchinson"`` (memory of ``chunk_size`` forward-mode passes) or ``"hutchpp"``
        (holds a sketch, :func:`~kernels.curvature.hutchpp_memory_bytes`).
      chunk_size: probes per vectorised batch, an int >= 1; ``None`` (default) runs them one
        at a time; ``"auto"``: ``None`` on a CPU; on a GPU or TPU, Hutchinson's probes under
        the memory budget of :func:`~kernels.curvature.hutchinson_trace` (1.5 gradients),
        Hutch++'s 16. Static.
      compute_dtype: the dtype ``apply_fn`` is evaluated in, as :func:`ggn` (default: float32
        for half-precision parameters). Static.

    Returns:
      Estimate of the trace (fields as the estimator's).

    Raises:
      ValueError: for an unknown method, the count of the other method (or both, or neither),
        too few probes or products, a bad ``key`` or ``chunk_size``,
        and as :func:`ggn`; (runtime check) non-finite ``params``, loss or products.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 2.0]])  # tr G = tr diag(1, 4): exact for a diagonal G
    >>> est = ggn_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)), jax.random.key(0),
    ...                 loss="squared_error", num_samples=4)
    >>> est.mean
    Array(5., dtype=float32)
    """
    name, count = method_count(method, num_samples, num_matvecs, stacklevel=2)
    return _ggn_trace(
        apply_fn,
        params,
        batch,
        key,
        loss=loss,
        count=count,
        count_name=name,
        method=method,
        chunk_size=chunk_size,
        compute_dtype=compute_dtype,
    )


@compile_once
def _ggn_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Loss,
    count: int,
    count_name: str,
    method: str,
    chunk_size: int | Literal["auto"] | None,
    compute_dtype: Any = None,
) -> Estimate:
    """:func:`ggn_trace` once its count is named (``count``: probes or products)."""
    count = _check_method_count(count, count_name, method)
    op = ggn(apply_fn, params, batch, loss=loss, compute_dtype=compute_dtype)
    return operator_trace(op, params, key, method=method, count=count, chunk_size=chunk_size)


def _example_chunk(example_chunk_size: Any) -> int | None:
    if example_chunk_size is None:
        return None
    return check_positive_int(example_chunk_size, "example_chunk_size")


def _trace_setup(
    apply_fn: Any, params: Any, batch: Any, loss: Any, compute_dtype: Any
) -> tuple[int, int, tuple]:
    """Static checks of a per-example trace; (n, N, the whole batch's output shape)."""
    _check_apply_fn(apply_fn)
    _check_floating(params, "params")
    num = _num_examples(batch, "batch")
    inputs, targets = jax.tree_util.tree_map(lambda a: a[:1], tuple(batch))
    spec = _output_spec(apply_fn, params, inputs, compute_dtype)
    _check_outputs(loss, spec, targets)
    shape = (num, *spec.shape[1:])
    return num, _num_terms(loss, shape), shape


def _example_sq_norm(
    apply_fn: Any,
    loss: Any,
    params: Any,
    example: Any,
    key: jax.Array | None,
    compute_dtype: Any = None,
) -> jax.Array:
    r"""$\|J_i^\top s_i\|^2$ for one example (its leading axis restored to length 1).

    The gradient is taken in the parameters' working dtypes and its squares summed in the
    outputs' dtype, at least float32 (:mod:`kernels._precision`).
    """
    inputs, targets = jax.tree_util.tree_map(lambda a: a[None], example)
    model = in_compute(lambda p, x: _apply(apply_fn, p, x), params, compute_dtype)
    outputs, vjp_fn = jax.vjp(lambda p: model(p, inputs), work_params(params))
    scores = _scores(loss, outputs, targets) if key is None else _sampled_scores(loss, outputs, key)
    grad = vjp_fn(jax.lax.stop_gradient(scores).astype(outputs.dtype))[0]
    leaves = jax.tree_util.tree_leaves(grad)
    acc = work_dtype(outputs.dtype)
    return sum(jnp.sum(leaf.astype(acc) ** 2) for leaf in leaves)


def _check_examples(num_bad: jax.Array, valid: jax.Array, num: int) -> None:
    check_that(
        jnp.logical_or(num_bad == 0, jnp.logical_not(valid)),
        f"apply_fn: non-finite per-example gradients at {{}} of the {num} examples",
        num_bad,
    )


@compile_once
def empirical_fisher_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    *,
    loss: Loss,
    example_chunk_size: int | None = None,
    compute_dtype: Any = None,
) -> jax.Array:
    r"""The exact trace of the empirical Fisher: per-example squared gradient norms.

    $$\operatorname{tr} F_{\rm emp} = \frac1N\sum_{i=1}^n \|g_i\|^2,\qquad
    g_i = \nabla_\theta\sum_{j\in i}\ell_j,$$ (:func:`empirical_fisher`; one term per example:
    $\frac1n\sum_i\|\nabla\ell_i\|^2$). Each $g_i$ is a vector-Jacobian product of example $i$
    alone, ``example_chunk_size`` examples vectorised at a time (memory: that many
    parameter-sized gradients and their activations, whatever n is), spread over the devices
    like Monte Carlo samples (:func:`kernels.parallel.map_samples`). Exact: pass a whole dataset
    as one batch, its size only sets the run time.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; examples must be independent (module
        docstring).
      params: pytree of floating arrays (half precision worked on in float32).
      batch: ``(inputs, targets)``.
      loss: a named loss or a callable (one term per example). Static.
      example_chunk_size: examples per vectorised batch of per-example gradients, an int >= 1;
        ``None`` runs them one at a time.
      compute_dtype: the dtype ``apply_fn`` is evaluated in, as :func:`ggn`. Static.

    Returns:
      The trace, a scalar in the outputs' dtype (at least float32).

    Raises:
      ValueError: as :func:`ggn`, for a bad ``example_chunk_size``; (runtime check) non-finite
        ``params``, cross-entropy labels out of range, non-finite per-example gradients (with
        how many of the n examples).

    References:
      Kunstner, Hennig, Balles 2019, arXiv:1905.12558.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # (1/2)(2^2 + 6^2)
    >>> empirical_fisher_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.array([-1.0, -3.0])),
    ...                        loss="squared_error")
    Array(20., dtype=float32)
    """
    _check_loss(loss)
    chunk = _example_chunk(example_chunk_size)
    compute_dtype = check_compute_dtype(compute_dtype)
    num, num_terms, shape = _trace_setup(apply_fn, params, batch, loss, compute_dtype)
    inputs, targets = batch
    valid = jnp.logical_and(_check_params(params), _check_labels(loss, shape, targets))
    norms = map_samples(
        lambda example: _example_sq_norm(apply_fn, loss, params, example, None, compute_dtype),
        (inputs, targets),
        chunk_size=chunk,
    )
    _check_examples(jnp.sum(~jnp.isfinite(norms)).astype(jnp.int32), valid, num)
    return jnp.sum(norms) / jnp.asarray(num_terms, norms.dtype)


@compile_once
def mc_fisher_trace(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    loss: Literal["cross_entropy", "logistic", "squared_error"],
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = None,
    example_chunk_size: int | None = None,
    compute_dtype: Any = None,
) -> Estimate:
    r"""Estimate $\operatorname{tr} F$ of the Fisher by labels drawn from the model.

    Sample $k$ draws every label from the predictive distribution (key
    ``sample_key(key, k)``, then as :func:`mc_fisher`) and computes the exact trace of that
    draw's $\hat F_k$, $\frac1N\sum_i\|\hat g_{ik}\|^2$, from per-example gradients; the
    estimate is the mean over the $K$ = ``num_samples`` draws and its standard error the sample
    standard deviation over $\sqrt K$. Unbiased for $\operatorname{tr} F =
    \operatorname{tr} G$ (named losses); no probe vectors, so the only noise is the labels'.
    Sample $k$ equals the trace of ``mc_fisher(..., key=fold_in(key, k), num_samples=1)``.
    Memory: ``chunk_size`` draws times ``example_chunk_size`` per-example gradients.

    Args:
      apply_fn: ``(params, inputs) -> outputs``; examples must be independent.
      params: pytree of floating arrays (half precision worked on in float32).
      batch: ``(inputs, targets)`` (targets checked, not used).
      key: PRNG key.
      loss: ``"cross_entropy"``, ``"logistic"`` or ``"squared_error"``. Static.
      num_samples: K >= 2 independent Monte Carlo samples (label draws). Static.
      chunk_size: samples per vectorised batch, an int >= 1; ``None`` runs them one at a time;
        ``"auto"``: ``None`` on a CPU, on a GPU or TPU
        :func:`kernels._backend.default_chunk_size` ``("probes", size=number of parameters)``.
      example_chunk_size: examples per vectorised batch of per-example gradients within a
        sample, an int >= 1; ``None`` runs them one at a time.
      compute_dtype: the dtype ``apply_fn`` is evaluated in, as :func:`ggn`. Static.

    Returns:
      Estimate(mean, stderr, num_samples=K).

    Raises:
      ValueError: as :func:`mc_fisher`, for num_samples < 2 or a bad chunk size; (runtime
        check) as :func:`empirical_fisher_trace` (non-finite samples, with their count).

    References:
      Martens 2020, arXiv:1412.1193; Jastrzebski et al. 2021, "Catastrophic Fisher explosion",
      arXiv:2012.14193 (the Fisher trace as a measure).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # tr F = tr G = (2/2)(1 + 1)
    >>> est = mc_fisher_trace(lambda w, x: x @ w, jnp.zeros(2), (x, jnp.zeros(2)),
    ...                       jax.random.key(0), loss="squared_error", num_samples=2000)
    >>> abs(float(est.mean) - 2.0) < 4 * float(est.stderr)
    True
    """
    _check_mc(loss, key, num_samples)
    num_samples = check_num_samples(num_samples, "num_samples", minimum=2)
    chunk = check_chunk_size(chunk_size, auto="auto")
    if chunk == "auto":
        size, dtype = tree_size(params)
        chunk = auto_chunk_size(None, "probes", size=size, dtype=dtype)
    example_chunk = _example_chunk(example_chunk_size)
    compute_dtype = check_compute_dtype(compute_dtype)
    num, num_terms, shape = _trace_setup(apply_fn, params, batch, loss, compute_dtype)
    inputs, targets = batch
    valid = jnp.logical_and(_check_params(params), _check_labels(loss, shape, targets))
    indices = jnp.arange(num, dtype=jnp.uint32)

    def one_draw(draw_key: jax.Array) -> jax.Array:
        base = jax.random.fold_in(draw_key, 0)  # sample m = 0 of mc_fisher(key=draw_key)

        def example_norm(xs: Any) -> jax.Array:
            example, index = xs
            key_i = jax.random.fold_in(base, index)
            return _example_sq_norm(apply_fn, loss, params, example, key_i, compute_dtype)

        norms = map_chunked(
            example_norm, ((inputs, targets), indices), chunk_size=example_chunk, key=draw_key
        )
        return jnp.sum(norms) / jnp.asarray(num_terms, norms.dtype)

    stats = sample_statistics(one_draw, key, num_samples=num_samples, chunk_size=chunk)
    check_that(
        jnp.logical_or(stats.num_nonfinite == 0, jnp.logical_not(valid)),
        f"apply_fn: non-finite per-example gradients in {{}} of the {num_samples} samples",
        stats.num_nonfinite,
    )
    return stats.estimate()
