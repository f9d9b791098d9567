"""The ``pac-bayes-gap`` reproduction: exponent fit, class bound, one unit's gap by hand.

Default run (no model compiled): :func:`fit_power_law` against the normal-equation solution
written out in numpy and an exact power law; :func:`class_bound` against the semi-analytic
formula written out in numpy; the train/test split is a partition. Slow: one smoke run end to
end, one unit's gap recomputed from the retrained model's predictions, and the report's
exponents recomputed from ``results.csv``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from jaxbounds.bounds.pac_bayes import construction_norm_bound
from jaxbounds.experiments import _fourier_training as ft
from jaxbounds.experiments import pac_bayes_gap as pbg
from kernels.walsh import cube_points
from tests.helpers import read_rows, run_smoke


def test_fit_power_law_matches_normal_equations():
    rng = np.random.default_rng(0)
    deg = np.repeat([1.0, 2.0, 3.0, 4.0], 3)
    spa = np.tile([1.0, 4.0, 7.0], 4)
    y = 0.3 * deg**2.5 * spa**1.5 * np.exp(0.1 * rng.standard_normal(deg.size))
    fit = pbg.fit_power_law([deg, spa], y)
    x = np.column_stack([np.ones(deg.size), np.log(deg), np.log(spa)])
    beta = np.linalg.solve(x.T @ x, x.T @ np.log(y))
    resid = np.log(y) - x @ beta
    se = np.sqrt(np.diag(resid @ resid / (deg.size - 3) * np.linalg.inv(x.T @ x)))
    np.testing.assert_allclose(fit.coefficients, beta, rtol=1e-10)
    np.testing.assert_allclose(fit.stderr, se, rtol=1e-8)
    assert fit.num_points == deg.size
    exact = pbg.fit_power_law([deg, spa], 2.0 * deg**3 * spa**0.5)
    np.testing.assert_allclose(exact.coefficients, [math.log(2.0), 3.0, 0.5], atol=1e-12)


def test_fit_power_law_drops_nonpositive_and_checks_arguments():
    fit = pbg.fit_power_law([[1, 2, 4, 8]], [1.0, -1.0, 16.0, 64.0])
    assert fit.num_points == 3
    np.testing.assert_allclose(fit.coefficients[1], 2.0, rtol=1e-12)
    assert all(math.isnan(c) for c in pbg.fit_power_law([[1, 2]], [0.0, 1.0]).coefficients)
    with pytest.raises(ValueError, match="xs"):
        pbg.fit_power_law([[1, 2]], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="xs"):
        pbg.fit_power_law([[0, 2]], [1.0, 2.0])


def test_class_bound_against_formula():
    group = [
        {"degree": 2, "sparsity": 3, "seq_len": 6, "num_train": 40, "delta": 0.05,
         "construction_G_u": g, "subgaussian_scale": s}
        for g, s in ((100.0, 0.2), (150.0, 0.1))
    ]  # fmt: skip
    out = pbg.class_bound(group)
    G, S, m, delta = 150.0, 0.2, 40, 0.05
    L = float(construction_norm_bound(3, 2, 6))
    L_by_hand = 16 * 4 * 3 + 8 * 3 + 1 + 3 + 4 * 3 * 3 * math.log(6) ** 2
    np.testing.assert_allclose(L, L_by_hand, rtol=1e-12)
    sigmas = np.geomspace(1e-2, 1e-5, 20)
    per = sigmas**2 * G + 2 * np.sqrt(S**2 / (2 * m) * (L / (2 * sigmas**2) + math.log(20 / delta)))
    np.testing.assert_allclose(out["bound"], per.min(), rtol=1e-12)
    np.testing.assert_allclose(out["bound_sigma"], sigmas[per.argmin()], rtol=1e-12)
    assert out["G_u"] == G
    assert out["subgaussian_scale"] == S


def test_split_is_a_partition():
    train, test = pbg.split(5, 12, seed=3)
    assert train.size == 12
    assert test.size == 20
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(32))


# ------------------------------------------------------------------------------ slow: smoke run


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    return run_smoke(pbg.EXPERIMENT, tmp_path_factory)


def _rows(run_dir: Path) -> list[dict]:
    return read_rows(run_dir, bools=("reached_threshold",), strings=())


@pytest.mark.slow
def test_files(smoke_run):
    for name in ("results.csv", "summary.json", "statistics.json", "report.md",
                 "figure_gap.png", "figure_exponents.png"):  # fmt: skip
        assert (smoke_run / name).stat().st_size > 0
    assert (smoke_run / "report.md").read_text().count("- **") == len(pbg.CLAIMS)


@pytest.mark.slow
def test_one_unit_gap_recomputed(smoke_run):
    row = _rows(smoke_run)[-1]
    cfg = pbg.SCALES["smoke"]
    t, d, w, seed = cfg["seq_len"], int(row["degree"]), int(row["sparsity"]), int(row["seed"])
    f = ft.target_function(num_bits=t, degree=d, sparsity=w, seed=seed, normalization="centred")
    c = np.asarray(f.coefficients)
    if w > 1:  # centred, unit (population) variance coefficients
        np.testing.assert_allclose([c.mean(), c.std()], [0.0, 1.0], atol=1e-12)
    train_idx, test_idx = pbg.split(t, cfg["num_train"], seed)
    cube = cube_points(t)
    y = np.asarray(f(cube))
    trained = ft.train_twin(
        cube[train_idx], y[train_idx], seed=seed, mlp_width=cfg["mlp_width"],
        learning_rate=cfg["learning_rate"], loss_threshold=cfg["loss_threshold"],
        max_steps=cfg["max_steps"], chunk_steps=cfg["chunk_steps"],
    )  # fmt: skip
    pred = np.asarray(ft.apply(trained.params, cube))
    train = np.mean((pred[train_idx] - y[train_idx]) ** 2)
    test = np.mean((pred[test_idx] - y[test_idx]) ** 2)
    np.testing.assert_allclose(row["train_loss"], train, rtol=1e-8)
    np.testing.assert_allclose(row["test_loss"], test, rtol=1e-8)
    np.testing.assert_allclose(row["gap"], test - train, rtol=1e-8, atol=1e-12)
    assert row["reached_threshold"] == (train <= cfg["loss_threshold"])


@pytest.mark.slow
def test_exponents_recomputed_from_results_csv(smoke_run):
    rows = _rows(smoke_run)
    stats = json.loads((smoke_run / "statistics.json").read_text())
    classes = sorted({(r["degree"], r["sparsity"]) for r in rows})
    means = [
        np.mean([r["gap"] for r in rows if (r["degree"], r["sparsity"]) == k]) for k in classes
    ]
    keep = np.array(means) > 0
    x = np.column_stack([np.ones(len(classes)), np.log([k[0] for k in classes]),
                         np.log([k[1] for k in classes])])[keep]  # fmt: skip
    beta = np.linalg.lstsq(x, np.log(np.array(means)[keep]), rcond=None)[0]
    np.testing.assert_allclose(
        [stats["pooled"]["degree_exponent"], stats["pooled"]["sparsity_exponent"]],
        beta[1:],
        rtol=1e-8,
    )
