"""Section ``curvature`` against the dense Hessian, dense Gauss-Newton and per-example Fisher
references, and the norms of the weights."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.report.sections import curvature_section
from jaxbounds.report.sections.curvature import _FISHER_SAMPLES
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


def test_gauss_newton_and_fisher_rows_against_dense_references(scalar_run, rows):
    # the scalar model: scores f_i, logistic loss; G = (1/n) sum_i s(f_i) s(-f_i) J_i J_i^T
    run = scalar_run
    flat, unravel = ravel_pytree(run.params)
    inputs, labels = run.train["inputs"], run.train["labels"]
    n = labels.shape[0]
    jac = np.asarray(jax.jacfwd(lambda f: run.apply_fn(unravel(f), inputs))(flat), np.float64)
    scores = np.asarray(run.apply_fn(run.params, inputs), np.float64)
    sig = 1 / (1 + np.exp(-scores))
    exact_ggn = float(np.sum(sig * (1 - sig) * np.sum(jac**2, axis=1)) / n)
    row = rows["GGN trace (Hutchinson)"]
    assert row.stderr > 0
    assert abs(row.value - exact_ggn) <= 5 * row.stderr

    # empirical Fisher: gradients of the training loss on each example alone (a batch of one)
    def example_loss(f, x, y):
        return run.loss_fn(unravel(f), {"inputs": x[None], "labels": y[None]})

    grads = jax.jit(jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0)))(flat, inputs, labels)
    grads = np.asarray(grads, np.float64)
    emp = rows["Empirical Fisher trace"]
    assert emp.value == pytest.approx(float(np.sum(grads**2) / n), rel=1e-10)
    assert emp.stderr is None
    # Monte Carlo Fisher: unbiased for the Gauss-Newton trace, its stderr from the label draws
    mc = rows["Fisher trace (Monte Carlo)"]
    assert mc.stderr > 0
    assert abs(mc.value - exact_ggn) <= 5 * mc.stderr
    assert f"{_FISHER_SAMPLES} draws" in mc.note
    assert "gauss_newton_seconds" in run.meta


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
    assert again["Empirical Fisher trace"].value != rows["Empirical Fisher trace"].value
