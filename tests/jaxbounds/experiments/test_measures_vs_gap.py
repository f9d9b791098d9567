"""The ``measures-vs-gap`` experiment: its design, its render, and (slow) the smoke run end to end.

The fast tests check the grids of every scale (sizes, every axis has groups that differ only in
it, batches share shapes), the refusal of bad grids, and the render on a synthetic table whose
measures are planted (results.csv loses its timing columns cell for cell, measures.csv holds the
statistics that ``jaxbounds.study`` gives, per family). The slow tests run the smoke scale once
and recompute from its files: tau from results.csv, a unit's row computed alone and in another order
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
from jaxbounds.experiments import measures_vs_gap as mvg
from jaxbounds.experiments import runner
from jaxbounds.experiments._output import csv_text
from jaxbounds.experiments.measures_vs_gap import rendering as mvg_rendering
from jaxbounds.experiments.measures_vs_gap import study as mvg_study
from jaxbounds.models import scalar_quantities
from jaxbounds.study import ranking
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
    for family, want in (
        (
            mvg.SPARSE,
            {"optimizer", "lr_scale", "batch_size", "width", "num_train", "seq_len",
             "weight_decay"},
        ),
        (mvg.MNIST, {"optimizer", "lr_scale", "max_steps", "width", "num_train",
                     "weight_decay"}),
    ):  # fmt: skip
        sub = [r for r in rows if r["family"] == family]
        # learning_rate is derived (base rate of the optimizer x lr_scale), not an axis
        axes = [a for a in mvg.AXIS_KEYS if a != "learning_rate" and len({r[a] for r in sub}) > 1]
        assert set(axes) == want
        assert set(mvg.family_axes(grid, family)) == want
        configs = [tuple(r[a] for a in axes) for r in sub]
        groups = ranking.psi_groups(configs, [r["seed"] for r in sub], axes)
        assert all(len(groups[a]) >= 2 for a in axes)
    for family in mvg.FAMILIES:
        for axis, values in grid["families"][family]["axes"].items():
            assert len(values) == 2 if axis == "optimizer" else len(values) in (1, 3)


def _product(values):
    return math.prod(len(v) for v in values)


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_the_optimizer_and_learning_rate_axes_are_crossed(scale):
    """lr_scale has the same levels for Adam and SGD; the rate is the optimizer's base times it."""
    grid = mvg.SCALES[scale]
    units = mvg.plan_units(grid, [0])
    for family, spec in grid["families"].items():
        sub = [u.config for u in units if u.config["family"] == family]
        base = spec["base_learning_rate"]
        optimizers = spec["axes"]["optimizer"]
        assert len(optimizers) == 2
        assert "adam" in optimizers
        other = next(o for o in optimizers if o != "adam")
        assert base["adam"] < base[other] / 3  # rates of different scales
        for c in sub:
            assert c["learning_rate"] == pytest.approx(base[c["optimizer"]] * c["lr_scale"],
                                                       rel=1e-12)  # fmt: skip
        # every optimizer meets every lr_scale, at equal other axes (the centre of the star)
        others = [a for a in mvg.AXIS_KEYS if a not in ("optimizer", "lr_scale", "learning_rate")]
        cells = {}
        for c in sub:
            cells.setdefault(tuple(c[a] for a in others), set()).add((c["optimizer"],
                                                                      c["lr_scale"]))  # fmt: skip
        full = {(o, s) for o in spec["axes"]["optimizer"] for s in spec["axes"]["lr_scale"]}
        assert full in cells.values()
        # per optimizer, one rate per level; the same level is a different rate per optimizer
        for level in spec["axes"]["lr_scale"]:
            rates = {o: {c["learning_rate"] for c in sub if c["lr_scale"] == level
                         and c["optimizer"] == o} for o in optimizers}  # fmt: skip
            assert all(len(r) == 1 for r in rates.values())
            assert rates["adam"] != rates[other]
    if scale == "paper":  # every axis crossed: the full factorial per family
        for family, spec in grid["families"].items():
            n = sum(u.config["family"] == family for u in units)
            assert n == _product(spec["axes"].values())
            assert set(spec["crossed"]) == {a for a, v in spec["axes"].items() if len(v) > 1}
    else:  # the optimizer is a star arm, crossed with lr_scale (and the step budget)
        counts = {f: sum(u.config["family"] == f for u in units) for f in mvg.FAMILIES}
        assert counts == {mvg.SPARSE: (1 + 1 + 2 * 5) * 3, mvg.MNIST: (1 + 1 + 2 * 3) * 3 * 3}
        assert len(mvg.plan_units(grid, range(8))) == 864


def test_the_statistics_take_lr_scale_as_the_learning_rate_axis():
    """With lr_scale the absolute rate (tied to the optimizer) is no axis; without, it is."""
    new = [{"lr_scale": 1.0, "learning_rate": 0.02}, {"lr_scale": 0.4, "learning_rate": 0.002}]
    old = [{"learning_rate": 0.02}, {"learning_rate": 0.002, "lr_scale": ""}]
    assert "learning_rate" not in mvg_study._axes(new)
    assert {"optimizer", "lr_scale"} <= set(mvg_study._axes(new))
    assert "learning_rate" in mvg_study._axes(old)
    assert mvg_study._lr_axis(mvg_study._axes(new)) == "lr_scale"
    assert mvg_study._lr_axis(["width", "learning_rate"]) == "learning_rate"
    assert mvg_study._lr_axis(["width"]) is None


def test_batches_share_their_shape_and_are_cut_at_16():
    units = mvg.plan_units(mvg.SCALES["cpu"], range(4))
    groups = runner._groups(mvg.EXPERIMENT, [(str(i), u) for i, u in enumerate(units)])
    assert max(len(g) for g in groups) == 16
    for group in groups:
        configs = [u.config for _, u in group]
        for key in ("family", "width", "num_train", "seq_len", "batch_size"):
            assert len({c[key] for c in configs}) == 1
    shapes = {mvg._batch_key(u) for u in units}
    # star designs: 1 + 2 x 4 and 1 + 2 x 2 shapes, and one batch per other optimizer
    assert len(shapes) == (9 + 1) + (5 + 1)
    for group in groups:
        assert len({u.config["optimizer"] for _, u in group}) == 1


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
        (lambda g: g.update(worst_batches=5), "worst_batches"),
        (lambda g: g.update(measure_lanes=0), "measure_lanes"),
        (lambda g: g["families"]["mnist01"]["axes"].update(learning_rate=[1.0]), "lr_scale"),
        (lambda g: g["families"]["mnist01"]["axes"].pop("optimizer"), "lr_scale"),
        (
            lambda g: g["families"]["mnist01"]["axes"].update(optimizer=["sgd", "momentum"]),
            "base_learning_rate",
        ),
        (
            lambda g: g["families"]["mnist01"]["base_learning_rate"].update(sgd=0.0),
            "base_learning_rate",
        ),
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
            if axis not in ("lr_scale", "width"):
                spec["axes"][axis] = values[len(values) // 2 : len(values) // 2 + 1]
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
    monkeypatch.setattr(mvg_rendering, "BOOTSTRAP_RESAMPLES", 20)
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
    table = list(csv.DictReader((tmp_path / "measures.csv").open()))
    for family in mvg.FAMILIES:
        measures = {r["measure"]: r for r in table if r["family"] == family}
        assert set(measures) == {s.name for s in mvg.measure_specs(rows[0])
                                 if family in s.families}  # fmt: skip
        assert float(measures["hessian_trace"]["tau"]) == 1.0
        assert float(measures["hessian_trace"]["psi"]) == 1.0
        assert float(measures["log_prod_spectral"]["psi"]) == -1.0
        # 2 seeds: an environment has at most 4 pairs, below Dziugaite's effective size of 12
        assert measures["hessian_trace"]["sign_error_max"] == ""
        assert float(measures["hessian_trace"]["seconds_per_model"]) == 0.5
        # the planted measure ranks first; a noise measure's tau is scipy's on the family
        assert next(iter(measures)) == "hessian_trace"
        sub = [r for r in rows if r["family"] == family]
        want = stats.kendalltau([r["param_norm"] for r in sub], [r["gap"] for r in sub])
        assert float(measures["param_norm"]["tau"]) == pytest.approx(want.statistic, abs=1e-12)
    report = (tmp_path / "report.md").read_text()
    assert report.count("- **") == len(mvg.CLAIMS) * len(mvg.FAMILIES)
    assert "norm products correlate negatively" in report
    assert "null: random measure" in report
    statistics = json.loads((tmp_path / "statistics.json").read_text())
    assert statistics["loss"]["families"][mvg.SPARSE]["num_models"] == len(rows) // 2
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


def _budget_rows():
    """mnist01-like rows: 2 widths x 3 learning rates x 2 seeds, each trained at budgets 100 and
    300; a run reaches the threshold at 100 steps at the larger rates, at 300 at the smallest."""
    rows = []
    for seed in (0, 1):
        for width in (16, 32):
            for lr in (0.3, 1.0, 3.0):
                gap = 0.01 * width + lr + 0.1 * seed
                for budget in (100, 300):
                    reached = budget == 300 or lr > 0.3
                    rows.append({
                        "family": mvg.MNIST, "width": width, "lr_scale": lr, "optimizer": "sgd",
                        "max_steps": budget, "seed": seed, "reached": reached,
                        "gap": gap if reached else gap + 5.0, "gap_stderr": 0.01,
                        "error_gap": gap / 10, "test_accuracy": 0.9, "num_test": 600,
                        "num_train": 100, "theorem5": gap, "lemma1_rademacher": 3.0 * gap,
                        "param_norm": -gap,
                    })  # fmt: skip
    return rows


def test_the_budget_is_an_outcome_never_an_axis():
    rows = _budget_rows()
    names = ["theorem5", "lemma1_rademacher", "param_norm"]
    studies = mvg_study.run_studies(rows, names, num_resamples=10, num_null_draws=2,
                                    confidence=0.95)  # fmt: skip
    fr = studies["loss"].families[mvg.MNIST]
    assert "max_steps" not in fr.axes
    assert fr.axes == ("width", "lr_scale")
    # the capped runs at budget 100 are apart; a run that reached 0.05 by 100 steps is the same
    # run at 300 and counts once: 2 seeds x 2 widths x 3 rates models
    assert (fr.num_capped, fr.num_duplicates, fr.num_models) == (4, 8, 12)
    # Psi's lr groups hold all three rates of one width and seed (one group each, 3 models)
    assert fr.measures["theorem5"].psi.num_groups == {"width": 6, "lr_scale": 4}
    assert mvg_study.converged_within(rows, fr) == {100: 8, 300: 4}


def test_measures_that_rank_identically_count_once_in_a_group_mean():
    rows = _budget_rows()
    names = ["theorem5", "lemma1_rademacher", "param_norm"]
    studies = mvg_study.run_studies(rows, names, num_resamples=10, num_null_draws=2,
                                    confidence=0.95)  # fmt: skip
    fr = studies["loss"].families[mvg.MNIST]
    assert mvg_study._distinct(names, studies["loss_table"], fr) == ["theorem5", "param_norm"]
    kinds = {"theorem5": "bound", "lemma1_rademacher": "bound", "param_norm": "sharpness"}
    ok, text = mvg_study._claim_rank_best(fr, studies["loss"].options, kinds,
                                          studies["loss_table"])  # fmt: skip
    # 1 sharpness measure (Psi -1) against 1 distinct bound (Psi +1): -2, not averaged twice
    assert "minus that of 1 norm and bound measures -2.000" in text
    assert "(lemma1_rademacher counted with the measure that ranks identically)" in text
    assert ok is False


def test_andriushchenko_claims_take_adaptive_sharpness_only():
    fr = type(
        "F",
        (),
        {
            "measures": dict.fromkeys(
                [
                    "avg_sharpness_0.02",
                    "adaptive_sharpness_0.1",
                    "worst_adaptive_l2",
                    "hessian_trace",
                ]
            )
        },
    )
    kinds = {"avg_sharpness_0.02": "sharpness", "adaptive_sharpness_0.1": "sharpness",
             "worst_adaptive_l2": "sharpness", "hessian_trace": "curvature"}  # fmt: skip
    assert mvg_study._adaptive(fr, kinds) == ["adaptive_sharpness_0.1", "worst_adaptive_l2"]


def _fake_family(worst, constant, noise=0.0):
    from types import SimpleNamespace as NS

    from jaxbounds.study.nulls import Summary

    def se(v):
        return NS(worst=v)

    measures = {n: NS(sign_error=se(v), sign_error_at={10000: se(min(1.0, v + 0.5))})
                for n, v in worst.items()}  # fmt: skip
    medians = (("random", 0.8), ("gap+noise", noise), ("constant", constant))
    nulls = {k: NS(stats={"sign_error_worst": Summary.of([v]),
                          "sign_error_worst@10000": Summary.of([v])})
             for k, v in medians}  # fmt: skip
    return NS(measures=measures, nulls=nulls)


def test_dziugaite_is_not_testable_where_the_size_adjusted_constant_passes():
    ok, text = mvg_study._claim_every_fails(_fake_family({"a": 0.6, "b": 0.1}, 0.0), {}, {})
    assert ok == "not testable"
    assert text.startswith("not testable on this family: the size-adjusted constant measure's "
                           "largest sign error is 0.000, below 0.5")  # fmt: skip
    assert "at the test size: largest sign error at least 0.5 for 1 of 2 measures" in text
    assert "at n = 10000: largest sign error at least 0.5 for 2 of 2 measures" in text
    assert "the verdict uses the test size" in text
    # where the constant fails, the verdict is the test size's
    assert mvg_study._claim_every_fails(_fake_family({"a": 0.6, "b": 0.1}, 0.5), {}, {})[0] is False
    assert mvg_study._claim_every_fails(_fake_family({"a": 0.6, "b": 0.5}, 0.5), {}, {})[0] is True
    noisy = _fake_family({"a": 0.6}, 0.5, noise=0.6)
    assert mvg_study._claim_every_fails(noisy, {}, {})[0] is None


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
    assert report.count("- **not tested at this scale**") == len(mvg.CLAIMS) * len(mvg.FAMILIES)


@pytest.mark.slow
def test_smoke_statistics_recomputed_from_results_csv(smoke_run):
    rows = [r for r in _rows(smoke_run) if r["reached"] == "true"]
    table = list(csv.DictReader((smoke_run / "measures.csv").open()))
    for family in mvg.FAMILIES:
        sub = [r for r in rows if r["family"] == family]
        measures = {r["measure"]: r for r in table if r["family"] == family}
        gap = np.array([float(r["gap"]) for r in sub])
        for name in ("hessian_trace", "adaptive_sharpness_0.05", "l1_norm"):
            mu = np.array([float(r[name]) for r in sub])
            assert int(measures[name]["num_models"]) == len(sub)
            if len(sub) < 2 or len(set(mu)) < 2:
                assert measures[name]["tau"] == ""  # n/a, never a number from nothing
                continue
            s = np.sign(mu[:, None] - mu[None, :]) * np.sign(gap[:, None] - gap[None, :])
            tau = s.sum() / (len(sub) * (len(sub) - 1))
            assert float(measures[name]["tau"]) == pytest.approx(tau, abs=1e-12)


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
    m = mvg.measure_size(cfg)
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
                fns.normalized_loss, params, meas, key(name),
                perturbation=P("gaussian", jnp.float32(s), adaptive=True),
                num_samples=cfg["sharpness_pairs"])  # fmt: skip
            _close(value(name), float(est.mean), 1e-3, 1e-7)
        b = cfg["worst_batches"]
        for norm, kind, rho in (("linf", "linf_ball", cfg["worst_rho_linf"]),
                                ("l2", "l2_ball", cfg["worst_rho_l2"])):  # fmt: skip
            name = f"worst_adaptive_{norm}"
            values = [
                float(kernels.worst_case_sharpness(
                    fns.normalized_loss, params, jax.tree_util.tree_map(lambda a, i=i: a[i * m // b:
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


# ------------------------------------------- the committed run, recomputed independently

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "reproduce" / "measures-vs-gap"


def test_committed_tau_and_psi_recomputed_from_results_csv():
    """tau (Jiang's eq. 3) and Psi per family, converged models, duplicates once: plain loops."""
    with (COMMITTED / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    table = list(csv.DictReader((COMMITTED / "measures.csv").open()))
    names = ["hessian_trace", "log_prod_spectral", "pacbayes_mag_flatness", "dist_init"]
    for family in mvg.FAMILIES:
        seen, sub = set(), []
        for r in rows:
            if r["family"] != family or r["reached"] != "true":
                continue
            key = (r["seed"], r["gap"], *(r[s.name] for s in mvg.measure_specs(mvg.SCALES["cpu"])))
            if key not in seen:
                seen.add(key)
                sub.append(r)
        # learning_rate = lr_scale x the optimizer's base rate: derived, not an axis of its own;
        # the step budget within which a kept model converged is an outcome, not an axis
        axes = [
            a for a in mvg.AXIS_KEYS
            if a not in ("learning_rate", "max_steps") and len({r.get(a) for r in sub}) > 1
        ]  # fmt: skip
        got = {r["measure"]: r for r in table if r["family"] == family}
        gap = [float(r["gap"]) for r in sub]
        for name in names:
            mu = [float(r[name]) for r in sub]
            n = len(sub)
            s = sum(np.sign(mu[i] - mu[j]) * np.sign(gap[i] - gap[j])
                    for i in range(n) for j in range(n) if i != j)  # fmt: skip
            assert float(got[name]["tau"]) == pytest.approx(s / (n * (n - 1)), abs=1e-12)
            per_axis = []
            for axis in axes:
                groups: dict = {}
                for i, r in enumerate(sub):
                    groups.setdefault((r["seed"], *(r[a] for a in axes if a != axis)), []).append(i)
                taus = []
                for members in groups.values():
                    if len({sub[i][axis] for i in members}) < 2:
                        continue
                    m = len(members)
                    t = sum(np.sign(mu[i] - mu[j]) * np.sign(gap[i] - gap[j])
                            for i in members for j in members if i != j)  # fmt: skip
                    taus.append(t / (m * (m - 1)))
                if taus:
                    per_axis.append(np.mean(taus))
                    assert float(got[name][f"psi[{axis}]"]) == pytest.approx(np.mean(taus),
                                                                             abs=1e-12)  # fmt: skip
            assert float(got[name]["psi"]) == pytest.approx(np.mean(per_axis), abs=1e-12)
    report = (COMMITTED / "report.md").read_text()
    assert "230 duplicate runs counted once" in report


# ----------------------------------------------- the magnitude-aware search (SPEC section 8)


def test_mag_sigma_search_closed_form_without_floor():
    """0.5 ||w||^2: an antithetic pair raises it by s^2 ||w * z||^2 / 2, solved for s."""
    w = jnp.array([1.0, -2.0, 0.5])
    key = jax.random.key(3)
    num_samples, target = 8, 0.3
    z = jax.vmap(lambda k: jax.random.normal(k, (3,), w.dtype))(jax.random.split(key, 8))
    mean_sq = float(jnp.mean(jnp.sum(jnp.square(w[None, :] * z), axis=1)))
    want = math.sqrt(2 * target / mean_sq)
    r = mvg.mag_sigma_search(lambda p, b: 0.5 * jnp.sum(p**2), w, None, key, eps=0.0,
                             target_increase=target, sigma_lower=1e-4, sigma_upper=10.0,
                             num_samples=num_samples, num_steps=50)  # fmt: skip
    assert bool(r["bracketed"])
    assert float(r["sigma"]) == pytest.approx(want, rel=1e-8)
    assert float(r["increase"]) == pytest.approx(target, rel=1e-7)


def test_mag_sigma_search_floor_perturbs_zero_weights():
    """All weights 0: without the floor nothing moves; a floor of 2 always exceeds the target."""
    w = jnp.zeros(4)
    err = lambda p, b: jnp.mean(jnp.abs(p) > 1.0).astype(p.dtype)  # noqa: E731
    kw = {"target_increase": 0.1, "sigma_lower": 1e-3, "sigma_upper": 10.0, "num_samples": 16,
          "num_steps": 10}  # fmt: skip
    none = mvg.mag_sigma_search(err, w, None, jax.random.key(0), eps=0.0, **kw)
    # never above target: every step moves the lower end up, to 10 (1e-4)^(2^-10)
    assert float(none["sigma"]) == pytest.approx(10.0 * 1e-4 ** (2.0**-10), rel=1e-5)
    assert not bool(none["bracketed"])
    big = mvg.mag_sigma_search(err, w, None, jax.random.key(0), eps=2.0, **kw)
    assert float(big["sigma"]) == pytest.approx(1e-3)  # the lower end: always above target
    assert float(big["increase"]) > 0.1
