r"""Full-batch gradient descent that records what the shallow-Transformer GD bound needs.

Every step $t = 0, \dots, T$ records the training loss $L(\theta_t)$, the distance from
initialisation of every parameter matrix $\|W_t - W_0\|_F$ (Frobenius; the 2-norm for vectors),
its running maximum (the paper's $R_Q, R_K, R_V, R_O$ are the maxima over training), and the
spectral norm $\|W_t\|_2$ of every matrix. From these, :meth:`GDHistory.bound_inputs` gives
$\eta_* = \|W_*^0\|_F + R_*$ and $\xi_* = \|W_*^0\|_2 + R_*$ (Lemma 1, Lemma 4, Theorem 5).

The update is optax's ``sgd`` (plain GD, no momentum) on the full batch:
$\theta_{t+1} = \theta_t - \gamma \nabla L(\theta_t)$. Steps run inside ``lax.scan`` chunks
(one compiled program per chunk length); a progress bar goes to stderr between chunks.

References:
  Shallow-Transformer GD paper (``shared/papers/shallow_transformer_gd_generalization.md``),
  sections 3.1.4, 4.1-4.4.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "GDHistory",
    "binary_cross_entropy",
    "half_squared_error",
    "leaf_names",
    "logistic_loss",
    "spectral_norm",
    "squared_loss",
    "train_gd",
]


def logistic_loss(
    apply_fn: Callable[[Any, Any], jax.Array], inputs: jax.Array, labels: jax.Array
) -> Callable[[Any], jax.Array]:
    r"""Mean binary cross-entropy on labels in {0, 1}: $\frac1N\sum_n \log(1 + e^{-s_n f(X_n)})$.

    $s_n = 2 y_n - 1 \in \{-1, +1\}$. The loss is 1-Lipschitz in $f$, as the paper's bound
    requires, and is the cross-entropy of the paper's MNIST experiment.

    Args:
      apply_fn: ``(params, inputs) -> (N,)`` scores.
      inputs: the full training batch.
      labels: (N,) labels in {0, 1}.

    Returns:
      ``params -> scalar`` mean loss.
    """
    return lambda params: binary_cross_entropy(apply_fn(params, inputs), labels)


def squared_loss(
    apply_fn: Callable[[Any, Any], jax.Array], inputs: jax.Array, targets: jax.Array
) -> Callable[[Any], jax.Array]:
    r"""Half mean squared error $\frac{1}{2N}\|f - y\|_2^2$ ($= \Phi(\theta)/N$ of the paper)."""
    return lambda params: half_squared_error(apply_fn(params, inputs), targets)


def binary_cross_entropy(scores: jax.Array, labels: jax.Array) -> jax.Array:
    r"""$\frac1N\sum_n \log(1 + e^{-s_n f_n})$ with $s_n = 2y_n - 1$, labels $y_n \in \{0, 1\}$."""
    signs = 2 * labels.astype(scores.dtype) - 1
    return jnp.mean(jax.nn.softplus(-signs * scores))


def half_squared_error(preds: jax.Array, targets: jax.Array) -> jax.Array:
    r"""$\frac{1}{2N}\|f - y\|_2^2$."""
    return 0.5 * jnp.mean((preds - targets.astype(preds.dtype)) ** 2)


def leaf_names(params: Any) -> list[str]:
    """Readable names of the leaves of a parameter pytree, in ``tree_leaves`` order.

    Dict keys and attribute names are joined with ``/``; a trailing ``value`` (nnx ``Variable``)
    is dropped, so an nnx ``State`` and its pure dict give the same names.

    >>> leaf_names({"W_Q": 1, "sub": {"w": 2}})
    ['W_Q', 'sub/w']
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


def spectral_norm(w: jax.Array) -> jax.Array:
    r"""$\|W\|_2$ (largest singular value) of a matrix; the 2-norm of a vector; |w| of a scalar.

    Uses the eigenvalues of the smaller Gram matrix ($W^\top W$ or $W W^\top$), which is exact
    up to rounding and cheap for the tall (d_m, d) matrices of the shallow model. Leaves with
    more than two axes are reshaped to (shape[0], -1).
    """
    if w.ndim <= 1:
        return jnp.linalg.norm(w)
    w = w.reshape((w.shape[0], -1))
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    return jnp.sqrt(jnp.maximum(jnp.linalg.eigvalsh(gram)[-1], 0))


@dataclasses.dataclass
class GDHistory:
    """Per-step record of a full-batch GD run (all arrays have length ``num_steps + 1``).

    Attributes:
      names: parameter names (see :func:`leaf_names`).
      loss: training loss at theta_t, t = 0..T.
      distance: name -> ||W_t - W_0||_F per step (2-norm for vectors).
      spectral: name -> ||W_t||_2 per step (empty if not recorded).
      frobenius0: name -> ||W_0||_F.
      spectral0: name -> ||W_0||_2.
      metrics: name -> per-step values of the user's ``metrics_fn``.
      learning_rate: the step size gamma.
      seconds: wall time of the run (compile included).
    """

    names: list[str]
    loss: np.ndarray
    distance: dict[str, np.ndarray]
    spectral: dict[str, np.ndarray]
    frobenius0: dict[str, float]
    spectral0: dict[str, float]
    metrics: dict[str, np.ndarray]
    learning_rate: float
    seconds: float = 0.0

    @property
    def num_steps(self) -> int:
        """Number of GD steps T."""
        return len(self.loss) - 1

    @property
    def radius(self) -> dict[str, float]:
        """R_* = max over t of ||W_t - W_0||_F, per parameter (the paper's R_Q, R_K, R_V, R_O)."""
        return {n: float(np.max(d)) for n, d in self.distance.items()}

    @property
    def running_radius(self) -> dict[str, np.ndarray]:
        """Running maximum of the distance from initialisation, per step."""
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


class _Progress:
    """A minimal text progress bar on a stream (stderr by default)."""

    def __init__(self, total: int, stream: TextIO | None, label: str):
        self.total, self.stream, self.label = total, stream, label
        self.start = time.perf_counter()

    def update(self, done: int, loss: float) -> None:
        if self.stream is None:
            return
        width = 24
        fill = int(width * done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        self.stream.write(
            f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
            f"loss {loss:.4g} {elapsed:.1f}s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def train_gd(
    loss_fn: Callable[..., jax.Array],
    params: Any,
    *,
    learning_rate: float,
    num_steps: int,
    args: tuple[Any, ...] = (),
    metrics_fn: Callable[..., dict[str, jax.Array]] | None = None,
    record_spectral: bool = True,
    chunk_steps: int | None = None,
    progress: bool | TextIO = True,
    label: str = "[gd]",
) -> tuple[Any, GDHistory]:
    r"""Full-batch gradient descent $\theta_{t+1} = \theta_t - \gamma\nabla L(\theta_t)$, recorded.

    Records, at every $t = 0..T$: $L(\theta_t)$, $\|W_t - W_0\|_F$ and (optionally)
    $\|W_t\|_2$ for every leaf, and the scalars of ``metrics_fn(theta_t, *args)`` (e.g. a test
    loss).
    Deterministic: the same inputs give the same trajectory whatever ``chunk_steps`` is (up to
    XLA's reassociation between differently compiled chunks).

    Args:
      loss_fn: ``(params, *args) -> scalar`` full-batch training loss; with ``args=()`` it
        closes over the data.
      params: initial parameters theta_0 (pytree of arrays, e.g. an nnx ``State`` or a dict).
      learning_rate: the step size gamma > 0 (the paper uses 0.1).
      num_steps: T >= 0 steps.
      args: arrays passed to ``loss_fn`` and ``metrics_fn`` after ``params`` (e.g. the data).
        They enter the compiled steps as arguments; arrays that ``loss_fn`` closes over become
        compile-time constants instead, which XLA may spend a long time constant-folding when
        they are large, so pass large data here.
      metrics_fn: optional ``(params, *args) -> dict[str, scalar]`` recorded every step.
      record_spectral: also record ||W_t||_2 every step (one small eigendecomposition per leaf).
      chunk_steps: steps per compiled ``lax.scan`` chunk (the progress bar updates between
        chunks); default about T/20, at most 100.
      progress: True for a progress bar on stderr, False for none, or a text stream.
      label: progress bar prefix.

    Returns:
      ``(params_T, history)``.

    Raises:
      ValueError: for a non-positive learning rate, negative ``num_steps`` or a non-finite loss
        at initialisation.
    """
    if not (isinstance(learning_rate, int | float) and learning_rate > 0):
        raise ValueError(f"learning_rate: expected a positive number, got {learning_rate!r}")
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 0:
        raise ValueError(f"num_steps: expected a non-negative int, got {num_steps!r}")
    if chunk_steps is None:
        chunk_steps = max(1, min(100, num_steps // 20))
    if chunk_steps < 1:
        raise ValueError(f"chunk_steps: expected a positive int, got {chunk_steps!r}")
    stream = sys.stderr if progress is True else (None if progress is False else progress)

    names = leaf_names(params)
    params0 = params
    leaves0 = jax.tree_util.tree_leaves(params0)
    tx = optax.sgd(learning_rate)
    opt_state = tx.init(params)

    def record(p: Any, loss: jax.Array, p0: Any, args: tuple[Any, ...]) -> dict[str, Any]:
        leaves = jax.tree_util.tree_leaves(p)
        leaves0 = jax.tree_util.tree_leaves(p0)
        rec: dict[str, Any] = {
            "loss": loss,
            "distance": jnp.stack(
                [jnp.linalg.norm(a - b) for a, b in zip(leaves, leaves0, strict=True)]
            ),
        }
        if record_spectral:
            rec["spectral"] = jnp.stack([spectral_norm(a) for a in leaves])
        if metrics_fn is not None:
            rec["metrics"] = metrics_fn(p, *args)
        return rec

    grad_fn = jax.value_and_grad(loss_fn)

    @jax.jit
    def final(p: Any, p0: Any, args: tuple[Any, ...]) -> dict[str, Any]:
        return record(p, loss_fn(p, *args), p0, args)

    def make_chunk(length: int) -> Callable:
        @jax.jit
        def chunk(p: Any, state: Any, p0: Any, args: tuple[Any, ...]) -> tuple[Any, Any, Any]:
            def step(carry: tuple[Any, Any], _: None) -> tuple[tuple[Any, Any], dict[str, Any]]:
                p, state = carry
                loss, grads = grad_fn(p, *args)
                rec = record(p, loss, p0, args)
                updates, state = tx.update(grads, state, p)
                return (optax.apply_updates(p, updates), state), rec

            (p, state), recs = jax.lax.scan(step, (p, state), None, length=length)
            return p, state, recs

        return chunk

    compiled: dict[int, Callable] = {}
    records = []
    bar = _Progress(num_steps, stream, label)
    start = time.perf_counter()
    done = 0
    while done < num_steps:
        length = min(chunk_steps, num_steps - done)
        if length not in compiled:
            compiled[length] = make_chunk(length)
        params, opt_state, recs = compiled[length](params, opt_state, params0, args)
        recs = jax.device_get(recs)
        if done == 0 and not np.isfinite(recs["loss"][0]):
            bar.close()
            raise ValueError(f"loss_fn: the loss at initialisation is {recs['loss'][0]}")
        records.append(recs)
        done += length
        bar.update(done, float(recs["loss"][-1]))
    last = jax.device_get(final(params, params0, args))
    if num_steps == 0 and not np.isfinite(last["loss"]):
        raise ValueError(f"loss_fn: the loss at initialisation is {last['loss']}")
    records.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[None], last))
    bar.close()
    stacked = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *records)

    spec0 = [float(spectral_norm(a)) for a in leaves0]
    history = GDHistory(
        names=names,
        loss=stacked["loss"],
        distance={n: stacked["distance"][:, i] for i, n in enumerate(names)},
        spectral=(
            {n: stacked["spectral"][:, i] for i, n in enumerate(names)} if record_spectral else {}
        ),
        frobenius0={n: float(jnp.linalg.norm(a)) for n, a in zip(names, leaves0, strict=True)},
        spectral0=dict(zip(names, spec0, strict=True)),
        metrics=dict(stacked.get("metrics", {})),
        learning_rate=float(learning_rate),
        seconds=time.perf_counter() - start,
    )
    return params, history
