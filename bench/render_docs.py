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
    s, _ = _summary("sharpness_quick", "average", results)
    if s is None:
        missing.append(command("sharpness_quick", "average"))
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


def _fmt(x: float | None, suffix: str = "") -> str:
    return "not measured" if x is None else f"{x:.2f}{suffix}"


def _status(values: list[float | None], goal: float, at_most: bool = True) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "not measured"
    misses = [v - goal if at_most else goal - v for v in got]
    worst = max(misses)
    return "met" if worst <= 0 else f"missed, by up to {worst:.2f}"


def readme_kernels(results: str = RESULTS) -> str:
    """README's table of issue 22's goals from the curvature and scale records."""
    k, _ = _summary("curvature", "kernels", results)
    sp, _ = _summary("curvature", "speed", results)
    sc, _ = _summary("scale", "kernels", results)
    k, sp = k or {}, sp or {}
    i22 = (sc or {}).get("issue22", {})
    if not (k or sp or i22):
        return not_measured("curvature") + f" Also `{command('scale')}`."
    rows = [  # (label, goal text, reference value, GPT-2-small value, goal, at_most)
        ("Hutchinson, time per probe", "<= 1.1 (reference), <= 1.3 (GPT-2-small) gradients",
         k.get("hutchinson_auto_per_unit_over_grad"), i22.get("hessian_trace_per_unit_over_grad"),
         None, True),
        ("Hutchinson, PyHessian's time per probe over ours", ">= 3x",
         sp.get("pyhessian_per_probe_over_ours"), i22.get("pyhessian_per_probe_over_ours"),
         3.0, False),
        ("Lanczos, time per step", "<= 1.3 gradients", k.get("lanczos_per_unit_over_grad"),
         i22.get("top_eigenvalues_per_unit_over_grad"), 1.3, True),
        ("Lanczos, XLA temporaries beyond its basis", "<= 2 gradients'", None,
         i22.get("top_eigenvalues_temp_beyond_basis_over_grad_temp"), 2.0, True),
        ("worst-case sharpness, time per ascent step", "<= 1.1 gradients",
         k.get("worst_case_per_unit_over_grad"),
         i22.get("worst_case_sharpness_per_unit_over_grad"), 1.1, True),
        ("worst-case sharpness, memory (reference: XLA temporaries; GPT-2-small: peak RSS)",
         "<= 1.3x a gradient's", k.get("worst_case_xla_temp_over_grad"),
         i22.get("worst_case_sharpness_peak_over_grad_peak"), 1.3, True),
    ]  # fmt: skip
    out = [
        "| kernel | goal | reference Transformer | GPT-2-small | status |",
        "|---|---|---|---|---|",
    ]
    for label, goal_text, ref, big, goal, at_most in rows:
        if goal is None:  # Hutchinson: a goal per model
            status = f"reference: {_status([ref], 1.1)}; GPT-2-small: {_status([big], 1.3)}"
        else:
            status = _status([ref, big], goal, at_most)
        # the curvature benchmark does not measure Lanczos's temporaries beyond its basis
        ref_text = "n/a" if ref is None and label.startswith("Lanczos, XLA") else _fmt(ref)
        out.append(f"| {label} | {goal_text} | {ref_text} | {_fmt(big)} | {status} |")
    missing = []
    if not k:
        missing.append(command("curvature", "kernels"))
    if not sp:
        missing.append(command("curvature", "speed"))
    if not i22:
        missing.append(command("scale"))
    if missing:
        out += ["", "Not measured: run " + ", ".join(f"`{c}`" for c in missing)
                + " on a quiet machine."]  # fmt: skip
    return "\n".join(out)


VIEWS = {("readme", "peers"): readme_peers, ("readme", "kernels"): readme_kernels}


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
