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


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
@pytest.mark.parametrize("group_words", [1, 3, 8, 2**20])
def test_sign_leaves_are_the_sign_vector_cut_into_the_leaves(monkeypatch, impl, group_words):
    # whatever the grouping of the leaves' words (one hash per group), the leaves are the flat
    # sign vector of the key, in order: entry i is bit i % 32 of word i // 32
    monkeypatch.setattr(_random, "GROUP_WORDS", group_words)
    key = jax.random.key(11, impl=impl)
    shapes = [(5,), (3, 40), (), (70,), (2, 2, 33), (1,)]
    leaves = _random.sign_leaves(key, shapes, jnp.float32)
    assert [a.shape for a in leaves] == shapes
    n = sum(int(np.prod(s)) for s in shapes)
    full = np.asarray(_random.sign_vector(key, n, jnp.float32))
    np.testing.assert_array_equal(np.concatenate([np.ravel(a) for a in leaves]), full)
    if impl == "threefry2x32":  # the words themselves, from public calls

        def word(w: int) -> int:
            return int(jax.random.bits(jax.random.fold_in(key, w // 4), (4,), jnp.uint32)[w % 4])

        want = [-1.0 if (word(i // 32) >> (i % 32)) & 1 else 1.0 for i in range(n)]
        np.testing.assert_array_equal(full, want)


def test_sign_leaves_groups_hold_at_most_their_limit_of_words():
    # one hash per group of consecutive leaves; a group's words fit the larger of GROUP_WORDS
    # and the largest leaf's (plus one word for a block that does not start on a word)
    assert _random._groups([32, 32, 32, 32], 2) == [[0, 1], [2, 3]]
    assert _random._groups([40, 40, 40], 3) == [[0, 1], [2]]  # words 0-2, then 2-3
    assert _random._groups([1000], 1) == [[0]]  # a leaf larger than the limit is alone
    assert _random._groups([10, 1000, 100], 32) == [[0, 1], [2]]
    with pytest.raises(ValueError, match=r"^shapes: expected at most 2\*\*37 entries"):
        _random.sign_leaves(jax.random.key(0), [(2**32,)], jnp.float32)
