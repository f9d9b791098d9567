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

from kernels.curvature import hessian_trace
from kernels.sharpness import (
    Perturbation,
    average_sharpness,
    perturbed_hessian_traces,
    sharpness_decomposition,
    sigma_search,
    worst_case_sharpness,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quadratic(n=6, seed=0, psd=True):
    rng = np.random.default_rng(seed)
    m = rng.normal(size=(n, n))
    a = m @ m.T / n + 0.5 * np.eye(n) if psd else (m + m.T) / 2
    b = rng.normal(size=n)
    theta = rng.normal(size=n)
    a_j, b_j = jnp.asarray(a), jnp.asarray(b)

    def loss(w):
        return 0.5 * w @ (a_j @ w) + b_j @ w

    return loss, a, b, theta


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
    loss, a, b, theta = quadratic()
    sigma, k = 0.3, 4000
    est = run(
        lambda: average_sharpness(
            loss,
            jnp.asarray(theta),
            jax.random.key(1),
            perturbation=Perturbation("gaussian", sigma),
            num_samples=k,
            antithetic=antithetic,
        )
    )
    exact = 0.5 * sigma**2 * np.trace(a)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)
    assert est.num_samples == k
    # closed-form standard error: Var(u.Au/2) = sigma^4 ||A||_F^2 / 2, Var(g.u) = sigma^2 ||g||^2
    quad_var = sigma**4 * np.sum(a**2) / 2
    if antithetic:
        closed = np.sqrt(quad_var / (k // 2))
    else:
        g = a @ theta + b
        closed = np.sqrt((sigma**2 * g @ g + quad_var) / k)
    assert abs(float(est.stderr) / closed - 1) < 0.2


@pytest.mark.parametrize(("kind", "second_moment"), [("l2_ball", 1 / 8), ("linf_ball", 1 / 3)])
def test_average_sharpness_quadratic_balls(kind, second_moment):
    # uniform in the l2 ball of R^6: E u u^T = r^2 / (n + 2) I; in the cube: r^2 / 3 I
    loss, a, _, theta = quadratic()
    radius = 0.5
    est = average_sharpness(
        loss,
        jnp.asarray(theta),
        jax.random.key(2),
        perturbation=Perturbation(kind, radius),
        num_samples=4000,
    )
    exact = 0.5 * radius**2 * second_moment * np.trace(a)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)
    assert float(est.stderr) < 0.05 * exact


def test_average_sharpness_adaptive_and_masked_quadratic():
    loss, a, _, theta = quadratic()
    sigma = 0.2
    mask = np.array([True, False, True, True, False, True])
    s = np.abs(theta) * mask
    est = average_sharpness(
        lambda p: loss(p["w"]),
        {"w": jnp.asarray(theta)},
        jax.random.key(3),
        perturbation=Perturbation("gaussian", sigma, adaptive=True, mask={"w": jnp.asarray(mask)}),
        num_samples=4000,
    )
    exact = 0.5 * sigma**2 * np.sum(np.diag(a) * s**2)  # E u u^T = sigma^2 diag(s^2)
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)


def test_average_sharpness_chunk_invariant_and_key_dependent():
    loss, _, _, theta = quadratic()
    pert = Perturbation("gaussian", 0.1)
    kwargs = {"perturbation": pert, "num_samples": 20}
    ref = average_sharpness(loss, jnp.asarray(theta), jax.random.key(0), **kwargs)
    for chunk in (3, 100):
        other = average_sharpness(
            loss, jnp.asarray(theta), jax.random.key(0), chunk_size=chunk, **kwargs
        )
        np.testing.assert_allclose(other.mean, ref.mean, rtol=1e-12)
        np.testing.assert_allclose(other.stderr, ref.stderr, rtol=1e-10)
    new = average_sharpness(loss, jnp.asarray(theta), jax.random.key(1), **kwargs)
    assert float(new.mean) != float(ref.mean)


def test_float32_in_float32_out_and_traced_once():
    _, a, _, theta = quadratic()
    theta32 = jnp.asarray(theta, jnp.float32)
    count = {"n": 0}

    def counted(key):
        count["n"] += 1
        return average_sharpness(
            loss_f32, theta32, key, perturbation=Perturbation("gaussian", 0.1), num_samples=8
        )

    a32 = jnp.asarray(a, jnp.float32)

    def loss_f32(w):
        return 0.5 * w @ (a32 @ w)

    fn = jax.jit(counted)
    est = fn(jax.random.key(0))
    fn(jax.random.key(1))
    assert count["n"] == 1
    assert est.mean.dtype == jnp.float32
    assert est.stderr.dtype == jnp.float32
    res = worst_case_sharpness(
        loss_f32, theta32, jax.random.key(0), perturbation=Perturbation("l2_ball", 0.1), num_steps=3
    )
    assert res.value.dtype == jnp.float32
    assert res.perturbation.dtype == jnp.float32


# ----------------------------------------------------------------------------------------------
# worst case


@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_l2_matches_trust_region(adaptive):
    loss, a, b, theta = quadratic(n=5, seed=4, psd=False)
    radius = 0.7
    s = np.abs(theta) if adaptive else np.ones_like(theta)
    # in eta coordinates: max g's.eta + eta.(S A S) eta / 2 over ||eta|| <= r
    exact = trust_region_max(s * (a @ theta + b), s[:, None] * a * s[None, :], radius)
    res = jax.jit(
        lambda: worst_case_sharpness(
            loss,
            jnp.asarray(theta),
            jax.random.key(0),
            perturbation=Perturbation("l2_ball", radius, adaptive=adaptive),
            num_steps=200,
            num_restarts=3,
        )
    )()
    u = np.asarray(res.perturbation)
    assert np.linalg.norm(u / s) <= radius * (1 + 1e-12)
    np.testing.assert_allclose(
        float(loss(jnp.asarray(theta + u)) - loss(jnp.asarray(theta))), float(res.value), rtol=1e-12
    )
    assert float(res.value) <= exact * (1 + 1e-12)
    np.testing.assert_allclose(float(res.value), exact, rtol=1e-6)


@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_linf_matches_vertex_enumeration(adaptive):
    # convex quadratic: the max over a box is attained at a vertex, so enumerate all 2^n
    loss, a, b, theta = quadratic(n=5, seed=5)
    radius = 0.3
    s = np.abs(theta) if adaptive else np.ones_like(theta)
    g = a @ theta + b
    exact = max(
        g @ (u := radius * s * np.array(signs)) + 0.5 * u @ a @ u
        for signs in itertools.product([-1.0, 1.0], repeat=5)
    )
    res = worst_case_sharpness(
        loss,
        jnp.asarray(theta),
        jax.random.key(1),
        perturbation=Perturbation("linf_ball", radius, adaptive=adaptive),
        num_steps=100,
        num_restarts=4,
    )
    assert np.all(np.abs(np.asarray(res.perturbation)) <= radius * s * (1 + 1e-12))
    np.testing.assert_allclose(float(res.value), exact, rtol=1e-9)


def test_worst_case_mask_leaves_other_groups_unperturbed():
    params = mlp_params(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (16, 3), jnp.float64)

    def loss(p):
        return jnp.mean(mlp(p, x) ** 2)

    res = worst_case_sharpness(
        loss,
        params,
        jax.random.key(2),
        perturbation=Perturbation("l2_ball", 0.1, mask=lambda path, leaf: "w1" in path),
        num_steps=10,
    )
    assert float(res.value) > 0
    assert float(jnp.linalg.norm(res.perturbation["w1"])) == pytest.approx(0.1, rel=1e-9)
    for name in ("b1", "w2", "b2"):
        assert not np.any(np.asarray(res.perturbation[name]))


# ----------------------------------------------------------------------------------------------
# Theorem 6/12 decomposition


def test_decomposition_matches_closed_form_exponential():
    # L(w) = sum exp(a w): E L(theta+u) = sum e^{a theta} e^{a^2 sigma^2 / 2}, H diagonal,
    # P = sum e^{a theta} (e^{a^2 sigma^2/2} - 1 - a^2 sigma^2/2) exactly.
    a = jnp.linspace(-1.5, 2.0, 8)
    theta = jnp.linspace(0.3, -0.4, 8)

    def loss(w):
        return jnp.sum(jnp.exp(a * w))

    decompose = jax.jit(  # sigma traced: one compilation for the three sigmas
        lambda sigma: sharpness_decomposition(
            loss, theta, jax.random.key(0), sigma=sigma, num_samples=1024, num_probes=4
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
        assert abs(float(dec.perturbation.mean) - p_exact) <= 5 * float(dec.perturbation.stderr)
        assert float(dec.perturbation.stderr) < 0.1 * p_exact
        ratios.append(float(dec.perturbation.mean) / float(dec.trace_term.mean))
    # P / trace term = O(sigma^2) here (odd orders vanish): halving sigma divides it by ~4
    assert 3.0 < ratios[0] / ratios[1] < 5.0
    assert 3.0 < ratios[1] / ratios[2] < 5.0


def test_decomposition_small_network_scaling():
    params = mlp_params(jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (32, 3), jnp.float64)
    y = jnp.sin(x[:, 0]) + 0.5 * x[:, 1]

    def loss(p):
        return jnp.mean((mlp(p, x) - y) ** 2)

    decompose = jax.jit(
        lambda sigma: sharpness_decomposition(
            loss, params, jax.random.key(5), sigma=sigma, num_samples=512, num_probes=64
        )
    )
    rel = []
    for sigma in (0.08, 0.04, 0.02):
        dec = decompose(sigma)
        total = dec.trace_term.mean + dec.perturbation.mean
        se = np.hypot(float(dec.trace_term.stderr), float(dec.perturbation.stderr))
        se = np.hypot(se, float(dec.average.stderr))
        assert abs(float(dec.average.mean) - float(total)) <= 5 * se
        rel.append(abs(float(dec.perturbation.mean)) / float(dec.trace_term.mean))
    # P is O(sigma^3) relative to sigma^2 tr H / 2: the ratio shrinks at least linearly in sigma
    assert rel[0] < 0.2
    assert rel[1] <= 0.6 * rel[0]
    assert rel[2] <= 0.6 * rel[1]


def test_interpolator_trace_equals_twice_gradient_norm():
    # SPEC Theorem 13: at an interpolator of the quadratic loss, tr H = (2/m) sum ||grad f(x_i)||^2
    params = mlp_params(jax.random.key(6))
    x = jax.random.normal(jax.random.key(7), (4, 3), jnp.float64)
    y = mlp(params, x)  # interpolated targets

    def loss(p):
        return jnp.mean((mlp(p, x) - y) ** 2)

    grads = jax.vmap(
        lambda xi: ravel_pytree(jax.grad(lambda p: mlp(p, xi[None, :])[0])(params))[0]
    )(x)
    rhs = 2 * float(jnp.mean(jnp.sum(grads**2, axis=1)))
    flat, unravel = ravel_pytree(params)
    dense = float(jnp.trace(jax.hessian(lambda f: loss(unravel(f)))(flat)))
    np.testing.assert_allclose(dense, rhs, rtol=1e-10)
    est = hessian_trace(loss, params, jax.random.key(8), num_probes=200)
    assert abs(float(est.mean) - rhs) <= 5 * float(est.stderr)
    assert float(est.stderr) < 0.1 * rhs


def test_perturbed_hessian_traces_exponential():
    a = jnp.linspace(-1.0, 1.5, 6)
    theta = jnp.linspace(0.2, -0.2, 6)
    sigma = 0.3

    def loss(w):
        return jnp.sum(jnp.exp(a * w))

    traces = perturbed_hessian_traces(
        loss, theta, jax.random.key(0), sigma=sigma, num_perturbations=200, num_probes=2
    )
    assert traces.shape == (200,)
    exact = float(jnp.sum(a**2 * jnp.exp(a * theta + a**2 * sigma**2 / 2)))  # E tr H(theta+u)
    se = float(jnp.std(traces, ddof=1)) / np.sqrt(200)
    assert abs(float(jnp.mean(traces)) - exact) <= 5 * se
    again = perturbed_hessian_traces(
        loss,
        theta,
        jax.random.key(0),
        sigma=sigma,
        num_perturbations=200,
        num_probes=2,
        chunk_size=50,
    )
    np.testing.assert_allclose(again, traces, rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# adaptive invariance


def relu_net(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
    return h @ params["w2"] + params["b2"][None, :]


def test_adaptive_sharpness_invariant_to_relu_rescaling():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(9), 4)
    params = {
        "w1": jax.random.normal(k1, (4, 8), jnp.float64),
        "b1": jax.random.normal(k2, (8,), jnp.float64),
        "w2": jax.random.normal(k3, (8, 2), jnp.float64),
        "b2": jnp.array([0.1, -0.2]),
    }
    x = jax.random.normal(k4, (32, 4), jnp.float64)
    y = jnp.sin(x[:, :2])
    c = 7.0
    scaled = {**params, "w1": c * params["w1"], "b1": c * params["b1"], "w2": params["w2"] / c}

    def loss(p):
        return jnp.mean((relu_net(p, x) - y) ** 2)

    np.testing.assert_allclose(loss(scaled), loss(params), rtol=1e-12)

    @functools.partial(jax.jit, static_argnums=1)
    def avg(p, adaptive):
        return average_sharpness(
            loss,
            p,
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 0.1, adaptive=adaptive),
            num_samples=64,
        ).mean

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def worst(p, adaptive, kind):
        return worst_case_sharpness(
            loss,
            p,
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
    loss, _, _, theta = quadratic()
    search = jax.jit(
        lambda target: sigma_search(
            loss,
            jnp.asarray(theta),
            jax.random.key(0),
            target_increase=target,
            num_samples=64,
            num_iterations=40,
        )
    )
    target = 0.05
    res = search(target)
    c = float(
        average_sharpness(
            loss,
            jnp.asarray(theta),
            jax.random.key(0),
            perturbation=Perturbation("gaussian", 1.0),
            num_samples=64,
        ).mean
    )
    np.testing.assert_allclose(float(res.sigma), np.sqrt(target / c), rtol=1e-8)
    np.testing.assert_allclose(float(res.increase.mean), target, rtol=1e-7)
    assert bool(res.bracketed)
    assert float(res.increase.mean) <= target
    # a target beyond the bracket returns its end, flagged
    far = search(1e6)
    assert float(far.sigma) == 1.0
    assert not bool(far.bracketed)


# ----------------------------------------------------------------------------------------------
# errors


def test_bad_arguments_raise():
    loss, _, _, theta = quadratic()
    theta = jnp.asarray(theta)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="sigma"):
        Perturbation("gaussian", 0.0)
    with pytest.raises(ValueError, match="radius"):
        Perturbation("l2_ball", -1.0)
    with pytest.raises(ValueError, match="kind"):
        Perturbation("uniform", 1.0)
    with pytest.raises(ValueError, match="sigma"):
        sharpness_decomposition(loss, theta, key, sigma=-0.1, num_samples=8, num_probes=2)
    with pytest.raises(ValueError, match="sigma"):
        perturbed_hessian_traces(loss, theta, key, sigma=0.0, num_perturbations=2, num_probes=2)
    with pytest.raises(ValueError, match="mask"):
        average_sharpness(
            lambda p: loss(p["w"]),
            {"w": theta},
            key,
            perturbation=Perturbation("gaussian", 0.1, mask={"w": False}),
            num_samples=8,
        )
    with pytest.raises(ValueError, match="mask"):
        worst_case_sharpness(
            loss,
            theta,
            key,
            num_steps=2,
            perturbation=Perturbation("l2_ball", 0.1, mask=lambda path, leaf: False),
        )
    with pytest.raises(ValueError, match="params"):
        average_sharpness(
            loss,
            theta.at[0].set(jnp.nan),
            key,
            perturbation=Perturbation("gaussian", 0.1),
            num_samples=8,
        )
    with pytest.raises(ValueError, match="loss_fn"):
        average_sharpness(
            lambda w: jnp.log(-jnp.sum(w**2)),
            theta,
            key,
            perturbation=Perturbation("gaussian", 0.1),
            num_samples=8,
        )
    with pytest.raises(ValueError, match="num_samples"):
        average_sharpness(
            loss, theta, key, perturbation=Perturbation("gaussian", 0.1), num_samples=7
        )
    with pytest.raises(ValueError, match="perturbation"):
        worst_case_sharpness(
            loss, theta, key, perturbation=Perturbation("gaussian", 0.1), num_steps=2
        )
    with pytest.raises(ValueError, match="step_size"):
        worst_case_sharpness(
            loss, theta, key, perturbation=Perturbation("l2_ball", 0.1), num_steps=2, step_size=0.0
        )
    with pytest.raises(ValueError, match="target_increase"):
        sigma_search(loss, theta, key, target_increase=0.0)
    with pytest.raises(ValueError, match="sigma_upper"):
        sigma_search(loss, theta, key, target_increase=0.1, sigma_lower=1.0, sigma_upper=0.5)


# ----------------------------------------------------------------------------------------------
# devices


_SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from kernels.sharpness import (Perturbation, average_sharpness, perturbed_hessian_traces,
                                   worst_case_sharpness)

    def compute():
        a = jnp.linspace(-1.0, 1.5, 5)
        loss = lambda w: jnp.sum(jnp.exp(a * w)) + jnp.sum(w) ** 2
        theta = jnp.linspace(0.2, -0.2, 5)
        key = jax.random.key(3)
        avg = average_sharpness(loss, theta, key, perturbation=Perturbation("gaussian", 0.1),
                                num_samples=14)
        worst = worst_case_sharpness(loss, theta, key, perturbation=Perturbation("l2_ball", 0.1),
                                     num_steps=5, num_restarts=3)
        traces = perturbed_hessian_traces(loss, theta, key, sigma=0.1, num_perturbations=3,
                                          num_probes=2)
        return {"devices": len(jax.devices()), "avg": float(avg.mean),
                "worst": float(worst.value), "traces": [float(t) for t in traces]}
    """
)


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
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
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
