"""The main job: model + data -> every kernel's estimate -> bounds -> one report.

Extension contract (how each part of the engine adds to the report):

- A *model builder* ``build(key, *, quick) -> EstimateContext`` is registered with
  :func:`register_model` under a name (``"scalar"``, ``"shallow"``, ``"construction"``); it makes
  the default data, trains (or constructs) the model and fills the context.
- A *section* ``fn(ctx) -> list[Row]`` is registered with :func:`register_section` for the
  models it applies to. Sections live in ``jaxbounds/sections/<topic>.py``; the package
  ``jaxbounds.sections`` imports them all.

:func:`run_estimate` builds the context, runs every applicable section in registration order,
and returns a :class:`Report` (rows + metadata), which :mod:`jaxbounds.report` prints as a table
and writes as JSON.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = [
    "EstimateContext",
    "Report",
    "Row",
    "register_model",
    "register_section",
    "run_estimate",
]


@dataclasses.dataclass
class EstimateContext:
    """Everything a section needs about one trained (or constructed) model.

    Attributes:
      name: model name (``"scalar"``, ``"shallow"``, ``"construction"``).
      model: the flax nnx module.
      apply_fn: ``(params, inputs) -> outputs`` from ``jaxbounds.models.as_pure``.
      params: the trained parameters (pytree).
      loss_fn: ``params -> scalar`` mean training loss on ``train`` (closes over the data).
      train: training data, a dict with at least ``"inputs"`` and ``"labels"``.
      test: held-out data with the same keys (may be None).
      history: training record (per-epoch loss / accuracy / norms), or None.
      key: PRNG key reserved for the sections' Monte Carlo draws.
      quick: True for the small default run (must finish in minutes on 2 CPU cores).
      extra: free-form facts a builder wants to pass to its sections (e.g. initial params).
    """

    name: str
    model: Any
    apply_fn: Callable[[Any, Any], Any]
    params: Any
    loss_fn: Callable[[Any], Any]
    train: dict[str, Any]
    test: dict[str, Any] | None = None
    history: Any = None
    key: jax.Array | None = None
    quick: bool = True
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def section_key(self, name: str) -> jax.Array:
        """A PRNG key for one section, derived from ``key`` and the section name."""
        base = self.key if self.key is not None else jax.random.key(0)
        return jax.random.fold_in(base, sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**31)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the report.

    Attributes:
      section: the section it belongs to (``"curvature"``, ``"sharpness"``, ...).
      name: what was measured.
      value: the number (float), or a string for descriptive rows.
      stderr: its standard error for Monte Carlo estimates, else None.
      lower: lower end of a confidence interval, else None.
      upper: upper end of a confidence interval, else None.
      vacuous: for bounds, whether the bound is vacuous (>= the trivial bound), else None.
      note: method, assumptions, status ("rebuilt"), units.
    """

    section: str
    name: str
    value: float | str
    stderr: float | None = None
    lower: float | None = None
    upper: float | None = None
    vacuous: bool | None = None
    note: str = ""

    @classmethod
    def from_estimate(cls, section: str, name: str, est: Any, note: str = "") -> Row:
        """A row from a kernels ``Estimate`` (mean, stderr and interval if any)."""
        lower = None if getattr(est, "lower", None) is None else float(est.lower)
        upper = None if getattr(est, "upper", None) is None else float(est.upper)
        return cls(section, name, float(est.mean), float(est.stderr), lower, upper, None, note)


@dataclasses.dataclass
class Report:
    """The main job's result: rows plus metadata (model, sizes, timings)."""

    model: str
    rows: list[Row]
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return {
            "model": self.model,
            "meta": self.meta,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }


_MODELS: dict[str, Callable[..., EstimateContext]] = {}
_SECTIONS: list[tuple[str, Callable[[EstimateContext], list[Row]], tuple[str, ...]]] = []


def register_model(name: str) -> Callable:
    """Decorator registering a model builder ``build(key, *, quick) -> EstimateContext``."""

    def deco(fn: Callable[..., EstimateContext]) -> Callable[..., EstimateContext]:
        _MODELS[name] = fn
        return fn

    return deco


def register_section(name: str, *, models: Sequence[str] = ("scalar",)) -> Callable:
    """Decorator registering a report section ``fn(ctx) -> list[Row]`` for the given models."""

    def deco(fn: Callable[[EstimateContext], list[Row]]) -> Callable[[EstimateContext], list[Row]]:
        _SECTIONS[:] = [s for s in _SECTIONS if s[0] != name]
        _SECTIONS.append((name, fn, tuple(models)))
        return fn

    return deco


def available_models() -> list[str]:
    """Names of the registered model builders."""
    import jaxbounds.sections  # noqa: F401  (registers builders and sections)

    return sorted(_MODELS)


def run_estimate(
    model: str = "scalar",
    *,
    seed: int = 0,
    quick: bool = True,
    sections: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> Report:
    """Build the model's context and run every applicable section.

    Args:
      model: a registered model name (see :func:`available_models`).
      seed: seed of every random choice (data, init, Monte Carlo).
      quick: the small default run.
      sections: restrict to these section names (default: all applicable).
      log: progress messages (None for silence).

    Returns:
      The :class:`Report`.

    Raises:
      ValueError: for an unknown model or section name.
    """
    import jaxbounds.sections  # noqa: F401  (registers builders and sections)

    if model not in _MODELS:
        raise ValueError(f"model: expected one of {sorted(_MODELS)}, got {model!r}")
    known = {s[0] for s in _SECTIONS}
    if sections is not None:
        unknown = set(sections) - known
        if unknown:
            raise ValueError(f"sections: unknown {sorted(unknown)}; known {sorted(known)}")
    say = log or (lambda _msg: None)
    key = jax.random.key(seed)
    t0 = time.perf_counter()
    ctx = _MODELS[model](key, quick=quick)
    timings = {"build": time.perf_counter() - t0}
    rows: list[Row] = []
    for name, fn, models in _SECTIONS:
        if model not in models or (sections is not None and name not in sections):
            continue
        say(f"[jaxbounds] {name} ...")
        t = time.perf_counter()
        rows.extend(fn(ctx))
        timings[name] = time.perf_counter() - t
    meta = {"seed": seed, "quick": quick, "timings_s": timings, "backend": jax.default_backend()}
    meta.update(ctx.extra.get("meta", {}))
    return Report(model=model, rows=rows, meta=meta)
