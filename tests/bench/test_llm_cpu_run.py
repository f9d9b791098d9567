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
    # (stopped by its target once it has its 2 probes, not by the clock: a loaded machine
    # compiles the first block for most of a short time limit)
    out = tmp_path / "run.json"
    args = ["--config", "tiny", "--max-time", "600", "--target", "1e9", "--repeats", "1",
            "--min-probes", "2", "--out", str(out),
            "--checkpoint", str(tmp_path / "trace.ckpt")]  # fmt: skip
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


def test_a_resume_whose_time_is_up_before_its_first_block_keeps_the_checkpoint(tmp_path):
    # resumed with a time limit already spent: no new probe, the checkpoint's estimate, and no
    # time per probe (there is none to measure) instead of a failure after the gradient
    ckpt = str(tmp_path / "trace.ckpt")
    first = ["--config", "tiny", "--max-time", "600", "--target", "1e9", "--repeats", "1",
             "--min-probes", "2", "--out", str(tmp_path / "a.json"),
             "--checkpoint", ckpt]  # fmt: skip
    done = {s["step"]: s for s in llm_cpu_run.main(first)["steps"]}["hessian_trace"]
    again = ["--config", "tiny", "--max-time", "1e-9", "--repeats", "1", "--min-probes", "2",
             "--out", str(tmp_path / "b.json"), "--checkpoint", ckpt]  # fmt: skip
    trace = {s["step"]: s for s in llm_cpu_run.main(again)["steps"]}["hessian_trace"]
    assert trace["num_probes"] == done["num_probes"]
    assert trace["trace"] == done["trace"]
    assert trace["per_unit_s"] is None
    assert trace["per_unit_in_grads"] is None
