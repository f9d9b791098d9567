"""The glossary (docs/guides/glossary.md) is the law for public names: a mechanical walk of the
public signatures."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

import jaxbounds.bounds
import kernels

GLOSSARY = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guides" / "glossary.md"
COUNT = re.compile(r"^(num_\w+|\w*chunk\w*)$")
# Names allowed only in these public functions (the glossary's "only ..." rows).
RESTRICTED = {
    "num_probes": {"sharpness_decomposition", "perturbed_hessian_traces"},
    "num_matvecs": {"hutchpp_trace", "hutchpp_memory_bytes", "hessian_trace", "ggn_trace"},
}
# Words that mark a data size, and words that mark a Monte Carlo count, in an Args entry.
DATA_WORDS = re.compile(r"\b(data|dataset|examples?|training (set|points)|inputs?)\b", re.I)
MC_WORDS = re.compile(r"\b(Monte Carlo|probes?|draws?|perturbations?)\b", re.I)


def glossary() -> set[str]:
    text = GLOSSARY.read_text(encoding="utf-8")
    section = text.split("\n| name | meaning |\n", 1)[1].split("\n\n", 1)[0]  # the table
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return names


def retired() -> dict[str, str]:
    """The retired names of the glossary's second table, each with its replacement's text."""
    text = GLOSSARY.read_text(encoding="utf-8")
    section = text.split("\n| retired name | use instead |\n", 1)[1].split("\n\n", 1)[0]
    names: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = line.split("|")
            for name in re.findall(r"`(\w+)`", cells[1]):
                names[name] = cells[2]
    return names


RETIRED = {name for name in retired() if name not in RESTRICTED}


def public_functions() -> list[tuple[str, object]]:
    found = [(f"kernels.{n}", getattr(kernels, n)) for n in kernels.__all__]
    for info in pkgutil.iter_modules(jaxbounds.bounds.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"jaxbounds.bounds.{info.name}")
        for n in getattr(module, "__all__", []):
            found.append((f"{module.__name__}.{n}", getattr(module, n)))
    return [(name, obj) for name, obj in found if callable(obj)]


def signature(obj: object) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def args_doc(obj: object) -> dict[str, str]:
    """Map each argument of a Google-style ``Args:`` section to its text."""
    doc = inspect.getdoc(obj) or ""
    if "Args:" not in doc:
        return {}
    body = doc.split("Args:", 1)[1]
    body = re.split(r"\n(?:Returns|Raises|Yields|References|Examples?|Attributes):", body)[0]
    entries: dict[str, str] = {}
    current = None
    for line in body.splitlines():
        match = re.match(r"^\s{2}(\w+)(?: \(.*?\))?:\s*(.*)$", line)
        if match:
            current = match.group(1)
            entries[current] = match.group(2)
        elif current:
            entries[current] += " " + line.strip()
    return entries


FUNCTIONS = public_functions()


def test_glossary_table_is_on_its_page():
    names = glossary()
    assert {"num_examples", "num_samples", "num_steps", "num_grid", "chunk_size"} <= names


@pytest.mark.parametrize(("name", "obj"), FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_public_names_follow_the_glossary(name, obj):
    sig = signature(obj)
    if sig is None:
        return
    allowed = glossary()
    docs = args_doc(obj)
    for param in sig.parameters.values():
        assert param.name not in RETIRED, f"{name}: retired name {param.name!r}"
        if param.name in RESTRICTED:
            short = name.rsplit(".", 1)[-1]
            assert short in RESTRICTED[param.name], f"{name}: {param.name!r} is restricted"
        if COUNT.match(param.name):
            assert param.name in allowed, f"{name}: {param.name!r} is not in the glossary"
        text = docs.get(param.name, "")
        if param.name == "num_samples":
            assert not DATA_WORDS.search(text), f"{name}: num_samples documented as a data size"
        if param.name == "num_examples":
            assert not MC_WORDS.search(text), f"{name}: num_examples documented as a MC count"
        if param.name == "chunk_size":
            default = param.default
            # "auto": the backend-dependent default the glossary's chunk_size row describes
            assert default in (None, "auto", inspect.Parameter.empty) or (
                isinstance(default, int) and default >= 1
            ), name
        if param.name == "perturbation":
            assert "Perturbation" in str(param.annotation), f"{name}: perturbation must be a spec"


@pytest.mark.parametrize(("name", "obj"), FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_no_bare_tuple_results(name, obj):
    sig = signature(obj)
    if sig is None:
        return
    annotation = str(sig.return_annotation)
    assert not annotation.startswith(("tuple", "Tuple")), f"{name} returns a bare tuple"
    assert not any(
        not k.startswith("_") for k in getattr(obj, "__dict__", {}) if k not in ("__wrapped__",)
    ) or inspect.isclass(obj), f"{name} carries ad-hoc attributes {sorted(vars(obj))}"


def test_retired_table_lists_the_renames():
    table = retired()
    for old in ("num_draws", "num_probes", "num_matvecs", "num_points", "num_iterations"):
        assert old in table, old
    assert "num_samples" in table["num_draws"]


@pytest.mark.parametrize(("name", "obj"), FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_deprecated_aliases_are_retired_names(name, obj):
    """A deprecation shim accepts only retired names, each forwarded to a glossary name."""
    renamed = getattr(obj, "_renamed_kwargs", {})
    sig = signature(obj)
    for old, new in renamed.items():
        assert old in retired(), f"{name}: alias {old!r} is not a retired name"
        assert new in glossary(), f"{name}: {old!r} -> {new!r}"
        assert new in sig.parameters, f"{name}: {old!r} -> {new!r}"
        assert old not in sig.parameters, f"{name}: {old!r} is still in the signature"


def test_glossary_walk_fails_on_a_retired_name():
    """The walk itself catches a retired count name (the check can fail)."""

    def bad(*, num_draws: int) -> None:
        """Args:
        num_draws: sign vectors.
        """

    with pytest.raises(AssertionError, match="retired name 'num_draws'"):
        test_public_names_follow_the_glossary("bad", bad)

    def probes(*, num_probes: int) -> None:
        """A standalone trace."""

    with pytest.raises(AssertionError, match="'num_probes' is restricted"):
        test_public_names_follow_the_glossary("kernels.probes", probes)
