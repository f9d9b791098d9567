"""Chunked and sharded maps over Monte Carlo samples."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.parallel import map_chunked, map_samples, num_leading


def per_sample(key):
    """A per-sample function with a pytree output, as the kernels use."""
    x = jax.random.normal(key, (3,))
    return {"sum": jnp.sum(x), "sq": x**2}


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


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"^chunk_size"):
        map_chunked(jnp.sin, jnp.arange(3.0), chunk_size=0)
    with pytest.raises(ValueError, match=r"^xs"):
        num_leading({"a": jnp.ones(3), "b": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"^xs"):
        num_leading({})
    assert num_leading((jnp.ones((4, 2)), jnp.ones(4))) == 4


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[1])
    from tests.kernels.test_parallel import per_sample
    from kernels.parallel import map_samples
    assert len(jax.devices()) == 4, jax.devices()
    keys = jax.random.split(jax.random.key(2), 10)  # 10 is not a multiple of 4: padding
    out = {}
    for chunk in (None, 1, 2):
        res = map_samples(per_sample, keys, chunk_size=chunk)
        out[str(chunk)] = {k: v.tolist() for k, v in res.items()}
    res = jax.jit(lambda k: map_samples(per_sample, k, chunk_size=3))(keys)
    out["jit"] = {k: v.tolist() for k, v in res.items()}
    print(json.dumps(out))
    """
)


def test_sharded_over_four_devices_equals_single_device():
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
