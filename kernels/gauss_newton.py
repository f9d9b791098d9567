r"""Gauss-Newton and Fisher curvature: positive semi-definite operators, traces and spectra.

The loss is split into a model and a loss of its outputs,
$$L(\theta) = \ell(f_\theta(x), y),\qquad f_\theta(x) = \texttt{apply\_fn}(\theta, x),$$
with ``batch = (inputs, targets)``. Three curvature matrices of $L$ are built from it:

- the **generalized Gauss-Newton** $G = J^\top H_{\rm out} J$, with $J$ the Jacobian of the
  outputs in the parameters and $H_{\rm out} = \nabla^2_f \ell$ (:func:`ggn`,
  :func:`dataset_ggn`). It drops the second derivatives of the model from the Hessian, so it is
  positive semi-definite whenever $\ell$ is convex in the outputs, and it is the Hessian for a
  model linear in its parameters;
- the **empirical Fisher** $F_{\rm emp} = \frac1N\sum_i g_i g_i^\top$, $g_i$ the gradient of
  example $i$'s log-likelihood term at its observed label (:func:`empirical_fisher`,
  :func:`empirical_fisher_trace`);
- the **Monte Carlo Fisher** $\hat F$, the same sum with labels drawn from the model's
  predictive distribution (:func:`mc_fisher`, :func:`mc_fisher_trace`). Its expectation over
  the draws is the Fisher, which equals $G$ for the three named losses below.

**Losses.** ``loss`` is a name or a callable. The named losses have analytic output Hessians
(never a $K \times K$ matrix: the softmax Hessian acts as $u \mapsto p\odot(u - p^\top u)$ per
position) and a predictive distribution for the Monte Carlo Fisher. Each is a mean over its $N$
*terms*:

- ``"cross_entropy"``: logits ``(n, ..., K)`` and integer labels ``(n, ...)``; term
  $\ell_j = \log\sum_k e^{f_{jk}} - f_{j y_j}$ per position (all axes but the last);
  $H_j = \frac1N(\operatorname{diag} p_j - p_j p_j^\top)$ with $p_j = \operatorname{softmax} f_j$;
- ``"logistic"``: scores and labels in $[0, 1]$ of one shape ``(n, ...)``; term
  $\ell_j = \log(1 + e^{f_j}) - y_j f_j$ per element; $H_j = \frac1N\sigma(f_j)\sigma(-f_j)$;
- ``"squared_error"``: predictions and targets of one shape; term $\ell_j = (f_j - y_j)^2$ per
  element (no factor 1/2); $H_j = \frac2N$.

A callable ``loss(outputs, targets) -> scalar`` (a mean over the examples on the leading axis)
gets its output Hessian by automatic differentiation on the outputs (cheap: the outputs are
small next to the network); the Gauss-Newton matrix is then positive semi-definite only where
the loss is convex in the outputs. For the Fisher matrices a callable loss counts each example
as one term ($N = n$, $g_i = \nabla_\theta\,$``loss(outputs[i:i+1], targets[i:i+1])``); the
Monte Carlo Fisher needs a named loss (its predictive distribution).

**Fisher normalisation.** Example $i$ (index $i$ on the leading axis of ``inputs``) contributes
$g_i = \nabla_\theta \sum_{j \in i} \ell_j$, the gradient of the log-likelihood of all its
terms, so $F = \frac1N\sum_i g_i g_i^\top$ and $\mathbb E_{\hat y}\hat F = G$. With one term
per example (classification, regression) this is the textbook
$\frac1n\sum_i \nabla\ell_i \nabla\ell_i^\top$; for a sequence model with $T$ positions per
example it is $T$ times the empirical Fisher of the per-sequence mean loss. Examples must be
independent: ``apply_fn(params, inputs)[i]`` must equal ``apply_fn(params, inputs[i:i+1])[0]``.

**Cost.** The product $Gv$ is one Jacobian-vector product, the output Hessian and one
vector-Jacobian product; a kernel that receives the operator linearises ``apply_fn`` once per
program (:meth:`GGNOperator.linearize`), so each product runs the tangent program and its
transpose only. The quadratic form $v^\top G v = (Jv)^\top H_{\rm out} (Jv)$, which
:func:`~kernels.curvature.hutchinson_trace` uses, is one forward-mode pass: no backward pass,
no stored activations. The Fisher operators cost the same (their $H_{\rm out}$ is replaced by
per-example outer products of the output scores). The exact empirical-Fisher trace and the
Monte Carlo Fisher trace take per-example gradients, ``example_chunk_size`` at a time.

**Estimators.** Every operator is a :class:`kernels._operators._LossOperator` (a registered
frozen-dataclass pytree: ``apply_fn`` and ``loss`` static, parameters, data, weights and key
leaves), so :func:`~kernels.curvature.hutchinson_trace`, :func:`~kernels.curvature.hutchpp_trace`,
:func:`~kernels.curvature.lanczos`, :func:`~kernels.curvature.top_eigenvalues`,
:func:`~kernels.curvature.slq_nodes` and :func:`~kernels.curvature.spectral_density` accept them
unchanged and compile once per (callables, shapes). The dataset operators stream stacked
batches with ``lax.scan`` (one batch of activations in memory), like
:func:`~kernels.curvature.dataset_hvp`.

**Checks.** Static checks raise ``ValueError`` naming the argument. Runtime checks (eagerly
``ValueError``, under ``jit`` ``JaxRuntimeError`` with ``"kernels check failed: ..."``):
non-finite ``params``, a non-finite loss at ``params``, cross-entropy labels outside
$[0, K)$, non-finite per-example gradients; the estimators add their own (non-finite products).

References:
  Schraudolph 2002, doi:10.1162/08997660260028683 (Gauss-Newton products); Martens 2020,
  "New insights and perspectives on the natural gradient method", arXiv:1412.1193;
  Kunstner, Hennig, Balles 2019, "Limitations of the empirical Fisher approximation",
  arXiv:1905.12558; Dangel et al., curvlinops (PyTorch).
"""

from __future__ import annotations

from kernels._ggn import (
    DatasetFisherOperator,
    DatasetGGNOperator,
    FisherOperator,
    GGNOperator,
    Matvec,  # noqa: F401
    dataset_empirical_fisher,
    dataset_ggn,
    dataset_mc_fisher,
    empirical_fisher,
    ggn,
    mc_fisher,
)
from kernels._ggn_trace import empirical_fisher_trace, ggn_trace, mc_fisher_trace
from kernels._losses import NAMED_LOSSES, Loss  # noqa: F401

__all__ = [
    "DatasetFisherOperator",
    "DatasetGGNOperator",
    "FisherOperator",
    "GGNOperator",
    "dataset_empirical_fisher",
    "dataset_ggn",
    "dataset_mc_fisher",
    "empirical_fisher",
    "empirical_fisher_trace",
    "ggn",
    "ggn_trace",
    "mc_fisher",
    "mc_fisher_trace",
]
