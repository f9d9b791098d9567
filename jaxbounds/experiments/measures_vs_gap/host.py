"""The host measures of ``measures-vs-gap``: norms and the papers' bounds, model by model."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbounds.bounds import spectral
from jaxbounds.bounds.from_model import scalar_bounds, shallow_bounds
from jaxbounds.experiments.measures_vs_gap.grid import SPARSE
from jaxbounds.experiments.measures_vs_gap.programs import _finite
from jaxbounds.models import (
    scalar_quantities,
    shallow_quantities,
)
from jaxbounds.models.shallow import PARAM_NAMES

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
