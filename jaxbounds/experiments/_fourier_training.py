r"""Training of the learnable twin on a random Fourier target, shared by two experiments.

``pac-bayes-flatness`` and ``pac-bayes-gap`` (arXiv 2605.20988, Sections 2.1-2.2) both train the
learnable twin :class:`~jaxbounds.models.construction.ConstructionTransformer` (2 attention
layers, 1 head, one MLP, no LayerNorm, one-hot positions) with the quadratic loss on the
values of a target $f = \sum_t c_t\chi_{S_t}$ until the training loss is below a threshold
(the paper: 0.02) or a step cap. This module is the one place where that training lives:

- :func:`target_function`: the (class, seed) function, with either normalisation; the
  ``"unit_norm"`` and ``"centred"`` functions of one (class, seed) share their subsets and
  the $|z_t|$ they are normalised from (same key);
- :func:`train_twin`: full-batch Adam on the training engine
  (:func:`jaxbounds.training.train`); every ``chunk_steps`` steps the full training loss is
  checked and training stops at the first check at or below ``loss_threshold`` (or at
  ``max_steps``). The result records whether the threshold was reached.

The model is evaluated through :func:`jaxbounds.experiments.pac_bayes_perturbation.forward`
(the same function as the module, on the parameter dict), so one compiled program serves every
function of a shape.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbounds.data.boolean import FourierFunction, random_fourier_function
from jaxbounds.experiments.pac_bayes_perturbation import forward, grad_sq, loss
from jaxbounds.models import as_pure
from jaxbounds.models.construction import ConstructionTransformer
from jaxbounds.training import train
from kernels._checks import check_positive_int

__all__ = [
    "TrainedModel",
    "apply",
    "evaluate_loss",
    "grad_sq",
    "init_params",
    "loss",
    "target_function",
    "train_twin",
]


def target_function(
    *, num_bits: int, degree: int, sparsity: int, seed: int, normalization: str
) -> FourierFunction:
    """The random Fourier target of one (class, seed), float64 coefficients.

    The key depends on (seed, degree, sparsity, num_bits) only, so both normalisations of one
    (class, seed) have the same subsets and the same $|z_t|$.
    """
    key = jax.random.fold_in(jax.random.key(seed), 1000 * degree + sparsity)
    with jax.enable_x64(True):
        f = random_fourier_function(
            jax.random.fold_in(key, num_bits), num_bits=num_bits, degree=degree,
            sparsity=sparsity, normalization=normalization,
        )  # fmt: skip
        return FourierFunction(f.subsets, jnp.asarray(f.coefficients, jnp.float64))


def init_params(seq_len: int, mlp_width: int, seed: int) -> dict[str, jax.Array]:
    """The twin's random initialisation (N(0, 1/fan-in) entries) as a float64 dict."""
    with jax.enable_x64(True):
        model = ConstructionTransformer(
            seq_len, mlp_width=mlp_width, rngs=nnx.Rngs(seed), dtype=jnp.float64
        )
        return as_pure(model)[1]


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A trained twin and how its training went.

    Attributes:
      params: the final parameters (dict of float64 arrays, the keys of :func:`forward`).
      train_loss: full training loss at ``params``.
      num_steps: Adam steps taken.
      reached: whether ``train_loss <= loss_threshold``.
      losses: training loss at every check after the start (the loss curve).
    """

    params: dict[str, jax.Array]
    train_loss: float
    num_steps: int
    reached: bool
    losses: tuple[float, ...]


def train_twin(
    bits: jax.Array,
    labels: jax.Array,
    *,
    seed: int,
    mlp_width: int,
    learning_rate: float,
    loss_threshold: float,
    max_steps: int,
    chunk_steps: int,
) -> TrainedModel:
    """Train the twin on ``(bits, labels)`` with full-batch Adam until the loss <= threshold.

    One call of the training engine (:func:`jaxbounds.training.train`, float64): full-batch
    Adam, the training loss evaluated at the start and every ``chunk_steps`` steps, the run
    stopped at the first evaluation at or below ``loss_threshold`` (or at ``max_steps``, or when
    the loss turns non-finite).

    Args:
      bits: (m, T) integer training inputs.
      labels: (m,) float64 targets.
      seed: seed of the initialisation.
      mlp_width: MLP width of the twin (>= 1).
      learning_rate: Adam's step size (> 0).
      loss_threshold: stop once the mean quadratic loss is at or below this (> 0; the paper:
        0.02).
      max_steps: step cap (>= 1).
      chunk_steps: how often (in steps) the loss is checked (>= 1).

    Returns:
      A :class:`TrainedModel`.

    Raises:
      ValueError: naming the argument, for a bad size, rate or threshold.
    """
    check_positive_int(mlp_width, "mlp_width")
    check_positive_int(max_steps, "max_steps")
    check_positive_int(chunk_steps, "chunk_steps")
    for name, value in (("learning_rate", learning_rate), ("loss_threshold", loss_threshold)):
        if not (isinstance(value, int | float) and np.isfinite(value) and value > 0):
            raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    with jax.enable_x64(True):
        bits = jnp.asarray(bits)
        params = init_params(bits.shape[1], mlp_width, seed)
        batch = {"bits": bits, "labels": jnp.asarray(labels, jnp.float64)}
        result = train(
            loss, params, batch, optimizer=optax.adam,
            hyperparams={"learning_rate": float(learning_rate)}, num_steps=int(max_steps),
            eval_every=int(chunk_steps), loss_threshold=float(loss_threshold),
        )  # fmt: skip
    losses = np.asarray(result.metrics["loss"], np.float64)
    return TrainedModel(
        result.params, float(losses[-1]), int(result.steps), bool(result.reached),
        tuple(float(v) for v in losses[1:]),
    )  # fmt: skip


def evaluate_loss(params: Mapping[str, jax.Array], bits: jax.Array, labels: jax.Array) -> float:
    """Mean quadratic loss of ``params`` on ``(bits, labels)`` (float64)."""
    with jax.enable_x64(True):
        return float(_loss_jit()(params, {"bits": jnp.asarray(bits), "labels": labels}))


@functools.cache
def _loss_jit():
    return jax.jit(loss)


#: Re-exported for the experiments: the twin's output on the parameter dict.
apply = forward
