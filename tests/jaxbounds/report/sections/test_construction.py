"""Section ``construction`` against Theorem 10, the error bound, explicit gradients, Theorem 13."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.bounds.pac_bayes import construction_norm_bound
from jaxbounds.data.boolean import tiling_parities
from jaxbounds.models.construction import construction_error_bound
from jaxbounds.report.sections import construction_section
from tests.helpers import compiles_in, count_compiles

# Hutch++ with 60 products keeps 20 residual probes, so each trace row's stderr has 19 degrees
# of freedom: |t_19| > 8 has probability 2e-7. (With 12 products, 3 degrees of freedom, a
# 5-stderr check fails for 1.5% of keys: measured 1.75% over 4,000 keys, as t_3 predicts.)
NUM_MATVECS, TOLERANCE = 60, 8


@pytest.fixture(scope="module")
def rows(construction_run):
    return {r.name: r for r in construction_section(construction_run, num_matvecs=NUM_MATVECS)}


def test_norm_rows(construction_run, rows):
    run = construction_run
    flat = np.asarray(ravel_pytree(run.params)[0], np.float64)
    norm = rows["squared parameter norm ||theta||^2"].value
    assert norm == pytest.approx(np.sum(flat**2), rel=1e-12)
    bound = rows["norm bound L(omega, D_f, T)"].value
    # L(omega=3, D=2, T=6) = 16*4*3 + 8*3 + 1 + 3 + 4*3*3*ln(6)^2
    assert bound == pytest.approx(192 + 24 + 1 + 3 + 36 * np.log(6.0) ** 2, rel=1e-12)
    assert bound == pytest.approx(float(construction_norm_bound(3, 2, 6)))
    assert norm < bound
    assert rows["||w_v1||_F^2"].value == 1.0
    per_matrix = sum(rows[f"||{n}||_F^2"].value for n in ("w_qk1", "w_v1", "w_in", "b_in"))
    per_matrix += sum(rows[f"||{n}||_F^2"].value for n in ("w_out", "w_qk2", "w_v2"))
    assert per_matrix == pytest.approx(norm, rel=1e-12)


def test_error_loss_and_gradient_rows(construction_run, rows):
    run = construction_run
    x, y = run.train["inputs"], run.train["labels"]
    out = np.asarray(run.apply_fn(run.params, x))
    err = rows["max |f_theta(x) - f(x)| over all 2^6 inputs"].value
    assert err == pytest.approx(np.abs(out - np.asarray(y)).max(), rel=1e-10)
    assert err <= construction_error_bound(tiling_parities(6, 2), seq_len=6) * (1 + 1e-9)
    loss = rows["training loss (quadratic, all inputs)"].value
    assert loss == pytest.approx(np.mean((out - np.asarray(y)) ** 2), rel=1e-10)
    flat, unravel = ravel_pytree(run.params)
    grads = jax.vmap(lambda xi: jax.grad(lambda v: run.apply_fn(unravel(v), xi[None])[0])(flat))(x)
    grad_sq = np.sum(np.asarray(grads) ** 2, axis=1)
    assert rows["G_u = max_x ||grad_theta f(x)||^2"].value == pytest.approx(
        grad_sq.max(), rel=1e-10
    )
    identity = rows["2 mean_x ||grad_theta f(x)||^2 (Theorem 13, exact)"].value
    assert identity == pytest.approx(2 * grad_sq.mean(), rel=1e-10)


def test_trace_rows_against_the_dense_hessian(construction_run, rows):
    run = construction_run
    x, y = run.train["inputs"], run.train["labels"]
    flat, unravel = ravel_pytree(run.params)
    outputs = run.apply_fn(run.params, x)
    for name, targets in (
        ("tr H at an interpolator (labels = model outputs), Hutch++", outputs),
        ("tr H of the loss with the true labels, Hutch++", y),
    ):
        hess = jax.jit(jax.hessian(lambda v, t: jnp.mean((run.apply_fn(unravel(v), x) - t) ** 2)))
        exact = float(jnp.trace(hess(flat, targets)))
        row = rows[name]
        assert abs(row.value - exact) <= TOLERANCE * row.stderr + 1e-6 * abs(exact), name
    identity = rows["2 mean_x ||grad_theta f(x)||^2 (Theorem 13, exact)"].value
    est = rows["tr H at an interpolator (labels = model outputs), Hutch++"]
    assert abs(est.value - identity) <= 1e-6 * identity + TOLERANCE * est.stderr
    assert f"{NUM_MATVECS} products" in est.note


def test_second_section_call_compiles_nothing(construction_run, rows):
    """Both Hutch++ traces use the run's loss_fn with the labels in the batch: one program."""
    with count_compiles() as messages:
        again = {r.name: r for r in construction_section(construction_run, num_matvecs=NUM_MATVECS)}
    assert compiles_in(messages) == []
    name = "tr H at an interpolator (labels = model outputs), Hutch++"
    assert again[name].value == rows[name].value
