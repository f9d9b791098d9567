r"""Edelman, Goel, Kakade & Zhang 2022: norm-based self-attention covers with a log(d m T) factor.

The covers here cover the m T token positions with Lemma 4.6, so they grow like log T, unlike
:mod:`jaxbounds.bounds.trauger_tewari`. Status: **rebuilt** from the restatement in Trauger &
Tewari 2024 (hidden constants and log factors other than log(d m T) dropped); a test pins the form.
Float64 numpy, validated inputs (``ValueError`` naming the argument, or a not-valid bound with
``strict=False``).

References:
  Edelman, Goel, Kakade & Zhang 2022, "Inductive biases and variable creation in self-attention
  mechanisms", ICML, arXiv:2110.10090.
"""

from __future__ import annotations

import numpy as np

from jaxbounds.bounds import covering, trauger_tewari
from jaxbounds.bounds._result import Bound, Inputs, quiet

__all__ = ["multi_layer_log_cover", "rademacher", "single_head_log_cover"]


@quiet
def single_head_log_cover(
    *, L_sigma, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21, d, num_examples, seq_len, strict=True
) -> Bound:
    r"""Log cover of one self-attention head with scalar readout (rebuilt form).

    $$\log N \lesssim (L_\sigma B_w B_X)^2\Big[(B_C^{2,1}B_V)^{2/3} + (B_V^{2,1}B_C)^{2/3}
      + (2B_{QK}^{2,1}B_V B_C B_X^2)^{2/3}\Big]^3\frac{\log(d m T)}{\epsilon^2},$$
    with $B^{2,1}$ bounds on $\|\cdot\|_{2,1}$ and $B_V, B_C$ spectral bounds.
    ``value`` is the coefficient of $1/\epsilon^2$.

    Args:
      L_sigma: activation Lipschitz constant (>= 0).
      B_w: readout norm bound (>= 0).
      B_X: token l2 norm bound (>= 0).
      B_C21: ||W_C||_{2,1} bound (>= 0).
      B_V: spectral bound on W_V (>= 0).
      B_V21: ||W_V||_{2,1} bound (>= 0).
      B_C: spectral bound on W_C (>= 0).
      B_QK21: ||W_QK||_{2,1} bound (>= 0).
      d: width (integer >= 1).
      num_examples: m (integer >= 1).
      seq_len: T (integer >= 1).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "log_cover", provenance "rebuilt") with terms ``bracket`` and ``log_factor``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Edelman et al. 2022, arXiv:2110.10090, Theorem 4.3 (as restated by Trauger & Tewari).
    """
    ins = Inputs(strict)
    names = ("L_sigma", "B_w", "B_X", "B_C21", "B_V", "B_V21", "B_C", "B_QK21")
    values = (L_sigma, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21)
    L_s, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21 = (
        ins.nonneg(n, v) for n, v in zip(names, values, strict=True)
    )
    d, m, T = (
        ins.count("d", d),
        ins.count("num_examples", num_examples),
        ins.count("seq_len", seq_len),
    )
    t = 2.0 / 3.0
    bracket = (B_C21 * B_V) ** t + (B_V21 * B_C) ** t + (2.0 * B_QK21 * B_V * B_C * B_X**2) ** t
    log_factor = np.log(d) + np.log(m) + np.log(T)
    value = (L_s * B_w * B_X) ** 2 * bracket**3 * log_factor
    return ins.bound(
        value=value,
        terms={"bracket": bracket, "log_factor": log_factor, "C": value},
        hypotheses={},
        name="Edelman et al. single head",
        kind="log_cover",
        provenance="rebuilt",
    )


@quiet
def multi_layer_log_cover(
    *, B21, B_x, d, num_examples, seq_len, num_layers: int, L_sigma, B_c2, B_v2, B_QK2, B_w,
    strict=True,
) -> Bound:  # fmt: skip
    r"""L-layer cover: Theorem 4.2 of Trauger & Tewari with Lemma 4.6 covers on the m T tokens.

    $C_1 = (B^{2,1})^2\log(dmT)$ and $C_{B_x} = (B^{2,1})^2B_x^2\log(dmT)$ fed to
    :func:`trauger_tewari.multi_layer_log_cover` (rebuilt).

    Args:
      B21: ||.||_{2,1} bound on every matrix (>= 0).
      B_x: input l2 bound (>= 0).
      d: width (integer >= 1).
      num_examples: m (integer >= 1).
      seq_len: T (integer >= 1).
      num_layers: L, a Python int >= 1. Static.
      L_sigma: activation Lipschitz constant (>= 0).
      B_c2: spectral bound on W_c (>= 0).
      B_v2: spectral bound on W_v (>= 0).
      B_QK2: spectral bound on W_QK (>= 0).
      B_w: readout norm bound (>= 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "log_cover", provenance "rebuilt").

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Edelman et al. 2022, arXiv:2110.10090, Theorem A.17.
    """
    ins = Inputs(strict)
    B21, B_x = ins.nonneg("B21", B21), ins.nonneg("B_x", B_x)
    d, m, T = (
        ins.count("d", d),
        ins.count("num_examples", num_examples),
        ins.count("seq_len", seq_len),
    )
    lg = np.log(d) + np.log(m) + np.log(T)
    out = trauger_tewari.multi_layer_log_cover(
        C_1=B21**2 * lg, C_Bx=B21**2 * B_x**2 * lg, num_layers=num_layers, L_sigma=L_sigma,
        B_c2=B_c2, B_v2=B_v2, B_QK2=B_QK2, B_w=B_w, strict=strict,
    )  # fmt: skip
    return ins.bound(
        value=out.value,
        terms={**out.terms, "log_factor": lg},
        hypotheses=out.hypotheses,
        name="Edelman et al. multi-layer",
        kind="log_cover",
        provenance="rebuilt",
    )


@quiet
def rademacher(*, cover: Bound, radius, num_examples, loss_bound=1.0, strict=True) -> Bound:
    r"""Rademacher bound from an Edelman cover by Dudley's integral (standard constants).

    See :func:`covering.dudley_rademacher`; the cover's hypotheses carry over. Vacuous when
    ``2 * value >= loss_bound``.

    Args:
      cover: an Edelman cover (:func:`single_head_log_cover` or :func:`multi_layer_log_cover`).
      radius: A > 0, the Dudley radius (a bound on |f|).
      num_examples: m (integer >= 1).
      loss_bound: range of the loss (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Edelman et al. 2022, arXiv:2110.10090.
    """
    ins = Inputs(strict)
    lb = ins.positive("loss_bound", loss_bound)
    out = covering.dudley_rademacher(
        C=cover.terms["C"], radius=radius, num_examples=num_examples, strict=strict
    )
    return ins.bound(
        value=out.value,
        terms={**out.terms, "cover_C": cover.terms["C"]},
        hypotheses={**cover.hypotheses, **out.hypotheses},
        trivial=lb / 2.0,
        name=cover.name + " (Dudley)",
        kind="rademacher",
        provenance="rebuilt",
    )
