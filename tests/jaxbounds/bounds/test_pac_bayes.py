"""PAC-Bayes calculators: the reported numbers of the flat construction, kl-inverse, properties."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, special

from jaxbounds.bounds import Status, pac_bayes

FAST = settings(max_examples=30, deadline=None)
E3 = {"G_u": 15524.0, "subgaussian_scale": 0.01, "num_examples": 10**6}


@pytest.fixture
def x64_off():
    """JAX's global float64 switch off for the test (restored after)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", previous)


def _kl_inverse_reference(q: float, c: float) -> float:
    """Float64 reference with scipy: the root of kl(q || p) = c on (q, 1) by Brent's method."""
    if q == 0.0:
        return float(-np.expm1(-c))

    def f(p):
        return special.xlogy(q, q / p) + special.xlog1py(1 - q, -q) - special.xlog1py(1 - q, -p) - c

    return optimize.brentq(f, q, 1.0 - 1e-16, xtol=1e-300, rtol=4 * np.finfo(float).eps)


def test_construction_norm_reported_value():
    """Theorem 10 [checked]: the authors report L(10, 2, 20) = 1303.93."""
    assert float(pac_bayes.construction_norm_bound(10, 2, 20)) == pytest.approx(1303.93, abs=5e-3)
    with pytest.raises(ValueError, match="D_f: expected an integer >= 1"):
        pac_bayes.construction_norm_bound(10, 0, 20)


def test_sigma_star_and_bound_without_remainder_reported():
    """E.3: G_u=15524, Sigma=0.01, m=1e6, P dropped -> sigma* ~ 2.27e-3 and bound ~ 0.239."""
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    sigma = pac_bayes.optimal_sigma(norm_sq=L, **E3)
    assert float(sigma) == pytest.approx(2.27e-3, abs=5e-6)
    out = pac_bayes.semi_analytic(norm_sq=L, delta=0.05, sigmas=[sigma], **E3)
    assert float(out.value) == pytest.approx(0.239, abs=1e-3)
    assert float(out.sigma) == pytest.approx(float(sigma))
    # at the optimum the curvature term is half the complexity term (up to the log(1/delta) part)
    assert float(out.curvature) == pytest.approx(0.5 * float(out.complexity), rel=1e-6)
    assert out.status is Status.NON_VACUOUS


def test_semi_analytic_mesh_pays_union_bound_and_is_above_continuous_optimum():
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    mesh = pac_bayes.semi_analytic(norm_sq=L, delta=0.05, **E3)
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
    best = pac_bayes.semi_analytic(norm_sq=L, delta=0.05, sigmas=[mesh.sigma_star], **E3)
    assert float(mesh.value) >= float(best.value)


def test_semi_analytic_remainder_per_sigma_and_slope():
    L = pac_bayes.construction_norm_bound(10, 2, 20)
    kw = {"norm_sq": L, "subgaussian_scale": 0.01, "num_examples": 10**6, "delta": 0.05}
    P = np.linspace(0.0, 5000.0, 20)
    with_p = pac_bayes.semi_analytic(G_u=15524.0, remainder=P, **kw)
    without = pac_bayes.semi_analytic(G_u=15524.0, **kw)
    assert float(with_p.value) > float(without.value)
    # d value / d G_u = sigma^2 at the chosen mesh point (the bound is linear in G_u there)
    h = 1e-3
    up = pac_bayes.semi_analytic(G_u=15524.0 + h, **kw).value
    down = pac_bayes.semi_analytic(G_u=15524.0 - h, **kw).value
    assert float((up - down) / (2 * h)) == pytest.approx(float(without.sigma) ** 2, rel=1e-6)
    with pytest.raises(ValueError, match="remainder: a 1-D remainder gives one value per sigma"):
        pac_bayes.semi_analytic(G_u=15524.0, remainder=np.zeros(3), **kw)


def test_kl_inverse_closed_form_at_zero():
    """kl^{-1}(0, ln(2/delta)/N) = 1 - (delta/2)^{1/N}."""
    for delta, N in [(0.05, 100), (0.01, 10_000), (0.5, 3)]:
        c = np.log(2 / delta) / N
        assert float(pac_bayes.kl_inverse(0.0, c)) == pytest.approx(
            1 - (delta / 2) ** (1 / N), rel=1e-12
        )


def test_kl_inverse_solves_kl_and_limits():
    q, c = np.array([0.1, 0.3, 0.7]), np.array([0.05, 0.2, 0.01])
    p = pac_bayes.kl_inverse(q, c)
    np.testing.assert_allclose(pac_bayes.kl_bernoulli(q, p), c, rtol=1e-12)
    assert bool(np.all(p > q))
    np.testing.assert_array_equal(pac_bayes.kl_inverse(q, 0.0), q)  # no budget: p = q
    np.testing.assert_array_equal(pac_bayes.kl_inverse(q, np.inf), 1.0)
    assert float(pac_bayes.kl_inverse(1.0, 0.3)) == 1.0
    with pytest.raises(ValueError, match=r"q: expected a number in \[0, 1\]"):
        pac_bayes.kl_inverse(1.2, 0.1)
    with pytest.raises(ValueError, match="c: expected a number >= 0"):
        pac_bayes.kl_inverse(0.1, np.nan)


@FAST
@given(q=st.floats(0.0, 0.999), c=st.floats(1e-9, 10.0), k=st.floats(1.01, 10.0))
def test_kl_inverse_monotone_in_budget_and_risk(q, c, k):
    # kl_inverse is exact to one float64 step (its bisection stops at adjacent floats), so
    # monotonicity holds up to that resolution: q = 1e-192 and 3e-192 give the same p +- 1 ulp.
    p = float(pac_bayes.kl_inverse(q, c))
    resolution = 2 * np.spacing(p)
    assert q <= p <= 1.0
    assert float(pac_bayes.kl_inverse(q, c * k)) >= p - resolution
    assert float(pac_bayes.kl_inverse(min(q * k, 1.0), c)) >= p - resolution


def test_float64_whatever_the_global_setting(x64_off):
    """Issue 11: kl_inverse(0, ln(40)/1e6) was off by 0.63% and Maurer at N=1e6 by 0.16%."""
    assert not jax.config.jax_enable_x64
    c = np.log(40.0) / 1e6
    p = pac_bayes.kl_inverse(jnp.float32(0.0), c)
    assert p.dtype == np.float64
    assert float(p) == pytest.approx(_kl_inverse_reference(0.0, c), rel=1e-12)
    for ls in (0.0, 1e-3, 0.1):
        b = pac_bayes.maurer(empirical_risk=ls, kl=5.0, num_examples=10**6, delta=0.05)
        budget = (5.0 + np.log(2.0 * 1e3 / 0.05)) / 1e6
        assert float(b.value) == pytest.approx(_kl_inverse_reference(ls, budget), rel=1e-12)
    mc = pac_bayes.mcallester(empirical_risk=0.1, kl=5.0, num_examples=10**6, delta=0.05)
    ref = 0.1 + np.sqrt((5.0 + np.log(2e3 / 0.05)) / 2e6)
    assert float(mc.value) == pytest.approx(ref, rel=1e-14)


def test_maurer_tighter_than_mcallester_and_catoni_alquier_values():
    kw = {"empirical_risk": 0.1, "kl": 50.0, "num_examples": 10_000, "delta": 0.05}
    mc = pac_bayes.mcallester(**kw)
    ma = pac_bayes.maurer(**kw)
    assert float(ma.value) <= float(mc.value)
    assert float(ma.value) == pytest.approx(
        _kl_inverse_reference(0.1, float(ma.kl_budget)), rel=1e-12
    )
    budget = 50.0 + np.log(2 * np.sqrt(10_000) / 0.05)
    assert float(mc.value) == pytest.approx(0.1 + np.sqrt(budget / 20_000), rel=1e-12)
    cat = pac_bayes.catoni(**kw, Cs=[1.0])
    ref = (1 - np.exp(-0.1 - (50.0 + np.log(1 / 0.05)) / 10_000)) / (1 - np.exp(-1.0))
    assert float(cat.value) == pytest.approx(ref, rel=1e-12)
    alq = pac_bayes.alquier(**kw, subgaussian_scale=0.5, lambdas=[100.0])
    ref = 0.1 + 100.0 * 0.25 / 20_000 + (50.0 + np.log(1 / 0.05)) / 100.0
    assert float(alq.value) == pytest.approx(ref, rel=1e-12)
    grid = pac_bayes.alquier(**kw, subgaussian_scale=0.5)
    opt = 0.1 + 2 * np.sqrt(0.25 / 20_000 * (50.0 + np.log(41 / 0.05)))
    assert opt <= float(grid.value) <= opt * 1.01
    assert grid.status is Status.NON_VACUOUS  # unbounded loss: never vacuous


@FAST
@given(
    ls=st.floats(0.0, 0.9),
    kl=st.floats(0.0, 1e3),
    n=st.integers(10, 10**6),
    delta=st.floats(1e-4, 0.5),
)
def test_bounds_above_empirical_risk_and_decrease_in_n(ls, kl, n, delta):
    for fn in (pac_bayes.mcallester, pac_bayes.maurer, pac_bayes.catoni):
        b1 = float(fn(empirical_risk=ls, kl=kl, num_examples=n, delta=delta).value)
        b2 = float(fn(empirical_risk=ls, kl=kl, num_examples=4 * n, delta=delta).value)
        b3 = float(fn(empirical_risk=ls, kl=kl + 10.0, num_examples=n, delta=delta).value)
        b4 = float(fn(empirical_risk=ls, kl=kl, num_examples=n, delta=min(2 * delta, 0.99)).value)
        assert b1 >= ls - 1e-12
        assert b2 <= b1 + 1e-12
        assert b3 >= b1 - 1e-12
        assert b4 <= b1 + 1e-12
    kw = {"empirical_risk": ls, "kl": kl, "delta": delta, "subgaussian_scale": 0.3}
    a1 = pac_bayes.alquier(num_examples=n, **kw)
    a2 = pac_bayes.alquier(num_examples=4 * n, **kw)
    assert float(a1.value) >= ls
    assert float(a2.value) <= float(a1.value) + 1e-12


@FAST
@given(
    G=st.floats(1.0, 1e5), L=st.floats(1.0, 1e4), m=st.integers(100, 10**8), S=st.floats(1e-3, 1.0)
)
def test_semi_analytic_monotone(G, L, m, S):
    kw = {"subgaussian_scale": S, "delta": 0.05}
    b = float(pac_bayes.semi_analytic(G_u=G, norm_sq=L, num_examples=m, **kw).value)
    assert float(pac_bayes.semi_analytic(G_u=2 * G, norm_sq=L, num_examples=m, **kw).value) >= b
    assert float(pac_bayes.semi_analytic(G_u=G, norm_sq=2 * L, num_examples=m, **kw).value) >= b
    assert float(pac_bayes.semi_analytic(G_u=G, norm_sq=L, num_examples=4 * m, **kw).value) <= b
    assert b >= 0.0


def test_estimate_subgaussian_scale_gaussian_and_bounded():
    x = np.random.default_rng(0).normal(size=4_000) * 0.3
    s = float(pac_bayes.estimate_subgaussian_scale(x))
    assert s == pytest.approx(0.3, rel=0.1)
    # the empirical MGF is dominated on the grid (definition)
    lam = np.geomspace(1e-2, 10.0, 40) / np.std(x)
    mgf = np.mean(np.exp(lam[:, None] * (x - x.mean())[None, :]), axis=1)
    assert bool(np.all(mgf <= np.exp(lam**2 * s**2 / 2) * (1 + 1e-12)))
    # Rademacher +-1: Hoeffding's constant is exactly 1 (cosh(l) <= exp(l^2/2))
    r = np.array([-1.0, 1.0] * 50)
    assert float(pac_bayes.estimate_subgaussian_scale(r)) == pytest.approx(1.0, abs=1e-3)
    assert float(pac_bayes.estimate_subgaussian_scale(np.ones(5))) == 0.0
    with pytest.raises(ValueError, match="losses: expected a finite number"):
        pac_bayes.estimate_subgaussian_scale([0.0, np.nan])
    with pytest.raises(ValueError, match="losses: expected a non-empty 1-D array"):
        pac_bayes.estimate_subgaussian_scale(np.zeros((2, 2)))


def test_chain_of_thought_and_one_pass():
    kw = {"T": 20, "G_u": 50.0, "subgaussian_scale": 0.01, "num_examples": 10**6}
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
    assert mesh.is_vacuous == (float(mesh.log_value) >= 0)
    # more samples -> smaller failure probability
    more = pac_bayes.chain_of_thought_parity(**{**kw, "num_examples": 10**7})
    assert float(more.log_value) <= float(mesh.log_value)


def test_reproduced_bad_inputs_raise_naming_the_argument():
    """Issue 11: semi_analytic(norm_sq=-1) and mcallester(num_samples=0) returned NaN flagged
    non-vacuous; catoni(empirical_risk=-0.2) returned -4.8e8."""
    pac = {"empirical_risk": 0.1, "kl": 5.0, "num_examples": 1000, "delta": 0.05}
    with pytest.raises(ValueError, match="norm_sq: expected a finite number >= 0, got -1"):
        pac_bayes.semi_analytic(norm_sq=-1.0, delta=0.05, **E3)
    with pytest.raises(ValueError, match="num_examples: expected an integer >= 1, got 0"):
        pac_bayes.mcallester(**{**pac, "num_examples": 0})
    with pytest.raises(
        ValueError, match=r"empirical_risk: expected a number in \[0, 1\], got -0.2"
    ):
        pac_bayes.catoni(**{**pac, "empirical_risk": -0.2})
    lax = pac_bayes.semi_analytic(norm_sq=-1.0, delta=0.05, strict=False, **E3)
    assert lax.status is Status.NOT_VALID
    assert str(lax).startswith("not valid: norm_sq: a finite number >= 0 fails (norm_sq = -1)")
    assert pac_bayes.mcallester(**{**pac, "num_examples": 0}, strict=False).status == 2


PAC = {"empirical_risk": 0.1, "kl": 5.0, "num_examples": 1000, "delta": 0.05}
PAC_BAD = [
    ("empirical_risk", 1.5), ("empirical_risk", np.nan), ("kl", -1.0), ("kl", np.inf),
    ("num_examples", 0), ("num_examples", 10.5), ("delta", 0.0), ("delta", 1.0),
]  # fmt: skip


PAC_FNS = {
    "mcallester": pac_bayes.mcallester,
    "maurer": pac_bayes.maurer,
    "catoni": pac_bayes.catoni,
    "alquier": functools.partial(pac_bayes.alquier, subgaussian_scale=0.3),
}


@pytest.mark.parametrize(("arg", "bad"), PAC_BAD)
@pytest.mark.parametrize("name", sorted(PAC_FNS))
def test_pac_bayes_bounds_validate(name, arg, bad):
    fn, kw = PAC_FNS[name], {**PAC, arg: bad}
    if name == "alquier" and (arg, bad) == ("empirical_risk", 1.5):
        assert fn(**kw).status is Status.NON_VACUOUS  # unbounded loss: any finite risk is in range
        return
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        fn(**kw)
    assert fn(**kw, strict=False).status is Status.NOT_VALID


@pytest.mark.parametrize(
    ("arg", "bad"),
    [("G_u", -1.0), ("subgaussian_scale", 0.0), ("num_examples", 0), ("remainder", np.nan),
     ("T", 0), ("norm_sq", -2.0)],
)  # fmt: skip
def test_parity_and_semi_analytic_validate(arg, bad):
    kw = {"T": 20, "G_u": 50.0, "subgaussian_scale": 0.01, "num_examples": 10**6}
    for fn in (pac_bayes.chain_of_thought_parity, pac_bayes.one_pass_parity):
        with pytest.raises(ValueError, match=f"^{arg}: expected"):
            fn(**{**kw, arg: bad})
        assert fn(**{**kw, arg: bad}, strict=False).status is Status.NOT_VALID
    if arg != "T":
        semi = {"G_u": 50.0, "norm_sq": 100.0, "subgaussian_scale": 0.01, "num_examples": 10**6}
        with pytest.raises(ValueError, match=f"^{arg}: expected"):
            pac_bayes.semi_analytic(**{**semi, arg: bad}, delta=0.05)
    with pytest.raises(ValueError, match="sigmas: expected a non-empty 1-D grid"):
        pac_bayes.semi_analytic(**E3, norm_sq=1.0, delta=0.05, sigmas=[1e-3, -1e-3])
    with pytest.raises(ValueError, match="remainder: expected a number with G_u"):
        pac_bayes.optimal_sigma(norm_sq=1.0, **{**E3, "G_u": 1.0}, remainder=-2.0)


def _log_exact(x):
    """ln x of a float64 in 80-digit decimal arithmetic (the truth the float64 code is held to)."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 80
        return Decimal(float(x)).ln()


def _budget(a, delta) -> float:
    """ln(a / delta) exactly (a ratio that overflows float64 for delta = 1e-308)."""
    return float(_log_exact(a) - _log_exact(delta))


@pytest.mark.parametrize("delta", [1e-308, 5e-324])
def test_tiny_delta_matches_closed_forms(delta):
    """Issue 26: at delta = 1e-308, N = 1e4 the ratio 2 sqrt(N) / delta overflowed: McAllester,
    semi-analytic and Alquier gave inf (Alquier's labelled valid), Maurer and Catoni 1.0 (truth
    about 0.07). ln(a / delta) is now ln a - ln delta; each bound equals its closed form."""
    n = 10**4
    kw = {"empirical_risk": 0.0, "kl": 0.0, "num_examples": n, "delta": delta}
    budget = _budget(2.0 * np.sqrt(n), delta)  # about 714
    mc = pac_bayes.mcallester(**kw)
    assert float(mc.value) == pytest.approx(np.sqrt(budget / (2 * n)), rel=1e-14)
    ma = pac_bayes.maurer(**kw)
    assert float(ma.value) == pytest.approx(-np.expm1(-budget / n), rel=1e-13)
    assert 0.06 < float(ma.value) < 0.08
    assert ma.status is Status.NON_VACUOUS
    assert mc.status is Status.NON_VACUOUS
    cat = pac_bayes.catoni(**kw, Cs=[1.0])
    cat_truth = -np.expm1(-_budget(1.0, delta) / n) / -np.expm1(-1.0)
    assert float(cat.value) == pytest.approx(cat_truth, rel=1e-13)
    assert float(pac_bayes.catoni(**kw).value) < 0.08  # the default grid: no overflow either
    al = pac_bayes.alquier(**kw, subgaussian_scale=1.0, lambdas=[100.0])
    assert float(al.value) == pytest.approx(
        100.0 / (2 * n) + _budget(1.0, delta) / 100.0, rel=1e-14
    )
    assert np.isfinite(float(pac_bayes.alquier(**kw, subgaussian_scale=1.0).value))
    semi = pac_bayes.semi_analytic(
        G_u=1.0, norm_sq=1.0, subgaussian_scale=1.0, num_examples=n, delta=delta, sigmas=[0.1]
    )
    semi_truth = 0.01 + 2.0 * np.sqrt((1.0 / (2 * n)) * (1.0 / 0.02 + _budget(1.0, delta)))
    assert float(semi.value) == pytest.approx(semi_truth, rel=1e-14)


def test_tiny_delta_in_the_other_calculators():
    """The same ln(c / delta) in rademacher_to_gap and shallow-GD Theorem 5 (closed forms)."""
    from jaxbounds.bounds import covering

    gap = covering.rademacher_to_gap(rademacher=0.0, num_examples=10**4, delta=1e-308)
    truth = 3.0 * np.sqrt(_budget(2.0, 1e-308) / (2 * 10**4))
    assert float(gap.value) == pytest.approx(truth, rel=1e-14)
    assert gap.status is Status.NON_VACUOUS


def test_subnormal_empirical_risk():
    """Issue 26: kl_bernoulli(1e-310, 0.5) was NaN (r / q overflowed) and maurer at
    empirical_risk = 1e-310 gave 0.99999 labelled non-vacuous (truth 0.0071)."""
    assert float(pac_bayes.kl_bernoulli(1e-310, 0.5)) == np.log(2.0)  # q ln q is below an ulp
    n, delta = 1000, 0.05
    budget = _budget(2.0 * np.sqrt(n), delta) / n
    for q in (1e-310, 5e-324, 1e-300):
        out = pac_bayes.maurer(empirical_risk=q, kl=0.0, num_examples=n, delta=delta)
        # kl(q || p) -> -ln(1 - p) as q -> 0: the q = 0 closed form to far below an ulp
        assert float(out.value) == pytest.approx(-np.expm1(-budget), rel=1e-14)
        assert out.status is Status.NON_VACUOUS
    assert float(pac_bayes.kl_inverse(1e-310, 0.0)) == pytest.approx(1e-310, rel=1e-12)


def test_kl_bernoulli_against_exact_decimals_at_the_extremes():
    """kl(q || p) on a grid of subnormal, tiny, ordinary and near-one q and p against 800-digit
    decimal arithmetic: relative error below 1e-13 everywhere (subnormal results included),
    inf exactly where the truth is infinite, 0 where q = p."""
    from decimal import Decimal, localcontext

    grid = [0.0, 5e-324, 1e-310, 1e-300, 1e-20, 1e-5, 0.1, 0.25, 0.5, 0.9, 1 - 1e-10,
            1 - 2**-53, 1.0]  # fmt: skip
    with localcontext() as ctx:
        ctx.prec = 800
        for q in grid:
            for p in grid:
                got = float(pac_bayes.kl_bernoulli(q, p))
                if (p == 0.0 and q > 0) or (p == 1.0 and q < 1):
                    assert got == np.inf, (q, p)
                    continue
                dq, dp, one = Decimal(q), Decimal(p), Decimal(1)
                truth = (dq * (dq / dp).ln() if q > 0 else 0) + (
                    (one - dq) * ((one - dq) / (one - dp)).ln() if q < 1 else 0
                )
                if truth == 0:
                    assert got == 0.0, (q, p)
                else:
                    assert abs(Decimal(got) - truth) <= Decimal("1e-13") * abs(truth), (q, p)


def test_huge_subgaussian_scale_does_not_overflow():
    """Sigma^2 overflows float64 past 1.3e154; Alquier and the semi-analytic bound multiply by
    Sigma instead of squaring it and equal their closed forms (were inf)."""
    S, n, lam = 1e200, 100, 1e-199  # lam Sigma = 10
    al = pac_bayes.alquier(
        empirical_risk=0.0, kl=1.0, num_examples=n, delta=0.05, subgaussian_scale=S, lambdas=[lam]
    )
    truth = 10.0 * (S / (2 * n)) + (1.0 + np.log(1.0 / 0.05)) / lam
    assert float(al.value) == pytest.approx(truth, rel=1e-14)
    semi = pac_bayes.semi_analytic(
        G_u=1.0, norm_sq=1.0, subgaussian_scale=S, num_examples=n, delta=0.05, sigmas=[0.1]
    )
    truth = 0.01 + 2.0 * S * np.sqrt((1.0 / 0.02 + np.log(1.0 / 0.05)) / (2 * n))
    assert float(semi.value) == pytest.approx(truth, rel=1e-14)
    assert semi.status is Status.VACUOUS
