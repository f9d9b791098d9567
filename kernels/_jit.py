"""Compile once per (callable, static options, shapes): the public entry points' jit boundary.

:func:`compile_once` wraps a kernel the way equinox's ``filter_jit`` wraps lineax's
``linear_solve``: every array leaf of the arguments (parameters, data batches, keys, traced
scalars) is a dynamic argument of one ``jax.jit`` program, everything else (callables, Python
ints and floats, strings, pytree structure) is static and part of the compilation cache key.
A second call with the same callable, the same static options and arrays of the same shapes and
dtypes therefore compiles nothing. Callables are keyed by identity: pass data through the
kernel's ``batch`` argument (``loss_fn(params, batch)``) instead of closing over it in a new
``lambda`` per call. Python floats are static, so a new ``sigma=0.02`` compiles again; pass
``jnp.asarray(sigma)`` to vary it without recompiling. A parameter annotated as an int (a count,
a size, a ``chunk_size``) is static whatever type the caller passes: a concrete NumPy or JAX
integer scalar (``np.int64(16)``, ``jnp.int32(16)``, a 0-d integer array) becomes the int 16, any
other concrete array reaches the kernel's own check unchanged (so its error describes it), and a
traced value stays traced (the kernel refuses it: a count fixes the program's shapes). Likewise an
exponent (a parameter named ``p``, ``q``, ``norm`` or ``readout_norm``, or an entry of a pair
``norm=(q, p)``) is static: a NumPy real scalar (``np.float64(2)``, ``np.int64(2)``) becomes its
Python float, and a concrete array reaches the kernel's check unchanged; a ``like`` given as a
NumPy or JAX integer scalar becomes the int n.

Inside a user's ``jax.jit`` / ``vmap`` / ``grad`` the wrapped kernel is an inner ``jit`` call,
which JAX inlines into the outer program.

Runtime checks (:mod:`kernels._checks`): called eagerly, the checks traced at the top level of
the kernel (and of the kernels it calls) are outputs of its program, and the wrapper raises the
first failed check's ``ValueError`` after the program ran (no host callback, so the same on every
backend). Inside a user's ``jit`` every check raises in place through a host callback (where
callbacks cannot raise, the collected checks turn the kernel's floating outputs into NaN). A
check inside a loop of the kernel records its failure through a callback, under the eager
call's number (an int32 argument of the program), and the call raises it after the program
ran; a kernel traced inside another one raises from inside the program instead.

Sharded inputs: the wrapper reads the mesh of the arguments' ``NamedSharding`` s and the axes
their parameter leaves use (:func:`kernels._devices.resolve_layout`; leaves of ``batch``,
``inputs`` and keys only name the mesh), and traces the kernel with that layout, which places
its Monte Carlo samples (:mod:`kernels.parallel`). The layout and an eager call's input
shardings are part of the compilation cache key.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from kernels import _checks, _devices, parallel

__all__ = ["compile_once"]

F = TypeVar("F", bound=Callable[..., Any])


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array | np.ndarray | np.generic)


class _Static:
    """A hashable wrapper of a static leaf: by value when hashable, else by identity."""

    __slots__ = ("hash", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        try:
            self.hash = hash((type(value), value))
        except TypeError:
            self.hash = id(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Static) or type(self.value) is not type(other.value):
            return False
        if self.value is other.value:
            return True
        try:
            return bool(self.value == other.value)
        except Exception:
            return False


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _run(
    fn: Callable[..., Any],
    treedef: Any,
    mask: tuple,
    static: tuple,
    checks: tuple,
    collect: bool,
    dynamic: list,
    call: Any,
):
    # cache key: the checks, device scope, sample window and layout are read while tracing; the
    # last entry holds the shardings of an eager call's placed arrays (parameter-shaped outputs
    # keep them). ``call``: the eager call's number, under which checks inside loops record
    # their failures (None inside a user's jit: they raise)
    shardings = checks[-1] or (None,) * len(dynamic)
    with _devices.tracing_inputs(dynamic, shardings), _checks.tracing_call(call):
        return _call(fn, treedef, mask, static, collect, dynamic)


def _call(fn, treedef, mask, static, collect, dynamic):
    dyn = iter(dynamic)
    stat = iter(static)
    leaves = [next(dyn) if is_dyn else _unwrap(next(stat).value) for is_dyn in mask]
    args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    if not collect:  # inside a user's jit: every check raises in place (callbacks)
        return fn(*args, **kwargs), _checks.Failures((), None, ())
    with _checks.collecting() as collector:
        out = fn(*args, **kwargs)
    return out, collector.failures()


_EARLIER_FAILURE = (
    "kernels: raised by jax.effects_barrier() while an eager kernel call waited for the host "
    "callbacks of its own checks. Those record their failures and do not raise, so this is the "
    "failure of an earlier program whose result was never read (on a GPU a failed check inside "
    "jax.jit is known only after its dispatch; read a jitted result, e.g. with "
    "jax.block_until_ready, to see its error where it happens)."
)


def _wait_for_callbacks() -> jax.errors.JaxRuntimeError | None:
    """Wait until the host callbacks of the program just run have run; return a stale error.

    ``jax.effects_barrier()`` waits for every program's side effects, this program's included.
    The callbacks of an eager call's checks record a failure instead of raising
    (:func:`kernels._checks.recording`), so an error the barrier raises belongs to an earlier
    program: on a GPU a failed check inside a user's ``jit`` whose result was never read stays
    in JAX's runtime token until a barrier. It is returned (with a note saying so) for the
    caller to raise after this call's own failures, never as one of them.
    """
    try:
        jax.effects_barrier()
    except jax.errors.JaxRuntimeError as err:
        err.add_note(_EARLIER_FAILURE)
        return err
    return None


def _placed(leaves: list[Any]) -> tuple | None:
    """The NamedShardings of concrete placed array leaves (None where there is none)."""
    if not _concrete(leaves):
        return None
    shardings = tuple(_devices.input_sharding(leaf) for leaf in leaves)
    return shardings if any(s is not None for s in shardings) else None


# exponents, static by name whatever their annotation (kernels.norms, the Rademacher classes)
_EXPONENTS = frozenset({"p", "q", "norm", "readout_norm"})

Converter = Callable[[Any], Any]


def _static_parameters(fn: Callable[..., Any]) -> tuple[dict[int, Converter], dict[str, Converter]]:
    """How the parameters made static are converted, by position and by name.

    Those annotated as an int (``int``, ``int | None``, ``int | Literal[...]``):
    :func:`_static_int`; the exponents (:data:`_EXPONENTS`): :func:`_static_exponent`; the
    template ``like``: :func:`_static_like`.
    """
    positions: dict[int, Converter] = {}
    names: dict[str, Converter] = {}
    for index, param in enumerate(inspect.signature(fn).parameters.values()):
        convert = _converter(param)
        if convert is None:
            continue
        names[param.name] = convert
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positions[index] = convert
    return positions, names


def _converter(param: inspect.Parameter) -> Converter | None:
    if param.name in _EXPONENTS:
        return _static_exponent
    if param.name == "like":
        return _static_like
    annotation = param.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    parts = {part.strip() for part in str(text).split("|")}
    other = ("int", "None", "str")
    if "int" in parts and all(p in other or p.startswith("Literal[") for p in parts):
        return _static_int
    return None


def _static_int(value: Any) -> Any:
    """A concrete NumPy / JAX value of an int parameter, made static (an int where it is one).

    A count or size fixes the program's shapes: ``np.int64(16)`` or ``jnp.int32(16)`` is the
    int 16, and any other concrete array is handed to the kernel's own check as it is (static),
    so its message shows what the caller passed. A traced value stays traced.
    """
    if isinstance(value, jax.core.Tracer) or not _is_dynamic(value):
        return value
    num = _checks.concrete_int(value)
    return _Opaque(value) if num is None else num


def _static_exponent(value: Any) -> Any:
    """An exponent (or each entry of a pair ``(q, p)``) made static: a NumPy real scalar's float.

    Any other concrete array is handed to the kernel's check as it is (static), so its message
    shows what the caller passed; a traced value stays traced (the check refuses it).
    """

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.core.Tracer) or not _is_dynamic(x):
            return x
        num = _checks.real_number(x)
        return _Opaque(x) if num is None else num

    return jax.tree_util.tree_map(leaf, value)


def _static_like(value: Any) -> Any:
    """``like`` given as a concrete NumPy / JAX integer scalar: the int n (else unchanged)."""
    if isinstance(value, jax.core.Tracer) or not _is_dynamic(value):
        return value
    num = _checks.concrete_int(value)
    return value if num is None else num


class _Opaque:
    """A static leaf that is not an int: the kernel's check refuses it (compared by identity)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, _Opaque) else value


def _concrete(leaves: list[Any]) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _layout(signature: inspect.Signature | None, args: tuple, kwargs: dict) -> Any:
    """The sample layout of a kernel called with these arguments (see ``_devices``).

    A kernel called inside another kernel's trace keeps the caller's layout; otherwise the
    layout is read from the shardings of the arguments' array leaves, those of the data
    arguments (``batch``, ``inputs``, keys) naming the mesh without claiming its axes.
    """
    outer = _devices.sample_layout()
    if outer is not None and _checks.under_trace():
        return outer
    params: list[Any] = []
    data: list[Any] = []
    try:
        bound = signature.bind(*args, **kwargs) if signature is not None else None
    except TypeError:
        bound = None
    if bound is None:
        params = jax.tree_util.tree_leaves((args, kwargs))
    else:
        for name, value in bound.arguments.items():
            _split(name, value, params, data)
    return _devices.resolve_layout(params, data)


def _split(name: str, value: Any, params: list[Any], data: list[Any]) -> None:
    """Add ``value``'s array leaves to ``params`` or ``data`` by argument (or field) name.

    An operator argument (a dataclass such as ``curvature.hvp(...)``) is split by its fields:
    its ``batch`` is data, its ``params`` parameters.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _split(field.name, getattr(value, field.name), params, data)
        return
    leaves = jax.tree_util.tree_leaves(value)
    (data if name in _devices.DATA_ARGUMENTS else params).extend(leaves)


def _call_kernel(fn: Callable, layout: Any, args: tuple, kwargs: dict) -> Any:
    """One call of a :func:`compile_once` kernel: its cached program, then its checks."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    mask = tuple(_is_dynamic(leaf) for leaf in leaves)
    dynamic = [leaf for leaf, is_dyn in zip(leaves, mask, strict=True) if is_dyn]
    static = tuple(_Static(leaf) for leaf, is_dyn in zip(leaves, mask, strict=True) if not is_dyn)
    enabled = _checks.runtime_checks_enabled()
    checks = (
        enabled,
        enabled and _checks.host_callbacks_raise(),
        _devices.devices_cache_key(),
        parallel.window_cache_key(),
        layout,
        _placed(dynamic) if layout is not None else None,
    )
    if not _concrete(dynamic) or _checks.under_trace():
        # inside a trace (also with concrete arguments the traced function closes over):
        # a kernel called by an eager kernel hands its checks to the caller's outputs;
        # where callbacks cannot raise, the checks poison the kernel's outputs instead
        collect = _checks.collector_accepts() or (enabled and not checks[1])
        # no call number: a kernel traced inside another one raises its loop checks' failures
        # in place (the eager caller turns them into its ValueError). Handing it the caller's
        # traced number would let a user's jitted function that calls a kernel close over that
        # tracer, and JAX's cache of its trace would then leak it into the next eager call.
        out, failures = _run(fn, treedef, mask, static, checks, collect, dynamic, None)
        return _checks.report(failures, out)
    stale = None
    call = _checks.new_call()
    with _checks.recording(call) as recorded:
        try:
            out, failures = _run(fn, treedef, mask, static, checks, True, dynamic, call)
            if failures.in_place:  # checks inside loops record from the program: wait
                out = jax.block_until_ready(out)
                stale = _wait_for_callbacks()
        except jax.errors.JaxRuntimeError as err:
            message = _checks.failed_check_message(err)
            if message is None:
                raise
            raise ValueError(message) from None
    # the checks collected as outputs (waits only if there are any), then the recorded ones
    failures.raise_first(recorded)
    if stale is not None:  # an earlier program's failure, raised by the barrier
        raise stale
    return out


def compile_once(fn: F) -> F:
    """Wrap a kernel so it is compiled once per (callables, static options, shapes and dtypes).

    Array leaves of the arguments are traced, all other leaves are static. Eager calls whose
    runtime checks fail raise the ``ValueError`` of the first failed check, in the order the
    kernel traced them (see :mod:`kernels._checks`).
    """
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - a callable without a signature
        signature = None

    positions, names = _static_parameters(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if positions and any(i < len(args) for i in positions):
            args = tuple(positions[i](a) if i in positions else a for i, a in enumerate(args))
        for name in names.keys() & kwargs.keys():
            kwargs[name] = names[name](kwargs[name])
        if parallel.window_cache_key() is not None:
            # inside a block of a sample stream (kernels.blocks): inline, so that the block's
            # sums recorded by sample_statistics stay values of the block's own program
            return fn(*args, **kwargs)
        layout = _layout(signature, args, kwargs)
        with _devices.tracing_layout(layout):
            return call(layout, *args, **kwargs)

    def call(layout: Any, *args: Any, **kwargs: Any) -> Any:
        return _call_kernel(fn, layout, args, kwargs)

    return wrapper  # type: ignore[return-value]
