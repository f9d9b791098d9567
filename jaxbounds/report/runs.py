r"""The model builders of ``jaxbounds estimate``: default data, a trained or constructed model.

A builder ``build_<model>(key, *, quick) -> Run`` makes everything the report sections need
(:class:`~jaxbounds.report.facts.Run`); :mod:`jaxbounds.report.registry` lists them.

- ``scalar`` (:func:`build_scalar`): a sparse-majority data set
  (:func:`jaxbounds.data.sparse_majority`; train and test share the subset I), a
  :class:`~jaxbounds.models.ScalarTransformer` with scalar output trained by Adam on the logistic
  loss (:func:`jaxbounds.training.train_minibatch`). Sizes: :data:`SCALAR_QUICK` (the default
  run) and :data:`SCALAR_FULL` (``--full``, the paper's d = 64).
- ``shallow`` (:func:`build_shallow`): digits 0 vs 1 (:func:`shallow_data`: scikit-learn's 8x8
  digits as 4 tokens of 16 pixels so that the attention layer is not trivial; MNIST as 13
  tokens of 64 pixels when the environment variable ``JAXBOUNDS_MNIST_DIR`` names a folder with
  the IDX files; the synthetic rings-vs-bars set, announced loudly, when scikit-learn is
  missing), a :class:`~jaxbounds.models.ShallowTransformer` with d_m = 512 >= N (quick) or
  2048, full-batch GD with learning rate 0.1 on the logistic loss, as in the paper
  (:func:`jaxbounds.training.train_gd`).
- ``construction`` (:func:`build_construction`): the tiling of 2-parities on $T = 12$ bits
  ($\omega = 6$, $D_f = 2$, $c_t = 1/\sqrt 6$; $T = 10$, $\omega = 5$ when quick), the
  hard-coded :func:`~jaxbounds.models.construction.construction` at the paper's logit scale
  $2 \ln T$ (no training), and as data all $2^T$ inputs with labels $f(x)$; the loss is the
  quadratic loss $\frac{1}{m}\sum_x (f_\theta(x) - f(x))^2$.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbounds.data import sparse_majority
from jaxbounds.data.boolean import boolean_dataset, tiling_parities
from jaxbounds.data.mnist import BinaryDigits, load_binary_digits
from jaxbounds.data.synthetic import synthetic_digits
from jaxbounds.models import (
    ScalarTransformer,
    ShallowTransformer,
    as_pure,
    construction,
    construction_quantities,
    scalar_quantities,
    set_params,
    shallow_quantities,
)
from jaxbounds.models.ntk import ntk_diagonal
from jaxbounds.models.pure import apply_in_chunks
from jaxbounds.models.shallow import PARAM_NAMES, shallow_apply
from jaxbounds.report.facts import (
    ConstructionFacts,
    Run,
    ScalarConfig,
    ScalarFacts,
    ShallowFacts,
)
from jaxbounds.training import (
    accuracy,
    classification_loss,
    logistic_loss,
    squared_loss,
    train_gd,
    train_minibatch,
)
from kernels.norms import tree_norm

__all__ = [
    "SCALAR_FULL",
    "SCALAR_QUICK",
    "SHALLOW_LEARNING_RATE",
    "build_construction",
    "build_scalar",
    "build_shallow",
    "construction_run",
    "scalar_run",
    "shallow_data",
    "shallow_run",
]

#: Sizes of the default ``scalar`` run (well under a minute of compute on 2 CPU cores).
SCALAR_QUICK = ScalarConfig()
#: Sizes of ``--full``: the paper's d = 64, 2 heads, |I| = 9, 300 training samples.
SCALAR_FULL = dataclasses.replace(
    SCALAR_QUICK,
    embed_dim=64,
    seq_len=40,
    num_test=10000,
    num_epochs=2000,
    num_probes=400,
    hutchpp_matvecs=399,
    lanczos_steps=80,
    top_k=5,
)
#: GD step size of the ``shallow`` run (the paper's).
SHALLOW_LEARNING_RATE = 0.1


def _scalar_data(k_data: jax.Array, k_test: jax.Array, cfg: ScalarConfig) -> tuple[dict, dict]:
    """Train and test sparse-majority sets sharing the subset I."""
    sizes = {"seq_len": cfg.seq_len, "sparsity": cfg.sparsity, "embed_dim": cfg.embed_dim}
    train = sparse_majority(k_data, num_examples=cfg.num_train, **sizes)
    test = sparse_majority(k_test, num_examples=cfg.num_test, subset=train["subset"], **sizes)
    return train, test


def _scalar_metrics(apply_fn: Any) -> Any:
    """Per-epoch metrics: accuracies, test loss (one forward pass over train and test), l1 norm."""

    def metrics(params: Any, data: tuple[jax.Array, ...]) -> dict[str, jax.Array]:
        x, y, tx, ty = data
        n = y.shape[0]
        both = apply_in_chunks(apply_fn, params, jnp.concatenate([x, tx]), chunk_size=4096)
        return {
            "train_accuracy": accuracy(both[:n], y),
            "test_loss": classification_loss(both[n:], ty),
            "test_accuracy": accuracy(both[n:], ty),
            "l1_total": tree_norm(params, p=1),
        }

    return metrics


def scalar_run(
    key: jax.Array, cfg: ScalarConfig, *, quick: bool = True, progress: bool = True
) -> Run:
    """Sparse-majority data + a ScalarTransformer trained by Adam with the sizes ``cfg``.

    Parameters are float64 when x64 is enabled, else float32 (the data's default float dtype).

    Args:
      key: PRNG key; split into data, init, minibatch order and Monte Carlo keys.
      cfg: the sizes.
      quick: recorded in the run (sections pick their Monte Carlo budgets from it).
      progress: draw the training progress bar on stderr.
    """
    k_data, k_test, k_init, k_train, k_mc = jax.random.split(key, 5)
    train, test = _scalar_data(k_data, k_test, cfg)
    model = ScalarTransformer(
        cfg.embed_dim, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
        activation=cfg.activation, param_dtype=jnp.result_type(float),
        rngs=nnx.Rngs(int(jax.random.randint(k_init, (), 0, 2**31 - 1))),
    )  # fmt: skip
    apply_fn, init_params = as_pure(model)

    def loss_fn(params: Any, batch: dict[str, Any]) -> jax.Array:
        return classification_loss(apply_fn(params, batch["inputs"]), batch["labels"])

    params, record = train_minibatch(
        loss_fn, init_params, {"inputs": train["inputs"], "labels": train["labels"]}, k_train,
        num_epochs=cfg.num_epochs, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
        metrics_fn=_scalar_metrics(apply_fn),
        metrics_data=(train["inputs"], train["labels"], test["inputs"], test["labels"]),
        progress=progress, label="[jaxbounds] scalar",
    )  # fmt: skip
    set_params(model, params)
    quantities = scalar_quantities(
        params, train["inputs"], activation_lipschitz=model.activation_lipschitz
    )
    meta = {
        "config": dataclasses.asdict(cfg),
        "num_params": sum(int(jnp.size(x)) for x in jax.tree_util.tree_leaves(params)),
        "subset": [int(i) for i in train["subset"]],
        "history": record.to_dict(),
    }
    return Run(
        name="scalar", model=model, apply_fn=apply_fn, params=params, loss_fn=loss_fn,
        train=train, test=test, record=record, key=k_mc, quick=quick, meta=meta,
        facts=ScalarFacts(config=cfg, init_params=init_params, quantities=quantities),
    )  # fmt: skip


def build_scalar(key: jax.Array, *, quick: bool = True) -> Run:
    """The ``scalar`` run with :data:`SCALAR_QUICK` (or :data:`SCALAR_FULL`) sizes."""
    return scalar_run(key, SCALAR_QUICK if quick else SCALAR_FULL, quick=quick)


def shallow_data(seed: int, quick: bool) -> BinaryDigits:
    """The ``shallow`` run's digits 0 vs 1: MNIST, scikit-learn's digits, or synthetic (loudly)."""
    directory = os.environ.get("JAXBOUNDS_MNIST_DIR")
    if directory:
        return load_binary_digits(
            directory, token_dim=64, num_train=400 if quick else 1200, num_test=1000
        )
    try:
        return load_binary_digits(None, token_dim=16, seed=seed)
    except ImportError as err:
        data = synthetic_digits(seed=seed)
        banner = "!" * 78
        print(
            f"{banner}\n[jaxbounds] WARNING: {err}.\n[jaxbounds] WARNING: the shallow model "
            f"falls back to a SYNTHETIC data set.\n[jaxbounds] {data.description}\n{banner}",
            file=sys.stderr,
        )
        return data


def _split(data: BinaryDigits, dtype: Any) -> tuple[dict, dict]:
    return tuple(
        {"inputs": jnp.asarray(d["inputs"], dtype), "labels": jnp.asarray(d["labels"])}
        for d in (data.train, data.test)
    )


def shallow_run(
    data: BinaryDigits,
    key: jax.Array,
    *,
    d_m: int,
    num_steps: int,
    quick: bool = True,
    progress: bool = True,
) -> Run:
    """Train a :class:`ShallowTransformer` of width ``d_m`` on ``data`` by full-batch GD.

    Learning rate :data:`SHALLOW_LEARNING_RATE`, logistic loss; the test loss is recorded every
    step. Parameters and inputs are float64 when x64 is enabled, else float32.
    """
    k_init, k_sections = jax.random.split(key)
    dtype = jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
    train, test = _split(data, dtype)
    model = ShallowTransformer(
        train["inputs"].shape[-1], d_m, rngs=nnx.Rngs(params=k_init), dtype=dtype
    )
    params0 = model.params_dict()

    def loss_fn(params: Any, batch: dict[str, Any]) -> jax.Array:
        return logistic_loss(shallow_apply(params, batch["inputs"]), batch["labels"])

    params, record = train_gd(
        loss_fn, params0, train, learning_rate=SHALLOW_LEARNING_RATE, num_steps=num_steps,
        metrics_fn=lambda p, test: {"test_loss": loss_fn(p, test)}, metrics_data=test,
        progress=progress, label="[jaxbounds] shallow GD",
    )  # fmt: skip
    for name in PARAM_NAMES:
        getattr(model, name)[...] = params[name]
    quantities = shallow_quantities(params0, train["inputs"], train["labels"], radii=record.radius)
    facts = ShallowFacts(
        params0=params0, description=data.description, source=data.source,
        token_dim=int(train["inputs"].shape[-1]), quantities=quantities,
    )  # fmt: skip
    return Run(
        name="shallow", model=model, apply_fn=shallow_apply, params=params, loss_fn=loss_fn,
        train=train, test=test, record=record, key=k_sections, quick=quick, facts=facts,
        meta={"data": data.description, "d_m": d_m, "gd_steps": num_steps},
    )  # fmt: skip


def build_shallow(key: jax.Array, *, quick: bool = True) -> Run:
    """The ``shallow`` run: d_m = 512 and 300 GD steps when quick, else d_m = 2048, 2000 steps."""
    k_data, k_model = jax.random.split(key)
    data = shallow_data(int(jax.random.randint(k_data, (), 0, 2**30)), quick)
    return shallow_run(
        data, k_model, d_m=512 if quick else 2048, num_steps=300 if quick else 2000, quick=quick
    )


def construction_run(
    *, seq_len: int = 12, k: int = 2, key: jax.Array | None = None, quick: bool = True
) -> Run:
    """The construction of the tiling of ``k``-parities on ``seq_len`` bits, on all its inputs."""
    f = tiling_parities(seq_len, k)
    model = construction(f, seq_len=seq_len)
    apply_fn, params = as_pure(model)
    data = boolean_dataset(f, None, num_bits=seq_len)

    def loss_fn(params: Any, batch: dict[str, Any]) -> jax.Array:
        return squared_loss(apply_fn(params, batch["inputs"]), batch["labels"])

    inputs, labels = data["inputs"], data["labels"]
    grad_sq = jax.jit(lambda p, x: ntk_diagonal(apply_fn, p, x))(params, inputs)
    risk = squared_loss(jax.jit(apply_fn)(params, inputs), labels)
    quantities = construction_quantities(
        apply_fn, params, inputs, empirical_risk=risk, grad_sq=grad_sq, function=f,
        seq_len=seq_len,
    )  # fmt: skip
    meta = {
        "target": f"tiling of {k}-parities, T={seq_len}, omega={f.sparsity}, D_f={k}",
        "num_inputs": int(inputs.shape[0]),
    }
    return Run(
        name="construction", model=model, apply_fn=apply_fn, params=params, loss_fn=loss_fn,
        train=data, key=key, quick=quick, meta=meta,
        facts=ConstructionFacts(f, seq_len=seq_len, grad_sq=grad_sq, quantities=quantities),
    )  # fmt: skip


def build_construction(key: jax.Array, *, quick: bool = True) -> Run:
    """Tiling of 2-parities on 12 bits (10 if ``quick``) at logit scale 2 ln T (no training)."""
    return construction_run(seq_len=10 if quick else 12, k=2, key=key, quick=quick)
