"""bench/sharded.py's quick mode: the script runs, measures and writes its records (CPU smoke).

Two forced host devices, a small decoder, one gradient and one Hutchinson probe placed 1 and 2
ways over ``model``: compiled, measured (XLA's memory analysis) and timed once. No timing or
memory value is asserted (they live in the benchmark's record), only that each is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_mode_writes_its_records(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    script = [sys.executable, str(ROOT / "bench" / "sharded.py"), "--quick", "--ways", "1,2"]
    proc = subprocess.run(
        [*script, "--placements", "model", "--programs", "gradient,hessian_trace_probe",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (tmp_path / "sharded_quick.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["ways"], r["program"]) for r in records] == [
        (1, "gradient"), (1, "hessian_trace_probe"), (2, "gradient"), (2, "hessian_trace_probe")
    ]  # fmt: skip
    for r in records:
        assert "error" not in r, r
        assert r["per_device_mb"] > 0
        assert r["seconds_per_unit"] > 0
        assert r["mesh"] == {"model": r["ways"]}
    assert records[2]["memory_vs_unsharded"] == round(
        records[2]["per_device_mb"] / records[0]["per_device_mb"], 3
    )
    assert "| model | 2 | hessian_trace_probe |" in (tmp_path / "sharded_quick.md").read_text()
