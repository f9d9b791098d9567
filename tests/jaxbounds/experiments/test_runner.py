"""Tests of the resumable experiment runner on a toy experiment (pure numpy, ms per unit).

Run as a script, this file is the tiny command line the subprocess tests start:
``python test_runner.py OUT_DIR SLEEP_S`` runs the toy experiment at ``smoke`` scale and exits
with ``Interrupted.exit_code`` (130 for SIGINT, 143 for SIGTERM) when interrupted.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxbounds._atomic import SignalGuard, check_stop, critical_section
from jaxbounds.experiments import _output, runner
from jaxbounds.experiments.runner import (
    Experiment,
    ExperimentRegistry,
    Interrupted,
    Unit,
    claim_line,
    kendall_tau,
    markdown_table,
    mean_spread,
    run_experiment,
    unit_key,
)

REPO = Path(__file__).resolve().parents[3]
NUM_SMOKE_UNITS = 12  # 3 values of n x 2 scales x 2 seeds
CLAIM = "The mean does not grow with n"


def _toy_result(unit: Unit) -> dict:
    rng = np.random.default_rng([unit.seed, unit.config["n"]])
    x = rng.normal(size=unit.config["n"]) * unit.config["scale"]
    return {"mean": float(x.mean()), "max": np.float64(x.max()), "label": f"n{unit.config['n']}"}


def _toy_render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    ns = [row["n"] for row in rows]
    trend = kendall_tau(ns, [row["mean"] for row in rows])
    table = [
        [n, mean_spread(r["mean"] for r in rows if r["n"] == n).format()] for n in sorted(set(ns))
    ]
    for name in ("figure1.png", "figure2.png"):
        figure = runner.new_figure(figsize=(3, 2))
        if figure is not None:
            figure.add_subplot().plot(ns, [row["mean"] for row in rows], "o")
            runner.save_figure(figure, out_dir / name)
    text = "\n".join([
        f"# {meta['experiment']} ({meta['scale']}, seeds {meta['seeds']})", "",
        markdown_table(["n", "mean ± std"], table, align="rl"),
        claim_line(CLAIM, trend.p_value >= 0.05 or trend.tau <= 0, str(trend)), "",
    ])  # fmt: skip
    runner.write_text_atomic(out_dir / "report.md", text)


def make_toy(*, calls=None, sleep=0.0, n_values=(8, 3, 5), batch_sizes=None, name="toy"):
    def run_unit(unit):
        if calls is not None:
            calls.append(unit)
        time.sleep(sleep)
        return _toy_result(unit)

    def run_batch(units):
        batch_sizes.append(len(units))
        return [run_unit(unit) for unit in units]

    grid = {"n": list(n_values), "scale": [0.5, 2.0], "kind": "normal"}
    return Experiment(
        name=name,
        description="a toy: means of Gaussian samples",
        paper="Nobody (2024), Table 0",
        scales={"smoke": grid, "cpu": {**grid, "n": [*n_values, 13]}},
        run_unit=run_unit,
        run_batch=None if batch_sizes is None else run_batch,
        render=_toy_render,
        claims=(CLAIM,),
        paper_numbers={"mean": 0.0},
        default_seeds=2,
    )


def _run(tmp_path, **kwargs):
    kwargs = {"scale": "smoke", "seeds": 2, "quiet": True, "out_dir": tmp_path, **kwargs}
    experiment = kwargs.pop("experiment", None) or make_toy()
    return run_experiment(experiment, **kwargs)


def _units(out_dir: Path, name: str = "toy") -> list[Path]:
    return sorted((out_dir / name / "units").glob("*.json"))


# ---------------------------------------------------------------------------- keys and resume


def test_unit_keys_follow_the_configuration():
    unit = Unit({"n": 3, "scale": 0.5}, seed=1)
    key = unit_key("toy", unit, "0.1.0")
    assert key == unit_key("toy", Unit({"scale": 0.5, "n": 3}, seed=1), "0.1.0")
    others = [
        unit_key("toy", Unit({"n": 3, "scale": 0.25}, seed=1), "0.1.0"),
        unit_key("toy", Unit({"n": 3, "scale": 0.5, "extra": None}, seed=1), "0.1.0"),
        unit_key("toy", Unit({"n": 3, "scale": 0.5}, seed=2), "0.1.0"),
        unit_key("other", unit, "0.1.0"),
        unit_key("toy", unit, "0.2.0"),
    ]
    assert len({key, *others}) == 6
    with pytest.raises(ValueError, match="NaN"):
        Unit({"x": float("nan")}, seed=0)


def test_changed_configuration_never_reuses_units(tmp_path):
    calls = []
    _run(tmp_path, experiment=make_toy(calls=calls))
    assert len(calls) == NUM_SMOKE_UNITS
    calls.clear()
    _run(tmp_path, experiment=make_toy(calls=calls, n_values=(8, 3, 6)))
    assert sorted({u.config["n"] for u in calls}) == [6]  # n=8 and n=3 are reused, n=6 is new
    assert len(calls) == 4
    assert len(_units(tmp_path)) == NUM_SMOKE_UNITS + 4


def test_resume_skips_finished_units(tmp_path, capsys):
    calls = []
    summary = _run(tmp_path, experiment=make_toy(calls=calls))
    assert (summary.num_run, summary.num_finished, summary.num_missing) == (12, 12, 0)
    csv_bytes = (tmp_path / "toy" / "results.csv").read_bytes()
    assert (tmp_path / "toy" / "figure1.png").stat().st_size > 0
    calls.clear()
    summary = _run(tmp_path, experiment=make_toy(calls=calls))
    assert calls == []
    assert summary.num_run == 0
    assert summary.rendered
    _units(tmp_path)[3].unlink()
    _units(tmp_path)[5].write_text("{")  # a damaged file (not one the runner writes) is rerun
    _run(tmp_path, experiment=make_toy(calls=calls), progress=True)
    assert len(calls) == 2
    err = capsys.readouterr().err
    assert "unreadable" in err
    assert re.search(r"toy: 100%.*12/12 \[[\d:]+<[\d:]+", err)  # tqdm bar: elapsed<ETA
    assert (tmp_path / "toy" / "results.csv").read_bytes() == csv_bytes


def test_results_csv_and_summary(tmp_path):
    _run(tmp_path)
    text = (tmp_path / "toy" / "results.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    assert list(rows[0]) == ["n", "scale", "kind", "seed", "mean", "max", "label"]
    order = [(int(r["n"]), float(r["scale"]), int(r["seed"])) for r in rows]
    assert order == sorted(order)
    assert len(order) == NUM_SMOKE_UNITS
    for row in rows:  # every number reads back to the exact double the unit computed
        unit = Unit({"n": int(row["n"]), "scale": float(row["scale"]), "kind": "normal"},
                    seed=int(row["seed"]))  # fmt: skip
        assert float(row["mean"]) == _toy_result(unit)["mean"]
    assert "wall" not in text
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["scale"] == "smoke"
    assert summary["seeds"] == [0, 1]
    assert summary["package"]["name"] == "jaxbounds"
    assert summary["versions"]["jax"]
    assert summary["machine"]["cpu_count"] >= 1
    assert summary["machine"]["jax_devices"]
    assert len(summary["units"]) == NUM_SMOKE_UNITS
    assert all(u["wall_time_s"] >= 0 for u in summary["units"])
    # the report's statistic recomputed independently from results.csv
    ns = [float(r["n"]) for r in rows]
    means = [float(r["mean"]) for r in rows]
    assert str(kendall_tau(ns, means)) in (tmp_path / "toy" / "report.md").read_text()


# --------------------------------------------------------------------- subprocess: kill, signals


def _start(out_dir: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           # this process's precision: units of the other one are other units
           "JAX_ENABLE_X64": "1" if jax.config.jax_enable_x64 else "0"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, __file__, str(out_dir), str(sleep)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_units(out_dir: Path, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while len(_units(out_dir)) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the toy run wrote no units in 180 s"
        time.sleep(0.02)


def test_kill_and_resume_gives_the_same_bytes(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    process = _start(killed, sleep=0.2)
    _wait_for_units(killed, 3, process)
    process.kill()  # SIGKILL: no handler runs
    process.communicate(timeout=60)
    done = len(_units(killed))
    assert 3 <= done < NUM_SMOKE_UNITS
    calls = []
    summary = _run(killed, experiment=make_toy(calls=calls))
    assert len(calls) == NUM_SMOKE_UNITS - done
    assert summary.num_missing == 0
    _run(clean)
    for name in ("results.csv", "report.md"):
        assert (killed / "toy" / name).read_bytes() == (clean / "toy" / name).read_bytes()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_exits_cleanly_without_partial_files(tmp_path, signum, code):
    process = _start(tmp_path, sleep=0.2)
    _wait_for_units(tmp_path, 2, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "interrupted by" in stderr
    assert "Traceback" not in stderr
    units_dir = tmp_path / "toy" / "units"
    assert [p.name for p in units_dir.iterdir() if not p.name.endswith(".json")] == [
        ".lock.process0"  # the run's lock file (an unlocked file blocks nobody)
    ]
    for path in _units(tmp_path):
        assert json.loads(path.read_text())["key"] == path.stem
    assert len(_units(tmp_path)) < NUM_SMOKE_UNITS


def test_a_first_signal_asks_a_second_stops_and_a_write_finishes_first():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with SignalGuard() as guard:
            if threading.current_thread() is threading.main_thread():
                assert signal.getsignal(signal.SIGINT) == guard.handle
            check_stop()  # nothing asked yet
            guard.handle(signal.SIGINT, None)  # the first signal raises nothing
            with pytest.raises(Interrupted) as info:
                check_stop()  # ... the runner stops at its next check
            assert info.value.exit_code == 130
            with pytest.raises(Interrupted) as info, critical_section():  # noqa: PT012
                guard.handle(signal.SIGTERM, None)  # a second: held until the write is done
                written = True
            assert written
            assert info.value.exit_code == 143
            with pytest.raises(Interrupted, match="SIGTERM"):
                guard.handle(signal.SIGTERM, None)  # outside a write: at once
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------- --from, matplotlib, shares


def test_from_dir_rerenders_without_running(tmp_path):
    _run(tmp_path)
    run_dir = tmp_path / "toy"
    before = {n: (run_dir / n).read_bytes() for n in ("results.csv", "report.md")}
    for name in ("results.csv", "report.md", "figure1.png"):
        (run_dir / name).unlink()
    calls = []
    summary = run_experiment(make_toy(calls=calls), from_dir=tmp_path, quiet=True)
    assert calls == []
    assert summary.rendered
    assert summary.out_dir == run_dir
    assert summary.scale == "smoke"
    assert summary.seeds == (0, 1)
    assert {n: (run_dir / n).read_bytes() for n in before} == before
    assert (run_dir / "figure1.png").exists()
    elsewhere = tmp_path / "elsewhere"
    run_experiment(make_toy(calls=calls), from_dir=run_dir, out_dir=elsewhere, quiet=True)
    assert (elsewhere / "toy" / "report.md").read_bytes() == before["report.md"]
    assert calls == []
    assert not (elsewhere / "toy" / "units").exists()
    with pytest.raises(FileNotFoundError, match="no toy/units"):
        run_experiment(make_toy(), from_dir=tmp_path / "nothing", quiet=True)


def test_without_matplotlib_everything_else_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr(_output, "_SAID_NO_MATPLOTLIB", False)
    _run(tmp_path)
    _run(tmp_path, from_dir=tmp_path)
    stderr = capsys.readouterr().err
    assert stderr.count("matplotlib is not installed") == 1
    names = sorted(p.name for p in (tmp_path / "toy").iterdir())
    assert names == ["report.md", "results.csv", "summary.json", "units"]


def test_process_shares_are_disjoint_and_process_0_renders(tmp_path, capsys):
    single = tmp_path / "single"
    _run(single)
    shared, seen = tmp_path / "shared", []
    for index in (2, 1):
        calls = []
        summary = _run(shared, experiment=make_toy(calls=calls), process_index=index,
                       process_count=3)  # fmt: skip
        assert not summary.rendered
        assert not (shared / "toy" / "results.csv").exists()
        seen.append({(repr(u.config), u.seed) for u in calls})
    assert len(seen[0]) == len(seen[1]) == 4
    assert not seen[0] & seen[1]
    capsys.readouterr()
    _run(shared, from_dir=shared)  # before process 0: renders what exists, says what is missing
    assert "4 of 12 units are missing" in capsys.readouterr().err
    summary = _run(shared, process_index=0, process_count=3)
    assert summary.rendered
    assert summary.num_run == 4
    assert summary.num_missing == 0
    csv_bytes = (shared / "toy" / "results.csv").read_bytes()
    assert csv_bytes == (single / "toy" / "results.csv").read_bytes()


def _process_0_waiting(shared: Path, capsys) -> tuple:
    """Start process 0 of 2 in a thread; return once it waits for process 1's 6 units."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    waiting = pool.submit(
        _run, shared, process_index=0, process_count=2, wait_for_shares=True, quiet=False
    )
    deadline = time.monotonic() + 30
    while "waiting for 6 units" not in capsys.readouterr().err:
        assert not waiting.done(), waiting.result()
        assert time.monotonic() < deadline, "process 0 did not reach the wait"
        time.sleep(0.05)
    return pool, waiting


def test_wait_for_shares_renders_once_every_unit_is_there(tmp_path, capsys):
    # process 0 of 2 waits (in a thread here) for process 1's share, then renders everything
    single, shared = tmp_path / "single", tmp_path / "shared"
    _run(single)
    first, waiting = _process_0_waiting(shared, capsys)
    assert not (shared / "toy" / "results.csv").exists()
    other = _run(shared, process_index=1, process_count=2, wait_for_shares=True)
    summary = waiting.result(timeout=30)
    first.shutdown()
    assert not other.rendered  # process 1 waited too, but only process 0 writes the tables
    assert summary.rendered
    assert (summary.num_run, other.num_run, summary.num_missing) == (6, 6, 0)
    for name in ("results.csv", "report.md"):
        assert (shared / "toy" / name).read_bytes() == (single / "toy" / name).read_bytes()


def test_a_stopped_process_stops_the_waiting_ones(tmp_path, capsys):
    # process 1 of 2 fails on its first unit: it leaves a stop marker with the reason, and
    # process 0, waiting for process 1's units (in a thread here), stops instead of hanging
    def broken(unit):
        raise RuntimeError(f"unit n={unit.config['n']} broke")

    toy = make_toy()
    failing = dataclasses.replace(toy, run_unit=broken)
    shared = tmp_path / "shared"
    first, waiting = _process_0_waiting(shared, capsys)
    with pytest.raises(RuntimeError, match="broke"):
        _run(shared, experiment=failing, process_index=1, process_count=2, wait_for_shares=True)
    marker = shared / "toy" / "units" / ".stopped.process1"
    assert "RuntimeError" in marker.read_text()
    with pytest.raises(Interrupted, match=r"another process stopped \(process 1: RuntimeError"):
        waiting.result(timeout=30)
    first.shutdown()
    assert len(_units(shared)) == 6  # process 0's finished share is kept
    assert (shared / "toy" / "units" / ".stopped.process0").exists()
    # the same command resumes: process 1 clears its old marker, runs its share, both render
    other = concurrent.futures.ThreadPoolExecutor(1)
    resumed = other.submit(_run, shared, process_index=0, process_count=2, wait_for_shares=True)
    time.sleep(0.5)  # process 1's old marker predates process 0's start: an earlier run's
    assert not resumed.done(), resumed.result()
    _run(shared, process_index=1, process_count=2, wait_for_shares=True)
    assert resumed.result(timeout=30).rendered
    other.shutdown()
    assert len(_units(shared)) == NUM_SMOKE_UNITS


def test_an_old_stop_marker_counts_once_its_process_does_not_restart(tmp_path, monkeypatch):
    # process 1 failed before process 0 started (marker older than process 0's start): after
    # the restart grace, with no newer start of process 1, process 0 stops instead of hanging
    shared = tmp_path / "shared"
    units = shared / "toy" / "units"
    units.mkdir(parents=True)
    runner.write_text_atomic(units / ".started.process1", "0\n")
    runner.write_text_atomic(units / ".stopped.process1", "Interrupted: SIGTERM\n")
    old = time.time() - 10
    os.utime(units / ".started.process1", (old - 1, old - 1))
    os.utime(units / ".stopped.process1", (old, old))
    monkeypatch.setattr(runner, "_RESTART_GRACE_S", 0.3)
    with pytest.raises(Interrupted, match="process 1: Interrupted: SIGTERM"):
        _run(shared, process_index=0, process_count=2, wait_for_shares=True)


def test_run_batch_gets_the_seeds_of_one_configuration(tmp_path):
    sizes = []
    _run(tmp_path / "batched", experiment=make_toy(batch_sizes=sizes), seeds=3)
    assert sizes == [3] * 6
    _run(tmp_path / "plain", seeds=3)
    batched = (tmp_path / "batched" / "toy" / "results.csv").read_bytes()
    assert batched == (tmp_path / "plain" / "toy" / "results.csv").read_bytes()
    summary = json.loads((tmp_path / "batched" / "toy" / "summary.json").read_text())
    assert {u["batch_size"] for u in summary["units"]} == {3}
    sizes.clear()  # shares keep batches whole
    _run(tmp_path / "shared", experiment=make_toy(batch_sizes=sizes), seeds=3,
         process_index=1, process_count=2)  # fmt: skip
    assert sizes == [3] * 3


def test_progress_lines_and_bad_inputs(tmp_path, capsys):
    _run(tmp_path, quiet=False, jobs=2)
    err = capsys.readouterr().err
    # a unit is named by the settings that vary in the run (kind is "normal" in every unit)
    assert len(re.findall(r"\[\d+/12\] toy n=\d+ scale=[\d.]+ seed=\d [\d.e-]+ s\n", err)) == 12
    assert "kind=" not in err
    assert "jobs=2" in err
    with pytest.raises(ValueError, match="scale"):
        _run(tmp_path, scale="huge")
    with pytest.raises(ValueError, match="seeds"):
        _run(tmp_path, seeds=0)
    with pytest.raises(ValueError, match="process_index"):
        _run(tmp_path, process_index=2, process_count=2)
    clash = Experiment("clash", "", "", {"smoke": {"n": [1]}}, lambda u: {"n": 2},
                       default_scale="smoke")  # fmt: skip
    with pytest.raises(ValueError, match=r"repeat config keys"):
        _run(tmp_path, experiment=clash)
    assert not list((tmp_path / "clash" / "units").glob("*.json"))
    with pytest.raises(ValueError, match="slug"):
        Experiment("Bad Name", "", "", {"cpu": {}}, lambda u: {})


def test_registry_is_explicit_ordered_and_lazy(tmp_path, monkeypatch):
    (tmp_path / "lazy_toy_module.py").write_text(
        "from jaxbounds.experiments.runner import Experiment\n"
        "def make():\n"
        "    return Experiment('lazy', 'its own longer text', '', {'cpu': {'n': [1]}},\n"
        "                      lambda u: {})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = make_toy()
    registry = ExperimentRegistry([("lazy", "lazy_toy_module:make", "lazy toy"), toy])
    assert registry.names() == ("lazy", "toy")
    assert len(registry) == 2
    assert "lazy_toy_module" not in sys.modules
    assert registry.listing().splitlines()[0].split() == ["lazy", "lazy", "toy"]
    listing = registry.listing()
    assert registry.get("lazy").name == "lazy"
    assert registry.get("lazy") is registry.get("lazy")
    assert registry.get("toy") is toy
    # Importing a lazy entry changes neither its table description nor the listing.
    assert registry.description("lazy") == "lazy toy"
    assert registry.listing() == listing
    with pytest.raises(ValueError, match="unknown experiment 'x'; known: lazy, toy"):
        registry.get("x")
    with pytest.raises(ValueError, match="twice"):
        ExperimentRegistry([toy, toy])
    wrong = ExperimentRegistry([("toy", "jaxbounds.experiments.runner:DEFAULT_OUT", "")])
    with pytest.raises((ValueError, TypeError)):
        wrong.get("toy")


# ------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "case", ["exact", "exact_perfect", "exact_n40_one_discordant", "ties", "large", "constant"]
)
def test_kendall_tau_matches_scipy(case):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    x = np.arange(10.0)
    y = {
        "exact": lambda: x + rng.normal(scale=4.0, size=10),
        "exact_perfect": lambda: -x,
        "exact_n40_one_discordant": None,
        "ties": lambda: np.round(x / 3) + rng.integers(0, 2, size=10),
        "large": None,
        "constant": lambda: np.ones(10),
    }[case]
    if case == "exact_n40_one_discordant":
        x = np.arange(40.0)
        y = x.copy()
        y[[3, 4]] = y[[4, 3]]
    elif case == "large":
        x = rng.normal(size=60)
        y = 0.3 * x + rng.normal(size=60)
    else:
        y = y()
    ours = kendall_tau(x, y, backend="numpy")
    ref = stats.kendalltau(x, y)
    np.testing.assert_allclose([ours.tau, ours.p_value], [ref.statistic, ref.pvalue],
                               rtol=1e-10, atol=1e-300)  # fmt: skip
    auto = kendall_tau(x, y)
    np.testing.assert_allclose([auto.tau, auto.p_value], [ours.tau, ours.p_value], rtol=1e-10)
    expected = {"ties": "asymptotic", "large": "asymptotic", "constant": "undefined"}
    assert ours.method == expected.get(case, "exact")


def test_mean_spread_table_and_claim_lines():
    values = [1.0, 2.0, 4.0]
    spread = mean_spread(values)
    assert spread.mean == pytest.approx(np.mean(values))
    assert spread.std == pytest.approx(np.std(values, ddof=1))
    assert spread.stderr == pytest.approx(np.std(values, ddof=1) / np.sqrt(3))
    assert spread.format(2) == "2.3 ± 1.5"
    assert mean_spread([5.0]).format() == "5 (n=1, no spread)"
    table = markdown_table(["a", "b|c"], [[1, 0.123456], ["x|y", None]], align="lr")
    assert table == "| a | b\\|c |\n| --- | ---: |\n| 1 | 0.1235 |\n| x\\|y | n/a |\n"
    with pytest.raises(ValueError, match="row 0"):
        markdown_table(["a"], [[1, 2]])
    assert claim_line("Gap has no trend.", True, "tau = 0.1").startswith("- **reproduced**: Gap")
    assert "**not reproduced**" in claim_line("c", False, "e")
    assert "**inconclusive**" in claim_line("c", None, "e")


def _main(argv: list[str]) -> int:
    out_dir, sleep = argv[0], float(argv[1])
    try:
        run_experiment(make_toy(sleep=sleep), scale="smoke", seeds=2, out_dir=out_dir)
    except Interrupted as exc:
        print(exc, file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    # a test run started in the background hands its children SIGINT ignored, which the runner
    # keeps ignored (tested apart); this child stands for a run started from a terminal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(_main(sys.argv[1:]))


# ---------------------------------------------------------- issue 26: size, batches, lock, signals


def test_batches_are_cut_to_max_batch_size_with_the_same_rows(tmp_path):
    """--seeds 100000 used to hand one batch of 100,000 units to run_batch (9 GB in 60 s);
    batches now hold at most max_batch_size units, and the rows are those of whole batches."""
    sizes = []
    toy = dataclasses.replace(make_toy(batch_sizes=sizes), max_batch_size=2)
    _run(tmp_path / "cut", experiment=toy, seeds=5)
    assert sizes == [2, 2, 1] * 6  # 6 configurations x 5 seeds
    whole = []
    _run(tmp_path / "whole", experiment=make_toy(batch_sizes=whole), seeds=5)
    assert whole == [5] * 6
    csv_bytes = [(tmp_path / d / "toy" / "results.csv").read_bytes() for d in ("cut", "whole")]
    assert csv_bytes[0] == csv_bytes[1]
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="max_batch_size must be an int >= 1"):
            dataclasses.replace(make_toy(), max_batch_size=bad)


def test_a_run_too_large_is_refused_before_any_work(tmp_path):
    calls = []
    seeds = runner.MAX_UNITS // 6 + 1  # 6 configurations per seed at smoke scale
    with pytest.raises(runner.RunTooLarge) as info:
        _run(tmp_path, experiment=make_toy(calls=calls), seeds=seeds)
    assert info.value.per_seed == 6
    assert info.value.max_seeds == runner.MAX_UNITS // 6
    message = str(info.value)
    assert f"with {seeds:,} seeds would plan {6 * seeds:,} units (6 per seed)" in message
    assert f"the limit is {runner.MAX_UNITS:,} units per run" in message
    assert "MB of memory only to track them" in message
    assert calls == []
    assert not (tmp_path / "toy").exists()
    assert runner.check_size(make_toy(), "smoke", range(runner.MAX_UNITS // 6)) <= runner.MAX_UNITS
    with pytest.raises(runner.RunTooLarge, match="with 100,000,000,000,000,000,000 seeds"):
        _run(tmp_path, seeds=10**20)  # refused at once: range(10**20) is never expanded
    assert not (tmp_path / "toy").exists()


def test_a_second_run_on_the_same_place_stops_at_once(tmp_path):
    """Two runs on one --out both did all the work; the second now stops before any, naming the
    holder. The lock is an flock: released with its process, whatever ends it."""
    from jaxbounds._atomic import LockBusy, exclusive_lock

    units = tmp_path / "toy" / "units"
    units.mkdir(parents=True)
    calls = []
    with exclusive_lock(units / ".lock.process0"):
        with pytest.raises(LockBusy) as info:
            _run(tmp_path, experiment=make_toy(calls=calls))
        assert info.value.pid == os.getpid()
        assert str(info.value) == f"process {os.getpid()} holds the lock {units}/.lock.process0"
        assert calls == []
        assert not (tmp_path / "toy" / "results.csv").exists()
        # another share of the same place is not blocked
        _run(tmp_path, experiment=make_toy(calls=calls), process_index=1, process_count=2)
        assert calls
    assert _run(tmp_path).num_missing == 0  # released: the next run goes ahead


def test_the_lock_dies_with_its_process(tmp_path):
    """SIGKILL of the holder leaves no stale lock (the kernel releases an flock)."""
    from jaxbounds._atomic import exclusive_lock

    lock = tmp_path / ".lock.process0"
    source = str(REPO / "jaxbounds" / "_atomic.py")  # standard library only: no jax import
    holder = textwrap.dedent(f"""
        import importlib.util, sys, time
        spec = importlib.util.spec_from_file_location("atomic", {source!r})
        atomic = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(atomic)
        with atomic.exclusive_lock({str(lock)!r}):
            print("locked", flush=True)
            time.sleep(600)
    """)  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "locked\n"
        with pytest.raises(runner.LockBusy) as info, exclusive_lock(lock):
            pass
        assert info.value.pid == process.pid
    finally:
        process.kill()
        process.wait(timeout=60)
    with exclusive_lock(lock):  # no stale lock after SIGKILL
        pass


def _signalling_toy(calls, signum=signal.SIGINT):
    def run_unit(unit):
        calls.append(unit)
        if len(calls) == 1:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
        return _toy_result(unit)

    return dataclasses.replace(make_toy(), run_unit=run_unit)


def test_an_ignored_sigint_stays_ignored_and_a_default_one_stops(tmp_path):
    """The Unix convention, the same as ``jaxbounds estimate``'s: a background job started with
    SIGINT ignored keeps ignoring it; otherwise SIGINT stops the run between units."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        calls = []
        summary = _run(tmp_path / "ignored", experiment=_signalling_toy(calls))
        assert summary.num_missing == 0
        assert len(calls) == NUM_SMOKE_UNITS
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        calls = []  # SIGTERM still stops a job whose SIGINT is ignored
        with pytest.raises(Interrupted) as info:
            _run(tmp_path / "term", experiment=_signalling_toy(calls, signal.SIGTERM))
        assert (info.value.exit_code, len(calls)) == (143, 1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        calls = []
        with pytest.raises(Interrupted) as info:
            _run(tmp_path / "default", experiment=_signalling_toy(calls))
        assert info.value.exit_code == 130
        assert len(calls) == 1
    finally:
        signal.signal(signal.SIGINT, previous)


# --- issue 30: reports say n/a, never nan or a degenerate interval; brief progress lines -------


def test_reports_use_one_rule_for_undefined_cells_and_degenerate_intervals():
    from jaxbounds.experiments.runner import format_interval, format_mean_std, format_number

    nan = float("nan")
    table = markdown_table(["a", "b", "c", "d"], [[nan, None, "", " "], [1, 0.5, "x", 2.0]])
    assert table.splitlines()[2] == "| n/a | n/a | n/a | n/a |"
    assert table.splitlines()[3] == "| 1 | 0.5 | x | 2 |"
    assert format_number(nan) == "n/a"
    assert format_number(float("-inf")) == "-inf"
    # an interval over one value (one seed: every bootstrap resample agrees)
    assert format_interval(0.6666, 0.6666, signed=True) == "+0.67 (no spread over resamples)"
    assert format_interval(-0.5, 0.25, signed=True) == "[-0.50, +0.25]"
    assert format_interval(0.1234, 0.5678, 3) == "[0.123, 0.568]"
    assert format_interval(nan, 0.3) == "n/a"
    assert format_interval(None, None) == "n/a"
    assert format_mean_std(0.882, nan) == "0.882 (n=1, no spread)"
    assert format_mean_std(0.882, 0.0123) == "0.882 ± 0.0123"
    assert format_mean_std(nan, 0.1) == "n/a"
    assert mean_spread([]).format() == "n/a"
    assert mean_spread([2.0, nan]).format() == "n/a"


def test_unlink_missing_figures(tmp_path):
    from jaxbounds.experiments.runner import unlink_missing_figures

    (tmp_path / "drawn.png").write_bytes(b"png")
    text = "![a](drawn.png) ![b](gone.png)\n![web](https://example.org/x.png)\n"
    assert unlink_missing_figures(text, tmp_path, drawn=True) == (
        "![a](drawn.png) *(figure gone.png not drawn)*\n![web](https://example.org/x.png)\n"
    )
    # without matplotlib no figure was drawn by this run, not even one an older run left
    assert unlink_missing_figures(text, tmp_path, drawn=False) == (
        "*(figure drawn.png not drawn: matplotlib is not installed)* "
        "*(figure gone.png not drawn: matplotlib is not installed)*\n"
        "![web](https://example.org/x.png)\n"
    )


def test_progress_lines_name_a_unit_briefly():
    from jaxbounds.experiments.runner import PROGRESS_WIDTH, _progress_line, unit_labels

    big = {"model": {"layers": list(range(200))}, "data": "x" * 500}
    units = [Unit({**big, "lr": lr, "width": 8}, seed=s) for lr in (0.1, 0.01) for s in (0, 1)]
    assert unit_labels(units) == ["lr=0.1 seed=0", "lr=0.1 seed=1", "lr=0.01 seed=0",
                                  "lr=0.01 seed=1"]  # fmt: skip
    assert unit_labels(units[:1]) == ["seed=0"]
    many = [Unit({f"key{i}": "v" * 30 + str(s) for i in range(20)}, seed=s) for s in range(2)]
    line = _progress_line("[1/2] toy", unit_labels(many)[0], "0.5 s")
    assert len(line) <= PROGRESS_WIDTH
    assert line.startswith("[1/2] toy key0=")
    assert line.endswith(" ... 0.5 s")


def test_another_run_in_the_output_folder_is_refused(tmp_path):
    from jaxbounds.experiments.runner import OtherRunThere

    experiment = make_toy()
    run_experiment(experiment, scale="smoke", seeds=1, out_dir=tmp_path, quiet=True)
    report = (tmp_path / "toy" / "report.md").read_bytes()
    with pytest.raises(OtherRunThere, match=r"seeds \[0\] \(now \[0, 1\]\)") as err:
        run_experiment(experiment, scale="smoke", seeds=2, out_dir=tmp_path, quiet=True)
    assert err.value.differences == ["seeds [0] (now [0, 1])"]
    assert (tmp_path / "toy" / "report.md").read_bytes() == report
    (tmp_path / "toy" / "summary.json").write_text("{not json")
    with pytest.raises(OtherRunThere, match=r"summary\.json is unreadable"):
        run_experiment(experiment, scale="smoke", seeds=1, out_dir=tmp_path, quiet=True)
    summary = run_experiment(experiment, scale="smoke", seeds=2, out_dir=tmp_path, quiet=True,
                             fresh=True)  # fmt: skip
    assert summary.seeds == (0, 1)


def test_missing_packages_are_named_before_any_work(tmp_path):
    from jaxbounds.experiments.runner import MissingPackages

    calls = []
    needy = Experiment("needy", "", "", {"smoke": {"n": [1]}}, lambda u: calls.append(u) or {},
                       default_scale="smoke", requires=("no_such_module_x", "json"),
                       render_requires=("no_such_module_y",))  # fmt: skip
    with pytest.raises(MissingPackages, match="no_such_module_x, no_such_module_y") as err:
        run_experiment(needy, scale="smoke", out_dir=tmp_path)
    assert err.value.packages == ["no_such_module_x", "no_such_module_y"]
    assert "pip install no_such_module_x no_such_module_y" in str(err.value)
    assert calls == []
    assert not (tmp_path / "needy").exists()
    with pytest.raises(TypeError, match="requires must be import names"):
        Experiment("bad", "", "", {"cpu": {}}, lambda u: {}, requires=("",))


def test_a_second_signal_inside_a_gc_callback_is_sent_again_after_the_collection():
    # Python cannot raise out of a garbage collector's callback (it reports the exception to
    # sys.unraisablehook and goes on): the guard's hook sends the signal again, which then
    # raises outside the callback, and nothing is printed
    import gc

    seen = []

    def callback(phase, info):
        if phase == "start" and not seen:
            seen.append(phase)
            guard.handle(signal.SIGINT, None)  # the second signal, handled here: raises

    # a run started in the background by a shell ignores SIGINT, and the guard leaves an
    # ignored signal alone: the test takes SIGINT's default handler whatever started it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with SignalGuard() as guard:
            guard.requested = signal.SIGINT  # the first signal
            gc.callbacks.append(callback)
            try:
                gc.collect()  # the Interrupted raised in the callback goes to the hook
            finally:
                gc.callbacks.remove(callback)
            assert seen == ["start"]
            with pytest.raises(Interrupted):
                time.sleep(10)  # the signal sent again arrives within 0.05 s
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sys.unraisablehook != guard._unraisable  # restored


def test_a_run_under_another_precision_never_reuses_units(tmp_path, monkeypatch):
    # a run stopped in float32 and resumed with JAX_ENABLE_X64 mixed float32 and float64 rows
    from jaxbounds.experiments import runner
    from jaxbounds.report import job

    calls = []
    monkeypatch.setattr(job, "precision", lambda: "float32")
    _run(tmp_path, experiment=make_toy(calls=calls))
    float32_units = {p.name for p in _units(tmp_path)}
    assert runner._precision_tag() == ""  # the keys of float32 runs are the earlier versions'
    calls.clear()
    monkeypatch.setattr(job, "precision", lambda: "float64")
    assert runner._precision_tag() == "+x64"
    _run(tmp_path, experiment=make_toy(calls=calls), fresh=True)
    assert len(calls) == NUM_SMOKE_UNITS  # every unit computed again
    assert {p.name for p in _units(tmp_path)} > float32_units
