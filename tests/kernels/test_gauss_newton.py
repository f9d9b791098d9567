"""Gauss-Newton and Fisher operators against dense float64 references built with jax.jacfwd.

G = J^T H_out J with J = jax.jacfwd of the outputs in the flattened parameters and H_out =
jax.hessian of a loss written here from scratch (not the kernel's analytic formulas); the Fisher
from per-example gradients taken one example at a time with jax.grad.
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from kernels._backend import reduced_precision_matmuls
from kernels._checks import runtime_checks
from kernels.curvature import (
    hutchinson_trace,
    hutchpp_trace,
    lanczos,
    slq_nodes,
    top_eigenvalues,
)
from kernels.gauss_newton import (
    DatasetFisherOperator,
    DatasetGGNOperator,
    FisherOperator,
    GGNOperator,
    dataset_empirical_fisher,
    dataset_ggn,
    dataset_mc_fisher,
    empirical_fisher,
    empirical_fisher_trace,
    ggn,
    ggn_trace,
    mc_fisher,
    mc_fisher_trace,
)
from tests.helpers import TraceCounter, compiles_in, count_compiles, matmul_tol

# --------------------------------------------------------------------------- small models


def mlp(p, x):
    """A tanh network applied on the last axis: (..., d) -> (..., k)."""
    h = x @ p["w1"]
    h = jnp.tanh(h + jnp.broadcast_to(p["b1"], h.shape)) @ p["w2"]
    return h + jnp.broadcast_to(p["b2"], h.shape)


def scalar_mlp(p, x):
    """Scalar scores (n,) of a tanh network."""
    return mlp(p, x)[..., 0]


def make_params(key, d, hidden, k, dtype=jnp.float64):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "w1": (0.8 * jax.random.normal(k1, (d, hidden))).astype(dtype),
        "b1": (0.2 * jax.random.normal(k2, (hidden,))).astype(dtype),
        "w2": jax.random.normal(k3, (hidden, k)).astype(dtype),
        "b2": (0.2 * jax.random.normal(k4, (k,))).astype(dtype),
    }


def ce_ref(outputs, targets):
    """Mean softmax cross-entropy over all positions, written with log_softmax."""
    logp = jax.nn.log_softmax(outputs, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def logistic_ref(outputs, targets):
    return jnp.mean(jnp.log1p(jnp.exp(outputs)) - targets * outputs)


def squared_ref(outputs, targets):
    return jnp.mean((outputs - targets) ** 2)


def log_cosh(outputs, targets):
    """A loss without a named form (the autodiff fallback): mean log cosh of the residuals."""
    return jnp.mean(jnp.log(jnp.cosh(outputs - targets)))


def make_case(name, dtype=jnp.float64, seed=0, num=5):
    """``(apply_fn, params, batch, loss, reference loss)`` of one problem (30-40 parameters).

    - ``cross_entropy``: logits of a sequence model, (n, T=3, K=4), integer labels (n, T);
    - ``logistic``: scalar scores (n,), labels in {0, 1};
    - ``squared_error``: two outputs per example, (n, 2);
    - ``fallback``: the mean log cosh of two outputs per example (a callable loss).
    """
    kx, ky, kp = jax.random.split(jax.random.key(100 + seed), 3)
    if name == "cross_entropy":
        x = jax.random.normal(kx, (num, 3, 3))
        y = jax.random.randint(ky, (num, 3), 0, 4)
        params = make_params(kp, 3, 4, 4, dtype)
        return mlp, params, (x.astype(dtype), y), "cross_entropy", ce_ref
    if name == "logistic":
        x = jax.random.normal(kx, (num, 3))
        y = jax.random.bernoulli(ky, 0.5, (num,)).astype(dtype)
        params = make_params(kp, 3, 5, 1, dtype)
        return scalar_mlp, params, (x.astype(dtype), y), "logistic", logistic_ref
    x = jax.random.normal(kx, (num, 3))
    y = jax.random.normal(ky, (num, 2))
    params = make_params(kp, 3, 4, 2, dtype)
    loss = "squared_error" if name == "squared_error" else log_cosh
    ref = squared_ref if name == "squared_error" else log_cosh
    return mlp, params, (x.astype(dtype), y.astype(dtype)), loss, ref


LOSSES = ["cross_entropy", "logistic", "squared_error", "fallback"]


def dense_ggn(apply_fn, params, batch, ref):
    """J^T H_out J from jax.jacfwd and jax.hessian on the flattened outputs."""
    x, y = batch
    flat, unravel = ravel_pytree(params)
    outputs = apply_fn(params, x)
    jac = jax.jacfwd(lambda f: apply_fn(unravel(f), x).reshape(-1))(flat)
    h_out = jax.hessian(lambda o: ref(o.reshape(outputs.shape), y))(outputs.reshape(-1))
    return np.asarray(jac.T @ h_out @ jac)


def per_example_grads(apply_fn, params, batch, ref, summed):
    """Rows g_i = grad of example i's loss, each example alone through jax.grad.

    ``summed``: the example's loss is the sum of its terms (named losses: its log-likelihood);
    else the loss on a batch of one (a callable loss).
    """
    x, y = batch
    flat, unravel = ravel_pytree(params)

    def example_loss(f, i):
        out = apply_fn(unravel(f), x[i : i + 1])
        value = ref(out, y[i : i + 1])
        return value * (out.size // (out.shape[-1] if ref is ce_ref else 1)) if summed else value

    return np.stack([np.asarray(jax.grad(example_loss)(flat, i)) for i in range(x.shape[0])])


def num_terms(name, apply_fn, params, batch):
    out = apply_fn(params, batch[0])
    if name == "cross_entropy":
        return out.size // out.shape[-1]
    return out.shape[0] if name == "fallback" else out.size


def dense_fisher(name, apply_fn, params, batch, ref):
    grads = per_example_grads(apply_fn, params, batch, ref, summed=name != "fallback")
    return grads.T @ grads / num_terms(name, apply_fn, params, batch), grads


def dense_matrix(op, params):
    """The operator applied to every unit vector (a symmetric n x n matrix)."""
    flat, unravel = ravel_pytree(params)
    cols = jax.jit(jax.vmap(lambda e: ravel_pytree(op(unravel(e)))[0]))(jnp.eye(flat.size))
    return np.asarray(cols).T


@functools.cache
def case(name):
    apply_fn, params, batch, loss, ref = make_case(name)
    return apply_fn, params, batch, loss, ref, dense_ggn(apply_fn, params, batch, ref)


def random_vectors(params, num, seed=3):
    flat, unravel = ravel_pytree(params)
    xs = jax.random.normal(jax.random.key(seed), (num, flat.size), flat.dtype)
    return np.asarray(xs), [unravel(v) for v in xs]


# --------------------------------------------------------------------------- GGN


@pytest.mark.parametrize("name", LOSSES)
def test_ggn_products_and_forms_match_the_jacfwd_reference(run, name):
    apply_fn, params, batch, loss, _, g = case(name)
    xs, vs = random_vectors(params, 3)
    op = ggn(apply_fn, params, batch, loss=loss)
    got = run(lambda: jnp.stack([ravel_pytree(op(v))[0] for v in vs]))
    want = xs @ g
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    forms = run(lambda: jnp.stack([op.form(v) for v in vs]))
    np.testing.assert_allclose(forms, np.einsum("ij,jk,ik->i", xs, g, xs), rtol=1e-10)
    assert np.abs(g - g.T).max() <= 1e-12 * np.abs(g).max()


def test_ggn_is_the_hessian_for_a_model_linear_in_its_parameters():
    kx, ky, kw = jax.random.split(jax.random.key(4), 3)
    x, y = jax.random.normal(kx, (7, 3)), jax.random.normal(ky, (7, 2))
    params = {"w": jax.random.normal(kw, (3, 2)), "b": jnp.array([0.3, -0.2])}

    def linear(p, x):
        return x @ p["w"] + p["b"][None, :]

    flat, unravel = ravel_pytree(params)
    hessian = jax.hessian(lambda f: squared_ref(linear(unravel(f), x), y))(flat)
    g = dense_matrix(ggn(linear, params, (x, y), loss="squared_error"), params)
    np.testing.assert_allclose(g, hessian, rtol=1e-12, atol=1e-13)


def test_recomputed_products_match_the_linearised_ones():
    # linearize=False linearises apply_fn afresh in every Lanczos step: the same operator (the
    # same label draws for the Monte Carlo Fisher), so the dense spectrum and the linearised
    # run's eigenvalues to rounding
    apply_fn, params, batch, loss, _, g = case("cross_entropy")
    n = g.shape[0]
    key = jax.random.key(8)
    dense = np.linalg.eigvalsh(g)[::-1]
    ops = {
        "ggn": ggn(apply_fn, params, batch, loss=loss),
        "empirical": empirical_fisher(apply_fn, params, batch, loss=loss),
        "mc": mc_fisher(apply_fn, params, batch, jax.random.key(9), loss=loss, num_samples=2),
    }
    for name, op in ops.items():
        top = [top_eigenvalues(op, params, key, k=2, num_steps=n, linearize=lin)
               for lin in (True, False)]  # fmt: skip
        scale = abs(float(top[0][0]))
        np.testing.assert_allclose(top[1], top[0], rtol=0, atol=1e-10 * scale, err_msg=name)
        if name == "ggn":
            np.testing.assert_allclose(top[1], dense[:2], rtol=1e-9)


def test_ggn_spectrum_is_non_negative_and_matches_the_dense_one():
    apply_fn, params, batch, loss, _, g = case("cross_entropy")
    op = ggn(apply_fn, params, batch, loss=loss)
    n = g.shape[0]
    tri = lanczos(op, params, jax.random.key(5), num_steps=n)  # a full basis: T ~ G
    ritz = np.linalg.eigvalsh(tri.matrix())
    dense = np.linalg.eigvalsh(g)
    scale = dense[-1]
    assert ritz.min() >= -1e-10 * scale, ritz.min()  # positive semi-definite to rounding
    assert dense.min() >= -1e-12 * scale
    np.testing.assert_allclose(np.sort(ritz), dense, atol=1e-9 * scale)
    top = top_eigenvalues(op, params, jax.random.key(6), k=3, num_steps=n)
    np.testing.assert_allclose(top, dense[::-1][:3], rtol=1e-9)
    # stochastic Lanczos quadrature: nodes inside the spectrum
    q = slq_nodes(op, params, jax.random.key(7), num_samples=3, num_steps=5)
    assert np.asarray(q.nodes).min() >= -1e-10 * scale
    assert np.asarray(q.nodes).max() <= scale * (1 + 1e-9)


def test_ggn_is_positive_where_the_hessian_is_not():
    # the Hessian of the same cross-entropy has negative eigenvalues (the network's curvature),
    # which the Gauss-Newton matrix drops
    apply_fn, params, batch, _, ref, g = case("cross_entropy")
    flat, unravel = ravel_pytree(params)
    hessian = jax.hessian(lambda f: ref(apply_fn(unravel(f), batch[0]), batch[1]))(flat)
    assert np.linalg.eigvalsh(hessian).min() < -1e-3
    assert np.linalg.eigvalsh(g).min() > -1e-12 * np.abs(g).max()


@pytest.mark.parametrize("method", ["hutchinson", "hutchpp"])
def test_ggn_trace(method):
    apply_fn, params, batch, loss, _, g = case("cross_entropy")
    n = g.shape[0]
    if method == "hutchpp":  # 3n products: the sketch spans the space, the trace is exact
        est = ggn_trace(
            apply_fn, params, batch, jax.random.key(7), loss=loss, num_matvecs=3 * n, method=method
        )
        assert float(est.mean) == pytest.approx(np.trace(g), rel=1e-10)
        return
    m = 400
    est = ggn_trace(apply_fn, params, batch, jax.random.key(7), loss=loss, num_samples=m)
    assert abs(float(est.mean) - np.trace(g)) <= 5 * float(est.stderr)
    closed_form = np.sqrt(2 * (np.sum(g**2) - np.sum(np.diag(g) ** 2)) / m)
    assert float(est.stderr) == pytest.approx(closed_form, rel=0.2)


# --------------------------------------------------------------------------- empirical Fisher


@pytest.mark.parametrize("name", LOSSES)
def test_empirical_fisher_matches_per_example_gradients(name):
    apply_fn, params, batch, loss, ref, _ = case(name)
    f, _ = dense_fisher(name, apply_fn, params, batch, ref)
    xs, vs = random_vectors(params, 3)
    op = empirical_fisher(apply_fn, params, batch, loss=loss)
    got = jnp.stack([ravel_pytree(op(v))[0] for v in vs])
    want = xs @ f
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    forms = jnp.stack([op.form(v) for v in vs])
    np.testing.assert_allclose(forms, np.einsum("ij,jk,ik->i", xs, f, xs), rtol=1e-10)


@pytest.mark.parametrize("name", LOSSES)
def test_empirical_fisher_trace_is_the_sum_of_per_example_squared_gradient_norms(name):
    apply_fn, params, batch, loss, ref, _ = case(name)
    _, grads = dense_fisher(name, apply_fn, params, batch, ref)
    want = np.sum(grads**2) / num_terms(name, apply_fn, params, batch)
    for chunk in (None, 2, 64):  # one at a time, chunks with a remainder, all at once
        got = empirical_fisher_trace(apply_fn, params, batch, loss=loss, example_chunk_size=chunk)
        assert float(got) == pytest.approx(want, rel=1e-12), chunk


def test_empirical_fisher_trace_matches_its_operator_and_sequence_normalisation():
    # cross-entropy on (n, T, K): F = (1/(nT)) sum_i g_i g_i^T, g_i the gradient of example i's
    # summed token losses, which is T times the Fisher of the per-sequence mean loss
    apply_fn, params, batch, loss, _, _ = case("cross_entropy")
    f = dense_matrix(empirical_fisher(apply_fn, params, batch, loss=loss), params)
    trace = float(empirical_fisher_trace(apply_fn, params, batch, loss=loss))
    assert trace == pytest.approx(np.trace(f), rel=1e-12)
    mean_loss_grads = per_example_grads(apply_fn, params, batch, ce_ref, summed=False)
    per_sequence = np.sum(mean_loss_grads**2) / batch[0].shape[0]
    assert trace == pytest.approx(3 * per_sequence, rel=1e-12)  # T = 3


def test_a_callable_loss_gives_the_named_operators_with_one_term_per_example():
    kx, ky, kp = jax.random.split(jax.random.key(8), 3)
    x, y = jax.random.normal(kx, (6, 3)), jax.random.randint(ky, (6,), 0, 4)
    params = make_params(kp, 3, 4, 4)
    for build in (ggn, empirical_fisher):
        named = dense_matrix(build(mlp, params, (x, y), loss="cross_entropy"), params)
        fallback = dense_matrix(build(mlp, params, (x, y), loss=ce_ref), params)
        np.testing.assert_allclose(fallback, named, rtol=1e-10, atol=1e-12 * np.abs(named).max())
    traces = [
        empirical_fisher_trace(mlp, params, (x, y), loss=loss) for loss in ("cross_entropy", ce_ref)
    ]
    assert float(traces[0]) == pytest.approx(float(traces[1]), rel=1e-12)


# --------------------------------------------------------------------------- Monte Carlo Fisher


def test_mc_fisher_operator_is_positive_and_each_draw_is_its_trace_sample():
    apply_fn, params, batch, loss, _, _ = case("cross_entropy")
    key = jax.random.key(9)
    op = mc_fisher(apply_fn, params, batch, key, loss=loss, num_samples=3)
    assert isinstance(op, FisherOperator)
    f = dense_matrix(op, params)
    assert np.abs(f - f.T).max() <= 1e-12 * np.abs(f).max()
    eigs = np.linalg.eigvalsh(f)
    assert eigs.min() >= -1e-12 * eigs.max()
    # rank at most n M = 15 of 40 dimensions
    assert np.sum(eigs > 1e-10 * eigs.max()) <= 15
    # sample k of mc_fisher_trace is the exact trace of mc_fisher(key=fold_in(key, k))
    draws = [
        np.trace(
            dense_matrix(
                mc_fisher(apply_fn, params, batch, jax.random.fold_in(key, k), loss=loss), params
            )
        )
        for k in range(2)
    ]
    est = mc_fisher_trace(apply_fn, params, batch, key, loss=loss, num_samples=2)
    assert float(est.mean) == pytest.approx(np.mean(draws), rel=1e-12)
    assert float(est.stderr) == pytest.approx(abs(draws[0] - draws[1]) / 2, rel=1e-9)


@pytest.mark.parametrize("name", ["cross_entropy", "logistic", "squared_error"])
def test_mc_fisher_trace_is_unbiased_for_the_gauss_newton_trace(name):
    """z-scores over 24 fixed keys: their mean within 3 standard errors of 0, their spread ~1."""
    apply_fn, params, batch, loss, _, g = case(name)
    exact = np.trace(g)  # the Fisher of these likelihoods is the Gauss-Newton matrix
    keys = jax.random.split(jax.random.key(10), 24)
    with runtime_checks(False):  # statistics only (vmap over keys)
        est = jax.jit(
            jax.vmap(
                lambda k: mc_fisher_trace(
                    apply_fn, params, batch, k, loss=loss, num_samples=64, example_chunk_size=5
                )
            )
        )(keys)
    z = (np.asarray(est.mean) - exact) / np.asarray(est.stderr)
    assert abs(z.mean()) <= 3 / np.sqrt(len(z)), z
    assert 0.6 <= z.std(ddof=1) <= 1.4, z.std(ddof=1)  # the reported stderr is calibrated
    pooled = np.asarray(est.mean).mean()
    assert abs(pooled - exact) <= 3 * np.asarray(est.mean).std(ddof=1) / np.sqrt(len(z))


def test_mc_fisher_quadratic_forms_average_to_the_gauss_newton_form():
    apply_fn, params, batch, loss, _, g = case("cross_entropy")
    xs, vs = random_vectors(params, 1, seed=11)
    keys = jax.random.split(jax.random.key(12), 400)
    with runtime_checks(False):
        forms = jax.jit(
            jax.vmap(lambda k: mc_fisher(apply_fn, params, batch, k, loss=loss).form(vs[0]))
        )(keys)
    forms = np.asarray(forms)
    exact = xs[0] @ g @ xs[0]
    assert abs(forms.mean() - exact) <= 3 * forms.std(ddof=1) / np.sqrt(len(forms))


def test_mc_fisher_draws_follow_the_documented_keys():
    # M = 2 samples of a logistic model by hand: label of example i in sample m drawn from
    # fold_in(fold_in(key, m), i), score s = sigmoid(f) - y, F = (1/(n M)) sum g g^T
    apply_fn, params, batch, loss, _, _ = case("logistic")
    x = batch[0]
    key = jax.random.key(13)
    flat, unravel = ravel_pytree(params)
    f = apply_fn(params, x)
    jac = np.asarray(jax.jacfwd(lambda w: apply_fn(unravel(w), x))(flat))  # (n, dim)
    want = 0
    for m in range(2):
        for i in range(x.shape[0]):
            k = jax.random.fold_in(jax.random.fold_in(key, m), i)
            label = jax.random.bernoulli(k, jax.nn.sigmoid(f[i : i + 1]))[0].astype(f.dtype)
            g = float(jax.nn.sigmoid(f[i]) - label) * jac[i]
            want = want + np.outer(g, g) / (2 * x.shape[0])
    got = dense_matrix(mc_fisher(apply_fn, params, batch, key, loss=loss, num_samples=2), params)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)


# --------------------------------------------------------------------------- datasets


def stacked(name, num_batches=3, per_batch=2):
    apply_fn, params, batch, loss, ref = make_case(name, num=num_batches * per_batch)
    batches = jax.tree_util.tree_map(
        lambda a: a.reshape(num_batches, per_batch, *a.shape[1:]), batch
    )
    return apply_fn, params, batch, batches, loss, ref


@pytest.mark.parametrize("name", ["cross_entropy", "fallback"])
def test_dataset_ggn_trace_equals_the_concatenated_batch(name):
    apply_fn, params, whole, batches, loss, _ = stacked(name)
    dop = dataset_ggn(apply_fn, params, batches, loss=loss)
    assert isinstance(dop, DatasetGGNOperator)
    g_whole = dense_matrix(ggn(apply_fn, params, whole, loss=loss), params)
    np.testing.assert_allclose(
        dense_matrix(dop, params), g_whole, rtol=1e-10, atol=1e-12 * np.abs(g_whole).max()
    )
    key = jax.random.key(14)
    a = hutchinson_trace(dop, params, key, num_samples=16)  # a scan of forms over batches
    b = hutchinson_trace(ggn(apply_fn, params, whole, loss=loss), params, key, num_samples=16)
    np.testing.assert_allclose([a.mean, a.stderr], [b.mean, b.stderr], rtol=1e-10)
    n = g_whole.shape[0]
    exact = hutchpp_trace(dop, params, key, num_matvecs=3 * n)
    assert float(exact.mean) == pytest.approx(np.trace(g_whole), rel=1e-10)


def test_dataset_fisher_operators_equal_their_batches():
    apply_fn, params, whole, batches, loss, _ = stacked("cross_entropy")
    dop = dataset_empirical_fisher(apply_fn, params, batches, loss=loss)
    assert isinstance(dop, DatasetFisherOperator)
    f_whole = dense_matrix(empirical_fisher(apply_fn, params, whole, loss=loss), params)
    np.testing.assert_allclose(
        dense_matrix(dop, params), f_whole, rtol=1e-10, atol=1e-12 * np.abs(f_whole).max()
    )
    key = jax.random.key(15)
    weights = jnp.array([0.5, 0.3, 0.2])
    mop = dataset_mc_fisher(apply_fn, params, batches, key, loss=loss, weights=weights)
    parts = [
        w
        * dense_matrix(
            mc_fisher(
                apply_fn,
                params,
                jax.tree_util.tree_map(lambda a, b=b: a[b], batches),
                jax.random.fold_in(key, b),
                loss=loss,
            ),
            params,
        )
        for b, w in enumerate(np.asarray(weights))
    ]
    want = sum(parts)
    np.testing.assert_allclose(
        dense_matrix(mop, params), want, rtol=1e-10, atol=1e-12 * np.abs(want).max()
    )
    _, vs = random_vectors(params, 1)
    x = ravel_pytree(vs[0])[0]
    assert float(mop.form(vs[0])) == pytest.approx(float(x @ want @ x), rel=1e-10)


# --------------------------------------------------------------------------- estimators


def operators(name="cross_entropy"):
    apply_fn, params, batch, loss, _ = make_case(name)
    _, _, _, batches, _, _ = stacked(name)
    key = jax.random.key(16)
    return params, {
        "ggn": ggn(apply_fn, params, batch, loss=loss),
        "empirical_fisher": empirical_fisher(apply_fn, params, batch, loss=loss),
        "mc_fisher": mc_fisher(apply_fn, params, batch, key, loss=loss, num_samples=2),
        "dataset_ggn": dataset_ggn(apply_fn, params, batches, loss=loss),
        "dataset_mc_fisher": dataset_mc_fisher(apply_fn, params, batches, key, loss=loss),
    }


@pytest.mark.parametrize("name", ["empirical_fisher", "mc_fisher", "dataset_mc_fisher"])
def test_every_estimator_accepts_the_fisher_operators(name):
    # the GGN operators: test_ggn_spectrum_is_non_negative_and_matches_the_dense_one (Lanczos,
    # top_eigenvalues, SLQ, spectral density), test_ggn_trace and the dataset tests (Hutchinson,
    # Hutch++)
    params, ops = operators()
    op = ops[name]
    a = dense_matrix(op, params)
    n = a.shape[0]
    key = jax.random.key(17)
    # Hutchinson on quadratic forms equals Hutchinson on products probe by probe
    forms = hutchinson_trace(op, params, key, num_samples=8)
    products = hutchinson_trace(lambda v: op(v), params, key, num_samples=8)
    np.testing.assert_allclose(forms.mean, products.mean, rtol=1e-10)
    assert float(hutchpp_trace(op, params, key, num_matvecs=3 * n).mean) == pytest.approx(
        np.trace(a), rel=1e-9
    )
    if name == "empirical_fisher":  # Lanczos runs on products, as Hutch++ does
        eigs = np.linalg.eigvalsh(a)
        top = top_eigenvalues(op, params, key, k=2, num_steps=n)
        np.testing.assert_allclose(top, eigs[::-1][:2], rtol=1e-8)


def test_chunk_sizes_do_not_change_results():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    op = ggn(apply_fn, params, batch, loss=loss)
    key = jax.random.key(18)
    hutch = [hutchinson_trace(op, params, key, num_samples=7, chunk_size=c) for c in (None, 3)]
    np.testing.assert_allclose([e.mean for e in hutch], hutch[0].mean, rtol=1e-12)
    np.testing.assert_allclose([e.stderr for e in hutch], hutch[0].stderr, rtol=1e-9)
    mc = [
        mc_fisher_trace(
            apply_fn,
            params,
            batch,
            key,
            loss=loss,
            num_samples=5,
            chunk_size=c,
            example_chunk_size=e,
        )
        for c, e in ((None, None), (2, 3))
    ]
    np.testing.assert_allclose([e.mean for e in mc], mc[0].mean, rtol=1e-12)
    np.testing.assert_allclose([e.stderr for e in mc], mc[0].stderr, rtol=1e-9)


def test_float32_in_float32_out():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy", jnp.float32)
    apply64, params64, batch64, _, _ = make_case("cross_entropy")
    key = jax.random.key(19)
    op = ggn(apply_fn, params, batch, loss=loss)
    out = op(params)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(out))
    assert op.form(params).dtype == jnp.float32
    est = ggn_trace(apply_fn, params, batch, key, loss=loss, num_samples=4)
    est64 = ggn_trace(apply64, params64, batch64, key, loss=loss, num_samples=4)
    assert est.mean.dtype == est.stderr.dtype == jnp.float32
    # the same probes: float32 rounding alone, or TF32's where matmuls run in it (a GPU)
    rel = matmul_tol(jnp.float32) if reduced_precision_matmuls(jnp.float32) else 1e-4
    assert float(est.mean) == pytest.approx(float(est64.mean), rel=rel)
    assert empirical_fisher_trace(apply_fn, params, batch, loss=loss).dtype == jnp.float32
    mc = mc_fisher_trace(apply_fn, params, batch, key, loss=loss, num_samples=3)
    assert mc.mean.dtype == mc.stderr.dtype == jnp.float32
    fisher = empirical_fisher(apply_fn, params, batch, loss=loss)(params)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(fisher))


def test_operators_are_pytrees_with_static_callables():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    for op in operators()[1].values():
        leaves, treedef = jax.tree_util.tree_flatten(op)
        rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
        assert rebuilt.apply_fn is apply_fn
        assert rebuilt.loss == loss
        assert all(isinstance(leaf, jax.Array) for leaf in leaves)
    assert isinstance(ggn(apply_fn, params, batch, loss=loss), GGNOperator)


# --------------------------------------------------------------------------- compile once

KERNELS = {
    "ggn_trace": lambda f, p, b, k: ggn_trace(f, p, b, k, loss="squared_error", num_samples=3),
    "ggn_trace_hutchpp": lambda f, p, b, k: ggn_trace(
        f, p, b, k, loss="squared_error", num_matvecs=6, method="hutchpp"
    ),
    "top_eigenvalues(ggn)": lambda f, p, b, k: top_eigenvalues(
        ggn(f, p, b, loss="squared_error"), p, k, k=1, num_steps=3
    ),
    "hutchinson(mc_fisher)": lambda f, p, b, k: hutchinson_trace(
        mc_fisher(f, p, b, k, loss="squared_error"), p, k, num_samples=3
    ),
    "hutchinson(dataset_ggn)": lambda f, p, b, k: hutchinson_trace(
        dataset_ggn(
            f, p, jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), b), loss="squared_error"
        ),
        p,
        k,
        num_samples=3,
    ),
    "empirical_fisher_trace": lambda f, p, b, k: empirical_fisher_trace(
        f, p, b, loss="squared_error", example_chunk_size=2
    ),
    "mc_fisher_trace": lambda f, p, b, k: mc_fisher_trace(
        f, p, b, k, loss="squared_error", num_samples=3
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_second_call_with_new_data_traces_and_compiles_nothing(name):
    kernel = KERNELS[name]
    counter = TraceCounter(mlp)
    _, params, batch, _, _ = make_case("squared_error", seed=1)
    _, params2, batch2, _, _ = make_case("squared_error", seed=2)
    key2 = jax.random.key(21)
    jax.block_until_ready((params2, batch2, key2))
    first = kernel(counter, params, batch, jax.random.key(20))
    traced = counter.count
    with count_compiles() as messages:
        second = kernel(counter, params2, batch2, key2)
        jax.block_until_ready(second)
    assert counter.count == traced
    assert compiles_in(messages) == []
    differs = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), first, second)
    assert any(jax.tree_util.tree_leaves(differs))


# --------------------------------------------------------------------------- runtime checks


def sqrt_model(p, x):
    return jnp.sqrt(p["w"])[None, :] * x  # NaN outputs where w < 0


def runtime_cases():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    key = jax.random.key(22)
    nan = {**params, "w1": params["w1"].at[0, 0].set(jnp.nan)}
    x1 = jnp.ones((3, 2))
    negative = {"w": jnp.array([1.0, -1.0])}
    bad_labels = batch[1].at[0, 0].set(4)
    return [
        # (message start, function of one array argument, argument)
        (
            "params",
            lambda p: ggn_trace(apply_fn, p, batch, key, loss=loss, num_samples=2).mean,
            nan,
        ),
        (
            "params",
            lambda p: top_eigenvalues(
                empirical_fisher(apply_fn, p, batch, loss=loss), p, key, num_steps=2
            ),
            nan,
        ),
        (
            "loss: non-finite loss",
            lambda p: (
                ggn_trace(sqrt_model, p, (x1, x1), key, loss="squared_error", num_samples=2).mean
            ),
            negative,
        ),
        (
            "batch: cross_entropy labels",
            lambda y: (
                ggn_trace(apply_fn, params, (batch[0], y), key, loss=loss, num_samples=2).mean
            ),
            bad_labels,
        ),
        (
            "batch: cross_entropy labels",
            lambda y: empirical_fisher_trace(apply_fn, params, (batch[0], y), loss=loss),
            bad_labels,
        ),
        (
            "apply_fn: non-finite per-example gradients at 3 of the 3 examples",
            lambda p: empirical_fisher_trace(sqrt_model, p, (x1, x1), loss="squared_error"),
            negative,
        ),
        (
            "apply_fn: non-finite per-example gradients in 2 of the 2 samples",
            lambda p: (
                mc_fisher_trace(
                    sqrt_model, p, (x1, x1), key, loss="squared_error", num_samples=2
                ).mean
            ),
            negative,
        ),
        (
            "weights",
            lambda w: (
                hutchinson_trace(
                    dataset_ggn(
                        apply_fn,
                        params,
                        jax.tree_util.tree_map(lambda a: a[None], batch),
                        loss=loss,
                        weights=w,
                    ),
                    params,
                    key,
                    num_samples=2,
                ).mean
            ),
            jnp.array([jnp.nan]),
        ),
    ]


@pytest.mark.parametrize("index", range(8))
def test_runtime_checks_raise_eagerly_and_under_jit(index):
    start, fn, arg = runtime_cases()[index]
    with pytest.raises(ValueError, match=rf"^{start}"):
        fn(arg)
    with pytest.raises(jax.errors.JaxRuntimeError, match=rf"kernels check failed: {start}"):
        jax.block_until_ready(jax.jit(fn)(arg))


def test_runtime_checks_switch_lets_nan_through():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    nan = {**params, "w1": params["w1"].at[0, 0].set(jnp.nan)}
    with runtime_checks(False):
        est = ggn_trace(apply_fn, nan, batch, jax.random.key(23), loss=loss, num_samples=2)
    assert np.isnan(est.mean)


# --------------------------------------------------------------------------- bad inputs


def bad_input_cases():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    x, y = batch
    key = jax.random.key(0)
    ints = jax.tree_util.tree_map(lambda a: a.astype(jnp.int32), params)
    stack = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), batch)
    return [
        ("apply_fn", lambda: ggn(None, params, batch, loss=loss)),
        ("loss", lambda: ggn(apply_fn, params, batch, loss="hinge")),
        ("loss", lambda: empirical_fisher(apply_fn, params, batch, loss=3)),
        ("loss", lambda: mc_fisher(apply_fn, params, batch, key, loss=ce_ref)),
        (
            "loss",
            lambda: mc_fisher_trace(apply_fn, params, batch, key, loss=log_cosh, num_samples=2),
        ),
        ("params", lambda: ggn(apply_fn, ints, batch, loss=loss)),
        ("params", lambda: dataset_ggn(apply_fn, {}, stack, loss=loss)),
        ("batch", lambda: ggn(apply_fn, params, x, loss=loss)),
        ("batch", lambda: ggn(apply_fn, params, (x, y, y), loss=loss)),
        ("batch", lambda: ggn(apply_fn, params, (x, y[:2]), loss=loss)),
        ("batch", lambda: ggn(apply_fn, params, (x[:0], y[:0]), loss=loss)),
        ("batch", lambda: ggn(apply_fn, params, (x, y.astype(jnp.float64)), loss=loss)(params)),
        ("batch", lambda: ggn(apply_fn, params, (x, y[:, :2]), loss=loss).form(params)),
        (
            "batch",
            lambda: empirical_fisher(apply_fn, params, (x, y[..., None]), loss="squared_error")(
                params
            ),
        ),
        ("batch", lambda: empirical_fisher_trace(apply_fn, params, (x, y[:, :2]), loss=loss)),
        ("apply_fn", lambda: ggn(lambda p, x: (x, x), params, batch, loss=loss)(params)),
        (
            "apply_fn",
            lambda: ggn(lambda p, x: jnp.sum(mlp(p, x)), params, batch, loss=log_cosh)(params),
        ),
        ("loss", lambda: ggn(apply_fn, params, batch, loss=lambda o, t: o)(params)),
        ("key", lambda: mc_fisher(apply_fn, params, batch, 0, loss=loss)),
        (
            "key",
            lambda: mc_fisher_trace(
                apply_fn, params, batch, jnp.zeros(3), loss=loss, num_samples=2
            ),
        ),
        ("num_samples", lambda: mc_fisher(apply_fn, params, batch, key, loss=loss, num_samples=0)),
        (
            "num_samples",
            lambda: mc_fisher_trace(apply_fn, params, batch, key, loss=loss, num_samples=1),
        ),
        ("num_samples", lambda: ggn_trace(apply_fn, params, batch, key, loss=loss, num_samples=1)),
        (
            "num_matvecs",
            lambda: ggn_trace(
                apply_fn, params, batch, key, loss=loss, num_matvecs=3, method="hutchpp"
            ),
        ),
        (
            "method",
            lambda: ggn_trace(
                apply_fn, params, batch, key, loss=loss, num_samples=4, method="exact"
            ),
        ),
        (
            "chunk_size",
            lambda: ggn_trace(apply_fn, params, batch, key, loss=loss, num_samples=4, chunk_size=0),
        ),
        (
            "chunk_size",
            lambda: mc_fisher_trace(
                apply_fn, params, batch, key, loss=loss, num_samples=2, chunk_size=1.5
            ),
        ),
        (
            "example_chunk_size",
            lambda: empirical_fisher_trace(
                apply_fn, params, batch, loss=loss, example_chunk_size=0
            ),
        ),
        (
            "example_chunk_size",
            lambda: mc_fisher_trace(
                apply_fn, params, batch, key, loss=loss, num_samples=2, example_chunk_size=True
            ),
        ),
        ("weights", lambda: dataset_ggn(apply_fn, params, stack, loss=loss, weights=jnp.ones(3))),
        ("batches", lambda: dataset_ggn(apply_fn, params, (), loss=loss)),
        ("batches", lambda: dataset_ggn(apply_fn, params, (stack[0], stack[1][:1]), loss=loss)),
        (
            "batches",
            lambda: dataset_empirical_fisher(
                apply_fn, params, (stack[0], stack[1][:, :2]), loss=loss
            ),
        ),
        (
            "like",
            lambda: hutchinson_trace(
                ggn(apply_fn, params, batch, loss=loss), {"w1": params["w1"]}, key, num_samples=2
            ),
        ),
    ]


def test_bad_arguments_raise_naming_the_argument():
    for name, call in bad_input_cases():
        with pytest.raises(ValueError, match=rf"^{name}\b"):
            call()


# --------------------------------------------------------------------------- memory


def temp_bytes(fn, *args):
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    if stats is None:  # pragma: no cover - backends without memory statistics
        pytest.skip("memory_analysis() is not available on this backend")
    return stats.temp_size_in_bytes


def test_memory_does_not_grow_with_probes_or_label_draws():
    apply_fn, params, batch, loss, _ = make_case("cross_entropy")
    key = jax.random.key(24)
    ggn_sizes = [
        temp_bytes(
            lambda p, k, m=m: ggn_trace(
                apply_fn, p, batch, k, loss=loss, num_samples=m, chunk_size=4
            ),
            params,
            key,
        )
        for m in (2**10, 2**16)
    ]
    assert ggn_sizes[0] == ggn_sizes[1], ggn_sizes
    mc_sizes = [
        temp_bytes(
            lambda p, k, m=m: mc_fisher_trace(
                apply_fn, p, batch, k, loss=loss, num_samples=m, example_chunk_size=2
            ),
            params,
            key,
        )
        for m in (2**8, 2**14)
    ]
    assert mc_sizes[0] == mc_sizes[1], mc_sizes


# --------------------------------------------------------------------------- devices


SHARDED = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, sys.argv[1])
    from tests.kernels import test_gauss_newton as t
    assert len(jax.devices()) == 4, jax.devices()
    print(json.dumps(t.sharded_results()))
    """
)


def sharded_results():
    """Results compared between 4 forced host devices and one device."""
    apply_fn, params, batch, loss, _ = make_case("cross_entropy", num=7)
    key = jax.random.key(25)
    out = {}
    op = ggn(apply_fn, params, batch, loss=loss)
    for chunk in (None, 3):  # 10 probes on 4 devices: uneven shares
        est = hutchinson_trace(op, params, key, num_samples=10, chunk_size=chunk)
        out[f"hutchinson-{chunk}"] = [float(est.mean), float(est.stderr)]
    est = hutchpp_trace(
        mc_fisher(apply_fn, params, batch, key, loss=loss),
        params,
        key,
        num_matvecs=13,
        chunk_size=2,
    )
    out["hutchpp-mc"] = [float(est.mean), float(est.stderr)]
    out["ef-trace"] = [
        float(empirical_fisher_trace(apply_fn, params, batch, loss=loss, example_chunk_size=2))
    ]
    est = mc_fisher_trace(apply_fn, params, batch, key, loss=loss, num_samples=9, chunk_size=2)
    out["mc-trace"] = [float(est.mean), float(est.stderr)]
    return out


@pytest.mark.slow
def test_sharded_equals_single_device():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED, root],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sharded = json.loads(proc.stdout.strip().splitlines()[-1])
    single = sharded_results()
    assert sharded.keys() == single.keys()
    for name, values in single.items():
        np.testing.assert_allclose(sharded[name], values, rtol=1e-10, atol=1e-14, err_msg=name)


# ------------------------------------------------------- logistic labels in [0, 1] (issue 30)


def logistic_entry_points():
    """Every GGN / Fisher entry point with the logistic loss, as a function of the labels."""
    apply_fn, params, batch, _, _, _ = case("logistic")
    x, key = batch[0], jax.random.key(5)
    stacked = jax.tree_util.tree_map(lambda a: a[None], batch)
    return (
        params,
        batch[1],
        {
            "ggn": lambda y: ggn(apply_fn, params, (x, y), loss="logistic")(params),
            "ggn_trace": lambda y: (
                ggn_trace(apply_fn, params, (x, y), key, loss="logistic", num_samples=2).mean
            ),
            "empirical_fisher": lambda y: empirical_fisher(
                apply_fn, params, (x, y), loss="logistic"
            )(params),
            "empirical_fisher_trace": lambda y: empirical_fisher_trace(
                apply_fn, params, (x, y), loss="logistic"
            ),
            "mc_fisher": lambda y: mc_fisher(
                apply_fn, params, (x, y), key, loss="logistic", num_samples=2
            )(params),
            "mc_fisher_trace": lambda y: (
                mc_fisher_trace(apply_fn, params, (x, y), key, loss="logistic", num_samples=2).mean
            ),
            "dataset_ggn": lambda y: dataset_ggn(
                apply_fn, params, (stacked[0], y[None]), loss="logistic"
            )(params),
            "dataset_empirical_fisher": lambda y: dataset_empirical_fisher(
                apply_fn, params, (stacked[0], y[None]), loss="logistic"
            )(params),
            "dataset_mc_fisher": lambda y: dataset_mc_fisher(
                apply_fn, params, (stacked[0], y[None]), key, loss="logistic", num_samples=2
            )(params),
        },
    )


# written out: collecting the file must not build the case (a dense GGN) on every xdist worker
LOGISTIC_ENTRY_POINTS = [
    "dataset_empirical_fisher", "dataset_ggn", "dataset_mc_fisher", "empirical_fisher",
    "empirical_fisher_trace", "ggn", "ggn_trace", "mc_fisher", "mc_fisher_trace",
]  # fmt: skip


def test_the_logistic_entry_points_are_all_listed():
    assert sorted(logistic_entry_points()[2]) == LOGISTIC_ENTRY_POINTS


@pytest.mark.parametrize("entry", LOGISTIC_ENTRY_POINTS)
@pytest.mark.parametrize("bad", ["digits", "negative", "nan"])
def test_logistic_labels_outside_0_1_raise_eagerly_and_under_jit(entry, bad):
    _, labels, calls = logistic_entry_points()
    fn = calls[entry]
    n = labels.shape[0]
    bad_labels = {
        "digits": jnp.arange(n, dtype=labels.dtype) % 10 + 1.0,  # labels 1..5 (0..9 style)
        "negative": labels.at[0].set(-1.0),
        "nan": labels.at[0].set(jnp.nan),
    }[bad]
    with pytest.raises(ValueError, match=r"^batch: logistic labels must lie in \[0, 1\]"):
        jax.block_until_ready(fn(bad_labels))
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.block_until_ready(jax.jit(fn)(bad_labels))
    from kernels._checks import failed_check_message

    assert failed_check_message(info.value) == "batch: logistic labels must lie in [0, 1]"


@pytest.mark.parametrize("entry", LOGISTIC_ENTRY_POINTS)
def test_logistic_soft_labels_in_0_1_pass(entry):
    _, labels, calls = logistic_entry_points()
    soft = jnp.linspace(0.0, 1.0, labels.shape[0], dtype=labels.dtype)  # ends included
    out = jax.tree_util.tree_leaves(calls[entry](soft))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in out)


# ------------------------------------------------- a loss where apply_fn is expected (issue 30)


def loss_fn_of_a_batch(params, batch):
    """A loss (params, batch) -> scalar: what hessian_trace takes, not an apply_fn."""
    x, y = batch
    return jnp.mean((scalar_mlp(params, x) - y) ** 2)


def scalar_model(params, x):
    """Returns one number for the whole batch (a loss-like apply_fn)."""
    return jnp.sum(scalar_mlp(params, x))


@pytest.mark.parametrize("fn", [loss_fn_of_a_batch, scalar_model], ids=["loss", "scalar"])
@pytest.mark.parametrize(
    "entry",
    [
        "ggn",
        "ggn_trace",
        "empirical_fisher",
        "empirical_fisher_trace",
        "mc_fisher",
        "mc_fisher_trace",
        "dataset_ggn",
        "dataset_empirical_fisher",
        "dataset_mc_fisher",
    ],
)
def test_a_loss_passed_as_apply_fn_names_hessian_trace(fn, entry):
    _, params, batch, _, _, _ = case("logistic")
    key = jax.random.key(6)
    stacked = jax.tree_util.tree_map(lambda a: a[None], batch)
    kw = dict(loss="squared_error")
    call = {
        "ggn": lambda: ggn(fn, params, batch, **kw)(params),
        "ggn_trace": lambda: ggn_trace(fn, params, batch, key, num_samples=2, **kw),
        "empirical_fisher": lambda: empirical_fisher(fn, params, batch, **kw)(params),
        "empirical_fisher_trace": lambda: empirical_fisher_trace(fn, params, batch, **kw),
        "mc_fisher": lambda: mc_fisher(fn, params, batch, key, num_samples=2, **kw)(params),
        "mc_fisher_trace": lambda: mc_fisher_trace(fn, params, batch, key, num_samples=2, **kw),
        "dataset_ggn": lambda: dataset_ggn(fn, params, stacked, **kw)(params),
        "dataset_empirical_fisher": lambda: dataset_empirical_fisher(fn, params, stacked, **kw)(
            params
        ),
        "dataset_mc_fisher": lambda: dataset_mc_fisher(
            fn, params, stacked, key, num_samples=2, **kw
        )(params),
    }[entry]
    with pytest.raises(ValueError, match=r"^apply_fn: ") as info:
        call()
    message = str(info.value)
    assert "hessian_trace" in message
    assert "batch=(inputs, targets)" in message


def test_a_batch_that_is_not_a_pair_is_described():
    apply_fn, params, batch, loss, _, _ = case("logistic")
    with pytest.raises(ValueError, match=r"^batch: expected a pair \(inputs, targets\)") as info:
        ggn_trace(apply_fn, params, batch[0], jax.random.key(0), loss=loss, num_samples=2)
    assert "float64[5, 3] array" in str(info.value)
    assert "Tracer" not in str(info.value)
