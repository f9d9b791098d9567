"""Covering calculators, Lemma A.8 budget, Dudley closed form vs numeric, Rademacher to risk."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import covering, trauger_tewari

FAST = settings(max_examples=25, deadline=None)


def test_lemma_covers_closed_forms():
    r = covering.lemma_3_3_log_cover(B_x=2.0, B_w=3.0, d=5, k=7, eps=0.5, num_points=10)
    assert float(r.value) == pytest.approx(5 * 9 * 4 * np.log(15) / 0.25)
    assert bool(r.hypotheses["N >= d"])
    r = covering.lemma_3_4_log_cover(B_x=2.0, B_w=3.0, d=5, k=7, num_points=5)
    assert float(r.value) == pytest.approx(9 * 4 * np.log(35))
    assert not bool(r.hypotheses["N > d"])
    r = covering.lemma_3_6_log_cover(B_x=2.0, B_w=3.0, d=5, k=7)
    assert float(r.value) == pytest.approx(4 * 9 * np.log(71))
    r = covering.edelman_lemma_4_6_log_cover(B_x=2.0, B_w=3.0, d=5, num_points=300 * 20)
    assert float(r.value) == pytest.approx(36 * np.log(5 * 6000))
    assert r.status == "rebuilt"


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
    C = jnp.array([1.0, 4.0, 9.0])
    beta = jnp.array([1.0, 2.0, 0.5])
    r = covering.budget_optimisation(C, beta, eps=0.1)
    assert float(jnp.sum(beta * r.eps_i)) == pytest.approx(0.1)
    assert float(jnp.sum(C / r.eps_i**2)) == pytest.approx(float(r.value))
    # brute force over the simplex of splits
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(3), size=20000)
    eps_i = 0.1 * w / np.asarray(beta)
    brute = np.min(np.sum(np.asarray(C) / eps_i**2, axis=1))
    assert float(r.value) <= brute
    assert float(r.value) == pytest.approx(brute, rel=2e-2)


def test_dudley_closed_form_matches_numeric_integral():
    for C, A, n in [(2.0, 1.0, 1000), (50.0, 3.0, 10**5), (0.5, 0.2, 300)]:
        closed = covering.dudley_rademacher(C=C, A=A, num_samples=n)
        num = covering.dudley_numeric(lambda e, C=C: C / e**2, A=A, num_samples=n)
        assert float(num) == pytest.approx(float(closed.value), rel=1e-4)
        expected = 12 * np.sqrt(C / n) * (1 + np.log(A * np.sqrt(n) / (3 * np.sqrt(C))))
        assert float(closed.value) == pytest.approx(expected)
    # optimum outside [0, A]: the value is 4A
    r = covering.dudley_rademacher(C=100.0, A=0.1, num_samples=10)
    assert float(r.value) == pytest.approx(0.4)
    assert float(covering.dudley_numeric(lambda e: 100.0 / e**2, A=0.1, num_samples=10)) == (
        pytest.approx(0.4, rel=1e-6)
    )


def test_dudley_vectorised_and_differentiable(run):
    n = jnp.array([100.0, 1000.0, 10000.0])
    out = run(lambda: covering.dudley_rademacher(C=jnp.full(3, 2.0), A=jnp.ones(3), num_samples=n))
    assert out.value.shape == (3,)
    assert bool(jnp.all(jnp.diff(out.value) < 0))
    g = jax.grad(lambda c: covering.dudley_rademacher(C=c, A=1.0, num_samples=1000).value)(2.0)
    assert float(g) > 0


@FAST
@given(
    C=st.floats(1e-3, 1e4), A=st.floats(1e-2, 1e2), n=st.integers(2, 10**7), k=st.floats(1.1, 10)
)
def test_dudley_monotone(C, A, n, k):
    v = float(covering.dudley_rademacher(C=C, A=A, num_samples=n).value)
    assert float(covering.dudley_rademacher(C=C * k, A=A, num_samples=n).value) >= v * (1 - 1e-12)
    assert float(covering.dudley_rademacher(C=C, A=A * k, num_samples=n).value) >= v * (1 - 1e-12)
    assert float(covering.dudley_rademacher(C=C, A=A, num_samples=n * 4).value) <= v * (1 + 1e-12)


@FAST
@given(
    rad=st.floats(0.0, 1.0), n=st.integers(1, 10**6), delta=st.floats(1e-6, 0.5),
    ls=st.floats(0.0, 1.0),
)  # fmt: skip
def test_rademacher_to_gap_above_empirical_risk(rad, n, delta, ls):
    r = covering.rademacher_to_gap(rademacher=rad, num_samples=n, delta=delta, empirical_risk=ls)
    assert float(r.value) >= ls
    assert bool(r.vacuous) == (float(r.value) >= 1.0)
    r2 = covering.rademacher_to_gap(
        rademacher=rad, num_samples=4 * n, delta=delta, empirical_risk=ls
    )
    assert float(r2.value) <= float(r.value)
    expected = ls + 2 * rad + 3 * np.sqrt(np.log(2 / delta) / (2 * n))
    assert float(r.value) == pytest.approx(expected)


def test_float32_in_float32_out():
    r = covering.lemma_3_6_log_cover(B_x=jnp.float32(1.0), B_w=jnp.float32(2.0), d=3, k=3)
    assert r.value.dtype == jnp.float32


def test_dudley_cross_check_with_kernels_dudley():
    """Cross-check with the Rademacher issue's numeric integral (kernels.dudley)."""
    from kernels.dudley import dudley_integral, dudley_inverse_square

    for C, A, n in [(2.0, 1.0, 1000), (50.0, 3.0, 10**5), (100.0, 0.1, 10)]:
        ours = float(covering.dudley_rademacher(C=C, A=A, num_samples=n).value)
        num, _ = dudley_integral(lambda e, C=C: C / e**2, num_samples=n, radius=A)
        assert ours == pytest.approx(float(num), rel=1e-5)
        assert ours == pytest.approx(float(dudley_inverse_square(C, num_samples=n, radius=A)))
    # a cover from Theorem 4.2 through both routes
    cover = trauger_tewari.multi_layer_log_cover(
        C_1=2.0, C_Bx=5.0, num_layers=2, L_sigma=1.0, B_c2=1.1, B_v2=0.9, B_QK2=0.5, B_w=1.7
    )
    rad = trauger_tewari.multi_layer_rademacher(cover=cover, B_w=1.7, num_samples=10**6)
    num, _ = dudley_integral(lambda e: cover.value / e**2, num_samples=10**6, radius=1.7)
    assert float(rad.value) == pytest.approx(float(num), rel=1e-5)
