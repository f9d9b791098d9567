"""Tests of kernels.sharpness against closed forms, dense trust-region solutions and enumeration."""

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
from kernels.sharpness import (
    Perturbation,
    PerturbedTraces,
    SigmaSearch,
    WorstCase,
    average_sharpness,
    perturbed_hessian_traces,
    sharpness_decomposition,
    sigma_search,
    worst_case_sharpness,
)
from tests.helpers import TraceCounter, compiles_in, count_compiles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quad_loss(w, batch):
    """0.5 w.A w + b.w with (A, b) passed as the batch."""
    a, b = batch
    return 0.5 * w @ (a @ w) + b @ w


def quadratic(n=6, seed=0, psd=True):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(n, n))
    a = m @ m.T / n + 0.5 * np.eye(n) if psd else (m + m.T) / 2
    b = rng.normal(size=n)
    theta = rng.normal(size=n)
    return (jnp.asarray(a), jnp.asarray(b)), a, b, theta


def trust_region_max(g, a, radius):
    """max_{||u|| <= r} g.u + u.A u / 2 for symmetric A (not the hard case), densely."""
    lam, vec = np.linalg.eigh(a)
    c = vec.T @ g

    def norm(mu):  # u(mu) = (mu I - A)^{-1} g, mu > lam_max
        return np.linalg.norm(c / (mu - lam))

    lo = max(lam[-1], 0.0) + 1e-14
    if lam[-1] <= 0 and norm(lo) <= radius:  # concave, interior maximiser
        u = -np.linalg.solve(a, g)
        return g @ u + 0.5 * u @ a @ u
    hi = lam[-1] + np.linalg.norm(g) / radius + 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if norm(mid) > radius else (lo, mid)
    u = vec @ (c / (0.5 * (lo + hi) - lam))
    return g @ u + 0.5 * u @ a @ u


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"][None, :])
    return (h @ params["w2"])[..., 0] + params["b2"][0]


def mlp_loss(params, batch):
    x, y = batch
    return jnp.mean((mlp(params, x) - y) ** 2)


def mlp_params(key, d_in=3, width=5, dtype=jnp.float64):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (d_in, width), dtype) / np.sqrt(d_in),
        "b1": 0.1 * jax.random.normal(k2, (width,), dtype),
        "w2": jax.random.normal(k3, (width, 1), dtype) / np.sqrt(width),
        "b2": jnp.zeros((1,), dtype),
    }


# ----------------------------------------------------------------------------------------------
# average sharpness


@pytest.mark.parametrize("antithetic", [True, False])
def test_average_sharpness_quadratic_gaussian(run, antithetic):
    batch, a, b, theta = quadratic()
    sigma, k = 0.3, 2000
    est = run(
        lambda: average_sharpness(
            quad_loss,
            jnp.asarray(theta),
            batch,
            jax.random.key(1),
            perturbation=Perturbation("gaussian", sigma),
            num_samples=k,
            antithetic=antithetic,
        )
    )
    exact = 0.5 * sigma**2 * np.trace(a)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)
    assert est.num_samples == k
    assert est.num_evaluations == (2 * k if antithetic else None)
    # closed-form standard error: Var(u.Au/2) = sigma^4 ||A||_F^2 / 2, Var(g.u) = sigma^2 ||g||^2;
    # a pair mean of a quadratic is exactly u.Au/2
    quad_var = sigma**4 * np.sum(a**2) / 2
    g = a @ theta + b
    closed = np.sqrt((quad_var if antithetic else sigma**2 * g @ g + quad_var) / k)
    assert abs(float(est.stderr) / closed - 1) < 0.2


@pytest.mark.parametrize(("kind", "second_moment"), [("l2_ball", 1 / 8), ("linf_ball", 1 / 3)])
def test_average_sharpness_quadratic_balls(kind, second_moment):
    # uniform in the l2 ball of R^6: E u u^T = r^2 / (n + 2) I; in the cube: r^2 / 3 I
    batch, a, _, theta = quadratic()
    radius = 0.5
    est = average_sharpness(
        quad_loss,
        jnp.asarray(theta),
        batch,
        jax.random.key(2),
        perturbation=Perturbation(kind, radius),
        num_samples=2000,
    )
    exact = 0.5 * radius**2 * second_moment * np.trace(a)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)
    assert float(est.stderr) < 0.05 * exact


def test_average_sharpness_adaptive_and_masked_quadratic():
    batch, a, _, theta = quadratic()
    sigma = 0.2
    mask = np.array([True, False, True, True, False, True])
    s = np.abs(theta) * mask
    est = average_sharpness(
        lambda p, batch: quad_loss(p["w"], batch),
        {"w": jnp.asarray(theta)},
        batch,
        jax.random.key(3),
        perturbation=Perturbation("gaussian", sigma, adaptive=True, mask={"w": jnp.asarray(mask)}),
        num_samples=2000,
    )
    exact = 0.5 * sigma**2 * np.sum(np.diag(a) * s**2)  # E u u^T = sigma^2 diag(s^2)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)


def test_average_sharpness_chunk_invariant_and_key_dependent():
    batch, _, _, theta = quadratic()
    kwargs = {"perturbation": Perturbation("gaussian", 0.1), "num_samples": 10}
    ref = average_sharpness(quad_loss, jnp.asarray(theta), batch, jax.random.key(0), **kwargs)
    for chunk in (1, 3, 100):
        other = average_sharpness(
            quad_loss, jnp.asarray(theta), batch, jax.random.key(0), chunk_size=chunk, **kwargs
        )
        np.testing.assert_allclose(other.mean, ref.mean, rtol=1e-12)
        np.testing.assert_allclose(other.stderr, ref.stderr, rtol=1e-10)
    new = average_sharpness(quad_loss, jnp.asarray(theta), batch, jax.random.key(1), **kwargs)
    assert float(new.mean) != float(ref.mean)


def test_float32_in_float32_out():
    batch, _, _, theta = quadratic()
    batch32 = tuple(x.astype(jnp.float32) for x in batch)
    theta32 = jnp.asarray(theta, jnp.float32)
    est = average_sharpness(
        quad_loss,
        theta32,
        batch32,
        jax.random.key(0),
        perturbation=Perturbation("gaussian", 0.1),
        num_samples=8,
    )
    assert est.mean.dtype == jnp.float32
    assert est.stderr.dtype == jnp.float32
    res = worst_case_sharpness(
        quad_loss,
        theta32,
        batch32,
        jax.random.key(0),
        perturbation=Perturbation("l2_ball", 0.1),
        num_steps=3,
    )
    assert res.value.dtype == jnp.float32
    assert res.u.dtype == jnp.float32


# ----------------------------------------------------------------------------------------------
# worst case


@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_l2_matches_trust_region(adaptive):
    batch, a, b, theta = quadratic(n=5, seed=4, psd=False)
    radius = 0.7
    s = np.abs(theta) if adaptive else np.ones_like(theta)
    # in eta coordinates: max g's.eta + eta.(S A S) eta / 2 over ||eta|| <= r
    exact = trust_region_max(s * (a @ theta + b), s[:, None] * a * s[None, :], radius)
    res = jax.jit(
        lambda: worst_case_sharpness(
            quad_loss,
            jnp.asarray(theta),
            batch,
            jax.random.key(0),
            perturbation=Perturbation("l2_ball", radius, adaptive=adaptive),
            num_steps=200,
            num_restarts=3,
        )
    )()
    assert isinstance(res, WorstCase)
    u = np.asarray(res.u)
    assert np.linalg.norm(u / s) <= radius * (1 + 1e-12)
    np.testing.assert_allclose(
        float(quad_loss(jnp.asarray(theta + u), batch) - quad_loss(jnp.asarray(theta), batch)),
        float(res.value),
        rtol=1e-12,
    )
    assert float(res.value) <= exact * (1 + 1e-12)
    np.testing.assert_allclose(float(res.value), exact, rtol=1e-6)


@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_linf_matches_vertex_enumeration(adaptive):
    # convex quadratic: the max over a box is attained at a vertex, so enumerate all 2^n
    batch, a, b, theta = quadratic(n=5, seed=5)
    radius = 0.3
    s = np.abs(theta) if adaptive else np.ones_like(theta)
    g = a @ theta + b
    exact = max(
        g @ (u := radius * s * np.array(signs)) + 0.5 * u @ a @ u
        for signs in itertools.product([-1.0, 1.0], repeat=5)
    )
    res = worst_case_sharpness(
        quad_loss,
        jnp.asarray(theta),
        batch,
        jax.random.key(1),
        perturbation=Perturbation("linf_ball", radius, adaptive=adaptive),
        num_steps=100,
        num_restarts=4,
    )
    assert np.all(np.abs(np.asarray(res.u)) <= radius * s * (1 + 1e-12))
    np.testing.assert_allclose(float(res.value), exact, rtol=1e-9)


def test_worst_case_mask_leaves_other_groups_unperturbed():
    params = mlp_params(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (16, 3), jnp.float64)
    res = worst_case_sharpness(
        mlp_loss,
        params,
        (x, jnp.zeros(16)),
        jax.random.key(2),
        perturbation=Perturbation("l2_ball", 0.1, mask=lambda path, leaf: "w1" in path),
        num_steps=10,
    )
    assert float(res.value) > 0
    assert float(jnp.linalg.norm(res.u["w1"])) == pytest.approx(0.1, rel=1e-9)
    for name in ("b1", "w2", "b2"):
        assert not np.any(np.asarray(res.u[name]))


# ----------------------------------------------------------------------------------------------
# Theorem 6/12 decomposition


def exp_loss(w, a):
    return jnp.sum(jnp.exp(a * w))


def test_decomposition_matches_closed_form_exponential():
    # L(w) = sum exp(a w): E L(theta+u) = sum e^{a theta} e^{a^2 sigma^2 / 2}, H diagonal,
    # P = sum e^{a theta} (e^{a^2 sigma^2/2} - 1 - a^2 sigma^2/2) exactly.
    a = jnp.linspace(-1.5, 2.0, 8)
    theta = jnp.linspace(0.3, -0.4, 8)
    decompose = jax.jit(  # sigma traced: one compilation for the three sigmas
        lambda sigma: sharpness_decomposition(
            exp_loss,
            theta,
            a,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", sigma),
            num_samples=512,
            num_probes=4,
        )
    )
    ratios = []
    for sigma in (0.2, 0.1, 0.05):
        dec = decompose(sigma)
        e = np.exp(np.asarray(a * theta))
        a2s2 = np.asarray(a) ** 2 * sigma**2
        avg_exact = np.sum(e * (np.exp(a2s2 / 2) - 1))
        trace_exact = np.sum(e * a2s2 / 2)
        p_exact = avg_exact - trace_exact
        # diagonal Hessian: Rademacher Hutchinson is exact
        np.testing.assert_allclose(float(dec.trace_term.mean), trace_exact, rtol=1e-12)
        assert abs(float(dec.average.mean) - avg_exact) <= 5 * float(dec.average.stderr)
        assert abs(float(dec.remainder.mean) - p_exact) <= 5 * float(dec.remainder.stderr)
        assert float(dec.remainder.stderr) < 0.1 * p_exact
        assert dec.average.num_samples == 512
        assert dec.average.num_evaluations == 1024
        assert dec.trace_term.num_samples == 4
        ratios.append(float(dec.remainder.mean) / float(dec.trace_term.mean))
    # P / trace term = O(sigma^2) here (odd orders vanish): halving sigma divides it by ~4
    assert 3.0 < ratios[0] / ratios[1] < 5.0
    assert 3.0 < ratios[1] / ratios[2] < 5.0


def test_decomposition_adaptive_masked_trace_term_exact():
    # diagonal Hessian: the trace term is (sigma^2 / 2) sum_i s_i^2 H_ii exactly
    a = jnp.linspace(-1.5, 2.0, 6)
    theta = jnp.linspace(0.3, -0.4, 6)
    mask = np.array([True, True, False, True, False, True])
    sigma = 0.1
    dec = sharpness_decomposition(
        exp_loss,
        theta,
        a,
        jax.random.key(1),
        perturbation=Perturbation("gaussian", sigma, adaptive=True, mask=jnp.asarray(mask)),
        num_samples=256,
        num_probes=2,
    )
    s2 = np.asarray(theta) ** 2 * mask
    h = np.asarray(a**2 * jnp.exp(a * theta))
    np.testing.assert_allclose(float(dec.trace_term.mean), 0.5 * sigma**2 * np.sum(s2 * h), 1e-12)
    a2s2 = np.asarray(a) ** 2 * sigma**2 * s2
    avg_exact = np.sum(np.exp(np.asarray(a * theta)) * (np.exp(a2s2 / 2) - 1))
    assert abs(float(dec.average.mean) - avg_exact) <= 5 * float(dec.average.stderr)


def test_decomposition_small_network_scaling():
    params = mlp_params(jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (32, 3), jnp.float64)
    y = jnp.sin(x[:, 0]) + 0.5 * x[:, 1]
    decompose = jax.jit(
        lambda sigma: sharpness_decomposition(
            mlp_loss,
            params,
            (x, y),
            jax.random.key(5),
            perturbation=Perturbation("gaussian", sigma),
            num_samples=256,
            num_probes=64,
        )
    )
    rel = []
    for sigma in (0.08, 0.04, 0.02):
        dec = decompose(sigma)
        total = dec.trace_term.mean + dec.remainder.mean
        se = np.hypot(float(dec.trace_term.stderr), float(dec.remainder.stderr))
        se = np.hypot(se, float(dec.average.stderr))
        assert abs(float(dec.average.mean) - float(total)) <= 5 * se
        rel.append(abs(float(dec.remainder.mean)) / float(dec.trace_term.mean))
    # P is O(sigma^3) relative to sigma^2 tr H / 2: the ratio shrinks at least linearly in sigma
    assert rel[0] < 0.2
    assert rel[1] <= 0.6 * rel[0]
    assert rel[2] <= 0.6 * rel[1]


@pytest.mark.slow
def test_interpolator_trace_equals_twice_gradient_norm():
    # SPEC Theorem 13: at an interpolator of the quadratic loss, tr H = (2/m) sum ||grad f(x_i)||^2
    params = mlp_params(jax.random.key(6))
    x = jax.random.normal(jax.random.key(7), (4, 3), jnp.float64)
    y = mlp(params, x)  # interpolated targets
    grads = jax.vmap(
        lambda xi: ravel_pytree(jax.grad(lambda p: mlp(p, xi[None, :])[0])(params))[0]
    )(x)
    rhs = 2 * float(jnp.mean(jnp.sum(grads**2, axis=1)))
    flat, unravel = ravel_pytree(params)
    dense = float(jnp.trace(jax.hessian(lambda f: mlp_loss(unravel(f), (x, y)))(flat)))
    np.testing.assert_allclose(dense, rhs, rtol=1e-10)
    # the decomposition's trace term is (sigma^2 / 2) x Hutchinson's tr H
    sigma = 0.01
    dec = sharpness_decomposition(
        mlp_loss,
        params,
        (x, y),
        jax.random.key(8),
        perturbation=Perturbation("gaussian", sigma),
        num_samples=4,
        num_probes=200,
    )
    trace = float(dec.trace_term.mean) / (0.5 * sigma**2)
    stderr = float(dec.trace_term.stderr) / (0.5 * sigma**2)
    assert abs(trace - rhs) <= 5 * stderr
    assert stderr < 0.1 * rhs


# ----------------------------------------------------------------------------------------------
# traces at perturbed points


def test_perturbed_hessian_traces_exponential():
    a = jnp.linspace(-1.0, 1.5, 6)
    theta = jnp.linspace(0.2, -0.2, 6)
    sigma = 0.3
    kwargs = {"perturbation": Perturbation("gaussian", sigma), "num_samples": 100, "num_probes": 2}
    res = perturbed_hessian_traces(exp_loss, theta, a, jax.random.key(0), **kwargs)
    assert isinstance(res, PerturbedTraces)
    assert res.traces.mean.shape == (100,)
    # diagonal Hessian: every Hutchinson estimate is exact, so its probe error is zero
    np.testing.assert_array_equal(res.traces.stderr, np.zeros(100))
    exact = float(jnp.sum(a**2 * jnp.exp(a * theta + a**2 * sigma**2 / 2)))  # E tr H(theta+u)
    assert abs(float(res.average.mean) - exact) <= 5 * float(res.average.stderr)
    np.testing.assert_allclose(
        float(res.average.stderr), float(jnp.std(res.traces.mean, ddof=1)) / 10, rtol=1e-12
    )
    assert (res.average.num_samples, res.average.num_evaluations) == (100, 200)
    again = perturbed_hessian_traces(exp_loss, theta, a, jax.random.key(0), chunk_size=7, **kwargs)
    np.testing.assert_allclose(again.traces.mean, res.traces.mean, rtol=1e-12)


def test_perturbed_hessian_traces_probe_error_dense_quadratic():
    # constant Hessian A: every perturbation gives an unbiased estimate of tr A with its own
    # Hutchinson error; the probe stderr matches the closed form sqrt(2 sum_{i!=j} A_ij^2 / m)
    batch, a, _, theta = quadratic(n=6, seed=2)
    res = perturbed_hessian_traces(
        quad_loss,
        jnp.asarray(theta),
        batch,
        jax.random.key(3),
        perturbation=Perturbation("l2_ball", 0.5),
        num_samples=200,
        num_probes=50,
    )
    closed = np.sqrt(2 * (np.sum(a**2) - np.sum(np.diag(a) ** 2)) / 50)
    assert abs(float(jnp.mean(res.traces.stderr)) / closed - 1) < 0.2
    assert abs(float(res.average.mean) - np.trace(a)) <= 5 * float(res.average.stderr)


# ----------------------------------------------------------------------------------------------
# adaptive invariance


def relu_loss(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
    return jnp.mean((h @ params["w2"] + params["b2"][None, :] - y) ** 2)


@pytest.mark.slow
def test_adaptive_sharpness_invariant_to_relu_rescaling():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(9), 4)
    params = {
        "w1": jax.random.normal(k1, (4, 8), jnp.float64),
        "b1": jax.random.normal(k2, (8,), jnp.float64),
        "w2": jax.random.normal(k3, (8, 2), jnp.float64),
        "b2": jnp.array([0.1, -0.2]),
    }
    x = jax.random.normal(k4, (32, 4), jnp.float64)
    batch = (x, jnp.sin(x[:, :2]))
    c = 7.0
    scaled = {**params, "w1": c * params["w1"], "b1": c * params["b1"], "w2": params["w2"] / c}
    np.testing.assert_allclose(relu_loss(scaled, batch), relu_loss(params, batch), rtol=1e-12)

    def avg(p, adaptive):
        return average_sharpness(
            relu_loss,
            p,
            batch,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 0.1, adaptive=adaptive),
            num_samples=32,
        ).mean

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def worst(p, adaptive, kind):
        return worst_case_sharpness(
            relu_loss,
            p,
            batch,
            jax.random.key(1),
            perturbation=Perturbation(kind, 0.05, adaptive=adaptive),
            num_steps=10,
        ).value

    np.testing.assert_allclose(avg(scaled, True), avg(params, True), rtol=1e-9)
    np.testing.assert_allclose(
        worst(scaled, True, "l2_ball"), worst(params, True, "l2_ball"), rtol=1e-9
    )
    np.testing.assert_allclose(
        worst(scaled, True, "linf_ball"), worst(params, True, "linf_ball"), rtol=1e-9
    )
    # the plain (non-adaptive) measure is not invariant: the test can fail
    assert abs(float(avg(scaled, False)) / float(avg(params, False)) - 1) > 0.1


# ----------------------------------------------------------------------------------------------
# sigma search


def test_sigma_search_quadratic():
    # the antithetic increase of a quadratic is exactly c * sigma^2 for the shared draws
    batch, _, _, theta = quadratic()
    search = jax.jit(
        lambda target: sigma_search(
            quad_loss,
            jnp.asarray(theta),
            batch,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 1.0),
            target_increase=target,
            num_samples=32,
            num_steps=40,
        )
    )
    target = 0.05
    res = search(target)
    assert isinstance(res, SigmaSearch)
    c = float(
        average_sharpness(
            quad_loss,
            jnp.asarray(theta),
            batch,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 1.0),
            num_samples=32,
        ).mean
    )
    np.testing.assert_allclose(float(res.sigma), np.sqrt(target / c), rtol=1e-8)
    np.testing.assert_allclose(float(res.increase.mean), target, rtol=1e-7)
    assert bool(res.bracketed)
    assert float(res.increase.mean) <= target
    assert (res.increase.num_samples, res.increase.num_evaluations) == (32, 64)
    # a target beyond the bracket returns its end, flagged
    far = search(1e6)
    assert float(far.sigma) == 1.0
    assert not bool(far.bracketed)


# ----------------------------------------------------------------------------------------------
# the Perturbation pytree


def test_perturbation_is_a_pytree_with_a_traced_scale():
    mask = {"w": True}
    pert = Perturbation("gaussian", 0.1, adaptive=True, mask=mask)
    leaves, treedef = jax.tree_util.tree_flatten(pert)
    assert leaves == [0.1]
    # kind, adaptive and mask are static: equal specs share a tree structure (and a compile)
    same = Perturbation("gaussian", 0.3, adaptive=True, mask={"w": True})
    assert jax.tree_util.tree_structure(same) == treedef
    assert hash(jax.tree_util.tree_structure(same)) == hash(treedef)
    other = Perturbation("gaussian", 0.3, adaptive=True, mask={"w": False})
    assert jax.tree_util.tree_structure(other) != treedef
    fn = lambda path, leaf: True  # noqa: E731
    assert Perturbation("l2_ball", 1.0, mask=fn).mask is fn
    doubled = jax.jit(lambda p: dataclasses_replace_scale(p, 2 * p.scale))(pert)
    assert float(doubled.scale) == pytest.approx(0.2)
    assert doubled.mask == pert.mask


def dataclasses_replace_scale(pert, scale):
    return Perturbation(pert.kind, scale, pert.adaptive, pert.mask)


def test_vmap_over_sigma_equals_loop():
    batch, _, _, theta = quadratic()
    sigmas = jnp.array([0.05, 0.1, 0.2])

    def mean(sigma):
        return average_sharpness(
            quad_loss,
            jnp.asarray(theta),
            batch,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", sigma),
            num_samples=8,
        ).mean

    batched = jax.vmap(mean)(sigmas)
    looped = [mean(s) for s in sigmas]
    np.testing.assert_allclose(batched, looped, rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# compile once, trace once


def weighted_sq(w, batch):
    return 0.5 * jnp.sum(batch * w**2) + jnp.sum(jnp.sin(w))


KERNELS = ("average", "decomposition", "traces", "worst", "sigma")


def call_kernel(name, loss_fn, params, batch, key, scale=0.1, **options):
    """One call of each public kernel with small sizes (``options`` override them)."""
    kernel, kind, sizes = {
        "average": (average_sharpness, "gaussian", {"num_samples": 4}),
        "decomposition": (sharpness_decomposition, "gaussian", {"num_samples": 4, "num_probes": 2}),
        "traces": (perturbed_hessian_traces, "gaussian", {"num_samples": 3, "num_probes": 2}),
        "worst": (worst_case_sharpness, "l2_ball", {"num_steps": 3, "num_restarts": 2}),
        "sigma": (sigma_search, "gaussian", {"num_samples": 4, "num_steps": 4}),
    }[name]
    if name == "sigma":  # the perturbation's scale is the largest sigma searched
        sizes = {**sizes, "target_increase": 1e-3}
        scale = 10 * scale
    pert = Perturbation(kind, scale)
    return kernel(loss_fn, params, batch, key, perturbation=pert, **(sizes | options))


def headline(name, result):
    """The scalar a user reads first from each kernel's result."""
    return {
        "average": lambda r: r.mean,
        "decomposition": lambda r: r.average.mean,
        "traces": lambda r: r.average.mean,
        "worst": lambda r: r.value,
        "sigma": lambda r: r.increase.mean,
    }[name](result)


@pytest.mark.parametrize("name", KERNELS)
def test_second_call_with_new_data_compiles_nothing(name):
    rng = np.random.default_rng(11)
    data = [
        (jnp.asarray(rng.normal(size=4)), jnp.asarray(rng.uniform(1, 2, size=4)), jax.random.key(i))
        for i in range(2)
    ]
    loss_fn = TraceCounter(weighted_sq)
    first = call_kernel(name, loss_fn, *data[0])
    jax.block_until_ready(first)
    assert loss_fn.count == 1  # the algorithm needs one trace; no validation traces
    with count_compiles() as messages:
        second = call_kernel(name, loss_fn, *data[1])
        jax.block_until_ready(second)
    assert loss_fn.count == 1
    assert compiles_in(messages) == []
    assert np.isfinite(float(headline(name, second)))
    assert float(headline(name, second)) != float(headline(name, first))


def test_equal_tree_masks_compile_once():
    batch, _, _, theta = quadratic()
    params = {"w": jnp.asarray(theta), "v": jnp.asarray(theta)}
    loss_fn = TraceCounter(lambda p, b: quad_loss(p["w"], b) + quad_loss(p["v"], b))
    keys = jax.random.key(0), jax.random.key(1)

    def call(key):
        pert = Perturbation("gaussian", 0.1, mask={"w": True, "v": False})  # a new dict each time
        return average_sharpness(loss_fn, params, batch, key, perturbation=pert, num_samples=4)

    jax.block_until_ready(call(keys[0]))
    with count_compiles() as messages:
        jax.block_until_ready(call(keys[1]))
    assert loss_fn.count == 1
    assert compiles_in(messages) == []


# ----------------------------------------------------------------------------------------------
# runtime checks: eagerly (ValueError) and inside jax.jit (runtime error), and the switch


THETA = np.array([0.3, -0.2, 0.5, 0.1])
WEIGHTS = np.array([1.0, 2.0, 1.5, 0.5])


def expect_failure(mode, match):
    """pytest.raises for an eager ValueError or a runtime error inside jax.jit."""
    if mode == "eager":
        return pytest.raises(ValueError, match=match)
    return pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: .*" + match)


def run_mode(mode, body, *args):
    fn = body if mode == "eager" else jax.jit(body)
    return jax.block_until_ready(fn(*args))


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("name", KERNELS)
def test_nan_params_raise(name, mode):
    params = jnp.asarray(THETA).at[1].set(jnp.nan)
    with expect_failure(mode, "params: expected finite"):
        run_mode(
            mode,
            lambda p: call_kernel(name, weighted_sq, p, jnp.asarray(WEIGHTS), jax.random.key(0)),
            params,
        )


@pytest.mark.parametrize("name", KERNELS)
def test_traced_nonpositive_scale_raises(name):
    body = lambda s: call_kernel(  # noqa: E731
        name, weighted_sq, jnp.asarray(THETA), jnp.asarray(WEIGHTS), jax.random.key(0), scale=s
    )
    with expect_failure("jit", r"perturbation\.scale \((sigma|radius)\): expected a finite"):
        run_mode("jit", body, -1.0)
    with expect_failure("jit", r"perturbation\.scale"):
        run_mode("jit", body, jnp.nan)
    # a concrete scale is refused when the spec is built
    with pytest.raises(ValueError, match=r"perturbation\.scale \(sigma\)"):
        Perturbation("gaussian", jnp.asarray(-1.0))
    with pytest.raises(ValueError, match=r"perturbation\.scale \(radius\)"):
        Perturbation("l2_ball", 0.0)


def nan_off_theta(w, theta):
    """Finite (sum w^2) at w = theta only, NaN at every other point."""
    return jnp.where(jnp.all(w == theta), jnp.sum(w**2), jnp.nan)


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("average", "4 of the 4 antithetic pairs"),
        ("decomposition", "4 of the 4 antithetic pairs"),
        ("traces", "3 of the 3 perturbed points"),
        ("worst", "8 of the 8 ascent points"),
        ("sigma", "4 of the 4 antithetic pairs at the returned sigma"),
    ],
)
def test_nonfinite_at_perturbed_points_raises_with_count(name, count, mode):
    theta = jnp.asarray(THETA)
    with expect_failure(mode, "loss_fn: non-finite at " + count):
        run_mode(mode, lambda p: call_kernel(name, nan_off_theta, p, p, jax.random.key(0)), theta)


def test_nonfinite_count_of_some_pairs():
    def loss(w, batch):  # NaN where w_0 < -0.5
        return jnp.sum(w**2) + jnp.sqrt(w[0] + 0.5)

    with pytest.raises(ValueError, match=r"non-finite at (\d+) of the 64 antithetic") as info:
        average_sharpness(
            loss,
            jnp.zeros(3),
            (),
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 0.3),
            num_samples=64,
        )
    bad = int(str(info.value).split("non-finite at ")[1].split()[0])
    assert 0 < bad < 64


@pytest.mark.parametrize("name", ["average", "decomposition", "worst", "sigma"])
def test_nonfinite_loss_at_params_raises(name):
    def loss(w, batch):
        return jnp.log(-jnp.sum(w**2))

    with expect_failure("eager", "loss_fn: expected a finite loss at params"):
        call_kernel(name, loss, jnp.asarray(THETA), (), jax.random.key(0))


@pytest.mark.parametrize("name", KERNELS)
def test_runtime_checks_switch_lets_nan_through(name):
    params = jnp.asarray(THETA).at[1].set(jnp.nan)
    with runtime_checks(False):
        out = call_kernel(name, weighted_sq, params, jnp.asarray(WEIGHTS), jax.random.key(0))
        inside = jax.jit(
            lambda p: headline(
                name, call_kernel(name, weighted_sq, p, jnp.asarray(WEIGHTS), jax.random.key(0))
            )
        )(params)
    assert np.isnan(float(headline(name, out)))
    assert np.isnan(float(inside))
    with pytest.raises(ValueError, match="params"):  # and back on after the block
        call_kernel(name, weighted_sq, params, jnp.asarray(WEIGHTS), jax.random.key(0))


# ----------------------------------------------------------------------------------------------
# bad inputs (static checks)


@pytest.mark.parametrize("name", KERNELS)
def test_bad_inputs_raise_naming_the_argument(name):
    theta, batch, key = jnp.asarray(THETA), jnp.asarray(WEIGHTS), jax.random.key(0)

    def total(p, b):
        return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(p))

    cases = [
        ("key: expected a PRNG key", weighted_sq, theta, batch, 0),
        ("key: expected one PRNG key", weighted_sq, theta, batch, jax.random.split(key, 2)),
        (
            "params: expected float16, bfloat16, float32 or float64 leaves, got int",
            total,
            jnp.arange(4),
            (),
            key,
        ),
        ("params: expected at least one parameter array", total, {}, (), key),
        ("params: expected at least one parameter entry", total, jnp.zeros((0,)), (), key),
        ("params: expected one float dtype", total, (theta, theta.astype(jnp.float32)), (), key),
        ("loss_fn: must return a real floating scalar", lambda w, b: w, theta, (), key),
    ]
    for match, loss_fn, params, data, k in cases:
        with pytest.raises(ValueError, match=match):
            call_kernel(name, loss_fn, params, data, k)
    for bad in ("float8", jnp.int32, 3, float("nan")):
        with pytest.raises(ValueError, match="compute_dtype: expected None, 'params'"):
            call_kernel(name, total, theta, (), key, compute_dtype=bad)
    # half-precision parameters are accepted (worked on in float32); a loss difference
    # evaluated in half precision is refused, with the reason
    for half in (jnp.float16, jnp.bfloat16):
        if name != "traces":
            with pytest.raises(ValueError, match=r"compute_dtype: .* evaluates L.θ\+u. - L.θ."):
                call_kernel(name, total, theta.astype(half), (), key, compute_dtype="params")
    if name == "worst":
        for option in ("num_steps", "num_restarts"):
            with pytest.raises(ValueError, match=option):
                call_kernel(name, weighted_sq, theta, batch, key, **{option: 0})
    else:
        with pytest.raises(ValueError, match="chunk_size"):
            call_kernel(name, weighted_sq, theta, batch, key, chunk_size=0)


def test_bad_options_raise():
    theta, batch, key = jnp.asarray(THETA), jnp.asarray(WEIGHTS), jax.random.key(0)
    gauss, ball = Perturbation("gaussian", 0.1), Perturbation("l2_ball", 0.1)
    kw = {"loss_fn": weighted_sq, "params": theta, "batch": batch, "key": key}
    with pytest.raises(ValueError, match="kind"):
        Perturbation("uniform", 1.0)
    with pytest.raises(ValueError, match="adaptive"):
        Perturbation("gaussian", 1.0, adaptive=1)
    with pytest.raises(ValueError, match="mask: expected bool"):
        Perturbation("gaussian", 1.0, mask={"w": 1.0})
    with pytest.raises(ValueError, match="perturbation: expected a Perturbation"):
        average_sharpness(**kw, perturbation=0.1, num_samples=4)
    with pytest.raises(ValueError, match=r"perturbation\.scale .*scalar"):
        average_sharpness(**kw, perturbation=Perturbation("gaussian", "big"), num_samples=4)
    with pytest.raises(ValueError, match="num_samples"):
        average_sharpness(**kw, perturbation=gauss, num_samples=1)
    for chunk in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="chunk_size"):
            average_sharpness(**kw, perturbation=gauss, num_samples=4, chunk_size=chunk)
    with pytest.raises(ValueError, match="antithetic"):
        average_sharpness(**kw, perturbation=gauss, num_samples=4, antithetic=None)
    with pytest.raises(ValueError, match="perturbation: the Theorem 6/12"):
        sharpness_decomposition(**kw, perturbation=ball, num_samples=4, num_probes=2)
    with pytest.raises(ValueError, match="num_probes"):
        sharpness_decomposition(**kw, perturbation=gauss, num_samples=4, num_probes=1)
    with pytest.raises(ValueError, match="perturbation: worst-case"):
        worst_case_sharpness(**kw, perturbation=gauss, num_steps=2)
    with pytest.raises(ValueError, match="step_size"):
        worst_case_sharpness(**kw, perturbation=ball, num_steps=2, step_size=0.0)
    with pytest.raises(ValueError, match="perturbation: sigma_search"):
        sigma_search(**kw, perturbation=ball, target_increase=0.1)
    with pytest.raises(ValueError, match="target_increase"):
        sigma_search(**kw, perturbation=gauss, target_increase=0.0)
    with pytest.raises(ValueError, match="sigma_lower"):
        sigma_search(**kw, perturbation=gauss, target_increase=0.1, sigma_lower=0.5)


def test_bad_masks_raise():
    theta, key = jnp.asarray(THETA), jax.random.key(0)
    params = {"w": theta}

    def loss(p, batch):
        return jnp.sum(p["w"] ** 2)

    def avg(pert, p=params):
        return average_sharpness(loss, p, (), key, perturbation=pert, num_samples=4)

    with pytest.raises(ValueError, match="mask: matches no parameter"):
        avg(Perturbation("gaussian", 0.1, mask={"w": False}))
    with pytest.raises(ValueError, match="mask: matches no parameter"):
        worst_case_sharpness(
            loss,
            params,
            (),
            key,
            num_steps=2,
            perturbation=Perturbation("l2_ball", 0.1, mask=lambda path, leaf: "attn" in path),
        )
    with pytest.raises(ValueError, match="mask: the callable must decide"):
        avg(Perturbation("gaussian", 0.1, mask=lambda path, leaf: jnp.all(leaf > 0)))
    with pytest.raises(ValueError, match="mask: expected None, a callable"):
        avg(Perturbation("gaussian", 0.1, mask={"v": True}))
    with pytest.raises(ValueError, match="mask: a mask of shape"):
        avg(Perturbation("gaussian", 0.1, mask={"w": np.array([True, False])}))
    with pytest.raises(ValueError, match="adaptive scales"):
        avg(Perturbation("gaussian", 0.1, adaptive=True), {"w": jnp.zeros(4)})


# ----------------------------------------------------------------------------------------------
# devices


_SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from kernels.sharpness import (Perturbation, average_sharpness, perturbed_hessian_traces,
                                   worst_case_sharpness)

    def loss(w, a):
        return jnp.sum(jnp.exp(a * w)) + jnp.sum(w) ** 2

    def compute():
        a = jnp.linspace(-1.0, 1.5, 5)
        theta = jnp.linspace(0.2, -0.2, 5)
        key = jax.random.key(3)
        gauss = Perturbation("gaussian", 0.1)
        avg = average_sharpness(loss, theta, a, key, perturbation=gauss, num_samples=7)
        worst = worst_case_sharpness(loss, theta, a, key, perturbation=Perturbation("l2_ball", 0.1),
                                     num_steps=5, num_restarts=3)
        traces = perturbed_hessian_traces(loss, theta, a, key, perturbation=gauss, num_samples=3,
                                          num_probes=2)
        return {"devices": len(jax.devices()), "avg": float(avg.mean),
                "worst": float(worst.value), "traces": traces.traces.mean.tolist()}
    """
)


@pytest.mark.slow
def test_sharded_equals_single_device():
    namespace = {}
    exec(_SHARDED, namespace)
    single = namespace["compute"]()
    script = (
        "import json, jax\n"
        'jax.config.update("jax_enable_x64", True)\n'
        + _SHARDED
        + "\nprint(json.dumps(compute()))\n"
    )
    flags = os.environ.get("XLA_FLAGS", "")
    env = {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=2".strip()}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    sharded = json.loads(out.stdout.strip().splitlines()[-1])
    assert single["devices"] == len(jax.devices())
    assert sharded["devices"] == 2
    np.testing.assert_allclose(sharded["avg"], single["avg"], rtol=1e-12)
    np.testing.assert_allclose(sharded["worst"], single["worst"], rtol=1e-12)
    np.testing.assert_allclose(sharded["traces"], single["traces"], rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# the pytree ascent, quadratic-form modes, key implementations, counts


def split_quad_loss(params, batch):
    """quad_loss on the concatenation of two leaves (a pytree of parameters)."""
    return quad_loss(jnp.concatenate([params["a"], params["b"].ravel()]), batch)


def apgd_reference(f, grad, eta0, radius, alpha, num_steps, p):
    """The ascent on flat vectors: the best point, the pending move, backtracking on rejection.

    Returns the best value, the best point and how many candidates were rejected.
    """
    proj = (
        (lambda v: v * min(1.0, radius / np.linalg.norm(v)))
        if p == 2
        else (lambda v: np.clip(v, -radius, radius))
    )
    x, fx, step, rejected = eta0, -np.inf, np.zeros_like(eta0), 0
    for i in range(num_steps + 1):
        c = proj(x + step)
        f_c, g_c = f(c), grad(c)
        if f_c > fx:  # accepted: APGD's momentum step from c, as a move
            mom = 1.0 if i == 0 else 0.75
            d = g_c / max(np.linalg.norm(g_c), 1e-300) if p == 2 else np.sign(g_c)
            z = proj(c + alpha * d)
            x, fx, step = c, f_c, proj(c + mom * (z - c) + (1 - mom) * step) - c
        else:  # rejected: stay, half the move and the step size
            step, alpha, rejected = step / 2, alpha / 2, rejected + 1
    return fx, x, rejected


@pytest.mark.parametrize(("kind", "adaptive"), [("l2_ball", False), ("linf_ball", True)])
def test_pytree_ascent_equals_the_flat_reference_step_by_step(kind, adaptive):
    # two parameter-sized trees are carried (the best point and the pending move): the flat
    # algorithm gives the same maximiser and value after each number of steps, rejections
    # (backtracking along the move) included
    batch, a, b, theta = quadratic(n=6, seed=5, psd=False)
    params = {"a": jnp.asarray(theta[:2]), "b": jnp.asarray(theta[2:]).reshape(2, 2)}
    radius = 2.0  # large enough for rejected candidates on both balls
    key = jax.random.key(50)
    s = np.abs(theta) if adaptive else np.ones(6)
    p = 2 if kind == "l2_ball" else np.inf
    # the start: the signs of restart 0's key (fold_in(key, 0)) over the 6 entries in leaf
    # order, from its first random word (fold_in(k0, 0)'s 4 words: entry j is bit j of word 0,
    # 1 meaning -1); l2: scaled to norm radius / 2; linf: the vertex +-radius / 2
    k0 = jax.random.fold_in(key, 0)
    word = int(jax.random.bits(jax.random.fold_in(k0, 0), (4,), jnp.uint32)[0])
    z = np.array([-1.0 if (word >> j) & 1 else 1.0 for j in range(6)])
    eta0 = 0.5 * radius * (z / np.linalg.norm(z) if p == 2 else z)
    f = lambda eta: 0.5 * (theta + s * eta) @ a @ (theta + s * eta) + b @ (theta + s * eta)  # noqa: E731
    grad = lambda eta: s * (a @ (theta + s * eta) + b)  # noqa: E731
    rejections = []
    for num_steps in (1, 2, 3, 5, 8, 12):
        res = worst_case_sharpness(
            split_quad_loss,
            params,
            batch,
            key,
            perturbation=Perturbation(kind, radius, adaptive=adaptive),
            num_steps=num_steps,
        )
        best_f, best_eta, rejected = apgd_reference(f, grad, eta0, radius, 2 * radius, num_steps, p)
        rejections.append(rejected)
        np.testing.assert_allclose(float(res.value), best_f - f(np.zeros(6)), rtol=1e-10)
        u = np.concatenate([np.asarray(res.u["a"]), np.asarray(res.u["b"]).ravel()])
        np.testing.assert_allclose(u, s * best_eta, rtol=1e-10, atol=1e-14)
    assert rejections[-1] >= 3, rejections  # the backtracking is exercised


def test_more_restarts_never_lower_the_worst_case():
    # restart 0 is the single-restart run: the best of three is at least its value
    batch, _, _, theta = quadratic(n=5, seed=6, psd=False)
    pert = Perturbation("l2_ball", 0.3)
    run = lambda r: worst_case_sharpness(  # noqa: E731
        quad_loss,
        jnp.asarray(theta),
        batch,
        jax.random.key(51),
        perturbation=pert,
        num_steps=2,
        num_restarts=r,
    )
    one, three = run(1), run(3)
    assert float(three.value) >= float(one.value)
    np.testing.assert_allclose(
        float(
            quad_loss(jnp.asarray(theta) + three.u, batch) - quad_loss(jnp.asarray(theta), batch)
        ),
        float(three.value),
        rtol=1e-12,
    )


def test_decomposition_modes_agree():
    # u^T H u by forward over forward mode or from the linearised gradient: same estimates
    a = jnp.linspace(-1.5, 2.0, 8)
    theta = jnp.linspace(0.3, -0.4, 8)
    runs = {
        mode: sharpness_decomposition(
            exp_loss,
            theta,
            a,
            jax.random.key(52),
            perturbation=Perturbation("gaussian", 0.1),
            num_samples=16,
            num_probes=4,
            mode=mode,
        )
        for mode in ("forms", "products", "auto")
    }
    for name in ("average", "trace_term", "remainder"):
        for mode in ("forms", "auto"):
            np.testing.assert_allclose(
                getattr(runs[mode], name).mean, getattr(runs["products"], name).mean, rtol=1e-10
            )
    with pytest.raises(ValueError, match=r"^mode: expected one of"):
        sharpness_decomposition(
            exp_loss,
            theta,
            a,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 0.1),
            num_samples=2,
            num_probes=2,
            mode="hvp",
        )


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])  # threefry2x32: the tests above
def test_every_key_implementation_keeps_the_invariances(impl):
    # Gaussian perturbations, random starts and probes from rbg keys (whose draws change under
    # vmap, so their samples run one at a time): finite results that do not depend on
    # chunk_size
    batch, _, _, theta = quadratic(n=5, seed=7)
    theta = jnp.asarray(theta)
    key = jax.random.key(53, impl=impl)
    gauss = Perturbation("gaussian", 0.05)
    for fn in (
        lambda c: (
            average_sharpness(
                quad_loss, theta, batch, key, perturbation=gauss, num_samples=6, chunk_size=c
            ).mean
        ),
        lambda c: (
            perturbed_hessian_traces(
                quad_loss,
                theta,
                batch,
                key,
                perturbation=gauss,
                num_samples=4,
                num_probes=2,
                chunk_size=c,
            ).traces.mean
        ),
    ):
        one, chunked = fn(None), fn(3)
        assert np.all(np.isfinite(np.asarray(one)))
        np.testing.assert_allclose(chunked, one, rtol=1e-10, atol=1e-14)
    res = worst_case_sharpness(
        quad_loss,
        theta,
        batch,
        key,
        perturbation=Perturbation("l2_ball", 0.2),
        num_steps=3,
        num_restarts=2,
    )
    assert np.isfinite(float(res.value))
    assert float(res.value) > 0


def test_counts_are_exact_or_refused_past_2_to_the_31():
    batch, _, _, theta = quadratic(n=4, seed=8)
    theta = jnp.asarray(theta)
    key = jax.random.key(0)
    gauss, ball = Perturbation("gaussian", 0.1), Perturbation("l2_ball", 0.1)
    # streamed Monte Carlo counts trace at 2**40 (nothing wraps), past 2**53 they are refused
    out = jax.eval_shape(
        lambda k: average_sharpness(
            quad_loss, theta, batch, k, perturbation=gauss, num_samples=2**40
        ),
        key,
    )
    assert out.num_evaluations == 2**41
    with pytest.raises(ValueError, match=r"^num_samples: at most 2\*\*53"):
        average_sharpness(quad_loss, theta, batch, key, perturbation=gauss, num_samples=2**53 + 1)
    # kept results and loop counts are refused past the int32 range, naming the reason
    with pytest.raises(ValueError, match=r"^num_samples: at most 2\*\*31 - 3 \(every sample"):
        perturbed_hessian_traces(
            quad_loss, theta, batch, key, perturbation=gauss, num_samples=2**31, num_probes=2
        )
    with pytest.raises(ValueError, match=r"^num_steps: at most 2\*\*31 - 3"):
        worst_case_sharpness(quad_loss, theta, batch, key, perturbation=ball, num_steps=2**31)
    with pytest.raises(ValueError, match=r"^num_restarts: num_restarts \* \(num_steps \+ 1\)"):
        worst_case_sharpness(
            quad_loss, theta, batch, key, perturbation=ball, num_steps=2**20, num_restarts=2**12
        )


def test_adaptive_dimension_count_does_not_wrap_with_x64_off():
    # the support of adaptive scales is counted in the parameters' float dtype: with x64 off an
    # int32 count of 2**31 + 2**20 nonzero scales wrapped negative (the l2 ball's radius draw
    # u**(1/dim) then turned NaN); the count is now float and positive, to float32 rounding.
    # (A broadcast: XLA folds the sum, nothing of that size is allocated.)
    from kernels.sharpness import _support_size

    size = 2**31 + 2**20
    with jax.enable_x64(False):
        scales = lambda: jnp.broadcast_to(jnp.float32(0.5), (size,))  # noqa: E731
        count = jax.jit(lambda: _support_size(scales()))()
        old = jax.jit(lambda: jnp.sum(scales() != 0))()
    assert count.dtype == jnp.float32
    assert float(count) == pytest.approx(size, rel=1e-6)
    assert int(old) < 0  # what the int32 count gave


def test_antithetic_pair_of_the_leaves_equals_the_losses_at_plus_and_minus_u():
    # the pair's loop evaluates the perturbation's leaves at +u and -u, one after the other;
    # its value is that of L(theta + u) and L(theta - u) evaluated directly (float64)
    from kernels._perturbation import _increase, _setup

    params = {"a": jnp.arange(3.0, dtype=jnp.float64), "b": jnp.ones((2, 2), jnp.float64)}

    def loss(p, batch):
        return jnp.sum(jnp.sin(p["a"] * batch)) * jnp.sum(p["b"] ** 3)

    prob = _setup(loss, params, 1.5, jax.random.key(0), Perturbation("gaussian", 0.1))
    u = {
        "a": 0.1 * jax.random.normal(jax.random.key(1), (3,), jnp.float64),
        "b": 0.1 * jax.random.normal(jax.random.key(2), (2, 2), jnp.float64),
    }
    leaves = jax.tree_util.tree_leaves(u)
    base = prob.shifted(prob.zeros())
    pair = _increase(prob, base, lambda: leaves, antithetic=True)
    one = _increase(prob, base, lambda: leaves, antithetic=False)
    ref_plus = loss(jax.tree_util.tree_map(jnp.add, params, u), 1.5)
    ref_minus = loss(jax.tree_util.tree_map(jnp.subtract, params, u), 1.5)
    ref_base = loss(params, 1.5)
    np.testing.assert_allclose(
        pair, 0.5 * ((ref_plus - ref_base) + (ref_minus - ref_base)), rtol=1e-12
    )
    np.testing.assert_allclose(one, ref_plus - ref_base, rtol=1e-12)


def test_masks_are_kept_per_leaf_without_a_parameter_sized_host_array():
    # the mask is a list of per-leaf broadcast views: None, a bool per leaf or a callable's
    # scalar answer repeat one bool (no host array of the leaf's size, 8e9 bools at 8B), and
    # their counts, all/any flags and program values follow the broadcast
    from kernels._perturbation import Perturbation, _mask_flags, _mask_tree, _mask_values

    params = {"a": jnp.zeros((300, 200)), "b": jnp.zeros((7,)), "c": jnp.zeros((4, 5))}
    for mask in (None, {"a": True, "b": False, "c": True}, lambda path, leaf: "a" in path):
        spec = Perturbation("gaussian", 0.1, mask=mask)
        for leaf in _mask_tree(spec.mask, params):
            assert all(stride == 0 for stride in leaf.strides), leaf.strides
    row = np.array([[True, False, True, True, False]])  # broadcast over c's rows
    spec = Perturbation("gaussian", 0.1, mask={"a": False, "b": True, "c": row})
    masks = _mask_tree(spec.mask, params)
    assert [_mask_flags(m) for m in masks] == [
        (False, False, 0),
        (True, True, 7),
        (True, False, 12),
    ]
    np.testing.assert_array_equal(_mask_values(masks[2], jnp.float64), np.repeat(row, 4, axis=0))


@pytest.mark.parametrize("kind", ["gaussian", "l2_ball", "linf_ball"])
def test_perturbations_are_drawn_leaf_by_leaf_from_the_sample_key(kind):
    # sample i's perturbation: leaf j of eta from fold_in(fold_in(key, i), j) (the l2 ball's
    # direction from the first of split(fold_in(key, i)), its radius from the second), scaled
    # by the mask times |theta| (adaptive) leaf by leaf; the mean of the antithetic pairs
    # recomputed from those draws (float64)
    params = {"a": jnp.linspace(-1.0, 2.0, 3), "b": jnp.linspace(0.5, -0.5, 4).reshape(2, 2)}
    mask = {"a": True, "b": np.array([[True, False]])}

    def loss(p, batch):
        return jnp.sum(jnp.sin(p["a"] * batch)) * jnp.sum(p["b"] ** 3) + jnp.sum(p["b"] ** 2)

    key, scale, num = jax.random.key(61), 0.2, 3
    pert = Perturbation(kind, scale, adaptive=True, mask=mask)
    est = average_sharpness(loss, params, 1.5, key, perturbation=pert, num_samples=num)
    s = {"a": np.abs(np.asarray(params["a"])), "b": np.abs(np.asarray(params["b"])) * mask["b"]}
    names, dim = ["a", "b"], 3 + 2  # the support: every entry of a, one column of b
    pairs = []
    for i in range(num):
        k = jax.random.fold_in(key, i)
        if kind == "l2_ball":
            k_dir, k_rad = jax.random.split(k)
            z = {
                n: np.asarray(jax.random.normal(jax.random.fold_in(k_dir, j), s[n].shape))
                * (s[n] != 0)
                for j, n in enumerate(names)
            }
            norm = np.sqrt(sum(np.sum(v**2) for v in z.values()))
            radius = scale * float(jax.random.uniform(k_rad, ())) ** (1 / dim)
            u = {n: radius * s[n] * z[n] / norm for n in names}
        else:
            draw = jax.random.normal if kind == "gaussian" else jax.random.uniform
            extra = () if kind == "gaussian" else (jnp.float64, -1.0, 1.0)
            u = {
                n: scale * s[n] * np.asarray(draw(jax.random.fold_in(k, j), s[n].shape, *extra))
                for j, n in enumerate(names)
            }
        plus = {n: params[n] + u[n] for n in names}
        minus = {n: params[n] - u[n] for n in names}
        base = loss(params, 1.5)
        pairs.append(0.5 * ((loss(plus, 1.5) - base) + (loss(minus, 1.5) - base)))
    np.testing.assert_allclose(float(est.mean), np.mean(pairs), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("kind", ["l2_ball", "linf_ball"])
def test_worst_case_with_an_empty_leaf(kind):
    # a parameter leaf of no entries (the ascent's max |g| over leaves once failed on it): the
    # same value as without the leaf, and an empty perturbation for it
    batch, _, _, theta = quadratic(n=5, seed=8, psd=False)
    with_empty = {"w": jnp.asarray(theta), "e": jnp.zeros((0, 3))}
    run = lambda params, loss: worst_case_sharpness(  # noqa: E731
        loss,
        params,
        batch,
        jax.random.key(53),
        perturbation=Perturbation(kind, 0.3),
        num_steps=4,
    )
    res = run(with_empty, lambda p, b: quad_loss(p["w"], b) + jnp.sum(p["e"]))
    ref = run({"w": jnp.asarray(theta)}, lambda p, b: quad_loss(p["w"], b))
    assert res.u["e"].shape == (0, 3)
    np.testing.assert_allclose(float(res.value), float(ref.value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(res.u["w"]), np.asarray(ref.u["w"]), rtol=1e-12)
