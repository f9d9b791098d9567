"""``.ci/run`` is exactly the README's test command, and a run that collects no test fails it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


def ci_command() -> str:
    """The one command line of ``.ci/run`` (after ``set`` and ``cd``)."""
    lines = [line for line in CI.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'], lines
    assert len(lines) == 3, lines
    return lines[2]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    tests = [b.strip() for b in blocks if "python -m pytest" in b]
    assert tests == [ci_command()]
    assert tests[0].endswith("&& python -m pytest")


def test_no_tests_collected_fails_the_ci_script(tmp_path):
    # pytest exits 5 when it collects nothing: the script's own shell settings, with the command
    # line replaced by one that exits 5, must end with that status and run nothing after it
    script = CI.read_text().replace(ci_command(), "true && (exit 5)\necho ran-on")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text(script)
    proc = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 5
    assert "ran-on" not in proc.stdout


def test_each_test_moved_to_slow_and_its_cover_exist():
    # a renamed test would leave its entry matching nothing (the test back in the default run)
    # or name a cover that no longer runs
    from tests.conftest import MOVED_TO_SLOW

    contributing = (ROOT / "docs" / "contributing.md").read_text()
    for moved, covers in MOVED_TO_SLOW.items():
        assert moved not in covers
        assert f"`{moved}`" in contributing, moved
        for node in (moved, *covers):
            path, name = node.split("::")
            function, _, param = name.partition("[")
            text = (ROOT / path).read_text()
            assert f"def {function}(" in text, node
            fixtures = (ROOT / "tests" / "conftest.py").read_text()  # the run fixture's ids
            for value in param.rstrip("]").split("-") if param else ():
                assert f'"{value}"' in text + fixtures, node
