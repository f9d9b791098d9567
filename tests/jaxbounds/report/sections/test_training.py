"""Section ``training`` against the trained model's losses and accuracies computed here."""

import numpy as np
import pytest

from jaxbounds.report.sections import training_section


def _logistic(scores, labels):
    s = 2.0 * np.asarray(labels) - 1.0
    return float(np.mean(np.logaddexp(0.0, -s * np.asarray(scores, np.float64))))


def test_rows_against_the_model(scalar_run):
    run = scalar_run
    rows = {r.name: r for r in training_section(run)}
    assert {r.section for r in rows.values()} == {"training"}
    for split, data in (("train", run.train), ("test", run.test)):
        scores = np.asarray(run.apply_fn(run.params, data["inputs"]))
        labels = np.asarray(data["labels"])
        assert rows[f"{split} loss"].value == pytest.approx(_logistic(scores, labels), rel=1e-5)
        assert rows[f"{split} accuracy"].value == pytest.approx(np.mean((scores > 0) == labels))
    assert rows["generalization gap (loss)"].value == pytest.approx(
        rows["test loss"].value - rows["train loss"].value
    )
    assert rows["parameters"].value == 3 * 2 * 64 + 8
    assert rows["epochs"].value == 3
    assert rows["train loss"].note == "logistic, n = 40"
    assert rows["test loss"].note == "logistic, n = 30"


def test_needs_a_record(construction_run):
    with pytest.raises(ValueError, match="record"):
        training_section(construction_run)
