"""The checks of :func:`jaxbounds.training.train`'s arguments: each bad one a ValueError naming it.

Counts, the optimizer and its hyperparameters, the evaluation and stopping rules, the run axis
of ``params``, ``key`` and ``data``, and the minibatches; each checked before anything is
compiled.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

_NORMS = (None, "frobenius", "spectral")


def _check_int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    return int(value)


def _leading(tree: Any, name: str) -> int:
    lengths = {int(np.shape(a)[0]) if np.ndim(a) else -1 for a in jax.tree_util.tree_leaves(tree)}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError(f"{name}: expected leaves with one common leading axis, got lengths "
                         f"{sorted(lengths)}")  # fmt: skip
    return lengths.pop()


def _per_run(value: Any, name: str, runs: int, dtype: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.full((runs,), arr)
    if arr.shape != (runs,):
        raise ValueError(f"{name}: expected a scalar or shape ({runs},), got shape {arr.shape}")
    return arr.astype(dtype)


def _float_dtype(params: Any) -> Any:
    floats = [a.dtype for a in jax.tree_util.tree_leaves(params)
              if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating)]  # fmt: skip
    return jnp.result_type(*floats) if floats else jnp.result_type(float)


def _check_optimizer(optimizer: Any, hyperparams: Mapping[str, Any]) -> tuple[str, ...]:
    if isinstance(optimizer, optax.GradientTransformation):
        if hyperparams:
            raise ValueError(
                "hyperparams: give an optax factory (e.g. optax.adam) as `optimizer` to inject "
                "hyperparameters, not a GradientTransformation"
            )
        return ()
    if not callable(optimizer):
        raise ValueError(
            f"optimizer: expected an optax factory (optax.adam) or GradientTransformation, got "
            f"{optimizer!r}"
        )
    if not hyperparams:
        raise ValueError(
            "optimizer: a factory needs its hyperparameters, e.g. "
            "hyperparams={'learning_rate': 1e-3}"
        )
    known = set(inspect.signature(optimizer).parameters)
    unknown = sorted(set(hyperparams) - known)
    if unknown:
        raise ValueError(f"hyperparams: {unknown} are not arguments of {optimizer.__name__}")
    return tuple(sorted(hyperparams))


def _check_rules(
    eval_every: Any, evals_per_call: Any, keep: Any, patience: Any, norms: Any, threshold: Any
) -> tuple[int, int]:
    """The checked evaluation sizes of :func:`train`; a ValueError naming a bad rule."""
    eval_every = _check_int(eval_every, "eval_every", 1)
    evals_per_call = max(1, 64 // eval_every) if evals_per_call is None else evals_per_call
    evals_per_call = _check_int(evals_per_call, "evals_per_call", 1)
    if keep not in ("last", "best"):
        raise ValueError(f"keep: expected 'last' or 'best', got {keep!r}")
    if patience is not None:
        if _check_int(patience, "patience", 1) > 2**31 - 1:  # the int32 counter of the lanes
            raise ValueError(f"patience: expected an int <= {2**31 - 1}, got {patience!r}")
        if keep != "best":
            raise ValueError("patience: early stopping needs keep='best' (it watches best_metric)")
    if norms not in _NORMS:
        raise ValueError(f"norms: expected one of {_NORMS}, got {norms!r}")
    if threshold is not None and not (
        isinstance(threshold, int | float) and math.isfinite(threshold)
    ):
        raise ValueError(f"loss_threshold: expected a finite number or None, got {threshold!r}")
    return eval_every, evals_per_call


def _with_run_axis(
    params: Any, key: Any, num_runs: int, single: bool, data_per_run: bool
) -> tuple[Any, Any]:
    """``params`` and ``key`` with their run axis (added for a single run), checked."""
    if single:
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None], params)
        key = None if key is None else key[None]
        if data_per_run:
            raise ValueError("data_per_run: needs runs (a batch of runs)")
    elif _leading(params, "params") != num_runs:
        raise ValueError(f"params: expected a leading run axis of {num_runs} (runs)")
    return params, key


def _check_batches(batch_size: Any, key: Any, n: int, num_runs: int) -> tuple[int | None, Any]:
    """The minibatch size (clipped to n) and one key per run (a fixed one without batches)."""
    if batch_size is not None:
        batch_size = min(_check_int(batch_size, "batch_size", 1), n)
        if key is None:
            raise ValueError("key: minibatches (batch_size) need a PRNG key per run")
    if key is None:
        key = jax.random.split(jax.random.key(0), num_runs)  # unused without minibatches
    elif jnp.shape(key)[:1] != (num_runs,):
        raise ValueError(f"key: expected one key per run, shape ({num_runs},), got "
                         f"{jnp.shape(key)}")  # fmt: skip
    return batch_size, key


def _num_examples(data: Any, per_run: bool, runs: int, needed: bool) -> int:
    leaves = jax.tree_util.tree_leaves(data)
    if per_run and _leading(data, "data") != runs:
        raise ValueError(f"data: expected a leading run axis of {runs} (data_per_run)")
    if not needed:
        return 0
    axis = 1 if per_run else 0
    lengths = {int(np.shape(a)[axis]) for a in leaves if np.ndim(a) > axis}
    if len(lengths) != 1:
        raise ValueError(f"data: expected leaves of one example length, got {sorted(lengths)}")
    return lengths.pop()
