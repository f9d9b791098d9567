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
    # By hand, unconditional: 12 ordered pairs; V = +1 iff strictly greater (a tie is -1).
    # V_mu = +1 on the 4 pairs (lr 2, lr 1), all with V_g = +1; V_mu = -1 on the other 8, with
    # V_g = +1 on 2 of them (same lr, larger bs). H(V_g) = ln 2,
    # H(V_g | V_mu) = (8/12) H(1/4), so I / H(V_g) = 1 - (2/3) H(1/4) / ln 2.
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert c.by_size[0] == pytest.approx(1 - (2 / 3) * h / math.log(2), abs=1e-12)
    # Given lr: within U=(a, a) V_mu is constant -1 (I = 0); within U=(1,2) or (2,1) V_g is
    # constant (H = 0) -> I(V_mu; V_g | U_lr) = 0.
    assert c.per_set[("lr",)] == pytest.approx(0.0, abs=1e-12)
    assert c.by_size[1] == pytest.approx(0.0, abs=1e-12)
    assert c.argmin[1] == ("lr",)


def test_undefined_when_the_gap_sign_is_known_from_the_condition():
    c = conditional_mutual_information([1, 2, 3], [1, 2, 3], [(1,), (2,), (3,)], ["lr"])
    assert math.isnan(c.per_set[("lr",)])
    assert math.isnan(c.by_size[1])
