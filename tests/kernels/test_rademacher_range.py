"""rademacher_linear and ldexp_exact at the ends of the float range (issue 38, case 4)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.norms import ldexp_exact, pow2_exponent


def _exact(x, radius=1.0):
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=x.shape[0])))
    values = np.linalg.norm(signs @ np.asarray(x, np.float64), axis=1) * radius / x.shape[0]
    return values.mean(), values.std()


@pytest.mark.parametrize(
    ("dtype", "factor", "radius"),
    [
        (np.float32, 1e-37, 1.0),
        (np.float32, 1e-35, 1.0),
        (np.float32, 1.0, 1e-37),
        (np.float32, 1e20, 1.0),
        (np.float32, 1.0, 1e38),
        (np.float64, 1e-300, 1.0),
        (np.float64, 1e300, 1.0),
        (np.float64, 1.0, 1e308),
    ],
)
def test_tiny_and_huge_scales_against_numpy(dtype, factor, radius):
    x64 = np.random.default_rng(0).normal(size=(10, 3))
    x = (x64 * factor).astype(dtype)
    est = kernels.rademacher_linear(jnp.asarray(x), jax.random.key(1), norm=2, radius=radius,
                                    num_samples=4000)  # fmt: skip
    assert est.mean.dtype == dtype
    # the truth for the stored values, computed at order 1 and scaled in float64 (Python floats)
    mean, sd = _exact(x.astype(np.float64) / factor)
    scale = factor * radius
    got, se = float(est.mean), float(est.stderr)
    assert se > 0
    assert abs(got / scale - mean) <= 5 * se / scale
    # subnormal float32 results keep fewer digits: the stderr is right to a few percent there
    assert se / scale == pytest.approx(sd / np.sqrt(4000), rel=0.1)
    assert float(est.lower) / scale <= mean <= float(est.upper) / scale
    assert float(est.lower) > 0


def test_scaling_is_bit_exact_in_the_normal_range():
    x = jnp.asarray(np.random.default_rng(2).normal(size=(12, 4)), jnp.float32)
    a = kernels.rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, num_samples=64)
    b = kernels.rademacher_linear(x * 2.0**-40, jax.random.key(0), norm=2, radius=2.0**40,
                                  num_samples=64)  # fmt: skip
    assert float(a.mean) == float(b.mean)
    assert float(a.stderr) == float(b.stderr)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ldexp_exact_against_numpy(dtype):
    rng = np.random.default_rng(0)
    info = np.finfo(dtype)
    x = rng.normal(size=4000).astype(dtype)
    lo, hi = int(info.minexp) - int(info.nmant) - 4, int(info.maxexp) + 2
    e = rng.integers(lo, hi, size=4000).astype(np.int32)
    got = np.asarray(jax.jit(ldexp_exact)(jnp.asarray(x), jnp.asarray(e)))
    with np.errstate(over="ignore"):
        want = (
            np.ldexp(x.astype(np.float64), e).astype(dtype)
            if dtype == np.float32
            else (np.ldexp(x, e))
        )
    np.testing.assert_array_equal(got, want)
    assert int(pow2_exponent(jnp.asarray(dtype(3.0)))) == 2
