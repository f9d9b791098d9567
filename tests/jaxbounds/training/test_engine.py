"""The training engine: the loops it replaced, closed forms, batch invariance, one compile."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxbounds.data import sparse_majority
from jaxbounds.models import ScalarTransformer, ShallowTransformer, as_pure
from jaxbounds.models.shallow import shallow_apply
from jaxbounds.training import (
    TrainingRecord,
    cross_entropy_loss,
    logistic_loss,
    squared_loss,
    train,
)
from tests.helpers import compiles_in, count_compiles
from tests.jaxbounds.training import _reference_loops as ref

# ------------------------------------------------------------------------------ problems


def shallow_logistic(params, batch):
    return logistic_loss(shallow_apply(params, batch[0]), batch[1])


def per_seed_logistic(params, batch):
    return jax.vmap(lambda p: shallow_logistic(p, batch))(params)


def shallow_eval(params, batch):
    return {"loss": shallow_logistic(params, batch), "f0": shallow_apply(params, batch[0])[0]}


def _shallow_params(seed, dtype=jnp.float64):
    return ShallowTransformer(4, 8, rngs=nnx.Rngs(seed), dtype=dtype).params_dict()


def _stack(trees):
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees)


@pytest.fixture(scope="module")
def shallow():
    x = jax.random.normal(jax.random.key(4), (9, 3, 4), jnp.float64)
    y = jnp.arange(9) % 2
    return _shallow_params(1), (x, y)


def quadratic(params, data):
    """mean_ij (data_ij - p_j)^2 over (n, 2) data; on zero data |p|^2 / 2, gradient p."""
    return jnp.mean((data - params[None, :]) ** 2)


def _leaves_equal(a, b):
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


# ------------------------------------------------------------------------------ closed forms


def test_threshold_caps_and_curve_closed_form():
    """loss = |p|^2 / 2 on zero data with rate g scales the loss by (1 - g)^2 per step."""
    runs = 3
    result = train(
        quadratic, jnp.ones((runs, 2)), jnp.zeros((3, 2)), optimizer=optax.sgd,
        hyperparams={"learning_rate": jnp.array([0.5, 0.25, 0.25])},
        num_steps=np.array([50, 50, 5]), loss_threshold=0.01, runs=runs, lanes=2,
    )  # fmt: skip
    # rate 0.5: 0.25^k <= 0.01 first at k = 4; rate 0.25: 0.5625^k <= 0.01 first at k = 9
    np.testing.assert_array_equal(result.steps, [4, 9, 5])
    np.testing.assert_array_equal(result.reached, [True, True, False])
    np.testing.assert_array_equal(result.hit_cap, [False, False, True])
    np.testing.assert_array_equal(result.diverged, [False] * 3)
    np.testing.assert_array_equal(result.num_evals, [5, 10, 6])
    np.testing.assert_array_equal(result.eval_step[0, :5], np.arange(5))
    np.testing.assert_array_equal(result.eval_step[0, 5:], -1)
    assert np.isnan(result.metrics["loss"][0, 5:]).all()
    np.testing.assert_array_equal(result.metrics["loss"][0, :5], 0.25 ** np.arange(5))
    np.testing.assert_allclose(result.metrics["loss"][1], 0.5625 ** np.arange(10), rtol=1e-14)
    np.testing.assert_allclose(result.params[2], 0.75**5 * np.ones(2), rtol=1e-14)
    one = result.run(2)
    assert int(one.steps) == 5
    assert one.metrics["loss"].shape == one.eval_step.shape == (6,)


def test_cap_inside_a_block_is_evaluated_at_the_cap():
    result = train(
        quadratic, jnp.ones((2, 2)), jnp.zeros((3, 2)), optimizer=optax.sgd,
        hyperparams={"learning_rate": 0.5}, num_steps=np.array([5, 7]), eval_every=3, runs=2,
    )  # fmt: skip
    np.testing.assert_array_equal(result.eval_step[0, :3], [0, 3, 5])
    np.testing.assert_array_equal(result.eval_step[1], [0, 3, 6, 7])
    np.testing.assert_array_equal(result.metrics["loss"][1], 0.25 ** np.array([0, 3, 6, 7]))
    np.testing.assert_array_equal(result.hit_cap, [True, True])


def test_keep_best_and_last():
    """Training drives p from 1 to 0 by halving; 'val' = (p - 1/2)^2 is 0 at step 1."""

    def val(params, data):
        return {"loss": quadratic(params, data), "val": jnp.sum((params - 0.5) ** 2)}

    kw = {"optimizer": optax.sgd, "hyperparams": {"learning_rate": 0.5}, "num_steps": 4,
          "eval_fn": val}  # fmt: skip
    best = train(quadratic, jnp.ones(2), jnp.zeros((3, 2)), keep="best", best_metric="val", **kw)
    np.testing.assert_array_equal(best.params, [0.5, 0.5])
    np.testing.assert_array_equal(best.last_params, [1 / 16, 1 / 16])
    assert int(best.best_index) == 1
    assert float(best.best("val")) == 0.0
    late = train(quadratic, jnp.ones(2), jnp.zeros((3, 2)), keep="best", best_metric="val",
                 eval_at_start=False, eval_every=2, **kw)  # fmt: skip
    np.testing.assert_array_equal(late.params, [0.25, 0.25])  # steps 2 and 4 only
    np.testing.assert_array_equal(late.eval_step, [2, 4])
    last = train(quadratic, jnp.ones(2), jnp.zeros((3, 2)), **kw)
    np.testing.assert_array_equal(last.params, last.last_params)
    assert int(last.best_index) == 4
    kw["num_steps"] = 50
    early = train(quadratic, jnp.ones(2), jnp.zeros((3, 2)), keep="best", best_metric="val",
                  patience=2, **kw)  # fmt: skip
    assert bool(early.stalled)
    assert not bool(early.hit_cap)
    assert int(early.steps) == 3  # best at step 1, no better at steps 2 and 3
    np.testing.assert_array_equal(early.params, [0.5, 0.5])


def _val_half(params, data):
    return {"loss": quadratic(params, data), "val": jnp.sum((params - 0.5) ** 2)}


def test_patience_counts_evaluations_per_run():
    """p <- (1 - rate) p from p = 1: 'val' = 2 (p - 1/2)^2 is lowest at step 1 (rate 1/2) and
    step 2 (rate 1/4, p = 9/16), then rises. Patience counts evaluations of each run, not steps;
    a new patience value compiles nothing."""

    def call(patience, eval_every, num_steps=40):
        return train(quadratic, jnp.ones((2, 2)), jnp.zeros((3, 2)), optimizer=optax.sgd,
                     hyperparams={"learning_rate": np.array([0.5, 0.25])}, num_steps=num_steps,
                     eval_every=eval_every, eval_fn=_val_half, keep="best", best_metric="val",
                     patience=patience, runs=2, lanes=2)  # fmt: skip

    two = call(2, 1)
    np.testing.assert_array_equal(two.steps, [3, 4])
    np.testing.assert_array_equal(two.stalled, [True, True])
    np.testing.assert_array_equal(two.hit_cap, [False, False])
    np.testing.assert_array_equal(two.best_index, [1, 2])
    np.testing.assert_array_equal(two.params, [[0.5, 0.5], [0.5625, 0.5625]])
    with count_compiles() as messages:
        three = call(3, 1)
    assert compiles_in(messages) == []
    np.testing.assert_array_equal(three.steps, [4, 5])
    sparse = call(2, 2)  # evaluations at steps 0, 2, 4, 6: the best at step 2 for both rates
    np.testing.assert_array_equal(sparse.steps, [6, 6])
    np.testing.assert_array_equal(sparse.eval_step, [[0, 2, 4, 6], [0, 2, 4, 6]])
    capped = call(10, 1, 11)  # rate 1/2 stalls at its cap (step 11), rate 1/4 would at step 12
    np.testing.assert_array_equal(capped.steps, [11, 11])
    np.testing.assert_array_equal(capped.stalled, [True, False])
    np.testing.assert_array_equal(capped.hit_cap, [False, True])


def test_divergence_stops_the_run():
    result = train(
        quadratic, jnp.ones((2, 2)), jnp.zeros((3, 2)), optimizer=optax.sgd,
        hyperparams={"learning_rate": jnp.array([0.5, 1e200])}, num_steps=20, runs=2,
    )  # fmt: skip
    np.testing.assert_array_equal(result.diverged, [False, True])


def test_divergence_to_infinite_weights_with_spectral_norms_stops_the_run():
    """The lane's weights jump to inf: its spectral norm is recorded, not a failed check."""

    def loss(params, data):
        return jnp.sum(jnp.exp(params["w"])) + 0.0 * jnp.sum(data)

    result = train(
        loss, {"w": jnp.full((2, 2, 2), 10.0)}, jnp.zeros((3, 2)), optimizer=optax.sgd,
        hyperparams={"learning_rate": jnp.array([1e-3, -1e306])}, num_steps=3, runs=2,
        norms="spectral",
    )  # fmt: skip
    np.testing.assert_array_equal(result.diverged, [False, True])
    np.testing.assert_array_equal(result.hit_cap, [True, False])
    assert int(result.steps[1]) < 20
    assert not np.isfinite(result.metrics["loss"][1, int(result.num_evals[1]) - 1])


# ------------------------------------------------------------------------------ the old loops


def test_full_batch_gd_equals_the_old_train_gd(shallow):
    params0, batch = shallow
    p_old, losses, metrics = ref.old_train_gd(
        shallow_logistic, params0, batch, learning_rate=0.3, num_steps=12,
        metrics_fn=lambda p, b: {"f0": shallow_apply(p, b[0])[0]},
    )  # fmt: skip
    new = train(shallow_logistic, params0, batch, optimizer=optax.sgd,
                hyperparams={"learning_rate": 0.3}, num_steps=12, eval_fn=shallow_eval)  # fmt: skip
    np.testing.assert_allclose(new.metrics["loss"], losses, rtol=1e-13)
    np.testing.assert_allclose(new.metrics["f0"], metrics["f0"], rtol=1e-12)
    for k in p_old:
        np.testing.assert_allclose(new.params[k], p_old[k], rtol=1e-12, atol=1e-15)


def test_vmapped_seeds_equal_the_old_summed_loss_stacking(shallow):
    """shallow_gd's old trick (GD on the sum of the seeds' losses) vs vmap over seeds."""
    _, batch = shallow
    stacked0 = _stack([_shallow_params(s) for s in range(3)])
    p_old, per_seed = ref.old_stacked_gd(per_seed_logistic, stacked0, batch, learning_rate=0.2,
                                         num_steps=10)  # fmt: skip
    new = train(shallow_logistic, stacked0, batch, optimizer=optax.sgd,
                hyperparams={"learning_rate": 0.2}, num_steps=10, runs=3, lanes=3)  # fmt: skip
    np.testing.assert_allclose(new.metrics["loss"], per_seed.T, rtol=1e-13)
    for k in p_old:
        np.testing.assert_allclose(new.params[k], p_old[k], rtol=1e-12, atol=1e-15)


def test_threshold_stop_equals_the_old_train_interpolator(shallow):
    """Full-batch Adam to a loss threshold, checked every chunk (old: strict <, same here)."""
    params0, batch = shallow
    p_old, value, steps, reached, losses = ref.old_train_interpolator(
        shallow_logistic, params0, batch, learning_rate=0.05, loss_threshold=0.2,
        max_steps=60, chunk_steps=4,
    )  # fmt: skip
    new = train(shallow_logistic, params0, batch, optimizer=optax.adam,
                hyperparams={"learning_rate": 0.05}, num_steps=60, eval_every=4,
                loss_threshold=0.2)  # fmt: skip
    assert reached
    assert bool(new.reached)
    assert int(new.steps) == steps < 60
    np.testing.assert_allclose(new.metrics["loss"][1:], losses, rtol=1e-12)
    assert float(new.metrics["loss"][-1]) == pytest.approx(value, rel=1e-12)
    for k in p_old:
        np.testing.assert_allclose(new.params[k], p_old[k], rtol=1e-10, atol=1e-13)


def test_minibatch_adam_equals_the_old_train_minibatch(shallow):
    params0, batch = shallow
    p_old, losses = ref.old_train_minibatch(shallow_logistic, params0, batch, jax.random.key(5),
                                            num_epochs=3, batch_size=4,
                                            optimizer=optax.adam(0.02))  # fmt: skip
    new = train(shallow_logistic, params0, batch, jax.random.key(5), optimizer=optax.adam,
                hyperparams={"learning_rate": 0.02}, num_steps=9, batch_size=4,
                eval_every=3)  # fmt: skip
    np.testing.assert_allclose(new.metrics["loss"], losses, rtol=1e-12)
    for k in p_old:
        np.testing.assert_allclose(new.params[k], p_old[k], rtol=1e-10, atol=1e-13)


@pytest.fixture(scope="module")
def majority():
    d, n = 8, 40
    apply_fn, _ = as_pure(ScalarTransformer(d, num_classes=2, param_dtype=jnp.float64,
                                            rngs=nnx.Rngs(0)))  # fmt: skip
    datas = []
    for seed in range(2):
        full = sparse_majority(jax.random.key(seed), num_examples=n + 30, seq_len=6, sparsity=3,
                               embed_dim=d, dtype=jnp.float64)  # fmt: skip
        x, y = full["inputs"], full["labels"]
        datas.append({"train_x": x[:n], "train_y": y[:n], "val_x": x[n:], "val_y": y[n:]})
    params = [
        as_pure(ScalarTransformer(d, num_classes=2, param_dtype=jnp.float64,
                                  rngs=nnx.Rngs(10 + s)))[1]
        for s in range(2)
    ]  # fmt: skip
    keys = jnp.stack([jax.random.key(20 + s) for s in range(2)])
    return apply_fn, _stack(params), _stack(datas), keys


def _tt_losses(apply_fn):
    def loss_fn(p, batch):
        return cross_entropy_loss(apply_fn(p, batch[0]), batch[1])

    def evaluate(p, data):
        return {f"{s}_loss": cross_entropy_loss(apply_fn(p, data[f"{s}_x"]), data[f"{s}_y"])
                for s in ("train", "val")}  # fmt: skip

    return loss_fn, evaluate


def test_best_epoch_tracking_equals_the_old_tt_loop(majority):
    """tt_sequence_length._train_one: 2 seeds, Adam, minibatches of 16, best validation state."""
    apply_fn, params0, data, keys = majority
    loss_fn, evaluate = _tt_losses(apply_fn)
    best, curve = ref.old_tt_train(params0, data, keys, loss_fn=loss_fn, evaluate=evaluate,
                                   learning_rate=0.02, batch_size=16, num_epochs=6,
                                   eval_every=2)  # fmt: skip
    train_data = {"x": data["train_x"], "y": data["train_y"]}
    new = train(
        lambda p, b: loss_fn(p, (b["x"], b["y"])), params0, train_data, keys,
        optimizer=optax.adam, hyperparams={"learning_rate": 0.02}, num_steps=18, batch_size=16,
        eval_every=6, eval_fn=evaluate, eval_data=data, eval_at_start=False, keep="best",
        best_metric="val_loss", runs=2, data_per_run=True, lanes=2,
    )  # fmt: skip
    np.testing.assert_allclose(new.metrics["val_loss"], curve["val_loss"], rtol=1e-11)
    np.testing.assert_array_equal(new.eval_step // 3, [[2, 4, 6]] * 2)  # epochs
    np.testing.assert_array_equal((new.best_index + 1) * 2, best["epoch"])
    for a, b in zip(jax.tree_util.tree_leaves(new.params),
                    jax.tree_util.tree_leaves(best["params"]), strict=True):  # fmt: skip
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------ vmap, lanes


def test_runs_equal_single_runs_and_learning_rates_vmap(shallow):
    """Seeds x learning rates under vmap agree with one run at a time (float64 rounding)."""
    _, batch = shallow
    seeds, rates = [0, 1, 0, 1], [0.1, 0.1, 0.3, 0.3]
    stacked = _stack([_shallow_params(s) for s in seeds])
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    kw = {"optimizer": optax.adam, "num_steps": 8, "batch_size": 4, "eval_every": 3}
    many = train(shallow_logistic, stacked, batch, keys, hyperparams={"learning_rate":
                 jnp.asarray(rates)}, runs=4, lanes=4, **kw)  # fmt: skip
    for i, (s, lr) in enumerate(zip(seeds, rates, strict=True)):
        one = train(shallow_logistic, _shallow_params(s), batch, jax.random.key(s),
                    hyperparams={"learning_rate": lr}, **kw)  # fmt: skip
        np.testing.assert_allclose(many.metrics["loss"][i], one.metrics["loss"], rtol=1e-12)
        np.testing.assert_allclose(many.hyperparams["learning_rate"][i], lr)
    assert not np.allclose(many.metrics["loss"][0], many.metrics["loss"][2])


def test_a_lane_does_not_depend_on_its_position_or_neighbours(shallow):
    """Same run, same bits: alone, first, last, beside other runs, in a batch of 2 or 5 (float32,
    where vmaps of different widths rounded differently before the engine)."""
    dtype = jnp.float32
    x, y = shallow[1]
    batch = (x.astype(dtype), y)
    seeds = [0, 1, 2, 3, 4]
    kw = {"optimizer": optax.adam, "hyperparams": {"learning_rate": 0.05}, "num_steps": 10,
          "batch_size": 4, "eval_every": 5, "keep": "best", "lanes": 3}  # fmt: skip

    def batch_of(order):
        params = _stack([_shallow_params(s, dtype) for s in order])
        keys = jnp.stack([jax.random.key(s) for s in order])
        return train(shallow_logistic, params, batch, keys, runs=len(order), **kw)

    reference = batch_of(seeds)
    for order in ([3], [4, 3], [0, 1, 2, 4, 3], [3, 3, 1], [2, 3]):
        other = batch_of(order)
        i = order.index(3)
        assert _leaves_equal(other.run(i).params, reference.run(3).params), order
        np.testing.assert_array_equal(other.metrics["loss"][i], reference.metrics["loss"][3])


def test_evals_per_call_does_not_change_the_result():
    data = jax.random.normal(jax.random.key(0), (6, 2), jnp.float32)
    params = jax.random.normal(jax.random.key(1), (2, 2), jnp.float32)
    keys = jnp.stack([jax.random.key(2), jax.random.key(3)])
    results = [
        train(quadratic, params, data, keys, optimizer=optax.adam,
              hyperparams={"learning_rate": 0.1}, num_steps=13, batch_size=4, eval_every=2,
              runs=2, lanes=2, evals_per_call=per_call)
        for per_call in (1, 5)
    ]  # fmt: skip
    np.testing.assert_array_equal(results[0].params, results[1].params)
    np.testing.assert_array_equal(results[0].metrics["loss"], results[1].metrics["loss"])
    np.testing.assert_array_equal(results[0].eval_step[0], [0, 2, 4, 6, 8, 10, 12, 13])


def test_one_lane_runs_without_vmap_and_single_run(shallow):
    params0, batch = shallow
    kw = {"optimizer": optax.sgd, "hyperparams": {"learning_rate": 0.1}, "num_steps": 3}
    single = train(shallow_logistic, params0, batch, **kw)
    lane = train(shallow_logistic, _stack([params0]), batch, runs=1, lanes=1, **kw)
    assert single.num_runs is None
    assert lane.num_runs == 1
    assert _leaves_equal(single.params, lane.run(0).params)


def test_compiled_once_per_shape(shallow):
    """New data values, rates, step caps and thresholds reuse the compiled programs."""
    _, (x, y) = shallow
    stacked = _stack([_shallow_params(s) for s in (0, 1)])
    keys = jnp.stack([jax.random.key(s) for s in (0, 1)])

    def call(scale, rates, steps, threshold):
        return train(shallow_logistic, jax.tree_util.tree_map(lambda a: a * scale, stacked),
                     (x * scale, y), keys, optimizer=optax.adam,
                     hyperparams={"learning_rate": jnp.asarray(rates)}, num_steps=steps,
                     batch_size=4, eval_every=2, loss_threshold=threshold, runs=2,
                     lanes=2)  # fmt: skip

    call(1.0, [0.1, 0.2], 6, 0.3)
    with count_compiles() as messages:
        again = call(0.9, [0.05, 0.01], np.array([10, 4]), 0.1)
    assert compiles_in(messages) == []
    assert int(again.steps[1]) == 4


# ------------------------------------------------------------------------------ records, errors


def test_record_of_one_run_matches_numpy(shallow):
    params0, batch = shallow
    result = train(shallow_logistic, params0, batch, optimizer=optax.sgd,
                   hyperparams={"learning_rate": 0.3}, num_steps=4, eval_every=2,
                   norms="spectral")  # fmt: skip
    rec = result.record(params0, learning_rate=0.3)
    assert isinstance(rec, TrainingRecord)
    np.testing.assert_array_equal(rec.step, [0, 2, 4])
    for k in params0:
        a, a0 = np.asarray(result.params[k]), np.asarray(params0[k])
        np.testing.assert_allclose(rec.distance[k][-1], np.linalg.norm(a - a0), rtol=1e-12)
        np.testing.assert_allclose(rec.frobenius[k][-1], np.linalg.norm(a), rtol=1e-12)
        want = np.linalg.norm(a, 2) if a.ndim == 2 else np.linalg.norm(a)
        np.testing.assert_allclose(rec.spectral[k][-1], want, rtol=1e-10)
        assert rec.distance[k][0] == 0.0
    with pytest.raises(ValueError, match="record"):
        train(shallow_logistic, params0, batch, optimizer=optax.sgd,
              hyperparams={"learning_rate": 0.3}, num_steps=1).record(params0)  # fmt: skip


def test_progress_bar(shallow):
    params0, batch = shallow
    stream = io.StringIO()
    train(shallow_logistic, params0, batch, optimizer=optax.sgd, hyperparams={"learning_rate":
          0.1}, num_steps=6, progress=stream, label="[demo]")  # fmt: skip
    text = stream.getvalue()
    assert "[demo]" in text
    assert "6/6" in text
    assert "loss" in text


def _bad(**kwargs):
    args = {"optimizer": optax.sgd, "hyperparams": {"learning_rate": 0.1}, "num_steps": 2}
    args.update(kwargs)
    train(squared_loss_p, jnp.ones(2), jnp.zeros((4, 2)), **args)


def squared_loss_p(params, data):
    return squared_loss(data @ params, jnp.zeros(data.shape[0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_steps": -1}, "num_steps"),
        ({"num_steps": np.array([1, 2])}, "num_steps"),
        ({"eval_every": 0}, "eval_every"),
        ({"batch_size": 0, "key": jax.random.key(0)}, "batch_size"),
        ({"batch_size": 2}, "key"),
        ({"keep": "worst"}, "keep"),
        ({"norms": "l1"}, "norms"),
        ({"loss_threshold": float("nan")}, "loss_threshold"),
        ({"hyperparams": {"learning_rate": float("inf")}}, "hyperparams"),
        ({"hyperparams": {"rate": 0.1}}, "hyperparams"),
        ({"hyperparams": None}, "optimizer"),
        ({"optimizer": optax.sgd(0.1)}, "hyperparams"),
        ({"optimizer": "adam"}, "optimizer"),
        ({"keep": "best", "best_metric": "val"}, "best_metric"),
        ({"loss_threshold": 0.1, "stop_metric": "acc"}, "stop_metric"),
        ({"runs": 0}, "runs"),
        ({"runs": 3}, "params"),
        ({"data_per_run": True}, "data_per_run"),
        ({"evals_per_call": 0}, "evals_per_call"),
        ({"patience": 3}, "patience"),
        ({"patience": 0, "keep": "best"}, "patience"),
        ({"patience": 2**31, "keep": "best"}, "patience"),
        ({"patience": 2.0, "keep": "best"}, "patience"),
        ({"num_steps": 2**31 - 64}, "num_steps"),
    ],
)
def test_bad_arguments(kwargs, match):
    if "key" in kwargs:
        key = kwargs.pop("key")
        with pytest.raises(ValueError, match=match):
            train(squared_loss_p, jnp.ones(2), jnp.zeros((4, 2)), key, optimizer=optax.sgd,
                  hyperparams={"learning_rate": 0.1}, num_steps=2, **kwargs)  # fmt: skip
        return
    with pytest.raises(ValueError, match=match):
        _bad(**kwargs)


def test_bad_runs_lanes_and_initial_loss():
    with pytest.raises(ValueError, match="lanes"):
        train(squared_loss_p, jnp.ones((2, 2)), jnp.zeros((4, 2)), optimizer=optax.sgd,
              hyperparams={"learning_rate": 0.1}, num_steps=1, runs=2, lanes=0)  # fmt: skip
    with pytest.raises(ValueError, match="initialisation"):
        train(lambda p, d: jnp.sum(p) * jnp.nan, jnp.ones(2), jnp.zeros((4, 2)),
              optimizer=optax.sgd, hyperparams={"learning_rate": 0.1}, num_steps=1)  # fmt: skip


def test_no_experiment_keeps_its_own_training_loop():
    """Every experiment trains through the engine: no optimiser step or loop of its own."""
    import pathlib
    import re

    folder = pathlib.Path(__file__).resolve().parents[3] / "jaxbounds" / "experiments"
    pattern = re.compile(r"make_step\(|\.update\(grad|def _?train_one|def train_interpolator")
    for path in sorted(folder.glob("*.py")):
        assert not pattern.search(path.read_text(encoding="utf-8")), path.name
