"""Regenerate the committed output of the default ``jaxbounds estimate`` job and its excerpt.

Run from anywhere, with the package installed (``pip install -e .``)::

    python docs/estimate/regenerate.py

It runs the default job (model ``scalar``, seed 0, quick) exactly as a user does, in a fresh
process: ``python -m jaxbounds.cli estimate --json docs/estimate/report_scalar.json --quiet``.
What the command prints goes to ``docs/estimate/table.txt`` and the JSON report to
``docs/estimate/report_scalar.json``. Then the one ```` ```text ```` block of the site's page
``docs/engine/estimate.md`` is replaced by :func:`excerpt` of the table: its header and the rows
of :data:`EXCERPT`, line for line. ``tests/jaxbounds/test_cli.py`` checks that the three agree
(the table is the JSON rendered by ``jaxbounds.report.format_table``, the page's block is the
excerpt of the table) and that the JSON is of the current package version and sections.
The job takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JSON = HERE / "report_scalar.json"
TABLE = HERE / "table.txt"
#: The page that shows the excerpt (it moved there from README.md with issue 23).
PAGE = ROOT / "docs" / "engine" / "estimate.md"

#: The quantities (second column) of the rows the page shows, in table order.
EXCERPT = (
    "train accuracy",
    "test accuracy",
    "Hessian trace (Hutchinson)",
    "Hessian trace (Hutch++)",
    "Hessian eigenvalue λ1",
    "‖θ‖_1 (all weights)",
)

_BLOCK = re.compile(r"(```text\n)(.*?)(```)", re.S)


def excerpt(table: str) -> list[str]:
    """The table's header line and its rows whose quantity is in :data:`EXCERPT`, verbatim.

    The columns are read from the dashes under the header (``format_table``'s second and third
    lines).

    Raises:
      ValueError: if a quantity of :data:`EXCERPT` is not in the table.
    """
    lines = table.splitlines()
    header, dashes = lines[1], lines[2]
    spans = [m.span() for m in re.finditer(r"-+", dashes)]
    start, stop = spans[1][0], spans[1][1]
    wanted = {line[start:stop].strip(): line for line in lines[3:] if len(line) > start}
    missing = [q for q in EXCERPT if q not in wanted]
    if missing:
        raise ValueError(f"excerpt: quantities not in the table: {missing}")
    return [header] + [line for line in lines[3:] if line[start:stop].strip() in EXCERPT]


def replace_page_block(page: str, lines: list[str]) -> str:
    """The page's text with its one ```` ```text ```` block set to ``lines``.

    Raises:
      ValueError: if the page has no ```` ```text ```` block or more than one.
    """
    new, count = _BLOCK.subn(lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(3), page)
    if count != 1:
        raise ValueError(f"{PAGE.relative_to(ROOT)}: expected one ```text block, found {count}")
    return new


def main() -> int:
    """Run the default job, write the table and the JSON, update the excerpt on the page."""
    command = [
        *(sys.executable, "-m", "jaxbounds.cli", "estimate"),
        *("--json", str(JSON.relative_to(ROOT)), "--quiet"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    TABLE.write_text(done.stdout, encoding="utf-8")
    page = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(replace_page_block(page, excerpt(done.stdout)), encoding="utf-8")
    wrote = ", ".join(str(path.relative_to(ROOT)) for path in (TABLE, JSON))
    print(f"wrote {wrote} and the excerpt on {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
