r"""Optax training loops that record what the bounds need, epoch by epoch.

:func:`train` fits any nnx module ``model(inputs) -> outputs`` by minibatch gradient descent
(Adam by default) on a dict data set with ``"inputs"`` and ``"labels"``. Each epoch is a random
permutation cut into ceil(n / batch_size) minibatches, the last one filled up with the first
examples of the permutation so every (jitted) step has the same shape. After each epoch the
record gets the full-data training loss / accuracy, the test loss / accuracy, the Frobenius
norm of every weight matrix, the total $\ell_1$ and $\ell_2$ norms of all parameters and the
$\ell_2$ distance from the initialisation. A one-line progress bar goes to stderr.

Losses (chosen from the output shape by :func:`task_loss`):

- scalar outputs $f \in \mathbb{R}$, labels $y \in \{0, 1\}$: logistic loss
  $\log(1 + e^{-(2y - 1) f})$ (1-Lipschitz in $f$); prediction $\mathbb{1}\{f > 0\}$;
- logits $f \in \mathbb{R}^K$, labels in $\{0..K-1\}$: softmax cross-entropy; prediction
  $\arg\max_k f_k$.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbounds.models.pure import as_pure, set_params

__all__ = ["TrainRecord", "task_accuracy", "task_loss", "train"]


def task_loss(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    r"""Mean logistic loss (scalar outputs) or softmax cross-entropy (logits).

    Args:
      outputs: (n,) scalar outputs or (n, K) logits.
      labels: (n,) ints, in {0, 1} for scalar outputs, in {0..K-1} for logits.

    Returns:
      The mean loss, a scalar of the outputs' dtype.

    >>> import jax.numpy as jnp
    >>> task_loss(jnp.array([0.0, 0.0]), jnp.array([0, 1]))  # log 2
    Array(0.69314718, dtype=float64)
    """
    if outputs.ndim == labels.ndim:
        signs = (2 * labels - 1).astype(outputs.dtype)
        return jnp.mean(jnp.logaddexp(jnp.zeros_like(outputs), -signs * outputs))
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(outputs, labels))


def task_accuracy(outputs: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of correct predictions: ``outputs > 0`` (scalar) or ``argmax`` (logits).

    >>> import jax.numpy as jnp
    >>> task_accuracy(jnp.array([1.0, -1.0, 2.0]), jnp.array([1, 1, 1]))
    Array(0.66666667, dtype=float64)
    """
    preds = (outputs > 0) if outputs.ndim == labels.ndim else jnp.argmax(outputs, axis=-1)
    return jnp.mean((preds.astype(labels.dtype) == labels).astype(jnp.result_type(float)))


@dataclasses.dataclass
class TrainRecord:
    """Per-epoch training record (index 0 is the initialisation, before any step).

    Attributes:
      epoch: 0, 1, ..., num_epochs.
      train_loss: loss on the whole training set.
      train_accuracy: accuracy on the whole training set.
      test_loss: loss on the test set (empty without test data).
      test_accuracy: accuracy on the test set (empty without test data).
      frobenius: matrix name -> its Frobenius norm per epoch.
      l1_total: sum of |theta_j| over all parameters.
      l2_total: Euclidean norm of all parameters.
      distance_from_init: ||theta - theta_0||_2.
      seconds: wall time of the whole loop (compilation included).
    """

    epoch: list[int] = dataclasses.field(default_factory=list)
    train_loss: list[float] = dataclasses.field(default_factory=list)
    train_accuracy: list[float] = dataclasses.field(default_factory=list)
    test_loss: list[float] = dataclasses.field(default_factory=list)
    test_accuracy: list[float] = dataclasses.field(default_factory=list)
    frobenius: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    l1_total: list[float] = dataclasses.field(default_factory=list)
    l2_total: list[float] = dataclasses.field(default_factory=list)
    distance_from_init: list[float] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return dataclasses.asdict(self)

    def final(self) -> dict[str, float]:
        """The last epoch's scalar values (loss, accuracy, norms)."""
        out: dict[str, float] = {}
        for name in (
            "train_loss",
            "train_accuracy",
            "test_loss",
            "test_accuracy",
            "l1_total",
            "l2_total",
            "distance_from_init",
        ):
            values = getattr(self, name)
            if values:
                out[name] = values[-1]
        return out


def _leaf_matrices(params: Any) -> dict[str, jax.Array]:
    """Every parameter leaf under its dotted path (fallback for models without names)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {
        ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
        for path, leaf in flat
    }


@functools.partial(jax.jit, static_argnums=(1, 2))
def _permutations(key: jax.Array, n: int, num_epochs: int) -> jax.Array:
    """One random permutation of range(n) per epoch, (num_epochs, n), in one compiled call."""
    return jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(key, num_epochs))


class _Progress:
    """A one-line text progress bar on stderr (no dependency)."""

    def __init__(self, total: int, enabled: bool, width: int = 30):
        self.total, self.enabled, self.width = total, enabled, width
        self.last = 0.0

    def update(self, done: int, text: str) -> None:
        now = time.perf_counter()
        if not self.enabled or (done < self.total and now - self.last < 0.2):
            return
        self.last = now
        filled = int(self.width * done / max(self.total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{self.total} {text}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def train(
    model: nnx.Module,
    data: Mapping[str, Any],
    key: jax.Array,
    *,
    num_epochs: int,
    batch_size: int = 128,
    learning_rate: float = 1e-3,
    optimizer: optax.GradientTransformation | None = None,
    test_data: Mapping[str, Any] | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = task_loss,
    accuracy_fn: Callable[[jax.Array, jax.Array], jax.Array] = task_accuracy,
    eval_chunk_size: int = 4096,
    progress: bool = True,
) -> tuple[nnx.Module, TrainRecord]:
    """Train ``model`` in place by minibatch optax steps and record every epoch.

    Args:
      model: nnx module, ``model(inputs[batch]) -> outputs[batch]``.
      data: dict with ``"inputs"`` (n, ...) and ``"labels"`` (n,).
      key: PRNG key for the minibatch permutations.
      num_epochs: passes over the data, >= 1.
      batch_size: minibatch size (clipped to n); an epoch is ceil(n / batch_size) steps.
      learning_rate: Adam's step size (ignored when ``optimizer`` is given).
      optimizer: any ``optax.GradientTransformation`` (default ``optax.adam(learning_rate)``).
      test_data: optional held-out dict with the same keys, evaluated every epoch.
      loss_fn: ``(outputs, labels) -> scalar`` (default :func:`task_loss`).
      accuracy_fn: ``(outputs, labels) -> scalar`` (default :func:`task_accuracy`).
      eval_chunk_size: examples per vectorised chunk when evaluating (memory bound).
      progress: draw a progress bar on stderr.

    Returns:
      ``(model, record)``: the same module with the trained parameters, and a
      :class:`TrainRecord`. Weight matrices are named by ``model.named_matrices(params)``
      when the model has it (e.g. :class:`jaxbounds.models.ScalarTransformer`), else by
      parameter path.

    Raises:
      ValueError: for num_epochs or batch_size < 1, or inputs and labels of different lengths.
    """
    for name, value in (("num_epochs", num_epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    inputs, labels = jnp.asarray(data["inputs"]), jnp.asarray(data["labels"])
    n = labels.shape[0]
    if inputs.shape[0] != n:
        raise ValueError(f"data: {inputs.shape[0]} inputs but {n} labels")
    apply_fn, params = as_pure(model)
    matrices_of = getattr(model, "named_matrices", None) or _leaf_matrices
    opt = optax.adam(learning_rate) if optimizer is None else optimizer
    bs = min(batch_size, n)
    num_batches = -(-n // bs)

    @jax.jit
    def step(p: Any, s: Any, x: jax.Array, y: jax.Array, idx: jax.Array) -> Any:
        xb, yb = x[idx], y[idx]
        grads = jax.grad(lambda q: loss_fn(apply_fn(q, xb), yb))(p)
        # optax mixes Python floats with int32 step counts (Adam's bias correction), which
        # strict dtype promotion rejects; the model code above stays under the caller's mode.
        with jax.numpy_dtype_promotion("standard"):
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s

    def run_epoch(p: Any, s: Any, perm: np.ndarray) -> Any:
        # ceil(n / bs) batches of bs; the last one is filled up from the start of perm.
        idx = np.concatenate([perm, perm[: num_batches * bs - n]]).reshape(num_batches, bs)
        for batch in idx:
            p, s = step(p, s, inputs, labels, batch)
        return p, s

    def outputs(p: Any, x: jax.Array) -> jax.Array:
        if len(x) <= eval_chunk_size:
            return apply_fn(p, x)
        return jax.lax.map(lambda xi: apply_fn(p, xi), x, batch_size=eval_chunk_size)

    @jax.jit
    def evaluate(p: Any, p0: Any, x: jax.Array, y: jax.Array, tx: Any, ty: Any) -> dict:
        # One forward pass over train and test together (one compiled copy of the model).
        both = outputs(p, x if tx is None else jnp.concatenate([x, tx]))
        leaves = jax.tree_util.tree_leaves(p)
        diff = jax.tree_util.tree_leaves(jax.tree_util.tree_map(jnp.subtract, p, p0))
        out = {
            "train": (loss_fn(both[:n], y), accuracy_fn(both[:n], y)),
            "frobenius": {k: jnp.sqrt(jnp.sum(m * m)) for k, m in matrices_of(p).items()},
            "l1_total": sum(jnp.sum(jnp.abs(leaf)) for leaf in leaves),
            "l2_total": jnp.sqrt(sum(jnp.sum(leaf * leaf) for leaf in leaves)),
            "distance_from_init": jnp.sqrt(sum(jnp.sum(d * d) for d in diff)),
        }
        if tx is not None:
            out["test"] = (loss_fn(both[n:], ty), accuracy_fn(both[n:], ty))
        return out

    test_x = None if test_data is None else jnp.asarray(test_data["inputs"])
    test_y = None if test_data is None else jnp.asarray(test_data["labels"])
    record = TrainRecord()
    bar = _Progress(num_epochs, progress)
    start = time.perf_counter()
    params0 = params
    with jax.numpy_dtype_promotion("standard"):
        opt_state = opt.init(params)

    def log(epoch: int, p: Any) -> None:
        ev = jax.device_get(evaluate(p, params0, inputs, labels, test_x, test_y))
        record.epoch.append(epoch)
        record.train_loss.append(float(ev["train"][0]))
        record.train_accuracy.append(float(ev["train"][1]))
        if "test" in ev:
            record.test_loss.append(float(ev["test"][0]))
            record.test_accuracy.append(float(ev["test"][1]))
        for name, value in ev["frobenius"].items():
            record.frobenius.setdefault(name, []).append(float(value))
        for name in ("l1_total", "l2_total", "distance_from_init"):
            getattr(record, name).append(float(ev[name]))

    log(0, params)
    perms = np.asarray(_permutations(key, n, num_epochs))
    for epoch, perm in enumerate(perms, start=1):
        params, opt_state = run_epoch(params, opt_state, perm)
        log(epoch, params)
        text = f"loss {record.train_loss[-1]:.4f} acc {record.train_accuracy[-1]:.3f}"
        if record.test_accuracy:
            text += f" test acc {record.test_accuracy[-1]:.3f}"
        bar.update(epoch, text)
    record.seconds = time.perf_counter() - start
    if not np.all(np.isfinite(record.train_loss)):
        sys.stderr.write("warning: non-finite training loss\n")
    set_params(model, params)
    return model, record
