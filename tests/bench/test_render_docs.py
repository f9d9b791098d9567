"""bench/render_docs.py: the docs' benchmark blocks equal what the committed records render."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import _quiet as quiet  # noqa: E402
from bench import render_docs  # noqa: E402


def test_the_docs_blocks_match_the_committed_records():
    out = io.StringIO()
    with redirect_stdout(out):
        code = render_docs.main(["--check"])
    assert code == 0, out.getvalue()


def fake_tree(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n<!-- bench: gauss_newton speed -->\n<!-- /bench -->\n\ntext\n\n"
        "<!-- bench: scale_quick -->\nold\n<!-- /bench -->\n"
    )
    (tmp_path / "README.md").write_text("no blocks\n")
    return page


def run(tmp_path, *argv):
    out = io.StringIO()
    with redirect_stdout(out):
        code = render_docs.main(["--root", str(tmp_path), *argv])
    return code, out.getvalue()


def test_missing_records_render_as_not_measured_and_pass_the_check(tmp_path):
    page = fake_tree(tmp_path)
    code, out = run(tmp_path, "--check")
    assert code == 1
    assert "docs/page.md: block `gauss_newton speed`" in out
    assert "docs/page.md: block `scale_quick`" in out
    assert run(tmp_path)[0] == 0
    text = page.read_text()
    assert (
        "<!-- bench: gauss_newton speed -->\n\nNot measured: run `python bench/gauss_newton.py "
        "--only speed` on a quiet machine.\n\n<!-- /bench -->" in text
    )
    assert "Not measured: run `python bench/scale.py --quick` on a quiet machine." in text
    assert text.endswith("<!-- /bench -->\n")
    assert "\ntext\n" in text
    assert run(tmp_path, "--check") == (0, "")


def test_a_record_fills_its_block_and_an_edited_block_fails_the_check(tmp_path):
    page = fake_tree(tmp_path)
    m = quiet.Monitor(quiet.Probe(proc_stat=str(tmp_path / "none"), getloadavg=lambda: (0.2, 0.2)))
    cond = m.stop()
    sec = quiet.Section(summary={"r": 1.5}, table="| ratio |\n|---|\n| 1.50 |")
    results = tmp_path / "bench" / "results"
    assert quiet.save("gauss_newton", {"speed": sec}, cond, out=str(results)) == 0
    run(tmp_path)
    text = page.read_text()
    assert "| 1.50 |" in text
    assert "quiet machine" in text
    assert run(tmp_path, "--check")[0] == 0
    page.write_text(text.replace("| 1.50 |", "| 10.0 |"))
    code, out = run(tmp_path, "--check")
    assert code == 1
    assert "docs/page.md: block `gauss_newton speed`" in out
    assert "scale_quick" not in out
    # a record written before the guard (no sections) is not a record of a quiet run
    (results / "scale_quick.json").write_text(json.dumps({"records": [], "summary": {}}))
    assert render_docs.load("scale_quick", str(results)) is None


def test_commands_name_the_script_and_its_part():
    assert render_docs.command("scale_quick") == "python bench/scale.py --quick"
    assert render_docs.command("scale", "kernels") == "python bench/scale.py"
    assert render_docs.command("curvature", "speed") == "python bench/curvature.py --only speed"
    assert (
        render_docs.command("sharpness_quick", "worst")
        == "python bench/sharpness.py --quick --only worst"
    )


def test_readme_views_read_the_scale_record(tmp_path):
    """The README's views on the archived 2026-11-27 scale run (written by bench/scale.py):
    its PyHessian row and issue 22's ratios, the missing records named."""
    archived = json.loads((ROOT / "bench/results/archive/scale_2026-11-27.json").read_text())
    results = tmp_path / "results"
    cond = quiet.Monitor(quiet.Probe(proc_stat=str(tmp_path / "none"), getloadavg=lambda: (0, 0)))
    sec = quiet.Section(summary=archived["summary"], table="| t |")
    assert quiet.save("scale", {"kernels": sec}, cond.stop(), out=str(results)) == 0
    peers = render_docs.readme_peers(str(results))
    assert (
        "| Hessian trace per probe, GPT-2-small, peak memory 6,591 MB (PyHessian) vs 2,041 MB "
        "(ours) | PyHessian | 11.70 s | 5.29 s | **2.21x** |" in peers
    )
    assert "`python bench/curvature.py --only speed`" in peers
    assert "`python bench/sharpness.py --quick --only average`" in peers
    kernels = render_docs.readme_kernels(str(results))
    assert (
        "| Lanczos, time per step | <= 1.3 gradients | not measured | 2.24 | "
        "missed, by up to 0.94 |" in kernels
    )
    assert "| <= 2 gradients' | n/a | 4.84 | missed, by up to 2.84 |" in kernels
    assert "GPT-2-small: missed, by up to 0.54" in kernels
