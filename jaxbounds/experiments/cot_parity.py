r"""``cot-parity``: chain of thought for PARITY (Appendix G, Theorem 16) of the PAC-Bayes paper.

"A Sharper Picture of Generalization in Transformers" (arXiv 2605.20988) bounds the probability
that a chain of thought for PARITY of length T goes wrong when every step is the flat
construction of one 2-parity ($\omega = 1$, $D_f = 2$), against one pass of a model computing
PARITY of all T bits (:func:`jaxbounds.bounds.pac_bayes.chain_of_thought_parity`,
:func:`jaxbounds.bounds.pac_bayes.one_pass_parity`, SPEC.md section 5, rebuilt):

$$P_{CoT} \le 4T\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2 (2G_u + P)}{4\Sigma^2}
  + \frac{L(1,2,T)}{2\sigma^2}\Big),\qquad
  P_{one} \le 4\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2 T(2G_u + P)}{4\Sigma^2}
  + \frac{T L(1,2,T)}{2\sigma^2}\Big),$$

each minimised over the paper's 20-point sigma mesh with the ln 20 union cost. The paper claims
the CoT bound grows linearly in T and the one-pass bound exponentially.

**Bound units** (``part="bounds"``, one per T). $G_u(1, 2)$ is measured on the construction
(:func:`jaxbounds.models.construction.construction` of $\chi_{\{0,1\}}$ at sequence length T, the
paper's 2 ln T logit scale): the largest $\|\nabla_\theta f(x)\|^2$ over every input of
$\{0,1\}^T$ (T <= ``exact_max_len``) or over ``num_inputs`` random inputs (a lower estimate of the
max; noted per row). The paper gives $G_u$ only for $(\omega, D_f) = (10, 2)$, so none for
(1, 2). $L(1,2,T)$ is Theorem 10's norm bound, P = 0 (the ``pac-bayes-perturbation`` experiment
measures |P| / G_u < 0.01 on these constructions), $\Sigma = 0.01$ as in E.3, and the bounds are
evaluated at every m of ``bound_num_examples``. The statistics fit the growth in T twice:
as the theorem is stated (G_u and L(1,2,T) measured at each T) and with G_u and L frozen at
their values at the smallest T (the paper's "held constant" reading).

**Training units** (``part="train"``): PARITY of T bits learned by the learnable twin
:class:`jaxbounds.models.construction.ConstructionTransformer` (no LayerNorm, one-hot
positions: the architecture the bounds are about, so the comparison is of the same model
class), quadratic loss, full-batch Adam (``jaxbounds.training.train``), at equal m
training strings drawn without replacement from $\{0,1\}^T$; the test set is every other
string of the cube (exact population quantities).

- ``mode="direct"``: the model reads $x \in \{0,1\}^T$ and is trained on PARITY(x) (degree T).
- ``mode="cot"``: the CoT sequence $z = (x_1..x_T, s_0 = 0, s_1..s_T)$ of
  :func:`jaxbounds.data.boolean.parity_cot_data` ($s_j = 1 \oplus x_j \oplus s_{j-1}$). Step j
  sees the window of the last T + 1 tokens, $(x_j..x_T, s_0..s_{j-1})$, and predicts $s_j$:
  a fixed 2-parity of window positions 0 and T (the paper's cyclic positional code of period
  T + 1), so the model has T + 1 bit positions and each training string gives T windows. At
  test time the chain runs autoregressively on the model's own rounded outputs, and the final
  answer is $s_T \oplus (T \bmod 2)$.

Both modes use an MLP of width 4(T + 1) (what the direct construction of PARITY needs), so the
two models have the same size up to one position.

**Scales.** ``cpu``: bounds at T = 2..64 (11 lengths, geometric; G_u exact over the cube up to
T = 12, then over 2048 random inputs), four m from 1e3 to E.3's 1e6; trained models at
T = 4, 6, 8 (m = 8, 32, 128 strings; 600 Adam epochs, by which every direct run in the
development runs had reached training loss < 0.02; CoT runs get there in < 100 epochs) with
3 seeds. The bound part costs about 100 CPU s (one gradient program compiled per T); each
trained unit 5-30 CPU s (the CoT unit at T = 8 trains on 1024 windows), which sizes the trained
grid to stay within ~15 CPU minutes. ``paper``: T up to 128 for the bounds, trained T up to 12,
4000 epochs, 10 seeds (the paper trains no model for this result).

References:
  arXiv 2605.20988, Section 3 and Appendix G (rebuilt, SPEC.md section 5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbounds.bounds import pac_bayes
from jaxbounds.data.boolean import FourierFunction, parity, parity_cot_data
from jaxbounds.experiments import runner
from jaxbounds.experiments._claims import claims_at_scale
from jaxbounds.experiments.pac_bayes_perturbation import forward, grad_sq
from jaxbounds.models import as_pure
from jaxbounds.models.construction import ConstructionTransformer, construction
from jaxbounds.training import train
from kernels.walsh import cube_points

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "TrainedUnit",
    "bound_row",
    "chain_predictions",
    "cot_windows",
    "growth_fits",
    "run_unit",
    "statistics",
    "train_unit",
    "trained_row",
]

NAME = "cot-parity"
PAPER = (
    "A Sharper Picture of Generalization in Transformers (PAC-Bayes, flat constructions), "
    "Section 3 and Appendix G (Theorem 16, chain of thought for PARITY)"
)

_BOUND_COMMON = {
    "subgaussian_scale": 0.01, "bound_num_examples": [10**3, 10**4, 10**5, 10**6],
    "exact_max_len": 12, "num_inputs": 2048,
}  # fmt: skip
_TRAIN_COMMON = {"learning_rate": 0.01, "train_fraction": 0.5}

#: Config grid per scale: bound lengths (``bound_seq_len``) and trained lengths
#: (``train_seq_len``, m = ``train_fraction`` * 2^T strings, the rest of the cube is the test).
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {
        **_BOUND_COMMON, "bound_seq_len": [2, 3, 4], "train_seq_len": [3],
        **_TRAIN_COMMON, "num_epochs": 30,
    },
    "cpu": {
        **_BOUND_COMMON, "bound_seq_len": [2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64],
        "train_seq_len": [4, 6, 8], **_TRAIN_COMMON, "num_epochs": 600,
    },
    "paper": {
        **_BOUND_COMMON, "bound_seq_len": [2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128],
        "train_seq_len": [4, 6, 8, 10, 12], **_TRAIN_COMMON, "num_epochs": 4000,
    },
}  # fmt: skip

CLAIMS = (
    "The chain-of-thought bound on the probability of a wrong PARITY answer grows only "
    "linearly in T",
    "The one-pass bound grows exponentially in T (its logarithm is linear in T)",
    "The one-pass bound grows exponentially faster than the chain-of-thought bound, so CoT "
    "gives a much better bound at every T",
    "Chain of thought improves generalization on PARITY: at equal m, the model trained with "
    "intermediate steps generalizes better than the one trained on the answer directly",
)

PAPER_NUMBERS = {
    "theorem_16": (
        "no numbers: P(CoT wrong) <= 4T exp(core_1) and P(one pass wrong) <= 4 exp(core_T), "
        "core_T >= T core_1; 'grows only linearly in T with CoT, exponentially without'"
    ),
    "G_u(1,2)": "not given (the paper reports G_u(10, 2) = 15524 only); measured here",
    "L(1,2,T)": "Theorem 10: 16 D^2 (D+1) + 8 (D+1) + 1 + omega + 4 omega (D+1) ln^2 T",
    "Sigma": "0.01 (the E.3 value; the CoT theorem states none)",
    "trained_models": "none (the paper's CoT result is a theorem only)",
}  # fmt: skip

#: R^2 of a straight-line fit above which a growth law is called linear.
_LINEAR_R2 = 0.99


# ------------------------------------------------------------------------------ units

_BOUND_KEYS = ("bound_seq_len", "subgaussian_scale", "bound_num_examples", "exact_max_len",
               "num_inputs")  # fmt: skip
_TRAIN_KEYS = ("train_seq_len", "learning_rate", "train_fraction", "num_epochs")


def _units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[runner.Unit]:
    """One bound unit per T (seed of the first seed only) and (T, mode) x seeds trained units."""
    empty = {"part": None, "mode": None, "seq_len": None}
    bkeys = {k: None for k in _BOUND_KEYS if k != "bound_seq_len"}
    tkeys = {k: None for k in _TRAIN_KEYS if k != "train_seq_len"}
    units = []
    for t in grid["bound_seq_len"]:
        config = {**empty, **bkeys, **tkeys, "part": "bounds", "seq_len": t}
        config.update({k: grid[k] for k in bkeys})
        units.append(runner.Unit(config, seeds[0]))
    for t in grid["train_seq_len"]:
        for mode in ("direct", "cot"):
            config = {**empty, **bkeys, **tkeys, "part": "train", "mode": mode, "seq_len": t}
            config.update({k: grid[k] for k in tkeys})
            units.extend(runner.Unit(config, seed) for seed in seeds)
    return units


def run_unit(unit: runner.Unit) -> dict[str, Any]:
    """A bound unit (:func:`bound_row`) or a trained unit (:func:`trained_row`)."""
    if unit.config["part"] == "bounds":
        return bound_row(unit.config, unit.seed)
    return trained_row(train_unit(unit.config, unit.seed))


# ------------------------------------------------------------------------------ bounds


def _step_function() -> FourierFunction:
    """One CoT step: the 2-parity indicator chi_{0,1} (omega = 1, D_f = 2), coefficient 1."""
    return FourierFunction(((0, 1),), jnp.asarray([1.0], jnp.float64))


def _bound_inputs(cfg: Mapping[str, Any], seed: int) -> jax.Array:
    t = cfg["seq_len"]
    if t <= cfg["exact_max_len"]:
        return cube_points(t)
    key = jax.random.fold_in(jax.random.key(seed), t)
    return jax.random.bernoulli(key, 0.5, (cfg["num_inputs"], t)).astype(jnp.int32)


def _bound_pair(T, G_u, L, cfg: Mapping[str, Any], m) -> tuple[Any, Any]:
    common = {"T": T, "G_u": G_u, "norm_sq": L, "subgaussian_scale": cfg["subgaussian_scale"],
              "num_examples": m}  # fmt: skip
    return pac_bayes.chain_of_thought_parity(**common), pac_bayes.one_pass_parity(**common)


def bound_row(cfg: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """G_u(1, 2) of the construction at length T and both PARITY bounds at every m (float64).

    ``*_log10`` are the bounds' unclipped base-10 logarithms (the probability is
    ``min(1, 10**log10)``); ``*_sigma`` the chosen mesh sigma.
    """
    t = cfg["seq_len"]
    with jax.enable_x64(True):
        params = as_pure(construction(_step_function(), seq_len=t))[1]
        bits = _bound_inputs(cfg, seed)
        norms_sq = np.asarray(grad_sq(params, bits))
        out = np.asarray(forward(params, bits))
        target = np.asarray(_step_function()(bits))
    G_u = float(norms_sq.max())
    L = float(pac_bayes.construction_norm_bound(1, 2, t))
    row: dict[str, Any] = {
        "G_u": G_u, "grad_sq_mean": float(norms_sq.mean()), "L": L,
        "num_inputs_used": int(bits.shape[0]), "exact_max": t <= cfg["exact_max_len"],
        "construction_max_error": float(np.max(np.abs(out - target))),
    }  # fmt: skip
    for name in ("cot", "one_pass"):
        row.update({f"{name}_log10": [], f"{name}_value": [], f"{name}_sigma": []})
    for m in cfg["bound_num_examples"]:
        for name, b in zip(("cot", "one_pass"), _bound_pair(t, G_u, L, cfg, m), strict=True):
            row[f"{name}_log10"].append(float(b.terms["log_value"]) / math.log(10.0))
            row[f"{name}_value"].append(float(b.value))
            row[f"{name}_sigma"].append(float(b.terms["sigma"]))
    return row


def growth_fits(T: Any, cot_log10: Any, one_log10: Any) -> dict[str, float]:
    r"""Least-squares growth fits of the two bounds over T (base-10 logs of the bounds).

    CoT: the slope of $\log P_{CoT}$ against $\log T$ (1 for linear growth) and the spread of
    $\log_{10} P_{CoT} - \log_{10}(4T)$ (0 for linear growth). One pass: the slope and $R^2$ of
    a straight line $\log_{10} P_{one} = a + bT$ (exponential growth), and the slope of
    $\log_{10} P_{one} - \log_{10} P_{CoT}$ against T.

    >>> T = np.array([2.0, 4.0, 8.0])
    >>> fits = growth_fits(T, np.log10(4 * T) - 5, np.log10(4.0) + 3 * T - 20)
    >>> [round(fits[k], 9) for k in ("cot_loglog_slope", "one_pass_r2", "one_pass_slope")]
    [1.0, 1.0, 3.0]
    """
    T, c, o = (np.asarray(a, dtype=np.float64) for a in (T, cot_log10, one_log10))
    core = c - np.log10(4.0 * T)
    cot_slope = np.polyfit(np.log10(T), c, 1)[0]
    slope, intercept = np.polyfit(T, o, 1)
    resid = o - (intercept + slope * T)
    total = np.sum((o - o.mean()) ** 2)
    r2 = 1.0 - np.sum(resid**2) / total if total > 0 else math.nan
    return {
        "cot_loglog_slope": float(cot_slope),
        "cot_core_range_log10": float(core.max() - core.min()),
        "one_pass_slope": float(slope),
        "one_pass_r2": float(r2),
        "one_pass_minus_cot_slope": float(np.polyfit(T, o - c, 1)[0]),
    }


# ------------------------------------------------------------------------------ training


def cot_windows(bits: jax.Array) -> dict[str, jax.Array]:
    r"""The T windows of the CoT sequence of each string and their step targets.

    With $z = (x_1..x_T, s_0 = 0, s_1..s_T)$ (:func:`parity_cot_data`), window j (1-based) is
    $z[j-1 : j+T] = (x_j..x_T, s_0..s_{j-1})$ and its target $s_j$: the even-parity indicator of
    window positions 0 and T.

    Returns:
      ``{"windows": (batch, T, T+1), "targets": (batch, T), "final_state_to_parity": T % 2}``.
    """
    data = parity_cot_data(bits)
    x, s = data["step_inputs"][..., 0], data["step_targets"]
    batch, t = x.shape
    z = jnp.concatenate([x, jnp.zeros((batch, 1), jnp.int32), s], axis=1)
    idx = jnp.arange(t)[:, None] + jnp.arange(t + 1)[None, :]
    return {"windows": z[:, idx], "targets": s, "final_state_to_parity": t % 2}


def chain_predictions(apply: Any, params: Any, bits: jax.Array) -> dict[str, jax.Array]:
    """Run the CoT autoregressively on the model's own rounded outputs.

    ``apply(params, windows (batch, T+1)) -> (batch,)``. Step j feeds the window of the last
    T + 1 tokens (inputs and the states produced so far, :func:`cot_windows`) and appends
    ``s_j = [output > 1/2]``.

    Returns:
      ``{"states": (batch, T) int32, "outputs": (batch, T) raw outputs, "parity": (batch,)}``.
    """
    bits = jnp.asarray(bits, jnp.int32)
    batch, t = bits.shape
    z = jnp.concatenate([bits, jnp.zeros((batch, t + 1), jnp.int32)], axis=1)
    outputs = []
    for j in range(t):
        out = apply(params, z[:, j : j + t + 1])
        outputs.append(out)
        z = z.at[:, t + 1 + j].set((out > 0.5).astype(jnp.int32))
    states = z[:, t + 1 :]
    return {"states": states, "outputs": jnp.stack(outputs, axis=1),
            "parity": (states[:, -1] + t) % 2}  # fmt: skip


class TrainedUnit:
    """A trained model of one unit and its data (for :func:`trained_row` and the tests).

    Attributes:
      config, seed: the unit.
      params: the trained parameter dict of :func:`~jaxbounds.experiments.pac_bayes_perturbation
        .forward` (float32).
      train_bits, test_bits: the training strings and every other string of the cube.
      losses: the full-batch training loss before every Adam step and after the last.
    """

    def __init__(self, config, seed, params, train_bits, test_bits, losses) -> None:
        self.config, self.seed, self.params = config, seed, params
        self.train_bits, self.test_bits, self.losses = train_bits, test_bits, losses


def _loss(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
    return jnp.mean((forward(params, batch["bits"]) - batch["labels"]) ** 2)


def _split(cfg: Mapping[str, Any], seed: int) -> tuple[jax.Array, jax.Array]:
    t = cfg["seq_len"]
    cube = cube_points(t)
    m = round(cfg["train_fraction"] * 2**t)
    perm = jax.random.permutation(jax.random.fold_in(jax.random.key(seed), t), 2**t)
    return cube[np.sort(np.asarray(perm[:m]))], cube[np.sort(np.asarray(perm[m:]))]


def _training_data(mode: str, bits: jax.Array) -> dict[str, jax.Array]:
    if mode == "direct":
        return {"bits": bits, "labels": parity(bits).astype(jnp.float32)}
    w = cot_windows(bits)
    t = bits.shape[1]
    return {"bits": w["windows"].reshape(-1, t + 1),
            "labels": w["targets"].reshape(-1).astype(jnp.float32)}  # fmt: skip


def train_unit(cfg: Mapping[str, Any], seed: int) -> TrainedUnit:
    """Train the direct or the CoT model of one unit (float32, full-batch Adam).

    :func:`jaxbounds.training.train` on the full batch, ``num_epochs`` steps, the training loss
    evaluated at every step.
    """
    t, mode = cfg["seq_len"], cfg["mode"]
    train_bits, test_bits = _split(cfg, seed)
    width = t if mode == "direct" else t + 1
    model = ConstructionTransformer(width, mlp_width=4 * (t + 1), dtype=jnp.float32,
                                    rngs=nnx.Rngs(params=seed))  # fmt: skip
    params = as_pure(model)[1]
    data = _training_data(mode, train_bits)
    result = train(
        _loss, params, data, optimizer=optax.adam,
        hyperparams={"learning_rate": cfg["learning_rate"]}, num_steps=cfg["num_epochs"],
    )  # fmt: skip
    losses = np.asarray(result.metrics["loss"])
    return TrainedUnit(dict(cfg), seed, result.params, train_bits, test_bits, losses)


def _metrics(trained: TrainedUnit, bits: jax.Array) -> dict[str, float]:
    """Quadratic loss and accuracy of the final answer on ``bits`` (+ CoT step losses)."""
    p = trained.params
    target = np.asarray(parity(bits))
    if trained.config["mode"] == "direct":
        out = np.asarray(forward(p, bits), dtype=np.float64)
        return {"loss": float(np.mean((out - target) ** 2)),
                "accuracy": float(np.mean((out > 0.5) == target))}  # fmt: skip
    w = cot_windows(bits)
    t = bits.shape[1]
    forced = np.asarray(forward(p, w["windows"].reshape(-1, t + 1)), dtype=np.float64)
    steps = np.asarray(w["targets"]).reshape(-1)
    chain = chain_predictions(forward, p, bits)
    return {
        "loss": float(np.mean((forced - steps) ** 2)),
        "step_accuracy": float(np.mean((forced > 0.5) == steps)),
        "accuracy": float(np.mean(np.asarray(chain["parity"]) == target)),
    }


def trained_row(trained: TrainedUnit) -> dict[str, Any]:
    """Train/test quadratic loss, their gap, and train/test accuracy of the final answer.

    For ``cot`` the losses are teacher-forced step losses (every window of every string) and the
    accuracy is of the autoregressive chain's final answer; ``error_gap`` is test minus train
    0-1 error of the final answer in both modes.
    """
    tr, te = _metrics(trained, trained.train_bits), _metrics(trained, trained.test_bits)
    losses = trained.losses
    row = {
        "num_train": int(trained.train_bits.shape[0]),
        "num_test": int(trained.test_bits.shape[0]),
        "num_step_examples": int(trained.train_bits.shape[0])
        * (trained.config["seq_len"] if trained.config["mode"] == "cot" else 1),
        "train_loss": tr["loss"], "test_loss": te["loss"], "gap": te["loss"] - tr["loss"],
        "train_accuracy": tr["accuracy"], "test_accuracy": te["accuracy"],
        "error_gap": tr["accuracy"] - te["accuracy"],
        "final_training_loss": float(losses[-1]),
        "epochs_to_loss_0.02": int(np.argmax(losses < 0.02)) if np.any(losses < 0.02) else -1,
    }  # fmt: skip
    if trained.config["mode"] == "cot":
        row["train_step_accuracy"] = tr["step_accuracy"]
        row["test_step_accuracy"] = te["step_accuracy"]
    return row


# ------------------------------------------------------------------------------ statistics


def _bound_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((r for r in rows if r["part"] == "bounds"), key=lambda r: r["seq_len"])


def _bound_statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per m: the bounds over T, the growth fits as stated and with G_u, L frozen at min T."""
    brows = _bound_rows(rows)
    if len(brows) < 2:
        return None
    cfg = brows[0]
    T = np.asarray([r["seq_len"] for r in brows], dtype=np.float64)
    G0, L0 = brows[0]["G_u"], brows[0]["L"]
    per_m = []
    for i, m in enumerate(cfg["bound_num_examples"]):
        cot = np.asarray([r["cot_log10"][i] for r in brows])
        one = np.asarray([r["one_pass_log10"][i] for r in brows])
        c_frozen, o_frozen = _bound_pair(T, G0, L0, cfg, m)
        cf = np.asarray(c_frozen.terms["log_value"]) / math.log(10.0)
        of = np.asarray(o_frozen.terms["log_value"]) / math.log(10.0)
        vac_one = [int(t) for t, v in zip(T, one, strict=True) if v >= 0]
        vac_cot = [int(t) for t, v in zip(T, cot, strict=True) if v >= 0]
        per_m.append({
            "num_examples": m, "cot_log10": cot.tolist(), "one_pass_log10": one.tolist(),
            "cot_log10_frozen": cf.tolist(), "one_pass_log10_frozen": of.tolist(),
            "fits": growth_fits(T, cot, one), "fits_frozen": growth_fits(T, cf, of),
            "min_one_minus_cot_log10": float(np.min(one - cot)),
            "first_vacuous_T_one_pass": min(vac_one) if vac_one else None,
            "first_vacuous_T_cot": min(vac_cot) if vac_cot else None,
        })  # fmt: skip
    return {
        "seq_len": T.astype(int).tolist(),
        "G_u": [r["G_u"] for r in brows],
        "G_u_exact_max": [bool(r["exact_max"]) for r in brows],
        "L": [r["L"] for r in brows],
        "construction_max_error": [r["construction_max_error"] for r in brows],
        "frozen_at_T": int(T[0]), "subgaussian_scale": cfg["subgaussian_scale"],
        "per_m": per_m,
    }  # fmt: skip


_TRAIN_STATS = ("gap", "error_gap", "train_loss", "test_loss", "train_accuracy",
                "test_accuracy", "final_training_loss")  # fmt: skip


def _train_statistics(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per T: mean ± std over seeds of each mode, and the seed-paired CoT minus direct gaps."""
    trows = [r for r in rows if r["part"] == "train"]
    out = []
    for (t,), group in runner.group_rows(trows, ["seq_len"], sort=True).items():
        entry: dict[str, Any] = {"seq_len": t}
        by_mode = {mode: {r["seed"]: r for r in group if r["mode"] == mode}
                   for mode in ("direct", "cot")}  # fmt: skip
        for mode, seeds in by_mode.items():
            entry[mode] = {k: runner.mean_spread(r[k] for r in seeds.values()).to_dict()
                           for k in _TRAIN_STATS}  # fmt: skip
            entry[mode]["num_train"] = next(iter(seeds.values()))["num_train"] if seeds else None
            entry[mode]["reached_0.02"] = sum(r["epochs_to_loss_0.02"] >= 0
                                              for r in seeds.values())  # fmt: skip
        common = sorted(set(by_mode["direct"]) & set(by_mode["cot"]))
        for k in ("gap", "error_gap", "test_accuracy"):
            diff = [by_mode["cot"][s][k] - by_mode["direct"][s][k] for s in common]
            entry[f"cot_minus_direct_{k}"] = runner.mean_spread(diff).to_dict()
        out.append(entry)
    return out


def statistics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Bounds over T with growth fits, and the trained gaps per T (``statistics.json``)."""
    return {"bounds": _bound_statistics(rows), "trained": _train_statistics(rows)}


# ------------------------------------------------------------------------------ report


def _fmt(value: Any, digits: int = 4) -> str:
    return runner.format_number(value, digits)


def _spread(s: Mapping[str, float], digits: int = 3) -> str:
    return runner.Spread(**s).format(digits)


def _below_zero(s: Mapping[str, float]) -> bool:
    """Mean + 2 standard errors < 0 (the mean alone when there is one seed)."""
    se = s["stderr"] if math.isfinite(s["stderr"]) else 0.0
    return s["mean"] + 2.0 * se < 0.0


def _claims(stats: Mapping[str, Any]) -> list[str]:
    b = stats["bounds"]
    if b is None:  # a partial run: the bound units have not finished
        lines = [
            runner.claim_line(c, None, "the bound units have not finished") for c in CLAIMS[:3]
        ]
    else:
        lines = _bound_claims(b)
    return [*lines, _training_claim(stats["trained"])]


def _bound_claims(b: Mapping[str, Any]) -> list[str]:
    """The claim lines of the bounds (claims 1-3) from the finished bound units."""
    pm = b["per_m"]
    slopes = [p["fits"]["cot_loglog_slope"] for p in pm]
    cores = [p["fits"]["cot_core_range_log10"] for p in pm]
    frozen = [p["fits_frozen"]["cot_loglog_slope"] for p in pm]
    linear = all(abs(s - 1.0) < 0.1 for s in slopes)
    ts = f"T = {b['seq_len'][0]}..{b['seq_len'][-1]}"
    lines = [runner.claim_line(CLAIMS[0], linear, (
        f"as stated, with G_u(1,2) measured at each T and L(1,2,T) of Theorem 10 "
        f"(ln^2 T from the 2 ln T logit scale), over {ts} the slope of log P_CoT against "
        f"log T is {', '.join(_fmt(s, 4) for s in slopes)} for m = "
        f"{', '.join(_fmt(p['num_examples']) for p in pm)} (1 for linear growth), and "
        f"log10 P_CoT - log10(4T) varies by {', '.join(_fmt(c, 3) for c in cores)} "
        f"decades (0 for linear growth); with G_u and L frozen at T = {b['frozen_at_T']} "
        f"(the paper's 'held constant' reading) the slope is "
        f"{', '.join(_fmt(s, 6) for s in frozen)}"
    ))]  # fmt: skip
    r2 = [p["fits"]["one_pass_r2"] for p in pm]
    r2f = [p["fits_frozen"]["one_pass_r2"] for p in pm]
    lines.append(runner.claim_line(CLAIMS[1], min(r2) >= _LINEAR_R2, (
        f"a straight line log10 P_one = a + b T over {ts} has R^2 = "
        f"{', '.join(_fmt(x, 5) for x in r2)} and slope b = "
        f"{', '.join(_fmt(p['fits']['one_pass_slope'], 4) for p in pm)} decades per bit "
        f"(as stated), R^2 = {', '.join(_fmt(x, 6) for x in r2f)} with G_u, L frozen; "
        f"R^2 >= {_LINEAR_R2} read as linear"
    )))  # fmt: skip
    gaps = [p["min_one_minus_cot_log10"] for p in pm]
    rel = [p["fits"]["one_pass_minus_cot_slope"] for p in pm]
    first = [p["first_vacuous_T_one_pass"] for p in pm]
    first_cot = [p["first_vacuous_T_cot"] for p in pm]
    lines.append(runner.claim_line(CLAIMS[2], min(gaps) > 0 and min(rel) > 0, (
        f"log10 P_one - log10 P_CoT is at least {', '.join(_fmt(g, 4) for g in gaps)} "
        f"over {ts} and grows by {', '.join(_fmt(x, 4) for x in rel)} decades per bit; "
        f"the first T where the one-pass bound is vacuous is {first}, for the CoT bound "
        f"{first_cot} (None: not on the grid) for m = "
        f"{[p['num_examples'] for p in pm]}"
    )))  # fmt: skip
    return lines


def _training_claim(trained: Any) -> str:
    """The claim line of the trained models (claim 4)."""
    if not trained:
        return runner.claim_line(CLAIMS[3], None, "no trained unit has finished")
    ok = all(
        _below_zero(e["cot_minus_direct_gap"])
        and _below_zero({k: -v for k, v in e["cot_minus_direct_test_accuracy"].items()})
        for e in trained
    )
    parts = [
        f"T = {e['seq_len']} (m = {e['direct']['num_train']}): test accuracy direct "
        f"{_spread(e['direct']['test_accuracy'])} vs CoT {_spread(e['cot']['test_accuracy'])}"
        f", loss gap direct {_spread(e['direct']['gap'])} vs CoT {_spread(e['cot']['gap'])}"
        f", paired CoT - direct gap {_spread(e['cot_minus_direct_gap'])}"
        for e in trained
    ]  # fmt: skip
    return runner.claim_line(CLAIMS[3], ok, "; ".join(parts) + " (mean ± std over "
                             "seeds; reproduced when the paired gap difference and "
                             "minus the accuracy difference are below 0 by 2 "
                             "standard errors at every T)")  # fmt: skip


def _bound_table(b: Mapping[str, Any]) -> str:
    header = ["T", "G_u(1,2)", "max over", "L(1,2,T)"]
    for p in b["per_m"]:
        header += [f"log10 P_CoT (m={_fmt(p['num_examples'])})", "log10 P_one"]
    table = []
    for i, t in enumerate(b["seq_len"]):
        cells = [t, b["G_u"][i], "cube" if b["G_u_exact_max"][i] else "sample", b["L"][i]]
        for p in b["per_m"]:
            cells += [p["cot_log10"][i], p["one_pass_log10"][i]]
        table.append(cells)
    return runner.markdown_table(header, table, align="r" * len(header), digits=5)


def _fit_table(b: Mapping[str, Any]) -> str:
    header = ["m", "inputs", "CoT slope of log P vs log T", "CoT core range (decades)",
              "one-pass slope (decades/bit)", "one-pass R^2", "one - CoT slope"]  # fmt: skip
    table = []
    for p in b["per_m"]:
        for label, f in (("as stated", p["fits"]), ("frozen", p["fits_frozen"])):
            table.append([p["num_examples"], label, f["cot_loglog_slope"],
                          f["cot_core_range_log10"], f["one_pass_slope"], f["one_pass_r2"],
                          f["one_pass_minus_cot_slope"]])  # fmt: skip
    return runner.markdown_table(header, table, align="rlrrrrr", digits=6)


def _train_table(trained: Sequence[Mapping[str, Any]]) -> str:
    header = ["T", "m (strings)", "mode", "train loss", "test loss", "loss gap",
              "train acc.", "test acc.", "0-1 error gap", "runs < 0.02"]  # fmt: skip
    table = []
    for e in trained:
        for mode in ("direct", "cot"):
            s = e[mode]
            table.append([e["seq_len"], s["num_train"], mode, _spread(s["train_loss"]),
                          _spread(s["test_loss"]), _spread(s["gap"]),
                          _spread(s["train_accuracy"]), _spread(s["test_accuracy"]),
                          _spread(s["error_gap"]),
                          f"{s['reached_0.02']}/{s['gap']['n']}"])  # fmt: skip
    return runner.markdown_table(header, table, align="rrl" + "r" * 7)


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict) -> str:
    g = meta["config_grid"]
    lines = [
        f"# {meta['experiment']}: {meta['paper']}", "", meta["description"], "",
        f"Scale `{meta['scale']}`, seeds {meta['seeds']}, {meta['num_finished']} of "
        f"{meta['num_units']} units. Bounds: T = {g['bound_seq_len']}, m = "
        f"{g['bound_num_examples']}, Sigma = {g['subgaussian_scale']} (E.3's value; the CoT "
        "theorem states none), P = 0, the 20-point sigma mesh 1e-2..1e-5 with the ln 20 union "
        "cost. G_u(1,2) is measured on the construction of one 2-parity at each T (the paper "
        "gives no value for (1, 2)): the max of ||grad f||^2 over the whole cube for T <= "
        f"{g['exact_max_len']}, over {g['num_inputs']} random inputs above (a lower "
        "estimate of the max). Trained models: T = "
        f"{g['train_seq_len']}, m = {g['train_fraction']} * 2^T training strings, the rest of "
        "the cube as the test set, ConstructionTransformer (no LayerNorm, MLP width 4(T+1)), "
        f"quadratic loss, full-batch Adam (lr {g['learning_rate']}, {g['num_epochs']} epochs).",
        "",
        "The bounds are astronomically small or large probabilities (Sigma = 0.01 makes "
        "m / (8 Sigma^2) huge), so we report their unclipped base-10 logarithms; a bound is "
        "vacuous where log10 >= 0.", "",
    ]  # fmt: skip
    b = stats["bounds"]
    if b is not None:
        lines += [
            "## Bounds over T (log10 of the unclipped probability bounds)", "",
            _bound_table(b), "",
            "## Growth fits", "",
            "As stated: G_u(1,2) and L(1,2,T) at each T. Frozen: both at T = "
            f"{b['frozen_at_T']} for every T.", "",
            _fit_table(b), "",
            "![bounds vs T](figure_bounds_vs_T.png)", "",
        ]  # fmt: skip
    if stats["trained"]:
        lines += [
            "## Trained models: direct PARITY vs chain of thought (mean ± std over seeds)", "",
            "Loss = quadratic loss (CoT: teacher-forced step loss over every window); "
            "accuracy = final PARITY answer (CoT: autoregressive chain on its own rounded "
            "outputs); 0-1 error gap = train minus test accuracy of the final answer.", "",
            _train_table(stats["trained"]), "",
            "![trained](figure_trained.png)", "",
        ]  # fmt: skip
    lines += ["## Claims", "", *claims_at_scale(_claims(stats), meta["scale"])]
    return "\n".join(lines).rstrip("\n") + "\n"


def _bounds_figure(b: Mapping[str, Any] | None):
    figure = runner.new_figure(figsize=(9.6, 3.6))
    if figure is None or b is None:
        return figure
    T = np.asarray(b["seq_len"])
    ax = figure.add_subplot(1, 2, 1)
    for p in b["per_m"]:
        (line,) = ax.plot(T, p["cot_log10"], "o-", ms=3, label=f"CoT, m={p['num_examples']:g}")
        ax.plot(T, p["one_pass_log10"], "s--", ms=3, color=line.get_color(),
                label=f"one pass, m={p['num_examples']:g}")  # fmt: skip
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(T, [str(int(t)) for t in T], fontsize=6)
    ax.tick_params(axis="x", which="minor", labelbottom=False)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("T")
    ax.set_ylabel("log10 bound on P(wrong)  (>= 0: vacuous)")
    ax.set_title("as stated (G_u, L(1,2,T) at each T)", fontsize=8)
    ax.legend(fontsize=5, ncol=2)
    ax = figure.add_subplot(1, 2, 2)
    p = b["per_m"][-1]
    for key, style, label in (("cot_log10", "o-", "CoT"), ("one_pass_log10", "s--", "one pass")):
        for suffix, alpha, what in (("", 1.0, "as stated"), ("_frozen", 0.5, "G_u, L frozen")):
            v = np.asarray(p[key + suffix])
            ax.plot(T, v - v[0], style, ms=3, alpha=alpha, label=f"{label}, {what}")
    ax.plot(T, np.log10(T / T[0]), "k:", lw=1, label="log10(T/T0): linear growth")
    ax.set_xscale("log")
    ax.set_xticks(T, [str(int(t)) for t in T], fontsize=6)
    ax.tick_params(axis="x", which="minor", labelbottom=False)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("T")
    ax.set_ylabel("log10 bound(T) - log10 bound(T0)")
    ax.set_title(f"growth from T0 = {T[0]}, m = {p['num_examples']:g}", fontsize=8)
    ax.legend(fontsize=6)
    return figure


def _trained_figure(trained: Sequence[Mapping[str, Any]]):
    figure = runner.new_figure(figsize=(9.6, 3.4))
    if figure is None or not trained:
        return figure
    T = np.asarray([e["seq_len"] for e in trained])
    for i, (key, label) in enumerate(
        (
            ("test_accuracy", "test accuracy (final answer)"),
            ("gap", "generalization gap (quadratic loss)"),
        )
    ):
        ax = figure.add_subplot(1, 2, i + 1)
        for j, mode in enumerate(("direct", "cot")):
            mean = [e[mode][key]["mean"] for e in trained]
            std = [np.nan_to_num(e[mode][key]["std"]) for e in trained]
            ax.errorbar(T + 0.08 * (2 * j - 1), mean, yerr=std, fmt="o-", capsize=3,
                        label=mode)  # fmt: skip
        ax.set_xlabel("T (m = half of the cube)")
        ax.set_ylabel(label)
        ax.set_title(f"{label}: mean ± std over seeds", fontsize=8)
        ax.legend(fontsize=7)
    return figure


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """The bounds and trained figures, ``statistics.json`` and ``report.md``."""
    stats = statistics(rows)
    figures = {
        "figure_bounds_vs_T.png": _bounds_figure(stats["bounds"]),
        "figure_trained.png": _trained_figure(stats["trained"]),
    }
    runner.write_rendered(out_dir, figures, stats, _report(rows, meta, stats))


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Chain-of-thought vs one-pass PARITY bounds over T (growth fits, G_u(1,2) measured on "
        "the construction) and trained ConstructionTransformers learning PARITY directly or "
        "with CoT steps at equal m: generalization gaps and test accuracy over seeds"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    units=_units,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 2, "cpu": 3, "paper": 10},
    default_scale="cpu",
)
