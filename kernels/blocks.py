r"""Blocks of a Monte Carlo kernel's sample stream, and their exact merges.

Sample $i$ of a Monte Carlo kernel has the key :func:`kernels.parallel.sample_key` ``(key, i)``
and therefore one value, whatever call computes it. :class:`MonteCarloBlocks` binds a kernel to
its arguments and computes the samples ``[start, stop)`` of that stream
(:meth:`MonteCarloBlocks.run`) as a :class:`MonteCarloState`: the running sums of the block
(count, shifted sums of $Y_i - s$ and $(Y_i - s)^2$ in double-word precision, the non-finite
count), the ranges of sample indices it covers, the kernel's name and a fingerprint of its
inputs. :func:`merge_states` adds the sums of disjoint blocks (Chan, Golub & LeVeque's pairwise
update, re-centred at the earlier block's shift, in double-word arithmetic), so blocks computed
in any order and of any sizes, in other processes or on other machines, merge into the one-call
result up to floating-point reassociation. :meth:`MonteCarloBlocks.estimate` turns a state into
the :class:`~kernels.estimate.Estimate` the one-call kernel returns for that many samples
(including its extra fields, e.g. the McDiarmid interval of the Rademacher kernels).

A block's start index is a traced argument of its program, so every block of one size runs one
compiled program: a run of any length compiles once per block size. Memory is that of the
kernel's ``chunk_size`` samples, whatever the number of samples. This module is pure JAX and
silent; ``jaxbounds.longrun`` drives blocks to a target precision or a time budget with
progress, interrupts and checkpoints.

The kernels with a block stream: ``rademacher_linear``, ``rademacher_finite``,
``rademacher_search``, ``rademacher_readout_search``, ``hutchinson_trace``, ``hessian_trace``
and ``ggn_trace`` (Hutchinson method), ``mc_fisher_trace``, ``average_sharpness`` and
``sharpness_decomposition`` (its stream is the perturbation pairs; the Hutchinson term of a
fixed ``num_probes`` is recomputed by :meth:`MonteCarloBlocks.estimate`); and the kernels whose
result keeps one output per sample, ``perturbed_hessian_traces`` (each perturbation's trace
estimate and its probe standard error) and ``slq_nodes`` / ``spectral_density`` (each probe's
nodes and weights). Sample $j$ of their blocks is sample $j$ of the one call; their states keep
those outputs in :attr:`MonteCarloState.kept` (memory grows with the samples a state covers, as
the one-call result's does) beside the sums of one scalar per sample (the perturbation's trace
estimate; the probe's $\sum_j \tau_{pj}\theta_{pj} = v_p^\top A v_p/\|v_p\|^2$), and
:func:`merge_states` concatenates them by sample index. Hutch++ (``hutchpp_trace``,
``method="hutchpp"``) has no stream (its sketch depends on its whole budget: use the Hutchinson
method) and ``empirical_fisher_trace`` is exact: both are refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
import types
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import _accumulate as dw
from kernels import parallel
from kernels._jit import compile_once
from kernels.estimate import Estimate
from kernels.parallel import MAX_SAMPLES, SampleStats, Sums

__all__ = ["MonteCarloBlocks", "MonteCarloState", "merge_states"]

# kernel name -> its sample count's name before the num_samples vocabulary
_KERNELS = {
    "rademacher_linear": "num_draws",
    "rademacher_finite": "num_draws",
    "rademacher_search": "num_draws",
    "rademacher_readout_search": "num_draws",
    "hutchinson_trace": "num_probes",
    "hessian_trace": "num_matvecs",
    "ggn_trace": "num_matvecs",
    "mc_fisher_trace": "num_samples",
    "average_sharpness": "num_samples",
    "sharpness_decomposition": "num_samples",
    "perturbed_hessian_traces": "num_samples",
    "slq_nodes": "num_samples",
    "spectral_density": "num_samples",
}
# kernels without a sample stream that blocks could split, and why
_NO_STREAM = {
    "hutchpp_trace": (
        "Hutch++'s sketch of the top subspace depends on its whole budget of products "
        "(num_matvecs), so its samples are no stream of independent draws that blocks could "
        "split; use hutchinson_trace (or method='hutchinson' of hessian_trace / ggn_trace)"
    ),
    "empirical_fisher_trace": "it is exact (a sum over the batch, no Monte Carlo samples)",
}
_HUTCHPP_WHY = (
    "Hutch++'s sketch of the top subspace depends on its whole budget of products, so its "
    "samples cannot be split into blocks; use method='hutchinson'"
)
_COUNT_NAMES = ("num_samples", "num_draws", "num_probes", "num_matvecs")
# options that do not change the result (up to reassociation): not part of the fingerprint
_FREE_OPTIONS = ("chunk_size",)
_MIN_CALL = 2  # the smallest sample count every kernel accepts in one call
_DIGEST_BYTES = 1 << 26  # arrays up to 64 MiB are hashed whole, larger ones by a strided sample


def _raw(kernel: Callable) -> Callable:
    """The kernel without its compile-once wrapper (the block program is the jit boundary)."""
    return getattr(kernel, "__wrapped__", kernel)


def _count_name(kernel: Callable, name: str) -> str:
    """The name of the kernel's sample count: ``num_samples`` where the kernel has it."""
    if (
        _KERNELS[name] == "num_samples"
        or "num_samples" in inspect.signature(_raw(kernel)).parameters
    ):
        return "num_samples"
    return _KERNELS[name]


def _callable_id(fn: Callable) -> str:
    """A name of a callable that is the same in every process (module and qualified name)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None:
        return f"partial({_callable_id(inner)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _digest_array(leaf: Any, h: Any) -> None:
    if jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key):
        h.update(str(jax.random.key_impl(leaf)).encode())
        leaf = jax.random.key_data(leaf)
    arr = np.asarray(leaf)
    h.update(f"{arr.shape}{arr.dtype}".encode())
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.nbytes > _DIGEST_BYTES:
        step = -(-flat.nbytes // _DIGEST_BYTES)
        h.update(np.ascontiguousarray(flat[::step]).tobytes())
        h.update(np.float64(np.sum(flat, dtype=np.float64)).tobytes())
    else:
        h.update(flat.tobytes())


def _stable_repr(value: Any) -> str:
    """``repr`` without memory addresses (the same in every process)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _digest_leaves(tree: Any, h: Any, depth: int = 0) -> None:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h.update(_stable_repr(treedef).encode())
    for leaf in leaves:
        if isinstance(leaf, jax.Array | np.ndarray | np.generic):
            _digest_array(leaf, h)
        elif isinstance(leaf, types.ModuleType):
            h.update(f"module {leaf.__name__}".encode())
        elif isinstance(leaf, type):
            h.update(f"class {_callable_id(leaf)}".encode())
        elif callable(leaf):
            _digest_callable(leaf, h, depth)
        elif depth == 0 or isinstance(leaf, _PLAIN):
            h.update(_stable_repr(leaf).encode())
        else:  # an object reached through a callable: its type (its repr may name its id)
            h.update(f"object {_callable_id(type(leaf))}".encode())


_PLAIN = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


def _digest_code(code: types.CodeType, h: Any) -> None:
    """A code object's bytecode, constants (nested code included) and the names it reads."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(const, h)
        else:
            h.update(f"{type(const).__name__}:{_stable_repr(const)}".encode())


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object (and the code nested in it) may read from its globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _digest_callable(leaf: Callable, h: Any, depth: int) -> None:
    """A callable's identity: name, code, constants, defaults, closure and the globals it reads.

    Arrays it reaches are hashed by content and functions it reads are followed two levels
    deep, so a loss edited from ``* 1.0`` to ``* 3.0``, or reading a global array whose data
    changed, is another problem. Modules and classes count by name.
    """
    h.update(_callable_id(leaf).encode())
    fn = getattr(leaf, "func", leaf)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # a bound method: its function (the instance below)
    code = getattr(fn, "__code__", None)
    if code is not None:
        _digest_code(code, h)
    if depth >= 2:
        return
    captured = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    namespace = getattr(fn, "__globals__", None) or {}
    reads = {} if code is None else {
        name: namespace[name] for name in sorted(_global_names(code)) if name in namespace
    }  # fmt: skip
    defaults = (getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None))
    partial = (getattr(leaf, "args", ()), getattr(leaf, "keywords", {})) if fn is not leaf else None
    owner = getattr(leaf, "__self__", None)
    state = None
    if owner is not None and not isinstance(owner, types.ModuleType) and hasattr(owner, "__dict__"):
        state = dict(vars(owner))
    _digest_leaves((captured, reads, defaults, partial, state), h, depth + 1)


def _fingerprint(name: str, args: tuple, kwargs: dict) -> str:
    """SHA-256 of the kernel's name, options, callables, arrays (with their contents) and key.

    A callable is hashed by its module, qualified name, bytecode, constants, default arguments,
    the cells it closes over and the globals its code reads (arrays by content, functions two
    levels deep, modules by name): see :func:`_digest_callable`. The key is hashed with all
    its words (a 64-bit seed's high word included).
    """
    h = hashlib.sha256(name.encode())
    kept = {k: v for k, v in kwargs.items() if k not in _FREE_OPTIONS}
    _digest_leaves((args, kept), h)
    return h.hexdigest()[:32]


def _check_range(start: Any, stop: Any) -> tuple[int, int]:
    for name, value in (("start", start), ("stop", stop)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name}: expected an int, got {value!r}")
    start, stop = int(start), int(stop)
    if not 0 <= start < stop <= MAX_SAMPLES:
        raise ValueError(
            f"start, stop: expected 0 <= start < stop <= 2**53 sample indices, got "
            f"[{start}, {stop})"
        )
    return start, stop


@compile_once
def _run_window(
    kernel: Callable, start: jax.Array, args: tuple, kwargs: dict, count: int | None = None
) -> Sums:
    """The sums of the kernel's samples ``[start, start + count)`` (one program per count).

    ``count`` (static) is set for a block smaller than the kernel's minimum sample count: the
    kernel is called with its minimum (in ``kwargs``) and the window computes ``count`` samples.
    """
    with parallel.sample_window(start, count=count) as window:
        _raw(kernel)(*args, **kwargs)
    if window.recorded is None:
        raise ValueError("kernel: it draws no Monte Carlo sample stream")
    return window.recorded


@dataclasses.dataclass(frozen=True)
class _Kept:
    """How blocks run a kernel that keeps one output per sample, indexed by the sample.

    ``block(*args, start=, count=, **kwargs)`` returns the block's kept outputs (a tuple of
    arrays with one row per sample), ``stream(kept)`` the values whose sums the state carries
    (one scalar per sample), ``finish(kept, kwargs)`` the kernel's result from the rows of
    ``[0, K)``; ``max_stop`` bounds the sample indices.
    """

    block: Callable
    stream: Callable
    finish: Callable
    max_stop: int
    what: str


def _first_row_values(kept: tuple) -> jax.Array:
    """The stream of ``perturbed_hessian_traces``: each perturbation's trace estimate."""
    return kept[0]


def _rayleigh(kept: tuple) -> jax.Array:
    r"""The stream of SLQ: probe $p$'s $\sum_j 	au_{pj}	heta_{pj} = v_p^\top A v_p/\|v_p\|^2$."""
    nodes, weights = kept
    return jnp.sum(nodes * weights, axis=1)


def _kept_spec(name: str) -> _Kept | None:
    """The :class:`_Kept` of a kernel that keeps per-sample outputs (None for the others)."""
    if name == "perturbed_hessian_traces":
        from kernels import sharpness

        return _Kept(
            block=sharpness._perturbed_block,
            stream=_first_row_values,
            finish=lambda kept, kw: sharpness._perturbed_finish(
                kept[0], kept[1], kw.get("num_probes")
            ),
            max_stop=2**31 - 3,
            what="perturbation",
        )
    if name in ("slq_nodes", "spectral_density"):
        from kernels import curvature

        if name == "slq_nodes":

            def finish(kept: tuple, kw: dict) -> Any:
                return curvature.QuadratureNodes(nodes=kept[0], weights=kept[1])

        else:

            def finish(kept: tuple, kw: dict) -> Any:
                return curvature._density_finish(
                    kept[0], kept[1], kw.get("num_grid", 1024), kw.get("bandwidth")
                )

        return _Kept(
            block=curvature._slq_block,
            stream=_rayleigh,
            finish=finish,
            max_stop=2**31 - 1,
            what="probe",
        )
    return None


def _block_sums(values: jax.Array) -> Sums:
    """Shifted double-word sums of a block's scalar samples (shift: its first sample)."""
    shift = values[0]
    d = values - shift
    zero = dw.of(jnp.zeros((), values.dtype))

    def add(carry: tuple, x: jax.Array) -> tuple:
        s1, s2 = carry
        return (dw.add_float(s1, x), dw.add_float(s2, x * x)), None

    (s1, s2), _ = jax.lax.scan(add, (zero, zero), d)
    bad = jnp.sum(jnp.logical_not(jnp.isfinite(values))).astype(jnp.int32)
    return Sums(shift, s1, s2, bad, values.shape[0])


@compile_once
def _run_kept(
    block: Callable,
    stream: Callable,
    start: jax.Array,
    count: int,
    args: tuple,
    kwargs: dict,
) -> tuple[Sums, tuple]:
    """Samples ``[start, start + count)`` of a kernel that keeps them: sums and kept rows."""
    kept = tuple(block(*args, start=start, count=count, **kwargs))
    return _block_sums(stream(kept)), kept


def _kept_segments(state: MonteCarloState) -> list[tuple[tuple[int, int], tuple]]:
    """``state``'s kept rows split by its ranges: ``[((start, stop), rows), ...]``."""
    out = []
    offset = 0
    for lo, hi in state.ranges:
        out.append(((lo, hi), tuple(x[offset : offset + hi - lo] for x in state.kept)))
        offset += hi - lo
    return out


def _merge_kept(states: Sequence[MonteCarloState]) -> tuple | None:
    """The kept rows of ``states`` (disjoint ranges) concatenated in order of sample index."""
    kept = [s.kept is not None for s in states]
    if not any(kept):
        return None
    if not all(kept):
        raise ValueError("states: some states keep per-sample outputs and others do not")
    segments = sorted((seg for s in states for seg in _kept_segments(s)), key=lambda t: t[0])
    parts = list(zip(*(rows for _, rows in segments), strict=True))
    return tuple(jnp.concatenate(p) if len(p) > 1 else p[0] for p in parts)


@compile_once
def _replay(kernel: Callable, sums: Sums, args: tuple, kwargs: dict) -> Any:
    """The kernel's result with its sample stream's statistics taken from ``sums``."""
    with parallel.sample_window(replay=sums):
        return _raw(kernel)(*args, **kwargs)


def _merge_ranges(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo < out[-1][1]:
            raise ValueError(
                f"states: sample ranges overlap ([{out[-1][0]}, {out[-1][1]}) and [{lo}, {hi})): "
                "merging would count samples twice"
            )
        if out and lo == out[-1][1]:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


@jax.jit
def _merge_pair(a: tuple, b: tuple, kb: dw.DoubleWord) -> tuple:
    r"""Sums of ``a`` plus those of ``b`` (``kb`` samples) re-centred at ``a``'s shift.

    With $e = s_b - s_a$: $S_1 = S_1^a + S_1^b + k_b e$, $S_2 = S_2^a + S_2^b + 2 e S_1^b +
    k_b e^2$ (double-word; the count is a traced double-word, so one program serves all counts).
    """
    a_shift, a1, a2, a_bad = a
    b_shift, b1, b2, b_bad = b
    e = dw.two_sum(b_shift, -a_shift)
    p1 = dw.add(b1, dw.mul(kb, e))
    p2 = dw.add(b2, dw.mul(e, dw.add(dw.add(b1, b1), dw.mul(kb, e))))
    bad = a_bad + jnp.minimum(b_bad, np.iinfo(np.int32).max - a_bad)
    return a_shift, dw.add(a1, p1), dw.add(a2, p2), bad


@jax.jit
def _finish(shift: jax.Array, s1: dw.DoubleWord, s2: dw.DoubleWord, inv: dw.DoubleWord) -> tuple:
    r"""$\bar Y = s + S_1/K$ and $M_2 = S_2 - S_1 \cdot S_1/K$ (``inv`` the double-word $1/K$)."""
    q = dw.mul(s1, inv)
    mean = dw.value(dw.add(q, dw.of(shift)))
    m2 = dw.value(dw.add(s2, dw.neg(dw.mul(s1, q))))
    return mean, jnp.maximum(m2, jnp.zeros_like(m2))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MonteCarloState:
    r"""Mergeable statistics of some blocks of a kernel's sample stream.

    With $s$ the shift (the first sample of the earliest block) and $d_i = Y_i - s$ over the
    $K$ samples covered:

    Attributes:
      shift: $s$, in the samples' dtype and shape.
      s1: $\sum_i d_i$ as a double-word ``(hi, lo)`` pair.
      s2: $\sum_i d_i^2$ as a double-word ``(hi, lo)`` pair.
      num_nonfinite: samples with a NaN/inf element (int32, saturating).
      count: $K$ (static).
      ranges: the sample index ranges ``((start, stop), ...)`` covered, sorted and disjoint
        (static).
      kernel: the kernel's name (static).
      fingerprint: hash of the kernel's name, options, input shapes/dtypes and contents and
        key (static): states of different problems never merge.
      kept: for a kernel whose result keeps one output per sample (``perturbed_hessian_traces``'
        per-perturbation traces, SLQ's per-probe nodes and weights), those outputs as a tuple of
        arrays with one row per sample covered, in order of sample index (so its memory grows
        with the samples covered, as the one-call result's does); ``None`` for the others.
    """

    shift: Any
    s1: Any
    s2: Any
    num_nonfinite: Any
    count: int = dataclasses.field(metadata={"static": True})
    ranges: tuple[tuple[int, int], ...] = dataclasses.field(metadata={"static": True})
    kernel: str = dataclasses.field(metadata={"static": True})
    fingerprint: str = dataclasses.field(metadata={"static": True})
    kept: Any = None

    def sums(self) -> Sums:
        """The running sums as :class:`kernels.parallel.Sums`."""
        return Sums(self.shift, self.s1, self.s2, self.num_nonfinite, self.count)

    def stats(self) -> SampleStats:
        r"""Mean and $M_2 = S_2 - S_1^2/K$ of the samples covered (elementwise)."""
        dtype = np.asarray(self.shift).dtype
        inv = dw.const(Fraction(1, max(self.count, 1)), dtype)
        mean, m2 = _finish(self.shift, self.s1, self.s2, inv)
        return SampleStats(mean, m2, self.num_nonfinite, self.count)

    @property
    def mean(self) -> jax.Array:
        """The mean of the samples covered (elementwise over the sample's shape)."""
        return self.stats().mean

    @property
    def stderr(self) -> jax.Array:
        r"""$\sqrt{M_2 / (K (K - 1))}$, the standard error of :attr:`mean` (NaN for K = 1)."""
        return self.stats().estimate().stderr

    @property
    def next_start(self) -> int:
        """The first index after the covered prefix ``[0, n)`` (0 if sample 0 is not covered)."""
        return self.ranges[0][1] if self.ranges[0][0] == 0 else 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (floats exact: float32 and float64 values round-trip)."""

        def enc(x: Any) -> Any:
            return np.asarray(x, np.float64).tolist()

        dtype = str(np.asarray(self.shift).dtype)
        return {
            "kernel": self.kernel,
            "fingerprint": self.fingerprint,
            "count": self.count,
            "ranges": [list(r) for r in self.ranges],
            "dtype": dtype,
            "shape": list(np.shape(self.shift)),
            "shift": enc(self.shift),
            "s1": [enc(self.s1[0]), enc(self.s1[1])],
            "s2": [enc(self.s2[0]), enc(self.s2[1])],
            "num_nonfinite": int(self.num_nonfinite),
            "kept": None
            if self.kept is None
            else [
                {"dtype": str(np.asarray(x).dtype), "shape": list(np.shape(x)), "values": enc(x)}
                for x in self.kept
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MonteCarloState:
        """The state written by :meth:`to_json` (a dict, or its JSON text).

        Raises:
          ValueError: if ``data`` is not such a record.
        """
        if isinstance(data, str):
            data = json.loads(data)
        try:
            dtype = np.dtype(data["dtype"])
            shape = tuple(data["shape"])

            def dec(x: Any) -> jax.Array:
                return jnp.asarray(np.asarray(x, np.float64).astype(dtype).reshape(shape))

            ranges = tuple((int(a), int(b)) for a, b in data["ranges"])
            count = int(data["count"])
            kept = data.get("kept")
            if kept is not None:
                kept = tuple(
                    jnp.asarray(
                        np.asarray(k["values"], np.float64)
                        .astype(np.dtype(k["dtype"]))
                        .reshape(tuple(k["shape"]))
                    )
                    for k in kept
                )
                if any(np.shape(x)[:1] != (count,) for x in kept):
                    raise ValueError("the kept outputs do not have one row per sample")
            state = cls(
                shift=dec(data["shift"]),
                s1=(dec(data["s1"][0]), dec(data["s1"][1])),
                s2=(dec(data["s2"][0]), dec(data["s2"][1])),
                num_nonfinite=jnp.asarray(int(data["num_nonfinite"]), jnp.int32),
                count=count,
                ranges=ranges,
                kernel=str(data["kernel"]),
                fingerprint=str(data["fingerprint"]),
                kept=kept,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"data: not a Monte Carlo state record ({err})") from None
        if sum(b - a for a, b in ranges) != count or _merge_ranges(ranges) != ranges:
            raise ValueError("data: the state's ranges do not match its count")
        return state


def merge_states(*states: MonteCarloState) -> MonteCarloState:
    r"""Merge states of disjoint blocks of one problem's stream (Chan et al.'s pairwise update).

    The sums are re-centred at the earliest block's shift and added in double-word arithmetic
    ($S_1 + K e$, $S_2 + 2 e S_1 + K e^2$ with $e$ the difference of shifts); states are taken in
    order of their first sample index, so the result does not depend on the argument order, and
    merged blocks equal the one-call result up to floating-point reassociation.

    Args:
      *states: one or more states of the same kernel, inputs and key, covering disjoint ranges.

    Returns:
      The merged state.

    Raises:
      ValueError: if no state is given, the states come from another kernel or another problem
        (inputs, options or key: their fingerprints differ), or their ranges overlap.

    References:
      Chan, Golub & LeVeque 1979, Stanford report STAN-CS-79-773.
    """
    if not states:
        raise ValueError("states: expected at least one MonteCarloState")
    for s in states:
        if not isinstance(s, MonteCarloState):
            raise ValueError(f"states: expected MonteCarloState objects, got {type(s).__name__}")
    first = states[0]
    for s in states[1:]:
        if s.kernel != first.kernel:
            raise ValueError(
                f"states: a state of kernel {s.kernel!r} cannot merge with one of {first.kernel!r}"
            )
        if s.fingerprint != first.fingerprint:
            raise ValueError(
                f"states: the states come from different problems of {first.kernel!r} (other "
                f"inputs, options or key: fingerprints {first.fingerprint} and {s.fingerprint})"
            )
    ordered = sorted(states, key=lambda s: s.ranges[0])
    ranges = _merge_ranges([r for s in ordered for r in s.ranges])
    if len(ordered) == 1:
        return first
    kept = _merge_kept(ordered)
    dtype = np.asarray(first.shift).dtype
    acc = (ordered[0].shift, ordered[0].s1, ordered[0].s2, ordered[0].num_nonfinite)
    for s in ordered[1:]:
        kb = dw.const(s.count, dtype)
        acc = _merge_pair(acc, (s.shift, s.s1, s.s2, s.num_nonfinite), kb)
    return MonteCarloState(
        shift=acc[0],
        s1=acc[1],
        s2=acc[2],
        num_nonfinite=acc[3],
        count=sum(s.count for s in ordered),
        ranges=ranges,
        kernel=first.kernel,
        fingerprint=first.fingerprint,
        kept=kept,
    )


class MonteCarloBlocks:
    r"""A Monte Carlo kernel bound to its arguments, computed block by block.

    ``MonteCarloBlocks(kernel, *args, **kwargs)`` takes the kernel's arguments without its
    sample count ``num_samples`` (nor its deprecated names ``num_draws``, ``num_probes``,
    ``num_matvecs``). :meth:`run` computes samples ``[start, stop)`` of the
    stream that ``kernel(*args, num_samples=n, **kwargs)`` averages over ``[0, n)``;
    :func:`merge_states` merges blocks; :meth:`estimate` gives the kernel's
    :class:`~kernels.estimate.Estimate` for the samples a state covers. The sample of index
    $i$ is the same in every block, so merging the blocks of ``[0, n)`` gives the one-call
    result up to reassociation.

    Args:
      kernel: one of the kernels listed in the module docstring.
      *args: its positional arguments (functions, parameters, data, key).
      **kwargs: its keyword options, without the sample count.

    Raises:
      ValueError: for a kernel without a block stream (``hutchpp_trace``,
        ``empirical_fisher_trace``: the message says why), a sample count among ``kwargs``,
        ``method="hutchpp"``, or (kernels that keep per-sample outputs) an option the kernel
        does not take.

    >>> import jax, jax.numpy as jnp, kernels
    >>> x = jnp.eye(4)
    >>> blocks = MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(0), norm=2,
    ...                           radius=1.0, delta=None)
    >>> state = merge_states(blocks.run(64, 128), blocks.run(0, 64))  # any order
    >>> state.count, state.ranges
    (128, ((0, 128),))
    >>> est = blocks.estimate(state)  # rademacher_linear(..., num_samples=128), sample by sample
    >>> one = kernels.rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, delta=None,
    ...                                 num_samples=128)
    >>> bool(jnp.allclose(est.mean, one.mean, rtol=1e-6))
    True
    """

    def __init__(self, kernel: Callable, *args: Any, **kwargs: Any) -> None:
        name = getattr(_raw(kernel), "__name__", repr(kernel))
        if name in _NO_STREAM:
            raise ValueError(f"kernel: {name!r} has no block stream: {_NO_STREAM[name]}")
        if name not in _KERNELS:
            raise ValueError(
                f"kernel: {name!r} has no block stream; expected one of {sorted(_KERNELS)}"
            )
        count = _count_name(kernel, name)
        given = [k for k in _COUNT_NAMES if k in kwargs]
        if name in ("sharpness_decomposition", "perturbed_hessian_traces"):
            given = [k for k in given if k != "num_probes"]
        if given:
            raise ValueError(
                f"{given[0]}: the sample count is set per block (MonteCarloBlocks.run), not "
                "passed to MonteCarloBlocks"
            )
        if kwargs.get("method", "hutchinson") != "hutchinson":
            raise ValueError(
                f"method: blocks need the Hutchinson method, got {kwargs['method']!r}: "
                f"{_HUTCHPP_WHY}"
            )
        self._kept = _kept_spec(name)
        if self._kept is not None:
            known = inspect.signature(_raw(kernel)).parameters
            for option in kwargs:
                if option not in known:
                    raise ValueError(f"{option}: not an option of {name}")
        self.kernel = kernel
        self.name = name
        self.count_name = count
        self.args = args
        self.kwargs = kwargs
        self.fingerprint = _fingerprint(name, args, kwargs)

    def _call_kwargs(self, count: int) -> dict[str, Any]:
        return {**self.kwargs, self.count_name: count}

    def run(self, start: int, stop: int) -> MonteCarloState:
        """Compute samples ``[start, stop)`` of the stream (one program per block size).

        Raises:
          ValueError: if not ``0 <= start < stop <= 2**53`` (``stop <= 2**31 - 3`` for
            ``perturbed_hessian_traces``, ``2**31 - 1`` for SLQ, whose outputs are kept), or as
            the kernel for its inputs (runtime checks of the block's samples included).
        """
        start, stop = _check_range(start, stop)
        if self._kept is not None:
            return self._run_kept_block(start, stop)
        words = jnp.asarray(np.asarray([start // 2**32, start % 2**32], np.uint32))
        count = stop - start
        if count < _MIN_CALL:  # the kernel refuses a single sample; the window runs one
            sums = _run_window(
                self.kernel, words, self.args, self._call_kwargs(_MIN_CALL), count=count
            )
        else:
            sums = _run_window(self.kernel, words, self.args, self._call_kwargs(count))
        return MonteCarloState(
            shift=sums.shift,
            s1=sums.s1,
            s2=sums.s2,
            num_nonfinite=sums.num_nonfinite,
            count=sums.count,
            ranges=((start, stop),),
            kernel=self.name,
            fingerprint=self.fingerprint,
        )

    def _run_kept_block(self, start: int, stop: int) -> MonteCarloState:
        spec = self._kept
        if stop > spec.max_stop:
            raise ValueError(
                f"stop: at most {spec.max_stop} for {self.name} (every {spec.what}'s output is "
                f"kept, one row each), got {stop}"
            )
        first = jnp.asarray(np.uint32(start))
        sums, kept = _run_kept(spec.block, spec.stream, first, stop - start, self.args, self.kwargs)
        return MonteCarloState(
            shift=sums.shift,
            s1=sums.s1,
            s2=sums.s2,
            num_nonfinite=sums.num_nonfinite,
            count=stop - start,
            ranges=((start, stop),),
            kernel=self.name,
            fingerprint=self.fingerprint,
            kept=kept,
        )

    def run_range(
        self,
        start: int,
        stop: int,
        *,
        block_size: int,
        callback: Callable[[MonteCarloState], None] | None = None,
    ) -> MonteCarloState:
        """Compute samples ``[start, stop)`` in blocks of ``block_size`` and merge them.

        ``callback(state)`` is called after each block with the state so far: the kernels' silent
        progress hook (``jaxbounds.longrun`` adds stopping rules, checkpoints and a progress bar).

        Raises:
          ValueError: as :meth:`run`, or for a ``block_size`` that is not an int >= 1.

        >>> import jax, jax.numpy as jnp, kernels
        >>> blocks = MonteCarloBlocks(kernels.hutchinson_trace, lambda v: 3.0 * v, jnp.zeros(4),
        ...                           jax.random.key(0))
        >>> seen = []
        >>> state = blocks.run_range(0, 10, block_size=4,
        ...                          callback=lambda s: seen.append(s.count))
        >>> seen, float(state.mean)  # tr(3 I) = 12 exactly for every probe
        ([4, 8, 10], 12.0)
        """
        start, stop = _check_range(start, stop)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: expected an int >= 1, got {block_size!r}")
        state = None
        for lo in range(start, stop, block_size):
            block = self.run(lo, min(lo + block_size, stop))
            state = block if state is None else merge_states(state, block)
            if callback is not None:
                callback(state)
        return state

    def check(self, state: MonteCarloState) -> MonteCarloState:
        """Return ``state`` if it belongs to this problem; else a ValueError naming the mismatch."""
        if not isinstance(state, MonteCarloState):
            raise ValueError(f"state: expected a MonteCarloState, got {type(state).__name__}")
        if state.kernel != self.name:
            raise ValueError(f"state: a state of kernel {state.kernel!r}, not of {self.name!r}")
        if state.fingerprint != self.fingerprint:
            raise ValueError(
                f"state: it comes from another problem of {self.name!r} (other inputs, options "
                f"or key: fingerprint {state.fingerprint}, this one {self.fingerprint})"
            )
        return state

    def estimate(self, state: MonteCarloState) -> Any:
        """The kernel's result (an Estimate or the kernel's result type) for ``state``'s samples.

        Equal, up to reassociation, to the one-call kernel with ``num_samples = state.count``
        when the state covers ``[0, state.count)``. For a kernel that keeps per-sample outputs
        the result is built from :attr:`MonteCarloState.kept` (rows in order of sample index).

        Raises:
          ValueError: if ``state`` belongs to another problem, or as the kernel for its count
            (``perturbed_hessian_traces`` needs at least 2 perturbations).
        """
        self.check(state)
        if self._kept is not None:
            if state.kept is None:
                raise ValueError(f"state: it holds no per-sample outputs of {self.name}")
            return self._kept.finish(state.kept, self.kwargs)
        return _replay(self.kernel, state.sums(), self.args, self._call_kwargs(state.count))


def stream_estimate(state: MonteCarloState, index: int = 0) -> Estimate:
    """Mean and standard error of element ``index`` of the stream (flattened), for stopping."""
    est = state.stats().estimate()
    mean = jnp.reshape(est.mean, (-1,))[index]
    stderr = jnp.reshape(est.stderr, (-1,))[index]
    return Estimate(mean=mean, stderr=stderr, num_samples=state.count)
