"""Jiang et al.'s conditional mutual information against a hand computation."""

import math

import pytest

from jaxbounds.study import conditional_mutual_information


def test_measure_equal_to_gap_has_normalised_information_one():
    configs = [(1, 1), (1, 2), (2, 1), (2, 2)]
    c = conditional_mutual_information([1, 2, 3, 4], [1, 2, 3, 4], configs, ["lr", "bs"])
    assert c.by_size[0] == pytest.approx(1.0, abs=1e-12)
    assert c.by_size[1] == pytest.approx(1.0, abs=1e-12)


def test_measure_that_rides_on_one_axis_loses_its_information():
    # gap = lr + small bs effect; measure = lr only. Given lr (U = (lr_i, lr_j)), the measure
    # is constant within each lr value pair where lr_i == lr_j, informative otherwise.
    configs = [(1, 1), (1, 2), (2, 1), (2, 2)]
    gap = [1.0, 1.5, 3.0, 3.5]
    mu = [1.0, 1.0, 2.0, 2.0]
    c = conditional_mutual_information(mu, gap, configs, ["lr", "bs"])
    # By hand, unconditional: ordered pairs 12; V_g = sign of gap difference, never 0.
    # V_mu = 0 on the 4 same-lr pairs (V_g +-1 evenly there), = V_g on the 8 others.
    # I(V_mu; V_g) = H(V_g) - H(V_g | V_mu) = ln2 - (4/12) ln2 = (2/3) ln 2; H(V_g) = ln 2.
    assert c.by_size[0] == pytest.approx(2 / 3, abs=1e-12)
    # Given lr: within U=(a, a) V_mu is constant (I = 0); within U=(1,2) or (2,1) V_g is
    # constant (H = 0) -> I(V_mu; V_g | U_lr) = 0.
    assert c.per_set[("lr",)] == pytest.approx(0.0, abs=1e-12)
    assert c.by_size[1] == pytest.approx(0.0, abs=1e-12)
    assert c.argmin[1] == ("lr",)


def test_undefined_when_the_gap_sign_is_known_from_the_condition():
    c = conditional_mutual_information([1, 2, 3], [1, 2, 3], [(1,), (2,), (3,)], ["lr"])
    assert math.isnan(c.per_set[("lr",)])
    assert math.isnan(c.by_size[1])
