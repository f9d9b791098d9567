"""Tests of kernels.rademacher against enumeration of all sign vectors and closed forms."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import norms
from kernels import rademacher as rad

INF = math.inf
KEY = jax.random.key(42)


def all_signs(n):
    return np.array(list(itertools.product([1.0, -1.0], repeat=n)))


def np_dual(v, p):
    return np.linalg.norm(v, ord=norms.dual_exponent(p), axis=-1)


# ----------------------------------------------------------------------------- sign vectors


def test_sign_layout_matches_raw_bits():
    # draw k, sample i = bit i % 32 of word i // 32 of bits(fold_in(key, k)); bit 1 -> -1
    n = 70
    signs = np.asarray(rad.sign_vectors(KEY, num_draws=3, num_samples=n))
    for k in range(3):
        words = np.asarray(jax.random.bits(jax.random.fold_in(KEY, k), (3,), jnp.uint32))
        bits = np.array([(int(words[i // 32]) >> (i % 32)) & 1 for i in range(n)])
        np.testing.assert_array_equal(signs[k], 1.0 - 2.0 * bits)


def test_sign_chunks_regenerate_alone_and_dtypes_agree():
    full = rad.sign_vectors(KEY, num_draws=12, num_samples=37, dtype=jnp.float64)
    assert full.dtype == jnp.float64
    f32 = rad.sign_vectors(KEY, num_draws=12, num_samples=37)
    assert f32.dtype == jnp.float32
    np.testing.assert_array_equal(full, f32.astype(jnp.float64))
    for c in range(3):
        chunk = rad.sign_chunk(KEY, c, chunk_size=4, num_samples=37, dtype=jnp.float64)
        np.testing.assert_array_equal(chunk, full[4 * c : 4 * c + 4])
    traced = jax.jit(lambda c: rad.sign_chunk(KEY, c, chunk_size=4, num_samples=37))(2)
    np.testing.assert_array_equal(traced, f32[8:])


def test_signs_are_balanced_and_uncorrelated():
    s = np.asarray(rad.sign_vectors(KEY, num_draws=512, num_samples=128, dtype=jnp.float64))
    assert set(np.unique(s)) == {-1.0, 1.0}
    total = s.size
    assert abs(s.sum()) <= 5 * math.sqrt(total)
    # neighbouring samples and neighbouring draws are uncorrelated
    assert abs(np.sum(s[:, 1:] * s[:, :-1])) <= 5 * math.sqrt(s[:, 1:].size)
    assert abs(np.sum(s[1:] * s[:-1])) <= 5 * math.sqrt(s[1:].size)


# ----------------------------------------------------------------------------- exact reference


@pytest.mark.parametrize("p", [1, 2, INF])
def test_exact_matches_numpy_enumeration(p):
    x = np.random.default_rng(0).normal(size=(9, 4))
    want = np.mean(np_dual(all_signs(9) @ x, p)) * 1.5 / 9
    got = rad.rademacher_exact(
        rad.linear_sup(jnp.asarray(x), norm=p, radius=1.5), 9, chunk_size=100
    )
    np.testing.assert_allclose(got.mean, want, rtol=1e-12)
    assert got.num_samples == 512
    assert float(got.stderr) == 0.0


def test_exact_rejects_large_n():
    with pytest.raises(ValueError, match="num_samples"):
        rad.rademacher_exact(rad.linear_sup(jnp.ones((21, 2)), norm=2, radius=1.0), 21)


# ----------------------------------------------------------------------------- linear classes


def linear_reference(x, p, radius, scale=1.0):
    vals = np_dual(all_signs(x.shape[0]) @ x, p) * radius * scale / x.shape[0]
    return vals.mean(), vals.std()


@pytest.mark.parametrize("p", [1, 2, INF])
def test_linear_within_stderr_of_exact(p, run):
    x = np.random.default_rng(1).normal(size=(12, 5))
    exact, sd = linear_reference(x, p, 2.0)
    num = 2000
    est = run(lambda: rad.rademacher_linear(jnp.asarray(x), KEY, norm=p, radius=2.0, num_draws=num))
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)
    # reported stderr within 20% of the closed-form sd / sqrt(K)
    np.testing.assert_allclose(est.stderr, sd / math.sqrt(num), rtol=0.2)
    # McDiarmid interval: mean -/+ 2 b sqrt(ln(2/delta) / (2 n K)), b = B max_i ||x_i||_{p*}
    b = 2.0 * np.max(np_dual(x, p))
    hw = 2 * b * math.sqrt(math.log(2 / 0.05) / (2 * 12 * num))
    np.testing.assert_allclose(est.lower, est.mean - hw, rtol=1e-12)
    np.testing.assert_allclose(est.upper, est.mean + hw, rtol=1e-12)
    assert float(est.lower) <= exact <= float(est.upper)
    assert est.delta == 0.05


@pytest.mark.parametrize(("q", "p"), [(1, INF), (2, 1), (1, 1), (2, 2)])
def test_matrix_class_dual_group_norm(q, p):
    # {x -> u^T W x : ||W||_{q,p} <= B}: sup = B ||u||_{q*} ||sum s_i x_i||_{p*} / n
    rng = np.random.default_rng(2)
    x, u = rng.normal(size=(10, 4)), rng.normal(size=(3,))
    exact, _ = linear_reference(x, p, 1.0, scale=np.linalg.norm(u, norms.dual_exponent(q)))
    sup = rad.linear_sup(jnp.asarray(x), norm=(q, p), radius=1.0, readout=jnp.asarray(u))
    np.testing.assert_allclose(rad.rademacher_exact(sup, 10).mean, exact, rtol=1e-12)
    est = rad.rademacher_linear(
        jnp.asarray(x), KEY, norm=(q, p), radius=1.0, readout=jnp.asarray(u), num_draws=1000
    )
    assert abs(float(est.mean) - exact) <= 5 * float(est.stderr)


def test_matrix_class_sup_is_attained():
    # the closed form is a true sup: the maximiser W* = u' v'^T (dual pair) attains it
    rng = np.random.default_rng(3)
    x, u = rng.normal(size=(6, 4)), rng.normal(size=(3,))
    s = np.array([1.0, -1, 1, 1, -1, 1])
    v = s @ x
    # (q, p) = (2, 2): W* = u v^T / (||u|| ||v||)
    w = np.outer(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))
    sup = rad.linear_sup(jnp.asarray(x), norm=(2, 2), radius=1.0, readout=jnp.asarray(u))
    np.testing.assert_allclose(sup(jnp.asarray(s[None]))[0], (u @ w @ x.T @ s) / 6, rtol=1e-12)


def test_chunking_does_not_change_result():
    x = jnp.asarray(np.random.default_rng(4).normal(size=(40, 3)))
    ests = [
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_draws=300, chunk_size=c)
        for c in (None, 1, 7, 64, 300)
    ]
    for e in ests[1:]:
        np.testing.assert_allclose(e.mean, ests[0].mean, rtol=1e-12)
        np.testing.assert_allclose(e.stderr, ests[0].stderr, rtol=1e-10)
    # and equals the plain average over the materialised sign vectors
    s = np.asarray(rad.sign_vectors(KEY, num_draws=300, num_samples=40, dtype=jnp.float64))
    vals = np.linalg.norm(s @ np.asarray(x), axis=1) / 40
    np.testing.assert_allclose(ests[0].mean, vals.mean(), rtol=1e-12)
    np.testing.assert_allclose(ests[0].stderr, vals.std(ddof=1) / math.sqrt(300), rtol=1e-10)


def test_float32_in_float32_out():
    x = jnp.ones((16, 3), jnp.float32)
    est = rad.rademacher_linear(x, KEY, norm=1, radius=1.0, num_draws=10)
    assert est.mean.dtype == jnp.float32
    assert est.stderr.dtype == jnp.float32
    assert est.lower.dtype == jnp.float32


def test_traced_once_for_new_keys():
    count = [0]
    x = jnp.ones((8, 2))

    def body(key):
        count[0] += 1
        return rad.rademacher_linear(x, key, norm=2, radius=1.0, num_draws=16, chunk_size=4)

    f = jax.jit(body)
    for i in range(3):
        f(jax.random.key(i))
    assert count[0] == 1
    # vmapped over keys equals the loop
    keys = jax.random.split(KEY, 3)
    batched = jax.vmap(
        functools.partial(rad.rademacher_linear, x, norm=2, radius=1.0, num_draws=16)
    )(keys)
    for i in range(3):
        one = rad.rademacher_linear(x, keys[i], norm=2, radius=1.0, num_draws=16)
        np.testing.assert_allclose(batched.mean[i], one.mean, rtol=1e-12)


def test_linear_bad_arguments_raise():
    x = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="radius"):
        rad.rademacher_linear(x, KEY, norm=2, radius=0.0, num_draws=4)
    with pytest.raises(ValueError, match="num_draws"):
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_draws=1)
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_draws=4, chunk_size=0)
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_linear(jnp.ones(4), KEY, norm=2, radius=1.0, num_draws=4)
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_linear(x.at[0, 0].set(jnp.nan), KEY, norm=2, radius=1.0, num_draws=4)
    with pytest.raises(ValueError, match="p"):
        rad.rademacher_linear(x, KEY, norm=0.5, radius=1.0, num_draws=4)
    with pytest.raises(ValueError, match="readout"):
        rad.rademacher_linear(x, KEY, norm=(1, 2), radius=1.0, num_draws=4)
    with pytest.raises(ValueError, match="delta"):
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_draws=4, delta=2.0)


# ----------------------------------------------------------------------------- finite classes


def test_finite_matches_enumeration_and_chunks():
    rng = np.random.default_rng(5)
    v = rng.normal(size=(53, 10))
    exact = np.mean(np.max(all_signs(10) @ v.T, axis=1)) / 10
    fn = lambda idx: jnp.asarray(v)[idx]  # noqa: E731
    got = rad.rademacher_exact(rad.finite_sup(fn, 53, member_chunk=8), 10)
    np.testing.assert_allclose(got.mean, exact, rtol=1e-12)
    a = rad.rademacher_finite(fn, 53, KEY, num_draws=1500, member_chunk=8, draw_chunk=100)
    b = rad.rademacher_finite(fn, 53, KEY, num_draws=1500)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    assert abs(float(a.mean) - exact) <= 5 * float(a.stderr)
    hw = 2 * np.abs(v).max() * math.sqrt(math.log(40) / (2 * 10 * 1500))
    np.testing.assert_allclose(a.upper - a.mean, hw, rtol=1e-10)
    assert float(a.lower) <= exact <= float(a.upper)


def test_finite_large_class_on_demand():
    # 200,003 members V_j = cos((j + 1) x): the output matrix is never materialised; the result
    # equals a numpy reference on the same sign vectors, computed in blocks.
    n, m = 16, 200_003
    x = jnp.linspace(0.1, 1.0, n)
    fn = lambda idx: jnp.cos((idx[:, None] + 1).astype(x.dtype) * x[None, :])  # noqa: E731
    est = rad.rademacher_finite(fn, m, KEY, num_draws=8, member_chunk=4096)
    s = np.asarray(rad.sign_vectors(KEY, num_draws=8, num_samples=n, dtype=jnp.float64))
    best = np.full(8, -np.inf)
    for start in range(0, m, 50_000):
        j = np.arange(start, min(m, start + 50_000))
        best = np.maximum(best, (s @ np.cos((j[:, None] + 1.0) * np.asarray(x)[None, :]).T).max(1))
    np.testing.assert_allclose(est.mean, best.mean() / n, rtol=1e-12)


def test_finite_bad_outputs_raise():
    with pytest.raises(ValueError, match="outputs_fn"):
        rad.rademacher_finite(lambda idx: jnp.ones(3), 5, KEY, num_draws=4)
    with pytest.raises(ValueError, match="num_members"):
        rad.rademacher_finite(lambda idx: jnp.ones((1, 3)), 0, KEY, num_draws=4)


# ----------------------------------------------------------------------------- search


@pytest.mark.parametrize(
    ("p", "steps"),
    [(2, 30), (1, 60), (INF, 30)],
)
def test_search_reaches_linear_sup_within_one_percent(p, steps):
    rng = np.random.default_rng(6)
    n, d = 64, 8
    x = jnp.asarray(rng.normal(size=(n, d)))
    w0 = jnp.asarray(rng.normal(size=(d,))) * 0.01
    radius = 1.5
    exact = rad.rademacher_linear(x, KEY, norm=p, radius=radius, num_draws=64, delta=None)
    est = rad.rademacher_search(
        lambda w, xs: xs @ w,
        w0,
        x,
        KEY,
        project=lambda w: norms.project_lp_ball(w, p=p, radius=radius),
        num_draws=64,
        num_steps=steps,
        step_size=2 * radius,
        num_restarts=2,
        chunk_size=16,
        delta=None,
    )
    # same key -> same sign vectors: the search is a lower bound and within 1% of the sup
    assert float(est.mean) <= float(exact.mean) * (1 + 1e-12)
    assert float(est.mean) >= 0.99 * float(exact.mean)


def test_search_is_lower_bound_per_sign_vector_on_a_network():
    # tanh network with a frobenius-ball constraint; every search value is attained by a
    # feasible parameter, so it is <= the sup; check against a dense random-feasible sweep that
    # the search is at least as good, and that its values are achieved (feasibility).
    rng = np.random.default_rng(7)
    n, d, h = 10, 3, 4
    x = jnp.asarray(rng.normal(size=(n, d)))
    params = {"w": jnp.asarray(rng.normal(size=(d, h))) * 0.3, "v": jnp.asarray(rng.normal(size=h))}

    def apply_fn(p, xs):
        return jnp.tanh(xs @ p["w"]) @ p["v"]

    def project(p):
        return {
            "w": norms.project_lp_ball(p["w"], p=2, radius=1.0),
            "v": norms.project_lp_ball(p["v"], p=2, radius=1.0),
        }

    sup = rad.search_sup(
        apply_fn, params, x, KEY, project=project, num_steps=40, step_size=0.3, num_restarts=3
    )
    s = rad.sign_vectors(KEY, num_draws=4, num_samples=n, dtype=jnp.float64)
    vals = np.asarray(sup(s))
    # random feasible points never beat the search by much (it is a good lower bound), and no
    # value exceeds the trivial upper bound sup |f| <= ||v||_1 <= sqrt(h) on the unit balls.
    sweep = jax.vmap(project)(
        {
            "w": jnp.asarray(rng.normal(size=(2000, d, h))),
            "v": jnp.asarray(rng.normal(size=(2000, h))),
        }
    )
    outs = jax.vmap(apply_fn, in_axes=(0, None))(sweep, x)  # [2000, n]
    best_random = np.max(np.asarray(s) @ np.asarray(outs).T, axis=1) / n
    assert np.all(vals >= best_random - 1e-9)
    assert np.all(vals <= math.sqrt(h) + 1e-12)


def test_search_interval_is_one_sided():
    x = jnp.eye(4)
    est = rad.rademacher_search(
        lambda w, xs: xs @ w,
        jnp.full(4, 0.1),
        x,
        KEY,
        project=lambda w: norms.project_lp_ball(w, p=2, radius=1.0),
        num_draws=4,
        num_steps=10,
        step_size=0.5,
        output_bound=1.0,
    )
    hw = 2 * math.sqrt(math.log(40) / (2 * 4 * 4))
    np.testing.assert_allclose(est.lower, est.mean - hw, rtol=1e-12)
    assert float(est.upper) == INF


def test_search_bad_arguments_raise():
    x = jnp.eye(3)
    kw = dict(project=lambda w: w, num_draws=4, num_steps=2, step_size=0.1)
    with pytest.raises(ValueError, match="apply_fn"):
        rad.rademacher_search(lambda w, xs: xs, jnp.ones(3), x, KEY, **kw)
    with pytest.raises(ValueError, match="step_size"):
        rad.rademacher_search(lambda w, xs: xs @ w, jnp.ones(3), x, KEY, **{**kw, "step_size": 0})
    with pytest.raises(ValueError, match="num_steps"):
        rad.rademacher_search(lambda w, xs: xs @ w, jnp.ones(3), x, KEY, **{**kw, "num_steps": 0})
