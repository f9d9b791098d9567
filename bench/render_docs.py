"""Fill the docs' benchmark blocks from the committed records in ``bench/results/``.

A block in ``README.md`` or ``docs/**/*.md``::

    <!-- bench: gauss_newton speed -->
    (generated: do not edit)
    <!-- /bench -->

names a record file (``bench/results/gauss_newton.json``, written by ``bench/gauss_newton.py``
through ``bench/_quiet.py``) and optionally one of its sections (``speed``); without a section
the block holds every section's table. A few views combine records (``readme peers``). When the
record or the section is missing, the block says which command measures it.

Run:  python bench/render_docs.py            (rewrite the blocks)
      python bench/render_docs.py --check    (exit 1 naming every block that differs)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
BLOCK = re.compile(r"(<!-- bench: ([\w-]+)(?: ([\w-]+))? -->\n)(.*?)(<!-- /bench -->)", re.DOTALL)
# scripts whose sections are picked with ``--only SECTION``
ONLY = {"gauss_newton", "curvature", "sharpness"}


def command(name: str, section: str | None = None) -> str:
    """The command that writes record ``name`` (``scale_quick`` -> ``bench/scale.py --quick``)."""
    script, quick = (name[: -len("_quick")], True) if name.endswith("_quick") else (name, False)
    cmd = f"python bench/{script}.py" + (" --quick" if quick else "")
    if section and script in ONLY:
        cmd += f" --only {section}"
    return cmd


def not_measured(name: str, section: str | None = None) -> str:
    return f"Not measured: run `{command(name, section)}` on a quiet machine."


def load(name: str, results: str = RESULTS) -> dict | None:
    """A record file written through the guard, or None (missing, or written without it)."""
    path = os.path.join(results, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.load(f)
    return doc if isinstance(doc.get("sections"), dict) else None


def section_table(name: str, section: str | None, results: str = RESULTS) -> str:
    doc = load(name, results)
    if doc is None:
        return not_measured(name, section)
    if section is None:
        if not doc["sections"]:
            return not_measured(name)
        return "\n\n".join(s["table"].strip() for s in doc["sections"].values())
    sec = doc["sections"].get(section)
    return not_measured(name, section) if sec is None else sec["table"].strip()


# --------------------------------------------------------------------------- views


def _summary(name: str, section: str, results: str) -> tuple[dict | None, dict | None]:
    doc = load(name, results)
    sec = None if doc is None else doc["sections"].get(section)
    return (None, None) if sec is None else (sec["summary"], sec["conditions"])


def readme_peers(results: str = RESULTS) -> str:
    """README's rows against the peers from the curvature, sharpness and scale records."""
    header = [
        "| what | peer | peer's time | ours | ours faster by | record |",
        "|---|---|---|---|---|---|",
    ]
    rows = []
    missing = []
    cpu = "[CPU](docs/benchmarks/cpu.md#curvature)"
    s, _ = _summary("curvature", "speed", results)
    if s is None:
        missing.append(command("curvature", "speed"))
    else:
        rows.append(
            f"| Hessian trace, time per Hutchinson probe, reference Transformer "
            f"({s['num_probes']} probes) | PyHessian | {s['pyhessian_per_probe_ms']:.1f} ms | "
            f"{s['ours_per_probe_ms']:.1f} ms | **{s['pyhessian_per_probe_over_ours']:.2f}x** | "
            f"{cpu} |"
        )
        rows.append(
            f"| the same, {s['matfree_probes']} probes each | matfree | "
            f"{s['matfree_per_probe_ms']:.1f} ms | {s['ours_per_probe_ms_at_matfree_probes']:.1f}"
            f" ms | **{s['matfree_over_ours']:.2f}x** | {cpu} |"
        )
    s, _ = _summary("scale", "kernels", results)
    if s is None or "pyhessian_per_probe_s" not in s:
        missing.append(command("scale"))
    else:
        ours = next(r for r in s["rows"] if r["job"] == "hessian_trace")
        rows.append(
            f"| Hessian trace per probe, GPT-2-small, peak memory "
            f"{s['pyhessian_peak_rss_mb']:,.0f} MB (PyHessian) vs {ours['peak_rss_mb']:,.0f} MB "
            f"(ours) | PyHessian | {s['pyhessian_per_probe_s']:.2f} s | "
            f"{s['ours_per_probe_s']:.2f} s | **{s['pyhessian_per_probe_over_ours']:.2f}x** | "
            "[Scale](docs/benchmarks/scale.md) |"
        )
    s, _ = _summary("sharpness", "average", results)
    if s is None:
        missing.append(command("sharpness", "average"))
    else:
        rows.append(
            f"| average sharpness, {s['num_evaluations']} perturbations, reference Transformer "
            f"| PyTorch loop | {s['torch_inplace_loop_s']:.2f} s | {s['ours_s']:.2f} s | "
            f"**{s['torch_loop_over_ours']:.2f}x** | [CPU](docs/benchmarks/cpu.md#sharpness) |"
        )
    out = "\n".join(header + rows) if rows else ""
    if missing:
        note = "Not measured: run " + ", ".join(f"`{c}`" for c in missing) + " on a quiet machine."
        out = f"{out}\n\n{note}" if out else note
    return out


VIEWS = {("readme", "peers"): readme_peers}


def render_block(name: str, section: str | None, results: str = RESULTS) -> str:
    view = VIEWS.get((name, section))
    body = view(results) if view else section_table(name, section, results)
    return f"\n{body.strip()}\n\n"


def render_text(text: str, results: str = RESULTS) -> tuple[str, list[str]]:
    """The text with every block filled, and the names of the blocks that changed."""
    changed = []

    def fill(m: re.Match) -> str:
        name, section = m.group(2), m.group(3)
        body = render_block(name, section, results)
        if body != m.group(4):
            changed.append(f"{name} {section}" if section else name)
        return m.group(1) + body + m.group(5)

    return BLOCK.sub(fill, text), changed


def pages(root: str = ROOT) -> list[str]:
    out = [os.path.join(root, "README.md")]
    out += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return [p for p in out if os.path.exists(p)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block differs")
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    results = args.results or os.path.join(args.root, "bench", "results")
    stale = []
    for path in pages(args.root):
        with open(path) as f:
            text = f.read()
        new, changed = render_text(text, results)
        rel = os.path.relpath(path, args.root)
        if args.check:
            stale += [f"{rel}: block `{c}`" for c in changed]
        elif changed:
            with open(path, "w") as f:
                f.write(new)
            print(f"{rel}: " + ", ".join(changed))
    if stale:
        print("benchmark blocks differ from bench/results (run python bench/render_docs.py):")
        print("\n".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
