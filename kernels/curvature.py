r"""Curvature of a loss: Hessian-vector products, trace estimators, Lanczos, spectral density.

**Operators.** Every kernel acts on a symmetric linear operator ``matvec: v -> A v`` on pytrees
shaped like a template ``like`` (or on vectors of shape ``(n,)`` when ``like`` is an int ``n``).
:func:`hvp` and :func:`dataset_hvp` build the Hessian of ``loss_fn(params, batch)`` as a
registered pytree operator (a frozen dataclass: ``loss_fn`` is static, ``params`` and the data
are leaves), so a kernel called again with new parameters or a new batch of the same shapes
compiles nothing. A kernel that receives such an operator linearises it once per program
(:meth:`HessianOperator.linearize`): the gradient's forward and backward pass at ``params`` run
once and every probe only runs the tangent program. Hutchinson needs only the quadratic forms
$v^\top H v$, which it can take from such an operator by forward over forward mode (the
second derivative of $t \mapsto L(\theta + tv)$, :meth:`HessianOperator.form`): no
linearisation, no backward pass, memory of about a forward pass, and on a dataset operator one
scalar accumulated over the batches. ``hutchinson_trace(..., mode="auto")`` chooses per
problem: for a one-batch :func:`hvp` probed one at a time, the linearised product
$v \cdot Hv$ while its memory fits 1.5 gradients' temporaries (at least 128 MiB, at most
1 GiB of residuals: :mod:`kernels._backend`'s memory budget; its tangent program
costs 0.86-0.90x a quadratic form's arithmetic and 0.63-0.90x its memory traffic per probe in XLA's
cost analysis, at 54k and 26M parameters), quadratic forms beyond (at 124M parameters the
linearisation holds 3.4 GB, 2.5x a gradient's peak memory; at 4.2M parameters its plan is
3.7 gradients' temporaries, the quadratic forms' 0.54) and for chunks of probes (which
then share their primal pass); quadratic forms for dataset and Gauss-Newton operators. Products
are used whenever the loss has no second forward-mode derivative (e.g. a ``jax.custom_vjp``
inside it). A plain callable (``lambda v: d * v``) works too; it is part of the compilation key
by identity, so keep the same object across calls.

**Lanczos.** Full reorthogonalisation against the stored basis, which holds ``num_steps``
vectors ($k n$ numbers): each step runs the three-term recurrence, one classical Gram-Schmidt
pass (two matrix-vector products with the basis; rows not yet written are zero) and a second
pass only when the first removed more than $1 - 1/\sqrt2$ of the vector's norm
(Daniel-Gragg-Kaufman-Stewart), so the basis is read twice per step where it was read four
times (two unconditional passes); a lower-precision basis is read block by block, only the
blocks that hold vectors so far. A step whose $\beta$ falls below $16\,\epsilon\,\|A\|$
(the running estimate $\max_j |\alpha_j| + \beta_{j-1} + \beta_j$) is an invariant subspace
and restarts.
Accuracy: finite-precision Lanczos returns the Ritz values of some $A + E$ with
$\|E\| \approx \epsilon \|A\|$, so eigenvalues are accurate to a few $\epsilon\|A\|$
**absolute**: in float32 beside an outlier $\lambda_{max} = 10^4$ the bulk is resolved to about
$10^{-3}$ (tested); eigenvalues closer than that, or much smaller than $\epsilon\|A\|$, need
float64. ``basis_dtype`` stores the basis in a lower precision (the recurrence stays in the
working dtype): Ritz values then move by at most about $0.1\,u\,\|A\|$ for the basis's unit
roundoff $u$ (measured 0.005-0.05 u; tested at 0.1 u): float32 for float64 work ($\sim
10^{-8}\|A\|$), float16 ($\sim 5\times10^{-5}\|A\|$) or bfloat16 ($\sim
4\times10^{-4}\|A\|$), halving or quartering the basis's memory and traffic.
Memory beside the basis: with ``linearize=True`` a loss operator is linearised once and
each step runs the tangent program, so the linearisation's residuals (the forward and
backward pass's intermediates) stay alive for the whole run; ``linearize=False`` recomputes
every product from scratch (a forward-over-reverse ``jax.jvp(jax.grad)``, behind an
``optimization_barrier`` so that XLA cannot hoist the forward pass out of the loop), which
keeps none. Measured in XLA's plan on a 26.4M-parameter decoder, 10 steps: the basis plus
2.55 gradients' temporaries linearised, plus 1.89 recomputed, at 1.65 and 2.06 gradients of
time per step; at 124M parameters plus 4.84 and 3.09, at 2.24 and 2.69 (peak memory 11.4 and
9.5 GB); at 1.2 billion (FSDP over 8 devices) 21.4 and 12.9 GiB per device against a
gradient's 4.9. The default, ``linearize="auto"``, linearises while the residuals take at
most 1 GiB (the whole model's, traced sizes) and recomputes beyond.

A dataset too large for one batch: stack equal-size batches along a leading axis and use
:func:`dataset_hvp`; its operator is the Hessian of the mean loss, accumulated batch by batch
with ``lax.scan`` (memory of one batch, no per-example Hessians):

    op = dataset_hvp(loss_fn, params, batches)
    estimate = hutchinson_trace(op, params, key, num_samples=64)

**Compile once.** The program-running kernels are wrapped by :func:`kernels._jit.compile_once`:
array leaves of the arguments are traced, everything else (callables, counts, strings) is static.
Inside a user's ``jax.jit`` / ``vmap`` they are inlined.

**Checks.** Static checks (counts, ``chunk_size``, ``key``, dtypes, sizes) raise ``ValueError``
naming the argument. Runtime checks hold eagerly (``ValueError``) and inside ``jax.jit``
(``JaxRuntimeError`` containing ``"kernels check failed: ..."``): non-finite ``params``, a
non-finite loss at ``params`` (:func:`hvp`), and non-finite products at the probes (with their
count). ``kernels._checks.runtime_checks(False)`` turns the runtime checks off.

**Randomness and memory.** Probe ``i`` uses the key ``jax.random.fold_in(key, i)``, derived inside
the program (:func:`kernels.parallel.sample_statistics`), so memory is that of ``chunk_size``
probes whatever their number, and results depend on neither ``chunk_size`` nor the device count.
Rademacher probes are unpacked from raw 32-bit words (:mod:`kernels._random`: one random bit
per entry, ~9x cheaper to draw than ``jax.random.rademacher`` at 10^8 parameters).
"""

from __future__ import annotations

# private names that kernels.blocks and the tests reach through this module
from kernels._flat import _setup  # noqa: F401
from kernels._hessian import (
    DatasetHessianOperator,
    DatasetLoss,
    HessianOperator,
    Matvec,  # noqa: F401
    dataset_hvp,
    dataset_loss,
    hvp,
)
from kernels._lanczos import (
    Tridiagonal,
    _Basis,  # noqa: F401
    lanczos,
    top_eigenvalues,
)
from kernels._slq import (  # noqa: F401
    QuadratureNodes,
    SpectralDensity,
    _density_finish,
    _slq_block,
    slq_nodes,
    spectral_density,
)
from kernels._trace import hessian_trace, hutchinson_trace, hutchpp_memory_bytes, hutchpp_trace
from kernels.estimate import Estimate

__all__ = [
    "DatasetHessianOperator",
    "DatasetLoss",
    "Estimate",
    "HessianOperator",
    "QuadratureNodes",
    "SpectralDensity",
    "Tridiagonal",
    "dataset_hvp",
    "dataset_loss",
    "hessian_trace",
    "hutchinson_trace",
    "hutchpp_memory_bytes",
    "hutchpp_trace",
    "hvp",
    "lanczos",
    "slq_nodes",
    "spectral_density",
    "top_eigenvalues",
]
