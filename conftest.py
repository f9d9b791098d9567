"""Root pytest configuration: numeric settings shared by the tests and the kernels' doctests."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
