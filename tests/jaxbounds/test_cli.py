"""`jaxbounds estimate` in-process on a tiny configuration; --list and bad flags."""

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from jaxbounds.cli import main
from jaxbounds.report import runs
from jaxbounds.report.render import format_value

TINY = dataclasses.replace(
    runs.SCALAR_QUICK, embed_dim=8, seq_len=6, sparsity=3, num_train=40, num_test=30,
    num_epochs=3, batch_size=16, num_probes=40, hutchpp_matvecs=12, lanczos_steps=20, top_k=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One in-process ``jaxbounds estimate`` run on the tiny configuration (seed 3)."""
    out_dir = tmp_path_factory.mktemp("report")
    argv = ["estimate", "--sections", "training,curvature", "--out", str(out_dir), "--seed", "3"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "SCALAR_QUICK", TINY)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main([*argv, "--quiet"])
    return code, buf.getvalue(), json.loads((out_dir / "report_scalar.json").read_text())


def test_estimate_prints_table_and_writes_json(cli_run):
    code, out, report = cli_run
    assert code == 0
    assert "jaxbounds estimate: model scalar, seed 3, quick run" in out
    for name in (
        "test accuracy",
        "Hessian trace (Hutchinson)",
        "Hessian trace (Hutch++)",
        "Hessian eigenvalue λ2",
        "‖layer0.head1.W_QK‖_F",
        "‖θ‖_1 (all weights)",
    ):
        assert name in out, name
    assert re.search(r"Hessian trace \(Hutchinson\)\s+\S+\s+± \S+", out)
    assert report["model"] == "scalar"
    assert report["meta"]["seed"] == 3
    assert report["meta"]["config"]["embed_dim"] == 8
    assert report["meta"]["history"]["epoch"] == [0, 1, 2, 3]
    rows = {r["name"]: r for r in report["rows"]}
    assert {r["section"] for r in report["rows"]} == {"training", "curvature"}
    # Table and JSON agree.
    for name in ("train accuracy", "Hessian trace (Hutch++)", "Hessian eigenvalue λ1"):
        assert format_value(rows[name]["value"]) in out
    np.testing.assert_allclose(rows["train loss"]["value"], report["meta"]["history"]["loss"][-1])
    assert out.rstrip().endswith("report_scalar.json")


def test_list_and_bad_arguments(capsys):
    assert main(["estimate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "models: construction, scalar, shallow" in out
    assert "section curvature: models scalar" in out
    assert "section bounds: models scalar, shallow, construction" in out
    for argv in (["estimate", "--model", "nope"], ["estimate", "--sections", "nope"], []):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2


def test_readme_api_tour_runs(capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("<!-- section: api-tour -->")[1].split("<!-- /section: api-tour -->")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Estimate(mean=11, stderr=0, n=16)" in out
    assert "tr H (Hutchinson, 30 probes) = " in out
