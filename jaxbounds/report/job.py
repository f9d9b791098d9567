"""The ``jaxbounds estimate`` job: build a model's run, run its sections, collect the report.

A job is fixed by its :class:`JobConfig` (model, seed, scale, the selected sections, the
package version and JAX's default float precision). :func:`run_estimate` can stop between two
steps (``should_stop``), hand each partial report to a callback as soon as a section is done
(``on_section``, which the command line writes to disk), and resume from such a partial report
(``resume``): the finished sections are kept as they are and only the others run. Every random
choice derives from the seed and the section's name, so a resumed job ends with the same
numbers as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from jaxbounds.report import registry
from jaxbounds.report.rows import Report, Row

__all__ = ["MAX_SEED", "JobConfig", "check_seed", "job_config", "precision", "run_estimate"]

#: Seeds are integers in ``[0, MAX_SEED)`` (what ``jax.random.key`` takes in every mode).
MAX_SEED = 2**32


def check_seed(seed: Any) -> int:
    """``seed`` as an int, checked to lie in ``[0, 2**32)``.

    Raises:
      ValueError: for a non-integer or out-of-range seed.

    >>> check_seed(7)
    7
    >>> check_seed(2**32)
    Traceback (most recent call last):
    ...
    ValueError: seed: expected an integer in [0, 2**32), got 4294967296
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed: expected an integer in [0, 2**32), got {seed!r}")
    return seed


def _version() -> str:
    from jaxbounds import __version__

    return __version__


def precision() -> str:
    """The float dtype JAX computes in by default: ``"float64"`` under ``JAX_ENABLE_X64``.

    Part of a job's identity: a run started in float32 and resumed with x64 on would mix
    rows of two trained models.

    >>> precision() in ("float32", "float64")
    True
    """
    import jax.numpy as jnp

    return jnp.dtype(jnp.result_type(float)).name


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What fixes the numbers of a job; a saved partial report is resumed only under the same.

    Attributes:
      model: the model name.
      seed: the seed of every random choice.
      quick: the small default run (False: ``--full``).
      sections: the selected sections, in report order.
      version: the ``jaxbounds`` version.
      precision: JAX's default float dtype (:func:`precision`); a report recorded without one
        was computed in float32 (JAX's default).
    """

    model: str
    seed: int
    quick: bool
    sections: tuple[str, ...]
    version: str
    precision: str = "float32"

    def to_dict(self) -> dict[str, Any]:
        """JSON form, stored in the report's ``meta["job"]``."""
        return {
            "model": self.model,
            "seed": self.seed,
            "scale": "quick" if self.quick else "full",
            "sections": list(self.sections),
            "version": self.version,
            "precision": self.precision,
        }

    def differences(
        self, recorded: Mapping[str, Any] | None, *, ignore: Sequence[str] = ()
    ) -> list[str]:
        """Where a report's recorded ``meta["job"]`` differs from this job (empty: same job).

        Args:
          recorded: the report's ``meta["job"]``.
          ignore: keys of :meth:`to_dict` not compared (e.g. ``("version",)``).

        >>> job = JobConfig("scalar", 1, True, ("training",), "0.1.0")
        >>> job.differences({**job.to_dict(), "seed": 2})
        ['seed 2 (now 1)']
        >>> job.differences({**job.to_dict(), "version": "0.0.9"}, ignore=("version",))
        []
        """
        if not isinstance(recorded, Mapping):
            return ["no job configuration recorded"]
        now = self.to_dict()
        before = {"precision": "float32", **recorded}  # recorded before precision was
        return [
            f"{key} {before.get(key)} (now {now[key]})"
            for key in now
            if key not in ignore and before.get(key) != now[key]
        ]


def job_config(
    model: str, *, seed: int = 0, quick: bool = True, sections: Sequence[str] | None = None
) -> JobConfig:
    """Check a job's options and fix its configuration (before any work).

    Raises:
      ValueError: for an unknown model or section, a selection that selects nothing, or a bad
        seed.
    """
    chosen = registry.sections_for(model, sections)
    names = tuple(s.name for s in chosen)
    return JobConfig(model, check_seed(seed), bool(quick), names, _version(), precision())


def _resumed(resume: Report | None, config: JobConfig) -> tuple[list[Row], list[str], dict]:
    """Rows, sections and timings kept from a saved partial report of the same job."""
    if resume is None:
        return [], [], {}
    diff = config.differences(resume.meta.get("job"))
    if resume.model != config.model or diff:
        raise ValueError(f"resume: the saved report is of another job: {'; '.join(diff)}")
    done = [s for s in config.sections if s in (resume.sections_done or [])]
    timings = dict(resume.meta.get("timings_s") or {})
    return list(resume.rows), done, {k: v for k, v in timings.items() if k in done}


def _build_parts(run: Any, build: float) -> dict[str, float]:
    """The build's time split into the training run (its record's wall time) and the rest.

    The model's builder trains it (``run.record.seconds``, compilation included); the rest is
    data, initialisation and the measurements the builder takes. Without a training record
    (a constructed model) the whole build is "data and model".
    """
    trained = getattr(getattr(run, "record", None), "seconds", None)
    if not isinstance(trained, int | float) or not 0 <= trained <= build:
        return {"data and model": build}
    return {"training run": float(trained), "data and model": build - float(trained)}


def run_estimate(
    model: str = "scalar",
    *,
    seed: int = 0,
    quick: bool = True,
    sections: Sequence[str] | None = None,
    log: Callable[[str], None] | None = print,
    resume: Report | None = None,
    on_section: Callable[[Report], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Report:
    """Build the model's run and run every applicable section, in report order.

    Args:
      model: a model name (see :func:`jaxbounds.report.registry.model_names`).
      seed: seed of every random choice (data, init, Monte Carlo), in ``[0, 2**32)``.
      quick: the small default run.
      sections: restrict to these section names (default: all that apply).
      log: progress messages (None for silence).
      resume: a partial report of the same job (:class:`JobConfig`); its finished sections are
        kept and not run again.
      on_section: called with the partial report (``complete=False``) after each section.
      should_stop: checked before the build and between sections; when it returns True the
        job stops there and returns the partial report.

    Returns:
      The :class:`~jaxbounds.report.rows.Report`: rows and metadata (seed, timings, backend,
      ``job`` (the :class:`JobConfig`) and the run's own metadata); ``complete`` is False when
      ``should_stop`` stopped it.

    Raises:
      ValueError: for an unknown model or section name, an empty selection, a bad seed, or a
        ``resume`` report of another job (all before any work).
    """
    config = job_config(model, seed=seed, quick=quick, sections=sections)
    rows, done, timings = _resumed(resume, config)
    say = log or (lambda _msg: None)
    stop = should_stop or (lambda: False)
    meta: dict[str, Any] = dict(resume.meta) if resume is not None else {}
    meta.update(seed=seed, quick=quick, sections=list(config.sections), job=config.to_dict())
    if done:
        meta["resumed"] = list(done)
        say(f"[jaxbounds] resuming: {', '.join(done)} done in the saved report")

    def report(complete: bool) -> Report:
        meta["timings_s"] = dict(timings)
        return Report(config.model, list(rows), dict(meta), complete, list(done))

    todo = [s for s in registry.sections_for(model, config.sections) if s.name not in done]
    if todo and not stop():
        t0 = time.perf_counter()
        run = registry.MODELS[model](jax.random.key(seed), quick=quick)
        build = time.perf_counter() - t0
        timings = {"build": build, **timings}
        meta["build_timings_s"] = _build_parts(run, build)
        meta["backend"] = jax.default_backend()
        for section in todo:
            if stop():
                break
            say(f"[jaxbounds] {section.name} ...")
            t = time.perf_counter()
            rows.extend(section.fn(run))
            timings[section.name] = time.perf_counter() - t
            done.append(section.name)
            meta.update(run.meta)
            if on_section is not None and len(done) < len(config.sections):
                on_section(report(False))
    return report(len(done) == len(config.sections))
