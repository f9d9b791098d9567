"""Chunked and multi-device maps over Monte Carlo samples, and streaming sample statistics.

Monte Carlo means go through :func:`sample_statistics`: sample ``i`` gets the key
``jax.random.fold_in(key, i)``, derived inside the program from its index, and each chunk of
``chunk_size`` samples is folded into a running (count, mean, M2) summary, so memory is that of
one chunk whatever the number of samples, and neither ``chunk_size`` nor the device count
changes which sample gets which key (results agree up to floating-point reassociation).
:func:`map_chunked` and :func:`map_samples` map a function over an array of inputs (indices,
keys, vectors) and keep every output.

``chunk_size`` means the same everywhere: samples per vectorised batch, an int >= 1; ``None``
is one sample at a time (a sequential ``lax.map``, least memory).

Many hosts: after ``jax.distributed.initialize()`` on every process, ``jax.devices()`` lists
the devices of all hosts and the mesh built here spans them. Call the kernel inside
``jax.jit`` on every process with the same arguments (same key, same replicated inputs): the
sample indices or keys are then created inside the program and sharded over the global mesh,
each host computes its share, and reductions of the output are cross-host collectives, so every
process receives the same replicated result. (Outside ``jit``, a process-local array cannot be
passed to a multi-host ``shard_map``.) Tested with 2 processes x 2 forced CPU devices on one
host (``tests/kernels/test_multiprocess.py``). Work that one process does alone in such a
program runs inside ``with using_devices(jax.local_devices()):``, which makes the kernels traced
in the block shard over those devices instead of ``jax.devices()``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from kernels._checks import check_key, check_positive_int
from kernels._devices import sample_devices, using_devices
from kernels.estimate import Estimate

__all__ = [
    "SampleStats",
    "map_chunked",
    "map_samples",
    "num_leading",
    "sample_devices",
    "sample_statistics",
    "using_devices",
]


def num_leading(xs: Any) -> int:
    """Common leading-axis length of the leaves of ``xs``.

    Raises:
      ValueError: if ``xs`` has no leaves or the leaves disagree.
    """
    sizes = {jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(xs)}
    if len(sizes) != 1:
        raise ValueError(f"xs: leaves must share one leading axis length, got {sorted(sizes)}")
    return sizes.pop()


def _chunk_size(chunk_size: int | None) -> int:
    """Validated ``chunk_size``: an int >= 1, with ``None`` meaning one at a time."""
    return 1 if chunk_size is None else check_positive_int(chunk_size, "chunk_size")


def map_chunked(fn: Callable[[Any], Any], xs: Any, *, chunk_size: int | None = None) -> Any:
    """Map ``fn`` over the leading axis of ``xs``, ``chunk_size`` elements vectorised at a time.

    ``chunk_size=None`` (or 1) is a sequential ``lax.map``, one element at a time and
    unbatched (least memory; a single element is a plain call: never a size-1 ``vmap``, which
    on CPU turns a perturbed model's matmuls into slower batched ones); ``chunk_size >=
    len(xs)`` vectorises everything with ``jax.vmap``; anything between is a ``lax.map`` over
    ``vmap``-ed chunks, so peak memory holds ``chunk_size`` elements' intermediates, not all
    of them. Element ``i`` of the output is ``fn(xs[i])`` whatever the
    chunk size.

    Args:
      fn: function of one element (a pytree slice of ``xs``).
      xs: pytree whose leaves share a leading axis.
      chunk_size: elements per vectorised batch, an int >= 1 (static); ``None``: one at a time.

    Returns:
      The stacked outputs, leading axis as ``xs``.

    Raises:
      ValueError: if ``chunk_size`` is not an int >= 1 or None, or the leaves of ``xs``
        disagree on their leading axis.

    >>> import jax.numpy as jnp
    >>> map_chunked(lambda x: x**2, jnp.arange(5), chunk_size=2)
    Array([ 0,  1,  4,  9, 16], dtype=int32)
    >>> map_chunked(lambda x: x**2, jnp.arange(5))  # one at a time
    Array([ 0,  1,  4,  9, 16], dtype=int32)
    """
    num = num_leading(xs)
    chunk = _chunk_size(chunk_size)
    if num == 1:  # one element: a plain call. No size-1 vmap: batching a perturbed model's
        # weights turns its matmuls into batched ones, measured 1.7x slower on CPU (a
        # 67M-parameter decoder); no scan, whose stacked output is one more buffer
        out = fn(jax.tree_util.tree_map(lambda a: a[0], xs))
        return jax.tree_util.tree_map(_leading_one, out)
    if chunk == 1:
        return jax.lax.map(fn, xs)
    if chunk >= num:
        return jax.vmap(fn)(xs)
    return jax.lax.map(fn, xs, batch_size=chunk)


def _leading_one(leaf: Any) -> jax.Array:
    """``leaf`` with a leading axis of length 1 (a Python scalar becomes an array first)."""
    return (leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf))[None]


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
      fn: function of one sample (e.g. of one sample index or PRNG key).
      xs: pytree whose leaves share a leading axis (e.g. ``jnp.arange(n)``).
      chunk_size: samples per vectorised batch on each device, an int >= 1 (static); ``None``:
        one at a time.
      devices: devices to shard over; default ``jax.devices()`` (or the innermost
        :func:`using_devices` scope).

    Returns:
      The stacked outputs, leading axis as ``xs``.

    Raises:
      ValueError: if ``chunk_size`` is not an int >= 1 or None.

    >>> import jax
    >>> keys = jax.random.split(jax.random.key(0), 6)
    >>> map_samples(lambda k: jax.random.uniform(k).shape, keys, chunk_size=4)
    ()
    """
    _chunk_size(chunk_size)
    devices = sample_devices() if devices is None else list(devices)
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
      num_nonfinite: how many samples had a NaN or infinite element (those samples are
        included in ``mean`` and ``m2``, which are then NaN or inf).
      num_samples: $K$ as a static Python int.
    """

    count: Any
    mean: Any
    m2: Any
    num_nonfinite: Any
    num_samples: int = dataclasses.field(metadata={"static": True})

    def estimate(self, *, num_evaluations: int | None = None) -> Estimate:
        r"""The mean with standard error $\sqrt{M_2/(K-1)}/\sqrt K$ as an :class:`Estimate`.

        Args:
          num_evaluations: function evaluations behind the estimate when they differ from
            ``num_samples`` (e.g. two per antithetic pair); stored in the Estimate.

        Returns:
          Estimate(mean, stderr, num_samples, num_evaluations=...); the stderr is NaN or inf
          when ``num_samples`` is 1.
        """
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
    m2 = jnp.sum(jnp.where(mask, (values - mean[None]) ** 2, 0), axis=0)
    finite = jnp.all(jnp.isfinite(values.reshape(values.shape[0], -1)), axis=1)
    bad = jnp.sum(jnp.logical_and(valid, ~finite)).astype(jnp.int32)
    return count, mean, m2, bad


def _share_summary(
    fn: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    share: jax.Array,
    *,
    num: int,
    chunk: int,
    per_device: int,
    out: jax.ShapeDtypeStruct,
) -> tuple[Any, ...]:
    """Summary of the chunks ``share * per_device + c``, ``c < per_device``, in one loop."""

    def body(c: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        first = (share * per_device + c).astype(jnp.uint32) * jnp.uint32(chunk)
        idx = first + jnp.arange(chunk, dtype=jnp.uint32)
        # vectorised over the chunk; a chunk of one is a plain call (no size-1 vmap)
        values = map_chunked(lambda i: fn(jax.random.fold_in(key, i)), idx, chunk_size=chunk)
        return _merge(carry, _chunk_summary(values, idx < jnp.uint32(num)))

    zero = jnp.zeros(out.shape, out.dtype)
    init = (jnp.zeros((), jnp.int32), zero, zero, jnp.zeros((), jnp.int32))
    return jax.lax.fori_loop(0, per_device, body, init)


def _sharded(
    run_share: Callable[[jax.Array], tuple[Any, ...]], devices: list[jax.Device]
) -> tuple[Any, ...]:
    """Run ``run_share(d)`` on device ``d`` of a one-axis mesh and merge the summaries in order.

    One device: ``run_share(0)`` directly, without a mesh.
    """
    if len(devices) == 1:
        return run_share(jnp.zeros((), jnp.int32))
    mesh = Mesh(np.asarray(devices), ("samples",))
    spec = PartitionSpec("samples")
    parts = jax.shard_map(
        lambda s: jax.tree_util.tree_map(lambda x: x[None], run_share(s[0])),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
        check_vma=False,
    )(jnp.arange(len(devices), dtype=jnp.int32))
    summary = jax.tree_util.tree_map(lambda x: x[0], parts)
    for d in range(1, len(devices)):
        summary = _merge(summary, jax.tree_util.tree_map(lambda x, d=d: x[d], parts))
    return summary


def sample_statistics(
    fn: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    *,
    num_samples: int,
    chunk_size: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> SampleStats:
    r"""Mean and $M_2$ of ``fn(fold_in(key, i))`` over ``i < num_samples``, in bounded memory.

    $$\bar Y = \frac1K\sum_{i<K} Y_i,\quad M_2 = \sum_{i<K}(Y_i - \bar Y)^2,\quad
    Y_i = \mathtt{fn}(\mathtt{fold\_in}(\mathtt{key}, i)),$$

    elementwise over the sample's shape. Sample $i$'s key is derived inside the program from
    its index, so neither the keys nor the values of all samples are ever held: the
    ``ceil(K / chunk_size)`` chunks are split into contiguous shares, one per device; each
    device loops over its share, ``chunk_size`` samples vectorised
    at a time, merging each chunk into a running (count, mean, M2) with Chan et al.'s update;
    the devices' summaries are merged in device order. Memory is that of one chunk, and the
    result does not depend on ``chunk_size`` or the device count (up to floating-point
    reassociation). Samples with a NaN/inf element are counted in ``num_nonfinite`` (and make
    ``mean``/``m2`` NaN or inf).

    Args:
      fn: function of one PRNG key returning a floating array of a fixed shape (a sample;
        several quantities can be stacked in a vector).
      key: PRNG key.
      num_samples: $K \ge 1$. Static.
      chunk_size: samples per vectorised batch, an int >= 1 (static); ``None`` runs them one
        at a time.
      devices: devices to spread chunks over; default ``jax.devices()`` (or the innermost
        :func:`using_devices` scope).

    Returns:
      SampleStats(count, mean, m2, num_nonfinite), elementwise over the sample's shape;
      ``.estimate()`` gives the :class:`~kernels.estimate.Estimate` with its standard error.

    Raises:
      ValueError: if ``num_samples`` or ``chunk_size`` is not an int >= 1, ``key`` is not a
        PRNG key, or ``fn`` does not return a floating array.

    References:
      Chan, Golub & LeVeque 1979, Stanford report STAN-CS-79-773 (pairwise variance updates).

    >>> import jax, jax.numpy as jnp
    >>> stats = sample_statistics(lambda k: jnp.asarray(2.0), jax.random.key(0), num_samples=5)
    >>> int(stats.count), float(stats.mean), float(stats.m2), int(stats.num_nonfinite)
    (5, 2.0, 0.0, 0)
    """
    num = check_positive_int(num_samples, "num_samples")
    chunk = min(_chunk_size(chunk_size), num)
    check_key(key)
    num_chunks = -(-num // chunk)
    devices = sample_devices() if devices is None else list(devices)
    # every given device takes a share (surplus ones get only padding, masked out), so the
    # program's device set is the same whatever num_samples is; fn is jitted so that its shape
    # probe and the loop share one trace.
    fn = jax.jit(fn)
    run_share = functools.partial(
        _share_summary, fn, key, num=num, chunk=chunk, per_device=-(-num_chunks // len(devices)),
        out=_sample_shape(fn, key),
    )  # fmt: skip
    return SampleStats(*_sharded(run_share, devices), num_samples=num)


def _sample_shape(fn: Callable[[jax.Array], jax.Array], key: jax.Array) -> Any:
    """Shape and dtype of one sample (an abstract trace of ``fn``); it must be floating."""
    out = jax.eval_shape(fn, key)
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"fn: must return a floating array, got dtype {out.dtype}")
    return out
