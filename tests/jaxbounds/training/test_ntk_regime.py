"""The NTK-regime comparison: a linear model never drifts; the drift is second order in the step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxbounds.models import ShallowTransformer
from jaxbounds.models.shallow import shallow_apply
from jaxbounds.training.ntk_regime import ntk_regime

N, D_S, D, D_M = 7, 3, 4, 5


@pytest.fixture(scope="module")
def tiny():
    model = ShallowTransformer(D, D_M, rngs=nnx.Rngs(0), dtype=jnp.float64)
    inputs = jax.random.normal(jax.random.key(1), (N, D_S, D), jnp.float64)
    return model.params_dict(), inputs


def test_ntk_regime_linear_model_has_no_drift():
    """For a model linear in its parameters the linearisation is exact: zero drift."""
    x = jax.random.normal(jax.random.key(0), (12, 3), jnp.float64)
    y = (x[:, 0] > 0).astype(jnp.int32)

    def apply_fn(p, inputs):
        return inputs @ p["w"] + p["b"]

    params0 = {"w": jnp.array([0.1, -0.2, 0.3]), "b": jnp.array(0.05)}
    res = ntk_regime(apply_fn, params0, {"inputs": x, "labels": y}, num_steps=20, progress=False)
    assert res.final_drift_train < 1e-12
    assert res.final_relative_drift < 1e-10
    m = res.record.metrics
    np.testing.assert_allclose(m["loss_model"], m["loss_linear"], rtol=1e-12)
    assert m["loss_model"][-1] < m["loss_model"][0]
    # movement reported = ||theta_T - theta_0|| / ||theta_0||, the same for both runs here
    diff = ravel_pytree(res.params)[0] - ravel_pytree(params0)[0]
    expected = float(jnp.linalg.norm(diff) / jnp.linalg.norm(ravel_pytree(params0)[0]))
    np.testing.assert_allclose(res.relative_movement, expected, rtol=1e-12)
    np.testing.assert_allclose(res.linear_relative_movement, expected, rtol=1e-10)


def test_ntk_regime_shallow_drift_is_second_order_in_step_size(tiny):
    """At a fixed number of steps, weights move O(lr) and the drift is O(lr^2): lr / 4 -> ~1/16."""
    params, inputs = tiny
    y = jnp.arange(N) % 2
    train = {"inputs": inputs, "labels": y}
    test = {"inputs": inputs[:3] + 0.1, "labels": y[:3]}
    big, small = (
        ntk_regime(
            shallow_apply, params, train, test, learning_rate=lr, num_steps=10, progress=False
        )
        for lr in (0.0125, 0.0125 / 4)
    )
    assert big.final_drift_train > 0
    assert 12 < big.final_drift_train / small.final_drift_train < 20
    assert big.final_drift_test is not None
    assert small.final_drift_test is not None
    assert 12 < big.final_drift_test / small.final_drift_test < 20
    assert 3.5 < big.relative_movement / small.relative_movement < 4.5
    with pytest.raises(ValueError, match="loss"):
        ntk_regime(shallow_apply, params, train, loss="hinge", progress=False)


def test_squared_loss_is_half_the_mean_squared_error():
    x = jax.random.normal(jax.random.key(0), (6, 2), jnp.float64)
    targets = x[:, 0] - x[:, 1]

    def apply_fn(p, inputs):
        return jnp.tanh(inputs @ p["w"])

    params0 = {"w": jnp.array([0.3, 0.2])}
    res = ntk_regime(
        apply_fn, params0, {"inputs": x, "labels": targets}, num_steps=1, loss="squared",
        progress=False,
    )  # fmt: skip
    f0 = np.tanh(np.asarray(x) @ np.array([0.3, 0.2]))
    expected = 0.5 * np.mean((f0 - np.asarray(targets)) ** 2)
    np.testing.assert_allclose(res.record.metrics["loss_model"][0], expected, rtol=1e-12)
    np.testing.assert_allclose(res.record.metrics["loss_linear"][0], expected, rtol=1e-12)
    assert res.final_drift_test is None
