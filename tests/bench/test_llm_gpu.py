"""bench/llm_gpu.py on a CPU: each program's record on the tiny decoder, the memory and time
limits, the records file, and bad flags."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llm_gpu  # noqa: E402

from bench import llm_plan  # noqa: E402


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"lanczos_steps": 3, "reps": 2, "seed": 0,
                                 "memory_limit_gib": None, **kw})  # fmt: skip


def _direct(program: str, args: argparse.Namespace):
    """The program called directly on the weights, tokens and key the harness uses."""
    import jax.numpy as jnp

    _, loss, _, _, shapes_of, batch, _ = llm_plan.placed_decoder("tiny", 1)
    params = llm_gpu.random_weights(shapes_of(jnp.bfloat16), args.seed)
    tokens = jax.random.randint(jax.random.key(args.seed + 1), batch.shape, 0, 64, jnp.int32)
    fn = llm_plan.programs(loss, args.lanczos_steps, None)[program]
    return jax.jit(fn)(params, tokens, jax.random.key(args.seed + 2))


@pytest.mark.parametrize("program", ["gradient", "top_eigenvalues", "worst_case_sharpness"])
def test_a_program_is_timed_per_unit_and_its_value_is_the_kernels(program):
    args = _args()
    r = llm_gpu.measure("tiny", program, args)
    units = {"gradient": 1, "top_eigenvalues": 3, "worst_case_sharpness": 3}[program]
    assert r["units_per_call"] == units
    assert len(r["run_s"]) == args.reps
    assert r["per_unit_s"] == pytest.approx(statistics.median(r["run_s"]) / units, abs=2e-6)
    assert r["compile_s"] > 0
    assert r["xla_plan_gib"] > 0
    assert "not_run" not in r
    if program == "gradient":
        # weights of standard deviation 0.02 give nearly uniform logits over the 64 tokens:
        # the loss is log 64 to within the logits' spread
        assert r["value"] == pytest.approx(math.log(64), abs=0.02)
        return
    # the record's value is what the kernel returns for the same weights, tokens and key
    # (the gradient above is computed with the weights cast to float32 first)
    out = _direct(program, args)
    want = out.value if program == "worst_case_sharpness" else out[0]
    np.testing.assert_allclose(r["value"], float(want), rtol=1e-6)


def test_a_plan_over_the_memory_limit_is_compiled_and_not_run():
    limit = 1e-6  # GiB: below any program's arguments
    r = llm_gpu.measure("tiny", "hessian_trace", _args(memory_limit_gib=limit))
    assert r["xla_plan_gib"] > limit
    assert "run_s" not in r
    assert "value" not in r
    assert r["not_run"].startswith("XLA plans")


def test_the_run_writes_its_records_and_keeps_the_others(tmp_path):
    out = tmp_path / "results"
    first = llm_gpu.main(["--configs", "tiny", "--programs", "average_sharpness", "--reps", "1",
                          "--out", str(out)])  # fmt: skip
    # the gradient is always measured first: every ratio is taken against it
    assert [r["program"] for r in first] == ["gradient", "average_sharpness"]
    rows = {r["program"]: r for r in llm_gpu.summarize(first)}
    assert rows["gradient"]["per_unit_in_grads"] == 1.0
    want = rows["average_sharpness"]["per_unit_s"] / rows["gradient"]["per_unit_s"]
    assert rows["average_sharpness"]["per_unit_in_grads"] == pytest.approx(want, abs=1e-3)
    stored = {(r["decoder"], r["program"]) for r in json.loads((out / "llm_gpu.json").read_text())}
    assert stored == {("tiny", "gradient"), ("tiny", "average_sharpness")}
    # a second run with no time left replaces its own records and keeps the others
    second = llm_gpu.main(["--configs", "tiny", "--programs", "gradient", "--budget", "1e-9",
                           "--out", str(out)])  # fmt: skip
    assert "not_run" in second[0]
    stored = {r["program"]: r for r in json.loads((out / "llm_gpu.json").read_text())}
    assert "not_run" in stored["gradient"]
    assert "per_unit_s" in stored["average_sharpness"]
    assert "| tiny | `average_sharpness` | pair |" in (out / "llm_gpu.md").read_text()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--configs", "70b"], "--configs"),
        (["--configs", ""], "--configs"),
        (["--programs", "gradient,trace"], "--programs"),
        (["--reps", "0"], "--reps"),
        (["--lanczos-steps", "2.5"], "--lanczos-steps"),
        (["--budget", "nan"], "--budget"),
        (["--budget", "-1"], "--budget"),
        (["--memory-limit-gib", "inf"], "--memory-limit-gib"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(flags, named, capsys):
    with pytest.raises(SystemExit) as info:
        llm_gpu.main(flags)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_an_output_that_is_a_file_is_refused_before_any_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for bad in (blocker, blocker / "sub"):
        with pytest.raises(SystemExit) as info:
            llm_gpu.main(["--configs", "tiny", "--out", str(bad)])
        assert info.value.code == 2
        assert "--out" in capsys.readouterr().err


def test_a_program_that_fails_when_run_keeps_its_compile_record(monkeypatch):
    # out of memory at run time (here: the weights cannot be drawn) is a record with the error,
    # beside what the compilation measured
    def fail(*args):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 32.00GiB")

    monkeypatch.setattr(llm_gpu, "random_weights", fail)
    r = llm_gpu.measure("tiny", "gradient", _args())
    assert r["error"].startswith("RuntimeError: RESOURCE_EXHAUSTED")
    assert r["compile_s"] > 0
    assert r["xla_plan_gib"] > 0
    assert "run_s" not in r


def test_a_stopped_run_keeps_its_records_and_leaves_no_process(tmp_path):
    # SIGTERM once the first program is recorded: the run ends as interrupted (exit 130, a line
    # saying where its records are), the program running then is killed with it, and what was
    # finished is on disk
    import os
    import signal
    import subprocess

    out = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "bench" / "llm_gpu.py"), "--configs", "tiny",
           "--programs", "hessian_trace,top_eigenvalues", "--reps", "1", "--seed", "7919",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})  # fmt: skip
    first = json.loads(proc.stdout.readline())  # the gradient's record, printed when written
    assert first["program"] == "gradient"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert f"recorded in {out / 'llm_gpu.json'}" in err
    stored = json.loads((out / "llm_gpu.json").read_text())
    assert stored[0]["program"] == "gradient"
    assert "per_unit_s" in stored[0]
    # the child of the program that was running (its seed is this test's own) is gone: the
    # run waits for it after killing it (an orphan would compile for seconds more)
    children = subprocess.run(["pgrep", "-af", "llm_gpu.py --child .*--seed 7919"],
                              capture_output=True, text=True)  # fmt: skip
    assert children.stdout == "", children.stdout
