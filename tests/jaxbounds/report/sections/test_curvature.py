"""Section ``curvature`` against the dense Hessian and the norms of the weights."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.report.sections import curvature_section
from tests.helpers import compiles_in, count_compiles


@pytest.fixture(scope="module")
def rows(scalar_run):
    return {r.name: r for r in curvature_section(scalar_run)}


def test_trace_and_eigenvalues_against_the_dense_hessian(scalar_run, rows):
    run = scalar_run
    flat, unravel = ravel_pytree(run.params)
    loss = run.train_loss()
    hess = np.asarray(jax.jit(jax.hessian(lambda f: loss(unravel(f))))(flat), np.float64)
    exact = float(np.trace(hess))
    for name in ("Hessian trace (Hutchinson)", "Hessian trace (Hutch++)"):
        row = rows[name]
        assert row.stderr > 0
        assert abs(row.value - exact) <= 5 * row.stderr + 1e-4 * abs(exact), name
    eig = np.linalg.eigvalsh(hess)
    # 40 Lanczos steps on a 392-dimensional Hessian: the top Ritz values have converged.
    assert rows["Hessian eigenvalue λ1"].value == pytest.approx(eig[-1], rel=1e-3)
    assert rows["Hessian eigenvalue λ2"].value == pytest.approx(eig[-2], rel=1e-2)
    assert "Hessian eigenvalue λ3" not in rows
    assert "curvature_seconds" in run.meta


def test_norm_rows(scalar_run, rows):
    run = scalar_run
    layer = run.params["layers"][0]
    for h in range(2):
        for key, name in (("w_qk", "W_QK"), ("w_v", "W_v"), ("w_c", "W_c")):
            expected = np.linalg.norm(np.asarray(layer[key][h], np.float64))
            assert rows[f"‖layer0.head{h}.{name}‖_F"].value == pytest.approx(expected, rel=1e-6)
    flat = np.asarray(ravel_pytree(run.params)[0], np.float64)
    flat0 = np.asarray(ravel_pytree(run.facts.init_params)[0], np.float64)
    assert rows["‖θ‖_1 (all weights)"].value == pytest.approx(np.abs(flat).sum(), rel=1e-6)
    assert rows["‖θ‖_2 (all weights)"].value == pytest.approx(np.linalg.norm(flat), rel=1e-6)
    assert rows["‖θ - θ_0‖_2"].value == pytest.approx(np.linalg.norm(flat - flat0), rel=1e-5)
    assert rows["‖w‖_F"].value == pytest.approx(float(jnp.linalg.norm(run.params["w"])))


def test_second_section_call_compiles_nothing(scalar_run, rows):
    """One program keyed by the run's loss_fn: new parameters of the same shapes reuse it."""
    moved = jax.tree_util.tree_map(lambda a: 1.01 * a, scalar_run.params)
    run = dataclasses.replace(scalar_run, params=moved, meta={})
    jax.block_until_ready(moved)
    with count_compiles() as messages:
        again = {r.name: r for r in curvature_section(run)}
    assert compiles_in(messages) == []
    assert again["Hessian eigenvalue λ1"].value != rows["Hessian eigenvalue λ1"].value
