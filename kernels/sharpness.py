r"""Sharpness of a loss under parameter perturbations: average, worst case, adaptive.

One :class:`Perturbation` spec describes the perturbation for every kernel here (and for the
PAC-Bayes bounds): its kind (Gaussian with standard deviation $\sigma$, or a uniform draw from /
the worst point of an $\ell_2$ or $\ell_\infty$ ball of radius $\rho$), whether it is *adaptive*
(each coordinate scaled by $|\theta_i|$, which makes sharpness invariant to the rescaling
symmetries of ReLU networks), and a *mask* restricting it to chosen parameter groups.

Writing $s = m \odot c$ for the mask $m \in \{0,1\}^n$ times $c = |\theta|$ (adaptive) or
$c = 1$, the perturbation vector is $u = s \odot \eta$ with

- ``"gaussian"``: $\eta \sim N(0, \sigma^2 I)$;
- ``"l2_ball"``: $\|\eta\|_2 \le \rho$ (on the support of $s$);
- ``"linf_ball"``: $\|\eta\|_\infty \le \rho$.

Kernels (all ``(loss_fn, params, batch, key, *, perturbation, ...)`` with
``loss_fn(params, batch) -> scalar``):

- :func:`average_sharpness`: $\mathbb E_u L(\theta+u) - L(\theta)$, with antithetic pairs;
- :func:`sharpness_decomposition`: the Theorem 6/12 identity
  $\mathbb E_u L(\theta+u) = L(\theta) + \frac{\sigma^2}{2}\operatorname{tr} H(\theta) + P$;
- :func:`perturbed_hessian_traces`: $\operatorname{tr} H(\theta + u_j)$ per perturbation, and
  their mean;
- :func:`worst_case_sharpness`: $\max_{u} L(\theta+u) - L(\theta)$ over a ball (a lower bound);
- :func:`sigma_search`: the largest $\sigma$ whose average increase stays below a target.

Glossary: ``num_samples`` counts independent Monte Carlo samples: perturbations, or antithetic
*pairs* $(u, -u)$ (``K`` pairs are ``2K`` loss evaluations, reported in
``Estimate.num_evaluations``); ``num_probes`` counts Hutchinson probes; ``num_steps`` counts
iterations (ascent steps, bisection steps); ``chunk_size`` is samples per vectorised batch,
``None`` meaning one at a time (least memory).

Monte Carlo means run through :func:`kernels.parallel.sample_statistics`: sample $i$ uses the key
``fold_in(key, i)``, memory is that of one chunk whatever ``num_samples`` is, the result does not
depend on ``chunk_size`` or the device count, and draws shard over ``jax.devices()``. A
perturbation (and a probe) is drawn, scaled and applied leaf by leaf: leaf $j$ of the
parameters' pytree from ``fold_in(k, j)`` of its sample's key ``k``
(:func:`kernels._random.leaf_keys`), each in its leaf's layout on a mesh, so no vector of
every parameter is formed.

Compilation: every kernel is compiled once per (``loss_fn`` object, static options, shapes and
dtypes) (:func:`kernels._jit.compile_once`): pass data through ``batch`` rather than closing over
it, and a traced scale (``Perturbation("gaussian", jnp.asarray(0.01))``) to vary $\sigma$
without recompiling. Inside one program ``loss_fn`` is traced once (its jaxpr is reused for
$L(\theta)$, every perturbed point and every derivative).

Checks: non-finite parameters, a non-positive or non-finite scale (also when traced), a
non-finite loss at $\theta$, and a loss that turns non-finite at any perturbed point raise an
error naming the argument, eagerly (``ValueError``) and inside ``jax.jit`` (a runtime error whose
message contains ``"kernels check failed: ..."``); :func:`kernels._checks.runtime_checks` turns
the runtime checks off.

Precision: $L(\theta+u) - L(\theta)$ is a difference of two nearly equal numbers. In float32
an increase below about $10^{-7} L(\theta)$ is lost to rounding, which the reported standard
error does not include; use float64 parameters for small $\sigma$. Half-precision parameters
(float16, bfloat16) are worked on in float32 by default (``compute_dtype=None``: each leaf cast
inside the program, $\theta + u$ formed and the loss evaluated in float32, every sum in
float32); a half-precision ``compute_dtype`` is refused by the kernels of loss differences
(the perturbed point would be rounded to 8 or 11 significand bits), see
:mod:`kernels._precision`.
"""

from __future__ import annotations

from kernels._apgd import WorstCase, worst_case_sharpness

# private names that kernels.blocks and the tests reach through this module
from kernels._perturbation import (  # noqa: F401
    Perturbation,
    _check_chunk,
    _sample_chunk,
    _setup,
    _support_size,
)
from kernels._perturbed import (  # noqa: F401
    PerturbedTraces,
    SharpnessDecomposition,
    _perturbed_block,
    _perturbed_finish,
    average_sharpness,
    perturbed_hessian_traces,
    sharpness_decomposition,
)
from kernels._sigma_search import SigmaSearch, sigma_search

__all__ = [
    "Perturbation",
    "PerturbedTraces",
    "SharpnessDecomposition",
    "SigmaSearch",
    "WorstCase",
    "average_sharpness",
    "perturbed_hessian_traces",
    "sharpness_decomposition",
    "sigma_search",
    "worst_case_sharpness",
]
