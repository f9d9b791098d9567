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

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from kernels._checks import check_positive_int
from kernels.estimate import Estimate

__all__ = ["SampleStats", "map_chunked", "map_samples", "num_leading", "sample_statistics"]


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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleStats:
    r"""Streaming statistics of i.i.d. Monte Carlo samples (elementwise over the sample shape).

    Attributes:
      count: number of samples $K$.
      mean: $\frac1K\sum_k Y_k$.
      m2: $\sum_k (Y_k - \bar Y)^2$ (Welford / Chan et al.).
      num_nonfinite: how many samples had a NaN or infinite element.
      num_samples: $K$ as a static Python int.
    """

    count: Any
    mean: Any
    m2: Any
    num_nonfinite: Any
    num_samples: int = dataclasses.field(metadata={"static": True})

    def estimate(self, *, num_evaluations: int | None = None) -> Estimate:
        """The mean with standard error $\\sqrt{M_2/(K-1)}/\\sqrt K$ as an :class:`Estimate`."""
        count = jnp.asarray(self.num_samples, self.mean.dtype)
        stderr = jnp.sqrt(self.m2 / (count - 1) / count)
        return Estimate(
            mean=self.mean,
            stderr=stderr,
            num_samples=self.num_samples,
            num_evaluations=num_evaluations,
        )


def _merge(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    """Chan et al.: merge two (count, mean, M2, nonfinite) summaries."""
    n_a, mean_a, m2_a, bad_a = a
    n_b, mean_b, m2_b, bad_b = b
    n = n_a + n_b
    safe = jnp.where(n > 0, n, 1).astype(mean_a.dtype)
    frac = n_b.astype(mean_a.dtype) / safe
    delta = mean_b - mean_a
    mean = mean_a + delta * frac
    m2 = m2_a + m2_b + delta**2 * n_a.astype(mean_a.dtype) * frac
    return n, mean, m2, bad_a + bad_b


def _chunk_summary(values: jax.Array, valid: jax.Array) -> tuple[Any, ...]:
    """(count, mean, M2, nonfinite) of the valid rows of a chunk of samples."""
    shape = (-1,) + (1,) * (values.ndim - 1)
    mask = valid.reshape(shape)
    count = jnp.sum(valid).astype(jnp.int32)
    denom = jnp.maximum(count, 1).astype(values.dtype)
    mean = jnp.sum(jnp.where(mask, values, 0), axis=0) / denom
    m2 = jnp.sum(jnp.where(mask, (values - mean) ** 2, 0), axis=0)
    finite = jnp.all(jnp.isfinite(values.reshape(values.shape[0], -1)), axis=1)
    bad = jnp.sum(jnp.logical_and(valid, ~finite)).astype(jnp.int32)
    return count, mean, m2, bad


def sample_statistics(
    fn: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    *,
    num_samples: int,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> SampleStats:
    r"""Mean and $M_2$ of ``fn(fold_in(key, i))`` over ``i < num_samples``, in bounded memory.

    Sample $i$ always gets the key ``jax.random.fold_in(key, i)``, derived inside the program
    from its index, so neither the keys nor the per-sample values of all samples are ever held:
    each device loops over its contiguous share of chunks (``chunk_size`` samples vectorised at a
    time; ``None`` means one at a time) and merges each chunk's summary into a running
    (count, mean, M2) with Chan et al.'s update. Memory is that of one chunk whatever
    ``num_samples`` is, and the result does not depend on ``chunk_size`` or on the device count
    (up to floating-point reassociation).

    Args:
      fn: function of one PRNG key returning an array of a fixed shape (a sample).
      key: PRNG key.
      num_samples: $K \ge 1$. Static.
      chunk_size: samples per vectorised batch (static, >= 1); ``None`` runs them one at a time.
      devices: devices to spread chunks over; default ``jax.devices()``.

    Returns:
      SampleStats(count, mean, m2, num_nonfinite), elementwise over the sample's shape.

    >>> import jax, jax.numpy as jnp
    >>> stats = sample_statistics(lambda k: jnp.float64(2.0), jax.random.key(0), num_samples=5)
    >>> int(stats.count), float(stats.mean), float(stats.m2)
    (5, 2.0, 0.0)
    """
    num = check_positive_int(num_samples, "num_samples")
    chunk = 1 if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
    chunk = min(chunk, num)
    num_chunks = -(-num // chunk)
    devices = list(jax.devices()) if devices is None else list(devices)
    num_dev = max(1, min(len(devices), num_chunks))
    per_device = -(-num_chunks // num_dev)
    out = jax.eval_shape(fn, key)

    def run_share(share: jax.Array) -> tuple[Any, ...]:
        def body(c: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
            first = (share * per_device + c).astype(jnp.uint32) * jnp.uint32(chunk)
            idx = first + jnp.arange(chunk, dtype=jnp.uint32)
            values = jax.vmap(lambda i: fn(jax.random.fold_in(key, i)))(idx)
            return _merge(carry, _chunk_summary(values, idx < jnp.uint32(num)))

        zero = jnp.zeros(out.shape, out.dtype)
        init = (jnp.zeros((), jnp.int32), zero, zero, jnp.zeros((), jnp.int32))
        return jax.lax.fori_loop(0, per_device, body, init)

    if num_dev == 1:
        summary = run_share(jnp.zeros((), jnp.int32))
    else:
        mesh = Mesh(np.asarray(devices[:num_dev]), ("samples",))
        spec = PartitionSpec("samples")
        parts = jax.shard_map(
            lambda s: jax.tree_util.tree_map(lambda x: x[None], run_share(s[0])),
            mesh=mesh,
            in_specs=spec,
            out_specs=spec,
            check_vma=False,
        )(jnp.arange(num_dev, dtype=jnp.int32))
        summary = jax.tree_util.tree_map(lambda x: x[0], parts)
        for d in range(1, num_dev):
            summary = _merge(summary, jax.tree_util.tree_map(lambda x, d=d: x[d], parts))
    return SampleStats(*summary, num_samples=num)
