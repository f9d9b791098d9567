"""Root pytest configuration: numeric settings shared by the tests and the kernels' doctests."""

import os

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# The tests run hundreds of small programs, so XLA's compile time dominates the suite: skip its
# expensive optimisation passes (the results do not depend on them beyond rounding, which every
# test's tolerance covers); the environment variable carries the setting into the processes the
# tests start. JAXBOUNDS_TEST_XLA_OPT=1 runs the suite with full optimisation.
if os.environ.get("JAXBOUNDS_TEST_XLA_OPT", "0") != "1":
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    jax.config.update("jax_disable_most_optimizations", True)
