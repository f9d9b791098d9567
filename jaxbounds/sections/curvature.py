r"""The ``scalar`` model of ``jaxbounds estimate`` and its ``training`` and ``curvature`` sections.

Builder ``scalar`` (:func:`build_scalar`): draws a sparse-majority data set
(:func:`jaxbounds.data.sparse_majority`; train and test share the subset I), trains a
:class:`jaxbounds.models.ScalarTransformer` with scalar output and logistic loss by Adam
(:func:`jaxbounds.train.train`), and fills the :class:`jaxbounds.estimate.EstimateContext`
with ``loss_fn(params)`` = mean logistic loss on the whole training set. Sizes are in
:data:`QUICK` (the default run) and :data:`FULL` (``--full``, the paper's d = 64).

Section ``training``: final train / test loss and accuracy, generalization gap, parameter count.

Section ``curvature``: Hessian trace of ``loss_fn`` at the trained parameters by Hutchinson
(Rademacher probes) and Hutch++ (same budget of Hessian-vector products), the top Hessian
eigenvalues by Lanczos with full reorthogonalisation, and the weight norms (Frobenius norm of
every matrix, total l1 and l2 norms, distance from the initialisation). All curvature numbers
come from one jitted program that linearises the gradient once.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbounds.data import sparse_majority
from jaxbounds.estimate import EstimateContext, Row, register_model, register_section
from jaxbounds.models import ScalarTransformer, as_pure
from jaxbounds.train import task_accuracy, task_loss, train
from kernels.curvature import hutchinson_trace, hutchpp_trace, hvp, top_eigenvalues

__all__ = ["FULL", "QUICK", "build_scalar", "curvature_section", "training_section"]

#: Sizes of the default run (well under a minute of compute on 2 CPU cores).
QUICK: dict[str, Any] = {
    "embed_dim": 32,
    "seq_len": 20,
    "sparsity": 9,
    "num_train": 300,
    "num_test": 2000,
    "num_layers": 1,
    "num_heads": 2,
    "activation": "relu",
    "num_epochs": 200,
    "batch_size": 128,
    "learning_rate": 3e-3,
    "num_probes": 100,
    "hutchpp_matvecs": 99,
    "lanczos_steps": 30,
    "top_k": 3,
}

#: Sizes of ``--full``: the paper's d = 64, 2 heads, |I| = 9, 300 training samples.
FULL: dict[str, Any] = {
    **QUICK,
    "embed_dim": 64,
    "seq_len": 40,
    "num_test": 10000,
    "num_epochs": 2000,
    "num_probes": 400,
    "hutchpp_matvecs": 399,
    "lanczos_steps": 80,
    "top_k": 5,
}


@register_model("scalar")
def build_scalar(key: jax.Array, *, quick: bool = True, progress: bool = True) -> EstimateContext:
    """Sparse-majority data + a trained ScalarTransformer (sizes in QUICK or FULL).

    Args:
      key: PRNG key; split into data, test data, init, minibatch order and Monte Carlo keys.
      quick: use :data:`QUICK` (else :data:`FULL`).
      progress: draw the training progress bar on stderr.

    Returns:
      The filled context; ``extra`` holds ``"config"``, ``"init_params"``,
      ``"activation_lipschitz"``, ``"loss"`` / ``"loss_lipschitz"`` and the JSON ``"meta"``
      (config, parameter count, training record).
    """
    cfg = dict(QUICK if quick else FULL)
    k_data, k_test, k_init, k_train, k_mc = jax.random.split(key, 5)
    sizes = {k: cfg[k] for k in ("seq_len", "sparsity", "embed_dim")}
    train_data = sparse_majority(k_data, num_samples=cfg["num_train"], **sizes)
    test_data = sparse_majority(
        k_test, num_samples=cfg["num_test"], subset=train_data["subset"], **sizes
    )
    seed = int(jax.random.randint(k_init, (), 0, 2**31 - 1))
    model = ScalarTransformer(
        cfg["embed_dim"],
        num_layers=cfg["num_layers"],
        num_heads=cfg["num_heads"],
        activation=cfg["activation"],
        rngs=nnx.Rngs(seed),
    )
    init_params = as_pure(model)[1]
    model, record = train(
        model,
        train_data,
        k_train,
        num_epochs=cfg["num_epochs"],
        batch_size=cfg["batch_size"],
        learning_rate=cfg["learning_rate"],
        test_data=test_data,
        progress=progress,
    )
    apply_fn, params = as_pure(model)
    inputs, labels = train_data["inputs"], train_data["labels"]

    def loss_fn(p: Any) -> jax.Array:
        return task_loss(apply_fn(p, inputs), labels)

    num_params = sum(int(jnp.size(x)) for x in jax.tree_util.tree_leaves(params))
    meta = {
        "config": cfg,
        "num_params": num_params,
        "subset": [int(i) for i in train_data["subset"]],
        "history": record.to_dict(),
    }
    return EstimateContext(
        name="scalar",
        model=model,
        apply_fn=apply_fn,
        params=params,
        loss_fn=loss_fn,
        train=train_data,
        test=test_data,
        history=record,
        key=k_mc,
        quick=quick,
        extra={
            "config": cfg,
            "init_params": init_params,
            "activation_lipschitz": model.activation_lipschitz,
            "loss": "logistic",
            "loss_lipschitz": 1.0,
            "meta": meta,
        },
    )


@register_section("training", models=("scalar",))
def training_section(ctx: EstimateContext) -> list[Row]:
    """Final train / test loss and accuracy of the trained model, and its size."""
    s = "training"
    history = ctx.history
    if history is not None and history.train_loss:
        # The record's last entry is the evaluation of the final parameters.
        final = history.final()
    else:
        final = {}
        for split, data in (("train", ctx.train), ("test", ctx.test)):
            if data is not None:
                out = jax.jit(ctx.apply_fn)(ctx.params, data["inputs"])
                final[f"{split}_loss"] = float(task_loss(out, data["labels"]))
                final[f"{split}_accuracy"] = float(task_accuracy(out, data["labels"]))
    n_train = int(ctx.train["labels"].shape[0])
    rows = [
        Row(s, "train loss", final["train_loss"], note=f"logistic, n = {n_train}"),
        Row(s, "train accuracy", final["train_accuracy"]),
    ]
    if "test_loss" in final and ctx.test is not None:
        n_test = int(ctx.test["labels"].shape[0])
        gap = final["test_loss"] - final["train_loss"]
        rows += [
            Row(s, "test loss", final["test_loss"], note=f"logistic, n = {n_test}"),
            Row(s, "test accuracy", final["test_accuracy"]),
            Row(s, "generalization gap (loss)", gap, note="test - train"),
        ]
    num_params = sum(int(jnp.size(x)) for x in jax.tree_util.tree_leaves(ctx.params))
    rows.append(Row(s, "parameters", float(num_params)))
    if history is not None and history.epoch:
        rows.append(Row(s, "epochs", float(history.epoch[-1]), note=f"{history.seconds:.1f} s"))
    return rows


def _curvature(
    loss_fn: Any,
    params: Any,
    key: jax.Array,
    *,
    num_probes: int,
    hutchpp_matvecs: int,
    lanczos_steps: int,
    top_k: int,
) -> tuple[Any, Any, jax.Array]:
    k_hutch, k_pp, k_lanczos = jax.random.split(key, 3)
    matvec = hvp(loss_fn, params)
    hutch = hutchinson_trace(matvec, params, k_hutch, num_probes=num_probes)
    hpp = hutchpp_trace(matvec, params, k_pp, num_matvecs=hutchpp_matvecs)
    top = top_eigenvalues(matvec, params, k_lanczos, k=top_k, num_iterations=lanczos_steps)
    return hutch, hpp, top


@register_section("curvature", models=("scalar",))
def curvature_section(ctx: EstimateContext) -> list[Row]:
    """Hessian trace (Hutchinson, Hutch++), top eigenvalues (Lanczos) and weight norms."""
    s = "curvature"
    cfg = ctx.extra.get("config") or (QUICK if ctx.quick else FULL)
    sizes = {k: cfg[k] for k in ("num_probes", "hutchpp_matvecs", "lanczos_steps", "top_k")}
    program = jax.jit(functools.partial(_curvature, ctx.loss_fn, **sizes))
    t = time.perf_counter()
    hutch, hpp, top = jax.block_until_ready(program(ctx.params, ctx.section_key(s)))
    seconds = time.perf_counter() - t
    rows = [
        Row.from_estimate(
            s,
            "Hessian trace (Hutchinson)",
            hutch,
            note=f"{sizes['num_probes']} Rademacher probes, train loss",
        ),
        Row.from_estimate(
            s,
            "Hessian trace (Hutch++)",
            hpp,
            note=f"{sizes['hutchpp_matvecs']} matvecs; stderr of the Hutchinson part",
        ),
    ]
    for i, value in enumerate(top.tolist(), start=1):
        rows.append(
            Row(
                s,
                f"Hessian eigenvalue λ{i}",
                float(value),
                note=f"Lanczos {sizes['lanczos_steps']} steps (Ritz value)",
            )
        )
    matrices = ScalarTransformer.named_matrices(ctx.params)
    for name, mat in matrices.items():
        rows.append(Row(s, f"‖{name}‖_F", float(jnp.linalg.norm(mat.reshape(-1))), note="norm"))
    leaves = jax.tree_util.tree_leaves(ctx.params)
    l1 = sum(float(jnp.sum(jnp.abs(x))) for x in leaves)
    l2 = sum(float(jnp.sum(x * x)) for x in leaves) ** 0.5
    rows.append(Row(s, "‖θ‖_1 (all weights)", l1, note="norm; T&T Fig. 1 quantity"))
    rows.append(Row(s, "‖θ‖_2 (all weights)", l2, note="norm"))
    init = ctx.extra.get("init_params")
    if init is not None:
        diff = jax.tree_util.tree_leaves(jax.tree_util.tree_map(jnp.subtract, ctx.params, init))
        dist = sum(float(jnp.sum(x * x)) for x in diff) ** 0.5
        rows.append(Row(s, "‖θ - θ_0‖_2", dist, note="norm; distance from initialisation"))
    ctx.extra.setdefault("meta", {})["curvature_seconds"] = seconds
    return rows
