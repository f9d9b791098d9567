"""The Estimate result type and estimate_from_samples."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.estimate import Estimate, estimate_from_samples


def test_estimate_from_samples_matches_numpy(run):
    x = jax.random.normal(jax.random.key(0), (50, 3))
    est = run(lambda: estimate_from_samples(x))
    xn = np.asarray(x)
    np.testing.assert_allclose(est.mean, xn.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(est.stderr, xn.std(axis=0, ddof=1) / np.sqrt(50), rtol=1e-12)
    assert est.num_samples == 50


def test_estimate_from_samples_axis():
    x = jnp.arange(12.0).reshape(3, 4)
    est = estimate_from_samples(x, axis=1)
    np.testing.assert_allclose(est.mean, [1.5, 5.5, 9.5])
    np.testing.assert_allclose(est.stderr, np.full(3, np.std([0, 1, 2, 3], ddof=1) / 2))
    assert est.num_samples == 4


def test_closed_form_two_samples():
    est = estimate_from_samples(jnp.array([1.0, 3.0]))
    assert float(est.mean) == 2.0
    assert float(est.stderr) == pytest.approx(1.0)  # std (ddof=1) = sqrt(2), / sqrt(2)


def test_stderr_covers_the_true_mean_at_the_nominal_rate():
    """Over 2000 independent experiments, |mean - 0| <= 2 stderr about 95% of the time."""
    x = jax.random.normal(jax.random.key(1), (2000, 100))
    est = estimate_from_samples(x, axis=1)
    coverage = float(jnp.mean(jnp.abs(est.mean) <= 2 * est.stderr))
    assert 0.93 <= coverage <= 0.97


def test_float32_preserved():
    est = estimate_from_samples(jnp.ones((5,), jnp.float32))
    assert est.mean.dtype == est.stderr.dtype == jnp.float32


def test_is_a_pytree_through_jit_and_vmap():
    est = Estimate(mean=jnp.array(1.0), stderr=jnp.array(0.5), num_samples=7, delta=0.05)
    leaves, treedef = jax.tree_util.tree_flatten(est)
    assert len(leaves) == 2  # lower/upper None are empty subtrees; num_samples, delta static
    assert jax.tree_util.tree_unflatten(treedef, leaves) == est
    doubled = jax.jit(lambda e: jax.tree_util.tree_map(lambda x: 2 * x, e))(est)
    assert float(doubled.mean) == 2.0
    assert doubled.num_samples == 7
    assert doubled.delta == 0.05
    batched = jax.vmap(lambda x: estimate_from_samples(x))(jnp.arange(12.0).reshape(3, 4))
    np.testing.assert_allclose(batched.mean, [1.5, 5.5, 9.5])
    assert batched.num_samples == 4


def test_frozen_and_repr():
    est = Estimate(
        mean=jnp.array(2.0), stderr=jnp.array(0.25), num_samples=3, lower=1.0, upper=3.0, delta=0.1
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.mean = 1.0  # type: ignore[misc]
    assert repr(est) == "Estimate(mean=2, stderr=0.25, n=3, 0.9-interval=[1, 3])"
    traced = jax.jit(lambda e: repr(e) and e)(est)  # repr of tracers does not fail
    assert traced.num_samples == 3


def test_too_few_samples_raise():
    with pytest.raises(ValueError, match=r"^samples"):
        estimate_from_samples(jnp.ones((1, 3)))
    with pytest.raises(ValueError, match=r"^samples"):
        estimate_from_samples(jnp.ones((3, 1)), axis=1)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"^samples: expected float32 or float64"):
        estimate_from_samples(jnp.ones(4, jnp.float16))
    with pytest.raises(ValueError, match=r"^samples: expected an array"):
        estimate_from_samples(jnp.float64(1.0))
    with pytest.raises(ValueError, match=r"^axis"):
        estimate_from_samples(jnp.ones((3, 2)), axis=2)
    with pytest.raises(ValueError, match=r"^samples: need at least 2"):
        estimate_from_samples(jnp.ones((0, 3)))


def test_integer_samples_and_negative_axis():
    est = estimate_from_samples(jnp.array([[1, 2, 3], [3, 4, 5]]), axis=-1)
    np.testing.assert_allclose(est.mean, [2.0, 4.0])
    np.testing.assert_allclose(est.stderr, [1 / np.sqrt(3)] * 2, rtol=1e-12)
    assert est.num_samples == 3


def test_nonfinite_samples_are_never_a_normal_number():
    est = estimate_from_samples(jnp.array([1.0, jnp.nan, 2.0]))
    assert np.isnan(float(est.mean))
    assert "nan" in repr(est)


def test_num_evaluations_is_static_metadata():
    est = Estimate(mean=jnp.array(1.0), stderr=jnp.array(0.1), num_samples=4, num_evaluations=8)
    leaves, treedef = jax.tree_util.tree_flatten(est)
    assert len(leaves) == 2
    assert jax.tree_util.tree_unflatten(treedef, leaves).num_evaluations == 8
    assert jax.jit(lambda e: e)(est).num_evaluations == 8


@pytest.mark.parametrize(
    "values",
    [
        np.full(1000, 1e8),  # equal samples: stderr exactly 0 (was 0.253)
        np.array([1e-30, 2e-30, 3e-30]),  # squares underflow float32 (stderr was 0)
        np.array([3e38, 3e38, -3e38]),  # the sum overflows float32 (mean was inf)
        np.array([-2e-37, 1.5e-37, 3e-37, 5e-37]),  # near the smallest normal float32
        1e4 + np.random.default_rng(0).standard_normal(1000),  # large offset, small spread
    ],
    ids=["constant", "tiny", "huge", "near-tiny", "offset"],
)
def test_float32_samples_match_a_float64_reference(values):
    """float32 in, float32 out, within float32 rounding of the float64 mean and stderr."""
    x = jnp.asarray(values, jnp.float32)
    est = estimate_from_samples(x)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    ref = np.asarray(x, np.float64)
    ref_mean, ref_se = ref.mean(), ref.std(ddof=1) / np.sqrt(ref.size)
    eps = float(jnp.finfo(jnp.float32).eps)
    scale = np.abs(ref).max()
    assert abs(float(est.mean) - ref_mean) <= 4 * eps * scale
    assert abs(float(est.stderr) - ref_se) <= 16 * eps * max(ref_se, eps * scale)
    if np.all(ref == ref[0]):
        assert float(est.stderr) == 0.0
        assert float(est.mean) == ref[0]
