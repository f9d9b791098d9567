"""The ``property-testing`` reproduction at smoke scale: files, statistics, one unit by hand.

One smoke run (T = 6, degrees {1, 3}, sparsity 3, eps {0.1, 0.01}, 2 functions) is shared by the
tests. The statistics of ``report.md`` / ``statistics.json`` are recomputed from ``results.csv``
with the standard library; one unit's function is evaluated directly on the whole cube, its
degree and sparsity recomputed with a dense Hadamard matrix in numpy, and its first accepted
degree checked against the exact one-trial rejection rates (enumeration).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics as pystats
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxbounds.data.boolean import random_fourier_function
from jaxbounds.experiments import property_testing as pt
from jaxbounds.experiments.runner import Unit, format_number
from kernels import testers
from tests.helpers import read_rows, run_smoke

pytestmark = pytest.mark.slow  # one smoke run: ~30 CPU s (about 20 testers compiled)

INTS = ("num_bits", "degree", "sparsity", "seed", "true_degree", "true_sparsity", "num_trials",
        "first_degree", "first_sparsity", "degree_queries", "sparsity_queries")  # fmt: skip


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    return run_smoke(pt.EXPERIMENT, tmp_path_factory)


def _rows(run_dir: Path) -> list[dict]:
    return read_rows(run_dir, ints=INTS, floats=("eps",))


def test_files(smoke_run):
    names = {p.name for p in smoke_run.iterdir()}
    expected = {"results.csv", "summary.json", "report.md", "statistics.json", "units",
                "figure8_first_acceptance.png", "queries.png"}  # fmt: skip
    assert expected <= names
    for figure in ("figure8_first_acceptance.png", "queries.png"):
        assert (smoke_run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert summary["scale"] == "smoke"
    assert summary["num_units"] == 8 == len(_rows(smoke_run))
    report = (smoke_run / "report.md").read_text()
    assert report.count("- **") == len(pt.CLAIMS)


def test_report_statistics_recomputed_from_results_csv(smoke_run):
    rows = _rows(smoke_run)
    report = (smoke_run / "report.md").read_text()
    recorded = json.loads((smoke_run / "statistics.json").read_text())
    for tester, true, found in (("degree", "true_degree", "first_degree"),
                                ("sparsity", "true_sparsity", "first_sparsity")):  # fmt: skip
        keys = sorted({(r["eps"], r[true]) for r in rows})
        for eps, t in keys:
            values = [r[found] for r in rows if r["eps"] == eps and r[true] == t]
            got = recorded[tester][str(eps)][str(t)]
            assert got["n"] == len(values)
            assert got["mean"] == pytest.approx(pystats.mean(values))
            std = pystats.stdev(values) if len(values) > 1 else math.nan
            assert got["std"] == pytest.approx(std, nan_ok=True)
            assert got["exact"] == pytest.approx(sum(v == t for v in values) / len(values))
            assert got["below"] == pytest.approx(sum(v < t for v in values) / len(values))
            mean = format_number(pystats.mean(values), 3)
            cell = f"{mean} ± {format_number(std, 3)}" if len(values) > 1 else mean
            assert f"| {format_number(eps)} | {t} | {len(values)} | {cell} |" in report
    for eps in sorted({r["eps"] for r in rows}):
        group = [r for r in rows if r["eps"] == eps]
        short = pystats.mean(r["true_degree"] - r["first_degree"] for r in group)
        assert recorded["overall"][str(eps)]["degree_shortfall"] == pytest.approx(short)
        assert f"{short:.3g}" in report


def _hadamard_spectrum(values: np.ndarray, n: int) -> np.ndarray:
    """Walsh coefficients by a dense Hadamard matrix: hat f(S) = 2^-n sum_x f(x) (-1)^{S.x}."""
    idx = np.arange(2**n)
    parity = np.array([[bin(s & x).count("1") % 2 for x in idx] for s in idx])
    return (1 - 2 * parity) @ values / 2**n


def test_one_unit_recomputed_by_hand(smoke_run):
    """Unit (degree 3, sparsity 3, eps 0.01, seed 0): f, its degree and sparsity, the sweep."""
    cfg = {**pt.SCALES["smoke"], "degree": 3, "sparsity": 3, "eps": 0.01}
    row = next(r for r in _rows(smoke_run)
               if r["degree"] == 3 and r["eps"] == 0.01 and r["seed"] == 0)  # fmt: skip
    n = cfg["num_bits"]
    key = jax.random.fold_in(jax.random.key(0), 1000 * 3 + 3)
    fn = random_fourier_function(key, num_bits=n, degree=3, sparsity=3, normalization="centred")
    # f on every point, directly from its definition (0/1 even-parity indicators).
    points = np.array(list(itertools.product([0, 1], repeat=n)))[:, ::-1]  # x_i = bit i of index
    c = np.asarray(fn.coefficients, dtype=np.float64)
    direct = np.array([sum(ct * ((x[list(s)].sum() + 1) % 2) for ct, s in
                           zip(c, fn.subsets, strict=True)) for x in points])  # fmt: skip
    table, _ = pt.function_table(fn, n)
    np.testing.assert_allclose(np.asarray(table), direct, atol=1e-5)
    spectrum = _hadamard_spectrum(direct, n)
    nonzero = np.abs(spectrum) > 1e-6
    sizes = np.array([bin(s).count("1") for s in range(2**n)])
    assert row["true_degree"] == sizes[nonzero].max() == 3
    assert row["true_sparsity"] == nonzero.sum() == 3  # centred: no constant term
    # Exact one-trial rejection rates by enumeration: 0 at d >= 3, so the sweep never passes 3;
    # at d < 3 every rate is large enough that t trials all accept with probability < 1e-6,
    # so the first acceptance is the true degree.
    t = testers.num_trials_for(0.01, cfg["delta"])
    assert row["num_trials"] == t
    rho = [float(testers.degree_rejection_rate(direct, degree=d)) for d in range(4)]
    assert rho[3] == 0.0
    assert all((1 - r) ** t < 1e-6 for r in rho[:3])
    assert row["first_degree"] == 3
    assert float(row["rho_below_exact"]) == pytest.approx(rho[2])
    assert float(row["rho_below_exact"]) == pytest.approx(3 / math.comb(n, 3))
    assert row["degree_queries"] == t * (2 + 4 + 8 + 16)
    # The early-stopping sparsity loop equals the kernel's full sweep, never above the truth.
    _, unit_key = pt._function(cfg, 0)
    sweep = testers.sparsity_sweep(
        pt._lookup, n, jax.random.fold_in(unit_key, 2), sparsities=(1, 2, 3),
        num_restrict=cfg["num_restrict"], num_trials=t, eps=0.01, args=table,
    )  # fmt: skip
    assert row["first_sparsity"] == int(sweep.value) <= 3
    assert row["sparsity_queries"] == t * row["first_sparsity"] * 2 ** cfg["num_restrict"]


def test_run_unit_reproduces_its_row(smoke_run):
    """A unit recomputed in this process gives the stored row (seeded, deterministic)."""
    cfg = {**pt.SCALES["smoke"], "degree": 1, "sparsity": 3, "eps": 0.1}
    row = pt.run_unit(Unit(cfg, 1))
    stored = next(r for r in _rows(smoke_run)
                  if r["degree"] == 1 and r["eps"] == 0.1 and r["seed"] == 1)  # fmt: skip
    for key in ("true_degree", "true_sparsity", "first_degree", "first_sparsity",
                "degree_queries", "sparsity_queries"):  # fmt: skip
        assert row[key] == stored[key]
    assert row["true_degree"] == 1
    assert row["true_sparsity"] == 3
