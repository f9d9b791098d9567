"""The flat problem every curvature estimator works on: an operator on flat vectors."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from kernels._checks import (
    check_positive_int,
    check_that,
    describe,
    runtime_checks,
)
from kernels._devices import input_sharding, keep_sharding
from kernels._hessian import HessianOperator, Matvec
from kernels._memory import linearisation_fits, products_fit
from kernels._operators import (
    _check_floating,
    _LossOperator,
)
from kernels._precision import is_template, work_dtype, work_like
from kernels._random import draw_leaf, leaf_keys, sign_leaves, sign_vector, wordwise
from kernels.parallel import (
    sample_layout,
    splits_user_mesh,
    window_cache_key,
)

# --------------------------------------------------------------------------- flat problem


@dataclasses.dataclass(frozen=True)
class _Flat:
    """An operator on flat vectors of one dtype, linearised once, with its input verdict.

    Beside the flat view, the same operator on the parameters' leaves (``tree_matvec``: a list
    of leaves in the working dtype to such a list), which Lanczos and the probes of a sharded
    model use: nothing parameter-sized is raveled there.
    """

    size: int
    dtype: Any
    matvec: Callable[[jax.Array], jax.Array] | None  # None when only ``form`` is set up
    valid: jax.Array
    name: str  # the argument a non-finite product is blamed on
    form: Callable[[jax.Array], jax.Array] | None = None  # x -> x^T A x (set by _setup_forms)
    # x -> x^T A x on pytrees shaped like ``template`` (forms of a loss operator only)
    tree_form: Callable[[Any], jax.Array] | None = None
    # the pytree the vectors are shaped like (``like``); for a loss operator its ``params``,
    # whose leaves carry the parameters' shardings
    template: Any = None
    # leaves -> leaves: the operator on lists of leaves shaped like ``template``'s, in ``dtype``
    tree_matvec: Callable[[list], list] | None = None
    # (key, kind) -> the probe's leaves, in place of drawing them for ``template`` (raveled)
    draw: Callable[[jax.Array, str], list] | None = None
    # set when ``form`` and ``tree_form`` return ``[x^T A x, loss at params]``, or products
    # come with that loss (``tree_matvec_loss``); ``valid`` is then None: the loss -> the input
    # verdict, with its runtime checks (:meth:`checked`, :meth:`with_loss`)
    verdict: Callable[[jax.Array], jax.Array] | None = None
    # leaves -> (the product's leaves, the loss at params): recomputed Hessian products that
    # carry the loss for ``verdict`` (Lanczos: no forward pass of its own for the checks)
    tree_matvec_loss: Callable[[list], tuple[list, jax.Array]] | None = None

    def checked(self, stats: Any) -> tuple[_Flat, Any]:
        """The input verdict from the samples' loss, and the statistics of the forms alone.

        Samples ``[x^T A x, loss at params]`` (``verdict`` set): the loss is the same in every
        sample, so its mean is that loss exactly. Otherwise both are returned as they are.
        """
        if self.verdict is None:
            return self, stats
        flat = dataclasses.replace(self, valid=self.verdict(stats.mean[1]), verdict=None)
        return flat, dataclasses.replace(stats, mean=stats.mean[0], m2=stats.m2[0])

    def with_loss(self, loss: jax.Array) -> _Flat:
        """The input verdict from the loss a product returned (``tree_matvec_loss``)."""
        if self.verdict is None:
            return self
        return dataclasses.replace(self, valid=self.verdict(loss), verdict=None)

    def for_bases(self) -> _Flat:
        """The vectors a kernel's basis is kept in: leaves on a user's mesh, else one raveled leaf.

        On a mesh the basis (Lanczos, Hutch++) is held leaf by leaf in the parameters' layout;
        off a mesh it is the raveled vectors as one leaf, the same numbers in a program that
        compiles faster (the leaves' measured 1.3-1.7x the compile time on the tiny decoder).
        """
        if sample_layout() is not None:
            return self
        raveled_loss = None
        if self.tree_matvec_loss is not None:
            shapes = [tuple(np.shape(a)) for a in jax.tree_util.tree_leaves(self.template)]

            def raveled_loss(x: list) -> tuple[list, jax.Array]:
                out, loss = self.tree_matvec_loss(_split(x[0], shapes))
                return [jnp.concatenate([jnp.ravel(a) for a in out])], loss

        return dataclasses.replace(
            self,
            template=jax.ShapeDtypeStruct((self.size,), self.dtype),
            tree_matvec=lambda x: [self.matvec(x[0])],
            draw=lambda key, kind: [self.probe(key, kind)],
            tree_matvec_loss=raveled_loss,
        )

    def leafwise(self, key: jax.Array, kind: str) -> bool:
        """Whether probes are drawn leaf by leaf and evaluated on the pytree (:meth:`leaf_probe`).

        On a user's mesh a flat probe would be split into the parameters' leaves, which
        gathers sharded leaves; the leaves of the same probe are drawn where they live instead
        (:meth:`probe_leaves`: the same values as the flat probe).
        """
        del key, kind  # every key and kind is drawn leaf by leaf (probe_leaves)
        return self.tree_form is not None and sample_layout() is not None

    def leaf_probe(self, key: jax.Array, kind: str = "rademacher") -> Any:
        """The probe of ``key`` as a pytree: ``unravel(probe(key))``, leaf by leaf.

        Each leaf in its own working dtype (float32 for a half-precision leaf; a Rademacher
        sign is exact in any of them, a Gaussian draw is made in the flat working dtype and
        cast).
        """
        leaves, treedef = jax.tree_util.tree_flatten(self.template)
        drawn = self.probe_leaves(key, kind)
        out = [
            a.astype(work_dtype(jnp.result_type(leaf)))
            for a, leaf in zip(drawn, leaves, strict=True)
        ]
        return keep_sharding(jax.tree_util.tree_unflatten(treedef, out), self.template)

    def probe_leaves(self, key: jax.Array, kind: str = "rademacher") -> list[jax.Array]:
        """The probe of ``key`` as a list of leaves shaped like ``template``'s, in ``dtype``.

        Rademacher with a threefry key: the flat :func:`sign_vector` of ``key``; on a user's
        mesh the vector's words are drawn once and each leaf's block unpacked where the leaf
        lives (:func:`sign_leaves`), off a mesh the flat vector is drawn and split. Any other
        key ("rbg"), and Gaussian probes: leaf ``i`` is drawn from ``fold_in(key, i)`` (signs
        unpacked from that key's words, or standard normals), on a mesh or not.
        """
        if self.draw is not None:
            return self.draw(key, kind)
        out = self._draw_leaves(key, kind)
        shardings = leaf_shardings(self.template)
        out = [place(a, sh) for a, sh in zip(out, shardings, strict=True)]
        anchors = self.anchors()
        if anchors is None:
            return out
        return [a + z for a, z in zip(out, anchors, strict=True)]

    def anchors(self) -> list[jax.Array] | None:
        """Per leaf, zeros computed from the parameter leaf (on a mesh; else None).

        ``0 * nan_to_num(leaf)``: exact zeros that JAX's partitioner places like the leaf
        (XLA does not fold ``0 * x`` for floats), so vectors and bases built on them are split
        like the parameters where their shardings are not visible while tracing (your ``jit`` on
        Auto mesh axes); a constant zero would leave them to be replicated.
        """
        leaves = jax.tree_util.tree_leaves(self.template)
        if self.draw is not None or sample_layout() is None or not all(map(_is_array, leaves)):
            return None
        zero = jnp.zeros((), self.dtype)
        return [
            zero
            * jnp.nan_to_num(jnp.asarray(leaf).astype(self.dtype), nan=0.0, posinf=0.0, neginf=0.0)
            for leaf in leaves
        ]

    def _draw_leaves(self, key: jax.Array, kind: str) -> list[jax.Array]:
        shapes = [tuple(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(self.template)]
        dtype = self.dtype
        if kind == "rademacher" and wordwise(key):
            if sample_layout() is not None and _blocks_fit(shapes):
                return sign_leaves(key, shapes, dtype)
            return _split(sign_vector(key, self.size, dtype), shapes)
        keys = leaf_keys(key, len(shapes))
        return [draw_leaf(k, shape, dtype, kind) for k, shape in zip(keys, shapes, strict=True)]

    def probe(self, key: jax.Array, kind: str = "rademacher") -> jax.Array:
        """The flat probe of ``key``: the leaves of :meth:`probe_leaves`, raveled in order."""
        if kind == "rademacher" and wordwise(key):
            return sign_vector(key, self.size, self.dtype)
        return jnp.concatenate([jnp.ravel(a) for a in self.probe_leaves(key, kind)])

    def check_products(self, num_bad: jax.Array, total: int, unit: str) -> None:
        """Runtime check: no non-finite product (reported only when the inputs were finite)."""
        check_that(
            jnp.logical_or(num_bad == 0, jnp.logical_not(self.valid)),
            f"{self.name}: non-finite products at {{}} of the {total} {unit}",
            num_bad,
        )


def _is_array(leaf: Any) -> bool:
    """Whether ``leaf`` holds values (an array or tracer), not a shape-and-dtype template."""
    return not isinstance(leaf, jax.ShapeDtypeStruct)


def _blocks_fit(shapes: list[tuple[int, ...]]) -> bool:
    """Whether every leaf's block of signs can be unpacked alone (:func:`sign_leaves`' limits)."""
    return sum(map(math.prod, shapes)) <= 2**37 and all(
        math.prod(shape) < 2**32 - 31 for shape in shapes
    )


def _split(flat: jax.Array, shapes: list[tuple[int, ...]]) -> list[jax.Array]:
    """A flat vector cut into consecutive leaves of ``shapes`` (row-major)."""
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return out


# --------------------------------------------------------------------------- vectors as leaves


def explicit_sharding(a: Any) -> Any:
    """The sharding in ``a``'s type when its mesh has Explicit axes (sharding in types), else None.

    Contractions over such axes name their output's sharding, and arrays are moved with
    ``jax.sharding.reshard``, not constrained.
    """
    if not _is_array(a):
        return None
    try:
        sharding = jax.typeof(a).sharding
    except (TypeError, AttributeError):  # pragma: no cover - not an array
        return None
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None
    return sharding if AxisType.Explicit in tuple(mesh.axis_types) else None


def contract(a: jax.Array, b: jax.Array, axes: int, like: Any = None) -> jax.Array:
    """``jnp.tensordot(a, b, axes)``, its output on Explicit axes laid out as ``like`` (or P())."""
    if explicit_sharding(a) is None and explicit_sharding(b) is None:
        return jnp.tensordot(a, b, axes=axes)
    layout = None if like is None else explicit_sharding(like)
    out = P() if layout is None else layout.spec
    return jnp.tensordot(a, b, axes=axes, out_sharding=out)


def place(x: jax.Array, sharding: Any) -> jax.Array:
    """``x`` laid out by ``sharding`` (a ``NamedSharding`` or None: left to the partitioner).

    Inside a share of the samples (manual mesh axes) ``x`` is left to the partitioner too, as
    :func:`leaf_shardings` leaves the leaves there: a sharding found outside the share (a
    problem's, set up before its samples) does not apply inside it.
    """
    context = jax.sharding.get_abstract_mesh()
    if sharding is None or (not context.empty and context.manual_axes):
        return x
    if AxisType.Explicit in tuple(sharding.mesh.axis_types):
        return jax.sharding.reshard(x, sharding.spec)
    return jax.lax.with_sharding_constraint(x, sharding)


def tree_dot(x: list[jax.Array], y: list[jax.Array]) -> jax.Array:
    """``sum_l <x_l, y_l>``: one contraction over all axes per leaf (no leaf is raveled)."""
    return sum(contract(a, b, a.ndim) for a, b in zip(x, y, strict=True))


def tree_norm2(x: list[jax.Array]) -> jax.Array:
    """The 2-norm of the vector whose pieces are the leaves ``x``."""
    return jnp.sqrt(sum(jnp.sum(a * a) for a in x))


def leaf_shardings(template: Any) -> list[Any]:
    """Per leaf of ``template``: its ``NamedSharding`` where known while tracing, else None.

    Known for placed arrays and the arguments of an eager kernel call
    (:func:`kernels._devices.input_sharding`); inside a user's ``jit`` JAX's partitioner
    places what derives from the parameters. None throughout inside a share of the samples
    (manual axes), where the partitioner places the leaves.
    """
    leaves = jax.tree_util.tree_leaves(template)
    context = jax.sharding.get_abstract_mesh()
    if not context.empty and context.manual_axes:
        return [None] * len(leaves)
    return [input_sharding(leaf) or explicit_sharding(leaf) for leaf in leaves]


def stacked_sharding(sharding: Any) -> Any:
    """The sharding of a stack of leaves (a leading axis) laid out as ``sharding`` below it."""
    if sharding is None:
        return None
    return NamedSharding(sharding.mesh, P(None, *sharding.spec))


def _template(like: Any) -> Any:
    """Turn ``like`` (pytree or int n) into a pytree template, in working dtypes.

    Half-precision leaves become float32 shape-and-dtype structs: probes and sums are float32.
    """
    if isinstance(like, int | np.integer) and not isinstance(like, bool):
        check_positive_int(like, "like")
        return jnp.zeros((int(like),), dtype=jnp.result_type(float))
    if is_template(like):  # already turned into a template
        return like
    _check_floating(like, "like")
    return work_like(like)


def _check_like(matvec: _LossOperator, like: Any) -> None:
    """Static: ``like`` has the pytree structure and shapes of the operator's ``params``."""

    def shapes(tree: Any) -> tuple[Any, list[tuple[int, ...]]]:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, [jnp.shape(leaf) for leaf in leaves]

    if shapes(like) != shapes(matvec.params):
        raise ValueError("like: expected the pytree structure and shapes of the operator's params")


def _linear(
    matvec: Any, like: Any, linearize: bool | str = True, loss: bool = False
) -> tuple[Matvec, jax.Array | None, str, Callable | None]:
    """Linearise a loss operator once (checking ``like`` against it); pass a callable through.

    With ``linearize`` false a loss operator's products are recomputed each time instead;
    ``"auto"``: linearised while its residuals are small (:func:`linearisation_fits`).
    ``loss``: recomputed Hessian products also give the loss at the parameters (the last item,
    ``v -> (Av, loss)``; ``valid`` is then None), else that item is None.
    """
    if isinstance(matvec, _LossOperator):
        _check_like(matvec, like)
        if linearize == "auto":
            linearize = _linearisation_fits(matvec, like)
        if not linearize and loss and isinstance(matvec, HessianOperator):
            both = matvec.recomputed_with_loss()
            return (lambda v: both(v)[0]), None, "loss_fn", both
        product, valid = matvec.linearize() if linearize else matvec.recomputed()
        return product, valid, "loss_fn", None
    if not callable(matvec):
        raise ValueError(f"matvec: expected a callable v -> A v, got {type(matvec).__name__}")
    return matvec, jnp.asarray(True), "matvec", None


def _linearisation_fits(op: _LossOperator, like: Any) -> bool:
    """:func:`kernels._memory.linearisation_fits` of ``op``'s linearisation, traced apart.

    The linearisation is traced under ``jax.eval_shape`` with the runtime checks off, so that
    nothing of it enters the kernel's program when the products are recomputed: its runtime
    check of the loss at the parameters, traced into the program, kept its forward pass there
    (compiled, and run once), beside the recomputed products' own check.
    """
    fits: list[bool] = []

    def trace() -> tuple:
        with runtime_checks(False):
            product, _ = op.linearize()
        fits.append(linearisation_fits(product, like))
        return ()

    jax.eval_shape(trace)
    return fits[0]


def _forward_mode_ok(form: Callable[[Any], jax.Array], params: Any) -> bool:
    """Whether a loss operator's ``form`` (jitted) traces at ``params``.

    It does when the loss has second forward-mode derivatives; a ``jax.custom_vjp`` inside the
    loss has none, and the kernels then use Hessian-vector products.
    """
    try:
        jax.eval_shape(form, params)
    except (TypeError, NotImplementedError):  # what JAX raises for a custom_vjp under jvp
        return False
    return True


def _setup_forms(matvec: Any, like: Any, mode: str = "auto", chunk: int = 1) -> _Flat:
    """The flat problem of a quadratic-form estimator (Hutchinson).

    ``form``: ``x -> x^T A x``, either by forward over forward mode (a loss operator whose
    loss has forward-mode derivatives: no linearisation, no Hessian-vector product) or as
    ``x . (A x)`` from the products of :func:`_setup` (the operator linearised once). Which
    one: ``mode`` (``"auto"``: :func:`kernels._memory.products_fit`).
    """
    # on a user's mesh, quadratic forms on the parameters' leaves (products would flatten
    # them: gathers), and any products are recomputed inside the shard_maps of the samples
    inside = not splits_user_mesh()
    placed = sample_layout() is not None
    if not isinstance(matvec, _LossOperator) or mode == "products":
        return _with_product_forms(_setup(matvec, like, linearize=inside))
    # fresh closures: a trace JAX caches across calls must not hold a call's checks (_checks._CALL)
    form = jax.jit(lambda v: matvec.form(v))
    valid = None
    if mode == "auto" and isinstance(matvec, HessianOperator) and chunk == 1 and not placed:
        like = _template(like)
        _check_like(matvec, like)
        product, valid = matvec.linearize()
        loss = matvec.scalar_loss()
        if products_fit("hutchinson", product, like, matvec.params, loss, matvec.form):
            return _with_product_forms(_setup(matvec, like, (product, valid, "loss_fn")))
        valid = None  # quadratic forms: the loss comes with them
    if not _forward_mode_ok(form, matvec.params):  # e.g. a custom_vjp in the loss
        return _with_product_forms(_setup(matvec, like, linearize=inside))
    like = _template(like)
    _check_like(matvec, like)
    size, dtype, unravel = _flat_space(like)
    if valid is None and isinstance(matvec, HessianOperator) and window_cache_key() is None:
        # each sample gives the loss at params beside its form: no forward pass for the checks
        # (not in a block of the stream, kernels.blocks, whose samples stay the forms alone)
        with_loss = jax.jit(lambda v: matvec.form_and_loss(v))

        def flat_form(x: jax.Array) -> jax.Array:
            return tree_form(unravel(x))

        def tree_form(tree: Any) -> jax.Array:
            return jnp.stack([a.astype(dtype) for a in with_loss(tree)])

        return _Flat(size, dtype, None, None, "loss_fn", flat_form, tree_form, matvec.params,
                     verdict=matvec.check_loss)  # fmt: skip
    valid = matvec.check_inputs() if valid is None else valid

    def flat_form(x: jax.Array) -> jax.Array:
        return form(unravel(x)).astype(dtype)

    def tree_form(tree: Any) -> jax.Array:
        return form(tree).astype(dtype)

    return _Flat(size, dtype, None, valid, "loss_fn", flat_form, tree_form, matvec.params)


def _with_product_forms(flat: _Flat) -> _Flat:
    tree_mv = flat.tree_matvec

    def tree_form(tree: Any) -> jax.Array:
        x = [jnp.asarray(a).astype(flat.dtype) for a in jax.tree_util.tree_leaves(tree)]
        return tree_dot(x, tree_mv(x))

    return dataclasses.replace(
        flat, form=lambda x: jnp.vdot(x, flat.matvec(x)), tree_form=tree_form
    )


def _flat_space(like: Any) -> tuple[int, Any, Callable[[jax.Array], Any]]:
    """Size, dtype and unravel function of the flat vectors of the pytree template ``like``.

    From unplaced zeros of the leaves' shapes: a placed template's ravel would be a reshape
    across its sharded axes (refused on Explicit mesh axes).
    """
    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(np.shape(a), jnp.result_type(a)), like)
    flat, unravel = ravel_pytree(zeros)
    return flat.size, flat.dtype, unravel


def _setup(
    matvec: Any,
    like: Any,
    linear: tuple | None = None,
    linearize: bool | str = True,
    loss: bool = False,
) -> _Flat:
    """The flat problem of ``matvec``: linearised once unless ``linearize`` is false.

    ``"auto"``: a loss operator is linearised while its residuals are small
    (:func:`kernels._memory.linearisation_fits`).

    ``linear``: the operator already linearised, ``(product, valid, name)``.

    ``loss``: recomputed Hessian products also give the loss at the parameters
    (``tree_matvec_loss``, ``verdict``; ``valid`` None until :meth:`_Flat.with_loss`), for a
    kernel that keeps it from its first product instead of a forward pass of its own.
    """
    like = _template(like)
    if linear is None:
        product, valid, name, both = _linear(matvec, like, _check_linearize(linearize), loss)
    else:
        (product, valid, name), both = linear, None
    size, dtype, unravel = _flat_space(like)
    like_leaves, treedef = jax.tree_util.tree_flatten(like)
    shapes = [tuple(np.shape(leaf)) for leaf in like_leaves]
    dtypes = [jnp.result_type(leaf) for leaf in like_leaves]

    def check_out(out_size: int, out_dtype: Any) -> None:
        if out_size != size:
            raise ValueError(
                f"like: has {size} elements but {name} returns {out_size}: pass a template of "
                "the operator's input and output shape"
            )
        if not jnp.issubdtype(out_dtype, jnp.floating):
            raise ValueError(f"{name}: must return floating values, got {out_dtype}")

    def flat_mv(x: jax.Array) -> jax.Array:
        out = ravel_pytree(product(unravel(x)))[0]
        check_out(out.size, out.dtype)
        return out.astype(dtype)

    def tree_in(x: list[jax.Array]) -> Any:
        return jax.tree_util.tree_unflatten(
            treedef, [a.astype(d) for a, d in zip(x, dtypes, strict=True)]
        )

    def tree_out(tree: Any) -> list[jax.Array]:
        out = jax.tree_util.tree_leaves(tree)
        if [tuple(np.shape(a)) for a in out] != shapes:  # another layout of the same numbers
            flat = ravel_pytree(out)[0]
            check_out(flat.size, flat.dtype)
            return _split(flat.astype(dtype), shapes)
        for a in out:
            check_out(size, jnp.result_type(a))
        return [jnp.asarray(a).astype(dtype) for a in out]

    def tree_mv(x: list[jax.Array]) -> list[jax.Array]:
        return tree_out(product(tree_in(x)))

    def tree_mv_loss(x: list[jax.Array]) -> tuple[list[jax.Array], jax.Array]:
        out, value = both(tree_in(x))
        return tree_out(out), value

    template = matvec.params if isinstance(matvec, _LossOperator) else like
    return _Flat(size, dtype, flat_mv, valid, name, template=template, tree_matvec=tree_mv,
                 verdict=None if both is None else matvec.check_loss,
                 tree_matvec_loss=None if both is None else tree_mv_loss)  # fmt: skip


def _check_linearize(linearize: Any) -> bool | str:
    if isinstance(linearize, str) and linearize == "auto":
        return "auto"
    if not isinstance(linearize, (bool, np.bool_)):
        raise ValueError(f"linearize: expected True, False or 'auto', got {describe(linearize)}")
    return bool(linearize)


def _num_bad_rows(*arrays: jax.Array) -> jax.Array:
    """Number of leading-axis rows with a non-finite element in any of ``arrays``."""
    finite = [jnp.all(jnp.isfinite(a), axis=tuple(range(1, a.ndim))) for a in arrays]
    return jnp.sum(jnp.logical_not(jnp.all(jnp.stack(finite), axis=0))).astype(jnp.int32)


# kernels that keep one output per probe (SLQ's nodes, Hutch++'s sketch) index their probes
# with uint32 and count them in int32: at most this many (their outputs would need 2**31 rows)
_MAX_KEPT = 2**31 - 1


def check_bounded_count(
    value: Any, name: str, *, minimum: int = 1, maximum: int, shown: str, why: str
) -> int:
    """An int in ``[minimum, maximum]``; else a ValueError naming ``name``, the bound and why.

    The one check of a count with an upper bound (``shown``: how the message writes it).
    """
    num = check_positive_int(value, name, minimum)
    if num > maximum:
        raise ValueError(f"{name}: at most {shown} ({why}), got {num}")
    return num


def _check_kept_count(value: Any, name: str) -> int:
    """An int in ``[1, 2**31 - 1]``: a count of probes whose outputs are all kept."""
    why = "every probe's output is kept in memory, one row each"
    return check_bounded_count(value, name, maximum=_MAX_KEPT, shown="2**31 - 1", why=why)


def _indices(num: int) -> jax.Array:
    """Probe indices ``0 .. num - 1`` (``num`` checked by :func:`_check_kept_count`)."""
    return jnp.arange(num, dtype=jnp.uint32)
