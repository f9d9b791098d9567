"""Tests of kernels.norms against numpy definitions, and projections checked by certificates.

A projection ``P(v)`` onto a closed convex set ``K`` is certified without any reference solver:

- feasibility: ``||P(v)|| <= r (1 + tol)``;
- the variational inequality ``<v - P(v), y - P(v)> <= tol |v - P(v)| |y - P(v)|`` for many
  feasible ``y`` (random points scaled into and onto the ball, and the ball's extreme points);
- where the norm has one, the exact optimality certificate: a closed form (clipping for the
  l_inf ball, scaling for the l2 / Frobenius ball, per-column projections for the (., inf) group
  balls, singular-value clipping for the spectral ball) or the KKT conditions of a
  soft-threshold (l1, group-lasso, nuclear balls): ``P = shrink(v, theta)`` with one
  ``theta >= 0`` read off ``P``, ``theta = 0`` iff ``v`` is inside.

Every test seeds its own generator, so no test depends on which tests ran before it.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import norms
from kernels._checks import runtime_checks
from tests.helpers import compiles_in, count_compiles, matmul_tol, tol

INF = math.inf
DTYPES = [np.float32, np.float64]


def np_group(w, q, p):
    cols = np.linalg.norm(w, ord=q, axis=0)
    return np.linalg.norm(cols, ord=p)


def np_schatten(w, p):
    return np.linalg.norm(np.linalg.svd(w, compute_uv=False), p)


@pytest.mark.parametrize("q", [1, 2, 3, INF])
@pytest.mark.parametrize("p", [1, 2, 4, INF])
def test_group_norm_matches_numpy(q, p):
    w = np.random.default_rng(0).normal(size=(5, 7))
    got = norms.group_norm(jnp.asarray(w), q=q, p=p)
    np.testing.assert_allclose(got, np_group(w, q, p), rtol=1e-12)


def test_group_norm_column_convention():
    # ||W||_{1,inf} is the largest column l1 norm, ||W||_{2,1} the sum of column l2 norms.
    w = jnp.array([[1.0, 0.0], [1.0, 3.0]])
    assert float(norms.group_norm(w, q=1, p=INF)) == 3.0
    np.testing.assert_allclose(norms.group_norm(w, q=2, p=1), math.sqrt(2) + 3.0, rtol=1e-15)
    np.testing.assert_allclose(norms.group_norm(w, q=2, p=2), np.linalg.norm(np.asarray(w)))


@pytest.mark.parametrize("p", [1, INF])
def test_operator_norm_matches_numpy(p, run):
    w = np.random.default_rng(1).normal(size=(6, 4))
    got = run(lambda: norms.operator_norm(jnp.asarray(w), p=p))
    np.testing.assert_allclose(got, np.linalg.norm(w, ord=p), rtol=1e-12)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_schatten_norm_matches_numpy(p):
    w = np.random.default_rng(2).normal(size=(4, 6))
    np.testing.assert_allclose(norms.schatten_norm(jnp.asarray(w), p=p), np_schatten(w, p))


@pytest.mark.parametrize(("name", "p"), [("operator_norm", 2), ("schatten_norm", INF)])
def test_the_spectral_norm_under_another_name_warns_and_agrees(name, p):
    # one name per idea: operator_norm(p=2) and schatten_norm(p=inf) are spectral_norm
    w = jnp.asarray(np.random.default_rng(1).normal(size=(6, 4)))
    shown = "inf" if p == INF else "2"
    with pytest.warns(DeprecationWarning, match=rf"^{name}\(w, p={shown}\) is deprecated; use "
                      r"spectral_norm\(w\) \(.* removed in 0\.3\)"):  # fmt: skip
        got = getattr(norms, name)(w, p=p)
    assert float(got) == float(norms.spectral_norm(w))
    np.testing.assert_allclose(got, np.linalg.norm(np.asarray(w), ord=2), rtol=1e-12)


def test_schatten_rank():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 3)) @ rng.normal(size=(3, 6))
    assert int(norms.schatten_norm(jnp.asarray(w), p=0)) == 3
    assert int(norms.schatten_norm(jnp.zeros((3, 3)).at[0, 0].set(1.0), p=0)) == 1


def test_dual_exponent_and_vector_norm():
    assert norms.dual_exponent(1) == INF
    assert norms.dual_exponent(INF) == 1.0
    assert norms.dual_exponent(3) == 1.5
    x = np.random.default_rng(4).normal(size=(3, 4))
    for p in (1, 2, 3, INF):
        np.testing.assert_allclose(
            norms.vector_norm(jnp.asarray(x), p), np.linalg.norm(x.ravel(), p)
        )


def test_large_p_does_not_overflow():
    x = jnp.array([1e300, 1e300], dtype=jnp.float64)
    np.testing.assert_allclose(norms.vector_norm(x, 50), 1e300 * 2 ** (1 / 50), rtol=1e-12)


def test_tree_versions():
    rng = np.random.default_rng(5)
    tree = {
        "w": jnp.asarray(rng.normal(size=(3, 4))),
        "b": jnp.asarray(rng.normal(size=(4,))),
        "k": jnp.asarray(rng.normal(size=(3, 2, 5))),
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
    # empty leaves contribute nothing
    with_empty = {**tree, "e": jnp.zeros((0, 3))}
    np.testing.assert_allclose(norms.tree_norm(with_empty, p=INF), np.linalg.norm(flat, INF))


def test_integer_inputs_are_read_as_floats():
    w = jnp.array([[1, -2], [3, 4]])
    assert float(norms.group_norm(w, q=1, p=INF)) == 6.0
    np.testing.assert_allclose(norms.spectral_norm(w), np.linalg.norm(np.asarray(w), 2))
    assert float(norms.tree_norm({"a": jnp.array([3, 4])})) == 5.0


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
    with pytest.raises(ValueError, match="tree: expected at least one non-empty"):
        norms.tree_norm({"a": jnp.zeros((0,))})


EXPONENT_USES = {
    "vector_norm": lambda x, p: norms.vector_norm(x, p),
    "tree_norm": lambda x, p: norms.tree_norm({"a": x}, p=p),
    "group_norm_q": lambda x, p: norms.group_norm(x, q=p, p=1),
    "group_norm_p": lambda x, p: norms.group_norm(x, q=1, p=p),
    "schatten_norm": lambda x, p: norms.schatten_norm(x, p=p),
    "dual_exponent": lambda x, p: norms.dual_exponent(p),
    "project_lp_ball": lambda x, p: norms.project_lp_ball(x, p=p, radius=1.0),
    "project_group_ball": lambda x, p: norms.project_group_ball(x, q=p, p=INF, radius=1.0),
    "project_schatten_ball": lambda x, p: norms.project_schatten_ball(x, p=p, radius=1.0),
    "tree_project_lp_ball": lambda x, p: norms.tree_project_lp_ball({"a": x}, p=p, radius=1.0)["a"],
}


@pytest.mark.parametrize("name", sorted(EXPONENT_USES))
def test_every_exponent_takes_python_and_numpy_numbers_alike(name):
    """np.float64(2) was traced by the projections' jit boundary and refused (a tracer shown)."""
    use = EXPONENT_USES[name]
    x = jnp.asarray(np.random.default_rng(6).normal(size=(3, 2)))
    want = np.asarray(use(x, 2))
    for p in (2.0, np.float64(2), np.int64(2), np.float32(2), np.int8(2)):
        np.testing.assert_array_equal(np.asarray(use(x, p)), want)


@pytest.mark.parametrize("p", ["2", np.array(2.0), jnp.float32(2), np.ones(2), np.complex64(2)])
@pytest.mark.parametrize("name", sorted(EXPONENT_USES))
def test_every_exponent_refuses_strings_and_arrays(name, p):
    """A string ('2') was read as the number 2; arrays were traced (a tracer in the message)."""
    x = jnp.ones((3, 2))
    arg = "q" if name in ("group_norm_q", "project_group_ball") else "p"
    with pytest.raises(ValueError, match=rf"^{arg}: expected a Python or NumPy number") as info:
        EXPONENT_USES[name](x, p)
    assert "Traced" not in str(info.value)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_is_refused(dtype):
    x = jnp.ones((2, 2), dtype)
    with pytest.raises(ValueError, match=r"^x: .*float32"):
        norms.vector_norm(x)
    with pytest.raises(ValueError, match=r"^w: .*float32"):
        norms.spectral_norm(x)
    with pytest.raises(ValueError, match=r"^tree: .*float32"):
        norms.tree_norm({"a": x})
    with pytest.raises(ValueError, match=r"^v: .*float32"):
        norms.project_lp_ball(x, p=2, radius=1.0)
    with pytest.raises(ValueError, match=r"^w: .*float32"):
        norms.project_spectral_ball(x, radius=1.0)


def test_empty_and_integer_projection_inputs_are_refused():
    with pytest.raises(ValueError, match=r"^x: expected a non-empty"):
        norms.vector_norm(jnp.zeros((0,)))
    with pytest.raises(ValueError, match=r"^w: expected a non-empty"):
        norms.group_norm(jnp.zeros((3, 0)), q=2, p=1)
    with pytest.raises(ValueError, match=r"^v: expected a non-empty"):
        norms.project_l1_ball(jnp.zeros((0, 4)), radius=1.0)
    with pytest.raises(ValueError, match=r"^w: expected a non-empty"):
        norms.project_group_ball(jnp.zeros((0, 4)), q=2, p=INF, radius=1.0)
    with pytest.raises(ValueError, match=r"^v: expected a real float32 or float64"):
        norms.project_lp_ball(jnp.array([3, 4]), p=2, radius=1.5)


# ----------------------------------------------------------------- projections: certificates


def random_feasible_points(rng, shape, norm_fn, radius, num=200):
    """Random points of the ball: half strictly inside, half on the sphere."""
    ys = rng.normal(size=(num, *shape)) * rng.uniform(0.1, 3.0, size=(num,) + (1,) * len(shape))
    scale = np.where(np.arange(num) % 2 == 0, rng.uniform(size=num), 1.0)
    return [y * (radius * s / norm_fn(y)) for y, s in zip(ys, scale, strict=True)]


def assert_projection_certificate(v, proj, norm_fn, radius, extra_points=(), *, rtol):
    """Feasibility and the variational inequality at random feasible points."""
    v = np.asarray(v, np.float64)
    proj = np.asarray(proj, np.float64)
    assert norm_fn(proj) <= radius * (1 + rtol)
    rng = np.random.default_rng(0)
    residual = v - proj
    # accuracy of a computed projection: a few ulps of the data (rtol**2 = eps of the dtype)
    err = 64 * rtol**2 * (np.linalg.norm(v) + radius)
    for y in [*random_feasible_points(rng, v.shape, norm_fn, radius), *extra_points]:
        d = y - proj
        r_norm, d_norm = np.linalg.norm(residual), np.linalg.norm(d)
        assert np.sum(residual * d) <= rtol * r_norm * d_norm + err * (r_norm + d_norm + err)


def assert_soft_threshold(a, b, radius, *, rtol):
    """KKT certificate that the nonnegative ``b`` is the l1-ball projection of nonnegative ``a``.

    ``b = max(a - theta, 0)`` for one ``theta >= 0``, with ``theta = 0`` when ``sum(a) <= r``
    (then ``b == a``) and ``sum(b) = r`` otherwise.
    """
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    scale = radius + np.max(a)
    assert np.all(b >= 0)
    if np.sum(a) <= radius:
        np.testing.assert_allclose(b, a, rtol=0, atol=rtol * scale)
        return
    support = b > rtol * scale
    assert np.any(support)
    theta = np.mean(a[support] - b[support])
    assert theta >= 0
    np.testing.assert_allclose(a[support] - b[support], theta, rtol=0, atol=rtol * scale)
    assert np.all(a[~support] <= theta + rtol * scale)
    np.testing.assert_allclose(np.sum(b), radius, rtol=rtol * b.size)


def sphere_vertices(shape, radius, p):
    """Extreme points of the l1 ball (+-r e_i) or some corners of the l_inf ball."""
    size = math.prod(shape)
    if p == 1:
        eye = np.eye(size) * radius
        return [s * e.reshape(shape) for e in eye for s in (1.0, -1.0)]
    if p == INF:
        rng = np.random.default_rng(1)
        return [radius * rng.choice([-1.0, 1.0], size=shape) for _ in range(50)]
    return []


def closed_form_lp(v, p, radius):
    """The exact projection where it has a closed form; None for l1 (certified by KKT)."""
    if p == 2:
        return v * min(1.0, radius / np.linalg.norm(v))
    if p == INF:
        return np.clip(v, -radius, radius)
    return None


def vectors(seed, dtype, size=7):
    """Vectors outside, on the border region and inside the radius-1.3 balls."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=size) * s).astype(dtype) for s in (0.1, 0.5, 1.0, 2.0, 5.0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [1, 2, INF])
def test_project_lp_ball_certificate(p, dtype, run):
    radius = 1.3
    rtol = tol(dtype)
    norm_fn = lambda x: np.linalg.norm(np.ravel(x), p)  # noqa: E731
    for v in vectors(10, dtype):
        proj = run(lambda v=v: norms.project_lp_ball(jnp.asarray(v), p=p, radius=radius))
        assert proj.dtype == dtype
        proj = np.asarray(proj, np.float64)
        v64 = v.astype(np.float64)
        vertices = sphere_vertices(v.shape, radius, p)
        assert_projection_certificate(v64, proj, norm_fn, radius, vertices, rtol=rtol)
        exact = closed_form_lp(v64, p, radius)
        if exact is not None:
            np.testing.assert_allclose(proj, exact, rtol=0, atol=rtol * radius)
        else:
            assert np.all(proj * v64 >= 0)  # signs kept
            assert_soft_threshold(np.abs(v64), np.abs(proj), radius, rtol=rtol)
        if norm_fn(v64) <= radius:  # inside the ball nothing moves
            np.testing.assert_array_equal(proj, v64)


def test_project_l1_ball_ties_and_zero():
    v = jnp.array([1.0, 1.0, -1.0, 0.0])
    np.testing.assert_allclose(norms.project_l1_ball(v, radius=1.5), [0.5, 0.5, -0.5, 0.0])
    np.testing.assert_array_equal(norms.project_l1_ball(jnp.zeros(3), radius=1.0), np.zeros(3))


def np_columnwise(w, q, radius):
    """Projection of each column onto its l_q ball, q in {1, 2, inf}, by closed form or None."""
    if q == 2:
        return w * np.minimum(1.0, radius / np.linalg.norm(w, axis=0))[None, :]
    if q == INF:
        return np.clip(w, -radius, radius)
    return None


def assert_group_closed_form(w, proj, q, p, radius, rtol):
    """The exact optimality certificate of each implemented group ball."""
    atol = rtol * (radius + np.max(np.abs(w)))
    if p == INF:  # the ball is a product of column balls: per-column projections
        exact = np_columnwise(w, q, radius)
        if exact is not None:
            np.testing.assert_allclose(proj, exact, rtol=0, atol=atol)
            return
        for j in range(w.shape[1]):  # q = 1: each column is an l1-ball projection
            assert np.all(proj[:, j] * w[:, j] >= 0)
            assert_soft_threshold(np.abs(w[:, j]), np.abs(proj[:, j]), radius, rtol=rtol)
        return
    if (q, p) == (2, 2):
        np.testing.assert_allclose(proj, w * min(1.0, radius / np.linalg.norm(w)), atol=atol)
        return
    if (q, p) == (1, 1):
        assert np.all(proj * w >= 0)
        assert_soft_threshold(np.abs(w), np.abs(proj), radius, rtol=rtol)
        return
    # (2, 1): every column keeps its direction, the column norms are an l1-ball projection
    c, c_new = np.linalg.norm(w, axis=0), np.linalg.norm(proj, axis=0)
    np.testing.assert_allclose(proj, w * (c_new / c)[None, :], rtol=0, atol=atol)
    assert_soft_threshold(c, c_new, radius, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("q", "p"), [(1, INF), (2, INF), (INF, INF), (1, 1), (2, 2), (2, 1)])
def test_project_group_ball_certificate(q, p, dtype):
    radius = 1.1
    rtol = tol(dtype)
    norm_fn = lambda x: np_group(x, q, p)  # noqa: E731
    rng = np.random.default_rng(20)
    for scale in (0.1, 0.5, 1.0, 2.0, 5.0):
        w = (rng.normal(size=(3, 4)) * scale).astype(dtype)
        proj = norms.project_group_ball(jnp.asarray(w), q=q, p=p, radius=radius)
        assert proj.dtype == dtype
        proj = np.asarray(proj, np.float64)
        w64 = w.astype(np.float64)
        assert_projection_certificate(w64, proj, norm_fn, radius, rtol=rtol)
        assert_group_closed_form(w64, proj, q, p, radius, rtol)


def assert_schatten_closed_form(w, proj, p, radius, rtol):
    """Same singular vectors as ``w``; singular values projected onto the l_p ball."""
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    s_new = np.linalg.svd(proj, compute_uv=False)
    atol = rtol * (radius + s[0])
    if p == 1:
        assert_soft_threshold(s, s_new, radius, rtol=rtol)
        s_exact = s_new  # certified above; the singular vectors are checked below
    else:
        s_exact = closed_form_lp(s, p, radius)  # clipping (spectral) or scaling (Frobenius)
    np.testing.assert_allclose(proj, (u * s_exact[None, :]) @ vt, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [1, 2, INF])
def test_project_schatten_ball_certificate(p, dtype):
    radius = 1.2
    rtol = matmul_tol(dtype)  # the projection is U diag(s') V^T: a matmul of the dtype
    norm_fn = lambda x: np_schatten(x, p)  # noqa: E731
    rng = np.random.default_rng(30)
    for scale in (0.1, 0.5, 1.0, 2.0, 5.0):
        w = (rng.normal(size=(3, 4)) * scale).astype(dtype)
        proj = norms.project_schatten_ball(jnp.asarray(w), p=p, radius=radius)
        assert proj.dtype == dtype
        proj = np.asarray(proj, np.float64)
        w64 = w.astype(np.float64)
        assert_projection_certificate(w64, proj, norm_fn, radius, rtol=rtol)
        assert_schatten_closed_form(w64, proj, p, radius, rtol)
        if p == INF:
            spectral = norms.project_spectral_ball(jnp.asarray(w), radius=radius)
            np.testing.assert_array_equal(spectral, proj.astype(dtype))


def test_tree_projection_and_float32():
    tree = {"a": jnp.array([3.0, 0.0], jnp.float32), "b": jnp.array([[4.0]], jnp.float32)}
    out = norms.tree_project_lp_ball(tree, p=1, radius=3.5)
    assert out["a"].dtype == jnp.float32
    np.testing.assert_allclose(out["a"], [1.25, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [[2.25]], rtol=1e-6)
    assert norms.group_norm(jnp.ones((2, 2), jnp.float32), q=2, p=1).dtype == jnp.float32


# ----------------------------------------------------------------- projections: runtime checks

PROJECTIONS = {
    "l1": lambda v, r: norms.project_l1_ball(v, radius=r),
    "lp": lambda v, r: norms.project_lp_ball(v, p=INF, radius=r),
    "group": lambda v, r: norms.project_group_ball(v, q=1, p=INF, radius=r),
    "schatten": lambda v, r: norms.project_schatten_ball(v, p=1, radius=r),
    "spectral": lambda v, r: norms.project_spectral_ball(v, radius=r),
    "tree": lambda v, r: norms.tree_project_lp_ball({"x": v}, p=2, radius=r),
}


@pytest.mark.parametrize("name", sorted(PROJECTIONS))
@pytest.mark.parametrize("radius", [0.0, -1.0, math.nan, math.inf])
def test_bad_radius_raises_eagerly_and_under_jit(name, radius):
    project = PROJECTIONS[name]
    v = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"^radius: expected a finite value > 0"):
        project(v, radius)
    with pytest.raises(ValueError, match=r"^radius: expected a finite value > 0"):
        project(v, jnp.asarray(radius))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: radius"):
        jax.block_until_ready(jax.jit(project)(v, jnp.asarray(radius)))


@pytest.mark.parametrize("name", sorted(PROJECTIONS))
def test_nonfinite_input_raises_eagerly_and_under_jit(name):
    project = PROJECTIONS[name]
    arg = "v" if name in ("l1", "lp", "tree") else "w"
    v = jnp.ones((2, 3)).at[1, 1].set(jnp.nan)
    with pytest.raises(ValueError, match=rf"^{arg}: expected finite values"):
        project(v, 1.0)
    with pytest.raises(jax.errors.JaxRuntimeError, match=f"kernels check failed: {arg}"):
        jax.block_until_ready(jax.jit(project)(v, jnp.asarray(1.0)))


def test_runtime_checks_switch_off_lets_nan_through():
    v = jnp.ones(3).at[0].set(jnp.nan)
    with runtime_checks(False):
        out = jax.jit(lambda v, r: norms.project_lp_ball(v, p=2, radius=r))(v, jnp.asarray(-1.0))
    assert np.isnan(np.asarray(out)).any()


def test_traced_radius_projection_matches_concrete():
    v = jnp.asarray(np.random.default_rng(40).normal(size=(4, 3)))
    jitted = jax.jit(lambda v, r: norms.project_schatten_ball(v, p=1, radius=r))
    np.testing.assert_allclose(
        jitted(v, jnp.asarray(0.7)), norms.project_schatten_ball(v, p=1, radius=0.7), atol=1e-12
    )


def test_rank_of_nan_matrix_raises():
    with pytest.raises(ValueError, match=r"^w: expected finite"):
        norms.schatten_norm(jnp.full((2, 2), jnp.nan), p=0)
    rank = jax.jit(lambda w: norms.schatten_norm(w, p=0))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: w"):
        jax.block_until_ready(rank(jnp.full((2, 2), jnp.nan)))


SVD_NORMS = {
    "spectral": norms.spectral_norm,
    "schatten1": lambda w: norms.schatten_norm(w, p=1),
    "schatten3": lambda w: norms.schatten_norm(w, p=3),
    "operator2": lambda w: norms.tree_operator_norms({"w": w}, p=2)["w"],
    "tree_schatten2": lambda w: norms.tree_schatten_norms({"w": w}, p=2)["w"],
}


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("name", sorted(SVD_NORMS))
def test_svd_norms_of_a_nonfinite_matrix_raise(name, bad):
    """They returned NaN silently; now the check the rank (p=0) already made."""
    w = jnp.eye(3).at[1, 2].set(bad)
    with pytest.raises(ValueError, match=r"^w: expected finite values"):
        SVD_NORMS[name](w)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: w"):
        jax.block_until_ready(jax.jit(SVD_NORMS[name])(w))


@pytest.mark.parametrize("rtol", [-1.0, math.nan, math.inf, "0.1", np.ones(2), True])
def test_rank_rtol_must_be_a_finite_number_at_least_zero(rtol):
    w = jnp.eye(3)
    with pytest.raises(ValueError, match=r"^rtol: expected None or a finite number >= 0"):
        norms.schatten_norm(w, p=0, rtol=rtol)
    with pytest.raises(ValueError, match=r"^rtol: expected None or a finite number >= 0"):
        norms.tree_schatten_norms({"w": w}, p=0, rtol=rtol)


def test_rank_rtol_accepts_numbers_and_checks_a_traced_one():
    w = jnp.diag(jnp.array([1.0, 0.5, 1e-3]))
    assert int(norms.schatten_norm(w, p=0, rtol=0)) == 3
    assert int(norms.schatten_norm(w, p=0, rtol=np.float32(0.1))) == 2
    rank = jax.jit(lambda r: norms.schatten_norm(w, p=0, rtol=r))
    assert int(rank(jnp.asarray(0.6))) == 1
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: rtol"):
        jax.block_until_ready(rank(jnp.asarray(-1.0)))


def test_checks_run_once_under_vmap_and_keep_gradients():
    """A vmapped projection holds a fixed number of runtime checks, not one per element."""
    project = jax.vmap(lambda v, r: norms.project_lp_ball(v, p=2, radius=r))

    def num_callbacks(batch):
        jaxpr = jax.make_jaxpr(project)(jnp.ones((batch, 3)), jnp.ones(batch))
        return str(jaxpr).count("debug_callback")

    assert num_callbacks(64) == num_callbacks(2)
    bad = jnp.ones((5, 3)).at[3, 1].set(jnp.nan)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: v"):
        jax.block_until_ready(jax.jit(project)(bad, jnp.ones(5)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: radius"):
        jax.block_until_ready(jax.jit(project)(jnp.ones((5, 3)), jnp.ones(5).at[2].set(-1.0)))
    grad = jax.grad(lambda v: norms.project_lp_ball(v, p=2, radius=jnp.asarray(1.0))[0])
    v = jnp.array([3.0, 4.0])  # d(v_0 / |v|) / dv = (1/|v| - v_0^2/|v|^3, -v_0 v_1 / |v|^3)
    np.testing.assert_allclose(grad(v), [0.2 - 9 / 125, -12 / 125], rtol=1e-12)


@pytest.mark.parametrize("p", [1, 2, INF])
def test_projection_gradient_at_zero_is_the_identity(p):
    """Inside the ball the projection is the identity: its gradient at 0 too (p=2 gave NaN)."""

    def total(v):
        return jnp.sum(norms.project_lp_ball(v, p=p, radius=1.0))

    def tree_total(v):
        return jnp.sum(norms.tree_project_lp_ball({"a": v[:1], "b": v[1:]}, p=p, radius=1.0)["b"])

    zero = jnp.zeros(2)
    np.testing.assert_array_equal(jax.grad(total)(zero), [1.0, 1.0])
    np.testing.assert_array_equal(jax.jit(jax.grad(total))(zero), [1.0, 1.0])
    np.testing.assert_array_equal(jax.grad(tree_total)(zero), [0.0, 1.0])
    # under vmap both branches of the safe-range cond are differentiated
    batch = jnp.zeros((2, 2)).at[1].set(jnp.array([0.1, 0.2]))
    np.testing.assert_array_equal(jax.vmap(jax.grad(total))(batch), np.ones((2, 2)))
    np.testing.assert_array_equal(norms.project_lp_ball(zero, p=p, radius=1.0), zero)


def test_projection_second_call_compiles_nothing():
    rng = np.random.default_rng(50)
    first, second = (jnp.asarray(rng.normal(size=(4, 3))) for _ in range(2))
    norms.project_schatten_ball(first, p=1, radius=jnp.asarray(1.0))
    norms.project_group_ball(first, q=2, p=1, radius=0.5)
    with count_compiles() as log:
        norms.project_schatten_ball(second, p=1, radius=jnp.asarray(2.0))
        norms.project_group_ball(second, q=2, p=1, radius=0.5)
    assert compiles_in(log) == []


# ----------------------------------------------------------------------------- range boundaries


@pytest.mark.parametrize("scale", [1e-20, 1e19, 1e-30, 1e30, 3e-38])
def test_two_norms_neither_overflow_nor_underflow(scale):
    """float32 [3, 4] * scale: the plain sum of squares is inf (1e19, 1e30) or 0 (1e-20,
    1e-30, 3e-38); the scaled norm is 5 * scale to float32 rounding. (XLA flushes subnormal
    numbers to zero on CPU and GPU, so inputs below 1.2e-38 read as 0.)"""
    x = np.array([3.0, 4.0]) * scale
    x32 = jnp.asarray(x, jnp.float32)
    want = np.linalg.norm(np.asarray(x32, np.float64))
    rtol = tol(jnp.float32)
    np.testing.assert_allclose(float(norms.vector_norm(x32)), want, rtol=rtol)
    np.testing.assert_allclose(float(norms.tree_norm({"a": x32[:1], "b": x32[1:]})), want,
                               rtol=rtol)  # fmt: skip
    np.testing.assert_allclose(float(norms.group_norm(x32.reshape(2, 1), q=2, p=2)), want,
                               rtol=rtol)  # fmt: skip
    rows = jnp.stack([x32, x32[::-1]])
    np.testing.assert_allclose(norms.vector_norm(rows, axis=1), [want, want], rtol=rtol)


def test_two_norm_scaling_keeps_the_plain_rounding():
    """In the normal range the power-of-two scaling is exact: the same float32 value as the
    plain sqrt(sum(x * x))."""
    x = jnp.asarray(np.random.default_rng(2).normal(size=1000), jnp.float32)
    assert float(norms.vector_norm(x)) == float(jnp.sqrt(jnp.sum(x * x)))


def test_projections_of_huge_and_tiny_vectors():
    """l2 projection of a vector whose norm overflows float32's sum of squares (it gave 0),
    of a tiny vector (inside: unchanged), and the l1 projection of [5e30, 1] (r below the
    rounding of 5e30: it gave [0, 0])."""
    big = jnp.asarray([3e30, 4e30], jnp.float32)
    np.testing.assert_allclose(norms.project_lp_ball(big, p=2, radius=1.0), [0.6, 0.8], rtol=1e-6)
    tiny = jnp.asarray([3e-30, 4e-30], jnp.float32)
    np.testing.assert_array_equal(norms.project_lp_ball(tiny, p=2, radius=1.0), tiny)
    np.testing.assert_array_equal(
        norms.project_l1_ball(jnp.asarray([5e30, 1.0], jnp.float32), radius=1.0), [1.0, 0.0]
    )
    w = jnp.asarray([[3e30, 0.0], [4e30, 1.0]], jnp.float32)
    np.testing.assert_allclose(norms.project_group_ball(w, q=2, p=1, radius=1.0),
                               [[0.6, 0.0], [0.8, 0.0]], rtol=1e-6)  # fmt: skip


def test_vector_norm_bad_axis_names_it():
    for axis in (2, -3, 1.0, True):
        with pytest.raises(ValueError, match=r"^axis"):
            norms.vector_norm(jnp.ones((2, 2)), axis=axis)


def test_projection_checks_name_the_first_bad_argument_under_jit():
    """v and radius both bad inside jit: one check reports, the one of the first argument
    (the checks form an ordered chain, so the backend's callback order does not decide)."""
    from kernels._checks import failed_check_message

    f = jax.jit(lambda v, r: norms.project_lp_ball(v, p=2, radius=r))
    # a failure inside jit is raised when the result is read (a GPU's call returns first)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.array([jnp.nan, 1.0]), jnp.asarray(-1.0)))
    assert failed_check_message(info.value).startswith("v: expected finite")
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(f(jnp.array([2.0, 1.0]), jnp.asarray(-1.0)))
    assert failed_check_message(info.value).startswith("radius")


def test_projection_radius_must_be_a_scalar():
    with pytest.raises(ValueError, match=r"^radius: expected a scalar"):
        norms.project_lp_ball(jnp.ones(3), p=2, radius=jnp.ones(2))
    with pytest.raises(ValueError, match=r"^radius: expected a scalar"):
        norms.project_group_ball(jnp.ones((2, 2)), q=2, p=1, radius=np.ones(2))


def test_eager_two_norms_compile_once():
    """tree_norm / vector_norm called eagerly a second time with new values compile nothing
    (their overflow branch is a lax.cond inside a jitted helper)."""
    t1 = {"a": jnp.ones((3, 4)), "b": jnp.ones(5)}
    t2 = {"a": jnp.zeros((3, 4)) + 2, "b": jnp.ones(5) + 1}
    v1, v2 = jnp.ones(7), jnp.ones(7) + 2
    norms.tree_norm(t1)
    norms.vector_norm(v1)
    with count_compiles() as messages:
        assert float(norms.tree_norm(t2)) == pytest.approx(np.sqrt(12 * 4 + 5 * 4))
        assert float(norms.vector_norm(v2)) == pytest.approx(np.sqrt(7 * 9))
    assert compiles_in(messages) == []
