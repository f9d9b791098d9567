"""Shallow-Transformer GD bounds (Lemma 1, Lemma 4, Theorem 5) and the spectrum-adaptive proxy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbounds.bounds import shallow_gd, spectral

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


def test_norms_lemma_1_reference():
    init, radii = _record()
    n = shallow_gd.norms_from_weights(init, radii)
    assert float(n["eta_V"]) == pytest.approx(np.linalg.norm(init["V"]) + 0.3)
    assert float(n["xi_Q"]) == pytest.approx(np.linalg.norm(init["Q"], 2) + 0.1)
    assert float(n["xi_O"]) == pytest.approx(np.linalg.norm(init["O"]) + 0.4)
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
            eta_Q=eQ, eta_K=eK, eta_V=eV, eta_O=eO, num_samples=N, d_s=ds, d_m=dm, R_X=RX
        )
        assert float(l1.P) == pytest.approx(P)
        assert float(l1.A) == pytest.approx(A)
        ratio = A * np.sqrt(N / P)
        expected = np.sqrt(P / N) * (1 + np.log(ratio)) if ratio >= 1 else A
        assert bool(l1.dudley_inside) == (ratio >= 1) == (N > 400)
        assert float(l1.value) == pytest.approx(expected)


def test_lemma_4_terms_and_hypotheses():
    init, radii = _record()
    n = shallow_gd.norms_from_weights(init, radii)
    kw = {k: v for k, v in n.items() if k != "xi_O"}
    N, ds, dm, RX = 10, 4, 2000, 0.5
    l4 = shallow_gd.lemma_4(alpha=3.0, phi0=1e-6, num_samples=N, d_s=ds, d_m=dm, R_X=RX, **kw)
    rho = np.sqrt(N) * ds**1.5 * RX
    eO, eV, eQ, eK = (float(n[f"eta_{k}"]) for k in "OVQK")
    z_hat = eO**2 * (1 + 4 / dm * RX**4 * ds**2 * eV**2 * (eQ**2 + eK**2))
    assert float(l4.rho) == pytest.approx(rho)
    assert float(l4.z_hat) == pytest.approx(z_hat)
    c = 2 / np.sqrt(dm) * RX**2 * ds
    M_hat = max(eV / 0.4, eO / 0.3, c * eK * eV * eO / 0.1, c * eQ * eV * eO / 0.2)
    assert float(l4.M_hat) == pytest.approx(M_hat)
    first = 9.0 / (8 * rho * M_hat * np.sqrt(N))
    second = 27.0 * eO / (32 * rho**2 * z_hat * np.sqrt(N))
    assert float(l4.value) == pytest.approx(min(first, second))
    # the printed rho^4 version is smaller by rho^2 (see module note)
    assert float(l4.second_printed) == pytest.approx(second / rho**2)
    assert bool(l4.hypotheses["d_m >= N^3"])  # 2000 >= 1000
    # the alpha conditions hold for a tiny initial loss and fail for a large one
    assert bool(l4.hypotheses["alpha^2 >= 8 rho M sqrt(2 Phi0)"])
    bad = shallow_gd.lemma_4(alpha=3.0, phi0=1e6, num_samples=N, d_s=ds, d_m=dm, R_X=RX, **kw)
    assert not bool(bad.hypotheses["alpha^2 >= 8 rho M sqrt(2 Phi0)"])
    assert not bool(bad.hypotheses_hold)
    small = shallow_gd.lemma_4(alpha=3.0, phi0=1e-6, num_samples=N, d_s=ds, d_m=64, R_X=RX, **kw)
    assert not bool(small.hypotheses["d_m >= N^3"])


def test_theorem_5_is_sum_of_parts():
    init, radii = _record()
    t5 = shallow_gd.theorem_5(
        alpha=2.0, phi0=0.5, num_samples=400, d_s=16, d_m=64, R_X=1.0, init=init, radii=radii,
        delta=0.05,
    )  # fmt: skip
    R = math.sqrt(0.1**2 + 0.2**2 + 0.3**2 + 0.4**2)
    conf = math.sqrt(math.log(R / 0.05) / 400)
    assert float(t5.confidence) == pytest.approx(conf)
    assert float(t5.value) == pytest.approx(float(t5.empirical + t5.rademacher) + conf)
    assert bool(t5.vacuous) == (float(t5.value) >= 1.0)
    assert set(t5.hypotheses) == {
        "d_m >= N^3",
        "alpha^2 >= 8 rho M sqrt(2 Phi0)",
        "alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O",
    }  # fmt: skip


def test_alpha_from_features():
    F = jax.random.normal(jax.random.key(0), (6, 10))
    assert float(shallow_gd.alpha_from_features(F)) == pytest.approx(
        np.linalg.svd(np.asarray(F), compute_uv=False).min()
    )


@FAST
@given(scale=st.floats(1.01, 4.0), which=st.sampled_from(["eta_Q", "eta_K", "eta_V", "eta_O"]))
def test_lemma_1_increases_in_norms(scale, which):
    base = {"eta_Q": 3.0, "eta_K": 3.0, "eta_V": 3.0, "eta_O": 1.0}
    kw = {"num_samples": 400, "d_s": 16, "d_m": 64, "R_X": 1.0}
    v = float(shallow_gd.lemma_1(**base, **kw).value)
    w = float(shallow_gd.lemma_1(**{**base, which: base[which] * scale}, **kw).value)
    assert w >= v * (1 - 1e-12)


# ---------------------------------------------------------------- spectrum-adaptive proxy


def _layers(seed=0, L=2, H=2, d=6, k=10):
    rng = np.random.default_rng(seed)
    return [
        {
            "qk": [rng.normal(size=(d, d)) for _ in range(H)],
            "v": [rng.normal(size=(d, d)) @ np.diag([1, 1, 0, 0, 0, 0.0]) for _ in range(H)],
            "m_in": rng.normal(size=(k, d)),
            "m_out": rng.normal(size=(d, k)),
        }
        for _ in range(L)
    ]


def _np_proxy(layers, N, L_phi=1.13):
    L = len(layers)
    c2 = lambda W: np.linalg.norm(W, 2)  # noqa: E731
    fac = [
        L_phi
        * c2(l["m_in"])
        * c2(l["m_out"])
        * sum(c2(v) * (1 + 4 * c2(q)) for q, v in zip(l["qk"], l["v"], strict=False))
        for l in layers
    ]
    alpha = [np.prod(fac[i + 1 :]) for i in range(L)]
    M = math.ceil(L + math.log(N))
    grid = np.arange(2 * M + 1) / M
    total = 0.0
    for i, l in enumerate(layers):
        ci, co = c2(l["m_in"]), c2(l["m_out"])
        mats = [(q, 2 * c2(v) * co * ci) for q, v in zip(l["qk"], l["v"], strict=False)]
        mats += [(v, co * ci) for v in l["v"]] + [(l["m_in"], co), (l["m_out"], 1.0)]
        for W, g in mats:
            s = np.linalg.svd(W, compute_uv=False)
            s = s[s > 1e-10 * s.max()]
            vals = [
                np.sum(s**p) ** (1 / (p + 2))
                * (g * alpha[i] * L) ** (p / (p + 2))
                * N ** ((p + 1) / (p + 2))
                for p in grid
            ]
            total += min(vals)
    return total + math.sqrt(L)


def test_spectrum_adaptive_proxy_matches_reference():
    layers = _layers()
    out = spectral.spectrum_adaptive_proxy(layers, N=1000.0)
    assert float(out.value) == pytest.approx(_np_proxy(layers, 1000.0), rel=1e-10)
    assert out.p_opt.shape == (2 * (2 + 2 + 2),)
    assert not bool(out.vacuous)
    # rank-2 value matrices: the rank (p = 0) is 2 in the Schatten power
    assert (
        float(
            spectral.schatten_power(
                jnp.linalg.svd(jnp.asarray(layers[0]["v"][0]), compute_uv=False), jnp.asarray(0.0)
            )
        )
        == 2.0
    )


def test_norm_based_proxy_reference():
    layers = _layers(L=1, H=1)
    l = layers[0]
    c2 = lambda W: np.linalg.norm(W, 2)  # noqa: E731
    n21 = lambda W: np.sum(np.linalg.norm(W, axis=0))  # noqa: E731
    ci, co = c2(l["m_in"]), c2(l["m_out"])
    xi = (co * ci * c2(l["v"][0]) * n21(l["qk"][0])) ** (2 / 3) + (co * ci * n21(l["v"][0])) ** (
        2 / 3
    )
    xi += (co * n21(l["m_in"])) ** (2 / 3) + n21(l["m_out"]) ** (2 / 3)
    out = spectral.norm_based_proxy(layers)
    assert float(out.value) == pytest.approx((1 + xi) ** 1.5, rel=1e-10)
