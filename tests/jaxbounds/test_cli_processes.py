"""The ``jaxbounds`` command in 2 processes (JAX's distributed runtime on 127.0.0.1) vs 1.

The processes are launched as docs/many-machines.md says: the same command in
each, with ``JAXBOUNDS_COORDINATOR``, ``JAXBOUNDS_NUM_PROCESSES`` and ``JAXBOUNDS_PROCESS_ID``.
A toy report (sections calling ``hessian_trace`` and ``average_sharpness``, sharded over both
processes' devices) and a toy experiment (units calling ``rademacher_linear``, each on the
devices of the process that runs it) keep the default run short; a one-process run of the same
commands, alongside, is the reference. The slow test runs the real ``tt-sequence-length``
experiment at smoke scale.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxbounds.cli import main
from tests.kernels.test_multiprocess import launch, multi_envs

ENV_NAMES = ("JAXBOUNDS_COORDINATOR", "JAXBOUNDS_PROCESS_ID", "JAXBOUNDS_NUM_PROCESSES")
TIMEOUT_S = 240

# Runs the commands of MP_COMMANDS (a JSON list of argv lists) one after the other in this
# process, each followed by a line "@@@ <command number> <exit status>" on stdout.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    import numpy as np

    import kernels
    from jaxbounds.cli import main
    from jaxbounds.experiments import registry as experiments_registry
    from jaxbounds.experiments.runner import Experiment, ExperimentRegistry
    from jaxbounds.report import registry
    from jaxbounds.report.facts import Run
    from jaxbounds.report.rows import Row


    def loss(p, batch):
        x, y = batch
        return 0.5 * jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)


    def build(key, *, quick=True):
        rng = np.random.default_rng(0)  # numpy: no eager JAX op to compile
        params = {"w1": 0.5 * rng.normal(size=(5, 6)).astype(np.float32),
                  "w2": 0.5 * rng.normal(size=(6,)).astype(np.float32)}
        train = {"x": rng.normal(size=(24, 5)).astype(np.float32),
                 "y": rng.normal(size=(24,)).astype(np.float32)}
        return Run(name="toy", model=None, apply_fn=None, params=params, loss_fn=loss,
                   train=train, facts=None, key=key, quick=quick, meta={})


    def curvature(run):
        batch = (run.train["x"], run.train["y"])
        # 13 probes in chunks of 3 over 2 devices: uneven shares, padding used
        est = kernels.hessian_trace(loss, run.params, batch, run.section_key("curvature"),
                                    num_samples=13, method="hutchinson", chunk_size=3)
        return [Row("curvature", "tr H", float(est.mean), stderr=float(est.stderr))]


    def sharp(run):
        batch = (run.train["x"], run.train["y"])
        est = kernels.average_sharpness(
            loss, run.params, batch, run.section_key("sharpness"),
            perturbation=kernels.Perturbation("gaussian", 0.1), num_samples=13, chunk_size=2)
        return [Row("sharpness", "average sharpness", float(est.mean), stderr=float(est.stderr))]


    def unit(u):
        calls = Path(os.environ["TOY_CALLS"])
        calls.mkdir(parents=True, exist_ok=True)
        (calls / f"{jax.process_index()}-n{u.config['n']}-s{u.seed}").touch()
        # inputs of one shape for every unit: one compilation
        x = np.random.default_rng([u.seed, u.config["n"]]).normal(size=(8, 3)).astype(np.float32)
        est = kernels.rademacher_linear(x, jax.random.key(u.seed), norm=2, radius=1.0,
                                        num_samples=9, chunk_size=2)
        return {"rademacher": float(est.mean), "stderr": float(est.stderr)}


    TOY = Experiment("toy", "a toy", "Nobody 2024", {"smoke": {"n": [2, 3, 5]}}, run_unit=unit,
                     default_seeds=2, default_scale="smoke")
    experiments_registry.REGISTRY = ExperimentRegistry([TOY])
    SECTIONS = [registry.Section("curvature", curvature, ("toy",)),
                registry.Section("sharpness", sharp, ("toy",))]
    with registry.using({"toy": build}, SECTIONS):
        for number, argv in enumerate(json.loads(os.environ["MP_COMMANDS"])):
            code = main(argv)
            sys.stdout.flush()
            print(f"@@@ {number} {code}", flush=True)
    """
)


def _commands(out: Path) -> list[list[str]]:
    return [
        ["estimate", "--model", "toy", "--out", str(out / "estimate")],
        ["reproduce", "toy", "--out", str(out / "reproduce")],
        ["reproduce", "toy", "--from", str(out / "reproduce")],  # re-render: process 0 alone
    ]


def _outputs(stdout: str) -> list[tuple[int, str]]:
    """Each command's (exit status, stdout), split at the ``@@@`` lines."""
    found, lines = [], []
    for line in stdout.splitlines():
        if line.startswith("@@@ "):
            found.append((int(line.split()[2]), "\n".join(lines)))
            lines = []
        else:
            lines.append(line)
    return found


def _table(text: str) -> str:
    """The printed table without its wall times and the output path."""
    keep = [ln for ln in text.splitlines() if not ln.startswith(("time (s):", "wrote "))]
    return "\n".join(keep)


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    single, shared = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("shared")
    envs = [
        {**env, "TOY_CALLS": str(shared / "calls"), "MP_COMMANDS": json.dumps(_commands(shared))}
        for env in multi_envs(2, *ENV_NAMES)
    ]
    alone = {"TOY_CALLS": str(single / "calls"), "MP_COMMANDS": json.dumps(_commands(single))}
    runs = launch(["-c", SCRIPT], [*envs, alone], TIMEOUT_S)  # the reference runs alongside
    for index, (code, _, err) in enumerate(runs):
        assert code == 0, f"process {index} ended with {code}: {err[-4000:]}"
    return single, shared, runs


def test_estimate_on_two_processes_prints_the_one_process_table(toy_runs):
    single, shared, runs = toy_runs
    (main_code, main_out), *_ = _outputs(runs[0][1])
    (other_code, other_out), *_ = _outputs(runs[1][1])
    (alone_code, alone_out), *_ = _outputs(runs[2][1])
    assert main_code == other_code == alone_code == 0
    assert "tr H" in main_out
    assert "average sharpness" in main_out
    assert _table(main_out) == _table(alone_out)
    assert other_out == ""  # process 1 prints nothing: no table, no gloo line
    assert "[jaxbounds]" not in runs[1][2]  # and no progress messages on stderr
    assert "[jaxbounds] curvature ..." in runs[0][2]
    assert sorted(p.name for p in (shared / "estimate").iterdir()) == ["report_toy.json"]
    got = json.loads((shared / "estimate" / "report_toy.json").read_text())
    want = json.loads((single / "estimate" / "report_toy.json").read_text())
    assert [r["name"] for r in got["rows"]] == [r["name"] for r in want["rows"]]
    for row_got, row_want in zip(got["rows"], want["rows"], strict=True):
        # float32 samples; 2 devices merge their per-device summaries in another order than
        # 1 device (reassociation): measured equal to the last digit here, 1e-5 leaves room
        for field in ("value", "stderr"):
            np.testing.assert_allclose(row_got[field], row_want[field], rtol=1e-5)


def test_reproduce_on_two_processes_writes_the_one_process_files(toy_runs):
    single, shared, runs = toy_runs
    _, (main_code, main_out), _ = _outputs(runs[0][1])
    _, (other_code, other_out), _ = _outputs(runs[1][1])
    assert main_code == other_code == 0
    assert main_out.endswith(f"toy: 6 of 6 units in {shared / 'reproduce' / 'toy'}")
    assert other_out == ""
    for name in ("results.csv", "report.md"):
        got = (shared / "reproduce" / "toy" / name).read_bytes()
        assert got == (single / "reproduce" / "toy" / name).read_bytes(), name
    summaries = [
        json.loads((root / "reproduce" / "toy" / "summary.json").read_text())
        for root in (shared, single)
    ]
    for summary in summaries:  # wall times and the devices listed differ; nothing else does
        assert len(summary.pop("machine")["jax_devices"]) == (2 if summary is summaries[0] else 1)
        del summary["total_unit_time_s"]
        for unit in summary["units"]:
            del unit["wall_time_s"]
    assert summaries[0] == summaries[1]
    # every unit ran exactly once, on the process whose round-robin share it is
    calls = sorted(p.name for p in (shared / "calls").iterdir())
    units = [f"n{n}-s{s}" for n in (2, 3, 5) for s in (0, 1)]
    assert sorted(c.split("-", 1)[1] for c in calls) == sorted(units)
    assert calls == sorted(f"{i % 2}-{u}" for i, u in enumerate(units))


def test_rerendering_on_two_processes_checks_on_every_process_then_process_0_renders(toy_runs):
    """``--from`` on 2 processes: both check the place (a collective), process 1 then stops and
    process 0 re-renders, byte for byte the files of the run."""
    single, shared, runs = toy_runs
    *_, (main_code, main_out) = _outputs(runs[0][1])
    *_, (other_code, other_out) = _outputs(runs[1][1])
    assert (main_code, other_code, other_out) == (0, 0, "")
    assert main_out.endswith(f"toy: 6 of 6 units in {shared / 'reproduce' / 'toy'}")
    for name in ("results.csv", "report.md"):
        got = (shared / "reproduce" / "toy" / name).read_bytes()
        assert got == (single / "reproduce" / "toy" / name).read_bytes(), name


def test_process_flags_that_contradict_the_runtime_stop_every_process(tmp_path):
    argv = ["reproduce", "toy", "--out", str(tmp_path), "--process-index", "0"]
    envs = [
        {**env, "TOY_CALLS": str(tmp_path / "calls"), "MP_COMMANDS": json.dumps([argv])}
        for env in multi_envs(2, *ENV_NAMES)
    ]
    runs = launch(["-c", SCRIPT], envs, TIMEOUT_S)
    assert [_outputs(out) for _, out, _ in runs] == [[(2, "")], [(2, "")]]
    assert "another process refused its options" in runs[0][2]
    assert "--process-index 0: this process runs as process 1 of 2" in runs[1][2]
    assert not (tmp_path / "calls").exists()  # nothing ran


@pytest.mark.parametrize("command", ["estimate", "reproduce"])
def test_a_malformed_layout_variable_is_a_usage_error(command, tmp_path, capsys, monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAXBOUNDS_NUM_PROCESSES", "two")
    argv = {"estimate": ["estimate"], "reproduce": ["reproduce", "tt-sequence-length"]}[command]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"jaxbounds {command}: error: num_processes (from JAXBOUNDS_NUM_PROCESSES='two'):"
        " expected an integer\n"
    )
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


# ``jaxbounds ARGV`` with ARGV (a JSON list) from MP_ARGV, so that each process has its own
CLI = (
    "import json, os, sys; from jaxbounds.cli import main; "
    "sys.exit(main(json.loads(os.environ['MP_ARGV'])))"
)


@pytest.mark.slow
def test_real_experiment_on_two_processes_gives_the_same_bytes(tmp_path):
    # tt-sequence-length at smoke scale (6 units); measured with 4: 236 s for the three processes
    # together (2 + the reference) on a 2-core machine at load average 13 (alone: about 70 s)
    def argv(out):
        cmd = ["reproduce", "tt-sequence-length", "--scale", "smoke", "--out", str(out)]
        return json.dumps([*cmd, "--quiet"])

    envs = [{**env, "MP_ARGV": argv(tmp_path / "shared")} for env in multi_envs(2, *ENV_NAMES)]
    runs = launch(["-c", CLI], [*envs, {"MP_ARGV": argv(tmp_path / "single")}], TIMEOUT_S * 3)
    for index, (code, _, err) in enumerate(runs):
        assert code == 0, f"process {index} ended with {code}: {err[-4000:]}"
    run_dir = "tt-sequence-length"
    where = re.escape(str(tmp_path / "shared" / run_dir))
    assert re.match(rf"{run_dir}: (\d+) of \1 units in {where}", runs[0][1]), runs[0][1]
    assert runs[1][1] == ""
    for name in ("results.csv", "report.md"):
        got = (tmp_path / "shared" / run_dir / name).read_bytes()
        assert got == (tmp_path / "single" / run_dir / name).read_bytes(), name
