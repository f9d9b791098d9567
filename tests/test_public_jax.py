"""The packages use public JAX only: no ``jax._src``, no ``jax.interpreters``, no private names.

Reads the source of ``kernels/`` and ``jaxbounds/`` (imports, attribute chains, strings such as
a logger's name) and fails on any reach into JAX's internals, so that a JAX upgrade either keeps
the behaviour or raises, never changes it silently behind a fallback.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "jaxbounds")
_PRIVATE_MODULES = ("jax._src", "jax.interpreters", "jaxlib")


def _private_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in _PRIVATE_MODULES)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def violations(source: str) -> list[str]:
    """Each reach into JAX's internals in ``source``, as ``line: text``."""
    tree = ast.parse(source)
    jax_names: dict[str, str] = {}  # local name -> the jax module or object it is bound to
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private_module(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
                if alias.name == "jax" or alias.name.startswith("jax."):
                    local = alias.asname or alias.name.split(".")[0]
                    jax_names[local] = alias.name if alias.asname else "jax"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                from_jax = node.module == "jax" or node.module.startswith("jax.")
                private_name = from_jax and alias.name.startswith("_")
                if private_name or _private_module(node.module) or _private_module(full):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                if from_jax:
                    jax_names[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is None:
                continue
            root, _, rest = dotted.partition(".")
            if root not in jax_names or not rest:
                continue
            full = f"{jax_names[root]}.{rest}"
            private = [p for p in full.split(".") if p.startswith("_") and not p.startswith("__")]
            if private or _private_module(full):
                found.append(f"{node.lineno}: {dotted}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and any(m in node.value for m in ("jax._src", "jax.interpreters"))
        ):
            found.append(f"{node.lineno}: string {node.value[:60]!r}")
    return sorted(set(found), key=lambda item: (int(item.split(":")[0]), item))


def _sources() -> list[pathlib.Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_packages_have_sources():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"kernels/_checks.py", "kernels/_jit.py", "kernels/parallel.py"} <= names


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("from jax._src import core", "1: from jax._src import core"),
        ("import jax._src.dispatch as d", "1: import jax._src.dispatch"),
        ("import jax\njax._src.core.trace_ctx", "2: jax._src.core.trace_ctx"),
        ("import jax\nx = jax.interpreters.pxla", "2: jax.interpreters.pxla"),
        ("from jax import interpreters as i\ni.pxla", "1: from jax import interpreters"),
        ("import logging\nlogging.getLogger('jax._src.debugging')", "2: string 'jax._src"),
        ("import jax.numpy as jnp\njnp._private_thing", "2: jnp._private_thing"),
        ("from jax.random import _check_prng_key", "1: from jax.random import _check"),
    ],
)
def test_the_checker_finds_private_jax(snippet, expected):
    found = violations(snippet)
    assert any(item.startswith(expected) for item in found), (snippet, found)


def test_the_checker_passes_public_jax():
    public = (
        "import jax\nimport jax.numpy as jnp\nfrom jax.extend.core import get_opaque_trace_state\n"
        "jax.random.fold_in(jax.random.key(0), 1)\njnp.zeros(3).__array__\n"
        "jax.core.Tracer\nobj._private  # not a jax object\n"
    )
    assert violations(public) == []


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_private_jax_in_the_packages(path):
    assert violations(path.read_text(encoding="utf-8")) == [], path.relative_to(ROOT).as_posix()
