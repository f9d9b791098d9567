"""Curvature kernels against dense float64 Hessians (jax.hessian on ravel_pytree)."""

import functools
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

from kernels.curvature import (
    dataset_hvp,
    hessian_trace,
    hutchinson_trace,
    hutchpp_trace,
    hvp,
    lanczos,
    slq_nodes,
    spectral_density,
    top_eigenvalues,
)

# --------------------------------------------------------------------------- small losses


def make_poly(dtype=jnp.float64):
    """A non-quadratic loss on a nested pytree (tanh regression), 3*4 + 4 + 2 = 18 params."""
    k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(k1, (7, 3), dtype)
    y = jax.random.normal(k2, (7,), dtype)
    params = {
        "w": 0.7 * jax.random.normal(k3, (3, 4), dtype),
        "head": {"b": jnp.zeros((4,), dtype), "c": 0.5 * jax.random.normal(k4, (2,), dtype)},
    }

    def loss(p):
        h = jnp.tanh(x @ p["w"] + p["head"]["b"][None, :])
        pred = jnp.sum(h, axis=1) * p["head"]["c"][0] + p["head"]["c"][1] ** 3
        return jnp.mean((pred - y) ** 2) + 0.1 * jnp.sum(p["w"] ** 4)

    return loss, params


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
    x = x.astype(dtype)
    return (lambda p: attention_ce(p, x, y)), params


def batch_ce(p, batch):
    return attention_ce(p, *batch)


LOSSES = {"poly": make_poly, "attention": make_attention}


def dense_hessian(loss, params):
    flat, unravel = ravel_pytree(params)
    return np.asarray(jax.jit(jax.hessian(lambda f: loss(unravel(f))))(flat))


@functools.cache
def attention_case():
    loss, params = make_attention()
    return loss, params, dense_hessian(loss, params)


def rademacher_se(a, m):
    return np.sqrt(2 * (np.sum(a**2) - np.sum(np.diag(a) ** 2)) / m)


def random_symmetric(key, eigs):
    q, _ = jnp.linalg.qr(jax.random.normal(key, (eigs.size, eigs.size)))
    return np.asarray((q * eigs[None, :]) @ q.T)


# --------------------------------------------------------------------------- hvp


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_hvp_matches_dense_hessian(run, name):
    loss, params = LOSSES[name]()
    h = dense_hessian(loss, params)
    flat, unravel = ravel_pytree(params)
    vs = jax.random.normal(jax.random.key(3), (3, flat.size))
    got = run(lambda: jnp.stack([ravel_pytree(hvp(loss, params)(unravel(v)))[0] for v in vs]))
    want = np.asarray(vs) @ h
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    assert np.abs(h - h.T).max() < 1e-10 * np.abs(h).max()  # the reference is a real Hessian


def test_hvp_preserves_pytree_and_float32():
    loss, params = make_attention(jnp.float32)
    out = hvp(loss, params)(params)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(params)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(out))
    loss64, params64 = make_attention()
    want = ravel_pytree(hvp(loss64, params64)(params64))[0]
    np.testing.assert_allclose(
        ravel_pytree(out)[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max()
    )


def test_dataset_hvp_is_hessian_of_mean_loss():
    _, params = make_attention()
    keys = jax.random.split(jax.random.key(4), 3)
    xs, ys = jax.vmap(lambda k: attention_batch(k, jnp.float64))(keys)  # 3 batches of 6
    flat, unravel = ravel_pytree(params)
    v = unravel(jax.random.normal(jax.random.key(5), flat.shape))

    def total(p, weights):
        return sum(w * attention_ce(p, xs[b], ys[b]) for b, w in enumerate(weights))

    for weights in (None, jnp.array([0.5, 0.3, 0.2])):
        w = jnp.full((3,), 1 / 3) if weights is None else weights
        h = dense_hessian(lambda p, w=w: total(p, w), params)
        got = ravel_pytree(dataset_hvp(batch_ce, params, (xs, ys), weights=weights)(v))[0]
        want = h @ np.asarray(ravel_pytree(v)[0])
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_dataset_hvp_equals_hvp_on_concatenated_batch():
    _, params = make_attention()
    xs, ys = jax.vmap(lambda k: attention_batch(k, jnp.float64))(
        jax.random.split(jax.random.key(6), 4)
    )
    v = jax.tree_util.tree_map(jnp.ones_like, params)
    got, whole = jax.jit(
        lambda: (
            dataset_hvp(batch_ce, params, (xs, ys))(v),
            hvp(lambda p: attention_ce(p, xs.reshape(24, 5, 4), ys.reshape(24)), params)(v),
        )
    )()
    np.testing.assert_allclose(ravel_pytree(got)[0], ravel_pytree(whole)[0], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- Hutchinson


@pytest.mark.parametrize("probe", ["rademacher", "gaussian"])
def test_hutchinson_within_5_stderr_and_stderr_is_exact(probe):
    loss, params, h = attention_case()
    m = 1000
    mv = hvp(loss, params)
    est = jax.jit(lambda k: hutchinson_trace(mv, params, k, num_probes=m, probe=probe))(
        jax.random.key(7)
    )
    exact = np.trace(h)
    assert abs(est.mean - exact) <= 5 * est.stderr
    gaussian_se = np.sqrt(2 * np.sum(h**2) / m)
    se = rademacher_se(h, m) if probe == "rademacher" else gaussian_se
    assert abs(est.stderr / se - 1) <= 0.2, (est.stderr, se)
    assert est.num_samples == m


def test_hutchinson_exact_for_diagonal_operator():
    d = jnp.array([1.5, -2.0, 3.25, 0.0, 7.0])
    est = hutchinson_trace(lambda v: d * v, 5, jax.random.key(0), num_probes=3)
    assert float(est.mean) == pytest.approx(float(jnp.sum(d)), abs=1e-14)
    assert float(est.stderr) == pytest.approx(0.0, abs=1e-14)


@pytest.mark.parametrize("method", ["hutchinson", "hutchpp"])
def test_hessian_trace_within_5_stderr(method):
    loss, params, h = attention_case()
    # num_probes=60 on n=47: Hutch++ deflates 20 directions and its stderr (of the Hutchinson
    # part on the residual, given the sketch) is the right yardstick for its conditional error
    est = jax.jit(lambda k: hessian_trace(loss, params, k, num_probes=60, method=method))(
        jax.random.key(8)
    )
    assert abs(est.mean - np.trace(h)) <= 5 * est.stderr
    assert est.stderr > 0


# --------------------------------------------------------------------------- Hutch++


def test_hutchpp_exact_when_sketch_spans_the_space():
    loss, params, h = attention_case()  # n = 47: 3 * 47 products make Q a full basis
    est = hutchpp_trace(hvp(loss, params), params, jax.random.key(9), num_matvecs=141)
    assert float(est.mean) == pytest.approx(np.trace(h), rel=1e-10)
    assert float(est.stderr) < 1e-10 * np.abs(h).max()
    assert est.num_samples == 141


def test_hutchpp_unbiased_and_beats_hutchinson_on_low_rank_plus_bulk():
    n = 60
    bulk = 0.05 * jax.random.normal(jax.random.key(10), (n - 4,))
    eigs = jnp.concatenate([jnp.array([40.0, 25.0, -20.0, 10.0]), 1.0 + bulk])
    a = random_symmetric(jax.random.key(11), eigs)
    exact = np.trace(a)
    mv = lambda v: jnp.asarray(a) @ v  # noqa: E731
    keys = jax.random.split(jax.random.key(12), 400)
    pp = jax.jit(jax.vmap(lambda k: hutchpp_trace(mv, n, k, num_matvecs=15).mean))(keys)
    hu = jax.jit(jax.vmap(lambda k: hutchinson_trace(mv, n, k, num_probes=15).mean))(keys)
    # unbiased: the mean over 400 independent keys is within 5 standard errors of the trace
    assert abs(np.mean(pp) - exact) <= 5 * np.std(pp, ddof=1) / np.sqrt(400)
    assert abs(np.mean(hu) - exact) <= 5 * np.std(hu, ddof=1) / np.sqrt(400)
    # Hutchinson's empirical spread matches its closed form, Hutch++'s is several times smaller
    assert abs(np.std(hu) / rademacher_se(a, 15) - 1) < 0.2
    assert np.median(np.abs(pp - exact)) * 5 < np.median(np.abs(hu - exact))


# --------------------------------------------------------------------------- Lanczos


def test_top_eigenvalues_exact_with_full_iterations(run):
    loss, params, h = attention_case()
    want = np.linalg.eigvalsh(h)[::-1][:3]
    got = run(
        lambda: top_eigenvalues(
            hvp(loss, params), params, jax.random.key(13), k=3, num_iterations=47
        )
    )
    assert got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * abs(want[0]))


def test_top_eigenvalues_converge_and_interlace():
    eigs = jnp.concatenate([jnp.array([50.0, 30.0, 20.0]), jnp.linspace(-1.0, 1.0, 197)])
    a = random_symmetric(jax.random.key(14), eigs)
    mv = lambda v: jnp.asarray(a) @ v  # noqa: E731
    few = top_eigenvalues(mv, 200, jax.random.key(15), k=3, num_iterations=8)
    more = top_eigenvalues(mv, 200, jax.random.key(15), k=3, num_iterations=30)
    np.testing.assert_allclose(more, [50.0, 30.0, 20.0], rtol=1e-9)
    assert np.all(np.asarray(few) <= np.array([50.0, 30.0, 20.0]) + 1e-9)  # Cauchy interlacing
    np.testing.assert_allclose(few, [50.0, 30.0, 20.0], rtol=1e-2)


def test_lanczos_moments_are_exact():
    """e1' T^p e1 ||v||^2 = v' A^p v for p <= 2k - 1 (Gauss quadrature exactness)."""
    _, _, h = attention_case()
    k = 6
    v = jax.random.normal(jax.random.key(16), (47,))
    tri, first = lanczos(lambda x: jnp.asarray(h) @ x, 47, jax.random.key(0), num_steps=k, start=v)
    assert float(first) == pytest.approx(float(jnp.linalg.norm(v)), rel=1e-12)
    np.testing.assert_allclose(tri, tri.T, atol=0)
    vn = np.asarray(v)
    for p in range(2 * k):
        want = vn @ np.linalg.matrix_power(h, p) @ vn
        got = np.linalg.matrix_power(np.asarray(tri), p)[0, 0] * float(first) ** 2
        assert got == pytest.approx(want, rel=1e-8, abs=1e-10 * np.abs(h).max() ** p * vn @ vn)


def test_lanczos_restarts_on_breakdown_and_keeps_spectrum():
    """Only 3 distinct eigenvalues: the Krylov space breaks down after 3 steps; restarts
    must still recover every eigenvalue with its multiplicity."""
    eigs = jnp.array([4.0, 4.0, 4.0, -1.0, -1.0, 2.0, 2.0, 2.0])
    a = random_symmetric(jax.random.key(17), eigs)
    tri, _ = lanczos(lambda v: jnp.asarray(a) @ v, 8, jax.random.key(18), num_steps=8)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(tri)), np.sort(eigs), atol=1e-10)


# --------------------------------------------------------------------------- SLQ


def test_slq_moments_within_5_stderr():
    loss, params, h = attention_case()
    n, num_probes = 47, 200
    mv = hvp(loss, params)
    nodes, weights = slq_nodes(mv, params, jax.random.key(19), num_probes=num_probes, num_steps=6)
    assert nodes.shape == weights.shape == (num_probes, 6)
    np.testing.assert_allclose(jnp.sum(weights, axis=1), 1.0, rtol=1e-12)
    for p in (1, 2, 3):
        per_probe = np.sum(np.asarray(weights) * np.asarray(nodes) ** p, axis=1)
        exact = np.trace(np.linalg.matrix_power(h, p)) / n
        stderr = np.std(per_probe, ddof=1) / np.sqrt(num_probes)
        assert abs(per_probe.mean() - exact) <= 5 * stderr, p
    # Ritz values lie inside the spectrum
    lam = np.linalg.eigvalsh(h)
    assert nodes.min() >= lam[0] - 1e-9
    assert nodes.max() <= lam[-1] + 1e-9


def test_spectral_density_integrates_to_one_and_has_the_trace_as_mean():
    loss, params, h = attention_case()
    grid, density = spectral_density(
        hvp(loss, params), params, jax.random.key(20), num_probes=100, num_steps=8, num_points=4001
    )
    assert grid.shape == density.shape == (4001,)
    assert np.all(np.asarray(density) >= 0)
    assert float(jnp.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-6)
    mean = float(jnp.trapezoid(grid * density, grid))
    nodes, weights = slq_nodes(
        hvp(loss, params), params, jax.random.key(20), num_probes=100, num_steps=8
    )
    per_probe = np.sum(np.asarray(weights * nodes), axis=1)
    assert mean == pytest.approx(per_probe.mean(), rel=1e-6)  # smoothing keeps the mean
    se = np.std(per_probe, ddof=1) / 10
    assert abs(mean - np.trace(h) / 47) <= 5 * se


def test_spectral_density_recovers_two_clusters():
    eigs = jnp.concatenate([jnp.full((30,), -2.0), jnp.full((10,), 5.0)])
    a = random_symmetric(
        jax.random.key(21), eigs + 0.01 * jax.random.normal(jax.random.key(22), (40,))
    )
    grid, density = spectral_density(
        lambda v: jnp.asarray(a) @ v,
        40,
        jax.random.key(23),
        num_probes=50,
        num_steps=20,
        bandwidth=0.2,
    )
    mass_low = float(jnp.trapezoid(jnp.where(grid < 1.5, density, 0.0), grid))
    assert mass_low == pytest.approx(0.75, abs=0.1)


# --------------------------------------------------------------------------- invariances


def flat_operator(loss, params):
    _, unravel = ravel_pytree(params)
    mv = hvp(loss, params)
    return lambda x: ravel_pytree(mv(unravel(x)))[0]


def test_pytree_and_flattened_operator_agree():
    loss, params = make_poly()
    mv, flat_mv, n = hvp(loss, params), flat_operator(loss, params), 18
    key = jax.random.key(24)
    a = hutchinson_trace(mv, params, key, num_probes=9)
    b = hutchinson_trace(flat_mv, n, key, num_probes=9)
    np.testing.assert_allclose([a.mean, a.stderr], [b.mean, b.stderr], rtol=1e-12)
    a = hutchpp_trace(mv, params, key, num_matvecs=12)
    b = hutchpp_trace(flat_mv, n, key, num_matvecs=12)
    np.testing.assert_allclose([a.mean, a.stderr], [b.mean, b.stderr], rtol=1e-10)
    np.testing.assert_allclose(
        top_eigenvalues(mv, params, key, k=2, num_iterations=10),
        top_eigenvalues(flat_mv, n, key, k=2, num_iterations=10),
        rtol=1e-12,
    )


def test_chunk_size_does_not_change_results_and_matches_a_loop():
    # a cheap pytree operator: the chunking, not the operator, is what is tested here
    dense_mv, like = make_dense_operator()
    flat_mv = lambda x: ravel_pytree(dense_mv(ravel_pytree(like)[1](x)))[0]  # noqa: E731
    key = jax.random.key(25)
    m = 10
    results = [
        hutchinson_trace(dense_mv, like, key, num_probes=m, chunk_size=c)
        for c in (None, 3, 64)  # sequential, chunks of 3 with a remainder, all at once
    ]
    keys = jax.random.split(key, m)
    looped = [
        float(jnp.vdot(v, flat_mv(v)))
        for v in (jax.random.rademacher(k, (17,), dtype=jnp.float64) for k in keys)
    ]
    for est in results:
        assert float(est.mean) == pytest.approx(np.mean(looped), rel=1e-12)
        assert float(est.stderr) == pytest.approx(np.std(looped, ddof=1) / np.sqrt(m), rel=1e-10)
    pp = [hutchpp_trace(dense_mv, like, key, num_matvecs=13, chunk_size=c).mean for c in (None, 5)]
    np.testing.assert_allclose(pp, pp[0], rtol=1e-11)
    sl = [
        slq_nodes(dense_mv, like, key, num_probes=5, num_steps=4, chunk_size=c)[1]
        for c in (None, 2)
    ]
    np.testing.assert_allclose(sl[0], sl[1], rtol=1e-10, atol=1e-14)


def test_float32_in_float32_out():
    loss, params = make_attention(jnp.float32)
    mv, key = hvp(loss, params), jax.random.key(26)
    est = hutchinson_trace(mv, params, key, num_probes=4)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    # the float32 estimate agrees with the float64 one for the same key
    loss64, params64 = make_attention()
    est64 = hutchinson_trace(hvp(loss64, params64), params64, key, num_probes=4)
    assert float(est.mean) == pytest.approx(float(est64.mean), rel=1e-4)
    # the other kernels on a float32 pytree operator
    mv32, like32 = make_dense_operator(jnp.float32)
    est = hutchpp_trace(mv32, like32, key, num_matvecs=6, chunk_size=2)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    assert top_eigenvalues(mv32, like32, key, k=2, num_iterations=5).dtype == jnp.float32
    grid, density = spectral_density(mv32, like32, key, num_probes=2, num_steps=3, num_points=8)
    assert grid.dtype == density.dtype == jnp.float32


def test_traced_once_for_new_keys_and_vmaps_over_keys():
    loss, params = make_poly()
    traces = []

    @jax.jit
    def estimate(p, key):
        traces.append(1)
        return hessian_trace(loss, p, key, num_probes=6)

    keys = jax.random.split(jax.random.key(27), 4)
    looped = [estimate(params, k) for k in keys]
    assert len(traces) == 1
    assert len({float(e.mean) for e in looped}) == 4  # new keys give new draws
    eager = hessian_trace(loss, params, keys[0], num_probes=6)
    np.testing.assert_allclose(
        [eager.mean, eager.stderr], [looped[0].mean, looped[0].stderr], rtol=1e-12
    )
    vm = jax.vmap(functools.partial(hutchinson_trace, hvp(loss, params), params, num_probes=6))(
        keys
    )
    np.testing.assert_allclose(vm.mean, [e.mean for e in looped], rtol=1e-12)
    np.testing.assert_allclose(vm.stderr, [e.stderr for e in looped], rtol=1e-10)
    tops = jax.vmap(
        lambda k: top_eigenvalues(hvp(loss, params), params, k, k=2, num_iterations=18)
    )(keys)
    np.testing.assert_allclose(tops, jnp.broadcast_to(tops[0], tops.shape), rtol=1e-9)


def test_bad_arguments_raise_naming_the_argument():
    loss, params = make_poly()
    mv, key = hvp(loss, params), jax.random.key(0)
    cases = [
        ("num_probes", lambda: hutchinson_trace(mv, params, key, num_probes=1)),
        ("num_probes", lambda: hessian_trace(loss, params, key, num_probes=1)),
        ("num_probes", lambda: hessian_trace(loss, params, key, num_probes=3, method="hutchpp")),
        ("num_probes", lambda: slq_nodes(mv, params, key, num_probes=0, num_steps=2)),
        ("num_matvecs", lambda: hutchpp_trace(mv, params, key, num_matvecs=3)),
        ("probe", lambda: hutchinson_trace(mv, params, key, num_probes=4, probe="normal")),
        ("method", lambda: hessian_trace(loss, params, key, num_probes=4, method="exact")),
        ("chunk_size", lambda: hutchinson_trace(mv, params, key, num_probes=4, chunk_size=0)),
        ("chunk_size", lambda: hutchpp_trace(mv, params, key, num_matvecs=6, chunk_size=-1)),
        ("k", lambda: top_eigenvalues(mv, params, key, k=19, num_iterations=19)),
        ("k", lambda: top_eigenvalues(mv, params, key, k=0, num_iterations=5)),
        ("num_iterations", lambda: top_eigenvalues(mv, params, key, k=3, num_iterations=2)),
        ("num_steps", lambda: slq_nodes(mv, params, key, num_probes=2, num_steps=19)),
        ("num_steps", lambda: lanczos(mv, params, key, num_steps=0)),
        ("start", lambda: lanczos(mv, params, key, num_steps=2, start=jnp.ones(17))),
        ("params", lambda: hvp(loss, {**params, "w": params["w"].at[0, 0].set(jnp.nan)})),
        (
            "params",
            lambda: hessian_trace(
                loss, jax.tree_util.tree_map(lambda x: x + jnp.inf, params), key, num_probes=2
            ),
        ),
        ("loss_fn", lambda: hvp(lambda p: p["w"] ** 2, params)),
        (
            "loss_fn",
            lambda: hessian_trace(lambda p: jnp.sum(p["w"], axis=0), params, key, num_probes=2),
        ),
        ("like", lambda: hutchinson_trace(lambda v: v, jnp.arange(3), key, num_probes=2)),
        ("like", lambda: hutchinson_trace(lambda v: v, 0, key, num_probes=2)),
        (
            "num_points",
            lambda: spectral_density(mv, params, key, num_probes=2, num_steps=2, num_points=1),
        ),
        (
            "bandwidth",
            lambda: spectral_density(mv, params, key, num_probes=2, num_steps=2, bandwidth=0.0),
        ),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


# --------------------------------------------------------------------------- sharding


def make_dense_operator(dtype=jnp.float64):
    """A fixed symmetric 17 x 17 operator on a two-leaf pytree (cheap to compile)."""
    like = {"a": jnp.zeros((3, 4), dtype), "b": jnp.zeros((5,), dtype)}
    _, unravel = ravel_pytree(like)
    a = random_symmetric(jax.random.key(29), jnp.linspace(-3.0, 5.0, 17)).astype(dtype)

    def matvec(v):
        return unravel(jnp.asarray(a) @ ravel_pytree(v)[0])

    return matvec, like


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[1])
    from tests.kernels import test_curvature as t
    from kernels.curvature import hutchinson_trace, hvp
    assert len(jax.devices()) == 4, jax.devices()
    if sys.argv[2] == "attention":
        loss, params = t.make_attention()
        matvec, like = hvp(loss, params), params
    else:
        matvec, like = t.make_dense_operator()
    key = jax.random.key(28)
    out = {}
    for m, chunk in ((10, None), (10, 3)):  # 10 probes on 4 devices: padding
        est = hutchinson_trace(matvec, like, key, num_probes=m, chunk_size=chunk)
        out[f"{m}-{chunk}"] = [float(est.mean), float(est.stderr)]
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("operator", ["dense", pytest.param("attention", marks=pytest.mark.slow)])
def test_sharded_equals_single_device(operator):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
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
    if operator == "attention":
        loss, params = make_attention()
        matvec, like = hvp(loss, params), params
    else:
        matvec, like = make_dense_operator()
    key = jax.random.key(28)
    for m, chunk in ((10, None), (10, 3)):
        est = hutchinson_trace(matvec, like, key, num_probes=m, chunk_size=chunk)
        np.testing.assert_allclose(sharded[f"{m}-{chunk}"], [est.mean, est.stderr], rtol=1e-12)
