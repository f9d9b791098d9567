"""Tests of kernels.dudley against the closed form and a quadrature + minimisation reference."""

import dataclasses
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
from kernels._checks import runtime_checks
from tests.helpers import TraceCounter, compiles_in, count_compiles


def inverse_square(eps, c):
    """log N = C / eps^2, with C passed as data (so one compilation serves every C)."""
    return c / eps**2


@pytest.mark.parametrize(
    ("c", "n", "a"), [(1.0, 100, 1.0), (50.0, 10_000, 3.0), (0.01, 7, 0.5), (1e3, 1e6, 10.0)]
)
def test_inverse_square_matches_closed_form(c, n, a):
    n = int(n)
    out = dudley.dudley_integral(inverse_square, num_examples=n, radius=a, args=jnp.asarray(c))
    assert isinstance(out, dudley.DudleyIntegral)
    want = 12 * math.sqrt(c / n) * (1 + math.log(a * math.sqrt(n) / (3 * math.sqrt(c))))
    np.testing.assert_allclose(out.value, want, rtol=1e-7)
    np.testing.assert_allclose(out.cutoff, 3 * math.sqrt(c / n), rtol=1e-3)
    np.testing.assert_allclose(
        dudley.dudley_inverse_square(c, num_examples=n, radius=a), want, rtol=1e-12
    )


def test_cutoff_at_radius_when_class_is_small_relative_to_cover():
    # delta* = 3 sqrt(C/n) >= A: the best is delta = A, bound 4A
    out = dudley.dudley_integral(lambda e: 100.0 / e**2, num_examples=4, radius=1.0)
    np.testing.assert_allclose(out.value, 4.0, rtol=1e-12)
    np.testing.assert_allclose(out.cutoff, 1.0, rtol=1e-12)
    np.testing.assert_allclose(dudley.dudley_inverse_square(100.0, num_examples=4, radius=1.0), 4.0)


def test_single_function_class_has_zero_bound():
    assert float(dudley.dudley_inverse_square(0.0, num_examples=10, radius=1.0)) == 0.0
    out = dudley.dudley_integral(lambda e: jnp.zeros_like(e), num_examples=10, radius=1.0)
    assert float(out.value) <= 4.0 * 1e-12 * (1 + 1e-9)  # the smallest delta on the grid


def reference(log_cover, n, a):
    def obj(delta):
        integral, _ = quad(lambda e: math.sqrt(max(log_cover(e), 0) / n), delta, a, limit=200)
        return 4 * delta + 12 * integral

    res = minimize_scalar(obj, bounds=(1e-9, a), method="bounded", options={"xatol": 1e-12})
    return min(res.fun, 4 * a)


@pytest.mark.parametrize(("p", "n", "a"), [(5, 1000, 1.0), (40, 500, 2.0), (3, 10, 1.0)])
def test_parametric_class_matches_quadrature(p, n, a):
    # log N = p log(3A / eps), a p-parameter class
    out = dudley.dudley_integral(lambda e: p * jnp.log(3 * a / e), num_examples=n, radius=a)
    want = reference(lambda e: p * math.log(3 * a / e), n, a)
    # the reference is a bounded scalar minimisation (xatol 1e-12) of a quad integral (about
    # 1e-10 relative here); the kernel's grid is accurate to about 1e-7 relative
    np.testing.assert_allclose(out.value, want, rtol=1e-6)


def test_result_is_a_frozen_registered_dataclass():
    out = dudley.dudley_integral(lambda e: 1.0 / e**2, num_examples=100, radius=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.value = 1.0  # type: ignore[misc]
    leaves = jax.tree_util.tree_leaves(out)
    assert len(leaves) == 2
    doubled = jax.tree_util.tree_map(lambda x: 2 * x, out)
    np.testing.assert_allclose(doubled.cutoff, 2 * out.cutoff)


def test_jit_vmap_and_traced_radius():
    f = jax.jit(
        lambda c, a: dudley.dudley_integral(inverse_square, num_examples=100, radius=a, args=c)
    )
    out = f(jnp.asarray(1.0), jnp.asarray(1.0))
    np.testing.assert_allclose(
        out.value, dudley.dudley_inverse_square(1.0, num_examples=100, radius=1.0), rtol=1e-7
    )
    cs = jnp.array([1.0, 4.0])
    batched = jax.vmap(lambda c: f(c, jnp.asarray(2.0)))(cs)
    want = dudley.dudley_inverse_square(cs, num_examples=100, radius=2.0)
    np.testing.assert_allclose(batched.value, want, rtol=1e-7)


def test_float32_radius_gives_float32():
    out = dudley.dudley_integral(
        inverse_square, num_examples=100, radius=jnp.float32(1.0), args=jnp.float32(1.0)
    )
    assert out.value.dtype == out.cutoff.dtype == jnp.float32
    np.testing.assert_allclose(out.value, 2.644767, rtol=1e-4)


def test_second_call_with_new_data_compiles_nothing():
    fn = TraceCounter(inverse_square)
    kwargs = {"num_examples": 50, "radius": jnp.asarray(1.0)}
    first = dudley.dudley_integral(fn, args=jnp.asarray(1.0), **kwargs)
    traces = fn.count
    assert traces == 3  # the coarse grid, the tail above the refinement, the fine grid
    new_c, new_a = jnp.asarray(2.0), jnp.asarray(1.5)
    with count_compiles() as log:
        second = dudley.dudley_integral(fn, args=new_c, num_examples=50, radius=new_a)
    assert compiles_in(log) == []
    assert fn.count == traces
    assert float(second.value) > float(first.value)


def test_bad_arguments_raise():
    f = lambda e: 1 / e**2  # noqa: E731
    with pytest.raises(ValueError, match="num_examples"):
        dudley.dudley_integral(f, num_examples=0, radius=1.0)
    with pytest.raises(ValueError, match="num_grid"):
        dudley.dudley_integral(f, num_examples=3, radius=1.0, num_grid=4)
    with pytest.raises(ValueError, match="min_ratio"):
        dudley.dudley_integral(f, num_examples=3, radius=1.0, min_ratio=0.0)
    with pytest.raises(ValueError, match="radius"):
        dudley.dudley_integral(f, num_examples=3, radius=0.0)
    with pytest.raises(ValueError, match="coef_delta"):
        dudley.dudley_integral(f, num_examples=3, radius=1.0, coef_delta=-4.0)
    with pytest.raises(ValueError, match="radius: expected a float32 or float64"):
        dudley.dudley_integral(f, num_examples=3, radius=jnp.float16(1.0))
    with pytest.raises(ValueError, match="log_cover_fn: must map"):
        dudley.dudley_integral(lambda e: jnp.sum(1 / e**2), num_examples=3, radius=1.0)
    with pytest.raises(ValueError, match="num_examples"):
        dudley.dudley_inverse_square(1.0, num_examples=0, radius=1.0)
    with pytest.raises(ValueError, match="log_cover_coef"):
        dudley.dudley_inverse_square(-1.0, num_examples=3, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        dudley.dudley_inverse_square(1.0, num_examples=3, radius=-1.0)


@pytest.mark.parametrize("radius", [0.0, -1.0, math.nan, math.inf])
def test_bad_traced_radius_raises_eagerly_and_under_jit(radius):
    kwargs = {"num_examples": 10, "args": jnp.asarray(1.0)}
    with pytest.raises(ValueError, match=r"^radius: expected a finite value > 0"):
        dudley.dudley_integral(inverse_square, radius=jnp.asarray(radius), **kwargs)
    jitted = jax.jit(lambda a: dudley.dudley_integral(inverse_square, radius=a, **kwargs).value)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: radius"):
        jax.block_until_ready(jitted(jnp.asarray(radius)))
    closed = jax.jit(lambda a: dudley.dudley_inverse_square(1.0, num_examples=10, radius=a))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: radius"):
        jax.block_until_ready(closed(jnp.asarray(radius)))


def test_nonfinite_log_cover_raises_eagerly_and_under_jit():
    nan_cover = lambda e, c: jnp.where(e < 0.5, c, 1.0 / e**2)  # noqa: E731
    kwargs = {"num_examples": 10, "radius": 1.0}
    with pytest.raises(ValueError, match=r"^log_cover_fn: returned NaN or inf at \d+ of"):
        dudley.dudley_integral(nan_cover, args=jnp.asarray(jnp.nan), **kwargs)
    jitted = jax.jit(lambda c: dudley.dudley_integral(nan_cover, args=c, **kwargs).value)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: log_cover_fn"):
        jax.block_until_ready(jitted(jnp.asarray(jnp.nan)))
    closed = jax.jit(lambda c: dudley.dudley_inverse_square(c, num_examples=10, radius=1.0))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: log_cover_coef"):
        jax.block_until_ready(closed(jnp.asarray(jnp.nan)))
    with runtime_checks(False):  # a program traced with the checks off lets NaN through
        off = jax.jit(lambda c: dudley.dudley_inverse_square(c, num_examples=10, radius=1.0))
        assert np.isnan(float(off(jnp.asarray(jnp.nan))))


@settings(max_examples=20, deadline=None)
@given(
    c=st.floats(1e-3, 1e3),
    n=st.integers(1, 10**6),
    a=st.floats(0.1, 10.0),
    scale=st.floats(1.01, 10.0),
)
def test_closed_form_monotone(c, n, a, scale):
    base = float(dudley.dudley_inverse_square(c, num_examples=n, radius=a))
    assert float(dudley.dudley_inverse_square(c * scale, num_examples=n, radius=a)) >= base
    assert float(dudley.dudley_inverse_square(c, num_examples=n, radius=a * scale)) >= base
    assert float(dudley.dudley_inverse_square(c, num_examples=n + 1, radius=a)) <= base * (
        1 + 1e-12
    )
    assert base <= 4 * a * (1 + 1e-12)


def test_integral_checks_name_the_radius_before_the_cover():
    """A negative radius makes the log grid NaN, so log_cover_fn's values fail too: the
    radius, the first argument checked, is the one reported."""
    from kernels._checks import failed_check_message

    f = jax.jit(lambda r: dudley.dudley_integral(inverse_square, num_examples=100, radius=r,
                                                 args=jnp.asarray(1.0)).value)  # fmt: skip
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.asarray(-1.0)))  # a GPU reports it when the result is read
    assert failed_check_message(info.value).startswith("radius")


def test_mismatched_shapes_name_the_arguments():
    with pytest.raises(ValueError, match=r"^log_cover_coef, radius: shapes \(3,\) and \(2,\)"):
        dudley.dudley_inverse_square(jnp.ones(3), num_examples=10, radius=jnp.ones(2))
    out = dudley.dudley_inverse_square(jnp.ones(3), num_examples=10, radius=jnp.ones(3))
    assert out.shape == (3,)
    with pytest.raises(ValueError, match=r"^radius: expected a scalar"):
        dudley.dudley_integral(inverse_square, num_examples=10, radius=jnp.ones(2),
                               args=jnp.asarray(1.0))  # fmt: skip
