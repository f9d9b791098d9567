"""run_estimate: the applicable sections in order, metadata, selection and errors."""

import dataclasses

import pytest

from jaxbounds.report import runs
from jaxbounds.report.job import run_estimate

TINY = dataclasses.replace(
    runs.SCALAR_QUICK, embed_dim=4, seq_len=3, sparsity=1, num_train=8, num_test=4,
    num_epochs=2, batch_size=8, num_probes=4, hutchpp_matvecs=6, lanczos_steps=4, top_k=1,
)  # fmt: skip


def test_selected_sections_in_report_order(monkeypatch):
    monkeypatch.setattr(runs, "SCALAR_QUICK", TINY)
    messages = []
    report = run_estimate("scalar", seed=5, sections=["curvature", "training"], log=messages.append)
    assert report.rows[0].section == "training"
    assert {r.section for r in report.rows} == {"training", "curvature"}
    assert messages == ["[jaxbounds] training ...", "[jaxbounds] curvature ..."]
    meta = report.meta
    assert (meta["seed"], meta["quick"]) == (5, True)
    assert list(meta["timings_s"]) == ["build", "training", "curvature"]
    assert meta["config"]["embed_dim"] == 4  # the run's own metadata is merged in
    assert "curvature_seconds" in meta
    assert report.model == "scalar"


def test_unknown_names_raise_before_building():
    with pytest.raises(ValueError, match="model"):
        run_estimate("nope", log=None)
    with pytest.raises(ValueError, match="sections"):
        run_estimate("scalar", sections=["nope"], log=None)
