"""The ``jaxbounds estimate`` job: build a model's run, run its sections, collect the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax

from jaxbounds.report.registry import MODELS, sections_for
from jaxbounds.report.rows import Report, Row

__all__ = ["run_estimate"]


def run_estimate(
    model: str = "scalar",
    *,
    seed: int = 0,
    quick: bool = True,
    sections: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> Report:
    """Build the model's run and run every applicable section, in report order.

    Args:
      model: a model name (see :func:`jaxbounds.report.registry.model_names`).
      seed: seed of every random choice (data, init, Monte Carlo).
      quick: the small default run.
      sections: restrict to these section names (default: all that apply).
      log: progress messages (None for silence).

    Returns:
      The :class:`~jaxbounds.report.rows.Report`: rows and metadata (seed, timings, backend and
      the run's own metadata).

    Raises:
      ValueError: for an unknown model or section name.
    """
    chosen = sections_for(model, sections)
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    run = MODELS[model](jax.random.key(seed), quick=quick)
    timings = {"build": time.perf_counter() - t0}
    rows: list[Row] = []
    for section in chosen:
        say(f"[jaxbounds] {section.name} ...")
        t = time.perf_counter()
        rows.extend(section.fn(run))
        timings[section.name] = time.perf_counter() - t
    meta = {"seed": seed, "quick": quick, "timings_s": timings, "backend": jax.default_backend()}
    meta.update(run.meta)
    return Report(model=model, rows=rows, meta=meta)
