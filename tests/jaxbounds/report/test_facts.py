"""Run: section keys and the closed-over training loss; facts are frozen and typed."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.report.facts import Run, ScalarConfig


def _run(key=None):
    train = {"inputs": jnp.arange(3.0), "labels": jnp.ones(3)}
    return Run(
        name="toy", model=None, apply_fn=lambda p, x: p * x, params=jnp.asarray(2.0),
        loss_fn=lambda p, b: jnp.mean((p * b["inputs"] - b["labels"]) ** 2), train=train,
        facts=None, key=key,
    )  # fmt: skip


def test_train_loss_closes_over_the_training_data():
    run = _run()
    assert float(run.train_loss()(jnp.asarray(1.0))) == pytest.approx((1 + 0 + 1) / 3)
    assert float(run.train_loss()(run.params)) == float(run.loss_fn(run.params, run.train))


def test_section_keys_are_deterministic_and_distinct():
    run = _run(jax.random.key(1))
    a, b = run.section_key("curvature"), run.section_key("sharpness")
    assert np.array_equal(jax.random.key_data(a), jax.random.key_data(run.section_key("curvature")))
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    other = _run(jax.random.key(2)).section_key("curvature")
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(other))
    assert _run().section_key("x").shape == ()  # no key: a fixed default


def test_config_is_frozen_and_json_ready():
    cfg = ScalarConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.embed_dim = 3
    assert dataclasses.asdict(cfg)["embed_dim"] == 32
    assert dataclasses.replace(cfg, num_epochs=5).num_epochs == 5
