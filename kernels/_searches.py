"""Sup oracles by projected gradient ascent over a network's parameters (lower bounds)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    check_key,
    check_positive_int,
    runtime_checks,
    runtime_checks_enabled,
)
from kernels._ordered import CheckChain
from kernels._signs import _check_float_dtype, _check_float_tree
from kernels._sups import _HIGHEST, _check_exponent
from kernels.norms import dual_exponent, pow2_factors, vector_norm
from kernels.parallel import (
    reserved_key,
)

# the random restarts of the searches draw from reserved_key(key, _RESTART_SLOT), a key that no
# sign vector gets (the signs of draw k use sample_key(key, k)); until 2026-11 they used
# fold_in(key, 0x5EA4C4), the key of sign draw 6,202,564
_RESTART_SLOT = 0


def _restart_key(key: jax.Array) -> jax.Array:
    """The key of the searches' random restarts (no sign vector's key)."""
    return reserved_key(key, _RESTART_SLOT)


# runtime checks inside the ascent's loop body (host callbacks every step); off by default,
# see _ascend. bench/rademacher.py turns it on to measure what they cost.
_CHECKS_IN_ASCENT = False


# --------------------------------------------------------------------------- search


def _ascent_decay(num_steps: int) -> np.ndarray:
    """Step factors 0.01 ** (t / (T - 1)) for t < T, then 0 (the extra step evaluates the end)."""
    return np.append(0.01 ** (np.arange(num_steps) / max(num_steps - 1, 1)), 0.0)


def _ascend(sup: Any, signs: jax.Array, theta0: Any) -> tuple[jax.Array, jax.Array]:
    r"""Best ``sup._objective`` value and largest output bound over the iterates from ``theta0``.

    Projected ascent with normalised steps $\eta_t$ = ``sup.step_size`` times
    :func:`_ascent_decay`; every iterate is ``sup.project``-ed, so every value is attained.
    The step direction $g/\|g\|$ is formed from $g$ rescaled by a power of two (exact), so a
    gradient whose squares underflow (or are flushed to zero, as on GPUs) takes a unit step,
    and a zero gradient takes none (never ``eta / tiny`` times a tiny gradient).
    """
    objective = functools.partial(sup._objective, signs)

    def step(carry: Any, eta: jax.Array) -> Any:
        theta, best, top = carry
        (val, f_max), grad = jax.value_and_grad(objective, has_aux=True)(theta)
        scale, grad = _unit_step(grad, eta)
        theta = sup.project(
            jax.tree_util.tree_map(lambda t, d: t + (scale * d).astype(t.dtype), theta, grad)
        )
        return (theta, jnp.maximum(best, val), jnp.maximum(top, f_max)), None

    etas = sup.step_size.astype(sup.dtype) * jnp.asarray(_ascent_decay(sup.num_steps), sup.dtype)
    init = (theta0, jnp.full((), -jnp.inf, sup.dtype), jnp.zeros((), sup.dtype))
    # one extra scan step evaluates the last iterate (its update is discarded): the
    # compiled program holds one copy of the model's forward and backward pass, not two.
    # The loop body is traced without runtime checks: a check is a host callback, and one per
    # step (e.g. the finiteness check of kernels.norms' projections) costs more than the step
    # itself on CPU. Nothing goes unchecked: the starts were projected with checks on, and a
    # NaN iterate makes its value NaN (max propagates NaN), which the Monte Carlo driver counts
    # and reports as a non-finite sup.
    with runtime_checks(_CHECKS_IN_ASCENT and runtime_checks_enabled()):
        (_, best, top), _ = jax.lax.scan(step, init, etas)
    return best, top


def _unit_step(grad: Any, eta: jax.Array) -> tuple[jax.Array, Any]:
    r"""``(eta / ||u||_2, u)``, ``u = grad * 2**-e`` (exact) with ``||u||`` in [0.5, sqrt(size)].

    ``eta * u / ||u||`` is the step $\eta\, g/\|g\|$; a zero gradient gives a zero scale.
    """
    leaves = jax.tree_util.tree_leaves(grad)
    dtype = jnp.result_type(*leaves)
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))
    down, _ = pow2_factors(top)
    grad = jax.tree_util.tree_map(lambda g: g * down.astype(g.dtype), grad)
    total = sum(jnp.sum(jnp.square(g)).astype(dtype) for g in jax.tree_util.tree_leaves(grad))
    norm = jnp.sqrt(total)
    positive = norm > 0
    scale = jnp.where(positive, eta.astype(dtype) / jnp.where(positive, norm, 1), 0)
    return scale, grad


def _search_all(sup: Any, signs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Best value and largest output bound over restarts, for sign vectors ``[..., n]``."""
    lead = signs.shape[:-1]
    flat = signs.astype(sup.dtype).reshape(-1, sup.num_examples)
    one = functools.partial(_ascend, sup)
    per_start = jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None))
    best, top = per_start(flat, sup.starts)
    return jnp.max(best, axis=1).reshape(lead), jnp.max(top, axis=1).reshape(lead)


class _Search:
    """What both searches share: the ascent from every start, for sign vectors ``[..., n]``.

    A subclass gives ``_objective(signs, theta) -> (value, output bound)`` and the fields
    ``starts``, ``num_examples`` and ``dtype`` (:func:`_search_all`, :func:`_ascend`).
    """

    def search(self, signs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Values ``[...]`` for sign vectors ``[..., n]`` and the largest output bound seen.

        The second output is the largest output bound of the class (:class:`SearchSup`:
        ``max |f(x_i)|``; :class:`ReadoutSearchSup`: ``B max_i ||phi_V(x_i)||_{q*}``) over
        every parameter the search visited for that sign vector (all iterates of all
        restarts): what an ``output_bound`` must cover.
        """
        return _search_all(self, signs)

    def __call__(self, signs: jax.Array) -> jax.Array:
        """Search values (lower bounds of the sups) for sign vectors ``[..., n]``."""
        return self.search(signs)[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SearchSup(_Search):
    r"""Lower-bound sup of a constrained parametric class (see :func:`search_sup`).

    Attributes:
      starts: the ascent's starting points, each leaf stacked ``[num_restarts, ...]`` (leaves).
      inputs: the sample ``apply_fn`` reads (leaves).
      step_size: $\eta_0$ (leaf).
      apply_fn: ``(params, inputs) -> [n]`` or ``[n, 1]`` outputs. Static.
      project: Euclidean projection onto the constraint set. Static.
      num_steps: ascent steps per start. Static.
      num_examples: n. Static.
      dtype: dtype of the outputs. Static.
    """

    starts: Any
    inputs: Any
    step_size: jax.Array
    apply_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    project: Callable[[Any], Any] = dataclasses.field(metadata={"static": True})
    num_steps: int = dataclasses.field(metadata={"static": True})
    num_examples: int = dataclasses.field(metadata={"static": True})
    dtype: Any = dataclasses.field(metadata={"static": True})

    def _objective(self, signs: jax.Array, theta: Any) -> tuple[jax.Array, jax.Array]:
        r"""$g_\sigma(\theta)$ and $\max_i |f_\theta(x_i)|$."""
        n = self.num_examples
        f = self.apply_fn(theta, self.inputs).reshape(n).astype(self.dtype)
        # the value certifies a lower bound: full precision whatever the default (TF32)
        return jnp.dot(signs, f, precision=_HIGHEST) / n, jnp.max(jnp.abs(f))


def _random_starts(
    params: Any, key: jax.Array, project: Callable, num_restarts: int, init_scale: Any
) -> Any:
    """``project(params)`` and ``num_restarts - 1`` projected Gaussian restarts, stacked."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))

    def random_start(r: int) -> Any:
        new = []
        for leaf, k in zip(leaves, keys, strict=True):
            leaf = jnp.asarray(leaf)
            rms = jnp.sqrt(jnp.mean(leaf * leaf)) if leaf.size else jnp.ones((), leaf.dtype)
            rms = jnp.where(rms > 0, rms, jnp.ones_like(rms))
            z = jax.random.normal(jax.random.fold_in(k, r), leaf.shape, leaf.dtype)
            new.append(leaf + jnp.asarray(init_scale, leaf.dtype) * rms * z)
        return project(jax.tree_util.tree_unflatten(treedef, new))

    starts = [project(params)] + [random_start(r) for r in range(1, num_restarts)]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *starts)


def _check_projection(project: Callable, params: Any) -> None:
    """``project(params)`` keeps the structure, shapes and dtypes of ``params`` (abstractly)."""
    try:
        out = jax.eval_shape(project, params)
    except Exception as err:  # re-raised with the argument named
        raise ValueError(f"project: could not be evaluated at params: {err}") from err
    want = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), params)
    got = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), out)
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(params) or got != want:
        raise ValueError(
            "project: must return parameters of the structure, shapes and dtypes of params "
            f"(a projection onto the constraint set), got {got} for {want}"
        )


def _search_starts(
    params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
):
    """Checked ascent options: the step count, the projected random starts and the first start.

    Runtime checks join ``chain`` in argument order (step_size, init_scale, params, inputs);
    ``project`` and the starts see the cleaned values, so a bad argument is reported by its
    own check, never by one inside ``project``.
    """
    steps = check_positive_int(num_steps, "num_steps")
    restarts = check_positive_int(num_restarts, "num_restarts")
    check_key(key)
    chain.positive(step_size, "step_size")
    chain.positive(init_scale, "init_scale")
    _check_float_tree(params, "params", chain=chain)
    if jax.tree_util.tree_leaves(inputs):
        _check_float_tree(inputs, "inputs", allow_int=True, chain=chain)
    _check_projection(project, params)
    params, inputs = chain.clean((params, inputs))
    if isinstance(init_scale, jax.Array):
        init_scale = chain.clean(init_scale)
    starts = _random_starts(params, key, project, restarts, init_scale)
    first = jax.tree_util.tree_map(lambda leaf: leaf[0], starts)
    return steps, starts, first, inputs


def _search_sup(
    apply_fn: Callable,
    params: Any,
    inputs: Any,
    key: jax.Array,
    project: Callable,
    num_steps: Any,
    step_size: Any,
    num_restarts: Any,
    init_scale: Any,
    chain: CheckChain,
) -> SearchSup:
    """The search object; ``apply_fn`` runs once at ``project(params)`` (n, dtype, finite)."""
    steps, starts, first, inputs = _search_starts(
        params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
    )
    out = apply_fn(first, inputs)
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValueError(f"apply_fn: must return outputs [n] or [n, 1], got shape {shape}")
    if shape[0] == 0:
        raise ValueError("inputs: empty sample (apply_fn returned 0 outputs)")
    dtype = _check_float_dtype(out.dtype, "apply_fn")
    chain.finite(out, "apply_fn: outputs at project(params)")
    step = chain.clean(jnp.asarray(step_size, dtype))
    return SearchSup(starts, inputs, step, apply_fn, project, steps, int(shape[0]), dtype)


def search_sup(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    init_scale: Any = 1.0,
) -> SearchSup:
    r"""Lower-bound sup object of a constrained parametric class, ``signs[..., n] -> [...]``.

    For each sign vector, projected gradient ascent on
    $g_\sigma(\theta) = \frac1n\sum_i \sigma_i f_\theta(x_i)$ over $\Theta$ = the range of
    ``project``: $\theta_{t+1} = P(\theta_t + \eta_t\, \nabla g_\sigma(\theta_t) /
    \|\nabla g_\sigma(\theta_t)\|_2)$ (normalised steps, so ``step_size`` is in parameter units;
    $\eta_t$ decays geometrically from ``step_size`` to ``step_size / 100``), started from
    ``project(params)`` and from ``num_restarts - 1`` random points
    ``project(params + init_scale * z)``, z Gaussian with each leaf's RMS scale (shared by all
    sign vectors, drawn from ``key``). The value is the best $g_\sigma$ over all iterates and
    restarts. Every iterate is feasible, so each value is a **lower bound** of
    $\sup_{\theta\in\Theta} g_\sigma(\theta)$. Sign vectors and restarts are vmapped. This
    evaluates ``apply_fn`` once at ``project(params)`` to learn n and the dtype.

    Args:
      apply_fn: ``(params, inputs) -> outputs`` of shape ``[n]`` or ``[n, 1]`` (float32/64).
      params: float32/float64 parameter pytree (a point of the class; the first start).
      inputs: the sample (any pytree ``apply_fn`` accepts; integer leaves such as token ids are
        allowed).
      key: PRNG key for the random restarts.
      project: Euclidean projection onto the constraint set (params -> params).
      num_steps: ascent steps per start. Static.
      step_size: first step length eta_0 > 0 (global l2 units), about the set's diameter.
      num_restarts: starts per sign vector (>= 1). Static.
      init_scale: scale > 0 of the random restarts relative to each leaf's RMS.

    Returns:
      :class:`SearchSup` (lower bound); ``.search(signs)`` also returns the largest
      $|f_\theta(x_i)|$ the search saw.

    Raises:
      ValueError: on bad counts, key, dtypes, non-finite data or parameters, a non-positive step
        size, or if ``apply_fn`` does not give ``[n]`` outputs.
    """
    return _search_sup(
        apply_fn, params, inputs, key, project, num_steps, step_size, num_restarts, init_scale,
        CheckChain(),
    )  # fmt: skip


def _smooth_lp(v: jax.Array, p: float) -> jax.Array:
    r"""$\|v\|_p$ along the last axis, with a zero (not NaN) gradient at $v = 0$; NaN stays NaN.

    For $1 < p < \infty$ computed as $m\,\|v/m\|_p$, $m = \max_j|v_j|$ (no overflow for large p,
    and a finite derivative everywhere); $p = 1$ and $p = \infty$ have subgradients already.
    """
    if p == 1 or math.isinf(p):
        return vector_norm(v, p, axis=-1)
    a = jnp.abs(v)
    m = jnp.max(a, axis=-1, keepdims=True)
    zero = m == 0  # false for NaN: a NaN v gives a NaN norm, never a silent 0
    m = jnp.where(zero, jnp.ones_like(m), m)
    total = jnp.sum((a / m) ** jnp.asarray(p, v.dtype), axis=-1, keepdims=True)
    total = jnp.where(zero, jnp.ones_like(total), total)  # >= 1 otherwise: the largest term is 1
    out = m * total ** jnp.asarray(1 / p, v.dtype)
    return jnp.where(zero, jnp.zeros_like(out), out)[..., 0]


def _readout_exponent(readout_norm: Any) -> float:
    """The dual exponent $q^*$ of ``readout_norm`` = q in [1, inf]; else raise naming it."""
    return dual_exponent(_check_exponent(readout_norm, "readout_norm: "))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReadoutSearchSup(_Search):
    r"""Lower-bound sup of a class ending in a norm-bounded readout (:func:`readout_search_sup`).

    Attributes:
      starts: the ascent's starting points of the inner parameters, each leaf stacked
        ``[num_restarts, ...]`` (leaves).
      inputs: the sample ``features_fn`` reads (leaves).
      step_size: $\eta_0$ (leaf).
      readout_radius: $B$, the radius of the readout ball (leaf).
      features_fn: ``(params, inputs) -> [n, k]`` features $\phi_V(x_i)$. Static.
      project: Euclidean projection of the inner parameters onto their constraint set. Static.
      num_steps: ascent steps per start. Static.
      num_examples: n. Static.
      dual: $q^*$, the exponent of the dual norm of the readout norm $q$. Static.
      dtype: dtype of the features. Static.
    """

    starts: Any
    inputs: Any
    step_size: jax.Array
    readout_radius: jax.Array
    features_fn: Callable[[Any, Any], jax.Array] = dataclasses.field(metadata={"static": True})
    project: Callable[[Any], Any] = dataclasses.field(metadata={"static": True})
    num_steps: int = dataclasses.field(metadata={"static": True})
    num_examples: int = dataclasses.field(metadata={"static": True})
    dual: float = dataclasses.field(metadata={"static": True})
    dtype: Any = dataclasses.field(metadata={"static": True})

    def _objective(self, signs: jax.Array, theta: Any) -> tuple[jax.Array, jax.Array]:
        r"""$\frac Bn\|\Phi_V^\top\sigma\|_{q^*}$ and $B\max_i\|\phi_V(x_i)\|_{q^*}$."""
        n = self.num_examples
        phi = self.features_fn(theta, self.inputs).reshape(n, -1).astype(self.dtype)
        # the closed-form readout sup certifies a lower bound: full precision whatever the
        # default matmul precision (TF32 on a GPU)
        v = jnp.dot(signs, phi, precision=_HIGHEST, preferred_element_type=self.dtype)
        radius = self.readout_radius.astype(self.dtype)
        value = radius / n * _smooth_lp(v, self.dual)
        return value, radius * jnp.max(vector_norm(phi, self.dual, axis=1))


def _readout_search_sup(
    features_fn: Callable,
    params: Any,
    inputs: Any,
    key: jax.Array,
    project: Callable,
    readout_norm: Any,
    readout_radius: Any,
    num_steps: Any,
    step_size: Any,
    num_restarts: Any,
    init_scale: Any,
    chain: CheckChain,
) -> ReadoutSearchSup:
    """The search object; ``features_fn`` runs once at ``project(params)`` (n, dtype, finite)."""
    dual = _readout_exponent(readout_norm)
    chain.positive(readout_radius, "readout_radius")
    steps, starts, first, inputs = _search_starts(
        params, inputs, key, project, num_steps, num_restarts, step_size, init_scale, chain
    )
    out = features_fn(first, inputs)
    shape = getattr(out, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] == 0:
        raise ValueError(f"features_fn: must return features [n, k] with k >= 1, got shape {shape}")
    if shape[0] == 0:
        raise ValueError("inputs: empty sample (features_fn returned 0 rows)")
    dtype = _check_float_dtype(out.dtype, "features_fn")
    chain.finite(out, "features_fn: features at project(params)")
    return ReadoutSearchSup(
        starts=starts,
        inputs=inputs,
        step_size=chain.clean(jnp.asarray(step_size, dtype)),
        readout_radius=chain.clean(jnp.asarray(readout_radius, dtype)),
        features_fn=features_fn,
        project=project,
        num_steps=steps,
        num_examples=int(shape[0]),
        dual=dual,
        dtype=dtype,
    )


def readout_search_sup(
    features_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    readout_norm: float,
    readout_radius: Any,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    init_scale: Any = 1.0,
) -> ReadoutSearchSup:
    r"""Lower-bound sup object of a class ending in a norm-bounded linear readout.

    The class is $\{x \mapsto w^\top\phi_V(x) : V \in \mathcal V, \|w\|_q \le B\}$ with
    features $\phi_V$ = ``features_fn(V, inputs)`` $\in\mathbb R^{n\times k}$. For a fixed V the
    sup over the readout is closed-form (Hölder, attained):

    $$\sup_{\|w\|_q\le B}\frac1n\sum_i\sigma_i w^\top\phi_V(x_i)
    = \frac Bn\Big\|\sum_i\sigma_i\phi_V(x_i)\Big\|_{q^*},\qquad \frac1q+\frac1{q^*}=1,$$

    so only V is searched: projected gradient ascent on
    $h_\sigma(V) = \frac Bn\|\Phi_V^\top\sigma\|_{q^*}$ over $\mathcal V$ = the range of
    ``project``, with the steps, decay, starts and restarts of :func:`search_sup`. Each value is
    the best $h_\sigma$ over all iterates and restarts; every iterate is feasible and its readout
    sup attained, so each value is a **lower bound** of the class's sup, and **exact** when the
    features do not depend on V (a linear class: :class:`LinearSup`'s value). This evaluates
    ``features_fn`` once at ``project(params)`` to learn n and the dtype.

    Args:
      features_fn: ``(params, inputs) -> [n, k]`` float32/float64 features (the network up to
        its readout).
      params: float32/float64 inner parameters V (a point of $\mathcal V$; the first start). The
        readout w is not a parameter: its sup is closed-form.
      inputs: the sample (any pytree ``features_fn`` accepts; integer leaves allowed).
      key: PRNG key for the random restarts.
      project: Euclidean projection of the inner parameters onto $\mathcal V$.
      readout_norm: q in [1, inf], the norm of the readout ball (its dual $q^*$ is used). Static.
      readout_radius: B > 0, the radius of the readout ball (float or array scalar).
      num_steps: ascent steps per start. Static.
      step_size: first step length eta_0 > 0 (global l2 units of V).
      num_restarts: starts per sign vector (>= 1). Static.
      init_scale: scale > 0 of the random restarts relative to each leaf's RMS.

    Returns:
      :class:`ReadoutSearchSup` (lower bound); ``.search(signs)`` also returns the largest
      $B\max_i\|\phi_V(x_i)\|_{q^*}$ the search saw.

    Raises:
      ValueError: on a readout norm outside [1, inf], a non-positive readout radius or step size,
        bad counts, key, dtypes, non-finite data or parameters, or if ``features_fn`` does not
        give ``[n, k]`` features.

    >>> import jax, jax.numpy as jnp, kernels.norms as kn
    >>> sup = readout_search_sup(lambda v, x: x, jnp.zeros(1), jnp.eye(2), jax.random.key(0),
    ...     project=lambda v: v, readout_norm=2, readout_radius=1.0, num_steps=1, step_size=1.0)
    >>> # fixed features: exact, B ||s||_2 / n = sqrt(2) / 2
    >>> round(float(sup(jnp.array([1.0, -1.0]))), 6)
    0.707107
    """
    return _readout_search_sup(
        features_fn,
        params,
        inputs,
        key,
        project,
        readout_norm,
        readout_radius,
        num_steps,
        step_size,
        num_restarts,
        init_scale,
        CheckChain(),
    )
