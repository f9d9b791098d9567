"""Leaf names, per-leaf norms, and the record's bound inputs against hand computations."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.models import ShallowTransformer, as_pure
from jaxbounds.training.records import (
    TrainingRecord,
    assemble,
    initial_norms,
    leaf_names,
    leaf_spectral_norm,
    weight_norms,
)


def test_leaf_names_of_dicts_lists_and_nnx_state():
    model = ShallowTransformer(3, 4, rngs=nnx.Rngs(0))
    assert leaf_names(as_pure(model)[1]) == ["W_K", "W_Q", "W_V", "w_O"]
    assert leaf_names(nnx.state(model, nnx.Param)) == ["W_K", "W_Q", "W_V", "w_O"]
    assert leaf_names({"layers": {0: {"w": 1}}, "b": [2, 3]}) == ["b/0", "b/1", "layers/0/w"]
    assert leaf_names(jnp.ones(2)) == ["param"]


def test_spectral_and_weight_norms():
    rng = np.random.default_rng(0)
    for shape in ((7, 3), (3, 7), (5,), (2, 3, 4)):
        w = rng.normal(size=shape)
        flat = w.reshape(shape[0], -1) if w.ndim > 1 else w
        expected = np.linalg.norm(flat, 2) if w.ndim > 1 else np.linalg.norm(w)
        np.testing.assert_allclose(leaf_spectral_norm(jnp.asarray(w)), expected, rtol=1e-12)
    p = {"a": jnp.asarray(rng.normal(size=(3, 2))), "b": jnp.asarray(rng.normal(size=4))}
    p0 = {"a": jnp.zeros((3, 2)), "b": jnp.ones(4)}
    out = weight_norms(p, p0, spectral=True)
    np.testing.assert_allclose(
        out["distance"], [np.linalg.norm(p["a"]), np.linalg.norm(p["b"] - 1)], rtol=1e-12
    )
    np.testing.assert_allclose(
        out["frobenius"], [np.linalg.norm(p["a"]), np.linalg.norm(p["b"])], rtol=1e-12
    )
    np.testing.assert_allclose(out["spectral"][0], np.linalg.norm(p["a"], 2), rtol=1e-12)
    assert "spectral" not in weight_norms(p, p0, spectral=False)
    frob0, spec0 = initial_norms(p0)
    assert frob0 == {"a": 0.0, "b": 2.0}
    assert spec0["b"] == 2.0


def _record() -> TrainingRecord:
    p0 = {"Q": jnp.array([[3.0, 0.0], [0.0, 1.0]]), "O": jnp.array([0.0, 2.0])}
    points = [
        {
            "loss": np.array([1.0, 0.5]),
            "distance": np.array([[0.0, 0.0], [0.3, 0.1]]),
            "frobenius": np.array([[2.0, 3.2], [2.1, 3.3]]),
            "metrics": {"acc": np.array([0.5, 0.75])},
        },
        {
            "loss": np.array([0.25]),
            "distance": np.array([[0.2, 0.4]]),
            "frobenius": np.array([[2.2, 3.4]]),
            "metrics": {"acc": np.array([1.0])},
        },
    ]
    steps = np.arange(3)
    return assemble(p0, points, step=steps, epoch=steps, learning_rate=0.1, start=0.0)


def test_record_properties_and_bound_inputs():
    rec = _record()
    assert rec.names == ["O", "Q"]  # tree_leaves order
    assert rec.num_steps == 2
    np.testing.assert_array_equal(rec.distance["O"], [0.0, 0.3, 0.2])
    assert rec.radius == {"O": 0.3, "Q": 0.4}
    np.testing.assert_array_equal(rec.running_radius["O"], [0.0, 0.3, 0.3])
    assert rec.total_radius == pytest.approx(0.5)
    inputs = rec.bound_inputs()
    assert inputs["eta"]["Q"] == pytest.approx(np.sqrt(10.0) + 0.4)
    assert inputs["xi"]["Q"] == pytest.approx(3.0 + 0.4)
    assert inputs["xi"]["O"] == pytest.approx(2.0 + 0.3)
    assert rec.spectral == {}
    assert rec.final() == {"loss": 0.25, "acc": 1.0}
    d = rec.to_dict()
    assert d["loss"] == [1.0, 0.5, 0.25]
    assert d["metrics"]["acc"] == [0.5, 0.75, 1.0]
    assert d["frobenius0"]["O"] == 2.0
