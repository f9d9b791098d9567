"""The explicit table of what ``jaxbounds estimate`` can run: models and sections, in order.

:data:`MODELS` maps each model name to its builder (:mod:`jaxbounds.report.runs`);
:data:`SECTIONS` lists every report section with the models it applies to, in the order the
report prints them. Nothing registers itself on import: to add a section, write
``fn(run) -> list[Row]`` in ``jaxbounds/report/sections/`` and add one line here.
:func:`using` swaps the whole table for the duration of a ``with`` block (tests, plug-ins):
everything that reads the registry (:func:`sections_for`, :func:`jaxbounds.report.run_estimate`,
the command line) sees the swapped table.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType

from jaxbounds.report import runs
from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row
from jaxbounds.report.sections import (
    bounds_section,
    construction_section,
    curvature_section,
    rademacher_section,
    shallow_section,
    sharpness_section,
    training_section,
)

__all__ = [
    "MODELS",
    "MODEL_PACKAGES",
    "SECTIONS",
    "Section",
    "model_names",
    "section_names",
    "sections_for",
    "using",
]


@dataclasses.dataclass(frozen=True)
class Section:
    """One report section: its name, ``fn(run) -> list[Row]`` and the models it applies to."""

    name: str
    fn: Callable[[Run], list[Row]]
    models: tuple[str, ...]


#: Model name -> builder ``build(key, *, quick) -> Run``.
MODELS: Mapping[str, Callable[..., Run]] = MappingProxyType(
    {
        "construction": runs.build_construction,
        "scalar": runs.build_scalar,
        "shallow": runs.build_shallow,
    }
)

#: Model name -> the optional packages (import names) its build uses where they are installed,
#: each with what the model does without it. No model *needs* one (the core install runs every
#: model); ``jaxbounds estimate`` says before any work which of them is missing.
MODEL_PACKAGES: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "shallow": MappingProxyType(
            {"sklearn": "trains on SYNTHETIC digits instead of scikit-learn's 8x8 digits"}
        ),
    }
)

_ALL = ("scalar", "shallow", "construction")

#: Every section in report order.
SECTIONS: tuple[Section, ...] = (
    Section("training", training_section, ("scalar",)),
    Section("curvature", curvature_section, ("scalar",)),
    Section("sharpness", sharpness_section, ("scalar",)),
    Section("rademacher", rademacher_section, ("scalar",)),
    Section("shallow", shallow_section, ("shallow",)),
    Section("construction", construction_section, ("construction",)),
    Section("bounds", bounds_section, _ALL),
)


def model_names() -> list[str]:
    """Names of the models, sorted.

    >>> model_names()
    ['construction', 'scalar', 'shallow']
    """
    return sorted(MODELS)


def section_names() -> list[str]:
    """Names of the sections, in report order.

    >>> section_names()[:2]
    ['training', 'curvature']
    """
    return [s.name for s in SECTIONS]


def sections_for(model: str, only: Sequence[str] | None = None) -> list[Section]:
    """The sections that apply to ``model`` (restricted to ``only`` if given), in report order.

    Raises:
      ValueError: for an unknown model or section name, or a selection that selects nothing
        (``only`` empty, or none of its sections applies to ``model``).

    >>> [s.name for s in sections_for("construction")]
    ['construction', 'bounds']
    >>> sections_for("construction", ["training"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: sections: training selects nothing for model 'construction' (its sections: ...)
    """
    if model not in MODELS:
        raise ValueError(f"model: expected one of {model_names()}, got {model!r}")
    applicable = [s for s in SECTIONS if model in s.models]
    if only is None:
        return applicable
    only = list(only)
    unknown = set(only) - set(section_names())
    if unknown:
        raise ValueError(f"sections: unknown {sorted(unknown)}; known {section_names()}")
    chosen = [s for s in applicable if s.name in only]
    if not chosen:
        asked = ", ".join(only) if only else "an empty list"
        its = ", ".join(s.name for s in applicable)
        raise ValueError(
            f"sections: {asked} selects nothing for model {model!r} (its sections: {its})"
        )
    return chosen


@contextlib.contextmanager
def using(
    models: Mapping[str, Callable[..., Run]] | None = None,
    sections: Sequence[Section] | None = None,
) -> Iterator[None]:
    """Swap the registry's table (:data:`MODELS`, :data:`SECTIONS`) inside a ``with`` block.

    Args:
      models: model name -> builder ``build(key, *, quick) -> Run`` (default: keep).
      sections: the sections in report order (default: keep).

    Raises:
      ValueError: if a section names a model that is not in ``models``.

    >>> def build(key, *, quick=True): ...
    >>> with using({"toy": build}, [Section("only", lambda run: [], ("toy",))]):
    ...     model_names(), section_names()
    (['toy'], ['only'])
    >>> "scalar" in model_names()
    True
    """
    global MODELS, SECTIONS
    new_models = MappingProxyType(dict(models)) if models is not None else MODELS
    new_sections = tuple(sections) if sections is not None else SECTIONS
    for section in new_sections:
        missing = set(section.models) - set(new_models)
        if missing:
            raise ValueError(f"using: section {section.name!r} names unknown models {missing}")
    saved = MODELS, SECTIONS
    MODELS, SECTIONS = new_models, new_sections
    try:
        yield
    finally:
        MODELS, SECTIONS = saved
