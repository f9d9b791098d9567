"""Spectrum-adaptive and norm-based proxies against a numpy reference of the authors' form."""

import math

import numpy as np
import pytest

from jaxbounds.bounds import Status, spectral


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
    out = spectral.spectrum_adaptive_proxy(layers, num_examples=1000.0)
    assert float(out.value) == pytest.approx(_np_proxy(layers, 1000.0), rel=1e-10)
    assert out.p_opt.shape == (2 * (2 + 2 + 2),)
    assert out.status is Status.NON_VACUOUS
    # rank-2 value matrices: the rank (p = 0) is 2 in the Schatten power
    s = np.linalg.svd(layers[0]["v"][0], compute_uv=False)
    assert float(spectral.schatten_power(s, 0.0)) == 2.0


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


def test_proxies_validate_layers_and_numbers():
    layers = _layers(L=1, H=1)
    with pytest.raises(ValueError, match=r"layers\[0\]\['qk'\]\[0\]: expected a finite number"):
        spectral.spectrum_adaptive_proxy(
            [{**layers[0], "qk": [layers[0]["qk"][0] * np.nan]}], num_examples=100.0
        )
    with pytest.raises(ValueError, match=r"layers\[0\]\['m_in'\]: expected a non-empty 2-D"):
        spectral.norm_based_proxy([{**layers[0], "m_in": np.ones(3)}])
    with pytest.raises(ValueError, match="as many 'v' as 'qk'"):
        spectral.norm_based_proxy([{**layers[0], "v": []}])
    with pytest.raises(ValueError, match="layers: expected a non-empty sequence"):
        spectral.norm_based_proxy([])
    with pytest.raises(ValueError, match="num_examples: expected a finite number > 0"):
        spectral.spectrum_adaptive_proxy(layers, num_examples=0.0)
    with pytest.raises(ValueError, match="L_phi: expected a finite number >= 0"):
        spectral.norm_based_proxy(layers, L_phi=-1.0)


def test_attention_only_layers_and_status():
    layers = [{"qk": [np.eye(3)], "v": [2.0 * np.eye(3)]}]
    out = spectral.norm_based_proxy(layers)
    # one layer: alpha_1 = 1 (empty product); no MLP: its spectral norms count as 1
    n21_qk, n21_v, c2_v = 3.0, 6.0, 2.0
    xi = (c2_v * n21_qk) ** (2 / 3) + n21_v ** (2 / 3)
    assert float(out.value) == pytest.approx((1 + xi) ** 1.5, rel=1e-13)
    assert out.status is Status.NON_VACUOUS
    assert out.value.dtype == np.float64
