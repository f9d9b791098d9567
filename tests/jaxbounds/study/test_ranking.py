"""Kendall's tau (Jiang's eq. 3) and the granulated Psi against hand-computed cases."""

import math

import numpy as np
import pytest
from scipy import stats

from jaxbounds.study import granulated_psi, kendall, psi_groups, tau_a


def test_tau_a_by_hand_with_ties():
    # pairs (i<j) of mu=[1,2,2,3], g=[1,3,2,2]: (0,1)+ (0,2)+ (0,3)+ (1,2) mu tie 0
    # (1,3) g 3>2 vs mu 2<3: - ; (2,3) g tie 0 -> sum over i<j = 3 - 1 = 2, tau = 2*2/12
    assert tau_a([1, 2, 2, 3], [1, 3, 2, 2]) == pytest.approx(4 / 12, abs=1e-15)


def test_tau_a_equals_scipy_tau_b_without_ties():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(30), rng.standard_normal(30)
    assert tau_a(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


def test_kendall_tau_b_is_scipys_with_ties():
    x, y = [1, 2, 2, 3, 4], [1, 1, 2, 3, 3]
    r = kendall(x, y)
    expected = stats.kendalltau(x, y)
    assert r.tau_b == pytest.approx(expected.statistic, abs=1e-12)
    assert r.p_value == pytest.approx(expected.pvalue, rel=1e-9)
    assert r.tau == pytest.approx(tau_a(x, y), abs=1e-15)
    assert abs(r.tau) < abs(r.tau_b)  # tau-a shrinks under ties


@pytest.mark.parametrize(
    ("mu", "g", "note"),
    [
        ([2.0, 2.0, 2.0], [1.0, 2.0, 3.0], "the measure is constant"),
        ([1.0, 2.0, 3.0], [5.0, 5.0, 5.0], "the gap is constant"),
        ([1.0], [1.0], "one model: needs two"),
        ([], [], "no values"),
        ([1.0, math.nan], [1.0, 2.0], "NaN values"),
    ],
)
def test_kendall_is_na_with_a_reason(mu, g, note):
    r = kendall(mu, g)
    assert math.isnan(r.tau)
    assert math.isnan(r.tau_b)
    assert r.note == note


def test_psi_by_hand_two_axes_two_seeds():
    # 2 x 2 design (lr, bs) with 2 seeds: 8 models.
    configs = [(lr, bs) for _ in (0, 1) for lr in (1, 2) for bs in (1, 2)]
    seeds = [s for s in (0, 1) for _ in range(4)]
    gap = [1, 2, 3, 4, 1, 2, 3, 4]
    mu = [1, 2, 4, 3, 2, 1, 3, 4]
    groups = psi_groups(configs, seeds, ["lr", "bs"])
    assert [len(groups[a]) for a in ("lr", "bs")] == [4, 4]
    r = granulated_psi(mu, gap, groups, seeds)
    # lr groups (bs fixed, seed fixed): seed0 bs1 models 0,2: mu 1<4, g 1<3 -> +1;
    # seed0 bs2 models 1,3: mu 2<3, g 2<4 -> +1; seed1 bs1 4,6: 2<3 +1; seed1 bs2 5,7: 1<4 +1
    assert r.per_axis["lr"] == 1.0
    # bs groups: seed0 lr1 (0,1): mu 1<2 g 1<2 +1; seed0 lr2 (2,3): mu 4>3 g 3<4 -1;
    # seed1 lr1 (4,5): 2>1 vs 1<2 -1; seed1 lr2 (6,7): 3<4 +1 -> mean 0
    assert r.per_axis["bs"] == 0.0
    assert r.psi == 0.5
    assert r.num_groups == {"lr": 4, "bs": 4}
    # a resample of seed 0 twice (models 0-3): lr 1, bs (1 - 1)/2 = 0 -> 0.5
    assert r.resampled(np.array([[2.0] * 4 + [0.0] * 4]))[0] == 0.5


def test_psi_leaves_out_an_axis_with_one_value():
    configs = [(1, 7), (2, 7), (3, 7)]
    groups = psi_groups(configs, [0, 0, 0], ["lr", "width"])
    assert groups["width"] == []
    r = granulated_psi([3, 2, 1], [1, 2, 3], groups, [0, 0, 0])
    assert r.per_axis["lr"] == -1.0
    assert math.isnan(r.per_axis["width"])
    assert r.psi == -1.0


def test_psi_one_group_constant_measure_scores_zero_there():
    groups = psi_groups([(1,), (2,)], [0, 0], ["lr"])
    r = granulated_psi([5.0, 5.0], [1.0, 2.0], groups, [0, 0])
    assert r.per_axis == {"lr": 0.0}


def test_the_study_floor_imports_nothing_of_the_experiments():
    import subprocess
    import sys

    code = (
        "import sys, jaxbounds.study, jaxbounds.study.report, jaxbounds.study._cli; "
        "print(sorted(m for m in sys.modules if m.startswith('jaxbounds.experiments')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
