"""Null baselines: seeded, and the gap+noise null needs the gap's standard error."""

import numpy as np
import pytest

from jaxbounds.study.nulls import Summary, null_draws
from jaxbounds.study.ranking import tau_a


def test_draws_follow_the_documented_generator():
    gap = np.linspace(0.0, 1.0, 6)
    se = np.full(6, 0.01)
    out = null_draws(gap, se, lambda m: {"tau": tau_a(m, gap)}, num_samples=3, rng_seed=7)
    rng = np.random.default_rng(7)
    expected_random, expected_noise = [], []
    for _ in range(3):
        r, z = rng.standard_normal(6), rng.standard_normal(6)
        expected_random.append(tau_a(r, gap))
        expected_noise.append(tau_a(gap + se * z, gap))
    assert out["random"].stats["tau"].values == tuple(expected_random)
    assert out["gap+noise"].stats["tau"].values == tuple(expected_noise)
    assert out["gap+noise"].stats["tau"].mean == 1.0  # noise far below the gap's spacing


def test_gap_plus_noise_needs_a_standard_error():
    out = null_draws(np.arange(3.0), None, lambda m: {"x": 0.0}, num_samples=2, rng_seed=0)
    assert out["gap+noise"].num_samples == 0
    assert out["gap+noise"].note


def test_summary_percentiles():
    s = Summary.of(list(np.arange(101.0)))
    assert (s.low, s.median, s.high, s.mean) == (2.5, 50.0, 97.5, 50.0)


def test_bad_num_samples():
    with pytest.raises(ValueError, match="num_samples"):
        null_draws(np.arange(3.0), None, lambda m: {}, num_samples=0, rng_seed=0)
