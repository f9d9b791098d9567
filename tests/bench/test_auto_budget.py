"""bench/auto_budget.py: Hutchinson's mode="auto" against XLA's plans on the 1B and 8B decoders.

The committed record (``bench/results/auto_budget.json``, made by the script under the heavy
benchmarks' lock: compiling the 1B and 8B decoders does not belong in a test run) is checked
against the rule of :func:`kernels._memory.products_fit` as the code states it now: the rule
applied to the recorded estimates gives the recorded choice, and XLA's plans agree with it (the
product's plan is not within the margin of the quadratic form's). A smoke run on the tiny
decoder checks that a record carries both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import _memory

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench" / "results" / "auto_budget.json"


def rule(estimates: dict) -> bool:
    """products_fit's decision from the recorded estimates (residuals, budget, the two modes)."""
    if estimates["residual_bytes"] > _memory.PRODUCT_RESIDUAL_BYTES:
        return False
    if estimates["products_bytes"] <= estimates["budget_bytes"]:
        return True
    forms = estimates["forms_bytes"]
    return forms > estimates["budget_bytes"] and (
        estimates["products_bytes"] <= _memory.PRODUCT_MEMORY_MARGIN * forms
    )


@pytest.mark.parametrize("decoder", ["1b", "8b"])
def test_the_recorded_choice_at_scale_follows_the_rule_and_xla_s_plans(decoder):
    records = {r["decoder"]: r for r in json.loads(RECORD.read_text())}
    r = records[decoder]
    est, plans = r["estimates"], r["plans"]
    assert r["mesh"] == {"fsdp": 8}
    assert r["batch"] == [8, 1024]
    # the rule, applied to what it estimated, gives the choice the kernel made: forms
    assert rule(est) is est["products_fit"] is False
    # XLA's plans agree: the product would take more than the margin over the quadratic form
    # (2.3x at 1B, 2.4x at 8B): not a small memory saving
    forms, products = plans["forms"]["temp_gib"], plans["products"]["temp_gib"]
    assert products > _memory.PRODUCT_MEMORY_MARGIN * forms, (forms, products)
    # the estimates err on the side of memory: each mode's estimate, in gradients, is at least
    # XLA's plan in gradients (estimates are global bytes, plans per device: ratios compare)
    grad_est, grad_plan = est["gradient_bytes"], plans["gradient"]["temp_gib"]
    assert est["forms_bytes"] / grad_est >= forms / grad_plan
    assert est["products_bytes"] / grad_est >= products / grad_plan
    # neither fits the budget, capped at the device's chunk budget (1 GiB on a CPU): one probe
    # at a time on an accelerator too
    assert est["budget_bytes"] == 2**30
    assert est["accelerator_chunk"] == 1


def test_a_smoke_run_on_the_tiny_decoder_records_estimates_and_plans(tmp_path):
    out = tmp_path / "auto_budget.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, str(ROOT / "bench" / "auto_budget.py"), "--configs", "tiny",
           "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=600)
    (r,) = json.loads(out.read_text())
    assert r["decoder"] == "tiny"
    assert r["mesh"] == {"fsdp": 8}
    assert set(r["plans"]) == {"gradient", "forms", "products"}
    assert all(p["temp_gib"] > 0 for p in r["plans"].values())
    # a tiny model sits under the 128 MiB floor: the product, and 16 probes on an accelerator
    assert r["estimates"]["products_fit"] is rule(r["estimates"]) is True
    assert r["estimates"]["accelerator_chunk"] == 16
    assert "| tiny" in out.with_suffix(".md").read_text()
