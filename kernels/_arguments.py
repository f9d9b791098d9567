"""Static argument checks of the kernels: counts, chunk sizes, keys, callables.

These run on concrete Python values at call time (no runtime check inside a program); their
errors name the argument and what was expected. Re-exported by :mod:`kernels._checks`, beside
the runtime checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_chunk_size",
    "check_key",
    "check_positive_int",
    "check_scalar_fn",
    "concrete_int",
    "describe",
    "real_number",
]


def concrete_int(value: Any) -> int | None:
    """``value`` as a Python int if it is a concrete integer scalar, else None.

    Python ints, NumPy integer scalars (``np.int64(16)``), 0-d NumPy integer arrays and concrete
    JAX integer scalars (``jnp.int32(16)`` outside ``jit``) are integers; bools, floats, arrays
    of another shape and traced values are not.
    """
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, np.ndarray | jax.Array):
        dtype = np.dtype(value.dtype) if not _is_key_array(value) else None
        if dtype is not None and value.shape == () and np.issubdtype(dtype, np.integer):
            return int(value)
    return None


def real_number(value: Any) -> float | None:
    """``value`` as a float if it is a Python or NumPy real scalar (int or float), else None.

    The form every exponent argument (``p``, ``q``, ``norm``, ``readout_norm``) accepts: an
    exponent is static (it picks the program), so strings, bools, complex numbers and arrays
    (NumPy 0-d arrays and JAX scalars included) are not numbers here.

    >>> real_number(2), real_number(np.float32(1.5)), real_number("2"), real_number(np.ones(()))
    (2.0, 1.5, None, None)
    """
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    return None


def _is_key_array(value: Any) -> bool:
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def describe(value: Any) -> str:
    """A short description of an argument's value for an error message (never a tracer's repr).

    >>> describe(np.zeros(2, np.float32)), describe(2.5), describe(np.float64(2.0))
    ('float32[2] array [0.0, 0.0]', '2.5', 'float64 scalar 2.0')
    >>> describe(np.zeros((3, 4)))
    'float64[3, 4] array'
    """
    if isinstance(value, jax.core.Tracer):
        aval = jax.typeof(value)
        return f"{_dtype_name(aval.dtype)}{list(aval.shape)} array"
    if isinstance(value, np.generic):
        return f"{value.dtype.name} scalar {value.item()!r}"
    if isinstance(value, np.ndarray | jax.Array):
        text = f"{_dtype_name(value.dtype)}{list(value.shape)} array"
        if value.size <= 4 and not _is_key_array(value):  # a concrete scalar or pair: its values
            text += f" {np.asarray(value).tolist()!r}"
        return text
    text = repr(value)
    return text if len(text) <= 80 else f"{type(value).__name__} {text[:60]}..."


def _dtype_name(dtype: Any) -> str:
    try:
        return str(jnp.dtype(dtype).name)
    except TypeError:
        return str(dtype)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``; else raise ValueError.

    Concrete NumPy and JAX integer scalars count as ints (:func:`concrete_int`); a traced value
    is refused (a count is static: it fixes the shape of the program).

    >>> check_positive_int(np.int64(16), "num_samples")
    16
    """
    num = concrete_int(value)
    if num is None:
        if isinstance(value, jax.core.Tracer) and jnp.issubdtype(value.dtype, jnp.integer):
            raise ValueError(
                f"{name}: expected a concrete int >= {minimum}, got a traced "
                f"{describe(value)} (a count is static: pass a Python int, not a value traced "
                "by jax.jit)"
            )
        raise ValueError(f"{name}: expected an int >= {minimum}, got {describe(value)}")
    if num < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {num}")
    return num


def check_chunk_size(value: Any, name: str = "chunk_size", auto: Any = None) -> Any:
    """Validate a ``chunk_size``: ``None``, an int >= 1 or ``"auto"`` (resolved by ``auto``).

    ``auto`` is what ``"auto"`` means for the calling kernel (an int or ``None``); the return
    value is ``None`` or an int >= 1.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{name}: expected None, an int >= 1 or 'auto', got {describe(value)}")
        return auto
    try:
        return check_positive_int(value, name)
    except ValueError:
        raise ValueError(
            f"{name}: expected None, an int >= 1 or 'auto', got {describe(value)}"
        ) from None


def check_key(key: Any, name: str = "key") -> jax.Array:
    """Return ``key`` if it is a single PRNG key (typed, or a raw uint32 key); else raise."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name}: expected one PRNG key of shape (), got shape {key.shape}")
        return key
    if isinstance(key, jax.Array | np.ndarray) and key.dtype == np.uint32 and key.shape == (2,):
        return key
    raise ValueError(f"{name}: expected a PRNG key (jax.random.key(seed)), got {describe(key)}")


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
