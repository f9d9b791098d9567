"""bench/accelerator.py's CPU smoke mode: every part of the GPU script runs here first.

The GPU run (``python bench/accelerator.py``, at most 8 minutes on one H100) must not die on a
typo: the smoke mode runs every part at tiny sizes (each kernel compiled once, one precision
each, both precisions over the run) and writes the same JSON and table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import accelerator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerator")
    # a generous budget: on a loaded machine no part may be cut (the test checks them all)
    script = [sys.executable, str(ROOT / "bench" / "accelerator.py"), "--smoke"]
    proc = subprocess.run(
        [*script, "--budget", "1200", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    payload = json.loads((out / "accelerator_smoke.json").read_text())
    return payload["records"], (out / "accelerator_smoke.md").read_text()


def _part(records, name):
    return [r for r in records if r.get("part") == name]


def test_smoke_runs_every_part(smoke):
    records, _ = smoke
    assert not [r for r in records if "not_run" in r and r["part"] != "torch"]
    assert _part(records, "device")[0]["platform"] == "cpu"
    scale = [r for r in _part(records, "scale") if "job" in r]
    assert {r["job"] for r in scale} == {"grad", *accelerator._KERNELS}
    assert {r["precision"] for r in scale} == set(accelerator.PRECISIONS)
    for r in scale:
        assert r["run_s"] > 0
        assert r["compile_s"] > 0
        assert r["per_unit_in_grads"] > 0
    rad = _part(records, "rademacher")
    assert next(r["variant"] for r in rad) == "stored_signs_matmul_plus_norms"
    assert {f"chunk_{c}" for c in accelerator.SMOKE.rad_chunks} <= {r["variant"] for r in rad}
    assert [r["chunk_size"] for r in _part(records, "sweep")] == list(
        accelerator.SMOKE.sweep_chunks
    )
    checks = {r["runtime_checks"]: r for r in _part(records, "checks")}
    # under jit(vmap(...)) the checks are host callbacks in the program; off, there are none
    assert checks[True]["callbacks_in_program"] > 0
    assert checks[False]["callbacks_in_program"] == 0
    (tests,) = _part(records, "tests")
    assert tests["exit_code"] == 0
    assert tests["passed"] > 0
    assert tests["failed"] == 0


def test_smoke_torch_rows_or_a_note(smoke):
    records, table = smoke
    torch_recs = _part(records, "torch")
    if accelerator._torch_available() is None:
        assert {r["job"] for r in torch_recs} == {"grad", "pyhessian_trace"}
        assert "pyhessian_trace" in table
    else:
        assert "not installed" in torch_recs[0]["not_run"]
        assert "Not run: torch / pyhessian not installed" in table


def test_smoke_writes_one_table_per_part(smoke):
    _, table = smoke
    for heading in (
        "## Kernels at scale",
        "## PyTorch / PyHessian on the same device",
        "## rademacher_linear throughput",
        "## 54k reference model",
        "## Runtime checks under jit(vmap(hessian_trace))",
        "## Kernel tests on the device",
    ):
        assert heading in table
    assert "| hessian_trace | default |" in table
    assert "| top_eigenvalues | highest |" in table
    assert "## Issue 22's goals" in table
    assert "| worst_case_per_value_and_grad_over_grad | <= 1.1 |" in table


def test_issue22_ratios_from_the_records():
    # hand-made records: the ratios are the quotients the docstring names
    records = [
        {"part": "scale", "num_params": 1000},
        {"part": "scale", "job": "grad", "precision": "default", "xla_temp_mb": 2.0},
        {"part": "scale", "job": "hessian_trace", "precision": "default", "count": 4,
         "per_unit_in_grads": 1.5, "per_unit_s": 0.3, "xla_temp_mb": 1.0},
        {"part": "scale", "job": "top_eigenvalues", "precision": "default", "count": 2,
         "per_unit_in_grads": 2.0, "xla_temp_mb": 5.0},
        {"part": "scale", "job": "worst_case_sharpness", "precision": "default", "count": 3,
         "per_unit_in_grads": 1.6, "xla_temp_mb": 3.0},
        {"part": "scale", "job": "grad", "precision": "highest", "xla_temp_mb": 2.0},
        {"part": "torch", "job": "pyhessian_trace", "per_unit_s": 0.9},
    ]  # fmt: skip
    got = accelerator.issue22(records, "default")
    basis = 2 * 1000 * 4 / 2**20
    assert got["hessian_trace_per_probe_over_grad"] == 1.5
    assert got["top_eigenvalues_per_step_over_grad"] == 2.0
    assert got["worst_case_per_value_and_grad_over_grad"] == pytest.approx(1.6 * 3 / 4)
    assert got["worst_case_temp_over_grad_temp"] == 1.5
    assert got["top_eigenvalues_temp_beyond_basis_over_grad_temp"] == pytest.approx(
        (5.0 - basis) / 2.0
    )
    assert got["pyhessian_per_probe_over_ours"] == pytest.approx(3.0)
    assert accelerator.issue22(records, "highest") == {"precision": "highest"}


def test_without_torch_the_torch_part_is_a_note(monkeypatch):
    monkeypatch.setattr(accelerator, "_torch_available", lambda: "not installed (torch)")
    accelerator.RECORDS.clear()
    accelerator.part_torch(accelerator.SMOKE, accelerator.Budget(60))
    assert accelerator.RECORDS == [
        {"part": "torch", "not_run": "torch / pyhessian not installed (torch)"}
    ]
    table = accelerator.markdown(accelerator.RECORDS, 1.0)
    assert "Not run: torch / pyhessian not installed (torch)." in table


def test_a_spent_budget_runs_nothing_and_says_so():
    accelerator.RECORDS.clear()
    budget = accelerator.Budget(0.0)
    accelerator.part_rademacher(accelerator.SMOKE, budget)
    accelerator.part_tests(accelerator.SMOKE, budget)
    assert all("not_run" in r for r in accelerator.RECORDS if r["part"] == "tests")
    assert not [r for r in accelerator.RECORDS if "draws_per_s" in r]
    assert "Not run:" in accelerator.markdown(accelerator.RECORDS, 0.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budget", "0"], "--budget: expected seconds > 0"),
        (["--budget", "-5"], "--budget: expected seconds > 0"),
        (["--budget", "nan"], "--budget: expected seconds > 0"),
        (["--budget", "60", "--tests-reserve", "60"], "--tests-reserve: expected seconds in"),
        (["--tests-reserve", "-1"], "--tests-reserve: expected seconds in"),
    ],
)
def test_bad_budget_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        accelerator.main(["--smoke", *argv, "--out", "/nonexistent/never"])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_the_timed_parts_leave_the_tests_their_reserve():
    accelerator.RECORDS.clear()
    budget = accelerator.Budget(100.0, reserve=99.5)  # 0.5 s for the timed parts
    assert not budget.allows("rademacher/x", 1.0)
    assert budget.allows("rademacher/y", 0.1)
    assert accelerator.RECORDS[0]["part"] == "rademacher/x"
