r"""The precision policy of the loss kernels: ``compute_dtype``, the one argument that sets it.

Parameters may be float16, bfloat16, float32 or float64, as checkpoints are. Each parameter
leaf has a *working* dtype: float32 for a half-precision leaf, its own dtype otherwise. The
kernels hold probes, perturbations, Lanczos bases and every sum in the working dtype; the
loss (or the model, for the Gauss-Newton kernels) is evaluated with each leaf cast to its
*compute* dtype, chosen by ``compute_dtype``:

- ``None`` (the default): the working dtype. A bfloat16 or float16 leaf is cast to float32
  with ``astype`` inside the kernel's program, so on a mesh each shard is cast where it lives
  (no float32 copy is gathered on one device, and no parameter vector is raveled for the
  cast); float32 and float64 leaves are used as they are. Derivatives are those of the loss at
  the float32 values of the weights (exactly the stored values), in float32 arithmetic.
- ``"params"``: each leaf's own dtype: a bfloat16 model runs in bfloat16 (faster, with the
  error of bfloat16 arithmetic; measured on the docs page "Large models", "Precision policy").
  Tangents inside the model are then rounded to the leaf's dtype too.
- a floating dtype (``"float32"``, ``jnp.bfloat16``, ...: float16, bfloat16, float32 or
  float64): every leaf is cast to it.

Kernels that evaluate a loss *difference* $L(\theta + u) - L(\theta)$ (average and worst-case
sharpness, ``sigma_search``, ``sharpness_decomposition``) refuse a half-precision compute
dtype: $\theta + u$ would be rounded to 8 (bfloat16) or 11 (float16) significand bits, so a
perturbation smaller than $2^{-8}|\theta|$ vanishes and the difference is rounding error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_HALF = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_ALLOWED = ("float16", "bfloat16", "float32", "float64")
_EXPECTED = f"None, 'params' or a floating dtype ({', '.join(_ALLOWED)})"


def check_compute_dtype(value: Any) -> str | None:
    """``compute_dtype`` checked and normalised: ``None``, ``"params"`` or a dtype name.

    Raises:
      ValueError: naming ``compute_dtype`` for anything else (an integer dtype, ``"float8"``,
        a number, NaN), or float64 while ``jax_enable_x64`` is off.
    """
    if value is None:
        return None
    if isinstance(value, str) and value == "params":
        return "params"
    if isinstance(value, bool | int | float | complex | np.number):
        raise ValueError(f"compute_dtype: expected {_EXPECTED}, got {value!r}")
    try:
        dtype = np.dtype(jnp.dtype(value))
    except (TypeError, ValueError):
        raise ValueError(f"compute_dtype: expected {_EXPECTED}, got {value!r}") from None
    if dtype.name not in _ALLOWED:
        raise ValueError(f"compute_dtype: expected {_EXPECTED}, got {dtype.name}")
    if dtype.name == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "compute_dtype: float64 needs jax_enable_x64 (jax.config.update('jax_enable_x64', "
            "True)); with it off arrays are float32"
        )
    return dtype.name


def work_dtype(dtype: Any) -> np.dtype:
    """The working dtype of a parameter leaf of ``dtype``: float32 for half precision."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _HALF else dtype


def _leaf_dtype(leaf: Any) -> np.dtype:
    return np.dtype(jnp.result_type(leaf)) if not hasattr(leaf, "dtype") else np.dtype(leaf.dtype)


def work_result_type(params: Any) -> np.dtype:
    """The working dtype of the flat vectors and sums of ``params`` (widest working dtype)."""
    dtypes = [work_dtype(_leaf_dtype(p)) for p in jax.tree_util.tree_leaves(params)]
    if not dtypes:
        return np.dtype(np.float32)
    return np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(*dtypes)))


def compute_leaf_dtype(dtype: Any, compute_dtype: str | None) -> np.dtype:
    """The dtype a parameter leaf of ``dtype`` is evaluated in under ``compute_dtype``."""
    if compute_dtype is None:
        return work_dtype(dtype)
    if compute_dtype == "params":
        return np.dtype(dtype)
    return np.dtype(jnp.dtype(compute_dtype))


def _cast(leaf: Any, dtype: np.dtype) -> Any:
    """``leaf.astype(dtype)`` inside the program; the leaf itself when it has that dtype."""
    if _leaf_dtype(leaf) == dtype or not jnp.issubdtype(_leaf_dtype(leaf), jnp.inexact):
        return leaf
    return jnp.asarray(leaf).astype(dtype)


def work_params(params: Any) -> Any:
    """``params`` with each half-precision leaf cast to float32 (others as they are).

    Called inside a kernel's program: the cast is one ``astype`` per leaf, which on a mesh
    runs on each shard where it lives.
    """
    return jax.tree_util.tree_map(lambda p: _cast(p, work_dtype(_leaf_dtype(p))), params)


class WorkStruct(jax.ShapeDtypeStruct):
    """The shape and working dtype of a half-precision leaf in a template (:func:`work_like`)."""

    __slots__ = ()


def is_template(tree: Any) -> bool:
    """Whether ``tree`` came from :func:`work_like` with a leaf cast (already a template)."""
    return any(isinstance(leaf, WorkStruct) for leaf in jax.tree_util.tree_leaves(tree))


def work_like(params: Any) -> Any:
    """A template of the working tree: ``jax.ShapeDtypeStruct`` leaves where a cast is due.

    Leaves already in their working dtype are returned as they are (so a float32 or float64
    template is unchanged); half-precision leaves become shape-and-dtype structs (nothing is
    computed for them).
    """

    def one(p: Any) -> Any:
        dtype = _leaf_dtype(p)
        if dtype not in _HALF:
            return p
        return WorkStruct(np.shape(p), work_dtype(dtype))

    return jax.tree_util.tree_map(one, params)


def to_compute(tree: Any, params: Any, compute_dtype: str | None) -> Any:
    """``tree`` (shaped like ``params``, in working dtypes) with each leaf in its compute dtype.

    The compute dtype of each leaf follows the dtype of the matching leaf of ``params``
    (:func:`compute_leaf_dtype`); only shapes and dtypes of ``params`` are read.
    """
    dtypes = [
        compute_leaf_dtype(_leaf_dtype(p), compute_dtype) for p in jax.tree_util.tree_leaves(params)
    ]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if len(leaves) != len(dtypes):  # not shaped like params: leave it to the caller's checks
        return tree
    return jax.tree_util.tree_unflatten(
        treedef, [_cast(x, d) for x, d in zip(leaves, dtypes, strict=True)]
    )


def needs_cast(params: Any, compute_dtype: str | None) -> bool:
    """Whether any leaf of ``params`` is evaluated in another dtype than its working one."""
    return any(
        compute_leaf_dtype(_leaf_dtype(p), compute_dtype) != work_dtype(_leaf_dtype(p))
        for p in jax.tree_util.tree_leaves(params)
    )


def in_compute(fn: Callable[..., Any], params: Any, compute_dtype: str | None) -> Callable:
    """``(p, *rest) -> fn(to_compute(p), *rest)``: ``fn`` of working-dtype parameters.

    The identity wrapper is skipped when nothing is cast (``fn`` itself is returned).
    """
    if not needs_cast(params, compute_dtype):
        return fn
    dtypes = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct((), _leaf_dtype(p)), params)

    def wrapped(p: Any, *rest: Any) -> Any:
        return fn(to_compute(p, dtypes, compute_dtype), *rest)

    return wrapped


def check_difference_dtype(params: Any, compute_dtype: str | None, kernel: str) -> None:
    """Refuse a half-precision compute dtype in a kernel of loss differences (static).

    Raises:
      ValueError: naming ``compute_dtype``, with the reason.
    """
    for p in jax.tree_util.tree_leaves(params):
        dtype = compute_leaf_dtype(_leaf_dtype(p), compute_dtype)
        if dtype in _HALF:
            bits = 8 if dtype == np.dtype(jnp.bfloat16) else 11
            raise ValueError(
                f"compute_dtype: {kernel} evaluates L(θ+u) - L(θ), and in {dtype.name} θ+u is "
                f"rounded to {bits} significand bits (a perturbation below 2^-{bits}|θ| vanishes, "
                "the difference is rounding error); use compute_dtype=None (float32)"
            )
