"""The study of a table: per family, converged only, duplicates once, NaN rows reported."""

import math

import numpy as np
import pytest

from jaxbounds.study import analyze, kendall, load_table, tau_a


def _rows(rng_seed=0, seeds=(0, 1, 2)):
    rng = np.random.default_rng(rng_seed)
    rows = []
    for fam, scale in (("small", 1.0), ("big", 10.0)):
        for s in seeds:
            for lr in (1, 2, 3):
                for bs in (8, 16):
                    gap = scale * (lr + 0.5 * bs / 8 + 0.1 * rng.standard_normal())
                    # within each family the measure rises with the gap; across families the
                    # big-gap family has the smaller measure (Simpson's paradox when pooled)
                    m = gap / scale + (100.0 if fam == "small" else 0.0)
                    rows.append({"fam": fam, "lr": lr, "bs": bs, "seed": s, "gap": gap,
                                 "m": m, "const": 1.0, "se": 0.01, "done": True})  # fmt: skip
    return rows


ARGS = {"family": "fam", "axes": ["lr", "bs"], "seed": "seed", "gap": "gap",
        "measures": ["m", "const"], "converged": "done", "gap_stderr": "se"}  # fmt: skip


def _study(rows, **kw):
    return analyze(load_table(rows, **ARGS), **({"num_null_draws": 20, "num_resamples": 30} | kw))


def test_per_family_tau_is_the_family_tau_and_pooled_is_apart():
    rows = _rows()
    r = _study(rows)
    for fam in ("small", "big"):
        sub = [x for x in rows if x["fam"] == fam]
        expected = tau_a([x["m"] for x in sub], [x["gap"] for x in sub])
        assert r.families[fam].measures["m"].tau.tau == pytest.approx(expected, abs=1e-15)
        assert r.families[fam].measures["m"].tau.tau > 0.8
    assert r.pooled["m"].tau < 0  # the pooled coefficient reverses: never a verdict
    assert r.families["small"].axes == ("lr", "bs")


def test_constant_measure_is_na():
    r = _study(_rows())
    m = r.families["small"].measures["const"]
    assert math.isnan(m.tau.tau)
    assert m.tau.note == "the measure is constant"
    assert math.isnan(m.tau_interval.low)
    assert any("const: tau n/a" in n for n in r.families["small"].notes)


def test_capped_models_are_reported_apart():
    rows = _rows()
    for x in rows[:5]:
        x["done"] = False
    r = _study(rows)
    f = r.families["small"]
    assert f.num_capped == 5
    assert f.num_models == 18 - 5
    assert f.measures["m"].tau_capped is not None
    sub = [x for x in rows if x["fam"] == "small" and x["done"]]
    expected = tau_a([x["m"] for x in sub], [x["gap"] for x in sub])
    assert f.measures["m"].tau.tau == pytest.approx(expected, abs=1e-15)
    everything = _study(rows, converged_only=False).families["small"]
    assert everything.num_models == 18


def test_duplicates_count_once():
    rows = _rows()
    copy = dict(rows[0]) | {"bs": 99}  # the same run under another cap
    r = _study([*rows, copy])
    f = r.families["small"]
    assert f.num_duplicates == 1
    assert f.duplicate_axes == ("bs",)
    assert f.num_models == 18
    assert f.axes == ("lr", "bs")


def test_duplicates_by_run_id():
    rows = [x | {"run": i} for i, x in enumerate(_rows())]
    rows.append(rows[3] | {"gap": rows[3]["gap"] + 1.0})  # same run id: one run
    t = load_table(rows, **ARGS, run_id="run")
    f = analyze(t, num_null_draws=5, num_resamples=5).families["small"]
    assert f.num_duplicates == 1


def test_nan_rows_are_reported_not_dropped_silently():
    rows = _rows()
    rows[1]["gap"] = math.nan
    rows[2]["m"] = math.nan
    f = _study(rows).families["small"]
    assert f.num_no_gap == 1
    assert any("without a gap" in n for n in f.notes)
    assert f.measures["m"].num_missing == 1
    assert f.measures["m"].num_models == 16


def test_one_seed_resamples_the_configurations_only():
    f = _study(_rows(seeds=(0,))).families["small"]
    assert f.seeds == (0,)
    assert math.isfinite(f.measures["m"].psi.psi)
    assert f.measures["m"].tau_interval.distinct_resamples == 462  # multisets of 6 of 6
    assert any("one seed: the intervals resample the configurations only" in n for n in f.notes)
    assert set(f.resamples.weights.sum(axis=1).tolist()) == {6.0}


def test_nulls_bracket_the_measure():
    f = _study(_rows()).families["small"]
    random_tau = f.nulls["random"].stats["tau"]
    assert random_tau.high < f.measures["m"].tau.tau
    assert f.nulls["gap+noise"].stats["tau"].mean > 0.9
    assert len(random_tau.values) == 20


def test_one_group_kendall_matches_scipy():
    from scipy import stats

    rows = _rows()
    f = _study(rows).families["big"]
    sub = [x for x in rows if x["fam"] == "big"]
    expected = stats.kendalltau([x["m"] for x in sub], [x["gap"] for x in sub]).statistic
    assert f.measures["m"].tau.tau_b == pytest.approx(expected, abs=1e-12)
    assert kendall([1, 2], [2, 1]).tau == -1.0


def test_bad_confidence():
    with pytest.raises(ValueError, match="confidence"):
        _study(_rows(), confidence=1.5)


def test_cmi_skipped_on_large_families_is_said():
    f = _study(_rows(), cmi_max_models=5).families["small"]
    assert f.measures["m"].cmi is None
    assert any(n.startswith("CMI skipped: 18 models") for n in f.notes)
    assert _study(_rows()).families["small"].measures["m"].cmi is not None


def test_the_constant_null_and_the_sign_error_at_another_test_size():
    # sizes N in (100, 400): the size-adjusted constant 1/sqrt(N) orders every N environment
    rows = [{"n": n, "lr": lr, "seed": s, "gap": 0.3 - 0.2 * (n == 400) + 0.03 * lr,
             "m": 1.0 + 0.1 * s, "nt": 1000}
            for n in (100, 400) for lr in (1, 2) for s in range(8)]  # fmt: skip
    t = load_table(rows, axes=["n", "lr"], seed="seed", gap="gap", measures=["m"],
                   num_test="nt", train_size="n")  # fmt: skip
    f = analyze(t, num_null_draws=3, num_resamples=5, sign_error_num_test=(10000,),
                min_ess=1.0).families["all"]  # fmt: skip
    const = f.nulls["constant"].stats
    assert f.nulls["constant"].num_samples == 1
    # N environments (gaps 0.2 apart): Hoeffding weight (1 - 2 e^{-20})^2 at n = 1000, and
    # 1/sqrt(N) right in every pair; lr environments (0.03 apart): 1 - 2 e^{-0.45} < 0, weight
    # 0 at n = 1000, but (1 - 2 e^{-4.5})^2 = 0.956 at n = 10000, where the constant ties every
    # pair (1/2)
    assert const["sign_error_worst"].median == 0.0
    assert const["sign_error_worst@10000"].median == 0.5
    m = f.measures["m"]
    assert set(m.sign_error_at) == {10000}
    assert m.sign_error_at[10000].num_environments > m.sign_error.num_environments


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [("converged_only", "no", r"^converged_only: expected True or False, got 'no'"),
     ("collapse_duplicates", "False", r"^collapse_duplicates: expected True or False"),
     ("log_measures", "logm", r"^log_measures: expected a list of measure names or None"),
     ("cmi_max_size", 2.5, r"^cmi_max_size: expected an int, got 2.5"),
     ("min_ess", math.nan, r"^min_ess: expected a finite number > 0, got nan"),
     ("min_ess", -1, r"^min_ess: expected a finite number > 0"),
     ("rng_seed", -1, r"^rng_seed: expected an int >= 0, got -1"),
     ("rng_seed", "a", r"^rng_seed: expected an int, got 'a'"),
     ("loss_range", "1", r"^loss_range: expected a finite number > 0, got '1'"),
     ("loss_range", None, r"^loss_range: expected a finite number > 0, got None"),
     ("num_null_draws", 0, r"^num_null_draws: expected an int in \[1, 100,000\], got 0"),
     ("num_resamples", 10**11, r"^num_resamples: expected an int in \[1, 100,000\]"),
     ("sign_error_num_test", (0,), r"^sign_error_num_test: expected an int in \[1, "),
     ("sign_error_num_test", 100, r"^sign_error_num_test: expected a list of ints")],
)  # fmt: skip
def test_each_bad_option_is_refused_naming_it(option, value, says):
    # a string flag was read as True, "logm" as the names 'l', 'o', 'g', 'm', 2.5 as 2, and
    # num_null_draws=0 was refused as "num_samples"
    with pytest.raises(ValueError, match=says):
        _study(_rows(), **{option: value})


def test_numpy_integers_are_counts_and_a_dict_is_not_a_table():
    a = _study(_rows(), num_null_draws=np.int64(20), rng_seed=np.uint32(0))
    b = _study(_rows())
    assert (
        a.families["small"].nulls["random"].stats["tau"]
        == (b.families["small"].nulls["random"].stats["tau"])
    )
    with pytest.raises(ValueError, match=r"^table: expected a ModelTable \(load_table\), got"):
        analyze({}, num_null_draws=20)
