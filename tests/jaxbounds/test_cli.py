"""`jaxbounds estimate` in-process on a tiny configuration; the README API tour runs."""

import contextlib
import io
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import jaxbounds.sections.curvature as curvature
from jaxbounds.cli import main
from jaxbounds.estimate import Report, Row
from jaxbounds.report import format_table, format_value, write_json

TINY = {
    **curvature.QUICK,
    "embed_dim": 8,
    "seq_len": 6,
    "sparsity": 3,
    "num_train": 40,
    "num_test": 30,
    "num_epochs": 3,
    "batch_size": 16,
    "num_probes": 40,
    "hutchpp_matvecs": 12,
    "lanczos_steps": 40,
    "top_k": 2,
}


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(curvature, "QUICK", TINY)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One in-process ``jaxbounds estimate`` run on the tiny configuration (seed 3)."""
    out_dir = tmp_path_factory.mktemp("report")
    argv = ["estimate", "--sections", "training,curvature", "--out", str(out_dir), "--seed", "3"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(curvature, "QUICK", TINY)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(argv)
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
    assert rows["Hessian trace (Hutchinson)"]["stderr"] > 0
    # Table and JSON agree.
    assert format_value(rows["train accuracy"]["value"]) in out
    assert format_value(rows["Hessian trace (Hutch++)"]["value"]) in out
    assert rows["epochs"]["value"] == 3
    np.testing.assert_allclose(
        rows["train loss"]["value"], report["meta"]["history"]["train_loss"][-1]
    )


def test_reported_curvature_against_dense_hessian(cli_run, tiny):
    """The JSON's numbers against jax.hessian of the same (deterministically rebuilt) model."""
    rows = {r["name"]: r for r in cli_run[2]["rows"]}
    ctx = curvature.build_scalar(jax.random.key(3), progress=False)
    flat, unravel = ravel_pytree(ctx.params)
    np.testing.assert_allclose(
        rows["‖θ‖_1 (all weights)"]["value"], float(jnp.sum(jnp.abs(flat))), rtol=1e-5
    )
    hess = jax.jit(jax.hessian(lambda f: ctx.loss_fn(unravel(f))))(flat).astype(jnp.float64)
    eig = np.linalg.eigvalsh(np.asarray(hess))
    exact = float(np.trace(np.asarray(hess)))
    for name in ("Hessian trace (Hutchinson)", "Hessian trace (Hutch++)"):
        row = rows[name]
        assert abs(row["value"] - exact) <= 5 * row["stderr"] + 1e-4 * abs(exact), name
    # 40 Lanczos steps on a 392-dimensional Hessian: the top Ritz values have converged.
    np.testing.assert_allclose(rows["Hessian eigenvalue λ1"]["value"], eig[-1], rtol=1e-3)
    np.testing.assert_allclose(rows["Hessian eigenvalue λ2"]["value"], eig[-2], rtol=1e-2)
    np.testing.assert_allclose(
        rows["‖layer0.head0.W_v‖_F"]["value"],
        float(jnp.linalg.norm(ctx.params["layers"][0]["w_v"][0])),
        rtol=1e-5,
    )
    assert rows["parameters"]["value"] == flat.size == 3 * 2 * 64 + 8
    assert 0.0 <= rows["test accuracy"]["value"] <= 1.0


def test_list_and_bad_arguments(tiny, capsys):
    assert main(["estimate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "scalar" in out
    assert "section curvature: models scalar" in out
    with pytest.raises(SystemExit) as err:
        main(["estimate", "--model", "nope"])
    assert err.value.code == 2
    with pytest.raises(SystemExit):
        main(["estimate", "--sections", "nope"])
    with pytest.raises(SystemExit):
        main([])


def test_format_table_and_json(tmp_path):
    rows = [
        Row("bounds", "a bound", 12.5, vacuous=True, note="rebuilt"),
        Row("rademacher", "Rad_S", 0.123456, 0.001, 0.1, 0.15),
        Row("training", "model", "scalar"),
    ]
    report = Report("scalar", rows, {"seed": 1, "quick": False, "timings_s": {"build": 2.0}})
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0] == "jaxbounds estimate: model scalar, seed 1, full run"
    assert "VACUOUS" in table
    assert "± 0.001" in table
    assert "[0.1, 0.15]" in table
    assert lines[-1] == "time (s): build 2.0; total 2.0"
    # Columns are aligned: the value column ends at the same offset in every data row.
    data_lines = [ln for ln in lines[3:-1] if ln]
    ends = {
        ln.index(v) + len(v)
        for ln, v in zip(data_lines, ("12.5", "0.12346", "scalar"), strict=True)
    }
    assert len(ends) == 1
    path = write_json(report, tmp_path / "sub" / "r.json")
    back = json.loads(path.read_text())
    assert back["rows"][1] == {
        "section": "rademacher",
        "name": "Rad_S",
        "value": 0.123456,
        "stderr": 0.001,
        "lower": 0.1,
        "upper": 0.15,
        "vacuous": None,
        "note": "",
    }
    assert back["rows"][0]["vacuous"] is True


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
