"""Section ``rademacher`` against closed forms, an independent Monte Carlo and McDiarmid widths."""

import math

import numpy as np
import pytest

from jaxbounds.report.sections import rademacher_section
from jaxbounds.report.sections.rademacher import RademacherSizes

SIZES = RademacherSizes(
    search_draws=4, search_steps=5, search_restarts=1, search_chunk=2, linear_draws=2048
)


@pytest.fixture(scope="module")
def rows(scalar_run):
    return {r.name: r for r in rademacher_section(scalar_run, sizes=SIZES)}


def _halfwidth(bound, m, draws, delta=0.05):
    return 2 * bound * math.sqrt(math.log(2 / delta) / (2 * m * draws))


def test_search_lower_bound(scalar_run, rows):
    row = rows["Rad_S lower bound (search, trained-norm ball)"]
    b = float(np.linalg.norm(np.asarray(scalar_run.params["w"], np.float64)))
    m = 40
    assert 0.0 <= row.value <= b  # |f| <= ||w||_2 = b on the ball, so Rad_S <= b
    assert row.stderr >= 0
    assert row.lower == pytest.approx(row.value - _halfwidth(b, m, 4), rel=1e-5)
    assert row.upper is None
    assert f"||w||_2 = {b:.4g}" in row.note
    assert "4 sign vectors x 1 starts x 5 steps, m = 40" in row.note


def test_linear_class_against_monte_carlo_and_khintchine(scalar_run, rows):
    x = np.asarray(scalar_run.train["inputs"], np.float64).reshape(40, -1)
    jensen = math.sqrt(np.sum(x**2)) / 40
    assert rows["linear class Jensen upper bound sqrt(sum ||X_i||_F^2) / m"].value == pytest.approx(
        jensen, rel=1e-6
    )
    row = rows["Rad_S linear class {<W, X>_F : ||W||_F <= 1} on the inputs"]
    rng = np.random.default_rng(0)
    signs = rng.choice([-1.0, 1.0], size=(20000, 40))
    sups = np.linalg.norm(signs @ x, axis=1) / 40  # the dual norm gives the exact sup
    assert abs(row.value - sups.mean()) <= 5 * math.hypot(row.stderr, sups.std() / math.sqrt(2e4))
    assert jensen / math.sqrt(2) - 5 * row.stderr <= row.value <= jensen + 5 * row.stderr
    width = _halfwidth(np.linalg.norm(x, axis=1).max(), 40, 2048)
    assert row.upper - row.value == pytest.approx(width, rel=1e-5)
    assert row.value - row.lower == pytest.approx(width, rel=1e-5)
