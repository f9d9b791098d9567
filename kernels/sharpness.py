r"""Sharpness of a loss under parameter perturbations: average, worst case, adaptive.

One :class:`Perturbation` spec describes the perturbation for every kernel here (and for the
PAC-Bayes bounds): its kind (Gaussian with standard deviation $\sigma$, or a uniform draw from /
the worst point of an $\ell_2$ or $\ell_\infty$ ball of radius $\rho$), whether it is *adaptive*
(each coordinate scaled by $|\theta_i|$, which makes sharpness invariant to the rescaling
symmetries of ReLU networks), and a *mask* restricting it to chosen parameter groups.

Writing $s = m \odot c$ for the mask $m \in \{0,1\}^n$ times $c = |\theta|$ (adaptive) or
$c = 1$, the perturbation is $u = s \odot \eta$ with

- ``"gaussian"``: $\eta \sim N(0, \sigma^2 I)$;
- ``"l2_ball"``: $\|\eta\|_2 \le \rho$ (on the support of $s$);
- ``"linf_ball"``: $\|\eta\|_\infty \le \rho$.

Kernels:

- :func:`average_sharpness`: $\mathbb E_u L(\theta+u) - L(\theta)$ with antithetic pairs;
- :func:`sharpness_decomposition`: the Theorem 6/12 identity
  $\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr} H(\theta) + P$;
- :func:`perturbed_hessian_traces`: $\operatorname{tr} H(\theta + u_j)$ per perturbation;
- :func:`worst_case_sharpness`: $\max_{u} L(\theta+u) - L(\theta)$ over a ball (a lower bound);
- :func:`sigma_search`: the largest $\sigma$ whose average increase stays below a target.

Every Monte Carlo kernel draws one key per perturbation and maps over the keys with
:func:`kernels.parallel.map_samples`, so memory is that of ``chunk_size`` perturbations whatever
``num_samples`` is, results do not depend on ``chunk_size``, and draws shard over
``jax.devices()``.

Precision: $L(\theta+u) - L(\theta)$ is a difference of two nearly equal numbers. In float32
an increase below about $10^{-7} L(\theta)$ is lost to rounding, which the reported standard
error does not include; use float64 parameters for small $\sigma$.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from kernels._checks import (
    check_finite,
    check_positive,
    check_positive_int,
    check_scalar_fn,
    is_concrete,
)
from kernels.curvature import hutchinson_trace, hvp
from kernels.estimate import Estimate, estimate_from_samples
from kernels.parallel import map_chunked, map_samples

__all__ = [
    "Perturbation",
    "SharpnessDecomposition",
    "SigmaSearch",
    "WorstCase",
    "average_sharpness",
    "perturbed_hessian_traces",
    "sharpness_decomposition",
    "sigma_search",
    "worst_case_sharpness",
]

_KINDS = ("gaussian", "l2_ball", "linf_ball")
_MOMENTUM = 0.75  # APGD's momentum weight (Croce & Hein 2020)


@dataclasses.dataclass(frozen=True)
class Perturbation:
    r"""How parameters are perturbed: kind, scale, adaptive scaling and a parameter mask.

    The perturbation is $u = s \odot \eta$ with $s = m \odot |\theta|$ (``adaptive=True``) or
    $s = m$, where $m$ is the 0/1 mask, and $\eta \sim N(0, \sigma^2 I)$ (``"gaussian"``,
    ``scale`` $= \sigma$) or $\eta$ in the $\ell_2$ / $\ell_\infty$ ball of radius
    ``scale`` $= \rho$ (``"l2_ball"``, ``"linf_ball"``; :func:`average_sharpness` draws $\eta$
    uniformly from the ball, :func:`worst_case_sharpness` maximises over it).

    Attributes:
      kind: ``"gaussian"``, ``"l2_ball"`` or ``"linf_ball"``.
      scale: $\sigma$ or the radius $\rho$; a finite value > 0 (may be a traced scalar).
      adaptive: scale each coordinate by $|\theta_i|$ (adaptive / magnitude-aware sharpness);
        coordinates with $\theta_i = 0$ are then not perturbed.
      mask: which parameters to perturb: ``None`` (all); a pytree of bools (or bool arrays
        broadcastable to the leaves) whose structure is a prefix of the parameters', e.g.
        ``{"attn": True, "mlp": False}``; or a callable ``(path, leaf) -> bool`` where ``path``
        is ``jax.tree_util.keystr`` of the leaf's key path, e.g.
        ``lambda path, leaf: "attn" in path``.

    Raises:
      ValueError: for an unknown kind, or a scale (sigma / radius) that is not > 0.

    References:
      Kwon, Kim, Park, Choi 2021, "ASAM", arXiv:2102.11600; Andriushchenko, Croce, Müller,
      Hein, Flammarion 2023, "A modern look at the relationship between sharpness and
      generalization", arXiv:2302.07011.

    >>> Perturbation("gaussian", 0.01)
    Perturbation(kind='gaussian', scale=0.01, adaptive=False, mask=None)
    """

    kind: Literal["gaussian", "l2_ball", "linf_ball"]
    scale: Any
    adaptive: bool = False
    mask: Any = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"perturbation.kind: expected one of {_KINDS}, got {self.kind!r}")
        name = "sigma" if self.kind == "gaussian" else "radius"
        check_positive(self.scale, f"perturbation.scale ({name})")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SharpnessDecomposition:
    r"""The terms of $\mathbb E_u L(\theta+u) - L(\theta) = \frac{\sigma^2}{2}\mathrm{tr} H + P$.

    Attributes:
      average: the measured average increase $\mathbb E_u L(\theta+u) - L(\theta)$.
      trace_term: $\frac{\sigma^2}{2}\operatorname{tr} H(\theta)$ (Hutchinson, independent probes).
      perturbation: $P = \frac12\mathbb E[u^\top(H(\theta+\tilde u) - H(\theta))u]$, estimated
        on the same perturbations as ``average`` with the control variate
        $\frac12 u^\top H(\theta) u$.
      sigma: the $\sigma$ used.
    """

    average: Estimate
    trace_term: Estimate
    perturbation: Estimate
    sigma: Any


class WorstCase(NamedTuple):
    r"""Result of :func:`worst_case_sharpness`.

    Attributes:
      value: $L(\theta+u^*) - L(\theta)$ at the best perturbation found (a lower bound of
        the maximum).
      perturbation: the maximiser $u^*$, a pytree shaped like the parameters.
    """

    value: jax.Array
    perturbation: Any


class SigmaSearch(NamedTuple):
    r"""Result of :func:`sigma_search`.

    Attributes:
      sigma: the largest $\sigma$ found whose estimated average increase is <= the target.
      increase: the :func:`average_sharpness` estimate at that $\sigma$.
      bracketed: False when even ``sigma_lower`` exceeds the target (then ``sigma`` is
        ``sigma_lower``) or ``sigma_upper`` stays below it (then ``sigma`` is ``sigma_upper``).
    """

    sigma: jax.Array
    increase: Estimate
    bracketed: jax.Array


# --------------------------------------------------------------------------------------------
# shared set-up


class _Problem(NamedTuple):
    flat: jax.Array  # theta, raveled
    unravel: Callable[[jax.Array], Any]
    loss: Callable[[jax.Array], jax.Array]  # flat -> scalar
    base: jax.Array  # L(theta)
    scales: jax.Array  # s = mask * (|theta| or 1)


def _mask_vector(mask: Any, params: Any, dtype: Any) -> jax.Array:
    """The 0/1 mask as a flat vector in the order of ``ravel_pytree(params)``."""
    if mask is None:
        tree = jax.tree_util.tree_map(lambda p: jnp.ones(jnp.shape(p), dtype), params)
    elif callable(mask):
        tree = jax.tree_util.tree_map_with_path(
            lambda path, p: jnp.broadcast_to(
                jnp.asarray(mask(jax.tree_util.keystr(path), p), bool), jnp.shape(p)
            ).astype(dtype),
            params,
        )
    else:
        try:
            tree = jax.tree_util.tree_map(
                lambda m, sub: jax.tree_util.tree_map(
                    lambda p: jnp.broadcast_to(jnp.asarray(m, bool), jnp.shape(p)).astype(dtype),
                    sub,
                ),
                mask,
                params,
            )
        except (ValueError, TypeError) as err:
            raise ValueError(
                "perturbation.mask: expected None, a callable (path, leaf) -> bool, or a pytree of"
                f" bools whose structure is a prefix of the params' structure: {err}"
            ) from err
    return ravel_pytree(tree)[0].astype(dtype)


def _setup(
    loss_fn: Callable[[Any], jax.Array], params: Any, perturbation: Perturbation
) -> _Problem:
    if not isinstance(perturbation, Perturbation):
        raise ValueError(
            f"perturbation: expected a Perturbation, got {type(perturbation).__name__}"
        )
    check_scalar_fn(loss_fn, params, "loss_fn")
    check_finite(params, "params")
    flat, unravel = ravel_pytree(params)
    if not jnp.issubdtype(flat.dtype, jnp.floating):
        raise ValueError(f"params: expected floating leaves, got {flat.dtype}")
    dtype = flat.dtype
    mask = _mask_vector(perturbation.mask, params, dtype)
    if is_concrete(mask) and not np.any(np.asarray(mask)):
        raise ValueError("perturbation.mask: matches no parameter")
    scales = mask * jnp.abs(flat) if perturbation.adaptive else mask
    if perturbation.adaptive and is_concrete(scales) and not np.any(np.asarray(scales)):
        raise ValueError("perturbation: adaptive scales |theta| are zero on every masked parameter")

    def loss(x: jax.Array) -> jax.Array:
        return loss_fn(unravel(x))

    base = loss(flat)
    if is_concrete(base) and not np.isfinite(np.asarray(base)):
        raise ValueError(f"loss_fn: expected a finite loss at params, got {float(base)}")
    return _Problem(flat, unravel, loss, base, scales)


def _sampler(kind: str, scale: Any, scales: jax.Array) -> Callable[[jax.Array], jax.Array]:
    r"""``key -> u``: one perturbation $u = s \odot \eta$ of the given kind."""
    dtype = scales.dtype
    size = scales.shape[0]
    support = (scales != 0).astype(dtype)
    scale = jnp.asarray(scale, dtype)

    if kind == "gaussian":
        return lambda k: scale * scales * jax.random.normal(k, (size,), dtype)
    if kind == "linf_ball":
        return lambda k: scale * scales * jax.random.uniform(k, (size,), dtype, -1.0, 1.0)

    dim = jnp.sum(support)  # uniform in the l2 ball of the support's dimension

    def l2(k: jax.Array) -> jax.Array:
        k_dir, k_rad = jax.random.split(k)
        z = support * jax.random.normal(k_dir, (size,), dtype)
        radius = scale * jax.random.uniform(k_rad, (), dtype) ** (1 / dim)
        return radius * scales * z / jnp.linalg.norm(z)

    return l2


def _check_count(value: Any, name: str, antithetic: bool) -> int:
    value = check_positive_int(value, name, minimum=4 if antithetic else 2)
    if antithetic and value % 2:
        raise ValueError(f"{name}: expected an even count with antithetic pairs, got {value}")
    return value


def _average_values(
    prob: _Problem,
    draw: Callable[[jax.Array], jax.Array],
    keys: jax.Array,
    *,
    antithetic: bool,
    chunk_size: int | None,
) -> jax.Array:
    r"""Per-draw increases: pair means $\frac12(f(u)+f(-u))$ or single $f(u)$."""

    def one(k: jax.Array) -> jax.Array:
        u = draw(k)
        up = prob.loss(prob.flat + u) - prob.base
        if not antithetic:
            return up
        return 0.5 * (up + (prob.loss(prob.flat - u) - prob.base))

    return map_samples(one, keys, chunk_size=chunk_size or 1)


# --------------------------------------------------------------------------------------------
# kernels


def average_sharpness(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_samples: int,
    chunk_size: int | None = None,
    antithetic: bool = True,
) -> Estimate:
    r"""Average sharpness $\mathbb E_u\,L(\theta+u) - L(\theta)$ by Monte Carlo.

    Draws perturbations $u$ from ``perturbation`` (Gaussian, or uniform in a ball) and averages
    $f(u) = L(\theta+u) - L(\theta)$. Unbiased. With ``antithetic=True`` the draws come in
    ``num_samples / 2`` pairs $(u, -u)$ and the sample is the pair mean
    $\frac12(f(u) + f(-u))$; the standard error is that of the pair means.

    Variance: with gradient $g$ and Hessian $H$,
    $f(u) = g^\top u + \frac12 u^\top H u + O(\|u\|^3)$. For Gaussian $u$ one draw has variance
    $\sigma^2\|g\|^2 + \frac{\sigma^4}{2}\|H\|_F^2 + O(\sigma^5)$; the pair mean cancels every
    odd-order term, leaving $\frac{\sigma^4}{2}\|H\|_F^2 + O(\sigma^6)$ per pair. Away from a
    critical point (where $\sigma^2\|g\|^2$ dominates) antithetic pairs are far more precise for
    the same number of loss evaluations; at an exact critical point of a quadratic the two halves
    of a pair are equal, so pairs are worth half as many independent draws (variance 2x).

    Args:
      loss_fn: ``params -> scalar`` loss (closing over its data); must be traceable.
      params: pytree $\theta$.
      key: PRNG key; one subkey per draw (pair), so ``chunk_size`` does not change the result.
      perturbation: the :class:`Perturbation` (kind, scale, adaptive, mask).
      num_samples: number of perturbed loss evaluations K (>= 2; even and >= 4 with
        ``antithetic``). Static.
      chunk_size: draws per vectorised batch (memory bound); ``None`` runs them sequentially
        (``lax.map``), which on CPU is as fast and uses the least memory.
      antithetic: use pairs $(u, -u)$.

    Returns:
      Estimate(mean, stderr, num_samples=K) (K counts loss evaluations, both halves of a pair).

    Raises:
      ValueError: for a bad count, a non-scalar or non-finite loss, non-finite params, a mask
        matching nothing, or a non-positive scale (raised by :class:`Perturbation`).

    References:
      Keskar et al. 2017, arXiv:1609.04836; Jiang et al. 2020, "Fantastic generalization
      measures", arXiv:1912.02178; Andriushchenko et al. 2023, arXiv:2302.07011.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w: 0.5 * jnp.sum(jnp.array([1.0, 3.0]) * w**2) + jnp.sum(w)
    >>> est = average_sharpness(loss, jnp.zeros(2), jax.random.key(0),
    ...                         perturbation=Perturbation("linf_ball", 1.0), num_samples=4000)
    >>> bool(abs(est.mean - 4 / 6) < 5 * est.stderr)  # E u_i^2 = 1/3, so (1 + 3) / 6
    True
    """
    num_samples = _check_count(num_samples, "num_samples", antithetic)
    prob = _setup(loss_fn, params, perturbation)
    draw = _sampler(perturbation.kind, perturbation.scale, prob.scales)
    num_draws = num_samples // 2 if antithetic else num_samples
    values = _average_values(
        prob, draw, jax.random.split(key, num_draws), antithetic=antithetic, chunk_size=chunk_size
    )
    est = estimate_from_samples(values)
    return Estimate(mean=est.mean, stderr=est.stderr, num_samples=num_samples)


def sharpness_decomposition(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    sigma: Any,
    num_samples: int,
    num_probes: int,
    chunk_size: int | None = None,
) -> SharpnessDecomposition:
    r"""The Theorem 6/12 decomposition of the average increase under Gaussian perturbations.

    For $u \sim N(0, \sigma^2 I)$ (Taylor with Lagrange remainder),
    $$\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr}H(\theta)
    + \underbrace{\tfrac12\mathbb E_u\big[u^\top (H(\theta+\tilde u) - H(\theta)) u\big]}_{P}.$$
    Returns the three terms:

    - ``average``: the antithetic estimate of $\mathbb E_u L(\theta+u) - L(\theta)$ from
      ``num_samples / 2`` pairs (as :func:`average_sharpness`);
    - ``trace_term``: $\frac{\sigma^2}{2}$ times the Hutchinson trace of
      :func:`~kernels.curvature.hessian_trace` (``hvp`` + ``hutchinson_trace``, sharing one
      linearisation with the control variate) with ``num_probes`` Rademacher probes, drawn
      independently of the perturbations;
    - ``perturbation``: $P$, estimated on the same pairs as the mean of
      $\frac12(f(u)+f(-u)) - \frac12 u^\top H(\theta) u$ (a Hessian-vector product per pair).
      The control variate $\frac12 u^\top H u$ has expectation exactly
      $\frac{\sigma^2}{2}\operatorname{tr}H$ and removes the $O(\sigma^4)$ variance of the
      quadratic term, so $P$'s standard error is $O(\sigma^4)$ (the fourth-order remainder), far
      smaller than that of ``average - trace_term`` from independent estimates. For a symmetric
      perturbation the third-order term has mean zero, so $P = O(\sigma^4)$ for smooth losses.

    ``average`` and ``trace_term + perturbation`` estimate the same number; they differ by
    Monte Carlo error only (compare them with their standard errors).

    Args:
      loss_fn: ``params -> scalar`` (twice differentiable).
      params: pytree $\theta$.
      key: PRNG key.
      sigma: $\sigma > 0$.
      num_samples: perturbed loss evaluations (even, >= 4; pairs $(u, -u)$). Static.
      num_probes: Hutchinson probes for the trace term (>= 2). Static.
      chunk_size: draws / probes per vectorised batch; ``None`` runs them sequentially.

    Returns:
      :class:`SharpnessDecomposition` (``average``, ``trace_term``, ``perturbation``, ``sigma``).

    Raises:
      ValueError: for sigma <= 0, bad counts, a non-scalar or non-finite loss, non-finite params.

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Theorems 6 and 12
      (SPEC.md section 5).
    """
    check_positive(sigma, "sigma")
    num_samples = _check_count(num_samples, "num_samples", True)
    check_positive_int(num_probes, "num_probes", minimum=2)
    prob = _setup(loss_fn, params, Perturbation("gaussian", sigma))
    dtype = prob.flat.dtype
    sigma = jnp.asarray(sigma, dtype)
    size = prob.flat.shape[0]
    matvec = hvp(prob.loss, prob.flat)
    key_pairs, key_trace = jax.random.split(key)

    def one(k: jax.Array) -> tuple[jax.Array, jax.Array]:
        u = sigma * jax.random.normal(k, (size,), dtype)
        pair = 0.5 * (
            (prob.loss(prob.flat + u) - prob.base) + (prob.loss(prob.flat - u) - prob.base)
        )
        return pair, pair - 0.5 * jnp.vdot(u, matvec(u))

    pairs, rest = map_samples(
        one, jax.random.split(key_pairs, num_samples // 2), chunk_size=chunk_size or 1
    )
    average = estimate_from_samples(pairs)
    perturb = estimate_from_samples(rest)
    # hessian_trace's computation (hvp + Hutchinson), reusing the linearisation built above
    trace = hutchinson_trace(
        matvec, prob.flat, key_trace, num_probes=num_probes, chunk_size=chunk_size
    )
    half = 0.5 * sigma**2
    return SharpnessDecomposition(
        average=Estimate(average.mean, average.stderr, num_samples),
        trace_term=Estimate(half * trace.mean, half * trace.stderr, num_probes),
        perturbation=Estimate(perturb.mean, perturb.stderr, num_samples),
        sigma=sigma,
    )


def perturbed_hessian_traces(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    sigma: Any,
    num_perturbations: int,
    num_probes: int,
    chunk_size: int | None = None,
) -> jax.Array:
    r"""Hessian traces $\operatorname{tr} H(\theta + u_j)$ at Gaussian perturbations $u_j$.

    For $j = 1..J$, $u_j \sim N(0, \sigma^2 I)$, and the trace at $\theta + u_j$ is estimated by
    Hutchinson with ``num_probes`` Rademacher probes (unbiased for each $j$; the Hessian is
    linearised once per perturbation and shared by its probes). Summarise with percentiles or
    the maximum for the "empirical worst-case perturbation" of the paper's Section 2.3; note
    that the maximum of noisy estimates is biased upwards by their Hutchinson noise.

    Args:
      loss_fn: ``params -> scalar`` (twice differentiable).
      params: pytree $\theta$.
      key: PRNG key; one subkey per perturbation.
      sigma: $\sigma > 0$.
      num_perturbations: J >= 1. Static.
      num_probes: Hutchinson probes per perturbation (>= 2). Static.
      chunk_size: perturbations per vectorised batch; ``None`` runs them sequentially.

    Returns:
      Array of shape (J,): the trace estimates.

    Raises:
      ValueError: for sigma <= 0, bad counts, a non-scalar or non-finite loss, non-finite params.

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Section 2.3.
    """
    check_positive(sigma, "sigma")
    check_positive_int(num_perturbations, "num_perturbations")
    check_positive_int(num_probes, "num_probes", minimum=2)
    prob = _setup(loss_fn, params, Perturbation("gaussian", sigma))
    dtype = prob.flat.dtype
    size = prob.flat.shape[0]
    sigma = jnp.asarray(sigma, dtype)

    def one(k: jax.Array) -> jax.Array:
        k_u, k_probe = jax.random.split(k)
        matvec = hvp(prob.loss, prob.flat + sigma * jax.random.normal(k_u, (size,), dtype))

        def quad(kp: jax.Array) -> jax.Array:
            v = jax.random.rademacher(kp, (size,), dtype)
            return jnp.vdot(v, matvec(v))

        # Inner probes are never sharded (the perturbations already are).
        return jnp.mean(map_chunked(quad, jax.random.split(k_probe, num_probes), chunk_size=1))

    return map_samples(one, jax.random.split(key, num_perturbations), chunk_size=chunk_size or 1)


def worst_case_sharpness(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_steps: int,
    step_size: Any = None,
    num_restarts: int = 1,
) -> WorstCase:
    r"""Worst-case sharpness $\max_{u \in B} L(\theta+u) - L(\theta)$ by projected gradient ascent.

    $u = s \odot \eta$ (see :class:`Perturbation`) and the ascent runs on $\eta$ over the ball
    $\|\eta\|_p \le \rho$, $p \in \{2, \infty\}$, where the Euclidean projection is exact:
    $\eta \min(1, \rho/\|\eta\|_2)$ and $\operatorname{clip}(\eta, -\rho, \rho)$. For the adaptive
    ball this is the ascent of Kwon et al. / Andriushchenko et al. in the rescaled coordinates.
    APGD-style (Croce & Hein 2020): from a random start, steps along $g/\|g\|_2$ ($\ell_2$) or
    $\operatorname{sign}(g)$ ($\ell_\infty$) with momentum 0.75; when a step does not increase
    the loss, the step size is halved and the iterate returns to the best point so far, whose
    value is returned. Each step costs one value-and-gradient evaluation (plus one for the
    start), per restart.

    The result is the loss increase at a feasible point, hence a **lower bound** of the true
    maximum (exact only if the ascent finds the global maximiser, e.g. for a convex quadratic's
    trust-region problem with enough steps).

    Args:
      loss_fn: ``params -> scalar`` (differentiable).
      params: pytree $\theta$.
      key: PRNG key (random starts).
      perturbation: a ball :class:`Perturbation` (``"l2_ball"`` or ``"linf_ball"``).
      num_steps: ascent steps per restart (>= 1). Static.
      step_size: initial step in $\eta$ units; default $2\rho$ (APGD).
      num_restarts: independent random starts (>= 1), the best is kept. Static.

    Returns:
      :class:`WorstCase` ``(value, perturbation)``: the increase and the maximiser $u^*$ (a
      pytree like ``params``).

    Raises:
      ValueError: for a Gaussian perturbation, radius <= 0, step_size <= 0, bad counts, a mask
        matching nothing, non-finite params or loss.

    References:
      Croce & Hein 2020, "Reliable evaluation of adversarial robustness (APGD)",
      arXiv:2003.01690; Foret et al. 2021 (SAM), arXiv:2010.01412; Kwon et al. 2021,
      arXiv:2102.11600; Andriushchenko et al. 2023, arXiv:2302.07011.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w: jnp.sum(w)  # linear: max over the unit l2 ball is sqrt(2)
    >>> res = worst_case_sharpness(loss, jnp.zeros(2), jax.random.key(0),
    ...                            perturbation=Perturbation("l2_ball", 1.0), num_steps=10)
    >>> round(float(res.value), 6)
    1.414214
    """
    if not isinstance(perturbation, Perturbation) or perturbation.kind == "gaussian":
        raise ValueError(
            "perturbation: worst-case sharpness needs a Perturbation of kind 'l2_ball' or"
            f" 'linf_ball', got {perturbation!r}"
        )
    num_steps = check_positive_int(num_steps, "num_steps")
    num_restarts = check_positive_int(num_restarts, "num_restarts")
    if step_size is not None:
        check_positive(step_size, "step_size")
    prob = _setup(loss_fn, params, perturbation)
    dtype = prob.flat.dtype
    radius = jnp.asarray(perturbation.scale, dtype)
    alpha0 = 2 * radius if step_size is None else jnp.asarray(step_size, dtype)
    scales = prob.scales
    support = (scales != 0).astype(dtype)
    l2 = perturbation.kind == "l2_ball"
    tiny = jnp.finfo(dtype).tiny

    def project(eta: jax.Array) -> jax.Array:
        if l2:
            norm = jnp.linalg.norm(eta)
            return eta * jnp.minimum(1, radius / jnp.maximum(norm, tiny))
        return jnp.clip(eta, -radius, radius)

    def direction(g: jax.Array) -> jax.Array:
        if l2:
            return g / jnp.maximum(jnp.linalg.norm(g), tiny)
        return jnp.sign(g)

    value_grad = jax.value_and_grad(lambda eta: prob.loss(prob.flat + scales * eta) - prob.base)
    size = prob.flat.shape[0]

    def restart(k: jax.Array) -> tuple[jax.Array, jax.Array]:
        if l2:
            z = support * jax.random.normal(k, (size,), dtype)
            eta0 = 0.5 * radius * z / jnp.maximum(jnp.linalg.norm(z), tiny)
        else:
            eta0 = 0.5 * radius * support * jax.random.uniform(k, (size,), dtype, -1.0, 1.0)
        f0, g0 = value_grad(eta0)

        def step(i: jax.Array, state: tuple) -> tuple:
            x, x_prev, fx, gx, best_x, best_f, best_g, alpha = state
            z = project(x + alpha * direction(gx))
            mom = jnp.where(i == 0, 1.0, _MOMENTUM).astype(dtype)
            x_new = project(x + mom * (z - x) + (1 - mom) * (x - x_prev))
            f_new, g_new = value_grad(x_new)
            better = f_new > best_f
            best_x = jnp.where(better, x_new, best_x)
            best_g = jnp.where(better, g_new, best_g)
            best_f = jnp.where(better, f_new, best_f)
            ok = f_new > fx
            alpha = jnp.where(ok, alpha, 0.5 * alpha)
            x_next = jnp.where(ok, x_new, best_x)
            x_prev = jnp.where(ok, x, best_x)
            f_next = jnp.where(ok, f_new, best_f)
            g_next = jnp.where(ok, g_new, best_g)
            return x_next, x_prev, f_next, g_next, best_x, best_f, best_g, alpha

        state = (eta0, eta0, f0, g0, eta0, f0, g0, alpha0)
        state = jax.lax.fori_loop(0, num_steps, step, state)
        return state[5], state[4]

    values, etas = map_samples(restart, jax.random.split(key, num_restarts), chunk_size=1)
    best = jnp.argmax(values)
    return WorstCase(value=values[best], perturbation=prob.unravel(scales * etas[best]))


def sigma_search(
    loss_fn: Callable[[Any], jax.Array],
    params: Any,
    key: jax.Array,
    *,
    target_increase: Any,
    num_samples: int = 64,
    sigma_lower: float = 1e-6,
    sigma_upper: float = 1.0,
    num_iterations: int = 20,
    adaptive: bool = False,
    mask: Any = None,
    chunk_size: int | None = None,
) -> SigmaSearch:
    r"""Largest $\sigma$ with average increase $\mathbb E_u L(\theta+u) - L(\theta)$ <= a target.

    Bisection on $\log\sigma$ between ``sigma_lower`` and ``sigma_upper`` of the antithetic
    :func:`average_sharpness` estimate with Gaussian perturbations (adaptive / masked as asked),
    using the *same* draws $z$ at every $\sigma$ ($u = \sigma s \odot z$, common random numbers),
    so the estimated curve is a smooth function of $\sigma$ and the bisection is consistent.
    This is the PAC-Bayes sharpness measure of Jiang et al. (2020): the largest $\sigma$ with
    $\mathbb E_u L(\theta+u) - L(\theta) \le$ target (they use a target on the 0-1 loss; pass
    any loss). The returned $\sigma$ is accurate to a factor
    $(\sigma_{upper}/\sigma_{lower})^{2^{-N}}$ up to the Monte Carlo error of the increase.

    Args:
      loss_fn: ``params -> scalar``.
      params: pytree $\theta$.
      key: PRNG key (the draws shared by all $\sigma$).
      target_increase: the target, > 0.
      num_samples: perturbed evaluations per $\sigma$ (even, >= 4). Static.
      sigma_lower: smallest $\sigma$ considered, > 0.
      sigma_upper: largest $\sigma$ considered, > sigma_lower.
      num_iterations: bisection steps N (>= 1). Static.
      adaptive: scale the noise by $|\theta|$.
      mask: parameter mask (see :class:`Perturbation`).
      chunk_size: draws per vectorised batch.

    Returns:
      :class:`SigmaSearch` ``(sigma, increase, bracketed)``.

    Raises:
      ValueError: for a target <= 0, bad bracket or counts, non-finite params or loss, a mask
        matching nothing.

    References:
      Jiang, Neyshabur, Mobahi, Krishnan, Bengio 2020, "Fantastic generalization measures and
      where to find them", arXiv:1912.02178, appendix on sharpness measures.
    """
    check_positive(target_increase, "target_increase")
    check_positive(sigma_lower, "sigma_lower")
    check_positive(sigma_upper, "sigma_upper")
    if is_concrete((sigma_lower, sigma_upper)) and not sigma_upper > sigma_lower:
        raise ValueError(f"sigma_upper: expected > sigma_lower = {sigma_lower}, got {sigma_upper}")
    num_samples = _check_count(num_samples, "num_samples", True)
    check_positive_int(num_iterations, "num_iterations")
    prob = _setup(loss_fn, params, Perturbation("gaussian", 1.0, adaptive=adaptive, mask=mask))
    dtype = prob.flat.dtype
    keys = jax.random.split(key, num_samples // 2)
    target = jnp.asarray(target_increase, dtype)

    def estimate(sigma: jax.Array) -> tuple[jax.Array, jax.Array]:
        draw = _sampler("gaussian", sigma, prob.scales)
        est = estimate_from_samples(
            _average_values(prob, draw, keys, antithetic=True, chunk_size=chunk_size)
        )
        return est.mean, est.stderr

    zero = jnp.zeros((), dtype)

    def body(i: jax.Array, state: tuple) -> tuple:
        # step 0 evaluates sigma_upper, step 1 sigma_lower, then bisection (one traced loss copy)
        lo, hi, lo_est, hi_est, low_ok = state
        sig = jnp.where(i == 0, hi, jnp.where(i == 1, lo, jnp.sqrt(lo * hi)))
        est = estimate(sig)
        below = est[0] <= target
        bisect = i >= 2
        take_lo = jnp.logical_or(i == 1, jnp.logical_and(bisect, below))
        lo_est = tuple(jnp.where(take_lo, a, b) for a, b in zip(est, lo_est, strict=True))
        hi_est = tuple(jnp.where(i == 0, a, b) for a, b in zip(est, hi_est, strict=True))
        lo = jnp.where(jnp.logical_and(bisect, below), sig, lo)
        hi = jnp.where(jnp.logical_and(bisect, jnp.logical_not(below)), sig, hi)
        low_ok = jnp.where(i == 1, below, low_ok)
        return lo, hi, lo_est, hi_est, low_ok

    init = (
        jnp.asarray(sigma_lower, dtype),
        jnp.asarray(sigma_upper, dtype),
        (zero, zero),
        (zero, zero),
        jnp.asarray(False),
    )
    lo_f, _, lo_est, hi_est, low_ok = jax.lax.fori_loop(0, num_iterations + 2, body, init)
    high_ok = hi_est[0] <= target
    sigma = jnp.where(high_ok, jnp.asarray(sigma_upper, dtype), lo_f)
    mean = jnp.where(high_ok, hi_est[0], lo_est[0])
    stderr = jnp.where(high_ok, hi_est[1], lo_est[1])
    return SigmaSearch(
        sigma=sigma,
        increase=Estimate(mean, stderr, num_samples),
        bracketed=jnp.logical_and(low_ok, jnp.logical_not(high_ok)),
    )
