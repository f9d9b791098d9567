"""The registry is an explicit ordered table: the models, the sections, their order, errors."""

import importlib

import pytest

from jaxbounds.report import registry, runs
from jaxbounds.report.registry import MODELS, SECTIONS, model_names, section_names, sections_for


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
