"""Dziugaite et al.'s robust sign error on cases small enough to do by hand."""

import math

import numpy as np
import pytest

from jaxbounds.study import environments, hoeffding_weight, robust_sign_error, size_adjusted


def test_hoeffding_weight_is_their_formula():
    # common.hoeffding_weight: max(0, 1 - 2 exp(-2 n (d/2)^2))^2
    d, n = 0.05, 1000
    expected = max(0.0, 1 - 2 * math.exp(-2 * n * (d / 2) ** 2)) ** 2
    assert float(hoeffding_weight(d, n)) == pytest.approx(expected, rel=1e-14)
    assert float(hoeffding_weight(0.0, n)) == 0.0
    assert float(hoeffding_weight(0.1, 100, loss_range=2.0)) == pytest.approx(
        float(hoeffding_weight(0.05, 100)), rel=1e-14
    )


@pytest.mark.parametrize(("kwargs", "name"), [({"num_test": 0}, "num_test"),
                                              ({"num_test": 10, "loss_range": 0.0},
                                               "loss_range")])  # fmt: skip
def test_hoeffding_weight_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        hoeffding_weight(0.1, **kwargs)


def test_environments_differ_in_exactly_one_axis():
    env = environments([(1, 1), (2, 1), (2, 2), (1, 2), (1, 1)], ["lr", "bs"])
    assert env == [("lr", (1, 1), (2, 1)), ("bs", (1, 1), (1, 2)), ("bs", (2, 1), (2, 2)),
                   ("lr", (2, 2), (1, 2))]  # fmt: skip


def test_sign_error_by_hand_every_seed_with_every_seed():
    # Two settings lr=1 (models 0, 1) and lr=2 (models 2, 3); every cross pair counts.
    mu = [1.0, 2.0, 3.0, 0.0]
    gap = [0.0, 0.1, 0.5, 0.6]
    configs = [(1,), (1,), (2,), (2,)]
    n = 100
    r = robust_sign_error(mu, gap, configs, ["lr"], n, min_ess=1.0)
    pairs = [(0, 2), (0, 3), (1, 2), (1, 3)]
    num = den = 0.0
    for i, j in pairs:
        d = abs(gap[i] - gap[j])
        h = max(0.0, 1 - 2 * math.exp(-2 * n * (d / 2) ** 2)) ** 2
        w = h - 0.5 if h > 0.5 else 0.0
        e = (1 - np.sign(mu[i] - mu[j]) * np.sign(gap[i] - gap[j])) / 2
        num, den = num + w * e, den + w
    # pairs (0,2) right, (0,3) wrong, (1,2) right, (1,3) wrong: the weight of the wrong ones
    assert r.per_axis["lr"] == (pytest.approx(num / den, abs=1e-15),)
    assert 0.4 < r.worst < 0.6
    assert r.worst == r.mean
    assert r.worst_environment == "lr: 1 -> 2"


def test_sign_error_effective_sample_size_filter():
    mu, gap = [1.0, 2.0], [0.0, 1.0]
    configs = [(1,), (2,)]
    # one pair: ESS = 1 < 12 -> dropped; with min_ess = 1 it stays
    r = robust_sign_error(mu, gap, configs, ["lr"], 1000)
    assert r.num_environments == 0
    assert r.num_dropped == {"lr": 1}
    assert math.isnan(r.worst)
    assert "effective sample size" in r.note
    assert robust_sign_error(mu, gap, configs, ["lr"], 1000, min_ess=1.0).worst == 0.0


def test_sign_error_tie_in_measure_is_one_half_and_noise_filter_off():
    r = robust_sign_error([1.0, 1.0], [0.0, 1.0], [(1,), (2,)], ["lr"], None, min_ess=1.0)
    assert r.worst == 0.5


def test_sign_error_per_axis_distribution():
    # 2 x 2 design, one model each, no noise filter (weights 1), min_ess 1:
    configs = [(1, 1), (2, 1), (1, 2), (2, 2)]
    gap = [0.0, 1.0, 2.0, 3.0]
    mu = [0.0, 1.0, 3.0, 2.0]
    r = robust_sign_error(mu, gap, configs, ["lr", "bs"], None, min_ess=1.0)
    # lr envs: (1,1)-(2,1) right 0; (1,2)-(2,2) wrong 1. bs envs: (1,1)-(1,2) right; (2,1)-(2,2)
    assert sorted(r.per_axis["lr"]) == [0.0, 1.0]
    assert r.per_axis["bs"] == (0.0, 0.0)
    # their 90th percentile is on the list with each environment twice: [0, 0, 1, 1] -> 1.0
    assert r.axis_summary("lr") == (0.5, 1.0, 1.0)
    assert r.p90 == 1.0  # all four [0, 1, 0, 0] doubled: position 6.3 of 0..7 -> 1.0
    assert r.worst == 1.0
    assert r.mean == 0.25


def test_size_adjustment_is_their_adjust_measure():
    assert size_adjusted([8.0], [2.0], log_scale=False).tolist() == [2.0]
    assert size_adjusted([3.0], [math.exp(1.0)], log_scale=True).tolist() == [1.0]
    assert math.isnan(float(size_adjusted([-1.0], [2.0], log_scale=False)[0]))
