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


# Tests moved to the slow suite from here rather than by a marker in their file (the files are
# shared by several changes at once): node id -> the default-run test that still covers the same
# behaviour. docs/contributing.md lists every moved test with its cover; tests/test_ci.py checks
# that both ends of each entry exist.
MOVED_TO_SLOW = {
    "tests/kernels/test_curvature.py::test_every_key_implementation_keeps_the_invariances"
    "[unsafe_rbg]": (
        "tests/kernels/test_curvature.py::test_every_key_implementation_keeps_the_invariances[rbg]",
        "tests/kernels/test_parallel.py::test_rbg_keys_give_the_same_statistics_for_every_chunk_"
        "size[unsafe_rbg]",
    ),
    "tests/kernels/test_sharpness.py::test_every_key_implementation_keeps_the_invariances"
    "[unsafe_rbg]": (
        "tests/kernels/test_sharpness.py::test_every_key_implementation_keeps_the_invariances[rbg]",
        "tests/kernels/test_parallel.py::test_sample_key_is_fold_in_below_2_32[unsafe_rbg]",
    ),
    # the run fixture's eager variant on the attention model: eager hvp against the dense Hessian
    # stays on the polynomial loss, the attention model against it under jit
    "tests/kernels/test_curvature.py::test_hvp_matches_dense_hessian[eager-attention]": (
        "tests/kernels/test_curvature.py::test_hvp_matches_dense_hessian[jit-attention]",
        "tests/kernels/test_curvature.py::test_hvp_matches_dense_hessian[eager-poly]",
    ),
    # the same assertions under jit; its SLQ nodes and densities run eagerly in both variants, and
    # eager linearize=False top eigenvalues are checked bit for bit against the linearised ones
    "tests/kernels/test_curvature.py::test_recomputed_products_give_the_dense_spectrum_and_the_"
    "linearised_results[eager]": (
        "tests/kernels/test_curvature.py::test_recomputed_products_give_the_dense_spectrum_and_the_"
        "linearised_results[jit]",
        "tests/kernels/test_curvature.py::test_recomputed_products_on_dataset_operators_and_"
        "callables_change_nothing",
    ),
    # a block merge in float32 for every kernel: float64 keeps every kernel, float32 the kernels
    # of each stream's kind (Rademacher sups, trace probes, kept per-sample outputs, SLQ nodes)
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[rademacher_finite-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_finite-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_linear-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[rademacher_search-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_search-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_linear-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[rademacher_readout_search-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_readout_search-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[rademacher_linear-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[hutchinson_trace-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[hutchinson_trace-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[hessian_trace-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[ggn_trace-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[ggn_trace-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[hessian_trace-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[mc_fisher_trace-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[mc_fisher_trace-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[hessian_trace-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[sharpness_decomposition-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[sharpness_decomposition-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[perturbed_hessian_traces-float32]",
    ),
    "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
    "[spectral_density-float32]": (
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[spectral_density-float64]",
        "tests/kernels/test_blocks.py::test_blocks_in_any_order_merge_into_the_one_call_result"
        "[slq_nodes-float32]",
    ),
}


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in MOVED_TO_SLOW:
            item.add_marker(pytest.mark.slow)
