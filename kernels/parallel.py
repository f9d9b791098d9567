r"""Chunked and multi-device maps over Monte Carlo samples, and streaming sample statistics.

Monte Carlo means go through :func:`sample_statistics`: sample ``i`` gets the key
:func:`sample_key` ``(key, i)`` (``jax.random.fold_in(key, i)`` for ``i < 2**32``), derived
inside the program from its index, and each chunk of ``chunk_size`` samples is folded into
running double-word sums, so memory is that of one chunk whatever the number of samples, and
neither ``chunk_size`` nor the device count changes which sample gets which key (results agree
up to floating-point reassociation). :func:`map_chunked` and :func:`map_samples` map a function
over an array of inputs (indices, keys, vectors) and keep every output.

``chunk_size`` means the same everywhere: samples per vectorised batch, an int >= 1; ``None``
is one sample at a time (a sequential ``lax.map``, least memory); ``"auto"`` is ``None`` on a CPU
and :func:`kernels._backend.default_chunk_size` on a GPU or TPU.

Counts, keys and accuracy at scale
----------------------------------
- **Counts.** Up to :data:`MAX_SAMPLES` ``= 2**53`` samples, with JAX's x64 on or off: sample
  indices are carried as two uint32 words and every count the statistics need is a static
  Python int, so nothing wraps at ``2**31`` or ``2**32``. Larger counts raise ``ValueError``.
- **Keys.** Every key is derived with ``jax.random.fold_in`` alone, inside the program, from
  the sample's index, so neither ``chunk_size``, a block of the stream nor the device count
  changes which sample gets which key. Sample ``i < 2**32`` gets ``fold_in(key, i)`` (streams
  drawn before are unchanged). ``fold_in`` reads its datum as uint32, so sample
  ``i = hi * 2**32 + lo`` past ``2**32`` takes two folds, ``fold_in(fold_in(root, hi), lo)``,
  from the root ``fold_in(fold_in(key, 2**32 - 1), 2**32 - 1)``; :func:`reserved_key` hands out
  ``fold_in(fold_in(key, 2**32 - 1), 2**32 - 2 - j)`` for other randomness of a kernel (e.g.
  random restarts). The high word of a sample index stays below ``2**21``, and the kernels
  fold only small data (``split``) or sign-word indices into a sample's own key, so these keys
  never coincide with a sample's key or a key derived from one.
- **Key implementations.** threefry2x32 keys (JAX's default, typed or raw) are vectorised over
  a chunk. "rbg", "unsafe_rbg" and other implementations are accepted with the same
  invariances, but their samples run one at a time (a sequential ``lax.map``) whatever
  ``chunk_size`` is: under ``vmap`` their ``rng_bit_generator`` draws a whole batch from the
  batch's first key, so a vectorised chunk would change the draws with ``chunk_size``.
- **Accuracy.** Each chunk's sums of deviations from a shift (the device's first sample) are
  added to double-word (two-float) accumulators in the samples' dtype (:mod:`kernels._accumulate`),
  and the mean and $M_2$ are formed once at the end from the exact static count. In float32 the
  summation error of a mean over $2^{30}$ samples stays far below 1% of its standard error (the
  mean is returned rounded to float32, a relative error of $6\times10^{-8}$); a plain float32
  running mean stops moving once an update falls below half an ulp.

Blocks of the stream: :class:`kernels.blocks.MonteCarloBlocks` computes the samples
``[start, stop)`` of a kernel's stream (the first :func:`sample_statistics` call traced inside a
private sample window runs from a traced start index and hands its unfinished sums out), so
blocks computed apart merge into the one-call result (:func:`kernels.blocks.merge_states`).

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

Sharded models: when a kernel's parameters (or batch) lie on a user's ``Mesh`` (leaves with a
``NamedSharding``), its samples are split over the mesh axes that no parameter leaf is sharded
on (a ``shard_map`` manual over those axes and automatic over the others, so JAX's partitioner
keeps the parameters' sharding inside each share), or run one share at a time on the whole
mesh when every axis holds parameters. :func:`using_mesh` names the axes explicitly
(``docs/sharded.md``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from kernels import _accumulate as dw
from kernels._backend import auto_chunk_size
from kernels._checks import check_chunk_size, check_key
from kernels._devices import sample_devices, sample_layout, using_devices, using_mesh
from kernels._keys import (
    _WORD,
    MAX_SAMPLES,
    _derive,
    _wide_root,  # noqa: F401  (the tests reach the key derivation through this module)
    _words,
    check_num_samples,
    reserved_key,
    sample_key,
    vmap_safe_key,
)
from kernels.estimate import Estimate

__all__ = [
    "MAX_SAMPLES",
    "SampleStats",
    "check_num_samples",
    "map_chunked",
    "map_samples",
    "num_leading",
    "reserved_key",
    "sample_devices",
    "sample_key",
    "sample_layout",
    "sample_statistics",
    "using_devices",
    "using_mesh",
    "vmap_safe_key",
]


# a loop of more chunks than this runs as a loop of loops (fori_loop counts are int32)
_LOOP_LIMIT = 2**30
_INT32_MAX = np.iinfo(np.int32).max


def num_leading(xs: Any) -> int:
    """Common leading-axis length of the leaves of ``xs``.

    Raises:
      ValueError: if ``xs`` has no leaves or the leaves disagree.
    """
    sizes = {jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(xs)}
    if len(sizes) != 1:
        raise ValueError(f"xs: leaves must share one leading axis length, got {sorted(sizes)}")
    return sizes.pop()


def _resolve_chunk(chunk_size: Any, size: int = 1) -> int | None:
    """Validated ``chunk_size``: ``None``, an int >= 1, or ``"auto"`` resolved.

    ``"auto"`` is ``None`` on a CPU and, on an accelerator,
    :func:`kernels._backend.default_chunk_size` ``("probes", size=size)`` (``size``: elements
    of one sample's input, 1 where unknown).
    """
    value = check_chunk_size(chunk_size, auto="auto")
    if value != "auto":
        return value
    return auto_chunk_size(None, "probes", size=size)


def _row_size(xs: Any) -> int:
    """Elements of one row (leading-axis slice) of ``xs``."""
    return max(1, sum(int(np.prod(jnp.shape(x)[1:])) for x in jax.tree_util.tree_leaves(xs)))


def _chunk_size(chunk_size: Any, size: int = 1) -> int:
    """Validated ``chunk_size`` as an int >= 1 (``None`` means one at a time)."""
    chunk = _resolve_chunk(chunk_size, size)
    return 1 if chunk is None else chunk


def _sequential_keys(xs: Any, key: jax.Array | None) -> bool:
    """Whether ``key`` or a typed key leaf of ``xs`` does not batch (its map must not vmap)."""
    keys = [] if key is None else [check_key(key)]
    keys += [
        leaf
        for leaf in jax.tree_util.tree_leaves(xs)
        if jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key)
    ]
    return any(not vmap_safe_key(k) for k in keys)


def map_chunked(
    fn: Callable[[Any], Any],
    xs: Any,
    *,
    chunk_size: int | Literal["auto"] | None = None,
    key: jax.Array | None = None,
) -> Any:
    """Map ``fn`` over the leading axis of ``xs``, ``chunk_size`` elements vectorised at a time.

    ``chunk_size=None`` (or 1) is a sequential ``lax.map``, one element at a time and
    unbatched (least memory; a single element is a plain call: never a size-1 ``vmap``, which
    on CPU turns a perturbed model's matmuls into slower batched ones); ``chunk_size >=
    len(xs)`` vectorises everything with ``jax.vmap``; anything between is a ``lax.map`` over
    ``vmap``-ed chunks, so peak memory holds ``chunk_size`` elements' intermediates, not all
    of them. Element ``i`` of the output is ``fn(xs[i])`` whatever the chunk size.

    Keys whose draws change under ``vmap`` ("rbg", "unsafe_rbg"; see :func:`vmap_safe_key`)
    make the map sequential whatever ``chunk_size`` is, so the chunk size never changes the
    draws: typed key leaves of ``xs`` are detected, and ``key`` names the key that ``fn``
    folds its draws from when ``xs`` holds indices.

    Args:
      fn: function of one element (a pytree slice of ``xs``).
      xs: pytree whose leaves share a leading axis.
      chunk_size: elements per vectorised batch, an int >= 1 (static); ``None``: one at a
        time; ``"auto"``: ``None`` on a CPU, on a GPU or TPU
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)`` of an element's size.
      key: optional PRNG key that ``fn`` draws from (see above); not passed to ``fn``.

    Returns:
      The stacked outputs, leading axis as ``xs``.

    Raises:
      ValueError: if ``chunk_size`` is not an int >= 1 or None, the leaves of ``xs``
        disagree on their leading axis, or ``key`` is not a PRNG key.

    >>> import jax.numpy as jnp
    >>> map_chunked(lambda x: x**2, jnp.arange(5), chunk_size=2)
    Array([ 0,  1,  4,  9, 16], dtype=int32)
    >>> map_chunked(lambda x: x**2, jnp.arange(5))  # one at a time
    Array([ 0,  1,  4,  9, 16], dtype=int32)
    """
    num = num_leading(xs)
    chunk = _chunk_size(chunk_size, _row_size(xs))
    if _sequential_keys(xs, key):
        chunk = 1
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


@dataclasses.dataclass(frozen=True)
class _Placement:
    """The mesh and its manual axes that a map or statistic splits its samples over.

    ``mesh`` None: no split (one share, traced in place: JAX's partitioner places it along
    the inputs). Otherwise a ``shard_map`` over ``mesh``, manual over ``axes`` (the samples'
    axes) and automatic over the others (the parameters' axes).
    """

    mesh: Any
    axes: tuple[str, ...]
    num_shares: int

    def shard_map(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` on each share of the leading axis, split over ``axes``."""
        spec = PartitionSpec(self.axes)
        return jax.shard_map(
            fn,
            mesh=self.mesh,
            in_specs=spec,
            out_specs=spec,
            axis_names=frozenset(self.axes),
            check_vma=False,
        )


_SEQUENTIAL = _Placement(None, (), 1)


def _placement(devices: Sequence[jax.Device] | None) -> _Placement:
    """Where samples run: the given devices, else the traced kernel's layout, else all devices.

    Given devices (or, when the inputs carry no mesh, :func:`sample_devices`) form a one-axis
    mesh ``"samples"``. When the kernel's inputs lie on a user's mesh
    (:func:`kernels._devices.resolve_layout`), the samples are split over the mesh axes the
    parameters leave free, or run in one share when there are none or they are already manual
    (a kernel called inside another kernel's share).
    """
    if devices is None:
        layout = sample_layout()
        if layout is not None:
            context = jax.sharding.get_abstract_mesh()
            manual = set() if context.empty else set(context.manual_axes)
            if not layout.axes or manual & set(layout.axes) or layout.num_shares <= 1:
                return _SEQUENTIAL
            return _Placement(layout.mesh, layout.axes, layout.num_shares)
        devices = sample_devices()
    devices = list(devices)
    if len(devices) <= 1:
        return _SEQUENTIAL
    return _Placement(Mesh(np.asarray(devices), ("samples",)), ("samples",), len(devices))


def splits_user_mesh() -> bool:
    """Whether samples traced now run in a ``shard_map`` over axes of the user's mesh.

    A product linearised outside such a ``shard_map`` (``jax.linearize``) cannot be evaluated
    inside it in JAX 0.10 (its residuals keep the mesh's automatic axis types): a kernel then
    recomputes its products inside each share instead.
    """
    place = _placement(None)
    return place.mesh is not None and sample_layout() is not None


def map_samples(
    fn: Callable[[Any], Any],
    xs: Any,
    *,
    chunk_size: int | Literal["auto"] | None = None,
    devices: Sequence[jax.Device] | None = None,
    key: jax.Array | None = None,
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
        one at a time; ``"auto"``: ``None`` on a CPU, on a GPU or TPU
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)`` of an element's size.
      devices: devices to shard over; default: inside a kernel whose inputs lie on a mesh, the
        mesh axes its parameters leave free (:func:`using_mesh`), else ``jax.devices()`` (or
        the innermost :func:`using_devices` scope).
      key: optional PRNG key that ``fn`` draws from; an "rbg" / "unsafe_rbg" key makes each
        device's map sequential (see :func:`map_chunked`).

    Returns:
      The stacked outputs, leading axis as ``xs``.

    Raises:
      ValueError: if ``chunk_size`` is not an int >= 1 or None, or ``key`` is not a PRNG key.

    >>> import jax
    >>> keys = jax.random.split(jax.random.key(0), 6)
    >>> map_samples(lambda k: jax.random.uniform(k).shape, keys, chunk_size=4)
    ()
    """
    chunk_size = _resolve_chunk(chunk_size, _row_size(xs))
    place = _placement(devices)
    if _sequential_keys(xs, key):
        chunk_size = None
    if place.mesh is None:
        return map_chunked(fn, xs, chunk_size=chunk_size)
    num = num_leading(xs)
    pad = (-num) % place.num_shares
    if pad:
        xs = jax.tree_util.tree_map(
            lambda leaf: jnp.concatenate([leaf, jnp.repeat(leaf[:1], pad, axis=0)]), xs
        )
    out = place.shard_map(lambda part: map_chunked(fn, part, chunk_size=chunk_size))(xs)
    return jax.tree_util.tree_map(lambda leaf: leaf[:num], out)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleStats:
    r"""Streaming statistics of i.i.d. Monte Carlo samples (elementwise over the sample shape).

    Attributes:
      mean: $\frac1K\sum_k Y_k$, in the samples' dtype.
      m2: $\sum_k (Y_k - \bar Y)^2$ (>= 0), in the samples' dtype.
      num_nonfinite: how many samples had a NaN or infinite element (int32, saturating at
        ``2**31 - 1``; those samples are included in ``mean`` and ``m2``, which are then NaN
        or inf).
      num_samples: $K$ as a static Python int (also :attr:`count`).
    """

    mean: Any
    m2: Any
    num_nonfinite: Any
    num_samples: int = dataclasses.field(metadata={"static": True})

    @property
    def count(self) -> int:
        """$K$, the number of samples (a Python int: exact for any count)."""
        return self.num_samples

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sums:
    r"""Running sums of one device's share: what :func:`sample_statistics` accumulates.

    With shift $s$ (the share's first sample), $d_k = Y_k - s$ over the share's $K$ samples:

    Attributes:
      shift: $s$ (zero for a share without samples).
      s1: $\sum_k d_k$ as a double-word ``(hi, lo)``.
      s2: $\sum_k d_k^2$ as a double-word ``(hi, lo)``.
      num_nonfinite: samples with a NaN/inf element (int32, saturating).
      count: $K$, static.
    """

    shift: Any
    s1: Any
    s2: Any
    num_nonfinite: Any
    count: int = dataclasses.field(metadata={"static": True})


def _saturating_add(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a + b`` for int32 counts in [0, 2**31 - 1], saturating instead of wrapping."""
    return a + jnp.minimum(b, _INT32_MAX - a)


def _shifted(sums: Sums, shift: jax.Array) -> tuple[dw.DoubleWord, dw.DoubleWord]:
    r"""``(s1, s2)`` of ``sums`` re-centred at ``shift`` $t$ (double-word).

    With $e = s - t$: $\sum (d + e) = S_1 + K e$ and $\sum (d + e)^2 = S_2 + 2 e S_1 + K e^2$.
    """
    e = dw.two_sum(sums.shift, -shift)
    k = dw.const(sums.count, e[0].dtype)
    s1 = dw.add(sums.s1, dw.mul(k, e))
    s2 = dw.add(sums.s2, dw.mul(e, dw.add(dw.add(sums.s1, sums.s1), dw.mul(k, e))))
    return s1, s2


def merge_sums(parts: Sequence[Sums]) -> Sums:
    """Add the sums of disjoint shares (re-centred at the first share's shift), in order.

    The counts are static Python ints, so the merged count is exact at any size.
    """
    first = parts[0]
    s1, s2, bad, count = first.s1, first.s2, first.num_nonfinite, first.count
    for part in parts[1:]:
        if part.count == 0:  # a surplus device: nothing to add (its shift is 0)
            bad = _saturating_add(bad, part.num_nonfinite)
            continue
        p1, p2 = _shifted(part, first.shift)
        s1, s2 = dw.add(s1, p1), dw.add(s2, p2)
        bad = _saturating_add(bad, part.num_nonfinite)
        count += part.count
    return Sums(first.shift, s1, s2, bad, count)


def finish_sums(sums: Sums) -> SampleStats:
    r"""Mean and $M_2$ from the sums: $\bar Y = s + S_1/K$, $M_2 = S_2 - S_1 \cdot S_1/K$.

    Formed in double-word arithmetic with the exact $1/K$, then rounded to the dtype ($M_2$
    clipped at 0).
    """
    dtype = sums.shift.dtype
    inv = dw.const(Fraction(1, max(sums.count, 1)), dtype)
    q = dw.mul(sums.s1, inv)  # mean - shift
    mean = dw.value(dw.add(q, dw.of(sums.shift)))
    m2 = dw.value(dw.add(sums.s2, dw.neg(dw.mul(sums.s1, q))))
    m2 = jnp.maximum(m2, jnp.zeros_like(m2))  # rounding must not give a negative M2
    return SampleStats(mean, m2, sums.num_nonfinite, sums.count)


def _chunk_sums(values: jax.Array, valid: jax.Array, carry: tuple[Any, ...]) -> tuple[Any, ...]:
    """Add a chunk of samples (rows of ``values``, ``valid`` ones only) to the running sums."""
    started, shift, s1, s2, bad = carry
    shape = (-1,) + (1,) * (values.ndim - 1)
    mask = valid.reshape(shape)
    # the shift is the share's first sample: deviations from it are small (no cancellation)
    shift = jnp.where(jnp.logical_or(started, ~valid[0]), shift, values[0])
    d = jnp.where(mask, values - shift[None], jnp.zeros((), values.dtype))
    s1 = dw.add_float(s1, jnp.sum(d, axis=0))
    s2 = dw.add_float(s2, jnp.sum(d * d, axis=0))
    finite = jnp.all(jnp.isfinite(values.reshape(values.shape[0], -1)), axis=1)
    chunk_bad = jnp.sum(jnp.logical_and(valid, ~finite)).astype(jnp.int32)
    return jnp.ones((), bool), shift, s1, s2, _saturating_add(bad, chunk_bad)


def _loop(body: Callable[[Any], Any], count: int, carry: Any) -> Any:
    """``body`` applied ``count`` times (a Python int of any size: loops of loops past 2**30)."""
    outer, rest = divmod(count, _LOOP_LIMIT)
    if outer:
        inner = functools.partial(jax.lax.fori_loop, 0, _LOOP_LIMIT, lambda _, c: body(c))
        carry = jax.lax.fori_loop(0, outer, lambda _, c: inner(c), carry)
    if rest:
        carry = jax.lax.fori_loop(0, rest, lambda _, c: body(c), carry)
    return carry


def _share_sums(
    fn: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    start: jax.Array,
    *,
    num: int,
    chunk: int,
    per_device: int,
    out: jax.ShapeDtypeStruct,
    sequential: bool,
) -> tuple[Any, ...]:
    """Sums of the ``per_device`` chunks from sample index ``start`` (uint32 words [2]).

    Samples at indices >= ``num`` are padding; ``start`` may carry the end index instead as
    words 2 and 3 (a block of the stream, whose end is traced).
    """
    num_hi, num_lo = _words(num) if start.shape[0] == 2 else (start[2], start[3])
    offsets = jnp.arange(chunk, dtype=jnp.uint32)
    # a whole stream of at most 2**32 samples: its samples never leave the low word (padding
    # past it may wrap into other samples' keys: it is masked out)
    wide = start.shape[0] != 2 or num > _WORD

    def sample(words: tuple[jax.Array, jax.Array]) -> jax.Array:
        return fn(_derive(key, *words, wide=wide))

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        hi0, lo0, *sums = carry
        lo = lo0 + offsets
        hi = hi0 + (lo < lo0).astype(jnp.uint32)  # carry into the high word
        valid = jnp.logical_or(hi < num_hi, jnp.logical_and(hi == num_hi, lo < num_lo))
        # vectorised over the chunk (a chunk of one is a plain call: no size-1 vmap), or one
        # at a time for keys whose draws change under vmap
        values = map_chunked(sample, (hi, lo), chunk_size=1 if sequential else chunk)
        sums = _chunk_sums(values, valid, tuple(sums))
        lo_next = lo0 + jnp.uint32(chunk)
        hi_next = hi0 + (lo_next < lo0).astype(jnp.uint32)
        return (hi_next, lo_next, *sums)

    zero = jnp.zeros(out.shape, out.dtype)
    init = (start[0], start[1], jnp.zeros((), bool), zero, dw.of(zero), dw.of(zero),
            jnp.zeros((), jnp.int32))  # fmt: skip
    _, _, _, shift, s1, s2, bad = _loop(body, per_device, init)
    return shift, s1, s2, bad


def _sharded(
    run_share: Callable[[jax.Array], tuple[Any, ...]],
    starts: np.ndarray,
    counts: list[int],
    place: _Placement,
) -> Sums:
    """Run ``run_share(start words)`` on each share of ``place``; merge in order.

    One share: ``run_share`` directly, without a ``shard_map``.
    """
    if place.mesh is None:
        return Sums(*run_share(jnp.asarray(starts[0])), count=counts[0])
    parts = place.shard_map(lambda s: jax.tree_util.tree_map(lambda x: x[None], run_share(s[0])))(
        jnp.asarray(starts)
    )
    shares = [
        Sums(*jax.tree_util.tree_map(lambda x, d=d: x[d], parts), count=counts[d])
        for d in range(place.num_shares)
    ]
    return merge_sums(shares)


@dataclasses.dataclass(eq=False)
class _Window:
    """A range of the sample stream that the next :func:`sample_statistics` call computes.

    ``start`` is the first sample's index as uint32 words ``[hi, lo]`` (traced, so blocks of one
    size share a program); the call's ``num_samples`` is the block size, unless ``count`` is set
    (a block of one sample: the kernel is called with its minimum count, and the window computes
    ``count`` samples). With ``replay`` set the
    call computes nothing and returns those sums finished. ``pending`` is cleared by the first
    call, so later calls and calls nested in its ``fn`` run their full stream.
    """

    start: Any
    replay: Sums | None = None
    count: int | None = None
    recorded: Sums | None = None
    pending: bool = True
    token: int = dataclasses.field(default_factory=itertools.count().__next__)


_WINDOW: contextvars.ContextVar[_Window | None] = contextvars.ContextVar(
    "kernels_sample_window", default=None
)


@contextlib.contextmanager
def sample_window(
    start: Any = None, replay: Sums | None = None, count: int | None = None
) -> Iterator[_Window]:
    """Context: the first :func:`sample_statistics` traced inside runs samples from ``start``.

    Private machinery of :mod:`kernels.blocks`: ``start`` is the first index as uint32 words
    ``[hi, lo]`` (a traced array); the call's sums are left in the yielded window's
    ``recorded``. With ``replay`` the call returns those sums finished instead of sampling.
    ``count`` overrides the call's sample count (a block smaller than the kernel's minimum).
    """
    window = _Window(start=start, replay=replay, count=count)
    token = _WINDOW.set(window)
    try:
        yield window
    finally:
        _WINDOW.reset(token)


def window_cache_key() -> int | None:
    """The active sample window's token (None outside one): part of the compilation cache key."""
    window = _WINDOW.get()
    return None if window is None else window.token


def _add_words(start: jax.Array, offset: int) -> jax.Array:
    """64-bit ``start + offset`` for uint32 words ``[hi, lo]`` (traced) and a Python int."""
    off_hi, off_lo = _words(offset)
    lo = start[1] + jnp.uint32(off_lo)
    hi = start[0] + jnp.uint32(off_hi) + (lo < start[1]).astype(jnp.uint32)
    return jnp.stack([hi, lo])


def sample_statistics(
    fn: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    *,
    num_samples: int,
    chunk_size: int | Literal["auto"] | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> SampleStats:
    r"""Mean and $M_2$ of ``fn(sample_key(key, i))`` over ``i < num_samples``, in bounded memory.

    $$\bar Y = \frac1K\sum_{i<K} Y_i,\quad M_2 = \sum_{i<K}(Y_i - \bar Y)^2,\quad
    Y_i = \mathtt{fn}(\mathtt{sample\_key}(\mathtt{key}, i)),$$

    elementwise over the sample's shape; ``sample_key(key, i)`` is ``jax.random.fold_in(key, i)``
    for ``i < 2**32`` (:func:`sample_key`). Sample $i$'s key is derived inside the program from
    its index, so neither the keys nor the values of all samples are ever held: the
    ``ceil(K / chunk_size)`` chunks are split into contiguous shares, one per device; each
    device loops over its share, ``chunk_size`` samples vectorised at a time, adding each
    chunk's sums of $Y_i - s$ and $(Y_i - s)^2$ ($s$ the share's first sample) to double-word
    accumulators; the devices' sums are merged in device order and
    $\bar Y = s + S_1/K$, $M_2 = S_2 - S_1^2/K$ formed once with the exact count. Memory is that
    of one chunk; the result does not depend on ``chunk_size`` or the device count (up to
    floating-point reassociation), and its summation error is about that of float64 sums in
    float32 (see the module docstring). Samples with a NaN/inf element are counted in
    ``num_nonfinite`` (and make ``mean``/``m2`` NaN or inf).

    Args:
      fn: function of one PRNG key returning a floating array of a fixed shape (a sample;
        several quantities can be stacked in a vector).
      key: PRNG key (threefry2x32, typed or raw; "rbg", "unsafe_rbg" and other implementations
        run their samples one at a time, see the module docstring).
      num_samples: $1 \le K \le 2^{53}$. Static.
      chunk_size: samples per vectorised batch, an int >= 1 (static); ``None`` runs them one
        at a time; ``"auto"``: ``None`` on a CPU, on a GPU or TPU
        :func:`kernels._backend.default_chunk_size` ``("probes", ...)`` of size 1 (16 samples).
      devices: devices to spread chunks over; default: inside a kernel whose inputs lie on a
        mesh, the mesh axes its parameters leave free (:func:`using_mesh`), else
        ``jax.devices()`` (or the innermost :func:`using_devices` scope).

    Returns:
      SampleStats(mean, m2, num_nonfinite), elementwise over the sample's shape;
      ``.estimate()`` gives the :class:`~kernels.estimate.Estimate` with its standard error.

    Raises:
      ValueError: if ``num_samples`` is not an int in ``[1, 2**53]``, ``chunk_size`` is not
        an int >= 1, ``key`` is not a PRNG key, or ``fn`` does not return a floating array.

    References:
      Chan, Golub & LeVeque 1979, Stanford report STAN-CS-79-773 (shifted sums, pairwise
      merges); Joldes, Muller & Popescu 2017, doi:10.1145/3121432 (double-word sums).

    >>> import jax, jax.numpy as jnp
    >>> stats = sample_statistics(lambda k: jnp.asarray(2.0), jax.random.key(0), num_samples=5)
    >>> stats.count, float(stats.mean), float(stats.m2), int(stats.num_nonfinite)
    (5, 2.0, 0.0, 0)
    >>> # float32 samples 1 + 2**-12 u, u uniform in {0, 1}: a float32 running mean of 2**16
    >>> # of them drifts by ulps, the double-word sums give the mean of the float32 samples
    >>> coin = lambda k: 1 + 2.0**-12 * jax.random.bernoulli(k).astype(jnp.float32)
    >>> stats = sample_statistics(coin, jax.random.key(1), num_samples=2**16, chunk_size=256)
    >>> stats.mean.dtype, abs(float(stats.mean) - 1 - 2.0**-13) < 1e-5
    (dtype('float32'), True)
    """
    num = check_num_samples(num_samples, "num_samples")
    chunk = min(_chunk_size(chunk_size), num)
    key = check_key(key)
    window = _WINDOW.get()
    if window is not None and window.pending:
        window.pending = False  # the first call only: later and nested calls run in full
        if window.replay is not None:
            if window.replay.count != num:
                raise ValueError(
                    f"num_samples: the state holds {window.replay.count} samples, the kernel "
                    f"asked for {num}"
                )
            return finish_sums(window.replay)
        if window.count is not None:
            requested, num = num, window.count
    else:
        window = None
    num_chunks = -(-num // chunk)
    place = _placement(devices)
    per_device = -(-num_chunks // place.num_shares)
    # every given device takes a share (surplus ones get only padding, masked out), so the
    # program's device set is the same whatever num_samples is; fn is jitted so that its shape
    # probe and the loop share one trace.
    share = per_device * chunk
    starts = np.asarray([_words(d * share) for d in range(place.num_shares)], np.uint32)
    counts = [min(max(num - d * share, 0), share) for d in range(place.num_shares)]
    fn = jax.jit(fn)
    run_share = functools.partial(
        _share_sums, fn, key, num=num, chunk=chunk, per_device=per_device,
        out=_sample_shape(fn, key), sequential=not vmap_safe_key(key),
    )  # fmt: skip
    if window is None:
        return finish_sums(_sharded(run_share, starts, counts, place))
    # a block of the stream: every share moves by the window's (traced) start
    end = _add_words(window.start, num)
    shifted = jnp.stack(
        [
            jnp.concatenate([_add_words(window.start, d * share), end])
            for d in range(place.num_shares)
        ]
    )
    sums = _sharded(run_share, shifted, counts, place)
    window.recorded = sums
    stats = finish_sums(sums)
    if window.count is not None and window.count < requested:
        # the kernel's own result is discarded; give it the count it asked for, so that its
        # checks of the standard error (undefined for one sample) hold
        stats = dataclasses.replace(stats, num_samples=requested)
    return stats


def _sample_shape(fn: Callable[[jax.Array], jax.Array], key: jax.Array) -> Any:
    """Shape and dtype of one sample (an abstract trace of ``fn``); it must be floating."""
    out = jax.eval_shape(fn, key)
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise ValueError(f"fn: must return a floating array, got dtype {out.dtype}")
    return out
