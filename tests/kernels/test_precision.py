"""Reduced-precision matmuls (TF32 on a GPU, bfloat16 on a TPU), simulated on the CPU.

A CPU computes float32 products in full precision whatever ``jax.default_matmul_precision``
says, so these tests simulate a GPU's TF32 (10 explicit mantissa bits) and a TPU's bfloat16 (7)
with a model that rounds the operands of its own matmuls (:func:`tests.helpers.round_mantissa`,
straight-through for the derivatives: the derivative program sees the rounded values; its own
products are not rounded, which a GPU would also round). The kernels must stay within the
precision's tolerance (:func:`tests.helpers.matmul_tol`) of the float64 truth; the results that
are only valid at full precision are computed at ``"highest"`` whatever the default.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import kernels
from kernels._backend import HIGHEST, full_precision
from tests.helpers import MANTISSA_BITS, dot_precisions, matmul_tol, round_mantissa, tol

PRECISIONS = sorted(MANTISSA_BITS)


def test_round_mantissa_is_round_to_nearest_even():
    one = np.float32(1.0)
    tf32_ulp, bf16_ulp = 2.0**-10, 2.0**-7
    # a tie rounds to the even neighbour, above a tie rounds up
    assert float(round_mantissa(one + tf32_ulp / 2, 10)) == 1.0
    assert float(round_mantissa(one + 3 * tf32_ulp / 2, 10)) == 1.0 + 2 * tf32_ulp
    assert float(round_mantissa(one + 0.75 * tf32_ulp, 10)) == 1.0 + tf32_ulp
    assert float(round_mantissa(-one - 0.75 * bf16_ulp, 7)) == -1.0 - bf16_ulp
    x = jax.random.normal(jax.random.key(0), (4096,), jnp.float32) * 1e3
    # bfloat16 is float32 with 7 mantissa bits: the same rounding as a cast
    np.testing.assert_array_equal(round_mantissa(x, 7), x.astype(jnp.bfloat16).astype(jnp.float32))
    for bits in (7, 10):
        rel = np.abs(np.asarray(round_mantissa(x, bits)) - np.asarray(x)) / np.abs(np.asarray(x))
        assert rel.max() <= 2.0 ** -(bits + 1)
        assert rel.max() > 2.0 ** -(bits + 2)  # and it does round


class _Device:
    """Stands for a device of another platform (only its platform is read)."""

    def __init__(self, platform):
        self.platform = platform


def test_matmul_tol_by_precision(monkeypatch):
    tf32, bf16 = 8 * 2.0**-11, 8 * 2.0**-8
    assert matmul_tol(jnp.float32, "tensorfloat32") == tf32
    assert matmul_tol(jnp.float32, "bfloat16") == bf16
    with pytest.raises(ValueError, match="precision"):
        matmul_tol(jnp.float32, "fp8")
    # at JAX's default precision: the CPU's matmuls are full float32, a GPU's TF32, a TPU's
    # bfloat16 passes; "highest" is full float32 everywhere and float64 is never reduced
    default = {"cpu": tol(jnp.float32), "gpu": tf32, "cuda": tf32, "rocm": tf32, "tpu": bf16}
    assert matmul_tol(jnp.float32) == default[jax.default_backend()]
    with jax.default_matmul_precision("highest"):
        assert matmul_tol(jnp.float32) == tol(jnp.float32)
    assert matmul_tol(jnp.float64) == tol(jnp.float64)
    import kernels._backend

    for platform in ("cpu", "cuda", "tpu"):  # each platform simulated on this machine
        monkeypatch.setattr(kernels._backend, "sample_devices", lambda p=platform: [_Device(p)])
        want = default["gpu" if platform == "cuda" else platform]
        assert matmul_tol(jnp.float32) == want
        with jax.default_matmul_precision("highest"):
            assert matmul_tol(jnp.float32) == tol(jnp.float32)
        assert matmul_tol(jnp.float64) == tol(jnp.float64)


# --------------------------------------------------------------------------- a rounding model


def _normal(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Fixed test data: each array from its own seeded generator, no generator kept."""
    return np.random.default_rng(seed).normal(size=shape)


X = _normal(0, (16, 3))
Y = _normal(1, (16,))
PARAMS = {
    "w1": _normal(2, (3, 4)) / np.sqrt(3),
    "w2": _normal(3, (4,)) / 2,
}


def _ste(v, bits):
    """Rounded in value, identity in derivative (straight-through)."""
    if bits is None:
        return v
    return v + jax.lax.stop_gradient(round_mantissa(v, bits) - v)


def make_loss(bits):
    """MLP regression loss whose matmuls round their operands to ``bits`` mantissa bits."""

    def mm(a, b):
        return _ste(a, bits) @ _ste(b, bits)

    def loss(params, batch):
        x, y = batch
        pred = mm(jnp.tanh(mm(x, params["w1"])), params["w2"])
        return jnp.mean((pred - y) ** 2)

    return loss


def _as(dtype):
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), PARAMS)
    return params, (jnp.asarray(X, dtype), jnp.asarray(Y, dtype))


@functools.cache
def dense_hessian64():
    params, batch = _as(jnp.float64)
    flat, unravel = ravel_pytree(params)
    return np.asarray(jax.hessian(lambda f: make_loss(None)(unravel(f), batch))(flat))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_hvp_of_a_rounding_model_is_within_the_precision_tolerance(precision):
    h = dense_hessian64()
    params, batch = _as(jnp.float32)
    flat, unravel = ravel_pytree(params)
    v = np.random.default_rng(4).normal(size=flat.shape)
    out = kernels.hvp(make_loss(MANTISSA_BITS[precision]), params, batch)(
        unravel(jnp.asarray(v, jnp.float32))
    )
    got = np.asarray(ravel_pytree(out)[0], np.float64)
    err = np.linalg.norm(got - h @ v) / (np.linalg.norm(h, 2) * np.linalg.norm(v))
    assert err <= matmul_tol(jnp.float32, precision)
    # the simulation is active: the rounding moves the product well past float32's own error
    plain = kernels.hvp(make_loss(None), params, batch)(unravel(jnp.asarray(v, jnp.float32)))
    moved = np.linalg.norm(np.asarray(ravel_pytree(plain)[0], np.float64) - got)
    assert moved / np.linalg.norm(h @ v) > 100 * np.finfo(np.float32).eps


@pytest.mark.parametrize("precision", PRECISIONS)
def test_exact_trace_of_a_rounding_model_is_within_the_precision_tolerance(precision):
    # Hutch++ with a sketch spanning all 16 parameters is exact (up to rounding)
    h = dense_hessian64()
    params, batch = _as(jnp.float32)
    est = kernels.hessian_trace(
        make_loss(MANTISSA_BITS[precision]),
        params,
        batch,
        jax.random.key(0),
        num_matvecs=3 * h.shape[0],
        method="hutchpp",
    )
    scale = np.abs(np.linalg.eigvalsh(h)).sum()  # the trace's own scale (nuclear norm)
    assert abs(float(est.mean) - np.trace(h)) <= matmul_tol(jnp.float32, precision) * scale


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sharpness_of_a_rounding_model_moves_by_the_loss_scale_not_the_sharpness(precision):
    # average sharpness is a difference of losses: rounding errors of the loss (relative to the
    # loss) do not cancel, so the tolerance is the precision's times the loss, the same draws
    params, batch = _as(jnp.float32)
    spec = kernels.Perturbation("gaussian", 0.05)
    key = jax.random.key(1)
    run = lambda loss: kernels.average_sharpness(  # noqa: E731
        loss, params, batch, key, perturbation=spec, num_samples=64
    )
    exact, rounded = run(make_loss(None)), run(make_loss(MANTISSA_BITS[precision]))
    loss = float(make_loss(None)(params, batch))
    assert abs(float(rounded.mean) - float(exact.mean)) <= matmul_tol(jnp.float32, precision) * loss


# --------------------------------------------------------------------------- full precision


@pytest.mark.parametrize("default", ["tensorfloat32", "bfloat16"])
def test_full_precision_overrides_a_reduced_default(default):
    a = jnp.ones((3, 3), jnp.float32)
    with jax.default_matmul_precision(default):
        (reduced,) = dot_precisions(jnp.matmul, a, a)
        with full_precision():
            (full,) = dot_precisions(jnp.matmul, a, a)
    assert reduced[1] != (HIGHEST, HIGHEST)
    assert full[1] == (HIGHEST, HIGHEST)


@pytest.mark.parametrize("default", ["tensorfloat32", "bfloat16"])
def test_the_readout_closed_form_is_full_precision_whatever_the_default(default):
    # the closed-form readout sup certifies a lower bound: its product with the signs is
    # computed at "highest" even where the default is TF32 / bfloat16 (the features follow it)
    x = jnp.asarray(X, jnp.float32)
    w0 = jnp.asarray(PARAMS["w1"], jnp.float32)

    def features(w, inputs):
        return jnp.tanh(inputs @ w)

    signs = jnp.ones((5, X.shape[0]), jnp.float32)
    with jax.default_matmul_precision(default):
        sup = kernels.readout_search_sup(
            features,
            w0,
            x,
            jax.random.key(0),
            project=lambda w: w,
            num_steps=2,
            step_size=0.1,
            readout_norm=2,
            readout_radius=1.0,
        )
        found = dot_precisions(sup, signs)
    with_signs = [p for shape, p in found if shape[-1] == X.shape[0] and shape[0] == 5]
    assert with_signs
    assert all(p == (HIGHEST, HIGHEST) for p in with_signs)
