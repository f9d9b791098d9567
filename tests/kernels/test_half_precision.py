"""Half-precision parameters: every loss kernel against float64 dense references.

The weights are bfloat16 (or float16); each reference is computed in float64 at the *rounded*
values (the half-precision weights cast to float64), with ``jax.hessian`` on the flattened
parameters. Acceptance (issue 40): a trace within 4 standard errors plus 1%, a top eigenvalue
within 1%, an average sharpness within 4 standard errors of its second-order value
$\\frac{\\sigma^2}{2}\\operatorname{tr}H$ at small $\\sigma$. By default (``compute_dtype=None``)
the kernels evaluate the loss with float32 parameters and keep probes, perturbations and sums in
float32; ``compute_dtype="params"`` evaluates it in the weights' own dtype.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxbounds.models import as_pure
from jaxbounds.models.decoder import Decoder, decoder_config, next_token_loss
from jaxbounds.models.ntk import empirical_ntk, ntk_diagonal, ntk_min_eigenvalue
from kernels import (
    Perturbation,
    average_sharpness,
    dataset_empirical_fisher,
    dataset_ggn,
    dataset_hvp,
    empirical_fisher,
    empirical_fisher_trace,
    ggn,
    ggn_trace,
    hessian_trace,
    hutchinson_trace,
    hvp,
    lanczos,
    mc_fisher_trace,
    perturbed_hessian_traces,
    sharpness_decomposition,
    sigma_search,
    slq_nodes,
    spectral_density,
    top_eigenvalues,
    worst_case_sharpness,
)

# ----------------------------------------------------------------------------------------------
# a small MLP classifier (fast to compile: every kernel eagerly and under jit)

IN, HIDDEN, OUT, N = 3, 4, 3, 8


def wide(dtype):
    """float32, or float64 for float64 inputs (the loss's own accumulation dtype)."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def mlp_apply(p, x):
    """Logits (n, OUT) in the parameters' dtype."""
    dtype = p["w1"].dtype
    h = jnp.tanh(x.astype(dtype) @ p["w1"] + p["b1"][None])
    return h @ p["w2"] + p["b2"][None]


def mlp_loss(p, batch):
    """Mean softmax cross-entropy, accumulated in float32 (float64 for float64 weights)."""
    x, y = batch
    logits = mlp_apply(p, x)
    logp = jax.nn.log_softmax(logits.astype(wide(logits.dtype)), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


def mlp_problem(dtype=jnp.bfloat16):
    """Weights in ``dtype`` (drawn in float32, rounded) and one batch."""
    k1, k2, k3, k4, k5 = jax.random.split(jax.random.key(7), 5)
    params = {
        "w1": 1.5 * jax.random.normal(k1, (IN, HIDDEN), jnp.float32),
        "b1": 0.5 * jax.random.normal(k2, (HIDDEN,), jnp.float32),
        "w2": 1.5 * jax.random.normal(k3, (HIDDEN, OUT), jnp.float32),
        "b2": jnp.zeros((OUT,), jnp.float32),
    }
    params = jax.tree_util.tree_map(lambda a: a.astype(dtype), params)
    x = jax.random.normal(k4, (N, IN), jnp.float32)
    y = jax.random.randint(k5, (N,), 0, OUT, dtype=jnp.int32)
    return params, (x, y)


def as64(params):
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)


def dense_hessian(loss, params, batch):
    """The float64 Hessian at the rounded values of ``params`` (flattened)."""
    flat, unravel = ravel_pytree(as64(params))
    return np.asarray(jax.jit(jax.hessian(lambda f: loss(unravel(f), batch)))(flat))


def dense_ggn(params, batch):
    """The float64 Gauss-Newton matrix J^T H_out J of the mean cross-entropy."""
    x, _ = batch
    flat, unravel = ravel_pytree(as64(params))
    jac = np.asarray(jax.jacobian(lambda f: mlp_apply(unravel(f), x))(flat))  # (n, OUT, P)
    probs = np.asarray(jax.nn.softmax(mlp_apply(unravel(flat), x), axis=-1))
    g = np.zeros((flat.size, flat.size))
    for j, p in zip(jac, probs, strict=True):
        g += j.T @ (np.diag(p) - np.outer(p, p)) @ j
    return g / x.shape[0]


def dense_empirical_fisher(params, batch):
    """(1/n) sum_i g_i g_i^T of the per-example cross-entropy gradients, in float64."""
    x, y = batch
    flat, unravel = ravel_pytree(as64(params))

    def one(xi, yi):
        return jax.grad(lambda f: mlp_loss(unravel(f), (xi[None], yi[None])))(flat)

    grads = np.asarray(jax.vmap(one)(x, y))
    return grads.T @ grads / x.shape[0]


def assert_trace(est, exact):
    """A Monte Carlo trace within 4 standard errors plus 1% of the exact value."""
    mean, stderr = float(est.mean), float(est.stderr)
    assert abs(mean - exact) <= 4 * stderr + 0.01 * abs(exact), (mean, stderr, exact)


def assert_top(value, exact):
    """A top eigenvalue within 1%."""
    assert abs(float(value) - exact) <= 0.01 * abs(exact), (float(value), exact)


@pytest.fixture(scope="module")
def mlp():
    params, batch = mlp_problem()
    hess = dense_hessian(mlp_loss, params, batch)
    return params, batch, hess


@pytest.fixture(scope="module")
def mlp_gauss_newton():
    """The float64 Gauss-Newton matrix and empirical Fisher of the MLP problem."""
    params, batch = mlp_problem()
    return dense_ggn(params, batch), dense_empirical_fisher(params, batch)


# ----------------------------------------------------------------------------------------------
# curvature


def test_hessian_traces_of_bfloat16_weights(run, mlp):
    params, batch, hess = mlp
    key = jax.random.key(0)

    def body():
        op = hvp(mlp_loss, params, batch)
        return (
            hessian_trace(mlp_loss, params, batch, key, num_samples=200),
            hessian_trace(mlp_loss, params, batch, key, num_matvecs=24, method="hutchpp"),
            hutchinson_trace(op, params, key, num_samples=200, mode="forms"),
            hutchinson_trace(op, params, key, num_samples=200, mode="products", probe="gaussian"),
        )

    exact = float(np.trace(hess))
    for est in run(body):
        assert est.mean.dtype == jnp.float32  # the working dtype, not bfloat16
        assert_trace(est, exact)


def test_lanczos_kernels_of_bfloat16_weights(run, mlp):
    params, batch, hess = mlp
    size = hess.shape[0]
    key = jax.random.key(1)

    def body():
        op = hvp(mlp_loss, params, batch)
        return (
            top_eigenvalues(op, params, key, k=2, num_steps=size),
            top_eigenvalues(op, params, key, k=1, num_steps=size, linearize=False),
            lanczos(op, params, key, num_steps=size),
            slq_nodes(op, params, key, num_samples=64, num_steps=4),
            spectral_density(op, params, key, num_samples=4, num_steps=size, num_grid=512),
        )

    top, top_recomputed, tri, nodes, density = run(body)
    eigs = np.linalg.eigvalsh(hess)[::-1]
    assert_top(top[0], eigs[0])
    assert_top(top[1], eigs[1])
    assert_top(top_recomputed[0], eigs[0])
    assert_top(np.linalg.eigvalsh(np.asarray(tri.matrix(), np.float64))[-1], eigs[0])
    assert tri.diagonal.dtype == jnp.float32
    # SLQ: size * sum_j tau_j theta_j is probe p's v^T H v (exact for degree 1)
    per_probe = size * np.sum(np.asarray(nodes.weights * nodes.nodes, np.float64), axis=1)
    mean, stderr = per_probe.mean(), per_probe.std(ddof=1) / np.sqrt(per_probe.size)
    assert abs(mean - np.trace(hess)) <= 4 * stderr + 0.01 * abs(np.trace(hess))
    grid, dens = np.asarray(density.grid, np.float64), np.asarray(density.density, np.float64)
    assert abs(np.trapezoid(dens, grid) - 1.0) < 0.01
    assert grid[0] <= eigs[-1]  # full Lanczos: the extreme eigenvalues are nodes
    assert grid[-1] >= eigs[0]


def test_dataset_operators_of_bfloat16_weights(run, mlp):
    params, (x, y), _ = mlp
    batches = (x.reshape(2, N // 2, IN), y.reshape(2, N // 2))
    halves = [(batches[0][b], batches[1][b]) for b in range(2)]
    hess = sum(dense_hessian(mlp_loss, params, h) for h in halves) / 2
    key = jax.random.key(2)
    v = jax.tree_util.tree_map(
        lambda a: jax.random.normal(key, a.shape, jnp.float32), params
    )  # a float32 direction

    def body():
        op = dataset_hvp(mlp_loss, params, batches)
        return hutchinson_trace(op, params, key, num_samples=200), op(v)

    est, product = run(body)
    assert_trace(est, float(np.trace(hess)))
    flat_v = np.asarray(ravel_pytree(as64(v))[0])
    got = np.asarray(ravel_pytree(product)[0], np.float64)
    assert ravel_pytree(product)[0].dtype == jnp.float32
    want = hess @ flat_v
    np.testing.assert_allclose(got, want, atol=1e-5 * np.max(np.abs(want)))


# ----------------------------------------------------------------------------------------------
# Gauss-Newton and Fisher


def test_gauss_newton_and_fisher_of_bfloat16_weights(run, mlp, mlp_gauss_newton):
    params, batch, _ = mlp
    x, y = batch
    gn, fisher = mlp_gauss_newton
    batches = (x.reshape(2, N // 2, IN), y.reshape(2, N // 2))
    key = jax.random.key(3)

    def body():
        ce = "cross_entropy"
        return (
            ggn_trace(mlp_apply, params, batch, key, loss=ce, num_samples=200),
            ggn_trace(mlp_apply, params, batch, key, loss=ce, num_matvecs=24, method="hutchpp"),
            hutchinson_trace(
                dataset_ggn(mlp_apply, params, batches, loss=ce), params, key, num_samples=200
            ),
            top_eigenvalues(ggn(mlp_apply, params, batch, loss=ce), params, key, num_steps=31),
            empirical_fisher_trace(mlp_apply, params, batch, loss=ce),
            hutchinson_trace(
                empirical_fisher(mlp_apply, params, batch, loss=ce), params, key, num_samples=200
            ),
            mc_fisher_trace(mlp_apply, params, batch, key, loss=ce, num_samples=400),
            hutchinson_trace(
                dataset_empirical_fisher(mlp_apply, params, batches, loss=ce),
                params,
                key,
                num_samples=200,
            ),
        )

    g_hutch, g_hutchpp, g_dataset, g_top, f_exact, f_hutch, f_mc, f_dataset = run(body)
    assert_trace(g_hutch, np.trace(gn))
    assert_trace(g_hutchpp, np.trace(gn))
    # the two halves' Gauss-Newton matrices average to the whole batch's
    assert_trace(g_dataset, np.trace(gn))
    assert_top(g_top[0], np.linalg.eigvalsh(gn)[-1])
    assert f_exact.dtype == jnp.float32
    np.testing.assert_allclose(float(f_exact), np.trace(fisher), rtol=1e-5)
    assert_trace(f_hutch, np.trace(fisher))
    assert_trace(f_mc, np.trace(gn))  # E F_mc = G for the cross-entropy
    # the halves' empirical Fishers (1/(n/2)) sum_{i in b} g_i g_i^T average to the whole one
    assert_trace(f_dataset, np.trace(fisher))


# ----------------------------------------------------------------------------------------------
# sharpness


SIGMA = 1e-2


def test_sharpness_of_bfloat16_weights(run, mlp):
    params, batch, hess = mlp
    trace = float(np.trace(hess))
    second_order = 0.5 * SIGMA**2 * trace
    key = jax.random.key(4)
    gauss = Perturbation("gaussian", SIGMA)
    flat, unravel = ravel_pytree(as64(params))
    grad = np.asarray(jax.grad(lambda f: mlp_loss(unravel(f), batch))(flat))

    def body():
        return (
            average_sharpness(mlp_loss, params, batch, key, perturbation=gauss, num_samples=400),
            sharpness_decomposition(
                mlp_loss, params, batch, key, perturbation=gauss, num_samples=400, num_probes=200
            ),
            perturbed_hessian_traces(
                mlp_loss, params, batch, key, perturbation=gauss, num_samples=16, num_probes=50
            ),
            worst_case_sharpness(
                mlp_loss,
                params,
                batch,
                key,
                perturbation=Perturbation("l2_ball", SIGMA),
                num_steps=30,
            ),
            worst_case_sharpness(
                mlp_loss,
                params,
                batch,
                key,
                perturbation=Perturbation("linf_ball", SIGMA),
                num_steps=30,
            ),
            sigma_search(
                mlp_loss,
                params,
                batch,
                key,
                perturbation=Perturbation("gaussian", 1.0),
                target_increase=second_order,
                num_samples=400,
                num_steps=30,
            ),
        )

    avg, dec, traces, worst, worst_inf, search = run(body)
    assert avg.mean.dtype == jnp.float32
    assert abs(float(avg.mean) - second_order) <= 4 * float(avg.stderr)
    assert abs(float(dec.average.mean) - second_order) <= 4 * float(dec.average.stderr)
    assert_trace(dec.trace_term, second_order)
    assert abs(float(dec.remainder.mean)) <= 4 * float(dec.remainder.stderr) + 1e-3 * second_order
    assert_trace(traces.average, trace)  # tr H(θ + u) = tr H(θ) + O(σ) at small σ
    # worst case over the l2 ball of radius ρ: at least the value at ρ g/|g| (second order),
    # at most ρ|g| + ρ²/2 λ_max
    norm = np.linalg.norm(grad)
    direction = grad / norm
    at_gradient = SIGMA * norm + 0.5 * SIGMA**2 * direction @ hess @ direction
    upper = SIGMA * norm + 0.5 * SIGMA**2 * np.linalg.eigvalsh(hess)[-1]
    assert 0.99 * at_gradient <= float(worst.value) <= 1.01 * upper
    assert worst.u["w1"].dtype == jnp.float32  # the perturbation in the working dtype
    # over the l-inf ball: at least the value at the corner ρ sign(g), at most
    # ρ|g|_1 + ρ²/2 n λ_max (|u|_2² <= n ρ²)
    corner = np.sign(grad)
    at_corner = SIGMA * np.abs(grad).sum() + 0.5 * SIGMA**2 * corner @ hess @ corner
    upper_inf = (
        SIGMA * np.abs(grad).sum() + 0.5 * SIGMA**2 * grad.size * np.linalg.eigvalsh(hess)[-1]
    )
    assert 0.99 * at_corner <= float(worst_inf.value) <= 1.01 * upper_inf
    assert float(jnp.max(jnp.abs(worst_inf.u["w1"]))) <= SIGMA * (1 + 1e-6)
    # sigma_search: the increase at the returned sigma is its own second-order value
    assert bool(search.bracketed)
    sigma = float(search.sigma)
    assert abs(float(search.increase.mean) - 0.5 * sigma**2 * trace) <= 4 * float(
        search.increase.stderr
    )


# ----------------------------------------------------------------------------------------------
# the empirical NTK


def test_empirical_ntk_of_bfloat16_weights(run, mlp):
    params, (x, _), _ = mlp

    def scalar(p, inputs):
        return mlp_apply(p, inputs)[:, 0]

    flat, unravel = ravel_pytree(as64(params))
    jac = np.asarray(jax.jacobian(lambda f: scalar(unravel(f), x))(flat))
    gram = jac @ jac.T
    k, diag, smallest = run(
        lambda: (
            empirical_ntk(scalar, params, x, tile_size=3),
            ntk_diagonal(scalar, params, x),
            ntk_min_eigenvalue(scalar, params, x),
        )
    )
    assert k.dtype == jnp.float32
    assert diag.dtype == jnp.float32
    tol = 1e-5 * np.max(np.abs(gram))
    np.testing.assert_allclose(np.asarray(k, np.float64), gram, atol=tol)
    np.testing.assert_allclose(np.asarray(diag, np.float64), np.diag(gram), atol=tol)
    assert abs(float(smallest) - np.linalg.eigvalsh(gram)[0]) <= tol


# ----------------------------------------------------------------------------------------------
# float16 weights: one kernel per family


def test_float16_weights_one_kernel_per_family(run):
    params, batch = mlp_problem(jnp.float16)
    hess = dense_hessian(mlp_loss, params, batch)
    gn = dense_ggn(params, batch)
    x = batch[0]
    flat, unravel = ravel_pytree(as64(params))
    jac = np.asarray(jax.jacobian(lambda f: mlp_apply(unravel(f), x)[:, 0])(flat))
    key = jax.random.key(5)

    def body():
        gauss = Perturbation("gaussian", SIGMA)
        return (
            hessian_trace(mlp_loss, params, batch, key, num_samples=200),
            ggn_trace(mlp_apply, params, batch, key, loss="cross_entropy", num_samples=200),
            average_sharpness(mlp_loss, params, batch, key, perturbation=gauss, num_samples=400),
            ntk_diagonal(lambda p, inputs: mlp_apply(p, inputs)[:, 0], params, x),
        )

    h_est, g_est, avg, diag = run(body)
    assert_trace(h_est, np.trace(hess))
    assert_trace(g_est, np.trace(gn))
    second_order = 0.5 * SIGMA**2 * np.trace(hess)
    assert abs(float(avg.mean) - second_order) <= 4 * float(avg.stderr)
    want = np.sum(jac**2, axis=1)
    np.testing.assert_allclose(np.asarray(diag, np.float64), want, atol=1e-5 * np.max(want))


# ----------------------------------------------------------------------------------------------
# where the loss is evaluated: compute_dtype


def recording_loss(seen):
    """``mlp_loss`` that records the dtype its weights arrive in (at trace time)."""

    def loss(p, batch):
        seen.add(jnp.dtype(p["w1"].dtype).name)
        return mlp_loss(p, batch)

    return loss


def recording_apply(seen):
    def apply(p, x):
        seen.add(jnp.dtype(p["w1"].dtype).name)
        return mlp_apply(p, x)

    return apply


@pytest.mark.parametrize(
    ("compute_dtype", "evaluated"), [(None, "float32"), ("params", "bfloat16")]
)
def test_compute_dtype_sets_the_dtype_the_loss_sees(compute_dtype, evaluated):
    params, batch = mlp_problem()
    key = jax.random.key(6)
    kw = {"compute_dtype": compute_dtype}
    seen = set()
    loss = recording_loss(seen)
    jax.eval_shape(lambda: calls(loss, params, batch, key, seen, kw))
    assert seen == {evaluated}
    if compute_dtype is None:  # the loss differences of the sharpness kernels
        jax.eval_shape(
            lambda: average_sharpness(
                loss, params, batch, key, perturbation=Perturbation("gaussian", 0.1), num_samples=2
            )
        )
        assert seen == {evaluated}


def calls(loss, params, batch, key, seen, kw):
    """One call of each kernel family (traced only: the loss records the dtype it sees)."""
    hessian_trace(loss, params, batch, key, num_samples=2, **kw)
    top_eigenvalues(hvp(loss, params, batch, **kw), params, key, num_steps=2)
    hutchinson_trace(
        dataset_hvp(loss, params, jax.tree_util.tree_map(lambda a: a[None], batch), **kw),
        params,
        key,
        num_samples=2,
    )
    perturbed_hessian_traces(
        loss,
        params,
        batch,
        key,
        perturbation=Perturbation("gaussian", 0.1),
        num_samples=2,
        num_probes=2,
        **kw,
    )
    apply = recording_apply(seen)
    ggn_trace(apply, params, batch, key, loss="cross_entropy", num_samples=2, **kw)
    empirical_fisher_trace(apply, params, batch, loss="cross_entropy", **kw)
    return empirical_ntk(lambda p, x: apply(p, x)[:, 0], params, batch[0], **kw)


def test_half_precision_weights_are_cast_inside_the_program():
    params, batch = mlp_problem()
    op = hvp(mlp_loss, params, batch)
    # the operator holds the user's weights (no float32 copy made when it is built) ...
    assert all(
        a is b
        for a, b in zip(
            jax.tree_util.tree_leaves(op.params), jax.tree_util.tree_leaves(params), strict=True
        )
    )
    # ... and the kernel's program takes them in bfloat16 and casts each leaf in the program
    jaxpr = jax.make_jaxpr(
        lambda p: hessian_trace(mlp_loss, p, batch, jax.random.key(0), num_samples=2).mean
    )(params)
    assert [v.aval.dtype for v in jaxpr.jaxpr.invars] == [jnp.bfloat16] * 4
    text = str(jaxpr)
    assert "convert_element_type" in text
    assert "new_dtype=float32" in text


@pytest.mark.parametrize("bad", ["float8", jnp.int32, 3, float("nan"), "bfloat", True])
def test_bad_compute_dtype_raises_naming_it(bad):
    params, batch = mlp_problem()
    key = jax.random.key(0)
    calls = [
        lambda: hessian_trace(mlp_loss, params, batch, key, num_samples=2, compute_dtype=bad),
        lambda: hvp(mlp_loss, params, batch, compute_dtype=bad),
        lambda: ggn(mlp_apply, params, batch, loss="cross_entropy", compute_dtype=bad),
        lambda: average_sharpness(
            mlp_loss,
            params,
            batch,
            key,
            num_samples=2,
            perturbation=Perturbation("gaussian", 0.1),
            compute_dtype=bad,
        ),
        lambda: empirical_ntk(mlp_apply, params, batch[0], compute_dtype=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"^compute_dtype: expected None, 'params'"):
            call()


def test_loss_differences_in_half_precision_are_refused_with_the_reason():
    params, batch = mlp_problem()
    key = jax.random.key(0)
    gauss = Perturbation("gaussian", SIGMA)
    for half in ("params", "bfloat16", jnp.float16):
        with pytest.raises(ValueError, match=r"^compute_dtype: average_sharpness .* rounded"):
            average_sharpness(
                mlp_loss, params, batch, key, perturbation=gauss, num_samples=2, compute_dtype=half
            )
    # float32 weights evaluated in float32 explicitly: accepted
    f32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), params)
    est = average_sharpness(
        mlp_loss, f32, batch, key, perturbation=gauss, num_samples=4, compute_dtype="float32"
    )
    assert np.isfinite(float(est.mean))


# ----------------------------------------------------------------------------------------------
# the decoder with bfloat16 weights

DECODER_VOCAB = 8


def decoder_problem():
    """A Llama-style decoder (GQA, RoPE, SwiGLU) smaller than "tiny", bfloat16 weights."""
    config = decoder_config(
        "tiny",
        vocab_size=DECODER_VOCAB,
        dim=4,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=2,
        hidden_dim=8,
    )
    apply_fn, params = as_pure(Decoder(config, rngs=nnx.Rngs(0)))
    # weights of std 0.4 (the initialisation's 0.02 leaves the loss nearly flat)
    params = jax.tree_util.tree_map(
        lambda a: (20 * a.astype(jnp.float32)).astype(jnp.bfloat16) if a.ndim > 1 else a, params
    )
    tokens = jax.random.randint(jax.random.key(1), (4, 7), 0, DECODER_VOCAB, dtype=jnp.int32)
    return next_token_loss(apply_fn), params, tokens


@pytest.fixture(scope="module")
def decoder():
    loss, params, tokens = decoder_problem()
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree_util.tree_leaves(params))
    return loss, params, tokens, dense_hessian(loss, params, tokens)


@pytest.mark.parametrize("mode", [pytest.param("eager", marks=pytest.mark.slow), "jit"])
def test_decoder_trace_top_eigenvalue_and_sharpness_in_bfloat16(mode, decoder):
    # the eager variant is slow (each kernel compiled apart); the MLP tests run every kernel
    # eagerly in the default run
    loss, params, tokens, hess = decoder
    key = jax.random.key(8)

    def body():
        op = hvp(loss, params, tokens)
        return (
            hutchinson_trace(op, params, key, num_samples=100),
            top_eigenvalues(op, params, key, num_steps=20),
            average_sharpness(
                loss,
                params,
                tokens,
                key,
                perturbation=Perturbation("gaussian", SIGMA),
                num_samples=100,
            ),
        )

    est, top, avg = body() if mode == "eager" else jax.jit(body)()
    assert_trace(est, np.trace(hess))
    assert_top(top[0], np.linalg.eigvalsh(hess)[-1])
    second_order = 0.5 * SIGMA**2 * np.trace(hess)
    assert abs(float(avg.mean) - second_order) <= 4 * float(avg.stderr)


# measured on this decoder (docs/large-models.md, "Precision policy"; weights of std 0.4):
# evaluated in bfloat16 (compute_dtype="params") a Hessian-vector product is off by 43% (relative
# norm) and the top eigenvalue by 7%; evaluated in float32 (the default) by 5e-4 and 6e-6. The
# bounds are about 1.5x the measured errors.
ERROR_BOUNDS = {None: (1e-3, 1e-5), "params": (0.65, 0.11)}


@pytest.mark.slow  # the fast checks: the decoder test above (float32) and the MLP's "params" test
@pytest.mark.parametrize("compute_dtype", [None, "params"])
def test_decoder_error_of_each_compute_dtype(decoder, compute_dtype):
    loss, params, tokens, hess = decoder
    key = jax.random.key(9)
    exact_top = np.linalg.eigvalsh(hess)[-1]
    v = jax.tree_util.tree_map(lambda a: jax.random.normal(key, a.shape, jnp.float32), params)
    want = hess @ np.asarray(ravel_pytree(as64(v))[0])
    product_bound, top_bound = ERROR_BOUNDS[compute_dtype]
    op = hvp(loss, params, tokens, compute_dtype=compute_dtype)
    got = np.asarray(ravel_pytree(op(v))[0], np.float64)
    assert np.linalg.norm(got - want) <= product_bound * np.linalg.norm(want)
    top = top_eigenvalues(op, params, key, num_steps=hess.shape[0])[0]
    assert abs(float(top) - exact_top) <= top_bound * abs(exact_top)


def test_the_model_dtype_is_bfloat16_arithmetic(mlp):
    # compute_dtype="params": the loss in bfloat16, products and sums still float32; its
    # products differ from float64 by bfloat16 rounding (unit roundoff 2^-8), the default's by
    # float32 rounding
    params, batch, hess = mlp
    key = jax.random.key(10)
    v = jax.tree_util.tree_map(lambda a: jax.random.normal(key, a.shape, jnp.float32), params)
    want = hess @ np.asarray(ravel_pytree(as64(v))[0])
    errors = {}
    for compute_dtype in (None, "params"):
        product = hvp(mlp_loss, params, batch, compute_dtype=compute_dtype)(v)
        assert ravel_pytree(product)[0].dtype == jnp.float32
        got = np.asarray(ravel_pytree(product)[0], np.float64)
        errors[compute_dtype] = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert errors[None] < 1e-5
    assert 1e-4 < errors["params"] < 0.5


def test_tied_weights_are_the_weights_and_nan_only_where_the_displacement_is():
    # the tie that keeps each weight's cast inside a loop changes no value: theta + d equals
    # the cast weights plus d, NaN exactly where d is (where theta + d is NaN anyway)
    from kernels._perturbation import _tied

    rng = np.random.default_rng(3)
    w = [jnp.asarray(rng.normal(size=(3, 4)), jnp.bfloat16), jnp.asarray(rng.normal(size=5))]
    d = [jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), jnp.asarray(rng.normal(size=5))]
    d[0] = d[0].at[1, 2].set(jnp.nan)
    tied = _tied(w, d)
    assert tied[1] is w[1]  # no cast, no tie
    assert tied[0].dtype == jnp.bfloat16
    finite = np.isfinite(np.asarray(d[0]))
    np.testing.assert_array_equal(
        np.asarray(tied[0], np.float32)[finite], np.asarray(w[0], np.float32)[finite]
    )
    point = np.asarray(tied[0].astype(jnp.float32) + d[0])
    np.testing.assert_array_equal(np.isnan(point), ~finite)
    # negative zero and infinities keep their bits
    special = [jnp.asarray([-0.0, jnp.inf, -jnp.inf, 1.0], jnp.bfloat16)]
    out = _tied(special, [jnp.zeros(4, jnp.float32)])[0]
    np.testing.assert_array_equal(
        jax.lax.bitcast_convert_type(out, jnp.uint16),
        jax.lax.bitcast_convert_type(special[0], jnp.uint16),
    )
