"""bench/llm_cpu_run.py: bad output places are refused before any work, and a tiny smoke run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llm_cpu_run  # noqa: E402


@pytest.mark.parametrize("flag", ["--out", "--checkpoint"])
def test_a_bad_place_is_refused_before_the_build(flag, tmp_path, monkeypatch, capsys):
    def build(*args):  # the decoder is built only after the flags are checked
        raise AssertionError("built before the flags were checked")

    monkeypatch.setattr(llm_cpu_run, "build", build)
    blocker = tmp_path / "file"
    blocker.write_text("")
    for bad in (tmp_path, blocker / "sub" / "record.json"):
        with pytest.raises(SystemExit) as exit_info:
            llm_cpu_run.main(["--config", "tiny", flag, str(bad)])
        assert exit_info.value.code == 2
        assert flag in capsys.readouterr().err


def test_tiny_smoke_run_writes_every_step(tmp_path):
    # the tiny decoder through every step: the gradient, the trace by the anytime driver (stopped
    # by --max-time or its target), one average sharpness; the record is written after each step
    out = tmp_path / "run.json"
    args = ["--config", "tiny", "--max-time", "5", "--repeats", "1", "--min-probes", "2",
            "--out", str(out), "--checkpoint", str(tmp_path / "trace.ckpt")]  # fmt: skip
    record = llm_cpu_run.main(args)
    assert json.loads(out.read_text()) == record
    steps = {step["step"]: step for step in record["steps"]}
    assert set(steps) == {"gradient", "hessian_trace", "average_sharpness"}
    assert steps["gradient"]["loss"] > 0
    assert steps["hessian_trace"]["num_probes"] >= 2
    assert steps["hessian_trace"]["stderr"] > 0
    sharp = steps["average_sharpness"]
    assert "not_run" not in sharp  # the tiny decoder's plan fits any machine
    assert math.isfinite(sharp["mean"])
    assert sharp["stderr"] > 0
