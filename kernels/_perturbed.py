"""Sharpness over random perturbations: the average, its decomposition, perturbed traces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._flat import place, tree_dot
from kernels._jit import compile_once
from kernels._perturbation import (
    Perturbation,
    _check_bool,
    _check_chunk,
    _check_count,
    _check_samples,
    _checked_base,
    _hessian_at,
    _increase,
    _increase_fn,
    _linearized,
    _loss_at_params,
    _pairs_text,
    _Problem,
    _products_fit,
    _quadratic_form,
    _sample_chunk,
    _sampler,
    _scaled,
    _setup,
    draw_leaves,
)
from kernels._random import draw_leaf, leaf_keys
from kernels.estimate import Estimate, estimate_from_samples
from kernels.parallel import (
    SampleStats,
    check_num_samples,
    map_samples,
    sample_devices,
    sample_key,
    sample_statistics,
)

_KEPT = "every sample's result is kept, one row each"
_MODES = ("auto", "forms", "products")


# --------------------------------------------------------------------------------------------
# results


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SharpnessDecomposition:
    r"""The terms of $\mathbb E_u L(\theta+u) - L(\theta) = \frac{\sigma^2}{2}\mathrm{tr}(SHS) + P$.

    Attributes:
      average: the measured average increase $\mathbb E_u L(\theta+u) - L(\theta)$
        (``num_samples`` antithetic pairs, ``num_evaluations`` = twice that).
      trace_term: $\frac{\sigma^2}{2}\operatorname{tr}(S H(\theta) S)$, $S = \mathrm{diag}(s)$
        ($= \frac{\sigma^2}{2}\operatorname{tr} H$ for a plain perturbation); Hutchinson with
        independent probes (``num_samples`` = probes).
      remainder: $P = \frac12\mathbb E[u^\top(H(\theta+\tilde u) - H(\theta))u]$, estimated on
        the same pairs as ``average`` with the control variate $\frac12 u^\top H(\theta) u$.
      sigma: the $\sigma$ used.
    """

    average: Estimate
    trace_term: Estimate
    remainder: Estimate
    sigma: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PerturbedTraces:
    r"""Result of :func:`perturbed_hessian_traces`: traces at $J$ perturbed points.

    Attributes:
      traces: one Hutchinson estimate per perturbation: ``mean`` and ``stderr`` of shape
        ``(J,)`` ($\widehat{\operatorname{tr}} H(\theta+u_j)$ and its probe error),
        ``num_samples`` = probes per perturbation. Use ``traces.mean`` for percentiles or the
        maximum (the paper's empirical worst-case perturbation).
      average: $\mathbb E_u \operatorname{tr} H(\theta+u)$: the mean of the $J$ estimates, with
        the standard error of that mean over perturbations (it includes the probe noise, since
        each estimate is unbiased for its own trace); ``num_samples`` = $J$,
        ``num_evaluations`` = $J \times$ probes (Hessian-vector products).
    """

    traces: Estimate
    average: Estimate


# --------------------------------------------------------------------------------------------
# average sharpness and the Theorem 6/12 decomposition


@compile_once
def average_sharpness(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = None,
    antithetic: bool = True,
    compute_dtype: Any = None,
) -> Estimate:
    r"""Average sharpness $\mathbb E_u\,L(\theta+u) - L(\theta)$ by Monte Carlo.

    Draws perturbation vectors $u$ from ``perturbation`` (Gaussian, or uniform in a ball) and
    averages $f(u) = L(\theta+u) - L(\theta)$. Unbiased. With ``antithetic=True`` each of the
    ``num_samples`` samples is a pair $(u, -u)$ with value $\frac12(f(u) + f(-u))$ (two loss
    evaluations, one after the other); the standard error is that of the pair means.

    Variance: with gradient $g$ and Hessian $H$,
    $f(u) = g^\top u + \frac12 u^\top H u + O(\|u\|^3)$. For Gaussian $u$ one draw has variance
    $\sigma^2\|g\|^2 + \frac{\sigma^4}{2}\|H\|_F^2 + O(\sigma^5)$; the pair mean cancels every
    odd-order term, leaving $\frac{\sigma^4}{2}\|H\|_F^2 + O(\sigma^6)$ per pair. Away from a
    critical point (where $\sigma^2\|g\|^2$ dominates) pairs are far more precise for the same
    number of loss evaluations; at an exact critical point of a quadratic the two halves of a
    pair are equal, so a pair is worth one independent draw at twice the cost.

    Args:
      loss_fn: ``(params, batch) -> scalar`` loss; must be traceable. Static (by identity).
      params: pytree $\theta$ of float16 / bfloat16 / float32 / float64 arrays (half precision
        is worked on in float32: perturbations and sums).
      batch: data passed to ``loss_fn`` (any pytree, ``()`` when there is none).
      key: PRNG key; sample $i$ uses ``fold_in(key, i)``, so ``chunk_size`` and the device
        count do not change the result.
      perturbation: the :class:`Perturbation` (kind, scale, adaptive, mask).
      num_samples: $K \ge 2$ independent samples: perturbations, or antithetic pairs (then
        $2K$ loss evaluations). Static.
      chunk_size: samples per vectorised batch (memory: that many perturbed loss evaluations at
        once); ``None`` runs them one at a time (least memory); ``"auto"``: ``None`` on a CPU, on a
        GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._memory.memory_budget`). An int is used as given.
        Static.
      antithetic: use pairs $(u, -u)$. Static.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program ($\theta + u$ formed in float32),
        float32/float64 leaves as they are; or ``"float32"`` / ``"float64"``. A half-precision
        compute dtype (``"params"`` of a bfloat16 model) is refused: $\theta + u$ would be
        rounded to the weights' 8 significand bits and the difference be rounding error
        (:mod:`kernels._precision`). Static.

    Returns:
      Estimate(mean, stderr, num_samples=K, num_evaluations=2K with pairs, else None).

    Raises:
      ValueError: for a bad count / chunk size / key / option, integer or empty params, a
        half-precision ``compute_dtype``, a mask matching nothing, a non-scalar loss; and
        (also under ``jit``, where it surfaces as a runtime error) non-finite params, a scale
        that is not a finite value > 0, a non-finite loss at params or at any perturbed point.

    References:
      Keskar et al. 2017, arXiv:1609.04836; Jiang et al. 2020, "Fantastic generalization
      measures", arXiv:1912.02178; Andriushchenko et al. 2023, arXiv:2302.07011.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, batch: 0.5 * jnp.sum(jnp.array([1.0, 3.0]) * w**2) + jnp.sum(w)
    >>> est = average_sharpness(loss, jnp.zeros(2), (), jax.random.key(0),
    ...                         perturbation=Perturbation("linf_ball", 1.0), num_samples=2000)
    >>> bool(abs(est.mean - 4 / 6) < 5 * est.stderr)  # E u_i^2 = 1/3, so (1 + 3) / 6
    True
    """
    num = check_num_samples(num_samples, "num_samples", minimum=2)
    chunk_size = _check_chunk(chunk_size)
    antithetic = _check_bool(antithetic, "antithetic")
    prob = _setup(loss_fn, params, batch, key, perturbation, compute_dtype, "average_sharpness")
    chunk_size = _sample_chunk(chunk_size, params, prob)
    base, ok = _loss_at_params(prob)
    draw = _sampler(perturbation.kind, perturbation.scale, prob)
    sample = _increase_fn(prob, base, draw, antithetic)
    stats = sample_statistics(sample, key, num_samples=num, chunk_size=chunk_size)
    _check_samples(stats.num_nonfinite, ok, _pairs_text(num, antithetic))
    return stats.estimate(num_evaluations=2 * num if antithetic else None)


def _decomposition_pair(
    prob: _Problem,
    base: jax.Array,
    sigma: jax.Array,
    quad: Callable[[jax.Array], jax.Array],
) -> Callable[[jax.Array], jax.Array]:
    r"""``key -> [pair mean, pair mean - u^T H u / 2]`` for one Gaussian pair."""
    draw = _sampler("gaussian", sigma, prob)

    def one(k: jax.Array) -> jax.Array:
        u = draw(k)
        pair = _increase(prob, base, lambda: u, antithetic=True)
        half = (0.5 * quad(u)).astype(pair.dtype)
        return jnp.stack([pair, pair - half])

    return one


def _split_estimate(stats: SampleStats, index: int, num_evaluations: int | None) -> Estimate:
    est = stats.estimate(num_evaluations=num_evaluations)
    return Estimate(
        mean=est.mean[index],
        stderr=est.stderr[index],
        num_samples=est.num_samples,
        num_evaluations=num_evaluations,
    )


@compile_once
def sharpness_decomposition(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_samples: int,
    num_probes: int,
    chunk_size: int | Literal["auto"] | None = None,
    mode: Literal["auto", "forms", "products"] = "auto",
    compute_dtype: Any = None,
) -> SharpnessDecomposition:
    r"""The Theorem 6/12 decomposition of the average increase under Gaussian perturbations.

    For $u = s \odot \eta$, $\eta \sim N(0, \sigma^2 I)$ (so $u \sim N(0, \sigma^2 S^2)$,
    $S = \mathrm{diag}(s)$, $S = I$ for a plain perturbation), Taylor with Lagrange remainder:
    $$\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr}(S H(\theta) S)
    + \underbrace{\tfrac12\mathbb E_u\big[u^\top (H(\theta+\tilde u) - H(\theta)) u\big]}_{P}.$$
    Returns the three terms:

    - ``average``: the antithetic estimate of $\mathbb E_u L(\theta+u) - L(\theta)$ from
      ``num_samples`` pairs (as :func:`average_sharpness`);
    - ``trace_term``: $\frac{\sigma^2}{2}$ times the Hutchinson estimate of
      $\operatorname{tr}(SHS)$ with ``num_probes`` probes $S v$, $v$ Rademacher, drawn
      independently of the perturbations;
    - ``remainder``: $P$, estimated on the same pairs as the mean of
      $\frac12(f(u)+f(-u)) - \frac12 u^\top H(\theta) u$ (a Hessian-vector product per pair).
      The control variate $\frac12 u^\top H u$ has expectation exactly the trace term and
      removes the $O(\sigma^4)$ variance of the quadratic term, so $P$'s standard error is
      $O(\sigma^4)$ (the fourth-order remainder), far smaller than that of
      ``average - trace_term`` from independent estimates. For a symmetric perturbation the
      third-order term has mean zero, so $P = O(\sigma^4)$ for smooth losses.

    ``average`` and ``trace_term + remainder`` estimate the same number; they differ by Monte
    Carlo error only (compare them with their standard errors). The quadratic forms
    $u^\top H u$ come from one linearisation of $\nabla L$ at $\theta$ (memory: its
    residuals) or by forward over forward mode (``mode``).

    Args:
      loss_fn: ``(params, batch) -> scalar`` (twice differentiable). Static (by identity).
      params: pytree $\theta$ of float16 / bfloat16 / float32 / float64 arrays (half precision
        is worked on in float32: perturbations and sums).
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key.
      perturbation: a Gaussian :class:`Perturbation` (adaptive / masked allowed).
      num_samples: $K \ge 2$ antithetic pairs ($2K$ loss evaluations). Static.
      num_probes: Hutchinson probes for the trace term (>= 2). Static.
      chunk_size: pairs / probes per vectorised batch; ``None`` runs them one at a time; ``"auto"``:
        ``None`` on a CPU, on a GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._memory.memory_budget`). An int is used as given.
      mode: how each $u^\top H u$ (pairs) and $v^\top SHS v$ (probes) is formed:
        ``"products"`` (a Hessian-vector product from one linearisation of the gradient at
        $\theta$, whose residuals stay in memory), ``"forms"`` (forward over forward mode:
        no linearisation, memory of a forward pass) or ``"auto"`` (default): products one at
        a time while their estimated memory (1.6 times the linearisation's residuals) stays
        within 1.3 gradients' temporaries (at least 128 MiB, at most 1 GiB of residuals),
        else forms (as :func:`kernels.curvature.hutchinson_trace`). ``"products"`` and
        ``"forms"`` are used as given. The two agree to rounding. Static.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program ($\theta + u$ formed in float32),
        float32/float64 leaves as they are; or ``"float32"`` / ``"float64"``. A half-precision
        compute dtype (``"params"`` of a bfloat16 model) is refused: $\theta + u$ would be
        rounded to the weights' 8 significand bits and the difference be rounding error
        (:mod:`kernels._precision`). Static.

    Returns:
      :class:`SharpnessDecomposition` (``average``, ``trace_term``, ``remainder``, ``sigma``).

    Raises:
      ValueError: for a non-Gaussian perturbation, and as :func:`average_sharpness` (eagerly;
        the runtime checks also under ``jit``), including non-finite Hessian-vector products.

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Theorems 6 and 12
      (SPEC.md section 5); Hutchinson 1989, doi:10.1080/03610918908812806.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, batch: 0.5 * jnp.sum(jnp.array([1.0, 3.0]) * w**2)
    >>> dec = sharpness_decomposition(loss, jnp.ones(2), (), jax.random.key(0),
    ...                               perturbation=Perturbation("gaussian", 0.1),
    ...                               num_samples=8, num_probes=4)
    >>> round(float(dec.trace_term.mean), 6), bool(abs(dec.remainder.mean) < 1e-6)  # exact here
    (0.02, True)
    """
    if not isinstance(perturbation, Perturbation) or perturbation.kind != "gaussian":
        raise ValueError(
            "perturbation: the Theorem 6/12 decomposition is for Gaussian perturbations; expected"
            f" Perturbation('gaussian', sigma, ...), got {perturbation!r}"
        )
    num = check_num_samples(num_samples, "num_samples", minimum=2)
    num_probes = check_num_samples(num_probes, "num_probes", minimum=2)
    chunk_size = _check_chunk(chunk_size)
    if not isinstance(mode, str) or mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    prob = _setup(
        loss_fn, params, batch, key, perturbation, compute_dtype, "sharpness_decomposition"
    )
    chunk_size = _sample_chunk(chunk_size, params, prob, hessian=True)
    base, linear = _linearized(prob, prob.zeros())
    products = mode == "products" or (
        mode == "auto" and chunk_size in (None, 1) and _products_fit(prob, linear)
    )
    if products:

        def quad(x: list) -> jax.Array:
            return tree_dot(x, linear(x)[1])
    else:
        quad = _quadratic_form(prob)
    ok = _checked_base(prob, base)
    sigma = jnp.asarray(perturbation.scale, prob.dtype)
    key_pairs, key_probes = jax.random.split(key)

    def probe(k: jax.Array) -> jax.Array:
        v = draw_leaves(prob, k, "rademacher", support=False)
        return quad([_scaled(s, a) for s, a in zip(prob.scales, v, strict=True)])

    pair_fn = _decomposition_pair(prob, base, sigma, quad)
    pairs = sample_statistics(pair_fn, key_pairs, num_samples=num, chunk_size=chunk_size)
    _check_samples(pairs.num_nonfinite, ok, _pairs_text(num))
    trace = sample_statistics(probe, key_probes, num_samples=num_probes, chunk_size=chunk_size)
    _check_samples(trace.num_nonfinite, ok, f"{num_probes} Hutchinson probes (u^T H u)")
    half = (0.5 * sigma**2).astype(trace.mean.dtype)
    trace_est = trace.estimate()
    return SharpnessDecomposition(
        average=_split_estimate(pairs, 0, 2 * num),
        trace_term=Estimate(half * trace_est.mean, half * trace_est.stderr, num_probes),
        remainder=_split_estimate(pairs, 1, 2 * num),
        sigma=sigma,
    )


# --------------------------------------------------------------------------------------------
# traces at perturbed points


def _probe_leaves(prob: _Problem, key: jax.Array) -> list:
    """A Rademacher probe of every parameter, leaf by leaf (leaf ``i`` from ``fold_in(key, i)``)."""
    keys = leaf_keys(key, len(prob.leaves))
    return [
        place(draw_leaf(k, jnp.shape(w), prob.dtype, "rademacher"), prob.shardings[i])
        for i, (k, w) in enumerate(zip(keys, prob.leaves, strict=True))
    ]


def _trace_at(
    prob: _Problem, draw: Callable[[jax.Array], list], key: jax.Array, num_probes: int
) -> Callable[[jax.Array], tuple[jax.Array, ...]]:
    r"""``index -> (trace estimate, its stderr, non-finite?)`` at $\theta + u_j$."""

    def one(index: jax.Array) -> tuple[jax.Array, ...]:
        k_u, k_probe = jax.random.split(sample_key(key, index))
        value, hvp = _hessian_at(prob, draw(k_u))

        def probe(kp: jax.Array) -> jax.Array:
            v = _probe_leaves(prob, kp)
            return tree_dot(v, hvp(v))

        # probes of one perturbation run one at a time on its device (perturbations shard)
        stats = sample_statistics(
            probe, k_probe, num_samples=num_probes, devices=sample_devices()[:1]
        )
        est = stats.estimate()
        bad = jnp.logical_or(jnp.logical_not(jnp.isfinite(value)), stats.num_nonfinite > 0)
        return est.mean, est.stderr, bad

    return one


@compile_once
def perturbed_hessian_traces(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_samples: int,
    num_probes: int,
    chunk_size: int | Literal["auto"] | None = None,
    compute_dtype: Any = None,
) -> PerturbedTraces:
    r"""Hessian traces $\operatorname{tr} H(\theta + u_j)$ at perturbed points, and their mean.

    For $j = 1..J$ draws $u_j$ from ``perturbation`` (any kind; Gaussian in the paper) and
    estimates the trace at $\theta + u_j$ by Hutchinson with ``num_probes`` Rademacher probes
    (unbiased for each $j$; the gradient is linearised once per perturbation and shared by its
    probes). ``traces`` keeps each estimate with its probe standard error, for percentiles or
    the maximum (the "empirical worst-case perturbation" of the paper's Section 2.3; the maximum
    of noisy estimates is biased upwards by their Hutchinson noise); ``average`` estimates
    $\mathbb E_u \operatorname{tr} H(\theta+u)$ with its standard error over perturbations.
    Memory: ``chunk_size`` linearisations at once plus the $J$ results.
    :class:`kernels.blocks.MonteCarloBlocks` computes perturbations ``[start, stop)`` (each as
    in this call) and merges them into this result.

    Args:
      loss_fn: ``(params, batch) -> scalar`` (twice differentiable). Static (by identity).
      params: pytree $\theta$ of float16 / bfloat16 / float32 / float64 arrays (half precision
        is worked on in float32: perturbations and sums).
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key; perturbation $j$ uses ``fold_in(key, j)``.
      perturbation: the :class:`Perturbation`.
      num_samples: $J \ge 2$ perturbations. Static.
      num_probes: Hutchinson probes per perturbation (>= 2). Static.
      chunk_size: perturbations per vectorised batch; ``None`` runs them one at a time; ``"auto"``:
        ``None`` on a CPU, on a GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._memory.memory_budget`). An int is used as given.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program ($\theta + u$ formed in float32),
        float32/float64 leaves as they are; ``"params"`` each leaf's own dtype (the perturbed
        point $\theta + u$ is then rounded to it); or a floating dtype
        (:mod:`kernels._precision`). Static.

    Returns:
      :class:`PerturbedTraces` (``traces``: per perturbation, ``average``: over them).

    Raises:
      ValueError: as :func:`average_sharpness` (eagerly; the runtime checks also under
        ``jit``), with a non-finite loss or trace at a perturbed point reported by count.

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Section 2.3;
      Hutchinson 1989, doi:10.1080/03610918908812806.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, batch: jnp.sum(jnp.array([1.0, 3.0]) * w**2)  # tr H = 8 everywhere
    >>> res = perturbed_hessian_traces(loss, jnp.ones(2), (), jax.random.key(0),
    ...                                perturbation=Perturbation("gaussian", 0.1),
    ...                                num_samples=3, num_probes=2)
    >>> res.traces.mean.tolist(), float(res.average.mean), float(res.average.stderr)
    ([8.0, 8.0, 8.0], 8.0, 0.0)
    """
    num = _check_count(num_samples, "num_samples", minimum=2, why=_KEPT)
    indices = jnp.arange(num, dtype=jnp.uint32)
    means, stderrs = _perturbed_samples(
        loss_fn, params, batch, key, perturbation, num_probes, chunk_size, indices, compute_dtype
    )
    return _perturbed_result(means, stderrs, num_probes)


def _perturbed_samples(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    perturbation: Perturbation,
    num_probes: int,
    chunk_size: Any,
    indices: jax.Array,
    compute_dtype: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Trace estimates and their probe stderrs at the perturbations ``indices`` (uint32)."""
    num_probes = check_num_samples(num_probes, "num_probes", minimum=2)
    chunk_size = _check_chunk(chunk_size)
    prob = _setup(loss_fn, params, batch, key, perturbation, compute_dtype)
    chunk_size = _sample_chunk(chunk_size, params, prob, hessian=True)
    draw = _sampler(perturbation.kind, perturbation.scale, prob)
    one = _trace_at(prob, draw, key, num_probes)
    means, stderrs, bad = map_samples(
        one,
        indices,
        chunk_size=1 if chunk_size is None else chunk_size,
        key=key,  # an rbg key's draws change under vmap: such a map runs one at a time
    )
    _check_samples(jnp.sum(bad.astype(jnp.int32)), prob.ok, f"{indices.shape[0]} perturbed points")
    return means, stderrs


def _perturbed_result(means: jax.Array, stderrs: jax.Array, num_probes: int) -> PerturbedTraces:
    """The :class:`PerturbedTraces` of the per-perturbation estimates (J >= 2 of them)."""
    num = means.shape[0]
    mean_est = estimate_from_samples(means)
    return PerturbedTraces(
        traces=Estimate(mean=means, stderr=stderrs, num_samples=num_probes),
        average=Estimate(
            mean=mean_est.mean,
            stderr=mean_est.stderr,
            num_samples=num,
            num_evaluations=num * num_probes,
        ),
    )


@compile_once
def _perturbed_block(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    start: jax.Array,
    count: int,
    *,
    perturbation: Perturbation,
    num_probes: int,
    chunk_size: int | Literal["auto"] | None = None,
    compute_dtype: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Perturbations ``start .. start + count - 1`` of :func:`perturbed_hessian_traces`.

    ``start`` is a traced uint32 scalar (one program per ``count``); perturbation $j$ has the
    keys it has in the one call. Private machinery of :mod:`kernels.blocks`.
    """
    indices = start + jnp.arange(count, dtype=jnp.uint32)
    return _perturbed_samples(
        loss_fn, params, batch, key, perturbation, num_probes, chunk_size, indices, compute_dtype
    )


@compile_once
def _perturbed_finish(means: jax.Array, stderrs: jax.Array, num_probes: int) -> PerturbedTraces:
    """:func:`_perturbed_result` as one program (for :mod:`kernels.blocks`)."""
    num_probes = check_num_samples(num_probes, "num_probes", minimum=2)
    _check_count(means.shape[0], "num_samples", minimum=2, why=_KEPT)
    return _perturbed_result(means, stderrs, num_probes)
