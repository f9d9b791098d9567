"""Sharded Monte Carlo: 4 forced host devices give the single-device results for the same key.

The 4-device configuration runs in a fresh subprocess (XLA_FLAGS must be set before jax starts);
the single-device reference runs the same script in the test's own process.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import kernels

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from kernels import norms, rademacher as rad
    from kernels.parallel import map_samples

    out = {"num_devices": len(jax.devices())}
    key = jax.random.key(7)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(50, 6)))
    # 37 draws in chunks of 5: 8 chunks, padded to a multiple of the device count
    for name, kw in {
        "linear_l2": dict(norm=2, radius=1.0, num_samples=37, chunk_size=5),
        "linear_l1": dict(norm=1, radius=2.0, num_samples=64, chunk_size=16),
        "linear_matrix": dict(norm=(2, 1), radius=1.0, num_samples=30, chunk_size=3,
                              readout=jnp.arange(1.0, 4.0)),
    }.items():
        e = rad.rademacher_linear(x, key, **kw)
        out[name] = [float(e.mean), float(e.stderr), float(e.lower), float(e.upper)]
    e = jax.jit(lambda k: rad.rademacher_linear(x.astype(jnp.float32), k, norm=2, radius=1.0,
                                                num_samples=40, chunk_size=4))(key)
    out["linear_f32_jit"] = [float(e.mean), float(e.stderr)]
    v = jnp.asarray(rng.normal(size=(23, 50)))
    e = rad.rademacher_finite(lambda i, b: b[i], v, key, num_samples=21, num_members=23,
                              member_chunk_size=5, chunk_size=4)
    out["finite"] = [float(e.mean), float(e.stderr), float(e.upper)]
    e = rad.rademacher_search(lambda w, xs: jnp.tanh(xs @ w), jnp.full(6, 0.1), x, key,
                              project=lambda w: norms.project_lp_ball(w, p=2, radius=1.0),
                              num_samples=12, num_steps=5, step_size=1.0, num_restarts=2,
                              chunk_size=3)
    out["search"] = [float(e.mean), float(e.stderr)]
    from kernels import sharpness
    w = jnp.asarray(rng.normal(size=(6,)))
    quad = lambda p, b: 0.5 * jnp.sum(b * p**2) + jnp.sum(jnp.sin(p))
    e = sharpness.average_sharpness(quad, w, jnp.arange(1.0, 7.0), key,
                                    perturbation=sharpness.Perturbation("gaussian", 0.1),
                                    num_samples=13, chunk_size=2)
    out["average_sharpness"] = [float(e.mean), float(e.stderr)]
    # kernels.using_devices: a kernel traced inside the scope shards over its devices only,
    # and one traced after it over all devices again (the scope is in the compilation key)
    from kernels import using_devices

    def scoped_linear():
        e = rad.rademacher_linear(x, key, norm=2, radius=1.0, num_samples=37, chunk_size=5)
        return [float(e.mean), float(e.stderr)], len(e.mean.sharding.device_set)

    with using_devices(jax.devices()[-2:]):
        out["linear_l2_scoped"], scoped = scoped_linear()
    _, after = scoped_linear()
    out["scoped_device_counts"] = [scoped, after]
    keys = jax.random.split(key, 9)
    out["map_samples"] = np.asarray(
        map_samples(lambda k: jax.random.normal(k), keys, chunk_size=2)).tolist()
    print(json.dumps(out))
    """
)


def run_with_devices(num_devices):
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={num_devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_in_this_process():
    """The script on this process's single device (no second JAX start for the reference)."""
    assert jax.device_count() == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out), jax.numpy_dtype_promotion("standard"):
        exec(compile(SCRIPT, "sharding_script", "exec"), {"__name__": "sharding_script"})
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results():
    return run_in_this_process(), run_with_devices(4)


def test_device_counts(results):
    single, sharded = results
    assert single["num_devices"] == 1
    assert sharded["num_devices"] == 4


def test_using_devices_scopes_the_sharding(results):
    single, sharded = results
    assert single["scoped_device_counts"] == [1, 1]
    assert sharded["scoped_device_counts"] == [2, 4]  # 2 in the scope, all 4 after it
    np.testing.assert_allclose(sharded["linear_l2_scoped"], single["linear_l2"][:2], rtol=1e-12)


@pytest.mark.parametrize(
    ("devices", "match"),
    [([], "non-empty"), ("cpu", "sequence of jax devices"), ([0], "non-empty"), (None, "sequence")],
)
def test_using_devices_bad_arguments(devices, match):
    with pytest.raises(ValueError, match=f"devices: .*{match}"), kernels.using_devices(devices):
        pass


def test_using_devices_repeated_device():
    device = jax.devices()[0]
    with pytest.raises(ValueError, match="listed twice"), kernels.using_devices([device, device]):
        pass
    assert kernels.parallel.sample_devices() == jax.devices()  # the scope was not left set


@pytest.mark.parametrize(
    "name",
    [
        "linear_l2",
        "linear_l1",
        "linear_matrix",
        "linear_f32_jit",
        "finite",
        "search",
        "average_sharpness",
        "map_samples",
    ],
)
def test_sharded_equals_single_device(results, name):
    single, sharded = results
    # same chunks, same keys, same per-chunk programs: equal up to the reassociation of the final
    # sum over chunks (a cross-device reduction when sharded): float64 1e-12, float32 a few ulps
    rtol = 1e-6 if name.endswith("f32_jit") else 1e-12
    np.testing.assert_allclose(sharded[name], single[name], rtol=rtol, atol=0)
