r"""``tt-sequence-length``: Trauger & Tewari (2024), section 6, Figures 1-3, plus the bounds.

Sparse majority (:func:`jaxbounds.data.sparse_majority`, $|I| = 9$): a one-layer
:class:`~jaxbounds.models.ScalarTransformer` (summed heads, row projections, ReLU, [CLS] readout
to 2 logits) is trained with Adam on minibatches of 128 with the cross-entropy, for every
sequence length T of the grid and several seeds (a new data set, subset I and initialisation per
seed). At the epoch of lowest validation loss each unit records what the paper's figures show

- ``l1_norm``: $\sum |\theta|$, the total l1 norm of all weights (Figure 1),
- ``gen_gap``: validation minus training cross-entropy (Figure 2),
- ``val_accuracy``: validation accuracy (Figure 3),

and, on the same weights, what the paper does not compute:

- ``tt_rad``: the Trauger & Tewari Theorem 4.1 Rademacher bound (Corollary 4.1.1, heads summed,
  hidden constant 1) with its status, and ``tt_gap_bound`` from it;
- ``tt42_rad``: the Theorem 4.2 bound through Corollary 4.2.1 (no T anywhere);
- ``edelman_rad``: the Edelman et al. cover with its $\log(d m T)$ factor, through the same
  Theorem 4.2 composition and Dudley, with ``edelman_gap_bound``, its ``edelman_log_factor`` and
  ``edelman_rad_ref``, the same bound on the same weights at the reference length
  ``edelman_ref_T`` (so ``edelman_rad / edelman_rad_ref`` is the growth due to T alone);
- ``rad_search``: a Monte Carlo **lower** bound on the empirical Rademacher complexity of the
  class the T&T bound covers (every matrix in the norm ball of its own trained norm), by
  projected gradient ascent (:func:`kernels.rademacher_search`), with its standard error and
  one-sided McDiarmid lower end.

The two-class cross-entropy of logits $(z_0, z_1)$ is the logistic loss of the scalar
$f = z_1 - z_0 = w^\top Y_{[CLS]}$ with $w = W_{:,1} - W_{:,0}$, so the bounds use the scalar
model with that readout, a 1-Lipschitz loss, and the loss range $[0, \log(1 + e^{\|w\|_2})]$.

The seeds of one T share every shape, so :func:`run_batch` trains them in one call of the
training engine (:func:`jaxbounds.training.train`, ``lanes`` seeds per vmapped program, so a
unit's row has the same bits alone, in a batch of any size, in any position); ``run_unit`` is
``run_batch`` of one unit.

References:
  Trauger & Tewari 2024, arXiv:2310.13088, sections 4 and 6; Edelman, Goel, Kakade & Zhang
  2022, arXiv:2110.10090.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import kernels
from jaxbounds.bounds import covering, edelman, trauger_tewari
from jaxbounds.bounds._result import Bound
from jaxbounds.data import sparse_majority
from jaxbounds.experiments import runner
from jaxbounds.experiments._tt_design import (
    CLAIMS,
    PAPER_NUMBERS,
    SCALES,
    tt_units,
)
from jaxbounds.experiments._tt_report import render
from jaxbounds.models import ScalarTransformer, as_pure
from jaxbounds.models.pure import apply_in_chunks
from jaxbounds.models.scalar import scale_by_radii
from jaxbounds.training import TrainResult, accuracy, cross_entropy_loss, train
from kernels.norms import group_norm, spectral_norm

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "best_params",
    "l1_norm",
    "run_batch",
    "run_unit",
    "unit_measurements",
]

NAME = "tt-sequence-length"
PAPER = "Trauger & Tewari 2024, arXiv:2310.13088, section 6 (Figures 1-3)"

# ------------------------------------------------------------------------------ model and data


@functools.cache
def _model(embed_dim: int, num_heads: int, activation: str, num_classes: int | None):
    """``apply_fn`` of a one-layer ScalarTransformer (one per shape, so programs are reused)."""
    model = ScalarTransformer(
        embed_dim, num_heads=num_heads, num_classes=num_classes, activation=activation,
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    return as_pure(model)[0]


def _init_params(cfg: Mapping[str, Any], seed: int) -> dict:
    model = ScalarTransformer(
        cfg["embed_dim"], num_heads=cfg["num_heads"], num_classes=2,
        activation=cfg["activation"], param_dtype=jnp.dtype(cfg["dtype"]), rngs=nnx.Rngs(seed),
    )  # fmt: skip
    return as_pure(model)[1]


def _data(cfg: Mapping[str, Any], seed: int) -> dict[str, jax.Array]:
    """A new data set per (seed, T): one draw of training and validation sequences (same I)."""
    n = cfg["num_train"]
    data = sparse_majority(
        jax.random.fold_in(jax.random.key(seed), cfg["seq_len"]),
        num_examples=n + cfg["num_val"], seq_len=cfg["seq_len"], sparsity=cfg["sparsity"],
        embed_dim=cfg["embed_dim"], dtype=jnp.dtype(cfg["dtype"]),
    )  # fmt: skip
    x, y = data["inputs"], data["labels"]
    return {"train_x": x[:n], "train_y": y[:n], "val_x": x[n:], "val_y": y[n:]}


# ---------------------------------------------------------------------------------- training

_EVAL_CHUNK = 2048


def _evaluate(apply_fn, params, data) -> dict[str, jax.Array]:
    """Full-set training and validation cross-entropy and accuracy (traceable).

    One forward pass over both sets, so the compiled program holds one copy of the model.
    """
    n = data["train_x"].shape[0]
    x = jnp.concatenate([data["train_x"], data["val_x"]])
    logits = apply_in_chunks(apply_fn, params, x, chunk_size=_EVAL_CHUNK)
    out = {}
    for split, part in (("train", slice(0, n)), ("val", slice(n, None))):
        out[f"{split}_loss"] = cross_entropy_loss(logits[part], data[f"{split}_y"])
        out[f"{split}_accuracy"] = accuracy(logits[part], data[f"{split}_y"]).astype(logits.dtype)
    return out


@functools.cache
def _training_fns(embed_dim: int, num_heads: int, activation: str) -> tuple:
    """``(loss_fn, eval_fn)`` of one model shape: the same objects on every call.

    The engine caches its compiled programs on these callables, so every call reuses them.
    """
    apply_fn = _model(embed_dim, num_heads, activation, 2)

    def loss_fn(params, batch):
        return cross_entropy_loss(apply_fn(params, batch["train_x"]), batch["train_y"])

    def eval_fn(params, data):
        return _evaluate(apply_fn, params, data)

    return loss_fn, eval_fn


def _check_config(cfg: Mapping[str, Any]) -> None:
    if cfg["optimizer"] != "adam":
        raise ValueError(f"optimizer: only 'adam' is implemented, got {cfg['optimizer']!r}")
    if cfg["num_epochs"] % cfg["eval_every"]:
        raise ValueError("num_epochs: expected a multiple of eval_every")


def _train(units: Sequence[runner.Unit]) -> tuple[list[dict], TrainResult]:
    """Train the seeds of one configuration together: their data and the engine's result.

    One :func:`jaxbounds.training.train` call: Adam on minibatches, the validation metrics every
    ``eval_every`` epochs (none at initialisation), the state of lowest validation loss kept;
    ``cfg["lanes"]`` runs per vmapped program whatever the number of seeds, so a unit's bits do
    not depend on the units trained beside it.
    """
    cfg = units[0].config
    if any(u.config != cfg for u in units):
        raise ValueError("run_batch: the units of a batch must share their configuration")
    _check_config(cfg)
    datas = [_data(cfg, u.seed) for u in units]
    stack = functools.partial(jax.tree_util.tree_map, lambda *xs: jnp.stack(xs))
    params0 = stack(*[_init_params(cfg, u.seed) for u in units])
    keys = jnp.stack([jax.random.fold_in(jax.random.key(u.seed), 1_000_003) for u in units])
    data = stack(*datas)
    per_epoch = -(-cfg["num_train"] // min(cfg["batch_size"], cfg["num_train"]))
    loss_fn, eval_fn = _training_fns(cfg["embed_dim"], cfg["num_heads"], cfg["activation"])
    result = train(
        loss_fn, params0, {"train_x": data["train_x"], "train_y": data["train_y"]}, keys,
        optimizer=optax.adam, hyperparams={"learning_rate": cfg["learning_rate"]},
        num_steps=cfg["num_epochs"] * per_epoch, batch_size=cfg["batch_size"],
        eval_every=cfg["eval_every"] * per_epoch, eval_fn=eval_fn, eval_data=data,
        eval_at_start=False, keep="best", best_metric="val_loss", runs=len(units),
        data_per_run=True, lanes=cfg["lanes"],
    )  # fmt: skip
    return datas, result


def best_params(units: Sequence[runner.Unit]) -> list[tuple[dict, dict[str, jax.Array]]]:
    """Per unit of one configuration, its parameters at the best epoch and its data.

    Trains exactly as :func:`run_batch` does (for checks and tests of the recorded rows).
    """
    datas, result = _train(units)
    return [(result.run(i).params, datas[i]) for i in range(len(units))]


# ------------------------------------------------------------------------------- measurements


def l1_norm(params: Any) -> float:
    r"""Total l1 norm $\sum |\theta|$ of every weight (the paper's Figure 1 quantity).

    >>> l1_norm({"a": np.array([1.0, -2.0]), "b": np.array([[0.5]])})
    3.5
    """
    return float(sum(np.abs(np.asarray(leaf, np.float64)).sum() for leaf in
                     jax.tree_util.tree_leaves(params)))  # fmt: skip


def _scalar_params(params: Mapping[str, Any]) -> dict:
    """The scalar model equal to logit 1 minus logit 0: readout ``w = W[:, 1] - W[:, 0]``."""
    w = params["w"]  # numpy or jax, computed in its own dtype
    return {"layers": params["layers"], "w": w[:, 1] - w[:, 0]}


def _norms(params: Mapping[str, Any], train_x: Any) -> dict[str, np.ndarray]:
    """Per-head norms of the T&T class, spectral and (2,1) norms, and the input bounds."""
    layer = params["layers"][0]
    heads = range(np.shape(layer["w_qk"])[0])
    f64 = functools.partial(np.asarray, dtype=np.float64)
    w = f64(params["w"])
    rows = f64(train_x).reshape(-1, np.shape(train_x)[-1])
    mats = [f64(layer[k][h]) for k in ("w_qk", "w_v", "w_c") for h in heads]
    return {
        "qk11": np.array([float(group_norm(f64(layer["w_qk"][h]), q=1, p=1)) for h in heads]),
        # ||W_v^T||_{1,inf}: W_v is (d, k); the columns of W_v^T are the rows of W_v.
        "v1inf": np.array([float(np.abs(f64(layer["w_v"][h])).sum(1).max()) for h in heads]),
        "c1inf": np.array([float(np.abs(f64(layer["w_c"][h])).sum(1).max()) for h in heads]),
        "w1": float(np.abs(w).sum()),
        "w2": float(np.linalg.norm(w)),
        "c2": max(float(spectral_norm(f64(layer["w_c"][h]).T)) for h in heads),
        "v2": max(float(spectral_norm(f64(layer["w_v"][h]).T)) for h in heads),
        "qk2": max(float(spectral_norm(f64(layer["w_qk"][h]))) for h in heads),
        "b11": max([float(np.abs(x).sum()) for x in mats] + [float(np.abs(w).sum())]),
        "b21": max([float(group_norm(x, q=2, p=1)) for x in mats] + [float(np.abs(w).sum())]),
        "x2": float(np.linalg.norm(rows, axis=1).max()),
    }


def _status(bound: Bound) -> str:
    return bound.status.name


def _tt_theorem_4_1(nm: dict, *, d: int, m: int, loss_bound: float) -> Bound:
    """Corollary 4.1.1 per head, summed over the heads (the heads' classes add)."""
    per_head = [
        trauger_tewari.corollary_4_1_1(
            B_x=nm["x2"], B_WQK=nm["qk11"][h], B_w=nm["w1"], B_Wc=nm["c1inf"][h],
            B_Wv=nm["v1inf"][h], L_sigma=1.0, d=d, num_examples=m, loss_bound=loss_bound,
        )
        for h in range(len(nm["qk11"]))
    ]  # fmt: skip
    hypotheses = {k: v for b in per_head for k, v in b.hypotheses.items()}
    return Bound(
        value=sum(float(b.value) for b in per_head), terms={}, hypotheses=hypotheses,
        trivial=loss_bound / 2.0, name="T&T Corollary 4.1.1 (heads summed)", kind="rademacher",
    )  # fmt: skip


def _head_cover(cover: Bound, num_heads: int) -> Bound:
    """H summed heads of equal norm bounds: log cover times H^3 (Lemma A.8, beta = 1) [rebuilt]."""
    factor = float(num_heads) ** 3
    return dataclasses.replace(
        cover, value=cover.value * factor, terms={**cover.terms, "C": cover.value * factor},
        provenance="rebuilt",
    )  # fmt: skip


def _edelman(nm: dict, *, d: int, m: int, seq_len: int, heads: int, loss_bound: float):
    """Edelman et al. multi-layer cover (log(d m T) factor, x H^3) and its Dudley bound."""
    cover = edelman.multi_layer_log_cover(
        B21=nm["b21"], B_x=nm["x2"], d=d, num_examples=m, seq_len=seq_len, num_layers=1,
        L_sigma=1.0, B_c2=nm["c2"], B_v2=nm["v2"], B_QK2=nm["qk2"], B_w=nm["w2"],
    )  # fmt: skip
    cover = _head_cover(cover, heads)
    rad = edelman.rademacher(cover=cover, radius=nm["w2"], num_examples=m, loss_bound=loss_bound)
    return cover, rad


def _tt_theorem_4_2(nm: dict, *, d: int, m: int, heads: int, loss_bound: float):
    """T&T Corollary 4.2.1 cover (no T, x H^3) and its Dudley bound."""
    cover = trauger_tewari.corollary_4_2_1(
        B=nm["b11"], B_x=nm["x2"], d=d, k=d, num_layers=1, L_sigma=1.0, B_c2=nm["c2"],
        B_v2=nm["v2"], B_QK2=nm["qk2"], B_w=nm["w2"],
    )  # fmt: skip
    cover = _head_cover(cover, heads)
    rad = trauger_tewari.multi_layer_rademacher(
        cover=cover, B_w=nm["w2"], num_examples=m, loss_bound=loss_bound
    )
    return cover, rad


def _gap(rad: Bound, *, m: int, delta: float, loss_bound: float) -> tuple[float, str]:
    """The gap bound from a Rademacher bound; not valid when the Rademacher bound is not."""
    gap = covering.rademacher_to_gap(
        rademacher=rad.value, num_examples=m, delta=delta, loss_bound=loss_bound
    )
    return float(gap.value), _status(gap) if rad.is_valid else "NOT_VALID"


def _bounds(cfg: Mapping[str, Any], nm: dict) -> dict[str, Any]:
    """The T&T and Edelman bounds (values and statuses) on one unit's measured norms."""
    d, m, heads, delta = cfg["embed_dim"], cfg["num_train"], cfg["num_heads"], cfg["delta"]
    c = float(np.log1p(np.exp(nm["w2"])))  # logistic loss range: |f| <= ||w||_2
    tt = _tt_theorem_4_1(nm, d=d, m=m, loss_bound=c)
    tt42_cover, tt42 = _tt_theorem_4_2(nm, d=d, m=m, heads=heads, loss_bound=c)
    kw = {"d": d, "m": m, "heads": heads, "loss_bound": c}
    ed_cover, ed = _edelman(nm, seq_len=cfg["seq_len"] + 1, **kw)  # tokens: T bits and [CLS]
    ref_cover, ref = _edelman(nm, seq_len=cfg["edelman_ref_T"] + 1, **kw)
    tt_gap, tt_gap_status = _gap(tt, m=m, delta=delta, loss_bound=c)
    ed_gap, ed_gap_status = _gap(ed, m=m, delta=delta, loss_bound=c)
    return {
        "loss_range": c,
        "tt_rad": float(tt.value), "tt_rad_status": _status(tt),
        "tt_gap_bound": tt_gap, "tt_gap_bound_status": tt_gap_status,
        "tt42_cover": float(tt42_cover.value),
        "tt42_rad": float(tt42.value), "tt42_rad_status": _status(tt42),
        "edelman_cover": float(ed_cover.value), "edelman_cover_ref": float(ref_cover.value),
        "edelman_log_factor": float(ed_cover.terms["log_factor"]),
        "edelman_rad": float(ed.value), "edelman_rad_status": _status(ed),
        "edelman_rad_ref": float(ref.value),
        "edelman_dudley_saturated": bool(ed.terms["delta_star"] >= nm["w2"]),
        "edelman_gap_bound": ed_gap, "edelman_gap_bound_status": ed_gap_status,
    }  # fmt: skip


# ------------------------------------------------------------- Rademacher search (lower bound)


def _project_unit_balls(theta: Mapping[str, Any]) -> dict:
    """Projection onto the product of unit balls of the normalised T&T class (per head).

    Traced without the projections' runtime checks (the radius is the constant 1; the
    search's own checks catch non-finite values): they are host callbacks inside every ascent
    step, which cost more compile time than the rest of the search.
    """
    with kernels.runtime_checks(False):
        return _project(theta)


def _project(theta: Mapping[str, Any]) -> dict:
    layer = theta["layers"][0]

    def rows_l1(w):  # ||W^T||_{1,inf} <= 1: every row of W in the l1 ball
        return kernels.project_group_ball(w.T, q=1, p=math.inf, radius=1.0).T

    return {
        "layers": {0: {
            "w_qk": jax.vmap(lambda w: kernels.project_l1_ball(w, radius=1.0))(layer["w_qk"]),
            "w_v": jax.vmap(rows_l1)(layer["w_v"]),
            "w_c": jax.vmap(rows_l1)(layer["w_c"]),
        }},
        "w": kernels.project_l1_ball(theta["w"], radius=1.0),
    }  # fmt: skip


@functools.cache
def _search_apply(embed_dim: int, num_heads: int, activation: str):
    """``(theta, inputs) -> [n]``: the scalar model at ``radius * theta`` (per matrix)."""
    scalar = _model(embed_dim, num_heads, activation, None)

    def apply_fn(theta, inputs):
        return scalar(scale_by_radii(theta, inputs["radii"]), inputs["x"])

    return apply_fn


def _rademacher_search(cfg: Mapping[str, Any], params: dict, nm: dict, x: Any, seed: int):
    r"""Lower bound on Rad_S of {every matrix in the ball of its trained norm} on the training set.

    The class is parametrised as ``radius * theta`` with ``theta`` in unit balls (the same set;
    the ascent runs in the normalised coordinates). ``|f| <= ||w||_2 <= ||w||_1`` bounds the
    outputs for the McDiarmid lower end.
    """
    dtype = jnp.dtype(cfg["dtype"])
    radii = {
        "qk": jnp.asarray(nm["qk11"], dtype), "v": jnp.asarray(nm["v1inf"], dtype),
        "c": jnp.asarray(nm["c1inf"], dtype), "w": jnp.asarray(nm["w1"], dtype),
    }  # fmt: skip
    layer = params["layers"][0]
    theta = {
        "layers": {0: {
            "w_qk": layer["w_qk"] / radii["qk"][:, None, None],
            "w_v": layer["w_v"] / radii["v"][:, None, None],
            "w_c": layer["w_c"] / radii["c"][:, None, None],
        }},
        "w": params["w"] / radii["w"],
    }  # fmt: skip
    est = kernels.rademacher_search(
        _search_apply(cfg["embed_dim"], cfg["num_heads"], cfg["activation"]),
        theta, {"x": x, "radii": radii},
        jax.random.fold_in(jax.random.key(seed), 2_000_003),
        project=_project_unit_balls, num_samples=cfg["rad_draws"], num_steps=cfg["rad_steps"],
        step_size=jnp.asarray(1.0, dtype), output_bound=jnp.asarray(nm["w1"] * 1.0001, dtype),
        delta=cfg["delta"],
    )  # fmt: skip
    return {
        "rad_search": float(est.mean), "rad_search_stderr": float(est.stderr),
        "rad_search_lower": float(est.lower),
    }  # fmt: skip


# ---------------------------------------------------------------------------------- the unit


def unit_measurements(cfg: Mapping[str, Any], seed: int, trained: TrainResult, data: dict):
    """One unit's result row from its training (one run of the engine's result) and its data."""
    params = jax.tree_util.tree_map(jnp.asarray, trained.params)
    m = {k: float(trained.best(k)) for k in trained.metrics}
    last = int(trained.num_evals) - 1
    final = {k: float(v[last]) for k, v in trained.metrics.items()}
    per_epoch = trained.steps_per_epoch
    best = int(trained.best_index)
    as64 = functools.partial(np.asarray, dtype=np.float64)
    nm = _norms(_scalar_params(jax.tree_util.tree_map(as64, params)), data["train_x"])
    row = {
        "best_epoch": int(trained.eval_step[best]) // per_epoch if best >= 0 else 0,
        "l1_norm": l1_norm(params),
        "gen_gap": m["val_loss"] - m["train_loss"],
        "val_accuracy": m["val_accuracy"],
        "train_accuracy": m["train_accuracy"],
        "train_loss": m["train_loss"],
        "val_loss": m["val_loss"],
        "final_val_loss": final["val_loss"],
        "final_train_loss": final["train_loss"],
        "input_l2": nm["x2"],
        "readout_l1": nm["w1"],
    }
    row |= _bounds(cfg, nm)
    row |= _rademacher_search(cfg, _scalar_params(params), nm, data["train_x"], seed)
    return row


def run_batch(units: Sequence[runner.Unit]) -> list[dict]:
    """The rows of the seeds of one configuration.

    One training call (:func:`_train`), then per unit the norms, bounds and Rademacher search;
    row ``i`` does not depend on the other units (same bits alone, in any batch, any position).
    """
    datas, result = _train(units)
    return [
        unit_measurements(unit.config, unit.seed, result.run(i), datas[i])
        for i, unit in enumerate(units)
    ]


def run_unit(unit: runner.Unit) -> dict:
    """One unit: :func:`run_batch` of that unit alone."""
    return run_batch([unit])[0]


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Sparse majority (|I| = 9) with a one-layer Transformer: total l1 norm, generalization "
        "gap and validation accuracy at the best epoch against the sequence length T, with the "
        "Trauger & Tewari and Edelman et al. bounds and a Rademacher lower bound on the same "
        "weights"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    run_batch=run_batch,
    units=tt_units,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 2, "cpu": 5, "paper": 5},
    default_scale="cpu",
)
