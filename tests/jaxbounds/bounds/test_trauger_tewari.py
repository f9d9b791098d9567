"""Trauger & Tewari calculators: closed forms, corollaries, hypotheses, validation, properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import Status, covering, trauger_tewari

FAST = settings(max_examples=25, deadline=None)

ONE = {"B_w": 2.0, "B_Wc": 1.5, "B_Wv": 1.2, "L_sigma": 1.0, "num_examples": 5000}
ML = {"L_sigma": 1.0, "B_c2": 1.1, "B_v2": 0.9, "B_QK2": 0.5, "B_w": 1.7}


def _np_theorem_4_1(C, B_x, d, m, H=1, B_w=2.0, B_Wc=1.5, B_Wv=1.2, L_s=1.0):
    inner = 2 * B_x**2 * np.sqrt(C) / np.sqrt(m) * (1 + np.log(np.sqrt(m) / (2 * B_x * np.sqrt(C))))
    return H * B_w * B_Wc * L_s * B_Wv * (inner + B_x * np.sqrt(np.log(2 * d) / m))


def test_theorem_4_1_closed_form_and_heads():
    r = trauger_tewari.theorem_4_1(C=3.0, B_x=1.3, d=16, **ONE)
    assert float(r.value) == pytest.approx(_np_theorem_4_1(3.0, 1.3, 16, 5000), rel=1e-13)
    assert r.hypotheses_hold
    assert r.status is Status.VACUOUS  # 2 * 1.24 >= 1: valid but says nothing
    r2 = trauger_tewari.theorem_4_1(C=3.0, B_x=1.3, d=16, num_heads=2, **ONE)
    assert float(r2.value) == pytest.approx(2 * float(r.value), rel=1e-14)
    small = trauger_tewari.theorem_4_1(C=3.0, B_x=1.3, d=16, **{**ONE, "num_examples": 8})
    assert not bool(small.hypotheses["m > d"])
    assert small.status is Status.NOT_VALID
    assert str(small).startswith("not valid: m > d fails (m = 8, d = 16)")
    # sqrt(m) <= 2 B_x sqrt(C): the bound is the Dudley radius B_x times the prefactor (a valid
    # branch of the formula, not a failed hypothesis)
    assert not bool(small.dudley_inside)
    assert float(small.value) == pytest.approx(2.0 * 1.5 * 1.0 * 1.2 * 1.3, rel=1e-14)
    wide = trauger_tewari.theorem_4_1(C=3e6, B_x=1.3, d=16, **ONE)
    assert not bool(wide.dudley_inside)
    assert wide.is_valid


def test_theorem_4_1_vacuous_state():
    r = trauger_tewari.theorem_4_1(C=3.0, B_x=1.3, d=16, **{**ONE, "B_w": 50.0})
    assert 2 * float(r.value) >= 1.0
    assert r.status is Status.VACUOUS
    assert str(r).endswith("(valid, vacuous)")


@pytest.mark.parametrize(
    ("corollary", "lemma", "printed_alpha"),
    [
        (
            trauger_tewari.corollary_4_1_1,
            covering.lemma_3_6_log_cover,
            lambda B, d: B * np.sqrt(2 * np.log(2 * d**2 + 1)),
        ),
        (
            trauger_tewari.corollary_d_0_1,
            covering.lemma_3_3_log_cover,
            lambda B, d: 2 * B * np.sqrt(d * np.log(2 * d + 1)),
        ),
        (
            trauger_tewari.corollary_d_0_2,
            covering.lemma_3_4_log_cover,
            lambda B, d: 2 * B * np.sqrt(2 * np.log(d)),
        ),
    ],
)
def test_theorem_4_1_corollaries_equal_theorem_with_lemma(corollary, lemma, printed_alpha):
    B_x, B_QK, d = 1.3, 0.7, 16
    cor = corollary(B_x=B_x, B_WQK=B_QK, d=d, **ONE)
    C = lemma(B_x=B_x, B_w=B_QK, d=d, k=d).C
    thm = trauger_tewari.theorem_4_1(C=C, B_x=B_x, d=d, **ONE)
    assert float(cor.value) == pytest.approx(float(thm.value), rel=1e-12)
    # the corollary's alpha (2 B_x^2 sqrt(C) = B_x^3 alpha) against the paper's printed alpha
    if corollary is trauger_tewari.corollary_4_1_1:
        # printed alpha = B sqrt(2 log(2d^2+1)); substitution gives 2 B sqrt(log(2d^2+1)):
        # a factor sqrt(2) apart (paper typo; we follow the substitution).
        assert float(cor.alpha) == pytest.approx(np.sqrt(2) * printed_alpha(B_QK, d))
    else:
        assert float(cor.alpha) == pytest.approx(printed_alpha(B_QK, d))


GOOD_4_1_1 = {"B_x": 1.0, "B_WQK": 2.0, "B_w": 1.0, "B_Wc": 1.0, "B_Wv": 1.0, "L_sigma": 1.0,
              "d": 16, "num_examples": 10000}  # fmt: skip


def test_corollary_4_1_1_reproduced_bad_inputs():
    """Issue 11: B_w = -1 returned -0.349 flagged non-vacuous; d = 0 returned NaN."""
    with pytest.raises(ValueError, match="B_w: expected a finite number >= 0, got -1"):
        trauger_tewari.corollary_4_1_1(**{**GOOD_4_1_1, "B_w": -1.0})
    with pytest.raises(ValueError, match="d: expected an integer >= 1, got 0"):
        trauger_tewari.corollary_4_1_1(**{**GOOD_4_1_1, "d": 0})
    lax = trauger_tewari.corollary_4_1_1(**{**GOOD_4_1_1, "B_w": -1.0}, strict=False)
    assert float(lax.value) < 0  # the value is kept for inspection ...
    assert lax.status is Status.NOT_VALID  # ... but never shown as a usable number
    assert str(lax) == "not valid: B_w: a finite number >= 0 fails (B_w = -1)"


@pytest.mark.parametrize(
    ("arg", "bad"),
    [("B_x", -1.0), ("B_WQK", np.nan), ("B_Wc", np.inf), ("B_Wv", -0.5), ("L_sigma", -1.0),
     ("d", 2.5), ("num_examples", 0), ("num_heads", 0), ("constant", 0.0), ("loss_bound", -1.0)],
)  # fmt: skip
@pytest.mark.parametrize(
    "corollary",
    [
        trauger_tewari.corollary_4_1_1,
        trauger_tewari.corollary_d_0_1,
        trauger_tewari.corollary_d_0_2,
    ],
)
def test_theorem_4_1_corollaries_validate(corollary, arg, bad):
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        corollary(**{**GOOD_4_1_1, arg: bad})
    assert corollary(**{**GOOD_4_1_1, arg: bad}, strict=False).status is Status.NOT_VALID


def _np_theorem_4_2(C_1, C_Bx, L, Ls, Bc, Bv, Bqk, Bw):
    alpha = [
        np.prod([Ls * Bc * Bv * (1 + 4 * Bqk) for _ in range(i + 1, L + 1)])
        for i in range(1, L + 1)
    ]
    tau = [
        a ** (2 / 3) + (2 * a * Ls * Bc * Bv) ** (2 / 3) + (a * Ls * Bv) ** (2 / 3) for a in alpha
    ]
    gamma = C_Bx ** (1 / 3) * (2 * Ls * Bc * Bv * alpha[0] * Bw) ** (2 / 3) + C_1 ** (1 / 3) * (
        1 + (Bw * Ls * Bv) ** (2 / 3)
    )
    eta = C_1 ** (1 / 3) * Bw ** (2 / 3) * sum(tau[1:])
    return (gamma + eta) ** 3, gamma, eta


@pytest.mark.parametrize("L", [1, 2, 4])
def test_theorem_4_2_matches_reference(L):
    r = trauger_tewari.multi_layer_log_cover(C_1=2.0, C_Bx=5.0, num_layers=L, **ML)
    ref, gamma, eta = _np_theorem_4_2(2.0, 5.0, L, 1.0, 1.1, 0.9, 0.5, 1.7)
    assert float(r.value) == pytest.approx(ref, rel=1e-12)
    assert float(r.gamma) == pytest.approx(gamma)
    assert float(r.eta) == pytest.approx(eta)
    assert r.alpha.shape == (L,)
    assert r.status is Status.NON_VACUOUS  # a log cover is never vacuous


def test_theorem_4_2_with_one_layer_reduces():
    """L = 1: alpha_1 = 1 (empty product), eta = 0 (empty sum), so the cover is gamma^3 with
    gamma = C_Bx^{1/3} (2 L_s B_c2 B_v2 B_w)^{2/3} + C_1^{1/3} (1 + (B_w L_s B_v2)^{2/3})."""
    r = trauger_tewari.multi_layer_log_cover(C_1=2.0, C_Bx=5.0, num_layers=1, **ML)
    assert float(r.alpha[0]) == 1.0
    assert float(r.eta) == 0.0
    g = 5.0 ** (1 / 3) * (2 * 1.1 * 0.9 * 1.7) ** (2 / 3) + 2.0 ** (1 / 3) * (
        1 + (1.7 * 0.9) ** (2 / 3)
    )
    assert float(r.value) == pytest.approx(g**3, rel=1e-12)


@pytest.mark.parametrize(
    ("corollary", "lemma"),
    [
        (trauger_tewari.corollary_4_2_1, covering.lemma_3_6_log_cover),
        (trauger_tewari.corollary_f_0_1, covering.lemma_3_3_log_cover),
        (trauger_tewari.corollary_f_0_2, covering.lemma_3_4_log_cover),
    ],
)
def test_theorem_4_2_corollaries_equal_theorem_with_lemma(corollary, lemma):
    B, B_x, d, k = 0.8, 2.5, 8, 12
    cor = corollary(B=B, B_x=B_x, d=d, k=k, num_layers=3, **ML)
    C_1 = lemma(B_x=1.0, B_w=B, d=d, k=k).C
    C_Bx = lemma(B_x=B_x, B_w=B, d=d, k=k).C
    thm = trauger_tewari.multi_layer_log_cover(C_1=C_1, C_Bx=C_Bx, num_layers=3, **ML)
    assert float(cor.value) == pytest.approx(float(thm.value), rel=1e-12)
    with pytest.raises(ValueError, match=r"^k: expected an integer >= 1"):
        corollary(B=B, B_x=B_x, d=d, k=0, num_layers=3, **ML)
    with pytest.raises(ValueError, match=r"^B_v2: expected a finite number >= 0"):
        corollary(B=B, B_x=B_x, d=d, k=k, num_layers=3, **{**ML, "B_v2": -1.0})
    lax = corollary(B=-B, B_x=B_x, d=d, k=k, num_layers=3, **ML, strict=False)
    assert lax.status is Status.NOT_VALID


def test_multi_layer_rademacher_and_num_layers_checked():
    cover = trauger_tewari.multi_layer_log_cover(C_1=2.0, C_Bx=5.0, num_layers=2, **ML)
    rad = trauger_tewari.multi_layer_rademacher(cover=cover, B_w=1.7, num_examples=10**6)
    ref = covering.dudley_rademacher(C=cover.value, radius=1.7, num_examples=10**6).value
    assert float(rad.value) == pytest.approx(float(ref), rel=1e-14)
    for bad in (0, 1.0, True):
        with pytest.raises(ValueError, match="num_layers"):
            trauger_tewari.multi_layer_log_cover(C_1=1.0, C_Bx=1.0, num_layers=bad, **ML)
    with pytest.raises(ValueError, match=r"^B_w: expected a finite number > 0"):
        trauger_tewari.multi_layer_rademacher(cover=cover, B_w=0.0, num_examples=10)
    # a not-valid cover makes a not-valid Rademacher bound
    bad_cover = trauger_tewari.multi_layer_log_cover(
        C_1=-2.0, C_Bx=5.0, num_layers=2, **ML, strict=False
    )
    rad = trauger_tewari.multi_layer_rademacher(
        cover=bad_cover, B_w=1.7, num_examples=10**6, strict=False
    )
    assert rad.status is Status.NOT_VALID


def test_masked_word_factor():
    r = trauger_tewari.masked_word_rademacher(scalar_rademacher=0.01, vocab_size=100)
    assert float(r.value) == pytest.approx(2 * 10 * 0.01, rel=1e-14)
    with pytest.raises(ValueError, match="vocab_size: expected an integer >= 1"):
        trauger_tewari.masked_word_rademacher(scalar_rademacher=0.01, vocab_size=0)
    thm = trauger_tewari.theorem_4_1(C=3.0, B_x=1.3, d=16, **{**ONE, "num_examples": 8})
    carried = trauger_tewari.masked_word_rademacher(scalar_rademacher=thm, vocab_size=100)
    assert carried.status is Status.NOT_VALID  # m > d fails in the scalar bound


@FAST
@given(
    scale=st.floats(1.01, 5.0),
    which=st.sampled_from(["B_w", "B_Wc", "B_Wv", "L_sigma", "B_x", "B_WQK"]),
    m=st.integers(200, 10**7),
)
def test_theorem_4_1_increases_in_every_norm_decreases_in_m(scale, which, m):
    base = {"B_x": 1.0, "B_WQK": 0.5, "d": 16, **ONE, "num_examples": m}
    v = float(trauger_tewari.corollary_4_1_1(**base).value)
    bigger = float(trauger_tewari.corollary_4_1_1(**{**base, which: base[which] * scale}).value)
    assert bigger >= v * (1 - 1e-12)
    more = float(trauger_tewari.corollary_4_1_1(**{**base, "num_examples": 4 * m}).value)
    assert more <= v
    gap = covering.rademacher_to_gap(rademacher=v, num_examples=m, delta=0.05, empirical_risk=0.1)
    assert float(gap.value) >= 0.1


@FAST
@given(
    scale=st.floats(1.01, 5.0),
    which=st.sampled_from(["L_sigma", "B_c2", "B_v2", "B_QK2", "B_w", "C_1", "C_Bx"]),
    L=st.integers(1, 4),
)
def test_theorem_4_2_increases_in_every_norm(scale, which, L):
    base = {"C_1": 2.0, "C_Bx": 5.0, **ML}
    v = float(trauger_tewari.multi_layer_log_cover(num_layers=L, **base).value)
    bigger = trauger_tewari.multi_layer_log_cover(
        num_layers=L, **{**base, which: base[which] * scale}
    )
    assert float(bigger.value) >= v * (1 - 1e-12)


def test_theorem_4_2_broadcasts():
    out = trauger_tewari.multi_layer_log_cover(
        C_1=np.array([1.0, 2.0]), C_Bx=np.array([1.0, 2.0]), num_layers=2, **ML
    )
    assert out.value.shape == (2,)
    assert float(out.value[1]) > float(out.value[0])
    assert out.alpha.shape == (2,)


def test_theorem_4_1_subnormal_cover_scale():
    """ln(sqrt(m) / (2 B_x sqrt(C))) with a subnormal denominator: the ratio overflowed to inf
    and 0 * inf made the bound NaN (not valid). Now a difference of logs: the cover term
    underflows to 0 and the bound is the sign term (closed form)."""
    r = trauger_tewari.theorem_4_1(
        C=1e-320, B_x=1e-160, B_w=1.0, B_Wc=1.0, B_Wv=1.0, L_sigma=1.0, d=3, num_examples=100
    )
    assert float(r.cover_term) == 0.0
    assert float(r.value) == pytest.approx(1e-160 * np.sqrt(np.log(6.0) / 100), rel=1e-14)
    assert r.status is Status.NON_VACUOUS
