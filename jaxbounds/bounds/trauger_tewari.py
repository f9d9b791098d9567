r"""Trauger & Tewari 2024: sequence-length independent norm-based bounds for Transformers.

Single layer (Theorem 4.1, Corollaries 4.1.1, D.0.1, D.0.2, H heads), L layers (Theorem 4.2,
Corollaries 4.2.1, F.0.1, F.0.2) and the masked-word factor of Theorem 5.1. Nothing here depends
on the sequence length T; compare :mod:`jaxbounds.bounds.edelman`, where log T enters.

The paper states Theorem 4.1 as $O(\cdot)$: the calculators return the expression inside the
$O$ times ``constant`` (default 1), i.e. an order-level value, not a certified bound.

References:
  Trauger & Tewari 2024, arXiv:2310.13088.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxbounds.bounds import covering
from jaxbounds.bounds._result import Bound, floats

__all__ = [
    "corollary_4_1_1",
    "corollary_4_2_1",
    "corollary_d_0_1",
    "corollary_d_0_2",
    "corollary_f_0_1",
    "corollary_f_0_2",
    "masked_word_rademacher",
    "multi_layer_log_cover",
    "multi_layer_rademacher",
    "theorem_4_1",
]


def theorem_4_1(
    *,
    C,
    B_x,
    B_w,
    B_Wc,
    B_Wv,
    L_sigma,
    d,
    num_samples,
    num_heads=1,
    constant=1.0,
    loss_bound=1.0,
) -> Bound:
    r"""Rademacher complexity of a one-layer scalar Transformer (Theorem 4.1, H heads).

    $$\mathrm{Rad} = O\Big(H B_w B_{W_c} L_\sigma B_{W_v}\Big[\frac{2B_x^2\sqrt C}{\sqrt m}
      \Big(1 + \ln\frac{\sqrt m}{2B_x\sqrt C}\Big) + B_x\sqrt{\frac{\ln(2d)}{m}}\Big]\Big)$$
    with $\|w\|_1 \le B_w$, $\|W_c^\top\|_{1,\infty} \le B_{W_c}$,
    $\|W_v^\top\|_{1,\infty} \le B_{W_v}$,
    $\|x\|_2 \le B_x$, and a cover $C/\epsilon^2$ of $\{x \mapsto W_{QK}x\}$ on those inputs.
    H heads multiply by H (Section 4.2). Returns ``constant`` times the expression inside O,
    capped at the Dudley radius $B_x$ (taking $\delta = B_x$ in the proof's integral; the printed
    expression goes negative when $\sqrt m \le 2B_x\sqrt C$).
    Vacuous when ``2 * value >= loss_bound`` (the generalization term alone exceeds the range).

    Args:
      C: cover coefficient of the W_QK class (e.g. from ``covering.lemma_3_6_log_cover``).
      B_x: input l2 bound.
      B_w: readout l1 bound.
      B_Wc: bound on ||W_c^T||_{1,inf}.
      B_Wv: bound on ||W_v^T||_{1,inf}.
      L_sigma: Lipschitz constant of the activation (sigma(0) = 0).
      d: embedding dimension.
      num_samples: m.
      num_heads: H.
      constant: the hidden constant of O (1 by default).
      loss_bound: range of the loss (for the vacuous flag).

    Returns:
      Bound (kind "rademacher") with terms ``prefactor``, ``cover_term``, ``sign_term``.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 4.1 and Section 4.2.
    """
    C, B_x, B_w, B_Wc, B_Wv, L_s, d, m, H, c, lb = floats(
        C, B_x, B_w, B_Wc, B_Wv, L_sigma, d, num_samples, num_heads, constant, loss_bound
    )
    sqrt_m = jnp.sqrt(m)
    inside = sqrt_m > 2.0 * B_x * jnp.sqrt(C)
    ratio = jnp.where(inside, sqrt_m / (2.0 * B_x * jnp.sqrt(C)), 1.0)
    cover_term = 2.0 * B_x**2 * jnp.sqrt(C) / sqrt_m * (1.0 + jnp.log(ratio))
    sign_term = B_x * jnp.sqrt(jnp.log(2.0 * d) / m)
    prefactor = c * H * B_w * B_Wc * L_s * B_Wv
    # Dudley with delta = B_x bounds the expectation by B_x whatever m is (the printed formula
    # turns negative when the optimal delta leaves [0, B_x]).
    inner = jnp.where(inside, jnp.minimum(cover_term + sign_term, B_x), B_x)
    value = prefactor * inner
    return Bound(
        value=value,
        terms={"prefactor": prefactor, "cover_term": cover_term, "sign_term": sign_term, "C": C},
        hypotheses={
            "m > d": m > d,
            "m > ln(2d)": m > jnp.log(2.0 * d),
            "Dudley optimum inside [0, B_x]": inside,
        },
        vacuous=2.0 * value >= lb,
        name="Trauger & Tewari Theorem 4.1",
        kind="rademacher",
        assumed=("sigma L_sigma-Lipschitz with sigma(0) = 0", "norm bounds hold for every weight"),
    )


def _corollary_4_1(lemma, name: str, *, B_x, B_WQK, d, **kw) -> Bound:
    cover = lemma(B_x=B_x, B_w=B_WQK, d=d, k=d)
    out = theorem_4_1(C=cover.terms["C"], B_x=B_x, d=d, **kw)
    # alpha of the corollary statement: 2 B_x^2 sqrt(C) = B_x^3 alpha.
    (bx,) = floats(B_x)
    alpha = 2.0 * jnp.sqrt(cover.terms["C"]) / bx
    return Bound(
        value=out.value,
        terms={**out.terms, "alpha": alpha},
        hypotheses=out.hypotheses,
        vacuous=out.vacuous,
        name=name,
        kind="rademacher",
        status=out.status,
        assumed=out.assumed,
    )


def corollary_4_1_1(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_samples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.6: $\|W_{QK}\|_{1,1} \le B_{W_{QK}}$, $\|x\|_2 \le B_x$.

    $C = B_x^2 B_{W_{QK}}^2\ln(2d^2+1)$ substituted into :func:`theorem_4_1`, i.e.
    $B(\frac{B_x^3\alpha}{\sqrt m}(1+\ln\frac{\sqrt m}{B_x^2\alpha}) + B_x\sqrt{\ln(2d)/m})$ with
    $\alpha = 2B_{W_{QK}}\sqrt{\ln(2d^2+1)}$. Note: the paper prints
    $\alpha = B_{W_{QK}}\sqrt{2\log(2d^2+1)}$ (a factor $\sqrt 2$ smaller), which does not follow
    from Theorem 4.1 with Lemma 3.6; we use the substitution (consistent with D.0.1 and D.0.2).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary 4.1.1.
    """
    return _corollary_4_1(
        covering.lemma_3_6_log_cover,
        "Trauger & Tewari Corollary 4.1.1",
        B_x=B_x,
        B_WQK=B_WQK,
        d=d,
        B_w=B_w,
        B_Wc=B_Wc,
        B_Wv=B_Wv,
        L_sigma=L_sigma,
        num_samples=num_samples,
        **kw,
    )


def corollary_d_0_1(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_samples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.3: $\|W_{QK}\|_{1,\infty} \le B_{W_{QK}}$, $\|x\|_1 \le B_x$.

    $C = d B_x^2 B_{W_{QK}}^2 \ln(2d+1)$, i.e. $\alpha = 2B_{W_{QK}}\sqrt{d\ln(2d+1)}$ as printed.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary D.0.1.
    """
    return _corollary_4_1(
        covering.lemma_3_3_log_cover,
        "Trauger & Tewari Corollary D.0.1",
        B_x=B_x,
        B_WQK=B_WQK,
        d=d,
        B_w=B_w,
        B_Wc=B_Wc,
        B_Wv=B_Wv,
        L_sigma=L_sigma,
        num_samples=num_samples,
        **kw,
    )


def corollary_d_0_2(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_samples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.4: $\|W_{QK}\|_{2,1} \le B_{W_{QK}}$, $\|x\|_1 \le B_x$.

    $C = B_x^2 B_{W_{QK}}^2 \ln(d^2)$, i.e. $\alpha = 2B_{W_{QK}}\sqrt{2\ln d}$ as printed.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary D.0.2.
    """
    return _corollary_4_1(
        covering.lemma_3_4_log_cover,
        "Trauger & Tewari Corollary D.0.2",
        B_x=B_x,
        B_WQK=B_WQK,
        d=d,
        B_w=B_w,
        B_Wc=B_Wc,
        B_Wv=B_Wv,
        L_sigma=L_sigma,
        num_samples=num_samples,
        **kw,
    )


def multi_layer_log_cover(*, C_1, C_Bx, num_layers: int, L_sigma, B_c2, B_v2, B_QK2, B_w) -> Bound:
    r"""Log cover of the L-layer scalar Transformer (Theorem 4.2): $(\gamma + \eta)^3/\epsilon^2$.

    $$\alpha_i = \prod_{j=i+1}^{L} L_\sigma B_{c2}B_{v2}(1 + 4B_{QK2}),\quad
      \tau_i = \alpha_i^{2/3} + (2\alpha_i L_\sigma B_{c2}B_{v2})^{2/3}
      + (\alpha_i L_\sigma B_{v2})^{2/3},$$
    $$\gamma = C_{B_x}^{1/3}(2L_\sigma B_{c2}B_{v2}\alpha_1 B_w)^{2/3}
      + C_1^{1/3}(1 + (B_w L_\sigma B_{v2})^{2/3}),\quad
      \eta = C_1^{1/3} B_w^{2/3}\sum_{i=2}^{L}\tau_i.$$
    ``value`` is $(\gamma+\eta)^3$, the coefficient of $1/\epsilon^2$ (formula as printed).

    Args:
      C_1: linear cover coefficient for inputs of l2 norm <= 1.
      C_Bx: linear cover coefficient for inputs of l2 norm <= B_x (first layer's W_QK).
      num_layers: L >= 1. Static.
      L_sigma: activation Lipschitz constant.
      B_c2: spectral bound on W_c^(i).
      B_v2: spectral bound on W_v^(i).
      B_QK2: spectral bound on W_QK^(i).
      B_w: bound on the readout ||w||.

    Returns:
      Bound (kind "log_cover") with terms ``alpha`` (shape (..., L)), ``tau``, ``gamma``, ``eta``.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 4.2 (after Edelman et al. Theorem A.17).

    >>> r = multi_layer_log_cover(C_1=1.0, C_Bx=1.0, num_layers=1, L_sigma=1.0, B_c2=1.0,
    ...                           B_v2=1.0, B_QK2=1.0, B_w=1.0)
    >>> round(float(r.value), 6)  # (2^(2/3) + 2)^3
    46.167865
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers: expected an int >= 1, got {num_layers!r}")
    C_1, C_Bx, L_s, B_c2, B_v2, B_QK2, B_w = floats(C_1, C_Bx, L_sigma, B_c2, B_v2, B_QK2, B_w)
    r = L_s * B_c2 * B_v2 * (1.0 + 4.0 * B_QK2)
    t = 2.0 / 3.0
    alphas = [r ** (num_layers - i) for i in range(1, num_layers + 1)]  # alpha_1..alpha_L
    taus = [a**t + (2.0 * a * L_s * B_c2 * B_v2) ** t + (a * L_s * B_v2) ** t for a in alphas]
    gamma = C_Bx ** (1 / 3) * (2.0 * L_s * B_c2 * B_v2 * alphas[0] * B_w) ** t + C_1 ** (1 / 3) * (
        1.0 + (B_w * L_s * B_v2) ** t
    )
    tau_sum = sum(taus[1:], jnp.zeros_like(gamma))
    eta = C_1 ** (1 / 3) * B_w**t * tau_sum
    value = (gamma + eta) ** 3
    return Bound(
        value=value,
        terms={
            "alpha": jnp.stack(jnp.broadcast_arrays(*alphas), axis=-1),
            "tau": jnp.stack(jnp.broadcast_arrays(*taus), axis=-1),
            "gamma": gamma,
            "eta": eta,
            "C": value,
        },
        hypotheses={},
        vacuous=jnp.zeros(jnp.shape(value), dtype=bool),
        name="Trauger & Tewari Theorem 4.2",
        kind="log_cover",
        assumed=("inputs and rows projected to the unit ball (Pi_norm)", "spectral bounds hold"),
    )


def multi_layer_rademacher(
    *, cover: Bound, B_w, num_samples, constant_delta=4.0, constant_integral=12.0, loss_bound=1.0
) -> Bound:
    r"""Rademacher bound of the L-layer model from its cover $(\gamma+\eta)^3/\epsilon^2$ (Dudley).

    The scalar output is at most $B_w$ in absolute value (rows are projected to the unit ball),
    so the Dudley radius is $A = B_w$. See :func:`covering.dudley_rademacher`.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Section 4.3.
    """
    out = covering.dudley_rademacher(
        C=cover.terms["C"],
        A=B_w,
        num_samples=num_samples,
        constant_delta=constant_delta,
        constant_integral=constant_integral,
    )
    (lb,) = floats(loss_bound)
    return Bound(
        value=out.value,
        terms={**out.terms, "cover_C": cover.terms["C"]},
        hypotheses=cover.hypotheses,
        vacuous=2.0 * out.value >= lb,
        name=cover.name + " (Dudley)",
        kind="rademacher",
        status=cover.status,
        assumed=cover.assumed,
    )


def _corollary_4_2(C_1, C_Bx, name, *, num_layers, L_sigma, B_c2, B_v2, B_QK2, B_w) -> Bound:
    out = multi_layer_log_cover(
        C_1=C_1,
        C_Bx=C_Bx,
        num_layers=num_layers,
        L_sigma=L_sigma,
        B_c2=B_c2,
        B_v2=B_v2,
        B_QK2=B_QK2,
        B_w=B_w,
    )
    return Bound(
        value=out.value,
        terms={**out.terms, "C_1": C_1, "C_Bx": C_Bx},
        hypotheses=out.hypotheses,
        vacuous=out.vacuous,
        name=name,
        kind="log_cover",
        assumed=out.assumed,
    )


def corollary_4_2_1(*, B, B_x, d, k, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.6 (all matrices $\|\cdot\|_{1,1} \le B$).

    $C_1 = B^2\ln(2dk+1)$, $C_{B_x} = B^2 B_x^2\ln(2dk+1)$.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary 4.2.1.
    """
    B, B_x, d, k = floats(B, B_x, d, k)
    lg = jnp.log(2.0 * d * k + 1.0)
    return _corollary_4_2(B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary 4.2.1", **kw)


def corollary_f_0_1(*, B, B_x, d, k, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.3 (all matrices $\|\cdot\|_{1,\infty} \le B$).

    $C_1 = dB^2\ln(2k+1)$, $C_{B_x} = dB^2B_x^2\ln(2k+1)$.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary F.0.1.
    """
    B, B_x, d, k = floats(B, B_x, d, k)
    lg = d * jnp.log(2.0 * k + 1.0)
    return _corollary_4_2(B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary F.0.1", **kw)


def corollary_f_0_2(*, B, B_x, d, k, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.4 (all matrices $\|\cdot\|_{2,1} \le B$).

    $C_1 = B^2\ln(dk)$, $C_{B_x} = B^2B_x^2\ln(dk)$.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary F.0.2.
    """
    B, B_x, d, k = floats(B, B_x, d, k)
    lg = jnp.log(d * k)
    return _corollary_4_2(B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary F.0.2", **kw)


def masked_word_rademacher(
    *, scalar_rademacher, vocab_size, lipschitz=2.0, loss_bound=None
) -> Bound:
    r"""Masked-word prediction (Theorem 5.1): vocabulary K costs a $\tilde O(\sqrt K)$ factor.

    Cross-entropy with softmax is 2-Lipschitz in $\ell_\infty$ (Appendix G), so by Foster &
    Rakhlin's vector contraction
    $\mathrm{Rad}(\ell\circ\mathcal F) \lesssim 2\sqrt K \max_s \mathrm{Rad}(\mathcal F_s)$,
    where $\mathcal F_s$ is the scalar model of Theorem 4.1 / 4.2 with readout row s.
    Log factors of the $\tilde O$ are dropped.

    Args:
      scalar_rademacher: the scalar-output Rademacher bound (Theorem 4.1 or 4.2).
      vocab_size: K.
      lipschitz: l_inf Lipschitz constant of the loss (2 for cross-entropy).
      loss_bound: range of the loss for the vacuous flag (default: no flag).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 5.1; Foster & Rakhlin 2019, arXiv:1904.12101.
    """
    rad, K, lip = floats(scalar_rademacher, vocab_size, lipschitz)
    factor = lip * jnp.sqrt(K)
    value = factor * rad
    vac = jnp.zeros(jnp.shape(value), bool) if loss_bound is None else 2.0 * value >= loss_bound
    return Bound(
        value=value,
        terms={"factor": factor, "scalar_rademacher": rad},
        hypotheses={},
        vacuous=vac,
        name="Trauger & Tewari Theorem 5.1 (masked word)",
        kind="rademacher",
    )
