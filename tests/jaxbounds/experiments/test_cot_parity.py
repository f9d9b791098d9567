"""The ``cot-parity`` reproduction: CoT data by hand, bounds written out, one trained unit.

Default run: the CoT windows and the autoregressive chain against PARITY computed by hand in
Python, the growth fits against closed-form lines. Slow run: one bound unit (T = 3) against the
two bounds written out in numpy with G_u recomputed from per-input gradients on the whole cube,
one trained unit per mode whose gap and accuracies are recomputed from the model's own
predictions, and the smoke run end to end (files, statistics from ``results.csv``).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from jaxbounds.experiments import cot_parity as cp
from jaxbounds.experiments.pac_bayes_perturbation import forward
from jaxbounds.experiments.runner import run_experiment
from jaxbounds.models import as_pure
from jaxbounds.models.construction import construction

BOUND_CFG = {
    "part": "bounds", "seq_len": 3, "subgaussian_scale": 0.01, "bound_num_examples": [1000, 10**6],
    "exact_max_len": 12, "num_inputs": 64,
}  # fmt: skip


def _hand_parity(x) -> int:
    out = 0
    for b in x:
        out ^= int(b)
    return out


def _hand_chain(x) -> tuple[list[int], list[list[int]]]:
    """States s_1..s_T (s_j = 1 xor x_j xor s_{j-1}, s_0 = 0) and the T windows, by hand."""
    t, states, windows = len(x), [0], []
    for j in range(1, t + 1):
        z = [int(b) for b in x] + states
        windows.append(z[j - 1 : j + t])
        states.append(1 ^ int(x[j - 1]) ^ states[-1])
    return states[1:], windows


def test_cot_windows_against_hand_parity():
    bits = np.asarray(jax.random.bernoulli(jax.random.key(3), 0.5, (12, 5)), np.int32)
    w = cp.cot_windows(jnp.asarray(bits))
    for i, x in enumerate(bits):
        states, windows = _hand_chain(x)
        assert np.asarray(w["targets"][i]).tolist() == states
        assert np.asarray(w["windows"][i]).tolist() == windows
        # the final state gives PARITY; each target is the 2-parity of window positions 0, T
        assert states[-1] ^ (len(x) % 2) == _hand_parity(x)
        for win, s in zip(windows, states, strict=True):
            assert s == 1 - (win[0] + win[-1]) % 2


def test_chain_with_the_exact_step_computes_parity():
    def step(_, windows):
        windows = np.asarray(windows)
        return jnp.asarray(1.0 - (windows[:, 0] + windows[:, -1]) % 2)

    bits = np.array(list(itertools.product([0, 1], repeat=4)), np.int32)
    chain = cp.chain_predictions(step, None, jnp.asarray(bits))
    assert np.asarray(chain["parity"]).tolist() == [_hand_parity(x) for x in bits]
    assert np.asarray(chain["states"]).tolist() == [_hand_chain(x)[0] for x in bits]


def test_growth_fits_on_exact_laws():
    T = np.array([2.0, 3.0, 5.0, 9.0])
    fits = cp.growth_fits(T, np.log10(4 * T) - 7.0, math.log10(4) + 0.5 * T - 3.0)
    assert fits["cot_loglog_slope"] == pytest.approx(1.0, abs=1e-12)
    assert fits["cot_core_range_log10"] == pytest.approx(0.0, abs=1e-12)
    assert fits["one_pass_slope"] == pytest.approx(0.5, rel=1e-12)
    assert fits["one_pass_r2"] == pytest.approx(1.0, abs=1e-12)
    # log P_one - log P_CoT = 0.5 T - log10(T) + 4: its least-squares slope against T
    diff = 0.5 * T - np.log10(T) + 4.0
    assert fits["one_pass_minus_cot_slope"] == pytest.approx(np.polyfit(T, diff, 1)[0], rel=1e-9)


def _log_bound(T, G, L, S, m, one_pass):
    """The rebuilt PARITY bounds written out: min over the 20-point mesh plus ln 20."""
    sig = np.geomspace(1e-2, 1e-5, 20)
    k = T if one_pass else 1
    lead = math.log(4.0) if one_pass else math.log(4.0 * T)
    terms = lead - m / (8 * S**2) + m * sig**2 * k * 2 * G / (4 * S**2) + k * L / (2 * sig**2)
    return float((terms + math.log(20)).min()) / math.log(10)


@pytest.mark.slow  # compiles the per-input gradients twice: ~10 CPU s
def test_bound_unit_written_out():
    row = cp.bound_row(BOUND_CFG, 0)
    T = 3
    L = 16 * 4 * 3 + 8 * 3 + 1 + 1 + 4 * 1 * 3 * math.log(T) ** 2  # Theorem 10 at (1, 2, T)
    assert row["L"] == pytest.approx(L, rel=1e-12)
    with jax.enable_x64(True):
        params = as_pure(construction(cp._step_function(), seq_len=T))[1]
        flat, unravel = ravel_pytree(params)
        bits = jnp.asarray(list(itertools.product([0, 1], repeat=T)), jnp.int32)
        grads = jax.vmap(lambda x: jax.grad(lambda v: forward(unravel(v), x[None])[0])(flat))
        sq = np.sum(np.asarray(grads(bits)) ** 2, axis=1)
    assert row["num_inputs_used"] == 2**T
    assert row["G_u"] == pytest.approx(sq.max(), rel=1e-10)
    for i, m in enumerate(BOUND_CFG["bound_num_examples"]):
        cot = _log_bound(T, row["G_u"], L, 0.01, m, one_pass=False)
        one = _log_bound(T, row["G_u"], L, 0.01, m, one_pass=True)
        assert row["cot_log10"][i] == pytest.approx(cot, rel=1e-12)
        assert row["one_pass_log10"][i] == pytest.approx(one, rel=1e-12)
        assert row["cot_value"][i] == pytest.approx(10 ** min(cot, 0.0), rel=1e-9)
        assert row["one_pass_value"][i] == pytest.approx(10 ** min(one, 0.0), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["direct", "cot"])
def test_trained_unit_gap_from_predictions(mode):
    cfg = {"part": "train", "mode": mode, "seq_len": 3, "learning_rate": 0.01,
           "train_fraction": 0.5, "num_epochs": 20}  # fmt: skip
    trained = cp.train_unit(cfg, 1)
    row = cp.trained_row(trained)
    train, test = np.asarray(trained.train_bits), np.asarray(trained.test_bits)
    assert len(train) == len(test) == 4
    assert {tuple(x) for x in train} | {tuple(x) for x in test} == set(
        itertools.product([0, 1], repeat=3)
    )

    def predict(windows):
        out = forward(trained.params, jnp.asarray(np.asarray(windows, np.int32)))
        return np.asarray(out, np.float64)

    def metrics(bits):
        if mode == "direct":
            out, y = predict(bits), np.array([_hand_parity(x) for x in bits])
            return np.mean((out - y) ** 2), np.mean((out > 0.5) == y)
        losses, correct = [], []
        for x in bits:
            states, windows = _hand_chain(x)
            losses += list((predict(windows) - np.array(states)) ** 2)
            s = [0]
            for j in range(1, len(x) + 1):  # autoregressive on its own rounded outputs
                z = [int(b) for b in x] + s
                s.append(int(predict([z[j - 1 : j + len(x)]])[0] > 0.5))
            correct.append((s[-1] ^ (len(x) % 2)) == _hand_parity(x))
        return np.mean(losses), np.mean(correct)

    (l_tr, a_tr), (l_te, a_te) = metrics(train), metrics(test)
    assert row["train_loss"] == pytest.approx(l_tr, rel=1e-5)
    assert row["test_loss"] == pytest.approx(l_te, rel=1e-5)
    assert row["gap"] == pytest.approx(l_te - l_tr, rel=1e-4, abs=1e-6)
    assert row["train_accuracy"] == a_tr
    assert row["test_accuracy"] == a_te
    assert row["error_gap"] == a_tr - a_te


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cot")
    summary = run_experiment(cp.EXPERIMENT, scale="smoke", out_dir=out, quiet=True)
    assert summary.num_missing == 0
    return summary.out_dir


@pytest.mark.slow
def test_smoke_run_files_and_statistics(smoke_run):
    names = {p.name for p in smoke_run.iterdir()}
    assert {"results.csv", "summary.json", "report.md", "statistics.json", "units",
            "figure_bounds_vs_T.png", "figure_trained.png"} <= names  # fmt: skip
    with (smoke_run / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    stats = json.loads((smoke_run / "statistics.json").read_text())
    report = (smoke_run / "report.md").read_text()
    bounds = sorted((r for r in rows if r["part"] == "bounds"), key=lambda r: int(r["seq_len"]))
    assert [int(r["seq_len"]) for r in bounds] == stats["bounds"]["seq_len"] == [2, 3, 4]
    T = np.array([2.0, 3.0, 4.0])
    for i, p in enumerate(stats["bounds"]["per_m"]):
        cot = np.array([json.loads(r["cot_log10"])[i] for r in bounds])
        one = np.array([json.loads(r["one_pass_log10"])[i] for r in bounds])
        assert p["fits"]["cot_loglog_slope"] == pytest.approx(
            np.polyfit(np.log10(T), cot, 1)[0], rel=1e-9
        )
        assert p["fits"]["one_pass_slope"] == pytest.approx(np.polyfit(T, one, 1)[0], rel=1e-9)
        # frozen at T = 2: the CoT bound is exactly 4T times a constant, up to the rounding of
        # log10 values of size |log10 P| (up to ~5e8 here) over a log10 T range of 0.3
        frozen = np.asarray(p["cot_log10_frozen"])
        resolution = 8 * np.finfo(float).eps * np.abs(frozen).max() / np.ptp(np.log10(T))
        assert p["fits_frozen"]["cot_loglog_slope"] == pytest.approx(1.0, abs=resolution)
        assert resolution < 1e-4  # still sharp: L(1,2,T) as stated moves the slope by ~1e5
    train = [r for r in rows if r["part"] == "train"]
    entry = stats["trained"][0]
    for mode in ("direct", "cot"):
        gaps = [float(r["gap"]) for r in train if r["mode"] == mode]
        assert entry[mode]["gap"]["mean"] == pytest.approx(np.mean(gaps), rel=1e-12)
        assert entry[mode]["gap"]["std"] == pytest.approx(np.std(gaps, ddof=1), rel=1e-9)
    for claim in cp.CLAIMS:
        assert claim in report
