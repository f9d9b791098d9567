"""The progress bar: one redrawn line, throttled, silent without a stream."""

import io

import pytest

from jaxbounds.training.progress import ProgressBar


def test_draws_the_last_update_and_ends_the_line():
    out = io.StringIO()
    bar = ProgressBar(4, out, "[t]", width=8, min_interval=3600.0)
    bar.update(1, "loss 1")  # first update is drawn
    bar.update(2, "loss 0.5")  # throttled
    bar.update(4, "loss 0.1")  # last one always drawn
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2
    assert "[t] [##......] 1/4 loss 1" in text
    assert "[t] [########] 4/4 loss 0.1" in text
    assert "loss 0.5" not in text
    assert text.endswith("\n")


def test_silent_without_a_stream(capsys):
    for stream in (None, False):
        bar = ProgressBar(2, stream, "[t]")
        bar.update(2, "x")
        bar.close()
    assert capsys.readouterr().err == ""
    bar = ProgressBar(1, True, "[stderr]", min_interval=0.0)
    bar.update(1)
    bar.close()
    assert "[stderr]" in capsys.readouterr().err


def test_the_old_name_warns_and_is_the_bar():
    # one name per idea: jaxbounds.longrun.Progress is what a long run reports; the bar is
    # ProgressBar, and its old name works until 0.3
    import jaxbounds.training as training
    from jaxbounds.training import progress

    for module in (training, progress):
        with pytest.warns(DeprecationWarning, match=r"^jaxbounds\.training\.Progress is "
                          r"deprecated; use ProgressBar \(.* removed in 0\.3\)"):  # fmt: skip
            assert module.Progress is ProgressBar
