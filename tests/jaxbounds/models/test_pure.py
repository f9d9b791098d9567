"""as_pure and set_params round trips, transforms through the pure function, apply_in_chunks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxbounds.models import ScalarTransformer, as_pure, set_params
from jaxbounds.models.pure import apply_in_chunks

F64 = jnp.float64


def _model(**kw):
    kw.setdefault("param_dtype", F64)
    return ScalarTransformer(kw.pop("d", 6), rngs=nnx.Rngs(kw.pop("seed", 0)), **kw)


def _inputs(shape, seed=1, scale=2.0):
    return scale * jax.random.normal(jax.random.key(seed), shape, F64)


def test_as_pure_round_trip_and_transforms(run):
    model = _model(num_layers=2, num_heads=2)
    x = _inputs((5, 4, 6))
    apply_fn, params = as_pure(model)
    np.testing.assert_allclose(run(lambda: apply_fn(params, x)), model(x), rtol=1e-12)
    # vmap over examples equals the batched call.
    per_example = jax.vmap(lambda xi: apply_fn(params, xi))(x)
    np.testing.assert_allclose(per_example, model(x), rtol=1e-12)
    # set_params writes a modified dict back.
    doubled = jax.tree_util.tree_map(lambda a: 2 * a, params)
    set_params(model, doubled)
    np.testing.assert_allclose(model(x), apply_fn(doubled, x), rtol=1e-12)
    with pytest.raises(ValueError, match="params"):
        apply_fn({"w": params["w"]}, x)


@pytest.mark.slow
def test_grad_jvp_linearize_through_as_pure():
    model = _model(num_layers=2, num_heads=2, hidden_dim=3, d=4)
    x = _inputs((3, 5, 4))
    apply_fn, params = as_pure(model)
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def loss(p):
        return jnp.sum(apply_fn(p, x) ** 2)

    g = ravel_pytree(jax.jit(jax.grad(loss))(params))[0]
    # Central finite differences along a few coordinate directions.
    eps = 1e-6
    for j in (0, 17, flat.size // 2, flat.size - 1):
        e = jnp.zeros_like(flat).at[j].set(eps)
        fd = (loss(unravel(flat + e)) - loss(unravel(flat - e))) / (2 * eps)
        np.testing.assert_allclose(g[j], fd, rtol=1e-6, atol=1e-8)
    v = unravel(jax.random.normal(jax.random.key(3), flat.shape, F64))
    tangent = jax.jit(lambda p, v: jax.jvp(loss, (p,), (v,))[1])(params, v)
    np.testing.assert_allclose(tangent, jnp.vdot(g, ravel_pytree(v)[0]), rtol=1e-10)
    hv = jax.jit(lambda p, v: ravel_pytree(jax.linearize(jax.grad(loss), p)[1](v))[0])(params, v)
    dense = jax.jit(jax.hessian(lambda f: loss(unravel(f))))(flat)
    np.testing.assert_allclose(hv, dense @ ravel_pytree(v)[0], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 100])
def test_apply_in_chunks_equals_one_call(chunk_size):
    apply_fn, params = as_pure(_model(num_heads=2))
    x = _inputs((7, 4, 6))
    got = jax.jit(lambda p, x: apply_in_chunks(apply_fn, p, x, chunk_size=chunk_size))(params, x)
    np.testing.assert_allclose(got, apply_fn(params, x), rtol=1e-12)
    with pytest.raises(ValueError, match="chunk_size"):
        apply_in_chunks(apply_fn, params, x, chunk_size=0)
