"""Checks of a run before any work: its size, its optional packages, the run already there."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxbounds import _deps
from jaxbounds.experiments._experiment import Experiment
from jaxbounds.experiments._units import canonical_json

MissingPackages = _deps.MissingPackages

#: The most units (configurations x seeds) one run may plan; :func:`check_size` refuses more.
MAX_UNITS = 20_000
_UNIT_OVERHEAD_BYTES = 1024  # Python objects, key and loaded record of one unit, besides its config


class RunTooLarge(ValueError):
    """A run that would plan more than :data:`MAX_UNITS` units (refused before any work).

    Attributes:
      num_units: the estimated number of units.
      per_seed: units per seed at the scale (its configurations).
      max_seeds: the most seeds allowed at the scale.
    """

    def __init__(self, message: str, num_units: int, per_seed: int, max_seeds: int) -> None:
        super().__init__(message)
        self.num_units, self.per_seed, self.max_seeds = num_units, per_seed, max_seeds


def _size_text(num_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:.0f} B"


def check_size(experiment: Experiment, scale: str, seeds: int | Sequence[int]) -> int:
    """The number of units a run plans, estimated from one seed before the grid is expanded.

    ``experiment.units(grid, [seeds[0]])`` gives the units of one seed (the configurations);
    the run plans about that many times ``len(seeds)``. Each planned unit costs about 1 kB of
    memory besides its configuration (key, objects, the record read back to render) and one
    unit file on disk; its compute is what the scale says. Memory for the computation itself
    does not grow with the seeds (batches hold at most ``max_batch_size`` units).

    Args:
      experiment: the :class:`Experiment`.
      scale: a key of ``experiment.scales``.
      seeds: the seeds, or their number N (seeds 0..N-1; never expanded, so an absurd N such
        as 10**20 is refused at once).

    Returns:
      The estimated number of units.

    Raises:
      RunTooLarge: above :data:`MAX_UNITS` units, with the figures (units, memory to track them)
        and the most seeds allowed at this scale.

    >>> toy = Experiment("toy", "a toy", "none", {"cpu": {"n": [1, 2]}}, run_unit=lambda u: {})
    >>> check_size(toy, "cpu", range(3))
    6
    >>> try:
    ...     check_size(toy, "cpu", range(10**5))
    ... except RunTooLarge as err:
    ...     print(err.num_units, err.max_seeds)
    200000 10000
    """
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        count, first = seeds, (0,)
    else:
        seeds = tuple(seeds)
        count, first = len(seeds), seeds[:1]
    one = list(experiment.units(experiment.scales[scale], first))
    per_seed = max(len(one), 1)
    num_units = per_seed * count
    if num_units <= MAX_UNITS:
        return num_units
    config_bytes = max((len(canonical_json(u.config)) for u in one), default=0)
    memory = num_units * (_UNIT_OVERHEAD_BYTES + config_bytes)
    max_seeds = MAX_UNITS // per_seed
    raise RunTooLarge(
        f"{experiment.name} at scale {scale} with {count:,} seeds would plan "
        f"{num_units:,} units ({per_seed:,} per seed), about {_size_text(memory)} of memory "
        f"only to track them and {num_units:,} unit files; the limit is {MAX_UNITS:,} units "
        f"per run: at most {max_seeds:,} seeds at this scale",
        num_units, per_seed, max_seeds,
    )  # fmt: skip


def check_packages(experiment: Experiment, *, rendering_only: bool = False) -> None:
    """Check the experiment's optional packages before any work (nothing is imported).

    Args:
      experiment: the :class:`Experiment`.
      rendering_only: check only ``render_requires`` (``--from``: nothing is run).

    Raises:
      MissingPackages: naming the missing packages and the ``pip`` command that installs them.

    >>> toy = Experiment("toy", "a toy", "none", {"cpu": {}}, run_unit=lambda u: {},
    ...                  requires=("no_such_module_here",))
    >>> try:
    ...     check_packages(toy)
    ... except MissingPackages as err:
    ...     print(err.packages)
    ['no_such_module_here']
    >>> check_packages(toy, rendering_only=True)
    """
    needed = [*experiment.render_requires]
    if not rendering_only:
        needed = [*experiment.requires, *needed]
    _deps.require(needed, experiment.name)


class OtherRunThere(ValueError):
    """The output folder holds the report of another run (another scale or other seeds).

    Attributes:
      run_dir: the folder.
      differences: what differs, e.g. ``["scale cpu (now smoke)"]``.
    """

    def __init__(self, run_dir: Path, differences: list[str]) -> None:
        self.run_dir, self.differences = run_dir, list(differences)
        super().__init__(
            f"{run_dir} holds the report of another run ({'; '.join(differences)}); "
            "replacing it needs --fresh (fresh=True), or choose another output folder"
        )


def check_same_run(experiment: Experiment, run_dir: Path, scale: str, seeds: tuple) -> None:
    """Refuse to replace the finished report of another run in ``run_dir`` (before any work).

    The run recorded in ``run_dir/summary.json`` is the same run when its experiment, scale
    and seeds are this run's (a newer package version is the same run, computed again). An
    unreadable ``summary.json`` counts as another run's.

    Raises:
      OtherRunThere: naming what differs.
    """
    summary = Path(run_dir) / "summary.json"
    if not summary.exists():
        return
    try:
        recorded = json.loads(summary.read_text(encoding="utf-8"))
        if not isinstance(recorded, Mapping):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise OtherRunThere(run_dir, [f"{summary.name} is unreadable ({err})"]) from None
    now = {"experiment": experiment.name, "scale": scale, "seeds": list(seeds)}
    differences = [
        f"{key} {_brief(recorded.get(key))} (now {_brief(value)})"
        for key, value in now.items()
        if recorded.get(key) != value
    ]
    if differences:
        raise OtherRunThere(run_dir, differences)


def _brief(value: Any, width: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."
