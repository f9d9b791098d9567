"""Section ``shallow`` against a hand-written GD of the model and of its explicit linearisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.models.shallow import PARAM_NAMES, shallow_apply, shallow_features
from jaxbounds.report.sections import shallow_section

LR, STEPS = 0.1, 4


def _loss(f, y):
    s = 2.0 * np.asarray(y) - 1.0
    return float(np.mean(np.logaddexp(0.0, -s * np.asarray(f))))


def _gd(grad, p, steps):
    """Plain GD written out; returns every iterate."""
    out = [p]
    for _ in range(steps):
        g = grad(p)
        p = jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)
        out.append(p)
    return out


@pytest.fixture(scope="module")
def reference(shallow_run):
    run = shallow_run
    p0 = run.facts.params0
    x, y = run.train["inputs"], run.train["labels"]
    signs = 2.0 * y.astype(jnp.float64) - 1.0

    def loss(p, f=shallow_apply):
        return jnp.mean(jnp.logaddexp(0.0, -signs * f(p, x)))

    path = _gd(jax.jit(jax.grad(loss)), p0, STEPS)
    flat0, unravel = ravel_pytree(p0)
    jac = jax.jacrev(lambda v: shallow_apply(unravel(v), x))(flat0)  # (N, P), explicit
    f0 = shallow_apply(p0, x)

    def lin_loss(v):
        return jnp.mean(jnp.logaddexp(0.0, -signs * (f0 + jac @ (v - flat0))))

    lin_path = _gd(jax.jit(jax.grad(lin_loss)), flat0, STEPS)
    return path, lin_path, jac, f0, lin_loss


@pytest.fixture(scope="module")
def rows(shallow_run):
    return {r.name: r for r in shallow_section(shallow_run)}


def test_run_and_radius_rows(shallow_run, reference, rows):
    run, (path, _, _, _, _) = shallow_run, reference
    x, y = run.train["inputs"], run.train["labels"]
    assert "SYNTHETIC" in rows["data"].value
    assert [
        rows[k].value for k in ("N (train examples)", "d_s (tokens)", "d (token dimension)")
    ] == [18, 4, 16]
    assert rows["d_m (model dimension)"].value == 24
    assert rows["GD steps"].value == STEPS
    assert rows["train loss"].value == pytest.approx(
        _loss(shallow_apply(path[-1], x), y), rel=1e-10
    )
    test_losses = [_loss(shallow_apply(p, run.test["inputs"]), run.test["labels"]) for p in path]
    assert rows["test loss"].value == pytest.approx(test_losses[-1], rel=1e-10)
    assert rows["lowest test loss"].value == pytest.approx(min(test_losses), rel=1e-10)
    for split, data in (("train", run.train), ("test", run.test)):
        scores = np.asarray(shallow_apply(path[-1], data["inputs"]))
        expected = np.mean((scores > 0) == np.asarray(data["labels"]))
        assert rows[f"{split} accuracy"].value == pytest.approx(expected)
    radii = {}
    for name in PARAM_NAMES:
        w0 = np.asarray(path[0][name])
        radii[name] = max(np.linalg.norm(np.asarray(p[name]) - w0) for p in path)
        spec0 = np.linalg.norm(w0, 2) if w0.ndim == 2 else np.linalg.norm(w0)
        tag = name[-1]
        assert rows[f"R_{tag}"].value == pytest.approx(radii[name], rel=1e-9)
        assert rows[f"eta_{tag}"].value == pytest.approx(np.linalg.norm(w0) + radii[name], rel=1e-9)
        assert rows[f"xi_{tag}"].value == pytest.approx(spec0 + radii[name], rel=1e-9)
    assert rows["R"].value == pytest.approx(np.linalg.norm(list(radii.values())), rel=1e-9)
    r_x = np.linalg.norm(np.asarray(x).reshape(18, -1), axis=1).max() / 2
    assert rows["R_X"].value == pytest.approx(r_x, rel=1e-12)


def test_ntk_and_regime_rows(shallow_run, reference, rows):
    run, (path, lin_path, jac, f0, lin_loss) = shallow_run, reference
    x = run.train["inputs"]
    feats = np.asarray(shallow_features(run.facts.params0, x))
    alpha = np.linalg.svd(feats, compute_uv=False)[17]  # N = 18 <= d_m = 24
    assert rows["alpha = sigma_min(F_pre^0)"].value == pytest.approx(alpha, rel=1e-8)
    gram = np.asarray(jac) @ np.asarray(jac).T
    assert rows["NTK lambda_min at init"].value == pytest.approx(
        np.linalg.eigvalsh(gram)[0], rel=1e-6, abs=1e-10
    )
    flat0 = ravel_pytree(path[0])[0]
    f_t = shallow_apply(path[-1], x)
    g_t = f0 + jac @ (lin_path[-1] - flat0)
    moved = float(jnp.linalg.norm(ravel_pytree(path[-1])[0] - flat0) / jnp.linalg.norm(flat0))
    assert rows["relative weight movement"].value == pytest.approx(moved, rel=1e-8)
    assert rows["linearised model train loss"].value == pytest.approx(
        float(lin_loss(lin_path[-1])), rel=1e-10
    )
    assert rows["prediction drift (train, max)"].value == pytest.approx(
        float(jnp.max(jnp.abs(f_t - g_t))), rel=1e-6, abs=1e-12
    )
    rel = float(jnp.linalg.norm(f_t - g_t) / jnp.linalg.norm(f_t - f0))
    assert rows["relative prediction drift (train)"].value == pytest.approx(rel, rel=1e-6)
    assert rows["prediction drift (test, max)"].value >= 0


def test_needs_test_data(shallow_run):
    import dataclasses

    with pytest.raises(ValueError, match="held-out"):
        shallow_section(dataclasses.replace(shallow_run, test=None))
