r"""The training loops: full-batch gradient descent and minibatch optax, one design.

Both loops take ``loss_fn(params, batch) -> scalar`` with the data as an argument (never a
closure, so it enters the compiled programs as an argument, not as folded constants), share one
optimiser step (:func:`make_step`: ``value_and_grad`` then an optax update), record with
:func:`~jaxbounds.training.records.weight_norms` into one
:class:`~jaxbounds.training.records.TrainingRecord`, and draw one
:class:`~jaxbounds.training.progress.Progress` bar on stderr.

- :func:`train_gd`: $\theta_{t+1} = \theta_t - \gamma\nabla L(\theta_t)$ (optax ``sgd``) on the
  full batch, a record point every step. Steps run inside ``lax.scan`` chunks (one compiled
  program per chunk length); the progress bar moves between chunks.
- :func:`train_minibatch`: any optax optimiser (Adam by default) on minibatches, a record point
  every epoch. Each epoch is a random permutation cut into ceil(n / batch_size) minibatches, the
  last one filled up with the first examples of the permutation so every step has one shape.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TextIO

import jax
import numpy as np
import optax

from jaxbounds.training.progress import Progress
from jaxbounds.training.records import TrainingRecord, assemble, weight_norms
from kernels._checks import check_positive_int

__all__ = ["make_step", "train_gd", "train_minibatch"]

LossFn = Callable[[Any, Any], jax.Array]
MetricsFn = Callable[[Any, Any], dict[str, jax.Array]]


def make_step(loss_fn: LossFn, optimizer: optax.GradientTransformation) -> Callable:
    """One optimiser step ``(params, opt_state, batch) -> (params, opt_state, loss at params)``.

    Traceable. The optax update runs under standard dtype promotion (Adam's bias correction
    mixes Python floats with int32 step counts, which strict promotion rejects); the model code
    stays under the caller's promotion mode.

    >>> import jax.numpy as jnp, optax
    >>> sgd = optax.sgd(0.25)
    >>> step = make_step(lambda p, b: jnp.sum((p - b) ** 2), sgd)
    >>> p0 = jnp.array([1.0])
    >>> p, _, loss = step(p0, sgd.init(p0), jnp.array([0.0]))
    >>> float(p[0]), float(loss)
    (0.5, 1.0)
    """
    grad_fn = jax.value_and_grad(loss_fn)

    def step(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = grad_fn(params, batch)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

    return step


def _point(
    params: Any, params0: Any, loss: jax.Array, metrics: dict | None, *, spectral: bool
) -> dict[str, Any]:
    """One record point (traceable): the loss, the weight norms and the metrics."""
    out: dict[str, Any] = {"loss": loss, **weight_norms(params, params0, spectral=spectral)}
    if metrics is not None:
        out["metrics"] = metrics
    return out


def _evaluator(loss_fn: LossFn, metrics_fn: MetricsFn | None, spectral: bool) -> Callable:
    """A compiled record point ``(params, params0, batch, metrics_data) -> point`` of the loops."""

    @jax.jit
    def evaluate(p: Any, p0: Any, batch: Any, mdata: Any) -> dict[str, Any]:
        metrics = None if metrics_fn is None else metrics_fn(p, mdata)
        return _point(p, p0, loss_fn(p, batch), metrics, spectral=spectral)

    return evaluate


def _check_initial(loss: Any, bar: Progress) -> None:
    if not np.isfinite(loss):
        bar.close()
        raise ValueError(f"loss_fn: the loss at initialisation is {loss}")


def _gd_chunk(step: Callable, metrics_fn: MetricsFn | None, spectral: bool, length: int):
    """A compiled program running ``length`` GD steps and recording before each one."""

    @jax.jit
    def chunk(p: Any, state: Any, p0: Any, batch: Any, mdata: Any) -> tuple[Any, Any, Any]:
        def body(carry: tuple[Any, Any], _: None) -> tuple[tuple[Any, Any], dict[str, Any]]:
            p, state = carry
            metrics = None if metrics_fn is None else metrics_fn(p, mdata)
            new_p, state, loss = step(p, state, batch)
            return (new_p, state), _point(p, p0, loss, metrics, spectral=spectral)

        (p, state), points = jax.lax.scan(body, (p, state), None, length=length)
        return p, state, points

    return chunk


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
    ``record_spectral``) and ``metrics_fn(theta_t, metrics_data)``. Deterministic: the same
    inputs give the same trajectory whatever ``chunk_steps`` is (up to XLA's reassociation
    between differently compiled chunks).

    Args:
      loss_fn: ``(params, batch) -> scalar`` full-batch training loss.
      params: initial parameters theta_0 (pytree of arrays, e.g. a dict or an nnx ``State``).
      batch: the training data, any pytree (``()`` when ``loss_fn`` needs none).
      learning_rate: the step size gamma > 0 (the shallow paper uses 0.1).
      num_steps: T >= 0 steps.
      metrics_fn: optional ``(params, metrics_data) -> dict[str, scalar]`` recorded every step.
      metrics_data: the second argument of ``metrics_fn`` (default ``batch``).
      record_spectral: also record ||W_t||_2 every step (one small SVD per leaf).
      chunk_steps: steps per compiled ``lax.scan`` chunk; default about T/20, at most 100.
      progress: True for a progress bar on stderr, False for none, or a text stream.
      label: progress bar prefix.

    Returns:
      ``(params_T, record)``, the record with ``T + 1`` points.

    Raises:
      ValueError: for a non-positive learning rate, negative ``num_steps``, a bad
        ``chunk_steps`` or a non-finite loss at initialisation.
    """
    if not (isinstance(learning_rate, int | float) and learning_rate > 0):
        raise ValueError(f"learning_rate: expected a positive number, got {learning_rate!r}")
    check_positive_int(num_steps, "num_steps", 0)
    chunk_steps = max(1, min(100, num_steps // 20)) if chunk_steps is None else chunk_steps
    check_positive_int(chunk_steps, "chunk_steps")
    tx = optax.sgd(learning_rate)
    step = make_step(loss_fn, tx)
    chunks = functools.cache(lambda n: _gd_chunk(step, metrics_fn, record_spectral, n))
    evaluate = _evaluator(loss_fn, metrics_fn, record_spectral)
    mdata = batch if metrics_data is None else metrics_data
    start, bar = time.perf_counter(), Progress(num_steps, progress, label)
    final, points = _gd_steps(
        chunks, evaluate, tx.init(params), params, batch, mdata, num_steps, chunk_steps, bar
    )
    steps = np.arange(num_steps + 1)
    return final, assemble(
        params, points, step=steps, epoch=steps, learning_rate=float(learning_rate), start=start
    )


def _gd_steps(chunks, evaluate, state, params0, batch, mdata, num_steps, chunk_steps, bar):
    """The chunk loop of :func:`train_gd`: ``(params_T, record points)``."""
    params, points, done = params0, [], 0
    while done < num_steps:
        length = min(chunk_steps, num_steps - done)
        params, state, recs = chunks(length)(params, state, params0, batch, mdata)
        recs = jax.device_get(recs)
        if done == 0:
            _check_initial(recs["loss"][0], bar)
        points.append(recs)
        done += length
        bar.update(done, f"loss {float(recs['loss'][-1]):.4g}")
    final = jax.device_get(evaluate(params, params0, batch, mdata))
    if num_steps == 0:
        _check_initial(final["loss"], bar)
    points.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[None], final))
    bar.close()
    return params, points


@functools.partial(jax.jit, static_argnums=(1, 2))
def _permutations(key: jax.Array, n: int, num_epochs: int) -> jax.Array:
    """One random permutation of range(n) per epoch, (num_epochs, n), in one compiled call."""
    return jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(key, num_epochs))


def _num_examples(data: Any) -> int:
    """The common leading length of the leaves of ``data``."""
    lengths = {int(np.shape(a)[0]) for a in jax.tree_util.tree_leaves(data)}
    if len(lengths) != 1:
        raise ValueError(f"data: expected leaves of one length, got lengths {sorted(lengths)}")
    return lengths.pop()


def _permuted_batches(key: jax.Array, n: int, num_epochs: int, batch_size: int) -> np.ndarray:
    """(num_epochs, num_batches, bs) example indices, bs = min(batch_size, n).

    Each epoch is a random permutation cut into ceil(n / bs) batches, the last one filled up
    from the start of the permutation.
    """
    bs = min(batch_size, n)
    num_batches = -(-n // bs)
    perms = np.asarray(_permutations(key, n, num_epochs))
    filled = np.concatenate([perms, perms[:, : num_batches * bs - n]], axis=1)
    return filled.reshape(num_epochs, num_batches, bs)


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
    initialisation.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss; ``batch`` has the structure of ``data``.
      params: initial parameters (pytree).
      data: pytree of arrays sharing a leading example axis of length n (e.g. ``(x, y)``).
      key: PRNG key of the minibatch permutations.
      num_epochs: passes over the data, >= 1.
      batch_size: minibatch size (clipped to n); an epoch is ceil(n / batch_size) steps.
      learning_rate: Adam's step size (ignored when ``optimizer`` is given).
      optimizer: any ``optax.GradientTransformation`` (default ``optax.adam(learning_rate)``).
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
    num_examples = _num_examples(data)
    opt = optax.adam(learning_rate) if optimizer is None else optimizer
    evaluate = _evaluator(loss_fn, metrics_fn, record_spectral)
    mdata = data if metrics_data is None else metrics_data
    start, bar = time.perf_counter(), Progress(num_epochs, progress, label)
    batches = _permuted_batches(key, num_examples, num_epochs, batch_size)
    final, points = _epochs(
        make_step(loss_fn, opt), evaluate, opt, params, data, mdata, batches, bar
    )
    epochs = np.arange(num_epochs + 1)
    steps = epochs * batches.shape[1]
    return final, assemble(
        params, points, step=steps, epoch=epochs, learning_rate=None, start=start
    )


def _epochs(step, evaluate, opt, params0, data, mdata, batches, bar):
    """The epoch loop of :func:`train_minibatch`: ``(params, record points)``."""
    minibatch = jax.jit(
        lambda p, s, data, idx: step(p, s, jax.tree_util.tree_map(lambda a: a[idx], data))[:2]
    )
    with jax.numpy_dtype_promotion("standard"):
        state = opt.init(params0)
    params, points = params0, [jax.device_get(evaluate(params0, params0, data, mdata))]
    _check_initial(points[0]["loss"], bar)
    for epoch, indices in enumerate(batches, start=1):
        for idx in indices:
            params, state = minibatch(params, state, data, idx)
        points.append(jax.device_get(evaluate(params, params0, data, mdata)))
        shown = " ".join(f"{k} {float(v):.3f}" for k, v in points[-1].get("metrics", {}).items())
        bar.update(epoch, f"loss {float(points[-1]['loss']):.4f} {shown}".rstrip())
    bar.close()
    return params, [jax.tree_util.tree_map(lambda a: np.asarray(a)[None], p) for p in points]
