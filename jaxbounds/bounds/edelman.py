r"""Edelman, Goel, Kakade & Zhang 2022: norm-based self-attention covers with a log(d m T) factor.

The covers here cover the m T token positions with Lemma 4.6, so they grow like log T, unlike
:mod:`jaxbounds.bounds.trauger_tewari`. Status: **rebuilt** from the restatement in Trauger &
Tewari 2024 (hidden constants and log factors other than log(d m T) dropped); a test pins the form.

References:
  Edelman, Goel, Kakade & Zhang 2022, "Inductive biases and variable creation in self-attention
  mechanisms", ICML, arXiv:2110.10090.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxbounds.bounds import covering, trauger_tewari
from jaxbounds.bounds._result import Bound, floats

__all__ = ["multi_layer_log_cover", "rademacher", "single_head_log_cover"]


def single_head_log_cover(
    *, L_sigma, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21, d, num_samples, seq_len
) -> Bound:
    r"""Log cover of one self-attention head with scalar readout (rebuilt form).

    $$\log N \lesssim (L_\sigma B_w B_X)^2\Big[(B_C^{2,1}B_V)^{2/3} + (B_V^{2,1}B_C)^{2/3}
      + (2B_{QK}^{2,1}B_V B_C B_X^2)^{2/3}\Big]^3\frac{\log(d m T)}{\epsilon^2},$$
    with $B^{2,1}$ bounds on $\|\cdot\|_{2,1}$ and $B_V, B_C$ spectral bounds.
    ``value`` is the coefficient of $1/\epsilon^2$.

    Args:
      L_sigma: activation Lipschitz constant.
      B_w: readout norm bound.
      B_X: token l2 norm bound.
      B_C21: ||W_C||_{2,1} bound.
      B_V: spectral bound on W_V.
      B_V21: ||W_V||_{2,1} bound.
      B_C: spectral bound on W_C.
      B_QK21: ||W_QK||_{2,1} bound.
      d: width.
      num_samples: m.
      seq_len: T.

    Returns:
      Bound (kind "log_cover", status "rebuilt") with terms ``bracket`` and ``log_factor``.

    References:
      Edelman et al. 2022, arXiv:2110.10090, Theorem 4.3 (as restated by Trauger & Tewari).
    """
    L_s, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21, d, m, T = floats(
        L_sigma, B_w, B_X, B_C21, B_V, B_V21, B_C, B_QK21, d, num_samples, seq_len
    )
    t = 2.0 / 3.0
    bracket = (B_C21 * B_V) ** t + (B_V21 * B_C) ** t + (2.0 * B_QK21 * B_V * B_C * B_X**2) ** t
    log_factor = jnp.log(d * m * T)
    value = (L_s * B_w * B_X) ** 2 * bracket**3 * log_factor
    return Bound(
        value=value,
        terms={"bracket": bracket, "log_factor": log_factor, "C": value},
        hypotheses={},
        vacuous=jnp.zeros(jnp.shape(value), bool),
        name="Edelman et al. single head",
        kind="log_cover",
        status="rebuilt",
    )


def multi_layer_log_cover(
    *, B21, B_x, d, num_samples, seq_len, num_layers: int, L_sigma, B_c2, B_v2, B_QK2, B_w
) -> Bound:
    r"""L-layer cover: Theorem 4.2 of Trauger & Tewari with Lemma 4.6 covers on the m T tokens.

    $C_1 = (B^{2,1})^2\log(dmT)$ and $C_{B_x} = (B^{2,1})^2B_x^2\log(dmT)$ fed to
    :func:`trauger_tewari.multi_layer_log_cover` (rebuilt).

    Args:
      B21: ||.||_{2,1} bound on every matrix.
      B_x: input l2 bound.
      d: width.
      num_samples: m.
      seq_len: T.
      num_layers: L. Static.
      L_sigma: activation Lipschitz constant.
      B_c2: spectral bound on W_c.
      B_v2: spectral bound on W_v.
      B_QK2: spectral bound on W_QK.
      B_w: readout norm bound.

    Returns:
      Bound (kind "log_cover", status "rebuilt").

    References:
      Edelman et al. 2022, arXiv:2110.10090, Theorem A.17.
    """
    B21, B_x, d, m, T = floats(B21, B_x, d, num_samples, seq_len)
    lg = jnp.log(d * m * T)
    out = trauger_tewari.multi_layer_log_cover(
        C_1=B21**2 * lg,
        C_Bx=B21**2 * B_x**2 * lg,
        num_layers=num_layers,
        L_sigma=L_sigma,
        B_c2=B_c2,
        B_v2=B_v2,
        B_QK2=B_QK2,
        B_w=B_w,
    )
    return Bound(
        value=out.value,
        terms={**out.terms, "log_factor": lg},
        hypotheses={},
        vacuous=out.vacuous,
        name="Edelman et al. multi-layer",
        kind="log_cover",
        status="rebuilt",
    )


def rademacher(*, cover: Bound, A, num_samples, loss_bound=1.0) -> Bound:
    r"""Rademacher bound from an Edelman cover by Dudley's integral (radius A, standard constants).

    References:
      Edelman et al. 2022, arXiv:2110.10090.
    """
    out = covering.dudley_rademacher(C=cover.terms["C"], A=A, num_samples=num_samples)
    (lb,) = floats(loss_bound)
    return Bound(
        value=out.value,
        terms={**out.terms, "cover_C": cover.terms["C"]},
        hypotheses={},
        vacuous=2.0 * out.value >= lb,
        name=cover.name + " (Dudley)",
        kind="rademacher",
        status="rebuilt",
    )
