r"""The training engine: one compiled loop for every training run of jaxbounds.

:func:`train` runs any optax optimiser on ``loss_fn(params, batch)``, full batch or in
minibatches, for one run or for many runs of one shape at once (seeds, learning rates, step
budgets: anything that keeps the shapes), evaluates every ``eval_every`` steps, keeps the best or
the last state, stops a run once a metric is at or below a threshold or at its step cap, and
returns a :class:`TrainResult` with the curve of every run. The programs it builds are cached on
the callables and the static sizes, so a second call with the same callables and shapes compiles
nothing (data, initial parameters, keys, hyperparameter values, step caps and the threshold are
arguments of the compiled programs).

**Batch invariance.** Many runs are trained ``lanes`` at a time by one ``jax.vmap`` of fixed
width: runs are cut into groups of ``lanes`` and the last group is filled up with copies of its
first run, which never take a step. Every group runs the same compiled program, and a lane's
numbers depend only on its own inputs, never on its position or on the other lanes (tested on
this engine's CPU programs), so a run gives the same bits alone, in a batch of any size, in any
position. They do depend on ``lanes`` (XLA compiles a vmap of another width to other kernels,
which round differently), so ``lanes`` belongs to an experiment's configuration. A single run
(``runs=None``) is traced without ``vmap``.

**Step** (per run, steps $t = 0, 1, \dots$): the batch is the full data, or with ``batch_size``
$b$ minibatch $t \bmod n_b$ of epoch $e = \lfloor t / n_b\rfloor$, $n_b = \lceil n/b\rceil$, cut
from the permutation ``jax.random.permutation(fold_in(key, e), n)`` with its last minibatch filled
up from the permutation's start; then one optax update of ``value_and_grad(loss_fn)`` at that
batch. A run takes steps while it has not stopped and $t <$ its cap.

**Evaluation** after every ``eval_every`` steps (and at step 0 with ``eval_at_start``):
``eval_fn(params, eval_data)`` (default ``{"loss": loss_fn(params, data)}``), plus per-leaf
weight norms with ``norms``. A run whose cap falls inside a block is evaluated at the block's end
on its parameters at the cap. After an evaluation a run stops when ``metrics[stop_metric] <=
loss_threshold`` (``reached``), after ``patience`` evaluations without a new best
(``stalled``), when it has taken its cap of steps (``hit_cap`` unless stopped otherwise),
or when the watched metric (``stop_metric`` with a threshold, else ``best_metric`` with
``keep="best"``, else ``"loss"`` when evaluated) is not finite (``diverged``). ``keep="best"``
keeps the state of the lowest ``best_metric`` over the evaluations (the first one on ties).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxbounds.training._arguments import (
    _check_batches,
    _check_int,
    _check_optimizer,
    _check_rules,
    _float_dtype,
    _num_examples,
    _per_run,
    _with_run_axis,
)
from jaxbounds.training.progress import ProgressBar
from jaxbounds.training.records import TrainingRecord, initial_norms, leaf_names, weight_norms

__all__ = ["TrainResult", "make_step", "train"]

LossFn = Callable[[Any, Any], jax.Array]
EvalFn = Callable[[Any, Any], Mapping[str, jax.Array]]


def make_step(loss_fn: LossFn, optimizer: optax.GradientTransformation) -> Callable:
    """One optimiser step ``(params, opt_state, batch) -> (params, opt_state, loss at params)``.

    Traceable; the step of :func:`train`. The optax update runs under standard dtype promotion
    (Adam's bias correction mixes Python floats with int32 step counts, which strict promotion
    rejects); the model code stays under the caller's promotion mode.

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


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns: the kept states and the curve of every run (host arrays).

    With ``runs=R`` every field has a leading run axis of length R (``params`` leaves too);
    with ``runs=None`` it has none. ``E`` is the largest number of evaluations of a run; a
    run's evaluations ``num_evals[i]:`` are padding (``eval_step`` -1, metrics NaN).

    Attributes:
      params: the kept parameters: at the best evaluation (``keep="best"``; the initial
        parameters if no evaluation was finite) or at the end.
      last_params: the parameters at the end of each run.
      steps: optimiser steps each run took.
      reached: whether ``stop_metric <= loss_threshold`` stopped the run.
      hit_cap: whether the run stopped at its step cap without reaching the threshold.
      diverged: whether the watched metric became NaN or infinite (the run stopped there).
      stalled: whether ``patience`` evaluations without a new best stopped the run.
      best_index: index of the kept evaluation (-1: none, the initial parameters were kept).
      num_evals: number of evaluations of each run.
      eval_step: (E,) steps taken before each evaluation.
      metrics: name -> (E,) values of ``eval_fn`` at each evaluation.
      norms: ``"distance"`` (||W_t - W_0||_F), ``"frobenius"`` (||W_t||_F) and with
        ``norms="spectral"`` ``"spectral"`` (||W_t||_2) -> (E, num_leaves), leaves in
        ``tree_leaves`` order; empty without ``norms``.
      names: the parameter leaf names (:func:`~jaxbounds.training.records.leaf_names`).
      hyperparams: name -> each run's hyperparameter value.
      steps_per_epoch: minibatch steps per pass over the data (1 for full batch).
      seconds: wall time of the call (compilation included).
    """

    params: Any
    last_params: Any
    steps: np.ndarray
    reached: np.ndarray
    hit_cap: np.ndarray
    diverged: np.ndarray
    stalled: np.ndarray
    best_index: np.ndarray
    num_evals: np.ndarray
    eval_step: np.ndarray
    metrics: dict[str, np.ndarray]
    norms: dict[str, np.ndarray]
    names: list[str]
    hyperparams: dict[str, np.ndarray]
    steps_per_epoch: int
    seconds: float

    @property
    def num_runs(self) -> int | None:
        """R, or None for a single run."""
        return None if self.steps.ndim == 0 else int(self.steps.shape[0])

    def run(self, i: int) -> TrainResult:
        """Run ``i`` of a batch as a single-run result (its padding evaluations dropped)."""
        if self.num_runs is None:
            raise ValueError("run: this result holds a single run (runs=None)")
        n = int(self.num_evals[i])
        pick = functools.partial(jax.tree_util.tree_map, lambda a: a[i])
        return dataclasses.replace(
            self, params=pick(self.params), last_params=pick(self.last_params),
            steps=self.steps[i], reached=self.reached[i], hit_cap=self.hit_cap[i],
            diverged=self.diverged[i], stalled=self.stalled[i], best_index=self.best_index[i],
            num_evals=self.num_evals[i], eval_step=self.eval_step[i, :n],
            metrics={k: v[i, :n] for k, v in self.metrics.items()},
            norms={k: v[i, :n] for k, v in self.norms.items()},
            hyperparams={k: v[i] for k, v in self.hyperparams.items()},
        )  # fmt: skip

    def best(self, name: str) -> np.ndarray:
        """Metric ``name`` at the kept evaluation (NaN where none was kept)."""
        values = self.metrics[name]
        index = np.asarray(self.best_index)
        safe = np.maximum(index, 0)
        picked = np.take_along_axis(values, safe[..., None], axis=-1)[..., 0]
        return np.where(index >= 0, picked, np.nan)

    def record(self, params0: Any, *, learning_rate: float | None = None) -> TrainingRecord:
        """The :class:`~jaxbounds.training.records.TrainingRecord` of a single run.

        Args:
          params0: the run's initial parameters (for ||W_0||_F and ||W_0||_2).
          learning_rate: recorded as the run's step size (plain GD).

        Raises:
          ValueError: for a batch result (take :meth:`run` first) or one without ``norms``, or
            without a ``"loss"`` metric.
        """
        if self.num_runs is not None:
            raise ValueError("record: take one run of the batch first (result.run(i))")
        if not self.norms or "loss" not in self.metrics:
            raise ValueError("record: needs norms and a 'loss' metric (train with norms=...)")
        frob0, spec0 = initial_norms(params0)

        def per_leaf(key: str) -> dict[str, np.ndarray]:
            values = self.norms.get(key)
            return {} if values is None else {n: values[:, j] for j, n in enumerate(self.names)}

        step = np.asarray(self.eval_step)
        return TrainingRecord(
            names=list(self.names), step=step, epoch=step // self.steps_per_epoch,
            loss=self.metrics["loss"], distance=per_leaf("distance"),
            frobenius=per_leaf("frobenius"), spectral=per_leaf("spectral"), frobenius0=frob0,
            spectral0=spec0, metrics={k: v for k, v in self.metrics.items() if k != "loss"},
            learning_rate=learning_rate, seconds=self.seconds,
        )  # fmt: skip


# ------------------------------------------------------------------------------ static setup


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything that shapes the compiled programs (the cache key)."""

    loss_fn: Callable
    eval_fn: Callable | None
    optimizer: Any
    hyper_names: tuple[str, ...]
    batch_size: int | None
    num_examples: int
    eval_every: int
    evals_per_call: int
    keep_best: bool
    best_metric: str | None
    stop_metric: str | None
    norms: str | None
    data_per_run: bool
    lanes: int
    eval_at_start: bool
    early_stop: bool

    @property
    def steps_per_epoch(self) -> int:
        return 1 if self.batch_size is None else -(-self.num_examples // self.batch_size)

    @property
    def watch(self) -> str:
        """The metric whose non-finite value stops a run (and fails at initialisation)."""
        return self.stop_metric or (self.best_metric if self.keep_best else None) or "loss"


def _transform(static: _Static, hyper: Mapping[str, jax.Array]) -> optax.GradientTransformation:
    """The optax transformation of one lane (hyperparameters injected as traced values)."""
    if not static.hyper_names:
        return static.optimizer
    factory = static.optimizer
    names = set(inspect.signature(factory).parameters)
    fixed = sorted(names - set(static.hyper_names))
    return optax.inject_hyperparams(factory, static_args=fixed)(**hyper)


def _lanes_map(fn: Callable, lanes: int, in_axes: tuple) -> Callable:
    """``vmap(fn, in_axes)`` over ``lanes`` lanes; one lane is a plain call (no size-1 vmap)."""
    if lanes > 1:
        return jax.vmap(fn, in_axes=in_axes)

    def one(*args: Any) -> Any:
        picked = [
            jax.tree_util.tree_map(lambda a: a[0], x) if ax == 0 else x
            for x, ax in zip(args, in_axes, strict=True)
        ]
        return jax.tree_util.tree_map(lambda a: a[None], fn(*picked))

    return one


def _evaluate(static: _Static, params: Any, params0: Any, data: Any, eval_data: Any) -> dict:
    """One lane's evaluation: the metrics and the weight norms."""
    if static.eval_fn is None:
        metrics = {"loss": static.loss_fn(params, data)}
    else:
        metrics = dict(static.eval_fn(params, eval_data))
    out = {"metrics": metrics}
    if static.norms is not None:
        out["norms"] = weight_norms(params, params0, spectral=static.norms == "spectral")
    return out


def _lane_verdict(static: _Static, lane: dict, ev: dict, valid: jax.Array, limits: dict,
                  cap: jax.Array) -> dict:  # fmt: skip
    """After an evaluation (number ``lane["num_evals"]``): the lane's best state and its stop."""
    metrics = ev["metrics"]
    lane = dict(lane)
    index = lane["num_evals"]
    if static.keep_best:
        value = metrics[static.best_metric]
        better = valid & (value < lane["best_value"])
        lane["best_value"] = jnp.where(better, value, lane["best_value"])
        lane["best_index"] = jnp.where(better, index, lane["best_index"])
        lane["best_params"] = jax.tree_util.tree_map(
            lambda new, old: jnp.where(better, new, old), lane["params"], lane["best_params"]
        )
        if static.early_stop:
            since = jnp.where(better, 0, lane["since_best"] + valid.astype(jnp.int32))
            lane["since_best"] = since
            lane["stalled"] = lane["stalled"] | (valid & (since >= limits["patience"]))
    if static.watch in metrics:
        bad = valid & ~jnp.isfinite(metrics[static.watch])
        lane["diverged"] = lane["diverged"] | bad
    if static.stop_metric is not None:
        value = metrics[static.stop_metric]
        threshold = limits["threshold"].astype(value.dtype)
        lane["reached"] = lane["reached"] | (valid & (value <= threshold))
    lane["stopped"] = lane["stopped"] | (
        valid & (lane["reached"] | lane["diverged"] | lane["stalled"] | (lane["steps"] >= cap))
    )
    lane["num_evals"] = lane["num_evals"] + valid.astype(lane["num_evals"].dtype)
    return lane


def _check_names(static: _Static, metrics: Mapping[str, Any]) -> None:
    for arg, name in (("best_metric", static.best_metric), ("stop_metric", static.stop_metric)):
        if name is not None and name not in metrics:
            raise ValueError(f"{arg}: {name!r} is not a metric of eval_fn {sorted(metrics)}")


def _permutation(key: jax.Array, epoch: jax.Array, n: int, batch_size: int) -> jax.Array:
    """Epoch ``epoch``'s order: a permutation of range(n), its last minibatch filled up."""
    nb = -(-n // batch_size)
    perm = jax.random.permutation(jax.random.fold_in(key, epoch), n)
    return jnp.concatenate([perm, perm[: nb * batch_size - n]]).astype(jnp.int32)


def _lane_step(static: _Static, lane: dict, key: Any, hyper: dict, data: Any, cap: jax.Array,
               t: jax.Array) -> dict:  # fmt: skip
    """One optimiser step of one lane at global step ``t`` (a no-op for a stopped lane)."""
    active = ~lane["stopped"] & (lane["steps"] < cap)
    batch = data
    new = dict(lane)
    if static.batch_size is not None:
        nb, bs = static.steps_per_epoch, static.batch_size
        perm = jax.lax.cond(
            t % nb == 0,
            lambda: _permutation(key, t // nb, static.num_examples, bs),
            lambda: lane["perm"],
        )
        idx = jax.lax.dynamic_slice_in_dim(perm, (t % nb) * bs, bs)
        batch = jax.tree_util.tree_map(lambda a: a[idx], data)
        new["perm"] = perm
    step = make_step(static.loss_fn, _transform(static, hyper))
    params, opt, _ = step(lane["params"], lane["opt"], batch)
    keep = lambda a, b: jnp.where(active, a, b)  # noqa: E731
    new["params"] = jax.tree_util.tree_map(keep, params, lane["params"])
    new["opt"] = jax.tree_util.tree_map(keep, opt, lane["opt"])
    new["steps"] = lane["steps"] + active.astype(lane["steps"].dtype)
    return new


def _init_lane(static: _Static, params: Any, hyper: dict, data: Any, eval_data: Any,
               cap: jax.Array, limits: dict, active: jax.Array) -> tuple:  # fmt: skip
    """A lane's initial state (and its evaluation at step 0 with ``eval_at_start``)."""
    with jax.numpy_dtype_promotion("standard"):
        opt = _transform(static, hyper).init(params)
    lane = {
        "params": params, "opt": opt, "steps": jnp.zeros((), jnp.int32),
        "stopped": ~active, "reached": jnp.zeros((), bool), "diverged": jnp.zeros((), bool),
        "stalled": jnp.zeros((), bool), "num_evals": jnp.zeros((), jnp.int32),
        "since_best": jnp.zeros((), jnp.int32),
    }  # fmt: skip
    if static.batch_size is not None:
        lane["perm"] = jnp.zeros((static.steps_per_epoch * static.batch_size,), jnp.int32)
    ev = _evaluate(static, params, params, data, eval_data)
    _check_names(static, ev["metrics"])
    if static.keep_best:
        value = ev["metrics"][static.best_metric]
        lane["best_value"] = jnp.full((), jnp.inf, value.dtype)
        lane["best_index"] = jnp.full((), -1, jnp.int32)
        lane["best_params"] = params
    if static.eval_at_start:
        lane = _lane_verdict(static, lane, ev, active, limits, cap)
    return lane, ev


@functools.lru_cache(maxsize=64)
def _data_axis(static: _Static) -> int | None:
    """The lanes' axis of the data: 0 when every run has its own data, else shared (None)."""
    return 0 if static.data_per_run else None


def _step(static: _Static, carry: tuple, t: jax.Array) -> tuple:
    """One optimisation step of every lane still running (none: the lanes unchanged)."""
    lanes, consts = carry
    keys, hyper, data, caps = consts["keys"], consts["hyper"], consts["data"], consts["caps"]
    go = jnp.any(~lanes["stopped"] & (lanes["steps"] < caps))
    axes = (0, 0, 0, _data_axis(static), 0, None)
    stepped = jax.lax.cond(
        go,
        lambda lanes: _lanes_map(functools.partial(_lane_step, static), static.lanes,
                                 axes)(lanes, keys, hyper, data, caps, t),
        lambda lanes: lanes,
        lanes,
    )  # fmt: skip
    return (stepped, consts), None


def _evaluate_lanes(static: _Static, params: Any, consts: dict) -> Any:
    """Every lane's evaluation record at ``params``."""
    d_ax = _data_axis(static)
    return _lanes_map(lambda p, p0, d, e: _evaluate(static, p, p0, d, e), static.lanes,
                      (0, 0, d_ax, d_ax))(params, consts["params0"], consts["data"],
                                          consts["eval_data"])  # fmt: skip


def _block(static: _Static, carry: tuple, b: jax.Array) -> tuple:
    """``eval_every`` steps, then an evaluation and each lane's verdict (stop, keep best)."""
    lanes, consts = carry
    t0 = consts["t0"] + b * static.eval_every
    valid = ~lanes["stopped"]

    def run(lanes):
        (lanes, _), _ = jax.lax.scan(
            functools.partial(_step, static), (lanes, consts),
            t0 + jnp.arange(static.eval_every, dtype=jnp.int32),
        )  # fmt: skip
        ev = _evaluate_lanes(static, lanes["params"], consts)
        lanes = _lanes_map(functools.partial(_lane_verdict, static), static.lanes,
                           (0, 0, 0, None, 0))(lanes, ev, valid, consts["limits"],
                                               consts["caps"])  # fmt: skip
        return lanes, {"ev": ev, "valid": valid, "step": lanes["steps"]}

    def skip(lanes):  # every lane has stopped: no step, an all-invalid record
        shapes = jax.eval_shape(functools.partial(_evaluate_lanes, static), lanes["params"], consts)
        ev = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return lanes, {"ev": ev, "valid": valid, "step": lanes["steps"]}

    lanes, rec = jax.lax.cond(jnp.any(valid), run, skip, lanes)
    return (lanes, consts), rec


@functools.lru_cache(maxsize=64)
def _programs(static: _Static) -> tuple[Callable, Callable]:
    """The compiled ``(init, advance)`` programs of one static setup."""
    d_ax = _data_axis(static)
    init_axes = (0, 0, d_ax, d_ax, 0, None, 0)

    @jax.jit
    def init(params, hyper, data, eval_data, caps, limits, active):
        fn = functools.partial(_init_lane, static)
        return _lanes_map(fn, static.lanes, init_axes)(
            params, hyper, data, eval_data, caps, limits, active
        )

    @jax.jit
    def advance(lanes, consts):
        (lanes, _), recs = jax.lax.scan(
            functools.partial(_block, static), (lanes, consts),
            jnp.arange(static.evals_per_call, dtype=jnp.int32),
        )  # fmt: skip
        return lanes, recs

    return init, advance


# ------------------------------------------------------------------------------ argument checks


# ------------------------------------------------------------------------------------- train


def train(
    loss_fn: LossFn,
    params: Any,
    data: Any,
    key: jax.Array | None = None,
    *,
    optimizer: Any,
    hyperparams: Mapping[str, Any] | None = None,
    num_steps: int | Any,
    batch_size: int | None = None,
    eval_every: int = 1,
    eval_fn: EvalFn | None = None,
    eval_data: Any = None,
    eval_at_start: bool = True,
    keep: str = "last",
    best_metric: str = "loss",
    stop_metric: str = "loss",
    loss_threshold: float | None = None,
    patience: int | None = None,
    norms: str | None = None,
    runs: int | None = None,
    data_per_run: bool = False,
    lanes: int = 4,
    evals_per_call: int | None = None,
    progress: bool | TextIO = False,
    label: str = "[train]",
) -> TrainResult:
    r"""Train ``loss_fn`` with an optax optimiser: one run, or many runs of one shape under vmap.

    See the module docstring for the step, the evaluation, the stop rules and batch
    invariance. Compiled programs are cached on (``loss_fn``, ``eval_fn``, ``optimizer``, the
    hyperparameter names, the static sizes): pass the same callables (module-level functions,
    not fresh lambdas) to reuse them; data, parameters, keys, hyperparameter values,
    ``num_steps`` and ``loss_threshold`` may change freely without a compile.

    Args:
      loss_fn: ``(params, batch) -> scalar`` mean loss; ``batch`` has the structure of ``data``.
      params: initial parameters (pytree); with ``runs`` every leaf has a leading axis of R.
      data: the training data, a pytree of arrays with a common leading example axis n (after
        the run axis when ``data_per_run``); ``()`` when ``loss_fn`` needs none.
      key: PRNG key of the minibatch order (one key per run with ``runs``); needed only with
        ``batch_size``.
      optimizer: an optax factory (``optax.adam``, ``optax.sgd``, ...) whose arguments named in
        ``hyperparams`` are injected per run (``optax.inject_hyperparams``; the factory's other
        arguments keep their defaults), or a ready ``optax.GradientTransformation``.
      hyperparams: name -> value (shared) or (R,) array (one per run), e.g.
        ``{"learning_rate": jnp.array([1e-3, 1e-2])}``; cast to the parameters' float dtype.
      num_steps: the step cap (>= 0), an int or (R,) ints.
      batch_size: minibatch size b >= 1 (clipped to n); None trains on the full batch.
      eval_every: steps between two evaluations (>= 1). Static.
      eval_fn: ``(params, eval_data) -> {name: scalar}``; default ``{"loss": loss_fn(params,
        data)}`` (the full-data training loss).
      eval_data: second argument of ``eval_fn`` (default ``data``).
      eval_at_start: evaluate at step 0 too (it can then be kept as best or stop the run).
      keep: ``"last"`` or ``"best"`` (lowest ``best_metric``).
      best_metric: the metric ``keep="best"`` minimises.
      stop_metric: the metric compared with ``loss_threshold``.
      loss_threshold: stop a run once ``stop_metric <= loss_threshold``; None: train to the cap.
      patience: with ``keep="best"``, stop a run once ``patience`` evaluations in a row have
        not lowered ``best_metric`` (early stopping; ``stalled``); None: never.
      norms: None, ``"frobenius"`` (distance from init and Frobenius norm of every leaf at every
        evaluation) or ``"spectral"`` (also ||W||_2).
      runs: number of runs R of a batch; None for a single run (no run axis anywhere).
      data_per_run: ``data``/``eval_data`` carry a leading run axis (e.g. one data set per
        seed); else every run shares them.
      lanes: the vmap width (>= 1, with ``runs``); a run's bits depend on it, never on R or on
        the other runs.
      evals_per_call: evaluation blocks per compiled call (the progress bar moves between
        calls; the results do not depend on it); default ``max(1, 64 // eval_every)``. Static.
      progress: True for a progress bar on stderr, False for none, or a text stream.
      label: progress bar prefix.

    Returns:
      A :class:`TrainResult`.

    Raises:
      ValueError: naming the argument, for a bad size, a bad optimizer / hyperparams pair,
        leaves without their leading axis, an unknown metric name, a non-finite threshold, or
        a non-finite watched metric at initialisation (with ``eval_at_start``).

    Example (four runs, two seeds x two learning rates, on a shared data set)::

        params = jax.vmap(init)(jax.random.split(jax.random.key(0), 4))
        result = train(loss_fn, params, data, keys, optimizer=optax.adam,
                       hyperparams={"learning_rate": jnp.array([1e-3, 1e-3, 1e-2, 1e-2])},
                       num_steps=5000, batch_size=64, eval_every=50, loss_threshold=0.01,
                       runs=4, lanes=4)
        result.hit_cap, result.steps, result.metrics["loss"]

    >>> import jax.numpy as jnp, optax
    >>> loss = lambda p, b: jnp.mean((b - p[None, :]) ** 2)
    >>> r = train(loss, jnp.ones(2), jnp.zeros((3, 2)), optimizer=optax.sgd,
    ...           hyperparams={"learning_rate": 0.5}, num_steps=50, loss_threshold=0.01)
    >>> int(r.steps), bool(r.reached), [round(float(v), 4) for v in r.metrics["loss"][:3]]
    (4, True, [1.0, 0.25, 0.0625])
    """
    start = time.perf_counter()
    hyperparams = dict(hyperparams or {})
    hyper_names = _check_optimizer(optimizer, hyperparams)
    eval_every, evals_per_call = _check_rules(
        eval_every, evals_per_call, keep, patience, norms, loss_threshold
    )
    single = runs is None
    num_runs = 1 if single else _check_int(runs, "runs", 1)
    width = 1 if single else _check_int(lanes, "lanes", 1)
    params, key = _with_run_axis(params, key, num_runs, single, data_per_run)
    eval_data = data if eval_data is None else eval_data
    n = _num_examples(data, data_per_run, num_runs, batch_size is not None)
    batch_size, key = _check_batches(batch_size, key, n, num_runs)
    caps = _per_run(num_steps, "num_steps", num_runs, np.int64)
    limit = 2**31 - evals_per_call * eval_every  # the int32 step counter of the last call
    if caps.min() < 0 or caps.max() >= limit:
        raise ValueError(f"num_steps: expected ints in [0, {limit}), got {num_steps!r}")
    dtype = _float_dtype(params)
    hyper = {k: _per_run(v, f"hyperparams[{k!r}]", num_runs, dtype) for k, v in
             hyperparams.items()}  # fmt: skip
    for k, v in hyper.items():
        if not np.all(np.isfinite(v)):
            raise ValueError(f"hyperparams[{k!r}]: expected finite values, got {v}")
    static = _Static(
        loss_fn=loss_fn, eval_fn=eval_fn, optimizer=optimizer, hyper_names=hyper_names,
        batch_size=batch_size, num_examples=n, eval_every=eval_every,
        evals_per_call=evals_per_call, keep_best=keep == "best",
        best_metric=best_metric if keep == "best" else None,
        stop_metric=stop_metric if loss_threshold is not None else None, norms=norms,
        early_stop=patience is not None,
        data_per_run=data_per_run, lanes=width, eval_at_start=bool(eval_at_start),
    )  # fmt: skip
    limits = {
        "threshold": jnp.asarray(-np.inf if loss_threshold is None else loss_threshold),
        "patience": jnp.asarray(0 if patience is None else patience, jnp.int32),
    }
    bar = ProgressBar(int(caps.max()) * -(-num_runs // width), progress, label)
    groups = []
    try:
        for g0 in range(0, num_runs, width):
            sl = slice(g0, min(g0 + width, num_runs))
            groups.append(_run_group(static, sl, params, key, hyper, data, eval_data, caps,
                                     limits, bar, g0 // width))  # fmt: skip
    finally:
        bar.close()
    return _assemble(static, groups, params, hyper, single, time.perf_counter() - start)


def _pad(tree: Any, sl: slice, width: int) -> Any:
    """Runs ``sl`` of a run-stacked tree, filled up to ``width`` with copies of the first."""

    def pad(a: Any) -> Any:
        part = a[sl]
        extra = width - part.shape[0]
        if extra == 0:
            return part
        return jnp.concatenate([part, jnp.repeat(part[:1], extra, axis=0)])

    return jax.tree_util.tree_map(pad, tree)


def _run_group(static: _Static, sl: slice, params, key, hyper, data, eval_data, caps, limits,
               bar: ProgressBar, group: int) -> dict:  # fmt: skip
    """Train one group of at most ``lanes`` runs; the host-side records of its lanes."""
    width = static.lanes
    real = sl.stop - sl.start
    lane_params = _pad(params, sl, width)
    lane_key = _pad(key, sl, width)
    lane_hyper = {k: jnp.asarray(np.resize(v[sl], width) if real < width else v[sl])
                  for k, v in hyper.items()}  # fmt: skip
    lane_caps = np.concatenate([caps[sl], np.zeros(width - real, np.int64)]).astype(np.int32)
    active = np.arange(width) < real
    if static.data_per_run:
        data, eval_data = _pad(data, sl, width), _pad(eval_data, sl, width)
    init, advance = _programs(static)
    lanes, ev0 = init(lane_params, lane_hyper, data, eval_data,
                      jnp.asarray(lane_caps), limits, jnp.asarray(active))  # fmt: skip
    records = []
    if static.eval_at_start:
        ev0 = jax.device_get(ev0)
        if static.watch in ev0["metrics"]:
            bad = ~np.isfinite(np.asarray(ev0["metrics"][static.watch]))[:real]
            if bad.any():
                raise ValueError(
                    f"loss_fn: the {static.watch} at initialisation is not finite "
                    f"(runs {[int(i) + sl.start for i in np.flatnonzero(bad)]})"
                )
        records.append({"ev": ev0, "valid": active, "step": np.zeros(width, np.int32)})
    consts = {
        "params0": lane_params, "keys": lane_key, "hyper": lane_hyper, "data": data,
        "eval_data": eval_data, "caps": jnp.asarray(lane_caps), "limits": limits,
    }  # fmt: skip
    done = 0
    base = group * int(caps.max())
    per_call = static.evals_per_call * static.eval_every
    while not bool(np.all(np.asarray(jax.device_get(lanes["stopped"])))):
        lanes, recs = advance(lanes, {**consts, "t0": jnp.asarray(done, jnp.int32)})
        recs = jax.device_get(recs)
        records.extend(
            jax.tree_util.tree_map(lambda a, i=i: np.asarray(a)[i], recs)
            for i in range(static.evals_per_call)
        )
        done += per_call
        steps = np.asarray(jax.device_get(lanes["steps"]))[:real]
        shown = _shown(records, static)
        bar.update(base + int(min(steps.max(), caps.max())), shown)
    return {"lanes": jax.device_get(lanes), "records": records, "real": real, "caps": caps[sl]}


def _shown(records: list, static: _Static) -> str:
    """The progress text: the first lane's latest valid value of the watched (or first) metric."""
    for rec in reversed(records):
        if bool(np.asarray(rec["valid"])[0]):
            metrics = rec["ev"]["metrics"]
            name = static.watch if static.watch in metrics else next(iter(metrics))
            return f"{name} {float(np.asarray(metrics[name])[0]):.4g}"
    return ""


def _assemble(static: _Static, groups: list, params: Any, hyper: dict, single: bool,
              seconds: float) -> TrainResult:  # fmt: skip
    """Stack the groups' lanes and records into one result (real runs only)."""
    num_evals = np.concatenate([np.asarray(g["lanes"]["num_evals"])[: g["real"]] for g in groups])
    width = int(num_evals.max()) if num_evals.size else 0
    metrics: dict[str, list] = {}
    norms: dict[str, list] = {}
    steps_rows = []
    for g in groups:
        for lane in range(g["real"]):
            valid = [rec for rec in g["records"] if bool(np.asarray(rec["valid"])[lane])]
            steps_rows.append(_row([np.asarray(r["step"])[lane] for r in valid], width, -1))
            first = g["records"][0]["ev"]
            for part, out in (("metrics", metrics), ("norms", norms)):
                for name in first.get(part, {}):
                    values = [np.asarray(r["ev"][part][name])[lane] for r in valid]
                    out.setdefault(name, []).append(_row(values, width, np.nan))

    def pick(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(g["lanes"][name])[: g["real"]] for g in groups])

    def joined(name: str) -> Any:
        parts = [_real(g["lanes"][name], g["real"]) for g in groups]
        return jax.tree_util.tree_map(lambda *a: np.concatenate(a), *parts)

    last = joined("params")
    if static.keep_best:
        kept, best_index = joined("best_params"), pick("best_index").astype(np.int64)
    else:
        kept, best_index = last, num_evals.astype(np.int64) - 1
    steps = pick("steps").astype(np.int64)
    reached, diverged, stalled = pick("reached"), pick("diverged"), pick("stalled")
    result = TrainResult(
        params=kept, last_params=last, steps=steps, reached=reached,
        hit_cap=~reached & ~diverged & ~stalled
        & (steps >= np.concatenate([g["caps"] for g in groups])),
        diverged=diverged, stalled=stalled,
        best_index=best_index, num_evals=num_evals.astype(np.int64),
        eval_step=np.stack(steps_rows).astype(np.int64),
        metrics={k: np.stack(v) for k, v in metrics.items()},
        norms={k: np.stack(v) for k, v in norms.items()},
        names=leaf_names(jax.tree_util.tree_map(lambda a: a[0], params)),
        hyperparams=dict(hyper), steps_per_epoch=static.steps_per_epoch, seconds=seconds,
    )  # fmt: skip
    return result.run(0) if single else result


def _row(values: list, width: int, fill: Any) -> np.ndarray:
    """``values`` stacked and padded with ``fill`` to ``width`` entries."""
    if not values:
        return np.full((width,), fill)
    stacked = np.stack([np.asarray(v) for v in values])
    dtype = np.result_type(stacked, fill)
    pad = np.full((width - len(values), *stacked.shape[1:]), fill, dtype=dtype)
    return np.concatenate([stacked.astype(pad.dtype), pad])


def _real(tree: Any, real: int) -> Any:
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[:real], tree)
