"""Leaf draws of the sharpness and curvature kernels: large layer-stacked leaves in slices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import _random
from kernels._random import SLICED_DRAW_ENTRIES, draw_leaf


@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_a_large_stacked_leaf_is_drawn_slice_by_slice(kind, monkeypatch):
    # slice j of the leading axis from fold_in(key, j); smaller leaves and leaves of 1 or 2 axes
    # stay one draw of their own shape
    key = jax.random.key(3)

    def draw(k, shape):
        if kind == "gaussian":
            return jax.random.normal(k, shape, jnp.float32)
        return jax.random.uniform(k, shape, jnp.float32, -1.0, 1.0)

    monkeypatch.setattr(_random, "SLICED_DRAW_ENTRIES", 40)
    sliced = draw_leaf(key, (3, 4, 5), jnp.float32, kind)
    want = jnp.stack([draw(jax.random.fold_in(key, j), (4, 5)) for j in range(3)])
    np.testing.assert_array_equal(sliced, want)
    np.testing.assert_array_equal(
        draw_leaf(key, (2, 4, 5), jnp.float32, kind), draw(key, (2, 4, 5))
    )
    np.testing.assert_array_equal(draw_leaf(key, (12, 5), jnp.float32, kind), draw(key, (12, 5)))
    # jit and vmap over keys draw the same numbers
    jitted = jax.jit(lambda k: draw_leaf(k, (3, 4, 5), jnp.float32, kind))(key)
    np.testing.assert_array_equal(jitted, want)
    keys = jax.random.split(key, 2)
    batched = jax.vmap(lambda k: draw_leaf(k, (3, 4, 5), jnp.float32, kind))(keys)
    np.testing.assert_array_equal(batched[1], draw_leaf(keys[1], (3, 4, 5), jnp.float32, kind))


def test_the_threshold_and_the_memory_it_saves():
    # at the real threshold: a (2, 1024, 2049)-leaf (just over 2**22 entries) is sliced and a
    # (4, 1024, 1024)-leaf (exactly 2**22) is not; the sliced draw's temporaries in XLA's plan
    # stay within half the leaf's size (a whole threefry draw plans about three times it on a CPU)
    key = jax.random.key(5)
    over, at = (2, 1024, 2049), (4, 1024, 1024)
    assert np.prod(over) > SLICED_DRAW_ENTRIES
    assert np.prod(at) == SLICED_DRAW_ENTRIES
    big = draw_leaf(key, over, jnp.float32, "gaussian")
    np.testing.assert_array_equal(
        big[1], jax.random.normal(jax.random.fold_in(key, 1), over[1:], jnp.float32)
    )
    np.testing.assert_array_equal(
        draw_leaf(key, at, jnp.float32, "gaussian"), jax.random.normal(key, at, jnp.float32)
    )
    shape = (16, 512, 1024)
    compiled = jax.jit(lambda k: draw_leaf(k, shape, jnp.float32, "gaussian")).lower(key).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:  # pragma: no cover - a backend without an allocation plan
        pytest.fail("no memory_analysis() on this backend: the test needs XLA's plan")
    assert analysis.temp_size_in_bytes <= 4 * np.prod(shape) / 2, analysis.temp_size_in_bytes
    # the numbers are standard normals: 8.4M draws, mean and variance to 5 standard errors
    x = np.asarray(compiled(key), np.float64)
    n = x.size
    assert abs(x.mean()) < 5 / np.sqrt(n)
    assert abs(x.var() - 1.0) < 5 * np.sqrt(2 / n)
