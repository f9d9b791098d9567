"""Worst-case sharpness by auto-projected gradient ascent (APGD) over a perturbation ball."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_positive,
)
from kernels._devices import keep_sharding
from kernels._flat import place
from kernels._jit import compile_once
from kernels._perturbation import (
    _INT32_MAX,
    _LOOP,
    Perturbation,
    _check_count,
    _check_samples,
    _loss_at_params,
    _Problem,
    _scaled,
    _setup,
    scaled_norm,
)
from kernels._random import sign_leaves
from kernels.parallel import (
    sample_key,
)

_MOMENTUM = 0.75  # APGD's momentum weight (Croce & Hein 2020)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WorstCase:
    r"""Result of :func:`worst_case_sharpness`.

    Attributes:
      value: $L(\theta+u^*) - L(\theta)$ at the best perturbation found (a lower bound of
        the maximum).
      u: the maximiser $u^*$, a pytree shaped like the parameters.
    """

    value: Any
    u: Any


# --------------------------------------------------------------------------------------------
# worst case


class _Ascent(NamedTuple):
    """APGD's state: the best point so far and the next move from it, two trees in all.

    The iterate is always the best point so far: a candidate is accepted exactly when it raises
    the loss above the best value. The gradient is used where it is computed: at an accepted
    candidate, the next move (APGD's momentum step) is formed at once; a rejected candidate
    halves the pending move, a backtracking along the same segment. So neither a gradient nor
    the previous iterate is carried, and the candidate is formed from ``x`` and ``step``
    wherever it is needed (not held). ``step`` is kept in the parameters' own dtype (bfloat16
    for a bfloat16 model): it only proposes the next candidate, which is formed, projected and
    evaluated in the working dtype, so the value and the maximiser returned are exact at a
    feasible point whatever its rounding.
    """

    x: Any  # current iterate eta = the best point so far (working dtype)
    step: Any  # the next candidate's move from x (the parameters' storage dtype)
    f: jax.Array  # loss at x
    alpha: jax.Array  # step size
    num_bad: jax.Array  # non-finite evaluations so far


def _leaves_norm(x: list[jax.Array]) -> jax.Array:
    """2-norm of all entries of the leaves ``x``: one fused pass per leaf.

    A plain sum of squares: the iterates lie within a few radii of 0. (A scaled norm per leaf
    made the ascent's program 3x larger.)
    """
    return scaled_norm(x)


def _direction(g: list[jax.Array]) -> list[jax.Array]:
    """``g / ||g||_2`` (0 for g = 0), scaled by ``max |g|`` first so that no square overflows."""
    dtype = g[0].dtype
    big = jnp.max(jnp.stack([jnp.max(jnp.abs(a), initial=0) for a in g]))  # a leaf may be empty
    inv_big = 1 / jnp.where(big > 0, big, jnp.ones((), dtype))
    nrm = _leaves_norm([a * inv_big for a in g])
    inv = inv_big / jnp.maximum(nrm, jnp.finfo(dtype).tiny)
    return [a * inv for a in g]


def _tree_project(x: list[jax.Array], p: float, radius: jax.Array) -> list[jax.Array]:
    """Euclidean projection of all entries of the leaves ``x`` onto the l_p ball, p in {2, inf}."""
    if p != 2:
        return [jnp.clip(a, -radius, radius) for a in x]
    nrm = _leaves_norm(x)
    one = jnp.ones((), nrm.dtype)
    safe = jnp.where(nrm > 0, nrm, one)
    factor = jnp.where(nrm > 0, jnp.minimum(one, radius / safe), one)
    return [a * factor for a in x]


def _apgd_start(prob: _Problem, p: float, radius: jax.Array, k: jax.Array) -> list[jax.Array]:
    r"""A random start at half the radius: random signs on the support of the scales (eta).

    The signs are :func:`kernels._random.sign_vector` of ``k`` over all the parameters, cut
    into the leaves (:func:`kernels._random.sign_leaves`: one draw of words for every leaf, each
    leaf unpacked where it lives), and zero off the support (a leaf the mask leaves out, an
    entry of scale 0). For the $\ell_2$ ball the direction of the signs, scaled to norm
    $\rho/2$; for the $\ell_\infty$ ball the vertex $\pm\rho/2$ of the half-size box. (A
    Gaussian or uniform start, drawn leaf by leaf, put a hash loop per leaf in the program: on
    the 124M decoder FSDP over 8 CPU devices the kernel compiled in 2.4x the gradient's time,
    against 2.1x with one draw of signs.)
    """
    shapes = [tuple(np.shape(w)) for w in prob.leaves]
    zero = jnp.zeros((), prob.dtype)
    leaves = []
    for i, (z, scale) in enumerate(
        zip(sign_leaves(k, shapes, prob.dtype), prob.scales, strict=True)
    ):
        if isinstance(scale, float) and scale == 0.0:
            leaves.append(jnp.zeros(shapes[i], prob.dtype))  # left out: its signs are not used
            continue
        z = place(z, prob.shardings[i])
        leaves.append(z if isinstance(scale, float) else jnp.where(scale != 0, z, zero))
    if p == 2:
        factor = 0.5 * radius / jnp.maximum(_leaves_norm(leaves), jnp.finfo(prob.dtype).tiny)
    else:
        factor = 0.5 * radius
    return [a * factor for a in leaves]


def _candidate_factor(x: list, step: list, p: float, radius: jax.Array) -> jax.Array:
    """The scale of ``x + step`` onto the l2 ball (1 for the l-inf ball, which clips).

    ``||x + step||^2`` is summed as ``||x||^2 + 2 <x, step> + ||step||^2``: no tree holds
    ``x + step``, which is formed only where it is used (each leaf of the displaced point).
    """
    if p != 2:
        return jnp.ones((), x[0].dtype)
    sq = sum(
        jnp.sum(a * a) + 2 * jnp.sum(a * t) + jnp.sum(t * t)
        for a, t in ((a, s.astype(a.dtype)) for a, s in zip(x, step, strict=True))
    )
    nrm = jnp.sqrt(jnp.maximum(sq, 0))
    one = jnp.ones((), nrm.dtype)
    return jnp.where(nrm > radius, radius / jnp.where(nrm > 0, nrm, one), one)


def _candidate(x: list, step: list, factor: jax.Array, p: float, radius: jax.Array) -> list:
    """The candidate ``P(x + step)`` in the working dtype (``factor``: its l2 scale)."""
    moved = [a + s.astype(a.dtype) for a, s in zip(x, step, strict=True)]
    return _tree_project(moved, p, radius) if p != 2 else [a * factor for a in moved]


def _next_move(
    c: list, g: list, step: list, alpha: jax.Array, mom: jax.Array, p: float, radius: jax.Array
) -> list:
    """APGD's momentum step from an accepted candidate ``c`` with gradient ``g``, as a move.

    ``P(c + mom (z - c) + (1 - mom) step) - c`` with ``z = P(c + alpha d)``, ``d`` the ascent
    direction of ``g`` and ``step`` the pending move that proposed ``c`` (the momentum term;
    the move itself where the projection left ``x + step`` as it was).
    """
    direction = _direction(g) if p == 2 else [jnp.sign(a) for a in g]
    z = _tree_project([a + alpha * d for a, d in zip(c, direction, strict=True)], p, radius)
    moved = [
        a + mom * (zz - a) + (1 - mom) * s.astype(a.dtype)
        for a, zz, s in zip(c, z, step, strict=True)
    ]
    return [m - a for m, a in zip(_tree_project(moved, p, radius), c, strict=True)]


def _apgd_restart(
    prob: _Problem,
    p: float,
    radius: jax.Array,
    alpha0: jax.Array,
    num_steps: int,
    step_dtypes: list,
) -> Callable[[jax.Array], tuple[jax.Array, list, jax.Array]]:
    r"""``key -> (best loss, best eta leaves, non-finite count)`` of one APGD run on the ball.

    Everything parameter-sized is a pytree: $\theta + s \odot \eta$ is formed leaf by leaf, at
    each candidate $\eta$ (formed inside the loss from the carried trees), and the gradient is
    taken with respect to the leaves of $\eta$ there (``candidate``'s derivative is the
    identity in the best point). ``step_dtypes``: the dtype of each leaf's pending move
    (:class:`_Ascent`).
    """

    @jax.custom_jvp
    def candidate(x: list, step: list, factor: jax.Array, radius: jax.Array) -> list:
        # P(x + step), differentiated as if it were x: the gradient with respect to x is then
        # the loss's gradient at the candidate (the ascent's direction), and the candidate is
        # formed inside the loss from the carried trees instead of being held as its argument.
        # (Every traced value it reads is an argument: a custom_jvp may not close over one.)
        return _candidate(x, step, factor, p, radius)

    @candidate.defjvp
    def _candidate_jvp(primals: tuple, tangents: tuple) -> tuple:
        return candidate(*primals), list(tangents[0])

    def displacement(operands: tuple) -> list:
        return [_scaled(s, e) for s, e in zip(prob.scales, candidate(*operands), strict=True)]

    def loss(x: list, step: list, factor: jax.Array, flag: jax.Array) -> jax.Array:
        return prob.shifted_held(displacement, (x, step, factor, radius), flag)

    value_grad = jax.value_and_grad(loss)

    def body(i: jax.Array, state: _Ascent) -> _Ascent:
        # iteration 0 evaluates the start (x + a zero move), which is accepted (every value
        # beats the initial -inf); iteration i >= 1 evaluates APGD's candidate i.
        # value_grad (hence loss_fn) appears once; the flag (always true on a valid ball) only
        # gives the point's branch a traced condition (:func:`kernels._perturbation._in_branch`)
        factor = _candidate_factor(state.x, state.step, p, radius)
        f_new, g_new = value_grad(state.x, state.step, factor, jnp.isfinite(state.alpha))
        ok = f_new > state.f
        # the accepted candidate is formed again from the carried trees (not held through the
        # loss's evaluation) and the next move from it: x is updated first, the move reads it
        cand = _candidate(state.x, state.step, factor, p, radius)
        x = [jnp.where(ok, c, a) for c, a in zip(cand, state.x, strict=True)]
        mom = jnp.where(i == 0, 1.0, _MOMENTUM).astype(f_new.dtype)
        move = _next_move(x, g_new, state.step, state.alpha, mom, p, radius)
        half = jnp.asarray(0.5, f_new.dtype)
        return _Ascent(
            x=x,
            step=[
                jnp.where(ok, m, half * s.astype(m.dtype)).astype(s.dtype)
                for m, s in zip(move, state.step, strict=True)
            ],
            f=jnp.where(ok, f_new, state.f),
            alpha=jnp.where(ok, state.alpha, half * state.alpha),
            num_bad=state.num_bad + jnp.logical_not(jnp.isfinite(f_new)).astype(jnp.int32),
        )

    def run(k: jax.Array) -> tuple[jax.Array, list, jax.Array]:
        eta0 = _apgd_start(prob, p, radius, k)
        step0 = [jnp.zeros_like(a, dtype=d) for a, d in zip(eta0, step_dtypes, strict=True)]
        f0 = jax.eval_shape(loss, eta0, step0, jnp.ones((), prob.dtype), True)
        lowest = jnp.full(f0.shape, -jnp.inf, f0.dtype)
        init = _Ascent(eta0, step0, lowest, alpha0, jnp.zeros((), jnp.int32))
        state = jax.lax.fori_loop(0, num_steps + 1, body, init)
        # no finite value anywhere (possible only with the runtime checks off): NaN, not -inf
        best_f = jnp.where(jnp.isneginf(state.f), jnp.nan, state.f)
        return best_f, state.x, state.num_bad

    return run


@compile_once
def worst_case_sharpness(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    perturbation: Perturbation,
    num_steps: int,
    step_size: Any = None,
    num_restarts: int = 1,
    compute_dtype: Any = None,
) -> WorstCase:
    r"""Worst-case sharpness $\max_{u \in B} L(\theta+u) - L(\theta)$ by projected gradient ascent.

    $u = s \odot \eta$ (see :class:`Perturbation`) and the ascent runs on $\eta$ over the ball
    $\|\eta\|_p \le \rho$, $p \in \{2, \infty\}$, with the exact Euclidean projections of
    :func:`kernels.norms.project_lp_ball`. For the adaptive ball this is the ascent of Kwon et
    al. / Andriushchenko et al. in the rescaled coordinates. APGD-style (Croce & Hein 2020): from
    a random start, steps along $g/\|g\|_2$ ($\ell_2$) or $\operatorname{sign}(g)$
    ($\ell_\infty$) with momentum 0.75; a candidate that does not increase the loss is
    rejected: the iterate stays at the best point so far and the next candidate lies halfway
    along the rejected move (a backtracking line search), with the step size halved. The best
    point's value is returned. Each restart costs ``num_steps + 1`` value-and-gradient
    evaluations, and holds two parameter-sized trees besides the loss's own: the best point and
    the pending move, the latter in the parameters' own dtype (bfloat16 for a bfloat16 model:
    it only proposes candidates, which are formed, projected and evaluated in float32).

    The result is the loss increase at a feasible point, hence a **lower bound** of the true
    maximum, exact only if the ascent finds the global maximiser. The step size only shrinks
    (halved at each rejection), so the ascent can stop short of a stationary point however many
    steps it gets: on a convex quadratic over an $\ell_2$ ball (6 dimensions,
    $\rho = 0.1$) it stopped at 2.379858 against the maximum 2.380279 with 20 and with 1000
    steps, while ``step_size=0.01`` reached it; more restarts or a smaller ``step_size`` come
    closer.

    Args:
      loss_fn: ``(params, batch) -> scalar`` (differentiable). Static (by identity).
      params: pytree $\theta$ of float16 / bfloat16 / float32 / float64 arrays (half precision
        is worked on in float32: perturbations and sums).
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key; restart $r$ starts from ``fold_in(key, r)``.
      perturbation: a ball :class:`Perturbation` (``"l2_ball"`` or ``"linf_ball"``).
      num_steps: ascent steps per restart (>= 1). Static.
      step_size: initial step in $\eta$ units, > 0 (may be traced); default $2\rho$ (APGD).
      num_restarts: independent random starts (>= 1), the best is kept. Static.
      compute_dtype: the dtype the loss is evaluated in: ``None`` (default) float32 for
        half-precision leaves, each cast inside the program ($\theta + u$ formed in float32),
        float32/float64 leaves as they are; or ``"float32"`` / ``"float64"``. A half-precision
        compute dtype (``"params"`` of a bfloat16 model) is refused: $\theta + u$ would be
        rounded to the weights' 8 significand bits and the difference be rounding error
        (:mod:`kernels._precision`). Static.

    Returns:
      :class:`WorstCase` ``(value, u)``: the increase and the maximiser $u^*$ (a pytree like
      ``params``).

    Raises:
      ValueError: for a Gaussian perturbation, bad counts, and as :func:`average_sharpness`
        (eagerly; the runtime checks, including ``step_size`` > 0 and a non-finite loss at an
        ascent point, also under ``jit``).

    References:
      Croce & Hein 2020, "Reliable evaluation of adversarial robustness (APGD)",
      arXiv:2003.01690; Foret et al. 2021 (SAM), arXiv:2010.01412; Kwon et al. 2021,
      arXiv:2102.11600; Andriushchenko et al. 2023, arXiv:2302.07011.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, batch: jnp.sum(w)  # linear: max over the unit l2 ball is sqrt(2)
    >>> res = worst_case_sharpness(loss, jnp.zeros(2), (), jax.random.key(0),
    ...                            perturbation=Perturbation("l2_ball", 1.0), num_steps=10)
    >>> round(float(res.value), 6)
    1.414214
    """
    if not isinstance(perturbation, Perturbation) or perturbation.kind == "gaussian":
        raise ValueError(
            "perturbation: worst-case sharpness needs a Perturbation of kind 'l2_ball' or"
            f" 'linf_ball', got {perturbation!r}"
        )
    num_steps = _check_count(num_steps, "num_steps", why=_LOOP)
    num_restarts = _check_count(num_restarts, "num_restarts", why=_LOOP)
    if num_restarts * (num_steps + 1) > _INT32_MAX:
        raise ValueError(
            "num_restarts: num_restarts * (num_steps + 1) ascent points are counted in int32, "
            f"at most 2**31 - 1; got {num_restarts} * {num_steps + 1}"
        )
    if step_size is not None:
        check_positive(step_size, "step_size")
    prob = _setup(loss_fn, params, batch, key, perturbation, compute_dtype, "worst_case_sharpness")
    base, ok = _loss_at_params(prob)
    dtype = prob.dtype
    radius = jnp.asarray(perturbation.scale, dtype)
    alpha0 = 2 * radius if step_size is None else jnp.asarray(step_size, dtype)
    p = 2 if perturbation.kind == "l2_ball" else math.inf
    # the pending move in each leaf's own dtype: a bfloat16 model's in bfloat16 (a float32 or
    # float64 leaf's own dtype is its working dtype)
    step_dtypes = [jnp.result_type(w) for w in jax.tree_util.tree_leaves(params)]
    restart = _apgd_restart(prob, p, radius, alpha0, num_steps, step_dtypes)
    value, eta, bad = restart(sample_key(key, 0))

    def better(r: jax.Array, carry: tuple) -> tuple:
        # restarts one after the other, keeping only the best point (one tree, not one a start)
        value, eta, bad = carry
        v, e, b = restart(sample_key(key, r))
        take = v > value  # a NaN restart never replaces a finite best
        eta = [jnp.where(take, a, c) for a, c in zip(e, eta, strict=True)]
        return jnp.where(take, v, value), eta, bad + b

    if num_restarts > 1:
        value, eta, bad = jax.lax.fori_loop(1, num_restarts, better, (value, eta, bad))
    total = num_restarts * (num_steps + 1)
    _check_samples(bad, ok, f"{total} ascent points")
    u = [_scaled(s, e) for s, e in zip(prob.scales, eta, strict=True)]
    u = keep_sharding(prob.tree(u), params)
    return WorstCase(value=value - base, u=u)
