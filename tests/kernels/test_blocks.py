"""Blocks of a kernel's sample stream merge into the one-call result (kernels/blocks.py)."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels import norms
from kernels._random import sign_vector
from kernels.blocks import MonteCarloBlocks, MonteCarloState, merge_states
from kernels.sharpness import Perturbation


def _l2_ball(w):
    return norms.project_lp_ball(w, p=2, radius=1.0)


def _linear_fn(w, xs):
    return xs @ w


def _take_rows(idx, v):
    return v[idx]


def _fixed_features(v, xs):
    return xs


def _matvec_of(m):
    return lambda v: m @ v


def _quad_loss(w, batch):
    a, b = batch
    return 0.5 * w @ (a @ w) + b @ w + 0.1 * jnp.sum(w**4)


def _apply(params, x):
    return x @ params["w"] + params["b"][None, :]


def _problem(name, dtype, seed=0):
    """(kernel, args, kwargs) of a small problem of each kernel with a block stream."""
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed + 11)
    x = jnp.asarray(rng.normal(size=(6, 3)), dtype)
    a = rng.normal(size=(4, 4))
    a = jnp.asarray(a @ a.T / 4 + np.eye(4), dtype)
    batch = (a, jnp.asarray(rng.normal(size=4), dtype))
    w = jnp.asarray(rng.normal(size=4) * 0.3, dtype)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)) * 0.5, dtype), "b": jnp.zeros(2, dtype)}
    cls_batch = (x, jnp.asarray(rng.integers(0, 2, size=6), jnp.int32))
    search = dict(num_steps=2, step_size=0.3, delta=None)
    table = {
        "rademacher_linear": (kernels.rademacher_linear, (x, key), dict(norm=2, radius=1.0)),
        "rademacher_finite": (
            kernels.rademacher_finite,
            (_take_rows, jnp.asarray(rng.normal(size=(5, 6)), dtype), key),
            dict(num_members=5),
        ),
        "rademacher_search": (
            kernels.rademacher_search,
            (_linear_fn, jnp.ones(3, dtype) / 2, x, key),
            dict(project=_l2_ball, **search),
        ),
        "rademacher_readout_search": (
            kernels.rademacher_readout_search,
            (_fixed_features, jnp.zeros(1, dtype), x, key),
            dict(project=lambda v: v, readout_norm=2, readout_radius=1.0, **search),
        ),
        "hutchinson_trace": (kernels.hutchinson_trace, (lambda v: batch[0] @ v, w, key), {}),
        "hessian_trace": (kernels.hessian_trace, (_quad_loss, w, batch, key), {}),
        "ggn_trace": (
            kernels.ggn_trace,
            (_apply, params, cls_batch, key),
            dict(loss="cross_entropy"),
        ),
        "mc_fisher_trace": (
            kernels.mc_fisher_trace,
            (_apply, params, cls_batch, key),
            dict(loss="cross_entropy"),
        ),
        "average_sharpness": (
            kernels.average_sharpness,
            (_quad_loss, w, batch, key),
            dict(perturbation=Perturbation("gaussian", 0.1)),
        ),
        "sharpness_decomposition": (
            kernels.sharpness_decomposition,
            (_quad_loss, w, batch, key),
            dict(perturbation=Perturbation("gaussian", 0.1), num_probes=3),
        ),
        "perturbed_hessian_traces": (
            kernels.perturbed_hessian_traces,
            (_quad_loss, w, batch, key),
            dict(perturbation=Perturbation("gaussian", 0.1), num_probes=3),
        ),
        "slq_nodes": (kernels.slq_nodes, (_matvec_of(batch[0]), w, key), dict(num_steps=3)),
        "spectral_density": (
            kernels.spectral_density,
            (_matvec_of(batch[0]), w, key),
            dict(num_steps=3, num_grid=16),
        ),
    }
    return table[name]


KERNELS = [
    "rademacher_linear",
    "rademacher_finite",
    "rademacher_search",
    "rademacher_readout_search",
    "hutchinson_trace",
    "hessian_trace",
    "ggn_trace",
    "mc_fisher_trace",
    "average_sharpness",
    "sharpness_decomposition",
    "perturbed_hessian_traces",
    "slq_nodes",
    "spectral_density",
]


def _one_call(kernel, args, kwargs, count_name, num):
    return kernel(*args, **kwargs, **{count_name: num})


def _leaves(result):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(result)]


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", KERNELS)
def test_blocks_in_any_order_merge_into_the_one_call_result(name, dtype):
    # the merge is under test, not the matmul precision: a GPU's float32 products at JAX's
    # default (TF32) may take another path for a block of 5 sign vectors than for 21 at once
    with jax.default_matmul_precision("highest"):
        _check_blocks_merge_into_the_one_call_result(name, dtype)


def _check_blocks_merge_into_the_one_call_result(name, dtype):
    kernel, args, kwargs = _problem(name, dtype)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    num = 21
    # blocks of sizes 5 and 3 (two programs), computed out of order and merged in two orders
    cuts = [(5, 10), (13, 16), (0, 5), (10, 13), (16, 21)]
    states = [blocks.run(a, b) for a, b in cuts]
    merged = merge_states(*states)
    assert merged.count == num
    assert merged.ranges == ((0, num),)
    other = merge_states(
        merge_states(states[3], states[0]), merge_states(states[4], states[1], states[2])
    )
    got = blocks.estimate(merged)
    got2 = blocks.estimate(other)
    want = _one_call(kernel, args, kwargs, blocks.count_name, num)
    chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
    chex.assert_trees_all_equal_shapes_and_dtypes(got2, want)
    rtol = 1e-12 if dtype == jnp.float64 else 2e-6
    for g, g2, w in zip(_leaves(got), _leaves(got2), _leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())))
        np.testing.assert_allclose(g2, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())))


def test_a_block_compiles_once_for_its_size():
    kernel, args, kwargs = _problem("rademacher_linear", jnp.float32)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    blocks.run(0, 16)
    with jax.log_compiles():
        import logging

        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            for b in range(1, 4):
                blocks.run(16 * b, 16 * (b + 1))
        finally:
            logger.removeHandler(handler)
    compiled = [r for r in records if "Compiling" in r.getMessage()]
    assert compiled == []


def test_blocks_past_2_to_the_32_use_the_64_bit_stream():
    kernel, args, kwargs = _problem("hutchinson_trace", jnp.float64)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    matvec, w, key = args
    start = 2**32 - 3  # a block across the carry into the high word

    def sample(i):  # the probe of sample i: Rademacher signs from sample_key(key, i)
        v = sign_vector(kernels.parallel.sample_key(key, i), w.shape[0], w.dtype)
        return float(v @ matvec(v))

    state = blocks.run(start, start + 6)
    want = [sample(i) for i in range(start, start + 6)]
    np.testing.assert_allclose(float(state.mean), np.mean(want), rtol=1e-12)
    np.testing.assert_allclose(float(state.stderr), np.std(want, ddof=1) / np.sqrt(6), rtol=1e-10)


def test_merging_another_problem_is_refused():
    kernel, args, kwargs = _problem("rademacher_linear", jnp.float64)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    state = blocks.run(0, 8)
    x, key = args
    other_key = MonteCarloBlocks(kernel, x, jax.random.key(999), **kwargs).run(8, 16)
    with pytest.raises(ValueError, match="different problems"):
        merge_states(state, other_key)
    other_inputs = MonteCarloBlocks(kernel, x.at[0, 0].add(1.0), key, **kwargs).run(8, 16)
    with pytest.raises(ValueError, match="different problems"):
        merge_states(state, other_inputs)
    other_option = MonteCarloBlocks(kernel, x, key, norm=1, radius=1.0).run(8, 16)
    with pytest.raises(ValueError, match="different problems"):
        merge_states(state, other_option)
    k2, a2, kw2 = _problem("rademacher_finite", jnp.float64)
    other_kernel = MonteCarloBlocks(k2, *a2, **kw2).run(8, 16)
    with pytest.raises(ValueError, match="kernel 'rademacher_finite'"):
        merge_states(state, other_kernel)
    with pytest.raises(ValueError, match="overlap"):
        merge_states(state, blocks.run(4, 12))
    with pytest.raises(ValueError, match="another problem"):
        MonteCarloBlocks(kernel, x, jax.random.key(999), **kwargs).estimate(state)
    # a matvec closing over another matrix is another problem
    k3, (_, w, key3), kw3 = _problem("hutchinson_trace", jnp.float64)
    a1, a2 = jnp.eye(4, dtype=jnp.float64), 2 * jnp.eye(4, dtype=jnp.float64)
    mine = MonteCarloBlocks(k3, _matvec_of(a1), w, key3, **kw3).run(0, 4)
    same = MonteCarloBlocks(k3, _matvec_of(a1 + 0.0), w, key3, **kw3).run(4, 8)
    assert merge_states(mine, same).count == 8  # equal contents, another closure object
    theirs = MonteCarloBlocks(k3, _matvec_of(a2), w, key3, **kw3).run(4, 8)
    with pytest.raises(ValueError, match="different problems"):
        merge_states(mine, theirs)
    # a different chunk size computes the same stream: its blocks merge
    chunked = MonteCarloBlocks(kernel, x, key, chunk_size=3, **kwargs).run(8, 16)
    assert merge_states(state, chunked).count == 16


def test_bad_arguments_are_refused():
    kernel, args, kwargs = _problem("rademacher_linear", jnp.float64)
    with pytest.raises(ValueError, match=r"num_draws|num_samples"):
        MonteCarloBlocks(kernel, *args, num_draws=10, **kwargs)
    with pytest.raises(ValueError, match="no block stream"):
        MonteCarloBlocks(kernels.rademacher_exact, *args)
    k, a, kw = _problem("hessian_trace", jnp.float64)
    with pytest.raises(ValueError, match="method"):
        MonteCarloBlocks(k, *a, method="hutchpp", **kw)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    for start, stop in [(5, 5), (-1, 3), (0, 2**53 + 1), (0.0, 3)]:
        with pytest.raises(ValueError, match="start"):
            blocks.run(start, stop)
    with pytest.raises(ValueError, match="at least one"):
        merge_states()


def test_state_json_round_trip_is_exact():
    kernel, args, kwargs = _problem("sharpness_decomposition", jnp.float32)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    state = merge_states(blocks.run(0, 5), blocks.run(9, 12))
    back = MonteCarloState.from_json(state.to_json())
    assert back.ranges == ((0, 5), (9, 12))
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype
    with pytest.raises(ValueError, match="data"):
        MonteCarloState.from_json({"kernel": "x"})


_DEVICES_SCRIPT = """
import json, jax, numpy as np
jax.config.update("jax_enable_x64", True)
import kernels
from kernels.blocks import MonteCarloBlocks, merge_states
x = jax.numpy.asarray(np.random.default_rng(0).normal(size=(6, 3)))
key = jax.random.key(5)
blocks = MonteCarloBlocks(kernels.hutchinson_trace, lambda v: x.T @ (x @ v), x[0], key,
                          chunk_size=2)
state = merge_states(blocks.run(13, 40), blocks.run(0, 13))
one = kernels.hutchinson_trace(lambda v: x.T @ (x @ v), x[0], key, num_samples=40, chunk_size=2)
print(json.dumps([len(jax.devices()), float(blocks.estimate(state).mean), float(one.mean),
                  float(state.mean)]))
"""


def test_blocks_sharded_over_devices_equal_one_device():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = []
    for num in (1, 3):
        env = dict(os.environ)
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={num}".strip()
        env["JAX_PLATFORMS"] = "cpu"
        env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
        proc = subprocess.run(
            [sys.executable, "-c", _DEVICES_SCRIPT], env=env, cwd=root, capture_output=True,
            text=True, timeout=600, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    (n1, est1, one1, mean1), (n3, est3, one3, mean3) = out
    assert (n1, n3) == (1, 3)
    for value in (est1, one1, est3, one3, mean3):
        np.testing.assert_allclose(value, mean1, rtol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_a_block_keeps_the_one_call_rows_of_its_samples(dtype):
    kernel, args, kwargs = _problem("perturbed_hessian_traces", dtype)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    want = kernel(*args, **kwargs, num_samples=12)
    state = blocks.run(7, 12)  # perturbation j of the block is perturbation j of the one call
    means, stderrs = state.kept
    np.testing.assert_array_equal(np.asarray(means), np.asarray(want.traces.mean)[7:12])
    np.testing.assert_array_equal(np.asarray(stderrs), np.asarray(want.traces.stderr)[7:12])
    rows = np.asarray(want.traces.mean, np.float64)[7:12]
    rtol = 1e-12 if dtype == jnp.float64 else 2e-6
    np.testing.assert_allclose(float(state.mean), rows.mean(), rtol=rtol)
    np.testing.assert_allclose(
        float(state.stderr), rows.std(ddof=1) / np.sqrt(5), rtol=1e-9 if rtol < 1e-6 else 1e-4
    )
    # SLQ: probe p's nodes and weights, and its stream value sum_j tau_pj theta_pj
    kernel, args, kwargs = _problem("slq_nodes", dtype)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    want = kernel(*args, **kwargs, num_samples=9)
    state = blocks.run(4, 9)
    np.testing.assert_array_equal(np.asarray(state.kept[0]), np.asarray(want.nodes)[4:9])
    np.testing.assert_array_equal(np.asarray(state.kept[1]), np.asarray(want.weights)[4:9])
    rayleigh = np.sum(np.asarray(want.nodes, np.float64) * np.asarray(want.weights), axis=1)
    np.testing.assert_allclose(float(state.mean), rayleigh[4:9].mean(), rtol=rtol)


def test_kept_outputs_round_trip_through_json_and_merge_by_index():
    kernel, args, kwargs = _problem("perturbed_hessian_traces", jnp.float32)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    gappy = merge_states(blocks.run(6, 9), blocks.run(0, 3))
    assert gappy.ranges == ((0, 3), (6, 9))
    back = MonteCarloState.from_json(json.loads(json.dumps(gappy.to_json())))
    for a, b in zip(jax.tree_util.tree_leaves(gappy), jax.tree_util.tree_leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype
    merged = merge_states(blocks.run(3, 6), back)
    got = blocks.estimate(merged)
    want = kernel(*args, **kwargs, num_samples=9)
    np.testing.assert_array_equal(np.asarray(got.traces.mean), np.asarray(want.traces.mean))
    np.testing.assert_array_equal(np.asarray(got.traces.stderr), np.asarray(want.traces.stderr))
    np.testing.assert_allclose(float(got.average.mean), float(want.average.mean), rtol=2e-6)
    assert (got.average.num_samples, got.average.num_evaluations) == (9, 27)
    record = gappy.to_json()
    record["kept"][0]["values"] = record["kept"][0]["values"][:-1]
    record["kept"][0]["shape"] = [5]
    with pytest.raises(ValueError, match="data"):
        MonteCarloState.from_json(record)


def test_kept_streams_refuse_other_problems_and_bad_ranges():
    kernel, args, kwargs = _problem("perturbed_hessian_traces", jnp.float64)
    blocks = MonteCarloBlocks(kernel, *args, **kwargs)
    state = blocks.run(0, 4)
    loss, w, batch, _ = args
    other_key = MonteCarloBlocks(kernel, loss, w, batch, jax.random.key(999), **kwargs)
    with pytest.raises(ValueError, match="different problems"):
        merge_states(state, other_key.run(4, 8))
    other_probes = MonteCarloBlocks(kernel, *args, **{**kwargs, "num_probes": 4})
    with pytest.raises(ValueError, match="different problems"):
        merge_states(state, other_probes.run(4, 8))
    k2, a2, kw2 = _problem("slq_nodes", jnp.float64)
    with pytest.raises(ValueError, match="kernel 'slq_nodes'"):
        merge_states(state, MonteCarloBlocks(k2, *a2, **kw2).run(4, 8))
    with pytest.raises(ValueError, match="overlap"):
        merge_states(state, blocks.run(3, 6))
    with pytest.raises(ValueError, match="num_samples"):
        blocks.estimate(blocks.run(4, 5))  # the kernel needs J >= 2 perturbations
    with pytest.raises(ValueError, match=r"stop: at most 2147483645"):
        blocks.run(2**31 - 4, 2**31)
    with pytest.raises(ValueError, match="num_grid: not an option of slq_nodes"):
        MonteCarloBlocks(k2, *a2, num_grid=8, **kw2)
    k3, a3, kw3 = _problem("spectral_density", jnp.float64)
    with pytest.raises(ValueError, match="num_grid"):
        MonteCarloBlocks(k3, *a3, **{**kw3, "num_grid": 1}).run(0, 2)


def test_kernels_without_a_stream_are_refused_with_the_reason():
    k, (_, w, batch, key), kw = _problem("hessian_trace", jnp.float64)
    with pytest.raises(ValueError, match=r"Hutch\+\+.*whole budget.*hutchinson_trace"):
        MonteCarloBlocks(kernels.hutchpp_trace, lambda v: v, w, key)
    with pytest.raises(ValueError, match=r"method: .*'hutchpp'.*whole budget.*'hutchinson'"):
        MonteCarloBlocks(k, _quad_loss, w, batch, key, method="hutchpp", **kw)
    with pytest.raises(ValueError, match=r"empirical_fisher_trace.*exact"):
        MonteCarloBlocks(kernels.empirical_fisher_trace, _apply, {}, batch)
