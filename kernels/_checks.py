"""Argument checks shared by the kernels: fail early with a ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(tree: Any) -> bool:
    """True when no leaf of ``tree`` is a tracer (so its values can be inspected)."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def check_finite(tree: Any, name: str) -> None:
    """Raise ValueError if a concrete floating leaf of ``tree`` holds NaN or inf.

    Traced leaves (inside ``jit`` / ``vmap``) cannot be inspected and are skipped.
    """
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.core.Tracer):
            continue
        arr = np.asarray(leaf)
        if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: expected finite values, found NaN or inf")


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``; else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return int(value)


def check_positive(value: Any, name: str) -> None:
    """Raise ValueError if a concrete ``value`` is not finite and > 0 (tracers are skipped)."""
    if isinstance(value, jax.core.Tracer):
        return
    arr = np.asarray(value)
    if not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
        raise ValueError(f"{name}: expected a finite value > 0, got {value!r}")


def check_scalar_fn(fn: Callable[[Any], Any], primal: Any, name: str) -> None:
    """Raise ValueError unless ``fn(primal)`` is a real floating scalar (checked abstractly)."""
    try:
        out = jax.eval_shape(fn, primal)
    except Exception as err:  # re-raised with the argument named
        raise ValueError(f"{name}: could not be evaluated at the given params: {err}") from err
    shape = getattr(out, "shape", None)
    if shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(
            f"{name}: must return a real floating scalar, got {getattr(out, 'dtype', type(out))}"
            f" of shape {shape}"
        )
