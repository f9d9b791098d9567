"""Null baselines: seeded, and the gap+noise null needs the gap's standard error."""

import numpy as np
import pytest

from jaxbounds.study.nulls import Summary, null_draws
from jaxbounds.study.ranking import tau_a


def test_draws_follow_the_documented_generator():
    gap = np.linspace(0.0, 1.0, 6)
    se = np.full(6, 0.01)
    out = null_draws(gap, se, lambda m, k: {"tau": tau_a(m, gap)}, num_samples=3, rng_seed=7)
    rng = np.random.default_rng(7)
    expected_random, expected_noise = [], []
    for _ in range(3):
        r, z = rng.standard_normal(6), rng.standard_normal(6)
        expected_random.append(tau_a(np.exp(r), gap))
        expected_noise.append(tau_a(gap + se * z, gap))
    assert out["random"].stats["tau"].values == tuple(expected_random)
    assert out["gap+noise"].stats["tau"].values == tuple(expected_noise)
    assert out["gap+noise"].stats["tau"].mean == 1.0  # noise far below the gap's spacing


def test_gap_plus_noise_needs_a_standard_error():
    out = null_draws(np.arange(3.0), None, lambda m, k: {"x": 0.0}, num_samples=2, rng_seed=0)
    assert out["gap+noise"].num_samples == 0
    assert out["gap+noise"].note


def test_summary_percentiles():
    s = Summary.of(list(np.arange(101.0)))
    assert (s.low, s.median, s.high, s.mean) == (2.5, 50.0, 97.5, 50.0)


def test_bad_num_samples():
    with pytest.raises(ValueError, match="num_samples"):
        null_draws(np.arange(3.0), None, lambda m, k: {}, num_samples=0, rng_seed=0)


@pytest.mark.parametrize("k", [39, 40, 100])
def test_beyond_has_its_level_over_every_rank(k):
    # A value that is itself a draw of the null has each of the k + 1 ranks with probability
    # 1 / (k + 1): the rank test calls it beyond for at most 5% of the ranks.
    from jaxbounds.study.nulls import beyond

    draws = Summary.of(list(np.arange(float(k))))
    calls = [beyond(r - 0.5, draws) for r in range(k + 1)]
    assert None not in calls
    expected = {39: 2, 40: 2, 100: 4}[k]  # ranks with 2 min(...) / (k + 1) <= 0.05
    assert sum(calls) == expected
    assert sum(calls) / (k + 1) <= 0.05


def test_beyond_needs_39_draws():
    from jaxbounds.study.nulls import beyond

    assert beyond(100.0, Summary.of(list(np.arange(38.0)))) is None
    assert beyond(100.0, Summary.of(list(np.arange(39.0)))) is True
