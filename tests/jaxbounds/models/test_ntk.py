"""Empirical NTK vs explicit Jacobians, tiling invariance, its diagonal, linearisation, alpha."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxbounds.models import ShallowTransformer, as_pure
from jaxbounds.models.ntk import (
    empirical_ntk,
    feature_alpha,
    linearize_model,
    linearized_apply,
    ntk_diagonal,
    ntk_min_eigenvalue,
)
from jaxbounds.models.shallow import shallow_apply, shallow_features

N, D_S, D, D_M = 7, 3, 4, 5


@pytest.fixture(scope="module")
def tiny():
    model = ShallowTransformer(D, D_M, rngs=nnx.Rngs(0), dtype=jnp.float64)
    inputs = jax.random.normal(jax.random.key(1), (N, D_S, D), jnp.float64)
    return model.params_dict(), inputs


def explicit_jacobian(params, inputs):
    """(N, P) Jacobian of the outputs w.r.t. the flattened parameters (jax.jacrev)."""
    flat, unravel = ravel_pytree(params)
    return jax.jacrev(lambda v: shallow_apply(unravel(v), inputs))(flat)


@pytest.mark.parametrize("tile_size", [None, 3])
def test_gram_equals_explicit_jacobian_product(tiny, tile_size, run):
    params, inputs = tiny
    jac = explicit_jacobian(params, inputs)
    assert jac.shape == (N, 3 * D_M * D + D_M)
    expected = jac @ jac.T
    got = run(lambda: empirical_ntk(shallow_apply, params, inputs, tile_size=tile_size))
    assert got.shape == (N, N)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * float(jnp.max(expected)))
    np.testing.assert_array_equal(got, got.T)


def test_tiling_does_not_change_the_gram(tiny):
    params, inputs = tiny
    reference = empirical_ntk(shallow_apply, params, inputs)
    for tile_size in (1, 4, 50):  # many tiles; padding (7 = 4 + 3); one tile larger than N
        got = empirical_ntk(shallow_apply, params, inputs, tile_size=tile_size)
        np.testing.assert_allclose(got, reference, rtol=1e-13, atol=1e-13)


def test_gram_on_nnx_pytree_and_float32():
    model = ShallowTransformer(D, D_M, rngs=nnx.Rngs(3))  # float32 parameters
    apply_fn, params = as_pure(model)
    inputs = jax.random.normal(jax.random.key(2), (4, D_S, D), jnp.float32)
    got = empirical_ntk(apply_fn, params, inputs, tile_size=3)
    assert got.dtype == jnp.float32
    params64 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)
    jac = explicit_jacobian(params64, inputs.astype(jnp.float64))
    np.testing.assert_allclose(got, jac @ jac.T, rtol=2e-4, atol=2e-4 * float(jnp.max(got)))


def test_min_eigenvalue(tiny):
    params, inputs = tiny
    jac = explicit_jacobian(params, inputs)
    expected = np.linalg.eigvalsh(np.asarray(jac @ jac.T))[0]
    got = ntk_min_eigenvalue(shallow_apply, params, inputs, tile_size=3)
    assert got > 0  # N = 7 < P = 65 and generic inputs: positive definite
    np.testing.assert_allclose(got, expected, rtol=1e-8)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_tile_size(tiny, bad):
    params, inputs = tiny
    with pytest.raises(ValueError, match="tile_size"):
        empirical_ntk(shallow_apply, params, inputs, tile_size=bad)


def test_linearisation_is_exact_at_init_and_first_order(tiny):
    params, inputs = tiny
    lin = linearize_model(shallow_apply, params)
    np.testing.assert_array_equal(lin(params, inputs), shallow_apply(params, inputs))
    np.testing.assert_array_equal(  # the closure and the argument form are one formula
        linearized_apply(shallow_apply, params, params, inputs), lin(params, inputs)
    )
    flat, unravel = ravel_pytree(params)
    direction = unravel(jax.random.normal(jax.random.key(7), flat.shape, flat.dtype))
    jac = explicit_jacobian(params, inputs)
    jv = jac @ ravel_pytree(direction)[0]

    def moved(eps):
        return jax.tree_util.tree_map(lambda a, v: a + eps * v, params, direction)

    f0 = shallow_apply(params, inputs)
    errors = []
    for eps in (1e-2, 5e-3, 2.5e-3):
        # the linear model is exactly f0 + eps * J v
        np.testing.assert_allclose(lin(moved(eps), inputs), f0 + eps * jv, rtol=1e-12, atol=1e-14)
        errors.append(float(jnp.max(jnp.abs(shallow_apply(moved(eps), inputs) - f0 - eps * jv))))
    # the model differs from it by O(eps^2): halving eps divides the error by ~4
    assert errors[0] < 0.05 * 1e-2 * float(jnp.max(jnp.abs(jv)))  # << the first-order term
    for big, small in itertools.pairwise(errors):
        assert 3.5 < big / small < 4.5


def test_feature_alpha():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(4, 9))
    expected = np.linalg.svd(features, compute_uv=False)[-1]
    np.testing.assert_allclose(feature_alpha(jnp.asarray(features)), expected, rtol=1e-12)
    # alpha^2 is the smallest eigenvalue of F F^T
    np.testing.assert_allclose(
        feature_alpha(jnp.asarray(features)) ** 2,
        np.linalg.eigvalsh(features @ features.T)[0],
        rtol=1e-10,
    )
    assert float(feature_alpha(jnp.asarray(rng.normal(size=(9, 4))))) == 0.0  # N > d_m
    with pytest.raises(ValueError, match="features"):
        feature_alpha(jnp.ones(3))


def test_shallow_alpha_positive_when_wide(tiny):
    params, inputs = tiny
    wide = ShallowTransformer(D, 16, rngs=nnx.Rngs(5), dtype=jnp.float64)
    alpha = feature_alpha(wide.features(inputs))
    assert alpha > 0
    f = shallow_features(params, inputs)
    assert f.shape == (N, D_M)


@pytest.mark.parametrize("chunk_size", [1, 3, 256])
def test_diagonal_is_the_gram_diagonal(tiny, chunk_size):
    params, inputs = tiny
    jac = np.asarray(explicit_jacobian(params, inputs))
    got = jax.jit(lambda p, x: ntk_diagonal(shallow_apply, p, x, chunk_size=chunk_size))(
        params, inputs
    )
    np.testing.assert_allclose(got, np.sum(jac**2, axis=1), rtol=1e-10)
    with pytest.raises(ValueError, match="chunk_size"):
        ntk_diagonal(shallow_apply, params, inputs, chunk_size=0)
