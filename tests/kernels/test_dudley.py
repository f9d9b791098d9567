"""Tests of kernels.dudley against the closed form and a quadrature + minimisation reference."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from scipy.optimize import minimize_scalar

from kernels import dudley


@pytest.mark.parametrize(
    ("c", "n", "a"), [(1.0, 100, 1.0), (50.0, 10_000, 3.0), (0.01, 7, 0.5), (1e3, 1e6, 10.0)]
)
def test_inverse_square_matches_closed_form(c, n, a):
    n = int(n)
    val, cut = dudley.dudley_integral(lambda e: c / e**2, num_samples=n, radius=a)
    want = 12 * math.sqrt(c / n) * (1 + math.log(a * math.sqrt(n) / (3 * math.sqrt(c))))
    np.testing.assert_allclose(val, want, rtol=1e-7)
    np.testing.assert_allclose(cut, 3 * math.sqrt(c / n), rtol=1e-3)
    np.testing.assert_allclose(
        dudley.dudley_inverse_square(c, num_samples=n, radius=a), want, rtol=1e-12
    )


def test_cutoff_at_radius_when_class_is_small_relative_to_cover():
    # delta* = 3 sqrt(C/n) >= A: the best is delta = A, bound 4A
    val, cut = dudley.dudley_integral(lambda e: 100.0 / e**2, num_samples=4, radius=1.0)
    np.testing.assert_allclose(val, 4.0, rtol=1e-12)
    np.testing.assert_allclose(cut, 1.0, rtol=1e-12)
    np.testing.assert_allclose(dudley.dudley_inverse_square(100.0, num_samples=4, radius=1.0), 4.0)


def reference(log_cover, n, a):
    def obj(delta):
        integral, _ = quad(lambda e: math.sqrt(max(log_cover(e), 0) / n), delta, a, limit=200)
        return 4 * delta + 12 * integral

    res = minimize_scalar(obj, bounds=(1e-9, a), method="bounded", options={"xatol": 1e-12})
    return min(res.fun, 4 * a)


@pytest.mark.parametrize(("p", "n", "a"), [(5, 1000, 1.0), (40, 500, 2.0), (3, 10, 1.0)])
def test_parametric_class_matches_quadrature(p, n, a):
    # log N = p log(3A / eps), a p-parameter class
    val, _ = dudley.dudley_integral(lambda e: p * jnp.log(3 * a / e), num_samples=n, radius=a)
    want = reference(lambda e: p * math.log(3 * a / e), n, a)
    np.testing.assert_allclose(val, want, rtol=1e-6)


def test_jit_and_errors():
    f = jax.jit(lambda c: dudley.dudley_integral(lambda e: c / e**2, num_samples=100, radius=1.0))
    np.testing.assert_allclose(
        f(1.0)[0], dudley.dudley_inverse_square(1.0, num_samples=100, radius=1.0)
    )
    with pytest.raises(ValueError, match="num_samples"):
        dudley.dudley_integral(lambda e: 1 / e**2, num_samples=0, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        dudley.dudley_integral(lambda e: 1 / e**2, num_samples=3, radius=0.0)


@settings(max_examples=20, deadline=None)
@given(
    c=st.floats(1e-3, 1e3),
    n=st.integers(1, 10**6),
    a=st.floats(0.1, 10.0),
    scale=st.floats(1.01, 10.0),
)
def test_closed_form_monotone(c, n, a, scale):
    base = float(dudley.dudley_inverse_square(c, num_samples=n, radius=a))
    assert float(dudley.dudley_inverse_square(c * scale, num_samples=n, radius=a)) >= base
    assert float(dudley.dudley_inverse_square(c, num_samples=n, radius=a * scale)) >= base
    assert float(dudley.dudley_inverse_square(c, num_samples=n + 1, radius=a)) <= base * (1 + 1e-12)
    assert base <= 4 * a * (1 + 1e-12)
