"""The backend the kernels run on, and what depends on it: matmul precision and chunk defaults.

Kernels run unchanged on whatever ``jax.devices()`` holds. Two things depend on the backend:

- **Matmul precision.** At JAX's default precision a float32 matrix product on a GPU runs in
  TF32 (about 10 mantissa bits) and on a TPU in bfloat16 passes; on a CPU it is full float32.
  :func:`reduced_precision_matmuls` says which holds for the devices kernels traced now use.
- **Vectorisation.** On a CPU, Monte Carlo samples are cheapest one at a time; an accelerator
  wants chunks of samples vectorised. Defaults that depend on this read :func:`sample_platform`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from kernels._devices import sample_devices

__all__ = ["is_accelerator", "reduced_precision_matmuls", "sample_platform"]

_FULL_PRECISION = {"highest", "float32", "fastest_float32", "tensorfloat32_x3"}


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
