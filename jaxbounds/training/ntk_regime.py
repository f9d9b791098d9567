r"""Is a GD run in the NTK (lazy) regime? Train a model and its linearisation side by side.

Both start from the same $\theta_0$ and take the same full-batch GD steps on the same loss:
the model $f(\theta; x)$ and its first-order Taylor model
$f^{lin}(\theta; x) = f(\theta_0; x) + J_{\theta_0}(x)(\theta - \theta_0)$
(:func:`jaxbounds.models.ntk.linearized_apply`). In the NTK regime (wide models, small steps)
the two trajectories stay together: the weights move little relative to their size, and the
predictions of the trained model and of the trained linear model agree.

Recorded every step (both runs share one :func:`~jaxbounds.training.train_gd` call, the
training engine with ``optax.sgd``, on the pair
``{"model": theta, "linear": theta_lin}``; the loss is the sum of the two losses, whose gradient
is the two separate gradients, so each half follows its own GD exactly):

- the training loss of each model;
- ``drift_train`` / ``drift_test``: $\max_n |f(\theta_t; x_n) - f^{lin}(\theta^{lin}_t; x_n)|$;
- ``relative_drift_train``: $\|f_t - f^{lin}_t\|_2 / \|f_t - f_0\|_2$ on the training inputs
  (0 in the lazy limit; order 1 when the model has left the linear regime);
- per-matrix distance from initialisation of both runs, and the relative movement
  $\|\theta_t - \theta_0\|_2 / \|\theta_0\|_2$.

This module sits in ``training`` (not in ``models.ntk`` beside the linearisation) because it
runs the training loop, and ``models`` is a floor below ``training``.

References:
  Lee et al. 2019, arXiv:1902.06720; Chizat, Oyallon, Bach 2019, "On lazy training in
  differentiable programming", arXiv:1812.07956.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbounds.models.ntk import linearized_apply
from jaxbounds.training.loops import train_gd
from jaxbounds.training.losses import logistic_loss, squared_loss
from jaxbounds.training.records import TrainingRecord
from kernels.norms import tree_norm

__all__ = ["NTKRegimeResult", "ntk_regime"]

#: The losses of :func:`ntk_regime`: logistic on {0, 1} labels, and the paper's
#: Phi / N = (1 / 2N) ||f - y||^2 on real targets.
LOSSES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "logistic": logistic_loss,
    "squared": lambda preds, targets: 0.5 * squared_loss(preds, targets),
}


@dataclasses.dataclass
class NTKRegimeResult:
    """Outcome of :func:`ntk_regime`.

    Attributes:
      params: trained model parameters.
      linear_params: trained parameters of the linearised model.
      record: the joint :class:`~jaxbounds.training.TrainingRecord` (leaf names prefixed
        ``model/`` and ``linear/``; ``metrics`` holds the per-step losses and drifts).
      relative_movement: ||theta_T - theta_0|| / ||theta_0|| of the model.
      linear_relative_movement: the same for the linearised model.
      final_drift_train: max_n |f - f_lin| on the training inputs after training.
      final_drift_test: the same on the test inputs (None without test data).
      final_relative_drift: ||f_T - f_lin_T|| / ||f_T - f_0|| on the training inputs.
    """

    params: Any
    linear_params: Any
    record: TrainingRecord
    relative_movement: float
    linear_relative_movement: float
    final_drift_train: float
    final_drift_test: float | None
    final_relative_drift: float

    def summary(self) -> dict[str, float | None]:
        """The headline numbers as a flat dict."""
        metrics = self.record.metrics
        return {
            "loss_model": float(metrics["loss_model"][-1]),
            "loss_linear": float(metrics["loss_linear"][-1]),
            "relative_movement": self.relative_movement,
            "linear_relative_movement": self.linear_relative_movement,
            "drift_train": self.final_drift_train,
            "drift_test": self.final_drift_test,
            "relative_drift_train": self.final_relative_drift,
        }


@functools.cache
def _metrics_fn(apply_fn: Callable, loss_of: Callable) -> Callable:
    """``(pair, (p0, x, y, x_test)) -> {losses, drifts}`` of one GD step of the pair.

    One object per (model, loss), so that repeated :func:`ntk_regime` calls compile nothing.
    """

    def metrics(pair: dict[str, Any], data: tuple[Any, ...]) -> dict[str, jax.Array]:
        p0, x, y, x_test = data
        f_t = apply_fn(pair["model"], x)
        g_t = linearized_apply(apply_fn, pair["linear"], p0, x)
        moved = jnp.linalg.norm(f_t - apply_fn(p0, x))
        out = {
            "loss_model": loss_of(f_t, y),
            "loss_linear": loss_of(g_t, y),
            "drift_train": jnp.max(jnp.abs(f_t - g_t)),
            "relative_drift_train": jnp.linalg.norm(f_t - g_t)
            / jnp.maximum(moved, jnp.finfo(moved.dtype).tiny),
        }
        if x_test is not None:
            lin_test = linearized_apply(apply_fn, pair["linear"], p0, x_test)
            out["drift_test"] = jnp.max(jnp.abs(apply_fn(pair["model"], x_test) - lin_test))
        return out

    return metrics


def ntk_regime(
    apply_fn: Callable[[Any, Any], jax.Array],
    params0: Any,
    train: dict[str, Any],
    test: dict[str, Any] | None = None,
    *,
    learning_rate: float = 0.1,
    num_steps: int = 100,
    loss: str = "logistic",
    progress: bool = True,
) -> NTKRegimeResult:
    """Train ``apply_fn`` and its linearisation around ``params0`` with the same full-batch GD.

    Args:
      apply_fn: ``(params, inputs) -> (N,)`` scalar outputs (e.g. ``as_pure(model)[0]``).
      params0: the initialisation theta_0 (pytree).
      train: dict with ``"inputs"`` and ``"labels"`` (labels in {0, 1} for the logistic loss,
        real targets for the squared loss).
      test: optional held-out dict with the same keys (drift on it is recorded too).
      learning_rate: GD step size.
      num_steps: number of GD steps.
      loss: ``"logistic"`` (cross-entropy, as in the paper's experiment) or ``"squared"``
        (half the mean squared error).
      progress: progress bar on stderr.

    Returns:
      An :class:`NTKRegimeResult`.

    Raises:
      ValueError: for an unknown ``loss`` (and see :func:`~jaxbounds.training.train_gd`).
    """
    if loss not in LOSSES:
        raise ValueError(f"loss: expected one of {sorted(LOSSES)}, got {loss!r}")
    loss_of = LOSSES[loss]
    x_test = None if test is None else jnp.asarray(test["inputs"])
    batch = (params0, jnp.asarray(train["inputs"]), jnp.asarray(train["labels"]))
    pair, record = train_gd(
        _joint_loss(apply_fn, loss_of),
        {"model": params0, "linear": params0},
        batch,
        learning_rate=learning_rate,
        num_steps=num_steps,
        metrics_fn=_metrics_fn(apply_fn, loss_of),
        metrics_data=(*batch, x_test),
        record_spectral=False,
        progress=progress,
        label="[ntk-regime]",
    )
    return _result(pair, record, params0, x_test is not None)


@functools.cache
def _joint_loss(apply_fn: Callable, loss_of: Callable) -> Callable:
    """The sum of the model's and the linearisation's losses (one object per model and loss).

    theta_0 and the data go into the compiled steps as arguments, not closed-over constants
    (XLA would constant-fold the whole forward pass at theta_0 otherwise).
    """

    def joint_loss(pair: dict[str, Any], batch: tuple[Any, ...]) -> jax.Array:
        p0, x, y = batch
        lin = linearized_apply(apply_fn, pair["linear"], p0, x)
        return loss_of(apply_fn(pair["model"], x), y) + loss_of(lin, y)

    return joint_loss


def _result(pair: dict[str, Any], record: TrainingRecord, params0: Any, has_test: bool):
    norm0 = float(tree_norm(params0))
    denom = norm0 if norm0 > 0 else math.inf
    moved = {
        name: float(tree_norm(jax.tree_util.tree_map(jnp.subtract, pair[name], params0))) / denom
        for name in ("model", "linear")
    }
    m = record.metrics
    return NTKRegimeResult(
        params=pair["model"],
        linear_params=pair["linear"],
        record=record,
        relative_movement=moved["model"],
        linear_relative_movement=moved["linear"],
        final_drift_train=float(m["drift_train"][-1]),
        final_drift_test=float(m["drift_test"][-1]) if has_test else None,
        final_relative_drift=float(np.asarray(m["relative_drift_train"])[-1]),
    )
