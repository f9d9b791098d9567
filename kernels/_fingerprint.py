"""The fingerprint of a Monte Carlo problem: what a checkpoint of its sample stream belongs to.

:func:`fingerprint` hashes a kernel's name, its options (all but those that do not change the
result), its arrays by content, every word of its key, and each callable argument: its module
and qualified name, bytecode, constants (nested code included), default arguments, the cells it
closes over and the globals its code reads (arrays by content, functions two levels deep,
modules and classes by name), and a bound method's instance. States of :mod:`kernels.blocks`
with different fingerprints never merge, and a checkpoint of one problem never resumes another.
The hash is the same in every process (no memory addresses or object ids enter it).
"""

from __future__ import annotations

import hashlib
import re
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["fingerprint"]

# options that do not change the result (up to reassociation): not part of the fingerprint
_FREE_OPTIONS = ("chunk_size",)
_DIGEST_BYTES = 1 << 26  # arrays up to 64 MiB are hashed whole, larger ones by a strided sample


def _callable_id(fn: Callable) -> str:
    """A name of a callable that is the same in every process (module and qualified name)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None:
        return f"partial({_callable_id(inner)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _digest_array(leaf: Any, h: Any) -> None:
    if jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key):
        h.update(str(jax.random.key_impl(leaf)).encode())
        leaf = jax.random.key_data(leaf)
    arr = np.asarray(leaf)
    h.update(f"{arr.shape}{arr.dtype}".encode())
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.nbytes > _DIGEST_BYTES:
        step = -(-flat.nbytes // _DIGEST_BYTES)
        h.update(np.ascontiguousarray(flat[::step]).tobytes())
        h.update(np.float64(np.sum(flat, dtype=np.float64)).tobytes())
    else:
        h.update(flat.tobytes())


def _stable_repr(value: Any) -> str:
    """``repr`` without memory addresses (the same in every process)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _digest_leaves(tree: Any, h: Any, depth: int = 0) -> None:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h.update(_stable_repr(treedef).encode())
    for leaf in leaves:
        if isinstance(leaf, jax.Array | np.ndarray | np.generic):
            _digest_array(leaf, h)
        elif isinstance(leaf, types.ModuleType):
            h.update(f"module {leaf.__name__}".encode())
        elif isinstance(leaf, type):
            h.update(f"class {_callable_id(leaf)}".encode())
        elif callable(leaf):
            _digest_callable(leaf, h, depth)
        elif depth == 0 or isinstance(leaf, _PLAIN):
            h.update(_stable_repr(leaf).encode())
        else:  # an object reached through a callable: its type (its repr may name its id)
            h.update(f"object {_callable_id(type(leaf))}".encode())


_PLAIN = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


def _digest_code(code: types.CodeType, h: Any) -> None:
    """A code object's bytecode, constants (nested code included) and the names it reads."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(const, h)
        else:
            h.update(f"{type(const).__name__}:{_stable_repr(const)}".encode())


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object (and the code nested in it) may read from its globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _digest_callable(leaf: Callable, h: Any, depth: int) -> None:
    """A callable's identity: name, code, constants, defaults, closure and the globals it reads.

    Arrays it reaches are hashed by content and functions it reads are followed two levels
    deep, so a loss edited from ``* 1.0`` to ``* 3.0``, or reading a global array whose data
    changed, is another problem. Modules and classes count by name.
    """
    h.update(_callable_id(leaf).encode())
    fn = getattr(leaf, "func", leaf)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # a bound method: its function (the instance below)
    code = getattr(fn, "__code__", None)
    if code is not None:
        _digest_code(code, h)
    if depth >= 2:
        return
    captured = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    namespace = getattr(fn, "__globals__", None) or {}
    reads = {} if code is None else {
        name: namespace[name] for name in sorted(_global_names(code)) if name in namespace
    }  # fmt: skip
    defaults = (getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None))
    partial = (getattr(leaf, "args", ()), getattr(leaf, "keywords", {})) if fn is not leaf else None
    owner = getattr(leaf, "__self__", None)
    state = None
    if owner is not None and not isinstance(owner, types.ModuleType) and hasattr(owner, "__dict__"):
        state = dict(vars(owner))
    _digest_leaves((captured, reads, defaults, partial, state), h, depth + 1)


def fingerprint(name: str, args: tuple, kwargs: dict) -> str:
    """SHA-256 of the kernel's name, options, callables, arrays (with their contents) and key.

    A callable is hashed by its module, qualified name, bytecode, constants, default arguments,
    the cells it closes over and the globals its code reads (arrays by content, functions two
    levels deep, modules by name): see :func:`_digest_callable`. The key is hashed with all
    its words (a 64-bit seed's high word included).
    """
    h = hashlib.sha256(name.encode())
    kept = {k: v for k, v in kwargs.items() if k not in _FREE_OPTIONS}
    _digest_leaves((args, kept), h)
    return h.hexdigest()[:32]
