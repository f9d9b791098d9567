"""Tests of kernels.walsh against a dense Hadamard matrix and characters enumerated by hand."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels._checks import runtime_checks
from kernels.walsh import (
    cube_points,
    fwht,
    spectrum_degree,
    spectrum_sparsity,
    subset_sizes,
    walsh_spectrum,
)


def dense_hadamard(n):
    idx = np.arange(2**n)
    pop = np.array([[bin(i & j).count("1") for j in idx] for i in idx])
    return (-1.0) ** pop


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7])
def test_fwht_matches_dense_hadamard(run, n):
    x = jax.random.normal(jax.random.key(n), (3, 2, 2**n))
    got = run(lambda: fwht(x))
    want = np.einsum("ij,abj->abi", dense_hadamard(n), np.asarray(x))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.shape == x.shape


def test_fwht_involution_and_dtype():
    x = jax.random.normal(jax.random.key(0), (16,), dtype=jnp.float32)
    y = fwht(x)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(fwht(y), 16 * np.asarray(x), rtol=1e-5, atol=1e-5)
    xi = jnp.array([3, -1, 2, 0, 5, 1, 1, 7])
    assert fwht(xi).dtype == xi.dtype
    np.testing.assert_array_equal(fwht(fwht(xi)), 8 * np.asarray(xi))


def test_fwht_is_linear_under_grad_and_vmap():
    h = dense_hadamard(4)
    w = jnp.arange(16.0)
    g = jax.grad(lambda v: jnp.dot(w, fwht(v)))(jnp.zeros(16))
    np.testing.assert_allclose(g, h.T @ np.asarray(w))
    xs = jax.random.normal(jax.random.key(1), (5, 16))
    np.testing.assert_allclose(jax.vmap(fwht)(xs), fwht(xs), rtol=1e-14)


def test_cube_points_order_matches_index_bits():
    pts = np.asarray(cube_points(4))
    assert pts.shape == (16, 4)
    for idx, row in enumerate(pts):
        assert idx == sum(int(b) << i for i, b in enumerate(row))
    np.testing.assert_array_equal(subset_sizes(4), pts.sum(axis=1))


def test_spectrum_of_characters_and_indicator():
    n = 4
    pts = np.asarray(cube_points(n))
    for mask in range(2**n):
        subset = [i for i in range(n) if mask >> i & 1]
        chi_pm = (-1.0) ** pts[:, subset].sum(axis=1)
        coeff = np.asarray(walsh_spectrum(jnp.asarray(chi_pm)))
        np.testing.assert_allclose(coeff, np.eye(2**n)[mask], atol=1e-15)
        # The 0/1 even-parity indicator: 1/2 at the empty set and 1/2 at the subset.
        chi01 = (1 + chi_pm) / 2
        want = np.zeros(2**n)
        want[0] += 0.5
        want[mask] += 0.5
        np.testing.assert_allclose(walsh_spectrum(jnp.asarray(chi01)), want, atol=1e-15)


def test_parseval_and_inverse(run):
    vals = jax.random.normal(jax.random.key(3), (4, 2**6))
    coeff = run(lambda: walsh_spectrum(vals))
    np.testing.assert_allclose(
        np.sum(np.asarray(coeff) ** 2, axis=-1), np.mean(np.asarray(vals) ** 2, axis=-1), rtol=1e-12
    )
    np.testing.assert_allclose(fwht(coeff), vals, rtol=1e-12, atol=1e-12)


def test_walsh_spectrum_integer_input_brute_force():
    n = 3
    vals = np.array([0, 1, 1, 0, 1, 0, 0, 1])  # parity of 3 bits (odd indicator)
    coeff = np.asarray(walsh_spectrum(jnp.asarray(vals)))
    assert coeff.dtype == np.float64
    pts = np.asarray(cube_points(n))
    for mask in range(8):
        chi = (-1.0) ** pts[:, [i for i in range(n) if mask >> i & 1]].sum(axis=1)
        assert coeff[mask] == pytest.approx(np.mean(vals * chi), abs=1e-15)
    np.testing.assert_allclose(coeff, [0.5, 0, 0, 0, 0, 0, 0, -0.5], atol=1e-15)


def test_degree_and_sparsity():
    n = 5
    pts = np.asarray(cube_points(n))
    rng = np.random.default_rng(0)
    for degree in range(n + 1):
        for subset in itertools.islice(itertools.combinations(range(n), degree), 3):
            c = rng.uniform(0.5, 1.0)
            vals = 0.3 + c * (-1.0) ** pts[:, list(subset)].sum(axis=1)
            coeff = walsh_spectrum(jnp.asarray(vals))
            assert int(spectrum_degree(coeff)) == degree
            assert int(spectrum_sparsity(coeff)) == (1 if degree == 0 else 2)
    # Batched, zero function, tolerance.
    coeff = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1e-3, 0.0, 1e-6]])
    np.testing.assert_array_equal(spectrum_degree(coeff), [-1, 2])
    np.testing.assert_array_equal(spectrum_degree(coeff, tol=1e-5), [-1, 1])
    np.testing.assert_array_equal(spectrum_sparsity(coeff, tol=1e-5), [0, 2])
    np.testing.assert_array_equal(jax.jit(spectrum_sparsity)(coeff), [0, 3])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="x"):
        fwht(jnp.zeros(6))
    with pytest.raises(ValueError, match="x"):
        fwht(jnp.float64(1.0))
    with pytest.raises(ValueError, match="values"):
        walsh_spectrum(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="tol"):
        spectrum_degree(jnp.zeros(4), tol=-1.0)
    with pytest.raises(ValueError, match="tol"):
        spectrum_sparsity(jnp.zeros(4), tol=float("nan"))
    with pytest.raises(ValueError, match="num_bits"):
        cube_points(-1)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_is_refused(dtype):
    with pytest.raises(ValueError, match=r"^x: float16/bfloat16"):
        fwht(jnp.ones(4, dtype))
    with pytest.raises(ValueError, match=r"^values: float16/bfloat16"):
        walsh_spectrum(jnp.ones(4, dtype))
    with pytest.raises(ValueError, match=r"^coefficients: float16/bfloat16"):
        spectrum_degree(jnp.ones(4, dtype))


def test_empty_inputs_are_refused():
    with pytest.raises(ValueError, match=r"^x: expected a non-empty"):
        fwht(jnp.zeros((0, 4)))
    with pytest.raises(ValueError, match=r"^values: last axis"):
        walsh_spectrum(jnp.zeros((3, 0)))
    with pytest.raises(ValueError, match=r"^coefficients: expected a non-empty"):
        spectrum_sparsity(jnp.zeros((0, 8)))


@pytest.mark.parametrize("kernel", [spectrum_degree, spectrum_sparsity])
def test_nan_coefficients_raise_eagerly_and_under_jit(kernel):
    coeff = jnp.array([0.5, jnp.nan, 0.0, 0.5])  # a NaN would otherwise count as a zero
    with pytest.raises(ValueError, match=r"^coefficients: expected finite values"):
        kernel(coeff)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: coefficients"):
        jax.block_until_ready(jax.jit(kernel)(coeff))
    with runtime_checks(False):
        jax.block_until_ready(jax.jit(lambda c: kernel(c))(coeff))  # switched off: no error


# ----------------------------------------------------------------------------- range boundaries


def test_integer_transforms_are_exact_or_refused():
    """uint8 [0, 1] gave [1, 255] (unsigned wrap): now the signed [1, -1]; int32 full(2**16,
    2**16) gave element 0 = 0 (2**32 wrapped): refused, naming x; values that fit are exact."""
    np.testing.assert_array_equal(fwht(jnp.array([0, 1], jnp.uint8)), [1, -1])
    assert fwht(jnp.array([0, 1], jnp.uint8)).dtype == jnp.int32
    np.testing.assert_array_equal(fwht(jnp.array([True, False])), [1, 1])
    with pytest.raises(ValueError, match=r"^x: an exact transform of 2\*\*16 integers"):
        fwht(jnp.full(2**16, 2**16, jnp.int32))
    with pytest.raises(ValueError, match=r"^x: an exact transform"):
        fwht(jnp.full(4, -(2**30), jnp.int32))
    ok = fwht(jnp.full(2**4, 2**26, jnp.int32))  # the largest entries that fit: 2**30
    assert int(ok[0]) == 2**30
    assert int(jnp.sum(jnp.abs(ok[1:]))) == 0
    with pytest.raises(ValueError, match=r"^x: an exact transform of 2\*\*4 integers"):
        fwht(jnp.full(2**4, 2**27, jnp.int32))
    wide = fwht(jnp.full(2**4, 2**28, jnp.int64))  # x64 is on in the tests: exact in int64
    assert wide.dtype == jnp.int64
    assert int(wide[0]) == 2**32
    with pytest.raises(jax.errors.JaxRuntimeError, match="x: an exact transform"):
        jax.jit(fwht)(jnp.full(8, 2**30, jnp.int32)).block_until_ready()


def test_and_of_12_bits_in_float32_has_full_degree_and_sparsity():
    """AND of 12 bits: every coefficient is +-2**-12, below float32's old absolute threshold
    sqrt(eps) = 3.5e-4 (degree -1, sparsity 0); the default threshold is relative to the
    spectrum's norm."""
    values = jnp.zeros(2**12, jnp.float32).at[-1].set(1.0)
    coeff = walsh_spectrum(values)
    assert int(spectrum_degree(coeff)) == 12
    assert int(spectrum_sparsity(coeff)) == 4096
    batch = jnp.stack([coeff, 1e6 * coeff, jnp.zeros_like(coeff)])
    np.testing.assert_array_equal(spectrum_degree(batch), [12, 12, -1])
    np.testing.assert_array_equal(spectrum_sparsity(batch), [4096, 4096, 0])
    # rounding noise of a float32 transform is below the default threshold
    chi = fwht(jnp.zeros(2**12, jnp.float32).at[5].set(1.0))  # the +-1 character of {0, 2}
    noisy = walsh_spectrum(0.1 * chi + 0.3)
    assert int(spectrum_sparsity(noisy)) == 2


def test_subset_sizes_at_26_bits_is_a_popcount():
    """n = 26: 256 MB of int32 (building the points first took 22 GB)."""
    sizes = subset_sizes(26)
    assert sizes.shape == (2**26,)
    assert sizes.dtype == jnp.int32
    idx = np.array([0, 1, 2**25, 2**26 - 1, 0b1011011])
    np.testing.assert_array_equal(np.asarray(sizes)[idx], [bin(int(i)).count("1") for i in idx])
    with pytest.raises(ValueError, match=r"^num_bits"):
        subset_sizes(33)
