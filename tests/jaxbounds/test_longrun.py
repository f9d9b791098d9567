"""The long-run driver: stopping rule and its coverage, resume, workers, signals, the CLI."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from jaxbounds.cli_rademacher import parse_duration
from jaxbounds.longrun import (
    Z95,
    load_checkpoint,
    merge_checkpoints,
    run_blocks,
    target_reached,
)
from kernels._random import sign_vector
from kernels.blocks import MonteCarloBlocks, merge_states

ROOT = Path(__file__).resolve().parents[2]


def _table(seed=0, n=8, d=3):
    """Every sup of the linear class on 8 points: (values over all 2^8 sign vectors, x)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=n)))
    return np.linalg.norm(signs @ x, axis=1) / n, x


def _simulate(runs, block, min_samples, target_factor, max_blocks, seed, relative=False):
    """Coverage of mean -+ 1.96 stderr at the rule's stopping time, vectorised over runs.

    Samples are i.i.d. draws of the Rademacher sup of a linear class on 8 points (radius 1,
    p = 2), through the sign-vector table; the rule is checked at block ends, like run_blocks.
    """
    table, _ = _table()
    mu = table.mean()
    rng = np.random.default_rng(seed)
    draws = table[rng.integers(0, table.size, size=(runs, max_blocks * block))]
    values = draws.reshape(runs, max_blocks, block)
    s1 = np.cumsum(values.sum(2), 1)
    s2 = np.cumsum((values**2).sum(2), 1)
    count = block * np.arange(1, max_blocks + 1)
    mean = s1 / count
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (s2 - count * mean**2) / (count - 1)
        stderr = np.sqrt(np.maximum(var, 0) / count)
    scale = table.std() / mu if relative else table.std()
    stop = target_reached(
        count[None, :], mean, stderr, target_stderr=scale * target_factor, relative=relative,
        min_samples=min_samples,
    )  # fmt: skip
    assert stop[:, -1].all()  # every run stops inside the simulated horizon
    first = stop.argmax(1)
    rows = np.arange(runs)
    covered = np.abs(mean[rows, first] - mu) <= Z95 * stderr[rows, first]
    return covered.mean(), count[first]


@pytest.mark.parametrize("relative", [False, True])
def test_stopping_rule_covers_95_percent(relative):
    # 4000 runs; the target is reached after 500 to ~800 samples (blocks of 50, n_min = 100):
    # the simulation's own standard error is 0.34 points
    coverage, stops = _simulate(4000, 50, 100, 1 / np.sqrt(600), 40, seed=1, relative=relative)
    assert 500 <= stops.mean() <= 900
    assert abs(coverage - 0.95) <= 0.02


def test_stopping_at_the_first_low_stderr_under_covers():
    # the naive rule (check after every sample, no minimum) stops early when the sample
    # variance is low by chance: coverage well below 95%
    coverage, _ = _simulate(2000, 1, 2, 1 / np.sqrt(600), 2000, seed=2)
    assert coverage < 0.93


def _linear_blocks(dtype=jnp.float64, seed=3):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(8, 3)), dtype)
    return MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(seed), norm=2, radius=1.0)


def test_run_blocks_applies_the_rule_at_block_ends():
    blocks = _linear_blocks()
    table, _ = _table(3)
    target = table.std() / np.sqrt(700)
    got = run_blocks(blocks, target_stderr=target, min_samples=200, block_size=64,
                     handle_signals=False)  # fmt: skip
    assert got.reason == "target"
    # replay the rule on the same blocks, merged one at a time; the kernel keeps its sups times
    # 2^-e with 2^(e-1) <= b < 2^e, b = radius * max_i ||x_i||_2 its McDiarmid bound
    x = np.asarray(blocks.args[0])
    up = 2.0 ** (np.floor(np.log2(np.linalg.norm(x, axis=1).max())) + 1)
    state, k = None, 0
    while True:
        new = blocks.run(64 * k, 64 * (k + 1))
        state = new if state is None else merge_states(state, new)
        k += 1
        est = state.stats().estimate()
        mean, stderr = up * float(est.mean), up * float(est.stderr)
        if target_reached(state.count, mean, stderr, target_stderr=target, min_samples=200):
            break
    assert got.num_samples == state.count
    np.testing.assert_allclose(got.mean, mean, rtol=1e-13)
    assert got.stderr <= target
    one = kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=state.count)
    np.testing.assert_allclose(float(got.estimate.mean), float(one.mean), rtol=1e-12)
    np.testing.assert_allclose(float(got.estimate.upper), float(one.upper), rtol=1e-12)


def test_max_samples_resume_and_foreign_checkpoints(tmp_path):
    blocks = _linear_blocks(jnp.float32)
    ck = tmp_path / "run.json"
    first = run_blocks(blocks, max_samples=300, block_size=64, checkpoint=ck, handle_signals=False)
    assert (first.reason, first.num_samples) == ("max_samples", 300)
    assert load_checkpoint(ck)["state"].count == 300
    calls = []
    resumed = run_blocks(blocks, max_samples=1000, block_size=64, checkpoint=ck,
                         callback=calls.append, handle_signals=False)  # fmt: skip
    assert (resumed.reason, resumed.num_samples) == ("max_samples", 1000)
    assert calls
    assert calls[-1].num_samples == 1000
    assert calls[-1].rate > 0
    one = kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=1000)
    np.testing.assert_allclose(float(resumed.estimate.mean), float(one.mean), rtol=2e-6)
    np.testing.assert_allclose(float(resumed.estimate.stderr), float(one.stderr), rtol=2e-5)
    other = _linear_blocks(jnp.float32, seed=4)
    with pytest.raises(ValueError, match="another problem"):
        run_blocks(other, max_samples=1000, block_size=64, checkpoint=ck, handle_signals=False)
    with pytest.raises(ValueError, match="block_size"):
        run_blocks(blocks, max_samples=2000, block_size=32, checkpoint=ck, handle_signals=False)


def test_workers_cover_disjoint_blocks_and_merge(tmp_path):
    blocks = _linear_blocks()
    paths = [tmp_path / f"w{w}.json" for w in range(3)]
    for w, path in enumerate(paths):
        run_blocks(blocks, max_samples=960, block_size=32, worker=w, num_workers=3,
                   checkpoint=path, handle_signals=False)  # fmt: skip
    merged = merge_checkpoints(paths)
    assert merged.ranges == ((0, 960),)
    one = kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=960)
    np.testing.assert_allclose(float(blocks.estimate(merged).mean), float(one.mean), rtol=1e-12)
    with pytest.raises(ValueError, match="overlap"):
        merge_checkpoints([paths[0], paths[0]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "at least one stopping rule"),
        ({"target_stderr": -1.0}, "target_stderr"),
        ({"max_samples": 1}, "max_samples"),
        ({"max_time": 0}, "max_time"),
        ({"max_samples": 10, "num_workers": 2}, "block_size"),
        ({"max_samples": 10, "worker": 2, "num_workers": 2, "block_size": 4}, "worker"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_blocks(_linear_blocks(), **kwargs)


def test_durations():
    assert parse_duration("2h") == 7200.0
    assert parse_duration("25s") == 25.0
    with pytest.raises(ValueError, match="--max-time"):
        parse_duration("soon")


@pytest.fixture
def sigint_default():
    """Python's SIGINT handler for the test, even in a run started with SIGINT ignored
    (``nohup``, ``&``): run_blocks keeps an ignored SIGINT ignored, as the shell asked, and a
    child process inherits it; a handler instead is reset to the default in the child."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _cli(tmp_path, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    # no forced device count from the caller; the run's compile flags (root conftest) stay
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f
    )
    argv = [sys.executable, "-m", "jaxbounds.cli", "rademacher", "X.npy", "--norm", "2",
            "--radius", "1", "--quiet", *extra]  # fmt: skip
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(path, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_cli_sigint_resume_and_sigkill(tmp_path, sigint_default):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16)).astype(np.float32)
    np.save(tmp_path / "X.npy", x)
    target = 5e-5
    flags = ["--target-stderr", str(target), "--block-size", "8192", "--checkpoint-every", "0"]
    # an uninterrupted run
    a = _cli(tmp_path, *flags, "--checkpoint", "a.json", "--json", "a_out.json")
    out, err = a.communicate(timeout=600)
    assert a.returncode == 0, err
    want = json.loads((tmp_path / "a_out.json").read_text())
    # the same run, SIGINT after its first checkpoint (a few of its ~45 blocks)
    ck = tmp_path / "s.json"
    run = [*flags, "--checkpoint", "s.json", "--json", "out.json"]
    b = _cli(tmp_path, *run)
    _wait_for(ck, b)
    b.send_signal(signal.SIGINT)
    _, err = b.communicate(timeout=600)
    assert b.returncode == 130, err
    assert "resume" in err
    partial = load_checkpoint(ck)
    assert 0 < partial["state"].count < want["num_samples"]
    # resumed, then SIGKILL: the checkpoint (written after every block) stays readable and
    # holds every block but the one in flight
    c = _cli(tmp_path, *run)
    deadline = time.monotonic() + 120
    while load_checkpoint(ck)["state"].count <= partial["state"].count + 8192:
        assert c.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.kill()
    c.communicate()
    killed = load_checkpoint(ck)["state"]
    assert killed.ranges == ((0, killed.count),)
    assert killed.count % 8192 == 0
    # the same command again finishes: the estimate of the uninterrupted run
    d = _cli(tmp_path, *run)
    out, err = d.communicate(timeout=600)
    assert d.returncode == 0, err
    assert "stopped: target" in out
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["reason"] == "target"
    assert got["num_samples"] == want["num_samples"]
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-6)
    np.testing.assert_allclose(got["stderr"], want["stderr"], rtol=1e-4)
    assert got["stderr"] <= target
    # an independent numpy estimate of E ||X^T sigma||_2 / n
    signs = rng.choice([-1.0, 1.0], size=(20000, 512))
    values = np.linalg.norm(signs @ x.astype(np.float64), axis=1) / 512
    ref, ref_se = values.mean(), values.std(ddof=1) / np.sqrt(values.size)
    assert abs(got["mean"] - ref) <= 5 * np.hypot(ref_se, got["stderr"])


def test_cli_bad_flags_exit_2(tmp_path, capsys, monkeypatch):
    from jaxbounds.cli import main

    np.save(tmp_path / "X.npy", np.ones((4, 2), np.float32))
    monkeypatch.chdir(tmp_path)
    base = ["rademacher", "X.npy", "--norm", "2", "--radius", "1", "--quiet"]
    for extra, flag in [
        (["--target-stderr", "-1"], "--target-stderr"),
        (["--max-time", "2y"], "--max-time"),
        (["--max-samples", "many"], "--max-samples"),
        (["--max-time", "1h", "--norm", "0.5"], "--norm"),
        ([], "--target-stderr, --max-samples or --max-time"),
        # output places that could not be written at the end are refused before any work
        (["--max-samples", "100", "--json", str(tmp_path)], "--json"),
        (["--max-samples", "100", "--json", "nowhere/out.json"], "--json"),
        (["--max-samples", "100", "--checkpoint", "nowhere/c.json"], "--checkpoint"),
        (["--max-samples", "100", "--checkpoint", "X.npy/c.json"], "--checkpoint"),
    ]:
        assert main([*base, *extra]) == 2
        assert flag in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse: an unknown flag
        main([*base, "--target-stdderr", "1"])
    assert exit_info.value.code == 2
    assert "--target-stdderr" in capsys.readouterr().err


_PROCESSES_SCRIPT = """
import json, os
import jaxbounds.distributed as dist

info = dist.initialize(local_device_count=1)
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import kernels
from jaxbounds.longrun import run_processes

x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)))
blocks = kernels.MonteCarloBlocks(kernels.rademacher_linear, x, jax.random.key(3), norm=2,
                                  radius=1.0)
run = run_processes(blocks, block_size=64, max_samples=1280, handle_signals=False,
                    checkpoint=os.path.join(os.environ["LONGRUN_DIR"], "c.json"))
one = kernels.rademacher_linear(x, jax.random.key(3), norm=2, radius=1.0, num_samples=1280)
own = run.state.ranges
print("RESULT " + json.dumps({"process": info.process_index, "count": run.num_samples,
      "ranges": own, "mean": float(run.estimate.mean), "one": float(one.mean)}), flush=True)
dist.shutdown()
"""


def test_processes_run_disjoint_blocks_and_merge(tmp_path):
    from jaxbounds import distributed as dist
    from tests.kernels.test_multiprocess import multi_envs, run_processes

    names = (dist.ENV_COORDINATOR, dist.ENV_PROCESS_ID, dist.ENV_NUM_PROCESSES)
    envs = [{**env, "LONGRUN_DIR": str(tmp_path)} for env in multi_envs(2, *names)]
    results = run_processes(_PROCESSES_SCRIPT, envs)
    assert sorted(r["process"] for r in results) == [0, 1]
    for r in results:
        assert r["count"] == 1280
        assert r["ranges"] == [[0, 1280]]
        np.testing.assert_allclose(r["mean"], r["one"], rtol=1e-12)
    # each process checkpointed its own blocks: 0, 2, 4, ... and 1, 3, 5, ... of 64 samples
    for p in range(2):
        state = load_checkpoint(tmp_path / f"c.{p}of2.json")["state"]
        assert state.ranges == tuple((64 * j, 64 * j + 64) for j in range(p, 20, 2))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_between_blocks_and_saves(tmp_path, signum, sigint_default):
    blocks = _linear_blocks()
    ck = tmp_path / "run.json"

    def send_after_two(progress):
        if progress.num_samples == 64:
            os.kill(os.getpid(), signum)  # handled by run_blocks: stop after this block

    run = run_blocks(blocks, max_samples=10_000, block_size=32, checkpoint=ck,
                     callback=send_after_two)  # fmt: skip
    assert (run.reason, run.signal, run.num_samples) == ("interrupted", signum, 64)
    saved = load_checkpoint(ck)
    assert saved["reason"] == "interrupted"
    assert saved["state"].ranges == ((0, 64),)
    assert signal.getsignal(signum) is not None  # the previous handler is back
    resumed = run_blocks(blocks, max_samples=128, block_size=32, checkpoint=ck)
    assert (resumed.reason, resumed.num_samples, resumed.signal) == ("max_samples", 128, None)
    one = kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=128)
    np.testing.assert_allclose(float(resumed.estimate.mean), float(one.mean), rtol=1e-12)


def _quartic_loss(w, batch):
    a, b = batch
    return 0.5 * w @ (a @ w) + b @ w + 0.25 * jnp.sum(w**4)


def test_perturbed_traces_run_to_a_target_and_resume(tmp_path):
    """The driver stops on the average over perturbations and keeps every perturbation's trace."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(3, 3))
    batch = (jnp.asarray(a @ a.T / 3 + np.eye(3)), jnp.asarray(rng.normal(size=3)))
    w = jnp.asarray(rng.normal(size=3) * 0.5)
    args = (_quartic_loss, w, batch, jax.random.key(2))
    opts = dict(perturbation=kernels.Perturbation("gaussian", 0.5), num_probes=2)
    blocks = MonteCarloBlocks(kernels.perturbed_hessian_traces, *args, **opts)
    ck = tmp_path / "traces.json"
    first = run_blocks(blocks, max_samples=40, block_size=16, checkpoint=ck, handle_signals=False)
    assert (first.reason, first.num_samples) == ("max_samples", 40)
    assert load_checkpoint(ck)["state"].kept[0].shape == (40,)
    one = kernels.perturbed_hessian_traces(*args, **opts, num_samples=first.num_samples)
    np.testing.assert_allclose(first.stderr, float(one.average.stderr), rtol=1e-9)
    target = 0.6 * first.stderr  # about (1 / 0.6)^2 times the samples: a few more blocks
    resumed = run_blocks(blocks, target_stderr=target, min_samples=48, block_size=16,
                         checkpoint=ck, handle_signals=False)  # fmt: skip
    assert resumed.reason == "target"
    assert (resumed.num_samples - 40) % 16 == 0
    assert resumed.num_samples > 48
    assert resumed.stderr <= target
    one = kernels.perturbed_hessian_traces(*args, **opts, num_samples=resumed.num_samples)
    got = resumed.estimate
    np.testing.assert_array_equal(np.asarray(got.traces.mean), np.asarray(one.traces.mean))
    np.testing.assert_array_equal(np.asarray(got.traces.stderr), np.asarray(one.traces.stderr))
    for value in (float(got.average.mean), resumed.mean):
        np.testing.assert_allclose(value, float(one.average.mean), rtol=1e-12)
    for value in (float(got.average.stderr), resumed.stderr):
        np.testing.assert_allclose(value, float(one.average.stderr), rtol=1e-9)


def test_slq_nodes_run_on_the_stream_of_rayleigh_quotients():
    """A result without an Estimate: the run reports the stream's mean, an estimate of tr A / n."""
    rng = np.random.default_rng(5)
    m = rng.normal(size=(5, 5))
    a = jnp.asarray(m @ m.T)
    blocks = MonteCarloBlocks(kernels.slq_nodes, lambda v: a @ v, 5, jax.random.key(1),
                              num_steps=5)  # fmt: skip
    run = run_blocks(blocks, max_samples=48, block_size=16, handle_signals=False)
    one = kernels.slq_nodes(lambda v: a @ v, 5, jax.random.key(1), num_samples=48, num_steps=5)
    np.testing.assert_array_equal(np.asarray(run.estimate.nodes), np.asarray(one.nodes))
    np.testing.assert_array_equal(np.asarray(run.estimate.weights), np.asarray(one.weights))
    rayleigh = np.sum(np.asarray(one.nodes) * np.asarray(one.weights), axis=1)
    np.testing.assert_allclose(run.mean, rayleigh.mean(), rtol=1e-12)
    np.testing.assert_allclose(run.stderr, rayleigh.std(ddof=1) / np.sqrt(48), rtol=1e-9)

    # probe p's v^T A v / |v|^2, v the Rademacher start of its Lanczos run (the first half of
    # the split of sample_key(key, p))
    def start(p):
        k = jax.random.split(kernels.parallel.sample_key(jax.random.key(1), p))[0]
        return np.asarray(sign_vector(k, 5, jnp.float64))

    signs = [start(p) for p in range(48)]
    want = [s @ np.asarray(a) @ s / 5 for s in signs]
    np.testing.assert_allclose(rayleigh, want, rtol=1e-9)


def test_a_burst_of_signals_cannot_cut_the_stop_short(tmp_path, monkeypatch, sigint_default):
    # a third signal while the second one's checkpoint was written raised out of the stop
    from jaxbounds import _atomic, longrun

    blocks = _linear_blocks()
    ck = tmp_path / "run.json"
    real = longrun.write_json_atomic

    def write_in_a_burst(path, value):
        with _atomic.critical_section():
            os.kill(os.getpid(), signal.SIGINT)  # the third, fourth, ... signal
            return real(path, value)

    def burst(progress):
        if progress.num_samples == 64:
            monkeypatch.setattr(longrun, "write_json_atomic", write_in_a_burst)
            os.kill(os.getpid(), signal.SIGINT)  # the first: stop after this block
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once

    run = run_blocks(blocks, max_samples=10_000, block_size=32, checkpoint=ck, callback=burst)
    assert (run.reason, run.signal, run.num_samples) == ("interrupted", signal.SIGINT, 64)
    assert load_checkpoint(ck)["state"].ranges == ((0, 64),)


def test_a_calibration_cut_short_is_calibrated_again(tmp_path, sigint_default):
    # a stop during the calibration saved its first block size (16) for every resumed run
    blocks = _linear_blocks()
    ck = tmp_path / "run.json"

    def stop_at_once(progress):
        if progress.num_samples == 16:
            os.kill(os.getpid(), signal.SIGINT)

    first = run_blocks(blocks, max_samples=3000, checkpoint=ck, callback=stop_at_once)
    assert (first.reason, first.num_samples) == ("interrupted", 16)
    saved = load_checkpoint(ck)
    assert saved["block_size"] is None  # no block size measured
    reports = []
    resumed = run_blocks(blocks, max_samples=3000, checkpoint=ck, callback=reports.append)
    assert reports[0].calibrating  # the resumed run calibrates again
    assert max(r.block_size for r in reports) > 16
    assert resumed.calibration_seconds >= saved["calibration_seconds"]
    one = kernels.rademacher_linear(*blocks.args, **blocks.kwargs, num_samples=3000)
    assert resumed.num_samples == 3000
    np.testing.assert_allclose(float(resumed.estimate.mean), float(one.mean), rtol=1e-12)
    np.testing.assert_allclose(float(resumed.estimate.stderr), float(one.stderr), rtol=1e-10)


def test_the_calibration_stays_within_the_largest_block(monkeypatch):
    from jaxbounds import longrun

    monkeypatch.setattr(longrun, "MAX_BLOCK_SIZE", 64)
    reports = []
    got = run_blocks(_linear_blocks(), max_samples=1000, block_seconds=100.0,
                     callback=reports.append, handle_signals=False)  # fmt: skip
    assert got.num_samples == 1000
    assert max(r.block_size for r in reports) == 64
    assert got.block_size == 64


def test_tiny_targets_saturate_the_samples_needed():
    # (stderr / 1e-160) ** 2 overflowed a float: OverflowError from the calibration and the ETA
    reports = []
    got = run_blocks(_linear_blocks(), target_stderr=1e-300, max_samples=600,
                     callback=reports.append, handle_signals=False)  # fmt: skip
    assert (got.reason, got.num_samples) == ("max_samples", 600)
    assert all(r.eta is not None and r.eta > 0 for r in reports[1:])


def test_checkpoint_errors_are_value_errors_naming_the_file(tmp_path):
    from jaxbounds.longrun import CheckpointError

    blocks = _linear_blocks()
    ck = tmp_path / "run.json"
    run_blocks(blocks, max_samples=64, block_size=32, checkpoint=ck, handle_signals=False)
    data = json.loads(ck.read_text())
    del data["state"]
    ck.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="holds no state") as info:
        run_blocks(blocks, max_samples=128, block_size=32, checkpoint=ck, handle_signals=False)
    assert isinstance(info.value, ValueError)
    assert info.value.path == ck


def test_a_stop_asked_before_the_run_stops_it_after_one_block(tmp_path, sigint_default):
    # the command line holds signals from before the run to the end of its writes (a hold guard
    # never raises); a stop asked there before the run's own guard is in place is not lost
    from jaxbounds._atomic import SignalGuard

    ck = tmp_path / "run.json"
    with SignalGuard(hold=True) as outer:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # held: no Interrupted
        run = run_blocks(_linear_blocks(), max_samples=10_000, checkpoint=ck)
    assert outer.requested == signal.SIGINT
    assert (run.reason, run.signal, run.num_samples) == ("interrupted", signal.SIGINT, 16)
    assert load_checkpoint(ck)["state"].count == 16
