"""The committed reproductions (docs/reproduce/NAME) and the README's excerpts of them.

- Each committed ``report.md`` (and ``statistics.json``) is what the experiment's ``render``
  makes of the committed ``results.csv`` and ``summary.json``: nothing in a report is typed by
  hand or left over from an older run.
- Every excerpt of a committed file in README.md or any page under docs/ (the reproduce
  section moves from the README to docs/reproductions.md), a block between
  ``<!-- excerpt: PATH -->`` and ``<!-- /excerpt -->``, is a run of consecutive lines of the
  committed file it names.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from jaxbounds.experiments import runner
from jaxbounds.experiments.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "reproduce"
NAMES = sorted(p.name for p in COMMITTED.iterdir() if (p / "results.csv").exists())
_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _cell(text: str):
    """A results.csv cell back to its JSON value (the runner writes floats with repr)."""
    if text == "":
        return None
    if text in _SPECIAL:
        return _SPECIAL[text]
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_committed(name: str) -> tuple[list[dict], dict]:
    """The rows of a committed results.csv (typed as the runner wrote them) and its summary."""
    folder = COMMITTED / name
    with (folder / "results.csv").open(newline="", encoding="utf-8") as fh:
        rows = [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    meta = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return rows, meta


def test_every_committed_reproduction_is_listed():
    assert NAMES, "no committed reproduction found"
    for name in NAMES:
        assert name in REGISTRY, name


# measures-vs-gap renders its study (two-way bootstrap, 100 null draws per statistic, CMI) over 864
# models: about 40 s on the 2-core machine, so it runs with the slow tests; its tau and Psi are
# recomputed independently in the default run (test_measures_vs_gap.py)
SLOW_RENDERS = {"measures-vs-gap"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_RENDERS else n for n in NAMES]
)
def test_committed_report_is_rendered_from_the_committed_csv(name, tmp_path, monkeypatch):
    rows, meta = read_committed(name)
    assert meta["experiment"] == name
    assert meta["num_finished"] == len(rows) == meta["num_units"]
    assert meta["scale"] == "cpu"
    monkeypatch.setattr(runner, "new_figure", lambda **_: None)  # figures are not compared
    experiment = REGISTRY.get(name)
    (experiment.render or runner.default_render)(rows, meta, tmp_path)
    folder = COMMITTED / name
    got = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert got == (folder / "report.md").read_text(encoding="utf-8")
    if (folder / "statistics.json").exists():
        # Fits and tests computed at render time (numpy/OpenBLAS, scipy) may round differently
        # in the last bits on another CPU (docs/reproducibility.md); the printed report may not.
        got_stats = json.loads((tmp_path / "statistics.json").read_text())
        _assert_close(got_stats, json.loads((folder / "statistics.json").read_text()), "stats")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_finished", [1, 2])
def test_a_partial_run_renders_every_claim(name, num_finished, tmp_path, monkeypatch):
    # a run cut short after its first units still renders (--from re-renders partial runs):
    # every claim of the experiment gets a verdict line, inconclusive where its units are missing
    rows, meta = read_committed(name)
    meta = {**meta, "num_finished": num_finished}
    monkeypatch.setattr(runner, "new_figure", lambda **_: None)
    experiment = REGISTRY.get(name)
    (experiment.render or runner.default_render)(rows[:num_finished], meta, tmp_path)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    verdict = (
        r"reproduced|not reproduced|inconclusive|inconclusive at our budget|"
        r"not testable on this family|not tested at this scale|not tested here"
    )
    verdicts = re.findall(rf"^- \*\*({verdict})\*\*: ", report, re.M)
    assert len(verdicts) >= len(experiment.claims), (name, verdicts)


def _assert_close(got, want, where: str) -> None:
    """Equal JSON trees, floats to 1e-6 relative (NaN equals NaN)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(got) == sorted(want), where
        for key in want:
            _assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert isinstance(got, int | float), where
        assert (math.isnan(got) and math.isnan(want)) or math.isclose(
            got, want, rel_tol=1e-6, abs_tol=1e-300
        ), f"{where}: {got} != {want}"
    else:
        assert got == want, where


_EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n(.*?)<!-- /excerpt -->", re.S)


def _excerpts() -> list[tuple[str, str, str]]:
    """(page, path, text) of every excerpt in README.md and every docs/**/*.md page."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [
        (str(page.relative_to(ROOT)), *found)
        for page in pages
        for found in _EXCERPT.findall(page.read_text("utf-8"))
    ]


def test_excerpt_pattern_finds_blocks():
    text = "x\n<!-- excerpt: docs/reproduce/a/report.md -->\n- one\n- two\n<!-- /excerpt -->\n"
    assert _EXCERPT.findall(text) == [("docs/reproduce/a/report.md", "- one\n- two\n")]


def test_readme_excerpts_equal_the_committed_files():
    excerpts = _excerpts()
    assert excerpts, "no excerpt of a committed reproduction in README.md or docs/"
    for page, path, body in excerpts:
        parts = path.split("/")
        assert parts[:2] == ["docs", "reproduce"], (page, path)
        assert parts[2] in NAMES, (page, path)
        lines = body.strip("\n").splitlines()
        assert lines, (page, path)
        source = (ROOT / path).read_text(encoding="utf-8").splitlines()
        starts = [i for i, line in enumerate(source) if line == lines[0]]
        assert any(source[i : i + len(lines)] == lines for i in starts), (
            f"{page}: the excerpt of {path} is not in the committed file (rerun and copy it again)"
        )
