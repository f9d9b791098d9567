"""PAC-Bayes calculators: the reported numbers of the flat construction, kl-inverse, properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import pac_bayes

FAST = settings(max_examples=30, deadline=None)


def test_construction_norm_reported_value():
    """Theorem 10 [checked]: the authors report L(10, 2, 20) = 1303.93."""
    assert float(pac_bayes.construction_norm_bound(10, 2, 20)) == pytest.approx(1303.93, abs=5e-3)


def test_sigma_star_and_bound_without_perturbation_reported():
    """E.3: G_u=15524, Sigma=0.01, m=1e6, P dropped -> sigma* ~ 2.27e-3 and bound ~ 0.239."""
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    sigma = pac_bayes.optimal_sigma(G_u=15524.0, norm_sq=L, Sigma=0.01, num_samples=1e6)
    assert float(sigma) == pytest.approx(2.27e-3, abs=5e-6)
    out = pac_bayes.semi_analytic(
        G_u=15524.0, norm_sq=L, Sigma=0.01, num_samples=1e6, delta=0.05, sigmas=[sigma]
    )
    assert float(out.value) == pytest.approx(0.239, abs=1e-3)
    assert float(out.sigma) == pytest.approx(float(sigma))
    # at the optimum the curvature term is half the complexity term (up to the log(1/delta) part)
    assert float(out.curvature) == pytest.approx(0.5 * float(out.complexity), rel=1e-6)
    assert not bool(out.vacuous)


def test_semi_analytic_mesh_pays_union_bound_and_is_above_continuous_optimum():
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    kw = {"G_u": 15524.0, "norm_sq": L, "Sigma": 0.01, "num_samples": 1e6, "delta": 0.05}
    mesh = pac_bayes.semi_analytic(**kw)
    assert mesh.per_sigma.shape == (20,)
    assert float(mesh.union_cost) == pytest.approx(np.log(20.0))
    s = pac_bayes.sigma_mesh()
    assert float(s[0]) == pytest.approx(1e-2)
    assert float(s[-1]) == pytest.approx(1e-5)
    # dense float64 reference of the mesh minimum, computed independently with numpy
    sn = np.geomspace(1e-2, 1e-5, 20)
    ref = sn**2 * 15524.0 + 2 * np.sqrt(1e-4 / 2e6 * (float(L) / (2 * sn**2) + np.log(20 / 0.05)))
    assert float(mesh.value) == pytest.approx(ref.min(), rel=1e-12)
    assert float(mesh.sigma) == pytest.approx(sn[ref.argmin()])
    best = pac_bayes.semi_analytic(**kw, sigmas=[mesh.sigma_star])
    assert float(mesh.value) >= float(best.value)


def test_semi_analytic_perturbation_per_sigma_and_grad():
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    kw = {"norm_sq": L, "Sigma": 0.01, "num_samples": 1e6, "delta": 0.05}
    P = jnp.linspace(0.0, 5000.0, 20)
    with_p = pac_bayes.semi_analytic(G_u=15524.0, perturbation=P, **kw)
    without = pac_bayes.semi_analytic(G_u=15524.0, **kw)
    assert float(with_p.value) > float(without.value)
    g = jax.grad(lambda G: pac_bayes.semi_analytic(G_u=G, **kw).value)(15524.0)
    assert float(g) == pytest.approx(float(without.sigma) ** 2, rel=1e-9)


def test_kl_inverse_closed_form_at_zero():
    """kl^{-1}(0, ln(2/delta)/N) = 1 - (delta/2)^{1/N}."""
    for delta, N in [(0.05, 100), (0.01, 10_000), (0.5, 3)]:
        c = np.log(2 / delta) / N
        assert float(pac_bayes.kl_inverse(0.0, c)) == pytest.approx(
            1 - (delta / 2) ** (1 / N), rel=1e-12
        )


def test_kl_inverse_solves_kl_and_gradient_matches_finite_difference():
    q, c = jnp.array([0.1, 0.3, 0.7]), jnp.array([0.05, 0.2, 0.01])
    p = pac_bayes.kl_inverse(q, c)
    np.testing.assert_allclose(pac_bayes.kl_bernoulli(q, p), c, rtol=1e-10)
    assert bool(jnp.all(p > q))
    for arg in (0, 1):
        g = jax.vmap(jax.grad(pac_bayes.kl_inverse, argnums=arg))(q, c)
        h = 1e-6
        dq = jnp.array([h, h, h]) if arg == 0 else 0.0 * q
        dc = jnp.array([h, h, h]) if arg == 1 else 0.0 * c
        fd = (pac_bayes.kl_inverse(q + dq, c + dc) - pac_bayes.kl_inverse(q - dq, c - dc)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-5)


def test_kl_inverse_jit(run):
    out = run(lambda: pac_bayes.kl_inverse(jnp.asarray(0.2), jnp.asarray(0.1)))
    assert float(pac_bayes.kl_bernoulli(0.2, out)) == pytest.approx(0.1, rel=1e-10)


def test_maurer_tighter_than_mcallester_and_catoni_alquier_values():
    kw = {"empirical_risk": 0.1, "kl": 50.0, "num_samples": 10_000, "delta": 0.05}
    mc = pac_bayes.mcallester(**kw)
    ma = pac_bayes.maurer(**kw)
    assert float(ma.value) <= float(mc.value)
    budget = 50.0 + np.log(2 * np.sqrt(10_000) / 0.05)
    assert float(mc.value) == pytest.approx(0.1 + np.sqrt(budget / 20_000), rel=1e-12)
    cat = pac_bayes.catoni(**kw, Cs=[1.0])
    ref = (1 - np.exp(-0.1 - (50.0 + np.log(1 / 0.05)) / 10_000)) / (1 - np.exp(-1.0))
    assert float(cat.value) == pytest.approx(ref, rel=1e-12)
    alq = pac_bayes.alquier(**kw, Sigma=0.5, lambdas=[100.0])
    ref = 0.1 + 100.0 * 0.25 / 20_000 + (50.0 + np.log(1 / 0.05)) / 100.0
    assert float(alq.value) == pytest.approx(ref, rel=1e-12)
    grid = pac_bayes.alquier(**kw, Sigma=0.5)
    opt = 0.1 + 2 * np.sqrt(0.25 / 20_000 * (50.0 + np.log(41 / 0.05)))
    assert opt <= float(grid.value) <= opt * 1.01


@FAST
@given(
    ls=st.floats(0.0, 0.9),
    kl=st.floats(0.0, 1e3),
    n=st.integers(10, 10**6),
    delta=st.floats(1e-4, 0.5),
)
def test_bounds_above_empirical_risk_and_decrease_in_n(ls, kl, n, delta):
    for fn in (pac_bayes.mcallester, pac_bayes.maurer, pac_bayes.catoni):
        b1 = float(fn(empirical_risk=ls, kl=kl, num_samples=n, delta=delta).value)
        b2 = float(fn(empirical_risk=ls, kl=kl, num_samples=4 * n, delta=delta).value)
        b3 = float(fn(empirical_risk=ls, kl=kl + 10.0, num_samples=n, delta=delta).value)
        assert b1 >= ls - 1e-12
        assert b2 <= b1 + 1e-12
        assert b3 >= b1 - 1e-12
    a1 = pac_bayes.alquier(empirical_risk=ls, kl=kl, num_samples=n, delta=delta, Sigma=0.3)
    a2 = pac_bayes.alquier(empirical_risk=ls, kl=kl, num_samples=4 * n, delta=delta, Sigma=0.3)
    assert float(a1.value) >= ls
    assert float(a2.value) <= float(a1.value) + 1e-12


@FAST
@given(G=st.floats(1.0, 1e5), L=st.floats(1.0, 1e4), m=st.floats(1e2, 1e8), S=st.floats(1e-3, 1.0))
def test_semi_analytic_monotone(G, L, m, S):
    kw = {"Sigma": S, "delta": 0.05}
    b = float(pac_bayes.semi_analytic(G_u=G, norm_sq=L, num_samples=m, **kw).value)
    assert float(pac_bayes.semi_analytic(G_u=2 * G, norm_sq=L, num_samples=m, **kw).value) >= b
    assert float(pac_bayes.semi_analytic(G_u=G, norm_sq=2 * L, num_samples=m, **kw).value) >= b
    assert float(pac_bayes.semi_analytic(G_u=G, norm_sq=L, num_samples=4 * m, **kw).value) <= b
    assert b >= 0.0


def test_subgaussian_constant_gaussian_and_bounded():
    x = jax.random.normal(jax.random.key(0), (4_000,)) * 0.3
    s = float(pac_bayes.subgaussian_constant(x))
    assert s == pytest.approx(0.3, rel=0.1)
    # the empirical MGF is dominated on the grid (definition)
    lam = jnp.geomspace(1e-2, 10.0, 40) / jnp.std(x)
    mgf = jnp.mean(jnp.exp(lam[:, None] * (x - x.mean())[None, :]), axis=1)
    assert bool(jnp.all(mgf <= jnp.exp(lam**2 * s**2 / 2) * (1 + 1e-12)))
    # Rademacher +-1: Hoeffding's constant is exactly 1 (cosh(l) <= exp(l^2/2))
    r = jnp.array([-1.0, 1.0] * 50)
    assert float(pac_bayes.subgaussian_constant(r)) == pytest.approx(1.0, abs=1e-3)
    assert float(pac_bayes.subgaussian_constant(jnp.ones(5))) == 0.0


def test_chain_of_thought_and_one_pass():
    kw = {"T": 20.0, "G_u": 50.0, "Sigma": 0.01, "num_samples": 1e6}
    cot = pac_bayes.chain_of_thought_parity(**kw, sigmas=[1e-3])
    L = float(pac_bayes.construction_norm_bound(1, 2, 20))
    m, S, s = 1e6, 0.01, 1e-3
    log_ref = np.log(4 * 20) - m / (8 * S**2) + m * s**2 * 100.0 / (4 * S**2) + L / (2 * s**2)
    assert float(cot.log_value) == pytest.approx(log_ref, rel=1e-12)
    one = pac_bayes.one_pass_parity(**kw, sigmas=[1e-3])
    log_ref1 = np.log(4) - m / (8 * S**2) + m * s**2 * 20 * 100.0 / (4 * S**2) + 20 * L / (2 * s**2)
    assert float(one.log_value) == pytest.approx(log_ref1, rel=1e-12)
    # the mesh version pays log 20 but can only choose better sigmas
    mesh = pac_bayes.chain_of_thought_parity(**kw)
    assert 0.0 <= float(mesh.value) <= 1.0
    assert bool(mesh.vacuous) == (float(mesh.log_value) >= 0)
    # more samples -> smaller failure probability
    more = pac_bayes.chain_of_thought_parity(**{**kw, "num_samples": 1e7})
    assert float(more.log_value) <= float(mesh.log_value)
