r"""Is a GD run in the NTK (lazy) regime? Train a model and its linearisation side by side.

Both start from the same $\theta_0$ and take the same full-batch GD steps on the same loss:
the model $f(\theta; x)$ and its first-order Taylor model
$f^{lin}(\theta; x) = f(\theta_0; x) + J_{\theta_0}(x)(\theta - \theta_0)$
(as :func:`jaxbounds.models.ntk.linearize_model`). In the NTK regime (wide models, small steps) the
two trajectories stay together: the weights move little relative to their size, and the
predictions of the trained model and of the trained linear model agree.

Recorded every step (both runs share one :func:`jaxbounds.gd.train_gd` call on the pair
``{"model": theta, "linear": theta_lin}``; the loss is the sum of the two losses, whose gradient
is the two separate gradients, so each half follows its own GD exactly):

- the training loss of each model;
- ``drift_train`` / ``drift_test``: $\max_n |f(\theta_t; x_n) - f^{lin}(\theta^{lin}_t; x_n)|$;
- ``relative_drift_train``: $\|f_t - f^{lin}_t\|_2 / \|f_t - f_0\|_2$ on the training inputs
  (0 in the lazy limit; order 1 when the model has left the linear regime);
- per-matrix distance from initialisation of both runs, and the relative movement
  $\|\theta_t - \theta_0\|_2 / \|\theta_0\|_2$.

References:
  Lee et al. 2019, arXiv:1902.06720; Chizat, Oyallon, Bach 2019, "On lazy training in
  differentiable programming", arXiv:1812.07956.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbounds.gd import GDHistory, binary_cross_entropy, half_squared_error, train_gd

__all__ = ["NTKRegimeResult", "ntk_regime"]


@dataclasses.dataclass
class NTKRegimeResult:
    """Outcome of :func:`ntk_regime`.

    Attributes:
      params: trained model parameters.
      linear_params: trained parameters of the linearised model.
      history: the joint :class:`~jaxbounds.gd.GDHistory` (leaf names prefixed ``model/`` and
        ``linear/``; ``metrics`` holds the per-step losses and drifts).
      relative_movement: ||theta_T - theta_0|| / ||theta_0|| of the model.
      linear_relative_movement: the same for the linearised model.
      final_drift_train: max_n |f - f_lin| on the training inputs after training.
      final_drift_test: the same on the test inputs (None without test data).
      final_relative_drift: ||f_T - f_lin_T|| / ||f_T - f_0|| on the training inputs.
    """

    params: Any
    linear_params: Any
    history: GDHistory
    relative_movement: float
    linear_relative_movement: float
    final_drift_train: float
    final_drift_test: float | None
    final_relative_drift: float

    def summary(self) -> dict[str, float | None]:
        """The headline numbers as a flat dict."""
        metrics = self.history.metrics
        return {
            "loss_model": float(metrics["loss_model"][-1]),
            "loss_linear": float(metrics["loss_linear"][-1]),
            "relative_movement": self.relative_movement,
            "linear_relative_movement": self.linear_relative_movement,
            "drift_train": self.final_drift_train,
            "drift_test": self.final_drift_test,
            "relative_drift_train": self.final_relative_drift,
        }


def _norm(tree: Any) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(leaf * leaf) for leaf in jax.tree_util.tree_leaves(tree)))


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
      loss: ``"logistic"`` (cross-entropy, as in the paper's experiment) or ``"squared"``.
      progress: progress bar on stderr.

    Returns:
      An :class:`NTKRegimeResult`.

    Raises:
      ValueError: for an unknown ``loss`` (and see :func:`jaxbounds.gd.train_gd`).
    """
    losses = {"logistic": binary_cross_entropy, "squared": half_squared_error}
    if loss not in losses:
        raise ValueError(f"loss: expected one of {sorted(losses)}, got {loss!r}")
    loss_of = losses[loss]

    # theta_0 and the data go into the compiled steps as arguments, not closed-over constants
    # (XLA would constant-fold the whole forward pass at theta_0 otherwise).
    def apply_lin(params: Any, p0: Any, inputs: jax.Array) -> jax.Array:
        delta = jax.tree_util.tree_map(jnp.subtract, params, p0)
        out, tangent = jax.jvp(lambda p: apply_fn(p, inputs), (p0,), (delta,))
        return out + tangent

    def joint_loss(pair: dict[str, Any], p0: Any, x: jax.Array, y: jax.Array, _: Any) -> jax.Array:
        return loss_of(apply_fn(pair["model"], x), y) + loss_of(apply_lin(pair["linear"], p0, x), y)

    def metrics(
        pair: dict[str, Any], p0: Any, x: jax.Array, y: jax.Array, x_test: Any
    ) -> dict[str, jax.Array]:
        f_t = apply_fn(pair["model"], x)
        g_t = apply_lin(pair["linear"], p0, x)
        moved = jnp.linalg.norm(f_t - apply_fn(p0, x))
        out = {
            "loss_model": loss_of(f_t, y),
            "loss_linear": loss_of(g_t, y),
            "drift_train": jnp.max(jnp.abs(f_t - g_t)),
            "relative_drift_train": jnp.linalg.norm(f_t - g_t)
            / jnp.maximum(moved, jnp.finfo(moved.dtype).tiny),
        }
        if x_test is not None:
            out["drift_test"] = jnp.max(
                jnp.abs(apply_fn(pair["model"], x_test) - apply_lin(pair["linear"], p0, x_test))
            )
        return out

    x_test = None if test is None else jnp.asarray(test["inputs"])
    args = (params0, jnp.asarray(train["inputs"]), jnp.asarray(train["labels"]), x_test)
    pair0 = {"model": params0, "linear": params0}
    pair, history = train_gd(
        joint_loss,
        pair0,
        learning_rate=learning_rate,
        num_steps=num_steps,
        args=args,
        metrics_fn=metrics,
        record_spectral=False,
        progress=progress,
        label="[ntk-regime]",
    )
    norm0 = float(_norm(params0))
    diff = jax.tree_util.tree_map(jnp.subtract, pair["model"], params0)
    diff_lin = jax.tree_util.tree_map(jnp.subtract, pair["linear"], params0)
    m = history.metrics
    drift_test = None if x_test is None else float(m["drift_test"][-1])
    denom = norm0 if norm0 > 0 else math.inf
    return NTKRegimeResult(
        params=pair["model"],
        linear_params=pair["linear"],
        history=history,
        relative_movement=float(_norm(diff)) / denom,
        linear_relative_movement=float(_norm(diff_lin)) / denom,
        final_drift_train=float(m["drift_train"][-1]),
        final_drift_test=drift_test,
        final_relative_drift=float(np.asarray(m["relative_drift_train"])[-1]),
    )
