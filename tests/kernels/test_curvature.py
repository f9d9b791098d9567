"""Curvature kernels against dense float64 Hessians (jax.hessian on ravel_pytree)."""

import functools
import itertools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from kernels._checks import runtime_checks
from kernels._random import sign_vector
from kernels.curvature import (
    DatasetHessianOperator,
    DatasetLoss,
    HessianOperator,
    QuadratureNodes,
    SpectralDensity,
    Tridiagonal,
    dataset_hvp,
    dataset_loss,
    hessian_trace,
    hutchinson_trace,
    hutchpp_memory_bytes,
    hutchpp_trace,
    hvp,
    lanczos,
    slq_nodes,
    spectral_density,
    top_eigenvalues,
)
from tests.helpers import TraceCounter, compiles_in, count_compiles, matmul_tol

# --------------------------------------------------------------------------- small losses


def poly_loss(p, batch):
    """A non-quadratic loss on a nested pytree (tanh regression)."""
    x, y = batch
    h = jnp.tanh(x @ p["w"] + p["head"]["b"][None, :])
    pred = jnp.sum(h, axis=1) * p["head"]["c"][0] + p["head"]["c"][1] ** 3
    return jnp.mean((pred - y) ** 2) + 0.1 * jnp.sum(p["w"] ** 4)


def make_poly(dtype=jnp.float64, seed=1):
    """``poly_loss`` with its parameters (3*4 + 4 + 2 = 18) and one batch of 7 examples."""
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    batch = (jax.random.normal(k1, (7, 3), dtype), jax.random.normal(k2, (7,), dtype))
    params = {
        "w": 0.7 * jax.random.normal(k3, (3, 4), dtype),
        "head": {"b": jnp.zeros((4,), dtype), "c": 0.5 * jax.random.normal(k4, (2,), dtype)},
    }
    return poly_loss, params, batch


def attention_forward(p, x):
    """Tiny one-layer attention model: combined W_QK, W_V, residual, tanh, [CLS] readout."""
    d = x.shape[-1]
    scores = jnp.einsum("btd,de,bse->bts", x, p["qk"], x) / jnp.sqrt(jnp.asarray(d, x.dtype))
    attn = jax.nn.softmax(scores, axis=-1)
    h = jnp.tanh(jnp.einsum("bts,bsd,de->bte", attn, x, p["v"]) + x)
    return h[:, 0, :] @ p["out"] + p["bias"][None, :]  # (B, C)


def attention_batch(key, dtype, *, batch=6, seq=5, dim=4, classes=3):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (batch, seq, dim), dtype)
    y = jax.random.randint(ky, (batch,), 0, classes)
    return x, y


def attention_ce(p, x, y):
    logits = attention_forward(p, x)
    picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)


def batch_ce(p, batch):
    return attention_ce(p, *batch)


def make_attention(dtype=jnp.float64, *, dim=4, classes=3):
    """Cross-entropy of the tiny attention model on one batch: 4*4*2 + 4*3 + 3 = 47 params.

    Drawn in float64 and cast, so the float32 case is the same problem rounded.
    """
    keys = jax.random.split(jax.random.key(2), 5)
    x, y = attention_batch(keys[0], jnp.float64, dim=dim, classes=classes)
    params = {
        "qk": 0.8 * jax.random.normal(keys[1], (dim, dim)),
        "v": 0.8 * jax.random.normal(keys[2], (dim, dim)),
        "out": jax.random.normal(keys[3], (dim, classes)),
        "bias": 0.1 * jax.random.normal(keys[4], (classes,)),
    }
    params = jax.tree_util.tree_map(lambda a: a.astype(dtype), params)
    return batch_ce, params, (x.astype(dtype), y)


LOSSES = {"poly": make_poly, "attention": make_attention}


def dense_hessian(loss, params, batch):
    flat, unravel = ravel_pytree(params)
    return np.asarray(jax.jit(jax.hessian(lambda f: loss(unravel(f), batch)))(flat))


@functools.cache
def attention_case():
    loss, params, batch = make_attention()
    return loss, params, batch, dense_hessian(loss, params, batch)


def rademacher_se(a, m):
    return np.sqrt(2 * (np.sum(a**2) - np.sum(np.diag(a) ** 2)) / m)


def random_symmetric(key, eigs):
    q, _ = jnp.linalg.qr(jax.random.normal(key, (eigs.size, eigs.size)))
    return np.asarray((q * eigs[None, :]) @ q.T)


def make_dense_operator(dtype=jnp.float64):
    """A fixed symmetric 17 x 17 operator on a two-leaf pytree (cheap to compile)."""
    like = {"a": jnp.zeros((3, 4), dtype), "b": jnp.zeros((5,), dtype)}
    return dense_operator(dtype), like


@functools.cache
def dense_operator(dtype):
    """One function object per dtype, so the kernels' compile cache is shared across tests."""
    like = {"a": jnp.zeros((3, 4), dtype), "b": jnp.zeros((5,), dtype)}
    _, unravel = ravel_pytree(like)
    a = random_symmetric(jax.random.key(29), jnp.linspace(-3.0, 5.0, 17)).astype(dtype)

    def matvec(v):
        return unravel(jnp.asarray(a) @ ravel_pytree(v)[0])

    return matvec


# --------------------------------------------------------------------------- hvp


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_hvp_matches_dense_hessian(run, name):
    loss, params, batch = LOSSES[name]()
    h = dense_hessian(loss, params, batch)
    flat, unravel = ravel_pytree(params)
    vs = jax.random.normal(jax.random.key(3), (3, flat.size))
    got = run(
        lambda: jnp.stack([ravel_pytree(hvp(loss, params, batch)(unravel(v)))[0] for v in vs])
    )
    want = np.asarray(vs) @ h
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    assert np.abs(h - h.T).max() < 1e-10 * np.abs(h).max()  # the reference is a real Hessian


def test_hvp_is_a_pytree_with_a_static_loss_and_preserves_float32():
    loss, params, batch = make_attention(jnp.float32)
    op = hvp(loss, params, batch)
    assert isinstance(op, HessianOperator)
    leaves, treedef = jax.tree_util.tree_flatten(op)
    assert len(leaves) == len(jax.tree_util.tree_leaves((params, batch)))
    assert jax.tree_util.tree_unflatten(treedef, leaves).loss_fn is loss
    out = op(params)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(params)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(out))
    loss64, params64, batch64 = make_attention()
    want = ravel_pytree(hvp(loss64, params64, batch64)(params64))[0]
    tol = matmul_tol(jnp.float32)  # float32 matmuls: TF32 on a GPU at default precision
    np.testing.assert_allclose(ravel_pytree(out)[0], want, rtol=tol, atol=tol * np.abs(want).max())


def test_dataset_hvp_is_hessian_of_mean_loss():
    _, params, _ = make_attention()
    keys = jax.random.split(jax.random.key(4), 3)
    xs, ys = jax.vmap(lambda k: attention_batch(k, jnp.float64))(keys)  # 3 batches of 6
    flat, unravel = ravel_pytree(params)
    v = unravel(jax.random.normal(jax.random.key(5), flat.shape))

    def total(p, weights):
        return sum(w * attention_ce(p, xs[b], ys[b]) for b, w in enumerate(weights))

    for weights in (None, jnp.array([0.5, 0.3, 0.2])):
        w = jnp.full((3,), 1 / 3) if weights is None else weights
        h = dense_hessian(lambda p, _, w=w: total(p, w), params, ())
        op = dataset_hvp(batch_ce, params, (xs, ys), weights=weights)
        assert isinstance(op, DatasetHessianOperator)
        got = ravel_pytree(op(v))[0]
        want = h @ np.asarray(ravel_pytree(v)[0])
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


@pytest.mark.slow
def test_dataset_hvp_equals_hvp_on_concatenated_batch():
    _, params, _ = make_attention()
    xs, ys = jax.vmap(lambda k: attention_batch(k, jnp.float64))(
        jax.random.split(jax.random.key(6), 4)
    )
    v = jax.tree_util.tree_map(jnp.ones_like, params)
    got, whole = jax.jit(
        lambda: (
            dataset_hvp(batch_ce, params, (xs, ys))(v),
            hvp(batch_ce, params, (xs.reshape(24, 5, 4), ys.reshape(24)))(v),
        )
    )()
    np.testing.assert_allclose(ravel_pytree(got)[0], ravel_pytree(whole)[0], rtol=1e-10, atol=1e-12)


def _three_batches():
    _, params, _ = make_attention()
    xs, ys = jax.vmap(lambda k: attention_batch(k, jnp.float64))(
        jax.random.split(jax.random.key(7), 3)
    )
    return params, (xs, ys)


def _mean_loss(p, xs, ys):
    return sum(attention_ce(p, xs[b], ys[b]) for b in range(xs.shape[0])) / xs.shape[0]


def test_dataset_loss_value_and_gradient_are_those_of_the_mean_loss(run):
    params, (xs, ys) = _three_batches()
    streamed = dataset_loss(batch_ce)
    assert isinstance(streamed, DatasetLoss)
    assert streamed == dataset_loss(batch_ce)  # equal callables: one compiled program
    value, grad = run(lambda: jax.value_and_grad(streamed)(params, (xs, ys)))
    want_value, want_grad = jax.value_and_grad(_mean_loss)(params, xs, ys)
    assert float(value) == pytest.approx(float(want_value), rel=1e-13)
    np.testing.assert_allclose(
        ravel_pytree(grad)[0], ravel_pytree(want_grad)[0], rtol=1e-12, atol=1e-14
    )
    # the value alone (no differentiation) streams forward passes only
    assert float(run(lambda: streamed(params, (xs, ys)))) == pytest.approx(float(want_value))


def test_dataset_trace_equals_dense_trace_of_mean_loss():
    params, (xs, ys) = _three_batches()
    h = dense_hessian(lambda p, _: _mean_loss(p, xs, ys), params, ())
    op = dataset_hvp(batch_ce, params, (xs, ys))
    est = hutchpp_trace(op, params, jax.random.key(9), num_matvecs=141)  # n = 47: exact
    assert float(est.mean) == pytest.approx(np.trace(h), rel=1e-10)
    hutch = hutchinson_trace(op, params, jax.random.key(10), num_samples=64)
    assert abs(float(hutch.mean) - np.trace(h)) <= 5 * float(hutch.stderr)


def test_dataset_loss_in_sharpness_kernels_equals_the_concatenated_batch():
    from kernels.sharpness import Perturbation, average_sharpness, worst_case_sharpness

    params, (xs, ys) = _three_batches()
    whole = (xs.reshape(18, 5, 4), ys.reshape(18))  # equal batches: mean of means = mean
    key = jax.random.key(11)
    gauss, ball = Perturbation("gaussian", 0.1), Perturbation("l2_ball", 0.3)
    a = average_sharpness(dataset_loss(batch_ce), params, (xs, ys), key, perturbation=gauss,
                          num_samples=8)  # fmt: skip
    b = average_sharpness(batch_ce, params, whole, key, perturbation=gauss, num_samples=8)
    assert float(a.mean) == pytest.approx(float(b.mean), rel=1e-10)
    assert float(a.stderr) == pytest.approx(float(b.stderr), rel=1e-8)
    a = worst_case_sharpness(dataset_loss(batch_ce), params, (xs, ys), key, perturbation=ball,
                             num_steps=4)  # fmt: skip
    b = worst_case_sharpness(batch_ce, params, whole, key, perturbation=ball, num_steps=4)
    assert float(a.value) == pytest.approx(float(b.value), rel=1e-9)


def test_dataset_loss_bad_arguments():
    with pytest.raises(ValueError, match="loss_fn"):
        dataset_loss(3)
    params, (xs, ys) = _three_batches()
    with pytest.raises(ValueError, match="loss_fn: must return a real floating scalar"):
        dataset_loss(lambda p, b: jnp.zeros(2))(params, (xs, ys))
    with pytest.raises(ValueError, match="batches: leaves must share"):
        dataset_loss(batch_ce)(params, (xs, ys[:2]))
    with pytest.raises(ValueError, match="batches: expected a pytree"):
        dataset_loss(batch_ce)(params, ())


# --------------------------------------------------------------------------- Hutchinson


@pytest.mark.parametrize("probe", ["rademacher", "gaussian"])
def test_hutchinson_within_5_stderr_and_stderr_is_exact(probe):
    loss, params, batch, h = attention_case()
    m = 1000
    est = jax.jit(
        lambda k: hutchinson_trace(hvp(loss, params, batch), params, k, num_samples=m, probe=probe)
    )(jax.random.key(7))
    exact = np.trace(h)
    assert abs(est.mean - exact) <= 5 * est.stderr
    gaussian_se = np.sqrt(2 * np.sum(h**2) / m)
    se = rademacher_se(h, m) if probe == "rademacher" else gaussian_se
    assert abs(est.stderr / se - 1) <= 0.2, (est.stderr, se)
    assert est.num_samples == m
    assert est.num_evaluations is None


def test_hutchinson_exact_for_diagonal_operator():
    d = jnp.array([1.5, -2.0, 3.25, 0.0, 7.0])
    est = hutchinson_trace(lambda v: d * v, 5, jax.random.key(0), num_samples=3)
    assert float(est.mean) == pytest.approx(float(jnp.sum(d)), abs=1e-14)
    assert float(est.stderr) == pytest.approx(0.0, abs=1e-14)


@pytest.mark.parametrize("method", ["hutchinson", "hutchpp"])
def test_hessian_trace_within_5_stderr(method):
    loss, params, batch, h = attention_case()
    # 60 products on n=47: Hutch++ deflates 20 directions and its stderr (of the Hutchinson
    # part on the residual, given the sketch) is the right yardstick for its conditional error
    count = {"num_samples" if method == "hutchinson" else "num_matvecs": 60}
    est = hessian_trace(loss, params, batch, jax.random.key(8), method=method, **count)
    assert abs(est.mean - np.trace(h)) <= 5 * est.stderr
    assert est.stderr > 0
    if method == "hutchpp":
        assert (est.num_samples, est.num_evaluations) == (20, 60)


# --------------------------------------------------------------------------- Hutch++


def test_hutchpp_exact_when_sketch_spans_the_space():
    loss, params, batch, h = attention_case()  # n = 47: 3 * 47 products make Q a full basis
    est = hutchpp_trace(hvp(loss, params, batch), params, jax.random.key(9), num_matvecs=141)
    assert float(est.mean) == pytest.approx(np.trace(h), rel=1e-10)
    assert float(est.stderr) < 1e-10 * np.abs(h).max()
    assert est.num_samples == 141 - 2 * 47  # the Hutchinson part's probes
    assert est.num_evaluations == 141


@pytest.mark.slow
def test_hutchpp_unbiased_and_beats_hutchinson_on_low_rank_plus_bulk():
    n = 60
    bulk = 0.05 * jax.random.normal(jax.random.key(10), (n - 4,))
    eigs = jnp.concatenate([jnp.array([40.0, 25.0, -20.0, 10.0]), 1.0 + bulk])
    a = random_symmetric(jax.random.key(11), eigs)
    exact = np.trace(a)
    mv = lambda v: jnp.asarray(a) @ v  # noqa: E731
    keys = jax.random.split(jax.random.key(12), 400)
    # statistics only: without runtime checks, whose host callbacks vmap unrolls per key
    # (jax's debug_callback batching rule), which multiplies the compile time by ~5
    with runtime_checks(False):
        pp = jax.jit(jax.vmap(lambda k: hutchpp_trace(mv, n, k, num_matvecs=15).mean))(keys)
        hu = jax.jit(jax.vmap(lambda k: hutchinson_trace(mv, n, k, num_samples=15).mean))(keys)
    # unbiased: the mean over 400 independent keys is within 5 standard errors of the trace
    assert abs(np.mean(pp) - exact) <= 5 * np.std(pp, ddof=1) / np.sqrt(400)
    assert abs(np.mean(hu) - exact) <= 5 * np.std(hu, ddof=1) / np.sqrt(400)
    # Hutchinson's empirical spread matches its closed form, Hutch++'s is several times smaller
    assert abs(np.std(hu) / rademacher_se(a, 15) - 1) < 0.2
    assert np.median(np.abs(pp - exact)) * 5 < np.median(np.abs(hu - exact))


# --------------------------------------------------------------------------- Lanczos


def test_top_eigenvalues_exact_with_full_steps(run):
    loss, params, batch, h = attention_case()
    want = np.linalg.eigvalsh(h)[::-1][:3]
    got = run(
        lambda: top_eigenvalues(
            hvp(loss, params, batch), params, jax.random.key(13), k=3, num_steps=47
        )
    )
    assert got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * abs(want[0]))


def test_top_eigenvalues_converge_and_interlace():
    eigs = jnp.concatenate([jnp.array([50.0, 30.0, 20.0]), jnp.linspace(-1.0, 1.0, 197)])
    a = random_symmetric(jax.random.key(14), eigs)
    mv = lambda v: jnp.asarray(a) @ v  # noqa: E731
    few = top_eigenvalues(mv, 200, jax.random.key(15), k=3, num_steps=8)
    more = top_eigenvalues(mv, 200, jax.random.key(15), k=3, num_steps=30)
    np.testing.assert_allclose(more, [50.0, 30.0, 20.0], rtol=1e-9)
    assert np.all(np.asarray(few) <= np.array([50.0, 30.0, 20.0]) + 1e-9)  # Cauchy interlacing
    np.testing.assert_allclose(few, [50.0, 30.0, 20.0], rtol=1e-2)


def test_lanczos_moments_are_exact():
    """e1' T^p e1 ||v||^2 = v' A^p v for p <= 2k - 1 (Gauss quadrature exactness)."""
    _, _, _, h = attention_case()
    k = 6
    v = jax.random.normal(jax.random.key(16), (47,))
    tri = lanczos(lambda x: jnp.asarray(h) @ x, 47, jax.random.key(0), num_steps=k, start=v)
    assert isinstance(tri, Tridiagonal)
    assert tri.diagonal.shape == (k,)
    assert tri.off_diagonal.shape == (k - 1,)
    first = float(tri.start_norm)
    assert first == pytest.approx(float(jnp.linalg.norm(v)), rel=1e-12)
    t = np.asarray(tri.matrix())
    np.testing.assert_allclose(t, t.T, atol=0)
    vn = np.asarray(v)
    for p in range(2 * k):
        want = vn @ np.linalg.matrix_power(h, p) @ vn
        got = np.linalg.matrix_power(t, p)[0, 0] * first**2
        assert got == pytest.approx(want, rel=1e-8, abs=1e-10 * np.abs(h).max() ** p * vn @ vn)


def test_lanczos_restarts_on_breakdown_and_keeps_spectrum():
    """Only 3 distinct eigenvalues: the Krylov space breaks down after 3 steps; restarts
    must still recover every eigenvalue with its multiplicity."""
    eigs = jnp.array([4.0, 4.0, 4.0, -1.0, -1.0, 2.0, 2.0, 2.0])
    a = random_symmetric(jax.random.key(17), eigs)
    tri = lanczos(lambda v: jnp.asarray(a) @ v, 8, jax.random.key(18), num_steps=8)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(tri.matrix())), np.sort(eigs), atol=1e-10)


@pytest.mark.parametrize(
    ("eigs", "k"),
    [([1.0, 1.0, 2.0, 2.0], 4), ([3.0, 3.0, 1.0, 1.0, 1.0, 1.0], 2), ([3.0] * 5, 5)],
)
def test_a_restart_in_a_small_dimension_gives_the_exact_spectrum_for_every_key(eigs, k):
    # a sign-vector restart probe lay in the basis's span for 24 of 40 keys on diag(1, 1, 2, 2)
    # (a zero vector: a spurious eigenvalue 0) and near it for others (a Ritz value of 3.40
    # above the largest eigenvalue 3); with num_steps = n the Ritz values are the spectrum
    d = jnp.asarray(eigs)  # the working dtype of an int ``like`` (float64 in this suite)
    want = np.sort(eigs)[::-1][:k]
    for seed in range(40):
        got = top_eigenvalues(lambda v: d * v, d.size, jax.random.key(seed), k=k,
                              num_steps=d.size)  # fmt: skip
        np.testing.assert_allclose(got, want, atol=8 * np.finfo(d.dtype).eps * max(eigs))


def test_a_rank_one_hessian_has_one_nonzero_eigenvalue_for_every_key():
    x = jnp.array([1.0, 2.0, -1.0, 0.5, 0.3, 2.0])

    def loss(w, batch):
        return 0.5 * (w @ batch) ** 2

    want = [float(x @ x), 0, 0, 0, 0, 0]
    for seed in range(20):
        got = top_eigenvalues(hvp(loss, jnp.zeros(6), x), jnp.zeros(6), jax.random.key(seed),
                              k=6, num_steps=6)  # fmt: skip
        np.testing.assert_allclose(got, want, atol=8 * np.finfo(got.dtype).eps * want[0])


# --------------------------------------------------------------------------- SLQ


def test_slq_moments_within_5_stderr():
    loss, params, batch, h = attention_case()
    n, num_probe_vectors = 47, 200
    q = slq_nodes(
        hvp(loss, params, batch),
        params,
        jax.random.key(19),
        num_samples=num_probe_vectors,
        num_steps=6,
    )
    assert isinstance(q, QuadratureNodes)
    nodes, weights = np.asarray(q.nodes), np.asarray(q.weights)
    assert nodes.shape == weights.shape == (num_probe_vectors, 6)
    np.testing.assert_allclose(np.sum(weights, axis=1), 1.0, rtol=1e-12)
    for p in (1, 2, 3):
        per_probe = np.sum(weights * nodes**p, axis=1)
        exact = np.trace(np.linalg.matrix_power(h, p)) / n
        stderr = np.std(per_probe, ddof=1) / np.sqrt(num_probe_vectors)
        assert abs(per_probe.mean() - exact) <= 5 * stderr, p
    # Ritz values lie inside the spectrum
    lam = np.linalg.eigvalsh(h)
    assert nodes.min() >= lam[0] - 1e-9
    assert nodes.max() <= lam[-1] + 1e-9


@pytest.mark.slow
def test_spectral_density_integrates_to_one_and_has_the_trace_as_mean():
    loss, params, batch, h = attention_case()
    op, key = hvp(loss, params, batch), jax.random.key(20)
    sd = spectral_density(op, params, key, num_samples=100, num_steps=8, num_grid=4001)
    assert isinstance(sd, SpectralDensity)
    grid, density = sd.grid, sd.density
    assert grid.shape == density.shape == (4001,)
    assert np.all(np.asarray(density) >= 0)
    assert float(jnp.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-6)
    mean = float(jnp.trapezoid(grid * density, grid))
    q = slq_nodes(op, params, key, num_samples=100, num_steps=8)
    per_probe = np.sum(np.asarray(q.weights * q.nodes), axis=1)
    assert mean == pytest.approx(per_probe.mean(), rel=1e-6)  # smoothing keeps the mean
    se = np.std(per_probe, ddof=1) / 10
    assert abs(mean - np.trace(h) / 47) <= 5 * se


def test_spectral_density_recovers_two_clusters():
    eigs = jnp.concatenate([jnp.full((30,), -2.0), jnp.full((10,), 5.0)])
    a = random_symmetric(
        jax.random.key(21), eigs + 0.01 * jax.random.normal(jax.random.key(22), (40,))
    )
    sd = spectral_density(
        lambda v: jnp.asarray(a) @ v,
        40,
        jax.random.key(23),
        num_samples=50,
        num_steps=20,
        bandwidth=0.2,
    )
    mass_low = float(jnp.trapezoid(jnp.where(sd.grid < 1.5, sd.density, 0.0), sd.grid))
    assert mass_low == pytest.approx(0.75, abs=0.1)


def _integral(sd):
    grid = np.asarray(sd.grid, np.float64)
    return float(np.trapezoid(np.asarray(sd.density, np.float64), grid))


def test_spectral_density_of_a_repeated_eigenvalue_in_float32():
    """c*I: the default bandwidth is relative to the nodes' scale.

    It sat below float32's resolution at 3: 4 distinct grid values, an integral of 3.17.
    """
    like = jnp.zeros(5, jnp.float32)
    sd = spectral_density(lambda v: 3.0 * v, like, jax.random.key(0), num_samples=4, num_steps=1)
    assert sd.grid.dtype == jnp.float32
    assert np.unique(np.asarray(sd.grid)).size == sd.grid.size
    assert _integral(sd) == pytest.approx(1.0, abs=1e-3)
    assert float(sd.grid[jnp.argmax(sd.density)]) == pytest.approx(3.0, rel=1e-3)
    zero = spectral_density(lambda v: 0.0 * v, like, jax.random.key(0), num_samples=2, num_steps=1)
    assert np.unique(np.asarray(zero.grid)).size == zero.grid.size
    assert _integral(zero) == pytest.approx(1.0, abs=1e-3)


def test_spectral_density_of_tiny_eigenvalues_is_not_smeared():
    """Eigenvalues 1e-10 * (1, 2, 3, 4): four peaks, the grid spans the nodes and 5 bandwidths.

    The absolute floor of the default bandwidth (1e-6) spread the grid over [-5e-8, 5e-8].
    """
    d = 1e-10 * jnp.arange(1.0, 5.0)
    sd = spectral_density(lambda v: d * v, 4, jax.random.key(1), num_samples=2, num_steps=4)
    grid, density = np.asarray(sd.grid), np.asarray(sd.density)
    assert 0.8e-10 < grid.min() < 1e-10
    assert 4e-10 < grid.max() < 4.2e-10
    assert _integral(sd) == pytest.approx(1.0, abs=1e-6)
    peaks = np.interp(np.asarray(d), grid, density)
    valleys = np.interp(np.asarray(d[:-1]) + 0.5e-10, grid, density)
    assert peaks.min() > 100 * valleys.max()


@pytest.mark.parametrize("bandwidth", [jnp.array([1.0, 2.0]), np.ones(1), [1.0], "1"])
def test_spectral_density_bandwidth_must_be_a_scalar(bandwidth):
    with pytest.raises(ValueError, match=r"^bandwidth: expected a finite"):
        spectral_density(
            lambda v: 2.0 * v, 4, jax.random.key(0), num_samples=2, num_steps=2,
            bandwidth=bandwidth,
        )  # fmt: skip


def test_python_float_params_and_numpy_integer_sizes():
    """A Python float params and a NumPy integer like work as for the other kernels.

    hessian_trace raised AttributeError ('float' object has no attribute 'dtype');
    hutchinson_trace refused np.int64(3) with a dtype message.
    """
    key = jax.random.key(0)
    est = hessian_trace(lambda p, b: p**2, 2.0, (), key, num_samples=4)
    assert float(est.mean) == 2.0
    assert float(est.stderr) == 0.0
    tree = hessian_trace(lambda p, b: p["a"] ** 3, {"a": 2.0}, (), key, num_matvecs=4,
                         method="hutchpp")  # fmt: skip
    assert float(tree.mean) == pytest.approx(12.0)
    for n in (np.int64(3), np.int32(3), jnp.int32(3)):
        got = hutchinson_trace(lambda v: 2 * v, n, key, num_samples=4)
        assert float(got.mean) == 6.0
        nodes = slq_nodes(lambda v: 2 * v, n, key, num_samples=1, num_steps=1).nodes
        assert float(nodes[0, 0]) == 2.0
    with pytest.raises(ValueError, match=r"^params: expected float16, bfloat16"):
        hessian_trace(lambda p, b: p**2, 2, (), key, num_samples=4)


# --------------------------------------------------------------------------- invariances


@pytest.mark.slow
def test_pytree_and_flattened_operator_agree():
    loss, params, batch = make_poly()
    _, unravel = ravel_pytree(params)
    op, n, key = hvp(loss, params, batch), 18, jax.random.key(24)

    def flat_mv(x):
        return ravel_pytree(op(unravel(x)))[0]

    a = hutchinson_trace(op, params, key, num_samples=9)
    b = hutchinson_trace(flat_mv, n, key, num_samples=9)
    np.testing.assert_allclose([a.mean, a.stderr], [b.mean, b.stderr], rtol=1e-12)
    a = hutchpp_trace(op, params, key, num_matvecs=12)
    b = hutchpp_trace(flat_mv, n, key, num_matvecs=12)
    np.testing.assert_allclose([a.mean, a.stderr], [b.mean, b.stderr], rtol=1e-10)
    np.testing.assert_allclose(
        top_eigenvalues(op, params, key, k=2, num_steps=10),
        top_eigenvalues(flat_mv, n, key, k=2, num_steps=10),
        rtol=1e-12,
    )


@pytest.mark.slow
def test_chunk_size_does_not_change_results_and_matches_a_loop():
    # a cheap pytree operator: the chunking, not the operator, is what is tested here
    dense_mv, like = make_dense_operator()
    flat_mv = lambda x: ravel_pytree(dense_mv(ravel_pytree(like)[1](x)))[0]  # noqa: E731
    key = jax.random.key(25)
    m = 10
    results = [
        hutchinson_trace(dense_mv, like, key, num_samples=m, chunk_size=c)
        for c in (None, 3, 64)  # sequential, chunks of 3 with a remainder, all at once
    ]
    # probe i is drawn from fold_in(key, i): a plain Python loop gives the same numbers
    looped = [
        float(jnp.vdot(v, flat_mv(v)))
        for v in (sign_vector(jax.random.fold_in(key, i), 17, jnp.float64) for i in range(m))
    ]
    for est in results:
        assert float(est.mean) == pytest.approx(np.mean(looped), rel=1e-12)
        assert float(est.stderr) == pytest.approx(np.std(looped, ddof=1) / np.sqrt(m), rel=1e-10)
    pp = [hutchpp_trace(dense_mv, like, key, num_matvecs=13, chunk_size=c) for c in (None, 5)]
    np.testing.assert_allclose([e.mean for e in pp], pp[0].mean, rtol=1e-11)
    np.testing.assert_allclose([e.stderr for e in pp], pp[0].stderr, rtol=1e-9)
    sl = [
        slq_nodes(dense_mv, like, key, num_samples=5, num_steps=4, chunk_size=c).weights
        for c in (None, 2)
    ]
    np.testing.assert_allclose(sl[0], sl[1], rtol=1e-10, atol=1e-14)


def test_float32_in_float32_out():
    loss, params, batch = make_attention(jnp.float32)
    key = jax.random.key(26)
    est = hutchinson_trace(hvp(loss, params, batch), params, key, num_samples=4)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    # the float32 estimate agrees with the float64 one for the same key
    loss64, params64, batch64 = make_attention()
    est64 = hutchinson_trace(hvp(loss64, params64, batch64), params64, key, num_samples=4)
    assert float(est.mean) == pytest.approx(float(est64.mean), rel=matmul_tol(jnp.float32))
    # the other kernels on a float32 pytree operator
    mv32, like32 = make_dense_operator(jnp.float32)
    est = hutchpp_trace(mv32, like32, key, num_matvecs=6, chunk_size=2)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    assert top_eigenvalues(mv32, like32, key, k=2, num_steps=5).dtype == jnp.float32
    sd = spectral_density(mv32, like32, key, num_samples=2, num_steps=3, num_grid=8)
    assert sd.grid.dtype == sd.density.dtype == jnp.float32


def test_traced_once_for_new_keys_and_vmaps_over_keys():
    loss, params, batch = make_poly()
    traces = []

    @jax.jit
    def estimate(p, key):
        traces.append(1)
        return hessian_trace(loss, p, batch, key, num_samples=6)

    keys = jax.random.split(jax.random.key(27), 4)
    looped = [estimate(params, k) for k in keys]
    assert len(traces) == 1
    assert len({float(e.mean) for e in looped}) == 4  # new keys give new draws
    eager = hessian_trace(loss, params, batch, keys[0], num_samples=6)
    np.testing.assert_allclose(
        [eager.mean, eager.stderr], [looped[0].mean, looped[0].stderr], rtol=1e-12
    )
    op = hvp(loss, params, batch)
    vm = jax.vmap(functools.partial(hutchinson_trace, op, params, num_samples=6))(keys)
    np.testing.assert_allclose(vm.mean, [e.mean for e in looped], rtol=1e-12)
    np.testing.assert_allclose(vm.stderr, [e.stderr for e in looped], rtol=1e-10)
    tops = jax.vmap(lambda k: top_eigenvalues(op, params, k, k=2, num_steps=18))(keys)
    np.testing.assert_allclose(tops, jnp.broadcast_to(tops[0], tops.shape), rtol=1e-9)


# --------------------------------------------------------------------------- compile once

KERNELS = {
    "hutchinson_trace": lambda loss, p, b, k: hutchinson_trace(
        hvp(loss, p, b), p, k, num_samples=4
    ),
    "hutchpp_trace": lambda loss, p, b, k: hutchpp_trace(hvp(loss, p, b), p, k, num_matvecs=6),
    "hessian_trace": lambda loss, p, b, k: hessian_trace(loss, p, b, k, num_samples=4),
    "hessian_trace_hutchpp": lambda loss, p, b, k: hessian_trace(
        loss, p, b, k, num_matvecs=6, method="hutchpp"
    ),
    "lanczos": lambda loss, p, b, k: lanczos(hvp(loss, p, b), p, k, num_steps=3),
    "top_eigenvalues": lambda loss, p, b, k: top_eigenvalues(
        hvp(loss, p, b), p, k, k=2, num_steps=3
    ),
    "slq_nodes": lambda loss, p, b, k: slq_nodes(hvp(loss, p, b), p, k, num_samples=2, num_steps=3),
    "spectral_density": lambda loss, p, b, k: spectral_density(
        hvp(loss, p, b), p, k, num_samples=2, num_steps=3, num_grid=16
    ),
    "dataset_hvp+hutchinson_trace": lambda loss, p, b, k: hutchinson_trace(
        dataset_hvp(loss, p, jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), b)),
        p,
        k,
        num_samples=4,
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_second_call_with_new_data_traces_and_compiles_nothing(name):
    kernel = KERNELS[name]
    counter = TraceCounter(poly_loss)
    _, params, batch = make_poly(seed=1)
    _, params2, batch2 = make_poly(seed=2)  # new data and parameters, same shapes
    key2 = jax.random.key(31)
    jax.block_until_ready((params2, batch2, key2))
    first = kernel(counter, params, batch, jax.random.key(30))
    # one trace of the loss per program: the linearisation (a dataset operator is traced at
    # each product site of the program, and once more by sample_statistics' shape probe);
    # Hutchinson on a one-batch operator: its quadratic form and the loss at params (check);
    # Lanczos with linearize="auto": the linearisation traced apart to size its residuals,
    # then the program's own
    hutchinson_one_batch = name in ("hessian_trace", "hutchinson_trace")
    lanczos_auto = name in ("lanczos", "slq_nodes", "spectral_density", "top_eigenvalues")
    budget = 2 if name.startswith("dataset") or hutchinson_one_batch or lanczos_auto else 1
    assert counter.count <= budget, counter.count
    traced = counter.count
    with count_compiles() as messages:
        second = kernel(counter, params2, batch2, key2)
        jax.block_until_ready(second)
    assert counter.count == traced
    assert compiles_in(messages) == []
    differs = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), first, second)
    assert any(jax.tree_util.tree_leaves(differs))  # new inputs were really used


# --------------------------------------------------------------------------- runtime checks


def nan_at(params):
    return {**params, "w": params["w"].at[0, 0].set(jnp.nan)}


def sqrt_loss(p, batch):
    return jnp.sum(jnp.sqrt(p) * batch)  # it and its derivatives are NaN where p < 0


def runtime_cases():
    loss, params, batch = make_poly()
    key = jax.random.key(32)
    ones = jnp.ones(4)
    return [
        # (message start, function of one array argument, argument)
        (
            "params",
            lambda p: hessian_trace(loss, p, batch, key, num_samples=4).mean,
            nan_at(params),
        ),
        (
            "params",
            lambda p: top_eigenvalues(hvp(loss, p, batch), p, key, k=1, num_steps=2),
            nan_at(params),
        ),
        (
            "loss_fn: non-finite loss",
            lambda p: hessian_trace(sqrt_loss, p, ones, key, num_samples=4).mean,
            ones.at[1].set(-1.0),
        ),
        (
            "loss_fn: non-finite products at 4 of the 4 probes",  # dataset: no loss evaluated
            lambda p: (
                hutchinson_trace(
                    dataset_hvp(sqrt_loss, p, jnp.stack([ones, ones])), p, key, num_samples=4
                ).mean
            ),
            ones.at[1].set(-1.0),
        ),
        # recomputed products give Lanczos the loss at params (no forward pass of its own)
        (
            "params",
            lambda p: top_eigenvalues(
                hvp(loss, p, batch), p, key, k=1, num_steps=2, linearize=False
            ),
            nan_at(params),
        ),
        (
            "loss_fn: non-finite loss",
            lambda p: (
                lanczos(hvp(sqrt_loss, p, ones), p, key, num_steps=2, linearize=False).diagonal
            ),
            ones.at[1].set(-1.0),
        ),
        (
            "start",
            lambda s: lanczos(lambda v: 2.0 * v, 4, key, num_steps=2, start=s).diagonal,
            jnp.zeros(4),
        ),
        (
            "bandwidth",
            lambda bw: (
                spectral_density(
                    lambda v: 2.0 * v, 4, key, num_samples=2, num_steps=2, bandwidth=bw
                ).density
            ),
            jnp.asarray(-1.0),
        ),
    ]


@pytest.mark.parametrize("case", range(8))
def test_runtime_checks_raise_eagerly_and_under_jit(case):
    start, fn, arg = runtime_cases()[case]
    with pytest.raises(ValueError, match=rf"^{start}"):
        fn(arg)
    with pytest.raises(jax.errors.JaxRuntimeError, match=rf"kernels check failed: {start}"):
        jax.block_until_ready(jax.jit(fn)(arg))


def test_non_finite_probes_are_counted_eagerly_and_under_jit():
    key, m = jax.random.key(33), 20

    def blows_up(v):  # infinite wherever the probe's first sign is -1
        return v / (v[0] + 1.0)

    bad = sum(
        int(sign_vector(jax.random.fold_in(key, i), 6, jnp.float64)[0] == -1) for i in range(m)
    )
    assert 0 < bad < m
    message = f"matvec: non-finite products at {bad} of the {m} probes"
    # no "$" after the message: what a backend appends to it (e.g. an executable's name) is
    # not the check's concern
    with pytest.raises(ValueError, match=f"^{message}(?!\\d)"):
        hutchinson_trace(blows_up, 6, key, num_samples=m, chunk_size=3)
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(
            jax.jit(lambda k: hutchinson_trace(blows_up, 6, k, num_samples=m))(key).mean
        )
    with pytest.raises(ValueError, match=r"^matvec: non-finite products at \d+ of the 20 products"):
        hutchpp_trace(blows_up, 6, key, num_matvecs=20)
    with pytest.raises(ValueError, match=r"^matvec: non-finite products at 3 of the 3 probes"):
        slq_nodes(lambda v: jnp.nan * v, 6, key, num_samples=3, num_steps=2)


def test_runtime_checks_switch_lets_nan_through():
    loss, params, batch = make_poly()
    with runtime_checks(False):
        est = hessian_trace(loss, nan_at(params), batch, jax.random.key(34), num_samples=4)
        top = jax.jit(
            lambda p: top_eigenvalues(hvp(loss, p, batch), p, jax.random.key(0), num_steps=2)
        )(nan_at(params))
    assert np.isnan(est.mean)
    assert np.all(np.isnan(top))
    with pytest.raises(ValueError, match=r"^params"):  # and back on after the block
        hessian_trace(loss, nan_at(params), batch, jax.random.key(34), num_samples=4)


# --------------------------------------------------------------------------- bad inputs


def bad_input_cases():
    loss, params, batch = make_poly()
    op, key = hvp(loss, params, batch), jax.random.key(0)
    diag = lambda v: 2.0 * v  # noqa: E731

    def cast(dtype):
        return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)

    ht = functools.partial(hessian_trace, loss)
    return [
        ("num_samples", lambda: hutchinson_trace(op, params, key, num_samples=1)),
        ("num_samples", lambda: ht(params, batch, key, num_samples=1)),
        ("num_matvecs", lambda: ht(params, batch, key, num_matvecs=3, method="hutchpp")),
        ("num_samples", lambda: slq_nodes(op, params, key, num_samples=0, num_steps=2)),
        ("num_matvecs", lambda: hutchpp_trace(op, params, key, num_matvecs=3)),
        ("probe", lambda: hutchinson_trace(op, params, key, num_samples=4, probe="normal")),
        ("method", lambda: ht(params, batch, key, num_samples=4, method="exact")),
        ("chunk_size", lambda: hutchinson_trace(op, params, key, num_samples=4, chunk_size=0)),
        ("chunk_size", lambda: hutchpp_trace(op, params, key, num_matvecs=6, chunk_size=-1)),
        ("chunk_size", lambda: ht(params, batch, key, num_samples=4, chunk_size=True)),
        ("chunk_size", lambda: slq_nodes(diag, 3, key, num_samples=2, num_steps=2, chunk_size=2.0)),
        ("k", lambda: top_eigenvalues(op, params, key, k=19, num_steps=19)),
        ("k", lambda: top_eigenvalues(op, params, key, k=0, num_steps=5)),
        ("num_steps", lambda: top_eigenvalues(op, params, key, k=3, num_steps=2)),
        ("num_steps", lambda: slq_nodes(op, params, key, num_samples=2, num_steps=19)),
        ("num_steps", lambda: lanczos(op, params, key, num_steps=0)),
        ("start", lambda: lanczos(op, params, key, num_steps=2, start=jnp.ones(17))),
        ("params", lambda: hvp(loss, nan_at(params), batch)(params)),
        (
            "params",
            lambda: ht(
                jax.tree_util.tree_map(lambda x: x + jnp.inf, params), batch, key, num_samples=2
            ),
        ),
        ("params", lambda: hvp(loss, cast(jnp.int32), batch)),
        ("params", lambda: ht(cast(jnp.int32), batch, key, num_samples=2)),
        ("compute_dtype", lambda: ht(params, batch, key, num_samples=2, compute_dtype="float8")),
        ("compute_dtype", lambda: hvp(loss, cast(jnp.bfloat16), batch, compute_dtype=jnp.int32)),
        ("compute_dtype", lambda: dataset_hvp(loss, params, batch, compute_dtype=3)),
        ("params", lambda: hvp(loss, cast(jnp.complex64), batch)),
        ("params", lambda: hvp(loss, {"w": jnp.zeros((0, 3))}, batch)),
        ("params", lambda: dataset_hvp(loss, {}, batch)),
        ("loss_fn", lambda: hvp(lambda p, b: p["w"] ** 2, params, batch)(params)),
        (
            "loss_fn",
            lambda: hessian_trace(
                lambda p, b: jnp.sum(p["w"], axis=0), params, batch, key, num_samples=2
            ),
        ),
        ("loss_fn", lambda: hvp(None, params, batch)),
        ("key", lambda: hutchinson_trace(op, params, 0, num_samples=2)),
        ("key", lambda: ht(params, batch, jnp.zeros(3), num_samples=2)),
        ("key", lambda: top_eigenvalues(op, params, jax.random.split(key, 2), num_steps=2)),
        ("like", lambda: hutchinson_trace(diag, jnp.arange(3), key, num_samples=2)),
        ("like", lambda: hutchinson_trace(diag, 0, key, num_samples=2)),
        ("like", lambda: hutchinson_trace(diag, jnp.zeros(3, jnp.complex64), key, num_samples=2)),
        ("like", lambda: hutchinson_trace(lambda v: jnp.ones(4), 3, key, num_samples=2)),
        ("like", lambda: hutchpp_trace(op, {"w": params["w"]}, key, num_matvecs=6)),
        ("like", lambda: lanczos(op, 18, key, num_steps=2)),
        ("matvec", lambda: hutchinson_trace("A", 3, key, num_samples=2)),
        (
            "num_grid",
            lambda: spectral_density(op, params, key, num_samples=2, num_steps=2, num_grid=1),
        ),
        (
            "bandwidth",
            lambda: spectral_density(op, params, key, num_samples=2, num_steps=2, bandwidth=0.0),
        ),
        (
            "weights",
            lambda: dataset_hvp(
                loss, params, (batch[0][None], batch[1][None]), weights=jnp.ones(2)
            ),
        ),
        ("batches", lambda: dataset_hvp(loss, params, ())),
        ("batches", lambda: dataset_hvp(loss, params, (jnp.zeros((0, 7, 3)), jnp.zeros((0, 7))))),
        ("batches", lambda: dataset_hvp(loss, params, (jnp.zeros((2, 7, 3)), jnp.zeros((3, 7))))),
        (
            "max_memory_bytes",
            lambda: ht(params, batch, key, num_matvecs=30, method="hutchpp", max_memory_bytes=1000),
        ),
        (
            "max_memory_bytes",
            lambda: ht(params, batch, key, num_matvecs=30, method="hutchpp", max_memory_bytes=0),
        ),
    ]


def test_bad_arguments_raise_naming_the_argument():
    for name, call in bad_input_cases():
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


def test_hutchpp_memory_budget_accepts_what_fits():
    loss, params, batch = make_poly()
    need = hutchpp_memory_bytes(30, 18, jnp.float64)
    assert need == 3 * 10 * 18 * 8
    est = hessian_trace(
        loss,
        params,
        batch,
        jax.random.key(35),
        num_matvecs=30,
        method="hutchpp",
        max_memory_bytes=need,
    )
    assert est.num_evaluations == 30


# --------------------------------------------------------------------------- memory


def temp_bytes(fn, *args):
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    if stats is None:  # pragma: no cover - backends without memory statistics
        pytest.skip("memory_analysis() is not available on this backend")
    return stats.temp_size_in_bytes


def test_hessian_trace_memory_does_not_grow_with_the_number_of_probes():
    loss, params, batch = make_poly()
    key = jax.random.key(36)
    sizes = [
        temp_bytes(
            lambda p, k, m=m: hessian_trace(loss, p, batch, k, num_samples=m, chunk_size=4),
            params,
            key,
        )
        for m in (2**10, 2**16)
    ]
    assert sizes[0] == sizes[1], sizes


def test_hutchpp_memory_is_within_its_formula():
    n = 3000
    d = jnp.linspace(1.0, 2.0, n)

    def run(m):
        return temp_bytes(
            lambda k: hutchpp_trace(lambda v: d * v, n, k, num_matvecs=m), jax.random.key(37)
        )

    small, large = run(30), run(300)
    per_product = 3 * n * 8  # a probe, its image and a projection at a time
    assert large <= hutchpp_memory_bytes(300, n, jnp.float64) + small + per_product
    # and it is the sketch that grows: at least one s x n array more
    assert large - small >= (100 - 10) * n * 8


# --------------------------------------------------------------------------- sharding


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[1])
    from tests.kernels import test_curvature as t
    assert len(jax.devices()) == 4, jax.devices()
    print(json.dumps(t.sharded_results(sys.argv[2])))
    """
)


def sharded_results(operator):
    """Results compared between 4 forced host devices and one device."""
    if operator == "attention":
        loss, params, batch = make_attention()
        matvec, like = hvp(loss, params, batch), params
    else:
        matvec, like = make_dense_operator()
    key = jax.random.key(28)
    out = {}
    for m, chunk in ((10, None), (10, 3)):  # 10 probes on 4 devices: uneven shares
        est = hutchinson_trace(matvec, like, key, num_samples=m, chunk_size=chunk)
        out[f"hutchinson-{m}-{chunk}"] = [float(est.mean), float(est.stderr)]
    est = hutchpp_trace(matvec, like, key, num_matvecs=13, chunk_size=2)
    out["hutchpp"] = [float(est.mean), float(est.stderr)]
    q = slq_nodes(matvec, like, key, num_samples=5, num_steps=3, chunk_size=2)
    out["slq"] = np.asarray(q.weights).ravel().tolist()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("operator", ["dense", "attention"])
def test_sharded_equals_single_device(operator):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED, root, operator],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sharded = json.loads(proc.stdout.strip().splitlines()[-1])
    single = sharded_results(operator)
    assert sharded.keys() == single.keys()
    for name, values in single.items():
        np.testing.assert_allclose(sharded[name], values, rtol=1e-10, atol=1e-14, err_msg=name)


# --------------------------------------------------------------------------- quadratic forms


def test_quadratic_form_is_v_hessian_v_on_one_batch_and_on_a_dataset():
    loss, params, batch = make_poly()
    batches = jax.tree_util.tree_map(lambda a: jnp.stack([a, 2.0 * a, -a]), batch)
    flat, unravel = ravel_pytree(params)
    weights = jnp.array([0.5, 0.3, 0.2])
    dense = dense_hessian(loss, params, batch)
    dense_set = sum(
        w * dense_hessian(loss, params, jax.tree_util.tree_map(lambda a, i=i: a[i], batches))
        for i, w in enumerate(np.asarray(weights))
    )
    for seed in range(3):
        x = np.asarray(jax.random.normal(jax.random.key(seed), flat.shape, flat.dtype))
        v = unravel(jnp.asarray(x))
        np.testing.assert_allclose(hvp(loss, params, batch).form(v), x @ dense @ x, rtol=1e-12)
        op = dataset_hvp(loss, params, batches, weights=weights)
        np.testing.assert_allclose(op.form(v), x @ dense_set @ x, rtol=1e-12)


def test_hutchinson_quadratic_forms_equal_the_products_probe_by_probe():
    # a loss operator's Hutchinson uses forward-over-forward quadratic forms; the same
    # operator as a plain callable uses v . Hv: same probes, same estimate to rounding
    loss, params, batch = make_poly()
    key = jax.random.key(5)
    op = hvp(loss, params, batch)
    forms = hutchinson_trace(op, params, key, num_samples=6)
    products = hutchinson_trace(lambda v: op(v), params, key, num_samples=6)
    np.testing.assert_allclose(forms.mean, products.mean, rtol=1e-12)
    np.testing.assert_allclose(forms.stderr, products.stderr, rtol=1e-9)
    batches = jax.tree_util.tree_map(lambda a: jnp.stack([a, jnp.flip(a, 0)]), batch)
    dop = dataset_hvp(loss, params, batches)
    np.testing.assert_allclose(
        hutchinson_trace(dop, params, key, num_samples=6).mean,
        hutchinson_trace(lambda v: dop(v), params, key, num_samples=6).mean,
        rtol=1e-12,
    )


@jax.custom_vjp
def _square_sum(x):
    return jnp.sum(x**2)


_square_sum.defvjp(lambda x: (_square_sum(x), x), lambda x, g: (2.0 * g * x,))


def test_custom_vjp_loss_falls_back_to_products():
    # no forward-mode derivative through a custom_vjp: the trace comes from products (exact
    # for Rademacher probes on this diagonal Hessian 2 * batch * I)
    def loss(p, batch):
        return batch * _square_sum(p["w"])

    params = {"w": jnp.arange(1.0, 6.0)}
    with pytest.raises((TypeError, NotImplementedError)):
        hvp(loss, params, 1.5).form(params)
    est = hessian_trace(loss, params, 1.5, jax.random.key(0), num_samples=3)
    np.testing.assert_allclose(est.mean, 2 * 1.5 * 5, rtol=1e-12)
    assert float(est.stderr) == 0.0


# --------------------------------------------------------------------------- Lanczos at scale


def outlier_diagonal(dtype):
    """diag([1e4, linspace(0, 1, 1999)]): one outlier far above a bulk (issue 26)."""
    d = np.concatenate([[1e4], np.linspace(0.0, 1.0, 1999)])
    dd = jnp.asarray(d, dtype)
    return (lambda v: dd * v), d


def test_float32_lanczos_keeps_the_bulk_beside_an_outlier():
    # float32 Lanczos used to call a beta below 1e3 eps ||A|| (1.2 here) a breakdown and
    # restart, giving [1e4, 0.788, 0.505] for the truth [1e4, 1, 0.9995]. Finite precision
    # Lanczos computes the Ritz values of A + E with ||E|| ~ eps ||A||: that is the floor.
    mv32, d = outlier_diagonal(jnp.float32)
    like = jnp.zeros(d.size, jnp.float32)
    truth = np.sort(d)[::-1][:3]
    floor = float(jnp.finfo(jnp.float32).eps) * d.max()
    got = top_eigenvalues(mv32, like, jax.random.key(40), k=3, num_steps=200)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got, np.float64), truth, rtol=0, atol=8 * floor)
    mv64, _ = outlier_diagonal(jnp.float64)
    got64 = top_eigenvalues(mv64, jnp.zeros(d.size), jax.random.key(40), k=3, num_steps=200)
    np.testing.assert_allclose(got64, truth, rtol=0, atol=1e-5)  # converged to 3e-7 here
    # SLQ of tr f(A) / n, f = exp(-10 x): for Rademacher probes of a diagonal A each probe's
    # quadrature is exact in exact arithmetic (float64 agrees to 1e-12); in float32 each node
    # moves by about eps ||A||, which moves the sum by eps ||A|| mean_i |f'(lambda_i)| to first
    # order (before the fix: 0.061 against 0.100)
    exact = np.mean(np.exp(-10 * d))
    for dtype, tol in ((jnp.float64, 1e-10), (jnp.float32, floor * np.mean(10 * np.exp(-10 * d)))):
        mv, _ = outlier_diagonal(dtype)
        q = slq_nodes(mv, jnp.zeros(d.size, dtype), jax.random.key(41), num_samples=4, num_steps=30)
        nodes, weights = np.asarray(q.nodes, np.float64), np.asarray(q.weights, np.float64)
        per_probe = np.sum(weights * np.exp(-10 * nodes), axis=1)
        np.testing.assert_allclose(per_probe, exact, rtol=0, atol=tol)


@pytest.mark.parametrize(
    ("basis_dtype", "bits"), [("float32", 24), ("float16", 11), ("bfloat16", 8)]
)
def test_lower_precision_basis_accuracy(basis_dtype, bits):
    # a basis stored at unit roundoff u = 2**-bits gives Ritz values within about
    # 0.015 u ||A|| of the truth (measured 0.013-0.016 u on this matrix at 40 and 120 steps;
    # 0.053 u with restarts, below); the documented bound, asserted, is 0.1 u ||A||. The
    # full-precision basis is at the rounding level
    rng = np.random.default_rng(42)
    n = 400
    q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    eigs = np.concatenate([[50.0, 40.0, 30.0, 20.0, 10.0], rng.uniform(-1, 1, n - 5)])
    a = jnp.asarray((q * eigs) @ q.T)
    a = 0.5 * (a + a.T)
    truth = np.sort(eigs)[::-1][:5]
    key = jax.random.key(43)
    full = top_eigenvalues(lambda v: a @ v, n, key, k=5, num_steps=40)
    np.testing.assert_allclose(full, truth, rtol=0, atol=1e-12 * 50)
    low = top_eigenvalues(lambda v: a @ v, n, key, k=5, num_steps=40, basis_dtype=basis_dtype)
    assert low.dtype == jnp.float64
    np.testing.assert_allclose(low, truth, rtol=0, atol=0.1 * 2.0**-bits * 50)


def test_lower_precision_basis_restarts_and_scales():
    # a float16 basis is stored scaled by sqrt(n): an invariant subspace (3 distinct
    # eigenvalues) still restarts into an exact spectrum, and lanczos / SLQ accept the option
    eigs = jnp.array([4.0, 4.0, 4.0, -1.0, -1.0, 2.0, 2.0, 2.0])
    a = jnp.asarray(random_symmetric(jax.random.key(17), eigs))
    tri = lanczos(lambda v: a @ v, 8, jax.random.key(18), num_steps=8, basis_dtype="float16")
    got = np.sort(np.linalg.eigvalsh(tri.matrix()))
    # within half a float16 unit roundoff of ||A|| = 4 (the start vector is key 18's Rademacher
    # probe: measured 0.053 u with the former sign words, 0.11 u with the public fold_in words)
    np.testing.assert_allclose(got, np.sort(eigs), atol=0.5 * 2.0**-11 * 4)
    q = slq_nodes(lambda v: a @ v, 8, jax.random.key(19), num_samples=2, num_steps=8,
                  basis_dtype="float32")  # fmt: skip
    np.testing.assert_allclose(np.sum(q.weights, axis=1), 1.0, rtol=1e-6)


def test_basis_dtype_bad_values_raise():
    mv, like = make_dense_operator(jnp.float32)
    key = jax.random.key(0)
    for bad in ("float64", "int8", "complex64", 3, "nonsense"):
        with pytest.raises(ValueError, match=r"^basis_dtype: expected None or one of"):
            top_eigenvalues(mv, like, key, k=1, num_steps=3, basis_dtype=bad)


def test_lanczos_gram_schmidt_against_the_rows_in_use():
    # rows not yet written are zero and change nothing; a lower-precision basis is read block
    # by block and skips the blocks past the rows in use (poisoned here: never read)
    from kernels.curvature import _Basis

    w = jnp.arange(1.0, 6.0)
    full = _Basis.create(6, 5, jnp.float64, jnp.float64).set(0, jnp.eye(5)[0])
    np.testing.assert_allclose(full.project_out(w, 1), [0.0, 2.0, 3.0, 4.0, 5.0])
    _, norm = full.orthogonalize(w, 1)
    np.testing.assert_allclose(norm, np.sqrt(4 + 9 + 16 + 25))
    low = _Basis.create(6, 5, jnp.float64, jnp.float16).set(0, jnp.eye(5)[0])
    low = _Basis([low.rows[0].at[3:].set(jnp.nan)], low.scale, low.work)
    # the stored row is sqrt(5) e_0 rounded to float16: exact to float16's unit roundoff
    np.testing.assert_allclose(low.project_out(w, 1), [0.0, 2.0, 3.0, 4.0, 5.0], atol=2.0**-11)
    assert np.isnan(np.asarray(low.project_out(w, 4))).all()  # row 3 is read at used=4


def _primitive_counts(jaxpr, counts=None):
    """How often each primitive occurs in a jaxpr and its sub-programs."""
    from jax.extend.core import jaxprs_in_params

    counts = {} if counts is None else counts
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
        for sub in jaxprs_in_params(eqn.params):
            _primitive_counts(sub, counts)
    return counts


def test_slq_probes_vmapped_together_keep_the_lanczos_branches(monkeypatch):
    # 16 probes in one vmapped chunk (the accelerator default): the restart probe's draw stays
    # a lax.cond branch and the Gram-Schmidt passes a loop, taken when any probe of the chunk
    # needs them (a batched predicate turns a cond into select_n: both sides at every step);
    # each probe keeps its own result, so the chunk gives the nodes of the probes run one at a
    # time
    from kernels import _lanczos
    from kernels._slq import _slq

    eigs = jnp.array([4.0, 4.0, 4.0, -1.0, -1.0, 2.0, 2.0, 2.0])  # breaks down: restarts
    a = jnp.asarray(random_symmetric(jax.random.key(17), eigs))

    def matvec(v):
        return a @ v

    key = jax.random.key(60)

    def chunked(k):
        q = _slq(matvec, 8, k, 16, 8, 16)
        return q.nodes, q.weights

    def num_branches():  # a fresh function each time: traced afresh
        jaxpr = jax.make_jaxpr(lambda k: chunked(k))(key).jaxpr
        return _primitive_counts(jaxpr).get("cond", 0)

    branches = num_branches()
    nodes, weights = jax.jit(chunked)(key)
    one = slq_nodes(matvec, 8, key, num_samples=16, num_steps=8, chunk_size=None)
    np.testing.assert_allclose(nodes, one.nodes, rtol=1e-12, atol=1e-12)
    for p in range(4):  # weights of repeated nodes may swap places: compare the moments
        np.testing.assert_allclose(
            np.sum(weights * nodes**p, axis=1),
            np.sum(one.weights * one.nodes**p, axis=1),
            rtol=1e-10,
        )
    np.testing.assert_allclose(np.sort(nodes[0]), np.sort(eigs), atol=1e-10)
    # with the predicate per probe, vmap turns the Lanczos branch, the restart probe's draw,
    # into a select that draws at every pass (the second Gram-Schmidt pass and the restart's
    # passes are turns of the step's one loop, whose predicate is then batched, and with it
    # the loop's count)
    monkeypatch.setattr(_lanczos, "_any_in_batch", lambda pred: pred)
    per_probe = num_branches()
    assert branches - per_probe == 1, (branches, per_probe)


# --------------------------------------------------------------------------- recomputed products


def test_recomputed_products_give_the_dense_spectrum_and_the_linearised_results(run):
    # linearize=False forms every Hessian-vector product from scratch (forward over reverse)
    # instead of linearising once: the same operator, so the exact spectrum with a full basis
    # and the linearised run's tridiagonal, eigenvalues and SLQ nodes to rounding
    loss, params, batch, h = attention_case()
    n = h.shape[0]
    op = hvp(loss, params, batch)
    key = jax.random.key(51)
    want = np.linalg.eigvalsh(h)[::-1][:3]
    top = run(lambda: top_eigenvalues(op, params, key, k=3, num_steps=n, linearize=False))
    np.testing.assert_allclose(top, want, rtol=1e-9, atol=1e-9 * abs(want[0]))
    scale = np.abs(np.linalg.eigvalsh(h)).max()
    tri = {lin: run(lambda lin=lin: lanczos(op, params, key, num_steps=12, linearize=lin))
           for lin in (True, False)}  # fmt: skip
    for field in ("diagonal", "off_diagonal"):
        np.testing.assert_allclose(getattr(tri[False], field), getattr(tri[True], field),
                                   rtol=0, atol=1e-11 * scale)  # fmt: skip
    nodes = {lin: slq_nodes(op, params, key, num_samples=2, num_steps=6, linearize=lin)
             for lin in (True, False)}  # fmt: skip
    np.testing.assert_allclose(nodes[False].nodes, nodes[True].nodes, rtol=0, atol=1e-11 * scale)
    np.testing.assert_allclose(nodes[False].weights, nodes[True].weights, rtol=0, atol=1e-11)
    dens = {lin: spectral_density(op, params, key, num_samples=2, num_steps=6, num_grid=64,
                                  linearize=lin) for lin in (True, False)}  # fmt: skip
    np.testing.assert_allclose(dens[False].density, dens[True].density, rtol=1e-8)


def test_recomputed_products_keep_no_linearisation():
    # the point of linearize=False: XLA's allocation plan no longer holds the forward and
    # backward pass's residuals beside the loop (activations of 8192 examples, 1.2k parameters);
    # the barrier in the product keeps XLA from hoisting that pass out of the loop
    def loss(p, b):
        x, y = b
        h = jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w2"])
        return jnp.mean((h @ p["w3"] - y) ** 2)

    k = jax.random.split(jax.random.key(52), 5)
    params = {
        "w1": jax.random.normal(k[0], (8, 32)) / 3,
        "w2": jax.random.normal(k[1], (32, 32)) / 6,
        "w3": jax.random.normal(k[2], (32, 1)) / 6,
    }
    batch = (jax.random.normal(k[3], (8192, 8)), jax.random.normal(k[4], (8192, 1)))
    temps, values = {}, {}
    for lin in (True, False):
        fn = jax.jit(lambda p, b, kk, lin=lin: top_eigenvalues(
            hvp(loss, p, b), p, kk, k=1, num_steps=4, linearize=lin))  # fmt: skip
        compiled = fn.lower(params, batch, jax.random.key(53)).compile()
        analysis = compiled.memory_analysis()
        if analysis is None:  # pragma: no cover - a backend without an allocation plan
            pytest.fail("no memory_analysis() on this backend: the test needs XLA's plan")
        temps[lin] = analysis.temp_size_in_bytes
        values[lin] = compiled(params, batch, jax.random.key(53))
    # one activation of the batch is 8192 x 32 float32 = 1 MiB; the linearisation keeps several
    assert temps[False] <= temps[True] - 2 * 2**20, temps
    np.testing.assert_allclose(values[False], values[True], rtol=16 * np.finfo(np.float32).eps)


def test_linearize_auto_keeps_the_linearisation_only_while_its_residuals_are_small(monkeypatch):
    # the default linearize="auto" gives the program of linearize=True while the residuals
    # (activations of 8192 examples: several MiB) are within PRODUCT_RESIDUAL_BYTES, and that
    # of linearize=False beyond it (the unused linearisation is dead code, dropped by JAX)
    from kernels import _memory

    k = jax.random.split(jax.random.key(55), 5)
    params = {"w1": jax.random.normal(k[0], (8, 32)) / 3, "w2": jax.random.normal(k[1], (32, 1))}
    batch = (jax.random.normal(k[3], (8192, 8)), jax.random.normal(k[4], (8192, 1)))

    def plan(linearize):
        def loss(p, b):  # a new function each time: traced afresh under the threshold set
            x, y = b
            return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

        fn = jax.jit(lambda p, b, kk: top_eigenvalues(
            hvp(loss, p, b), p, kk, k=1, num_steps=4, linearize=linearize))  # fmt: skip
        compiled = fn.lower(params, batch, jax.random.key(56)).compile()
        temps = compiled.memory_analysis().temp_size_in_bytes  # XLA's allocation plan
        return temps, compiled(params, batch, jax.random.key(56))

    linearised, recomputed = plan(True), plan(False)
    assert recomputed[0] <= linearised[0] - 2**20, (recomputed[0], linearised[0])
    auto = plan("auto")
    assert auto[0] == linearised[0]
    np.testing.assert_array_equal(auto[1], linearised[1])
    monkeypatch.setattr(_memory, "PRODUCT_RESIDUAL_BYTES", 2**20)
    auto = plan("auto")
    assert auto[0] == recomputed[0]
    np.testing.assert_array_equal(auto[1], recomputed[1])


def test_recomputed_products_on_dataset_operators_and_callables_change_nothing():
    # operators over stacked batches recompute already, and a plain callable has nothing to
    # linearise: linearize=False gives the same bits
    loss, params, batch, _ = attention_case()
    batches = jax.tree_util.tree_map(lambda a: jnp.stack([a, jnp.flip(a, 0)]), batch)
    op = dataset_hvp(loss, params, batches)
    key = jax.random.key(54)
    same = [
        top_eigenvalues(op, params, key, k=2, num_steps=6, linearize=lin) for lin in (True, False)
    ]
    np.testing.assert_array_equal(same[0], same[1])
    mv, like = make_dense_operator()
    plain = [
        top_eigenvalues(mv, like, key, k=2, num_steps=6, linearize=lin) for lin in (True, False)
    ]
    np.testing.assert_array_equal(plain[0], plain[1])


def test_linearize_bad_values_raise():
    mv, like = make_dense_operator(jnp.float32)
    key = jax.random.key(0)
    for bad in ("yes", 1, None, 0.0):
        with pytest.raises(ValueError, match=r"^linearize: expected True, False or 'auto', got"):
            top_eigenvalues(mv, like, key, k=1, num_steps=3, linearize=bad)
        with pytest.raises(ValueError, match=r"^linearize: expected True, False or 'auto', got"):
            lanczos(mv, like, key, num_steps=3, linearize=bad)
        with pytest.raises(ValueError, match=r"^linearize: expected True, False or 'auto', got"):
            slq_nodes(mv, like, key, num_samples=1, num_steps=3, linearize=bad)


# --------------------------------------------------------------------------- Hutchinson modes


def test_hutchinson_modes_agree_and_auto_picks_by_residual_memory(monkeypatch):
    # forms and linearised products give the same probes' v^T H v to rounding; "auto" takes
    # products one at a time while the linearisation's residuals fit its budget, else forms
    import kernels.curvature as curvature
    from kernels import _flat, _memory

    # the default chunk_size ("auto") one probe at a time, as on a CPU; on an accelerator it
    # is a chunk, which takes forms (below)
    monkeypatch.setattr(_memory, "is_accelerator", lambda: False)
    loss, params, batch = attention_case()[:3]
    op = hvp(loss, params, batch)
    key = jax.random.key(44)
    run = {
        mode: hutchinson_trace(op, params, key, num_samples=5, mode=mode)
        for mode in ("forms", "products", "auto")
    }
    np.testing.assert_allclose(run["forms"].mean, run["products"].mean, rtol=1e-12)
    np.testing.assert_allclose(run["forms"].stderr, run["products"].stderr, rtol=1e-9)
    chosen = {}
    real_setup = curvature._setup

    def spy(matvec, like, linear=None):
        chosen["products"] = True
        return real_setup(matvec, like, linear)

    monkeypatch.setattr(_flat, "_setup", spy)
    hutchinson_trace(op, params, jax.random.key(45), num_samples=3)  # small residuals
    assert chosen.pop("products", False)
    monkeypatch.setattr(_memory, "PRODUCT_RESIDUAL_BYTES", 0)
    hutchinson_trace(op, params, jax.random.key(46), num_samples=3)
    assert not chosen  # over the budget: forms
    hutchinson_trace(op, params, jax.random.key(47), num_samples=4, chunk_size=2)
    assert not chosen  # chunks: forms share their primal pass
    monkeypatch.setattr(_memory, "PRODUCT_RESIDUAL_BYTES", 2**30)
    monkeypatch.setattr(_memory, "is_accelerator", lambda: True)
    hutchinson_trace(op, params, jax.random.key(48), num_samples=3)
    assert not chosen  # the accelerator's default: a chunk of probes, forms


def test_hutchinson_chunk_size_auto_follows_the_backend(monkeypatch):
    # "auto" is one probe at a time on a CPU (the same program as None) and chunks of 16 on
    # an accelerator; the chunk never changes the estimate beyond rounding
    from kernels import _memory

    loss, params, batch = make_poly()
    op = hvp(loss, params, batch)
    key = jax.random.key(48)
    # the backend this runs on: one probe at a time on a CPU, 16 on an accelerator
    assert _memory.probe_chunk("auto") == (16 if _memory.is_accelerator() else 1)
    monkeypatch.setattr(_memory, "is_accelerator", lambda: False)
    assert _memory.probe_chunk("auto") == 1
    cpu = hutchinson_trace(op, params, key, num_samples=20)
    none = hutchinson_trace(op, params, key, num_samples=20, chunk_size=None)
    assert float(cpu.mean) == float(none.mean)
    monkeypatch.setattr(_memory, "is_accelerator", lambda: True)
    assert _memory.probe_chunk("auto") == 16
    accel = hutchinson_trace(op, params, key, num_samples=20)
    np.testing.assert_allclose(accel.mean, cpu.mean, rtol=1e-12)
    np.testing.assert_allclose(accel.stderr, cpu.stderr, rtol=1e-9)


def test_hutchinson_bad_mode_and_chunk_raise():
    loss, params, batch = make_poly()
    op = hvp(loss, params, batch)
    key = jax.random.key(0)
    for bad in ("product", None, 1):
        with pytest.raises(ValueError, match=r"^mode: expected one of"):
            hutchinson_trace(op, params, key, num_samples=2, mode=bad)
    for bad in ("AUTO", 0, -1, 2.5):
        with pytest.raises(ValueError, match=r"^chunk_size"):
            hutchinson_trace(op, params, key, num_samples=2, chunk_size=bad)


# --------------------------------------------------------------------------- keys and counts


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])  # threefry2x32: the tests above
def test_every_key_implementation_keeps_the_invariances(impl):
    # results are exact where the algorithm is (diagonal Hutchinson, full-step Lanczos, SLQ
    # weights) and do not depend on chunk_size whatever the key implementation
    d = jnp.array([1.0, 2.0, 3.0, 5.0, 8.0])
    key = jax.random.key(49, impl=impl)
    est = hutchinson_trace(lambda v: d * v, 5, key, num_samples=4)
    np.testing.assert_allclose(est.mean, 19.0, rtol=1e-12)
    mv, like = make_dense_operator()
    for fn in (
        lambda c: hutchinson_trace(mv, like, key, num_samples=6, chunk_size=c).mean,
        lambda c: hutchpp_trace(mv, like, key, num_matvecs=9, chunk_size=c).mean,
        lambda c: slq_nodes(mv, like, key, num_samples=3, num_steps=4, chunk_size=c).nodes,
    ):
        np.testing.assert_allclose(fn(None), fn(2), rtol=1e-10, atol=1e-12)
    eigs = jnp.array([4.0, 4.0, 4.0, -1.0, -1.0, 2.0, 2.0, 2.0])  # restarts twice
    a = jnp.asarray(random_symmetric(jax.random.key(17), eigs))
    top = top_eigenvalues(lambda v: a @ v, 8, key, k=8, num_steps=8)
    np.testing.assert_allclose(top, np.sort(eigs)[::-1], atol=1e-10)


def test_counts_past_2_to_the_31_are_traced_or_refused_clearly():
    # Hutchinson streams its probes: 2**40 of them trace (nothing wraps); 2**53 + 1 is refused.
    # SLQ and Hutch++ keep an output per probe / sketch vector, indexed in 32 bits: refused
    # past 2**31 - 1 with the reason, before any work
    d = jnp.arange(1.0, 5.0)
    key = jax.random.key(0)
    out = jax.eval_shape(lambda k: hutchinson_trace(lambda v: d * v, 4, k, num_samples=2**40), key)
    assert out.mean.shape == ()
    assert out.num_samples == 2**40
    with pytest.raises(ValueError, match=r"^num_samples: at most 2\*\*53"):
        hutchinson_trace(lambda v: d * v, 4, key, num_samples=2**53 + 1)
    with pytest.raises(ValueError, match=r"^num_samples: at most 2\*\*31 - 1 \(every probe"):
        slq_nodes(lambda v: d * v, 4, key, num_samples=2**31, num_steps=2)
    with pytest.raises(ValueError, match=r"^num_steps: at most 2\*\*31 - 1"):
        lanczos(lambda v: d * v, 2**32, key, num_steps=2**31)
    with pytest.raises(ValueError, match=r"^num_matvecs: Hutch\+\+ keeps a sketch"):
        hutchpp_trace(lambda v: v, 2**34, key, num_matvecs=3 * 2**31)
    est = jax.eval_shape(lambda k: hutchpp_trace(lambda v: d * v, 4, k, num_matvecs=2**40), key)
    assert est.num_evaluations == 2**40


# --------------------------------------------------------------------------- vectors as leaves


def _leafy_operator():
    """A symmetric 25 x 25 operator as a matvec on a pytree of three leaves and on flat vectors."""
    rng = np.random.default_rng(12)
    like = {
        "a": jnp.zeros((3, 4), jnp.float64),
        "b": jnp.zeros((5,), jnp.float64),
        "c": jnp.zeros((2, 2, 2), jnp.float64),
    }
    m = rng.normal(size=(25, 25))
    dense = jnp.asarray(m + m.T + np.diag(np.arange(25.0)))
    unravel = ravel_pytree(like)[1]

    def on_tree(v):
        return unravel(dense @ ravel_pytree(v)[0])

    def on_flat(v):
        return dense @ v

    return like, unravel, dense, on_tree, on_flat


def test_lanczos_on_leaves_equals_the_raveled_operator():
    # the basis is kept leaf by leaf: the same recurrence as on the raveled vectors (the same
    # start, its leaves cut from the flat probe), to rounding; a start given as a pytree or
    # as a flat vector is the same start
    like, unravel, dense, on_tree, on_flat = _leafy_operator()
    key = jax.random.key(5)
    tree = lanczos(on_tree, like, key, num_steps=12)
    flat = lanczos(on_flat, 25, key, num_steps=12)
    np.testing.assert_allclose(tree.diagonal, flat.diagonal, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree.off_diagonal, flat.off_diagonal, rtol=1e-12, atol=1e-12)
    start = jnp.asarray(np.random.default_rng(3).normal(size=25))
    from_flat = lanczos(on_tree, like, key, num_steps=8, start=start)
    from_tree = lanczos(on_tree, like, key, num_steps=8, start=unravel(start))
    np.testing.assert_allclose(from_flat.diagonal, from_tree.diagonal, rtol=1e-13)
    np.testing.assert_allclose(from_flat.start_norm, np.linalg.norm(start), rtol=1e-13)
    top = top_eigenvalues(on_tree, like, key, k=3, num_steps=25)
    np.testing.assert_allclose(top, np.linalg.eigvalsh(dense)[::-1][:3], rtol=1e-10)
    with pytest.raises(ValueError, match=r"^start: expected a flat vector of shape \(25,\) or a"):
        lanczos(on_tree, like, key, num_steps=4, start=jnp.ones(24))


def test_lanczos_basis_leaf_by_leaf_equals_the_raveled_basis():
    # on a mesh the basis is one (num_steps, *leaf.shape) array per leaf (off a mesh one
    # raveled leaf): the same recurrence, the same start (the leaves' blocks of the flat
    # probe), to rounding; here the mesh's layout is set by hand on one device
    from jax.sharding import Mesh

    from kernels._devices import SampleLayout, tracing_layout
    from kernels._flat import _setup
    from kernels._lanczos import _lanczos_run

    like, _, _, on_tree, _ = _leafy_operator()
    key = jax.random.key(5)
    flat = _setup(on_tree, like)
    raveled = _lanczos_run(flat, key, 12, None)
    with tracing_layout(SampleLayout(Mesh(jax.devices()[:1], ("model",)), ())):
        assert flat.for_bases() is flat  # leaves
        leaves = _lanczos_run(flat, key, 12, None)
        low = _lanczos_run(flat, key, 12, None, jnp.float32)
    for a, b in zip(leaves, raveled, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # a float32 basis for float64 work, read block by block leaf by leaf: the Ritz values move
    # by at most 0.1 u ||A|| (u = 2**-24, as the module docstring states)
    like, _, dense, _, _ = _leafy_operator()
    norm = float(np.max(np.abs(np.linalg.eigvalsh(dense))))

    def ritz(run):
        return np.linalg.eigvalsh(Tridiagonal(run[0], run[1], run[2]).matrix())

    np.testing.assert_allclose(ritz(low), ritz(raveled), atol=0.1 * 2.0**-24 * norm)


def test_hutchpp_on_leaves_is_exact_with_a_full_sketch():
    # s = n: the Gram-Schmidt basis of the sketch spans everything, so the estimate is the trace
    like, _, dense, on_tree, _ = _leafy_operator()
    est = hutchpp_trace(on_tree, like, jax.random.key(2), num_matvecs=77)
    np.testing.assert_allclose(est.mean, np.trace(dense), rtol=1e-10)


def test_gaussian_probes_are_drawn_leaf_by_leaf():
    # probe i's leaf l is normal(fold_in(fold_in(key, i), l)), on a mesh or not: the estimate
    # is the mean of v_i^T A v_i over those probes
    like, _, dense, on_tree, _ = _leafy_operator()
    key = jax.random.key(9)
    est = hutchinson_trace(on_tree, like, key, num_samples=4, probe="gaussian")
    leaves, treedef = jax.tree_util.tree_flatten(like)
    values = []
    for i in range(4):
        k = jax.random.fold_in(key, i)
        v = [
            jax.random.normal(jax.random.fold_in(k, j), a.shape, a.dtype)
            for j, a in enumerate(leaves)
        ]
        x = ravel_pytree(jax.tree_util.tree_unflatten(treedef, v))[0]
        values.append(float(x @ dense @ x))
    np.testing.assert_allclose(est.mean, np.mean(values), rtol=1e-12)
    np.testing.assert_allclose(est.stderr, np.std(values, ddof=1) / 2, rtol=1e-10)


def test_rbg_rademacher_probes_are_drawn_leaf_by_leaf():
    # keys whose draws are not word by word ("rbg"): leaf l of probe i holds the signs of
    # fold_in(fold_in(key, i), l), on a mesh or not
    like, _, dense, on_tree, _ = _leafy_operator()
    key = jax.random.key(9, impl="rbg")
    est = hutchinson_trace(on_tree, like, key, num_samples=3)
    leaves, treedef = jax.tree_util.tree_flatten(like)
    values = []
    for i in range(3):
        k = jax.random.fold_in(key, i)
        v = [
            sign_vector(jax.random.fold_in(k, j), a.size, a.dtype).reshape(a.shape)
            for j, a in enumerate(leaves)
        ]
        x = ravel_pytree(jax.tree_util.tree_unflatten(treedef, v))[0]
        values.append(float(x @ dense @ x))
    np.testing.assert_allclose(est.mean, np.mean(values), rtol=1e-12)


def test_sign_blocks_past_two_to_the_32():
    # a leaf's block of a threefry key's signs starts anywhere below 2**37: entry i is bit
    # i % 32 of word i // 32, word w entry w % 4 of the bits of fold_in(key, w // 4)
    from kernels._random import sign_block

    # (the Threefry hash written out in _random, checked against jax.random's under both
    # settings of jax_threefry_partitionable, and for a raw uint32 key)
    for partitionable, key in itertools.product(
        (False, True), (jax.random.key(4), jax.random.PRNGKey(5))
    ):
        with jax.threefry_partitionable(partitionable):
            for start in (2**32 - 40, 2**32 + 3, 2**36 + 77):
                block = np.asarray(sign_block(key, start, (3, 30), jnp.float32)).ravel()
                want = []
                for i in range(start, start + 90):
                    word, bit = divmod(i, 32)
                    group = jax.random.bits(jax.random.fold_in(key, word // 4), (4,), jnp.uint32)
                    want.append(-1.0 if (int(group[word % 4]) >> bit) & 1 else 1.0)
                np.testing.assert_array_equal(block, want)
    key = jax.random.key(4)
    with pytest.raises(ValueError, match=r"^start: expected a block of under 2\*\*32 - 31"):
        sign_block(key, 2**37 - 10, (20,), jnp.float32)


def test_hutchpp_with_a_sketch_of_n_vectors_is_exact_for_every_key():
    # n = 5 Rademacher sketch vectors often repeat or oppose one another (or are otherwise
    # dependent): Gram-Schmidt leaves such an image only its rounding, which normalised was a
    # column far from orthogonal (the trace came out 27.7 instead of 10); a Gaussian direction
    # orthogonal to the columns now completes the basis, so 3 n products give tr A exactly
    diag = {"a": jnp.arange(1.0, 4.0), "b": jnp.asarray([[4.0, 5.0]])}

    def mv(v):
        return jax.tree_util.tree_map(jnp.multiply, diag, v)

    like = jax.tree_util.tree_map(jnp.zeros_like, diag)
    for seed in range(16):
        est = hutchpp_trace(mv, like, jax.random.key(seed), num_matvecs=15)
        assert float(est.mean) == pytest.approx(15.0, rel=1e-12), seed
