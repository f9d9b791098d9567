"""Section ``shallow`` (model ``shallow``): the GD run's bound inputs, its NTK and the NTK regime.

Rows: data and sizes, train / test loss and accuracy, the distance from initialisation per
matrix (R_Q, R_K, R_V, R_O), eta = ||W^0||_F + R and xi = ||W^0||_2 + R, R_X,
alpha = sigma_min(F_pre^0), the smallest eigenvalue of the empirical NTK at initialisation and
after training (both in float64), and the NTK-regime check (the model against its
linearisation trained side by side, :func:`jaxbounds.training.ntk_regime.ntk_regime`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxbounds.models.ntk import empirical_ntk, feature_alpha
from jaxbounds.models.shallow import PARAM_NAMES, shallow_features
from jaxbounds.report.facts import Run, ShallowFacts
from jaxbounds.report.rows import Row
from jaxbounds.training.losses import accuracy
from jaxbounds.training.ntk_regime import ntk_regime
from jaxbounds.training.records import TrainingRecord

__all__ = ["shallow_section"]

_SECTION = "shallow"
#: Examples per tile of the empirical NTK.
NTK_TILE = 64
#: The NTK-regime check runs min(GD steps, this) steps.
MAX_REGIME_STEPS = 100


def _run_rows(run: Run, facts: ShallowFacts, record: TrainingRecord) -> list[Row]:
    """Data, sizes, losses and accuracies."""
    s, q, test_loss = _SECTION, facts.quantities, record.metrics["test_loss"]
    rows = [
        Row(s, "data", facts.description),
        Row(s, "N (train examples)", float(q.num_examples)),
        Row(s, "d_s (tokens)", float(q.d_s)),
        Row(s, "d (token dimension)", float(facts.token_dim)),
        Row(s, "d_m (model dimension)", float(q.d_m)),
        Row(s, "GD steps", float(record.num_steps), note=f"learning rate {record.learning_rate}"),
        Row(s, "train loss", float(record.loss[-1]), note="cross-entropy, final step"),
        Row(s, "test loss", float(test_loss[-1]), note="final step"),
        Row(
            s,
            "lowest test loss",
            float(np.min(test_loss)),
            note=f"at step {int(np.argmin(test_loss))}",
        ),
    ]
    for split, data in (("train", run.train), ("test", run.test)):
        acc = accuracy(run.apply_fn(run.params, data["inputs"]), data["labels"])
        rows.append(Row(s, f"{split} accuracy", float(acc)))
    return rows


def _radius_rows(facts: ShallowFacts, record: TrainingRecord) -> list[Row]:
    """R_* per matrix, R, eta_* and xi_*, R_X."""
    s, inputs = _SECTION, record.bound_inputs()
    rows = [
        Row(s, f"R_{n[-1]}", inputs["R"][n], note=f"max_t ||{n}^t - {n}^0||_F over training")
        for n in PARAM_NAMES
    ]
    rows.append(Row(s, "R", record.total_radius, note="sqrt(R_Q^2+R_K^2+R_V^2+R_O^2)"))
    for n in PARAM_NAMES:
        rows.append(Row(s, f"eta_{n[-1]}", inputs["eta"][n], note="||W^0||_F + R"))
        rows.append(Row(s, f"xi_{n[-1]}", inputs["xi"][n], note="||W^0||_2 + R"))
    q = facts.quantities
    rows.append(Row(s, "R_X", q.input_radius, note="max_n ||X_n||_F / sqrt(d_s)"))
    return rows


def _ntk_rows(run: Run, facts: ShallowFacts) -> list[Row]:
    """The alpha row and the NTK's smallest eigenvalue at init and after training (float64).

    lambda_min is ~1e-7 of lambda_max here, below float32 rounding of the Gram matrix.
    """
    s, num, d_m = _SECTION, facts.quantities.num_examples, facts.quantities.d_m
    with jax.enable_x64(True):
        x64 = jnp.asarray(run.train["inputs"], jnp.float64)
        p0_64, p_64 = (
            jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), t)
            for t in (facts.params0, run.params)
        )
        alpha = float(feature_alpha(shallow_features(p0_64, x64)))
        ntk = jax.jit(lambda p, x: empirical_ntk(run.apply_fn, p, x, tile_size=NTK_TILE))
        spectra = {
            label: np.linalg.eigvalsh(np.asarray(ntk(p, x64)))
            for label, p in (("at init", p0_64), ("after training", p_64))
        }
    note = "N-th singular value of the (N, d_m) init features, float64"
    rows = [
        Row(
            s,
            "alpha = sigma_min(F_pre^0)",
            alpha,
            note=note + ("" if d_m >= num else "; 0 because N > d_m"),
        )
    ]
    for label, eigs in spectra.items():
        note = (
            f"empirical NTK on the N train inputs, float64, tiles of {NTK_TILE}; "
            f"lambda_max {float(eigs[-1]):.4g}"
        )
        rows.append(Row(s, f"NTK lambda_min {label}", float(eigs[0]), note=note))
    return rows


def _regime_rows(run: Run, facts: ShallowFacts, record: TrainingRecord) -> list[Row]:
    """The model against its linearisation at init, both trained by the same GD steps."""
    s, steps = _SECTION, min(record.num_steps, MAX_REGIME_STEPS)
    summary = ntk_regime(
        run.apply_fn, facts.params0, run.train, run.test,
        learning_rate=record.learning_rate, num_steps=steps, progress=True,
    ).summary()  # fmt: skip
    note = f"model vs its linearisation at init, both trained {steps} GD steps"
    return [
        Row(s, "relative weight movement", summary["relative_movement"], note=note),
        Row(s, "linearised model train loss", summary["loss_linear"], note=note),
        Row(s, "prediction drift (train, max)", summary["drift_train"], note=note),
        Row(s, "prediction drift (test, max)", float(summary["drift_test"]), note=note),
        Row(
            s,
            "relative prediction drift (train)",
            summary["relative_drift_train"],
            note="||f - f_lin|| / ||f - f_0||; near 0 in the NTK regime",
        ),
    ]


def shallow_section(run: Run) -> list[Row]:
    """Sizes, losses, distances from init, alpha, NTK smallest eigenvalues, NTK-regime check.

    Raises:
      ValueError: if the run has no held-out data or no training record.
    """
    if run.test is None or run.record is None:
        raise ValueError("run: the shallow section needs held-out data and a GD record")
    facts: ShallowFacts = run.facts
    return (
        _run_rows(run, facts, run.record)
        + _radius_rows(facts, run.record)
        + _ntk_rows(run, facts)
        + _regime_rows(run, facts, run.record)
    )
