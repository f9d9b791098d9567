"""Tests of kernels.rademacher against enumeration of all sign vectors and closed forms."""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import _checks, _rademacher, norms
from kernels import rademacher as rad
from tests.helpers import TraceCounter, compiles_in, count_compiles, matmul_tol, tol

INF = math.inf
KEY = jax.random.key(42)  # a fixed key (not a generator): no state shared between tests


def all_signs(n):
    return np.array(list(itertools.product([1.0, -1.0], repeat=n)))


def np_dual(v, p):
    return np.linalg.norm(v, ord=norms.dual_exponent(p), axis=-1)


def l2_ball(w):
    return norms.project_lp_ball(w, p=2, radius=1.0)


def linear_fn(w, xs):
    return xs @ w


def take_rows(idx, v):
    return v[idx]


# ----------------------------------------------------------------------------- sign vectors


def test_sign_layout_matches_raw_bits():
    # draw k, example i = bit i % 32 of word w = i // 32, entry w % 4 of the 4 words
    # bits(fold_in(fold_in(key, k), w // 4)) (public jax.random calls alone); bit 1 -> -1
    n = 170
    signs = np.asarray(rad.sign_vectors(KEY, num_samples=3, num_examples=n))
    for k in range(3):
        draw = jax.random.fold_in(KEY, k)
        groups = [jax.random.bits(jax.random.fold_in(draw, g), (4,), jnp.uint32) for g in range(2)]
        words = [int(groups[w // 4][w % 4]) for w in range(6)]
        bits = np.array([(int(words[i // 32]) >> (i % 32)) & 1 for i in range(n)])
        np.testing.assert_array_equal(signs[k], 1.0 - 2.0 * bits)


def test_sign_chunks_regenerate_alone_and_dtypes_agree():
    full = rad.sign_vectors(KEY, num_samples=12, num_examples=37, dtype=jnp.float64)
    assert full.dtype == jnp.float64
    f32 = rad.sign_vectors(KEY, num_samples=12, num_examples=37)
    assert f32.dtype == jnp.float32
    np.testing.assert_array_equal(full, f32.astype(jnp.float64))
    for c in range(3):
        chunk = rad.sign_chunk(KEY, c, chunk_size=4, num_examples=37, dtype=jnp.float64)
        np.testing.assert_array_equal(chunk, full[4 * c : 4 * c + 4])
    traced = jax.jit(lambda c: rad.sign_chunk(KEY, c, chunk_size=4, num_examples=37))(2)
    np.testing.assert_array_equal(traced, f32[8:])


def test_signs_are_balanced_and_uncorrelated():
    s = np.asarray(rad.sign_vectors(KEY, num_samples=512, num_examples=128, dtype=jnp.float64))
    assert set(np.unique(s)) == {-1.0, 1.0}
    assert abs(s.sum()) <= 5 * math.sqrt(s.size)
    # neighbouring examples and neighbouring draws are uncorrelated
    assert abs(np.sum(s[:, 1:] * s[:, :-1])) <= 5 * math.sqrt(s[:, 1:].size)
    assert abs(np.sum(s[1:] * s[:-1])) <= 5 * math.sqrt(s[1:].size)


def test_sign_bad_arguments_raise():
    with pytest.raises(ValueError, match="key"):
        rad.sign_vectors(0, num_samples=2, num_examples=3)
    with pytest.raises(ValueError, match="num_examples"):
        rad.sign_vectors(KEY, num_samples=2, num_examples=0)
    with pytest.raises(ValueError, match="dtype"):
        rad.sign_vectors(KEY, num_samples=2, num_examples=3, dtype=jnp.float16)
    with pytest.raises(ValueError, match="chunk_index"):
        rad.sign_chunk(KEY, -1, chunk_size=2, num_examples=3)
    with pytest.raises(ValueError, match="chunk_size"):
        rad.sign_chunk(KEY, 0, chunk_size=True, num_examples=3)


def test_sign_vectors_refuses_more_than_2_31_entries_up_front():
    """2**40 x 4 signs were allocated lazily (17.6 TB) and failed at block_until_ready."""
    with pytest.raises(ValueError, match=r"^num_samples: .* more than the 2\*\*31.*sign_chunk"):
        rad.sign_vectors(KEY, num_samples=2**40, num_examples=4)
    with pytest.raises(ValueError, match=r"^num_samples: 536870913 sign vectors of 4 examples"):
        rad.sign_vectors(KEY, num_samples=2**29 + 1, num_examples=4)
    assert jax.eval_shape(
        lambda k: rad.sign_vectors(k, num_samples=2**29, num_examples=4), KEY
    ).shape == (2**29, 4)


# ----------------------------------------------------------------------------- exact reference


@pytest.mark.parametrize("p", [1, 2, INF])
def test_exact_matches_numpy_enumeration(p):
    x = np.random.default_rng(0).normal(size=(9, 4))
    want = np.mean(np_dual(all_signs(9) @ x, p)) * 1.5 / 9
    sup = rad.linear_sup(jnp.asarray(x), norm=p, radius=1.5)
    got = rad.rademacher_exact(sup, chunk_size=100)
    np.testing.assert_allclose(got.mean, want, rtol=1e-12)
    assert got.num_samples == 512
    assert float(got.stderr) == 0.0
    # one sign vector at a time, and a plain function with an explicit size, agree
    one = rad.rademacher_exact(sup, chunk_size=None)
    np.testing.assert_allclose(one.mean, want, rtol=1e-12)
    plain = rad.rademacher_exact(lambda s: sup(s), num_examples=9)
    np.testing.assert_allclose(plain.mean, want, rtol=1e-12)


def test_exact_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_examples"):
        rad.rademacher_exact(rad.linear_sup(jnp.ones((21, 2)), norm=2, radius=1.0))
    sup = rad.linear_sup(jnp.ones((3, 2)), norm=2, radius=1.0)
    with pytest.raises(ValueError, match="num_examples"):
        rad.rademacher_exact(sup, num_examples=4)
    with pytest.raises(ValueError, match="num_examples"):
        rad.rademacher_exact(lambda s: s[:, 0])
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_exact(sup, chunk_size=0)
    with pytest.raises(ValueError, match="sup: non-finite"):
        rad.rademacher_exact(lambda s: jnp.log(s[:, 0]), num_examples=3)


@pytest.mark.parametrize("keepdims", [False, True])
def test_exact_refuses_a_sup_that_does_not_return_one_value_per_sign_vector(keepdims):
    """A scalar (or [1, 1]) from a function sup was broadcast into a wrong average."""
    v = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)))

    def sup(s):
        return jnp.max(s @ v.T, axis=None, keepdims=keepdims) / 5

    with pytest.raises(ValueError, match=r"^sup: expected values of shape \(16,\).*got shape"):
        rad.rademacher_exact(sup, num_examples=4)
    with pytest.raises(ValueError, match=r"^sup: expected values of shape \(1,\)"):
        rad.rademacher_exact(sup, num_examples=4, chunk_size=None)
    right = rad.rademacher_exact(lambda s: jnp.max(s @ v.T, axis=1) / 5, num_examples=4)
    np.testing.assert_allclose(right.mean, np.mean(np.max(all_signs(4) @ v.T, axis=1)) / 5)


# ----------------------------------------------------------------------------- linear classes


def linear_reference(x, p, radius, scale=1.0):
    vals = np_dual(all_signs(x.shape[0]) @ x, p) * radius * scale / x.shape[0]
    return vals.mean(), vals.std()


@pytest.mark.parametrize("p", [1, 2, INF])
def test_linear_within_stderr_of_exact(p, run):
    x = np.random.default_rng(1).normal(size=(12, 5))
    exact, sd = linear_reference(x, p, 2.0)
    num = 2000
    est = run(
        lambda: rad.rademacher_linear(jnp.asarray(x), KEY, norm=p, radius=2.0, num_samples=num)
    )
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
    assert est.num_samples == num


@pytest.mark.parametrize(("q", "p"), [(1, INF), (2, 1), (1, 1), (2, 2)])
def test_matrix_class_dual_group_norm(q, p):
    # {x -> u^T W x : ||W||_{q,p} <= B}: sup = B ||u||_{q*} ||sum s_i x_i||_{p*} / n
    rng = np.random.default_rng(2)
    x, u = rng.normal(size=(10, 4)), rng.normal(size=(3,))
    exact, _ = linear_reference(x, p, 1.0, scale=np.linalg.norm(u, norms.dual_exponent(q)))
    sup = rad.linear_sup(jnp.asarray(x), norm=(q, p), radius=1.0, readout=jnp.asarray(u))
    np.testing.assert_allclose(rad.rademacher_exact(sup).mean, exact, rtol=1e-12)
    est = rad.rademacher_linear(
        jnp.asarray(x), KEY, norm=(q, p), radius=1.0, readout=jnp.asarray(u), num_samples=1000
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
    np.testing.assert_allclose(sup(jnp.asarray(s)), (u @ w @ x.T @ s) / 6, rtol=1e-12)


def test_sup_objects_are_pytrees():
    x = jnp.asarray(np.random.default_rng(4).normal(size=(5, 3)))
    s = rad.sign_vectors(KEY, num_samples=4, num_examples=5, dtype=jnp.float64)
    sup = rad.linear_sup(x, norm=1, radius=2.0)
    leaves = jax.tree_util.tree_leaves(sup)
    assert len(leaves) == 4  # inputs, scale, the power of two of the inputs, the exponent
    np.testing.assert_allclose(jax.jit(lambda t: t(s))(sup), sup(s), rtol=1e-12)
    np.testing.assert_allclose(sup.bound, 2.0 * np.max(np.abs(np.asarray(x))), rtol=1e-12)
    fin = rad.finite_sup(take_rows, x.T, num_members=3)
    assert fin.num_examples == 5
    np.testing.assert_allclose(jax.jit(lambda t: t(s))(fin), fin(s), rtol=1e-12)
    np.testing.assert_allclose(fin.bound, np.max(np.abs(np.asarray(x))), rtol=1e-12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sup.dual = 1.0  # type: ignore[misc]


def test_chunking_does_not_change_result():
    x = jnp.asarray(np.random.default_rng(4).normal(size=(40, 3)))
    ests = [
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_samples=300, chunk_size=c)
        for c in (None, 1, 7, 256, 300)
    ]
    for e in ests[1:]:
        np.testing.assert_allclose(e.mean, ests[0].mean, rtol=1e-12)
        np.testing.assert_allclose(e.stderr, ests[0].stderr, rtol=1e-10)
    # and equals the plain average over the materialised sign vectors
    s = np.asarray(rad.sign_vectors(KEY, num_samples=300, num_examples=40, dtype=jnp.float64))
    vals = np.linalg.norm(s @ np.asarray(x), axis=1) / 40
    np.testing.assert_allclose(ests[0].mean, vals.mean(), rtol=1e-12)
    np.testing.assert_allclose(ests[0].stderr, vals.std(ddof=1) / math.sqrt(300), rtol=1e-10)


def test_float32_in_float32_out():
    x = jnp.ones((16, 3), jnp.float32)
    est = rad.rademacher_linear(x, KEY, norm=1, radius=1.0, num_samples=10)
    assert est.mean.dtype == jnp.float32
    assert est.stderr.dtype == jnp.float32
    assert est.lower.dtype == jnp.float32


def test_traced_once_for_new_keys():
    count = [0]
    x = jnp.ones((8, 2))

    def body(key):
        count[0] += 1
        return rad.rademacher_linear(x, key, norm=2, radius=1.0, num_samples=16, chunk_size=4)

    f = jax.jit(body)
    for i in range(3):
        f(jax.random.key(i))
    assert count[0] == 1
    # vmapped over keys equals the loop
    keys = jax.random.split(KEY, 3)
    batched = jax.vmap(
        functools.partial(rad.rademacher_linear, x, norm=2, radius=1.0, num_samples=16)
    )(keys)
    for i in range(3):
        one = rad.rademacher_linear(x, keys[i], norm=2, radius=1.0, num_samples=16)
        np.testing.assert_allclose(batched.mean[i], one.mean, rtol=1e-12)


def test_linear_bad_arguments_raise():
    x = jnp.ones((4, 2))
    kw = dict(norm=2, radius=1.0, num_samples=4)
    with pytest.raises(ValueError, match="radius"):
        rad.rademacher_linear(x, KEY, **{**kw, "radius": 0.0})
    with pytest.raises(ValueError, match="num_samples"):
        rad.rademacher_linear(x, KEY, **{**kw, "num_samples": 1})
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_linear(jnp.ones(4), KEY, **kw)
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_linear(x.at[0, 0].set(jnp.nan), KEY, **kw)
    with pytest.raises(ValueError, match="p"):
        rad.rademacher_linear(x, KEY, **{**kw, "norm": 0.5})
    with pytest.raises(ValueError, match="readout"):
        rad.rademacher_linear(x, KEY, **{**kw, "norm": (1, 2)})
    with pytest.raises(ValueError, match="delta"):
        rad.rademacher_linear(x, KEY, **kw, delta=2.0)


@pytest.mark.parametrize("chunk_size", [0, -3, True, 2.0])
def test_bad_chunk_size_raises_everywhere(chunk_size):
    x = jnp.ones((4, 2))
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_linear(x, KEY, norm=2, radius=1.0, num_samples=4, chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_finite(
            take_rows, x, KEY, num_samples=4, num_members=4, chunk_size=chunk_size
        )
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_search(
            linear_fn,
            jnp.ones(2),
            x,
            KEY,
            project=l2_ball,
            num_samples=4,
            num_steps=2,
            step_size=0.1,
            chunk_size=chunk_size,
        )
    with pytest.raises(ValueError, match="chunk_size"):
        rad.rademacher_exact(rad.linear_sup(x, norm=2, radius=1.0), chunk_size=chunk_size)


@pytest.mark.parametrize(
    ("inputs", "key", "match"),
    [
        (np.ones((4, 2)), 0, "key"),
        (np.ones((0, 2)), KEY, "inputs"),
        (np.ones((4, 2), np.int32), KEY, "inputs.*float32"),
        (np.ones((4, 2), np.float16), KEY, "inputs.*float32"),
    ],
    ids=["int_key", "empty", "integer", "float16"],
)
def test_linear_bad_inputs_raise(inputs, key, match):
    with pytest.raises(ValueError, match=match):
        rad.rademacher_linear(jnp.asarray(inputs), key, norm=2, radius=1.0, num_samples=4)


# ----------------------------------------------------------------------------- finite classes


def test_finite_matches_enumeration_and_chunks():
    rng = np.random.default_rng(5)
    v = jnp.asarray(rng.normal(size=(53, 10)))
    exact = np.mean(np.max(all_signs(10) @ np.asarray(v).T, axis=1)) / 10
    got = rad.rademacher_exact(rad.finite_sup(take_rows, v, num_members=53, member_chunk_size=8))
    np.testing.assert_allclose(got.mean, exact, rtol=1e-12)
    kw = dict(num_samples=1500, num_members=53)
    a = rad.rademacher_finite(take_rows, v, KEY, member_chunk_size=8, chunk_size=100, **kw)
    b = rad.rademacher_finite(take_rows, v, KEY, **kw)
    c = rad.rademacher_finite(take_rows, v, KEY, member_chunk_size=53, chunk_size=None, **kw)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12)
    np.testing.assert_allclose(c.mean, b.mean, rtol=1e-12)
    assert abs(float(a.mean) - exact) <= 5 * float(a.stderr)
    hw = 2 * np.abs(np.asarray(v)).max() * math.sqrt(math.log(40) / (2 * 10 * 1500))
    np.testing.assert_allclose(a.upper - a.mean, hw, rtol=1e-10)
    np.testing.assert_allclose(b.upper - b.mean, hw, rtol=1e-10)
    assert float(a.lower) <= exact <= float(a.upper)


def test_finite_large_class_on_demand():
    # 200,003 members V_j = cos((j + 1) x): the output matrix is never materialised; the result
    # equals a numpy reference on the same sign vectors, computed in blocks.
    n, m = 16, 200_003
    x = jnp.linspace(0.1, 1.0, n)

    def cosines(idx, xs):
        return jnp.cos((idx[:, None] + 1).astype(xs.dtype) * xs[None, :])

    est = rad.rademacher_finite(
        cosines, x, KEY, num_samples=8, num_members=m, member_chunk_size=4096, delta=None
    )
    s = np.asarray(rad.sign_vectors(KEY, num_samples=8, num_examples=n, dtype=jnp.float64))
    best = np.full(8, -np.inf)
    for start in range(0, m, 50_000):
        j = np.arange(start, min(m, start + 50_000))
        best = np.maximum(best, (s @ np.cos((j[:, None] + 1.0) * np.asarray(x)[None, :]).T).max(1))
    np.testing.assert_allclose(est.mean, best.mean() / n, rtol=1e-12)


def test_finite_bad_arguments_raise():
    v = jnp.ones((5, 3))
    kw = dict(num_samples=4, num_members=5)
    with pytest.raises(ValueError, match="outputs_fn"):
        rad.rademacher_finite(lambda idx, b: jnp.ones(3), v, KEY, **kw)
    with pytest.raises(ValueError, match=r"outputs_fn.*float32"):
        rad.rademacher_finite(lambda idx, b: b[idx].astype(jnp.float16), v, KEY, **kw)
    with pytest.raises(ValueError, match="outputs_fn"):
        rad.rademacher_finite(lambda idx, b: b[idx][:, :0], v, KEY, **kw)
    with pytest.raises(ValueError, match="batch"):
        rad.rademacher_finite(take_rows, jnp.ones((5, 0)), KEY, **kw)
    with pytest.raises(ValueError, match="num_members"):
        rad.rademacher_finite(take_rows, v, KEY, num_samples=4, num_members=0)
    with pytest.raises(ValueError, match="num_members"):
        rad.rademacher_finite(take_rows, v, KEY, num_samples=4)
    with pytest.raises(ValueError, match="key"):
        rad.rademacher_finite(take_rows, v, 0, **kw)
    with pytest.raises(ValueError, match="batch"):
        rad.rademacher_finite(take_rows, v.at[1, 1].set(jnp.inf), KEY, **kw)
    with pytest.raises(ValueError, match=r"batch.*float32"):
        rad.rademacher_finite(take_rows, v.astype(jnp.float16), KEY, **kw)


def test_finite_non_finite_outputs_are_counted():
    # finite data, but the outputs of member 2 are NaN: every sign vector sees it
    v = jnp.asarray(np.random.default_rng(6).normal(size=(4, 6)))

    def outputs(idx, b):
        return jnp.where((idx == 2)[:, None], jnp.nan, b[idx])

    with pytest.raises(ValueError, match="outputs_fn: non-finite value at 5 of the 5"):
        rad.rademacher_finite(outputs, v, KEY, num_samples=5, num_members=4)


# ----------------------------------------------------------------------------- search


@pytest.mark.parametrize(("p", "steps"), [(2, 30), (1, 60), (INF, 30)])
def test_search_reaches_linear_sup_within_one_percent(p, steps):
    rng = np.random.default_rng(6)
    n, d = 64, 8
    x = jnp.asarray(rng.normal(size=(n, d)))
    w0 = jnp.asarray(rng.normal(size=(d,))) * 0.01
    radius = 1.5
    exact = rad.rademacher_linear(x, KEY, norm=p, radius=radius, num_samples=64, delta=None)
    est = rad.rademacher_search(
        linear_fn,
        w0,
        x,
        KEY,
        project=lambda w: norms.project_lp_ball(w, p=p, radius=radius),
        num_samples=64,
        num_steps=steps,
        step_size=2 * radius,
        num_restarts=2,
        chunk_size=16,
        delta=None,
    )
    # same key -> same sign vectors: the search is a lower bound and within 1% of the sup
    assert float(est.mean) <= float(exact.mean) * (1 + 1e-12)
    assert float(est.mean) >= 0.99 * float(exact.mean)


def tanh_net(p, xs):
    return jnp.tanh(xs @ p["w"]) @ p["v"]


def unit_balls(p):
    return {k: norms.project_lp_ball(v, p=2, radius=1.0) for k, v in p.items()}


def test_search_is_lower_bound_per_sign_vector_on_a_network():
    # tanh network with a frobenius-ball constraint; every search value is attained by a
    # feasible parameter, so it is <= the sup; check against a dense random-feasible sweep that
    # the search is at least as good, and that no value exceeds the trivial bound.
    rng = np.random.default_rng(7)
    n, d, h = 10, 3, 4
    x = jnp.asarray(rng.normal(size=(n, d)))
    params = {"w": jnp.asarray(rng.normal(size=(d, h))) * 0.3, "v": jnp.asarray(rng.normal(size=h))}
    sup = rad.search_sup(
        tanh_net, params, x, KEY, project=unit_balls, num_steps=40, step_size=0.3, num_restarts=3
    )
    assert sup.num_examples == n
    s = rad.sign_vectors(KEY, num_samples=4, num_examples=n, dtype=jnp.float64)
    vals, top = (np.asarray(a) for a in sup.search(s))
    np.testing.assert_array_equal(vals, np.asarray(sup(s)))
    sweep = jax.vmap(unit_balls)(
        {
            "w": jnp.asarray(rng.normal(size=(2000, d, h))),
            "v": jnp.asarray(rng.normal(size=(2000, h))),
        }
    )
    outs = jax.vmap(tanh_net, in_axes=(0, None))(sweep, x)  # [2000, n]
    best_random = np.max(np.asarray(s) @ np.asarray(outs).T, axis=1) / n
    assert np.all(vals >= best_random - 1e-9)
    # |f| <= ||v||_1 <= sqrt(h) on the unit balls, for the values and the outputs seen
    assert np.all(vals <= math.sqrt(h) + 1e-12)
    assert np.all(top <= math.sqrt(h) + 1e-12)
    assert np.all(top >= np.abs(vals))  # |<s, f>| / n <= max |f|


def test_search_chunking_does_not_change_result():
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(7, 3)))
    kw = dict(project=l2_ball, num_samples=6, num_steps=6, step_size=1.0, num_restarts=2)
    ests = [
        rad.rademacher_search(linear_fn, jnp.ones(3), x, KEY, chunk_size=c, **kw)
        for c in (None, 4, 6)
    ]
    for e in ests[1:]:
        np.testing.assert_allclose(e.mean, ests[0].mean, rtol=1e-10)
        np.testing.assert_allclose(e.stderr, ests[0].stderr, rtol=1e-8)


def search_kw(**over):
    kw = dict(project=l2_ball, num_samples=4, num_steps=10, step_size=0.5)
    kw.update(over)
    return kw


def test_search_interval_is_one_sided():
    x = jnp.eye(4)
    est = rad.rademacher_search(linear_fn, jnp.full(4, 0.1), x, KEY, **search_kw(output_bound=1.0))
    hw = 2 * math.sqrt(math.log(40) / (2 * 4 * 4))
    np.testing.assert_allclose(est.lower, est.mean - hw, rtol=1e-12)
    assert float(est.upper) == INF
    # without delta there is no interval (and output_bound is not needed)
    est = rad.rademacher_search(linear_fn, jnp.full(4, 0.1), x, KEY, **search_kw(delta=None))
    assert est.lower is None


def test_search_output_bound_is_checked():
    # outputs on the unit ball reach max_i ||x_i||_2 > 2: a bound of 0.01 is false
    x = jnp.asarray(np.random.default_rng(9).normal(size=(12, 5)))
    reach = float(np.max(np.linalg.norm(np.asarray(x), axis=1)))
    assert reach > 1.0
    w0 = jnp.zeros(5)
    with pytest.raises(ValueError, match=r"output_bound: expected a finite value > 0"):
        rad.rademacher_search(linear_fn, w0, x, KEY, **search_kw(output_bound=-1.0))
    with pytest.raises(ValueError, match=r"output_bound: 0.01 is exceeded"):
        rad.rademacher_search(linear_fn, w0, x, KEY, **search_kw(output_bound=0.01))
    jitted = jax.jit(
        lambda b: rad.rademacher_search(linear_fn, w0, x, KEY, **search_kw(output_bound=b)).lower
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"output_bound: 0.01 is exceeded"):
        jax.block_until_ready(jitted(jnp.asarray(0.01)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="output_bound: expected a finite"):
        jax.block_until_ready(jitted(jnp.asarray(-1.0)))
    # with runtime checks off: never an invalid interval, the lower end is -inf
    with _checks.runtime_checks(False):
        for b in (0.01, -1.0):  # arrays: checked at run time, so the switch applies
            bound = jnp.asarray(b)
            est = rad.rademacher_search(linear_fn, w0, x, KEY, **search_kw(output_bound=bound))
            assert float(est.lower) == -INF
            assert float(est.upper) == INF
            assert np.isfinite(float(est.mean))
    # a true bound (sup over the unit ball of |<w, x_i>| is max_i ||x_i||) gives the interval
    est = rad.rademacher_search(linear_fn, w0, x, KEY, **search_kw(output_bound=reach * 1.001))
    hw = 2 * reach * 1.001 * math.sqrt(math.log(40) / (2 * 12 * 4))
    np.testing.assert_allclose(est.lower, est.mean - hw, rtol=1e-12)


def test_search_bad_arguments_raise():
    x = jnp.eye(3)
    kw = search_kw(num_steps=2, step_size=0.1)
    w = jnp.ones(3)
    with pytest.raises(ValueError, match="apply_fn"):
        rad.rademacher_search(lambda w, xs: xs, w, x, KEY, **kw)
    with pytest.raises(ValueError, match="step_size"):
        rad.rademacher_search(linear_fn, w, x, KEY, **{**kw, "step_size": 0})
    with pytest.raises(ValueError, match="num_steps"):
        rad.rademacher_search(linear_fn, w, x, KEY, **{**kw, "num_steps": 0})
    with pytest.raises(ValueError, match="key"):
        rad.rademacher_search(linear_fn, w, x, 0, **kw)
    with pytest.raises(ValueError, match=r"params.*float32"):
        rad.rademacher_search(linear_fn, jnp.ones(3, jnp.int32), x, KEY, **kw)
    with pytest.raises(ValueError, match=r"params.*float32"):
        rad.rademacher_search(linear_fn, w.astype(jnp.float16), x, KEY, **kw)
    with pytest.raises(ValueError, match="params"):
        rad.rademacher_search(linear_fn, w.at[0].set(jnp.nan), x, KEY, **kw)
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_search(linear_fn, w, jnp.ones((0, 3)), KEY, **kw)
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_search(linear_fn, w, x.astype(jnp.float16), KEY, **kw)
    with pytest.raises(ValueError, match="apply_fn: outputs at project"):
        rad.rademacher_search(lambda w, xs: jnp.log(xs @ w - 2), w, x, KEY, **kw)


# ----------------------------------------------------------------------------- compile once


def test_compile_once_linear_and_exact():
    rng = np.random.default_rng(10)
    x1, x2 = (jnp.asarray(rng.normal(size=(9, 3))) for _ in range(2))
    key2, radius2 = jax.random.key(7), jnp.asarray(2.0)
    kw = dict(norm=2, num_samples=10, chunk_size=4)
    rad.rademacher_linear(x1, KEY, radius=jnp.asarray(1.0), **kw)
    sup1, sup2 = (rad.linear_sup(x, norm=1, radius=1.0) for x in (x1, x2))
    rad.rademacher_exact(sup1)
    with count_compiles() as messages:
        rad.rademacher_linear(x2, key2, radius=radius2, **kw)
        rad.rademacher_exact(sup2)
    assert compiles_in(messages) == []


def test_compile_once_finite():
    rng = np.random.default_rng(11)
    v1, v2 = (jnp.asarray(rng.normal(size=(20, 6))) for _ in range(2))
    fn = TraceCounter(take_rows)
    kw = dict(num_samples=6, num_members=20, member_chunk_size=8, chunk_size=4)
    rad.rademacher_finite(fn, v1, KEY, **kw)
    # outputs of the first block (n, dtype), the bound pass, one shared trace of the sup pass
    assert fn.count <= 3
    first = fn.count
    key2 = jax.random.key(3)
    with count_compiles() as messages:
        rad.rademacher_finite(fn, v2, key2, **kw)
    assert fn.count == first
    assert compiles_in(messages) == []


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class Ball:
    """A projection whose radius is a pytree leaf: a new radius compiles nothing."""

    radius: jax.Array

    def __call__(self, w):
        return norms.project_lp_ball(w, p=2, radius=self.radius)


def test_compile_once_search():
    rng = np.random.default_rng(12)
    x1, x2 = (jnp.asarray(rng.normal(size=(7, 3))) for _ in range(2))
    w1, w2 = (jnp.asarray(rng.normal(size=3)) * 0.1 for _ in range(2))
    key2, bound2, ball2 = jax.random.key(9), jnp.asarray(5.0), Ball(jnp.asarray(0.5))
    apply_fn = TraceCounter(lambda w, xs: jnp.tanh(xs @ w))
    kw = dict(
        num_samples=4,
        num_steps=3,
        step_size=jnp.asarray(0.5),
        num_restarts=2,
        chunk_size=2,
    )
    bound1, ball1 = jnp.asarray(4.0), Ball(jnp.asarray(1.0))
    rad.rademacher_search(apply_fn, w1, x1, KEY, project=ball1, output_bound=bound1, **kw)
    # outputs at project(params) (n, dtype, finite check), one shared trace of the ascent
    assert apply_fn.count <= 2
    first = apply_fn.count
    with count_compiles() as messages:
        est = rad.rademacher_search(
            apply_fn, w2, x2, key2, project=ball2, output_bound=bound2, **kw
        )
    assert apply_fn.count == first
    assert compiles_in(messages) == []
    assert np.isfinite(float(est.lower))


# ----------------------------------------------------------------------------- runtime checks


def jitted_kernels(x):
    """Fresh user-jitted calls (the switch applies to programs traced after it is set)."""
    linear = jax.jit(
        lambda x, r: rad.rademacher_linear(x, KEY, norm=2, radius=r, num_samples=4).mean
    )
    search = jax.jit(
        lambda w: rad.rademacher_search(linear_fn, w, x, KEY, **search_kw(num_steps=2)).mean
    )
    finite = jax.jit(
        lambda v: rad.rademacher_finite(take_rows, v, KEY, num_samples=4, num_members=6).mean
    )
    return linear, search, finite


def test_runtime_checks_under_jit_and_switch():
    x = jnp.asarray(np.random.default_rng(13).normal(size=(6, 2)))
    bad, bad_w = x.at[0, 0].set(jnp.nan), jnp.array([jnp.nan, 0.0])
    linear, search, finite = jitted_kernels(x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="inputs: expected finite"):
        jax.block_until_ready(linear(bad, 1.0))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"radius: expected a finite value > 0"):
        jax.block_until_ready(linear(x, -1.0))
    with pytest.raises(ValueError, match="radius"):
        rad.rademacher_linear(x, KEY, norm=2, radius=jnp.asarray(-1.0), num_samples=4)
    with pytest.raises(jax.errors.JaxRuntimeError, match="params: expected finite"):
        jax.block_until_ready(search(bad_w))
    with pytest.raises(jax.errors.JaxRuntimeError, match="batch: expected finite"):
        jax.block_until_ready(finite(bad))
    with _checks.runtime_checks(False):
        linear, search, finite = jitted_kernels(x)
        assert np.isnan(float(linear(bad, 1.0)))
        assert np.isnan(float(search(bad_w)))
        assert np.isnan(float(finite(bad)))
        # eager calls compile a program without checks too
        est = rad.rademacher_linear(bad, KEY, norm=2, radius=1.0, num_samples=4)
        assert np.isnan(float(est.mean))


def test_mcdiarmid_halfwidth_checks():
    np.testing.assert_allclose(
        mcd := rad.mcdiarmid_halfwidth(2.0, num_examples=8, num_samples=3, delta=0.1),
        4 * math.sqrt(math.log(20) / 48),
        rtol=1e-12,
    )
    assert mcd > 0
    with pytest.raises(ValueError, match="delta"):
        rad.mcdiarmid_halfwidth(1.0, num_examples=8, num_samples=3, delta=1.0)
    with pytest.raises(ValueError, match="bound"):
        rad.mcdiarmid_halfwidth(-1.0, num_examples=8, num_samples=3, delta=0.1)
    with pytest.raises(ValueError, match="num_examples"):
        rad.mcdiarmid_halfwidth(1.0, num_examples=0, num_samples=3, delta=0.1)


# ----------------------------------------------------------------------------- readout search


def fixed_features(v, xs):
    return xs  # features that ignore the inner parameters: a linear class, searched exactly


def identity(v):
    return v


def readout_kw(**over):
    kw = dict(project=identity, readout_norm=2, readout_radius=1.0, num_samples=4, num_steps=1)
    kw.update(step_size=0.5, delta=None)
    kw.update(over)
    return kw


@pytest.mark.parametrize("q", [1, 2, 4, INF])
def test_readout_search_with_fixed_features_is_the_linear_closed_form(q):
    # phi_V(x) = x: the class is {x -> <w, x> : ||w||_q <= B}, whose sup is B/n ||X^T s||_{q*}
    rng = np.random.default_rng(20)
    n, d, radius = 8, 3, 1.7
    x = jnp.asarray(rng.normal(size=(n, d)))
    kw = dict(project=identity, readout_norm=q, readout_radius=radius, num_steps=2, step_size=0.5)
    sup = rad.readout_search_sup(fixed_features, jnp.zeros(1), x, KEY, **kw)
    signs = all_signs(n)
    closed = radius / n * np_dual(signs @ np.asarray(x), q)
    np.testing.assert_allclose(np.asarray(sup(jnp.asarray(signs))), closed, rtol=1e-13)
    exact = rad.rademacher_exact(sup)
    np.testing.assert_allclose(float(exact.mean), closed.mean(), rtol=1e-13)
    # the Monte Carlo kernel: the same sign vectors, values and stderr as rademacher_linear
    est = rad.rademacher_readout_search(
        fixed_features, jnp.zeros(1), x, KEY, num_samples=32, chunk_size=8, delta=None, **kw
    )
    lin = rad.rademacher_linear(x, KEY, norm=q, radius=radius, num_samples=32, delta=None)
    np.testing.assert_allclose(float(est.mean), float(lin.mean), rtol=1e-13)
    np.testing.assert_allclose(float(est.stderr), float(lin.stderr), rtol=1e-10)
    assert est.num_samples == 32


def inner_linear(v, xs):
    return xs @ v


def frobenius_ball(v):
    return norms.project_lp_ball(v, p=2, radius=1.0)


@pytest.mark.parametrize(("q", "factor"), [(1, 1.0), (2, 1.0), (INF, math.sqrt(3))])
def test_readout_search_through_an_inner_matrix_reaches_its_closed_form(q, factor):
    # {x -> w^T V^T x : ||V||_F <= 1, ||w||_q <= B}: sup over V of ||V^T a||_{q*} with a = X^T s
    # is ||a||_2 for q* in {2, inf} and sqrt(k) ||a||_2 for q* = 1 (k = 3 columns)
    rng = np.random.default_rng(21)
    n, d, k, radius = 16, 4, 3, 0.8
    x = jnp.asarray(rng.normal(size=(n, d)))
    v0 = frobenius_ball(jnp.asarray(rng.normal(size=(d, k))))
    s = rad.sign_vectors(KEY, num_samples=8, num_examples=n, dtype=jnp.float64)
    closed = factor * radius / n * np.linalg.norm(np.asarray(s) @ np.asarray(x), axis=1)
    sup = rad.readout_search_sup(
        inner_linear, v0, x, KEY, project=frobenius_ball, readout_norm=q, readout_radius=radius,
        num_steps=30, step_size=2.0, num_restarts=2,
    )  # fmt: skip
    vals, top = (np.asarray(a) for a in sup.search(s))
    assert np.all(vals <= closed * (1 + 1e-12))
    assert np.all(vals >= 0.99 * closed)
    # the output bound seen, B max_i ||V^T x_i||_{q*}, is at most its sup over the ball
    reach = factor * radius * np.max(np.linalg.norm(np.asarray(x), axis=1))
    assert np.all(top <= reach * (1 + 1e-12))
    assert np.all(top >= vals)


def tanh_features(w, xs):
    return jnp.tanh(xs @ w)


def test_readout_search_is_not_below_plain_ascent_on_a_two_layer_net():
    # the same class two ways: {x -> v^T tanh(W^T x) : ||W||_F <= 1, ||v||_2 <= 1}
    rng = np.random.default_rng(22)
    n, d, h, draws = 24, 3, 6, 16
    x = jnp.asarray(rng.normal(size=(n, d)))
    params = {"w": jnp.asarray(rng.normal(size=(d, h))) * 0.3, "v": jnp.asarray(rng.normal(size=h))}
    common = dict(num_samples=draws, num_steps=15, step_size=1.0, chunk_size=8, delta=None)
    plain = rad.rademacher_search(tanh_net, params, x, KEY, project=unit_balls, **common)
    readout = rad.rademacher_readout_search(
        tanh_features, params["w"], x, KEY, project=frobenius_ball, readout_norm=2,
        readout_radius=1.0, **common,
    )  # fmt: skip
    # the same key gives the same sign vectors: compare the means over those draws
    assert float(readout.mean) >= float(plain.mean) - float(plain.stderr)
    # both are lower bounds of one sup: |f| <= ||v||_2 ||tanh||_2 <= sqrt(h)
    assert float(readout.mean) <= math.sqrt(h)


def test_readout_search_interval_chunks_and_dtype():
    rng = np.random.default_rng(23)
    n, d, h = 10, 3, 4
    x = jnp.asarray(rng.normal(size=(n, d)))
    w0 = frobenius_ball(jnp.asarray(rng.normal(size=(d, h))))
    kw = readout_kw(project=frobenius_ball, num_samples=6, num_steps=4, delta=0.05)
    run = functools.partial(rad.rademacher_readout_search, tanh_features)
    # |w^T tanh(.)| <= B ||tanh(.)||_2 <= B sqrt(h): a valid output bound gives the interval
    bound = math.sqrt(h)
    ests = [run(w0, x, KEY, chunk_size=c, output_bound=jnp.asarray(bound), **kw) for c in (None, 4)]
    np.testing.assert_allclose(ests[1].mean, ests[0].mean, rtol=1e-10)
    np.testing.assert_allclose(ests[1].stderr, ests[0].stderr, rtol=1e-8)
    hw = 2 * bound * math.sqrt(math.log(40) / (2 * n * 6))
    np.testing.assert_allclose(ests[1].lower, ests[1].mean - hw, rtol=1e-12)
    assert float(ests[1].upper) == INF
    with pytest.raises(ValueError, match=r"output_bound: 0.01 is exceeded"):
        run(w0, x, KEY, chunk_size=4, output_bound=jnp.asarray(0.01), **kw)
    # float32 in, float32 out (one start, so no float32 Gaussian restart differs from float64)
    est32 = run(w0.astype(jnp.float32), x.astype(jnp.float32), KEY, **{**kw, "delta": None})
    assert est32.mean.dtype == jnp.float32
    # a float32 matmul (the features) is on the path: TF32 on a GPU at JAX's defaults
    np.testing.assert_allclose(float(est32.mean), float(ests[0].mean), rtol=matmul_tol(jnp.float32))


def test_readout_search_zero_features_have_zero_value_and_finite_gradient():
    # at V = 0 the features x @ V vanish: value 0, and the smooth dual norm's gradient is 0,
    # not NaN (the search stays at 0, which is the sup for V in {0})
    x = jnp.eye(3)
    est = rad.rademacher_readout_search(
        inner_linear, jnp.zeros((3, 2)), x, KEY, **readout_kw(project=lambda v: v * 0.0)
    )
    assert float(est.mean) == 0.0


def test_readout_search_bad_arguments_raise():
    x = jnp.eye(3)
    w = jnp.ones(1)
    call = functools.partial(rad.rademacher_readout_search, fixed_features, w, x, KEY)
    for q in (0.5, 0, -1, float("nan"), "2", True, None, (2, 2)):
        with pytest.raises(ValueError, match="readout_norm"):
            call(**readout_kw(readout_norm=q))
    for b in (0.0, -1.0, float("inf"), "1"):
        with pytest.raises(ValueError, match="readout_radius"):
            call(**readout_kw(readout_radius=b))
    with pytest.raises(ValueError, match=r"features_fn: must return features \[n, k\]"):
        rad.rademacher_readout_search(lambda v, xs: xs[:, 0], w, x, KEY, **readout_kw())
    with pytest.raises(ValueError, match="inputs"):
        rad.rademacher_readout_search(fixed_features, w, jnp.ones((0, 3)), KEY, **readout_kw())
    with pytest.raises(ValueError, match="features_fn: features at project"):
        rad.rademacher_readout_search(lambda v, xs: jnp.log(xs - 2), w, x, KEY, **readout_kw())
    bad = [
        ("step_size", {"step_size": 0}),
        ("num_steps", {"num_steps": 0}),
        ("num_restarts", {"num_restarts": 0}),
        ("num_samples", {"num_samples": 1}),
        ("chunk_size", {"chunk_size": 0}),
        ("init_scale", {"init_scale": -1.0}),
        ("output_bound", {"output_bound": -1.0, "delta": 0.05}),
        ("delta", {"delta": 1.5}),
    ]
    for name, over in bad:
        with pytest.raises(ValueError, match=name):
            call(**readout_kw(**over))
    with pytest.raises(ValueError, match="key"):
        rad.rademacher_readout_search(fixed_features, w, x, 0, **readout_kw())
    with pytest.raises(ValueError, match=r"params.*float32"):
        rad.rademacher_readout_search(fixed_features, w.astype(jnp.int32), x, KEY, **readout_kw())
    with pytest.raises(ValueError, match="params"):
        rad.rademacher_readout_search(fixed_features, w * jnp.nan, x, KEY, **readout_kw())
    # traced radius: checked inside the program, naming the argument
    jitted = jax.jit(lambda b: call(**readout_kw(readout_radius=b)).mean)
    with pytest.raises(jax.errors.JaxRuntimeError, match="readout_radius: expected a finite"):
        jax.block_until_ready(jitted(jnp.asarray(-1.0)))
    np.testing.assert_allclose(float(jitted(jnp.asarray(2.0))), 2 * math.sqrt(3) / 3, rtol=1e-12)


def test_compile_once_readout_search():
    rng = np.random.default_rng(24)
    x1, x2 = (jnp.asarray(rng.normal(size=(7, 3))) for _ in range(2))
    w1, w2 = (jnp.asarray(rng.normal(size=(3, 2))) * 0.1 for _ in range(2))
    features = TraceCounter(tanh_features)
    kw = readout_kw(
        project=Ball(jnp.asarray(1.0)), readout_radius=jnp.asarray(1.0), num_steps=3,
        step_size=jnp.asarray(0.5), num_restarts=2, chunk_size=2,
    )  # fmt: skip
    rad.rademacher_readout_search(features, w1, x1, KEY, **kw)
    assert features.count <= 2  # features at project(params), one shared trace of the ascent
    first = features.count
    kw2 = {**kw, "project": Ball(jnp.asarray(0.5)), "readout_radius": jnp.asarray(2.0)}
    with count_compiles() as messages:
        rad.rademacher_readout_search(features, w2, x2, jax.random.key(9), **kw2)
    assert features.count == first
    assert compiles_in(messages) == []


def blows_up_outside_unit_ball(w):
    # feasible (and finite) at the start, NaN once an iterate leaves the unit ball
    return jnp.where(jnp.sqrt(jnp.sum(w * w)) > 1.0, jnp.nan, 1.0) * w


def test_search_nan_iterate_is_reported_though_the_loop_is_unchecked():
    # the ascent's loop body runs without runtime checks; a NaN iterate must still fail
    x = jnp.asarray(np.random.default_rng(25).normal(size=(6, 3)))
    w0 = jnp.full(3, 0.1)
    kw = dict(project=blows_up_outside_unit_ball, num_samples=4, num_steps=3, step_size=5.0)
    with pytest.raises(ValueError, match=r"apply_fn: non-finite value at 4 of the 4 sign"):
        rad.rademacher_search(linear_fn, w0, x, KEY, **kw)
    with pytest.raises(ValueError, match=r"features_fn: non-finite value at 4 of the 4 sign"):
        rad.rademacher_readout_search(
            inner_linear, w0[:, None], x, KEY, readout_norm=2, readout_radius=1.0, **kw
        )


# ----------------------------------------------------------------------------- at scale


def test_sign_chunks_past_2_32_use_64_bit_draw_indices():
    """Chunk 2**29 + 1 of 8 draws starts at draw 2**32 + 8: its rows are the sign vectors of
    sample_key(key, 2**32 + 8 + r) (sign draws past 2**32 are new draws, not draws r + 8), from
    a Python and from a traced chunk index (64-bit product of uint32 words)."""
    from kernels import parallel
    from kernels._random import sign_vector

    n = 37
    chunk = rad.sign_chunk(KEY, 2**29 + 1, chunk_size=8, num_examples=n)
    want = np.stack([sign_vector(parallel.sample_key(KEY, 2**32 + 8 + r), n, jnp.float32)
                     for r in range(8)])  # fmt: skip
    np.testing.assert_array_equal(chunk, want)
    traced = jax.jit(lambda c: rad.sign_chunk(KEY, c, chunk_size=8, num_examples=n))(
        jnp.uint32(2**29 + 1)
    )
    np.testing.assert_array_equal(traced, want)
    assert not np.array_equal(chunk, rad.sign_chunk(KEY, 1, chunk_size=8, num_examples=n))
    with pytest.raises(ValueError, match=r"^chunk_index"):
        rad.sign_chunk(KEY, 2**50, chunk_size=2**4, num_examples=3)


def test_mul_words_is_the_64_bit_product():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, size=200, dtype=np.uint64)
    for b in (1, 7, 2**16 - 1, 2**16, 2**31 - 1, 2**32 - 1):
        hi, lo = rad._mul_words(jnp.asarray(a.astype(np.uint32)), b)
        got = np.asarray(hi).astype(object) * 2**32 + np.asarray(lo).astype(object)
        assert list(got) == [int(x) * b for x in a]


def test_finite_member_indices_do_not_wrap_at_int32():
    """M = 2**31 - 1 members: the last block's indices stay in [0, M) and the padding is
    masked (the old b * chunk + arange wrapped to negative indices that passed idx < M)."""
    m, mc = 2**31 - 1, 1000

    def index_outputs(idx, batch):
        return idx[:, None].astype(jnp.float64)

    sup = rad.finite_sup(index_outputs, None, num_members=m, member_chunk_size=mc)
    last = sup.num_blocks - 1
    vals, valid = sup.block(last)
    vals = np.asarray(vals)[:, 0]
    assert vals.min() >= last * mc
    assert vals.max() == m - 1
    assert int(np.sum(valid)) == m - last * mc
    np.testing.assert_array_equal(vals[np.asarray(valid)], np.arange(last * mc, m))
    with pytest.raises(ValueError, match=r"^num_members: at most 2\*\*31 - 1"):
        rad.finite_sup(index_outputs, None, num_members=2**31, member_chunk_size=mc)


@pytest.mark.slow
def test_finite_exact_with_2_31_minus_1_members():
    """The issue's class: M = 2**31 - 1 members with outputs j / M, n = 1: Rad = max_j V_j / 2
    = (M - 1) / (2M) (the wrapped indices gave 1.0)."""
    m = 2**31 - 1

    def scaled(idx, batch):
        return (idx.astype(jnp.float64) / m)[:, None]

    sup = rad.finite_sup(scaled, None, num_members=m, member_chunk_size=2**22)
    est = rad.rademacher_exact(sup)
    np.testing.assert_allclose(float(est.mean), (m - 1) / (2 * m), rtol=1e-15)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_linear_norms_neither_overflow_nor_underflow(dtype):
    """rademacher_linear(1e-20 eye(4), radius=1e20) is 0.5 for every sign vector (the unscaled
    sum of squares gave 0 in float32), and 1e20 eye(4) with radius 1e-20 too (it gave inf)."""
    x = jnp.eye(4, dtype=dtype)
    for scale in (1e-20, 1e20):
        est = rad.rademacher_linear(scale * x, KEY, norm=2, radius=1 / scale, num_samples=8)
        assert est.mean.dtype == dtype
        np.testing.assert_allclose(float(est.mean), 0.5, rtol=tol(dtype))
        assert float(est.stderr) <= tol(dtype)
        assert float(est.lower) < 0.5 < float(est.upper)


def test_mcdiarmid_with_a_tiny_delta_is_finite():
    for delta in (1e-308, 5e-324):
        got = float(rad.mcdiarmid_halfwidth(1.0, num_examples=10_000, num_samples=1, delta=delta))
        want = 2 * math.sqrt((math.log(2) - math.log(delta)) / (2 * 10_000))
        assert math.isfinite(got)
        np.testing.assert_allclose(got, want, rtol=1e-14)


def test_counts_past_2_53_are_refused():
    with pytest.raises(ValueError, match=r"^num_samples: at most 2\*\*53"):
        rad.rademacher_linear(jnp.eye(3), KEY, norm=2, radius=1.0, num_samples=2**53 + 1)


def test_rbg_keys_keep_the_chunk_invariance():
    """rbg keys: vmap of rng_bit_generator draws a batch from its first key, so vectorised
    chunks changed the estimate with chunk_size; their draws now run one at a time (unsafe_rbg:
    tests/kernels/test_parallel.py)."""
    key = jax.random.key(3, impl="rbg")
    x = jnp.asarray(np.random.default_rng(4).normal(size=(9, 3)))
    means = [float(rad.rademacher_linear(x, key, norm=2, radius=1.0, num_samples=21,
                                         chunk_size=c).mean) for c in (None, 4, 64)]  # fmt: skip
    np.testing.assert_allclose(means, means[0], rtol=1e-12)
    rows = rad.sign_vectors(key, num_samples=6, num_examples=9)
    np.testing.assert_array_equal(rad.sign_chunk(key, 1, chunk_size=3, num_examples=9), rows[3:])


def test_first_bad_argument_is_named_and_project_never_sees_it():
    """Runtime checks run in argument order on every backend: NaN params are reported as params
    (a GPU reported the projection's own 'v' check first), and the user's projection is handed
    cleaned values, so its checks never fire for an argument of the kernel."""
    seen = []

    def watching_ball(w):
        jax.debug.callback(lambda ok: seen.append(bool(ok)), jnp.all(jnp.isfinite(w)))
        return norms.project_lp_ball(w, p=2, radius=1.0)

    x, w = jnp.eye(3), jnp.ones(3).at[0].set(jnp.nan)
    with pytest.raises(ValueError, match=r"^params: expected finite"):
        rad.rademacher_search(linear_fn, w, x, KEY, **search_kw(project=watching_ball))
    assert seen
    assert all(seen)

    @jax.jit
    def both_bad(step, params):
        return rad.rademacher_search(linear_fn, params, x, KEY,
                                     **search_kw(step_size=step)).mean  # fmt: skip

    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(both_bad(jnp.asarray(-1.0), w))  # a GPU reports it when read
    assert _checks.failed_check_message(info.value).startswith("step_size")


def test_mismatched_shapes_name_the_argument():
    sup = rad.linear_sup(jnp.eye(3), norm=2, radius=1.0)
    with pytest.raises(ValueError, match=r"^signs: expected sign vectors \[\.\.\., 3\]"):
        sup(jnp.ones((2, 4)))
    fsup = rad.finite_sup(take_rows, jnp.eye(3), num_members=3)
    with pytest.raises(ValueError, match=r"^signs"):
        fsup(jnp.ones(2))
    with pytest.raises(ValueError, match=r"^project: must return"):
        rad.rademacher_search(linear_fn, jnp.ones(3), jnp.eye(3), KEY,
                              **search_kw(project=lambda w: w[:2]))  # fmt: skip


def bf16_features(w, xs):
    """tanh features whose matmul rounds its operands to bfloat16 (what TF32/bfloat16 passes
    do to a float32 matmul on an accelerator; the CPU ignores the precision setting)."""
    bf = lambda a: a.astype(jnp.bfloat16).astype(a.dtype)  # noqa: E731
    return jnp.tanh(bf(xs) @ bf(w))


def test_readout_search_under_reduced_precision_matmuls():
    """The float32 readout search with the features' matmul at bfloat16 precision is finite
    and close to float64; its closed-form value is computed at full precision."""
    rng = np.random.default_rng(23)
    n, d, h = 10, 3, 4
    x = jnp.asarray(rng.normal(size=(n, d)))
    w0 = frobenius_ball(jnp.asarray(rng.normal(size=(d, h))))
    kw = readout_kw(project=frobenius_ball, num_samples=6, num_steps=4)
    e64 = rad.rademacher_readout_search(bf16_features, w0, x, KEY, **kw)
    e32 = rad.rademacher_readout_search(
        bf16_features, w0.astype(jnp.float32), x.astype(jnp.float32), KEY, **kw
    )
    assert np.isfinite(float(e32.mean))
    np.testing.assert_allclose(float(e32.mean), float(e64.mean), rtol=matmul_tol(jnp.float32))
    sup = rad.readout_search_sup(bf16_features, w0, x, KEY, project=frobenius_ball,
                                 readout_norm=2, readout_radius=1.0, num_steps=1,
                                 step_size=1.0)  # fmt: skip
    jaxpr = str(jax.make_jaxpr(sup._objective)(jnp.ones(n), w0))
    assert "Precision.HIGHEST" in jaxpr


def test_linear_bf16x2_is_far_below_the_monte_carlo_error():
    """precision='bf16x2' (x = hi + lo in bfloat16, float32 accumulation): each sup within
    2**-15 of the float64 value, the mean within 1% of the standard error of the float32 path."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 16))
    x32 = jnp.asarray(x, jnp.float32)
    signs = rad.sign_vectors(KEY, num_samples=32, num_examples=64, dtype=jnp.float64)
    exact = np.linalg.norm(np.asarray(signs) @ x, axis=1) / 64
    s32 = signs.astype(jnp.float32)
    split = rad.linear_sup(x32, norm=2, radius=1.0, precision="bf16x2")(s32)
    np.testing.assert_allclose(np.asarray(split, np.float64), exact, rtol=2.0**-15)
    highest = rad.linear_sup(x32, norm=2, radius=1.0, precision="highest")(s32)
    np.testing.assert_allclose(np.asarray(highest, np.float64), exact, rtol=tol(jnp.float32))
    kw = dict(norm=2, radius=1.0, num_samples=512, chunk_size=64)
    plain = rad.rademacher_linear(x32, KEY, **kw)
    fast = rad.rademacher_linear(x32, KEY, precision="bf16x2", **kw)
    assert abs(float(fast.mean) - float(plain.mean)) < 0.01 * float(plain.stderr)
    with pytest.raises(ValueError, match=r"^precision: 'bf16x2' splits float32"):
        rad.rademacher_linear(jnp.eye(3), KEY, precision="bf16x2", **kw)
    with pytest.raises(ValueError, match=r"^precision"):
        rad.rademacher_linear(x32, KEY, precision="fast", **kw)


def test_linear_default_chunk_follows_the_backend(monkeypatch):
    """chunk_size='auto': 256 on a CPU (unchanged); on an accelerator 4096, halved until the
    chunk's signs and products fit the budget."""
    x = jnp.zeros((4096, 512), jnp.float32)
    # the backend this runs on: its 4096 draws take 75 MB, within the budget
    assert rad._linear_chunk("auto", x) == (4096 if _rademacher.is_accelerator() else 256)
    monkeypatch.setattr(_rademacher, "is_accelerator", lambda: False)
    assert rad._linear_chunk("auto", x) == 256
    assert rad._linear_chunk(None, x) is None
    assert rad._linear_chunk(12, x) == 12
    monkeypatch.setattr(_rademacher, "is_accelerator", lambda: True)
    assert rad._linear_chunk("auto", x) == 4096
    monkeypatch.setattr(_rademacher, "_ACCEL_CHUNK_BYTES", 4608 * 4 * 1000)  # fits 1000 draws
    assert rad._linear_chunk("auto", x) == 512
    with pytest.raises(ValueError, match=r"^chunk_size"):
        rad.rademacher_linear(x[:4, :2], KEY, norm=2, radius=1.0, num_samples=4, chunk_size="big")


# ----------------------------------------------------------------------------- slow: 2**31 draws


@pytest.mark.slow
def test_linear_past_2_31_draws_is_right():
    """The issue's run: 2**31 + 2**22 draws (past int32) of ones((2, 1)): each sup is 0 or 1
    with probability 1/2 (the int32 count gave mean 1e10 and a NaN stderr)."""
    num = 2**31 + 2**22
    est = rad.rademacher_linear(jnp.ones((2, 1), jnp.float32), KEY, norm=2, radius=1.0,
                                num_samples=num, chunk_size=2**22)  # fmt: skip
    assert est.num_samples == num
    assert abs(float(est.mean) - 0.5) <= 5 * float(est.stderr)
    np.testing.assert_allclose(float(est.stderr), 0.5 / math.sqrt(num), rtol=1e-3)


@pytest.mark.slow
def test_float32_linear_agrees_with_float64_at_2_24_draws():
    """The issue's case: eye(32) + 0.02 N in float32 gave 0.17762406 at 2**22 and 2**24 draws
    (the float32 running mean stopped moving), 21 stderr from float64 on the same draws."""
    rng = np.random.default_rng(0)
    x = np.eye(32) + 0.02 * rng.normal(size=(32, 32))
    kw = dict(norm=2, radius=1.0, num_samples=2**24, chunk_size=4096)
    e32 = rad.rademacher_linear(jnp.asarray(x, jnp.float32), KEY, **kw)
    e64 = rad.rademacher_linear(jnp.asarray(x), KEY, **kw)
    # summation now contributes nothing visible: what is left is each draw's float32 rounding
    assert abs(float(e32.mean) - float(e64.mean)) < 0.05 * float(e64.stderr)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("radius", lambda v: rad.rademacher_linear(jnp.eye(3), KEY, norm=2, radius=v,
                                                   num_samples=4)),
        ("step_size", lambda v: rad.rademacher_search(linear_fn, jnp.ones(3), jnp.eye(3), KEY,
                                                      **search_kw(step_size=v))),
        ("readout_radius", lambda v: rad.rademacher_readout_search(
            fixed_features, jnp.ones(1), jnp.eye(3), KEY, **readout_kw(readout_radius=v))),
        ("output_bound", lambda v: rad.rademacher_search(linear_fn, jnp.ones(3), jnp.eye(3), KEY,
                                                         **search_kw(output_bound=v))),
    ],
)  # fmt: skip
def test_array_options_must_be_scalars(name, call):
    """A radius or step of shape (2,) broadcast into raw shape errors (or a silently
    two-valued estimate): a ValueError names the option."""
    with pytest.raises(ValueError, match=rf"^{name}: expected a scalar, got an array of shape"):
        call(jnp.ones(2))


# ------------------------------------------------- huge values: scaled statistics (issue 30)


def _linear_reference(x64, norm, readout, k):
    """float64 sups of the kernel's own draws (sign_vectors rows) for inputs ``x64``."""
    n = x64.shape[0]
    s = np.asarray(rad.sign_vectors(KEY, num_samples=k, num_examples=n, dtype=jnp.float64))
    v = s @ x64
    if isinstance(norm, tuple):
        q, p = norm
        scale = np.linalg.norm(readout, ord=norms.dual_exponent(q))
        return scale * np_dual(v, p) / n
    return np_dual(v, norm) / n


@pytest.mark.parametrize("norm", [2, 1, np.inf, 3.0, (2, 1), (1, np.inf), (np.inf, 2)])
def test_linear_huge_inputs_give_finite_stderr(norm):
    rng = np.random.default_rng(30)
    x = jnp.asarray(1e20 * rng.standard_normal((64, 8)), jnp.float32)
    readout = None
    if isinstance(norm, tuple):
        readout = jnp.asarray([1.0, -2.0, 0.5], jnp.float32)
    k = 256
    est = rad.rademacher_linear(
        x, KEY, norm=norm, radius=1.0, num_samples=k, readout=readout, precision="highest"
    )
    ro = None if readout is None else np.asarray(readout, np.float64)
    vals = _linear_reference(np.asarray(x, np.float64), norm, ro, k)
    assert np.isfinite(float(est.stderr))
    np.testing.assert_allclose(float(est.mean), vals.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(est.stderr), vals.std(ddof=1) / np.sqrt(k), rtol=1e-4)
    assert np.isfinite(float(est.lower))
    assert np.isfinite(float(est.upper))


def test_linear_scaling_is_exact():
    """Inputs times 2**60: the estimate times 2**60, bit for bit (powers of two are exact)."""
    rng = np.random.default_rng(31)
    x = jnp.asarray(rng.standard_normal((32, 5)), jnp.float32)
    kw = dict(norm=2, radius=1.0, num_samples=64, precision="highest")
    small = rad.rademacher_linear(x, KEY, **kw)
    big = rad.rademacher_linear(x * 2.0**60, KEY, **kw)
    assert float(big.mean) == float(small.mean) * 2.0**60
    assert float(big.stderr) == float(small.stderr) * 2.0**60


def test_linear_result_beyond_the_range_raises_naming_inputs():
    x = jnp.full((64, 8), 3e38, jnp.float32)
    kw = dict(norm=np.inf, radius=10.0, num_samples=16)
    # the sups are computed in working units (finite); the average itself is beyond float32
    message = r"^inputs: the Rademacher average or its standard error exceeds the range of float32"
    with pytest.raises(ValueError, match=message):
        rad.rademacher_linear(x, KEY, **kw)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(lambda a: rad.rademacher_linear(a, KEY, **kw).mean)(x).block_until_ready()
    assert _checks.failed_check_message(info.value).startswith("inputs: the Rademacher average")


def test_finite_huge_outputs_give_finite_stderr():
    rng = np.random.default_rng(32)
    v = jnp.asarray(1e20 * rng.standard_normal((7, 40)), jnp.float32)
    k = 128
    est = rad.rademacher_finite(take_rows, v, KEY, num_samples=k, num_members=7)
    s = np.asarray(rad.sign_vectors(KEY, num_samples=k, num_examples=40, dtype=jnp.float64))
    vals = (s @ np.asarray(v, np.float64).T).max(axis=1) / 40
    assert np.isfinite(float(est.stderr))
    np.testing.assert_allclose(float(est.mean), vals.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(est.stderr), vals.std(ddof=1) / np.sqrt(k), rtol=1e-4)
    with pytest.raises(ValueError, match=r"^outputs_fn: non-finite value .* beyond the range"):
        rad.rademacher_finite(
            take_rows, jnp.full((3, 4), 3e38, jnp.float32), KEY, num_samples=4, num_members=3
        )


@pytest.mark.parametrize("norm", [np.int64(2), np.float64(2), np.float32(INF), np.int32(1)])
def test_numpy_exponents_are_python_numbers(norm):
    """A NumPy norm was traced by the jit boundary and refused with a tracer in the message."""
    x = jnp.asarray(np.random.default_rng(3).normal(size=(5, 3)))
    want = rad.rademacher_linear(x, KEY, norm=float(norm), radius=1.0, num_samples=4)
    got = rad.rademacher_linear(x, KEY, norm=norm, radius=1.0, num_samples=4)
    assert float(got.mean) == float(want.mean)
    u = jnp.ones(2)
    pair = rad.rademacher_linear(x, KEY, norm=(norm, np.int64(1)), readout=u, radius=1.0,
                                 num_samples=4)  # fmt: skip
    plain = rad.rademacher_linear(x, KEY, norm=(float(norm), 1), readout=u, radius=1.0,
                                  num_samples=4)  # fmt: skip
    assert float(pair.mean) == float(plain.mean)
    assert rad.linear_sup(x, norm=norm, radius=1.0).dual == norms.dual_exponent(float(norm))
    kw = readout_kw(readout_norm=norm)
    est = rad.rademacher_readout_search(fixed_features, jnp.ones(1), jnp.eye(3), KEY, **kw)
    ref = readout_kw(readout_norm=float(norm))
    assert float(est.mean) == float(
        rad.rademacher_readout_search(fixed_features, jnp.ones(1), jnp.eye(3), KEY, **ref).mean
    )


@pytest.mark.parametrize("norm", ["2", jnp.float32(2), np.array(2.0), np.ones(2), np.complex64(2)])
def test_string_and_array_exponents_are_refused(norm):
    with pytest.raises(ValueError, match=r"^norm: expected an exponent.*Python or NumPy number"):
        rad.rademacher_linear(jnp.eye(3), KEY, norm=norm, radius=1.0, num_samples=4)
    with pytest.raises(ValueError, match=r"^readout_norm: expected .*Python or NumPy number"):
        rad.rademacher_readout_search(
            fixed_features, jnp.ones(1), jnp.eye(3), KEY, **readout_kw(readout_norm=norm)
        )


@pytest.mark.parametrize("norm", [0.5, -1, float("nan"), "two", (2, 0.5), (0, 2)])
def test_linear_bad_norm_names_norm(norm):
    readout = jnp.ones(2) if isinstance(norm, tuple) else None
    with pytest.raises(ValueError, match=r"^norm: ") as info:
        rad.rademacher_linear(
            jnp.eye(3), KEY, norm=norm, radius=1.0, num_samples=4, readout=readout
        )
    assert "exponent in [1, inf]" in str(info.value)
