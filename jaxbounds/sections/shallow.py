"""The ``shallow`` model of ``jaxbounds estimate``: the GD-trained shallow Transformer and its NTK.

Builder (``--model shallow``): digits 0 vs 1 (scikit-learn's 8x8 digits by default, as 4 tokens
of 16 pixels so that the attention layer is not trivial; MNIST as 13 tokens of 64 pixels when the
environment variable ``JAXBOUNDS_MNIST_DIR`` names a folder with the IDX files; a small synthetic
two-class image set, announced loudly, when scikit-learn is missing), a
:class:`~jaxbounds.models.ShallowTransformer` with d_m = 512 >= N (quick) or 2048, and
full-batch GD with learning rate 0.1 on the logistic (cross-entropy) loss, as in the paper.

Section ``shallow``: data and sizes, train / test loss, distance from initialisation per matrix
(R_Q, R_K, R_V, R_O), eta = ||W^0||_F + R and xi = ||W^0||_2 + R, R_X, alpha = sigma_min(F_pre^0),
the smallest eigenvalue of the empirical NTK at initialisation and after training, and the
NTK-regime check (the model against its linearisation trained side by side).
"""

from __future__ import annotations

import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbounds.data.mnist import BinaryDigits, load_binary_digits, tokenize
from jaxbounds.estimate import EstimateContext, Row, register_model, register_section
from jaxbounds.experiments.ntk_regime import ntk_regime
from jaxbounds.gd import binary_cross_entropy, logistic_loss, train_gd
from jaxbounds.models.ntk import empirical_ntk, feature_alpha
from jaxbounds.models.shallow import (
    PARAM_NAMES,
    ShallowTransformer,
    shallow_apply,
    shallow_features,
)

__all__ = ["build_shallow", "shallow_context", "shallow_section", "synthetic_digits"]

_SECTION = "shallow"
_LR = 0.1


def synthetic_digits(*, num: int = 360, seed: int = 0, token_dim: int = 16) -> BinaryDigits:
    """A synthetic stand-in for digits 0 vs 1: 8x8 rings (label 0) and vertical bars (label 1).

    Each image is the class template, shifted by up to one pixel, times a random contrast in
    [0.6, 1], plus uniform noise in [0, 0.3], clipped to [0, 1]; 3/4 train, 1/4 test. Only used
    when scikit-learn is missing.
    """
    rng = np.random.default_rng(seed)
    ring = np.zeros((8, 8), np.float32)
    ring[1:7, 2] = ring[1:7, 5] = ring[1, 2:6] = ring[6, 2:6] = 1
    bar = np.zeros((8, 8), np.float32)
    bar[1:7, 3:5] = 1
    labels = rng.integers(0, 2, num).astype(np.int32)
    images = np.where(labels[:, None, None] == 0, ring, bar)
    shifts = rng.integers(-1, 2, (num, 2))
    images = np.stack(
        [np.roll(im, tuple(s), axis=(0, 1)) for im, s in zip(images, shifts, strict=True)]
    )
    contrast = rng.uniform(0.6, 1.0, (num, 1, 1)).astype(np.float32)
    images = np.clip(images * contrast + rng.uniform(0, 0.3, images.shape), 0, 1)
    inputs = tokenize(images.astype(np.float32), token_dim=token_dim)
    cut = (3 * num) // 4
    train = {"inputs": inputs[:cut], "labels": labels[:cut], "digits": labels[:cut]}
    test = {"inputs": inputs[cut:], "labels": labels[cut:], "digits": labels[cut:]}
    description = (
        "data: SYNTHETIC 8x8 rings vs bars (scikit-learn is not installed, so the embedded "
        "digits are unavailable; `pip install 'jaxbounds[digits]'` for real digits); "
        f"{cut} train, {num - cut} test, {inputs.shape[1]} tokens of dimension {token_dim}"
    )
    return BinaryDigits(train=train, test=test, source="synthetic", description=description)


def _load_data(seed: int, quick: bool) -> BinaryDigits:
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


def _accuracy(scores: jax.Array, labels: jax.Array) -> float:
    return float(jnp.mean((scores > 0) == (labels == 1)))


@register_model("shallow")
def build_shallow(key: jax.Array, *, quick: bool = True) -> EstimateContext:
    """Train the shallow Transformer by full-batch GD on the default digits data.

    Args:
      key: PRNG key (initialisation; the data split uses a seed derived from it).
      quick: d_m = 512 and 300 GD steps (seconds on 2 CPU cores); else d_m = 2048, 2000 steps.

    Returns:
      The context; ``extra["shallow"]`` holds what the bound calculators need: ``params0``,
      ``init`` and ``radii`` (keyed ``Q, K, V, O``), ``features0`` (F_pre^0 on the training
      inputs), ``Phi0`` = 1/2 ||f(theta^0) - s||^2 with targets s = 2y - 1 in {-1, +1}, ``N``,
      ``d_s``, ``d``, ``d_m``, ``R_X``, ``learning_rate`` and the data description; the GD
      record is ``ctx.history``.
    """
    k_data, k_model = jax.random.split(key)
    data = _load_data(int(jax.random.randint(k_data, (), 0, 2**30)), quick)
    return shallow_context(
        data, k_model, d_m=512 if quick else 2048, num_steps=300 if quick else 2000, quick=quick
    )


def shallow_context(
    data: BinaryDigits, key: jax.Array, *, d_m: int, num_steps: int, quick: bool = True
) -> EstimateContext:
    """Train a :class:`ShallowTransformer` of width ``d_m`` on ``data`` and fill the context.

    Full-batch GD, learning rate 0.1, logistic loss; the test loss is recorded every step.
    Parameters and inputs are float64 when x64 is enabled, else float32.
    """
    k_init, k_sections = jax.random.split(key)
    dtype = jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32
    x_train = jnp.asarray(data.train["inputs"], dtype)
    y_train = jnp.asarray(data.train["labels"])
    x_test = jnp.asarray(data.test["inputs"], dtype)
    y_test = jnp.asarray(data.test["labels"])
    num, d_s, d = x_train.shape

    model = ShallowTransformer(d, d_m, rngs=nnx.Rngs(params=k_init), dtype=dtype)
    params0 = model.params_dict()
    loss_fn = logistic_loss(shallow_apply, x_train, y_train)
    params, history = train_gd(  # data as arguments of the compiled steps, not constants
        lambda p, x, y, xt, yt: binary_cross_entropy(shallow_apply(p, x), y),
        params0,
        learning_rate=_LR,
        num_steps=num_steps,
        args=(x_train, y_train, x_test, y_test),
        metrics_fn=lambda p, x, y, xt, yt: {
            "test_loss": binary_cross_entropy(shallow_apply(p, xt), yt)
        },
        label="[jaxbounds] shallow GD",
    )
    for name in PARAM_NAMES:
        getattr(model, name)[...] = params[name]
    r_x = float(jnp.max(jnp.linalg.norm(x_train.reshape(num, -1), axis=1)) / math.sqrt(d_s))
    f0 = shallow_apply(params0, x_train)
    signs = 2 * y_train.astype(dtype) - 1
    shallow = {
        "params0": params0,
        # keyed Q, K, V, O as jaxbounds.bounds.shallow_gd.norms_from_weights expects
        "init": {name[-1]: params0[name] for name in PARAM_NAMES},
        "radii": {name[-1]: history.radius[name] for name in PARAM_NAMES},
        "Phi0": float(0.5 * jnp.sum((f0 - signs) ** 2)),
        "features0": shallow_features(params0, x_train),
        "data": data.description,
        "source": data.source,
        "N": num,
        "d_s": d_s,
        "d": d,
        "d_m": d_m,
        "learning_rate": _LR,
        "R_X": r_x,
    }
    return EstimateContext(
        name="shallow",
        model=model,
        apply_fn=shallow_apply,
        params=params,
        loss_fn=loss_fn,
        train={"inputs": x_train, "labels": y_train},
        test={"inputs": x_test, "labels": y_test},
        history=history,
        key=k_sections,
        quick=quick,
        extra={
            "shallow": shallow,
            "meta": {"data": data.description, "d_m": d_m, "gd_steps": num_steps},
        },
    )


@register_section(_SECTION, models=("shallow",))
def shallow_section(ctx: EstimateContext) -> list[Row]:
    """Distance from init per matrix, alpha, NTK smallest eigenvalue, losses, NTK-regime check."""
    info = ctx.extra["shallow"]
    hist = ctx.history
    x_train, y_train = ctx.train["inputs"], ctx.train["labels"]
    if ctx.test is None:
        raise ValueError("ctx.test: the shallow section needs held-out data")
    x_test, y_test = ctx.test["inputs"], ctx.test["labels"]
    params0, params = info["params0"], ctx.params
    rows = [
        Row(_SECTION, "data", info["data"]),
        Row(_SECTION, "N (train examples)", float(info["N"])),
        Row(_SECTION, "d_s (tokens)", float(info["d_s"])),
        Row(_SECTION, "d (token dimension)", float(info["d"])),
        Row(_SECTION, "d_m (model dimension)", float(info["d_m"])),
        Row(
            _SECTION, "GD steps", float(hist.num_steps), note=f"learning rate {hist.learning_rate}"
        ),
        Row(_SECTION, "train loss", float(hist.loss[-1]), note="cross-entropy, final step"),
        Row(_SECTION, "test loss", float(hist.metrics["test_loss"][-1]), note="final step"),
        Row(
            _SECTION,
            "lowest test loss",
            float(np.min(hist.metrics["test_loss"])),
            note=f"at step {int(np.argmin(hist.metrics['test_loss']))}",
        ),
        Row(_SECTION, "train accuracy", _accuracy(ctx.apply_fn(params, x_train), y_train)),
        Row(_SECTION, "test accuracy", _accuracy(ctx.apply_fn(params, x_test), y_test)),
    ]
    inputs = hist.bound_inputs()
    for name in PARAM_NAMES:
        tag = name[-1]
        rows.append(
            Row(
                _SECTION,
                f"R_{tag}",
                inputs["R"][name],
                note=f"max_t ||{name}^t - {name}^0||_F over training",
            )
        )
    rows.append(Row(_SECTION, "R", hist.total_radius, note="sqrt(R_Q^2+R_K^2+R_V^2+R_O^2)"))
    for name in PARAM_NAMES:
        tag = name[-1]
        rows.append(Row(_SECTION, f"eta_{tag}", inputs["eta"][name], note="||W^0||_F + R"))
        rows.append(Row(_SECTION, f"xi_{tag}", inputs["xi"][name], note="||W^0||_2 + R"))
    rows.append(Row(_SECTION, "R_X", info["R_X"], note="max_n ||X_n||_F / sqrt(d_s)"))
    num, d_m = info["N"], info["d_m"]
    tile = 64
    # alpha and the NTK spectrum in float64 whatever the training dtype: lambda_min is ~1e-7 of
    # lambda_max here, below float32 rounding of the Gram matrix.
    with jax.enable_x64(True):
        x64 = jnp.asarray(x_train, jnp.float64)
        p0_64, p_64 = (
            jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), t)
            for t in (params0, params)
        )
        alpha = float(feature_alpha(shallow_features(p0_64, x64)))
        ntk = jax.jit(lambda p, x: empirical_ntk(shallow_apply, p, x, tile_size=tile))
        spectra = {
            label: np.linalg.eigvalsh(np.asarray(ntk(p, x64)))
            for label, p in (("at init", p0_64), ("after training", p_64))
        }
    rows.append(
        Row(
            _SECTION,
            "alpha = sigma_min(F_pre^0)",
            alpha,
            note="N-th singular value of the (N, d_m) init features, float64"
            + ("" if d_m >= num else "; 0 because N > d_m"),
        )
    )
    for label, eigs in spectra.items():
        rows.append(
            Row(
                _SECTION,
                f"NTK lambda_min {label}",
                float(eigs[0]),
                note=f"empirical NTK on the N train inputs, float64, tiles of {tile}; "
                f"lambda_max {float(eigs[-1]):.4g}",
            )
        )
    steps = min(hist.num_steps, 100)
    result = ntk_regime(
        ctx.apply_fn,
        params0,
        ctx.train,
        ctx.test,
        learning_rate=hist.learning_rate,
        num_steps=steps,
        progress=True,
    )
    summary = result.summary()
    note = f"model vs its linearisation at init, both trained {steps} GD steps"
    rows += [
        Row(_SECTION, "relative weight movement", summary["relative_movement"], note=note),
        Row(_SECTION, "linearised model train loss", summary["loss_linear"], note=note),
        Row(_SECTION, "prediction drift (train, max)", summary["drift_train"], note=note),
        Row(_SECTION, "prediction drift (test, max)", float(summary["drift_test"]), note=note),
        Row(
            _SECTION,
            "relative prediction drift (train)",
            summary["relative_drift_train"],
            note="||f - f_lin|| / ||f - f_0||; near 0 in the NTK regime",
        ),
    ]
    return rows
