r"""Trauger & Tewari 2024: sequence-length independent norm-based bounds for Transformers.

Single layer (Theorem 4.1, Corollaries 4.1.1, D.0.1, D.0.2, H heads), L layers (Theorem 4.2,
Corollaries 4.2.1, F.0.1, F.0.2) and the masked-word factor of Theorem 5.1. Nothing here depends
on the sequence length T; compare :mod:`jaxbounds.bounds.edelman`, where log T enters.

The paper states Theorem 4.1 as $O(\cdot)$: the calculators return the expression inside the
$O$ times ``constant`` (default 1), i.e. an order-level value, not a certified bound.
Calculators compute in float64 numpy, validate their inputs (``ValueError`` naming the argument;
``strict=False`` returns a not-valid bound instead) and report the hypotheses they can check.

References:
  Trauger & Tewari 2024, arXiv:2310.13088.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxbounds.bounds import covering
from jaxbounds.bounds._result import Bound, Check, Inputs, int_option, log_2x_plus_1, quiet

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


def _theorem_4_1_inputs(ins: Inputs, C, B_x, B_w, B_Wc, B_Wv, L_sigma, d, m, H, c, lb) -> tuple:
    return (
        ins.nonneg("C", C),
        ins.nonneg("B_x", B_x),
        ins.nonneg("B_w", B_w),
        ins.nonneg("B_Wc", B_Wc),
        ins.nonneg("B_Wv", B_Wv),
        ins.nonneg("L_sigma", L_sigma),
        ins.count("d", d),
        ins.count("num_examples", m),
        ins.count("num_heads", H),
        ins.positive("constant", c),
        ins.positive("loss_bound", lb),
    )


@quiet
def theorem_4_1(
    *, C, B_x, B_w, B_Wc, B_Wv, L_sigma, d, num_examples, num_heads=1, constant=1.0,
    loss_bound=1.0, strict=True,
) -> Bound:  # fmt: skip
    r"""Rademacher complexity of a one-layer scalar Transformer (Theorem 4.1, H heads).

    $$\mathrm{Rad} = O\Big(H B_w B_{W_c} L_\sigma B_{W_v}\Big[\frac{2B_x^2\sqrt C}{\sqrt m}
      \Big(1 + \ln\frac{\sqrt m}{2B_x\sqrt C}\Big) + B_x\sqrt{\frac{\ln(2d)}{m}}\Big]\Big)$$
    with $\|w\|_1 \le B_w$, $\|W_c^\top\|_{1,\infty} \le B_{W_c}$,
    $\|W_v^\top\|_{1,\infty} \le B_{W_v}$, $\|x\|_2 \le B_x$, and a cover $C/\epsilon^2$ of
    $\{x \mapsto W_{QK}x\}$ on those inputs. H heads multiply by H (Section 4.2). Returns
    ``constant`` times the expression inside O, capped at the Dudley radius $B_x$ (taking
    $\delta = B_x$ in the proof's integral; the printed expression goes negative when
    $\sqrt m \le 2B_x\sqrt C$; the term ``dudley_inside`` says which branch was used).
    Hypotheses checked: m > d and m > ln(2d). Vacuous when ``2 * value >= loss_bound``.

    Args:
      C: cover coefficient of the W_QK class (>= 0; e.g. ``covering.lemma_3_6_log_cover``).
      B_x: input l2 bound (>= 0).
      B_w: readout l1 bound (>= 0).
      B_Wc: bound on ||W_c^T||_{1,inf} (>= 0).
      B_Wv: bound on ||W_v^T||_{1,inf} (>= 0).
      L_sigma: Lipschitz constant of the activation (>= 0, sigma(0) = 0).
      d: embedding dimension (integer >= 1).
      num_examples: m (integer >= 1).
      num_heads: H (integer >= 1).
      constant: the hidden constant of O (> 0, 1 by default).
      loss_bound: range of the loss (> 0, for the vacuous state).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "rademacher") with terms ``prefactor``, ``cover_term``, ``sign_term``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 4.1 and Section 4.2.
    """
    ins = Inputs(strict)
    C, B_x, B_w, B_Wc, B_Wv, L_s, d, m, H, c, lb = _theorem_4_1_inputs(
        ins, C, B_x, B_w, B_Wc, B_Wv, L_sigma, d, num_examples, num_heads, constant, loss_bound
    )
    terms = _theorem_4_1_terms(C, B_x, d, m, prefactor=c * H * B_w * B_Wc * L_s * B_Wv)
    return ins.bound(
        value=terms.pop("value"),
        terms=terms,
        hypotheses=_theorem_4_1_hypotheses(m, d),
        trivial=lb / 2.0,
        name="Trauger & Tewari Theorem 4.1",
        kind="rademacher",
        assumed=("sigma L_sigma-Lipschitz with sigma(0) = 0", "norm bounds hold for every weight"),
    )  # fmt: skip


def _theorem_4_1_terms(C, B_x, d, m, *, prefactor) -> dict[str, np.ndarray]:
    """The bracket of Theorem 4.1, capped at the Dudley radius B_x, times the prefactor."""
    scale = 2.0 * B_x * np.sqrt(C)
    inside = np.sqrt(m) > scale
    # ln(sqrt(m) / scale) as a difference of logs: the ratio overflows for a subnormal scale.
    log_ratio = np.where(inside & (scale > 0), 0.5 * np.log(m) - np.log(scale), 0.0)
    cover_term = B_x * scale / np.sqrt(m) * (1.0 + log_ratio)
    sign_term = B_x * np.sqrt((np.log(2.0) + np.log(d)) / m)
    # Dudley with delta = B_x bounds the expectation by B_x whatever m is.
    inner = np.where(inside, np.minimum(cover_term + sign_term, B_x), B_x)
    return {
        "value": prefactor * inner, "prefactor": prefactor, "cover_term": cover_term,
        "sign_term": sign_term, "C": C, "dudley_inside": inside,
    }  # fmt: skip


def _theorem_4_1_hypotheses(m: np.ndarray, d: np.ndarray) -> dict[str, Check]:
    ln2d = np.log(2.0) + np.log(d)
    return {
        "m > d": Check.of(m > d, m=m, d=d),
        "m > ln(2d)": Check.of(m > ln2d, m=m, **{"ln(2d)": ln2d}),
    }


def _corollary_4_1(lemma, name: str, *, B_x, B_WQK, d, strict=True, **kw) -> Bound:
    ins = Inputs(strict)
    B_x, B_WQK, d = ins.nonneg("B_x", B_x), ins.nonneg("B_WQK", B_WQK), ins.count("d", d)
    cover = lemma(B_x=B_x, B_w=B_WQK, d=d, k=d, strict=False)
    out = theorem_4_1(C=cover.terms["C"], B_x=B_x, d=d, strict=strict, **kw)
    # alpha of the corollary statement: 2 B_x^2 sqrt(C) = B_x^3 alpha.
    alpha = np.where(B_x > 0, 2.0 * np.sqrt(cover.terms["C"]) / np.where(B_x > 0, B_x, 1.0), 0.0)
    return ins.bound(
        value=out.value,
        terms={**out.terms, "alpha": alpha},
        hypotheses=out.hypotheses,
        trivial=out.trivial,
        name=name,
        kind="rademacher",
        provenance=out.provenance,
        assumed=out.assumed,
    )


@quiet
def corollary_4_1_1(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_examples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.6: $\|W_{QK}\|_{1,1} \le B_{W_{QK}}$, $\|x\|_2 \le B_x$.

    $C = B_x^2 B_{W_{QK}}^2\ln(2d^2+1)$ substituted into :func:`theorem_4_1`, i.e.
    $B(\frac{B_x^3\alpha}{\sqrt m}(1+\ln\frac{\sqrt m}{B_x^2\alpha}) + B_x\sqrt{\ln(2d)/m})$ with
    $\alpha = 2B_{W_{QK}}\sqrt{\ln(2d^2+1)}$. Note: the paper prints
    $\alpha = B_{W_{QK}}\sqrt{2\log(2d^2+1)}$ (a factor $\sqrt 2$ smaller), which does not follow
    from Theorem 4.1 with Lemma 3.6; we use the substitution (consistent with D.0.1 and D.0.2).
    Arguments as in :func:`theorem_4_1` (``B_WQK >= 0`` too; ``strict``, ``num_heads``,
    ``constant``, ``loss_bound`` through ``**kw``).

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary 4.1.1.

    >>> r = corollary_4_1_1(B_x=1.0, B_WQK=2.0, B_w=1.0, B_Wc=1.0, B_Wv=1.0, L_sigma=1.0, d=16,
    ...                     num_examples=10_000)
    >>> round(float(r.value), 6), str(r.status)
    (0.348696, 'valid, non-vacuous')
    """
    return _corollary_4_1(
        covering.lemma_3_6_log_cover, "Trauger & Tewari Corollary 4.1.1", B_x=B_x, B_WQK=B_WQK,
        d=d, B_w=B_w, B_Wc=B_Wc, B_Wv=B_Wv, L_sigma=L_sigma, num_examples=num_examples, **kw,
    )  # fmt: skip


@quiet
def corollary_d_0_1(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_examples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.3: $\|W_{QK}\|_{1,\infty} \le B_{W_{QK}}$, $\|x\|_1 \le B_x$.

    $C = d B_x^2 B_{W_{QK}}^2 \ln(2d+1)$, i.e. $\alpha = 2B_{W_{QK}}\sqrt{d\ln(2d+1)}$ as printed.
    Arguments as in :func:`corollary_4_1_1`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary D.0.1.
    """
    return _corollary_4_1(
        covering.lemma_3_3_log_cover, "Trauger & Tewari Corollary D.0.1", B_x=B_x, B_WQK=B_WQK,
        d=d, B_w=B_w, B_Wc=B_Wc, B_Wv=B_Wv, L_sigma=L_sigma, num_examples=num_examples, **kw,
    )  # fmt: skip


@quiet
def corollary_d_0_2(*, B_x, B_WQK, B_w, B_Wc, B_Wv, L_sigma, d, num_examples, **kw) -> Bound:
    r"""Theorem 4.1 with Lemma 3.4: $\|W_{QK}\|_{2,1} \le B_{W_{QK}}$, $\|x\|_1 \le B_x$.

    $C = B_x^2 B_{W_{QK}}^2 \ln(d^2)$, i.e. $\alpha = 2B_{W_{QK}}\sqrt{2\ln d}$ as printed.
    Arguments as in :func:`corollary_4_1_1`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary D.0.2.
    """
    return _corollary_4_1(
        covering.lemma_3_4_log_cover, "Trauger & Tewari Corollary D.0.2", B_x=B_x, B_WQK=B_WQK,
        d=d, B_w=B_w, B_Wc=B_Wc, B_Wv=B_Wv, L_sigma=L_sigma, num_examples=num_examples, **kw,
    )  # fmt: skip


def _theorem_4_2(L: int, C_1, C_Bx, L_s, B_c2, B_v2, B_QK2, B_w) -> dict[str, np.ndarray]:
    """alpha_1..alpha_L, tau_1..tau_L, gamma, eta and C = (gamma + eta)^3 of Theorem 4.2."""
    r = L_s * B_c2 * B_v2 * (1.0 + 4.0 * B_QK2)
    t = 2.0 / 3.0
    alphas = [r ** (L - i) for i in range(1, L + 1)]
    taus = [a**t + (2.0 * a * L_s * B_c2 * B_v2) ** t + (a * L_s * B_v2) ** t for a in alphas]
    gamma = C_Bx ** (1 / 3) * (2.0 * L_s * B_c2 * B_v2 * alphas[0] * B_w) ** t
    gamma = gamma + C_1 ** (1 / 3) * (1.0 + (B_w * L_s * B_v2) ** t)
    eta = C_1 ** (1 / 3) * B_w**t * sum(taus[1:], np.zeros_like(gamma))
    return {
        "alpha": np.stack(np.broadcast_arrays(*alphas), axis=-1),
        "tau": np.stack(np.broadcast_arrays(*taus), axis=-1),
        "gamma": gamma,
        "eta": eta,
        "C": (gamma + eta) ** 3,
    }


@quiet
def multi_layer_log_cover(
    *, C_1, C_Bx, num_layers: int, L_sigma, B_c2, B_v2, B_QK2, B_w, strict=True
) -> Bound:
    r"""Log cover of the L-layer scalar Transformer (Theorem 4.2): $(\gamma + \eta)^3/\epsilon^2$.

    $$\alpha_i = \prod_{j=i+1}^{L} L_\sigma B_{c2}B_{v2}(1 + 4B_{QK2}),\quad
      \tau_i = \alpha_i^{2/3} + (2\alpha_i L_\sigma B_{c2}B_{v2})^{2/3}
      + (\alpha_i L_\sigma B_{v2})^{2/3},$$
    $$\gamma = C_{B_x}^{1/3}(2L_\sigma B_{c2}B_{v2}\alpha_1 B_w)^{2/3}
      + C_1^{1/3}(1 + (B_w L_\sigma B_{v2})^{2/3}),\quad
      \eta = C_1^{1/3} B_w^{2/3}\sum_{i=2}^{L}\tau_i.$$
    ``value`` is $(\gamma+\eta)^3$, the coefficient of $1/\epsilon^2$ (formula as printed).

    Args:
      C_1: linear cover coefficient for inputs of l2 norm <= 1 (>= 0).
      C_Bx: linear cover coefficient for inputs of l2 norm <= B_x (first layer's W_QK, >= 0).
      num_layers: L, a Python int >= 1. Static.
      L_sigma: activation Lipschitz constant (>= 0).
      B_c2: spectral bound on W_c^(i) (>= 0).
      B_v2: spectral bound on W_v^(i) (>= 0).
      B_QK2: spectral bound on W_QK^(i) (>= 0).
      B_w: bound on the readout ||w|| (>= 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "log_cover") with terms ``alpha`` (shape (..., L)), ``tau``, ``gamma``, ``eta``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (``num_layers`` always).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 4.2 (after Edelman et al. Theorem A.17).

    >>> r = multi_layer_log_cover(C_1=1.0, C_Bx=1.0, num_layers=1, L_sigma=1.0, B_c2=1.0,
    ...                           B_v2=1.0, B_QK2=1.0, B_w=1.0)
    >>> round(float(r.value), 6)  # (2^(2/3) + 2)^3
    46.167865
    """
    L = int_option("num_layers", num_layers)
    ins = Inputs(strict)
    names = ("C_1", "C_Bx", "L_sigma", "B_c2", "B_v2", "B_QK2", "B_w")
    values = (C_1, C_Bx, L_sigma, B_c2, B_v2, B_QK2, B_w)
    terms = _theorem_4_2(L, *(ins.nonneg(n, v) for n, v in zip(names, values, strict=True)))
    return ins.bound(
        value=terms["C"],
        terms=terms,
        hypotheses={},
        name="Trauger & Tewari Theorem 4.2",
        kind="log_cover",
        assumed=("inputs and rows projected to the unit ball (Pi_norm)", "spectral bounds hold"),
    )


@quiet
def multi_layer_rademacher(
    *, cover: Bound, B_w, num_examples, coef_delta=4.0, coef_integral=12.0, loss_bound=1.0,
    strict=True,
) -> Bound:  # fmt: skip
    r"""Rademacher bound of the L-layer model from its cover $(\gamma+\eta)^3/\epsilon^2$ (Dudley).

    The scalar output is at most $B_w$ in absolute value (rows are projected to the unit ball),
    so the Dudley radius is $A = B_w$. See :func:`covering.dudley_rademacher`. The cover's
    hypotheses (and input failures) carry over. Vacuous when ``2 * value >= loss_bound``.

    Args:
      cover: the Theorem 4.2 cover (:func:`multi_layer_log_cover` or a corollary).
      B_w: readout norm bound (> 0), the Dudley radius.
      num_examples: m (integer >= 1).
      coef_delta: Dudley's c_0.
      coef_integral: Dudley's c_1.
      loss_bound: range of the loss (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Section 4.3.
    """
    ins = Inputs(strict)
    B_w, n = ins.positive("B_w", B_w), ins.count("num_examples", num_examples)
    lb = ins.positive("loss_bound", loss_bound)
    out = covering.dudley_rademacher(
        C=cover.terms["C"], radius=B_w, num_examples=n, coef_delta=coef_delta,
        coef_integral=coef_integral, strict=strict,
    )  # fmt: skip
    return ins.bound(
        value=out.value,
        terms={**out.terms, "cover_C": cover.terms["C"]},
        hypotheses={**cover.hypotheses, **out.hypotheses},
        trivial=lb / 2.0,
        name=cover.name + " (Dudley)",
        kind="rademacher",
        provenance=cover.provenance,
        assumed=cover.assumed,
    )


def _corollary_4_2(ins: Inputs, C_1, C_Bx, name: str, **kw: Any) -> Bound:
    out = multi_layer_log_cover(C_1=C_1, C_Bx=C_Bx, strict=ins.strict, **kw)
    return ins.bound(
        value=out.value,
        terms={**out.terms, "C_1": C_1, "C_Bx": C_Bx},
        hypotheses=out.hypotheses,
        name=name,
        kind="log_cover",
        assumed=out.assumed,
    )


def _corollary_4_2_inputs(strict, B, B_x, d, k) -> tuple:
    ins = Inputs(strict)
    return ins, ins.nonneg("B", B), ins.nonneg("B_x", B_x), ins.count("d", d), ins.count("k", k)


@quiet
def corollary_4_2_1(*, B, B_x, d, k, strict=True, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.6 (all matrices $\|\cdot\|_{1,1} \le B$).

    $C_1 = B^2\ln(2dk+1)$, $C_{B_x} = B^2 B_x^2\ln(2dk+1)$. ``B, B_x >= 0``, ``d, k`` integers
    >= 1, the rest (``num_layers``, ``L_sigma``, ``B_c2``, ``B_v2``, ``B_QK2``, ``B_w``) as in
    :func:`multi_layer_log_cover`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary 4.2.1.
    """
    ins, B, B_x, d, k = _corollary_4_2_inputs(strict, B, B_x, d, k)
    lg = log_2x_plus_1(d, k)
    return _corollary_4_2(
        ins, B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary 4.2.1", **kw
    )


@quiet
def corollary_f_0_1(*, B, B_x, d, k, strict=True, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.3 (all matrices $\|\cdot\|_{1,\infty} \le B$).

    $C_1 = dB^2\ln(2k+1)$, $C_{B_x} = dB^2B_x^2\ln(2k+1)$. Arguments as in
    :func:`corollary_4_2_1`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary F.0.1.
    """
    ins, B, B_x, d, k = _corollary_4_2_inputs(strict, B, B_x, d, k)
    lg = d * log_2x_plus_1(k)
    return _corollary_4_2(
        ins, B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary F.0.1", **kw
    )


@quiet
def corollary_f_0_2(*, B, B_x, d, k, strict=True, **kw) -> Bound:
    r"""Theorem 4.2 with Lemma 3.4 (all matrices $\|\cdot\|_{2,1} \le B$).

    $C_1 = B^2\ln(dk)$, $C_{B_x} = B^2B_x^2\ln(dk)$. Arguments as in :func:`corollary_4_2_1`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Corollary F.0.2.
    """
    ins, B, B_x, d, k = _corollary_4_2_inputs(strict, B, B_x, d, k)
    lg = np.log(d) + np.log(k)
    return _corollary_4_2(
        ins, B**2 * lg, B**2 * B_x**2 * lg, "Trauger & Tewari Corollary F.0.2", **kw
    )


@quiet
def masked_word_rademacher(
    *, scalar_rademacher, vocab_size, lipschitz=2.0, loss_bound=None, strict=True
) -> Bound:
    r"""Masked-word prediction (Theorem 5.1): vocabulary K costs a $\tilde O(\sqrt K)$ factor.

    Cross-entropy with softmax is 2-Lipschitz in $\ell_\infty$ (Appendix G), so by Foster &
    Rakhlin's vector contraction
    $\mathrm{Rad}(\ell\circ\mathcal F) \lesssim 2\sqrt K \max_s \mathrm{Rad}(\mathcal F_s)$,
    where $\mathcal F_s$ is the scalar model of Theorem 4.1 / 4.2 with readout row s.
    Log factors of the $\tilde O$ are dropped.

    Args:
      scalar_rademacher: the scalar-output Rademacher bound (Theorem 4.1 or 4.2), a number >= 0
        or a :class:`Bound` (its hypotheses then carry over).
      vocab_size: K (integer >= 1).
      lipschitz: l_inf Lipschitz constant of the loss (>= 0; 2 for cross-entropy).
      loss_bound: range of the loss (> 0) for the vacuous state (default: never vacuous).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Theorem 5.1; Foster & Rakhlin 2019, arXiv:1904.12101.

    >>> float(masked_word_rademacher(scalar_rademacher=0.01, vocab_size=100).value)
    0.2
    """
    ins = Inputs(strict)
    hyp = scalar_rademacher.hypotheses if isinstance(scalar_rademacher, Bound) else {}
    if isinstance(scalar_rademacher, Bound):
        scalar_rademacher = scalar_rademacher.value
    rad, K = ins.nonneg("scalar_rademacher", scalar_rademacher), ins.count("vocab_size", vocab_size)
    lip = ins.nonneg("lipschitz", lipschitz)
    lb = None if loss_bound is None else ins.positive("loss_bound", loss_bound)
    factor = lip * np.sqrt(K)
    return ins.bound(
        value=factor * rad,
        terms={"factor": factor, "scalar_rademacher": rad},
        hypotheses=hyp,
        trivial=None if lb is None else lb / 2.0,
        name="Trauger & Tewari Theorem 5.1 (masked word)",
        kind="rademacher",
    )
