import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.data.boolean import (
    FourierFunction,
    boolean_dataset,
    even_parity_function,
    parity,
    parity_cot_data,
    random_fourier_function,
    tiling_parities,
)
from kernels.walsh import cube_points, spectrum_degree, spectrum_sparsity, walsh_spectrum


def brute_force(f, bits):
    bits = np.asarray(bits)
    out = np.zeros(bits.shape[0])
    for s, c in zip(f.subsets, np.asarray(f.coefficients), strict=True):
        out += c * (bits[:, list(s)].sum(axis=1) % 2 == 0)
    return out


def test_fourier_function_matches_definition():
    f = FourierFunction(((0, 2), (1,), ()), jnp.array([0.5, -1.0, 2.0]))
    x = cube_points(4)
    np.testing.assert_allclose(f(x), brute_force(f, x), atol=1e-15)
    assert (f.sparsity, f.degree, f.num_bits) == (3, 2, 3)
    # chi_A(x) = (1 + (-1)^{sum_A x_i}) / 2 on one point
    v = f(jnp.array([[1, 0, 1, 0]]))
    assert float(v[0]) == pytest.approx(0.5 * 1 + (-1.0) * 1 + 2.0)


def test_walsh_coefficients_convention():
    f = FourierFunction(((0, 1), (2,)), jnp.array([0.6, 0.8]))
    coeff = np.asarray(f.walsh_coefficients(3))
    want = np.zeros(8)
    want[0] = (0.6 + 0.8) / 2
    want[0b011] = 0.3
    want[0b100] = 0.4
    np.testing.assert_allclose(coeff, want, atol=1e-15)
    assert int(spectrum_degree(coeff)) == 2
    assert int(spectrum_sparsity(coeff)) == 3


def test_fourier_function_is_a_pytree_and_jits():
    f = tiling_parities(6, 3)
    leaves, treedef = jax.tree_util.tree_flatten(f)
    assert len(leaves) == 1
    g = jax.tree_util.tree_unflatten(treedef, [leaves[0] * 2])
    x = cube_points(6)
    np.testing.assert_allclose(jax.jit(lambda h: h(x))(g), 2 * np.asarray(f(x)), atol=1e-14)
    grad = jax.grad(lambda h: jnp.sum(h(x)))(f)
    # d/dc_t sum_x f(x) = number of x with even parity on S_t = 2^T / 2
    np.testing.assert_allclose(grad.coefficients, [32.0, 32.0])


@pytest.mark.parametrize(("num_bits", "degree", "sparsity"), [(6, 1, 6), (6, 2, 15), (8, 3, 5)])
def test_random_fourier_function(num_bits, degree, sparsity):
    f = random_fourier_function(
        jax.random.key(num_bits), num_bits=num_bits, degree=degree, sparsity=sparsity
    )
    assert f.sparsity == sparsity
    assert all(len(s) == degree for s in f.subsets)
    assert len(set(f.subsets)) == sparsity
    c = np.asarray(f.coefficients)
    assert np.all(c > 0)
    assert np.linalg.norm(c) == pytest.approx(1.0, abs=1e-12)
    coeff = f.walsh_coefficients(num_bits)
    assert int(spectrum_degree(coeff)) == degree
    assert int(spectrum_sparsity(coeff)) == sparsity + 1  # plus the constant sum(c)/2
    # Same key, same function; another key, another one.
    g = random_fourier_function(
        jax.random.key(num_bits), num_bits=num_bits, degree=degree, sparsity=sparsity
    )
    assert g.subsets == f.subsets
    np.testing.assert_array_equal(g.coefficients, f.coefficients)


def test_random_subsets_are_uniform():
    counts = {}
    for i in range(300):
        f = random_fourier_function(jax.random.key(i), num_bits=4, degree=2, sparsity=1)
        counts[f.subsets[0]] = counts.get(f.subsets[0], 0) + 1
    assert set(counts) == set(itertools.combinations(range(4), 2))
    # 300 draws over 6 subsets: each count ~ Binomial(300, 1/6), mean 50, sd 6.5
    assert all(abs(v - 50) <= 5 * math.sqrt(300 * (1 / 6) * (5 / 6)) for v in counts.values())


def test_centred_variant():
    f = random_fourier_function(
        jax.random.key(1), num_bits=8, degree=2, sparsity=7, normalization="centred"
    )
    c = np.asarray(f.coefficients)
    assert c.mean() == pytest.approx(0.0, abs=1e-12)
    assert c.var() == pytest.approx(1.0, abs=1e-12)
    single = random_fourier_function(
        jax.random.key(1), num_bits=8, degree=2, sparsity=1, normalization="centred"
    )
    np.testing.assert_array_equal(single.coefficients, [1.0])


def test_tiling_parities_and_parity():
    f = tiling_parities(20, 2)
    assert (f.sparsity, f.degree) == (10, 2)
    assert float(jnp.sum(f.coefficients)) == pytest.approx(math.sqrt(10))
    assert f.subsets[3] == (6, 7)
    x = cube_points(5)
    g = tiling_parities(5, 2)  # bit 4 unused
    assert g.subsets == ((0, 1), (2, 3))
    np.testing.assert_allclose(g(x), brute_force(g, x), atol=1e-15)
    p = np.asarray(parity(x))
    np.testing.assert_array_equal(p, np.asarray(x).sum(axis=1) % 2)
    np.testing.assert_allclose(even_parity_function(5)(x), 1 - p)


def test_parity_cot_data():
    x = cube_points(6)
    data = parity_cot_data(x)
    xs = np.asarray(x)
    s = np.zeros(xs.shape[0], dtype=int)
    step_fn = FourierFunction(((0, 1),), jnp.array([1.0]))
    for j in range(6):
        pair = np.stack([xs[:, j], s], axis=1)
        np.testing.assert_array_equal(data["step_inputs"][:, j], pair)
        s_next = np.asarray(step_fn(jnp.asarray(pair))).astype(int)  # chi_{0,1}, degree 2
        np.testing.assert_array_equal(data["step_targets"][:, j], s_next)
        np.testing.assert_array_equal(s_next, (xs[:, : j + 1].sum(axis=1) + j + 1) % 2)
        s = s_next
    np.testing.assert_array_equal(data["parity"], s ^ (6 % 2))
    np.testing.assert_array_equal(data["sequence"][:, :6], xs)


def test_boolean_dataset():
    f = tiling_parities(6, 2)
    full = boolean_dataset(f, None, num_bits=6)
    assert full["inputs"].shape == (64, 6)
    np.testing.assert_allclose(full["labels"], brute_force(f, full["inputs"]))
    sample = boolean_dataset(f, jax.random.key(0), num_bits=6, num_examples=4000)
    assert sample["inputs"].shape == (4000, 6)
    m = np.asarray(sample["inputs"]).mean()
    assert abs(m - 0.5) <= 5 * math.sqrt(0.25 / 24000)
    spectrum = walsh_spectrum(full["labels"])
    assert int(spectrum_sparsity(spectrum)) == 4


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="coefficients"):
        FourierFunction(((0,), (1,)), jnp.ones(3))
    with pytest.raises(ValueError, match="subsets"):
        FourierFunction(((0, 0),), jnp.ones(1))
    with pytest.raises(ValueError, match="sparsity"):
        random_fourier_function(jax.random.key(0), num_bits=4, degree=2, sparsity=7)
    with pytest.raises(ValueError, match="degree"):
        random_fourier_function(jax.random.key(0), num_bits=4, degree=5, sparsity=1)
    with pytest.raises(ValueError, match="normalization"):
        random_fourier_function(
            jax.random.key(0), num_bits=4, degree=1, sparsity=1, normalization="x"
        )
    with pytest.raises(ValueError, match="num_bits"):
        tiling_parities(20, 2).masks(10)
    with pytest.raises(ValueError, match="key"):
        boolean_dataset(tiling_parities(4, 2), None, num_bits=4, num_examples=3)
