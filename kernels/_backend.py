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
  budget stated in gradients: :func:`gradient_bytes`, :func:`sample_bytes`,
  :func:`memory_budget` and :func:`budgeted_chunk_size` hold the rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from kernels._devices import sample_devices

__all__ = [
    "CHUNK_DEFAULTS",
    "GRADIENT_MULTIPLES",
    "HIGHEST",
    "UNCONSTRAINED_BYTES",
    "auto_chunk_size",
    "budgeted_chunk_size",
    "chunk_memory_budget",
    "default_chunk_size",
    "full_precision",
    "gradient_bytes",
    "is_accelerator",
    "memory_budget",
    "program_bytes",
    "reduced_precision_matmuls",
    "sample_bytes",
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


# --------------------------------------------------------------------------- memory budget
#
# chunk_size="auto" of the loss kernels and Hutchinson's mode="auto" keep a kernel's planned
# temporaries within a multiple of one gradient's (issue 34). Everything is estimated by
# tracing only (``jax.eval_shape`` / ``jax.make_jaxpr``: no compilation), so it works eagerly
# and under a user's ``jit`` alike. Calibrated against XLA's plans
# (``compiled.memory_analysis().temp_size_in_bytes``) on the CPU, float32, 16 samples:
#
#   model (parameters)         gradient         forms probe      linearised product  sample
#                              est. / XLA       est. / XLA       est. / XLA          est. / XLA
#   bench/scale.py QUICK (135k) 3.2 / 4.1 MB    6.5 / 2.7 MB     16.5 / 16.4 MB      2.6 / 2.1 MB
#   reference (53,968)          91.8 / 73.8 MB  275 / 256 MB     346 / 274 MB        19 / 11 MB
#   decoder (4,240,896)         100 / 128 MB    132 / 69 MB      515 / 478 MB        78 / 68 MB
#
# (forms probe and sample: a chunk's plan per added sample, one at a time for the reference
# model's forms; product: probes one at a time, the whole plan; the decoder is
# bench/scale.py's build_jax(Config(4096, 256, 4, 1024, 4, 128, 4, 1)).)

GRADIENT_MULTIPLES: dict[str, float] = {
    # Hutchinson: hessian_trace, ggn_trace and the Gauss-Newton / Fisher operators,
    # hutchinson_trace on any loss operator
    "hutchinson": 1.5,
    # perturbed-loss samples: average_sharpness and the sharpness kernels' chunk_size="auto"
    "sharpness": 1.3,
}
"""The budget of ``chunk_size="auto"`` per kind of kernel, in gradients' temporaries."""

UNCONSTRAINED_BYTES = 128 << 20
"""Below this many bytes (128 MiB) a chunk's memory is not constrained by the gradient's."""

# a quadratic form's plan per probe over the bytes of all the values its program computes
# (its jaxpr's equations, no buffer reused): 0.08 (QUICK), 0.19 (reference), 0.10 (decoder)
_FORMS_FRACTION = 0.2
# a linearised product's plan over the bytes of its residuals: 1.59 (QUICK), 1.27, 1.49
_PRODUCT_FACTOR = 1.6
# a perturbed-loss sample: its parameter-sized copies (the perturbation, the perturbed
# parameters and their tangents in the program: 4.0 in the decoder's plan) plus this fraction of
# the bytes of the values the loss's program computes (0.06 in the reference model's plan), on
# top of 2 parameter-sized copies per chunk
_SAMPLE_COPIES = 4
_SAMPLE_FRACTION = 0.1
_CHUNK_COPIES = 2


def gradient_bytes(loss: Callable[[Any], Any], params: Any) -> int:
    """Estimated temporaries of one gradient of ``loss`` at ``params``, traced only.

    The bytes of the residuals of ``jax.vjp(loss, params)`` that the forward pass computes
    (the values the backward pass reads, not ``params`` or the data ``loss`` closes over),
    from ``jax.make_jaxpr``: nothing is compiled or run, and ``loss`` may close over tracers
    of an outer ``jit``. XLA's plan for ``jax.value_and_grad`` measured 0.80x (reference
    model) to 1.28x (4.2M decoder) of it.

    Args:
      loss: ``params -> scalar``.
      params: the pytree the gradient is taken in.

    Returns:
      Bytes, an int >= 0.

    >>> import jax.numpy as jnp
    >>> x = jnp.ones((8, 3))  # the backward pass of sin(x @ w) reads cos(x @ w): 8 floats
    >>> gradient_bytes(lambda w: jnp.sum(jnp.sin(x @ w)), jnp.ones((3,)))
    32
    """
    closed = jax.make_jaxpr(lambda p: jax.vjp(loss, p)[1])(params)
    given = {id(v) for v in (*closed.jaxpr.invars, *closed.jaxpr.constvars)}
    return tree_bytes([v.aval for v in closed.jaxpr.outvars if id(v) not in given])


def _jaxpr_bytes(jaxpr: Any) -> int:
    """Bytes of the values a jaxpr's equations compute (a sub-program's counted once)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += tree_bytes([v.aval for v in eqn.outvars])
        subs = []
        for param in eqn.params.values():
            for item in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(item, "jaxpr", item)  # a ClosedJaxpr's jaxpr, or a Jaxpr
                if hasattr(inner, "eqns"):
                    subs.append(inner)
        total += max((_jaxpr_bytes(sub) for sub in subs), default=0)
    return total


def program_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Bytes of every value ``fn(*args)``'s program computes, none reused (traced only).

    A loop's or a sub-program's body counts once. An upper bound on what one call holds at a
    time; :func:`sample_bytes` scales it by calibrated fractions.
    """
    return _jaxpr_bytes(jax.make_jaxpr(fn)(*args).jaxpr)


def sample_bytes(kind: str, *, params: Any, program: int = 0, residuals: int = 0) -> int:
    """Estimated bytes one Monte Carlo sample of ``kind`` adds to a chunk (traced sizes).

    - ``"forms"``: a Hutchinson probe by forward over forward mode: ``0.2 * program``, the
      bytes of the quadratic form's values (:func:`program_bytes`).
    - ``"products"``: a linearised product, probes one at a time: ``1.6 * residuals``, the
      linearisation's residual bytes (its whole cost: it is paid once, not per probe).
    - ``"perturbations"``: a perturbed-loss sample: 4 parameter-sized copies plus
      ``0.1 * program``, the bytes of the loss's values.

    The factors cover XLA's plans on bench/scale.py's QUICK decoder, the 54k reference model
    and a 4.2M decoder (the calibration table in this module's source), so an estimate errs
    on the side of memory.

    Args:
      kind: ``"forms"``, ``"products"`` or ``"perturbations"``.
      params: the parameters (a pytree; only shapes and dtypes are read).
      program: :func:`program_bytes` of one sample's program (``"forms"``, ``"perturbations"``).
      residuals: the linearisation's residual bytes (``"products"``).

    Returns:
      Bytes, an int >= 0.

    Raises:
      ValueError: for an unknown ``kind``.
    """
    if kind == "forms":
        return int(_FORMS_FRACTION * program)
    if kind == "products":
        return int(_PRODUCT_FACTOR * residuals)
    if kind == "perturbations":
        return _SAMPLE_COPIES * tree_bytes(params) + int(_SAMPLE_FRACTION * program)
    raise ValueError(f"kind: expected 'forms', 'products' or 'perturbations', got {kind!r}")


def memory_budget(kind: str, gradient: int) -> int:
    """Bytes a kernel of ``kind`` may plan for its samples, given a gradient's ``gradient``.

    ``min(chunk_memory_budget(), max(UNCONSTRAINED_BYTES, GRADIENT_MULTIPLES[kind] *
    gradient))``: a multiple of one gradient's temporaries (1.5 for Hutchinson, 1.3 for
    perturbed-loss samples), never constrained below 128 MiB (tiny models keep vectorised
    chunks and linearised products), never above the device's chunk budget.

    Args:
      kind: a key of :data:`GRADIENT_MULTIPLES`.
      gradient: :func:`gradient_bytes` of the kernel's loss.

    Raises:
      ValueError: for an unknown ``kind``.

    >>> memory_budget("hutchinson", 200 << 20) == 300 << 20  # a device of 4.7 GiB or more
    True
    >>> memory_budget("sharpness", 1 << 20) == UNCONSTRAINED_BYTES
    True
    """
    if kind not in GRADIENT_MULTIPLES:
        raise ValueError(f"kind: expected one of {sorted(GRADIENT_MULTIPLES)}, got {kind!r}")
    budget = max(UNCONSTRAINED_BYTES, int(GRADIENT_MULTIPLES[kind] * gradient))
    return min(chunk_memory_budget(), budget)


def budgeted_chunk_size(
    cpu: int | None,
    *,
    per_sample: int,
    budget: int,
    cap: int,
    fixed: int = 0,
    accelerator: bool | None = None,
) -> int | None:
    """``chunk_size="auto"`` under a memory budget: the CPU default, or the largest that fits.

    On a CPU ``cpu`` (the kernel's CPU default, unchanged). On an accelerator the largest power
    of two ``c <= cap`` with ``fixed + c * per_sample <= budget``; ``None`` (one sample at a
    time) when not even two fit.

    Args:
      cpu: the kernel's CPU default (``None`` or an int >= 1).
      per_sample: bytes one sample adds (:func:`sample_bytes`).
      budget: bytes allowed (:func:`memory_budget`).
      cap: the largest chunk worth vectorising on an accelerator.
      fixed: bytes a chunk holds whatever its size.
      accelerator: whether the backend is an accelerator (``None``: :func:`is_accelerator`).

    >>> chunk = budgeted_chunk_size(None, per_sample=10, budget=100, cap=16)
    >>> chunk == (8 if is_accelerator() else None)  # 8 x 10 bytes fit 100, 16 x 10 do not
    True
    """
    if not (is_accelerator() if accelerator is None else accelerator):
        return cpu
    chunk = cap
    while chunk > 1 and fixed + chunk * per_sample > budget:
        chunk //= 2
    return chunk if chunk >= 2 else None
