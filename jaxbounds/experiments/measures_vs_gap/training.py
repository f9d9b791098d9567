"""The models, data and training lanes of ``measures-vs-gap``."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import kernels
from jaxbounds.data import sparse_majority
from jaxbounds.data.mnist import load_mnist_sample
from jaxbounds.experiments import runner
from jaxbounds.experiments.measures_vs_gap.grid import MNIST, SPARSE, _batch_key
from jaxbounds.models import (
    ScalarTransformer,
    ShallowTransformer,
    as_pure,
)
from jaxbounds.models.scalar import scale_by_radii
from jaxbounds.models.shallow import PARAM_NAMES, shallow_apply
from jaxbounds.training import accuracy, logistic_loss, train

# ---------------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class _Fns:
    """The callables of one family and shape (the same objects every call: compiled once)."""

    apply: Callable
    loss: Callable
    error: Callable
    search_apply: Callable
    project: Callable
    normalized_loss: Callable


def _error_of(apply: Callable) -> Callable:
    def error(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        scores = apply(params, batch["x"])
        return 1.0 - accuracy(scores, batch["y"]).astype(scores.dtype)

    return error


def _loss_of(apply: Callable) -> Callable:
    def loss(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return logistic_loss(apply(params, batch["x"]), batch["y"])

    return loss


#: The floor of the logits' norm in :func:`normalize_logits` (as Andriushchenko et al.'s code).
LOGIT_NORM_FLOOR = 1e-10


def normalize_logits(scores: jax.Array) -> jax.Array:
    r"""Logits normalised before the loss of adaptive sharpness (Andriushchenko et al. 2023).

    Class logits $z \in \mathbb R^{n \times K}$, $K \ge 2$: per example, centred over the
    classes and divided by their Euclidean norm, as ``LogitNormalizationWrapper`` in
    tml-epfl/sharpness-vs-generalization (``models.py``) does:
    $\tilde z_i = (z_i - \bar z_i) / \max(\|z_i - \bar z_i\|_2, 10^{-10})$.

    Scalar logits $z \in \mathbb R^n$ of a binary logistic model: per-example normalisation
    of one logit leaves only its sign (their code's one-logit path even centres it to 0), so
    the batch's logits are divided by their root mean square over the batch,
    $\tilde z_i = \sqrt2\, z_i / \max(\sqrt{\tfrac1n \textstyle\sum_j z_j^2}, 10^{-10})$.
    Like theirs, the loss then depends on the logits' direction only (a model whose logits are
    all scaled by $c > 0$ has the same normalised loss), and like theirs it is computed at the
    weights where the loss is evaluated (inside a sharpness measure: the perturbed ones). The
    factor $\sqrt2$ makes it equal to theirs applied to the two-class logits
    $(-z_i/2, z_i/2)$ when every $|z_i|$ is the same.

    Args:
      scores: (n,) scalar logits or (n, K) class logits.

    Returns:
      The normalised logits, same shape and dtype.

    >>> normalize_logits(jnp.array([3.0, -3.0, 3.0]))  # every |z_i| equal: sqrt(2) sign(z)
    Array([ 1.4142135, -1.4142135,  1.4142135], dtype=float32)
    >>> normalize_logits(jnp.array([[1.0, 3.0]]))  # centred (-1, 1), norm sqrt(2)
    Array([[-0.70710677,  0.70710677]], dtype=float32)
    """
    scores = jnp.asarray(scores)
    floor = jnp.asarray(LOGIT_NORM_FLOOR, scores.dtype)
    if scores.ndim == 1:
        rms = jnp.sqrt(jnp.mean(jnp.square(scores)))
        return math.sqrt(2.0) * scores / jnp.maximum(rms, floor)
    if scores.ndim != 2 or scores.shape[-1] < 2:
        raise ValueError(f"scores: expected shape (n,) or (n, K) with K >= 2, got {scores.shape}")
    centred = scores - jnp.mean(scores, axis=-1, keepdims=True)
    norms = jnp.linalg.norm(centred, axis=-1, keepdims=True)
    return centred / jnp.maximum(norms, floor)


def _normalized_loss_of(apply: Callable) -> Callable:
    def loss(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return logistic_loss(normalize_logits(apply(params, batch["x"])), batch["y"])

    return loss


def _rows_l1_ball(w: jax.Array) -> jax.Array:
    """Every row of W in the unit l1 ball (``||W^T||_{1,inf} <= 1``)."""
    return kernels.project_group_ball(w.T, q=1, p=math.inf, radius=1.0).T


def _project_tt(theta: Mapping[str, Any]) -> dict:
    """Projection onto the product of unit balls of the Trauger & Tewari class, per head."""
    layer = theta["layers"][0]
    return {
        "layers": {0: {
            "w_qk": jax.vmap(lambda w: kernels.project_l1_ball(w, radius=1.0))(layer["w_qk"]),
            "w_v": jax.vmap(_rows_l1_ball)(layer["w_v"]),
            "w_c": jax.vmap(_rows_l1_ball)(layer["w_c"]),
        }},
        "w": kernels.project_l1_ball(theta["w"], radius=1.0),
    }  # fmt: skip


def _project_frobenius(theta: Mapping[str, Any]) -> dict:
    """Every matrix in the unit Frobenius ball."""
    return {
        k: kernels.project_lp_ball(v.reshape(-1), p=2, radius=1.0).reshape(v.shape)
        for k, v in theta.items()
    }


@functools.cache
def _fns(family: str, width: int | None, num_heads: int | None) -> _Fns:
    if family == SPARSE:
        model = ScalarTransformer(width, num_heads=num_heads, rngs=nnx.Rngs(0))
        apply = as_pure(model)[0]

        def search_apply(theta, inputs):
            return apply(scale_by_radii(theta, inputs["radii"]), inputs["x"])

        return _Fns(apply, _loss_of(apply), _error_of(apply), search_apply, _project_tt,
                    _normalized_loss_of(apply))  # fmt: skip

    def shallow_search_apply(theta, inputs):
        params = {k: theta[k] * inputs["radii"][k] for k in PARAM_NAMES}
        return shallow_apply(params, inputs["x"])

    return _Fns(
        shallow_apply, _loss_of(shallow_apply), _error_of(shallow_apply), shallow_search_apply,
        _project_frobenius, _normalized_loss_of(shallow_apply),
    )  # fmt: skip


def _family_fns(cfg: Mapping[str, Any]) -> _Fns:
    if cfg["family"] == SPARSE:
        return _fns(SPARSE, cfg["width"], cfg["num_heads"])
    return _fns(MNIST, None, None)


@functools.lru_cache(maxsize=16)
def _sparse_pool(seed: int, seq_len: int, width: int, sparsity: int, pool: int, num_test: int):
    data = sparse_majority(
        jax.random.fold_in(jax.random.key(seed), seq_len), num_examples=pool + num_test,
        seq_len=seq_len, sparsity=sparsity, embed_dim=width, dtype=jnp.float32,
    )  # fmt: skip
    return np.asarray(data["inputs"]), np.asarray(data["labels"], np.int32)


@functools.cache
def _mnist(token_dim: int, test_fraction: float = 0.2) -> Any:
    return load_mnist_sample(token_dim=token_dim, log=None, test_fraction=test_fraction)


def _unit_data(cfg: Mapping[str, Any], seed: int) -> tuple[dict, dict]:
    """(train, test) host arrays of a unit: ``{"x": inputs, "y": int32 labels}``."""
    n = cfg["num_train"]
    if cfg["family"] == SPARSE:
        x, y = _sparse_pool(seed, cfg["seq_len"], cfg["width"], cfg["sparsity"],
                            cfg["train_pool"], cfg["num_test"])  # fmt: skip
        pool = cfg["train_pool"]
        return {"x": x[:n], "y": y[:n]}, {"x": x[pool:], "y": y[pool:]}
    digits = _mnist(cfg["token_dim"], cfg.get("test_fraction") or 0.2)
    pool = len(digits.train["labels"])
    if cfg["train_pool"] != pool or cfg["num_test"] != len(digits.test["labels"]):
        raise ValueError(f"train_pool, num_test: the MNIST sample has {pool} and "
                         f"{len(digits.test['labels'])}")  # fmt: skip
    cast = lambda d, k: {"x": np.asarray(d["inputs"][:k], np.float32),  # noqa: E731
                         "y": np.asarray(d["labels"][:k], np.int32)}  # fmt: skip
    return cast(digits.train, n), cast(digits.test, None)


def _init(cfg: Mapping[str, Any], seed: int) -> dict:
    if cfg["family"] == SPARSE:
        model = ScalarTransformer(cfg["width"], num_heads=cfg["num_heads"], rngs=nnx.Rngs(seed))
        return as_pure(model)[1]
    model = ShallowTransformer(cfg["token_dim"], cfg["width"], rngs=nnx.Rngs(params=seed))
    return model.params_dict()


def sgd_decayed(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    """Plain SGD with decoupled weight decay: ``w <- w - lr (g + weight_decay w)``."""
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate))


def momentum_decayed(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    """SGD with heavy-ball momentum 0.9 and decoupled weight decay (Jiang et al.'s "momentum")."""
    return optax.chain(optax.add_decayed_weights(weight_decay),
                       optax.sgd(learning_rate, momentum=0.9))  # fmt: skip


#: Optimizer factories with a ``weight_decay`` argument (0 gives the plain optimizer's steps).
_OPTIMIZERS = {"adam": optax.adamw, "sgd": sgd_decayed, "momentum": momentum_decayed}


def _stack(trees: Sequence[Any]) -> Any:
    """Stack pytrees on a new leading axis (host numpy; PRNG keys with ``jnp.stack``)."""

    def stack(*leaves: Any) -> Any:
        if jnp.issubdtype(getattr(leaves[0], "dtype", np.float32), jax.dtypes.prng_key):
            return jnp.stack(leaves)
        return np.stack([np.asarray(x) for x in leaves])

    return jax.tree_util.tree_map(stack, *trees)


def _pick(tree: Any, i: int) -> Any:
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[i], tree)


@dataclasses.dataclass
class _Trained:
    """A batch after training: per unit its data, initial and final parameters, outcome."""

    units: list
    train: list
    test: list
    params0: list
    params: list
    steps: np.ndarray
    reached: np.ndarray
    hit_cap: np.ndarray
    diverged: np.ndarray
    radii: list
    seconds: float


def _train_batch(units: Sequence[runner.Unit]) -> _Trained:
    """Train the units of one batch (one shape) with one :func:`~jaxbounds.training.train`."""
    cfg = units[0].config
    key = _batch_key(units[0])
    if any(_batch_key(u) != key for u in units):
        raise ValueError("run_batch: the units of a batch must share their shape")
    if cfg["optimizer"] not in _OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {sorted(_OPTIMIZERS)}, got "
                         f"{cfg['optimizer']!r}")  # fmt: skip
    data = [_unit_data(u.config, u.seed) for u in units]
    params0 = [_init(cfg, u.seed) for u in units]
    per_run = cfg["family"] == SPARSE
    train_data = _stack([d[0] for d in data]) if per_run else data[0][0]
    keys = jnp.stack([jax.random.fold_in(jax.random.key(u.seed), 1_000_003) for u in units])
    result = train(
        _family_fns(cfg).loss, _stack(params0), train_data, keys,
        optimizer=_OPTIMIZERS[cfg["optimizer"]],
        hyperparams={
            "learning_rate": np.array([u.config["learning_rate"] for u in units]),
            "weight_decay": np.array([u.config.get("weight_decay") or 0.0 for u in units]),
        },
        num_steps=np.array([u.config["max_steps"] for u in units]),
        batch_size=cfg["batch_size"], eval_every=cfg["eval_every"],
        loss_threshold=cfg["loss_threshold"], norms="frobenius" if cfg["family"] == MNIST else None,
        runs=len(units), lanes=cfg["lanes"], data_per_run=per_run,
    )  # fmt: skip
    radii = []
    for i in range(len(units)):
        if result.norms:
            n = int(result.num_evals[i])
            dist = np.asarray(result.norms["distance"][i, :n], np.float64).max(axis=0)
            radii.append({name: float(dist[j]) for j, name in enumerate(result.names)})
        else:
            radii.append(None)
    return _Trained(
        units=list(units), train=[d[0] for d in data], test=[d[1] for d in data],
        params0=params0, params=[_pick(result.params, i) for i in range(len(units))],
        steps=result.steps, reached=result.reached, hit_cap=result.hit_cap,
        diverged=result.diverged, radii=radii, seconds=result.seconds,
    )  # fmt: skip


def trained_models(units: Sequence[runner.Unit]) -> list[dict]:
    """Per unit of one batch: its data, initial and trained parameters (as :func:`run_batch`).

    For checks and tests of the recorded rows (the measures recomputed from the weights).
    """
    t = _train_batch(units)
    return [
        {"train": t.train[i], "test": t.test[i], "params0": t.params0[i],
         "params": t.params[i], "radii": t.radii[i]}
        for i in range(len(units))
    ]  # fmt: skip
