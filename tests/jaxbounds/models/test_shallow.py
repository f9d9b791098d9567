"""Shallow GD Transformer: the paper's formula, initialisation, the bound quantities."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.models import ShallowTransformer, as_pure
from jaxbounds.models.shallow import (
    PARAM_NAMES,
    shallow_apply,
    shallow_features,
    shallow_quantities,
)


def paper_formula(params, x):
    """f(X) = (1/d_s) w_O^T sum_i relu(W_V X^T softmax(X W_K^T W_Q x_i^T / sqrt(d_m))), a loop."""
    w_q, w_k, w_v, w_o = (np.asarray(params[k]) for k in ("W_Q", "W_K", "W_V", "w_O"))
    d_s, d_m = x.shape[0], w_q.shape[0]
    total = np.zeros(d_m)
    for i in range(d_s):
        logits = x @ w_k.T @ w_q @ x[i] / np.sqrt(d_m)
        beta = np.exp(logits - logits.max())
        beta /= beta.sum()
        total += np.maximum(w_v @ x.T @ beta, 0)
    return w_o @ total / d_s


@pytest.fixture(scope="module")
def model64():
    return ShallowTransformer(6, 10, rngs=nnx.Rngs(0), dtype=jnp.float64)


def test_output_matches_the_paper_formula(model64, run):
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, 4, 6), jnp.float64))
    params = model64.params_dict()
    expected = np.array([paper_formula(params, xn) for xn in x])
    got = run(lambda: model64(jnp.asarray(x)))
    assert got.shape == (5,)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(model64(jnp.asarray(x[2])), expected[2], rtol=1e-13)  # unbatched
    np.testing.assert_allclose(shallow_apply(params, jnp.asarray(x)), expected, rtol=1e-13)
    apply_fn, pure = as_pure(model64)
    np.testing.assert_allclose(apply_fn(pure, jnp.asarray(x)), expected, rtol=1e-13)
    feats = model64.features(jnp.asarray(x))
    assert feats.shape == (5, 10)
    assert float(jnp.min(feats)) >= 0  # average of ReLUs
    np.testing.assert_allclose(feats @ params["w_O"], expected, rtol=1e-13)


def test_one_token_reduces_to_a_two_layer_relu_net(model64):
    """With d_s = 1 the softmax is 1: f(x) = w_O^T relu(W_V x)."""
    x = jax.random.normal(jax.random.key(2), (3, 1, 6), jnp.float64)
    p = model64.params_dict()
    expected = jax.nn.relu(x[:, 0] @ p["W_V"].T) @ p["w_O"]
    np.testing.assert_allclose(model64(x), expected, rtol=1e-13)


def test_lecun_initialisation_variances():
    d, d_m = 64, 1024
    model = ShallowTransformer(d, d_m, rngs=nnx.Rngs(3), dtype=jnp.float64)
    for name in ("W_Q", "W_K", "W_V"):
        w = np.asarray(getattr(model, name)[...])
        assert w.shape == (d_m, d)
        n = w.size  # sample variance of n normals: relative stderr sqrt(2/n)
        assert abs(w.var() * d - 1) < 5 * np.sqrt(2 / n)
        assert abs(w.mean()) < 5 / np.sqrt(n * d)
    w_o = np.asarray(model.w_O[...])
    assert w_o.shape == (d_m,)
    assert abs(w_o.var() * d_m - 1) < 5 * np.sqrt(2 / d_m)
    # the four matrices are drawn independently
    assert not np.allclose(model.W_Q[...], model.W_K[...])


def test_dtype_follows_parameters_and_bad_arguments():
    model = ShallowTransformer(3, 4, rngs=nnx.Rngs(0))
    x = jnp.ones((2, 5, 3), jnp.float32)
    assert model(x).dtype == jnp.float32
    with pytest.raises(ValueError, match="d_m"):
        ShallowTransformer(3, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d:"):
        ShallowTransformer(2.5, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="inputs"):
        model(jnp.ones((2, 5, 4), jnp.float32))


def test_quantities_from_a_run(model64):
    x = jax.random.normal(jax.random.key(2), (7, 3, 6), jnp.float64)
    y = jnp.arange(7) % 2
    params = model64.params_dict()
    radii = {"W_Q": 0.1, "W_K": 0.2, "W_V": 0.3, "w_O": 0.4}
    q = shallow_quantities(params, x, y, radii=radii)
    assert (q.num_examples, q.d_s, q.d_m) == (7, 3, 10)
    r_x = max(np.linalg.norm(np.asarray(xn)) for xn in x) / math.sqrt(3)
    assert q.input_radius == pytest.approx(r_x, rel=1e-12)
    f0 = np.array([paper_formula(params, np.asarray(xn)) for xn in x])
    assert q.phi0 == pytest.approx(0.5 * np.sum((f0 - (2 * np.asarray(y) - 1)) ** 2), rel=1e-10)
    np.testing.assert_allclose(q.features0, shallow_features(params, x))
    assert q.radii == {"Q": 0.1, "K": 0.2, "V": 0.3, "O": 0.4}
    for name in PARAM_NAMES:
        np.testing.assert_array_equal(q.init[name[-1]], params[name])
