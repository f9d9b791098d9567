"""Root pytest configuration: numeric settings shared by the tests and the kernels' doctests.

The tests run with float64 enabled (they compare with exact references). The doctests of the
packages show what a user with JAX's defaults gets: each runs with ``jax_enable_x64`` off
(float32), and the setting is restored after it.
"""

import gc
import os

# XLA's CPU compiler spends most of a small program's compile generating code for its fusions; its
# older elemental emitters compile those about twice as fast as the MLIR fusion emitters (the
# default), with results equal within rounding. Read when JAX starts its CPU backend, so set before
# jax is imported; the environment variable carries the flag into the processes the tests start.
# JAXBOUNDS_TEST_XLA_OPT=1 leaves XLA's defaults (here and below).
_COMPILE_FLAGS = "--xla_cpu_use_fusion_emitters=false"
if os.environ.get("JAXBOUNDS_TEST_XLA_OPT", "0") != "1":
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} {_COMPILE_FLAGS}".strip()

# Tests start processes on 2 to 8 forced CPU devices while the other pytest-xdist worker keeps
# the cores busy: XLA's CPU collectives end the process when a device's thread has not joined a
# collective's rendezvous within 40 s (seen on a 2-core machine). Allow 10 minutes; the flag
# carries into the processes the tests start.
_COLLECTIVE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds=600"
if "xla_cpu_collective_call_terminate_timeout_seconds" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_COLLECTIVE_FLAG}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# The tests never use the user's persistent compilation cache (the CLI turns it on; the cache's
# own tests give it a temporary folder); the setting carries into the processes tests start.
os.environ["JAXBOUNDS_COMPILE_CACHE"] = "off"

# The tests run hundreds of small programs, so XLA's compile time dominates the suite: skip its
# expensive optimisation passes (the results do not depend on them beyond rounding, which every
# test's tolerance covers); the environment variable carries the setting into the processes the
# tests start. JAXBOUNDS_TEST_XLA_OPT=1 runs the suite with full optimisation.
if os.environ.get("JAXBOUNDS_TEST_XLA_OPT", "0") != "1":
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    jax.config.update("jax_disable_most_optimizations", True)

# JAX's persistent compilation cache: every compiled program, however quick its compile, is kept
# on disk in the checkout's gitignored .pytest_cache/, shared by the xdist workers and by later
# runs. An entry is keyed by the program's HLO, the compile options, XLA_FLAGS, the backend and
# the jax/jaxlib versions, so a changed kernel compiles afresh; a hit skips XLA's compile only
# (tracing, lowering and every assertion run as before). A rerun uses about half the CPU of a
# first run (docs/contributing.md). The processes the tests start do not use it: some are killed
# on purpose, and JAX writes an entry in place, so a killed writer could leave a broken entry
# (JAX would warn and compile; an empty entry left by an interrupted run is removed below).
# JAXBOUNDS_TEST_COMPILE_CACHE names another folder, or 0 compiles everything (a fresh clone's
# run); `rm -rf .pytest_cache/jax-compile-cache` empties it.
_COMPILE_CACHE = os.environ.get(
    "JAXBOUNDS_TEST_COMPILE_CACHE",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), ".pytest_cache", "jax-compile-cache"),
)
if _COMPILE_CACHE != "0":
    if "PYTEST_XDIST_WORKER" not in os.environ and os.path.isdir(_COMPILE_CACHE):
        for _entry in os.scandir(_COMPILE_CACHE):
            if _entry.is_file() and _entry.stat().st_size == 0:
                os.remove(_entry.path)
    jax.config.update("jax_compilation_cache_dir", _COMPILE_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(autouse=True)
def _doctests_in_float32(request):
    """Doctests run with JAX's default dtypes (x64 off); tests keep float64."""
    if not isinstance(request.node, pytest.DoctestItem):
        yield
        return
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop JAX's compiled programs after every test module (and doctested module).

    Every compiled CPU program keeps its own memory mappings; a pytest worker that runs a
    thousand test files' programs without freeing them reaches Linux's per-process limit
    (``vm.max_map_count``, 65,530 by default) and XLA's compiler segfaults on the next mapping
    (seen at 64k mappings, 5 GB RSS, about 900 tests into one worker). No test relies on a
    program compiled by another module.
    """
    yield
    jax.clear_caches()
    gc.collect()
