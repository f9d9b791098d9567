"""The registry is an explicit ordered table: the models, the sections, their order, errors."""

import importlib

import pytest

from jaxbounds.report import registry, runs
from jaxbounds.report.registry import (
    MODELS,
    SECTIONS,
    Section,
    model_names,
    section_names,
    sections_for,
    using,
)


def test_models_and_sections_in_report_order():
    assert model_names() == ["construction", "scalar", "shallow"]
    assert MODELS["scalar"] is runs.build_scalar
    assert section_names() == [
        "training",
        "curvature",
        "sharpness",
        "rademacher",
        "shallow",
        "construction",
        "bounds",
    ]
    assert [s.name for s in sections_for("scalar")] == [
        "training",
        "curvature",
        "sharpness",
        "rademacher",
        "bounds",
    ]
    assert [s.name for s in sections_for("shallow")] == ["shallow", "bounds"]
    assert [s.name for s in sections_for("scalar", ["bounds", "training"])] == [
        "training",
        "bounds",
    ]
    for section in SECTIONS:
        assert set(section.models) <= set(MODELS)
        assert callable(section.fn)


def _table(module):
    return tuple(module.MODELS.items()), [(s.name, s.fn, s.models) for s in module.SECTIONS]


def test_importing_twice_changes_nothing():
    before = _table(registry)
    importlib.reload(registry)
    assert _table(registry) == before
    with pytest.raises(TypeError):
        registry.MODELS["new"] = runs.build_scalar  # read-only


def test_unknown_names():
    with pytest.raises(ValueError, match="model"):
        sections_for("nope")
    with pytest.raises(ValueError, match="sections: unknown"):
        sections_for("scalar", ["training", "nope"])


@pytest.mark.parametrize(
    ("model", "only", "match"),
    [
        ("scalar", [], "an empty list selects nothing for model 'scalar'"),
        ("construction", ["training"], r"training selects nothing .*construction, bounds"),
        ("shallow", ["curvature", "sharpness"], "curvature, sharpness selects nothing"),
    ],
)
def test_a_selection_that_selects_nothing_is_an_error(model, only, match):
    with pytest.raises(ValueError, match=match):
        sections_for(model, only)


def test_using_swaps_the_table_and_restores_it():
    before = _table(registry)

    def build(key, *, quick=True):
        raise AssertionError("not called")

    toy = Section("toy section", lambda run: [], ("toy",))
    with using({"toy": build}, [toy]):
        assert model_names() == ["toy"]
        assert sections_for("toy") == [toy]
        with pytest.raises(TypeError):
            registry.MODELS["x"] = build
    assert _table(registry) == before
    # The real sections name models that are gone.
    with pytest.raises(ValueError, match="unknown models"), using({"toy": build}):
        pass
    assert _table(registry) == before
    with pytest.raises(RuntimeError), using({"toy": build}, [toy]):
        raise RuntimeError
    assert _table(registry) == before
