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
#: ``learning_rate`` is not an axis of a grid: each unit's rate is its optimizer's base rate
#: times ``lr_scale`` (:func:`learning_rate`), so the learning-rate axis (``lr_scale``) has the
#: same levels for every optimizer and stays crossed with the optimizer axis.
AXIS_KEYS = (
    "width", "num_train", "seq_len", "batch_size", "optimizer", "lr_scale", "learning_rate",
    "max_steps", "weight_decay",
)  # fmt: skip
#: Settings of a family that are not axes (None for the other family).
FAMILY_KEYS = (
    "num_heads", "sparsity", "token_dim", "train_pool", "num_test", "loss_threshold",
    "eval_every", "measure_examples", "test_fraction",
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

#: Each family's base learning rate per optimizer (``learning_rate = base * lr_scale``): Adam's
#: and SGD's rates differ by orders of magnitude, so the ``lr_scale`` levels are relative. On
#: sparse majority plain SGD did not reach the loss threshold within the cpu scale's 4,000 steps
#: (d = 12, N = 256, T = 20, batch 64: training loss 0.47 at rate 3, stuck at log 2 from rate
#: 10), SGD with momentum 0.9 did at rates 0.012 to 0.048 (not at 0.072), hence momentum there.
_SPARSE_BASE_LR = {"adam": 5e-3, "momentum": 0.02}
_MNIST_BASE_LR = {"sgd": 1.0, "adam": 1e-2}

#: Config grid per scale: the families' axes and designs, and the measures' settings.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {
        "families": {
            SPARSE: {
                "axes": {"optimizer": ["adam"], "lr_scale": [0.3, 1.0], "width": [8],
                         "num_train": [48], "seq_len": [6], "batch_size": [16],
                         "max_steps": [150]},
                "crossed": ["optimizer", "lr_scale"],
                "base_learning_rate": {"adam": 1e-2, "sgd": 1.0},
                "fixed": {"num_heads": 2, "sparsity": 3, "train_pool": 48, "num_test": 64,
                          "loss_threshold": 0.1, "eval_every": 10, "measure_examples": None},
            },
            MNIST: {
                "axes": {"optimizer": ["sgd"], "lr_scale": [1.0], "max_steps": [20, 40],
                         "width": [8], "num_train": [24]},
                "crossed": ["optimizer", "lr_scale", "max_steps"],
                "base_learning_rate": {"sgd": 1.0, "adam": 1e-2},
                "fixed": {"token_dim": 112, "train_pool": 800, "num_test": 200,
                          "loss_threshold": 0.05, "eval_every": 10, "measure_examples": None,
                          "test_fraction": 0.2},
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
                "axes": {"lr_scale": [0.4, 1.0, 2.4], "optimizer": ["momentum", "adam"],
                         "batch_size": [32, 64, 128], "width": [8, 12, 16],
                         "num_train": [128, 256, 512], "seq_len": [10, 20, 40],
                         "max_steps": [4000], "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["lr_scale"],
                "base_learning_rate": _SPARSE_BASE_LR,
                "fixed": {"num_heads": 4, "sparsity": 5, "train_pool": 512, "num_test": 2000,
                          "loss_threshold": 0.05, "eval_every": 25, "measure_examples": None},
            },
            MNIST: {
                "axes": {"lr_scale": [0.3, 1.0, 3.0], "optimizer": ["adam", "sgd"],
                         "max_steps": [100, 300, 1000], "width": [16, 32, 64],
                         "num_train": [100, 200, 400], "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["lr_scale", "max_steps"],
                "base_learning_rate": _MNIST_BASE_LR,
                "fixed": {"token_dim": 64, "train_pool": 400, "num_test": 600,
                          "loss_threshold": 0.05, "eval_every": 25, "measure_examples": None,
                          "test_fraction": 0.6},
            },
        },
        **_MEASURE_COMMON,
        "lanes": 4, "measure_lanes": 4,
    },
    "paper": {
        "families": {
            SPARSE: {
                "axes": {"lr_scale": [0.3, 1.0, 3.0], "optimizer": ["momentum", "adam"],
                         "batch_size": [32, 64, 128], "width": [16, 32, 64],
                         "num_train": [256, 512, 1024], "seq_len": [20, 50, 100],
                         "max_steps": [20000], "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["lr_scale", "optimizer", "batch_size", "width", "num_train",
                            "seq_len", "weight_decay"],
                "base_learning_rate": {"adam": 3e-3, "momentum": _SPARSE_BASE_LR["momentum"]},
                "fixed": {"num_heads": 4, "sparsity": 9, "train_pool": 1024, "num_test": 2000,
                          "loss_threshold": 0.01, "eval_every": 50, "measure_examples": None},
            },
            MNIST: {
                "axes": {"lr_scale": [0.3, 1.0, 3.0], "optimizer": ["adam", "sgd"],
                         "max_steps": [300, 1000, 3000], "width": [64, 256, 1024],
                         "num_train": [100, 200, 400], "weight_decay": [0.0, 1e-4, 1e-3]},
                "crossed": ["lr_scale", "optimizer", "max_steps", "width", "num_train",
                            "weight_decay"],
                "base_learning_rate": _MNIST_BASE_LR,
                "fixed": {"token_dim": 64, "train_pool": 400, "num_test": 600,
                          "loss_threshold": 0.01, "eval_every": 50, "measure_examples": None,
                          "test_fraction": 0.6},
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
    "Jiang et al. 2020: the magnitude-aware PAC-Bayes measure is among the best",
    "Jiang et al. 2020: norm products correlate negatively with the gap",
    "Andriushchenko et al. 2023: adaptive sharpness does not correlate well with generalization",
    "Andriushchenko et al. 2023: adaptive sharpness correlates rather with the learning rate",
    "Dziugaite et al. 2020: every measure fails in some environment",
)

#: Each claim's source: the anchor's own sentence where the project holds the text it is in,
#: else None (the claim is then our paraphrase of the paper's results, and the report says so).
_ANDRIUSHCHENKO = (
    'Andriushchenko et al. 2023, abstract: "Overall, we observe that sharpness does not '
    "correlate well with generalization but rather with some training parameters like the "
    "learning rate that can be positively or negatively correlated with generalization "
    'depending on the setup." (the sharpness of that sentence is adaptive sharpness: the '
    'abstract announces "a detailed study of various definitions of adaptive sharpness")'
)
CLAIM_SOURCES = (None, None, None, _ANDRIUSHCHENKO, _ANDRIUSHCHENKO, None)

#: The anchors' published numbers: ``checked`` ones (read in the paper, with where) are quoted
#: by the report; ``not_checked`` ones are kept only to say what was not verified.
PAPER_NUMBERS = {
    "jiang2020": {
        "paper": "Jiang et al. 2020, Fantastic generalization measures and where to find them, "
        "arXiv:1912.02178 (v1)",
        "checked": [
            {
                "statement": "more than 40 complexity measures, over 10,000 convolutional "
                "networks trained by varying common hyperparameters",
                "where": "abstract, page 1",
            },
        ],
        "not_checked": [
            "7 hyperparameters at 3 values, CIFAR-10 and SVHN, trained to cross-entropy 0.01",
            "Psi of pacbayes.mag.flatness 0.143 and sharpness.mag.flatness 0.138 on CIFAR-10",
            "log.prod.of.spec tau -0.251",
        ],
    },
    "andriushchenko2023": {
        "paper": "Andriushchenko et al. 2023, A modern look at the relationship between "
        "sharpness and generalization, arXiv:2302.07011 (ICML 2023, PMLR 202, "
        "pp. 840-902)",
        "checked": [
            {
                "statement": '"Overall, we observe that sharpness does not correlate well with '
                "generalization but rather with some training parameters like the learning "
                "rate that can be positively or negatively correlated with generalization "
                'depending on the setup" (no number)',
                "where": "abstract (arXiv:2302.07011)",
            },
        ],
        "not_checked": [
            "ViTs and BERT fine-tuned on many settings: rank correlation of adaptive "
            "worst-case sharpness with test error weak or negative",
        ],
    },
    "dziugaite2020": {
        "paper": "Dziugaite et al. 2020, In search of robust measures of generalization, "
        "arXiv:2010.11924 (NeurIPS 2020)",
        "checked": [],
        "not_checked": [
            "2,000+ CNNs",
            "every measure has a robust sign error near or above 0.5 in its worst environment",
        ],
    },
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


def learning_rate(spec: Mapping[str, Any], optimizer: str, lr_scale: float) -> float:
    """A unit's learning rate: its optimizer's base rate in ``spec`` times ``lr_scale``.

    Rounded to 12 significant digits, so a rate reads the same in every configuration.

    >>> learning_rate({"base_learning_rate": {"adam": 5e-3, "sgd": 1.0}}, "adam", 0.4)
    0.002
    """
    return float(f"{spec['base_learning_rate'][optimizer] * lr_scale:.12g}")


def _check_family(family: str, spec: Mapping[str, Any]) -> None:
    if family not in FAMILIES:
        raise ValueError(f"families: expected names in {FAMILIES}, got {family!r}")
    axes = spec["axes"]
    unknown = sorted(set(axes) - set(AXIS_KEYS)) + sorted(set(spec["fixed"]) - set(FAMILY_KEYS))
    if unknown:
        raise ValueError(f"families[{family!r}]: unknown settings {unknown}")
    if "learning_rate" in axes or not {"optimizer", "lr_scale"} <= set(axes):
        raise ValueError(f"families[{family!r}]: give the axes optimizer and lr_scale (the "
                         "learning rate is base_learning_rate[optimizer] * lr_scale)")  # fmt: skip
    base = spec.get("base_learning_rate")
    missing = sorted(set(axes["optimizer"]) - set(base or {}))
    if missing or any(not (isinstance(v, int | float) and v > 0) for v in (base or {}).values()):
        raise ValueError(f"families[{family!r}].base_learning_rate: expected a rate > 0 for "
                         f"every optimizer, missing {missing}")  # fmt: skip
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
            point["learning_rate"] = learning_rate(spec, point["optimizer"], point["lr_scale"])
            config |= {k: point.get(k) for k in AXIS_KEYS}
            config |= {k: spec["fixed"].get(k) for k in FAMILY_KEYS}
            config |= common
            units.extend(runner.Unit(config, seed) for seed in seeds)
    return units


def family_axes(grid: Mapping[str, Any], family: str) -> list[str]:
    """The axes of ``family`` that take several values at this scale (the statistics' axes).

    >>> family_axes(SCALES["cpu"], "mnist01")
    ['lr_scale', 'optimizer', 'max_steps', 'width', 'num_train', 'weight_decay']
    """
    spec = grid["families"].get(family)
    return [] if spec is None else [a for a, v in spec["axes"].items() if len(v) > 1]


def _batch_key(unit: runner.Unit) -> str:
    """Units of one shape share a batch: equal configuration up to the vmapped hyperparameters.

    The learning rate, the weight decay and the step budget differ from run to run inside one
    :func:`~jaxbounds.training.train` call; the optimizer does not (one batch per optimizer).
    """
    skip = ("learning_rate", "lr_scale", "max_steps", "weight_decay")
    return runner.canonical_json({k: v for k, v in unit.config.items() if k not in skip})
