"""The run builders: data, model, training record and typed facts of each run."""

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.data.boolean import tiling_parities
from jaxbounds.models import ConstructionTransformer, ScalarTransformer, ShallowTransformer
from jaxbounds.report import runs
from jaxbounds.report.facts import ConstructionFacts, ScalarFacts, ShallowFacts


def test_scalar_run(scalar_run):
    run = scalar_run
    assert run.name == "scalar"
    assert isinstance(run.model, ScalarTransformer)
    assert isinstance(run.facts, ScalarFacts)
    cfg = run.facts.config
    assert run.train["inputs"].shape == (cfg.num_train, cfg.seq_len + 1, cfg.embed_dim)
    assert run.test["inputs"].shape[0] == cfg.num_test
    np.testing.assert_array_equal(run.train["subset"], run.test["subset"])
    # the model holds the trained parameters, which differ from the initialisation
    np.testing.assert_array_equal(run.model.w[...], run.params["w"])
    assert not np.array_equal(run.params["w"], run.facts.init_params["w"])
    assert run.record.epoch[-1] == cfg.num_epochs
    assert set(run.record.metrics) == {"train_accuracy", "test_loss", "test_accuracy", "l1_total"}
    assert run.meta["config"] == dataclasses.asdict(cfg)
    assert run.meta["num_params"] == 392
    assert run.meta["history"]["epoch"] == list(range(cfg.num_epochs + 1))
    q = run.facts.quantities
    assert (q.num_examples, q.num_layers, q.num_heads) == (cfg.num_train, 1, 2)
    # a second run with the same key is the same run
    again = runs.scalar_run(jax.random.key(3), cfg, progress=False)
    np.testing.assert_array_equal(again.params["w"], run.params["w"])


def test_build_scalar_uses_the_quick_sizes(monkeypatch):
    tiny = dataclasses.replace(runs.SCALAR_QUICK, embed_dim=4, seq_len=3, sparsity=1,
                               num_train=8, num_test=4, num_epochs=1, batch_size=8)  # fmt: skip
    monkeypatch.setattr(runs, "SCALAR_QUICK", tiny)
    run = runs.build_scalar(jax.random.key(0))
    assert run.facts.config is tiny
    assert run.quick
    assert runs.SCALAR_FULL.embed_dim == 64


def test_shallow_run(shallow_run):
    run = shallow_run
    assert isinstance(run.model, ShallowTransformer)
    assert isinstance(run.facts, ShallowFacts)
    assert run.train["inputs"].dtype == jnp.float64  # x64 is on in the tests
    assert run.record.num_steps == 4
    assert run.record.learning_rate == runs.SHALLOW_LEARNING_RATE
    np.testing.assert_array_equal(run.model.W_Q[...], run.params["W_Q"])
    q = run.facts.quantities
    assert q.radii == {name[-1]: r for name, r in run.record.radius.items()}
    assert (q.num_examples, q.d_s, q.d_m) == (18, 4, 24)
    assert run.meta == {"data": run.facts.description, "d_m": 24, "gd_steps": 4}
    loss = float(run.loss_fn(run.params, run.train))
    assert loss == pytest.approx(float(run.record.loss[-1]), rel=1e-12)


def test_shallow_data_falls_back_loudly_without_scikit_learn(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    monkeypatch.delenv("JAXBOUNDS_MNIST_DIR", raising=False)
    data = runs.shallow_data(0, True)
    assert data.source == "synthetic"
    err = capsys.readouterr().err
    assert "WARNING" in err
    assert "SYNTHETIC" in err
    assert "pip install 'jaxbounds[digits]'" in err


def test_construction_run(construction_run):
    run = construction_run
    assert isinstance(run.model, ConstructionTransformer)
    assert isinstance(run.facts, ConstructionFacts)
    f = tiling_parities(6, 2)
    np.testing.assert_array_equal(run.facts.function.subsets, f.subsets)
    assert run.train["inputs"].shape == (64, 6)
    assert run.record is None
    q = run.facts.quantities
    assert float(q.G_u) == float(jnp.max(run.facts.grad_sq))
    assert float(q.empirical_risk) == pytest.approx(float(run.loss_fn(run.params, run.train)))
    assert (q.sparsity, q.degree, q.seq_len, q.num_examples) == (3, 2, 6, 64)
    assert run.meta["num_inputs"] == 64
