"""``jaxbounds rademacher`` against hostile input and long-run faults (issue 38, cases 1-7).

The second round (a tester's hostile command lines) is at the end: a burst of signals, a closed
stdout, outputs over the inputs, refused checkpoints, a huge .npy header, tiny targets.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxbounds._atomic import exclusive_lock
from jaxbounds.cli import main
from jaxbounds.longrun import load_checkpoint
from kernels.blocks import MonteCarloBlocks

ROOT = Path(__file__).resolve().parents[2]
BASE = ["rademacher", "X.npy", "--norm", "2", "--radius", "1", "--quiet"]


def _exact(x, radius=1.0):
    """E ||sum_i s_i x_i||_2 * radius / n over all 2^n sign vectors (float64, by enumeration)."""
    n = x.shape[0]
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=n)))
    values = np.linalg.norm(signs @ np.asarray(x, np.float64), axis=1) * radius / n
    return values.mean(), values.std()


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = np.random.default_rng(0).normal(size=(10, 3))
    np.save(tmp_path / "X.npy", x.astype(np.float32))
    np.save(tmp_path / "X64.npy", x)
    return tmp_path, x


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- case 1: any --max-samples; nothing computed is lost


@pytest.mark.parametrize("count", ["2", "17", "1E3"])
def test_any_max_samples(data, capsys, count):
    code, _out, err = _run(capsys, *BASE, "--max-samples", count, "--json", "o.json")
    assert code == 0, err
    got = json.loads(Path("o.json").read_text())
    assert got["num_samples"] == int(float(count))
    assert got["reason"] == "max_samples"


def test_a_last_block_of_one_sample_with_checkpoint(data, capsys):
    flags = ["--block-size", "64", "--max-samples", "641", "--checkpoint", "c.json"]
    code, _, err = _run(capsys, *BASE, *flags, "--checkpoint-every", "0", "--json", "o.json")
    assert code == 0, err
    assert json.loads(Path("o.json").read_text())["num_samples"] == 641
    assert load_checkpoint("c.json")["state"].ranges == ((0, 641),)


def test_a_failed_block_writes_checkpoint_and_json(data, capsys, monkeypatch):
    real = MonteCarloBlocks.run

    def fails_late(self, start, stop):
        if start >= 128:
            raise ValueError("inputs: a failure in a late block")
        return real(self, start, stop)

    monkeypatch.setattr(MonteCarloBlocks, "run", fails_late)
    flags = ["--block-size", "64", "--max-samples", "1000", "--checkpoint", "c.json"]
    code, _, err = _run(capsys, *BASE, *flags, "--json", "o.json")
    assert code == 1
    assert "late block" in err
    assert "128 samples kept" in err
    assert "Traceback" not in err
    assert load_checkpoint("c.json")["state"].ranges == ((0, 128),)
    record = json.loads(Path("o.json").read_text())
    assert (record["reason"], record["num_samples"]) == ("error", 128)


# -- cases 3, 5: seeds, locks, another job's result


def test_seeds_past_2_32_are_refused(data, capsys):
    for seed in ["4294967296", "99999999999999999999", "-1"]:
        code, _, err = _run(capsys, *BASE, "--max-samples", "10", "--seed", seed)
        assert code == 2
        assert "--seed" in err
        assert len(err.strip().splitlines()) == 1


def test_a_busy_checkpoint_or_json_is_refused(data, capsys):
    for flag in ["--checkpoint", "--json"]:
        with exclusive_lock(Path(".f.json.lock")):
            code, _, err = _run(capsys, *BASE, "--max-samples", "10", flag, "f.json")
        assert code == 2
        assert flag in err
        assert "lock" in err


def test_json_of_another_job_needs_fresh(data, capsys):
    code, _, err = _run(capsys, *BASE, "--max-samples", "10", "--json", "o.json")
    assert code == 0, err
    norm1 = ["rademacher", "X.npy", "--norm", "1", "--radius", "1", "--quiet"]
    code, _, err = _run(capsys, *norm1, "--max-samples", "10", "--json", "o.json")
    assert code == 2
    assert "--json o.json: holds the result of another job" in err
    assert json.loads(Path("o.json").read_text())["norm"] == 2.0
    code, _, err = _run(capsys, *BASE, "--max-samples", "20", "--json", "o.json")
    assert code == 0, err  # the same job: replaced
    code, _, err = _run(capsys, *norm1, "--max-samples", "10", "--json", "o.json", "--fresh")
    assert code == 0, err
    assert json.loads(Path("o.json").read_text())["norm"] == 1.0


# -- case 4: the file's dtype is the compute dtype; tiny and huge values are exact


@pytest.mark.parametrize(
    ("name", "factor"), [("X64.npy", 1.0), ("tiny.npy", 1e-300), ("huge.npy", 1e300)]
)
def test_float64_files_run_in_float64_at_any_scale(data, capsys, name, factor):
    tmp_path, x = data
    if factor != 1.0:
        np.save(tmp_path / name, x * factor)
    argv = ["rademacher", name, "--norm", "2", "--radius", "1", "--quiet"]
    code, _, err = _run(capsys, *argv, "--max-samples", "4000", "--json", "o.json")
    assert code == 0, err
    got = json.loads(Path("o.json").read_text())
    assert got["dtype"] == "float64"
    mean, sd = _exact(x)
    assert got["stderr"] > 0
    assert abs(got["mean"] / factor - mean) <= 5 * got["stderr"] / factor
    assert got["stderr"] / factor == pytest.approx(sd / np.sqrt(4000), rel=0.1)
    assert got["mcdiarmid_lower"] <= mean * factor <= got["mcdiarmid_upper"]


def test_a_float64_file_is_not_computed_in_float32(data):
    """In a fresh process (JAX's x64 off), the estimate is the float64 kernel's on the same key."""
    import jax

    import kernels

    tmp_path, x = data
    np.save(tmp_path / "X.npy", x)  # float64, under the name the command (BASE) reads
    proc = _cli(tmp_path, "--max-samples", "64", "--block-size", "64", "--json", "o.json")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    got = json.loads((tmp_path / "o.json").read_text())
    assert got["dtype"] == "float64"
    one = kernels.rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, num_samples=64)
    assert one.mean.dtype == np.float64
    np.testing.assert_allclose(got["mean"], float(one.mean), rtol=1e-13)


# -- case 6: one line naming the flag or the file


def _save_inputs(tmp_path):
    x = np.random.default_rng(1).normal(size=(6, 2))
    np.savez(tmp_path / "a.npz", x=x)
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("1 2\n3 4\n")
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ints.npy", np.ones((3, 2), np.int64))
    np.save(tmp_path / "vec.npy", np.ones(3))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "X64.npy").read_bytes()[:100])
    with (tmp_path / "huge.npy").open("wb") as f:  # a 4 EB array's header, 64 bytes of data
        header = {"descr": "<f4", "fortran_order": False, "shape": (10**12, 10**6)}
        np.lib.format.write_array_header_2_0(f, header)
        f.write(bytes(64))


@pytest.mark.parametrize(
    ("inputs", "flags", "code", "named"),
    [
        ("a.npz", [], 1, "a.npz: a .npz archive"),
        ("empty.npy", [], 1, "empty.npy: the file is empty"),
        ("text.npy", [], 1, "text.npy: not a .npy file"),
        ("obj.npy", [], 1, "obj.npy: holds Python objects"),
        ("ints.npy", [], 1, "ints.npy: expected a float array"),
        ("vec.npy", [], 1, "vec.npy: expected a 2-D"),
        ("cut.npy", [], 1, "cut.npy: "),
        (
            "huge.npy",
            [],
            1,
            "huge.npy: truncated or damaged .npy file: its header describes a "
            "(1000000000000, 1000000) float32 array of 4000000000000000000 bytes",
        ),
        ("missing.npy", [], 1, "missing.npy: does not exist"),
        ("X.npy", ["--radius", "1e308"], 2, "--radius 1e+308: outside the normal range of float32"),
        ("X.npy", ["--json", "/proc/x.json"], 2, "--json /proc/x.json: cannot write"),
        ("X.npy", ["--max-samples", "1.5e0"], 2, "--max-samples '1.5e0'"),
        ("X.npy", ["--max-samples", "1e400"], 2, "--max-samples '1e400'"),
        ("X.npy", ["--max-time", "1e400"], 2, "--max-time"),
        ("X.npy", ["--json", "o.json", "--checkpoint", "o.json"], 2, "--json, --checkpoint"),
        (
            "X.npy",
            ["--block-size", "16777217"],
            2,
            "--block-size '16777217': expected an integer from 1 to 2**24",
        ),
        ("X.npy", ["--block-size", "1e12"], 2, "--block-size '1e12'"),
        ("X.npy", ["--block-size", "1e30"], 2, "--block-size '1e30'"),
        ("X.npy", ["--norm", "1e400"], 2, "--norm '1e400': expected a finite number"),
        ("X.npy", ["--norm", "1_0"], 2, "--norm '1_0'"),
        ("X.npy", ["--radius", "1_0"], 2, "--radius '1_0'"),
        ("X.npy", ["--target-stderr", "1_0"], 2, "--target-stderr '1_0'"),
        ("X.npy", ["--json", "X.npy", "--fresh"], 2, "--json X.npy: is the inputs file"),
        ("X.npy", ["--checkpoint", "./X.npy", "--fresh"], 2, "--checkpoint ./X.npy: is the inputs"),
    ],
)
def test_bad_input_is_one_line(data, capsys, inputs, flags, code, named):
    tmp_path, _ = data
    _save_inputs(tmp_path)
    argv = ["rademacher", inputs, "--norm", "2", "--radius", "1", "--quiet", "--max-samples", "10"]
    before = (tmp_path / "X.npy").read_bytes()
    got, _, err = _run(capsys, *argv, *flags)
    assert got == code, err
    assert named in err
    assert len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "X.npy").read_bytes() == before  # the inputs are never written


def test_big_endian_and_float16_files(data, capsys):
    tmp_path, x = data
    np.save(tmp_path / "be.npy", x.astype(">f8"))
    np.save(tmp_path / "half.npy", x.astype(np.float16))
    for name, dtype in [("be.npy", "float64"), ("half.npy", "float32")]:
        argv = ["rademacher", name, "--norm", "2", "--radius", "1", "--quiet"]
        code, _, err = _run(capsys, *argv, "--max-samples", "10", "--json", f"{name}.json")
        assert code == 0, err
        assert json.loads(Path(f"{name}.json").read_text())["dtype"] == dtype
    assert "float16 inputs run in float32" in err


# -- case 6: a second Ctrl-C writes the checkpoint and exits 130


def _cli(tmp_path, *extra):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    # no forced device count from the caller; the run's compile flags (root conftest) stay
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f
    )
    argv = [sys.executable, "-m", "jaxbounds.cli", *BASE, *extra]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture
def sigint_default():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # children: the default
    yield
    signal.signal(signal.SIGINT, old)


def _two_sigints(tmp_path, pause):
    for name in ("c.json", "o.json"):
        (tmp_path / name).unlink(missing_ok=True)
    flags = ["--max-time", "300", "--block-size", "512", "--checkpoint", "c.json",
             "--checkpoint-every", "0", "--json", "o.json"]  # fmt: skip
    proc = _cli(tmp_path, *flags)
    deadline = time.monotonic() + 300
    while not (tmp_path / "c.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    time.sleep(pause)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "stopped: interrupted" in out
    assert "Traceback" not in err
    state = load_checkpoint(tmp_path / "c.json")["state"]
    assert state.count >= 512
    assert state.ranges == ((0, state.count),)
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["reason"] == "interrupted"
    assert record["num_samples"] >= 512


def test_sigint_twice_exits_130_with_the_checkpoint(data, sigint_default):
    # the second signal lands while the first one's stop is being finished (the estimate's
    # program compiles): it used to reach Python's default handler there (no result, no JSON)
    _two_sigints(data[0], pause=0.3)


@pytest.mark.slow
def test_sigint_twice_twenty_times(data, sigint_default):
    pauses = [0.0, 0.02, 0.1, 0.3, 0.6, 1.0, 1.5]
    for attempt in range(20):
        _two_sigints(data[0], pause=pauses[attempt % len(pauses)])


# -- the second round: bursts of signals, closed pipes, outputs over inputs, checkpoints


class _Exit(BaseException):
    """``os._exit`` in a test: the status, without ending pytest's process."""


def test_a_burst_of_signals_exits_130_with_every_output(data, capsys, monkeypatch, sigint_default):
    # 1: a third signal while the second one's checkpoint is written raised out of the stop
    from jaxbounds import _atomic

    real_run, real_write = MonteCarloBlocks.run, _atomic.write_bytes_atomic
    burst = []

    def run(self, start, stop):
        if start >= 128 and not burst:
            burst.append(start)
            os.kill(os.getpid(), signal.SIGINT)  # the first: stop after this block
            os.kill(os.getpid(), signal.SIGINT)  # the second: at once
        return real_run(self, start, stop)

    def write(path, data):
        with _atomic.critical_section():  # the rest of the burst, while each file is written
            if burst:
                os.kill(os.getpid(), signal.SIGINT)
            return real_write(path, data)

    def exit_(code):
        raise _Exit(code)

    monkeypatch.setattr(MonteCarloBlocks, "run", run)
    monkeypatch.setattr(_atomic, "write_bytes_atomic", write)
    monkeypatch.setattr(os, "_exit", exit_)
    flags = ["--block-size", "64", "--max-samples", "10000", "--checkpoint", "c.json"]
    with pytest.raises(_Exit) as info:
        main([*BASE, *flags, "--checkpoint-every", "0", "--json", "o.json"])
    out, err = capsys.readouterr()
    assert info.value.args == (130,)
    assert "stopped: interrupted" in out
    assert err.strip().splitlines() == [
        "jaxbounds rademacher: interrupted; the state is saved to c.json; run the same command "
        "again to resume"
    ]
    assert load_checkpoint("c.json")["state"].ranges == ((0, 128),)
    record = json.loads(Path("o.json").read_text())
    assert (record["reason"], record["num_samples"]) == ("interrupted", 128)


def test_a_closed_stdout_loses_no_file(data):
    # 7: the result line was printed first: a closed pipe lost the --json and exited 1
    proc = _cli(data[0], "--max-samples", "100", "--json", "o.json", "--checkpoint", "c.json")
    proc.stdout.close()  # `jaxbounds rademacher ... | true`
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err
    assert err == ""
    assert json.loads((data[0] / "o.json").read_text())["num_samples"] == 100
    assert load_checkpoint(data[0] / "c.json")["state"].count == 100


def test_refused_checkpoints_name_the_flag_and_fresh(data, capsys):
    # 8: another problem's or block size's checkpoint, or a damaged one: exit 2 naming --checkpoint
    flags = ["--max-samples", "128", "--checkpoint", "c.json"]
    code, _, err = _run(capsys, *BASE, *flags, "--block-size", "64")
    assert code == 0, err
    other = [(["--norm", "1"], "another problem"), (["--seed", "5"], "another problem"),
             (["--block-size", "32"], "it ran blocks of 64")]  # fmt: skip
    for extra, why in other:
        code, _, err = _run(capsys, *BASE, *flags, *extra)
        assert code == 2, err
        assert err.startswith("jaxbounds rademacher: error: --checkpoint c.json: "), err
        assert why in err
        assert "pass --fresh to start over" in err
        assert len(err.strip().splitlines()) == 1
    saved = json.loads(Path("c.json").read_text())
    damaged = {"nostate.json": {k: v for k, v in saved.items() if k != "state"},
               "badstate.json": {**saved, "state": 3}}  # fmt: skip
    for name, value in damaged.items():
        Path(name).write_text(json.dumps(value))
        code, _, err = _run(capsys, *BASE, "--max-samples", "128", "--checkpoint", name)
        assert code == 2, err
        assert f"--checkpoint {name}: a damaged checkpoint" in err
        assert len(err.strip().splitlines()) == 1, err
    code, _, err = _run(capsys, *BASE, *flags, "--norm", "1", "--fresh")
    assert code == 0, err  # --fresh starts over


@pytest.mark.parametrize("target", ["1e-160", "1e-300"])
def test_a_tiny_target_runs_to_max_samples(data, capsys, target):
    # 4: the samples the target needs overflowed a float while the block size was calibrated
    argv = [*BASE, "--target-stderr", target, "--max-samples", "3000", "--json", "o.json"]
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    record = json.loads(Path("o.json").read_text())
    assert (record["reason"], record["num_samples"]) == ("max_samples", 3000)


def test_a_longdouble_file_is_named_by_its_own_dtype(data, capsys):
    # 9: the note was built after the conversion ("float64 inputs run in float64")
    tmp_path, x = data
    np.save(tmp_path / "ld.npy", x.astype(np.longdouble))
    argv = ["rademacher", "ld.npy", "--norm", "2", "--radius", "1", "--quiet"]
    code, _, err = _run(capsys, *argv, "--max-samples", "10", "--json", "o.json")
    assert code == 0, err
    assert f"ld.npy: {np.dtype(np.longdouble).name} inputs run in float64" in err
    assert json.loads(Path("o.json").read_text())["dtype"] == "float64"


def test_an_output_linked_to_the_inputs_is_refused(data, capsys):
    # 6: --fresh wrote the checkpoint over the inputs
    tmp_path, _ = data
    os.link(tmp_path / "X.npy", tmp_path / "hard.npy")
    before = (tmp_path / "X.npy").read_bytes()
    for flag in ["--checkpoint", "--json"]:
        code, _, err = _run(capsys, *BASE, "--max-samples", "10", flag, "hard.npy", "--fresh")
        assert code == 2
        assert f"{flag} hard.npy: is the inputs file" in err
    assert (tmp_path / "X.npy").read_bytes() == before


def test_the_block_size_bound_is_the_drivers():
    # 3: the command line's maximum is the largest block the calibration picks
    from jaxbounds import cli_rademacher, longrun

    assert cli_rademacher._MAX_BLOCK_SIZE == longrun.MAX_BLOCK_SIZE == 2**24
