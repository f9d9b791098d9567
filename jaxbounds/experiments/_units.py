"""Units of an experiment: JSON conversion, canonical JSON, stable keys, grid expansion.

A unit is one configuration point times one seed. Its key is the SHA-256 of the canonical JSON
(sorted keys, no whitespace, ASCII, no NaN) of ``{"experiment", "version", "config", "seed"}``,
so any change of a configuration value, of the seed, of the experiment name or of the package
version gives another key, and equal configurations give equal keys in every process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Unit", "canonical_json", "config_batch_key", "grid_units", "to_jsonable", "unit_key"]


def to_jsonable(value: Any, *, where: str = "value") -> Any:
    """Convert numpy/JAX scalars and arrays, tuples and mappings into JSON builtins.

    Args:
      value: ``None``, bool, int, float, str, a numpy/JAX scalar or array, a list/tuple or a
        mapping with string keys (recursively).
      where: name of the value in error messages.

    Returns:
      The same data as Python builtins (arrays become nested lists, tuples become lists).

    Raises:
      TypeError: for a mapping key that is not a string or an object JSON cannot hold.

    >>> to_jsonable({"a": np.float32(0.5), "b": (1, np.arange(2))})
    {'a': 0.5, 'b': [1, [0, 1]]}
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {key!r}")
            out[key] = to_jsonable(item, where=f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [to_jsonable(item, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "__array__"):
        array = np.asarray(value)
        return array.item() if array.ndim == 0 else array.tolist()
    raise TypeError(f"{where}: {type(value).__name__} is not JSON-serialisable")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value``: sorted keys, no spaces, ASCII, finite numbers.

    Args:
      value: anything :func:`to_jsonable` accepts.

    Returns:
      A string that is equal for equal data in every process and Python session.

    Raises:
      ValueError: if the value holds NaN or an infinity.

    >>> canonical_json({"b": 1, "a": [0.5, "x"]})
    '{"a":[0.5,"x"],"b":1}'
    """
    try:
        return json.dumps(
            to_jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
            allow_nan=False,
        )  # fmt: skip
    except ValueError:
        raise ValueError(f"canonical_json: NaN or infinity in {value!r}") from None


@dataclasses.dataclass(frozen=True)
class Unit:
    """One configuration point times one seed.

    Attributes:
      config: the unit's full configuration, a mapping with string keys and JSON values. It
        must hold every setting that changes the result (the key is computed from it); the
        stored copy is converted with :func:`to_jsonable`.
      seed: a non-negative int.

    >>> Unit({"T": 20}, seed=1).label()
    'T=20 seed=1'
    """

    config: Mapping[str, Any]
    seed: int

    def __post_init__(self) -> None:
        if not isinstance(self.config, Mapping):
            raise TypeError(f"Unit.config: expected a mapping, got {type(self.config).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise TypeError(f"Unit.seed: expected an int, got {self.seed!r}")
        if self.seed < 0:
            raise ValueError(f"Unit.seed: expected a non-negative int, got {self.seed}")
        object.__setattr__(self, "config", to_jsonable(self.config, where="Unit.config"))
        object.__setattr__(self, "seed", int(self.seed))
        canonical_json(self.config)  # NaN or infinity in a configuration: ValueError now

    def __hash__(self) -> int:
        return hash((canonical_json(self.config), self.seed))

    def label(self) -> str:
        """A short ``key=value`` description for progress lines."""
        parts = [f"{k}={_short(v)}" for k, v in self.config.items()]
        return " ".join([*parts, f"seed={self.seed}"])


def _short(value: Any, width: int = 24) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def unit_key(experiment: str, unit: Unit, version: str) -> str:
    """The unit's file key: SHA-256 (hex) of its canonical JSON with experiment and version.

    Args:
      experiment: the experiment's name.
      unit: the unit.
      version: the package version the unit was computed with.

    Returns:
      64 hexadecimal characters.

    >>> key = lambda n: unit_key("toy", Unit({"n": n}, seed=0), "0.1.0")
    >>> key(1) == key(1), key(1) == key(2), len(key(1))
    (True, False, 64)
    """
    text = canonical_json(
        {"experiment": experiment, "version": version, "config": unit.config, "seed": unit.seed}
    )
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def config_batch_key(unit: Unit) -> str:
    """Default batch key: units with equal configurations (different seeds) share a batch.

    >>> config_batch_key(Unit({"n": 1}, 0)) == config_batch_key(Unit({"n": 1}, 5))
    True
    """
    return canonical_json(unit.config)


def grid_units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[Unit]:
    """Default expansion: the Cartesian product of the grid's list values, times the seeds.

    Every value that is a ``list`` is an axis (the first key varies slowest); every other value
    (a tuple for a constant sequence) is the same in every configuration. Seeds vary fastest.

    Args:
      grid: the configuration grid of one scale.
      seeds: the seeds.

    Returns:
      One :class:`Unit` per configuration point and seed.

    >>> [u.label() for u in grid_units({"T": [20, 40], "d": 8}, seeds=[0, 1])]
    ['T=20 d=8 seed=0', 'T=20 d=8 seed=1', 'T=40 d=8 seed=0', 'T=40 d=8 seed=1']
    """
    axes = [(key, value) for key, value in grid.items() if isinstance(value, list)]
    fixed = {key: value for key, value in grid.items() if not isinstance(value, list)}
    units = []
    for point in itertools.product(*(values for _, values in axes)):
        chosen = dict(zip((key for key, _ in axes), point, strict=True))
        config = {key: chosen.get(key, fixed.get(key)) for key in grid}
        units.extend(Unit(config, seed) for seed in seeds)
    return units
