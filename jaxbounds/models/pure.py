r"""Turn a Flax nnx module into a pure function of a parameter pytree.

``apply_fn, params = as_pure(model)`` gives ``apply_fn(params, inputs) == model(inputs)`` with
``params`` a plain nested dict of arrays (``nnx.State.to_pure_dict()`` of the module's
``nnx.Param`` variables; list indices are int keys). ``apply_fn`` rebuilds the module with
``nnx.merge`` on every call, so it is a pure function: it works with ``jax.grad``, ``jax.jvp``,
``jax.linearize``, ``jax.vmap`` and ``jax.jit``, and with every kernel in :mod:`kernels`.
Non-parameter state (e.g. RNG counters) is captured as a constant at the time of the split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from kernels._checks import check_positive_int

__all__ = ["apply_in_chunks", "as_pure", "set_params"]


def as_pure(model: nnx.Module) -> tuple[Callable[[Any, Any], Any], dict[str, Any]]:
    """Split an nnx module into ``(apply_fn, params)``.

    Args:
      model: an ``nnx.Module`` whose ``__call__(inputs)`` is the function to expose.

    Returns:
      ``apply_fn(params, inputs) -> model(inputs)`` and ``params``, a nested dict of the
      module's ``nnx.Param`` arrays (a copy; changing it does not change ``model``).

    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> apply_fn, params = as_pure(model)
    >>> sorted(params)
    ['bias', 'kernel']
    >>> x = jnp.ones(2, jnp.float32)
    >>> bool(jnp.allclose(apply_fn(params, x), model(x)))
    True
    """
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    treedef = jax.tree_util.tree_structure(state)
    pure_treedef = jax.tree_util.tree_structure(nnx.to_pure_dict(state))
    params = jax.tree_util.tree_map(lambda x: x, nnx.to_pure_dict(state))

    def apply_fn(params: Any, inputs: Any) -> Any:
        leaves, got = jax.tree_util.tree_flatten(params)
        if got != pure_treedef:
            raise ValueError(f"params: expected the structure {pure_treedef}, got {got}")
        module = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves), rest)
        return module(inputs)

    return apply_fn, params


def set_params(model: nnx.Module, params: dict[str, Any]) -> nnx.Module:
    """Write a pure parameter dict (as returned by :func:`as_pure`) back into ``model``.

    Args:
      model: the module to update in place.
      params: nested dict with the structure of ``as_pure(model)[1]``.

    Returns:
      ``model`` (updated).
    """
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


def apply_in_chunks(
    apply_fn: Callable[[Any, Any], Any], params: Any, inputs: jax.Array, *, chunk_size: int = 4096
) -> Any:
    """``apply_fn(params, inputs)`` on a large batch, ``chunk_size`` examples at a time.

    Up to ``chunk_size`` examples are one call; beyond, ``lax.map`` vectorises ``apply_fn`` on
    single examples over chunks (memory of one chunk). Traceable.

    Args:
      apply_fn: ``(params, inputs) -> outputs``, batched over the leading axis.
      params: parameters.
      inputs: (n, ...) examples.
      chunk_size: examples per vectorised chunk, >= 1. Static.

    >>> import jax.numpy as jnp
    >>> apply_in_chunks(lambda p, x: x * p, 2.0, jnp.arange(5.0), chunk_size=2)
    Array([0., 2., 4., 6., 8.], dtype=float32)
    """
    check_positive_int(chunk_size, "chunk_size")
    if len(inputs) <= chunk_size:
        return apply_fn(params, inputs)
    return jax.lax.map(lambda x: apply_fn(params, x), inputs, batch_size=chunk_size)
