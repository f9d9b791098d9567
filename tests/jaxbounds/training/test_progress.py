"""The progress bar: one redrawn line, throttled, silent without a stream."""

import io

from jaxbounds.training.progress import Progress


def test_draws_the_last_update_and_ends_the_line():
    out = io.StringIO()
    bar = Progress(4, out, "[t]", width=8, min_interval=3600.0)
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
        bar = Progress(2, stream, "[t]")
        bar.update(2, "x")
        bar.close()
    assert capsys.readouterr().err == ""
    bar = Progress(1, True, "[stderr]", min_interval=0.0)
    bar.update(1)
    bar.close()
    assert "[stderr]" in capsys.readouterr().err
