"""The two-way bootstrap: configurations and seeds drawn jointly, weights as documented."""

import itertools
import math

import numpy as np
import pytest

from jaxbounds.study.bootstrap import (
    distinct_resamples,
    interval,
    tau_resampled,
    tau_weighted,
    two_way_resamples,
)
from jaxbounds.study.ranking import granulated_psi, psi_groups, signs, tau_a


def test_distinct_resamples_is_the_multiset_count():
    for k in (1, 2, 3, 4):
        count = len(set(itertools.combinations_with_replacement(range(k), k)))
        assert distinct_resamples(k) == count


def test_weights_follow_the_documented_draws():
    configs = [("a",), ("b",), ("c",), ("a",), ("b",), ("c",)]
    seeds = [0, 0, 0, 1, 1, 1]
    r = two_way_resamples(configs, seeds, num_resamples=5, rng_seed=3)
    rng = np.random.default_rng(3)
    for row in r.weights:
        a = np.bincount(rng.integers(0, 3, size=3), minlength=3)
        b = np.bincount(rng.integers(0, 2, size=2), minlength=2)
        assert row.tolist() == [a[c] * b[s] for c, s in zip([0, 1, 2] * 2, seeds, strict=True)]
    assert r.distinct == 10 * 3


def test_one_model_has_no_interval_and_few_resamples_are_flagged():
    r = two_way_resamples([("a",)], [0], num_resamples=5, rng_seed=0)
    assert math.isnan(interval(np.ones(5), r).low)
    r = two_way_resamples([1, 2, 1, 2], [0, 0, 1, 1], num_resamples=200, rng_seed=1)
    iv = interval(r.weights[:, 0], r)
    assert iv.distinct_resamples == 9
    assert "9 distinct" in iv.note
    assert (iv.low, iv.high) == (0.0, 4.0)


def test_weighted_tau_with_unit_weights_is_tau_a():
    rng = np.random.default_rng(3)
    mu, g = rng.standard_normal(7), rng.standard_normal(7)
    pairs = signs(mu).astype(np.int64) * signs(g)
    assert tau_weighted(pairs, np.ones(7)) == pytest.approx(tau_a(mu, g), abs=1e-14)


def test_weighted_tau_counts_copies_but_never_a_model_with_itself():
    mu, g = np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0])
    pairs = signs(mu).astype(np.int64) * signs(g)
    # model 0 drawn twice: copies pair with 1 and 2 twice, (1,2) once, (0,0') never
    # ordered sum: 2*2*(+1) [0-1] + 2*2*(+1) [0-2] + 2*(-1) [1-2] = 6 over 4*4 - 6 = 10 pairs
    assert tau_weighted(pairs, np.array([2.0, 1.0, 1.0])) == pytest.approx(6 / 10, abs=1e-15)


def test_resampled_tau_is_tau_of_the_resample_built_model_by_model():
    rng = np.random.default_rng(5)
    configs = [(lr,) for _ in range(3) for lr in (1, 2, 3, 4)]
    seeds = [s for s in range(3) for _ in range(4)]
    mu, g = rng.standard_normal(12), rng.standard_normal(12)
    r = two_way_resamples(configs, seeds, num_resamples=20, rng_seed=2)
    got = tau_resampled(signs(mu).astype(float) * signs(g), r.weights)
    for w, value in zip(r.weights, got, strict=True):
        # the resample as a list of models, each copy a distinct model (copies never pair)
        copies = np.repeat(np.arange(12), w.astype(int))
        if copies.size < 2:
            assert math.isnan(value)
            continue
        s = signs(mu[copies]) * signs(g[copies])
        same = copies[:, None] == copies[None, :]
        expected = s[~same].sum() / (~same).sum()
        assert value == pytest.approx(expected, abs=1e-12)


def test_resampled_psi_with_unit_weights_is_psi():
    rng = np.random.default_rng(6)
    configs = [(lr, bs) for _ in range(2) for lr in (1, 2, 3) for bs in (8, 16)]
    seeds = [s for s in range(2) for _ in range(6)]
    mu, g = rng.standard_normal(12), rng.standard_normal(12)
    groups = psi_groups(configs, seeds, ["lr", "bs"])
    p = granulated_psi(mu, g, groups, seeds)
    assert p.resampled(np.ones((1, 12)))[0] == pytest.approx(p.psi, abs=1e-14)
    # one seed drawn twice: Psi of that seed's groups alone
    only0 = granulated_psi(mu[:6], g[:6], psi_groups(configs[:6], seeds[:6], ["lr", "bs"]),
                           seeds[:6])  # fmt: skip
    w = np.array([[2.0] * 6 + [0.0] * 6])
    assert p.resampled(w)[0] == pytest.approx(only0.psi, abs=1e-14)
