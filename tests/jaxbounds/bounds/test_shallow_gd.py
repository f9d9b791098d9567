"""Shallow-Transformer GD bounds (Lemma 1, Lemma 4, Theorem 5): terms, hypotheses, status."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import Status, shallow_gd

FAST = settings(max_examples=20, deadline=None)


def _record(d=8, d_m=16, seed=0):
    rng = np.random.default_rng(seed)
    init = {
        "Q": rng.normal(size=(d_m, d)) / np.sqrt(d),
        "K": rng.normal(size=(d_m, d)) / np.sqrt(d),
        "V": rng.normal(size=(d_m, d)) / np.sqrt(d),
        "O": rng.normal(size=(d_m,)) / np.sqrt(d_m),
    }
    radii = {"Q": 0.1, "K": 0.2, "V": 0.3, "O": 0.4}
    return init, radii


def _lemma_4_kwargs():
    init, radii = _record()
    n = shallow_gd.norms_from_weights(init, radii)
    return n, {k: v for k, v in n.items() if k != "xi_O"}


def test_norms_lemma_1_reference():
    init, radii = _record()
    n = shallow_gd.norms_from_weights(init, radii)
    assert float(n["eta_V"]) == pytest.approx(np.linalg.norm(init["V"]) + 0.3, rel=1e-14)
    assert float(n["xi_Q"]) == pytest.approx(np.linalg.norm(init["Q"], 2) + 0.1, rel=1e-14)
    assert float(n["xi_O"]) == pytest.approx(np.linalg.norm(init["O"]) + 0.4, rel=1e-14)
    for N in (400, 10**9):
        ds, dm, RX = 16, 16, 1.5
        eQ, eK, eV, eO = (float(n[f"eta_{k}"]) for k in "QKVO")
        P = (
            (np.sqrt(ds) * RX) ** 2
            * ((np.sqrt(dm) * eV) ** (2 / 3) + (np.sqrt(dm) * eK * eQ * eV) ** (2 / 3)) ** 3
            * np.log(N * ds)
        )
        A = eO * eV * np.sqrt(ds) * RX
        l1 = shallow_gd.lemma_1(
            eta_Q=eQ, eta_K=eK, eta_V=eV, eta_O=eO, num_examples=N, d_s=ds, d_m=dm, R_X=RX
        )
        assert float(l1.P) == pytest.approx(P, rel=1e-13)
        assert float(l1.A) == pytest.approx(A, rel=1e-13)
        ratio = A * np.sqrt(N / P)
        expected = np.sqrt(P / N) * (1 + np.log(ratio)) if ratio >= 1 else A
        assert bool(l1.dudley_inside) == (ratio >= 1) == (N > 400)
        assert float(l1.value) == pytest.approx(expected, rel=1e-13)
        assert l1.is_valid  # Lemma 1 has no checkable hypotheses


def test_lemma_1_limit_zero_class():
    """R_X = 0 (all inputs zero): P = A = 0, the Rademacher bound is 0, not 0 * inf = NaN."""
    l1 = shallow_gd.lemma_1(
        eta_Q=1.0, eta_K=1.0, eta_V=1.0, eta_O=1.0, num_examples=10, d_s=4, d_m=8, R_X=0.0
    )
    assert float(l1.value) == 0.0
    assert l1.status is Status.NON_VACUOUS


def test_lemma_4_terms_and_hypotheses():
    n, kw = _lemma_4_kwargs()
    N, ds, dm, RX = 10, 4, 2000, 0.5
    l4 = shallow_gd.lemma_4(alpha=3.0, phi0=1e-6, num_examples=N, d_s=ds, d_m=dm, R_X=RX, **kw)
    rho = np.sqrt(N) * ds**1.5 * RX
    eO, eV, eQ, eK = (float(n[f"eta_{k}"]) for k in "OVQK")
    z_hat = eO**2 * (1 + 4 / dm * RX**4 * ds**2 * eV**2 * (eQ**2 + eK**2))
    assert float(l4.rho) == pytest.approx(rho, rel=1e-14)
    assert float(l4.z_hat) == pytest.approx(z_hat, rel=1e-13)
    c = 2 / np.sqrt(dm) * RX**2 * ds
    M_hat = max(eV / 0.4, eO / 0.3, c * eK * eV * eO / 0.1, c * eQ * eV * eO / 0.2)
    assert float(l4.M_hat) == pytest.approx(M_hat, rel=1e-13)
    first = 9.0 / (8 * rho * M_hat * np.sqrt(N))
    second = 27.0 * eO / (32 * rho**2 * z_hat * np.sqrt(N))
    assert float(l4.value) == pytest.approx(min(first, second), rel=1e-13)
    # the printed rho^4 version is smaller by rho^2 (see module note)
    assert float(l4.second_printed) == pytest.approx(second / rho**2, rel=1e-13)
    assert bool(l4.hypotheses["d_m >= N^3"])  # 2000 >= 1000
    assert bool(l4.hypotheses["alpha^2 >= 8 rho M sqrt(2 Phi0)"])
    assert l4.status is Status.NON_VACUOUS
    # the alpha conditions fail for a large initial loss: the bound is NOT valid
    bad = shallow_gd.lemma_4(alpha=3.0, phi0=1e6, num_examples=N, d_s=ds, d_m=dm, R_X=RX, **kw)
    assert not bool(bad.hypotheses["alpha^2 >= 8 rho M sqrt(2 Phi0)"])
    assert not bad.hypotheses_hold
    assert bad.status is Status.NOT_VALID
    small = shallow_gd.lemma_4(alpha=3.0, phi0=1e-6, num_examples=N, d_s=ds, d_m=64, R_X=RX, **kw)
    assert not bool(small.hypotheses["d_m >= N^3"])
    assert "d_m >= N^3 fails (d_m = 64, N^3 = 1000)" in small.failed


def test_lemma_4_with_failing_hypotheses_never_shows_as_non_vacuous():
    """Issue 11: `Lemma 4 empirical 8.6e-22 non-vacuous ... hypotheses FAIL` while the measured
    train loss was 0.037. A bound whose hypotheses fail is not valid and renders as such."""
    _, kw = _lemma_4_kwargs()
    tiny = shallow_gd.lemma_4(
        alpha=1e-9, phi0=5.0, num_examples=400, d_s=16, d_m=512, R_X=1.0, **kw
    )
    assert float(tiny.value) < 1e-10  # a tiny number that would look like a great bound
    assert tiny.status is Status.NOT_VALID
    assert not tiny.is_valid
    assert not tiny.is_vacuous
    text = str(tiny)
    assert text.startswith("not valid: d_m >= N^3 fails (d_m = 512, N^3 = 6.4e+07)")
    assert "alpha^2 >= 8 rho M sqrt(2 Phi0) fails" in text
    assert "e-1" not in text.split("(")[0]  # no bare value before the reasons


def test_theorem_5_is_sum_of_parts_and_inherits_status():
    init, radii = _record()
    t5 = shallow_gd.theorem_5(
        alpha=2.0, phi0=0.5, num_examples=400, d_s=16, d_m=64, R_X=1.0, init=init, radii=radii,
        delta=0.05,
    )  # fmt: skip
    R = math.sqrt(0.1**2 + 0.2**2 + 0.3**2 + 0.4**2)  # < 1: the union over radii counts 1
    assert float(t5.R) == pytest.approx(R, rel=1e-14)
    conf = math.sqrt(math.log(1.0 / 0.05) / 400)
    assert float(t5.confidence) == pytest.approx(conf, rel=1e-14)
    assert float(t5.value) == pytest.approx(float(t5.empirical + t5.rademacher) + conf, rel=1e-14)
    assert set(t5.hypotheses) == {
        "d_m >= N^3",
        "alpha^2 >= 8 rho M sqrt(2 Phi0)",
        "alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O",
    }  # fmt: skip
    assert t5.status is Status.NOT_VALID  # d_m = 64 < 400^3
    assert str(t5).startswith("not valid: ")
    big = {k: 3.0 * v for k, v in radii.items()}  # R > 1: log(R / delta)
    t5b = shallow_gd.theorem_5(
        alpha=2.0, phi0=0.5, num_examples=400, d_s=16, d_m=64, R_X=1.0, init=init, radii=big,
        delta=0.05,
    )  # fmt: skip
    assert float(t5b.confidence) == pytest.approx(math.sqrt(math.log(3 * R / 0.05) / 400))


def test_theorem_5_valid_case_is_a_number():
    init, radii = _record()
    t5 = shallow_gd.theorem_5(
        alpha=50.0, phi0=1e-12, num_examples=2, d_s=1, d_m=64, R_X=0.1, init=init, radii=radii,
        delta=0.05,
    )  # fmt: skip
    assert t5.is_valid
    assert t5.status in (Status.NON_VACUOUS, Status.VACUOUS)
    assert not str(t5).startswith("not valid")


def test_alpha_from_features():
    F = np.random.default_rng(0).normal(size=(6, 10))
    assert float(shallow_gd.alpha_from_features(F)) == pytest.approx(
        np.linalg.svd(F, compute_uv=False).min(), rel=1e-13
    )
    with pytest.raises(ValueError, match="features: expected a non-empty 2-D array"):
        shallow_gd.alpha_from_features(np.ones(3))


LEMMA_1 = {"eta_Q": 3.0, "eta_K": 3.0, "eta_V": 3.0, "eta_O": 1.0, "num_examples": 400,
           "d_s": 16, "d_m": 64, "R_X": 1.0}  # fmt: skip


@pytest.mark.parametrize(
    ("arg", "bad"),
    [("eta_Q", -1.0), ("eta_O", np.nan), ("num_examples", 0), ("d_s", 2.5), ("d_m", 0),
     ("R_X", -0.1), ("loss_bound", 0.0)],
)  # fmt: skip
def test_lemma_1_validates(arg, bad):
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        shallow_gd.lemma_1(**{**LEMMA_1, arg: bad})
    assert shallow_gd.lemma_1(**{**LEMMA_1, arg: bad}, strict=False).status is Status.NOT_VALID


@pytest.mark.parametrize(
    ("arg", "bad"),
    [("alpha", -1.0), ("phi0", -1.0), ("R_Q", 0.0), ("eta_O", 0.0), ("xi_V", np.inf),
     ("num_examples", 0)],
)  # fmt: skip
def test_lemma_4_validates(arg, bad):
    _, kw = _lemma_4_kwargs()
    base = {"alpha": 3.0, "phi0": 1e-6, "num_examples": 10, "d_s": 4, "d_m": 2000, "R_X": 0.5}
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        shallow_gd.lemma_4(**{**base, **kw, arg: bad})
    lax = shallow_gd.lemma_4(**{**base, **kw, arg: bad}, strict=False)
    assert lax.status is Status.NOT_VALID


def test_theorem_5_and_norms_validate():
    init, radii = _record()
    kw = {"alpha": 2.0, "phi0": 0.5, "num_examples": 400, "d_s": 16, "d_m": 64, "R_X": 1.0}
    with pytest.raises(ValueError, match="delta: expected"):
        shallow_gd.theorem_5(**kw, init=init, radii=radii, delta=1.5)
    with pytest.raises(ValueError, match=r"radii\['Q'\]: expected a finite number >= 0"):
        shallow_gd.theorem_5(**kw, init=init, radii={**radii, "Q": -1.0}, delta=0.05)
    with pytest.raises(ValueError, match=r"init\['V'\]: expected a finite number"):
        shallow_gd.norms_from_weights({**init, "V": init["V"] * np.nan}, radii)
    with pytest.raises(ValueError, match="missing 'O'"):
        shallow_gd.norms_from_weights({k: v for k, v in init.items() if k != "O"}, radii)


@FAST
@given(scale=st.floats(1.01, 4.0), which=st.sampled_from(["eta_Q", "eta_K", "eta_V", "eta_O"]))
def test_lemma_1_increases_in_norms(scale, which):
    v = float(shallow_gd.lemma_1(**LEMMA_1).value)
    w = float(shallow_gd.lemma_1(**{**LEMMA_1, which: LEMMA_1[which] * scale}).value)
    assert w >= v * (1 - 1e-12)


@FAST
@given(n=st.integers(2, 10**6), k=st.integers(2, 64))
def test_lemma_4_decreases_in_alpha_loss(n, k):
    """A larger initial loss never helps the hypotheses; a larger alpha never hurts the value."""
    _, kw = _lemma_4_kwargs()
    base = {"num_examples": n, "d_s": 4, "d_m": 2000, "R_X": 0.5}
    a = shallow_gd.lemma_4(alpha=1.0, phi0=1e-6, **base, **kw)
    b = shallow_gd.lemma_4(alpha=1.0 * k, phi0=1e-6, **base, **kw)
    assert float(b.value) >= float(a.value)
    c = shallow_gd.lemma_4(alpha=1.0, phi0=1e-6 * k, **base, **kw)
    for name, check in c.hypotheses.items():
        assert bool(check) <= bool(a.hypotheses[name])


def test_tiny_delta_and_subnormal_P():
    """Issue 26's pattern: ln(R / delta) and ln(A sqrt(N / P)) were ratios that overflow (delta =
    1e-308; P subnormal made N / P infinite and the bound inf). Both are now differences of logs
    and equal the closed form computed in exact decimals."""
    from decimal import Decimal, localcontext

    init, radii = _record()
    t5 = shallow_gd.theorem_5(
        alpha=2.0, phi0=0.5, num_examples=400, d_s=16, d_m=64, R_X=1.0, init=init, radii=radii,
        delta=1e-308,
    )  # fmt: skip
    with localcontext() as ctx:
        ctx.prec = 60
        conf = float((-Decimal("1e-308").ln() / 400).sqrt())  # R < 1 counts as 1
        assert float(t5.confidence) == pytest.approx(conf, rel=1e-14)
        l1 = shallow_gd.lemma_1(
            eta_Q=1.0, eta_K=1.0, eta_V=1.0, eta_O=1.0, num_examples=10**4, d_s=4, d_m=4,
            R_X=1e-160,
        )  # fmt: skip
        P, A, N = Decimal(float(l1.P)), Decimal(float(l1.A)), Decimal(10**4)
        assert 0 < float(P) < np.finfo(np.float64).tiny  # subnormal
        truth = (P / N).sqrt() * (1 + (A * (N / P).sqrt()).ln())
    assert bool(l1.dudley_inside)
    assert float(l1.value) == pytest.approx(float(truth), rel=1e-12)
    assert l1.status is Status.NON_VACUOUS
