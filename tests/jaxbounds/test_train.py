"""train(): a short run reduces the loss, records every epoch, and writes the params back."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxbounds.data import sparse_majority
from jaxbounds.models import ScalarTransformer, as_pure
from jaxbounds.train import TrainRecord, task_accuracy, task_loss, train


@pytest.fixture(scope="module")
def trained():
    d = 8
    data = sparse_majority(jax.random.key(0), num_samples=60, seq_len=6, sparsity=3, embed_dim=d)
    test = sparse_majority(
        jax.random.key(1),
        num_samples=40,
        seq_len=6,
        sparsity=3,
        embed_dim=d,
        subset=data["subset"],
    )
    model = ScalarTransformer(d, num_heads=2, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    init = as_pure(model)[1]
    model, record = train(
        model,
        data,
        jax.random.key(2),
        num_epochs=12,
        batch_size=16,
        learning_rate=1e-2,
        test_data=test,
        eval_chunk_size=32,  # 100 examples evaluated in chunks of 32 (lax.map path)
        progress=True,
    )
    return model, record, init, data, test


def test_loss_decreases_and_every_epoch_recorded(trained):
    _, record, _, _, _ = trained
    assert isinstance(record, TrainRecord)
    assert record.epoch == list(range(13))
    for name in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "l1_total"):
        assert len(getattr(record, name)) == 13, name
    assert record.train_loss[-1] < 0.8 * record.train_loss[0]
    assert record.train_accuracy[-1] > record.train_accuracy[0]
    assert record.seconds > 0
    assert set(record.final()) >= {"train_loss", "test_accuracy", "distance_from_init"}


def test_record_matches_final_params(trained):
    model, record, init, data, test = trained
    apply_fn, params = as_pure(model)
    out = apply_fn(params, data["inputs"])
    np.testing.assert_allclose(record.train_loss[-1], task_loss(out, data["labels"]), rtol=1e-10)
    np.testing.assert_allclose(
        record.train_accuracy[-1], task_accuracy(out, data["labels"]), rtol=1e-12
    )
    out_t = apply_fn(params, test["inputs"])
    np.testing.assert_allclose(record.test_loss[-1], task_loss(out_t, test["labels"]), rtol=1e-10)
    # Norms: Frobenius of each named matrix, total l1 / l2, distance from init.
    mats = ScalarTransformer.named_matrices(params)
    assert set(record.frobenius) == set(mats)
    for name, mat in mats.items():
        np.testing.assert_allclose(record.frobenius[name][-1], np.linalg.norm(mat), rtol=1e-10)
    flat = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(params)])
    flat0 = np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(init)])
    np.testing.assert_allclose(record.l1_total[-1], np.abs(flat).sum(), rtol=1e-10)
    np.testing.assert_allclose(record.l2_total[-1], np.linalg.norm(flat), rtol=1e-10)
    np.testing.assert_allclose(record.distance_from_init[-1], np.linalg.norm(flat - flat0))
    assert record.distance_from_init[0] == 0.0
    np.testing.assert_allclose(record.l1_total[0], np.abs(flat0).sum(), rtol=1e-10)


def test_progress_bar_on_stderr(capsys):
    model = nnx.Linear(3, 1, param_dtype=jnp.float64, rngs=nnx.Rngs(0))

    class Scalar(nnx.Module):
        def __init__(self):
            self.lin = model

        def __call__(self, x):
            return self.lin(x)[..., 0]

    x = jax.random.normal(jax.random.key(0), (20, 3), jnp.float64)
    data = {"inputs": x, "labels": (x[:, 0] > 0).astype(jnp.int32)}
    _, record = train(Scalar(), data, jax.random.key(1), num_epochs=3, batch_size=7)
    err = capsys.readouterr().err
    assert "3/3" in err
    assert "#" * 30 in err
    # Generic models: parameters named by path.
    assert set(record.frobenius) == {"lin.bias", "lin.kernel"}


def test_plain_sgd_steps_match_closed_form():
    """One epoch of full-batch SGD on a linear model equals the hand-computed update."""

    class Lin(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.zeros(2, jnp.float64))

        def __call__(self, x):
            return x @ self.w[...]

    x = jnp.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], jnp.float64)
    y = jnp.array([1, 0, 1], jnp.int32)
    model, _ = train(
        Lin(),
        {"inputs": x, "labels": y},
        jax.random.key(0),
        num_epochs=1,
        batch_size=3,
        optimizer=optax.sgd(0.5),
        progress=False,
    )
    # Logistic loss at w = 0: gradient = mean(-s_i x_i / 2), s = 2y - 1.
    s = 2.0 * np.asarray(y) - 1.0
    grad = np.mean(-s[:, None] * np.asarray(x) / 2.0, axis=0)
    np.testing.assert_allclose(model.w[...], -0.5 * grad, rtol=1e-12)


def test_task_loss_cross_entropy_and_accuracy():
    logits = jnp.array([[2.0, 0.0], [0.0, 1.0]], jnp.float64)
    labels = jnp.array([0, 0], jnp.int32)
    expected = np.mean([np.log1p(np.exp(-2.0)), np.log1p(np.exp(1.0))])
    np.testing.assert_allclose(task_loss(logits, labels), expected, rtol=1e-12)
    np.testing.assert_allclose(task_accuracy(logits, labels), 0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"num_epochs": 0}, "num_epochs"), ({"batch_size": 0}, "batch_size")]
)
def test_bad_arguments(kwargs, match):
    data = {"inputs": jnp.ones((4, 3, 4)), "labels": jnp.zeros(4, jnp.int32)}
    model = ScalarTransformer(4, rngs=nnx.Rngs(0))
    args = {"num_epochs": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        train(model, data, jax.random.key(0), **args)
