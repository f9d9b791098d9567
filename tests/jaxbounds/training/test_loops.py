"""train_gd / train_minibatch (the engine's shorthands): hand-written loops, records, bad input."""

import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxbounds.data import sparse_majority
from jaxbounds.models import ScalarTransformer, ShallowTransformer, as_pure
from jaxbounds.models.shallow import shallow_apply
from jaxbounds.training import (
    accuracy,
    classification_loss,
    logistic_loss,
    make_step,
    squared_loss,
    train_gd,
    train_minibatch,
)


def shallow_logistic(params, batch):
    x, y = batch
    return logistic_loss(shallow_apply(params, x), y)


def shallow_squared(params, batch):
    x, y = batch
    return 0.5 * squared_loss(shallow_apply(params, x), y)


@pytest.fixture(scope="module")
def small_problem():
    model = ShallowTransformer(4, 8, rngs=nnx.Rngs(1), dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(4), (9, 3, 4), jnp.float64)
    y = jnp.arange(9) % 2
    return model.params_dict(), x, y


def _reference_gd(loss_fn, params0, batch, lr, steps):
    """Plain GD written out: losses, per-leaf distances and spectral norms at every step."""
    p = dict(params0)
    losses, dists, specs = [], {k: [] for k in p}, {k: [] for k in p}
    grad = jax.jit(jax.value_and_grad(loss_fn))
    for t in range(steps + 1):
        value, g = grad(p, batch)
        losses.append(float(value))
        for k in p:
            a = np.asarray(p[k])
            dists[k].append(np.linalg.norm(a - np.asarray(params0[k])))
            specs[k].append(np.linalg.norm(a, 2) if a.ndim == 2 else np.linalg.norm(a))
        if t < steps:
            p = {k: p[k] - lr * g[k] for k in p}
    return p, losses, dists, specs


def test_train_gd_matches_a_hand_written_loop(small_problem):
    params0, x, y = small_problem
    lr, steps, stream = 0.3, 12, io.StringIO()
    params, rec = train_gd(
        shallow_logistic, params0, (x, y), learning_rate=lr, num_steps=steps,
        metrics_fn=lambda p, xs: {"f0": shallow_apply(p, xs)[0]}, metrics_data=x,
        chunk_steps=5, progress=stream,
    )  # fmt: skip
    p, losses, dists, specs = _reference_gd(shallow_logistic, params0, (x, y), lr, steps)
    assert rec.num_steps == steps
    np.testing.assert_array_equal(rec.step, np.arange(steps + 1))
    np.testing.assert_allclose(rec.loss, losses, rtol=1e-12)
    f0 = [float(shallow_apply(q, x)[0]) for q in _reference_params(params0, x, y, lr, steps)]
    np.testing.assert_allclose(rec.metrics["f0"], f0, rtol=1e-12)
    for k in p:
        np.testing.assert_allclose(params[k], p[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(rec.distance[k], dists[k], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(rec.spectral[k], specs[k], rtol=1e-10)
        assert rec.frobenius0[k] == pytest.approx(np.linalg.norm(np.asarray(params0[k])))
        assert rec.spectral0[k] == pytest.approx(specs[k][0], rel=1e-12)
    assert losses[-1] < losses[0]
    assert f"{steps}/{steps}" in stream.getvalue()


def _reference_params(params0, x, y, lr, steps):
    p, out = dict(params0), []
    for _ in range(steps + 1):
        out.append(p)
        g = jax.grad(shallow_logistic)(p, (x, y))
        p = {k: p[k] - lr * g[k] for k in p}
    return out


def test_train_gd_chunking_metrics_default_and_zero_steps(small_problem):
    params0, x, y = small_problem
    kw = {"learning_rate": 0.1, "num_steps": 6, "progress": False, "record_spectral": False}
    _, one = train_gd(shallow_squared, params0, (x, y), chunk_steps=1, **kw)
    _, six = train_gd(
        shallow_squared, params0, (x, y), chunk_steps=6,
        metrics_fn=lambda p, b: {"again": shallow_squared(p, b)}, **kw,
    )  # fmt: skip
    np.testing.assert_allclose(one.loss, six.loss, rtol=1e-12)
    np.testing.assert_allclose(six.metrics["again"], one.loss, rtol=1e-12)  # default: the batch
    assert one.spectral == {}
    _, zero = train_gd(shallow_squared, params0, (x, y), learning_rate=0.1, num_steps=0)
    assert zero.loss.shape == (1,)
    assert all(float(d[0]) == 0.0 for d in zero.distance.values())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"num_steps": -1}, "num_steps"),
        ({"chunk_steps": 0}, "chunk_steps"),
    ],
)
def test_train_gd_bad_arguments(small_problem, kwargs, match):
    params0, x, y = small_problem
    args = {"learning_rate": 0.1, "num_steps": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        train_gd(shallow_squared, params0, (x, y), **args)


@pytest.mark.parametrize("num_steps", [0, 2])
def test_non_finite_initial_loss_raises(small_problem, num_steps):
    params0, _, _ = small_problem
    with pytest.raises(ValueError, match="initialisation"):
        train_gd(
            lambda p, _: jnp.sum(p["w_O"]) * jnp.nan, params0, learning_rate=0.1,
            num_steps=num_steps, progress=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match="initialisation"):
        train_minibatch(
            lambda p, b: jnp.sum(p["w_O"]) * jnp.nan + jnp.sum(b), params0, jnp.ones(4),
            jax.random.key(0), num_epochs=1, progress=False,
        )  # fmt: skip


def test_make_step_is_optax():
    opt = optax.adam(0.1)
    p = {"w": jnp.array([1.0, -2.0])}
    step = make_step(lambda q, b: jnp.sum((q["w"] - b) ** 2), opt)
    new, state, loss = jax.jit(step)(p, opt.init(p), jnp.zeros(2))
    g = {"w": 2 * p["w"]}
    with jax.numpy_dtype_promotion("standard"):
        updates, _ = opt.update(g, opt.init(p), p)
    np.testing.assert_allclose(new["w"], p["w"] + updates["w"], rtol=1e-12)
    assert float(loss) == 5.0
    assert int(state[0].count) == 1


@pytest.fixture(scope="module")
def trained():
    d = 8
    data = sparse_majority(jax.random.key(0), num_examples=60, seq_len=6, sparsity=3, embed_dim=d)
    test = sparse_majority(
        jax.random.key(1), num_examples=40, seq_len=6, sparsity=3, embed_dim=d,
        subset=data["subset"],
    )  # fmt: skip
    apply_fn, init = as_pure(ScalarTransformer(d, param_dtype=jnp.float64, rngs=nnx.Rngs(0)))

    def loss_fn(p, batch):
        return classification_loss(apply_fn(p, batch[0]), batch[1])

    def metrics(p, t):
        return {"test_accuracy": accuracy(apply_fn(p, t[0]), t[1])}

    params, record = train_minibatch(
        loss_fn, init, (data["inputs"], data["labels"]), jax.random.key(2), num_epochs=12,
        batch_size=16, learning_rate=1e-2, metrics_fn=metrics,
        metrics_data=(test["inputs"], test["labels"]), progress=False,
    )  # fmt: skip
    return params, record, init, apply_fn, data, test


@pytest.mark.slow
def test_minibatch_loss_decreases_and_every_epoch_recorded(trained):
    _, record, _, _, _, _ = trained
    np.testing.assert_array_equal(record.epoch, np.arange(13))
    np.testing.assert_array_equal(record.step, 4 * np.arange(13))  # ceil(60 / 16) = 4 steps
    assert record.loss.shape == record.metrics["test_accuracy"].shape == (13,)
    assert record.loss[-1] < 0.8 * record.loss[0]
    assert record.learning_rate is None
    assert record.seconds > 0
    assert set(record.final()) == {"loss", "test_accuracy"}


def test_minibatch_record_matches_final_params(trained):
    params, record, init, apply_fn, data, test = trained
    out = apply_fn(params, data["inputs"])
    np.testing.assert_allclose(
        record.loss[-1], classification_loss(out, data["labels"]), rtol=1e-10
    )
    np.testing.assert_allclose(
        record.metrics["test_accuracy"][-1],
        accuracy(apply_fn(params, test["inputs"]), test["labels"]),
    )
    leaves, leaves0 = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(init)
    for name, a, a0 in zip(record.names, leaves, leaves0, strict=True):
        np.testing.assert_allclose(record.frobenius[name][-1], np.linalg.norm(a), rtol=1e-10)
        np.testing.assert_allclose(record.distance[name][-1], np.linalg.norm(a - a0), rtol=1e-10)
        assert record.distance[name][0] == 0.0


def test_minibatch_matches_a_hand_written_epoch():
    """One epoch of SGD in batches of 2 equals the hand-computed updates, in permutation order."""
    x = jnp.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], jnp.float64)
    y = jnp.array([1, 0, 1], jnp.int32)

    def loss_fn(p, batch):
        return logistic_loss(batch[0] @ p, batch[1])

    key = jax.random.key(3)
    params, _ = train_minibatch(
        loss_fn, jnp.zeros(2), (x, y), key, num_epochs=1, batch_size=2,
        optimizer=optax.sgd(0.5), progress=False,
    )  # fmt: skip
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), 3))  # epoch 0
    w = np.zeros(2)
    for idx in (perm[:2], np.array([perm[2], perm[0]])):  # the last batch is filled up
        s = 2.0 * np.asarray(y)[idx] - 1.0
        xb = np.asarray(x)[idx]
        grad = np.mean(-s[:, None] * xb / (1 + np.exp(s * (xb @ w)))[:, None], axis=0)
        w = w - 0.5 * grad
    np.testing.assert_allclose(params, w, rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"num_epochs": 0}, "num_epochs"), ({"batch_size": 0}, "batch_size")],
)
def test_minibatch_bad_arguments(kwargs, match):
    args = {"num_epochs": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        train_minibatch(
            lambda p, b: jnp.sum(p * b), jnp.ones(2), jnp.ones((4, 2)), jax.random.key(0), **args
        )
    with pytest.raises(ValueError, match="one length"):
        train_minibatch(
            lambda p, b: jnp.sum(p), jnp.ones(2), (jnp.ones(4), jnp.ones(3)), jax.random.key(0),
            num_epochs=1,
        )  # fmt: skip


def test_minibatch_progress_bar(capsys):
    train_minibatch(
        lambda p, b: jnp.mean((b @ p) ** 2), jnp.ones(2), jnp.ones((5, 2)), jax.random.key(0),
        num_epochs=3, batch_size=2, label="[demo]",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "[demo]" in err
    assert "9/9" in err  # 3 epochs of ceil(5 / 2) = 3 steps
    assert "#" * 30 in err


def test_flat_params_through_ravel(small_problem):
    """Any pytree works, e.g. a flat vector with an unravel closure."""
    params0, x, y = small_problem
    flat, unravel = ravel_pytree(params0)
    _, rec = train_gd(
        lambda v, b: shallow_logistic(unravel(v), b), flat, (x, y), learning_rate=0.1,
        num_steps=2, progress=False,
    )  # fmt: skip
    assert rec.names == ["param"]
