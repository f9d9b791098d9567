"""Tests of kernels.norms against numpy definitions and projection optimality."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

from kernels import norms

INF = math.inf
RNG = np.random.default_rng(0)


def np_group(w, q, p):
    cols = np.linalg.norm(w, ord=q, axis=0)
    return np.linalg.norm(cols, ord=p)


@pytest.mark.parametrize("q", [1, 2, 3, INF])
@pytest.mark.parametrize("p", [1, 2, 4, INF])
def test_group_norm_matches_numpy(q, p):
    w = RNG.normal(size=(5, 7))
    got = norms.group_norm(jnp.asarray(w), q=q, p=p)
    np.testing.assert_allclose(got, np_group(w, q, p), rtol=1e-12)


def test_group_norm_column_convention():
    # ||W||_{1,inf} is the largest column l1 norm, ||W||_{2,1} the sum of column l2 norms.
    w = jnp.array([[1.0, 0.0], [1.0, 3.0]])
    assert float(norms.group_norm(w, q=1, p=INF)) == 3.0
    np.testing.assert_allclose(norms.group_norm(w, q=2, p=1), math.sqrt(2) + 3.0, rtol=1e-15)
    np.testing.assert_allclose(norms.group_norm(w, q=2, p=2), np.linalg.norm(np.asarray(w)))


@pytest.mark.parametrize("p", [1, 2, INF])
def test_operator_norm_matches_numpy(p, run):
    w = RNG.normal(size=(6, 4))
    got = run(lambda: norms.operator_norm(jnp.asarray(w), p=p))
    np.testing.assert_allclose(got, np.linalg.norm(w, ord=p), rtol=1e-12)


@pytest.mark.parametrize("p", [1, 2, 3, INF])
def test_schatten_norm_matches_numpy(p):
    w = RNG.normal(size=(4, 6))
    s = np.linalg.svd(w, compute_uv=False)
    np.testing.assert_allclose(norms.schatten_norm(jnp.asarray(w), p=p), np.linalg.norm(s, p))


def test_schatten_rank():
    a = RNG.normal(size=(8, 3))
    w = a @ RNG.normal(size=(3, 6))
    assert int(norms.schatten_norm(jnp.asarray(w), p=0)) == 3
    assert int(norms.schatten_norm(jnp.zeros((3, 3)).at[0, 0].set(1.0), p=0)) == 1


def test_dual_exponent_and_vector_norm():
    assert norms.dual_exponent(1) == INF
    assert norms.dual_exponent(INF) == 1.0
    assert norms.dual_exponent(3) == 1.5
    x = RNG.normal(size=(3, 4))
    for p in (1, 2, 3, INF):
        np.testing.assert_allclose(
            norms.vector_norm(jnp.asarray(x), p), np.linalg.norm(x.ravel(), p)
        )


def test_large_p_does_not_overflow():
    x = jnp.array([1e300, 1e300], dtype=jnp.float64)
    np.testing.assert_allclose(norms.vector_norm(x, 50), 1e300 * 2 ** (1 / 50), rtol=1e-12)


def test_tree_versions():
    tree = {
        "w": jnp.asarray(RNG.normal(size=(3, 4))),
        "b": jnp.asarray(RNG.normal(size=(4,))),
        "k": jnp.asarray(RNG.normal(size=(3, 2, 5))),
    }
    got = norms.tree_group_norms(tree, q=2, p=1)
    np.testing.assert_allclose(got["w"], np_group(np.asarray(tree["w"]), 2, 1))
    np.testing.assert_allclose(got["b"], np.linalg.norm(np.asarray(tree["b"])))
    np.testing.assert_allclose(got["k"], np_group(np.asarray(tree["k"]).reshape(3, 10), 2, 1))
    ops = norms.tree_operator_norms(tree, p=2)
    np.testing.assert_allclose(ops["w"], np.linalg.norm(np.asarray(tree["w"]), 2))
    sch = norms.tree_schatten_norms(tree, p=1)
    np.testing.assert_allclose(sch["w"], np.linalg.norm(np.asarray(tree["w"]), "nuc"))
    flat = np.concatenate([np.asarray(v).ravel() for v in jax.tree_util.tree_leaves(tree)])
    for p in (1, 2, INF):
        np.testing.assert_allclose(norms.tree_norm(tree, p=p), np.linalg.norm(flat, p))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="p:"):
        norms.group_norm(jnp.ones((2, 2)), q=1, p=0.5)
    with pytest.raises(ValueError, match="w:"):
        norms.group_norm(jnp.ones(3), q=1, p=1)
    with pytest.raises(ValueError, match="p:"):
        norms.operator_norm(jnp.ones((2, 2)), p=3)
    with pytest.raises(ValueError, match=r"\(q, p\)"):
        norms.project_group_ball(jnp.ones((2, 2)), q=1, p=2, radius=1.0)
    with pytest.raises(ValueError, match="tree"):
        norms.tree_norm({})


# ----------------------------------------------------------------- projections


def solve_projection(v, norm_fn, radius):
    """Nearest point of the ball by SLSQP (generic solver) on a small case."""
    shape = v.shape
    res = minimize(
        lambda x: 0.5 * np.sum((x - v.ravel()) ** 2),
        x0=np.zeros(v.size),
        jac=lambda x: x - v.ravel(),
        constraints=[{"type": "ineq", "fun": lambda x: radius - norm_fn(x.reshape(shape))}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x.reshape(shape)


def check_projection(v, proj, norm_fn, radius):
    # feasibility, then the variational inequality <v - P, c - P> <= 0 on random feasible c,
    # then agreement with a generic solver.
    assert norm_fn(proj) <= radius * (1 + 1e-9)
    for _ in range(50):
        c = RNG.normal(size=v.shape)
        c *= radius / norm_fn(c) * RNG.uniform()
        assert np.sum((v - proj) * (c - proj)) <= 1e-9
    # the solver's answer, pulled into the ball, is feasible: the projection must beat it
    ref = solve_projection(v, norm_fn, radius)
    ref *= min(1.0, radius / norm_fn(ref))
    assert np.sum((proj - v) ** 2) <= np.sum((ref - v) ** 2) + 1e-12
    np.testing.assert_allclose(proj, ref, atol=2e-3)


@pytest.mark.parametrize("p", [1, 2, INF])
def test_project_lp_ball(p, run):
    v = RNG.normal(size=(6,)) * 2
    radius = 1.3
    proj = np.asarray(run(lambda: norms.project_lp_ball(jnp.asarray(v), p=p, radius=radius)))
    check_projection(v, proj, lambda x: np.linalg.norm(x.ravel(), p), radius)
    # inside the ball nothing moves
    inside = v / np.linalg.norm(v, p) * 0.5
    np.testing.assert_array_equal(
        norms.project_lp_ball(jnp.asarray(inside), p=p, radius=1.0), inside
    )


def test_project_l1_ball_ties_and_zero():
    v = jnp.array([1.0, 1.0, -1.0, 0.0])
    np.testing.assert_allclose(norms.project_l1_ball(v, radius=1.5), [0.5, 0.5, -0.5, 0.0])
    np.testing.assert_array_equal(norms.project_l1_ball(jnp.zeros(3), radius=1.0), np.zeros(3))


@pytest.mark.parametrize(("q", "p"), [(1, INF), (2, INF), (INF, INF), (1, 1), (2, 2), (2, 1)])
def test_project_group_ball(q, p):
    w = RNG.normal(size=(3, 4)) * 2
    radius = 1.1
    proj = np.asarray(norms.project_group_ball(jnp.asarray(w), q=q, p=p, radius=radius))
    check_projection(w, proj, lambda x: np_group(x, q, p), radius)


@pytest.mark.parametrize("p", [1, 2, INF])
def test_project_schatten_ball(p):
    w = RNG.normal(size=(3, 3)) * 2
    radius = 1.2
    proj = np.asarray(norms.project_schatten_ball(jnp.asarray(w), p=p, radius=radius))
    nrm = lambda x: np.linalg.norm(np.linalg.svd(x, compute_uv=False), p)  # noqa: E731
    check_projection(w, proj, nrm, radius)
    if p == INF:
        np.testing.assert_allclose(
            norms.project_spectral_ball(jnp.asarray(w), radius=radius), proj, atol=1e-12
        )


def test_tree_projection_and_float32():
    tree = {"a": jnp.array([3.0, 0.0], jnp.float32), "b": jnp.array([[4.0]], jnp.float32)}
    out = norms.tree_project_lp_ball(tree, p=1, radius=3.5)
    assert out["a"].dtype == jnp.float32
    np.testing.assert_allclose(out["a"], [1.25, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [[2.25]], rtol=1e-6)
    assert norms.group_norm(jnp.ones((2, 2), jnp.float32), q=2, p=1).dtype == jnp.float32
