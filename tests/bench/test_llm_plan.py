"""bench/llm_plan.py: the ratios and goals of its table, and a smoke run on the tiny decoder.

``summarize`` is checked on hand-made records (exact arithmetic); the smoke run compiles the
tiny decoder's gradient and one Hutchinson program on 8 forced CPU devices and checks that each
record carries XLA's numbers (no memory or time value is asserted: they live in the record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llm_plan  # noqa: E402  (names only: JAX is set up in the subprocess)


def record(program, variant, gib, compile_s, **extra):
    return {"decoder": "1b", "num_params": 8 * 2**30, "program": program, "variant": variant,
            "per_device_gib": gib, "compile_s": compile_s, **extra}  # fmt: skip


def test_ratios_and_goals():
    records = llm_plan.summarize([
        record("gradient", "f32_in_program", 10.0, 4.0),
        record("gradient", "bf16", 8.0, 5.0),
        record("hessian_trace", "f32_in_program", 15.0, 8.0),
        record("hessian_trace", "bf16_args", 12.0, 6.0),
        record("average_sharpness", "f32_in_program", 15.5, 2.0),
        # 10 steps of 2^33 float32 parameters over 8 devices: 40 GiB per device allowed on top
        record("top_eigenvalues", "f32_in_program", 54.0, 40.0, num_steps=10),
        record("worst_case_sharpness", "f32_in_program", 0.0, 1.0, error="x"),
    ])  # fmt: skip
    by = {(r["program"], r["variant"]): r for r in records}
    assert by["gradient", "bf16"]["memory_vs_gradient"] == 0.8
    assert by["gradient", "bf16"]["compile_vs_gradient"] == 1.25
    assert "meets_goal" not in by["gradient", "bf16"]
    assert by["hessian_trace", "f32_in_program"]["goal_gib"] == 15.0
    assert by["hessian_trace", "f32_in_program"]["meets_goal"] is True
    # the kernel on the bfloat16 shards: against the float32-in-the-program gradient
    assert by["hessian_trace", "bf16_args"]["memory_vs_gradient"] == 1.2
    assert by["hessian_trace", "bf16_args"]["compile_vs_gradient"] == 1.5
    assert by["hessian_trace", "bf16_args"]["goal_gib"] == 15.0
    assert by["average_sharpness", "f32_in_program"]["meets_goal"] is False
    lanczos = by["top_eigenvalues", "f32_in_program"]
    assert lanczos["basis_share_gib"] == 40.0
    assert lanczos["goal_gib"] == 55.0
    assert lanczos["meets_goal"] is True
    table = llm_plan.markdown(records)
    assert (
        "| 1b (8.59B) | average_sharpness | f32_in_program | 15.50 | 1.55 | 15.00 | **no** |"
        in (table)
    )


def test_smoke_run_on_the_tiny_decoder(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "llm_plan.py"), "--configs", "tiny",
         "--programs", "gradient,hessian_trace", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = json.loads((tmp_path / "llm_plan.json").read_text())
    assert [(r["program"], r["variant"]) for r in records] == [
        ("gradient", "bf16"),
        ("gradient", "f32_in_program"),
        ("hessian_trace", "bf16_args"),
        ("hessian_trace", "f32_in_program"),
    ]
    for r in records:
        assert r["mesh"] == {"fsdp": 8}
        assert r["num_params"] == 20640
        assert r["per_device_gib"] > 0
        assert r["compile_s"] > 0
        assert r["xla_flops_per_device"] > 0
        assert r["compile_cache"] is None
    assert (
        "| tiny (0.00B) | hessian_trace | f32_in_program |"
        in (tmp_path / "llm_plan.md").read_text()
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--configs", "3b"], "--configs: unknown ['3b']"),
        (["--programs", "gradient,nope"], "--programs: unknown program 'nope'"),
        (["--lanczos-steps", "0"], "--lanczos-steps: expected an int >= 1, got 0"),
        (["--host-memory-gib", "nan"], "--host-memory-gib: expected a number > 0, got nan"),
        (["--out", "{tmp}/file"], "--out: expected a folder, got the file"),
        (["--out", "{tmp}/empty", "--render"], "--out: no llm_plan.json to render"),
        (["--out", "{tmp}/file/sub"], "--out: cannot create the folder"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_before_any_compile(tmp_path, monkeypatch, capsys,
                                                             argv, message):  # fmt: skip
    (tmp_path / "file").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr(llm_plan, "_child", pytest.fail)  # no compile may start
    monkeypatch.setattr(llm_plan, "_setup", lambda: None)  # XLA_FLAGS of this process unchanged
    with pytest.raises(SystemExit) as exit_info:
        llm_plan.main(["--configs", "tiny", *argv] if "--configs" not in argv else argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
