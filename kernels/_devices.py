"""Which devices the kernels spread their Monte Carlo samples over: all, or a scoped subset.

By default the kernels shard over ``jax.devices()``, which after ``jax.distributed.initialize``
spans every process: a kernel call is then a collective program that every process must run.
Work that one process does alone (a unit of ``jaxbounds reproduce``, whose units are shared out
over the processes) runs its kernels inside ``with kernels.using_devices(jax.local_devices()):``
instead. The choice is read when a program is traced, and it is part of the compilation cache
key of the kernels' entry points (like the runtime-checks switch).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding

__all__ = [
    "SampleLayout",
    "devices_cache_key",
    "resolve_layout",
    "sample_devices",
    "sample_layout",
    "using_devices",
    "using_mesh",
]

_SCOPE: contextvars.ContextVar[tuple[jax.Device, ...] | None] = contextvars.ContextVar(
    "kernels_sample_devices", default=None
)


def sample_devices() -> list[jax.Device]:
    """The devices kernels traced now shard over: the innermost :func:`using_devices`, else all.

    >>> sample_devices() == jax.devices()
    True
    """
    scoped = _SCOPE.get()
    return list(jax.devices()) if scoped is None else list(scoped)


def devices_cache_key() -> tuple[int, ...] | None:
    """The scoped devices' ids (None when unscoped): part of the kernels' compilation cache key."""
    scoped = _SCOPE.get()
    return None if scoped is None else tuple(d.id for d in scoped)


@contextlib.contextmanager
def using_devices(devices: Sequence[jax.Device]) -> Iterator[None]:
    """Context manager: kernels traced inside the block shard over ``devices`` only.

    Args:
      devices: a non-empty sequence of distinct ``jax.Device`` s, e.g. ``jax.local_devices()``
        for work that this process does alone in a multi-process program.

    Raises:
      ValueError: if ``devices`` is empty, holds something that is not a device, or repeats one.

    >>> import jax, kernels
    >>> with kernels.using_devices(jax.local_devices()[:1]):
    ...     len(sample_devices())
    1
    """
    if isinstance(devices, jax.Device) or not isinstance(devices, Sequence):
        raise ValueError(f"devices: expected a sequence of jax devices, got {devices!r}")
    chosen = tuple(devices)
    if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
        raise ValueError(f"devices: expected a non-empty sequence of jax devices, got {devices!r}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices: a device is listed twice in {list(chosen)}")
    token = _SCOPE.set(chosen)
    try:
        yield
    finally:
        _SCOPE.reset(token)


# ---------------------------------------------------------------------------------------------
# Sharded models: the user's mesh and the axes the Monte Carlo samples run over

# arguments of a kernel that hold data or keys, not parameters: their shardings do not claim
# mesh axes (a batch sharded on "data" leaves "data" free for the samples)
DATA_ARGUMENTS = frozenset({"batch", "batches", "inputs", "key", "start", "weights"})


@dataclasses.dataclass(frozen=True)
class SampleLayout:
    """Where a kernel traced now runs its Monte Carlo samples.

    Attributes:
      mesh: the mesh of the kernel's sharded inputs (a ``Mesh`` or, inside a user's ``jit``,
        its ``AbstractMesh``); None: the inputs carry no mesh, and the samples run over a
        one-axis mesh of :func:`sample_devices`.
      axes: the mesh axes the samples are split over (manual axes of a ``shard_map``; the
        other axes stay with JAX's partitioner); empty: the samples run one share at a time on
        the whole mesh.
    """

    mesh: Any
    axes: tuple[str, ...]

    @property
    def num_shares(self) -> int:
        """How many devices' shares the samples are split into (1 with no sample axes)."""
        return int(np.prod([dict(self.mesh.shape)[a] for a in self.axes], dtype=np.int64))


_MESH_SCOPE: contextvars.ContextVar[tuple[Any, tuple[str, ...] | None] | None] = (
    contextvars.ContextVar("kernels_mesh_scope", default=None)
)
_LAYOUT: contextvars.ContextVar[SampleLayout | None] = contextvars.ContextVar(
    "kernels_sample_layout", default=None
)


def _axis_names(samples: Any) -> tuple[str, ...]:
    if isinstance(samples, str):
        return (samples,)
    if not isinstance(samples, Sequence) or not all(isinstance(a, str) for a in samples):
        raise ValueError(
            f"samples: expected a mesh axis name or a sequence of them, got {samples!r}"
        )
    names = tuple(samples)
    if len(set(names)) != len(names):
        raise ValueError(f"samples: an axis is named twice in {list(names)}")
    return names


@contextlib.contextmanager
def using_mesh(mesh: Mesh, *, samples: str | Sequence[str] | None = None) -> Iterator[None]:
    """Context manager: kernels traced inside the block run their samples over ``samples``.

    The one way to name the mesh axes that the Monte Carlo samples of a kernel are split over
    when its parameters live on ``mesh``. Without it, a kernel reads the mesh from its inputs'
    shardings and splits its samples over the axes (of size > 1) that no parameter leaf is
    sharded on; inside a user's ``jit`` JAX shows a kernel the specs of ``Explicit`` mesh
    axes only, so a kernel traced there treats every ``Auto`` axis as holding parameters
    (samples sequential) unless this scope names the axes. The parameters' own axes are left
    to JAX's partitioner (GSPMD) in either case.

    Args:
      mesh: the ``jax.sharding.Mesh`` the parameters (and batch) are placed on.
      samples: an axis name or a sequence of them, axes of ``mesh`` that no parameter leaf is
        sharded on (a batch may be: it is then gathered over them); ``()`` runs the samples
        sequentially on the whole mesh; None (default): the axes that the parameters leave
        free, as without the scope.

    Raises:
      ValueError: if ``mesh`` is not a Mesh, or ``samples`` names an axis twice or an axis that
        ``mesh`` lacks (a kernel traced in the scope raises a ValueError naming ``samples`` if
        its parameters are sharded on a named axis).

    >>> import jax, kernels
    >>> from jax.sharding import Mesh
    >>> mesh = Mesh(jax.devices()[:1], ("data",))
    >>> with kernels.using_mesh(mesh, samples="data"):
    ...     pass
    >>> with kernels.using_mesh(mesh, samples="batch"):  # doctest: +ELLIPSIS
    ...     pass
    Traceback (most recent call last):
    ...
    ValueError: samples: the mesh has no axis 'batch' (its axes: ('data',))
    """
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh: expected a jax.sharding.Mesh, got {mesh!r}")
    names = None if samples is None else _axis_names(samples)
    for name in names or ():
        if name not in mesh.axis_names:
            raise ValueError(
                f"samples: the mesh has no axis {name!r} (its axes: {tuple(mesh.axis_names)})"
            )
    token = _MESH_SCOPE.set((mesh, names))
    try:
        yield
    finally:
        _MESH_SCOPE.reset(token)


def _spec_axes(spec: Any) -> set[str]:
    used: set[str] = set()
    for entry in spec:
        if entry is None:
            continue
        used.update((entry,) if isinstance(entry, str) else tuple(entry))
    return used


def _leaf_mesh(leaf: Any) -> tuple[Any, set[str], set[str]] | None:
    """(mesh, axes the leaf is sharded on, axes it may be sharded on) of a placed leaf, or None.

    Inside a user's ``jit`` JAX shows the spec of Explicit axes only: the Auto axes may hold
    the leaf (they are not used for samples by default, and may be named in ``using_mesh``).
    """
    if isinstance(leaf, jax.core.Tracer):
        try:
            sharding = jax.typeof(leaf).sharding
        except Exception:  # pragma: no cover - a tracer without a sharded type
            return None
        mesh = getattr(sharding, "mesh", None)
        if mesh is None or mesh.empty or not isinstance(sharding, NamedSharding):
            return None
        # JAX shows a traced function the specs of Explicit axes only: an Auto axis may hold it
        explicit = {
            name
            for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
            if kind == AxisType.Explicit
        }
        used = _spec_axes(sharding.spec) & explicit
        maybe = set(mesh.axis_names) - explicit - set(mesh.manual_axes)
        return mesh, used - set(mesh.manual_axes), maybe
    sharding = getattr(leaf, "sharding", None)
    placed = isinstance(leaf, jax.Array) and isinstance(sharding, NamedSharding)
    if placed and sharding.mesh.size > 1:
        return sharding.mesh, _spec_axes(sharding.spec), set()
    return None


def _same_mesh(a: Any, b: Any) -> bool:
    return tuple(a.axis_names) == tuple(b.axis_names) and tuple(a.axis_sizes) == tuple(b.axis_sizes)


def resolve_layout(params: Sequence[Any], data: Sequence[Any]) -> SampleLayout | None:
    """The :class:`SampleLayout` of a kernel called on these leaves (None: no mesh in sight).

    ``params`` are the array leaves of the kernel's parameter arguments (their shardings claim
    mesh axes), ``data`` those of its data arguments (they only say which mesh). Called by the
    kernels' jit wrapper when a kernel is called (not inside another kernel's trace, whose
    layout the inner kernel keeps).

    Raises:
      ValueError: if the inputs lie on meshes of different axes, or the :func:`using_mesh`
        scope names a sample axis that a parameter leaf is sharded on or a mesh whose axes
        differ from the inputs'.
    """
    mesh = None
    used: set[str] = set()
    maybe: set[str] = set()
    for leaves, claims in ((params, True), (data, False)):
        for leaf in leaves:
            found = _leaf_mesh(leaf)
            if found is None:
                continue
            leaf_mesh, leaf_axes, leaf_maybe = found
            if mesh is None or (isinstance(mesh, AbstractMesh) and isinstance(leaf_mesh, Mesh)):
                if mesh is not None and not _same_mesh(mesh, leaf_mesh):
                    raise ValueError(_mixed(mesh, leaf_mesh))
                mesh = leaf_mesh
            elif not _same_mesh(mesh, leaf_mesh):
                raise ValueError(_mixed(mesh, leaf_mesh))
            if claims:
                used |= leaf_axes
                maybe |= leaf_maybe
    context = jax.sharding.get_abstract_mesh()
    manual = set(context.manual_axes) if not context.empty else set()
    scope = _MESH_SCOPE.get()
    if scope is not None:
        scope_mesh, named = scope
        if mesh is not None and not _same_mesh(mesh, scope_mesh):
            raise ValueError(
                f"mesh: the inputs lie on a mesh of axes {dict(mesh.shape)}, the using_mesh "
                f"scope's mesh has axes {dict(scope_mesh.shape)}"
            )
        if named is not None:
            for name in named:
                if name in used:
                    raise ValueError(
                        f"samples: axis {name!r} holds parameters (a parameter leaf is sharded "
                        f"on it); name axes that the parameters do not use"
                    )
            return SampleLayout(scope_mesh, tuple(a for a in named if a not in manual))
        mesh = scope_mesh
    if mesh is None and not context.empty:
        mesh = context  # jax.set_mesh(...): the user's mesh, no spec known
        maybe |= set(context.axis_names) - set(context.explicit_axes)
    if mesh is None:
        return None
    free = tuple(
        name
        for name, size in dict(mesh.shape).items()
        if size > 1 and name not in used | maybe | manual
    )
    return SampleLayout(mesh, free)


def _mixed(a: Any, b: Any) -> str:
    return (
        f"params: the inputs lie on meshes of different axes ({dict(a.shape)} and "
        f"{dict(b.shape)}); place every leaf on one mesh"
    )


def sample_layout() -> SampleLayout | None:
    """The layout of the kernel being traced (set by its jit wrapper), else None."""
    return _LAYOUT.get()


@contextlib.contextmanager
def tracing_layout(layout: SampleLayout | None) -> Iterator[None]:
    """Scope the layout a kernel's samples use while it is traced."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def layout_cache_key() -> Any:
    """The :func:`using_mesh` scope, part of the kernels' compilation cache key."""
    scope = _MESH_SCOPE.get()
    return None if scope is None else (scope[0], scope[1])


_INPUT_SHARDINGS: contextvars.ContextVar[dict[int, Any] | None] = contextvars.ContextVar(
    "kernels_input_shardings", default=None
)


@contextlib.contextmanager
def tracing_inputs(tracers: Sequence[Any], shardings: Sequence[Any]) -> Iterator[None]:
    """Scope the concrete shardings of an eager kernel call's traced array arguments."""
    known = {id(t): s for t, s in zip(tracers, shardings, strict=True) if s is not None}
    token = _INPUT_SHARDINGS.set(known or None)
    try:
        yield
    finally:
        _INPUT_SHARDINGS.reset(token)


def input_sharding(leaf: Any) -> Any:
    """The ``NamedSharding`` of a placed leaf, else None.

    Known for a concrete array and for an argument of the eager kernel call being traced.
    """
    if not isinstance(leaf, jax.core.Tracer):
        sharding = getattr(leaf, "sharding", None)
        return sharding if isinstance(sharding, NamedSharding) else None
    known = _INPUT_SHARDINGS.get()
    if known is not None and id(leaf) in known:
        return known[id(leaf)]
    return None


def keep_sharding(tree: Any, like: Any) -> Any:
    """``tree`` (shaped like ``like``) constrained to the shardings of ``like``'s leaves.

    A parameter-shaped output of a kernel (a perturbation, a projection) keeps the sharding of
    the parameters it was computed from when that sharding is known while tracing (an eager
    call on placed arrays); otherwise ``tree`` is returned unchanged and JAX's partitioner
    chooses. Leaves whose shapes differ are left alone.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    like_leaves = jax.tree_util.tree_leaves(like)
    context = jax.sharding.get_abstract_mesh()
    if len(like_leaves) != len(leaves) or (not context.empty and context.manual_axes):
        return tree  # inside a share of the samples (manual axes) the partitioner places it
    out = []
    for leaf, ref in zip(leaves, like_leaves, strict=True):
        sharding = input_sharding(ref)
        if sharding is not None and jnp_shape(leaf) == jnp_shape(ref):
            leaf = jax.lax.with_sharding_constraint(leaf, sharding)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def jnp_shape(leaf: Any) -> tuple[int, ...]:
    return tuple(np.shape(leaf))
