"""Chunked and sharded maps over Monte Carlo samples, and streaming sample statistics."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels._checks import check_that
from kernels.parallel import map_chunked, map_samples, num_leading, sample_statistics


def per_sample(key):
    """A per-sample function with a pytree output, as the kernels use."""
    x = jax.random.normal(key, (3,))
    return {"sum": jnp.sum(x), "sq": x**2}


def stat_sample(key):
    """A vector sample for sample_statistics: several quantities stacked."""
    x = jax.random.normal(key, (3,))
    return jnp.concatenate([x, jnp.sum(x**2)[None]])


def loop_reference(fn, key, num):
    """The statistics by a Python loop over the fold_in keys."""
    ys = np.stack([np.asarray(fn(jax.random.fold_in(key, i))) for i in range(num)])
    finite = np.all(np.isfinite(ys.reshape(num, -1)), axis=1)
    return ys.mean(axis=0), ((ys - ys.mean(axis=0)) ** 2).sum(axis=0), int(np.sum(~finite))


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 7, 11])
def test_map_chunked_equals_a_python_loop(run, chunk_size):
    keys = jax.random.split(jax.random.key(0), 7)
    got = run(lambda: map_chunked(per_sample, keys, chunk_size=chunk_size))
    want = [per_sample(k) for k in keys]
    np.testing.assert_allclose(got["sum"], [w["sum"] for w in want], rtol=1e-14)
    np.testing.assert_allclose(got["sq"], np.stack([w["sq"] for w in want]), rtol=1e-14)


def test_map_samples_one_device_is_map_chunked():
    keys = jax.random.split(jax.random.key(1), 5)
    got = map_samples(per_sample, keys, chunk_size=2, devices=jax.devices()[:1])
    want = map_chunked(per_sample, keys, chunk_size=2)
    np.testing.assert_array_equal(got["sq"], want["sq"])


def test_pytree_inputs_and_vmap_over_the_map():
    xs = {"a": jnp.arange(6.0), "b": jnp.arange(12.0).reshape(6, 2)}
    out = map_samples(lambda x: x["a"] * jnp.sum(x["b"]), xs, chunk_size=4)
    np.testing.assert_allclose(out, np.arange(6.0) * np.arange(12.0).reshape(6, 2).sum(1))
    batched = jax.vmap(lambda s: map_chunked(lambda x: s * x, jnp.arange(5.0), chunk_size=2))(
        jnp.array([1.0, 2.0])
    )
    np.testing.assert_allclose(batched, [np.arange(5.0), 2 * np.arange(5.0)])


@pytest.mark.parametrize("chunk_size", [0, -2, True, 2.5, "4"])
def test_bad_chunk_size_raises(chunk_size):
    with pytest.raises(ValueError, match=r"^chunk_size"):
        map_chunked(jnp.sin, jnp.arange(3.0), chunk_size=chunk_size)
    with pytest.raises(ValueError, match=r"^chunk_size"):
        map_samples(jnp.sin, jnp.arange(3.0), chunk_size=chunk_size)
    with pytest.raises(ValueError, match=r"^chunk_size"):
        sample_statistics(
            stat_sample, jax.random.key(0), num_samples=3, chunk_size=chunk_size
        )


def test_none_is_one_at_a_time():
    """chunk_size=None is a sequential lax.map: the jaxpr maps one element per step."""
    jaxpr = str(jax.make_jaxpr(lambda xs: map_chunked(jnp.sin, xs))(jnp.arange(6.0)))
    assert "scan" in jaxpr
    assert "length=6" in jaxpr
    vectorised = str(jax.make_jaxpr(lambda xs: map_chunked(jnp.sin, xs, chunk_size=6))(
        jnp.arange(6.0)
    ))
    assert "scan" not in vectorised


def _batch_counter():
    """``(f, calls)``: the identity on a scalar, recording in ``calls`` each time it is vmapped."""
    calls = []

    @jax.custom_batching.custom_vmap
    def f(x):
        return x

    @f.def_vmap
    def _rule(axis_size, in_batched, x):
        calls.append(axis_size)
        return x, in_batched[0]

    return f, calls


@pytest.mark.parametrize("num", [1, 5])
def test_one_at_a_time_never_vmaps(num):
    """chunk_size None / 1, or a single element, runs the function unbatched (no size-1
    vmap: batching a perturbed model's weights turns its matmuls into batched ones, much
    slower on CPU); larger chunks vectorise."""
    f, calls = _batch_counter()
    xs = jnp.arange(float(num))
    for chunk_size in (None, 1):
        np.testing.assert_array_equal(map_chunked(f, xs, chunk_size=chunk_size), xs)
        stats = sample_statistics(
            lambda k: f(jax.random.uniform(k)), jax.random.key(0), num_samples=num,
            chunk_size=chunk_size,
        )  # fmt: skip
        assert int(stats.count) == num
    np.testing.assert_array_equal(map_chunked(f, xs[:1], chunk_size=4), xs[:1])
    assert calls == []
    map_chunked(f, jnp.arange(4.0), chunk_size=2)
    sample_statistics(lambda k: f(jax.random.uniform(k)), jax.random.key(0), num_samples=4,
                      chunk_size=2)  # fmt: skip
    assert calls == [2, 2]


def test_single_element_matches_lax_map():
    """One element is a plain call; its output (keys, Python scalars, pytrees) is what
    ``lax.map`` gives."""
    keys = jax.random.split(jax.random.key(2), 1)
    split = map_chunked(lambda k: jax.random.split(k), keys)
    want = jax.lax.map(lambda k: jax.random.split(k), keys)
    np.testing.assert_array_equal(jax.random.key_data(split), jax.random.key_data(want))
    fn = lambda x: {"a": 2 * x, "b": (x, 3)}  # noqa: E731
    got, ref = map_chunked(fn, jnp.ones(1), chunk_size=8), jax.lax.map(fn, jnp.ones(1))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref), strict=True):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"^xs"):
        num_leading({"a": jnp.ones(3), "b": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"^xs"):
        num_leading({})
    assert num_leading((jnp.ones((4, 2)), jnp.ones(4))) == 4


@pytest.mark.parametrize("num", [1, 2, 7, 20])
def test_sample_statistics_equals_a_python_loop(run, num):
    key = jax.random.key(3)
    stats = run(lambda: sample_statistics(stat_sample, key, num_samples=num, chunk_size=3))
    mean, m2, bad = loop_reference(stat_sample, key, num)
    assert int(stats.count) == num
    assert stats.num_samples == num
    assert int(stats.num_nonfinite) == bad == 0
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(stats.m2, m2, rtol=1e-10, atol=1e-13)


def test_sample_statistics_estimate():
    key = jax.random.key(4)
    stats = sample_statistics(stat_sample, key, num_samples=9, chunk_size=4)
    est = stats.estimate(num_evaluations=18)
    mean, m2, _ = loop_reference(stat_sample, key, 9)
    np.testing.assert_allclose(est.mean, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(est.stderr, np.sqrt(m2 / 8 / 9), rtol=1e-10)
    assert est.num_samples == 9
    assert est.num_evaluations == 18


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 7, 13, 40])
def test_sample_statistics_chunk_invariance(chunk_size):
    key = jax.random.key(5)
    ref = sample_statistics(stat_sample, key, num_samples=13, chunk_size=1)
    got = sample_statistics(stat_sample, key, num_samples=13, chunk_size=chunk_size)
    np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got.m2, ref.m2, rtol=1e-12, atol=1e-14)
    assert int(got.count) == 13


def test_sample_statistics_device_count_invariance():
    key = jax.random.key(6)
    one = sample_statistics(stat_sample, key, num_samples=11, chunk_size=2,
                            devices=jax.devices()[:1])  # fmt: skip
    every = sample_statistics(stat_sample, key, num_samples=11, chunk_size=2)
    np.testing.assert_allclose(every.mean, one.mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(every.m2, one.m2, rtol=1e-12, atol=1e-14)
    for num_dev in range(2, len(jax.devices()) + 1):  # forced host devices, when available
        part = sample_statistics(stat_sample, key, num_samples=11, chunk_size=2,
                                 devices=jax.devices()[:num_dev])  # fmt: skip
        np.testing.assert_allclose(part.mean, one.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(part.m2, one.m2, rtol=1e-12, atol=1e-14)
    # four forced devices in a subprocess: tested with map_samples below


def nan_sometimes(key):
    """NaN for about 30% of the keys, else a normal draw."""
    k1, k2 = jax.random.split(key)
    return jnp.where(jax.random.uniform(k1) < 0.3, jnp.nan, jax.random.normal(k2))


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_sample_statistics_counts_nonfinite_samples(run, chunk_size):
    key = jax.random.key(7)
    stats = run(lambda: sample_statistics(nan_sometimes, key, num_samples=30,
                                          chunk_size=chunk_size))  # fmt: skip
    _, _, bad = loop_reference(nan_sometimes, key, 30)
    assert 0 < bad < 30
    assert int(stats.num_nonfinite) == bad
    assert np.isnan(float(stats.mean))  # a NaN sample never disappears from the mean
    inf_stats = sample_statistics(lambda k: jnp.full((2,), jnp.inf), key, num_samples=3)
    assert int(inf_stats.num_nonfinite) == 3
    with pytest.raises(ValueError, match="non-finite at 3 of the 3"):
        check_that(inf_stats.num_nonfinite == 0, "fn: non-finite at {} of the 3 samples",
                   inf_stats.num_nonfinite)  # fmt: skip


def test_sample_statistics_bad_arguments():
    with pytest.raises(ValueError, match=r"^num_samples"):
        sample_statistics(stat_sample, jax.random.key(0), num_samples=0)
    with pytest.raises(ValueError, match=r"^key"):
        sample_statistics(stat_sample, 0, num_samples=3)
    with pytest.raises(ValueError, match=r"^fn: must return a floating"):
        sample_statistics(lambda k: jnp.int32(1), jax.random.key(0), num_samples=3)


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[1])
    from tests.kernels.test_parallel import per_sample, stat_sample
    from kernels.parallel import map_samples, sample_statistics
    assert len(jax.devices()) == 4, jax.devices()
    keys = jax.random.split(jax.random.key(2), 10)  # 10 is not a multiple of 4: padding
    out = {}
    for chunk in (None, 1, 2):
        res = map_samples(per_sample, keys, chunk_size=chunk)
        out[str(chunk)] = {k: v.tolist() for k, v in res.items()}
    res = jax.jit(lambda k: map_samples(per_sample, k, chunk_size=3))(keys)
    out["jit"] = {k: v.tolist() for k, v in res.items()}
    for chunk in (None, 2, 3):  # 13 samples over 4 devices: uneven shares, padding chunks
        stats = sample_statistics(stat_sample, jax.random.key(8), num_samples=13,
                                  chunk_size=chunk)
        out[f"stats{chunk}"] = [stats.mean.tolist(), stats.m2.tolist(), int(stats.count)]
    print(json.dumps(out))
    """
)


def test_sharded_over_four_devices_equals_single_device():
    """map_samples and sample_statistics on four forced host devices equal one device."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED, root],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sharded = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = jax.random.split(jax.random.key(2), 10)
    want = map_chunked(per_sample, keys, chunk_size=1)
    for variant in ("None", "1", "2", "jit"):
        for name in ("sum", "sq"):
            np.testing.assert_allclose(sharded[variant][name], want[name], rtol=1e-14)
    ref = sample_statistics(stat_sample, jax.random.key(8), num_samples=13, chunk_size=1)
    for chunk in ("None", "2", "3"):
        mean, m2, count = sharded[f"stats{chunk}"]
        assert count == 13
        np.testing.assert_allclose(mean, ref.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(m2, ref.m2, rtol=1e-12, atol=1e-14)
