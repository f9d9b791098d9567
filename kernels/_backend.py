"""The backend the kernels run on, and what depends on it: matmul precision and chunk defaults.

Kernels run unchanged on whatever ``jax.devices()`` holds. Two things depend on the backend:

- **Matmul precision.** At JAX's default precision a float32 matrix product on a GPU runs in
  TF32 (about 10 mantissa bits) and on a TPU in bfloat16 passes; on a CPU it is full float32.
  :func:`reduced_precision_matmuls` says which holds for the devices kernels traced now use.
  The policy: kernels follow the user's ``jax.default_matmul_precision``; a result that is only
  valid at full precision (a bound, a certificate, a closed form that certifies a lower bound)
  is computed at ``"highest"`` whatever the default (:data:`HIGHEST`, :func:`full_precision`).
- **Vectorisation.** On a CPU, Monte Carlo samples are cheapest one at a time (Hutchinson
  probes, sharpness samples) or in modest chunks (Rademacher sign vectors); an accelerator
  wants large vectorised chunks. :func:`default_chunk_size` gives the default for a kind of
  sample, the backend and the problem's size, under a memory budget per chunk
  (:func:`chunk_memory_budget`). Defaults that depend on this read :func:`sample_platform`.
- **Memory relative to a gradient.** ``chunk_size="auto"`` of the loss kernels (Hutchinson on
  a loss operator, the sharpness kernels) and Hutchinson's ``mode="auto"`` choose under a
  budget stated in gradients: :mod:`kernels._memory` holds every memory estimate and the
  rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from kernels._devices import sample_devices

__all__ = [
    "CHUNK_DEFAULTS",
    "HIGHEST",
    "auto_chunk_size",
    "chunk_memory_budget",
    "default_chunk_size",
    "full_precision",
    "is_accelerator",
    "reduced_precision_matmuls",
    "sample_platform",
    "tree_bytes",
    "tree_size",
]

_FULL_PRECISION = {"highest", "float32", "fastest_float32", "tensorfloat32_x3"}

HIGHEST = jax.lax.Precision.HIGHEST
"""``precision=`` of a matmul whose result must be full precision (bounds, certificates)."""


def sample_platform() -> str:
    """The platform (``"cpu"``, ``"gpu"``, ``"tpu"``, ...) of the devices kernels shard over.

    >>> sample_platform() in ("cpu", "gpu", "tpu")
    True
    """
    platform = sample_devices()[0].platform
    return "gpu" if platform in ("cuda", "rocm") else platform


def is_accelerator() -> bool:
    """Whether the kernels' devices are accelerators (anything but a CPU)."""
    return sample_platform() != "cpu"


def reduced_precision_matmuls(dtype: Any = np.float32) -> bool:
    """Whether float32 matmuls of ``dtype`` run below float32 at the current default precision.

    True for float32 on a GPU or TPU unless ``jax_default_matmul_precision`` asks for full
    float32 (``"highest"`` or ``"float32"``); float64 and the CPU are always full precision.
    """
    if np.dtype(dtype) != np.float32 or not is_accelerator():
        return False
    setting = jax.config.jax_default_matmul_precision
    return setting is None or str(setting).lower() not in _FULL_PRECISION


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Context manager: matmuls traced inside run at full precision whatever the default.

    For results that are only valid at full precision (a bound, a certificate); TF32 on a GPU
    keeps about 10 mantissa bits. A matmul with an explicit ``precision=`` keeps its own.

    >>> import jax.numpy as jnp
    >>> with full_precision():
    ...     jax.make_jaxpr(jnp.matmul)(jnp.ones((2, 2)), jnp.ones((2, 2))).eqns[0].params[
    ...         "precision"]
    (Precision.HIGHEST, Precision.HIGHEST)
    """
    with jax.default_matmul_precision("highest"):
        yield


# Defaults per kind of Monte Carlo sample: (CPU default, accelerator's largest chunk, bytes one
# sample of size 1 element needs, in units of the dtype's itemsize). ``None`` on the CPU is one
# sample at a time (no vmap): measured fastest there for probes and perturbations (README,
# "Curvature" and "Scale"); sign vectors are matmul rows, 256 at a time on a CPU (README,
# "Rademacher"). On an H100 (issue 25's measurements) rademacher_linear at n = 4096, d = 512
# reached 0.51x of a stored-signs matmul at chunk 256, 1.05x at 1,024 and 1.49x at 4,096, and a
# Hutchinson probe on the 54k-parameter reference model cost 0.53 gradients one at a time and
# 0.30 in chunks of 16.
CHUNK_DEFAULTS: dict[str, tuple[int | None, int, int]] = {
    # sign vectors of rademacher_linear: one row of signs and one row of products per draw
    "signs": (256, 4096, 1),
    # Hutchinson probes / sharpness perturbations: a probe, its tangent and the program's
    # parameter-sized intermediates (a few copies) per sample
    "probes": (None, 16, 4),
}

# The memory one chunk may take on an accelerator: a sixteenth of the device's memory, at most
# 1 GiB (when the device does not report its memory: 1 GiB).
_MAX_CHUNK_BYTES = 1 << 30


def chunk_memory_budget() -> int:
    """Bytes one vectorised chunk may take on the kernels' devices (accelerators; see above).

    ``min(1 GiB, bytes_limit / 16)`` from ``device.memory_stats()`` where the device reports
    it (a GPU or TPU), else 1 GiB. A fixed property of the device, not its free memory, so the
    default does not change from call to call.
    """
    try:
        stats = sample_devices()[0].memory_stats() or {}
    except Exception:  # a backend without memory statistics (the CPU)
        stats = {}
    limit = stats.get("bytes_limit")
    if isinstance(limit, int | np.integer) and limit > 0:
        return int(min(_MAX_CHUNK_BYTES, limit // 16))
    return _MAX_CHUNK_BYTES


def default_chunk_size(kind: str, *, size: int, dtype: Any = np.float32) -> int | None:
    """The default ``chunk_size`` for ``kind`` of sample on the kernels' backend.

    On a CPU: the measured CPU default of the kind (``None``: one sample at a time). On an
    accelerator: the largest power of two up to the kind's cap whose chunk fits
    :func:`chunk_memory_budget`, counting ``size`` elements of ``dtype`` (times the kind's
    copies) per sample; ``None`` when not even two samples fit.

    Args:
      kind: ``"signs"`` (Rademacher sign vectors; ``size`` = n + d, the sign row and the
        product row of one draw) or ``"probes"`` (Hutchinson probes, sharpness perturbations;
        ``size`` = the number of parameters).
      size: elements per sample, an int >= 1.
      dtype: the samples' dtype.

    Returns:
      An int >= 2, or ``None`` (one sample at a time).

    Raises:
      ValueError: for an unknown ``kind`` or a ``size`` that is not an int >= 1.

    >>> import kernels
    >>> with kernels.using_devices(jax.devices("cpu")):  # the CPU's defaults
    ...     default_chunk_size("signs", size=4096 + 512), default_chunk_size("probes", size=54_000)
    (256, None)
    """
    if kind not in CHUNK_DEFAULTS:
        raise ValueError(f"kind: expected one of {sorted(CHUNK_DEFAULTS)}, got {kind!r}")
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
        raise ValueError(f"size: expected an int >= 1, got {size!r}")
    cpu, cap, copies = CHUNK_DEFAULTS[kind]
    if not is_accelerator():
        return cpu
    per_sample = int(size) * copies * np.dtype(dtype).itemsize
    budget = chunk_memory_budget()
    chunk = cap
    while chunk > 1 and chunk * per_sample > budget:
        chunk //= 2
    return chunk if chunk >= 2 else None


def auto_chunk_size(
    cpu: int | None, kind: str, *, size: Any, dtype: Any = np.float32
) -> int | None:
    """What ``chunk_size="auto"`` means for a kernel whose CPU default is ``cpu``.

    On a CPU ``cpu`` (the kernel's default, unchanged); on an accelerator
    :func:`default_chunk_size` ``(kind, size=size, dtype=dtype)``.

    Args:
      cpu: the kernel's default ``chunk_size`` (an int >= 1 or ``None``).
      kind: as :func:`default_chunk_size`.
      size: elements per sample (clipped to at least 1).
      dtype: the samples' dtype (a non-floating one counts as float32).

    >>> import kernels
    >>> with kernels.using_devices(jax.devices("cpu")):  # on a CPU: the kernel's own default
    ...     auto_chunk_size(8, "probes", size=1000)
    8
    """
    if not is_accelerator():
        return cpu
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = np.dtype(np.float32)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.dtype(np.float32)
    return default_chunk_size(kind, size=max(1, int(size)), dtype=dtype)


def tree_size(tree: Any) -> tuple[int, Any]:
    """Elements and the widest floating dtype of a pytree's array leaves (an int n: n, float32)."""
    if isinstance(tree, int | np.integer) and not isinstance(tree, bool):
        return max(1, int(tree)), np.dtype(np.float32)
    size, dtype = 0, np.dtype(np.float32)
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = getattr(leaf, "shape", None)
        if shape is None:
            continue
        size += int(np.prod(shape))
        leaf_dtype = getattr(leaf, "dtype", None)
        try:
            leaf_dtype = np.dtype(leaf_dtype)
        except TypeError:
            continue
        if np.issubdtype(leaf_dtype, np.floating) and leaf_dtype.itemsize > dtype.itemsize:
            dtype = leaf_dtype
    return max(1, size), dtype


def tree_bytes(tree: Any) -> int:
    """Bytes of a pytree's array leaves (arrays, tracers or ``jax.ShapeDtypeStruct``)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        with contextlib.suppress(TypeError):  # a key array's dtype: no numpy itemsize
            total += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return total
