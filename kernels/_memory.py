"""Memory estimates of the kernels, in one place: every chunk and product budget.

``chunk_size="auto"`` of the loss kernels (Hutchinson on a loss operator, the sharpness
kernels) and the ``mode="auto"`` of Hutchinson and of the sharpness decomposition keep a
kernel's planned temporaries within a multiple of one gradient's. Everything here is estimated
from traced programs through public JAX (``jax.make_jaxpr``, ``jax.closure_convert``,
``jax.extend.core.jaxprs_in_params``): nothing is compiled or run, so it works eagerly and
under a user's ``jit`` alike.

- What a program needs: :func:`gradient_bytes` (one gradient's residuals),
  :func:`linear_residual_bytes` (a linearised product's, from the function itself),
  :func:`program_bytes` (every value a program computes) and :func:`sample_bytes` (one Monte
  Carlo sample, calibrated against XLA).
- What a kernel may plan: :func:`memory_budget` and :func:`budgeted_chunk_size`.
- The kernels' rules: :func:`probe_chunk` and :func:`hutchinson_chunk` (Hutchinson's probes),
  :func:`perturbation_chunk` (the sharpness kernels' samples), :func:`products_fit`
  (whether ``mode="auto"`` takes a linearised product) and :func:`linearisation_fits`
  (whether Lanczos's ``linearize="auto"`` keeps the linearisation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend

from kernels._backend import (
    auto_chunk_size,
    chunk_memory_budget,
    is_accelerator,
    tree_bytes,
    tree_size,
)
from kernels._checks import check_chunk_size
from kernels._operators import _LossOperator

__all__ = [
    "GRADIENT_MULTIPLES",
    "PRODUCT_MEMORY_MARGIN",
    "PRODUCT_RESIDUAL_BYTES",
    "UNCONSTRAINED_BYTES",
    "budgeted_chunk_size",
    "gradient_bytes",
    "hutchinson_chunk",
    "linear_residual_bytes",
    "linearisation_fits",
    "memory_budget",
    "perturbation_chunk",
    "probe_chunk",
    "products_fit",
    "program_bytes",
    "sample_bytes",
]

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
#   reference (53,968)          91.2 / 73.8 MB  275 / 256 MB     345 / 274 MB        19 / 11 MB
#   decoder (4,240,896)         100 / 128 MB    132 / 69 MB      514 / 478 MB        78 / 68 MB
#
# (forms probe and sample: a chunk's plan per added sample, one at a time for the reference
# model's forms; product: probes one at a time, the whole plan; the decoder is
# bench/scale.py's build_jax(Config(4096, 256, 4, 1024, 4, 128, 4, 1)).)
#
# At scale (bench/auto_budget.py: the reference decoders, bfloat16 weights cast to float32,
# FSDP over 8 CPU devices, batch 8 x 1024), in gradients (estimates: global bytes; XLA's plans:
# temporaries per device):
#
#   decoder (parameters)   gradient est. / XLA       forms probe        linearised product
#                          GiB         GiB/device    est. / XLA         est. / XLA
#   1B (1,235,814,400)     6.08 / 4.03               7.55x / 1.89x      23.5x / 4.42x
#   8B (8,030,261,248)     8.29 / 8.54               6.15x / 2.69x      45.8x / 6.53x
#
# Neither mode fits the budget (capped at the device's 1 GiB chunk budget) and the product
# plans 2.3-2.4 times the quadratic form: mode="auto" takes quadratic forms (its residuals
# also pass PRODUCT_RESIDUAL_BYTES), chunk_size="auto" one probe at a time.

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
    (the values the backward pass reads, as ``jax.closure_convert`` hoists them from the vjp
    function; not ``params`` or the data ``loss`` closes over), from ``jax.make_jaxpr``:
    nothing is compiled or run, and ``loss`` may close over tracers of an outer ``jit``.
    XLA's plan for ``jax.value_and_grad`` measured 0.81x (reference model) to 1.28x (4.2M
    decoder) of it.

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

    def residuals(p: Any) -> Any:
        out, vjp_fn = jax.vjp(loss, p)
        return jax.closure_convert(vjp_fn, out)[1]

    return _computed_bytes(residuals, params)


def linear_residual_bytes(linear: Callable, tangent: Any) -> int:
    """Bytes a linear function keeps between calls: its residuals, traced only.

    ``linear`` is ``jax.linearize``'s function (or ``jax.vjp``'s), built under a trace (the
    kernels run under ``jit``): its residuals are the tracers it closes over, which
    ``jax.closure_convert`` hoists; each counts once. ``tangent`` is an argument it takes (only
    shapes and dtypes are read); nothing of the loss is traced again. Built outside any trace,
    a function closes over concrete arrays only, and this returns 0.

    Args:
      linear: ``t -> L t``.
      tangent: a valid argument of ``linear``.

    Returns:
      Bytes, an int >= 0.

    >>> import jax.numpy as jnp
    >>> x = jnp.ones((8, 3))  # the tangent program of sin(x @ w) reads cos(x @ w): 8 floats
    >>> def kept(w):
    ...     linear = jax.linearize(lambda v: jnp.sin(x @ v), w)[1]
    ...     return linear_residual_bytes(linear, w)
    >>> out = []
    >>> _ = jax.make_jaxpr(lambda w: out.append(kept(w)) or w)(jnp.ones((3,)))
    >>> out
    [32]
    """
    return tree_bytes(jax.closure_convert(linear, tangent)[1])


def _computed_bytes(fn: Callable[[Any], Any], primal: Any) -> int:
    """Bytes of ``fn(primal)``'s outputs that its program computes (not inputs or constants)."""
    closed = jax.make_jaxpr(fn)(primal)
    given = {id(v) for v in (*closed.jaxpr.invars, *closed.jaxpr.constvars)}
    return tree_bytes([v.aval for v in closed.jaxpr.outvars if id(v) not in given])


def _jaxpr_bytes(jaxpr: Any) -> int:
    """Bytes of the values a jaxpr's equations compute (a sub-program's counted once)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += tree_bytes([v.aval for v in eqn.outvars])
        subs = jax.extend.core.jaxprs_in_params(eqn.params)
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


# --------------------------------------------------------------------------- the kernels' rules

# Hutchinson's chunk_size="auto": probes one at a time on a CPU (vectorising them measured
# slower there), this many vectorised on an accelerator (the 54k-parameter reference model on
# an H100: 0.53 gradients per probe one at a time, 0.30 in chunks of 16)
ACCELERATOR_PROBES = 16

# mode="auto" with probes one at a time (Hutchinson on a one-batch Hessian, the sharpness
# decomposition): the linearised product (its tangent program measured 0.7-1.0x a quadratic
# form's time per probe, at 54k to 124M parameters) while its estimated memory fits the
# kernel's budget (1.5 gradients for Hutchinson, 1.3 for sharpness, at least 128 MiB: a
# 4.2M-parameter decoder's product planned 3.7x its gradient's temporaries, its quadratic forms
# 0.54x) and its residuals (the forward and backward pass's intermediates) this much at most
# (3.4 GB at 124M parameters). Chunks of probes take quadratic forms, which then share their
# primal pass: per probe about 4 forward passes of matmuls against the tangent program's 6.
PRODUCT_RESIDUAL_BYTES = 2**30


def probe_chunk(chunk_size: Any) -> int:
    """``chunk_size`` of probes with ``"auto"`` resolved for the kernels' devices (validated).

    ``"auto"``: one at a time on a CPU, :data:`ACCELERATOR_PROBES` on an accelerator.
    """
    chunk = check_chunk_size(chunk_size, auto=ACCELERATOR_PROBES if is_accelerator() else None)
    return 1 if chunk is None else chunk


def hutchinson_chunk(chunk_size: Any, matvec: Any) -> int:
    """Hutchinson's ``chunk_size``, ``"auto"`` resolved under the memory budget (validated).

    For a loss operator on an accelerator: the largest power of two up to 16 whose probes'
    estimated memory fits ``memory_budget("hutchinson", ...)`` (1.5 gradients, at least
    128 MiB; :func:`budgeted_chunk_size`); on a CPU one at a time. A plain callable has no
    gradient to compare with: :func:`probe_chunk` (16 on an accelerator).
    """
    value = check_chunk_size(chunk_size, auto="auto")
    if value != "auto" or not isinstance(matvec, _LossOperator):
        return probe_chunk(value)
    if not is_accelerator():
        return 1
    params = matvec.params
    try:
        program = program_bytes(matvec.form, params)
    except (TypeError, NotImplementedError):  # no forward-mode derivatives: products
        grad_fn = jax.grad(matvec.scalar_loss())
        program = program_bytes(lambda p: jax.jvp(grad_fn, (p,), (p,))[1], params)
    per_probe = sample_bytes("forms", params=params, program=program)
    budget = memory_budget("hutchinson", gradient_bytes(matvec.scalar_loss(), params))
    chunk = budgeted_chunk_size(
        None, per_sample=per_probe, budget=budget, cap=ACCELERATOR_PROBES, accelerator=True
    )
    return 1 if chunk is None else chunk


def perturbation_chunk(
    chunk_size: Any,
    params: Any,
    loss: Callable[[Any], Any],
    primal: Any,
    form: Callable[[Any], Any] | None = None,
) -> int | None:
    """The sharpness kernels' ``chunk_size`` (checked) with ``"auto"`` resolved.

    ``"auto"`` is ``None`` on a CPU. On an accelerator the largest power of two up to 16 (and
    within :func:`kernels._backend.default_chunk_size`'s device budget) whose samples'
    estimated memory fits ``memory_budget("sharpness", ...)``: 1.3 gradients' temporaries of
    ``loss`` at ``primal``, at least 128 MiB. A sample is a perturbed-loss evaluation, plus
    (``form`` given) a Hutchinson quadratic form of the Hessian.

    Args:
      chunk_size: ``None``, an int >= 1 or ``"auto"``.
      params: the parameters (only shapes and dtypes are read).
      loss: the flat loss, ``x -> scalar``, that each sample evaluates.
      primal: the flat point ``loss`` is traced at.
      form: ``x -> x^T H x``, when each sample adds a quadratic form.
    """
    if chunk_size != "auto":
        return chunk_size
    size, dtype = tree_size(params)
    cap = auto_chunk_size(None, "probes", size=size, dtype=dtype)
    if cap is None:  # a CPU, or not two samples within the device's chunk budget
        return None
    per_sample = sample_bytes("perturbations", params=params, program=program_bytes(loss, primal))
    if form is not None:
        per_sample += sample_bytes("forms", params=params, program=program_bytes(form, primal))
    budget = memory_budget("sharpness", gradient_bytes(loss, primal))
    fixed = 2 * tree_bytes(params)  # the raveled parameters and their scales
    return budgeted_chunk_size(None, per_sample=per_sample, budget=budget, cap=cap, fixed=fixed)


# Where neither mode fits the budget (the 54k reference model at batch 256 x 32: its quadratic
# form plans 3.47 gradients' temporaries, its linearised product 3.71 and runs 8% faster), the
# product is kept unless its estimate exceeds the quadratic form's by more than this factor: a
# small memory saving is not worth the slower probes
PRODUCT_MEMORY_MARGIN = 1.3


def products_fit(
    kind: str,
    linear: Callable,
    tangent: Any,
    primal: Any,
    loss: Callable[[Any], Any],
    form: Callable[[Any], Any] | None = None,
) -> bool:
    """Whether ``mode="auto"`` takes a linearised product, probes one at a time.

    Never when its residuals (:func:`linear_residual_bytes`) pass
    :data:`PRODUCT_RESIDUAL_BYTES`. Otherwise when their estimated memory
    (:func:`sample_bytes` ``("products", ...)``) fits ``memory_budget(kind,
    gradient_bytes(loss, primal))``. With ``form`` given (the quadratic form the kernel would
    use instead), also when neither fits: when the quadratic form's estimate
    (``"forms"``) is over the budget too and the product's is at most
    :data:`PRODUCT_MEMORY_MARGIN` times it (the faster mode, for a small memory cost).

    Args:
      kind: ``"hutchinson"`` or ``"sharpness"`` (:data:`GRADIENT_MULTIPLES`).
      linear: the linearised product, built under the kernel's trace.
      tangent: an argument of ``linear`` (shapes and dtypes only).
      primal: the point the budget's gradient is taken at.
      loss: ``p -> scalar``, whose gradient the budget is stated in.
      form: ``v -> v^T A v`` at ``primal`` (traced only), or None.
    """
    residuals = linear_residual_bytes(linear, tangent)
    if residuals > PRODUCT_RESIDUAL_BYTES:
        return False
    need = sample_bytes("products", params=primal, residuals=residuals)
    budget = memory_budget(kind, gradient_bytes(loss, primal))
    if need <= budget:
        return True
    if form is None:
        return False
    try:
        program = program_bytes(form, primal)
    except (TypeError, NotImplementedError):  # no forward-mode derivatives: no quadratic form
        return True
    forms = sample_bytes("forms", params=primal, program=program)
    return forms > budget and need <= PRODUCT_MEMORY_MARGIN * forms


def linearisation_fits(linear: Callable, tangent: Any) -> bool:
    """Whether ``linearize="auto"`` (Lanczos, SLQ) keeps a loss operator's linearisation.

    When its residuals (:func:`linear_residual_bytes`: the forward and backward pass's
    intermediates, and the weights its tangent program reads) are at most
    :data:`PRODUCT_RESIDUAL_BYTES`, as for Hutchinson's ``mode="auto"``; beyond, every product
    is recomputed from scratch (the unused linearisation is dead code, which JAX drops before
    compiling). The residuals stay alive for the whole run beside the basis: at 1.2 billion
    parameters (FSDP over 8 devices) XLA planned 21.4 GiB per device for 10 Lanczos steps
    linearised and 12.9 recomputed, against a gradient's 4.9; recomputed products cost 16-25%
    more time per step at 26M to 124M parameters (docs/benchmarks-kernels-at-scale.md).

    Args:
      linear: the linearised product, built under the kernel's trace.
      tangent: an argument of ``linear`` (shapes and dtypes only).
    """
    return linear_residual_bytes(linear, tangent) <= PRODUCT_RESIDUAL_BYTES
