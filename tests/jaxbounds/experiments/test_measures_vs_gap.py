"""The ``measures-vs-gap`` experiment: its design, its render, and (slow) the smoke run end to end.

The fast tests check the grids of every scale (sizes, every axis has groups that differ only in
it, batches share shapes), the refusal of bad grids, and the render on a synthetic table whose
measures are planted (results.csv loses its timing columns cell for cell, measures.csv holds the
statistics that ``_stats`` gives). The slow tests run the smoke scale once and recompute from
its files: every statistic from results.csv, a unit's row computed alone and in another order
(same bytes), and one unit's measures from its trained weights directly with the kernels.
"""

from __future__ import annotations

import copy
import csv
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import kernels
from jaxbounds.bounds.from_model import scalar_bounds
from jaxbounds.experiments import _stats, runner
from jaxbounds.experiments import measures_vs_gap as mvg
from jaxbounds.experiments._output import csv_text
from jaxbounds.models import scalar_quantities
from tests.helpers import run_smoke

# ------------------------------------------------------------------------------------ design


@pytest.mark.parametrize(("scale", "least"), [("smoke", 4), ("cpu", 150), ("paper", 1000)])
def test_scales_plan_enough_models(scale, least):
    seeds = range(mvg.EXPERIMENT.seeds_for(scale))
    units = mvg.plan_units(mvg.SCALES[scale], seeds)
    assert len(units) >= least
    assert runner.check_size(mvg.EXPERIMENT, scale, list(seeds)) == len(units)
    keys = list(units[0].config)
    assert keys[: 1 + len(mvg.AXIS_KEYS)] == ["family", *mvg.AXIS_KEYS]
    assert all(list(u.config) == keys for u in units)
    assert len({runner.unit_key(mvg.NAME, u, "v") for u in units}) == len(units)


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_axis_has_groups_that_differ_only_in_it(scale):
    """Each family's axes: at least 3 values (where the shapes allow) and groups for psi_i."""
    grid = mvg.SCALES[scale]
    units = mvg.plan_units(grid, [0, 1])
    rows = [{**u.config, "seed": u.seed} for u in units]
    settings, axes = mvg._settings(rows, grid)
    assert {a.split(":")[1] for a in axes if a.startswith(mvg.SPARSE)} == {
        "learning_rate", "batch_size", "width", "num_train", "seq_len"}  # fmt: skip
    assert {a.split(":")[1] for a in axes if a.startswith(mvg.MNIST)} == {
        "learning_rate", "max_steps", "width", "num_train"}  # fmt: skip
    for family in mvg.FAMILIES:
        for values in grid["families"][family]["axes"].values():
            assert len(values) in (1, 3)
    rng = np.random.default_rng(0)
    g = _stats.granulated_tau(rng.normal(size=len(rows)), rng.normal(size=len(rows)), settings,
                              axes, seed_key="seed")  # fmt: skip
    assert all(g.num_groups[a] >= 2 for a in axes)
    assert all(not math.isnan(v) for v in g.per_axis.values())


def test_batches_share_their_shape_and_are_cut_at_16():
    units = mvg.plan_units(mvg.SCALES["cpu"], range(4))
    groups = runner._groups(mvg.EXPERIMENT, [(str(i), u) for i, u in enumerate(units)])
    assert max(len(g) for g in groups) == 16
    for group in groups:
        configs = [u.config for _, u in group]
        for key in ("family", "width", "num_train", "seq_len", "batch_size"):
            assert len({c[key] for c in configs}) == 1
    shapes = {mvg._batch_key(u) for u in units}
    assert len(shapes) == 9 + 5  # star designs: 1 + 2 x 4 and 1 + 2 x 2 shapes


def test_star_design_points():
    points = mvg._star_points({"a": [1, 2, 3], "b": [10, 20, 30], "c": [5, 6]}, ["c"])
    # centre (2, 20) and the arms a in {1, 3}, b in {10, 30}, each crossed with c in {5, 6}
    arms = [(2, 20), (1, 20), (3, 20), (2, 10), (2, 30)]
    assert [(p["a"], p["b"], p["c"]) for p in points] == [(a, b, c) for a, b in arms
                                                           for c in (5, 6)]  # fmt: skip


def _bad(mutate):
    grid = copy.deepcopy(mvg.SCALES["smoke"])
    mutate(grid)
    return grid


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g["families"].update(cifar=g["families"]["mnist01"]), "families"),
        (lambda g: g["families"]["mnist01"]["axes"].update(depth=[1, 2]), "unknown settings"),
        (lambda g: g["families"]["mnist01"]["crossed"].append("seq_len"), "crossed"),
        (lambda g: g["families"]["mnist01"]["axes"].update(width=[8, 8]), "distinct"),
        (lambda g: g["families"]["mnist01"]["fixed"].update(measure_examples=40), "measure_ex"),
        (lambda g: g.update(worst_batches=3), "worst_batches"),
        (lambda g: g.update(measure_lanes=0), "measure_lanes"),
    ],
)
def test_bad_grids_raise(mutate, message):
    with pytest.raises(ValueError, match=message):
        mvg.plan_units(_bad(mutate), [0])


# ------------------------------------------------------------- render on a synthetic table


def _synthetic_rows():
    """A small table with planted measures: one equal to the gap, one reversed, noise.

    The cpu grid cut to learning rate x width per family (9 configurations each), 2 seeds.
    """
    grid = copy.deepcopy(mvg.SCALES["cpu"])
    for spec in grid["families"].values():
        for axis, values in spec["axes"].items():
            if axis not in ("learning_rate", "width"):
                spec["axes"][axis] = values[1:2] if len(values) == 3 else values
    units = mvg.plan_units(grid, range(2))
    rng = np.random.default_rng(1)
    rows = []
    specs = mvg.measure_specs(units[0].config)
    for u in units:
        gap = float(rng.normal())
        row = {**u.config, "seed": u.seed, **mvg._row_template(specs)}
        row.update(gap=gap, gap_stderr=0.01, error_gap=gap / 10, reached=True, hit_cap=False,
                   diverged=False, steps=100)  # fmt: skip
        for spec in specs:
            if u.config["family"] in spec.families:
                row[spec.name] = float(rng.normal())
        row["hessian_trace"] = gap
        row["log_prod_spectral"] = -2.0 * gap
        row["seconds_hessian_trace"] = 0.5
        row["compile_seconds_hessian_trace"] = 0.0
        rows.append(row)
    return rows, grid


def _json_cell(text: str):
    """A results.csv cell back to the value the runner wrote (JSON, else the text)."""
    if text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def test_render_on_planted_measures(tmp_path, monkeypatch):
    monkeypatch.setattr(mvg, "BOOTSTRAP_RESAMPLES", 20)
    rows, grid = _synthetic_rows()
    columns = list(rows[0])
    (tmp_path / "results.csv").write_text(csv_text(rows, columns))
    before = list(csv.reader((tmp_path / "results.csv").open()))
    meta = {"experiment": mvg.NAME, "description": "d", "paper": "p", "scale": "cpu",
            "seeds": [0, 1], "num_finished": len(rows), "num_units": len(rows),
            "config_grid": runner.to_jsonable(grid)}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(meta))
    mvg.render(rows, meta, tmp_path)
    after = list(csv.reader((tmp_path / "results.csv").open()))
    keep = [j for j, c in enumerate(before[0]) if not c.startswith(("seconds_", "compile_"))]
    assert after == [[line[j] for j in keep] for line in before]
    assert "seconds_hessian_trace" in (tmp_path / "seconds.csv").read_text().splitlines()[0]
    measures = {r["measure"]: r for r in csv.DictReader((tmp_path / "measures.csv").open())}
    assert set(measures) == {s.name for s in mvg.measure_specs(rows[0])}
    assert float(measures["hessian_trace"]["tau"]) == pytest.approx(1.0, abs=1e-12)
    assert float(measures["hessian_trace"]["psi"]) == pytest.approx(1.0, abs=1e-12)
    assert float(measures["hessian_trace"]["sign_error_worst"]) == 0.0
    assert float(measures["log_prod_spectral"]["psi"]) == pytest.approx(-1.0, abs=1e-12)
    assert float(measures["hessian_trace"]["seconds_per_model"]) == 0.5
    # the planted measure ranks first; a pure-noise measure has |tau| within 4 null sd
    assert next(iter(measures)) == "hessian_trace"
    n = int(measures["param_norm"]["num_models"])
    null_sd = math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))
    assert abs(float(measures["param_norm"]["tau"])) < 4 * null_sd
    report = (tmp_path / "report.md").read_text()
    assert report.count("- **") == len(mvg.CLAIMS)
    assert "norm products correlate negatively" in report
    stats = json.loads((tmp_path / "statistics.json").read_text())
    assert stats["models"]["num_models"] == len(rows)
    # rendered again from results.csv (no timings) and summary.json alone: the same files
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["measure_cost"]["hessian_trace"] == {"seconds_per_model": 0.5,
                                                        "compile_seconds": 0.0}  # fmt: skip
    read_back = [{k: _json_cell(v) for k, v in r.items()}
                 for r in csv.DictReader((tmp_path / "results.csv").open())]  # fmt: skip
    again = tmp_path / "again"
    again.mkdir()
    monkeypatch.setattr(runner, "new_figure", lambda **_: None)
    mvg.render(read_back, summary, again)
    for name in ("report.md", "measures.csv", "statistics.json"):
        assert (again / name).read_text() == (tmp_path / name).read_text(), name


def test_bootstrap_tau_equals_scipy_on_the_repeated_sample():
    """The resampled tau-b from sign matrices is scipy's tau-b of the sample with its repeats."""
    rng = np.random.default_rng(8)
    x = np.round(rng.normal(size=40), 1)  # ties in x
    y = rng.normal(size=40)
    sx, sy = mvg._signs(x), mvg._signs(y)
    for index in (np.arange(40), rng.integers(0, 40, size=40), np.r_[0:20, 0:20, 5:9]):
        want = stats.kendalltau(x[index], y[index]).statistic
        assert mvg._tau_b_resample(sx, sy, index) == pytest.approx(want, abs=1e-12)


# -------------------------------------------------------------------- slow: the smoke run


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    return run_smoke(mvg.EXPERIMENT, tmp_path_factory)


def _rows(run_dir: Path) -> list[dict]:
    with (run_dir / "results.csv").open() as f:
        return list(csv.DictReader(f))


def _number(text: str) -> float:
    return math.nan if text == "" else float(text)


@pytest.mark.slow
def test_smoke_files(smoke_run):
    for name in (
        "results.csv",
        "seconds.csv",
        "measures.csv",
        "summary.json",
        "report.md",
        "statistics.json",
        "figure_tau.png",
        "figure_psi.png",
        "figure_scatter.png",
    ):
        assert (smoke_run / name).exists(), name  # fmt: skip
    rows = _rows(smoke_run)
    assert len(rows) == len(mvg.plan_units(mvg.SCALES["smoke"], [0]))
    assert not [c for c in rows[0] if c.startswith(("seconds_", "compile_seconds_"))]
    specs = mvg.measure_specs(mvg.SCALES["smoke"])
    for row in rows:
        for spec in specs:
            if row["family"] in spec.families:
                assert math.isfinite(_number(row[spec.name])), spec.name
    seconds = list(csv.DictReader((smoke_run / "seconds.csv").open()))
    assert all(float(r["seconds_hessian_trace"]) > 0 for r in seconds)
    report = (smoke_run / "report.md").read_text()
    assert report.count("- **not tested at this scale**") == len(mvg.CLAIMS)


@pytest.mark.slow
def test_smoke_statistics_recomputed_from_results_csv(smoke_run):
    rows = _rows(smoke_run)
    gap = np.array([float(r["gap"]) for r in rows])
    measures = {r["measure"]: r for r in csv.DictReader((smoke_run / "measures.csv").open())}
    settings = [{f"{mvg.SPARSE}:learning_rate": float(r["learning_rate"])
                 if r["family"] == mvg.SPARSE else None,
                 f"{mvg.MNIST}:max_steps": int(r["max_steps"]) if r["family"] == mvg.MNIST
                 else None, "family": r["family"], "seed": int(r["seed"])}
                for r in rows]  # fmt: skip
    axes = [f"{mvg.SPARSE}:learning_rate", f"{mvg.MNIST}:max_steps"]
    for name in ("hessian_trace", "adaptive_sharpness_0.05", "l1_norm"):
        mu = np.array([float(r[name]) for r in rows])
        assert float(measures[name]["tau"]) == pytest.approx(
            _stats.kendall_tau(mu, gap).tau, abs=1e-12)  # fmt: skip
        psi = _stats.granulated_tau(mu, gap, settings, axes).psi
        assert float(measures[name]["psi"]) == pytest.approx(psi, abs=1e-12)


def _strip(row: dict) -> str:
    return json.dumps({k: v for k, v in row.items() if not mvg._is_timing(k)}, sort_keys=True)


@pytest.mark.slow
def test_a_unit_row_does_not_depend_on_its_batch(smoke_run):
    """Alone, or in its batch in reversed order: the same row as results.csv, byte for byte."""
    units = [u for u in mvg.plan_units(mvg.SCALES["smoke"], [0]) if u.config["family"] ==
             mvg.SPARSE]  # fmt: skip
    alone = mvg.run_unit(units[1])
    reversed_rows = mvg.run_batch(units[::-1])
    assert _strip(alone) == _strip(reversed_rows[0])
    unit_file = (
        smoke_run
        / "units"
        / f"{runner.unit_key(mvg.NAME, units[1], runner.package_version())}.json"
    )
    stored = json.loads(unit_file.read_text())["result"]
    assert _strip(alone) == _strip(stored)


def _close(got, want, rtol, atol=0.0):
    assert got == pytest.approx(want, rel=rtol, abs=atol)


@pytest.mark.slow
def test_one_unit_recomputed_by_hand(smoke_run):
    """A sparse-majority unit's measures from its weights, each kernel called on its own."""
    unit = mvg.plan_units(mvg.SCALES["smoke"], [0])[0]
    cfg, seed = unit.config, unit.seed
    (row,) = [r for r in _rows(smoke_run) if r["family"] == cfg["family"] and int(r["seed"]) ==
              seed and float(r["learning_rate"]) == cfg["learning_rate"]]  # fmt: skip
    (model,) = mvg.trained_models([unit])
    fns = mvg._family_fns(cfg)
    params = jax.tree_util.tree_map(jnp.asarray, model["params"])
    params0 = model["params0"]
    m = cfg["measure_examples"]
    meas = {"x": jnp.asarray(model["train"]["x"][:m]), "y": jnp.asarray(model["train"]["y"][:m])}
    key = lambda name: mvg._key(seed, name)  # noqa: E731
    value = lambda name: float(row[name])  # noqa: E731
    # losses and the gap, in float64 numpy from the model's scores
    for split in ("train", "test"):
        d = model[split]
        f = np.asarray(fns.apply(params, jnp.asarray(d["x"])), np.float64)
        s = 2.0 * d["y"] - 1.0
        _close(value(f"{split}_loss"), np.mean(np.logaddexp(0.0, -s * f)), 1e-5)
        _close(value(f"{split}_accuracy"), np.mean((f > 0) == (d["y"] == 1)), 0, 1e-7)
    _close(value("gap"), value("test_loss") - value("train_loss"), 1e-12)
    P = kernels.Perturbation
    with kernels.runtime_checks(False):
        est = kernels.hessian_trace(fns.loss, params, meas, key("hessian_trace"),
                                    num_samples=cfg["hessian_probes"])  # fmt: skip
        _close(value("hessian_trace"), float(est.mean), 1e-4)
        _close(value("hessian_trace_stderr"), float(est.stderr), 1e-3)
        top = kernels.top_eigenvalues(
            kernels.hvp(fns.loss, params, meas),
            params,
            key("hessian_top"),
            k=1,
            num_steps=cfg["lanczos_steps"],
        )
        _close(value("hessian_top_eigenvalue"), float(top[0]), 1e-4)
        for s in cfg["sharpness_sigmas"]:
            name = f"avg_sharpness_{s:g}"
            est = kernels.average_sharpness(fns.loss, params, meas, key(name),
                                            perturbation=P("gaussian", jnp.float32(s)),
                                            num_samples=cfg["sharpness_pairs"])  # fmt: skip
            _close(value(name), float(est.mean), 1e-3, 1e-7)
        for s in cfg["adaptive_sigmas"]:
            name = f"adaptive_sharpness_{s:g}"
            est = kernels.average_sharpness(
                fns.loss, params, meas, key(name),
                perturbation=P("gaussian", jnp.float32(s), adaptive=True),
                num_samples=cfg["sharpness_pairs"])  # fmt: skip
            _close(value(name), float(est.mean), 1e-3, 1e-7)
        b = cfg["worst_batches"]
        for norm, kind, rho in (("linf", "linf_ball", cfg["worst_rho_linf"]),
                                ("l2", "l2_ball", cfg["worst_rho_l2"])):  # fmt: skip
            name = f"worst_adaptive_{norm}"
            values = [
                float(kernels.worst_case_sharpness(
                    fns.loss, params, jax.tree_util.tree_map(lambda a, i=i: a[i * m // b:
                                                             (i + 1) * m // b], meas),
                    jax.random.fold_in(key(name), i),
                    perturbation=P(kind, jnp.float32(rho), adaptive=True),
                    num_steps=cfg["worst_steps"]).value)
                for i in range(b)
            ]  # fmt: skip
            _close(value(name), np.mean(values), 1e-3, 1e-7)
        for program, column, adaptive, bracket in (
            ("sigma_mag", "pacbayes_mag", True, cfg["adaptive_sigma_bracket"]),
            ("sigma_plain", "pacbayes", False, cfg["sigma_bracket"]),
        ):
            r = kernels.sigma_search(
                fns.error, params, meas, key(program),
                perturbation=P("gaussian", jnp.float32(bracket[1]), adaptive=adaptive),
                target_increase=jnp.float32(cfg["sigma_target"]),
                num_samples=cfg["sigma_pairs"], sigma_lower=jnp.float32(bracket[0]),
                num_steps=cfg["sigma_steps"],
            )  # fmt: skip
            _close(value(f"{column}_sigma"), float(r.sigma), 1e-5)
            _close(value(f"{column}_flatness"), 1.0 / float(r.sigma) ** 2, 1e-5)
        xy = (meas["x"], meas["y"].astype(meas["x"].dtype))
        est = kernels.ggn_trace(fns.apply, params, xy, key("ggn_trace"), loss="logistic",
                                num_samples=cfg["ggn_probes"])  # fmt: skip
        _close(value("ggn_trace"), float(est.mean), 1e-4)
        ef = kernels.empirical_fisher_trace(fns.apply, params, xy, loss="logistic")
        _close(value("empirical_fisher_trace"), float(ef), 1e-4)
        est = kernels.mc_fisher_trace(fns.apply, params, xy, key("mc_fisher"), loss="logistic",
                                      num_samples=cfg["fisher_samples"])  # fmt: skip
        _close(value("mc_fisher_trace"), float(est.mean), 1e-4)
    # norms, written out in numpy (float64)
    layer, layer0 = model["params"]["layers"][0], params0["layers"][0]
    heads = range(cfg["num_heads"])
    mats = [np.asarray(layer[k][h], np.float64) for k in ("w_qk", "w_v", "w_c") for h in heads]
    mats.append(np.asarray(model["params"]["w"], np.float64)[:, None])
    mats0 = [np.asarray(layer0[k][h], np.float64) for k in ("w_qk", "w_v", "w_c") for h in heads]
    mats0.append(np.asarray(params0["w"], np.float64)[:, None])
    fro2 = [np.sum(w**2) for w in mats]
    spec2 = [np.linalg.svd(w, compute_uv=False)[0] ** 2 for w in mats]
    _close(value("log_prod_frobenius"), sum(np.log(fro2)), 1e-12)
    _close(value("log_prod_spectral"), sum(np.log(spec2)), 1e-10)
    _close(value("sum_fro_over_spec"), sum(a / b for a, b in zip(fro2, spec2, strict=True)), 1e-10)
    _close(value("param_norm"), sum(fro2), 1e-12)
    dist2 = sum(np.sum((w - w0) ** 2) for w, w0 in zip(mats, mats0, strict=True))
    _close(value("dist_init"), math.sqrt(dist2), 1e-12)
    _close(value("l1_norm"), sum(np.abs(w).sum() for w in mats), 1e-12)
    _close(value("pacbayes_kl_init"), dist2 / (2 * value("pacbayes_sigma") ** 2), 1e-6)
    squared = jax.tree_util.tree_map(jnp.square, params)
    ones = jnp.ones((1, *model["train"]["x"].shape[1:]), jnp.float32)
    _close(value("path_norm"), float(fns.apply(squared, ones)[0]), 1e-5)
    # the bounds on the same weights
    with jax.enable_x64(True):
        p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), model["params"])
        q = scalar_quantities(p64, np.asarray(model["train"]["x"], np.float64),
                              activation_lipschitz=1.0)  # fmt: skip
        bounds = scalar_bounds(q, delta=cfg["delta"])
    _close(value("tt_gap_cor411"), float(bounds["T&T Corollary 4.1.1 gap"].value), 1e-12)
    _close(value("edelman_cover"), float(bounds["Edelman multi-layer log cover"].value), 1e-12)
    assert row["tt_gap_cor411_status"] == bounds["T&T Corollary 4.1.1 gap"].status.name
