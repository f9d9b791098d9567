"""The seed bootstrap: few resamples are said, one seed gives no interval."""

import math

import numpy as np
import pytest

from jaxbounds.study.bootstrap import (
    distinct_resamples,
    seed_interval,
    seed_resamples,
    tau_weighted,
)
from jaxbounds.study.ranking import signs, tau_a


def test_distinct_resamples_is_the_multiset_count():
    # enumerate multisets of k draws from k seeds for small k
    import itertools

    for k in (1, 2, 3, 4):
        count = len(set(itertools.combinations_with_replacement(range(k), k)))
        assert distinct_resamples(k) == count


def test_one_seed_has_no_interval():
    r = seed_interval([0, 0], lambda c: 1.0, seed_resamples([0], num_resamples=5, rng_seed=0))
    assert math.isnan(r.low)
    assert "1 seed" in r.note


def test_few_resamples_are_flagged():
    seeds = [0, 1, 2, 3]
    r = seed_interval(seeds, lambda c: float(c.get(0, 0)),
                      seed_resamples(seeds, num_resamples=200, rng_seed=1))  # fmt: skip
    assert r.distinct_resamples == 35
    assert "35 distinct" in r.note
    assert r.low == 0.0
    assert r.high >= 2.0


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
