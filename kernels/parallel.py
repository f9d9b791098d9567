"""Chunked and multi-device maps over Monte Carlo samples.

Every kernel draws one key per sample (``jax.random.split(key, num_samples)``) and maps a
per-sample function over those keys with :func:`map_samples`. Chunking bounds memory to
``chunk_size`` samples at a time, and sharding spreads the samples over ``jax.devices()``.
Neither changes which sample gets which key, so results do not depend on either (up to
floating-point reassociation inside a vectorised batch).

Many hosts: after ``jax.distributed.initialize()`` on every process, ``jax.devices()`` lists
the devices of all hosts and the mesh built here spans them. Call the kernel inside
``jax.jit`` on every process with the same arguments (same key, same replicated inputs): the
sample indices or keys are then created inside the program and sharded over the global mesh,
each host computes its share, and reductions of the output are cross-host collectives, so every
process receives the same replicated result. (Outside ``jit``, a process-local array cannot be
passed to a multi-host ``shard_map``.) Tested with forced host devices on one host only
(``tests/kernels/test_sharding.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

__all__ = ["map_chunked", "map_samples", "num_leading"]


def num_leading(xs: Any) -> int:
    """Common leading-axis length of the leaves of ``xs``.

    Raises:
      ValueError: if ``xs`` has no leaves or the leaves disagree.
    """
    sizes = {jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(xs)}
    if len(sizes) != 1:
        raise ValueError(f"xs: leaves must share one leading axis length, got {sorted(sizes)}")
    return sizes.pop()


def map_chunked(fn: Callable[[Any], Any], xs: Any, *, chunk_size: int | None = None) -> Any:
    """Map ``fn`` over the leading axis of ``xs``, ``chunk_size`` elements vectorised at a time.

    ``chunk_size=None`` vectorises everything at once (``jax.vmap``); ``chunk_size=1`` is a
    sequential ``lax.map``; anything between is a ``lax.map`` over ``vmap``-ed chunks, so peak
    memory holds ``chunk_size`` elements' intermediates, not all of them.

    Args:
      fn: function of one element (a pytree slice of ``xs``).
      xs: pytree whose leaves share a leading axis.
      chunk_size: elements per vectorised batch (static, >= 1), or None for all at once.

    Returns:
      The stacked outputs, leading axis as ``xs``.

    Raises:
      ValueError: if ``chunk_size`` < 1.

    >>> import jax.numpy as jnp
    >>> map_chunked(lambda x: x**2, jnp.arange(5), chunk_size=2)
    Array([ 0,  1,  4,  9, 16], dtype=int64)
    """
    num = num_leading(xs)
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int or None, got {chunk_size}")
    if chunk_size is None or chunk_size >= num:
        return jax.vmap(fn)(xs)
    if chunk_size == 1:
        return jax.lax.map(fn, xs)
    return jax.lax.map(fn, xs, batch_size=chunk_size)


def map_samples(
    fn: Callable[[Any], Any],
    xs: Any,
    *,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> Any:
    """Map ``fn`` over Monte Carlo samples, chunked and sharded over devices.

    With one device this is :func:`map_chunked`. With several (``jax.devices()`` by default,
    which spans every host after ``jax.distributed.initialize()``), the leading axis is padded
    to a multiple of the device count, split across a one-axis mesh with ``jax.shard_map``,
    each device runs :func:`map_chunked` on its share, and the padding is dropped. The element
    ``i`` of the output is always ``fn(xs[i])``, so the result equals the single-device result.

    Args:
      fn: function of one sample (e.g. of one PRNG key).
      xs: pytree whose leaves share a leading axis (e.g. ``jax.random.split(key, n)``).
      chunk_size: samples per vectorised batch on each device (static), None for all at once.
      devices: devices to shard over; default ``jax.devices()``.

    Returns:
      The stacked outputs, leading axis as ``xs``.

    >>> import jax
    >>> keys = jax.random.split(jax.random.key(0), 6)
    >>> map_samples(lambda k: jax.random.uniform(k).shape, keys, chunk_size=4)
    ()
    """
    devices = list(jax.devices()) if devices is None else list(devices)
    if len(devices) <= 1:
        return map_chunked(fn, xs, chunk_size=chunk_size)
    num = num_leading(xs)
    num_dev = len(devices)
    pad = (-num) % num_dev
    if pad:
        xs = jax.tree_util.tree_map(
            lambda leaf: jnp.concatenate([leaf, jnp.repeat(leaf[:1], pad, axis=0)]), xs
        )
    mesh = Mesh(np.asarray(devices), ("samples",))
    spec = PartitionSpec("samples")
    per_device = jax.shard_map(
        lambda part: map_chunked(fn, part, chunk_size=chunk_size),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
        check_vma=False,
    )
    out = per_device(xs)
    return jax.tree_util.tree_map(lambda leaf: leaf[:num], out)
