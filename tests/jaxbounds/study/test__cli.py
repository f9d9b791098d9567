"""``jaxbounds study --from CSV`` on a CSV with its own column names."""

import json

import pytest

from jaxbounds.cli import main

HEADER = "net,eta,d,rep,ggap,ggap_se,flat,const,ok\n"


def _csv(tmp_path, seeds=(0, 1, 2), extra=""):
    lines = [HEADER]
    for net, scale in (("cnn", 1.0), ("vit", 5.0)):
        for s in seeds:
            for eta in (0.1, 0.3):
                for d in (2, 4):
                    gap = scale * (eta + 0.1 * d + 0.01 * s)
                    lines.append(f"{net},{eta},{d},{s},{gap},0.001,{gap * 2},7,true\n")
    path = tmp_path / "theirs.csv"
    path.write_text("".join(lines) + extra)
    return path


def _args(path, out, **over):
    flags = {"--from": str(path), "--out": str(out), "--family": "net", "--axes": "eta,d",
             "--seed": "rep", "--gap": "ggap", "--measures": "flat,const",
             "--converged": "ok", "--gap-stderr": "ggap_se", "--null-draws": "10",
             "--resamples": "10"} | over  # fmt: skip
    return ["study", *[x for k, v in flags.items() for x in (k, v)]]


def test_study_writes_the_report_per_family(tmp_path):
    path = _csv(tmp_path)
    assert main(_args(path, tmp_path / "out")) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## cnn" in report
    assert "## vit" in report
    assert "random measure" in report
    assert "gap + noise" in report
    assert "Pooled over families (not a verdict)" in report
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert data["families"]["cnn"]["measures"]["flat"]["tau"]["tau"] == 1.0
    assert data["families"]["cnn"]["measures"]["const"]["tau"]["note"] == "the measure is constant"


@pytest.mark.parametrize(
    ("flag", "value"), [("--gap", "gap"), ("--axes", "eta,depth"), ("--measures", "flat,sharp"),
                        ("--family", "fam"), ("--converged", "done")],
)  # fmt: skip
def test_missing_column_exits_2_naming_the_flag(tmp_path, capsys, flag, value):
    assert main(_args(_csv(tmp_path), tmp_path / "out", **{flag: value})) == 2
    err = capsys.readouterr().err
    assert f"{flag}: column '" in err
    assert "is not in the table" in err


def test_nan_rows_and_one_seed_are_reported(tmp_path, capsys):
    path = _csv(tmp_path, seeds=(0,), extra="cnn,0.2,2,0,,0.001,1.0,7,true\n")
    assert main(_args(path, tmp_path / "out")) == 0
    out = capsys.readouterr().out
    assert "1 row(s) without a gap (NaN) left out" in out
    assert "one seed: no bootstrap interval over seeds" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert "the measure is constant" in report


def test_bad_value_exits_2(tmp_path, capsys):
    path = _csv(tmp_path, extra="cnn,0.2,2,0,abc,0.001,1.0,7,true\n")
    assert main(_args(path, tmp_path / "out")) == 2
    assert "--gap: column 'ggap' row" in capsys.readouterr().err


def test_out_is_checked_before_any_work_and_another_study_is_kept(tmp_path, capsys):
    path = _csv(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    for out in (tmp_path / "afile", tmp_path / "afile" / "x"):
        assert main(_args(path, out)) == 2
        assert "--out" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(_args(path, out)) == 0
    first = (out / "report.md").read_text()
    assert main(_args(path, out)) == 0  # the same study again replaces its own report
    assert (out / "report.md").read_text() == first
    other = [*_args(path, out), "--title", "Another study"]
    assert main(other) == 2  # another study's flags: the finished report is kept
    assert "--fresh" in capsys.readouterr().err
    assert (out / "report.md").read_text() == first
    assert main([*other, "--fresh"]) == 0
    assert "Another study" in (out / "report.md").read_text()
