"""The perturbation scale that reaches a target loss increase, by bisection."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from kernels._checks import (
    check_positive,
    check_that,
)
from kernels._jit import compile_once
from kernels._perturbation import (
    Perturbation,
    _check_chunk,
    _check_count,
    _check_samples,
    _increase_fn,
    _loss_at_params,
    _sample_chunk,
    _sampler,
    _setup,
)
from kernels.estimate import Estimate
from kernels.parallel import (
    check_num_samples,
    sample_statistics,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SigmaSearch:
    r"""Result of :func:`sigma_search`.

    Attributes:
      sigma: the largest $\sigma$ found whose estimated average increase is <= the target.
      increase: the antithetic average-sharpness estimate at that $\sigma$.
      bracketed: False when even ``sigma_lower`` exceeds the target (then ``sigma`` is
        ``sigma_lower``) or the upper end (``perturbation.scale``) stays below it (then
        ``sigma`` is that upper end).
    """

    sigma: Any
    increase: Estimate
    bracketed: Any


# --------------------------------------------------------------------------------------------
# sigma search


def _bisection(
    estimate: Callable[[jax.Array], tuple[jax.Array, ...]],
    target: jax.Array,
    lower: jax.Array,
    upper: jax.Array,
    num_steps: int,
) -> tuple[jax.Array, tuple[jax.Array, ...], jax.Array]:
    """Geometric bisection of ``estimate(sigma)[0] <= target``; (sigma, its estimate, bracketed)."""
    zero = jnp.zeros((), target.dtype)
    empty = (zero, zero, jnp.zeros((), jnp.int32))

    def body(i: jax.Array, state: tuple) -> tuple:
        # step 0 evaluates the upper end, step 1 the lower end, then bisection (one traced copy)
        lo, hi, lo_est, hi_est, low_ok = state
        sig = jnp.where(i == 0, hi, jnp.where(i == 1, lo, jnp.sqrt(lo * hi)))
        est = estimate(sig)
        below = est[0] <= target  # a non-finite increase counts as above the target
        bisect = i >= 2
        take_lo = jnp.logical_or(i == 1, jnp.logical_and(bisect, below))
        lo_est = tuple(jnp.where(take_lo, a, b) for a, b in zip(est, lo_est, strict=True))
        hi_est = tuple(jnp.where(i == 0, a, b) for a, b in zip(est, hi_est, strict=True))
        lo = jnp.where(jnp.logical_and(bisect, below), sig, lo)
        hi = jnp.where(jnp.logical_and(bisect, jnp.logical_not(below)), sig, hi)
        low_ok = jnp.where(i == 1, below, low_ok)
        return lo, hi, lo_est, hi_est, low_ok

    init = (lower, upper, empty, empty, jnp.asarray(False))
    lo, _, lo_est, hi_est, low_ok = jax.lax.fori_loop(0, num_steps + 2, body, init)
    high_ok = hi_est[0] <= target
    sigma = jnp.where(high_ok, upper, lo)
    est = tuple(jnp.where(high_ok, a, b) for a, b in zip(hi_est, lo_est, strict=True))
    return sigma, est, jnp.logical_and(low_ok, jnp.logical_not(high_ok))


@compile_once
def sigma_search(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    target_increase: Any,
    num_samples: int = 32,
    sigma_lower: Any = 1e-6,
    num_steps: int = 20,
    chunk_size: int | Literal["auto"] | None = None,
    compute_dtype: Any = None,
) -> SigmaSearch:
    r"""Largest $\sigma$ with average increase $\mathbb E_u L(\theta+u) - L(\theta)$ <= a target.

    Bisection on $\log\sigma$ between ``sigma_lower`` and $\sigma_{upper}$ =
    ``perturbation.scale`` of the antithetic :func:`average_sharpness` estimate with Gaussian
    perturbations (adaptive / masked as ``perturbation`` says), using the *same* draws $z$ at
    every $\sigma$ ($u = \sigma s \odot z$, common random numbers), so the estimated curve is a
    smooth function of $\sigma$ and the bisection is consistent. This is the PAC-Bayes
    sharpness measure of Jiang et al. (2020): the largest $\sigma$ with
    $\mathbb E_u L(\theta+u) - L(\theta) \le$ target (they use a target on the 0-1 loss; pass
    any loss). The returned $\sigma$ is accurate to a factor
    $(\sigma_{upper}/\sigma_{lower})^{2^{-N}}$ up to the Monte Carlo error of the increase. A
    $\sigma$ where the loss is non-finite at some perturbed point counts as above the target;
    the estimate at the returned $\sigma$ must be finite (runtime check).

    Args:
      loss_fn: ``(params, batch) -> scalar``. Static (by identity).
      params: pytree $\theta$ of float16 / bfloat16 / float32 / float64 arrays (half precision
        is worked on in float32: perturbations and sums).
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key (the draws shared by all $\sigma$).
      perturbation: a Gaussian :class:`Perturbation`; its scale is the largest $\sigma$
        considered (e.g. ``Perturbation("gaussian", 1.0, adaptive=True)``).
      target_increase: the target, > 0 (may be traced).
      num_samples: $K \ge 2$ antithetic pairs per $\sigma$ ($2K$ loss evaluations). Static.
      sigma_lower: smallest $\sigma$ considered, $0 <$ ``sigma_lower`` $<$ the upper end.
      num_steps: bisection steps $N \ge 1$. Static.
      chunk_size: pairs per vectorised batch; ``None`` runs them one at a time; ``"auto"``: ``None``
        on a CPU, on a GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._memory.memory_budget`). An int is used as given.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program ($\theta + u$ formed in float32),
        float32/float64 leaves as they are; or ``"float32"`` / ``"float64"``. A half-precision
        compute dtype (``"params"`` of a bfloat16 model) is refused: $\theta + u$ would be
        rounded to the weights' 8 significand bits and the difference be rounding error
        (:mod:`kernels._precision`). Static.

    Returns:
      :class:`SigmaSearch` ``(sigma, increase, bracketed)``.

    Raises:
      ValueError: for a non-Gaussian perturbation, a target <= 0, a bad bracket, and as
        :func:`average_sharpness` (eagerly; the runtime checks also under ``jit``).

    References:
      Jiang, Neyshabur, Mobahi, Krishnan, Bengio 2020, "Fantastic generalization measures and
      where to find them", arXiv:1912.02178, appendix on sharpness measures.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, batch: 0.5 * jnp.sum(w**2)  # pair increase = sigma^2 ||z||^2 / 2
    >>> res = sigma_search(loss, jnp.zeros(3), (), jax.random.key(0),
    ...                    perturbation=Perturbation("gaussian", 10.0), target_increase=1.0,
    ...                    num_steps=40)
    >>> bool(res.bracketed), round(float(res.increase.mean), 6)
    (True, 1.0)
    """
    if not isinstance(perturbation, Perturbation) or perturbation.kind != "gaussian":
        raise ValueError(
            "perturbation: sigma_search searches a Gaussian sigma; expected"
            f" Perturbation('gaussian', sigma_upper, ...), got {perturbation!r}"
        )
    check_positive(target_increase, "target_increase")
    check_positive(sigma_lower, "sigma_lower")
    num = check_num_samples(num_samples, "num_samples", minimum=2)
    num_steps = _check_count(num_steps, "num_steps")
    chunk_size = _check_chunk(chunk_size)
    prob = _setup(loss_fn, params, batch, key, perturbation, compute_dtype, "sigma_search")
    chunk_size = _sample_chunk(chunk_size, params, prob)
    dtype = prob.dtype
    lower = jnp.asarray(sigma_lower, dtype)
    upper = jnp.asarray(perturbation.scale, dtype)
    check_that(
        jnp.logical_or(jnp.logical_not(prob.ok), lower < upper),
        "sigma_lower: expected < perturbation.scale (the largest sigma), got {} >= {}",
        lower,
        upper,
    )
    base, ok = _loss_at_params(prob)

    def estimate(sigma: jax.Array) -> tuple[jax.Array, ...]:
        sample = _increase_fn(prob, base, _sampler("gaussian", sigma, prob), True)
        stats = sample_statistics(sample, key, num_samples=num, chunk_size=chunk_size)
        est = stats.estimate()
        return est.mean, est.stderr, stats.num_nonfinite

    sigma, (mean, stderr, bad), bracketed = _bisection(
        estimate, jnp.asarray(target_increase, base.dtype), lower, upper, num_steps
    )
    _check_samples(bad, ok, f"{num} antithetic pairs at the returned sigma")
    return SigmaSearch(
        sigma=sigma,
        increase=Estimate(mean, stderr, num, num_evaluations=2 * num),
        bracketed=bracketed,
    )
