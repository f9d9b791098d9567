r"""Sharpness of a loss under parameter perturbations: average, worst case, adaptive.

One :class:`Perturbation` spec describes the perturbation for every kernel here (and for the
PAC-Bayes bounds): its kind (Gaussian with standard deviation $\sigma$, or a uniform draw from /
the worst point of an $\ell_2$ or $\ell_\infty$ ball of radius $\rho$), whether it is *adaptive*
(each coordinate scaled by $|\theta_i|$, which makes sharpness invariant to the rescaling
symmetries of ReLU networks), and a *mask* restricting it to chosen parameter groups.

Writing $s = m \odot c$ for the mask $m \in \{0,1\}^n$ times $c = |\theta|$ (adaptive) or
$c = 1$, the perturbation vector is $u = s \odot \eta$ with

- ``"gaussian"``: $\eta \sim N(0, \sigma^2 I)$;
- ``"l2_ball"``: $\|\eta\|_2 \le \rho$ (on the support of $s$);
- ``"linf_ball"``: $\|\eta\|_\infty \le \rho$.

Kernels (all ``(loss_fn, params, batch, key, *, perturbation, ...)`` with
``loss_fn(params, batch) -> scalar``):

- :func:`average_sharpness`: $\mathbb E_u L(\theta+u) - L(\theta)$, with antithetic pairs;
- :func:`sharpness_decomposition`: the Theorem 6/12 identity
  $\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr} H(\theta) + P$;
- :func:`perturbed_hessian_traces`: $\operatorname{tr} H(\theta + u_j)$ per perturbation, and
  their mean;
- :func:`worst_case_sharpness`: $\max_{u} L(\theta+u) - L(\theta)$ over a ball (a lower bound);
- :func:`sigma_search`: the largest $\sigma$ whose average increase stays below a target.

Glossary: ``num_samples`` counts independent Monte Carlo samples: perturbations, or antithetic
*pairs* $(u, -u)$ (``K`` pairs are ``2K`` loss evaluations, reported in
``Estimate.num_evaluations``); ``num_probes`` counts Hutchinson probes; ``num_steps`` counts
iterations (ascent steps, bisection steps); ``chunk_size`` is samples per vectorised batch,
``None`` meaning one at a time (least memory).

Monte Carlo means run through :func:`kernels.parallel.sample_statistics`: sample $i$ uses the key
``fold_in(key, i)``, memory is that of one chunk whatever ``num_samples`` is, the result does not
depend on ``chunk_size`` or the device count, and draws shard over ``jax.devices()``.

Compilation: every kernel is compiled once per (``loss_fn`` object, static options, shapes and
dtypes) (:func:`kernels._jit.compile_once`): pass data through ``batch`` rather than closing over
it, and a traced scale (``Perturbation("gaussian", jnp.asarray(0.01))``) to vary $\sigma$
without recompiling. Inside one program ``loss_fn`` is traced once (its jaxpr is reused for
$L(\theta)$, every perturbed point and every derivative).

Checks: non-finite parameters, a non-positive or non-finite scale (also when traced), a
non-finite loss at $\theta$, and a loss that turns non-finite at any perturbed point raise an
error naming the argument, eagerly (``ValueError``) and inside ``jax.jit`` (a runtime error whose
message contains ``"kernels check failed: ..."``); :func:`kernels._checks.runtime_checks` turns
the runtime checks off.

Precision: $L(\theta+u) - L(\theta)$ is a difference of two nearly equal numbers. In float32
an increase below about $10^{-7} L(\theta)$ is lost to rounding, which the reported standard
error does not include; use float64 parameters for small $\sigma$. Half-precision parameters
(float16, bfloat16) are refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from kernels._backend import (
    auto_chunk_size,
    budgeted_chunk_size,
    gradient_bytes,
    memory_budget,
    program_bytes,
    sample_bytes,
    tree_bytes,
    tree_size,
)
from kernels._checks import (
    check_array_leaves,
    check_chunk_size,
    check_finite,
    check_key,
    check_positive,
    check_positive_int,
    check_that,
    describe,
    is_concrete,
)
from kernels._devices import keep_sharding
from kernels._jit import compile_once
from kernels._random import sign_vector
from kernels.estimate import Estimate, estimate_from_samples
from kernels.norms import tree_norm
from kernels.parallel import (
    SampleStats,
    check_num_samples,
    map_samples,
    sample_devices,
    sample_key,
    sample_statistics,
)

__all__ = [
    "Perturbation",
    "PerturbedTraces",
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
_INT32_MAX = 2**31 - 1
_KEPT = "every sample's result is kept, one row each"
_LOOP = "a loop count (int32)"
_MODES = ("auto", "forms", "products")
_MOMENTUM = 0.75  # APGD's momentum weight (Croce & Hein 2020)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# --------------------------------------------------------------------------------------------
# the perturbation spec


class _TreeMask:
    """A pytree of bools held as static data: hashed and compared by value."""

    __slots__ = ("_key", "tree")

    def __init__(self, tree: Any) -> None:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        arrays = []
        for leaf in leaves:
            if isinstance(leaf, jax.core.Tracer):
                raise ValueError(
                    "perturbation.mask: a mask is static; expected concrete bools, got a traced"
                    " value"
                )
            arr = np.asarray(leaf)
            if arr.dtype != np.bool_:
                raise ValueError(
                    f"perturbation.mask: expected bool leaves (True / False), got {arr.dtype}"
                )
            arr.setflags(write=False)
            arrays.append(arr)
        self.tree = jax.tree_util.tree_unflatten(treedef, arrays)
        self._key = (treedef, tuple((a.shape, a.tobytes()) for a in arrays))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TreeMask) and self._key == other._key

    def __repr__(self) -> str:
        return repr(jax.tree_util.tree_map(lambda a: a.tolist(), self.tree))


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(
        value, int | float | np.integer | np.floating | np.ndarray | jax.Array
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Perturbation:
    r"""How parameters are perturbed: kind, scale, adaptive scaling and a parameter mask.

    The perturbation vector is $u = s \odot \eta$ with $s = m \odot |\theta|$
    (``adaptive=True``) or $s = m$, where $m$ is the 0/1 mask, and
    $\eta \sim N(0, \sigma^2 I)$ (``"gaussian"``, ``scale`` $= \sigma$) or $\eta$ in the
    $\ell_2$ / $\ell_\infty$ ball of radius ``scale`` $= \rho$ (``"l2_ball"``, ``"linf_ball"``;
    :func:`average_sharpness` draws $\eta$ uniformly from the ball, :func:`worst_case_sharpness`
    maximises over it).

    A registered pytree: ``scale`` is its one leaf (it may be a traced scalar, e.g. to vary
    $\sigma$ under ``jit`` / ``vmap`` without recompiling); ``kind``, ``adaptive`` and ``mask``
    are static. A concrete scale is checked here; a traced one by a runtime check in the kernel.

    Attributes:
      kind: ``"gaussian"``, ``"l2_ball"`` or ``"linf_ball"``. Static.
      scale: $\sigma$ or the radius $\rho$: a finite scalar > 0.
      adaptive: scale each coordinate by $|\theta_i|$ (adaptive / magnitude-aware sharpness);
        coordinates with $\theta_i = 0$ are then not perturbed. Static.
      mask: which parameters to perturb (static): ``None`` (all); a pytree of bools (or bool
        arrays broadcastable to the leaves) whose structure is a prefix of the parameters', e.g.
        ``{"attn": True, "mlp": False}`` (stored as a hashable copy); or a callable
        ``(path, leaf) -> bool`` deciding from ``path = jax.tree_util.keystr(key_path)`` and the
        leaf's shape / dtype (not its values), e.g. ``lambda path, leaf: "attn" in path``,
        hashed by identity (reuse one function object to avoid recompiling).

    Raises:
      ValueError: for an unknown kind, a non-bool ``adaptive``, a mask with non-bool leaves, or
        a concrete scale (sigma / radius) that is not a finite value > 0.

    References:
      Kwon, Kim, Park, Choi 2021, "ASAM", arXiv:2102.11600; Andriushchenko, Croce, Müller,
      Hein, Flammarion 2023, "A modern look at the relationship between sharpness and
      generalization", arXiv:2302.07011.

    >>> Perturbation("gaussian", 0.01)
    Perturbation(kind='gaussian', scale=0.01, adaptive=False, mask=None)
    """

    kind: Literal["gaussian", "l2_ball", "linf_ball"] = dataclasses.field(metadata={"static": True})
    scale: Any
    adaptive: bool = dataclasses.field(default=False, metadata={"static": True})
    mask: Any = dataclasses.field(default=None, metadata={"static": True})

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"perturbation.kind: expected one of {_KINDS}, got {self.kind!r}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"perturbation.adaptive: expected a bool, got {self.adaptive!r}")
        if not (self.mask is None or callable(self.mask) or isinstance(self.mask, _TreeMask)):
            object.__setattr__(self, "mask", _TreeMask(self.mask))
        # pytree unflattening rebuilds the spec with tracers (checked in the kernels) or
        # placeholders; only concrete numbers are checked here
        if _is_number(self.scale) and is_concrete(self.scale):
            check_positive(self.scale, self.scale_name)

    @property
    def scale_name(self) -> str:
        """``"perturbation.scale (sigma)"`` or ``"perturbation.scale (radius)"`` for messages."""
        return f"perturbation.scale ({'sigma' if self.kind == 'gaussian' else 'radius'})"


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
# shared set-up


@dataclasses.dataclass(frozen=True)
class _Problem:
    flat: jax.Array  # theta, raveled
    unravel: Callable[[jax.Array], Any]
    # flat displacement d -> L(theta + d), traced once (jitted closure). theta + d is formed
    # leaf by leaf from the unraveled d, so no raveled perturbed vector is ever materialised.
    loss: Callable[[jax.Array], jax.Array]
    scales: jax.Array  # s = mask * (|theta| or 1)
    dim: Any  # number of perturbed coordinates (support of s)
    ok: jax.Array  # params finite and scale valid: later checks report only their own failure
    # displacement leaves [d_1, ...] (shaped like the parameters' leaves) -> L(theta + d)
    shifted: Callable[[list], jax.Array]


def _ravel_params(params: Any) -> tuple[jax.Array, Callable[[jax.Array], Any]]:
    """Static checks of the parameters' dtypes and sizes, then ``ravel_pytree``."""
    check_array_leaves(params, "params")
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError("params: expected at least one parameter array, got an empty pytree")
    dtypes = {np.dtype(jnp.result_type(leaf)) for leaf in leaves}
    for dtype in dtypes:
        if dtype in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16)):
            raise ValueError(
                f"params: {dtype} parameters are refused (a loss difference L(θ+u) - L(θ) in half"
                " precision is mostly rounding error); cast them to float32 or float64"
            )
        if dtype not in _FLOATS:
            raise ValueError(f"params: expected float32 or float64 leaves, got {dtype}")
    if len(dtypes) > 1:
        names = sorted(map(str, dtypes))
        raise ValueError(f"params: expected one float dtype for all leaves, got {names}")
    if sum(math.prod(jnp.shape(leaf)) for leaf in leaves) == 0:
        raise ValueError("params: expected at least one parameter entry, got only empty arrays")
    return ravel_pytree(params)


def _mask_leaf(value: Any, leaf: Any) -> np.ndarray:
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            "perturbation.mask: the callable must decide from the path and the leaf's shape or"
            " dtype (a static choice), not from the parameter values"
        )
    arr = np.asarray(value)
    if arr.dtype != np.bool_:
        raise ValueError(f"perturbation.mask: expected bools, got {arr.dtype}")
    try:
        return np.broadcast_to(arr, jnp.shape(leaf))
    except ValueError as err:
        raise ValueError(
            f"perturbation.mask: a mask of shape {arr.shape} does not broadcast to a parameter of"
            f" shape {jnp.shape(leaf)}"
        ) from err


def _mask_tree(mask: Any, params: Any) -> list[np.ndarray]:
    """The 0/1 mask (static) as one bool array per leaf of ``params`` (in leaf order)."""
    if mask is None:
        tree = jax.tree_util.tree_map(lambda p: np.ones(jnp.shape(p), bool), params)
    elif callable(mask):
        tree = jax.tree_util.tree_map_with_path(
            lambda path, p: _mask_leaf(mask(jax.tree_util.keystr(path), p), p), params
        )
    else:
        try:
            tree = jax.tree_util.tree_map(
                lambda m, sub: jax.tree_util.tree_map(lambda p: _mask_leaf(m, p), sub),
                mask.tree,
                params,
            )
        except (ValueError, TypeError) as err:
            if str(err).startswith("perturbation.mask"):
                raise
            raise ValueError(
                "perturbation.mask: expected None, a callable (path, leaf) -> bool, or a pytree of"
                f" bools whose structure is a prefix of the params' structure: {err}"
            ) from err
    return list(jax.tree_util.tree_leaves(tree))


def _mask_vector(mask: Any, params: Any) -> np.ndarray:
    """The 0/1 mask (static) as a flat bool vector in the order of ``ravel_pytree(params)``."""
    return np.concatenate([np.ravel(m) for m in _mask_tree(mask, params)])


def _setup(
    loss_fn: Callable[..., Any], params: Any, batch: Any, key: Any, perturbation: Any
) -> _Problem:
    """Static checks, the runtime checks on params and scale, and the raveled problem."""
    if not isinstance(perturbation, Perturbation):
        raise ValueError(
            f"perturbation: expected a Perturbation, got {type(perturbation).__name__}"
        )
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    check_key(key)
    flat, unravel = _ravel_params(params)
    dtype = flat.dtype
    scale = perturbation.scale
    if not _is_number(scale) or jnp.shape(scale) != ():
        raise ValueError(f"{perturbation.scale_name}: expected a scalar > 0, got {describe(scale)}")
    mask = _mask_vector(perturbation.mask, params)
    if not mask.any():
        raise ValueError("perturbation.mask: matches no parameter")
    check_finite(params, "params")
    check_positive(scale, perturbation.scale_name)
    ok = jnp.logical_and(jnp.all(jnp.isfinite(flat)), _valid_scale(scale))
    # an all-true mask (the default) becomes a broadcast of ones that XLA folds away, not a
    # parameter-sized constant in the program
    mask_values = jnp.ones(flat.shape, dtype) if mask.all() else jnp.asarray(mask, dtype)
    if perturbation.adaptive:
        scales = mask_values * jnp.abs(flat)
        dim = _support_size(scales)
        check_that(
            jnp.logical_or(jnp.logical_not(ok), dim > 0),
            "perturbation: adaptive scales |θ| are zero on every masked parameter",
        )
        ok = jnp.logical_and(ok, dim > 0)
    else:
        scales = mask_values
        dim = int(mask.sum())
    # One jitted closure of the displacement's leaves: every use (L(θ), perturbed points,
    # derivatives, flat or leaf by leaf) reuses the jaxpr of a single trace of loss_fn, this
    # shape check included.
    leaves, treedef = jax.tree_util.tree_flatten(params)
    shifted = jax.jit(
        lambda d: loss_fn(
            jax.tree_util.tree_unflatten(treedef, [w + x for w, x in zip(leaves, d, strict=True)]),
            batch,
        )
    )

    def loss(d: jax.Array) -> jax.Array:
        return shifted(jax.tree_util.tree_leaves(unravel(d)))

    _check_loss_value(jax.eval_shape(loss, flat))
    return _Problem(flat, unravel, loss, scales, dim, ok, shifted)


def _support_size(scales: jax.Array) -> jax.Array:
    """How many scales are nonzero, counted in their float dtype.

    An int32 count wraps past 2**31 parameters with x64 off; a float32 count is exact to
    2**24 and within a relative 1e-6 beyond, ample for the radius draw ``u**(1/dim)``.
    """
    return jnp.sum(scales != 0, dtype=scales.dtype)


def _valid_scale(scale: Any) -> jax.Array:
    return jnp.logical_and(jnp.isfinite(scale), jnp.asarray(scale) > 0)


def _check_loss_value(value: Any) -> None:
    """Static check that the loss is a real floating scalar (from its shape and dtype)."""
    shape, dtype = jnp.shape(value), jnp.result_type(value)
    if shape != () or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"loss_fn: must return a real floating scalar, got {dtype} of shape {shape}"
        )


def _checked_base(prob: _Problem, base: jax.Array) -> jax.Array:
    """Runtime check that L(theta) is finite; returns the updated check gate."""
    finite = jnp.isfinite(base)
    check_that(
        jnp.logical_or(jnp.logical_not(prob.ok), finite),
        "loss_fn: expected a finite loss at params, got {}",
        base,
    )
    return jnp.logical_and(prob.ok, finite)


def _loss_at_params(prob: _Problem) -> tuple[jax.Array, jax.Array]:
    """L(theta) (checked) and the updated check gate."""
    base = prob.loss(jnp.zeros_like(prob.flat))
    return base, _checked_base(prob, base)


def _hessian_at(
    prob: _Problem, shift: jax.Array
) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """L at theta + ``shift`` and ``v -> H v`` there, from one linearisation of the gradient."""
    value, linear = _linearized(prob, shift)
    return value, lambda v: linear(v)[1]


def _linearized(prob: _Problem, shift: jax.Array) -> tuple[jax.Array, Any]:
    """L at theta + ``shift`` and the linearised value-and-gradient there (a Partial)."""
    (value, _), linear = jax.linearize(jax.value_and_grad(prob.loss), shift)
    return value, linear


def _quadratic_form(prob: _Problem) -> Callable[[jax.Array], jax.Array]:
    r"""``x -> x^T H(theta) x``: the second derivative of $t \mapsto L(\theta + t x)$ at 0.

    Forward over forward mode (two nested ``jax.jvp``): no backward pass, no linearisation.
    """
    zero = jnp.zeros_like(prob.flat)

    def form(x: jax.Array) -> jax.Array:
        def slope(d: jax.Array) -> jax.Array:
            return jax.jvp(prob.loss, (d,), (x,))[1]

        return jax.jvp(slope, (zero,), (x,))[1]

    return form


# the decomposition's u^T H u: linearised products for one pair / probe at a time while the
# linearisation keeps at most this many bytes and their estimated memory fits the sharpness
# budget (_products_fit), else quadratic forms (the rule and the measurements behind it:
# kernels._backend's memory budget, kernels.curvature's Hutchinson mode="auto")
_PRODUCT_RESIDUAL_BYTES = 2**30


def _residual_bytes(linear: Any) -> int:
    leaves = jax.tree_util.tree_leaves(linear)
    return sum(math.prod(jnp.shape(x)) * np.dtype(jnp.result_type(x)).itemsize for x in leaves)


def _check_samples(num_bad: jax.Array, ok: jax.Array, what: str) -> None:
    """Runtime check: no non-finite sample (reported only when the earlier checks passed)."""
    check_that(
        jnp.logical_or(jnp.logical_not(ok), num_bad == 0),
        f"loss_fn: non-finite at {{}} of the {what} (the estimate would be NaN)",
        num_bad,
    )


def _check_count(value: Any, name: str, minimum: int = 1, why: str = _LOOP) -> int:
    """An int in ``[minimum, 2**31 - 3]``: counts of kept results and of loop iterations.

    The loops run a count plus up to 2 extra iterations in int32 (``lax.fori_loop``).
    """
    num = check_positive_int(value, name, minimum)
    if num > _INT32_MAX - 2:
        raise ValueError(f"{name}: at most 2**31 - 3 ({why}), got {num}")
    return num


def _check_chunk(chunk_size: Any) -> Any:
    """``chunk_size``: ``None``, an int >= 1, or ``"auto"`` (resolved by :func:`_auto_chunk`)."""
    return check_chunk_size(chunk_size, auto="auto")


def _auto_chunk(
    chunk_size: Any, params: Any, prob: _Problem, *, hessian: bool = False
) -> int | None:
    """``chunk_size`` (checked by :func:`_check_chunk`) with ``"auto"`` resolved.

    ``"auto"`` is ``None`` on a CPU. On an accelerator the largest power of two up to 16 (and
    within :func:`kernels._backend.default_chunk_size`'s device budget) whose samples'
    estimated memory fits ``memory_budget("sharpness", ...)``: 1.3 gradients' temporaries of
    the loss (``prob.loss``: its jaxpr is reused, ``loss_fn`` is not traced again), at least
    128 MiB (:mod:`kernels._backend`). A sample is a perturbed-loss evaluation, plus
    (``hessian``) a Hutchinson quadratic form of the Hessian.
    """
    if chunk_size != "auto":
        return chunk_size
    size, dtype = tree_size(params)
    cap = auto_chunk_size(None, "probes", size=size, dtype=dtype)
    if cap is None:  # a CPU, or not two samples within the device's chunk budget
        return None
    zero = jnp.zeros_like(prob.flat)
    program = program_bytes(prob.loss, zero)
    per_sample = sample_bytes("perturbations", params=params, program=program)
    if hessian:
        program = program_bytes(_quadratic_form(prob), zero)
        per_sample += sample_bytes("forms", params=params, program=program)
    budget = memory_budget("sharpness", _gradient_bytes(prob))
    fixed = 2 * tree_bytes(params)  # the raveled parameters and their scales
    return budgeted_chunk_size(None, per_sample=per_sample, budget=budget, cap=cap, fixed=fixed)


def _products_fit(linear: Any, prob: _Problem, params: Any) -> bool:
    """Whether the decomposition's linearised products fit (``mode="auto"``, one at a time).

    Residuals of at most ``_PRODUCT_RESIDUAL_BYTES``, and their estimated memory
    (:func:`kernels._backend.sample_bytes` ``("products", ...)``) within
    ``memory_budget("sharpness", ...)``: 1.3 gradients' temporaries, at least 128 MiB. On a
    4.2M-parameter decoder the products planned 4.5 gradients, quadratic forms 1.26.
    """
    residuals = _residual_bytes(linear)
    if residuals > _PRODUCT_RESIDUAL_BYTES:
        return False
    need = sample_bytes("products", params=params, residuals=residuals)
    return need <= memory_budget("sharpness", _gradient_bytes(prob))


def _gradient_bytes(prob: _Problem) -> int:
    """:func:`kernels._backend.gradient_bytes` of the loss, from the problem's jitted loss.

    ``prob.loss`` was traced once already: its jaxpr is reused, ``loss_fn`` is not traced again.
    """
    return gradient_bytes(prob.loss, jnp.zeros_like(prob.flat))


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {describe(value)}")
    return value


def _sampler(kind: str, scale: Any, prob: _Problem) -> Callable[[jax.Array], jax.Array]:
    r"""``key -> u``: one perturbation vector $u = s \odot \eta$ of the given kind."""
    scales = prob.scales
    dtype, size = scales.dtype, scales.shape[0]
    scale = jnp.asarray(scale, dtype)
    if kind == "gaussian":
        return lambda k: scale * scales * jax.random.normal(k, (size,), dtype)
    if kind == "linf_ball":
        return lambda k: scale * scales * jax.random.uniform(k, (size,), dtype, -1.0, 1.0)
    support = (scales != 0).astype(dtype)
    dim = jnp.asarray(prob.dim, dtype)  # uniform in the l2 ball of the support's dimension

    def l2(k: jax.Array) -> jax.Array:
        k_dir, k_rad = jax.random.split(k)
        z = support * jax.random.normal(k_dir, (size,), dtype)
        radius = scale * jax.random.uniform(k_rad, (), dtype) ** (1 / dim)
        return radius * scales * z / tree_norm(z)

    return l2


def _increase(prob: _Problem, base: jax.Array, u: jax.Array, antithetic: bool) -> jax.Array:
    r"""$\frac12(f(u) + f(-u))$ (one after the other) or $f(u)$; $f = L(\theta+.) - L(\theta)$."""
    if not antithetic:
        return prob.loss(u) - base
    # one evaluation after the other over the sign of u: never two perturbed vectors at once
    values = jax.lax.map(lambda sign: prob.loss(sign * u), jnp.array([1, -1], u.dtype))
    return 0.5 * ((values[0] - base) + (values[1] - base))


def _increase_fn(
    prob: _Problem, base: jax.Array, draw: Callable[[jax.Array], jax.Array], antithetic: bool
) -> Callable[[jax.Array], jax.Array]:
    """``key -> sample`` of :func:`_increase` at a drawn perturbation vector."""
    return lambda k: _increase(prob, base, draw(k), antithetic)


def _pairs_text(num: int, antithetic: bool = True) -> str:
    return f"{num} antithetic pairs" if antithetic else f"{num} perturbed points"


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
      params: pytree $\theta$ of float32 / float64 arrays.
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
        128 MiB; :func:`kernels._backend.memory_budget`). An int is used as given.
        Static.
      antithetic: use pairs $(u, -u)$. Static.

    Returns:
      Estimate(mean, stderr, num_samples=K, num_evaluations=2K with pairs, else None).

    Raises:
      ValueError: for a bad count / chunk size / key / option, integer, half-precision or empty
        params, a mask matching nothing, a non-scalar loss; and (also under ``jit``, where it
        surfaces as a runtime error) non-finite params, a scale that is not a finite value > 0,
        a non-finite loss at params or at any perturbed point.

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
    prob = _setup(loss_fn, params, batch, key, perturbation)
    chunk_size = _auto_chunk(chunk_size, params, prob)
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
        pair = _increase(prob, base, u, antithetic=True)
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
      params: pytree $\theta$ of float32 / float64 arrays.
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key.
      perturbation: a Gaussian :class:`Perturbation` (adaptive / masked allowed).
      num_samples: $K \ge 2$ antithetic pairs ($2K$ loss evaluations). Static.
      num_probes: Hutchinson probes for the trace term (>= 2). Static.
      chunk_size: pairs / probes per vectorised batch; ``None`` runs them one at a time; ``"auto"``:
        ``None`` on a CPU, on a GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._backend.memory_budget`). An int is used as given.
      mode: how each $u^\top H u$ (pairs) and $v^\top SHS v$ (probes) is formed:
        ``"products"`` (a Hessian-vector product from one linearisation of the gradient at
        $\theta$, whose residuals stay in memory), ``"forms"`` (forward over forward mode:
        no linearisation, memory of a forward pass) or ``"auto"`` (default): products one at
        a time while their estimated memory (1.6 times the linearisation's residuals) stays
        within 1.3 gradients' temporaries (at least 128 MiB, at most 1 GiB of residuals),
        else forms (as :func:`kernels.curvature.hutchinson_trace`). ``"products"`` and
        ``"forms"`` are used as given. The two agree to rounding. Static.

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
    prob = _setup(loss_fn, params, batch, key, perturbation)
    chunk_size = _auto_chunk(chunk_size, params, prob, hessian=True)
    base, linear = _linearized(prob, jnp.zeros_like(prob.flat))
    products = mode == "products" or (
        mode == "auto" and chunk_size in (None, 1) and _products_fit(linear, prob, params)
    )
    if products:

        def quad(x: jax.Array) -> jax.Array:
            return jnp.vdot(x, linear(x)[1])
    else:
        quad = _quadratic_form(prob)
    ok = _checked_base(prob, base)
    sigma = jnp.asarray(perturbation.scale, prob.flat.dtype)
    key_pairs, key_probes = jax.random.split(key)

    def probe(k: jax.Array) -> jax.Array:
        return quad(prob.scales * sign_vector(k, prob.scales.shape[0], prob.scales.dtype))

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


def _trace_at(
    prob: _Problem, draw: Callable[[jax.Array], jax.Array], key: jax.Array, num_probes: int
) -> Callable[[jax.Array], tuple[jax.Array, ...]]:
    r"""``index -> (trace estimate, its stderr, non-finite?)`` at $\theta + u_j$."""

    def one(index: jax.Array) -> tuple[jax.Array, ...]:
        k_u, k_probe = jax.random.split(sample_key(key, index))
        value, hvp = _hessian_at(prob, draw(k_u))

        def probe(kp: jax.Array) -> jax.Array:
            v = sign_vector(kp, prob.flat.shape[0], prob.flat.dtype)
            return jnp.vdot(v, hvp(v))

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
      params: pytree $\theta$ of float32 / float64 arrays.
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key; perturbation $j$ uses ``fold_in(key, j)``.
      perturbation: the :class:`Perturbation`.
      num_samples: $J \ge 2$ perturbations. Static.
      num_probes: Hutchinson probes per perturbation (>= 2). Static.
      chunk_size: perturbations per vectorised batch; ``None`` runs them one at a time; ``"auto"``:
        ``None`` on a CPU, on a GPU or TPU the largest power of two up to 16 (within
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)``) whose samples'
        estimated memory stays within 1.3 gradients' temporaries of the loss (at least
        128 MiB; :func:`kernels._backend.memory_budget`). An int is used as given.

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
        loss_fn, params, batch, key, perturbation, num_probes, chunk_size, indices
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
) -> tuple[jax.Array, jax.Array]:
    """Trace estimates and their probe stderrs at the perturbations ``indices`` (uint32)."""
    num_probes = check_num_samples(num_probes, "num_probes", minimum=2)
    chunk_size = _check_chunk(chunk_size)
    prob = _setup(loss_fn, params, batch, key, perturbation)
    chunk_size = _auto_chunk(chunk_size, params, prob, hessian=True)
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
) -> tuple[jax.Array, jax.Array]:
    """Perturbations ``start .. start + count - 1`` of :func:`perturbed_hessian_traces`.

    ``start`` is a traced uint32 scalar (one program per ``count``); perturbation $j$ has the
    keys it has in the one call. Private machinery of :mod:`kernels.blocks`.
    """
    indices = start + jnp.arange(count, dtype=jnp.uint32)
    return _perturbed_samples(
        loss_fn, params, batch, key, perturbation, num_probes, chunk_size, indices
    )


@compile_once
def _perturbed_finish(means: jax.Array, stderrs: jax.Array, num_probes: int) -> PerturbedTraces:
    """:func:`_perturbed_result` as one program (for :mod:`kernels.blocks`)."""
    num_probes = check_num_samples(num_probes, "num_probes", minimum=2)
    _check_count(means.shape[0], "num_samples", minimum=2, why=_KEPT)
    return _perturbed_result(means, stderrs, num_probes)


# --------------------------------------------------------------------------------------------
# worst case


class _Ascent(NamedTuple):
    """APGD's state on pytrees shaped like the parameters.

    The iterate is always the best point so far: a step is accepted exactly when it raises the
    loss above the best value (the current value *is* the best one, by induction from the
    start), and a rejected step returns to the iterate. So the best point, its value and its
    gradient need no copies of their own: three parameter-sized trees in all.
    """

    x: Any  # current iterate eta = the best point so far
    x_prev: Any  # the iterate before it (momentum)
    g: Any  # gradient at x
    f: jax.Array  # loss at x
    alpha: jax.Array  # step size
    num_bad: jax.Array  # non-finite evaluations so far


def _tree_scales(prob: _Problem, params: Any, perturbation: Perturbation) -> list[Any]:
    r"""Per leaf of ``params``: the scale $s$ of $u = s \odot \eta$ on that leaf.

    A Python 1.0 for an unmasked leaf of a plain perturbation, 0.0 for a leaf the mask leaves
    out (so no parameter-sized constant enters the program), else the leaf's mask times
    $|\theta|$ (adaptive) or the mask.
    """
    leaves = jax.tree_util.tree_leaves(params)
    masks = _mask_tree(perturbation.mask, params)
    out = []
    for leaf, mask in zip(leaves, masks, strict=True):
        dtype = jnp.result_type(leaf)
        if not mask.any():
            out.append(0.0)
        elif perturbation.adaptive:
            scale = jnp.abs(leaf)
            out.append(scale if mask.all() else jnp.asarray(mask, dtype) * scale)
        else:
            out.append(1.0 if mask.all() else jnp.asarray(mask, dtype))
    del prob
    return out


def _scaled(scale: Any, eta: jax.Array) -> jax.Array:
    """``scale * eta`` on one leaf (a plain leaf, scale 1.0, is ``eta`` itself)."""
    return eta if isinstance(scale, float) and scale == 1.0 else scale * eta


def _leaves_norm(x: list[jax.Array]) -> jax.Array:
    """2-norm of all entries of the leaves ``x``: one fused pass per leaf.

    A plain sum of squares: the iterates lie within a few radii of 0. (A scaled norm per leaf
    made the ascent's program 3x larger.)
    """
    return jnp.sqrt(sum(jnp.sum(a * a) for a in x))


def _direction(g: list[jax.Array]) -> list[jax.Array]:
    """``g / ||g||_2`` (0 for g = 0), scaled by ``max |g|`` first so that no square overflows."""
    dtype = g[0].dtype
    big = jnp.max(jnp.stack([jnp.max(jnp.abs(a)) for a in g]))
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


def _apgd_start(
    prob: _Problem, scales: list[Any], p: float, radius: jax.Array, k: jax.Array
) -> list[jax.Array]:
    """A random start at half the radius, on the support of the scales (leaves of eta).

    Drawn as one flat vector (the draws of every earlier version) and split into leaves once,
    before the ascent.
    """
    dtype, size = prob.flat.dtype, prob.flat.shape[0]
    if p == 2:
        z = jax.random.normal(k, (size,), dtype)
    else:
        z = jax.random.uniform(k, (size,), dtype, -1.0, 1.0)
    leaves = jax.tree_util.tree_leaves(prob.unravel(z))
    zero = jnp.zeros((), dtype)
    leaves = [
        a if isinstance(s, float) and s == 1.0 else jnp.where(jnp.asarray(s) != 0, a, zero)
        for a, s in zip(leaves, scales, strict=True)
    ]
    if p == 2:
        factor = 0.5 * radius / jnp.maximum(_leaves_norm(leaves), jnp.finfo(dtype).tiny)
    else:
        factor = 0.5 * radius
    return [a * factor for a in leaves]


def _apgd_candidate(state: _Ascent, step: jax.Array, p: float, radius: jax.Array) -> list:
    """APGD's momentum step from the current iterate, projected onto the ball."""
    g = state.g
    direction = _direction(g) if p == 2 else [jnp.sign(a) for a in g]
    z = _tree_project(
        [x + state.alpha * d for x, d in zip(state.x, direction, strict=True)], p, radius
    )
    mom = jnp.where(step == 0, 1.0, _MOMENTUM).astype(g[0].dtype)
    moved = [
        x + mom * (zz - x) + (1 - mom) * (x - xp)
        for x, zz, xp in zip(state.x, z, state.x_prev, strict=True)
    ]
    return _tree_project(moved, p, radius)


def _apgd_update(state: _Ascent, x_new: list, f_new: jax.Array, g_new: list) -> _Ascent:
    """Accept a step that raises the loss; else halve the step and stay (the best point)."""
    ok = f_new > state.f

    def pick(a: list, b: list) -> list:
        return [jnp.where(ok, u, v) for u, v in zip(a, b, strict=True)]

    return _Ascent(
        x=pick(x_new, state.x),
        x_prev=state.x,
        g=pick(g_new, state.g),
        f=jnp.where(ok, f_new, state.f),
        alpha=jnp.where(ok, state.alpha, 0.5 * state.alpha),
        num_bad=state.num_bad,
    )


def _apgd_restart(
    prob: _Problem,
    scales: list[Any],
    p: float,
    radius: jax.Array,
    alpha0: jax.Array,
    num_steps: int,
) -> Callable[[jax.Array], tuple[jax.Array, list, jax.Array]]:
    r"""``key -> (best loss, best eta leaves, non-finite count)`` of one APGD run on the ball.

    Everything parameter-sized is a pytree: $\theta + s \odot \eta$ is formed leaf by leaf and
    the gradient is taken with respect to the leaves of $\eta$.
    """

    def loss(eta: list) -> jax.Array:
        return prob.shifted([_scaled(s, e) for s, e in zip(scales, eta, strict=True)])

    value_grad = jax.value_and_grad(loss)

    def run(k: jax.Array) -> tuple[jax.Array, list, jax.Array]:
        eta0 = _apgd_start(prob, scales, p, radius, k)

        def body(i: jax.Array, state: _Ascent) -> _Ascent:
            # iteration 0 evaluates the start (the state's x), which the update accepts (every
            # value beats the initial -inf); iteration i >= 1 takes APGD step i - 1.
            # value_grad (hence loss_fn) appears once
            cand = _apgd_candidate(state, i - 1, p, radius)
            x_new = [jnp.where(i == 0, x, c) for x, c in zip(state.x, cand, strict=True)]
            f_new, g_new = value_grad(x_new)
            num_bad = state.num_bad + jnp.logical_not(jnp.isfinite(f_new)).astype(jnp.int32)
            return _apgd_update(state._replace(num_bad=num_bad), x_new, f_new, g_new)

        f0 = jax.eval_shape(loss, eta0)
        lowest = jnp.full(f0.shape, -jnp.inf, f0.dtype)
        zero_g = [jnp.zeros_like(a) for a in eta0]
        init = _Ascent(eta0, eta0, zero_g, lowest, alpha0, jnp.zeros((), jnp.int32))
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
) -> WorstCase:
    r"""Worst-case sharpness $\max_{u \in B} L(\theta+u) - L(\theta)$ by projected gradient ascent.

    $u = s \odot \eta$ (see :class:`Perturbation`) and the ascent runs on $\eta$ over the ball
    $\|\eta\|_p \le \rho$, $p \in \{2, \infty\}$, with the exact Euclidean projections of
    :func:`kernels.norms.project_lp_ball`. For the adaptive ball this is the ascent of Kwon et
    al. / Andriushchenko et al. in the rescaled coordinates. APGD-style (Croce & Hein 2020): from
    a random start, steps along $g/\|g\|_2$ ($\ell_2$) or $\operatorname{sign}(g)$
    ($\ell_\infty$) with momentum 0.75; when a step does not increase the loss, the step size is
    halved and the iterate returns to the best point so far, whose value is returned. Each
    restart costs ``num_steps + 1`` value-and-gradient evaluations.

    The result is the loss increase at a feasible point, hence a **lower bound** of the true
    maximum (exact only if the ascent finds the global maximiser, e.g. for a convex quadratic's
    trust-region problem with enough steps).

    Args:
      loss_fn: ``(params, batch) -> scalar`` (differentiable). Static (by identity).
      params: pytree $\theta$ of float32 / float64 arrays.
      batch: data passed to ``loss_fn`` (any pytree).
      key: PRNG key; restart $r$ starts from ``fold_in(key, r)``.
      perturbation: a ball :class:`Perturbation` (``"l2_ball"`` or ``"linf_ball"``).
      num_steps: ascent steps per restart (>= 1). Static.
      step_size: initial step in $\eta$ units, > 0 (may be traced); default $2\rho$ (APGD).
      num_restarts: independent random starts (>= 1), the best is kept. Static.

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
    prob = _setup(loss_fn, params, batch, key, perturbation)
    base, ok = _loss_at_params(prob)
    dtype = prob.flat.dtype
    radius = jnp.asarray(perturbation.scale, dtype)
    alpha0 = 2 * radius if step_size is None else jnp.asarray(step_size, dtype)
    p = 2 if perturbation.kind == "l2_ball" else math.inf
    scales = _tree_scales(prob, params, perturbation)
    restart = _apgd_restart(prob, scales, p, radius, alpha0, num_steps)
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
    treedef = jax.tree_util.tree_structure(params)
    u = [_scaled(s, e) for s, e in zip(scales, eta, strict=True)]
    u = keep_sharding(jax.tree_util.tree_unflatten(treedef, u), params)
    return WorstCase(value=value - base, u=u)


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
      params: pytree $\theta$ of float32 / float64 arrays.
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
        128 MiB; :func:`kernels._backend.memory_budget`). An int is used as given.

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
    prob = _setup(loss_fn, params, batch, key, perturbation)
    chunk_size = _auto_chunk(chunk_size, params, prob)
    dtype = prob.flat.dtype
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
