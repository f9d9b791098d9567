"""The quiet-machine guard shared by the timing benchmarks in ``bench/``.

A timing benchmark measures the machine as much as the code when other processes share its
cores, so a script records the conditions of its run and writes its results tables only when the
run was quiet:

- other processes used at most :data:`MAX_OTHERS_CORES` cores on average during the run (Linux:
  the busy CPU time of the whole machine from ``/proc/stat`` over the run, minus this process's
  and its waited-for children's CPU time from ``resource.getrusage``, divided by the wall time);
- the 1-minute load average at the start was at most :data:`MAX_LOAD_START` (the load average at
  the end counts the benchmark itself, so it is recorded, not tested).

Otherwise the script prints its records to stdout (nothing measured is lost), says in one line on
stderr which number exceeded which limit and how to override, writes nothing and exits with
:data:`REFUSED_EXIT`. With ``--allow-load`` it writes its tables, and each table states the
condition it was measured under ("under load: other processes used 1.30 of 2 cores").

The records go to ``<out>/<name>.json`` (``name`` is the script's stem, ``_quick`` appended for
``--quick``), one entry per section of the script, each with its conditions, summary, records
and rendered table; a run of some sections (``--only``) replaces those sections and keeps the
others. ``<out>/<name>.md`` holds every section's table. ``bench/render_docs.py`` copies the
tables into the docs' marked blocks.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable

MAX_OTHERS_CORES = 0.25  # cores used by other processes, on average over the run
MAX_LOAD_START = 1.0  # 1-minute load average when the run starts
REFUSED_EXIT = 3  # exit status of a script that refused to write its tables
ALLOW_FLAG = "--allow-load"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def busy_seconds(path: str = "/proc/stat", ticks: int | None = None) -> float | None:
    """CPU seconds the whole machine has spent busy since boot (all cores), or None off Linux.

    The first line of ``/proc/stat`` counts jiffies per state: user, nice, system, idle, iowait,
    irq, softirq, steal, guest, guest_nice. Busy = user + nice + system + irq + softirq + steal
    (guest time is already inside user and nice).
    """
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    fields = [int(x) for x in first[1:]] + [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    if ticks is None:
        ticks = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / ticks


def own_cpu_seconds(getrusage: Callable = resource.getrusage) -> float:
    """User + system CPU seconds of this process and of its terminated, waited-for children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclasses.dataclass(frozen=True)
class Reading:
    """The machine's counters at one instant."""

    wall: float
    busy_s: float | None
    own_s: float
    load: tuple[float, float]


@dataclasses.dataclass
class Probe:
    """Where the counters come from (replaced by fakes in the tests)."""

    proc_stat: str = "/proc/stat"
    ticks: int | None = None
    getrusage: Callable = resource.getrusage
    getloadavg: Callable = os.getloadavg
    clock: Callable = time.monotonic
    cpu_count: int | None = dataclasses.field(default_factory=os.cpu_count)

    def read(self) -> Reading:
        load = self.getloadavg()
        return Reading(
            wall=self.clock(),
            busy_s=busy_seconds(self.proc_stat, self.ticks),
            own_s=own_cpu_seconds(self.getrusage),
            load=(float(load[0]), float(load[1])),
        )


@dataclasses.dataclass(frozen=True)
class Conditions:
    """The conditions of one run and whether it was quiet."""

    cpu_count: int | None
    wall_s: float
    load_start: tuple[float, float]
    load_end: tuple[float, float]
    others_cores: float | None  # None off Linux (no /proc/stat)
    own_cores: float
    max_others_cores: float = MAX_OTHERS_CORES
    max_load_start: float = MAX_LOAD_START
    date: str = ""
    machine: str = ""

    @property
    def reasons(self) -> list[str]:
        """Each limit the run exceeded, with its number."""
        out = []
        if self.others_cores is not None and self.others_cores > self.max_others_cores:
            out.append(
                f"other processes used {self.others_cores:.2f} of {self.cpu_count} cores on "
                f"average (limit {self.max_others_cores})"
            )
        if self.load_start[0] > self.max_load_start:
            out.append(
                f"the 1-min load average at the start was {self.load_start[0]:.2f} "
                f"(limit {self.max_load_start})"
            )
        return out

    @property
    def quiet(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(quiet=self.quiet, reasons=self.reasons)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Conditions:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["load_start"], kw["load_end"] = tuple(kw["load_start"]), tuple(kw["load_end"])
        return cls(**kw)

    def statement(self, *, timed: bool = True, interleaved: bool = False) -> str:
        """One sentence for the top of a table: the run's date, machine and load."""
        others = (
            "other processes' CPU not measured"
            if self.others_cores is None
            else f"other processes used {self.others_cores:.2f} of {self.cpu_count} cores"
        )
        load = f"1-min load average {self.load_start[0]:.2f} at the start"
        where = ", ".join(x for x in (self.date or "(date not recorded)", self.machine) if x)
        if not timed:
            return f"Measured {where}; not timed ({others} on average)."
        if self.quiet:
            return f"Measured {where}, quiet machine: {others} on average, {load}."
        tail = (
            " The ratios were timed interleaved in one run; absolute times are not a quiet "
            "machine's."
            if interleaved
            else " Not a quiet machine's numbers."
        )
        return f"Measured {where}, **under load**: " + "; ".join(self.reasons) + "." + tail


def machine() -> str:
    """The CPU model and core count (Linux: ``/proc/cpuinfo``), else the platform."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


class Monitor:
    """Counters read at the start of a run; :meth:`stop` gives the run's :class:`Conditions`."""

    def __init__(self, probe: Probe | None = None):
        self.probe = probe or Probe()
        self.start = self.probe.read()

    def stop(self) -> Conditions:
        end = self.probe.read()
        wall = max(end.wall - self.start.wall, 1e-9)
        own = end.own_s - self.start.own_s
        others = None
        if self.start.busy_s is not None and end.busy_s is not None:
            others = max(0.0, (end.busy_s - self.start.busy_s - own) / wall)
        return Conditions(
            cpu_count=self.probe.cpu_count,
            wall_s=wall,
            load_start=self.start.load,
            load_end=end.load,
            others_cores=others,
            own_cores=own / wall,
            date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=machine(),
        )


def combine(parts: list[Conditions]) -> Conditions:
    """The conditions of a run made of consecutive parts (a script's jobs): the first part's
    start, the last part's end, others' and own CPU averaged over the parts' wall time."""
    if not parts:
        raise ValueError("combine: no conditions to combine")
    wall = sum(p.wall_s for p in parts)
    known = [p for p in parts if p.others_cores is not None]
    others = None
    if len(known) == len(parts):
        others = sum(p.others_cores * p.wall_s for p in parts) / wall
    return dataclasses.replace(
        parts[-1],
        wall_s=wall,
        load_start=parts[0].load_start,
        others_cores=others,
        own_cores=sum(p.own_cores * p.wall_s for p in parts) / wall,
        date=parts[0].date,
    )


@dataclasses.dataclass
class Section:
    """One part of a script's results: its summary, records and rendered markdown table."""

    summary: dict
    table: str
    records: list = dataclasses.field(default_factory=list)
    timed: bool = True  # False: no times (memory, accuracy, XLA's plan): written under any load
    interleaved: bool = False  # the table's ratios were timed interleaved in one run


def add_arguments(parser) -> None:
    """The options every guarded script shares: ``--allow-load`` and ``--out``."""
    parser.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help=f"write the tables even when the machine was not quiet (other processes > "
        f"{MAX_OTHERS_CORES} cores or 1-min load > {MAX_LOAD_START} at the start); the tables "
        "then say so",
    )
    parser.add_argument("--out", default=RESULTS, help="directory of the records and tables")


def stem(name: str, quick: bool) -> str:
    return name + ("_quick" if quick else "")


def render_markdown(doc: dict) -> str:
    """Every section's table of a record file, in order."""
    parts = []
    for key, sec in doc["sections"].items():
        parts.append(f"## {key}\n\n{sec['table']}")
    return "\n\n".join(parts) + "\n"


def table_with_statement(section: Section, conditions: Conditions) -> str:
    statement = conditions.statement(timed=section.timed, interleaved=section.interleaved)
    return f"{statement}\n\n{section.table.strip()}"


def save(
    name: str,
    sections: dict[str, Section],
    conditions: Conditions,
    *,
    quick: bool = False,
    allow_load: bool = False,
    out: str = RESULTS,
    stream=None,
) -> int:
    """Write the sections' records and tables when the run was quiet (or ``allow_load``).

    Returns 0 when written, :data:`REFUSED_EXIT` when refused: then the records are printed to
    stdout (one JSON line), the reason to ``stream`` (stderr), and nothing is written. Sections
    that are not timed (``Section.timed=False``) are load-free and never refused.
    """
    stream = stream or sys.stderr
    timed = any(s.timed for s in sections.values())
    base = stem(name, quick)
    if timed and not conditions.quiet and not allow_load:
        print(json.dumps({"record": "refused", "name": base, "conditions": conditions.to_dict(),
                          "sections": {k: dataclasses.asdict(s) for k, s in sections.items()}}),
              flush=True)  # fmt: skip
        stream.write(
            f"{base}: tables not written: {'; '.join(conditions.reasons)}; rerun on a quiet "
            f"machine or pass {ALLOW_FLAG} to write them marked as measured under load\n"
        )
        stream.flush()
        return REFUSED_EXIT
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, base + ".json")
    doc = {"name": base, "sections": {}}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if isinstance(old.get("sections"), dict):
            doc["sections"].update(old["sections"])
    for key, sec in sections.items():
        doc["sections"][key] = {
            "conditions": conditions.to_dict(),
            "timed": sec.timed,
            "interleaved": sec.interleaved,
            "allow_load": allow_load,
            "summary": sec.summary,
            "records": sec.records,
            "table": table_with_statement(sec, conditions),
        }
    _write(path, json.dumps(doc, indent=1, default=_jsonable) + "\n")
    _write(os.path.join(out, base + ".md"), render_markdown(doc))
    return 0


def finish(name: str, sections: dict[str, Section], conditions: Conditions, args) -> None:
    """:func:`save` with a script's parsed ``args`` (``quick``, ``allow_load``, ``out``); exits
    with :data:`REFUSED_EXIT` when it refused."""
    code = save(name, sections, conditions, quick=bool(getattr(args, "quick", False)),
                allow_load=args.allow_load, out=args.out)  # fmt: skip
    if code:
        raise SystemExit(code)


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, tuple | set):
        return list(x)
    return str(x)


def _write(path: str, text: str) -> None:
    """Write then rename: a reader never sees half a file."""
    part = path + ".part"
    with open(part, "w") as f:
        f.write(text)
    os.replace(part, path)
