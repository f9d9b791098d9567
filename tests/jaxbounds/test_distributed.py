"""jaxbounds.distributed: settings checks, one-process fallback, and a real 2-process run.

The 2-process run is launched the way docs/many-machines.md says (the
``JAXBOUNDS_*`` environment variables, the same script twice) and computes the empirical NTK,
which :func:`jaxbounds.models.ntk.empirical_ntk` shards over all global devices.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from jaxbounds import distributed as dist
from tests.kernels.test_multiprocess import multi_envs, run_processes

ENV_NAMES = (dist.ENV_COORDINATOR, dist.ENV_PROCESS_ID, dist.ENV_NUM_PROCESSES)

SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os
    import jaxbounds.distributed as dist

    info = dist.initialize(local_device_count=int(os.environ.get("MP_LOCAL_DEVICES", "1")))
    out = {"info": dataclasses.asdict(info), "again": dist.initialize() == info}
    out["is_initialized"] = dist.is_initialized()
    try:
        dist.initialize(num_processes=info.process_count + 1)
        out["conflict"] = None
    except ValueError as err:
        out["conflict"] = str(err)

    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jaxbounds.models.ntk import empirical_ntk

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 4))
    params = {"w1": rng.normal(size=(4, 5)), "w2": rng.normal(size=(5,))}

    def apply(p, xs):
        return jnp.tanh(xs @ p["w1"]) @ p["w2"]

    # 10 examples in tiles of 3: 4 tiles, 10 tile pairs over 4 devices (padded to 12)
    gram = jax.jit(lambda p, xs: empirical_ntk(apply, p, xs, tile_size=3))(params, x)
    assert gram.sharding.is_fully_replicated, gram.sharding
    out["ntk"] = np.asarray(gram.addressable_data(0)).tolist()
    out["share"] = dist.process_share(list(range(7)))
    dist.shutdown()
    out["after_shutdown"] = dist.is_initialized()
    print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def runs():
    envs = [{**env, "MP_LOCAL_DEVICES": "2"} for env in multi_envs(2, *ENV_NAMES)]
    *multi, single = run_processes(SCRIPT, [*envs, {}])  # the reference runs alongside
    return single, multi


def test_layout_from_the_environment(runs):
    single, multi = runs
    assert single["info"] == dict(
        process_index=0, process_count=1, local_device_count=1, global_device_count=1
    )
    for index, result in enumerate(multi):
        assert result["info"] == dict(
            process_index=index, process_count=2, local_device_count=2, global_device_count=4
        )
    for result in [single, *multi]:
        assert result["again"] is True  # a second call returns the running layout
        assert result["after_shutdown"] is False
    assert single["is_initialized"] is False  # one process: no distributed runtime
    assert all(result["is_initialized"] is True for result in multi)


def test_conflicting_second_call(runs):
    single, multi = runs
    for result in [single, *multi]:
        assert "num_processes" in result["conflict"], result["conflict"]


def test_process_shares_partition_the_units(runs):
    single, multi = runs
    assert single["share"] == list(range(7))
    assert [result["share"] for result in multi] == [[0, 2, 4, 6], [1, 3, 5]]


def test_empirical_ntk_on_two_processes(runs):
    single, (first, second) = runs
    assert first["ntk"] == second["ntk"]  # every process holds the same replicated Gram matrix
    # each tile pair is the same program on 1 or 4 devices: float64 agreement to rounding
    np.testing.assert_allclose(first["ntk"], single["ntk"], rtol=1e-12, atol=1e-14)


FRESH = textwrap.dedent(
    """
    import json
    import jaxbounds.distributed as dist

    out = {}
    try:  # a partial configuration: no process count or id, and no cluster to supply them
        dist.initialize("127.0.0.1:1")
    except ValueError as err:
        out["partial"] = str(err)
    info = dist.initialize(local_device_count=3)  # alone, with 3 forced CPU devices
    out["alone"] = [info.process_index, info.process_count, info.local_device_count]
    for name, call in {
        "recount": lambda: dist.initialize(local_device_count=2),
        "conflict": lambda: dist.initialize("127.0.0.1:1", 2, 0),
    }.items():
        try:
            call()
        except ValueError as err:
            out[name] = str(err)
    dist._alone = None  # as if JAX had computed before the first call to initialize
    try:
        dist.initialize("127.0.0.1:1", 2, 0)
    except RuntimeError as err:
        out["late"] = str(err)
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_one_fresh_process():
    (out,) = run_processes(FRESH, [{}])
    assert "num_processes (argument or JAXBOUNDS_NUM_PROCESSES)" in out["partial"]
    assert "process_id (argument or JAXBOUNDS_PROCESS_ID)" in out["partial"]
    assert "coordinator_address" not in out["partial"].split(" not given")[0]
    assert out["alone"] == [0, 1, 3]
    assert out["recount"].startswith("local_device_count: JAX already runs with 3 local devices")
    assert out["conflict"].startswith("num_processes: this program already runs as 1 process")
    assert out["late"].startswith("initialize: could not start the distributed runtime")


# ------------------------------------------------------------------ checks made before JAX runs


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(coordinator_address="127.0.0.1"), "coordinator_address"),
        (dict(coordinator_address="127.0.0.1:0"), "coordinator_address"),
        (dict(coordinator_address="127.0.0.1:port"), "coordinator_address"),
        (dict(coordinator_address=":1234"), "coordinator_address"),
        (dict(coordinator_address=1234), "coordinator_address"),
        (dict(num_processes=0), "num_processes"),
        (dict(num_processes=True), "num_processes"),
        (dict(num_processes=2.0), "num_processes"),
        (dict(process_id=-1), "process_id"),
        (dict(num_processes=2, process_id=2), "process_id: must be < num_processes = 2"),
        (dict(num_processes=1, process_id=1), "process_id"),
        (dict(local_device_count=0), "local_device_count"),
        (dict(local_device_count="2"), "local_device_count"),
    ],
)
def test_bad_arguments_are_named(clean_env, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dist.initialize(**kwargs)


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (dist.ENV_NUM_PROCESSES, "two", r"num_processes \(from JAXBOUNDS_NUM_PROCESSES='two'\)"),
        (dist.ENV_PROCESS_ID, "-3", r"process_id \(from JAXBOUNDS_PROCESS_ID='-3'\)"),
        (dist.ENV_COORDINATOR, "host", r"coordinator_address \(from JAXBOUNDS_COORDINATOR="),
    ],
)
def test_bad_environment_is_named(clean_env, name, text, match):
    clean_env.setenv(name, text)
    with pytest.raises(ValueError, match=match):
        dist.initialize()


def test_one_process_in_a_running_jax(clean_env):
    info = dist.initialize(num_processes=1)
    assert info == dist.ProcessInfo(0, 1, 1, 1)
    assert info.is_main
    assert dist.initialize() == info
    assert not dist.is_initialized()
    dist.shutdown()  # alone: nothing to leave


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_process_share_partitions(count):
    items = [f"unit{i}" for i in range(11)]
    shares = [dist.process_share(items, process_index=i, process_count=count) for i in range(count)]
    assert sorted(item for share in shares for item in share) == sorted(items)
    assert sum(len(share) for share in shares) == len(items)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert shares[0][0] == "unit0"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(process_index=2, process_count=2), "process_index"),
        (dict(process_index=-1, process_count=2), "process_index"),
        (dict(process_index=0, process_count=0), "process_count"),
        (dict(process_index=0, process_count=True), "process_count"),
    ],
)
def test_process_share_bad_layout(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dist.process_share(range(3), **kwargs)
