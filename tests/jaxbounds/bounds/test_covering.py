"""Covering calculators, Lemma A.8 budget, Dudley through kernels.dudley, Rademacher to risk."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import Status, covering, trauger_tewari

FAST = settings(max_examples=25, deadline=None)


@pytest.fixture
def x64_off():
    """JAX's global float64 switch off for the test (restored after)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", previous)


def test_lemma_covers_closed_forms():
    r = covering.lemma_3_3_log_cover(B_x=2.0, B_w=3.0, d=5, k=7, eps=0.5, num_examples=10)
    assert float(r.value) == pytest.approx(5 * 9 * 4 * np.log(15) / 0.25, rel=1e-14)
    assert bool(r.hypotheses["N >= d"])
    r = covering.lemma_3_4_log_cover(B_x=2.0, B_w=3.0, d=5, k=7, num_examples=5)
    assert float(r.value) == pytest.approx(9 * 4 * np.log(35), rel=1e-14)
    assert not bool(r.hypotheses["N > d"])
    assert r.status is Status.NOT_VALID
    assert "N > d fails (N = 5, d = 5)" in str(r)
    r = covering.lemma_3_6_log_cover(B_x=2.0, B_w=3.0, d=5, k=7)
    assert float(r.value) == pytest.approx(4 * 9 * np.log(71), rel=1e-14)
    assert r.status is Status.NON_VACUOUS
    r = covering.edelman_lemma_4_6_log_cover(B_x=2.0, B_w=3.0, d=5, num_examples=300 * 20)
    assert float(r.value) == pytest.approx(36 * np.log(5 * 6000), rel=1e-14)
    assert r.provenance == "rebuilt"


def test_maurey_cover_is_a_cover_lemma_3_6_by_enumeration():
    """Lemma 3.6's count log(2dk+1) B^2/eps^2 is the Maurey count: k atoms from 2dk+1 choices.

    Check the sparsification itself on a small matrix: the best k-term average of +-B e_ij atoms
    (and 0) is within eps = B / sqrt(k) of W in Frobenius norm (Maurey's guarantee).
    """
    W = np.array([[0.3, -0.2], [0.1, 0.4]])  # ||W||_{1,1} = 1
    B, k = 1.0, 4
    atoms = [np.zeros((2, 2))]
    for i in range(2):
        for j in range(2):
            for s in (1.0, -1.0):
                a = np.zeros((2, 2))
                a[i, j] = s * B
                atoms.append(a)
    atoms = np.stack(atoms)
    best = min(
        float(np.linalg.norm(W - atoms[list(c)].mean(0)))
        for c in itertools.combinations_with_replacement(range(len(atoms)), k)
    )
    assert best <= B / np.sqrt(k)
    # and the number of multisets is at most (2dk+1)^k, the log of which is the lemma's count
    assert np.log(len(atoms)) * k == pytest.approx(
        float(covering.lemma_3_6_log_cover(B_x=1.0, B_w=B, d=2, k=2, eps=B / np.sqrt(k)).value)
    )


def test_budget_optimisation_matches_numeric_minimum():
    C = np.array([1.0, 4.0, 9.0])
    beta = np.array([1.0, 2.0, 0.5])
    r = covering.budget_optimisation(C, beta, eps=0.1)
    assert float(np.sum(beta * r.eps_i)) == pytest.approx(0.1, rel=1e-14)
    assert float(np.sum(C / r.eps_i**2)) == pytest.approx(float(r.value), rel=1e-12)
    # brute force over the simplex of splits
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(3), size=20000)
    brute = np.min(np.sum(C / (0.1 * w / beta) ** 2, axis=1))
    assert float(r.value) <= brute
    assert float(r.value) == pytest.approx(brute, rel=2e-2)
    # all-zero coefficients: value 0 with a feasible split
    z = covering.budget_optimisation([0.0, 0.0], [1.0, 2.0], eps=0.1)
    assert float(z.value) == 0.0
    assert float(np.sum(np.array([1.0, 2.0]) * z.eps_i)) == pytest.approx(0.1)


def test_dudley_closed_form_matches_numeric_integral():
    for C, A, n in [(2.0, 1.0, 1000), (50.0, 3.0, 10**5), (0.5, 0.2, 300)]:
        closed = covering.dudley_rademacher(C=C, radius=A, num_examples=n)
        num = covering.dudley_numeric(lambda e, C=C: C / e**2, radius=A, num_examples=n)
        assert float(num.value) == pytest.approx(float(closed.value), rel=1e-6)
        expected = 12 * np.sqrt(C / n) * (1 + np.log(A * np.sqrt(n) / (3 * np.sqrt(C))))
        assert float(closed.value) == pytest.approx(expected, rel=1e-13)
        assert float(num.cutoff) == pytest.approx(3 * np.sqrt(C / n), rel=1e-3)
    # optimum outside [0, A]: the value is 4A, which is vacuous (>= A)
    r = covering.dudley_rademacher(C=100.0, radius=0.1, num_examples=10)
    assert float(r.value) == pytest.approx(0.4, rel=1e-14)
    assert r.status is Status.VACUOUS
    num = covering.dudley_numeric(lambda e: 100.0 / e**2, radius=0.1, num_examples=10)
    assert float(num.value) == pytest.approx(0.4, rel=1e-6)
    # a zero cover coefficient: a single function, Rademacher 0 (not 0 * inf = NaN)
    assert float(covering.dudley_rademacher(C=0.0, radius=1.0, num_examples=10).value) == 0.0


def test_dudley_vectorised():
    n = np.array([100, 1000, 10000])
    out = covering.dudley_rademacher(C=np.full(3, 2.0), radius=np.ones(3), num_examples=n)
    assert out.value.shape == (3,)
    assert bool(np.all(np.diff(out.value) < 0))
    for i in range(3):
        one = covering.dudley_rademacher(C=2.0, radius=1.0, num_examples=int(n[i]))
        assert float(out.value[i]) == float(one.value)


@FAST
@given(
    C=st.floats(1e-3, 1e4), A=st.floats(1e-2, 1e2), n=st.integers(2, 10**7), k=st.floats(1.1, 10)
)
def test_dudley_monotone(C, A, n, k):
    def v(**kw):
        base = {"C": C, "radius": A, "num_examples": n}
        return float(covering.dudley_rademacher(**{**base, **kw}).value)

    ref = v()
    assert v(C=C * k) >= ref * (1 - 1e-12)
    assert v(radius=A * k) >= ref * (1 - 1e-12)
    assert v(num_examples=n * 4) <= ref * (1 + 1e-12)
    assert 0.0 <= ref <= 4.0 * A * (1 + 1e-12)  # never above the delta = A choice


def test_dudley_tends_to_zero_with_n():
    vals = [
        float(covering.dudley_rademacher(C=5.0, radius=1.0, num_examples=10**e).value)
        for e in (2, 6, 10, 14)
    ]
    assert vals == sorted(vals, reverse=True)
    assert vals[-1] < 1e-4


@FAST
@given(
    rad=st.floats(0.0, 1.0), n=st.integers(1, 10**6), delta=st.floats(1e-6, 0.5),
    ls=st.floats(0.0, 1.0),
)  # fmt: skip
def test_rademacher_to_gap_above_empirical_risk(rad, n, delta, ls):
    r = covering.rademacher_to_gap(rademacher=rad, num_examples=n, delta=delta, empirical_risk=ls)
    assert float(r.value) >= ls
    assert r.is_vacuous == (float(r.value) >= 1.0)
    r2 = covering.rademacher_to_gap(
        rademacher=rad, num_examples=4 * n, delta=delta, empirical_risk=ls
    )
    assert float(r2.value) <= float(r.value)
    expected = ls + 2 * rad + 3 * np.sqrt(np.log(2 / delta) / (2 * n))
    assert float(r.value) == pytest.approx(expected, rel=1e-14)


@FAST
@given(delta=st.floats(1e-9, 0.98), factor=st.floats(1.01, 50.0))
def test_rademacher_to_gap_decreases_in_delta(delta, factor):
    """A larger failure probability gives a smaller bound, on all of (0, 1) (and only there)."""
    small = covering.rademacher_to_gap(rademacher=0.01, num_examples=1000, delta=delta)
    big_delta = min(delta * factor, 0.99)
    big = covering.rademacher_to_gap(rademacher=0.01, num_examples=1000, delta=big_delta)
    assert float(big.value) <= float(small.value)


def test_rademacher_to_gap_rejects_the_reproduced_bad_inputs():
    """Issue 11: delta = 1.5 gave a bound tighter than at 0.05; rademacher = -1 gave -1.87."""
    kw = {"rademacher": 0.01, "num_examples": 1000, "delta": 0.05}
    with pytest.raises(ValueError, match=r"delta: expected a number in \(0, 1\), got 1.5"):
        covering.rademacher_to_gap(**{**kw, "delta": 1.5})
    with pytest.raises(ValueError, match="rademacher: expected a finite number >= 0, got -1"):
        covering.rademacher_to_gap(**{**kw, "rademacher": -1.0})
    with pytest.raises(ValueError, match=r"empirical_risk: expected a number in \[0, loss_bound\]"):
        covering.rademacher_to_gap(**kw, empirical_risk=1.5)
    lax = covering.rademacher_to_gap(**{**kw, "delta": 1.5}, strict=False)
    assert lax.status is Status.NOT_VALID
    assert str(lax) == "not valid: delta: a number in (0, 1) fails (delta = 1.5)"


COVER_GOOD = {"B_x": 1.0, "B_w": 2.0, "d": 4, "k": 3}


@pytest.mark.parametrize(
    "lemma",
    [covering.lemma_3_3_log_cover, covering.lemma_3_4_log_cover, covering.lemma_3_6_log_cover],
)
@pytest.mark.parametrize(
    ("arg", "bad"),
    [("B_x", -1.0), ("B_w", np.nan), ("B_w", np.inf), ("d", 0), ("k", 1.5), ("eps", 0.0),
     ("num_examples", 0)],
)  # fmt: skip
def test_lemma_covers_validate(lemma, arg, bad):
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        lemma(**{**COVER_GOOD, arg: bad})
    assert lemma(**{**COVER_GOOD, arg: bad}, strict=False).status is Status.NOT_VALID


@pytest.mark.parametrize(
    ("kw", "arg"),
    [
        ({"C": -1.0, "radius": 1.0, "num_examples": 10}, "C"),
        ({"C": 1.0, "radius": 0.0, "num_examples": 10}, "radius"),
        ({"C": 1.0, "radius": 1.0, "num_examples": 0}, "num_examples"),
        ({"C": 1.0, "radius": 1.0, "num_examples": 10, "coef_delta": -4.0}, "coef_delta"),
    ],
)
def test_dudley_validates(kw, arg):
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        covering.dudley_rademacher(**kw)
    assert covering.dudley_rademacher(**kw, strict=False).status is Status.NOT_VALID
    with pytest.raises(ValueError, match="num_examples: expected an int"):
        covering.dudley_numeric(lambda e: 1.0 / e**2, radius=1.0, num_examples=1.5)


def test_float64_whatever_the_global_setting(x64_off):
    r = covering.lemma_3_6_log_cover(B_x=jnp.float32(1.0), B_w=jnp.float32(2.0), d=3, k=3)
    assert r.value.dtype == np.float64
    C, A, n = 7.0, 1.3, 10**6
    ref = 12 * np.sqrt(C / n) * (1 + np.log(A * np.sqrt(n) / (3 * np.sqrt(C))))
    closed = covering.dudley_rademacher(C=C, radius=A, num_examples=n)
    assert closed.value.dtype == np.float64
    assert float(closed.value) == pytest.approx(ref, rel=1e-12)
    gap = covering.rademacher_to_gap(rademacher=1e-3, num_examples=10**6, delta=0.05)
    assert float(gap.value) == pytest.approx(2e-3 + 3 * np.sqrt(np.log(40.0) / 2e6), rel=1e-12)


def test_dudley_cross_check_with_kernels_dudley():
    """One Dudley: the calculators are kernels.dudley (closed form and numeric) as Bounds."""
    from kernels.dudley import dudley_integral, dudley_inverse_square

    for C, A, n in [(2.0, 1.0, 1000), (50.0, 3.0, 10**5), (100.0, 0.1, 10)]:
        ours = float(covering.dudley_rademacher(C=C, radius=A, num_examples=n).value)
        out = dudley_integral(lambda e, C=C: C / e**2, num_examples=n, radius=A)
        assert ours == pytest.approx(float(out.value), rel=1e-5)
        assert ours == pytest.approx(float(dudley_inverse_square(C, num_examples=n, radius=A)))
    # a cover from Theorem 4.2 through both routes
    ML = {"L_sigma": 1.0, "B_c2": 1.1, "B_v2": 0.9, "B_QK2": 0.5, "B_w": 1.7}
    cover = trauger_tewari.multi_layer_log_cover(C_1=2.0, C_Bx=5.0, num_layers=2, **ML)
    rad = trauger_tewari.multi_layer_rademacher(cover=cover, B_w=1.7, num_examples=10**6)
    num = covering.dudley_numeric(lambda e: cover.value / e**2, num_examples=10**6, radius=1.7)
    assert float(rad.value) == pytest.approx(float(num.value), rel=1e-6)


@pytest.mark.parametrize(("c0", "c1"), [(1.0, 1.0), (1.0, 3.0), (4.0, 12.0), (2.0, 7.0)])
def test_dudley_other_constants(c0, c1):
    """c_1 sqrt(C/n)(1 + ln(c_0 A / (c_1 sqrt(C/n)))) inside, c_0 A outside [0, A]."""
    for C, A, n in [(2.0, 1.0, 1000), (100.0, 0.1, 10)]:
        s = np.sqrt(C / n)
        ref = c1 * s * (1 + np.log(c0 * A / (c1 * s))) if c1 / c0 * s < A else c0 * A
        out = covering.dudley_rademacher(
            C=C, radius=A, num_examples=n, coef_delta=c0, coef_integral=c1
        )
        assert float(out.value) == pytest.approx(ref, rel=1e-13)
