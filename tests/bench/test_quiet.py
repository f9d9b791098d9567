"""bench/_quiet.py: the quiet-machine guard, on fake /proc/stat, getrusage and load readings."""

from __future__ import annotations

import io
import json
import resource
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import _quiet as quiet  # noqa: E402

TICKS = 100


def stat_line(busy: int, idle: int) -> str:
    """A /proc/stat whose busy jiffies (user + nice + system + irq + softirq + steal) are ``busy``;
    iowait and guest are set too, and must not count (guest is inside user already)."""
    user, nice, system, irq, softirq = busy - 40, 10, 20, 4, 6
    steal = busy - (user + nice + system + irq + softirq)
    return (
        f"cpu  {user} {nice} {system} {idle} 77 {irq} {softirq} {steal} 500 0\n"
        f"cpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2 3\n"
    )


class FakeMachine:
    """Counters a test advances: /proc/stat's busy jiffies, this process's and its children's
    CPU seconds, the load average and the clock."""

    def __init__(self, tmp_path, cpu_count=2):
        self.path = tmp_path / "stat"
        self.busy, self.self_s, self.children_s = 10_000, 5.0, 1.0
        self.load, self.now, self.cpu_count = (0.3, 0.4), 100.0, cpu_count
        self.write()

    def write(self):
        self.path.write_text(stat_line(self.busy, idle=123_456))

    def advance(self, *, wall, others_cores, self_s=0.0, children_s=0.0, load=None):
        self.now += wall
        self.self_s += self_s
        self.children_s += children_s
        own = self_s + children_s
        self.busy += round((others_cores * wall + own) * TICKS)
        if load is not None:
            self.load = load
        self.write()

    def getrusage(self, who):
        total = self.self_s if who == resource.RUSAGE_SELF else self.children_s
        # split into user and system time: both count
        return SimpleNamespace(ru_utime=0.75 * total, ru_stime=0.25 * total)

    def probe(self):
        return quiet.Probe(
            proc_stat=str(self.path),
            ticks=TICKS,
            getrusage=self.getrusage,
            getloadavg=lambda: self.load,
            clock=lambda: self.now,
            cpu_count=self.cpu_count,
        )


def test_busy_seconds_reads_the_busy_states(tmp_path):
    path = tmp_path / "stat"
    path.write_text(stat_line(1234, idle=99_999))
    assert quiet.busy_seconds(str(path), ticks=TICKS) == pytest.approx(12.34, abs=1e-12)


def test_busy_seconds_is_none_without_proc_stat(tmp_path):
    assert quiet.busy_seconds(str(tmp_path / "missing"), ticks=TICKS) is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert quiet.busy_seconds(str(tmp_path / "odd"), ticks=TICKS) is None


def test_others_cores_subtract_this_process_and_its_children(tmp_path):
    m = FakeMachine(tmp_path)
    mon = quiet.Monitor(m.probe())
    # 10 s of wall: this process 12 CPU-s and its children 4 CPU-s (1.6 cores), others 0.1 cores
    m.advance(wall=10.0, others_cores=0.1, self_s=12.0, children_s=4.0, load=(2.5, 1.1))
    c = mon.stop()
    assert c.wall_s == pytest.approx(10.0)
    assert c.own_cores == pytest.approx(1.6)
    assert c.others_cores == pytest.approx(0.1, abs=1e-9)
    assert c.load_start == (0.3, 0.4)
    assert c.load_end == (2.5, 1.1)  # recorded, not tested: it counts the benchmark itself
    assert c.cpu_count == 2
    assert c.quiet
    assert c.reasons == []


def test_busy_others_make_the_run_loud(tmp_path):
    m = FakeMachine(tmp_path)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=20.0, others_cores=1.3, self_s=20.0)
    c = mon.stop()
    assert c.others_cores == pytest.approx(1.3, abs=1e-9)
    assert not c.quiet
    assert c.reasons == ["other processes used 1.30 of 2 cores on average (limit 0.25)"]


def test_limits_are_inclusive(tmp_path):
    m = FakeMachine(tmp_path)
    m.load = (quiet.MAX_LOAD_START, 0.0)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=100.0, others_cores=quiet.MAX_OTHERS_CORES)
    assert mon.stop().quiet
    m.load = (quiet.MAX_LOAD_START + 0.01, 0.0)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=100.0, others_cores=quiet.MAX_OTHERS_CORES + 0.01)
    assert len(mon.stop().reasons) == 2


def test_start_load_is_tested_and_without_proc_stat_only_it(tmp_path):
    m = FakeMachine(tmp_path)
    m.load = (1.8, 0.9)
    probe = m.probe()
    probe.proc_stat = str(tmp_path / "missing")  # not Linux
    mon = quiet.Monitor(probe)
    m.advance(wall=5.0, others_cores=1.9)
    c = mon.stop()
    assert c.others_cores is None
    assert c.reasons == ["the 1-min load average at the start was 1.80 (limit 1.0)"]


def loud_conditions(tmp_path):
    m = FakeMachine(tmp_path)
    m.load = (3.1, 2.0)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=30.0, others_cores=1.3, self_s=30.0)
    return mon.stop()


def quiet_conditions(tmp_path):
    m = FakeMachine(tmp_path)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=30.0, others_cores=0.05, self_s=30.0)
    return mon.stop()


def sections():
    return {"speed": quiet.Section(summary={"ratio": 1.07}, table="| a | b |\n|---|---|\n| 1 | 2 |",
                                   records=[{"variant": "x", "median": 0.5}])}  # fmt: skip


def test_refusal_writes_nothing_prints_records_and_says_why(tmp_path, capsys):
    cond = loud_conditions(tmp_path)
    err = io.StringIO()
    out = tmp_path / "results"
    code = quiet.save("gauss_newton", sections(), cond, quick=True, out=str(out), stream=err)
    assert code == quiet.REFUSED_EXIT != 0
    assert not out.exists()
    assert err.getvalue() == (
        "gauss_newton_quick: tables not written: other processes used 1.30 of 2 cores on "
        "average (limit 0.25); the 1-min load average at the start was 3.10 (limit 1.0); rerun "
        "on a quiet machine or pass --allow-load to write them marked as measured under load\n"
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["record"] == "refused"
    assert printed["sections"]["speed"]["records"] == [{"variant": "x", "median": 0.5}]
    assert printed["sections"]["speed"]["summary"] == {"ratio": 1.07}


def test_allow_load_writes_tables_that_state_the_load(tmp_path):
    cond = loud_conditions(tmp_path)
    out = tmp_path / "results"
    code = quiet.save("curvature", sections(), cond, allow_load=True, out=str(out))
    assert code == 0
    doc = json.loads((out / "curvature.json").read_text())
    sec = doc["sections"]["speed"]
    assert sec["allow_load"] is True
    assert sec["conditions"]["quiet"] is False
    assert sec["conditions"]["others_cores"] == pytest.approx(1.3, abs=1e-9)
    assert "**under load**: other processes used 1.30 of 2 cores on average" in sec["table"]
    assert "| 1 | 2 |" in sec["table"]
    md = (out / "curvature.md").read_text()
    assert "under load" in md
    assert "| 1 | 2 |" in md


def test_quiet_run_writes_and_only_replaces_its_sections(tmp_path):
    out = tmp_path / "results"
    cond = quiet_conditions(tmp_path)
    assert quiet.save("gauss_newton", sections(), cond, out=str(out)) == 0
    memory = {"memory": quiet.Section(summary={"mb": 3}, table="| m |", timed=False)}
    # a load-free section is written whatever the load, keeping the timed one
    assert quiet.save("gauss_newton", memory, loud_conditions(tmp_path), out=str(out)) == 0
    doc = json.loads((out / "gauss_newton.json").read_text())
    assert list(doc["sections"]) == ["speed", "memory"]
    assert doc["sections"]["speed"]["table"].startswith("Measured ")
    assert (
        "quiet machine: other processes used 0.05 of 2 cores" in doc["sections"]["speed"]["table"]
    )
    assert "not timed (other processes used 1.30 of 2 cores" in doc["sections"]["memory"]["table"]
    assert not (out / "gauss_newton_quick.json").exists()


def test_interleaved_tables_say_so_under_load(tmp_path):
    cond = loud_conditions(tmp_path)
    sec = quiet.Section(summary={}, table="| r |", interleaved=True)
    text = quiet.table_with_statement(sec, cond)
    assert "timed interleaved in one run" in text
    # still refused without the flag: one flag decides, the table states it
    assert quiet.save("x", {"s": sec}, cond, out=str(tmp_path / "o"), stream=io.StringIO()) == 3


def test_conditions_round_trip(tmp_path):
    cond = loud_conditions(tmp_path)
    again = quiet.Conditions.from_dict(json.loads(json.dumps(cond.to_dict())))
    assert again == cond
    assert again.reasons == cond.reasons


def test_finish_exits_nonzero_when_refused_and_writes_with_the_flag(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quiet.add_arguments(parser)
    cond = loud_conditions(tmp_path)
    args = parser.parse_args(["--quick", "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit) as exc:
        quiet.finish("scale", sections(), cond, args)
    assert exc.value.code == quiet.REFUSED_EXIT
    assert not (tmp_path / "r").exists()
    args = parser.parse_args(["--quick", "--allow-load", "--out", str(tmp_path / "r")])
    quiet.finish("scale", sections(), cond, args)
    assert (tmp_path / "r" / "scale_quick.md").exists()


def test_combine_weights_the_parts_by_their_wall_time(tmp_path):
    m = FakeMachine(tmp_path)
    mon = quiet.Monitor(m.probe())
    m.advance(wall=10.0, others_cores=0.1, self_s=15.0, load=(1.5, 1.0))
    first = mon.stop()
    mon = quiet.Monitor(m.probe())
    m.advance(wall=30.0, others_cores=0.5, children_s=30.0, load=(2.0, 1.5))
    second = mon.stop()
    run = quiet.combine([first, second])
    assert run.wall_s == pytest.approx(40.0)
    assert run.others_cores == pytest.approx((0.1 * 10 + 0.5 * 30) / 40, abs=1e-9)
    assert run.own_cores == pytest.approx(45.0 / 40)
    assert run.load_start == (0.3, 0.4)
    assert run.load_end == (2.0, 1.5)
    assert run.reasons == ["other processes used 0.40 of 2 cores on average (limit 0.25)"]
    with pytest.raises(ValueError, match="no conditions"):
        quiet.combine([])
