"""Runtime checks that fail in argument order on every backend.

Runtime checks (:mod:`kernels._checks`) are host callbacks with no data dependency between
them, so when several fail in one program the backend decides which one reports: a GPU ran a
projection's check of its input ("v: expected finite values") before the check naming the
kernel's own argument (``params``). A :class:`CheckChain` makes the first failing argument the
one named everywhere:

- each check passes automatically once an earlier check of the chain has failed (its condition
  is ``ok or not all_earlier_ok``), so at most one check of the chain reports;
- :meth:`CheckChain.clean` replaces the floating values of a checked argument by zeros when an
  earlier check failed, before they reach a callable with checks of its own (a user's
  ``project``, a norm), so those never report a failure that an argument of the kernel caused.
  With runtime checks off nothing is replaced: bad values propagate to the result.

Concrete (eager) values are checked at once, in call order, as with :func:`check_that`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import (
    all_finite,
    check_positive,
    check_that,
    finite_message,
    is_concrete,
    runtime_checks_enabled,
)


class CheckChain:
    """An ordered list of runtime checks; see the module docstring."""

    def __init__(self) -> None:
        self._ok: jax.Array | None = None

    def require(self, ok: Any, message: str, *values: Any) -> None:
        """Fail with ``message`` unless ``ok`` holds (or an earlier check failed already)."""
        ok = jnp.all(jnp.asarray(ok))
        if is_concrete((ok, values)) or self._ok is None:
            check_that(ok, message, *values)
        else:
            check_that(jnp.logical_or(ok, jnp.logical_not(self._ok)), message, *values)
        if not is_concrete(ok):
            self._ok = ok if self._ok is None else jnp.logical_and(self._ok, ok)

    def finite(self, tree: Any, name: str) -> None:
        """Every floating leaf of ``tree`` is finite (:func:`kernels._checks.all_finite`)."""
        ok = all_finite(tree, name)
        if ok is not None:
            self.require(ok, finite_message(name))

    def positive(self, value: Any, name: str, *, scalar: bool = True) -> None:
        """``value`` is finite and > 0 (its type, and that it is a scalar, are checked at once)."""
        if scalar and np.ndim(value) != 0 and not isinstance(value, str):
            raise ValueError(f"{name}: expected a scalar, got an array of shape {np.shape(value)}")
        if is_concrete(value) or not isinstance(value, jax.Array):
            check_positive(value, name)  # static values, and the type check
            return
        ok = jnp.logical_and(jnp.isfinite(value), value > 0)
        self.require(
            ok,
            f"{name}: expected a finite value > 0, got a non-positive or non-finite traced value",
        )

    def clean(self, tree: Any) -> Any:
        """``tree`` with its floating leaves zeroed where an earlier check failed (traced only)."""
        if self._ok is None or not runtime_checks_enabled():
            return tree
        ok = self._ok

        def zero_if_failed(leaf: Any) -> Any:
            if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                return leaf
            leaf = jnp.asarray(leaf)
            return jnp.where(ok, leaf, jnp.zeros((), leaf.dtype))

        return jax.tree_util.tree_map(zero_if_failed, tree)
