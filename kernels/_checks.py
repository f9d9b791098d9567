"""Argument checks shared by the kernels: fail with a ValueError naming the argument.

Two kinds of check:

- *static* checks (counts, sizes, option strings, shapes, dtypes) run in Python while the
  kernel is traced and raise ``ValueError`` at once;
- *runtime* checks (:func:`check_finite`, :func:`check_positive`, :func:`check_that`) test
  array values inside the compiled program with a host callback, so they hold eagerly and
  inside a user's ``jax.jit`` / ``vmap`` alike. Eagerly they raise ``ValueError``; inside a
  user's ``jit`` the failure surfaces as a ``jax.errors.JaxRuntimeError`` whose message contains
  the same text (``"kernels check failed: <argument>: ..."``).

Runtime checks cost one reduction over the checked values and one host callback per kernel
call. Turn them off with ``kernels.set_runtime_checks(False)`` (or the environment variable
``KERNELS_RUNTIME_CHECKS=0`` at import), or for a block with
``with kernels.runtime_checks(False): ...``. The switch is read when a program is traced, and
it is part of the compilation cache key of the kernels' entry points.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_array_leaves",
    "check_finite",
    "check_key",
    "check_positive",
    "check_positive_int",
    "check_scalar_fn",
    "check_that",
    "ensure_that",
    "runtime_checks",
    "runtime_checks_enabled",
    "set_runtime_checks",
]

_MARKER = "kernels check failed: "


class _DropFailedChecks(logging.Filter):
    """Keep JAX's callback logger quiet about our own failed checks (they are re-raised)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, ValueError) and str(exc).startswith(_MARKER))


logging.getLogger("jax._src.debugging").addFilter(_DropFailedChecks())
_state = {"enabled": os.environ.get("KERNELS_RUNTIME_CHECKS", "1").strip() not in ("0", "false")}


def runtime_checks_enabled() -> bool:
    """Whether runtime checks are compiled into kernels traced from now on."""
    return _state["enabled"]


def set_runtime_checks(enabled: bool) -> None:
    """Turn the kernels' runtime value checks on or off (default on).

    Args:
      enabled: ``False`` compiles kernels without the NaN / sign checks on traced values
        (static checks of counts, shapes and options always run).
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled: expected a bool, got {enabled!r}")
    _state["enabled"] = enabled


@contextlib.contextmanager
def runtime_checks(enabled: bool) -> Iterator[None]:
    """Context manager: runtime checks on or off inside the block, restored after it."""
    previous = runtime_checks_enabled()
    set_runtime_checks(enabled)
    try:
        yield
    finally:
        set_runtime_checks(previous)


def failed_check_message(err: BaseException) -> str | None:
    """The check's message inside a runtime error raised by a failed check, else None."""
    found = re.search(re.escape(_MARKER) + r"([^\n]*)", str(err))
    return None if found is None else found.group(1)


def is_concrete(tree: Any) -> bool:
    """True when no leaf of ``tree`` is a tracer (so its values can be inspected)."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _format(message: str, values: tuple[Any, ...]) -> str:
    return message.format(*(np.asarray(v).tolist() for v in values)) if values else message


def _raise_if(message: str, failed: Any, *values: Any) -> None:
    """Host side of a runtime check: raise when ``failed`` holds anywhere."""
    if np.any(np.asarray(failed)):
        raise ValueError(_MARKER + _format(message, values))


@functools.cache
def _vmap_safe_check(message: str) -> Callable[..., Any]:
    """``ensure(x, ok, values) -> x`` failing with ``message`` unless ``ok``; once under vmap.

    A plain ``jax.debug.callback`` on a batched value is unrolled by ``vmap`` into one host
    callback per batch element (slow to compile and run); this batching rule reduces ``ok`` over
    the batch (and each message value by its maximum) and checks once. The ``custom_jvp`` passes
    tangents of ``x`` through unchanged (the check does not touch values).
    """

    @jax.custom_batching.custom_vmap
    def ensure(x: Any, ok: jax.Array, values: tuple[jax.Array, ...]) -> Any:
        jax.debug.callback(functools.partial(_raise_if, message), jnp.logical_not(ok), *values)
        return x

    @ensure.def_vmap
    def _batched(axis_size: int, in_batched: Any, x: Any, ok: jax.Array, values: Any) -> Any:
        del axis_size
        x_batched, ok_batched, values_batched = in_batched
        ok = jnp.all(ok) if ok_batched else ok
        values = tuple(
            jnp.max(v, axis=0) if b else v for v, b in zip(values, values_batched, strict=True)
        )
        return ensure(x, ok, values), x_batched

    @jax.custom_jvp
    def ensure_differentiable(x: Any, ok: jax.Array, values: tuple[jax.Array, ...]) -> Any:
        return ensure(x, ok, values)

    @ensure_differentiable.defjvp
    def _jvp(primals: Any, tangents: Any) -> Any:
        return ensure(*primals), tangents[0]

    return ensure_differentiable


def ensure_that(x: Any, ok: Any, message: str, *values: Any) -> Any:
    """Return ``x``; fail with ``message`` unless every element of ``ok`` is true.

    Concrete ``ok`` raises ``ValueError`` at once. A traced one installs one host callback in
    the program (skipped when runtime checks are off), tied to ``x`` by a data dependency; under
    ``vmap`` it runs once for the whole batch (the largest of each value is reported).
    ``values`` (arrays, possibly traced) fill ``{}`` fields of ``message`` when it fails, e.g.
    ``ensure_that(y, bad == 0, "loss_fn: non-finite at {} of the probes", bad)``.
    """
    if is_concrete((ok, values)):
        if not np.all(np.asarray(ok)):
            raise ValueError(_format(message, values))
        return x
    if not runtime_checks_enabled():
        return x
    values = tuple(jnp.asarray(v) for v in values)
    return _vmap_safe_check(message)(x, jnp.all(jnp.asarray(ok)), values)


def check_that(ok: Any, message: str, *values: Any) -> None:
    """Fail with ``message`` unless every element of ``ok`` is true (see :func:`ensure_that`)."""
    ensure_that(jnp.zeros((), jnp.int32), ok, message, *values)


def _is_array_like(leaf: Any) -> bool:
    """An array (jax, numpy, a tracer) or a real/complex number: what a kernel can trace."""
    if isinstance(leaf, bool):
        return True
    return isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | complex)


def check_array_leaves(tree: Any, name: str) -> None:
    """Static: every leaf of ``tree`` is an array or a number; else a ValueError naming ``name``.

    A model object passed whole (an equinox module holds its methods and activation functions
    as leaves, a string or an arbitrary object) cannot be traced: the error names the first
    such leaf by its path and says how to pass the arrays alone.

    >>> check_array_leaves({"w": np.zeros(2), "act": "relu"}, "params")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: params: leaf ['act'] is a str, not an array: pass a pytree of arrays only ...
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        if not _is_array_like(leaf):
            raise ValueError(
                f"{name}: leaf {jax.tree_util.keystr(path) or '(root)'} is a "
                f"{type(leaf).__name__}, not an array: pass a pytree of arrays only (for an "
                "equinox module, params, static = eqx.partition(model, eqx.is_array); for a flax "
                "nnx module, graphdef, params = nnx.split(model, nnx.Param))"
            )


def check_finite(tree: Any, name: str) -> None:
    """Fail unless every floating leaf of ``tree`` is finite (eagerly and under ``jit``)."""
    leaves = [
        leaf
        for leaf in jax.tree_util.tree_leaves(tree)
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
    ]
    if not leaves:
        return
    if is_concrete(leaves):
        for leaf in leaves:
            if not np.all(np.isfinite(np.asarray(leaf))):
                raise ValueError(f"{name}: expected finite values, found NaN or inf")
        return
    if not runtime_checks_enabled():
        return
    ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))
    check_that(ok, f"{name}: expected finite values, found NaN or inf")


def check_positive(value: Any, name: str) -> None:
    """Fail unless ``value`` is finite and > 0 (eagerly and under ``jit``)."""
    if isinstance(value, bool) or not (
        isinstance(value, int | float | np.integer | np.floating | np.ndarray | jax.Array)
    ):
        raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
    if is_concrete(value):
        arr = np.asarray(value)
        if not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
            raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")
        return
    check_that(
        jnp.logical_and(jnp.isfinite(value), value > 0),
        f"{name}: expected a finite value > 0, got a non-positive or non-finite traced value",
    )


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``; else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def check_key(key: Any, name: str = "key") -> jax.Array:
    """Return ``key`` if it is a single PRNG key (typed, or a raw uint32 key); else raise."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name}: expected one PRNG key of shape (), got shape {key.shape}")
        return key
    if (
        isinstance(key, jax.Array | np.ndarray)
        and key.dtype == np.uint32
        and key.shape == (2,)
    ):
        return key
    raise ValueError(
        f"{name}: expected a PRNG key such as jax.random.key(0), got {type(key).__name__}"
        f"{'' if not hasattr(key, 'shape') else f' of shape {key.shape}'}"
    )


def check_scalar_fn(fn: Callable[..., Any], primal: Any, name: str, *args: Any) -> None:
    """Raise ValueError unless ``fn(primal, *args)`` is a real floating scalar (abstractly).

    This traces ``fn`` once more; inside a kernel prefer checking the shape and dtype of a value
    the program computes anyway (e.g. the loss at ``params``).
    """
    try:
        out = jax.eval_shape(fn, primal, *args)
    except Exception as err:  # re-raised with the argument named
        raise ValueError(f"{name}: could not be evaluated at the given arguments: {err}") from err
    shape = getattr(out, "shape", None)
    if shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(
            f"{name}: must return a real floating scalar, got {getattr(out, 'dtype', type(out))}"
            f" of shape {shape}"
        )
