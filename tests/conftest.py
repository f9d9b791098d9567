"""Test configuration: float64, strict dtype promotion, rank promotion raises, eager/jit fixture."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(params=["eager", "jit"])
def run(request):
    """Run a zero-argument body eagerly, or traced once under ``jax.jit``.

    Usage: ``result = run(lambda: kernel(...))``.
    """
    if request.param == "eager":
        return lambda body: body()
    return lambda body: jax.jit(body)()
