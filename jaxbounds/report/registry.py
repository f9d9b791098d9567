"""The explicit table of what ``jaxbounds estimate`` can run: models and sections, in order.

:data:`MODELS` maps each model name to its builder (:mod:`jaxbounds.report.runs`);
:data:`SECTIONS` lists every report section with the models it applies to, in the order the
report prints them. Nothing registers itself on import: to add a section, write
``fn(run) -> list[Row]`` in ``jaxbounds/report/sections/`` and add one line here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
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

__all__ = ["MODELS", "SECTIONS", "Section", "model_names", "section_names", "sections_for"]


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
      ValueError: for an unknown model or section name.

    >>> [s.name for s in sections_for("construction")]
    ['construction', 'bounds']
    """
    if model not in MODELS:
        raise ValueError(f"model: expected one of {model_names()}, got {model!r}")
    if only is not None:
        unknown = set(only) - set(section_names())
        if unknown:
            raise ValueError(f"sections: unknown {sorted(unknown)}; known {section_names()}")
    return [s for s in SECTIONS if model in s.models and (only is None or s.name in only)]
