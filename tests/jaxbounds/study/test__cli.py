"""``jaxbounds study --from CSV`` on a CSV with its own column names."""

import errno
import json
import os
import signal

import pytest

from jaxbounds.cli import main

HEADER = "net,eta,d,rep,ggap,ggap_se,flat,const,ok\n"
ERR = "jaxbounds study: error: "


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
    assert "one seed: the intervals resample the configurations only" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert "the measure is constant" in report


def test_bad_value_exits_2(tmp_path, capsys):
    path = _csv(tmp_path, extra="cnn,0.2,2,0,abc,0.001,1.0,7,true\n")
    assert main(_args(path, tmp_path / "out")) == 2
    n = 2 * 3 * 2 * 2  # families x seeds x eta x d: the data rows before the bad one
    assert f"--gap: column 'ggap', row {n + 2} of {path}, is not a number: 'abc'" in (
        capsys.readouterr().err
    )


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


def _rows_before(seeds=(0, 1, 2)):
    return 2 * len(seeds) * 2 * 2  # families x seeds x eta x d


def test_a_gap_beyond_the_loss_range_is_refused_naming_the_flag(tmp_path, capsys):
    path = _csv(tmp_path)  # the vit gaps reach 3.6: a gap in other units than the 0-1 loss
    assert main(_args(path, tmp_path / "out", **{"--num-test": "100"})) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{ERR}--loss-range: the gap column 'ggap' holds 3.6 (row ")
    assert f"of {path}; 12 gap(s) beyond the loss range 1)" in err
    assert main(_args(path, tmp_path / "o2", **{"--num-test": "100", "--loss-range": "5"})) == 0


def test_negative_gaps_are_warned_about_at_the_start(tmp_path, capsys):
    path = _csv(tmp_path, extra="cnn,0.2,2,0,-0.25,0.001,1.0,7,true\n")
    args = _args(path, tmp_path / "out", **{"--num-test": "100", "--loss-range": "5"})
    assert main(args) == 0
    err = capsys.readouterr().err
    assert (f"warning: --gap: 1 of 25 gaps in column 'ggap' are below 0 (lowest -0.25, "
            f"row {_rows_before() + 2} of {path})") in err  # fmt: skip


def test_an_empty_axis_cell_is_refused_naming_row_and_column(tmp_path, capsys):
    path = _csv(tmp_path, extra="cnn,,2,0,0.5,0.001,1.0,7,true\n")
    assert main(_args(path, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert (f"--axes: column 'eta', row {_rows_before() + 2} of {path}, is empty while other "
            "models of family 'cnn' have a value") in err  # fmt: skip


def test_num_test_zero_exits_2_naming_the_column(tmp_path, capsys):
    lines = _csv(tmp_path).read_text().splitlines()
    lines[0] += ",nt"
    lines[1:] = [f"{line},{0 if k == 4 else 200}" for k, line in enumerate(lines[1:])]
    path = tmp_path / "with_nt.csv"
    path.write_text("\n".join(lines) + "\n")
    over = {"--num-test": "nt", "--loss-range": "5"}
    assert main(_args(path, tmp_path / "out", **over)) == 2
    err = capsys.readouterr().err
    assert err == f"{ERR}--num-test: column 'nt', row 6 of {path}, is 0: expected a size >= 1\n"
    assert main(_args(path, tmp_path / "out", **{"--num-test": "0"})) == 2
    assert (
        "--num-test: expected a column name or an int in [1, 2**53], got 0"
        in capsys.readouterr().err
    )


def test_too_few_null_draws_say_so_instead_of_beyond_null(tmp_path, capsys):
    path = _csv(tmp_path)
    assert main(_args(path, tmp_path / "out", **{"--null-draws": "20"})) == 0
    assert "--null-draws: 20 draws are too few for 'beyond null'" in capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "n/a (too few draws: 20 < 39)" in report
    assert "| yes |" not in report
    assert "| no |" not in report
    assert main(_args(path, tmp_path / "o2", **{"--null-draws": "39"})) == 0
    report = (tmp_path / "o2" / "report.md").read_text()
    assert "too few draws" not in report
    assert "| yes |" in report  # flat ranks every model as the gap does: tau 1


def test_a_duplicated_header_is_refused(tmp_path, capsys):
    text = _csv(tmp_path).read_text().replace("flat,const", "flat,flat", 1)
    path = tmp_path / "twice.csv"
    path.write_text(text)
    assert main(_args(path, tmp_path / "out", **{"--measures": "flat"})) == 2
    assert (f"--from: {path}: column 'flat' appears twice in the header (columns 7 and 8)"
            in capsys.readouterr().err)  # fmt: skip


def test_a_byte_order_mark_is_read(tmp_path):
    plain = _csv(tmp_path)
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert main(_args(plain, tmp_path / "a")) == 0
    assert main(_args(bom, tmp_path / "b")) == 0
    a = json.loads((tmp_path / "a" / "study.json").read_text())
    b = json.loads((tmp_path / "b" / "study.json").read_text())
    assert a == b


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00", "is not UTF-8 text (byte 0: invalid start byte); "
         "a binary file, or a CSV saved in another encoding (save it as CSV UTF-8)"),
        (b"net,eta\x00,d\n", "holds NUL bytes: a binary file, not a CSV"),
        (b"", "has no header line"),
    ],
)  # fmt: skip
def test_a_binary_file_names_the_file(tmp_path, capsys, data, says):
    path = tmp_path / "image.csv"
    path.write_bytes(data)
    assert main(_args(path, tmp_path / "out")) == 2
    assert capsys.readouterr().err == f"{ERR}--from: {path} {says}\n"


def test_a_short_row_names_its_spreadsheet_row(tmp_path, capsys):
    path = _csv(tmp_path, extra="cnn,0.2,2,0,0.5,0.001,1.0,7\n")
    assert main(_args(path, tmp_path / "out")) == 2
    n = _rows_before() + 2
    assert f"--from: row {n} of {path} has 8 cells, the header 9" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("over", "says"),
    [({"--axes": "eta,eta"}, "--axes: a column is named twice in ['eta', 'eta']"),
     ({"--axes": "eta,rep"}, "--seed: column 'rep' is the axes column already"),
     ({"--rng-seed": "-1"}, "--rng-seed: expected an integer >= 0, got -1"),
     ({"--resamples": "100000000000"}, "--resamples: expected an integer in [1, 100,000], got"),
     ({"--null-draws": str(10**22)}, "--null-draws: expected an integer in [1, 100,000], got"),
     ({"--loss-range": "inf"}, "--loss-range: expected a finite number > 0, got inf"),
     ({"--num-test": "1" + "0" * 400}, "--num-test: expected a column name or an int in")],
)  # fmt: skip
def test_bad_flags_exit_2_naming_the_flag_and_leave_no_folder(tmp_path, capsys, over, says):
    out = tmp_path / "new" / "a" / "b"
    assert main(_args(_csv(tmp_path), out, **over)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{ERR}{says}")
    assert err.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "new").exists()  # nothing made for a run that did not start


def test_a_big_integer_cell_names_its_row_and_column(tmp_path, capsys):
    path = _csv(tmp_path, extra=f"cnn,0.2,2,0,0.5,0.001,1{'0' * 400},7,true\n")
    assert main(_args(path, tmp_path / "out")) == 2
    assert (f"--measures: column 'flat', row {_rows_before() + 2} of {path}, is a number "
            "beyond the float range") in capsys.readouterr().err  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "says"), [("dir", "is a directory"), ("fifo", "is not a regular file")]
)
def test_from_a_directory_or_a_pipe_says_what_it_is(tmp_path, capsys, kind, says):
    source = tmp_path / "src"
    source.mkdir() if kind == "dir" else os.mkfifo(source)
    assert main(_args(source, tmp_path / "out")) == 2
    assert f"--from {source}: {says}" in capsys.readouterr().err


def test_a_second_study_into_a_locked_folder_stops_at_once(tmp_path, capsys):
    from jaxbounds._atomic import exclusive_lock

    out = tmp_path / "out"
    out.mkdir()
    with exclusive_lock(out):  # another study writing there
        assert main(_args(_csv(tmp_path), out)) == 2
    assert "--out" in (err := capsys.readouterr().err)
    assert "another jaxbounds study is writing there" in err
    assert list(out.iterdir()) == []
    assert main(_args(_csv(tmp_path), out)) == 0


@pytest.fixture
def terminal_handlers():
    """SIGINT and SIGTERM handled as in a terminal for the test, the process's own after.

    An earlier test of this process may have left SIGINT ignored (the console script ignores
    it once its work is done), and a guard keeps an ignored signal ignored.
    """
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: lambda *_: None}
    previous = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.usefixtures("terminal_handlers")
def test_a_stop_during_the_analysis_writes_nothing_and_says_so(tmp_path, capsys, monkeypatch,
                                                               signum):  # fmt: skip
    from jaxbounds.study import analysis

    measure = analysis._measure

    def stopped(*args, **kwargs):  # the signal arrives while the first measure is studied
        os.kill(os.getpid(), signum)
        return measure(*args, **kwargs)

    monkeypatch.setattr(analysis, "_measure", stopped)
    out = tmp_path / "new" / "out"
    assert main(_args(_csv(tmp_path), out)) == 128 + signum
    err = capsys.readouterr().err
    assert err.endswith(f"interrupted by {signal.Signals(signum).name} before the report was "
                        "written; nothing was written (the study writes its report at the "
                        "end: run the command again)\n")  # fmt: skip
    assert not (tmp_path / "new").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_no_model_left_to_analyse_exits_1_writing_nothing(tmp_path, capsys):
    path = _csv(tmp_path)
    path.write_text(path.read_text().replace(",true\n", ",false\n"))  # every run capped
    assert main(_args(path, tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert f"--from {path}: no model left to analyse (cnn: 12 rows, 0 without a gap, 12 " in err
    assert "(--all-models analyses capped models too); nothing written" in err
    assert not (tmp_path / "out").exists()


def test_a_failed_write_names_the_file_and_leaves_no_record_of_the_job(tmp_path, capsys,
                                                                      monkeypatch):  # fmt: skip
    from jaxbounds.study import report

    path, out = _csv(tmp_path), tmp_path / "out"
    assert main(_args(path, out)) == 0
    assert (out / "study_job.json").exists()

    def full(target, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))

    monkeypatch.setattr(report, "write_text_atomic", full)
    assert main([*_args(path, out), "--title", "B", "--fresh"]) == 1
    err = capsys.readouterr().err
    assert f"--out {out}: cannot write {out / 'report.md'} (No space left on device)" in err
    # the folder holds the earlier report without its record: a rerun must say --fresh
    assert not (out / "study_job.json").exists()
    monkeypatch.undo()
    assert main(_args(path, out)) == 2
    assert "--fresh" in capsys.readouterr().err
