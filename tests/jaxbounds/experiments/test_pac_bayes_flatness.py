"""The ``pac-bayes-flatness`` reproduction: one unit's measurements against dense float64 ones.

Slow (compiles): :func:`measure` on the construction of a tiny function (T = 3, 270 parameters)
against the dense float64 Hessian of the flattened loss (Hutch++ trace within the two-sided 1e-6
quantile of Student's t for its residual probes' standard error, top eigenvalue exact once
Lanczos runs the full dimension), the Frobenius norm, the Gauss-Newton trace from dense
per-input Jacobians and the loss in numpy; one smoke run end to end; one unit's rows recomputed
(learned model retrained, both models against dense Hessians) and the report's statistics
recomputed from ``results.csv``. Default run: the
domination bookkeeping and the training's argument checks (no compilation).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy import stats

from jaxbounds.data.boolean import FourierFunction
from jaxbounds.experiments import _fourier_training as ft
from jaxbounds.experiments import pac_bayes_flatness as pbf
from jaxbounds.models import as_pure
from jaxbounds.models.construction import construction
from kernels.walsh import cube_points
from tests.helpers import read_rows, run_smoke


def _dense(params, batch):
    """Dense float64 references: Hessian, per-input Jacobian, loss."""
    flat, unravel = ravel_pytree(params)
    loss = lambda v: ft.loss(unravel(v), batch)  # noqa: E731
    grad = jax.grad(loss)  # dense Hessian column by column (cheaper to compile than jax.hessian)
    columns = jax.vmap(lambda e: jax.jvp(grad, (flat,), (e,))[1])(jnp.eye(flat.size))
    hessian = np.asarray(columns)
    jac = np.asarray(jax.jacrev(lambda v: ft.apply(unravel(v), batch["bits"]))(flat))
    out = np.asarray(ft.apply(params, batch["bits"]))
    labels = np.asarray(batch["labels"])
    return hessian, jac, float(np.mean((out - labels) ** 2)), flat


def _trace_tolerance(num_matvecs: int) -> float:
    """Standard errors allowed between a Hutch++ trace and the exact one: the two-sided 1e-6
    quantile of Student's t with the residual probes' degrees of freedom (Hutch++'s stderr is
    that of its num_matvecs - 2 (num_matvecs // 3) residual probes). With 12 products (3 degrees
    of freedom) a 5-stderr check would fail for 1.5% of keys."""
    num_hutch = num_matvecs - 2 * (num_matvecs // 3)
    return float(stats.t.isf(0.5e-6, num_hutch - 1))


def _check_measure(m, params, batch, *, exact_top, num_matvecs):
    hessian, jac, loss, flat = _dense(params, batch)
    trace = float(np.trace(hessian))
    tol = _trace_tolerance(num_matvecs)
    assert abs(m["trace"] - trace) <= tol * m["trace_stderr"] + 1e-9 * abs(trace)
    top = float(np.linalg.eigvalsh(hessian)[-1])
    if exact_top:
        np.testing.assert_allclose(m["top_eigenvalue"], top, rtol=1e-8)
    else:  # Ritz values are lower bounds of the top eigenvalue
        assert m["top_eigenvalue"] <= top * (1 + 1e-9)
        assert m["top_eigenvalue"] >= 0.9 * top
    np.testing.assert_allclose(m["norm"], np.linalg.norm(np.asarray(flat)), rtol=1e-12)
    grad_sq = np.sum(jac**2, axis=1)
    np.testing.assert_allclose(m["gn_trace"], 2 * grad_sq.mean(), rtol=1e-10)
    np.testing.assert_allclose(m["G_u"], grad_sq.max(), rtol=1e-10)
    np.testing.assert_allclose(m["loss"], loss, rtol=1e-10)
    # Gauss-Newton part of the dense Hessian: (2/m) J^T J has trace 2 mean ||grad f||^2
    np.testing.assert_allclose(np.trace(2 * jac.T @ jac / jac.shape[0]), m["gn_trace"], rtol=1e-10)


@pytest.mark.slow  # compiles Hutch++, a 270-step Lanczos and a dense Hessian: ~25 CPU s
def test_measure_against_dense_hessian():
    f = FourierFunction(((0, 1), (1, 2)), jnp.array([0.6, 0.8]))
    params = as_pure(construction(f, seq_len=3))[1]
    bits = cube_points(3)
    batch = {"bits": bits, "labels": f(bits)}
    n = ravel_pytree(params)[0].size
    m = pbf.measure(params, batch, jax.random.key(3), num_matvecs=60, lanczos_steps=n)
    assert m["num_params"] == n == 270
    _check_measure(m, params, batch, exact_top=True, num_matvecs=60)  # 7.1 stderr


def test_domination_names_the_failing_coordinate():
    row = {"constructed_trace": 10.0, "learned_trace": 20.0, "constructed_norm": 5.0,
           "learned_norm": 1.0, "constructed_top_eigenvalue": 4.0, "learned_top_eigenvalue": 2.0,
           "constructed_matrix_norm_w_v2": 1.0, "learned_matrix_norm_w_v2": 2.0,
           "constructed_matrix_norm_w_in": 3.0, "learned_matrix_norm_w_in": 1.0}  # fmt: skip
    out = pbf._domination(row)
    assert out["dominated"] is False
    assert out["domination_fails"] == "trace"
    assert out["matrices_above_construction"] == "w_v2"
    assert out["trace_ratio"] == 0.5
    assert out["norm_ratio"] == 5.0


def test_train_twin_checks_arguments():
    bits = cube_points(3)
    with pytest.raises(ValueError, match="loss_threshold"):
        ft.train_twin(bits, jnp.zeros(8), seed=0, mlp_width=4, learning_rate=0.1,
                              loss_threshold=0.0, max_steps=1, chunk_steps=1)  # fmt: skip
    with pytest.raises(ValueError, match="max_steps"):
        ft.train_twin(bits, jnp.zeros(8), seed=0, mlp_width=4, learning_rate=0.1,
                              loss_threshold=0.1, max_steps=0, chunk_steps=1)  # fmt: skip


# ------------------------------------------------------------------------------ slow: smoke run

BOOLS = ("reached_threshold", "dominated")
STRINGS = ("domination_fails", "matrices_above_construction")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    return run_smoke(pbf.EXPERIMENT, tmp_path_factory)


def _rows(run_dir: Path) -> list[dict]:
    return read_rows(run_dir, bools=BOOLS, strings=STRINGS)


@pytest.mark.slow
def test_files(smoke_run):
    for name in ("results.csv", "summary.json", "statistics.json", "report.md",
                 "figure2_trace_norm.png", "domination.png"):  # fmt: skip
        assert (smoke_run / name).stat().st_size > 0
    report = (smoke_run / "report.md").read_text()
    assert report.count("- **") == len(pbf.CLAIMS)


@pytest.mark.slow
def test_one_unit_recomputed(smoke_run):
    row = _rows(smoke_run)[0]
    cfg = pbf.SCALES["smoke"]
    t, d, w, seed = cfg["seq_len"], int(row["degree"]), int(row["sparsity"]), int(row["seed"])
    f = ft.target_function(num_bits=t, degree=d, sparsity=w, seed=seed, normalization="unit_norm")
    assert np.all(np.asarray(f.coefficients) > 0)
    bits = cube_points(t)
    batch = {"bits": bits, "labels": f(bits)}
    built = as_pure(construction(f, seq_len=t))[1]
    trained = ft.train_twin(
        bits, batch["labels"], seed=seed, mlp_width=cfg["mlp_width"],
        learning_rate=cfg["learning_rate"], loss_threshold=cfg["loss_threshold"],
        max_steps=cfg["max_steps"], chunk_steps=cfg["chunk_steps"],
    )  # fmt: skip
    assert trained.reached == row["reached_threshold"]
    assert trained.num_steps == row["train_steps"]
    key = jax.random.fold_in(jax.random.key(seed), 1000 * d + w)  # the unit's key (run_unit)
    for i, (name, params) in enumerate((("constructed", built), ("learned", trained.params))):
        m = {k[len(name) + 1 :]: v for k, v in row.items() if k.startswith(name + "_")}
        # the recorded estimates are the unit's own: measure() again with its key gives them
        again = pbf.measure(
            params, batch, jax.random.fold_in(key, i),
            num_matvecs=cfg["num_matvecs"], lanczos_steps=cfg["lanczos_steps"],
        )  # fmt: skip
        for k in ("trace", "trace_stderr", "top_eigenvalue"):
            np.testing.assert_allclose(m[k], again[k], rtol=1e-9, err_msg=f"{name} {k}")
        _check_measure(m, params, batch, exact_top=False, num_matvecs=cfg["num_matvecs"])
    assert row["dominated"] == (
        row["learned_trace"] <= row["constructed_trace"]
        and row["learned_norm"] <= row["constructed_norm"]
    )
    np.testing.assert_allclose(row["trace_ratio"], row["constructed_trace"] / row["learned_trace"])


@pytest.mark.slow
def test_statistics_recomputed_from_results_csv(smoke_run):
    rows = _rows(smoke_run)
    stats = json.loads((smoke_run / "statistics.json").read_text())
    ratios = np.array([r["constructed_trace"] / r["learned_trace"] for r in rows])
    np.testing.assert_allclose(stats["pooled"]["trace"]["geomean"],
                               np.exp(np.mean(np.log(ratios))), rtol=1e-6)  # fmt: skip
    c = stats["classes"][0]
    np.testing.assert_allclose(c["trace_ratio"]["mean"], ratios.mean(), rtol=1e-6)
    np.testing.assert_allclose(c["trace_ratio"]["std"], ratios.std(ddof=1), rtol=1e-6)
    norms = np.array([r["constructed_norm"] / r["learned_norm"] for r in rows])
    np.testing.assert_allclose(c["norm_ratio"]["mean"], norms.mean(), rtol=1e-6)
    assert stats["num_dominated"] == sum(r["dominated"] for r in rows)
