"""The documentation as a product: the site builds strictly, the API reference is complete, every
Python block of README.md and docs/ runs, and the version is one number.

- The site is built once per run with ``mkdocs build --strict`` in a subprocess (exactly the
  command a developer types; a broken link or anchor, a page missing from the nav, a docstring
  griffe cannot parse, or a missing snippet fails it); a tiny site with a broken link checks that
  the command does fail.
- Every name of every public ``__all__`` (``kernels``, each ``jaxbounds`` subpackage, the public
  ``jaxbounds`` modules, and the modules a package re-exports, such as
  ``jaxbounds.bounds.pac_bayes``) must have its anchor on its package's page of the built API
  reference.
- The Python blocks of the Markdown files run with Sybil, in order, one namespace per file (a
  page reads top to bottom), with JAX's defaults (float32, standard dtype promotion, rank
  promotion allowed): what a reader who copies them sees, not the float64 of the other tests.
  A block that cannot run here is preceded by ``<!-- skip: next "why" -->``; one that runs but is
  too slow for the default run by ``<!-- skip: next if(not run_slow_examples, reason="why") -->``:
  it is not collected in the default run, and the slow suite runs its page's blocks in order
  with it (``test_slow_examples_in_order``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
import tomllib
import types
import unittest
from pathlib import Path

import jax
import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

import jaxbounds
import jaxbounds.cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXTENSION = DOCS / "_ext" / "griffe_docstrings.py"

# ---------------------------------------------------------------------------------------------
# The site


def mkdocs_build(config: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` in a subprocess. Not ``--quiet``: it hides the warnings that
    ``--strict`` turns into a failure, and the build then passes whatever is broken."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "mkdocs", "build", "--strict"),
            *("--config-file", str(config), "--site-dir", str(site_dir)),
        ],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Build the site once for this module with ``mkdocs build --strict``; return its folder."""
    site_dir = tmp_path_factory.mktemp("site")
    proc = mkdocs_build(ROOT / "mkdocs.yml", site_dir)
    warnings = [line for line in proc.stderr.splitlines() if not line.startswith("INFO")]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(warnings)
    return site_dir


def test_strict_build_fails_on_a_broken_link(tmp_path):
    # The command the site fixture runs must turn a warning into a failure.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [a page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\n")
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "missing.md" in proc.stderr


def public_modules() -> list[str]:
    """``kernels``, every ``jaxbounds`` subpackage with an ``__all__``, and the public top-level
    ``jaxbounds`` modules with an ``__all__`` (``jaxbounds.distributed``, ``jaxbounds.cli``)."""
    names = ["kernels"]
    for info in pkgutil.walk_packages(jaxbounds.__path__, "jaxbounds."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts):
            continue
        if not info.ispkg and len(parts) > 2:  # a module inside a subpackage: public only if
            continue  # the subpackage re-exports it (checked through that package's __all__)
        if hasattr(importlib.import_module(info.name), "__all__"):
            names.append(info.name)
    return sorted(names)


def public_names(module_name: str) -> list[str]:
    """Dotted names of the module's ``__all__`` and of the ``__all__`` of each module it exports."""
    module = importlib.import_module(module_name)
    found = []
    for name in module.__all__:
        found.append(f"{module_name}.{name}")
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            found += public_names(value.__name__)
    return found


PUBLIC_MODULES = public_modules()


def test_public_modules_are_found():
    # The discovery above is what keeps the reference complete: if it found nothing, the test
    # below would check nothing.
    assert {"kernels", "jaxbounds.bounds", "jaxbounds.models", "jaxbounds.distributed"} <= set(
        PUBLIC_MODULES
    )
    assert "jaxbounds.bounds.pac_bayes.semi_analytic" in public_names("jaxbounds.bounds")


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_on_its_reference_page(site, module_name):
    source = DOCS / "api" / f"{module_name}.md"
    assert source.exists(), f"no API page for {module_name}: add {source} with `::: {module_name}`"
    html = (site / "api" / module_name / "index.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    missing = [name for name in public_names(module_name) if name not in anchors]
    assert not missing, f"not on the API page of {module_name}: {missing}"


def _griffe_extension():
    spec = importlib.util.spec_from_file_location("griffe_docstrings", EXTENSION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_griffe_extension_fences_doctests_only():
    ext = _griffe_extension()
    lines = ["Intro.", "", "Args:", "  x: a value.", "    >>> f(1)", "    2", ""]
    lines += ["```", ">>> no doctest", "```", ">>> g()"]
    text = "\n".join(lines)
    assert ext.fence_doctests(text).split("\n") == [
        "Intro.",
        "",
        "Args:",
        "  x: a value.",
        "",
        "    ```pycon",
        "    >>> f(1)",
        "    2",
        "    ```",
        "",
        "```",
        ">>> no doctest",
        "```",
        "",
        "```pycon",
        ">>> g()",
        "```",
    ]
    assert ext.roles_to_code(":func:`~kernels.hvp` and :py:class:`Estimate`") == (
        "`kernels.hvp` and `Estimate`"
    )


def test_reference_renders_doctests_and_math(site):
    html = (site / "api" / "kernels" / "index.html").read_text()
    # Doctests are highlighted code with a prompt, not Markdown block quotes made of ">>>".
    assert html.count('<span class="gp">&gt;&gt;&gt; </span>') > 50
    for page in (site / "api").glob("*/index.html"):
        assert "<blockquote>\n<blockquote>" not in page.read_text(), page
    # The docstrings' $...$ reach MathJax as arithmatex spans, and MathJax is loaded.
    assert html.count('<span class="arithmatex">') > 50
    assert "mathjax" in html.lower()


def test_every_reproduction_has_a_page(site):
    for report in sorted(DOCS.glob("reproduce/*/report.md")):
        name = report.parent.name
        assert (site / "reproduce" / name / "report" / "index.html").exists(), name
        assert f"reproduce/{name}/report.md" in (DOCS / "reproductions.md").read_text(), name


# ---------------------------------------------------------------------------------------------
# The version


def test_version_is_one_number(capsys):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert jaxbounds.__version__ == declared
    assert importlib.metadata.version("jaxbounds") == declared, "reinstall: pip install -e ."
    scripts = importlib.metadata.entry_points(group="console_scripts")
    (script,) = [ep for ep in scripts if ep.name == "jaxbounds"]
    assert script.value == "jaxbounds.cli:script"
    with pytest.raises(SystemExit) as exit_info:
        jaxbounds.cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxbounds {declared}"


# ---------------------------------------------------------------------------------------------
# The examples

SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
# The pages of the site (mkdocs.yml's exclude_docs: names starting with "_", local reproduce runs).
MARKDOWN = [
    ROOT / "README.md",
    *sorted(
        p
        for p in DOCS.rglob("*.md")
        if not any(
            part.startswith("_") or part == "reproduce_run" for part in p.relative_to(DOCS).parts
        )
    ),
]


_SLOW_DIRECTIVE = "run_slow_examples"


def _examples():
    """Every example of every page, but the slow blocks (``skip: next if(not run_slow_examples``
    before them): those run in order with their page in :func:`test_slow_examples_in_order`."""
    params = []
    for path in MARKDOWN:
        document = SYBIL.parse(path)
        slow_next = False
        for example in document.examples():
            kind = "skip" if isinstance(example.parsed, tuple) else "code"
            label = f"{path.relative_to(ROOT)}:{example.line}:{kind}"
            if kind == "skip" and _SLOW_DIRECTIVE in str(example.region.parsed):
                slow_next = True
                continue
            if kind == "code" and slow_next:
                slow_next = False
                continue
            params.append(pytest.param(example, id=label))
    return params


_SLOW_PAGES = [p for p in MARKDOWN if _SLOW_DIRECTIVE in p.read_text()]


@pytest.fixture
def jax_user_defaults():
    """JAX's own defaults for the duration of one example (the suite runs float64, strict)."""
    settings = {
        "jax_enable_x64": False,
        "jax_numpy_dtype_promotion": "standard",
        "jax_numpy_rank_promotion": "allow",
    }
    previous = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)


@pytest.mark.parametrize("example", _examples())
def test_markdown_example(example, jax_user_defaults):
    example.namespace.setdefault(_SLOW_DIRECTIVE, False)
    try:
        example.evaluate()
    except unittest.SkipTest as skip:
        pytest.skip(str(skip))


@pytest.mark.slow
@pytest.mark.parametrize("path", _SLOW_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_slow_examples_in_order(path, jax_user_defaults):
    """A page with slow blocks, every block in order, the slow ones included."""
    examples = list(SYBIL.parse(path).examples())
    for example in examples:
        example.namespace[_SLOW_DIRECTIVE] = True
        example.evaluate()


# ---------------------------------------------------------------------------------------------
# Every block shows its result and says when it continues an earlier one (issue 30)

_FENCE = re.compile(r"^([ \t]*)```python[ \t]*\n(.*?)^\1```", re.M | re.S)
_CONTINUES = "# continues"


def _python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the opening fence, dedented source) of every ```python block of a page."""
    import textwrap

    return [
        (text[: m.start()].count("\n") + 1, textwrap.dedent(m.group(2)))
        for m in _FENCE.finditer(text)
    ]


def _bound_names(tree) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def block_problems(text: str) -> list[str]:
    """What a page's Python blocks do that a reader running one as a script would trip on.

    - An expression statement that is not a call (``est.mean, est.stderr``) shows nothing when
      the block runs as a script, and a block that ends in an expression other than
      ``print(...)`` (``lazy.summary()``) drops its result: print it.
    - A block that uses a name defined only in an earlier block of the page must say so on its
      first line (``# continues the previous block``), and only such a block says so.
    """
    import ast
    import builtins

    problems, earlier = [], set()
    for line, code in _python_blocks(text):
        tree = ast.parse(code)
        body = tree.body
        for node in body:
            if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Call):
                problems.append(f"line {line}: bare expression `{ast.unparse(node)[:50]}`")
        last = body[-1] if body else None
        if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
            func = last.value.func
            if not (isinstance(func, ast.Name) and func.id == "print"):
                problems.append(f"line {line}: ends in `{ast.unparse(last)[:50]}`, not print")
        mine = _bound_names(tree)
        loaded = {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        borrowed = sorted((loaded - mine - set(dir(builtins))) & earlier)
        says = code.lstrip("\n").startswith(_CONTINUES)
        if borrowed and not says:
            problems.append(f"line {line}: uses {borrowed} of an earlier block; first line "
                            f"'{_CONTINUES} ...' missing")  # fmt: skip
        if says and not borrowed:
            problems.append(f"line {line}: says it continues, but uses no earlier name")
        earlier |= mine
    return problems


def test_block_problems_finds_each_problem():
    fence = "```"
    page = (
        f"{fence}python\nimport jax\nx = jax.numpy.ones(2)\nx.sum(), x\n{fence}\n\ntext\n\n"
        f"{fence}python\ny = x + 1\nsorted(y)\n{fence}\n\n"
        f"{fence}python\n# continues the previous block\nprint(x)\n{fence}\n\n"
        f"{fence}python\n# continues the previous block\nprint(1)\n{fence}\n"
    )
    assert block_problems(page) == [
        "line 1: bare expression `(x.sum(), x)`",
        "line 9: ends in `sorted(y)`, not print",
        "line 9: uses ['x'] of an earlier block; first line '# continues ...' missing",
        "line 19: says it continues, but uses no earlier name",
    ]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_shows_its_result_and_says_when_it_continues(path):
    assert block_problems(path.read_text(encoding="utf-8")) == []
