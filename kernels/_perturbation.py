"""Perturbations of the parameters: the spec, the problem on the leaves, samplers, increases."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    all_finite,
    check_array_leaves,
    check_chunk_size,
    check_key,
    check_positive,
    check_that,
    describe,
    finite_message,
    is_concrete,
)
from kernels._flat import check_bounded_count, leaf_shardings, place
from kernels._memory import perturbation_chunk, products_fit
from kernels._precision import (
    check_compute_dtype,
    check_difference_dtype,
    in_compute,
    work_dtype,
    work_like,
    work_params,
)
from kernels._random import draw_leaf, leaf_keys

_KINDS = ("gaussian", "l2_ball", "linf_ball")
_INT32_MAX = 2**31 - 1
_LOOP = "a loop count (int32)"
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
# shared set-up


@dataclasses.dataclass(frozen=True)
class _Problem:
    """The perturbed loss on the parameters' leaves: nothing of every parameter is raveled.

    Every parameter-sized vector (a perturbation, a gradient, a probe) is a list of leaves
    shaped like the parameters' leaves, in the working dtype, drawn, scaled and applied leaf by
    leaf (each in its leaf's layout on a mesh).
    """

    leaves: list  # theta's leaves in the working dtype
    treedef: Any
    dtype: Any  # the working dtype of every leaf
    # displacement leaves [d_1, ...] -> L(theta + d), traced once (a jitted closure): every use
    # (L(theta), perturbed points, derivatives) reuses the jaxpr of one trace of loss_fn
    shifted: Callable[[list], jax.Array]
    # (make, operands, flag) -> L(theta + make(operands)), for a loop that holds ``operands``
    # anyway (the ascent's carried trees): with half-precision weights the point is formed in a
    # branch (:func:`_in_branch`), so no copy of the weights is held for the loop
    shifted_held: Callable[[Callable[[Any], list], Any, jax.Array], jax.Array]
    # per leaf, the scale s of u = s * eta: a Python 1.0 (an unmasked leaf of a plain
    # perturbation), 0.0 (a leaf the mask leaves out: nothing is drawn for it), else an array
    # (the leaf's mask, times |theta| when adaptive)
    scales: list
    dim: Any  # number of perturbed coordinates (support of s)
    ok: jax.Array  # params finite and scale valid: later checks report only their own failure
    shardings: list  # per leaf: its sharding where known while tracing, else None

    def zeros(self) -> list:
        """The zero displacement, leaf by leaf (no sharding of its own: valid in a share)."""
        return [jnp.zeros(jnp.shape(w), self.dtype) for w in self.leaves]

    def tree(self, leaves: list) -> Any:
        """Leaves shaped like the parameters' as the parameters' pytree."""
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _work_leaves(params: Any) -> tuple[list, Any, Any]:
    """Static checks of the parameters' dtypes and sizes; their working leaves, treedef, dtype.

    Half-precision leaves are worked on in float32 (:mod:`kernels._precision`): each is cast
    inside the program, and the perturbations and every sum are float32; the leaves' working
    dtypes must agree (bfloat16 with float32 does, float32 with float64 does not).
    """
    check_array_leaves(params, "params")
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError("params: expected at least one parameter array, got an empty pytree")
    dtypes = {np.dtype(jnp.result_type(leaf)) for leaf in leaves}
    for dtype in dtypes:
        if work_dtype(dtype) not in _FLOATS or not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"params: expected float16, bfloat16, float32 or float64 leaves, got {dtype}"
            )
    work = {work_dtype(d) for d in dtypes}
    if len(work) > 1:
        names = sorted(map(str, dtypes))
        raise ValueError(f"params: expected one float dtype for all leaves, got {names}")
    if sum(math.prod(jnp.shape(leaf)) for leaf in leaves) == 0:
        raise ValueError("params: expected at least one parameter entry, got only empty arrays")
    work_leaves, treedef = jax.tree_util.tree_flatten(work_params(params))
    work_leaves = [jnp.asarray(w) for w in work_leaves]
    return work_leaves, treedef, work.pop()


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
    """The 0/1 mask (static) as one bool array per leaf of ``params`` (in leaf order).

    Each is a read-only broadcast of what the mask gave (a scalar ``True`` is one bool seen at
    every entry): nothing of the parameters' size is allocated on the host
    (:func:`_mask_compact`).
    """
    if mask is None:
        tree = jax.tree_util.tree_map(lambda p: np.broadcast_to(np.True_, jnp.shape(p)), params)
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


def _mask_compact(mask: np.ndarray) -> np.ndarray:
    """The entries of a broadcast mask leaf that it repeats: its axes of stride 0 cut to 1."""
    if mask.size == 0:
        return mask
    return mask[tuple(slice(0, 1) if st == 0 else slice(None) for st in mask.strides)]


def _mask_flags(mask: np.ndarray) -> tuple[bool, bool, int]:
    """``(any, all, count of True)`` of a mask leaf, read from :func:`_mask_compact`."""
    if mask.size == 0:
        return False, True, 0
    compact = _mask_compact(mask)
    count = int(compact.sum()) * (mask.size // compact.size)
    return count > 0, count == mask.size, count


def _mask_values(mask: np.ndarray, dtype: Any) -> jax.Array:
    """A mask leaf as 0/1 values of ``dtype`` in the program: a constant of its compact form."""
    return jnp.broadcast_to(jnp.asarray(_mask_compact(mask), dtype), mask.shape)


def _setup(
    loss_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    key: Any,
    perturbation: Any,
    compute_dtype: Any = None,
    difference: str | None = None,
) -> _Problem:
    """Static checks, the runtime checks on params and scale, and the problem on the leaves.

    The problem works in the parameters' working dtype (float32 for half precision) and
    evaluates ``loss_fn`` with each leaf cast to its compute dtype (``compute_dtype``,
    :mod:`kernels._precision`). ``difference``: the kernel's name when it evaluates loss
    differences, which refuse a half-precision compute dtype.
    """
    if not isinstance(perturbation, Perturbation):
        raise ValueError(
            f"perturbation: expected a Perturbation, got {type(perturbation).__name__}"
        )
    if not callable(loss_fn):
        raise ValueError(f"loss_fn: expected a callable (params, batch) -> scalar, got {loss_fn!r}")
    check_key(key)
    compute_dtype = check_compute_dtype(compute_dtype)
    leaves, treedef, dtype = _work_leaves(params)
    if difference is not None:
        check_difference_dtype(params, compute_dtype, difference)
    scale = perturbation.scale
    if not _is_number(scale) or jnp.shape(scale) != ():
        raise ValueError(f"{perturbation.scale_name}: expected a scalar > 0, got {describe(scale)}")
    masks = _mask_tree(perturbation.mask, params)
    flags = [_mask_flags(m) for m in masks]
    if not any(f[0] for f in flags):
        raise ValueError("perturbation.mask: matches no parameter")
    # the parameters' finiteness leaf by leaf, once, for its check and for the gate
    finite = all_finite(params, "params")
    if finite is not None:
        check_that(finite, finite_message("params"))
    check_positive(scale, perturbation.scale_name)
    ok = _valid_scale(scale) if finite is None else jnp.logical_and(finite, _valid_scale(scale))
    scales, dim, ok = _scales(perturbation.adaptive, masks, flags, leaves, ok)
    # theta + d leaf by leaf in the working dtype, then each leaf cast to its compute dtype;
    # from the parameters as given, each cast where the point is formed (:func:`_tied`,
    # :func:`_in_branch`). One trace of loss_fn (``evaluate``) serves both evaluations
    in_dtype = in_compute(loss_fn, params, compute_dtype)
    evaluate = jax.jit(lambda point: in_dtype(point, batch))
    given = [jnp.asarray(w) for w in jax.tree_util.tree_leaves(params)]

    def point(d: list, tie: bool = True) -> Any:
        weights = _tied(given, d) if tie else given
        return jax.tree_util.tree_unflatten(
            treedef, [w.astype(dtype) + x for w, x in zip(weights, d, strict=True)]
        )

    shifted = jax.jit(lambda d: evaluate(point(d)))
    cast = any(jnp.result_type(w) != dtype for w in given)

    def shifted_held(make: Callable[[Any], list], operands: Any, flag: jax.Array) -> jax.Array:
        def form(ops: Any, tie: bool = True) -> Any:
            return point(make(ops), tie)

        return evaluate(_in_branch(form, operands, flag) if cast else form(operands))

    zeros = [jax.ShapeDtypeStruct(jnp.shape(w), dtype) for w in leaves]
    _check_loss_value(jax.eval_shape(shifted, zeros))
    shardings = leaf_shardings(params)
    return _Problem(leaves, treedef, dtype, shifted, shifted_held, scales, dim, ok, shardings)


def _in_branch(form: Callable[..., Any], operands: Any, flag: jax.Array) -> Any:
    """``form(operands)`` (a displaced point) computed inside both branches of a ``lax.cond``.

    The branches are the same, so ``flag`` (any traced boolean: the ascent passes whether its
    step size is finite) changes nothing but keeps the cond in the program. XLA hoists out of a
    loop what the loop's body computes from values fixed for the loop, never what a branch
    computes: each half-precision weight is then cast where the point is formed, with neither a
    float32 copy of the weights nor the 16-bit view of :func:`_tied` held for the loop. A
    branch's operands are held in memory, so ``operands`` should be what the loop holds anyway
    (the ascent passes its carried trees, and the candidate is formed inside the branch); a
    loop that draws its displacement where it is used (a noise sample) keeps :func:`_tied`,
    which lets the draw fuse into the point. Measured (``bench/llm_plan.py``, compiled for
    CPUs): worst-case sharpness at 8B on 8 devices 21.66 -> 19.79 GiB per device, and at 1B on
    one device 20.77 -> 18.47 GiB; a branch given the candidate itself held it beside the point
    (22.06 GiB on one device).
    """

    def branch(ops: Any) -> Any:
        return form(ops, tie=False)

    return jax.lax.cond(flag, branch, branch, operands)


def _tied(given: list, d: list) -> list:
    """The parameters' leaves ``given``, tied to the displacement ``d`` where they are cast.

    In a loop (an ascent, a loop over samples) the cast of a half-precision leaf to the working
    dtype is the same in every iteration, and XLA hoists it out of the loop: a float32 copy of
    the whole model is then held for the loop's length, beside each displaced point. An
    optimisation barrier does not stop it (XLA removes barriers before it hoists), nor does a
    zero added in half precision (a CPU adds bfloat16 in float32, after a cast it hoists). So
    each half-precision leaf's bits are or-ed with whether the entry of ``d`` is NaN: the cast
    then depends on the iteration and is fused where ``theta + d`` is formed. The values do not
    change: where the flag is 1, ``theta + d`` is NaN whatever the weight's last bit. (XLA still
    holds the leaves reinterpreted as 16-bit integers, half a float32 copy.) Leaves in the
    working dtype (no cast) are returned as they are.
    """
    return [
        jax.lax.bitcast_convert_type(
            jax.lax.bitcast_convert_type(w, jnp.uint16) | jnp.isnan(x).astype(jnp.uint16),
            w.dtype,
        )
        if w.dtype != x.dtype and w.dtype.itemsize == 2
        else w
        for w, x in zip(given, d, strict=True)
    ]


def _scales(
    adaptive: bool, masks: list, flags: list, leaves: list, ok: jax.Array
) -> tuple[list, Any, jax.Array]:
    r"""The per-leaf scales, the perturbed dimension, and the gate ``ok`` updated.

    Scales are the mask (times $|\theta|$ when ``adaptive``): a Python 1.0 for an unmasked
    leaf of a plain perturbation and 0.0 for a leaf the mask leaves out (no parameter-sized
    constant enters the program), else an array of the leaf's shape. An adaptive perturbation
    with every masked $\theta$ zero is refused at run time.
    """
    scales: list = []
    for leaf, mask, (some, every, _) in zip(leaves, masks, flags, strict=True):
        dtype = jnp.result_type(leaf)
        if not some:
            scales.append(0.0)
        elif adaptive:
            scale = jnp.abs(leaf)
            scales.append(scale if every else _mask_values(mask, dtype) * scale)
        else:
            scales.append(1.0 if every else _mask_values(mask, dtype))
    if not adaptive:
        return scales, sum(f[2] for f in flags), ok
    dim = sum(_support_size(s) for s in scales if not isinstance(s, float))
    check_that(
        jnp.logical_or(jnp.logical_not(ok), dim > 0),
        "perturbation: adaptive scales |θ| are zero on every masked parameter",
    )
    return scales, dim, jnp.logical_and(ok, dim > 0)


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
    base = prob.shifted(prob.zeros())
    return base, _checked_base(prob, base)


def _hessian_at(prob: _Problem, shift: list) -> tuple[jax.Array, Callable[[list], list]]:
    """L at theta + ``shift`` and ``v -> H v`` there (leaves), from one linearisation."""
    value, linear = _linearized(prob, shift)
    return value, lambda v: linear(v)[1]


def _linearized(prob: _Problem, shift: list) -> tuple[jax.Array, Any]:
    """L at theta + ``shift`` and the linearised value-and-gradient there (a Partial)."""
    (value, _), linear = jax.linearize(jax.value_and_grad(prob.shifted), shift)
    return value, linear


def _quadratic_form(prob: _Problem) -> Callable[[list], jax.Array]:
    r"""``x -> x^T H(theta) x`` (leaves): the second derivative of $t \mapsto L(\theta + t x)$.

    Forward over forward mode (two nested ``jax.jvp``): no backward pass, no linearisation.
    """

    def form(x: list) -> jax.Array:
        def slope(d: list) -> jax.Array:
            return jax.jvp(prob.shifted, (d,), (x,))[1]

        return jax.jvp(slope, (prob.zeros(),), (x,))[1]

    return form


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
    return check_bounded_count(
        value, name, minimum=minimum, maximum=_INT32_MAX - 2, shown="2**31 - 3", why=why
    )


def _check_chunk(chunk_size: Any) -> Any:
    """``chunk_size``: ``None``, an int >= 1, or ``"auto"`` (resolved by :func:`_sample_chunk`)."""
    return check_chunk_size(chunk_size, auto="auto")


def _sample_chunk(
    chunk_size: Any, params: Any, prob: _Problem, *, hessian: bool = False
) -> int | None:
    """``chunk_size`` (checked by :func:`_check_chunk`) with ``"auto"`` resolved.

    :func:`kernels._memory.perturbation_chunk` of the problem's jitted loss (``prob.shifted``:
    its jaxpr is reused, ``loss_fn`` is not traced again); a sample is a perturbed-loss
    evaluation, plus (``hessian``) a Hutchinson quadratic form of the Hessian.
    """
    form = _quadratic_form(prob) if hessian else None
    return perturbation_chunk(chunk_size, work_like(params), prob.shifted, prob.zeros(), form)


def _products_fit(prob: _Problem, linear: Any) -> bool:
    """Whether the decomposition's linearised products fit (``mode="auto"``, one at a time).

    :func:`kernels._memory.products_fit` of ``linear`` (the linearised value and gradient at
    the unperturbed point) under the sharpness budget (1.3 gradients, at least 128 MiB). On a
    4.2M-parameter decoder the products planned 4.5 gradients, quadratic forms 1.26.
    """
    zero = prob.zeros()
    return products_fit("sharpness", linear, zero, zero, prob.shifted)


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {describe(value)}")
    return value


def _scaled(scale: Any, eta: jax.Array) -> jax.Array:
    """``scale * eta`` on one leaf (a plain leaf, scale 1.0, is ``eta`` itself)."""
    return eta if isinstance(scale, float) and scale == 1.0 else scale * eta


def draw_leaves(
    prob: _Problem, key: jax.Array, kind: str, *, support: bool = True
) -> list[jax.Array]:
    """Standard draws of ``kind`` leaf by leaf (:func:`kernels._random.draw_leaf`).

    Leaf ``i`` from ``fold_in(key, i)`` (a large layer-stacked leaf slice by slice,
    :data:`kernels._random.SLICED_DRAW_ENTRIES`), in its leaf's layout. A leaf the mask leaves out
    (scale 0.0) is zeros, nothing drawn; with ``support``, entries whose scale is 0 are zero.
    """
    out = []
    keys = leaf_keys(key, len(prob.leaves))
    for i, (w, s, k) in enumerate(zip(prob.leaves, prob.scales, keys, strict=True)):
        if isinstance(s, float) and s == 0.0:
            out.append(jnp.zeros(jnp.shape(w), prob.dtype))
            continue
        z = place(draw_leaf(k, jnp.shape(w), prob.dtype, kind), prob.shardings[i])
        if support and not isinstance(s, float):
            z = jnp.where(s != 0, z, jnp.zeros((), prob.dtype))
        out.append(z)
    return out


def scaled_norm(x: list[jax.Array]) -> jax.Array:
    """2-norm of all entries of the leaves ``x``: one fused pass per leaf."""
    return jnp.sqrt(sum(jnp.sum(a * a) for a in x))


def _sampler(kind: str, scale: Any, prob: _Problem) -> Callable[[jax.Array], list]:
    r"""``key -> u``: one perturbation $u = s \odot \eta$ of the given kind, leaf by leaf.

    $\eta$'s leaf ``i`` is drawn from ``fold_in(key, i)`` (Gaussian, uniform on
    $[-1, 1)$ for the $\ell_\infty$ ball); for the $\ell_2$ ball the direction is drawn so
    from ``split(key)[0]`` on the scales' support and the radius
    $\rho\,U^{1/\dim}$ from ``split(key)[1]``.
    """
    dtype = prob.dtype
    scale = jnp.asarray(scale, dtype)
    if kind in ("gaussian", "linf_ball"):
        name = "gaussian" if kind == "gaussian" else "uniform"

        def box(k: jax.Array) -> list:
            eta = draw_leaves(prob, k, name, support=False)
            return [_scaled(s, scale * z) for s, z in zip(prob.scales, eta, strict=True)]

        return box
    dim = jnp.asarray(prob.dim, dtype)  # uniform in the l2 ball of the support's dimension

    def l2(k: jax.Array) -> list:
        k_dir, k_rad = jax.random.split(k)
        z = draw_leaves(prob, k_dir, "gaussian")
        radius = scale * jax.random.uniform(k_rad, (), dtype) ** (1 / dim)
        factor = radius / scaled_norm(z)
        return [_scaled(s, factor * a) for s, a in zip(prob.scales, z, strict=True)]

    return l2


def _increase(
    prob: _Problem, base: jax.Array, u: Callable[[], list], antithetic: bool
) -> jax.Array:
    r"""$\frac12(f(u) + f(-u))$ (one after the other) or $f(u)$; $f = L(\theta+.) - L(\theta)$.

    ``u``: a function giving the perturbation's leaves, called where they are used (inside the
    pair's loop for a drawn perturbation: the draw fuses with $\theta + u$, and no
    perturbation is held across the two evaluations).
    """
    if not antithetic:
        return prob.shifted(u()) - base
    # one evaluation after the other over the sign of u: never two perturbed points at once,
    # one trace of the loss in the loop's body; the sign flip is exact
    values = jax.lax.map(
        lambda sign: prob.shifted([sign * x for x in u()]), jnp.array([1, -1], prob.dtype)
    )
    return 0.5 * ((values[0] - base) + (values[1] - base))


def _increase_fn(
    prob: _Problem, base: jax.Array, draw: Callable[[jax.Array], list], antithetic: bool
) -> Callable[[jax.Array], jax.Array]:
    """``key -> sample`` of :func:`_increase` at a drawn perturbation."""
    return lambda k: _increase(prob, base, lambda: draw(k), antithetic)


def _pairs_text(num: int, antithetic: bool = True) -> str:
    return f"{num} antithetic pairs" if antithetic else f"{num} perturbed points"
