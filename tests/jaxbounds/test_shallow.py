"""Shallow GD Transformer: the paper's formula, initialisation, GD record, the report section."""

import io
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.gd import leaf_names, logistic_loss, spectral_norm, squared_loss, train_gd
from jaxbounds.models import ShallowTransformer, as_pure
from jaxbounds.models.shallow import shallow_apply, shallow_features


def paper_formula(params, x):
    """f(X) = (1/d_s) w_O^T sum_i relu(W_V X^T softmax(X W_K^T W_Q x_i^T / sqrt(d_m))), a loop."""
    w_q, w_k, w_v, w_o = (np.asarray(params[k]) for k in ("W_Q", "W_K", "W_V", "w_O"))
    d_s, d_m = x.shape[0], w_q.shape[0]
    total = np.zeros(d_m)
    for i in range(d_s):
        logits = x @ w_k.T @ w_q @ x[i] / np.sqrt(d_m)
        beta = np.exp(logits - logits.max())
        beta /= beta.sum()
        total += np.maximum(w_v @ x.T @ beta, 0)
    return w_o @ total / d_s


@pytest.fixture(scope="module")
def model64():
    return ShallowTransformer(6, 10, rngs=nnx.Rngs(0), dtype=jnp.float64)


def test_output_matches_the_paper_formula(model64, run):
    x = np.asarray(jax.random.normal(jax.random.key(1), (5, 4, 6), jnp.float64))
    params = model64.params_dict()
    expected = np.array([paper_formula(params, xn) for xn in x])
    got = run(lambda: model64(jnp.asarray(x)))
    assert got.shape == (5,)
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(model64(jnp.asarray(x[2])), expected[2], rtol=1e-13)  # unbatched
    np.testing.assert_allclose(shallow_apply(params, jnp.asarray(x)), expected, rtol=1e-13)
    apply_fn, pure = as_pure(model64)
    np.testing.assert_allclose(apply_fn(pure, jnp.asarray(x)), expected, rtol=1e-13)
    feats = model64.features(jnp.asarray(x))
    assert feats.shape == (5, 10)
    assert float(jnp.min(feats)) >= 0  # average of ReLUs
    np.testing.assert_allclose(feats @ params["w_O"], expected, rtol=1e-13)


def test_one_token_reduces_to_a_two_layer_relu_net(model64):
    """With d_s = 1 the softmax is 1: f(x) = w_O^T relu(W_V x)."""
    x = jax.random.normal(jax.random.key(2), (3, 1, 6), jnp.float64)
    p = model64.params_dict()
    expected = jax.nn.relu(x[:, 0] @ p["W_V"].T) @ p["w_O"]
    np.testing.assert_allclose(model64(x), expected, rtol=1e-13)


def test_lecun_initialisation_variances():
    d, d_m = 64, 1024
    model = ShallowTransformer(d, d_m, rngs=nnx.Rngs(3), dtype=jnp.float64)
    for name in ("W_Q", "W_K", "W_V"):
        w = np.asarray(getattr(model, name)[...])
        assert w.shape == (d_m, d)
        n = w.size  # sample variance of n normals: relative stderr sqrt(2/n)
        assert abs(w.var() * d - 1) < 5 * np.sqrt(2 / n)
        assert abs(w.mean()) < 5 / np.sqrt(n * d)
    w_o = np.asarray(model.w_O[...])
    assert w_o.shape == (d_m,)
    assert abs(w_o.var() * d_m - 1) < 5 * np.sqrt(2 / d_m)
    # the four matrices are drawn independently
    assert not np.allclose(model.W_Q[...], model.W_K[...])


def test_dtype_follows_parameters_and_bad_arguments():
    model = ShallowTransformer(3, 4, rngs=nnx.Rngs(0))
    x = jnp.ones((2, 5, 3), jnp.float32)
    assert model(x).dtype == jnp.float32
    with pytest.raises(ValueError, match="d_m"):
        ShallowTransformer(3, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d:"):
        ShallowTransformer(2.5, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="inputs"):
        model(jnp.ones((2, 5, 4), jnp.float32))


def test_logistic_and_squared_losses_closed_form():
    def apply_fn(p, x):
        return x * p

    x = jnp.array([1.0, -2.0, 0.5])
    y = jnp.array([1, 0, 0])
    p = jnp.array(0.7)
    signs = np.array([1, -1, -1])
    f = np.array([0.7, -1.4, 0.35])
    np.testing.assert_allclose(
        logistic_loss(apply_fn, x, y)(p), np.mean(np.log1p(np.exp(-signs * f))), rtol=1e-14
    )
    t = jnp.array([1.0, 0.0, 2.0])
    np.testing.assert_allclose(
        squared_loss(apply_fn, x, t)(p), 0.5 * np.mean((f - np.array([1.0, 0.0, 2.0])) ** 2)
    )


def test_leaf_names_and_spectral_norm(model64):
    _, pure = as_pure(model64)
    assert leaf_names(pure) == ["W_K", "W_Q", "W_V", "w_O"]
    assert leaf_names(nnx.state(model64, nnx.Param)) == ["W_K", "W_Q", "W_V", "w_O"]
    rng = np.random.default_rng(0)
    for shape in ((7, 3), (3, 7), (5,)):
        w = rng.normal(size=shape)
        expected = np.linalg.norm(w, 2) if w.ndim == 2 else np.linalg.norm(w)
        np.testing.assert_allclose(spectral_norm(jnp.asarray(w)), expected, rtol=1e-12)


@pytest.fixture(scope="module")
def small_problem():
    model = ShallowTransformer(4, 8, rngs=nnx.Rngs(1), dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(4), (9, 3, 4), jnp.float64)
    y = jnp.arange(9) % 2
    return model.params_dict(), x, y


def test_train_gd_matches_a_hand_written_loop(small_problem):
    params0, x, y = small_problem
    lr, steps = 0.3, 12
    loss_fn = logistic_loss(shallow_apply, x, y)
    stream = io.StringIO()
    params, hist = train_gd(
        loss_fn,
        params0,
        learning_rate=lr,
        num_steps=steps,
        metrics_fn=lambda p: {"f0": shallow_apply(p, x)[0]},
        chunk_steps=5,
        progress=stream,
    )
    # reference: plain GD written out, recording the same quantities
    p = dict(params0)
    losses, dists, specs, f0 = [], {k: [] for k in p}, {k: [] for k in p}, []
    grad = jax.jit(jax.value_and_grad(loss_fn))
    for t in range(steps + 1):
        value, g = grad(p)
        losses.append(float(value))
        f0.append(float(shallow_apply(p, x)[0]))
        for k in p:
            dists[k].append(np.linalg.norm(np.asarray(p[k] - params0[k])))
            a = np.asarray(p[k])
            specs[k].append(np.linalg.norm(a, 2) if a.ndim == 2 else np.linalg.norm(a))
        if t < steps:
            p = {k: p[k] - lr * g[k] for k in p}
    assert hist.num_steps == steps
    np.testing.assert_allclose(hist.loss, losses, rtol=1e-12)
    np.testing.assert_allclose(hist.metrics["f0"], f0, rtol=1e-12)
    for k in p:
        np.testing.assert_allclose(params[k], p[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(hist.distance[k], dists[k], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(hist.spectral[k], specs[k], rtol=1e-10)
        assert hist.radius[k] == pytest.approx(max(dists[k]), rel=1e-10)
        np.testing.assert_allclose(hist.running_radius[k], np.maximum.accumulate(dists[k]))
        assert hist.frobenius0[k] == pytest.approx(np.linalg.norm(np.asarray(params0[k])))
        bound = hist.bound_inputs()
        assert bound["eta"][k] == pytest.approx(hist.frobenius0[k] + max(dists[k]), rel=1e-10)
        assert bound["xi"][k] == pytest.approx(specs[k][0] + max(dists[k]), rel=1e-10)
    assert hist.total_radius == pytest.approx(
        np.sqrt(sum(max(d) ** 2 for d in dists.values())), rel=1e-10
    )
    assert losses[-1] < losses[0]
    assert f"{steps}/{steps}" in stream.getvalue()


def test_train_gd_chunking_and_arguments(small_problem):
    params0, x, y = small_problem
    loss_fn = squared_loss(shallow_apply, x, y)
    _, one = train_gd(
        loss_fn,
        params0,
        learning_rate=0.1,
        num_steps=6,
        chunk_steps=1,
        progress=False,
        record_spectral=False,
    )
    _, six = train_gd(
        loss_fn,
        params0,
        learning_rate=0.1,
        num_steps=6,
        chunk_steps=6,
        progress=False,
        record_spectral=False,
    )
    np.testing.assert_allclose(one.loss, six.loss, rtol=1e-12)
    # data passed as arguments of the compiled steps gives the same run as a closure
    _, with_args = train_gd(
        lambda p, xx, yy: squared_loss(shallow_apply, xx, yy)(p),
        params0,
        learning_rate=0.1,
        num_steps=6,
        args=(x, y),
        metrics_fn=lambda p, xx, yy: {"loss_again": squared_loss(shallow_apply, xx, yy)(p)},
        progress=False,
    )
    np.testing.assert_allclose(with_args.loss, one.loss, rtol=1e-12)
    np.testing.assert_allclose(with_args.metrics["loss_again"], one.loss, rtol=1e-12)
    assert one.spectral == {}
    _, zero = train_gd(loss_fn, params0, learning_rate=0.1, num_steps=0, progress=False)
    assert zero.loss.shape == (1,)
    assert all(float(d[0]) == 0.0 for d in zero.distance.values())
    with pytest.raises(ValueError, match="learning_rate"):
        train_gd(loss_fn, params0, learning_rate=0.0, num_steps=1)
    with pytest.raises(ValueError, match="num_steps"):
        train_gd(loss_fn, params0, learning_rate=0.1, num_steps=-1)
    with pytest.raises(ValueError, match="initialisation"):
        train_gd(
            lambda p: jnp.sum(p["w_O"]) * jnp.nan,
            params0,
            learning_rate=0.1,
            num_steps=2,
            progress=False,
        )


def test_report_section_on_a_small_synthetic_run():
    from jaxbounds.models.ntk import empirical_ntk, feature_alpha
    from jaxbounds.sections.shallow import shallow_context, shallow_section, synthetic_digits

    data = synthetic_digits(num=24, seed=1)
    assert data.train["inputs"].shape == (18, 4, 16)
    ctx = shallow_context(data, jax.random.key(0), d_m=24, num_steps=4)
    rows = {r.name: r for r in shallow_section(ctx)}
    hist = ctx.history
    assert rows["R_Q"].value == pytest.approx(hist.radius["W_Q"])
    assert rows["R_O"].value == pytest.approx(hist.radius["w_O"])
    assert rows["eta_V"].value == pytest.approx(hist.bound_inputs()["eta"]["W_V"])
    assert rows["train loss"].value == pytest.approx(float(hist.loss[-1]))
    assert rows["N (train examples)"].value == 18
    x = ctx.train["inputs"]
    params0 = ctx.extra["shallow"]["params0"]
    feats = np.asarray(shallow_features(params0, x))
    assert rows["alpha = sigma_min(F_pre^0)"].value == pytest.approx(
        np.linalg.svd(feats, compute_uv=False)[17], rel=1e-8
    )
    assert float(feature_alpha(jnp.asarray(feats))) > 0  # d_m = 24 >= N = 18
    gram = np.asarray(empirical_ntk(shallow_apply, params0, x))
    assert rows["NTK lambda_min at init"].value == pytest.approx(
        np.linalg.eigvalsh(gram)[0], rel=1e-6, abs=1e-10
    )
    assert rows["R_X"].value == pytest.approx(
        float(np.max(np.linalg.norm(np.asarray(x).reshape(18, -1), axis=1)) / 2)
    )
    assert "SYNTHETIC" in rows["data"].value


def test_builder_falls_back_loudly_without_scikit_learn(monkeypatch, capsys):
    from jaxbounds.sections import shallow as section

    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    monkeypatch.delenv("JAXBOUNDS_MNIST_DIR", raising=False)
    data = section._load_data(0, True)
    assert data.source == "synthetic"
    err = capsys.readouterr().err
    assert "WARNING" in err
    assert "SYNTHETIC" in err
    assert "pip install 'jaxbounds[digits]'" in err
