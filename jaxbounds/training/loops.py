r"""Two shorthands of :func:`~jaxbounds.training.train` that return a :class:`TrainingRecord`.

Neither has a loop of its own; both are one call of the engine with every record point's loss,
weight norms and metrics:

- :func:`train_gd`: full-batch gradient descent $\theta_{t+1} = \theta_t - \gamma\nabla
  L(\theta_t)$ (optax ``sgd``), a record point at every step $t = 0..T$;
- :func:`train_minibatch`: any optax optimiser (Adam by default) on minibatches, a record point
  after every epoch (point 0 is the initialisation). Epoch $e$'s order is the permutation
  ``jax.random.permutation(fold_in(key, e), n)`` cut into $\lceil n/b\rceil$ minibatches, the
  last one filled up from the start of the permutation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TextIO

import jax
import optax

from jaxbounds.training.engine import make_step, train
from jaxbounds.training.records import TrainingRecord
from kernels._checks import check_positive_int

__all__ = ["make_step", "train_gd", "train_minibatch"]

LossFn = Callable[[Any, Any], jax.Array]
MetricsFn = Callable[[Any, Any], dict[str, jax.Array]]


@functools.cache
def _with_loss(loss_fn: LossFn, metrics_fn: MetricsFn | None) -> Callable:
    """``(params, (data, metrics_data)) -> {"loss", **metrics}`` (one object per pair)."""

    def evaluate(params: Any, both: tuple[Any, Any]) -> dict[str, jax.Array]:
        data, mdata = both
        out = {"loss": loss_fn(params, data)}
        if metrics_fn is not None:
            out |= dict(metrics_fn(params, mdata))
        return out

    return evaluate


def train_gd(
    loss_fn: LossFn,
    params: Any,
    batch: Any = (),
    *,
    learning_rate: float,
    num_steps: int,
    metrics_fn: MetricsFn | None = None,
    metrics_data: Any = None,
    record_spectral: bool = True,
    chunk_steps: int | None = None,
    progress: bool | TextIO = True,
    label: str = "[gd]",
) -> tuple[Any, TrainingRecord]:
    r"""Full-batch gradient descent $\theta_{t+1} = \theta_t - \gamma\nabla L(\theta_t)$, recorded.

    Records at every $t = 0..T$ the loss, the weight norms of every leaf (with $\|W_t\|_2$ if
    ``record_spectral``) and ``metrics_fn(theta_t, metrics_data)``: :func:`train` with
    ``optimizer=optax.sgd``, ``eval_every=1``.

    Args:
      loss_fn: ``(params, batch) -> scalar`` full-batch training loss.
      params: initial parameters theta_0 (pytree of arrays, e.g. a dict or an nnx ``State``).
      batch: the training data, any pytree (``()`` when ``loss_fn`` needs none).
      learning_rate: the step size gamma > 0 (the shallow paper uses 0.1).
      num_steps: T >= 0 steps.
      metrics_fn: optional ``(params, metrics_data) -> dict[str, scalar]`` recorded every step.
      metrics_data: the second argument of ``metrics_fn`` (default ``batch``).
      record_spectral: also record ||W_t||_2 every step (one small SVD per leaf).
      chunk_steps: steps per compiled call (the progress bar moves between calls); default 64.
      progress: True for a progress bar on stderr, False for none, or a text stream.
      label: progress bar prefix.

    Returns:
      ``(params_T, record)``, the record with ``T + 1`` points (fewer if the loss turned
      non-finite: the run stops there).

    Raises:
      ValueError: for a non-positive learning rate, negative ``num_steps``, a bad
        ``chunk_steps`` or a non-finite loss at initialisation.
    """
    if not (isinstance(learning_rate, int | float) and learning_rate > 0):
        raise ValueError(f"learning_rate: expected a positive number, got {learning_rate!r}")
    check_positive_int(num_steps, "num_steps", 0)
    if chunk_steps is not None:
        check_positive_int(chunk_steps, "chunk_steps")
    result = train(
        loss_fn, params, batch, optimizer=optax.sgd,
        hyperparams={"learning_rate": float(learning_rate)}, num_steps=num_steps,
        eval_fn=_with_loss(loss_fn, metrics_fn),
        eval_data=(batch, batch if metrics_data is None else metrics_data),
        norms="spectral" if record_spectral else "frobenius", evals_per_call=chunk_steps,
        progress=progress, label=label,
    )  # fmt: skip
    return result.last_params, result.record(params, learning_rate=float(learning_rate))


def train_minibatch(
    loss_fn: LossFn,
    params: Any,
    data: Any,
    key: jax.Array,
    *,
    num_epochs: int,
    batch_size: int = 128,
    learning_rate: float = 1e-3,
    optimizer: optax.GradientTransformation | None = None,
    metrics_fn: MetricsFn | None = None,
    metrics_data: Any = None,
    record_spectral: bool = False,
    progress: bool | TextIO = True,
    label: str = "[train]",
) -> tuple[Any, TrainingRecord]:
    """Minibatch optax training of ``loss_fn``, recorded after every epoch.

    A record point holds the full-data loss ``loss_fn(params, data)``, the weight norms and
    ``metrics_fn(params, metrics_data)`` (e.g. accuracies and a test loss); point 0 is the
    initialisation. :func:`train` with ``batch_size`` and ``eval_every`` one epoch.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss; ``batch`` has the structure of ``data``.
      params: initial parameters (pytree).
      data: pytree of arrays sharing a leading example axis of length n (e.g. ``(x, y)``).
      key: PRNG key of the minibatch permutations.
      num_epochs: passes over the data, >= 1.
      batch_size: minibatch size (clipped to n); an epoch is ceil(n / batch_size) steps.
      learning_rate: Adam's step size (ignored when ``optimizer`` is given).
      optimizer: any ``optax.GradientTransformation`` (default ``optax.adam(learning_rate)``,
        injected so that a new rate compiles nothing).
      metrics_fn: optional ``(params, metrics_data) -> dict[str, scalar]`` every epoch.
      metrics_data: the second argument of ``metrics_fn`` (default ``data``).
      record_spectral: also record ||W||_2 of every leaf every epoch.
      progress: True for a progress bar on stderr, False for none, or a text stream.
      label: progress bar prefix.

    Returns:
      ``(params, record)``, the record with ``num_epochs + 1`` points.

    Raises:
      ValueError: for num_epochs or batch_size < 1, ``data`` leaves of different lengths, or
        a non-finite loss at initialisation.
    """
    check_positive_int(num_epochs, "num_epochs")
    check_positive_int(batch_size, "batch_size")
    lengths = {int(a.shape[0]) for a in jax.tree_util.tree_leaves(data)}
    if len(lengths) != 1:
        raise ValueError(f"data: expected leaves of one length, got lengths {sorted(lengths)}")
    steps_per_epoch = -(-lengths.pop() // batch_size)
    opt, hyper = (optax.adam, {"learning_rate": learning_rate}) if optimizer is None else (
        optimizer, None)  # fmt: skip
    result = train(
        loss_fn, params, data, key, optimizer=opt, hyperparams=hyper,
        num_steps=num_epochs * steps_per_epoch, batch_size=batch_size,
        eval_every=steps_per_epoch, eval_fn=_with_loss(loss_fn, metrics_fn),
        eval_data=(data, data if metrics_data is None else metrics_data),
        norms="spectral" if record_spectral else "frobenius", evals_per_call=8,
        progress=progress, label=label,
    )  # fmt: skip
    return result.last_params, result.record(params)
