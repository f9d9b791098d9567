"""Kernels on sharded models: every family on a user's mesh gives its unsharded value.

``tests/kernels/sharded_checks.py`` runs in one subprocess with 8 forced CPU devices (XLA_FLAGS
must be set before jax starts): a 2-layer MLP placed tensor-parallel (``w1`` ``P(None,
"model")``, ``w2`` ``P("model", None)``) or FSDP-style (the largest axis of each matrix) on a
``(8,)`` mesh (every axis holds parameters: samples sequential) and a ``(2, 4)`` mesh
(``data``, ``model``/``fsdp``, the batch on ``data``, samples on ``data``), against the same
kernel on unplaced arrays in the same process. A core set runs on every mesh, eagerly and under
``jax.jit``; every other family runs eagerly on the tensor-parallel ``(2, 4)`` mesh
(every family on every mesh, both ways, with ``SHARDED_FULL=1``: the slow test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "kernels" / "sharded_checks.py"
sys.path.insert(0, str(SCRIPT.parent))
import sharded_checks  # noqa: E402  (names only: jax starts in the subprocess)

# float64 throughout: the placed programs differ from the unplaced ones only by the order of
# the reductions that GSPMD splits over devices (measured <= 1e-14 relative)
RTOL, ATOL = 1e-10, 1e-12


def run_checks(num_devices: int, full: bool = False) -> dict:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={num_devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("SHARDED_CONFIGS", None)
    env["SHARDED_FULL"] = "1" if full else "0"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module")
def results():
    return run_checks(8)


def close(got, want):
    assert isinstance(got, list), got  # an error message otherwise
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=RTOL, atol=ATOL)


CASES = [
    (config, name, mode)
    for config in sharded_checks.ALL_CONFIGS
    for name in sharded_checks.calls()
    if config == sharded_checks.FULL_CONFIG or name in sharded_checks.CORE
    for mode in sharded_checks.modes(name, full=False)
]


@pytest.mark.parametrize(("config", "name", "mode"), CASES)
def test_sharded_equals_unsharded(results, config, name, mode):
    assert results["device_count"] == 8
    close(results["configs"][config][name][mode], results["reference"][name])


@pytest.mark.parametrize("config", sorted(sharded_checks.ALL_CONFIGS))
@pytest.mark.parametrize("name", sorted(sharded_checks.PARAM_SHAPED))
def test_parameter_shaped_outputs_keep_the_sharding(results, config, name):
    kept = results["configs"][config][name]["eager_kept"]
    assert kept == {"w1": True, "b1": True, "w2": True}


def test_samples_axes(results):
    axes = {config: record["samples_axes"] for config, record in results["configs"].items()}
    assert axes == {
        "tp_8": [],  # every axis holds parameters: the samples run sequentially
        "fsdp_8": [],
        "tp_2x4": ["data"],  # the axis the parameters leave free (the batch's axis)
        "fsdp_2x4": ["data"],
        "tp_2x4_named": ["data"],
        "replicated_2x4": ["data", "model"],
    }


def test_samples_axis_errors(results):
    errors = results["errors"]
    assert errors["missing_axis"] == (
        "samples: the mesh has no axis 'batch' (its axes: ('data', 'model'))"
    )
    for case in ("param_axis", "param_axis_jit_explicit"):
        assert errors[case].startswith("samples: axis 'model' holds parameters"), errors[case]


@pytest.fixture(scope="module")
def full_results():
    return run_checks(8, full=True)


@pytest.mark.slow
def test_every_family_on_every_mesh(full_results):
    full = full_results
    for _config, record in full["configs"].items():
        for name in sharded_checks.calls():
            for mode in ("eager", "jit"):
                close(record[name][mode], full["reference"][name])


MULTI_CONFIGS = ("tp_2x4", "fsdp_8")


@pytest.fixture(scope="module")
def multi():
    from test_multiprocess import multi_envs, run_processes

    envs = multi_envs(2, "MP_COORDINATOR", "MP_PROCESS_ID")
    envs = [{**env, "MP_MODE": "multi", "SHARDED_CONFIGS": ",".join(MULTI_CONFIGS)} for env in envs]
    return run_processes(SCRIPT.read_text(), envs, timeout=1200)


@pytest.mark.slow  # two 4-device processes compile every core kernel: ~1.5 min of 2 cores
@pytest.mark.parametrize("config", MULTI_CONFIGS)
def test_two_processes_equal_one_process(results, multi, config):
    # 2 processes x 4 CPU devices, the mesh spanning both: every process gets the numbers of
    # one process with 8 devices (the core kernels, eager and under jit)
    assert [(r["process_count"], r["device_count"]) for r in multi] == [(2, 8), (2, 8)]
    for result in multi:
        for name in sharded_checks.CORE:
            for mode in ("eager", "jit"):
                close(result["configs"][config][name][mode], results["configs"][config][name][mode])
        assert (
            result["configs"][config]["samples_axes"] == results["configs"][config]["samples_axes"]
        )


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_lanczos_on_explicit_axes(results, mode):
    # sharding in types (an Explicit mesh from jax.make_mesh): the basis and probes leaf by leaf
    # are placed with reshard, and each contraction names its output's layout
    record = results["explicit"]["top_eigenvalues"]
    close(record[mode], record["reference"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_hutchpp_on_explicit_axes(full_results, mode):
    record = full_results["explicit"]["hutchpp"]
    close(record[mode], record["reference"])


def _elements(shape: str) -> int:
    dims = shape[shape.index("[") + 1 : -1]
    return int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1


def test_probe_gathers_no_parameter(results):
    # a 4-way model-sharded Hutchinson probe all-gathers no operand of a parameter's size (or
    # larger) beyond what the model's own gradient program gathers
    found = results["gathers"]
    smallest = min(found["param_sizes"])
    allowed = sorted(s for s in found["grad"] if _elements(s) >= smallest)
    for chunk in ("probe_chunk1", "probe_chunk2"):
        big = sorted(s for s in found[chunk] if _elements(s) >= smallest)
        assert all(big.count(s) <= allowed.count(s) for s in big), (chunk, big, allowed)


def _no_gather_beyond_a_leaf(record: dict, families) -> None:
    """No all-gather of a compiled kernel holds more elements than the largest parameter leaf."""
    largest = record["largest_leaf"]
    assert largest < record["num_params"]  # a gather of the flat vector would be caught
    for name in families:
        found = record[name]
        assert isinstance(found, list), (name, found)  # an error message otherwise
        big = [s for s in found if _elements(s) > largest]
        assert not big, (name, big, largest)


def _no_leaf_gathered(record: dict, families) -> None:
    """No all-gather of a leaf's size (the smallest leaf's) or more beyond the gradient's own."""
    smallest = record["smallest_leaf"]
    allowed = sorted(s for s in record["grad"] if _elements(s) >= smallest)
    for name in families:
        big = sorted(s for s in record[name] if _elements(s) >= smallest)
        assert all(big.count(s) <= allowed.count(s) for s in big), (name, big, allowed)


def test_fsdp_bases_and_perturbations_gather_no_parameter(results):
    # 8-way FSDP (every leaf split): the Lanczos basis and the Hutch++ sketch are held, and
    # average and worst-case sharpness's perturbations drawn, leaf by leaf where the parameters
    # live; the compiled programs gather no leaf (the flat bases gathered each leaf, Hutch++ its
    # whole sketch: f32[1600,2])
    record = results["fsdp_gathers"]["mlp"]
    _no_gather_beyond_a_leaf(record, sharded_checks.FSDP_FAST)
    _no_leaf_gathered(record, sharded_checks.FSDP_FAST)


@pytest.mark.slow  # every family compiled for the MLP and the tiny decoder: minutes on 2 cores
@pytest.mark.parametrize("model", ["mlp", "decoder"])
def test_fsdp_every_family_gathers_no_more_than_a_leaf(full_results, model):
    families = list(sharded_checks.fsdp_kernels(None, None, None))
    record = full_results["fsdp_gathers"][model]
    _no_gather_beyond_a_leaf(record, families)
    if model == "mlp":  # whose gradient gathers nothing: the curvature kernels gather no leaf
        flat = sharded_checks.FSDP_UNPACKED_SIGNS
        _no_leaf_gathered(record, [f for f in families if f not in flat])
