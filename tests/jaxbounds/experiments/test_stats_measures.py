"""The statistics of ``measures-vs-gap``: Kendall's tau, Jiang et al.'s Psi, Dziugaite et al.'s sign
error and the seed bootstrap, against hand computations and enumerations on small tables."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from jaxbounds.experiments import _stats

# A 2 x 2 table (learning rate x batch size, one seed), worked by hand in the docstrings below.
TABLE = [  # (lr, bs, measure, gap)
    (1, 8, 1.0, 1.0),
    (1, 16, 2.0, 3.0),
    (2, 8, 3.0, 2.0),
    (2, 16, 4.0, 1.5),
]


def _table():
    settings = [{"lr": lr, "bs": bs, "seed": 0} for lr, bs, _, _ in TABLE]
    return settings, [m for *_, m, _ in TABLE], [g for *_, g in TABLE]


def test_tau_and_psi_by_hand():
    """tau over all models and psi per axis of the 2 x 2 table, pair by pair.

    Pairs (i < j) of (measure, gap): (1,2): +,+; (1,3): +,+; (1,4): +,+; (2,3): +,-; (2,4): +,-;
    (3,4): +,- -> tau = (3 - 3) / 6 = 0.  Groups differing only in lr: bs=8 {1,3}: (+)(+) = +1;
    bs=16 {2,4}: (+)(-) = -1 -> psi_lr = 0.  Only in bs: lr=1 {1,2}: +1; lr=2 {3,4}: (+)(-) =
    -1 -> psi_bs = 0.  Change model 4's gap to 5: every pair concordant but (2,3) -> tau =
    (5 - 1)/6 = 2/3, psi_lr = (1 + 1)/2 = 1, psi_bs = 1, Psi = 1.
    """
    settings, mu, gap = _table()
    assert _stats.kendall_tau_a(mu, gap) == 0.0
    assert _stats.kendall_tau(mu, gap).tau == pytest.approx(0.0, abs=1e-15)
    g = _stats.granulated_tau(mu, gap, settings, ["lr", "bs"])
    assert g.per_axis == {"lr": 0.0, "bs": 0.0}
    assert g.num_groups == {"lr": 2, "bs": 2}
    assert g.psi == 0.0
    gap[3] = 5.0
    assert _stats.kendall_tau_a(mu, gap) == pytest.approx(2 / 3, abs=1e-15)
    assert _stats.kendall_tau(mu, gap).tau == pytest.approx(2 / 3, abs=1e-15)
    g = _stats.granulated_tau(mu, gap, settings, ["lr", "bs"])
    assert g.per_axis == {"lr": 1.0, "bs": 1.0}
    assert g.psi == 1.0


def test_tau_a_three_values_and_ties_by_hand():
    """(1,2,3) vs (2,1,3): pairs -, +, + -> 1/3; ties count 0: (1,1,2) vs (1,2,3) -> (0+1+1)/3."""
    assert _stats.kendall_tau_a([1, 2, 3], [2, 1, 3]) == pytest.approx(1 / 3, abs=1e-15)
    assert _stats.kendall_tau_a([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / 3, abs=1e-15)
    assert _stats.kendall_tau_a([5, 5, 5], [1, 2, 3]) == 0.0
    assert math.isnan(_stats.kendall_tau_a([1.0], [2.0]))
    assert math.isnan(_stats.kendall_tau_a([1.0, math.nan], [2.0, 3.0]))


def _grid(seeds=(0, 1, 2, 3)):
    """A 3 x 3 x 3 grid (lr, width, N) times seeds, in that order."""
    return [
        {"lr": lr, "width": w, "N": n, "seed": s}
        for lr, w, n, s in itertools.product((1e-3, 3e-3, 1e-2), (8, 16, 32), (64, 128, 256), seeds)
    ]


def _reference_psi(mu, gap, settings, axes):
    """psi_i by brute force: for each pair of models of one group, the sign product."""
    out = {}
    for axis in axes:
        others = [k for k in settings[0] if k != axis]
        groups = {}
        for i, s in enumerate(settings):
            groups.setdefault(tuple(s[k] for k in others), []).append(i)
        taus = []
        for members in groups.values():
            n = len(members)
            total = sum(
                np.sign(mu[i] - mu[j]) * np.sign(gap[i] - gap[j])
                for i in members for j in members if i != j
            )  # fmt: skip
            taus.append(total / (n * (n - 1)))
        out[axis] = float(np.mean(taus))
    return out


def test_psi_against_brute_force_on_a_grid():
    settings = _grid()
    rng = np.random.default_rng(7)
    gap = rng.normal(size=len(settings))
    mu = gap + rng.normal(scale=1.0, size=len(settings))
    axes = ["lr", "width", "N"]
    g = _stats.granulated_tau(mu, gap, settings, axes)
    ref = _reference_psi(mu, gap, settings, axes)
    for axis in axes:
        assert g.per_axis[axis] == pytest.approx(ref[axis], abs=1e-12)
        assert g.num_groups[axis] == 9 * 4
    assert g.psi == pytest.approx(np.mean(list(ref.values())), abs=1e-12)


def test_planted_measure_gives_one_and_a_reversed_one_minus_one():
    settings = _grid()
    gap = np.random.default_rng(3).permutation(len(settings)) / 10.0  # distinct gaps
    axes = ["lr", "width", "N"]
    for measure, sign in ((gap, 1.0), (np.exp(gap) + 2.0, 1.0), (-3.0 * gap, -1.0)):
        assert _stats.kendall_tau(measure, gap).tau == pytest.approx(sign, abs=1e-12)
        assert _stats.kendall_tau_a(measure, gap) == pytest.approx(sign, abs=1e-12)
        g = _stats.granulated_tau(measure, gap, settings, axes)
        assert g.psi == pytest.approx(sign, abs=1e-12)
        assert all(v == pytest.approx(sign, abs=1e-12) for v in g.per_axis.values())
        err = _stats.sign_error(measure, gap, settings, axes)
        assert err.worst == (0.0 if sign > 0 else 1.0)


def test_random_measure_gives_small_tau_and_psi():
    """Independent of the gap: |tau| within 4 null standard deviations, |Psi| likewise."""
    settings = _grid()
    rng = np.random.default_rng(11)
    gap = rng.normal(size=len(settings))
    measure = rng.normal(size=len(settings))
    n = len(settings)
    sd_tau = math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))
    assert abs(_stats.kendall_tau(measure, gap).tau) < 4 * sd_tau
    g = _stats.granulated_tau(measure, gap, settings, ["lr", "width", "N"])
    # a group of 3 has null variance 2 (2*3 + 5) / (9*3*2) = 22/54; 36 groups per axis, 3 axes
    sd_psi = math.sqrt(22 / 54 / 36 / 3)
    assert abs(g.psi) < 4 * sd_psi


def test_tau_a_equals_scipy_tau_b_without_ties():
    rng = np.random.default_rng(5)
    for _ in range(5):
        x, y = rng.normal(size=30), rng.normal(size=30)
        assert _stats.kendall_tau_a(x, y) == pytest.approx(stats.kendalltau(x, y).statistic,
                                                           abs=1e-12)  # fmt: skip


# ------------------------------------------------------------------------------ sign error

# Configurations A, B, C (lr = 1, 2, 3 at bs = 1) and D (lr = 1, bs = 2), seeds 0 and 1:
# (config, seed) -> (measure, gap).
SIGN = {
    ("A", 0): (1, 1), ("A", 1): (1, 2),
    ("B", 0): (2, 2), ("B", 1): (3, 1),
    ("C", 0): (0, 3), ("C", 1): (5, 0),
    ("D", 0): (1, 0), ("D", 1): (2, 2),
}  # fmt: skip
CONFIGS = {"A": (1, 1), "B": (2, 1), "C": (3, 1), "D": (1, 2)}


def _sign_table():
    keys = list(SIGN)
    settings = [{"lr": CONFIGS[c][0], "bs": CONFIGS[c][1], "seed": s} for c, s in keys]
    mu = [SIGN[k][0] for k in keys]
    gap = [SIGN[k][1] for k in keys]
    return keys, settings, mu, gap


def test_sign_error_enumerated():
    """Environments (configurations one axis apart) and their errors, enumerated by hand.

    lr axis (bs = 1): (A,B): seed 0 (-)(-) -> 0, seed 1 (-)(+) -> 1: 1/2; (A,C): (+)(-) -> 1,
    (-)(+) -> 1: 1; (B,C): (+)(-) -> 1, (-)(+) -> 1: 1.  bs axis (lr = 1): (A,D): seed 0
    measure tie -> 1/2, seed 1 gap tie -> 1/2: 1/2.  B-D and C-D differ in two axes: no
    environment.  Worst 1, mean 3/4, 90th percentile of (1/2, 1, 1, 1/2) = 1.
    """
    _, settings, mu, gap = _sign_table()
    err = _stats.sign_error(mu, gap, settings, ["lr", "bs"])
    assert err.num_environments == 4
    assert err.worst == 1.0
    assert err.mean == pytest.approx(0.75, abs=1e-15)
    assert err.p90 == pytest.approx(np.quantile([0.5, 1, 1, 0.5], 0.9), abs=1e-15)
    assert err.per_axis == {"lr": 1.0, "bs": 0.5}
    assert err.worst_environment.startswith("lr: 1 -> 3")


def test_sign_error_environment_names_only_the_axes_a_model_has():
    """Two families: the other family's axes (None) are left out of the environment's name."""
    settings = [{"a:lr": lr, "a:bs": 4, "b:lr": None, "family": "a", "seed": s}
                for lr in (1, 2) for s in (0, 1)]  # fmt: skip
    # seed 0: measure 1 -> 2, gap 1 -> 2 (right, 0); seed 1: 2 -> 1, 1 -> 2 (wrong, 1): 1/2
    err = _stats.sign_error([1, 2, 2, 1], [1, 1, 2, 2], settings, ["a:lr", "a:bs", "b:lr"])
    assert err.num_environments == 1
    assert err.worst == 0.5
    assert err.worst_environment == "a:lr: 1 -> 2 (a:bs=4)"


def test_sign_error_weights_and_threshold_enumerated():
    """Seed-0 pairs weigh 2, seed-1 pairs 1: (A,B) (2*0 + 1)/3, (A,C) 1, (B,C) 1, (A,D) 1/2.

    With seed-1 pairs weighing 0 and min_weight 1.5 (every environment weighs 2): (A,B) 0,
    (A,C) 1, (B,C) 1, (A,D) 1/2; with min_weight 2 every environment is left out.
    """
    keys, settings, mu, gap = _sign_table()
    seed = [k[1] for k in keys]
    err = _stats.sign_error(mu, gap, settings, ["lr", "bs"],
                            pair_weight=lambda i, j: 2.0 if seed[i] == 0 else 1.0)  # fmt: skip
    assert err.mean == pytest.approx((1 / 3 + 1 + 1 + 0.5) / 4, abs=1e-15)
    err = _stats.sign_error(mu, gap, settings, ["lr", "bs"], min_weight=1.5,
                            pair_weight=lambda i, j: 2.0 * (seed[i] == 0))  # fmt: skip
    assert err.mean == pytest.approx(2.5 / 4, abs=1e-15)
    assert err.per_axis == {"lr": 1.0, "bs": 0.5}
    none = _stats.sign_error(mu, gap, settings, ["lr", "bs"], min_weight=2.0,
                             pair_weight=lambda i, j: 2.0 * (seed[i] == 0))  # fmt: skip
    assert none.num_environments == 0
    assert math.isnan(none.worst)


def test_pair_weights_closed_forms():
    w = _stats.hoeffding_weight([0.0, 0.1, -0.1, 0.02], num_test=1000, loss_range=1.0)
    expected = [0.0, 1 - 2 * math.exp(-5.0), 1 - 2 * math.exp(-5.0), 0.0]
    assert w == pytest.approx(expected, abs=1e-15)
    assert _stats.hoeffding_weight(0.2, num_test=50, loss_range=2.0) == pytest.approx(
        max(0.0, 1 - 2 * math.exp(-50 * 0.04 / 8)), abs=1e-15
    )
    w = _stats.normal_weight([0.0, 0.1, -0.2, 0.3], [0.1, 0.1, 0.1, 0.0])
    assert w == pytest.approx([0.0, math.erf(1 / math.sqrt(2)), math.erf(2 / math.sqrt(2)), 1.0],
                              abs=1e-15)  # fmt: skip


# ------------------------------------------------------------------------------- bootstrap


def test_seed_bootstrap_replays_its_draws():
    """The interval is the percentile interval of the statistic on the documented draws."""
    seeds = [0, 0, 1, 1, 2, 2, 5, 5]
    values = {0: 1.0, 1: 2.0, 2: 4.0, 5: 8.0}

    def mean_of(drawn):
        return float(np.mean([values[s] for s in drawn]))

    got = _stats.seed_bootstrap(seeds, mean_of, num_resamples=300, confidence=0.9, rng_seed=4)
    rng = np.random.default_rng(4)
    labels = [0, 1, 2, 5]
    ref = [mean_of([labels[k] for k in rng.integers(0, 4, size=4)]) for _ in range(300)]
    assert (got.low, got.high) == tuple(np.quantile(ref, [0.05, 0.95]))
    assert got.num_resamples == 300
    assert got.confidence == 0.9
    again = _stats.seed_bootstrap(seeds, mean_of, num_resamples=300, confidence=0.9, rng_seed=4)
    assert again == got


def test_resampled_psi_equals_psi_of_the_duplicated_models():
    """Granulated.resampled(drawn) is Psi of the resample built model by model."""
    settings = _grid(seeds=(0, 1, 2))
    rng = np.random.default_rng(2)
    gap = rng.normal(size=len(settings))
    mu = gap + rng.normal(size=len(settings))
    axes = ["lr", "width", "N"]
    g = _stats.granulated_tau(mu, gap, settings, axes, seed_key="seed")
    assert g.resampled([0, 1, 2]) == pytest.approx(g.psi, abs=1e-12)
    for drawn in ([0, 0, 2], [1, 1, 1], [2, 0, 0]):
        index, copy = _stats.resample_index([s["seed"] for s in settings], drawn)
        relabelled = [{**settings[i], "seed": int(c)} for i, c in zip(index, copy, strict=True)]
        direct = _stats.granulated_tau(mu[index], gap[index], relabelled, axes)
        assert g.resampled(drawn) == pytest.approx(direct.psi, abs=1e-12)


def test_resample_index():
    index, copy = _stats.resample_index(["a", "b", "a"], ["a", "a", "b"])
    assert index.tolist() == [0, 2, 0, 2, 1]
    assert copy.tolist() == [0, 0, 1, 1, 2]


# ------------------------------------------------------------------------------ bad inputs


def test_bad_arguments_raise():
    settings, mu, gap = _table()
    with pytest.raises(ValueError, match="differ in size"):
        _stats.granulated_tau(mu[:3], gap, settings, ["lr"])
    with pytest.raises(ValueError, match="settings: expected 4"):
        _stats.granulated_tau(mu, gap, settings[:3], ["lr"])
    with pytest.raises(ValueError, match="axes"):
        _stats.granulated_tau(mu, gap, settings, [])
    with pytest.raises(ValueError, match="'depth' is not a key"):
        _stats.granulated_tau(mu, gap, settings, ["depth"])
    with pytest.raises(ValueError, match="1-D"):
        _stats.kendall_tau_a([[1, 2]], [[1, 2]])
    with pytest.raises(ValueError, match="pair_weight"):
        _stats.sign_error(mu, gap, settings, ["lr"], pair_weight=lambda i, j: -1.0)
    with pytest.raises(ValueError, match="min_weight"):
        _stats.sign_error(mu, gap, settings, ["lr"], min_weight=-1.0)
    with pytest.raises(ValueError, match="'seed' is not a key"):
        _stats.sign_error(mu, gap, [{"lr": 1, "bs": 1}] * 4, ["lr"])
    with pytest.raises(ValueError, match="num_test"):
        _stats.hoeffding_weight(0.1, num_test=0)
    with pytest.raises(ValueError, match="loss_range"):
        _stats.hoeffding_weight(0.1, num_test=10, loss_range=math.nan)
    with pytest.raises(ValueError, match="stderr"):
        _stats.normal_weight(0.1, -1.0)
    with pytest.raises(ValueError, match="num_resamples"):
        _stats.seed_bootstrap([0], lambda d: 0.0, num_resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        _stats.seed_bootstrap([0], lambda d: 0.0, confidence=1.0)
    with pytest.raises(ValueError, match="seeds"):
        _stats.seed_bootstrap([], lambda d: 0.0)
    with pytest.raises(ValueError, match="group_taus"):
        _stats.granulated_tau(mu, gap, settings, ["lr"]).resampled([0])
