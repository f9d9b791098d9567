"""chunk_size="auto" and Hutchinson's mode="auto" under the memory budget (kernels._memory).

The budget is a multiple of one gradient's temporaries (1.5 for Hutchinson, 1.3 for perturbed
losses), at least 128 MiB. The decoder tests compile (never run) the kernels' programs of a
4.2M-parameter decoder and read XLA's plan, on the CPU as they are and with the backend
treated as an accelerator (``kernels._backend.sample_platform`` patched), so the chunk an
accelerator would get is the one compiled and checked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels.curvature as curvature
import kernels.sharpness as sharpness
from kernels import (
    Perturbation,
    _backend,
    _flat,
    _memory,
    average_sharpness,
    dataset_ggn,
    dataset_hvp,
    ggn,
    hessian_trace,
    hutchinson_trace,
    hvp,
    sharpness_decomposition,
)

GAUSS = Perturbation("gaussian", 1e-3)


@pytest.fixture
def accelerator(monkeypatch):
    """The kernels' backend treated as an accelerator."""
    monkeypatch.setattr(_backend, "sample_platform", lambda: "gpu")
    assert _backend.is_accelerator()


@pytest.fixture
def cpu(monkeypatch):
    """The kernels' backend treated as a CPU (whatever the devices are)."""
    monkeypatch.setattr(_backend, "sample_platform", lambda: "cpu")
    assert not _backend.is_accelerator()


@functools.cache
def decoder():
    """bench/scale.py's decoder at 4,240,896 parameters and one batch of 4 x 128 tokens."""
    from bench.scale import Config, build_jax, num_params

    cfg = Config(vocab=4096, dim=256, heads=4, hidden=1024, layers=4, seq=128, batch=4,
                 num_batches=1)  # fmt: skip
    loss_fn, params, batches = build_jax(cfg)
    assert num_params(cfg) == 4_240_896
    return loss_fn, params, jax.tree_util.tree_map(lambda a: a[0], batches)


def reference():
    """The 53,968-parameter reference model of the curvature benchmark (batch 256 x 32)."""
    from bench import _reference as ref

    params = {k: jnp.asarray(v) for k, v in ref.init_params().items()}
    inputs, targets = ref.make_batch()
    batch = (jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32))
    return (lambda p, b: ref.jax_loss(p, *b)), params, batch


def quick():
    """bench/scale.py's QUICK decoder (134,912 parameters), one batch of 4 x 32 tokens."""
    from bench.scale import QUICK, build_jax

    loss_fn, params, batches = build_jax(QUICK)
    return loss_fn, params, jax.tree_util.tree_map(lambda a: a[0], batches)


def planned(fn, *args):
    """XLA's planned temporaries (bytes) of ``jax.jit(fn)(*args)``: compiled, never run."""
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def traced(fn, *args):
    """``fn(*args)``'s Python result, computed while ``fn`` is traced (nothing runs).

    Rank promotion is allowed: the reference model broadcasts its LayerNorm gains.
    """
    out = []
    with jax.numpy_rank_promotion("allow"):
        jax.make_jaxpr(lambda *a: out.append(fn(*a)) or 0)(*args)
    return out[0]


def hutchinson_choice(loss_fn, params, batch, chunk_size="auto"):
    """(chunk, products) that hessian_trace's Hutchinson resolves, traced only."""

    def choose(p, b):
        op = hvp(loss_fn, p, b)
        chunk = _memory.hutchinson_chunk(chunk_size, op)
        product = op.linearize()[0]
        return chunk, chunk == 1 and _memory.products_fit(
            "hutchinson", product, p, p, op.scalar_loss(), op.form
        )

    return traced(choose, params, batch)


def sharpness_chunk(loss_fn, params, batch, chunk_size="auto", hessian=False):
    """The chunk the sharpness kernels resolve ``chunk_size`` to, traced only."""

    def choose(p, b):
        prob = sharpness._setup(loss_fn, p, b, jax.random.key(0), GAUSS)
        value = sharpness._check_chunk(chunk_size)
        return sharpness._sample_chunk(value, p, prob, hessian=hessian)

    return traced(choose, params, batch)


# --------------------------------------------------------------------------- the estimates


def test_gradient_bytes_counts_the_residuals_of_a_closed_form():
    # sum(sin(x @ w)): the backward pass reads cos(x @ w), n floats; x (data) and w (params)
    # are not computed by the forward pass and do not count
    n, d = 11, 3
    x = jnp.ones((n, d), jnp.float32)
    w = jnp.ones((d,), jnp.float32)
    assert _memory.gradient_bytes(lambda v: jnp.sum(jnp.sin(x @ v)), w) == 4 * n
    assert _memory.gradient_bytes(lambda v: jnp.sum(x @ v), w) == 0  # linear: nothing kept
    # two layers, float64: cos of both pre-activations (n*h + n) and the hidden layer (n*h)
    h = 5
    x64 = jnp.ones((n, d), jnp.float64)
    params = {"a": jnp.ones((d, h), jnp.float64), "b": jnp.ones((h,), jnp.float64)}

    def loss(p):
        return jnp.sum(jnp.sin(jnp.sin(x64 @ p["a"]) @ p["b"]))

    assert _memory.gradient_bytes(loss, params) == 8 * (n * h + n + n * h)
    # the same under an outer jit, with the data a tracer closed over
    got = traced(lambda xs: _memory.gradient_bytes(lambda v: jnp.sum(jnp.sin(xs @ v)), w), x)
    assert got == 4 * n


def test_sample_bytes_budget_and_chunk_follow_the_stated_rule(accelerator):
    params = {"w": jnp.zeros((1000,), jnp.float32)}  # 4,000 bytes
    assert _memory.sample_bytes("forms", params=params, program=1000) == 200
    assert _memory.sample_bytes("products", params=params, residuals=1000) == 1600
    assert _memory.sample_bytes("perturbations", params=params, program=1000) == 16_100
    with pytest.raises(ValueError, match=r"^kind: expected"):
        _memory.sample_bytes("probes", params=params)
    mib = 2**20
    assert _memory.memory_budget("hutchinson", 200 * mib) == 300 * mib
    assert _memory.memory_budget("sharpness", 200 * mib) == 260 * mib
    assert _memory.memory_budget("hutchinson", mib) == _memory.UNCONSTRAINED_BYTES == 128 * mib
    cap = _backend.chunk_memory_budget()  # the device's: 1 GiB on a CPU or an H100
    assert _memory.memory_budget("hutchinson", 10**6 * mib) == cap
    with pytest.raises(ValueError, match=r"^kind: expected one of"):
        _memory.memory_budget("probes", mib)
    chunk = functools.partial(_memory.budgeted_chunk_size, None, budget=100, cap=16)
    assert chunk(per_sample=10) == 8
    assert chunk(per_sample=10, fixed=30) == 4
    assert chunk(per_sample=1) == 16
    assert chunk(per_sample=60) is None


def test_the_chunk_is_the_cpu_default_on_a_cpu(cpu):
    for cpu in (None, 1, 8):
        assert _memory.budgeted_chunk_size(cpu, per_sample=1, budget=100, cap=16) == cpu


# --------------------------------------------------------------------------- the decoder


@functools.cache
def decoder_gradient_plan():
    """XLA's planned temporaries of the decoder's ``value_and_grad`` (128 MB)."""
    loss_fn, params, batch = decoder()
    return planned(lambda p, b: jax.value_and_grad(loss_fn)(p, b), params, batch)


def _check_decoder_plans(choices):
    loss_fn, params, batch = decoder()
    key = jax.random.key(0)
    grad = decoder_gradient_plan()
    plans = {
        "hessian_trace": planned(
            lambda p, b, k: hessian_trace(loss_fn, p, b, k, num_samples=8), params, batch, key
        ),
        "average_sharpness": planned(
            lambda p, b, k: average_sharpness(loss_fn, p, b, k, perturbation=GAUSS, num_samples=8),
            params,
            batch,
            key,
        ),
        "average_sharpness auto": planned(
            lambda p, b, k: average_sharpness(
                loss_fn, p, b, k, perturbation=GAUSS, num_samples=8, chunk_size="auto"
            ),
            params,
            batch,
            key,
        ),
    }
    # hessian_trace's default is chunk_size="auto"; XLA planned 128 MB for the gradient
    assert plans["hessian_trace"] <= 1.5 * grad, (plans, grad, choices)
    assert plans["average_sharpness"] <= 1.3 * grad, (plans, grad, choices)
    assert plans["average_sharpness auto"] <= 1.3 * grad, (plans, grad, choices)


def test_the_decoder_plans_within_the_budget_on_a_cpu(cpu):
    # before the budget: the linearised product, 456 MB planned (3.7 gradients)
    loss_fn, params, batch = decoder()
    choices = hutchinson_choice(loss_fn, params, batch)
    assert choices == (1, False)  # quadratic forms, one probe at a time
    assert sharpness_chunk(loss_fn, params, batch) is None
    _check_decoder_plans(choices)
    # sharpness_decomposition's mode="auto": quadratic forms (the products planned 4.5)
    decomposition = planned(
        lambda p, b, k: sharpness_decomposition(
            loss_fn, p, b, k, perturbation=GAUSS, num_samples=4, num_probes=4
        ),
        params,
        batch,
        jax.random.key(0),
    )
    assert decomposition <= 1.3 * decoder_gradient_plan()


def test_the_decoder_plans_within_the_budget_on_an_accelerator(accelerator):
    # before the budget: 16 probes vectorised, without a memory budget
    loss_fn, params, batch = decoder()
    choices = hutchinson_choice(loss_fn, params, batch)
    assert choices == (1, False)
    assert sharpness_chunk(loss_fn, params, batch) is None
    assert sharpness_chunk(loss_fn, params, batch, hessian=True) is None
    _check_decoder_plans(choices)


def test_an_explicit_choice_overrides_the_budget(accelerator):
    # an int chunk_size and mode="products" are never second-guessed
    loss_fn, params, batch = decoder()
    assert hutchinson_choice(loss_fn, params, batch, chunk_size=8)[0] == 8
    assert hutchinson_choice(loss_fn, params, batch, chunk_size=None)[0] == 1
    assert sharpness_chunk(loss_fn, params, batch, chunk_size=8) == 8
    assert sharpness_chunk(loss_fn, params, batch, chunk_size=None) is None
    used = []
    real_setup = curvature._setup

    def spy(*args, **kwargs):
        used.append("products")
        return real_setup(*args, **kwargs)

    def run(mode, chunk_size="auto"):
        used.clear()
        jax.make_jaxpr(
            lambda p, b, k: hutchinson_trace(
                hvp(loss_fn, p, b), p, k, num_samples=8, mode=mode, chunk_size=chunk_size
            )
        )(params, batch, jax.random.key(0))
        return bool(used)

    curvature_setup = pytest.MonkeyPatch()
    curvature_setup.setattr(_flat, "_setup", spy)
    try:
        assert run("products")
        assert run("products", chunk_size=8)
        assert not run("auto")  # over the budget: quadratic forms
    finally:
        curvature_setup.undo()


# --------------------------------------------------------------------------- small models


def test_a_small_model_keeps_products_and_vectorised_chunks_under_the_floor(cpu, monkeypatch):
    # bench/scale.py's QUICK decoder: every plan is far below 128 MiB, so memory is not
    # constrained: the linearised product on a CPU, 16 probes / perturbations on an accelerator
    loss_fn, params, batch = quick()
    assert hutchinson_choice(loss_fn, params, batch) == (1, True)
    monkeypatch.setattr(_backend, "sample_platform", lambda: "gpu")
    assert hutchinson_choice(loss_fn, params, batch)[0] == 16
    assert sharpness_chunk(loss_fn, params, batch) == 16


def test_the_reference_model_gets_what_the_budget_allows(cpu, monkeypatch):
    # the 54k reference model at batch 256 x 32: its gradient plans 74 MB, a quadratic form
    # 256 MB and the linearised product 274 MB (3.5 and 3.7 gradients, both over the floor):
    # neither fits, so Hutchinson keeps the faster product (estimated 345 MB, 1.25 times the
    # forms' 275 MB: within PRODUCT_MEMORY_MARGIN); perturbed losses (11 MB each) fit 4 at a time
    loss_fn, params, batch = reference()
    assert hutchinson_choice(loss_fn, params, batch) == (1, True)
    assert sharpness_chunk(loss_fn, params, batch) is None  # a CPU
    monkeypatch.setattr(_backend, "sample_platform", lambda: "gpu")
    assert hutchinson_choice(loss_fn, params, batch) == (1, True)
    assert sharpness_chunk(loss_fn, params, batch) == 4


def test_where_no_mode_fits_auto_keeps_the_product_by_xla_s_plans(cpu):
    # the choice above against XLA's plans of the reference model's probes: both modes over the
    # budget (1.5 gradients' temporaries; the 128 MiB floor is above both plans, so the rule is
    # checked on the estimates it uses and the plans confirm their order and margin)
    loss_fn, params, batch = reference()
    key = jax.random.key(0)

    def plan(mode):
        def trace(p, b, k):
            return hutchinson_trace(hvp(loss_fn, p, b), p, k, num_samples=2, mode=mode)

        with jax.numpy_rank_promotion("allow"):
            return planned(trace, params, batch, key)

    with jax.numpy_rank_promotion("allow"):
        grad = planned(lambda p, b: jax.value_and_grad(loss_fn)(p, b), params, batch)
        auto = plan("auto")
    forms, products = plan("forms"), plan("products")
    assert forms > 1.5 * grad, (grad, forms)
    assert products > 1.5 * grad, (grad, products)
    assert products <= _memory.PRODUCT_MEMORY_MARGIN * forms, (forms, products)
    assert auto == products, (auto, forms, products)  # the program "auto" compiles


def test_gauss_newton_operators_give_their_loss_to_the_budget(monkeypatch):
    # a GGN operator's scalar loss is the named loss of apply_fn's outputs; ggn_trace's
    # chunk_size="auto" resolves through it: a tiny model gets 16 on an accelerator
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((6, 3)))
    y = jnp.asarray(rng.integers(0, 2, 6), jnp.int32)
    w = jnp.asarray(rng.standard_normal((3, 2)))
    op = ggn(lambda p, xs: xs @ p, w, (x, y), loss="cross_entropy")
    logits = x @ w
    expected = jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[jnp.arange(6), y])
    np.testing.assert_allclose(op.scalar_loss()(w), expected, rtol=1e-12)
    monkeypatch.setattr(_backend, "sample_platform", lambda: "gpu")
    assert traced(lambda p: _memory.hutchinson_chunk("auto", op), w) == 16


def test_a_loss_without_forward_mode_derivatives_is_budgeted_by_its_products(monkeypatch):
    # a custom_vjp inside the loss has no quadratic form: the estimate takes the
    # forward-over-reverse product's program, and the trace stays exact for a diagonal Hessian
    @jax.custom_vjp
    def square(x):
        return x**2

    square.defvjp(lambda x: (x**2, x), lambda x, g: (2.0 * x * g,))
    d = jnp.array([1.0, 2.0, 3.0])

    def loss(w, batch):
        return 0.5 * jnp.sum(d * square(w))

    w = jnp.array([0.3, -0.2, 0.5])
    monkeypatch.setattr(_backend, "sample_platform", lambda: "gpu")
    assert traced(lambda p: _memory.hutchinson_chunk("auto", hvp(loss, p, ())), w) == 16
    est = hessian_trace(loss, w, (), jax.random.key(0), num_samples=4)
    np.testing.assert_allclose(est.mean, 6.0, rtol=1e-12)


def test_dataset_operators_give_their_first_batch_s_loss():
    # the budget compares with one batch's gradient: the kernels hold one batch at a time
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.standard_normal((3, 5, 2)))  # 3 batches of 5 examples
    ys = jnp.asarray(rng.standard_normal((3, 5)))
    w = jnp.asarray(rng.standard_normal(2))

    def loss(p, batch):
        x, y = batch
        return jnp.mean((x @ p - y) ** 2)

    first = loss(w, (xs[0], ys[0]))
    op = dataset_hvp(loss, w, (xs, ys))
    np.testing.assert_allclose(op.scalar_loss()(w), first, rtol=1e-12)
    op = dataset_ggn(lambda p, x: x @ p, w, (xs, ys), loss="squared_error")
    np.testing.assert_allclose(op.scalar_loss()(w), first, rtol=1e-12)
