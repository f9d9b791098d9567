"""Long runs that keep their work: counts, failures, identity, budgets (issue 38, cases 1-3, 7)."""

import json
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from jaxbounds.longrun import RunFailed, load_checkpoint, run_blocks, target_reached
from kernels.blocks import MonteCarloBlocks, merge_states


def _blocks(seed=3, n=8, dtype=jnp.float64):
    x = jnp.asarray(np.random.default_rng(seed).normal(size=(n, 3)), dtype)
    return MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(seed), norm=2, radius=1.0)


def _one(blocks, count):
    return kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=count)


# -- case 1: every count from 1 up; no rule throws computed samples away


@pytest.mark.parametrize(
    ("max_samples", "block_size"), [(2, None), (17, None), (4097, 2048), (65, 8)]
)
def test_any_max_samples_and_last_block(max_samples, block_size):
    blocks = _blocks()
    got = run_blocks(blocks, max_samples=max_samples, block_size=block_size, handle_signals=False)
    assert (got.reason, got.num_samples) == ("max_samples", max_samples)
    assert got.state.ranges == ((0, max_samples),)
    one = _one(blocks, max_samples)
    np.testing.assert_allclose(float(got.estimate.mean), float(one.mean), rtol=1e-12)
    np.testing.assert_allclose(float(got.estimate.stderr), float(one.stderr), rtol=1e-9)


def test_numpy_integer_counts_are_counts():
    got = run_blocks(
        _blocks(), max_samples=np.int64(40), block_size=np.int32(16), min_samples=np.int64(2),
        handle_signals=False,
    )  # fmt: skip
    assert got.num_samples == 40


def test_a_block_of_one_sample():
    blocks = _blocks()
    parts = [blocks.run(0, 1), blocks.run(1, 2), blocks.run(2, 7), blocks.run(7, 8)]
    state = merge_states(*parts)
    assert [p.count for p in parts] == [1, 1, 5, 1]
    np.testing.assert_allclose(
        float(blocks.estimate(state).mean), float(_one(blocks, 8).mean), rtol=1e-12
    )


def _quadratic_trace_blocks():
    """Hessian trace of sum(a * w**2) / 2: the Hessian is diag(a), its trace 10."""
    a = jnp.arange(1.0, 5.0)
    loss = lambda p, b: 0.5 * jnp.sum(b * p["w"] ** 2)  # noqa: E731
    return MonteCarloBlocks(kernels.hessian_trace, loss, {"w": jnp.ones(4)}, a, jax.random.key(1))


def test_blocks_of_one_probe_through_the_driver():
    # a driver run of one-probe blocks read the estimate's units from one sample, which no
    # kernel estimates from (hessian_trace takes two or more): it failed after the first block
    seen = []
    got = run_blocks(
        _quadratic_trace_blocks(), max_samples=5, block_size=1, min_samples=2,
        callback=seen.append, handle_signals=False,
    )  # fmt: skip
    assert (got.reason, got.num_samples) == ("max_samples", 5)
    assert [p.num_samples for p in seen] == [1, 2, 3, 4, 5]
    assert math.isnan(seen[0].mean) and seen[0].stderr == math.inf  # one sample: no estimate
    assert all(math.isfinite(p.mean) and math.isfinite(p.stderr) for p in seen[1:])
    # Rademacher probes of a diagonal Hessian: every probe gives the trace exactly
    assert float(got.estimate.mean) == pytest.approx(10.0, rel=1e-12)
    assert got.mean == pytest.approx(10.0, rel=1e-12)


def test_a_run_stopped_after_one_probe_keeps_it(tmp_path):
    path = tmp_path / "one.json"
    got = run_blocks(
        _quadratic_trace_blocks(), max_time=1e-9, block_size=1, checkpoint=path,
        handle_signals=False,
    )  # fmt: skip
    assert (got.reason, got.num_samples, got.estimate) == ("max_time", 1, None)
    assert math.isnan(got.mean) and math.isnan(got.stderr)
    assert load_checkpoint(path)["state"].count == 1  # the probe is kept for a resume
    again = run_blocks(
        _quadratic_trace_blocks(), max_samples=3, block_size=1, checkpoint=path,
        handle_signals=False,
    )  # fmt: skip
    assert (again.num_samples, again.state.ranges) == (3, ((0, 3),))
    assert float(again.estimate.mean) == pytest.approx(10.0, rel=1e-12)


def test_a_failing_block_saves_what_finished(tmp_path, monkeypatch):
    """A block's error: the checkpoint and the partial run hold every finished block."""
    blocks = _blocks()
    ck = tmp_path / "run.json"
    real = MonteCarloBlocks.run

    def third_fails(self, start, stop):
        if start >= 64:
            raise ValueError("inputs: a failure in the third block")
        return real(self, start, stop)

    monkeypatch.setattr(MonteCarloBlocks, "run", third_fails)
    with pytest.raises(RunFailed, match="third block") as info:
        run_blocks(blocks, max_samples=1000, block_size=32, checkpoint=ck, handle_signals=False)
    saved = load_checkpoint(ck)
    assert saved["reason"] == "error"
    assert saved["state"].ranges == ((0, 64),)
    partial = info.value.partial
    assert (partial.reason, partial.num_samples) == ("error", 64)
    monkeypatch.setattr(MonteCarloBlocks, "run", real)
    np.testing.assert_allclose(
        float(partial.estimate.mean), float(_one(blocks, 64).mean), rtol=1e-12
    )
    resumed = run_blocks(blocks, max_samples=96, block_size=32, checkpoint=ck)
    assert (resumed.reason, resumed.num_samples) == ("max_samples", 96)


# -- case 2: a checkpoint's identity covers a loss's constants and the globals it reads


def _loss_source(factor):
    return f"def loss(p, batch):\n    return {factor} * jnp.sum(p * p)\n"


def _make_loss(source, namespace):
    exec(compile(source, "<loss>", "exec"), namespace)  # the same name, file and qualname
    return namespace["loss"]


def test_an_edited_constant_is_another_problem(tmp_path):
    params = jnp.zeros(3)
    one = _make_loss(_loss_source("1.0"), {"jnp": jnp})
    three = _make_loss(_loss_source("3.0"), {"jnp": jnp})
    a = MonteCarloBlocks(kernels.hessian_trace, one, params, (), jax.random.key(0))
    b = MonteCarloBlocks(kernels.hessian_trace, three, params, (), jax.random.key(0))
    assert a.fingerprint != b.fingerprint
    ck = tmp_path / "run.json"
    run = run_blocks(a, max_samples=10, block_size=5, checkpoint=ck, handle_signals=False)
    assert float(run.mean) == pytest.approx(6.0)  # tr(2 I_3)
    with pytest.raises(ValueError, match="another problem"):
        run_blocks(b, max_samples=20, block_size=5, checkpoint=ck, handle_signals=False)


def test_a_changed_global_array_is_another_problem(tmp_path):
    namespace = {"jnp": jnp, "CURV": jnp.ones(3)}
    source = "def loss(p, batch):\n    return 0.5 * jnp.sum(CURV * p * p)\n"
    loss = _make_loss(source, namespace)
    params = jnp.zeros(3)

    def blocks():
        return MonteCarloBlocks(kernels.hessian_trace, loss, params, (), jax.random.key(0))

    ck = tmp_path / "run.json"
    first = run_blocks(blocks(), max_samples=10, block_size=5, checkpoint=ck, handle_signals=False)
    assert float(first.mean) == pytest.approx(3.0)
    namespace["CURV"] = jnp.asarray([1.0, 2.0, 7.0])  # the data changed: trace 10
    with pytest.raises(ValueError, match="another problem"):
        run_blocks(blocks(), max_samples=20, block_size=5, checkpoint=ck, handle_signals=False)


def test_same_loss_same_fingerprint_and_helpers_followed():
    namespace = {"jnp": jnp, "SCALE": 2.0}
    helper = "def helper(p):\n    return SCALE * jnp.sum(p * p)\n"
    exec(compile(helper, "<helper>", "exec"), namespace)
    loss = _make_loss("def loss(p, batch):\n    return helper(p)\n", namespace)
    params = jnp.zeros(2)
    fp = MonteCarloBlocks(kernels.hessian_trace, loss, params, (), jax.random.key(0)).fingerprint
    again = MonteCarloBlocks(kernels.hessian_trace, loss, params, (), jax.random.key(0))
    assert again.fingerprint == fp
    namespace["SCALE"] = 5.0  # read by the helper the loss calls
    other = MonteCarloBlocks(kernels.hessian_trace, loss, params, (), jax.random.key(0))
    assert other.fingerprint != fp
    assert isinstance(namespace["helper"], types.FunctionType)


# -- case 3: a key's every bit counts


def test_a_key_above_2_32_is_not_key_0():
    x = jnp.eye(3)
    zero = MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(0), norm=2, radius=1.0)
    big = MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(2**32), norm=2, radius=1.0)
    assert zero.fingerprint != big.fingerprint


# -- case 7: calibration counts; the rule and the time budget hold to within one block


def test_a_target_met_while_calibrating_stops_there():
    blocks = _blocks()
    reports = []
    x = np.asarray(blocks.args[0])
    signs = np.array([[1 - 2 * ((k >> i) & 1) for i in range(8)] for k in range(256)], float)
    sd = np.std(np.linalg.norm(signs @ x, axis=1) / 8)
    target = sd / math.sqrt(40)  # reached after about 40 samples: inside the 16-sample blocks
    got = run_blocks(blocks, target_stderr=target, min_samples=2, callback=reports.append,
                     handle_signals=False)  # fmt: skip
    assert got.reason == "target"
    assert reports[0].calibrating  # the run started by calibrating; its blocks counted
    for r in reports[:-1]:  # the rule did not hold at any earlier block end
        assert not target_reached(r.num_samples, r.mean, r.stderr, target_stderr=target,
                                  min_samples=2)  # fmt: skip
    assert got.num_samples < 200


def test_max_time_counts_this_run_and_stops_at_the_first_block_end(tmp_path):
    blocks = _blocks()
    ck = tmp_path / "run.json"
    run_blocks(blocks, max_samples=64, block_size=32, checkpoint=ck, handle_signals=False)
    data = json.loads(ck.read_text())
    data["seconds"] = 1e6  # earlier runs took long: they do not count against this one
    ck.write_text(json.dumps(data))
    reports = []
    got = run_blocks(blocks, max_time=0.5, block_size=32, checkpoint=ck,
                     callback=reports.append, handle_signals=False)  # fmt: skip
    assert got.reason == "max_time"
    assert got.num_samples > 64  # this run did blocks of its own
    assert got.seconds >= 1e6  # the record keeps the total time
    # the stop came at the first block end past the budget: one block before, it was not over
    own = [r.seconds - 1e6 for r in reports]
    assert all(t < 0.5 for t in own[:-1])
