"""Griffe extension for the API reference: what Python sees, rendered the way Markdown needs.

The docstrings of `kernels` and `jaxbounds` keep their doctests as bare ``>>>`` lines (pytest's
``--doctest-modules`` runs them) and name other objects with Sphinx roles such as
``:func:`hvp```. Markdown reads a bare ``>>>`` line as a nested block quote (and ``x["a"][0]``
as a reference link), and prints a role verbatim. This extension rewrites each docstring before
mkdocstrings renders it: a run of doctest lines (from a ``>>>`` line to the next blank line) is
wrapped in a fenced ``pycon`` block, and a role becomes inline code. The source files are not
touched; the doctests run exactly as written.

It also settles a name that is both a submodule and an object the package imports from it
(``jaxbounds.data.sparse_majority``, ``jaxbounds.models.construction``): griffe's static view
keeps the submodule, Python's import keeps the object, so the package's member becomes an alias
of the object, as ``import`` makes it.

Loaded by ``mkdocs.yml`` (``plugins: mkdocstrings: handlers: python: options: extensions``).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import griffe

__all__ = ["DocstringsForMarkdown", "fence_doctests", "roles_to_code", "shadow_submodules"]

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const|type):`~?([^`]+)`")


def roles_to_code(text: str) -> str:
    """Replace Sphinx cross-reference roles by inline code.

    >>> roles_to_code("see :func:`hvp` and :class:`~kernels.Estimate`")
    'see `hvp` and `kernels.Estimate`'
    """
    return _ROLE.sub(r"`\1`", text)


def fence_doctests(text: str) -> str:
    r"""Wrap each run of doctest lines outside a fenced block in a ``pycon`` fence.

    A run starts at a line whose first non-blank characters are ``>>>`` and ends before the next
    blank line (doctest's own rule for the end of an expected output); the fence takes the
    run's indentation, so a doctest inside a docstring section stays in that section.

    >>> fence_doctests("Text.\n>>> 1 + 1\n2\n\nMore.").split("\n")
    ['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
    """
    lines = text.split("\n")
    out: list[str] = []
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            run = []
            while i < len(lines) and lines[i].strip():
                run.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [f"{indent}```pycon", *run, f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _modules(module: griffe.Module) -> list[griffe.Module]:
    """``module`` and all its submodules (not aliases), depth first."""
    found = [module]
    for member in list(module.members.values()):
        if not member.is_alias and isinstance(member, griffe.Module):
            found += _modules(member)
    return found


def shadow_submodules(package: griffe.Module) -> None:
    """In ``package`` and its submodules, let an imported object replace a submodule of its name.

    ``from pkg.name import name`` in ``pkg/__init__.py`` rebinds ``pkg.name`` to the object at
    import time; griffe keeps the submodule. The member becomes an alias of that object. The
    aliases whose target path runs through such a submodule (``from pkg.name import other``) are
    resolved first, while that path still leads to the submodule.
    """
    modules = _modules(package)
    shadowed = []
    for module in modules:
        for name, target in list(module.imports.items()):
            member = module.members.get(name)
            if member is None or member.is_alias or not isinstance(member, griffe.Module):
                continue
            prefix = member.path + "."
            if target.startswith(prefix) and target[len(prefix) :] in member.members:
                shadowed.append((module, name, member.members[target[len(prefix) :]], prefix))
    if not shadowed:
        return
    prefixes = tuple(prefix for *_, prefix in shadowed)
    for module in modules:
        for member in list(module.members.values()):
            if member.is_alias and member.target_path.startswith(prefixes):
                with contextlib.suppress(griffe.AliasResolutionError, griffe.CyclicAliasError):
                    member.resolve_target()
    for module, name, obj, _ in shadowed:
        module.set_member(name, griffe.Alias(name, obj, parent=module))


class DocstringsForMarkdown(griffe.Extension):
    """Rewrite each docstring griffe loads: :func:`fence_doctests`, then :func:`roles_to_code`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring (if any) before it is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = roles_to_code(fence_doctests(obj.docstring.value))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Once a package is loaded, apply :func:`shadow_submodules` to it."""
        shadow_submodules(pkg)
