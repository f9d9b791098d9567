"""The study's report: every statistic beside its nulls, JSON without NaN, figures optional."""

import builtins
import json
import math

from jaxbounds.study import analyze, load_table
from jaxbounds.study.report import as_json, render_report, study_markdown


def _study():
    rows = [{"lr": lr, "bs": bs, "seed": s, "gap": (lr + 0.1 * bs + 0.01 * s) / 10,
             "m": lr * bs, "flat": 1.0, "se": 0.001}
            for lr in (1, 2, 3) for bs in (1, 2) for s in (0, 1, 2, 3)]  # fmt: skip
    t = load_table(rows, axes=["lr", "bs"], seed="seed", gap="gap", measures=["m", "flat"],
                   gap_stderr="se", num_test=100000)  # fmt: skip
    return analyze(t, num_null_draws=10, num_resamples=20)


def test_markdown_has_nulls_measures_and_per_axis():
    text = study_markdown(_study())
    assert "| random measure | 10 |" in text
    assert "| gap + noise at its stderr | 10 |" in text
    # tau-a of lr * bs with the gap over 276 pairs: 36 same-setting pairs and 16 pairs of
    # (1, 2) with (2, 1) tie, 16 pairs of (3, 1) with (2, 2) disagree, 13 * 16 agree: 192 / 276
    assert f"| m | 24 | {192 / 276:+.3f} |" in text
    assert "the measure is constant" in text
    assert "### Per axis" in text


def test_json_has_no_nan(tmp_path):
    paths = render_report(_study(), tmp_path, figures=False)
    data = json.loads((tmp_path / "study.json").read_text())
    assert data["families"]["all"]["measures"]["flat"]["tau"]["tau"] is None
    assert [p.name for p in paths] == ["report.md", "study.json"]
    assert as_json({"x": math.inf}) == {"x": None}


def test_without_matplotlib_the_report_says_so(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    paths = render_report(_study(), tmp_path)
    assert "matplotlib is not installed" in (tmp_path / "report.md").read_text()
    assert not [p for p in paths if p.suffix == ".png"]


def test_cmi_ignores_direction_so_the_report_prints_taus_sign():
    rows = [{"lr": lr, "bs": bs, "seed": s, "gap": (lr + 0.1 * bs + 0.01 * s) / 10,
             "minus": -(lr + 0.1 * bs + 0.01 * s), "se": 0.001}
            for lr in (1, 2, 3) for bs in (1, 2) for s in (0, 1)]  # fmt: skip
    t = load_table(rows, axes=["lr", "bs"], seed="seed", gap="gap", measures=["minus"],
                   gap_stderr="se")  # fmt: skip
    study = analyze(t, num_null_draws=40, num_resamples=5)
    m = study.families["all"].measures["minus"]
    assert m.tau.tau == -1.0
    assert m.cmi.by_size[0] == 1.0  # -gap tells the gap's order as well as the gap does
    text = study_markdown(study)
    assert "| 1.000 / 1.000 / 1.000 (tau -) |" in text
    # the nulls carry the CMI too: the random measure near 0, the gap plus noise far above
    nulls = study.families["all"].nulls
    assert nulls["random"].stats["cmi_0"].median < 0.2
    assert nulls["gap+noise"].stats["cmi_0"].median > 0.5


def _two_measures(name, scale=1.0):
    rows = [{"lr": lr, "seed": s, "gap": (lr + 0.01 * s) / 10, name: scale * (lr - 2),
             "other": -scale * (lr - 2)} for lr in (1, 2, 3) for s in (0, 1)]  # fmt: skip
    t = load_table(rows, axes=["lr"], seed="seed", gap="gap", measures=[name, "other"])
    return analyze(t, num_null_draws=5, num_resamples=5)


def test_a_bar_in_a_measure_name_keeps_its_row_in_the_table():
    text = study_markdown(_two_measures("mag|x"))
    header = next(line for line in text.splitlines() if line.startswith("| measure |"))
    row = next(line for line in text.splitlines() if line.startswith("| mag"))
    assert row.startswith("| mag\\|x | 6 | +0.800 |")  # 12 of 15 pairs agree, 3 tie
    assert row.replace("\\|", "").count("|") == header.count("|")


def test_values_beyond_the_float_range_give_their_signs_without_warnings(tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow and matplotlib's empty legend
        study = _two_measures("m", scale=1.7e308)  # differences of 3.4e308 overflow
        render_report(study, tmp_path)
    m = study.families["all"].measures
    assert (m["m"].tau.tau, m["other"].tau.tau) == (12 / 15, -12 / 15)


def test_the_figures_of_an_earlier_study_with_more_families_go(tmp_path):
    for stale in ("figure_1_tau_psi.png", "figure_2_tau_psi.png"):
        (tmp_path / stale).write_bytes(b"old")
    (tmp_path / "figure_notes.png").write_bytes(b"mine")  # not a name the report uses
    paths = render_report(_study(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "figure_0_tau_psi.png", "figure_notes.png", "report.md", "study.json"]  # fmt: skip
    assert (tmp_path / "figure_0_tau_psi.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in paths][-1] == "figure_0_tau_psi.png"
