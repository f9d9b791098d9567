"""Section ``rademacher`` against closed forms, an independent Monte Carlo and McDiarmid widths."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.report.sections import rademacher_section
from jaxbounds.report.sections.rademacher import NormBallProjection, RademacherSizes
from tests.helpers import compiles_in, count_compiles

SIZES = RademacherSizes(
    search_draws=4, search_steps=5, search_restarts=1, search_chunk=2, linear_draws=2048
)


@pytest.fixture(scope="module")
def rows(scalar_run):
    return {r.name: r for r in rademacher_section(scalar_run, sizes=SIZES)}


def _halfwidth(bound, m, draws, delta=0.05):
    return 2 * bound * math.sqrt(math.log(2 / delta) / (2 * m * draws))


def test_search_lower_bound(scalar_run, rows):
    row = rows["Rad_S lower bound (search, trained-norm ball)"]
    b = float(np.linalg.norm(np.asarray(scalar_run.params["w"], np.float64)))
    m = 40
    assert 0.0 <= row.value <= b  # |f| <= ||w||_2 = b on the ball, so Rad_S <= b
    assert row.stderr >= 0
    assert row.lower == pytest.approx(row.value - _halfwidth(b, m, 4), rel=1e-5)
    assert row.upper is None
    assert f"||w||_2 = {b:.4g}" in row.note
    assert "4 sign vectors x 1 starts x 5 steps, m = 40" in row.note


def test_linear_class_against_monte_carlo_and_khintchine(scalar_run, rows):
    x = np.asarray(scalar_run.train["inputs"], np.float64).reshape(40, -1)
    jensen = math.sqrt(np.sum(x**2)) / 40
    assert rows["linear class Jensen upper bound sqrt(sum ||X_i||_F^2) / m"].value == pytest.approx(
        jensen, rel=1e-6
    )
    row = rows["Rad_S linear class {<W, X>_F : ||W||_F <= 1} on the inputs"]
    rng = np.random.default_rng(0)
    signs = rng.choice([-1.0, 1.0], size=(20000, 40))
    sups = np.linalg.norm(signs @ x, axis=1) / 40  # the dual norm gives the exact sup
    assert abs(row.value - sups.mean()) <= 5 * math.hypot(row.stderr, sups.std() / math.sqrt(2e4))
    assert jensen / math.sqrt(2) - 5 * row.stderr <= row.value <= jensen + 5 * row.stderr
    width = _halfwidth(np.linalg.norm(x, axis=1).max(), 40, 2048)
    assert row.upper - row.value == pytest.approx(width, rel=1e-5)
    assert row.value - row.lower == pytest.approx(width, rel=1e-5)


def test_norm_ball_projection_is_a_pytree_and_handles_zero_norm_leaves():
    rng = np.random.default_rng(5)
    params = {"a": jnp.asarray(rng.normal(size=(3, 2))), "b": jnp.zeros(4), "c": jnp.zeros((0,))}
    proj = NormBallProjection.of(params)
    leaves, treedef = jax.tree_util.tree_flatten(proj)
    assert len(leaves) == 3
    assert all(leaf.shape == () for leaf in leaves)
    assert jax.tree_util.tree_unflatten(treedef, leaves).radii.keys() == params.keys()
    x = {"a": 3.0 * params["a"], "b": jnp.ones(4), "c": jnp.zeros((0,))}
    out = jax.jit(lambda p, v: p(v))(proj, x)
    np.testing.assert_allclose(out["a"], params["a"], rtol=1e-12)  # scaled back onto the sphere
    np.testing.assert_array_equal(out["b"], np.zeros(4))  # radius 0: the ball is the origin
    assert out["c"].shape == (0,)
    inside = {"a": 0.5 * params["a"], "b": jnp.zeros(4), "c": jnp.zeros((0,))}
    np.testing.assert_allclose(proj(inside)["a"], inside["a"], rtol=1e-12)


def test_second_section_call_compiles_nothing(scalar_run):
    """The search gets the run's apply_fn and a pytree projection: nothing is rebuilt per call."""
    rademacher_section(scalar_run, sizes=SIZES)
    # shrunk, so that the readout norm of the facts still bounds |f| on the new ball
    moved = jax.tree_util.tree_map(lambda a: 0.99 * a, scalar_run.params)
    run = dataclasses.replace(scalar_run, params=moved)
    jax.block_until_ready(moved)
    with count_compiles() as messages:
        rows = {r.name: r for r in rademacher_section(run, sizes=SIZES)}
    assert compiles_in(messages) == []
    assert np.isfinite(rows["Rad_S lower bound (search, trained-norm ball)"].value)
