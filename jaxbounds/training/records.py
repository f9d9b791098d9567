r"""What the training loops record, and the leaf names it is keyed by.

:class:`TrainingRecord` is the one record type of :func:`~jaxbounds.training.train_gd` (a record
point every step) and :func:`~jaxbounds.training.train_minibatch` (a record point every epoch).
At every record point $t$ (index 0 is the initialisation) it holds the training loss, for every
parameter leaf $W$ the distance from initialisation $\|W_t - W_0\|_F$, the norm $\|W_t\|_F$ and
optionally $\|W_t\|_2$, and the scalars of the caller's ``metrics_fn``. From these,
:meth:`TrainingRecord.bound_inputs` gives the shallow-Transformer GD bound's
$R_* = \max_t \|W_{*,t} - W_{*,0}\|_F$, $\eta_* = \|W_*^0\|_F + R_*$ and
$\xi_* = \|W_*^0\|_2 + R_*$ (Lemma 1, Lemma 4, Theorem 5).

References:
  Shallow-Transformer GD paper (``shared/papers/shallow_transformer_gd_generalization.md``),
  sections 3.1.4, 4.1-4.4.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import runtime_checks
from kernels.norms import spectral_norm

__all__ = ["TrainingRecord", "leaf_names", "leaf_spectral_norm", "weight_norms"]


def leaf_names(params: Any) -> list[str]:
    """Readable names of the leaves of a parameter pytree, in ``tree_leaves`` order.

    Dict keys, attribute names and sequence indices are joined with ``/``; a trailing ``value``
    (nnx ``Variable``) is dropped, so an nnx ``State`` and its pure dict give the same names.

    >>> leaf_names({"W_Q": 1, "sub": {"w": 2}, "layers": [3]})
    ['W_Q', 'layers/0', 'sub/w']
    """
    names = []
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        parts = []
        for entry in path:
            for attr in ("key", "name", "idx"):
                if hasattr(entry, attr):
                    parts.append(str(getattr(entry, attr)))
                    break
            else:
                parts.append(str(entry))
        if len(parts) > 1 and parts[-1] == "value":
            parts = parts[:-1]
        names.append("/".join(parts) or "param")
    return names


def leaf_spectral_norm(w: jax.Array) -> jax.Array:
    r"""$\|W\|_2$ of a matrix (:func:`kernels.norms.spectral_norm`); the 2-norm of a vector.

    Leaves with more than two axes are reshaped to (shape[0], -1) first; a scalar gives |w|.

    >>> import jax.numpy as jnp
    >>> float(leaf_spectral_norm(jnp.array([3.0, 4.0]))), float(leaf_spectral_norm(jnp.eye(2)))
    (5.0, 1.0)
    """
    if w.ndim <= 1:
        return jnp.linalg.norm(w)
    # the weights of a diverged lane are inf or NaN: their norm is recorded as NaN (the engine
    # reports the divergence) rather than failing spectral_norm's finiteness check in the program
    with runtime_checks(False):
        return spectral_norm(w.reshape((w.shape[0], -1)))


def weight_norms(params: Any, params0: Any, *, spectral: bool) -> dict[str, jax.Array]:
    """Per-leaf norms of one record point, each stacked in ``tree_leaves`` order (traceable).

    Returns:
      ``{"distance": ||W - W_0||_F, "frobenius": ||W||_F}`` and, if ``spectral``,
      ``"spectral": ||W||_2`` (see :func:`leaf_spectral_norm`); each a (num_leaves,) array.
    """
    leaves = jax.tree_util.tree_leaves(params)
    leaves0 = jax.tree_util.tree_leaves(params0)
    out = {
        "distance": jnp.stack(
            [jnp.linalg.norm(a - b) for a, b in zip(leaves, leaves0, strict=True)]
        ),
        "frobenius": jnp.stack([jnp.linalg.norm(a) for a in leaves]),
    }
    if spectral:
        out["spectral"] = jnp.stack([leaf_spectral_norm(a) for a in leaves])
    return out


@dataclasses.dataclass
class TrainingRecord:
    """Values at every record point of a training run (arrays with one entry per record point).

    Attributes:
      names: parameter leaf names (see :func:`leaf_names`).
      step: optimiser steps taken before each record point (0 first).
      epoch: passes over the training data before each record point (equal to ``step`` for
        full-batch GD).
      loss: training loss at each record point.
      distance: name -> ||W_t - W_0||_F per record point (2-norm for vectors).
      frobenius: name -> ||W_t||_F per record point.
      spectral: name -> ||W_t||_2 per record point (empty if not recorded).
      frobenius0: name -> ||W_0||_F.
      spectral0: name -> ||W_0||_2.
      metrics: name -> per-record-point values of the caller's ``metrics_fn``.
      learning_rate: the step size for plain GD, else None.
      seconds: wall time of the run (compilation included).
    """

    names: list[str]
    step: np.ndarray
    epoch: np.ndarray
    loss: np.ndarray
    distance: dict[str, np.ndarray]
    frobenius: dict[str, np.ndarray]
    spectral: dict[str, np.ndarray]
    frobenius0: dict[str, float]
    spectral0: dict[str, float]
    metrics: dict[str, np.ndarray]
    learning_rate: float | None = None
    seconds: float = 0.0

    @property
    def num_steps(self) -> int:
        """Optimiser steps of the whole run."""
        return int(self.step[-1])

    @property
    def radius(self) -> dict[str, float]:
        """R_* = max over t of ||W_t - W_0||_F, per parameter (the paper's R_Q, R_K, R_V, R_O)."""
        return {n: float(np.max(d)) for n, d in self.distance.items()}

    @property
    def running_radius(self) -> dict[str, np.ndarray]:
        """Running maximum of the distance from initialisation, per record point."""
        return {n: np.maximum.accumulate(d) for n, d in self.distance.items()}

    @property
    def total_radius(self) -> float:
        """R = sqrt(R_Q^2 + R_K^2 + R_V^2 + R_O^2) (over all parameters)."""
        return math.sqrt(sum(r * r for r in self.radius.values()))

    def bound_inputs(self) -> dict[str, dict[str, float]]:
        """eta_* = ||W_*^0||_F + R_* and xi_* = ||W_*^0||_2 + R_* per parameter, plus R_*."""
        radius = self.radius
        return {
            "R": radius,
            "eta": {n: self.frobenius0[n] + radius[n] for n in self.names},
            "xi": {n: self.spectral0[n] + radius[n] for n in self.names},
        }

    def final(self) -> dict[str, float]:
        """The last record point's loss and metrics as floats."""
        return {"loss": float(self.loss[-1])} | {
            k: float(np.asarray(v)[-1]) for k, v in self.metrics.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (arrays become lists)."""
        return jax.tree_util.tree_map(
            lambda a: np.asarray(a).tolist() if isinstance(a, np.ndarray) else a,
            dataclasses.asdict(self),
        )


def initial_norms(params0: Any) -> tuple[dict[str, float], dict[str, float]]:
    """``(frobenius0, spectral0)``: ||W_0||_F and ||W_0||_2 of every leaf, keyed by name."""
    names = leaf_names(params0)
    leaves0 = jax.tree_util.tree_leaves(params0)
    frob = {n: float(jnp.linalg.norm(a)) for n, a in zip(names, leaves0, strict=True)}
    spec = {n: float(leaf_spectral_norm(a)) for n, a in zip(names, leaves0, strict=True)}
    return frob, spec


def assemble(
    params0: Any,
    points: list[dict[str, Any]],
    *,
    step: np.ndarray,
    epoch: np.ndarray,
    learning_rate: float | None,
    start: float,
) -> TrainingRecord:
    """Stack the loops' per-chunk record dicts into a record; ``start`` is the run's start time."""
    names = leaf_names(params0)
    stacked = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *points)

    def per_leaf(key: str) -> dict[str, np.ndarray]:
        if key not in stacked:
            return {}
        return {n: stacked[key][:, i] for i, n in enumerate(names)}

    frob0, spec0 = initial_norms(params0)
    return TrainingRecord(
        names=names,
        step=np.asarray(step),
        epoch=np.asarray(epoch),
        loss=stacked["loss"],
        distance=per_leaf("distance"),
        frobenius=per_leaf("frobenius"),
        spectral=per_leaf("spectral"),
        frobenius0=frob0,
        spectral0=spec0,
        metrics=dict(stacked.get("metrics", {})),
        learning_rate=learning_rate,
        seconds=time.perf_counter() - start,
    )
