"""run_estimate on a toy registry: order, metadata, checks before work, stop, resume."""

import jax
import jax.numpy as jnp
import pytest

from jaxbounds.report import registry
from jaxbounds.report.facts import Run
from jaxbounds.report.job import JobConfig, check_seed, job_config, precision, run_estimate
from jaxbounds.report.rows import Report, Row


@pytest.fixture
def toy():
    """A toy model and three sections whose numbers derive from the seed and their names."""
    calls = {"build": 0, "first": 0, "second": 0, "third": 0}

    def build(key, *, quick=True):
        calls["build"] += 1
        return Run(
            name="toy", model=None, apply_fn=lambda p, x: x, params={"w": jnp.ones(3)},
            loss_fn=lambda p, b: jnp.sum(p["w"]), train={}, facts=None, key=key, quick=quick,
            meta={"width": 3},
        )  # fmt: skip

    def section(name):
        def fn(run):
            calls[name] += 1
            run.meta[f"{name}_seconds"] = 0.0
            value = float(jax.random.normal(run.section_key(name)))
            return [Row(name, f"{name} value", value), Row(name, f"{name} note", "text")]

        return fn

    sections = [registry.Section(n, section(n), ("toy",)) for n in ("first", "second", "third")]
    sections.append(registry.Section("lonely", section("first"), ("other",)))
    with registry.using({"toy": build, "other": build}, sections):
        yield calls


def test_selected_sections_in_report_order(toy):
    messages = []
    report = run_estimate("toy", seed=5, sections=["third", "first"], log=messages.append)
    assert [r.section for r in report.rows] == ["first", "first", "third", "third"]
    assert messages == ["[jaxbounds] first ...", "[jaxbounds] third ..."]
    meta = report.meta
    assert (meta["seed"], meta["quick"], meta["sections"]) == (5, True, ["first", "third"])
    assert meta["job"]["scale"] == "quick"
    assert list(meta["timings_s"]) == ["build", "first", "third"]
    assert meta["width"] == 3  # the run's own metadata is merged in
    assert "third_seconds" in meta
    assert report.complete
    assert report.sections_done == ["first", "third"]
    assert toy["second"] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "nope"}, "model"),
        ({"sections": ["nope"]}, "sections: unknown"),
        ({"sections": []}, "selects nothing"),
        ({"sections": ["lonely"]}, "selects nothing for model 'toy'"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_bad_jobs_raise_before_building(toy, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_estimate(**{"model": "toy", **kwargs}, log=None)
    assert toy["build"] == 0


def test_check_seed_range():
    assert check_seed(0) == 0
    assert check_seed(2**32 - 1) == 2**32 - 1


def test_stop_between_sections_keeps_what_finished(toy):
    partials = []
    report = run_estimate(
        "toy", seed=1, log=None, on_section=partials.append,
        should_stop=lambda: len(partials) >= 1,
    )  # fmt: skip
    assert not report.complete
    assert report.sections_done == ["first"]
    assert [r.section for r in report.rows] == ["first", "first"]
    assert len(partials) == 1
    assert not partials[0].complete
    assert (toy["second"], toy["third"]) == (0, 0)
    stopped = run_estimate("toy", seed=1, log=None, should_stop=lambda: True)
    assert (stopped.complete, stopped.rows, toy["build"]) == (False, [], 1)


def test_resume_skips_finished_sections_and_ends_with_the_same_numbers(toy):
    whole = run_estimate("toy", seed=9, log=None)
    partials = []
    run_estimate("toy", seed=9, log=None, on_section=partials.append,
                 should_stop=lambda: len(partials) >= 2)  # fmt: skip
    saved = Report.from_dict(partials[-1].to_dict())  # as read back from its file
    assert saved.sections_done == ["first", "second"]
    before = dict(toy)
    messages = []
    resumed = run_estimate("toy", seed=9, log=messages.append, resume=saved)
    assert resumed.complete
    assert resumed.rows == whole.rows
    assert resumed.meta["resumed"] == ["first", "second"]
    assert messages == ["[jaxbounds] resuming: first, second done in the saved report",
                        "[jaxbounds] third ..."]  # fmt: skip
    assert (toy["first"], toy["second"]) == (before["first"], before["second"])
    assert toy["third"] == before["third"] + 1
    # Nothing left to run: no build at all.
    done = Report.from_dict({**resumed.to_dict(), "complete": False})
    builds = toy["build"]
    assert run_estimate("toy", seed=9, log=None, resume=done).rows == whole.rows
    assert toy["build"] == builds


def test_resume_refuses_another_job(toy):
    partials = []
    run_estimate("toy", seed=2, log=None, on_section=partials.append, should_stop=lambda: True)
    run_estimate("toy", seed=2, log=None, on_section=partials.append,
                 should_stop=lambda: bool(partials))  # fmt: skip
    with pytest.raises(ValueError, match=r"another job: seed 2 \(now 3\)"):
        run_estimate("toy", seed=3, log=None, resume=partials[0])
    with pytest.raises(ValueError, match="sections"):
        run_estimate("toy", seed=2, sections=["first"], log=None, resume=partials[0])


def test_job_config_fingerprint(toy):
    config = job_config("toy", seed=4, quick=False, sections=["second"])
    assert config == JobConfig("toy", 4, False, ("second",), config.version, precision())
    assert config.precision == "float64"  # this suite's (x64 on)
    assert config.to_dict()["scale"] == "full"
    assert config.differences(config.to_dict()) == []
    assert config.differences(None) == ["no job configuration recorded"]


def test_timing_line_adds_up_and_puts_training_in_the_build():
    """Issue 26: the line put the training under "build" and printed "training 0.0" beside it.
    Now the build is split into its training run (the record's wall time) and the rest, the
    sections are summed apart, and total = build + sections."""
    import re
    import time
    import types

    from jaxbounds.report.render import format_table

    def build(key, *, quick=True):
        time.sleep(0.05)  # data and model
        run = Run(
            name="toy", model=None, apply_fn=lambda p, x: x, params={"w": jnp.ones(3)},
            loss_fn=lambda p, b: jnp.sum(p["w"]), train={}, facts=None, key=key, quick=quick,
            meta={},
        )  # fmt: skip
        run.record = types.SimpleNamespace(seconds=0.02)  # what the training loop measured
        return run

    sections = [registry.Section("training", lambda run: [Row("training", "x", 1.0)], ("toy",))]
    with registry.using({"toy": build}, sections):
        report = run_estimate("toy", log=None)
    timings, parts = report.meta["timings_s"], report.meta["build_timings_s"]
    assert list(parts) == ["training run", "data and model"]
    assert parts["training run"] == 0.02
    assert sum(parts.values()) == pytest.approx(timings["build"], rel=1e-12)
    assert timings["build"] >= 0.05
    line = format_table(report).splitlines()[-1]
    numbers = re.fullmatch(
        r"time \(s\): build ([\d.]+) \(training run 0\.0, data and model ([\d.]+)\); "
        r"sections ([\d.]+) \(training ([\d.]+)\); total ([\d.]+)",
        line,
    )
    assert numbers, line
    build_s, _, sections_s, _, total = (float(x) for x in numbers.groups())
    assert total == pytest.approx(build_s + sections_s, abs=0.051)  # printed to 0.1 s


def test_a_job_under_another_precision_is_another_job(toy, monkeypatch):
    # a partial report of a float32 run resumed with JAX_ENABLE_X64 kept float32 training rows
    # beside float64 bounds of another trained model, and said it was complete
    from jaxbounds.report import job

    monkeypatch.setattr(job, "precision", lambda: "float32")
    partials = []
    run_estimate("toy", seed=2, log=None, on_section=partials.append,
                 should_stop=lambda: bool(partials))  # fmt: skip
    assert partials[0].meta["job"]["precision"] == "float32"
    monkeypatch.setattr(job, "precision", lambda: "float64")
    with pytest.raises(ValueError, match=r"another job: precision float32 \(now float64\)"):
        run_estimate("toy", seed=2, log=None, resume=partials[0])
    older = {k: v for k, v in partials[0].meta["job"].items() if k != "precision"}
    assert job_config("toy", seed=2).differences(older) == ["precision float32 (now float64)"]
    monkeypatch.setattr(job, "precision", lambda: "float32")
    assert job_config("toy", seed=2).differences(older) == []  # recorded before: float32
