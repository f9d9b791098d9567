"""BlockTransformer: the forward pass against a float64 numpy transcription, spectral_layers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from jaxbounds.models import as_pure
from jaxbounds.models.block import BlockTransformer, spectral_layers


def _proj(x):
    return x / np.maximum(1.0, np.linalg.norm(x, axis=-1, keepdims=True))


def _numpy_forward(p, x):
    """The module docstring's formula written out in numpy, one example (T, d)."""
    for i in sorted(p["layers"]):
        lay = {k: np.asarray(v, np.float64) for k, v in p["layers"][i].items()}
        n = _proj(x)
        k = lay["w_q"].shape[-1]
        att = np.zeros_like(x)
        for h in range(lay["w_q"].shape[0]):
            s = (n @ lay["w_q"][h]) @ (n @ lay["w_k"][h]).T / math.sqrt(k)
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            att += a @ n @ lay["w_v"][h] @ lay["w_o"][h]
        x = x + att
        u = _proj(x) @ lay["m_in"]
        x = x + 0.5 * u * (1 + erf(u / math.sqrt(2))) @ lay["m_out"]
    return _proj(x[0]) @ np.asarray(p["w"], np.float64)


def test_forward_matches_numpy_float64():
    model = BlockTransformer(6, num_layers=3, num_heads=2, head_dim=2, mlp_dim=5,
                             param_dtype=jnp.float64, rngs=nnx.Rngs(3))  # fmt: skip
    apply_fn, p = as_pure(model)
    apply_fn = jax.jit(apply_fn)  # one compile instead of an eager dispatch per op
    x = np.random.default_rng(0).normal(size=(4, 7, 6))
    got = np.asarray(apply_fn(p, jnp.asarray(x)))
    want = np.array([_numpy_forward(p, xi) for xi in x])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert got.shape == (4,)
    assert apply_fn(p, jnp.asarray(x[0])).shape == ()


def test_spectral_layers_products_and_ranks():
    model = BlockTransformer(8, num_layers=2, num_heads=2, head_dim=3, mlp_dim=10,
                             rngs=nnx.Rngs(1))  # fmt: skip
    _, p = as_pure(model)
    layers = spectral_layers(p)
    assert len(layers) == 2
    for i, layer in enumerate(layers):
        raw = {k: np.asarray(v, np.float64) for k, v in p["layers"][i].items()}
        for h in range(2):
            np.testing.assert_allclose(
                layer["qk"][h], raw["w_q"][h] @ raw["w_k"][h].T / math.sqrt(3), rtol=1e-12
            )
            np.testing.assert_allclose(layer["v"][h], raw["w_v"][h] @ raw["w_o"][h], rtol=1e-12)
            for name in ("qk", "v"):
                assert layer[name][h].shape == (8, 8)
                assert layer[name][h].dtype == np.float64
                s = np.linalg.svd(layer[name][h], compute_uv=False)
                assert np.sum(s > 1e-10 * s[0]) == 3  # rank cap k
        assert layer["m_in"].shape == (8, 10)
        assert layer["m_out"].shape == (10, 8)


def test_defaults_and_dtype():
    model = BlockTransformer(6, num_layers=1, num_heads=3, rngs=nnx.Rngs(0))
    _, p = as_pure(model)
    assert p["layers"][0]["w_q"].shape == (3, 6, 2)
    assert p["layers"][0]["m_in"].shape == (6, 12)
    apply_fn, p = as_pure(model)
    assert jax.jit(apply_fn)(p, jnp.ones((2, 4, 6), jnp.float32)).dtype == jnp.float32


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"num_layers": 0}, "num_layers"), ({"num_heads": 0}, "num_heads"),
     ({"head_dim": 0}, "head_dim"), ({"mlp_dim": -1}, "mlp_dim")],
)  # fmt: skip
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BlockTransformer(4, rngs=nnx.Rngs(0), **kwargs)


def test_bad_inputs_and_params_raise():
    model = BlockTransformer(4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="inputs"):
        model(jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="params"):
        spectral_layers({"w": np.ones(4)})
