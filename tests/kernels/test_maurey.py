"""Tests of kernels.maurey: error bound, covers, Lemma 3.2 of Trauger & Tewari, W_QK cover class."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import _checks, maurey
from kernels import rademacher as rad
from tests.helpers import compiles_in, count_compiles

KEY = jax.random.key(3)  # a fixed key (not a generator): no state shared between tests


def sparsify_many(v, k, radius, num):
    keys = jax.random.split(KEY, num)
    return np.asarray(
        jax.vmap(lambda key: maurey.maurey_sparsify(v, key, num_atoms=k, radius=radius))(keys)
    )


@pytest.mark.parametrize("spread", [False, True])
def test_error_bound_holds_on_average(spread):
    rng = np.random.default_rng(11)
    d, k, radius, num = 30, 7, 2.0, 4000
    if spread:  # on the sphere ||v||_1 = B and spread out: the bound is attained
        v = rng.uniform(0.5, 1.0, size=d) * rng.choice([-1, 1], size=d)
        v *= radius / np.abs(v).sum()
    else:
        v = rng.normal(size=d)
        v *= 0.6 * radius / np.abs(v).sum()
    vj = jnp.asarray(v)
    draws = sparsify_many(vj, k, radius, num)
    err = np.sum((draws - v) ** 2, axis=1)
    mean, se = err.mean(), err.std(ddof=1) / math.sqrt(num)
    exact = float(maurey.maurey_expected_error(vj, num_atoms=k, radius=radius))
    bound = float(maurey.maurey_error_bound(vj, num_atoms=k, radius=radius))
    np.testing.assert_allclose(exact, (radius * np.abs(v).sum() - v @ v) / k, rtol=1e-12)
    np.testing.assert_allclose(bound, (radius**2 - v @ v) / k, rtol=1e-12)
    assert abs(mean - exact) <= 5 * se
    assert mean <= bound + 5 * se
    if spread:
        np.testing.assert_allclose(exact, bound, rtol=1e-12)
        assert abs(mean / bound - 1) <= 5 * se / bound
        assert bound > 0.9 * radius**2 / k  # spread out: ||v||_2 << B
    else:
        assert exact < 0.7 * bound
    # unbiased: E v_k = v coordinatewise
    se_coord = draws.std(axis=0, ddof=1) / math.sqrt(num)
    assert np.all(np.abs(draws.mean(axis=0) - v) <= 5 * se_coord + 1e-12)
    # on the lattice (B/k) c, ||c||_1 <= k
    c = draws * k / radius
    np.testing.assert_allclose(c, np.round(c), atol=1e-9)
    assert np.all(np.abs(np.round(c)).sum(axis=1) <= k)


def test_sparsify_matrix_and_dtype_and_errors():
    w = jnp.asarray(np.random.default_rng(12).normal(size=(3, 4)), jnp.float32)
    w = w / jnp.sum(jnp.abs(w))
    out = maurey.maurey_sparsify(w, KEY, num_atoms=5, radius=1.0)
    assert out.shape == (3, 4)
    assert out.dtype == jnp.float32
    with pytest.raises(ValueError, match="v: expected"):
        maurey.maurey_sparsify(jnp.ones(3), KEY, num_atoms=2, radius=1.0)
    with pytest.raises(ValueError, match="num_atoms"):
        maurey.maurey_sparsify(jnp.zeros(3), KEY, num_atoms=0, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        maurey.maurey_sparsify(jnp.zeros(3), KEY, num_atoms=1, radius=-1.0)
    # the same draw inside jit (traced v)
    jitted = jax.jit(lambda v: maurey.maurey_sparsify(v, KEY, num_atoms=5, radius=1.0))(w)
    np.testing.assert_array_equal(jitted, out)


@pytest.mark.parametrize(
    ("v", "key", "match"),
    [
        (np.zeros(3), 0, "key"),
        (np.zeros((0, 3)), KEY, "v"),
        (np.zeros(3, np.int32), KEY, "v: expected float32"),
        (np.zeros(3, np.float16), KEY, "v: expected float32"),
        (np.array([np.nan, 0.0]), KEY, "v: expected finite"),
    ],
    ids=["int_key", "empty", "integer", "float16", "nan"],
)
def test_sparsify_bad_inputs_raise(v, key, match):
    with pytest.raises(ValueError, match=match):
        maurey.maurey_sparsify(jnp.asarray(v), key, num_atoms=2, radius=1.0)


def jitted_sparsify():
    return jax.jit(lambda v, r: maurey.maurey_sparsify(v, KEY, num_atoms=3, radius=r))


def test_sparsify_checks_under_jit_and_switch():
    sparsify = jitted_sparsify()
    with pytest.raises(jax.errors.JaxRuntimeError, match="v: expected finite"):
        jax.block_until_ready(sparsify(jnp.array([jnp.nan, 0.0]), 1.0))
    with pytest.raises(jax.errors.JaxRuntimeError, match="radius"):
        jax.block_until_ready(sparsify(jnp.array([0.1, 0.0]), -1.0))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"v: expected \|\|v\|\|_1 <= radius"):
        jax.block_until_ready(sparsify(jnp.array([0.8, 0.8]), 1.0))
    with _checks.runtime_checks(False):  # programs traced from now on have no checks
        out = jitted_sparsify()(jnp.array([jnp.nan, 0.0]), 1.0)
        assert np.isnan(np.asarray(out)).any()  # NaN flows through


def test_sparsify_compiles_once():
    rng = np.random.default_rng(13)
    v1, v2 = (jnp.asarray(rng.uniform(size=6) / 6) for _ in range(2))
    key2, radius2 = jax.random.key(8), jnp.asarray(2.0)
    maurey.maurey_sparsify(v1, KEY, num_atoms=4, radius=jnp.asarray(1.0))
    with count_compiles() as messages:
        maurey.maurey_sparsify(v2, key2, num_atoms=4, radius=radius2)
    assert compiles_in(messages) == []


def test_expected_error_and_bound_check_the_ball():
    with pytest.raises(ValueError, match="v: expected"):
        maurey.maurey_expected_error(jnp.ones(3), num_atoms=2, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        maurey.maurey_error_bound(jnp.zeros(3), num_atoms=2, radius=0.0)
    with pytest.raises(ValueError, match="v: expected float32"):
        maurey.maurey_error_bound(jnp.zeros(3, jnp.int32), num_atoms=2, radius=1.0)


@pytest.mark.parametrize(("d", "k"), [(1, 3), (2, 2), (3, 2), (4, 3)])
def test_cover_enumeration(d, k):
    radius = 1.5
    cover = maurey.maurey_cover(d, k, radius)
    assert cover.shape == (maurey.maurey_cover_size(d, k), d)
    assert len({tuple(np.round(p, 12)) for p in cover}) == cover.shape[0]
    c = cover * k / radius
    np.testing.assert_allclose(c, np.round(c), atol=1e-12)
    assert np.all(np.abs(c).sum(axis=1) <= k + 1e-9)
    assert math.log(cover.shape[0]) <= maurey.maurey_cover_log_size(d, k) + 1e-12
    # the indexed points are exactly the cover (with repetitions)
    idx = jnp.arange((2 * d + 1) ** k)
    pts = np.asarray(maurey.maurey_cover_point(idx, dim=d, num_atoms=k, radius=radius))
    assert {tuple(np.round(p, 12)) for p in pts} == {tuple(np.round(p, 12)) for p in cover}
    # covering: every v in the l1 ball has a point within (B^2 - ||v||^2)/k
    rng = np.random.default_rng(14)
    for _ in range(50):
        v = rng.normal(size=d)
        v *= radius * rng.uniform() ** (1 / d) / np.abs(v).sum()
        dist2 = np.min(np.sum((cover - v) ** 2, axis=1))
        assert dist2 <= (radius**2 - v @ v) / k + 1e-12


def test_cover_refuses_huge():
    with pytest.raises(ValueError, match="max_size"):
        maurey.maurey_cover(50, 6, 1.0)


def test_lemma_3_2_basis_cover_covers_l1_inputs():
    # Trauger & Tewari Lemma 3.2 / 3.3: W in R^{k x d} with ||W||_{1,inf} <= B_w; a cover built on
    # the scaled basis {B_x e_j} (each column sparsified) covers every input with ||x||_1 <= B_x
    # at the same resolution.
    rng = np.random.default_rng(15)
    k_out, d, b_w, b_x, atoms = 5, 6, 1.3, 2.0, 4
    w = rng.normal(size=(k_out, d))
    w *= b_w / np.abs(w).sum(axis=0, keepdims=True) * rng.uniform(0.3, 1.0, size=(1, d))
    keys = jax.random.split(KEY, d)
    w_hat = np.stack(
        [
            np.asarray(
                maurey.maurey_sparsify(jnp.asarray(w[:, j]), keys[j], num_atoms=atoms, radius=b_w)
            )
            for j in range(d)
        ],
        axis=1,
    )
    eps_basis = max(np.linalg.norm((w - w_hat) @ (b_x * np.eye(d)[j])) for j in range(d))
    assert eps_basis > 0
    xs = rng.normal(size=(5000, d)) * rng.uniform(size=(5000, 1)) ** 3
    xs *= b_x / np.abs(xs).sum(axis=1, keepdims=True) * rng.uniform(size=(5000, 1))
    xs = np.concatenate([xs, b_x * np.eye(d), -b_x * np.eye(d)])
    errs = np.linalg.norm(xs @ (w - w_hat).T, axis=1)
    assert np.all(errs <= eps_basis * (1 + 1e-12))
    # and the bound is attained on a basis input
    np.testing.assert_allclose(errs.max(), eps_basis, rtol=1e-12)


def np_wqk_member(x, cls, w, j, s):
    logits = x @ w @ cls
    att = np.exp(logits - logits.max())
    att /= att.sum()
    return s * (x.T @ att)[j]


def test_wqk_cover_outputs_and_rademacher():
    rng = np.random.default_rng(16)
    m, t, d, k, radius = 6, 3, 2, 1, 1.5
    x = rng.normal(size=(m, t, d))
    cls = x[:, 0, :]
    batch = (jnp.asarray(x), jnp.asarray(cls))
    cover = maurey.wqk_cover_outputs(dim=d, num_atoms=k, radius=radius)
    num = cover.num_members
    assert num == 2 * d * (2 * d * d + 1) ** k
    out = np.asarray(cover(jnp.arange(num), batch))
    assert out.shape == (num, m)
    for member in (0, 1, 5, 17, num - 1):
        cover_idx, j, s = member // (2 * d), (member // 2) % d, 1 - 2 * (member % 2)
        w = np.asarray(
            maurey.maurey_cover_point(cover_idx, dim=d * d, num_atoms=k, radius=radius)
        ).reshape(d, d)
        want = [np_wqk_member(x[i], cls[i], w, j, s) for i in range(m)]
        np.testing.assert_allclose(out[member], want, rtol=1e-12)
    exact = rad.rademacher_exact(rad.finite_sup(cover, batch, member_chunk_size=7))
    signs = np.array([[1 - 2 * ((tt >> i) & 1) for i in range(m)] for tt in range(2**m)])
    np.testing.assert_allclose(exact.mean, np.mean(np.max(signs @ out.T, axis=1)) / m, rtol=1e-12)
    est = rad.rademacher_finite(cover, batch, KEY, num_samples=600, member_chunk_size=16)
    assert abs(float(est.mean) - float(exact.mean)) <= 5 * float(est.stderr)
    # |f| <= max ||x_t||_inf, the McDiarmid b
    np.testing.assert_allclose(
        est.upper - est.mean,
        2 * np.abs(out).max() * math.sqrt(math.log(40) / (2 * m * 600)),
        rtol=1e-10,
    )


def test_wqk_cover_compiles_once_for_new_data_and_radius():
    rng = np.random.default_rng(17)
    batches = [
        (jnp.asarray(x), jnp.asarray(x[:, 0])) for x in (rng.normal(size=(4, 3, 2)) for _ in "ab")
    ]
    covers = [
        maurey.wqk_cover_outputs(dim=2, num_atoms=1, radius=jnp.asarray(r)) for r in (1.0, 2.0)
    ]
    kw = dict(num_samples=4, member_chunk_size=9, chunk_size=2)
    rad.rademacher_finite(covers[0], batches[0], KEY, **kw)
    with count_compiles() as messages:
        est = rad.rademacher_finite(covers[1], batches[1], KEY, **kw)
    assert compiles_in(messages) == []
    assert np.isfinite(float(est.mean))


def test_wqk_cover_bad_arguments():
    cover = maurey.wqk_cover_outputs(dim=4, num_atoms=1, radius=1.0)
    with pytest.raises(ValueError, match="cls_tokens"):
        cover(jnp.arange(3), (jnp.ones((2, 3, 4)), jnp.ones((2, 3))))
    with pytest.raises(ValueError, match="inputs"):
        cover(jnp.arange(3), (jnp.ones((2, 3, 4), jnp.int32), jnp.ones((2, 4))))
    with pytest.raises(ValueError, match="batch"):
        cover(jnp.arange(3), jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="num_atoms"):
        maurey.wqk_cover_outputs(dim=8, num_atoms=6, radius=1.0)
    with pytest.raises(ValueError, match="radius"):
        maurey.wqk_cover_outputs(dim=2, num_atoms=1, radius=0.0)


def test_sparsify_counts_past_2_24_atoms_stay_exact():
    """A vertex of the ball with 2**24 + 2**22 atoms: every atom is the vertex, so v_k = v
    exactly (float32 counts stopped at 2**24 and gave 1.6 for 2; the issue's v = [0, 2, 0] with
    2**25 atoms gave [0, 1, 0])."""
    v = jnp.asarray([2.0], jnp.float32)
    out = maurey.maurey_sparsify(v, KEY, num_atoms=2**24 + 2**22, radius=2.0)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, [2.0])
    with pytest.raises(ValueError, match=r"^num_atoms: at most 2\*\*31 - 1"):
        maurey.maurey_sparsify(v, KEY, num_atoms=2**31, radius=2.0)


def test_sparsify_checks_name_the_first_bad_argument_under_jit():
    """NaN v fails its own check and the ball check (NaN > r): only v is reported."""
    f = jax.jit(lambda v, r: maurey.maurey_sparsify(v, KEY, num_atoms=3, radius=r))
    # a failure inside jit is raised when the result is read (a GPU's call returns first)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.array([jnp.nan, 1.0]), jnp.asarray(-1.0)))
    assert _checks.failed_check_message(info.value).startswith("v: expected finite")
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.array([2.0, 1.0]), jnp.asarray(1.0)))
    assert _checks.failed_check_message(info.value).startswith("v: expected ||v||_1 <= radius")


def test_radius_must_be_a_scalar():
    for call in (
        lambda r: maurey.maurey_sparsify(jnp.ones(3) / 3, KEY, num_atoms=2, radius=r),
        lambda r: maurey.maurey_expected_error(jnp.ones(3) / 3, num_atoms=2, radius=r),
        lambda r: maurey.maurey_cover_point(jnp.arange(3), dim=2, num_atoms=2, radius=r),
    ):
        with pytest.raises(ValueError, match=r"^radius: expected a scalar"):
            call(jnp.ones(2))
