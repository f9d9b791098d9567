"""The grid of ``measures-vs-gap``: its scales, claims and the design (units, batches)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from jaxbounds.experiments import runner

NAME = "measures-vs-gap"
PAPER = (
    "Jiang et al. 2020 (arXiv:1912.02178); Dziugaite et al. 2020 (arXiv:2010.11924); "
    "Andriushchenko et al. 2023 (arXiv:2302.07011)"
)
SPARSE = "sparse-majority"
MNIST = "mnist01"
FAMILIES = (SPARSE, MNIST)

#: Axis columns of every unit (None where a family has no such axis), in results.csv order.
AXIS_KEYS = (
    "width", "num_train", "seq_len", "batch_size", "learning_rate", "max_steps", "weight_decay",
)  # fmt: skip
#: Settings of a family that are not axes (None for the other family).
FAMILY_KEYS = (
    "num_heads", "sparsity", "token_dim", "train_pool", "num_test", "optimizer",
    "loss_threshold", "eval_every", "measure_examples", "test_fraction",
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
                          "measure_examples": None},
            },
            MNIST: {
                "axes": {"learning_rate": [1.0], "max_steps": [20, 40], "width": [8],
                         "num_train": [24]},
                "crossed": ["learning_rate", "max_steps"],
                "fixed": {"token_dim": 112, "train_pool": 800, "num_test": 200,
                          "optimizer": "sgd", "loss_threshold": 0.05, "eval_every": 10,
                          "measure_examples": None, "test_fraction": 0.2},
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
                         "seq_len": [10, 20, 40], "max_steps": [4000],
                         "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["learning_rate"],
                "fixed": {"num_heads": 4, "sparsity": 5, "train_pool": 512, "num_test": 2000,
                          "optimizer": "adam", "loss_threshold": 0.05, "eval_every": 25,
                          "measure_examples": None},
            },
            MNIST: {
                "axes": {"learning_rate": [0.3, 1.0, 3.0], "max_steps": [100, 300, 1000],
                         "width": [16, 32, 64], "num_train": [100, 200, 400],
                         "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["learning_rate", "max_steps"],
                "fixed": {"token_dim": 64, "train_pool": 400, "num_test": 600,
                          "optimizer": "sgd", "loss_threshold": 0.05, "eval_every": 25,
                          "measure_examples": None, "test_fraction": 0.6},
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
                         "seq_len": [20, 50, 100], "max_steps": [20000],
                         "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["learning_rate", "batch_size", "width", "num_train", "seq_len"],
                "fixed": {"num_heads": 4, "sparsity": 9, "train_pool": 1024, "num_test": 2000,
                          "optimizer": "adam", "loss_threshold": 0.01, "eval_every": 50,
                          "measure_examples": None},
            },
            MNIST: {
                "axes": {"learning_rate": [0.3, 1.0, 3.0], "max_steps": [300, 1000, 3000],
                         "width": [64, 256, 1024], "num_train": [100, 200, 400],
                         "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["learning_rate", "max_steps", "width", "num_train"],
                "fixed": {"token_dim": 64, "train_pool": 400, "num_test": 600,
                          "optimizer": "sgd", "loss_threshold": 0.01, "eval_every": 50,
                          "measure_examples": None, "test_fraction": 0.6},
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
#: Draws of each null baseline (a random measure; the gap plus noise at its standard error).
NULL_DRAWS = 100


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
    least = fixed["measure_examples"] or 1
    if min(axes["num_train"]) < least or max(axes["num_train"]) > fixed["train_pool"]:
        raise ValueError(f"families[{family!r}]: need measure_examples <= num_train <= train_pool")


#: The measure set of a unit without ``measure_examples``: the training set, at most this many.
MEASURE_MAX = 1024


def measure_size(cfg: Mapping[str, Any]) -> int:
    """The measure set's size: ``measure_examples``, else the training set up to 1024 examples.

    SPEC section 8 (after Andriushchenko et al. 2023): at least 1024 points, or the whole
    training set when it is smaller.

    >>> measure_size({"measure_examples": None, "num_train": 200}), measure_size(
    ...     {"measure_examples": 64, "num_train": 200})
    (200, 64)
    """
    given = cfg["measure_examples"]
    return int(given) if given else min(int(cfg["num_train"]), MEASURE_MAX)


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
        sizes = ([spec["fixed"]["measure_examples"]] if spec["fixed"]["measure_examples"]
                 else [min(n, MEASURE_MAX) for n in spec["axes"]["num_train"]])  # fmt: skip
        if any(size % common["worst_batches"] for size in sizes):
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
    ['learning_rate', 'max_steps', 'width', 'num_train', 'weight_decay']
    """
    spec = grid["families"].get(family)
    return [] if spec is None else [a for a, v in spec["axes"].items() if len(v) > 1]


def _batch_key(unit: runner.Unit) -> str:
    """Units of one shape share a batch: equal configuration up to the vmapped hyperparameters.

    The learning rate, the weight decay and the step budget differ from run to run inside one
    :func:`~jaxbounds.training.train` call.
    """
    skip = ("learning_rate", "max_steps", "weight_decay")
    return runner.canonical_json({k: v for k, v in unit.config.items() if k not in skip})
