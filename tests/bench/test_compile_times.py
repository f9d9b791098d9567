"""bench/compile_times.py: the ratios of its table, and a smoke run on the tiny decoder.

``summarize`` is checked on hand-made records (exact arithmetic: the minimum over repeats, the
ratio to the gradient's, the 2x goal); the smoke run compiles the tiny decoder's gradient and
Hutchinson trace with an rbg key in child processes on 8 forced CPU devices and checks that each
record carries XLA's numbers (no time value is asserted: they live in the record).
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
import compile_times  # noqa: E402  (names only: JAX is set up in the subprocess)


def record(program, cpu, wall=1.0, **extra):
    return {"decoder": "1b", "num_params": 1_235_814_400, "program": program,
            "compile_cpu_s": cpu, "compile_wall_s": wall, "hlo_lines": 10, "hlo_fusion": 2,
            "hlo_while": 1, "load_start": [3.0, 2.0, 1.0], **extra}  # fmt: skip


def test_ratios_use_the_fastest_repeat():
    records = [
        record("gradient", 5.0),
        record("gradient", 4.0),
        record("average_sharpness", 9.0),
        record("average_sharpness", 6.0),
        record("worst_case_sharpness", 8.5),
        record("top_eigenvalues", 20.0, num_steps=10),
        {"decoder": "1b", "program": "hessian_trace", "error": "exit 1", "load_start": [1.0]},
    ]
    rows = {r["program"]: r for r in compile_times.summarize(records)}
    assert rows["gradient"]["vs_gradient"] == 1.0
    assert rows["gradient"]["compile_cpu_s"] == [5.0, 4.0]
    assert rows["average_sharpness"]["vs_gradient"] == 1.5
    assert rows["average_sharpness"]["meets"] is True
    assert rows["worst_case_sharpness"]["vs_gradient"] == 2.12
    assert rows["worst_case_sharpness"]["meets"] is False
    assert rows["top_eigenvalues (10 steps)"]["vs_gradient"] == 5.0
    assert "hessian_trace" not in rows
    table = compile_times.markdown(records)
    assert "| fsdp x 8 | 1b (1.24B) | average_sharpness | 9.0, 6.0 | 1.5 | yes |" in table
    assert "| 8 | 1b | hessian_trace | exit 1 |" in table


def test_each_placement_is_compared_with_its_own_gradient():
    records = [
        record("gradient", 4.0),  # made before --devices: FSDP over 8 devices
        record("top_eigenvalues", 14.0, num_steps=10),
        record("gradient", 3.0, devices=1),
        record("top_eigenvalues", 6.0, num_steps=10, devices=1),
        record("worst_case_sharpness", 7.5, devices=1),
    ]
    rows = {(r["devices"], r["program"]): r for r in compile_times.summarize(records)}
    assert rows[(8, "top_eigenvalues (10 steps)")]["vs_gradient"] == 3.5
    assert rows[(8, "top_eigenvalues (10 steps)")]["meets"] is False
    assert rows[(1, "top_eigenvalues (10 steps)")]["vs_gradient"] == 2.0
    assert rows[(1, "top_eigenvalues (10 steps)")]["meets"] is True
    assert rows[(1, "worst_case_sharpness")]["vs_gradient"] == 2.5
    assert (8, "worst_case_sharpness") not in rows
    table = compile_times.markdown(records)
    assert "| one device | 1b (1.24B) | top_eigenvalues (10 steps) | 6.0 | 2.0 | yes |" in table
    assert "| fsdp x 8 | 1b (1.24B) | top_eigenvalues (10 steps) | 14.0 | 3.5 | **no** |" in table


@pytest.mark.slow
def test_smoke_run_on_the_tiny_decoder(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("JAXBOUNDS_COMPILE_CACHE", None)
    out = tmp_path / "compile_times.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compile_times.py"), "--configs", "tiny",
         "--programs", "gradient,hessian_trace_rbg", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = json.loads(out.read_text())
    assert [r["program"] for r in records] == ["gradient", "hessian_trace_rbg"]
    assert [r["key_impl"] for r in records] == ["threefry2x32", "rbg"]
    for r in records:
        assert r["devices"] == 8
        assert r["mesh"] == {"fsdp": 8}
        assert r["num_params"] == 20640
        assert r["compile_cpu_s"] > 0
        assert r["hlo_fusion"] > 0
        assert r["compile_cache"] is None
    assert "| fsdp x 8 | tiny (20,640) | hessian_trace_rbg |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "{tmp}"], "--out: expected a .json file"),
        (["--out", "{tmp}/records.txt"], "--out: expected a .json file"),
        (["--out", "{tmp}/none.json", "--render"], "--out: no records to render"),
        (["--out", "{tmp}/file.json/sub/records.json"], "--out: cannot create the folder"),
        (["--configs", "3b"], "--configs: unknown ['3b']"),
        (["--configs", ","], "--configs: unknown"),
        (["--programs", "gradient,nope"], "--programs: unknown ['nope']"),
        (["--repeats", "0"], "--repeats: expected an int >= 1, got 0"),
        (["--lanczos-steps", "-1"], "--lanczos-steps: expected an int >= 1, got -1"),
        (["--devices", "4"], "--devices: invalid choice: 4"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_before_any_compile(tmp_path, monkeypatch, capsys,
                                                             argv, message):  # fmt: skip
    (tmp_path / "file.json").write_text("[]")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr(sys, "argv", ["compile_times.py", *argv])
    monkeypatch.setattr(compile_times, "_child", pytest.fail)  # no compile may start
    with pytest.raises(SystemExit) as exit_info:
        compile_times.main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
