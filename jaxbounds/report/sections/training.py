"""Section ``training`` (model ``scalar``): final train / test loss and accuracy, model size."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row

__all__ = ["training_section"]

_SECTION = "training"


def training_section(run: Run) -> list[Row]:
    """The last record point of the training run (loss, accuracy, test loss), sizes and time.

    Raises:
      ValueError: if the run has no training record.
    """
    record = run.record
    if record is None:
        raise ValueError("run.record: the training section needs a training record")
    s, final = _SECTION, record.final()
    n_train = int(run.train["labels"].shape[0])
    rows = [
        Row(s, "train loss", final["loss"], note=f"logistic, n = {n_train}"),
        Row(s, "train accuracy", final["train_accuracy"]),
    ]
    if "test_loss" in final and run.test is not None:
        n_test = int(run.test["labels"].shape[0])
        rows += [
            Row(s, "test loss", final["test_loss"], note=f"logistic, n = {n_test}"),
            Row(s, "test accuracy", final["test_accuracy"]),
            Row(
                s,
                "generalization gap (loss)",
                final["test_loss"] - final["loss"],
                note="test - train",
            ),
        ]
    num_params = sum(int(jnp.size(x)) for x in jax.tree_util.tree_leaves(run.params))
    rows.append(Row(s, "parameters", float(num_params)))
    rows.append(Row(s, "epochs", float(record.epoch[-1]), note=f"{record.seconds:.1f} s"))
    return rows
