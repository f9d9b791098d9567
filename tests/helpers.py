"""Shared test helpers: trace and compile counting, dtype tolerances, experiment smoke runs."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp


class TraceCounter:
    """Wrap a function and count how often JAX traces (or Python runs) it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.fn(*args, **kwargs)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def count_compiles() -> Iterator[list[str]]:
    """Collect the messages of every XLA compilation inside the block (``jax.log_compiles``)."""
    handler = _Collect()
    names = ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax")
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield handler.messages
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def compiles_in(messages: list[str]) -> list[str]:
    """The compilation messages among collected log messages."""
    return [m for m in messages if m.startswith("Compiling") or "Finished XLA compilation" in m]


def tol(dtype: Any) -> float:
    """Relative tolerance tied to a dtype: sqrt(eps)."""
    return float(jnp.sqrt(jnp.finfo(dtype).eps))


def run_smoke(experiment: Any, tmp_path_factory: Any) -> Path:
    """Run an experiment at smoke scale into a fresh folder; every unit must finish."""
    from jaxbounds.experiments.runner import run_experiment

    out = tmp_path_factory.mktemp(experiment.name)
    summary = run_experiment(experiment, scale="smoke", out_dir=out, quiet=True)
    assert summary.num_missing == 0
    return summary.out_dir


def read_rows(
    run_dir: Path,
    *,
    ints: Iterable[str] = (),
    floats: Iterable[str] = (),
    lists: Iterable[str] = (),
    bools: Iterable[str] = (),
    strings: Iterable[str] | None = None,
) -> list[dict]:
    """The rows of a run's ``results.csv`` with the named columns parsed (lists are JSON).

    With ``strings`` given, every column not named in any argument is read as a float and the
    ``strings`` columns stay text.
    """
    with (Path(run_dir) / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    parse: dict[str, Callable[[str], Any]] = {k: int for k in ints}
    parse.update({k: float for k in floats})
    parse.update({k: json.loads for k in lists})
    parse.update({k: (lambda v: v.lower() == "true") for k in bools})
    keep = set(strings or ())
    for row in rows:
        for key, value in row.items():
            if key in parse:
                row[key] = parse[key](value)
            elif strings is not None and key not in keep:
                row[key] = float(value)
    return rows


# TF32 keeps 10 explicit mantissa bits (unit roundoff 2^-11), bfloat16 7 (2^-8); a handful of
# roundoffs of the operands' scale covers a product's rounding, as sqrt(eps) does for float32.
_TF32_TOL = 8 * 2.0**-11
_BF16_TOL = 8 * 2.0**-8
# Explicit mantissa bits a matmul keeps its float32 operands to, by precision name.
MANTISSA_BITS = {"tensorfloat32": 10, "bfloat16": 7}


def matmul_tol(dtype: Any, precision: str | None = None) -> float:
    """Relative tolerance of a result computed through matmuls of ``dtype`` at default precision.

    sqrt(eps) of the dtype where float32 matmuls are full precision (CPU, float64, or
    ``jax_default_matmul_precision="highest"``); TF32's on a GPU and bfloat16's on a TPU at JAX's
    default precision. Use it only where a matmul of float32 operands is on the path.
    ``precision`` (``"tensorfloat32"`` or ``"bfloat16"``) asks for that precision's tolerance
    whatever the backend: for a model that rounds its own matmul operands (a CPU simulation).
    """
    from kernels._backend import reduced_precision_matmuls, sample_platform

    if precision is not None:
        if precision not in MANTISSA_BITS:
            raise ValueError(
                f"precision: expected one of {sorted(MANTISSA_BITS)}, got {precision!r}"
            )
        return _TF32_TOL if precision == "tensorfloat32" else _BF16_TOL
    if not reduced_precision_matmuls(dtype):
        return tol(dtype)
    return _BF16_TOL if sample_platform() == "tpu" else _TF32_TOL


def round_mantissa(x: Any, bits: int) -> jax.Array:
    """float32 ``x`` rounded to ``bits`` explicit mantissa bits (round to nearest, ties to even).

    What a TF32 (``bits=10``) or bfloat16 (``bits=7``) matmul does to its float32 operands; the
    exponent range stays float32's. A simulation of a GPU / TPU matmul on a CPU, which computes
    float32 products in full precision whatever ``jax.default_matmul_precision`` says.
    """
    x = jnp.asarray(x, jnp.float32)
    shift = 23 - bits
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    lsb = (u >> shift) & jnp.uint32(1)
    u = (u + jnp.uint32((1 << (shift - 1)) - 1) + lsb) & jnp.uint32(
        ~((1 << shift) - 1) & 0xFFFFFFFF
    )
    return jax.lax.bitcast_convert_type(u, jnp.float32)


def dot_precisions(fn: Callable[..., Any], *args: Any) -> list[tuple[tuple, Any]]:
    """(lhs shape, precision) of every ``dot_general`` in ``fn``'s program, nested ones too."""
    found: list[tuple[tuple, Any]] = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append((tuple(eqn.invars[0].aval.shape), eqn.params["precision"]))
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # ClosedJaxpr
                        walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):  # Jaxpr
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found
