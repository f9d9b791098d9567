"""Kernel contracts, eagerly and under ``jax.jit`` (``chex.variants``), with chex's assertions.

Each contract holds the same with and without ``jit``: an exact case gives its exact value,
the output dtype follows the input dtype, shapes and trees are as documented, and the chunk
size does not change the result.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

import kernels
from kernels import rademacher as rad
from kernels.parallel import sample_key, sample_statistics

KEY = jax.random.key(3)
_DIAG = jnp.asarray([1.0, -2.0, 3.5, 0.25])


class KernelContractsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hutchinson_trace_is_exact_for_a_diagonal_operator(self):
        # Rademacher probes: v^T D v = tr(D) for every draw, so the mean is exact, stderr 0
        for dtype in (jnp.float64, jnp.float32):
            diag = _DIAG.astype(dtype)

            @self.variant
            def trace(key, diag=diag):
                return kernels.hutchinson_trace(lambda v: diag * v, diag, key, num_samples=8)

            est = trace(KEY)
            chex.assert_shape([est.mean, est.stderr], ())
            chex.assert_type([est.mean, est.stderr], dtype)
            np.testing.assert_allclose(est.mean, float(jnp.sum(_DIAG)), rtol=1e-6)
            assert float(est.stderr) == 0.0

    @chex.variants(with_jit=True, without_jit=True)
    def test_sample_statistics_equal_a_python_loop_over_the_sample_keys(self):
        def fn(key):
            return jax.random.normal(key, (2,), jnp.float64)

        @self.variant
        def stats(key):
            return sample_statistics(fn, key, num_samples=7, chunk_size=3)

        got = stats(KEY)
        ys = np.stack([np.asarray(fn(sample_key(KEY, i))) for i in range(7)])
        chex.assert_shape([got.mean, got.m2], (2,))
        chex.assert_trees_all_close(
            (got.mean, got.m2), (ys.mean(0), ((ys - ys.mean(0)) ** 2).sum(0)), rtol=1e-12
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_rademacher_linear_follows_the_input_dtype_and_ignores_the_chunk_size(self):
        x = jnp.asarray(np.random.default_rng(1).normal(size=(9, 4)), jnp.float32)

        @self.variant(static_argnames=("chunk_size",))
        def estimate(x, key, chunk_size):
            return kernels.rademacher_linear(
                x, key, norm=2, radius=1.0, num_samples=12, chunk_size=chunk_size
            )

        one, chunked = estimate(x, KEY, chunk_size=None), estimate(x, KEY, chunk_size=5)
        chex.assert_type([one.mean, one.stderr], jnp.float32)
        chex.assert_trees_all_equal_shapes_and_dtypes(one, chunked)
        chex.assert_trees_all_close((one.mean, one.stderr), (chunked.mean, chunked.stderr),
                                    rtol=1e-6)  # fmt: skip

    @chex.variants(with_jit=True, without_jit=True)
    def test_sign_chunks_are_rows_of_the_sign_vectors(self):
        full = rad.sign_vectors(KEY, num_samples=6, num_examples=37, dtype=jnp.float64)
        chex.assert_shape(full, (6, 37))
        chex.assert_type(full, jnp.float64)

        @self.variant
        def chunk(index):
            return rad.sign_chunk(KEY, index, chunk_size=3, num_examples=37, dtype=jnp.float64)

        chex.assert_trees_all_equal(chunk(jnp.asarray(1)), full[3:])
        assert set(np.unique(np.asarray(full))) == {-1.0, 1.0}
