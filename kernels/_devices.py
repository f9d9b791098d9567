"""Which devices the kernels spread their Monte Carlo samples over: all, or a scoped subset.

By default the kernels shard over ``jax.devices()``, which after ``jax.distributed.initialize``
spans every process: a kernel call is then a collective program that every process must run.
Work that one process does alone (a unit of ``jaxbounds reproduce``, whose units are shared out
over the processes) runs its kernels inside ``with kernels.using_devices(jax.local_devices()):``
instead. The choice is read when a program is traced, and it is part of the compilation cache
key of the kernels' entry points (like the runtime-checks switch).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import jax

__all__ = ["devices_cache_key", "sample_devices", "using_devices"]

_SCOPE: contextvars.ContextVar[tuple[jax.Device, ...] | None] = contextvars.ContextVar(
    "kernels_sample_devices", default=None
)


def sample_devices() -> list[jax.Device]:
    """The devices kernels traced now shard over: the innermost :func:`using_devices`, else all.

    >>> sample_devices() == jax.devices()
    True
    """
    scoped = _SCOPE.get()
    return list(jax.devices()) if scoped is None else list(scoped)


def devices_cache_key() -> tuple[int, ...] | None:
    """The scoped devices' ids (None when unscoped): part of the kernels' compilation cache key."""
    scoped = _SCOPE.get()
    return None if scoped is None else tuple(d.id for d in scoped)


@contextlib.contextmanager
def using_devices(devices: Sequence[jax.Device]) -> Iterator[None]:
    """Context manager: kernels traced inside the block shard over ``devices`` only.

    Args:
      devices: a non-empty sequence of distinct ``jax.Device`` s, e.g. ``jax.local_devices()``
        for work that this process does alone in a multi-process program.

    Raises:
      ValueError: if ``devices`` is empty, holds something that is not a device, or repeats one.

    >>> import jax, kernels
    >>> with kernels.using_devices(jax.local_devices()[:1]):
    ...     len(sample_devices())
    1
    """
    if isinstance(devices, jax.Device) or not isinstance(devices, Sequence):
        raise ValueError(f"devices: expected a sequence of jax devices, got {devices!r}")
    chosen = tuple(devices)
    if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
        raise ValueError(f"devices: expected a non-empty sequence of jax devices, got {devices!r}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices: a device is listed twice in {list(chosen)}")
    token = _SCOPE.set(chosen)
    try:
        yield
    finally:
        _SCOPE.reset(token)
