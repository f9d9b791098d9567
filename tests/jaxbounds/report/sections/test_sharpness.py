"""Section ``sharpness`` against an independent Monte Carlo, the dense Hessian and ascent bounds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.report.sections import sharpness_section
from jaxbounds.report.sections.sharpness import RADIUS, SIGMA, SharpnessSizes
from tests.helpers import compiles_in, count_compiles

SIZES = SharpnessSizes(num_samples=32, num_probes=32, num_steps=8)  # 32 pairs: 64 evaluations


@pytest.fixture(scope="module")
def setup(scalar_run):
    rows = {r.name: r for r in sharpness_section(scalar_run, sizes=SIZES)}
    flat, unravel = ravel_pytree(scalar_run.params)
    loss = jax.jit(lambda f: scalar_run.train_loss()(unravel(f)))
    return rows, flat, loss


def _average(loss, flat, scale, key, num=2000):
    """Independent antithetic Monte Carlo of E L(θ+u) - L(θ), u = scale * N(0, I)."""
    u = jax.random.normal(key, (num, flat.size), flat.dtype) * scale[None]
    base = loss(flat)
    vals = jax.lax.map(lambda v: (loss(flat + v) + loss(flat - v)) / 2 - base, u, batch_size=200)
    vals = np.asarray(vals, np.float64)
    return vals.mean(), vals.std(ddof=1) / np.sqrt(num)


def test_average_sharpness_rows(setup):
    rows, flat, loss = setup
    assert rows["σ (Gaussian perturbation)"].value == SIGMA
    for name, scale in (
        ("average sharpness E L(θ+u) - L(θ)", jnp.full_like(flat, SIGMA)),
        ("adaptive average sharpness", SIGMA * jnp.abs(flat)),
    ):
        mean, se = _average(loss, flat, scale, jax.random.key(11))
        row = rows[name]
        assert abs(row.value - mean) <= 5 * np.hypot(row.stderr, se) + 1e-7, name
    hess = np.asarray(jax.jit(jax.hessian(loss))(flat), np.float64)
    trace_row = rows["Thm 6/12: (σ²/2) tr H(θ)"]
    assert abs(trace_row.value - SIGMA**2 / 2 * np.trace(hess)) <= 5 * trace_row.stderr + 1e-9
    p_row = rows["Thm 6/12: remainder P"]
    assert abs(p_row.value) <= abs(trace_row.value)  # P = O(σ⁴) against O(σ²)
    # the three terms estimate one identity: average = trace term + P up to Monte Carlo error
    avg = rows["average sharpness E L(θ+u) - L(θ)"]
    gap = avg.value - trace_row.value - p_row.value
    assert abs(gap) <= 5 * np.sqrt(avg.stderr**2 + trace_row.stderr**2 + p_row.stderr**2)
    for name in ("average sharpness E L(θ+u) - L(θ)", "adaptive average sharpness"):
        assert "32 antithetic pairs (u, -u), 64 loss evaluations" in rows[name].note


def _ascent_bounds(loss, flat, scale):
    """(value at a feasible point along the gradient, first + second order estimate of the max)."""
    g = np.asarray(jax.grad(loss)(flat), np.float64) * np.asarray(scale)
    step = RADIUS * g / np.linalg.norm(g)
    along = float(loss(flat + jnp.asarray(step * np.asarray(scale), flat.dtype)) - loss(flat))
    return along, RADIUS * np.linalg.norm(g)


def test_worst_case_rows_between_a_feasible_point_and_the_first_order_max(setup):
    rows, flat, loss = setup
    for name, scale in (
        (f"worst-case sharpness (l2, ρ = {RADIUS:g})", np.ones(flat.size)),
        (f"adaptive worst-case sharpness (l2, ρ = {RADIUS:g})", np.abs(np.asarray(flat))),
    ):
        along, first_order = _ascent_bounds(loss, flat, scale)
        value = rows[name].value
        assert along > 0
        # the ascent finds at least most of the gradient step, and at most a little more than
        # the first-order maximum (curvature adds O(ρ²))
        assert 0.9 * along <= value <= 1.5 * first_order, (name, along, value, first_order)
        assert rows[name].stderr is None


def test_second_section_call_compiles_nothing(scalar_run, setup):
    rows = setup[0]
    moved = jax.tree_util.tree_map(lambda a: 1.01 * a, scalar_run.params)
    run = dataclasses.replace(scalar_run, params=moved, meta={})
    jax.block_until_ready(moved)
    with count_compiles() as messages:
        again = {r.name: r for r in sharpness_section(run, sizes=SIZES)}
    assert compiles_in(messages) == []
    name = "average sharpness E L(θ+u) - L(θ)"
    assert again[name].value != rows[name].value
