"""What a run builder hands to the report sections: the :class:`Run` and its typed facts.

A builder (:mod:`jaxbounds.report.runs`) makes the data, trains or constructs the model and
returns a :class:`Run`. Everything model-specific that sections read travels in ``run.facts``,
a frozen dataclass per model (:class:`ScalarFacts`, :class:`ShallowFacts`,
:class:`ConstructionFacts`), so a misspelt fact is an ``AttributeError``, not a silently
missing dict key. Every facts type carries ``quantities``, the model's record of what its
papers' bounds take, which the ``bounds`` section hands to
:func:`jaxbounds.bounds.from_model.from_model`. Sections pass nothing to each other, so they may
run in any order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxbounds.data.boolean import FourierFunction
from jaxbounds.models.construction import ConstructionQuantities
from jaxbounds.models.scalar import ScalarQuantities
from jaxbounds.models.shallow import ShallowQuantities
from jaxbounds.training.records import TrainingRecord

__all__ = ["ConstructionFacts", "Run", "ScalarConfig", "ScalarFacts", "ShallowFacts"]


@dataclasses.dataclass(frozen=True)
class ScalarConfig:
    """Sizes of the ``scalar`` run (data, model, training, and the curvature section's budget)."""

    embed_dim: int = 32
    seq_len: int = 20
    sparsity: int = 9
    num_train: int = 300
    num_test: int = 2000
    num_layers: int = 1
    num_heads: int = 2
    activation: str = "relu"
    num_epochs: int = 200
    batch_size: int = 128
    learning_rate: float = 3e-3
    num_probes: int = 100
    hutchpp_matvecs: int = 99
    lanczos_steps: int = 30
    top_k: int = 3


@dataclasses.dataclass(frozen=True)
class ScalarFacts:
    """Facts of the ``scalar`` run: its sizes, the initialisation and the bound quantities."""

    config: ScalarConfig
    init_params: Any
    quantities: ScalarQuantities


@dataclasses.dataclass(frozen=True)
class ShallowFacts:
    """Facts of the ``shallow`` run.

    Attributes:
      params0: the initial parameters (``W_Q``, ``W_K``, ``W_V``, ``w_O``).
      description: one line naming the data set used.
      source: ``"mnist"``, ``"sklearn-digits"`` or ``"synthetic"``.
      token_dim: d.
      quantities: what Lemma 1, Lemma 4 and Theorem 5 take.
    """

    params0: Any
    description: str
    source: str
    token_dim: int
    quantities: ShallowQuantities


@dataclasses.dataclass(frozen=True)
class ConstructionFacts:
    """Facts of the ``construction`` run.

    Attributes:
      function: the Boolean target f.
      seq_len: T.
      grad_sq: (2^T,) per-input ||grad_theta f_theta(x)||^2 (the NTK diagonal).
      quantities: what the semi-analytic PAC-Bayes bound takes.
    """

    function: FourierFunction
    seq_len: int
    grad_sq: jax.Array
    quantities: ConstructionQuantities


@dataclasses.dataclass
class Run:
    """Everything the sections need about one trained (or constructed) model.

    Attributes:
      name: model name (``"scalar"``, ``"shallow"``, ``"construction"``).
      model: the flax nnx module.
      apply_fn: ``(params, inputs) -> outputs``.
      params: the trained parameters (pytree).
      loss_fn: ``(params, batch) -> scalar`` mean training loss; ``batch`` is shaped like
        ``train`` (see :meth:`train_loss`).
      train: training data, a dict with at least ``"inputs"`` and ``"labels"``.
      test: held-out data with the same keys (or None).
      record: the training record, or None for a constructed model.
      facts: the model's typed facts.
      key: PRNG key reserved for the sections' Monte Carlo draws.
      quick: True for the small default run (minutes on 2 CPU cores).
      meta: JSON metadata of the run; sections may add timings.
    """

    name: str
    model: Any
    apply_fn: Callable[[Any, Any], Any]
    params: Any
    loss_fn: Callable[[Any, Any], jax.Array]
    train: dict[str, Any]
    facts: ScalarFacts | ShallowFacts | ConstructionFacts
    test: dict[str, Any] | None = None
    record: TrainingRecord | None = None
    key: jax.Array | None = None
    quick: bool = True
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def train_loss(self) -> Callable[[Any], jax.Array]:
        """``params -> loss_fn(params, train)``: the training loss with the data closed over."""
        return lambda params: self.loss_fn(params, self.train)

    def section_key(self, name: str) -> jax.Array:
        """A PRNG key for one section, derived from ``key`` and the section name."""
        base = self.key if self.key is not None else jax.random.key(0)
        return jax.random.fold_in(base, sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**31)
