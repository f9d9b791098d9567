"""The ``spectrum-adaptive`` reproduction: proxies in numpy, brute-force p, closed-form fits.

Fast tests (default run): both proxies of a random 3-layer BlockTransformer recomputed with
the formula of SPEC.md section 6 written out in numpy (SVDs), the chosen p of every matrix
against a brute-force minimum over the grid, the growth-rate fit against the closed-form
least-squares slope, and the per-matrix ranks. Slow: one smoke run end to end, one unit
retrained and its row recomputed in numpy, and the report's slopes recomputed from
``results.csv``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics as pystats
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jaxbounds.experiments import spectrum_adaptive as sa
from jaxbounds.experiments.runner import run_experiment
from jaxbounds.models import as_pure
from jaxbounds.models.block import GELU_LIPSCHITZ, BlockTransformer, spectral_layers

LPHI = GELU_LIPSCHITZ


def _c2(W):
    return np.linalg.svd(W, compute_uv=False)[0]


def _n21(W):
    return np.sum(np.linalg.norm(W, axis=0))


def _alphas(layers):
    f = [LPHI * _c2(x["m_in"]) * _c2(x["m_out"])
         * sum(_c2(v) * (1 + 4 * _c2(q)) for q, v in zip(x["qk"], x["v"], strict=True))
         for x in layers]  # fmt: skip
    return [math.prod(f[l + 1 :]) for l in range(len(layers))]


def _numpy_spectrum_adaptive(layers, N):
    """B of SPEC.md section 6 with the min over p taken by brute force: (B, p per matrix)."""
    L = len(layers)
    M = math.ceil(L + math.log(N))
    grid = [j / M for j in range(2 * M + 1)]
    alphas = _alphas(layers)
    total, ps = 0.0, []
    for l, x in enumerate(layers):
        ci, co = _c2(x["m_in"]), _c2(x["m_out"])
        mats = [(q, 2 * _c2(v) * co * ci) for q, v in zip(x["qk"], x["v"], strict=True)]
        mats += [(v, co * ci) for v in x["v"]] + [(x["m_in"], co), (x["m_out"], 1.0)]
        for W, gamma in mats:
            s = np.linalg.svd(W, compute_uv=False)
            s = s[s > 1e-10 * s[0]]
            best, best_p = math.inf, None
            for p in grid:
                sp = float(len(s)) if p == 0 else float(np.sum(s**p))
                val = (
                    sp ** (1 / (p + 2))
                    * (gamma * alphas[l] * L) ** (p / (p + 2))
                    * N ** ((p + 1) / (p + 2))
                )
                if val < best:
                    best, best_p = val, p
            total += best
            ps.append(best_p)
    return total + math.sqrt(L), ps


def _numpy_norm_based(layers):
    alphas = _alphas(layers)
    total = 0.0
    for a, x in zip(alphas, layers, strict=True):
        ci, co = _c2(x["m_in"]), _c2(x["m_out"])
        xi = sum((co * ci * _c2(v) * _n21(q)) ** (2 / 3) + (co * ci * _n21(v)) ** (2 / 3)
                 for q, v in zip(x["qk"], x["v"], strict=True))  # fmt: skip
        xi += (co * _n21(x["m_in"])) ** (2 / 3) + _n21(x["m_out"]) ** (2 / 3)
        total += a ** (2 / 3) * xi
    return (1 + total) ** 1.5


def _random_layers(seed, scale=1.0):
    model = BlockTransformer(6, num_layers=3, num_heads=2, head_dim=2, mlp_dim=7,
                             rngs=nnx.Rngs(seed))  # fmt: skip
    _, p = as_pure(model)
    layers = spectral_layers(p)
    return [{k: ([w * scale for w in v] if isinstance(v, list) else v * scale)
             for k, v in x.items()} for x in layers]  # fmt: skip


@pytest.mark.parametrize(("N", "scale"), [(4096, 1.0), (3, 0.05), (6, 0.3)])
def test_proxies_against_numpy_and_brute_force_p(N, scale):
    from jaxbounds.bounds import spectral

    layers = _random_layers(0, scale)
    got = spectral.spectrum_adaptive_proxy(layers, num_examples=N, L_phi=LPHI)
    want, ps = _numpy_spectrum_adaptive(layers, N)
    assert float(got.value) == pytest.approx(want, rel=1e-10)
    np.testing.assert_array_equal(got.terms["p_opt"], ps)
    assert float(spectral.norm_based_proxy(layers, L_phi=LPHI).value) == pytest.approx(
        _numpy_norm_based(layers), rel=1e-10
    )
    if N == 4096:
        assert set(ps) == {0.0}  # large N: the rank term wins everywhere
    if scale < 0.1:
        assert max(ps) > 0.0  # small weights and N: a positive p wins somewhere


def test_growth_rate_closed_form():
    rng = np.random.default_rng(5)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = 0.3 + 1.7 * x + rng.normal(scale=0.1, size=4)
    xb, yb = x.mean(), y.mean()
    slope = np.sum((x - xb) * (y - yb)) / np.sum((x - xb) ** 2)
    slope_got, intercept_got = sa.growth_rate(x, y)
    assert slope_got == pytest.approx(slope, rel=1e-10)
    assert intercept_got == pytest.approx(yb - slope * xb, rel=1e-10)


def test_matrix_stats_and_names():
    layers = _random_layers(2)
    names = sa.matrix_names(layers)
    stats = sa.matrix_stats(layers)
    assert len(names) == len(stats["rank"]) == 3 * 6
    assert names[:6] == ["l0.qk0", "l0.qk1", "l0.v0", "l0.v1", "l0.m_in", "l0.m_out"]
    W = layers[1]["m_in"]
    s = np.linalg.svd(W, compute_uv=False)
    i = names.index("l1.m_in")
    assert stats["rank"][i] == 6
    assert stats["stable_rank"][i] == pytest.approx(np.sum(W**2) / s[0] ** 2, rel=1e-10)
    assert stats["rank"][names.index("l2.qk1")] == 2


# ---------------------------------------------------------------------------- slow: smoke


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sa")
    summary = run_experiment(sa.EXPERIMENT, scale="smoke", out_dir=out, quiet=True)
    assert summary.num_missing == 0
    return summary.out_dir


def _rows(run_dir: Path) -> list[dict]:
    with (run_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("depth", "num_examples", "seed"):
            r[k] = int(r[k])
        for k in ("spectrum_adaptive", "norm_based", "spectrum_adaptive_width_n", "train_loss"):
            r[k] = float(r[k])
        for k in ("p_opt", "rank", "matrices"):
            r[k] = json.loads(r[k])
    return rows


@pytest.mark.slow
def test_files(smoke_run):
    names = {p.name for p in smoke_run.iterdir()}
    assert {"results.csv", "summary.json", "report.md", "statistics.json", "figure_proxies.png",
            "figure_matrices.png"} <= names  # fmt: skip
    assert len(_rows(smoke_run)) == 8
    assert (smoke_run / "report.md").read_text().count("- **") == len(sa.CLAIMS)


@pytest.mark.slow
def test_one_unit_retrained_and_recomputed(smoke_run):
    cfg = {**sa.SCALES["smoke"], "depth": 2, "num_examples": 64}
    row = next(r for r in _rows(smoke_run)
               if r["depth"] == 2 and r["num_examples"] == 64 and r["seed"] == 1)  # fmt: skip
    _, params, *_ = sa.train_unit(cfg, 1)
    layers = spectral_layers(params)
    want, ps = _numpy_spectrum_adaptive(layers, 64)
    assert row["spectrum_adaptive"] == pytest.approx(want, rel=1e-9)
    assert row["p_opt"] == ps
    assert row["norm_based"] == pytest.approx(_numpy_norm_based(layers), rel=1e-9)
    assert row["spectrum_adaptive_width_n"] == pytest.approx(
        _numpy_spectrum_adaptive(layers, cfg["embed_dim"])[0], rel=1e-9
    )
    ranks = [int(np.linalg.matrix_rank(W, tol=1e-10 * np.linalg.norm(W, 2)))
             for x in layers for W in [*x["qk"], *x["v"], x["m_in"], x["m_out"]]]  # fmt: skip
    assert row["rank"] == ranks


@pytest.mark.slow
def test_depth_growth_recomputed_from_csv(smoke_run):
    rows = _rows(smoke_run)
    stats = json.loads((smoke_run / "statistics.json").read_text())
    for n in (32, 64):
        for proxy in ("spectrum_adaptive", "norm_based"):
            slopes = []
            for seed in (0, 1):
                by_depth = {r["depth"]: r[proxy] for r in rows
                            if r["num_examples"] == n and r["seed"] == seed}  # fmt: skip
                slopes.append(math.log(by_depth[2]) - math.log(by_depth[1]))  # two points
            got = stats["depth_growth"][str(n)][proxy]
            assert got["mean"] == pytest.approx(pystats.mean(slopes), rel=1e-9)
            assert got["std"] == pytest.approx(pystats.stdev(slopes), rel=1e-6, abs=1e-12)
