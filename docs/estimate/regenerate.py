"""Regenerate the committed output of the default ``jaxbounds estimate`` job and its excerpt.

Run from anywhere, with the package installed (``pip install -e .``)::

    python docs/estimate/regenerate.py                  # rerun the job
    python docs/estimate/regenerate.py --render-only    # only render the committed JSON again

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
    """The table's two header lines and its rows whose quantity is in :data:`EXCERPT`, verbatim.

    A row comes with the lines below it that continue it (its wrapped quantity, its note). The
    columns are read from the dashes under the header (``format_table``'s fourth line).

    Raises:
      ValueError: if a quantity of :data:`EXCERPT` is not in the table.
    """
    lines = table.splitlines()
    header, dashes = lines[1:3], lines[3]
    spans = [m.span() for m in re.finditer(r"-+", dashes)]
    section_end, (start, stop) = spans[0][1], spans[1]
    shown, found, take = list(header), [], False
    for line in lines[4:]:
        if line[:section_end].strip():  # a row: its section cell is not blank
            quantity = line[start:stop].strip()
            take = quantity in EXCERPT
            found += [quantity] if take else []
        elif not line.strip():
            take = False
        if take:
            shown.append(line)
    missing = [q for q in EXCERPT if q not in found]
    if missing:
        raise ValueError(f"excerpt: quantities not in the table: {missing}")
    return shown


def replace_page_block(page: str, lines: list[str]) -> str:
    """The page's text with its one ```` ```text ```` block set to ``lines``.

    Raises:
      ValueError: if the page has no ```` ```text ```` block or more than one.
    """
    new, count = _BLOCK.subn(lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(3), page)
    if count != 1:
        raise ValueError(f"{PAGE.relative_to(ROOT)}: expected one ```text block, found {count}")
    return new


def render_committed() -> str:
    """What the command prints for the committed JSON report (the table and ``wrote`` line)."""
    sys.path.insert(0, str(ROOT))
    import json

    from jaxbounds.report import format_table
    from jaxbounds.report.rows import Report

    report = Report.from_dict(json.loads(JSON.read_text(encoding="utf-8")))
    return f"{format_table(report)}\nwrote {JSON.relative_to(ROOT)}\n"


def main(argv: list[str] | None = None) -> int:
    """Run the default job, write the table and the JSON, update the excerpt on the page.

    With ``--render-only`` the committed JSON report is rendered again instead (after a
    change of the table's format: no job is run, the numbers stay the committed ones).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--render-only"]:
        stdout = render_committed()
    else:
        command = [
            *(sys.executable, "-m", "jaxbounds.cli", "estimate"),
            *("--json", str(JSON.relative_to(ROOT)), "--quiet", "--fresh"),
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        stdout = done.stdout
    TABLE.write_text(stdout, encoding="utf-8")
    page = PAGE.read_text(encoding="utf-8")
    PAGE.write_text(replace_page_block(page, excerpt(stdout)), encoding="utf-8")
    written = (TABLE,) if argv == ["--render-only"] else (TABLE, JSON)
    wrote = ", ".join(str(path.relative_to(ROOT)) for path in written)
    print(f"wrote {wrote} and the excerpt on {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
