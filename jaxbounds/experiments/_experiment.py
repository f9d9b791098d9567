"""The specification of a reproducible experiment (:class:`Experiment`) and the table of them."""

from __future__ import annotations

import dataclasses
import importlib
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxbounds.experiments._progress import PROGRESS_WIDTH
from jaxbounds.experiments._units import Unit, config_batch_key, grid_units, to_jsonable

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclasses.dataclass(frozen=True, eq=False)
class Experiment:
    """The specification of a reproducible experiment (no state; hooks are plain functions).

    Attributes:
      name: directory name and registry key (lower case, digits, ``-``, ``_``, ``.``).
      description: one line for ``--list`` and the report.
      paper: the reference (authors, year, section/figure).
      scales: ``{scale: config grid}``, usually ``smoke`` (< 1 min, tests), ``cpu`` (default,
        < 20 min on 2 cores) and ``paper`` (the paper's sizes).
      run_unit: ``run_unit(unit) -> dict`` of JSON-serialisable results (numpy scalars and
        arrays are converted). Keys must differ from the config keys and ``"seed"``.
      units: ``units(config_grid, seeds) -> list[Unit]`` (default :func:`grid_units`). Every
        setting that changes a result belongs in the unit's config.
      run_batch: optional ``run_batch(units) -> list[dict]`` computing several units at once
        (e.g. the seeds of one configuration as one vmapped program); used instead of
        ``run_unit`` when given. Row ``i`` must equal what ``run_unit(units[i])`` would give
        whatever the other units of the batch are (a resumed run may batch fewer units).
      batch_key: units with equal ``batch_key(unit)`` form one batch (default: equal config).
      max_batch_size: the most units one ``run_batch`` call gets (a larger batch is computed in
        consecutive pieces of this size, so memory does not grow with ``--seeds``; default 16).
      render: ``render(rows, meta, out_dir) -> None`` writing figures and ``report.md``
        (default :func:`default_render`). ``rows`` are the sorted result rows (config, seed
        and result columns as dicts), ``meta`` the content of ``summary.json``.
      claims: the paper's claims the report tests, one sentence each.
      paper_numbers: the paper's reported numbers the report puts beside ours (JSON data).
      default_seeds: number of seeds, one int or ``{scale: int}``.
      default_scale: the scale when none is given.
      requires: the optional packages (import names, e.g. ``"mlxtend"``) that running its
        units needs; :func:`run_experiment` checks them before any work
        (``importlib.util.find_spec``, nothing imported) and raises
        :class:`MissingPackages` naming the ``pip`` command.
      render_requires: the optional packages that rendering its report needs (checked before
        any work too, also with ``from_dir``). Figures need ``matplotlib`` but are never
        required: without it the report is written without them and says so.
    """

    name: str
    description: str
    paper: str
    scales: Mapping[str, Mapping[str, Any]]
    run_unit: Callable[[Unit], Mapping[str, Any]]
    units: Callable[[Mapping[str, Any], Sequence[int]], list[Unit]] = grid_units
    run_batch: Callable[[Sequence[Unit]], Sequence[Mapping[str, Any]]] | None = None
    batch_key: Callable[[Unit], Any] = config_batch_key
    max_batch_size: int = 16
    render: Callable[[list[dict], dict, Path], None] | None = None
    claims: tuple[str, ...] = ()
    paper_numbers: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    default_seeds: int | Mapping[str, int] = 3
    default_scale: str = "cpu"
    requires: tuple[str, ...] = ()
    render_requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Experiment.name: expected a lower-case slug, got {self.name!r}")
        if not self.scales or not all(isinstance(g, Mapping) for g in self.scales.values()):
            raise ValueError(f"Experiment {self.name}: scales must map names to config grids")
        if self.default_scale not in self.scales:
            raise ValueError(
                f"Experiment {self.name}: default_scale {self.default_scale!r} is not one of "
                f"{sorted(self.scales)}"
            )
        for hook in ("run_unit", "units", "batch_key"):
            if not callable(getattr(self, hook)):
                raise TypeError(f"Experiment {self.name}: {hook} must be callable")
        size = self.max_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Experiment {self.name}: max_batch_size must be an int >= 1, "
                             f"got {size!r}")  # fmt: skip
        object.__setattr__(self, "claims", tuple(self.claims))
        for field in ("requires", "render_requires"):
            value = getattr(self, field)
            names = (value,) if isinstance(value, str) else tuple(value)
            if not all(isinstance(name, str) and name for name in names):
                raise TypeError(f"Experiment {self.name}: {field} must be import names")
            object.__setattr__(self, field, names)
        to_jsonable(self.paper_numbers, where=f"Experiment {self.name}: paper_numbers")

    def seeds_for(self, scale: str) -> int:
        """The default number of seeds at ``scale``."""
        if isinstance(self.default_seeds, Mapping):
            return int(self.default_seeds.get(scale, 1))
        return int(self.default_seeds)


class ExperimentRegistry:
    """An explicit, ordered table of experiments (nothing registers itself on import).

    Entries are :class:`Experiment` objects or lazy ``(name, "module:attribute", description)``
    triples, imported on :meth:`get` only, so listing needs no experiment module. The attribute
    is an :class:`Experiment` or a function of no arguments returning one.

    >>> toy = Experiment("toy", "a toy", "none", {"cpu": {"n": [1, 2]}}, run_unit=lambda u: {})
    >>> registry = ExperimentRegistry([toy, ("other", "some.module:EXPERIMENT", "lazy one")])
    >>> registry.names(), registry.get("toy") is toy, "other" in registry
    (('toy', 'other'), True, True)
    """

    def __init__(self, entries: Iterable[Experiment | tuple[str, str, str]] = ()) -> None:
        self._entries: dict[str, Experiment | tuple[str, str]] = {}
        # Lazy entries once imported; kept apart from the table so that the listing and the
        # descriptions never depend on which experiments a process has already run.
        self._loaded: dict[str, Experiment] = {}
        for entry in entries:
            name, value = self._entry(entry)
            if name in self._entries:
                raise ValueError(f"ExperimentRegistry: experiment {name!r} listed twice")
            self._entries[name] = value

    @staticmethod
    def _entry(entry: Experiment | tuple[str, str, str]) -> tuple[str, Any]:
        if isinstance(entry, Experiment):
            return entry.name, entry
        name, target, description = entry
        if ":" not in target:
            raise ValueError(f"ExperimentRegistry: {name}: target must be 'module:attr'")
        return name, (target, description)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        """Names in table order."""
        return tuple(self._entries)

    def description(self, name: str) -> str:
        """One-line description of ``name`` (without importing a lazy entry).

        A lazy entry keeps its table description after :meth:`get` has imported it.
        """
        entry = self._entries[self._known(name)]
        return entry.description if isinstance(entry, Experiment) else entry[1]

    def listing(self, width: int = PROGRESS_WIDTH) -> str:
        """``name  description`` lines for ``jaxbounds reproduce --list``, ``width`` columns wide.

        A long description wraps onto lines indented under the first (descriptions get at
        least 20 columns).

        >>> toy = Experiment("toy", "a toy", "none", {"cpu": {}}, run_unit=lambda u: {})
        >>> print(ExperimentRegistry([toy, ("other", "m:E", "word " * 6)]).listing(width=27))
        toy    a toy
        other  word word word word
               word word
        """
        names = max((len(name) for name in self._entries), default=0)
        lines = []
        for name in self._entries:
            text = textwrap.wrap(self.description(name), max(width - names - 2, 20)) or [""]
            lines.append(f"{name:<{names}}  {text[0]}")
            lines += [" " * (names + 2) + more for more in text[1:]]
        return "\n".join(lines)

    def get(self, name: str) -> Experiment:
        """The experiment called ``name`` (importing its module if lazy).

        Raises:
          ValueError: for an unknown name, or a lazy target that is not that experiment.
        """
        entry = self._entries[self._known(name)]
        if isinstance(entry, Experiment):
            return entry
        if name in self._loaded:
            return self._loaded[name]
        module, _, attribute = entry[0].partition(":")
        value = getattr(importlib.import_module(module), attribute)
        experiment = value() if callable(value) and not isinstance(value, Experiment) else value
        if not isinstance(experiment, Experiment) or experiment.name != name:
            raise ValueError(f"ExperimentRegistry: {entry[0]} is not the experiment {name!r}")
        self._loaded[name] = experiment
        return experiment

    def _known(self, name: str) -> str:
        if name not in self._entries:
            known = ", ".join(self._entries) or "none"
            raise ValueError(f"unknown experiment {name!r}; known: {known}")
        return name
