"""Test configuration: float64, strict dtype promotion, rank promotion raises, eager/jit fixture."""

import os

import jax
import pytest
from hypothesis import settings

# Property tests draw the same examples on every machine and every run (no example database, no
# fresh randomness), so CI's verdict never depends on luck. JAXBOUNDS_HYPOTHESIS=explore turns the
# random search back on (with more examples) for hunting new counterexamples by hand.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", max_examples=500, database=None, print_blob=True)
settings.load_profile(os.environ.get("JAXBOUNDS_HYPOTHESIS", "deterministic"))

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
