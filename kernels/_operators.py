"""The operator layer shared by the curvature and Gauss-Newton kernels.

:class:`_LossOperator` is the base of the loss-curvature operators (``curvature.hvp``,
``curvature.dataset_hvp`` and the Gauss-Newton / Fisher operators): kernels call its
:meth:`~_LossOperator.linearize` once, or its quadratic :meth:`~_LossOperator.form` per probe.
The input checks here are the ones every operator constructor runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_array_leaves, check_that, finite_verdict
from kernels._precision import in_compute, work_params
from kernels.parallel import num_leading

Matvec = Callable[[Any], Any]
_SUPPORTED = ("float16", "bfloat16", "float32", "float64")


def _check_floating(tree: Any, name: str) -> None:
    """Static: ``tree`` has array leaves, all floating (half, single or double), and elements.

    Half-precision leaves are accepted: the kernels work on them in float32
    (:mod:`kernels._precision`).
    """
    check_array_leaves(tree, name)
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError(f"{name}: expected a pytree with at least one array leaf, got {tree!r}")
    for leaf in leaves:
        dtype = np.dtype(jnp.result_type(leaf))
        if dtype.name not in _SUPPORTED:
            raise ValueError(
                f"{name}: expected float16, bfloat16, float32 or float64 leaves, got {dtype.name}"
            )
    if sum(int(np.prod(jnp.shape(leaf))) for leaf in leaves) == 0:
        shapes = [jnp.shape(leaf) for leaf in leaves]
        raise ValueError(f"{name}: expected at least one element, got leaves of shapes {shapes}")


def _all_finite(tree: Any) -> jax.Array:
    return finite_verdict(jax.tree_util.tree_leaves(tree))


def _check_params(params: Any) -> jax.Array:
    """Runtime check that ``params`` is finite; returns the (possibly traced) verdict."""
    ok = _all_finite(params)
    check_that(ok, "params: expected finite values, found NaN or inf")
    return ok


def _as_scalar(loss_fn: Callable[[Any, Any], jax.Array], batch: Any) -> Callable:
    """``p -> (loss, loss)`` for ``jax.grad(..., has_aux=True)``, checking the loss's type."""

    def value(p: Any) -> tuple[jax.Array, jax.Array]:
        out = loss_fn(p, batch)
        shape, dtype = jnp.shape(out), jnp.result_type(out)
        if shape != () or not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                f"loss_fn: must return a real floating scalar, got {dtype} of shape {shape}"
            )
        return out, out

    return value


class _LossOperator:
    """Hessian of a loss as a pytree operator: kernels call :meth:`linearize` once."""

    params: Any
    compute_dtype: Any  # None, "params" or a dtype name (kernels._precision); static

    def primal(self) -> Any:
        """``params`` in their working dtypes (half precision cast to float32, in the program)."""
        return work_params(self.params)

    def in_compute(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn(params, ...)`` taking working-dtype parameters, evaluated in ``compute_dtype``."""
        return in_compute(fn, self.params, self.compute_dtype)

    def linearize(self) -> tuple[Matvec, jax.Array]:  # pragma: no cover - abstract
        raise NotImplementedError

    def form(self, v: Any) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_inputs(self) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def scalar_loss(self) -> Callable[[Any], jax.Array]:  # pragma: no cover - abstract
        """``params -> scalar``: the loss whose gradient a kernel's memory is measured against.

        For an operator over stacked batches, the loss of the first batch (the kernels hold
        one batch at a time). Used only abstractly (``jax.eval_shape``) by
        :func:`kernels._memory.gradient_bytes`, to size ``chunk_size="auto"``.
        """
        raise NotImplementedError

    def recomputed(self) -> tuple[Matvec, jax.Array]:
        """``(product, valid)`` as :meth:`linearize`, keeping nothing between products.

        Each product runs the operator's whole program afresh (for a Hessian: the forward and
        backward pass and their tangents), so no residuals stay alive across the products of a
        kernel; ``valid`` comes from :meth:`check_inputs`. Operators over stacked batches
        already work this way, and return :meth:`linearize`.
        """
        return self.linearize()

    def __call__(self, v: Any) -> Any:
        """$H v$ for one pytree ``v`` shaped like ``params`` (linearises afresh each call)."""
        product, _ = self.linearize()
        return product(v)


def _num_batches(batches: Any) -> int:
    """Static check of stacked batches: B >= 1 along a shared leading axis."""
    if not jax.tree_util.tree_leaves(batches):
        raise ValueError("batches: expected a pytree with array leaves stacked along axis 0")
    try:
        num_batches = num_leading(batches)
    except (ValueError, IndexError) as err:
        raise ValueError(f"batches: leaves must share a leading batch axis ({err})") from None
    if num_batches < 1:
        raise ValueError("batches: expected at least one batch, got a leading axis of length 0")
    return num_batches
