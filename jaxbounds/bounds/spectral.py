r"""Sakai & Imaizumi 2026: spectrum-adaptive complexity proxy, and the norm-based proxy beside it.

Per layer l and matrix a in {W_QK per head, V~ = W_V W_O per head, M_in, M_out}, with $C_2$ the
spectral norm and $\|W\|_{S_p}^p = \sum_i s_i(W)^p$ (the rank at p = 0):
$$\alpha^{(l)} = \prod_{k>l}L_\phi C_2(M_{in}^k)C_2(M_{out}^k)
  \sum_h C_2(\tilde V^{k,h})(1 + 4C_2(QK^{k,h})),$$
$\gamma$: QK -> $2C_2(\tilde V)C_2(M_{out})C_2(M_{in})$; $\tilde V$ -> $C_2(M_{out})C_2(M_{in})$;
$M_{in}$ -> $C_2(M_{out})$; $M_{out}$ -> 1, and
$$B = \sum_{l,a}\min_{p\in\{0,1/M,\dots,2\}}(\|W\|_{S_p}^p)^{1/(p+2)}(\gamma\alpha L)^{p/(p+2)}
  N^{(p+1)/(p+2)}
  + \sqrt L,\quad M = \lceil L + \log N\rceil.$$
The index p is chosen after training, per matrix. The norm-based proxy (Edelman et al. style) is
$(1 + \sum_l \alpha_l^{2/3}\xi_l)^{3/2}$ with
$\xi_l = \sum_h[(C_2(M_{out})C_2(M_{in})C_2(\tilde V)\|QK\|_{2,1})^{2/3}
+ (C_2(M_{out})C_2(M_{in})\|\tilde V\|_{2,1})^{2/3}]
+ (C_2(M_{out})\|M_{in}\|_{2,1})^{2/3} + \|M_{out}\|_{2,1}^{2/3}$.

Only the abstract of the paper is available; the form follows the authors' code (file
``src/bert_spectrum/bounds.py`` of ``manasakai/spectrum-adaptive-transformers``), where N is
the value passed as ``num_examples`` (their scripts pass the hidden size). The sample-size factor
of the full theorem is unknown: both numbers are complexity proxies, not bounds (never
vacuous). Float64 numpy (norms by :mod:`kernels.norms` in a float64 scope); matrices must be
finite 2-D arrays.

References:
  Sakai & Imaizumi 2026, spectrum-adaptive generalization bounds for Transformers (abstract).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxbounds.bounds._result import Bound, Inputs, in_float64, int_option
from kernels.norms import group_norm, spectral_norm

__all__ = ["Layer", "norm_based_proxy", "p_grid", "schatten_power", "spectrum_adaptive_proxy"]

Layer = dict[str, Any]
"""One layer: ``{"qk": [W_QK per head], "v": [W_V W_O per head], "m_in": M_in, "m_out": M_out}``.

``m_in`` / ``m_out`` may be missing or None for attention-only layers: they then contribute
no term, their spectral norms count as 1 and L_phi is not applied."""


def p_grid(num_layers: int, num_examples: float, grid_m: int | None = None) -> np.ndarray:
    """The post-hoc grid {0, 1/M, ..., 2} with M = ceil(L + log N) (or ``grid_m``), float64.

    >>> p_grid(1, 1.0, grid_m=2)
    array([0. , 0.5, 1. , 1.5, 2. ])
    """
    if grid_m is None:
        layers = int_option("num_layers", num_layers)
        n = float(Inputs(True).positive("num_examples", num_examples))
        m = math.ceil(layers + math.log(max(n, 2.0)))
    else:
        m = int_option("grid_m", grid_m)
    m = max(int(m), 1)
    return np.arange(0, 2 * m + 1, dtype=np.float64) / m


def schatten_power(s: Any, p: Any, rank_tol: float = 1e-10) -> np.ndarray:
    r"""$\|W\|_{S_p}^p = \sum_i s_i^p$ from singular values ``s`` (last axis), float64.

    At p = 0 it is the rank (number of s > rank_tol * max s).

    >>> float(schatten_power([3.0, 4.0, 0.0], 2.0))
    25.0
    >>> float(schatten_power([3.0, 4.0, 0.0], 0.0))
    2.0
    """
    ins = Inputs(True)
    s, p = ins.nonneg("s", s), ins.nonneg("p", p)
    rank_tol = ins.nonneg("rank_tol", rank_tol)
    nz = s > rank_tol * np.max(s)
    safe = np.where(nz, s, 1.0)
    return np.sum(np.where(nz, safe**p, 0.0), axis=-1)


def _matrix(W: Any, where: str) -> np.ndarray:
    a = Inputs(True).real(where, W)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"{where}: expected a non-empty 2-D matrix, got shape {a.shape}")
    return a


def _c2(W: np.ndarray) -> np.float64:
    return in_float64(spectral_norm, W)


def _n21(W: np.ndarray) -> np.float64:
    return in_float64(group_norm, W, q=2, p=1)


def _check_layers(layers: Sequence[Layer]) -> list[Layer]:
    """Validated copies of the layers: float64 finite 2-D matrices, as many v as qk heads."""
    if isinstance(layers, dict) or len(layers) == 0:
        raise ValueError("layers: expected a non-empty sequence of layer dicts")
    out = []
    for i, layer in enumerate(layers):
        qk, v = list(layer.get("qk", ())), list(layer.get("v", ()))
        if not qk or len(qk) != len(v):
            raise ValueError(f"layers[{i}]: expected as many 'v' as 'qk' matrices (>= 1), got "
                             f"{len(qk)} and {len(v)}")  # fmt: skip
        new = {
            "qk": [_matrix(q, f"layers[{i}]['qk'][{h}]") for h, q in enumerate(qk)],
            "v": [_matrix(w, f"layers[{i}]['v'][{h}]") for h, w in enumerate(v)],
        }
        for name in ("m_in", "m_out"):
            if layer.get(name) is not None:
                new[name] = _matrix(layer[name], f"layers[{i}][{name!r}]")
        out.append(new)
    return out


def _c2_opt(layer: Layer, name: str) -> np.float64:
    """Spectral norm of an MLP matrix, 1 when the layer has no MLP (attention-only models)."""
    return _c2(layer[name]) if layer.get(name) is not None else np.float64(1.0)


def _alphas(layers: Sequence[Layer], L_phi: float) -> list[np.float64]:
    factors = []
    for layer in layers:
        heads = sum(
            _c2(v) * (1.0 + 4.0 * _c2(q)) for q, v in zip(layer["qk"], layer["v"], strict=True)
        )
        lphi = L_phi if layer.get("m_in") is not None else 1.0
        factors.append(lphi * _c2_opt(layer, "m_in") * _c2_opt(layer, "m_out") * heads)
    return [np.float64(np.prod(factors[l + 1 :])) for l in range(len(layers))]


def _matrices_with_gamma(layer: Layer) -> list[tuple[np.ndarray, np.float64]]:
    """Each matrix of a layer with its gamma (QK, then V~, then M_in, M_out)."""
    ci, co = _c2_opt(layer, "m_in"), _c2_opt(layer, "m_out")
    mats = [(q, 2.0 * _c2(v) * co * ci) for q, v in zip(layer["qk"], layer["v"], strict=True)]
    mats += [(v, co * ci) for v in layer["v"]]
    if layer.get("m_in") is not None:
        mats.append((layer["m_in"], co))
    if layer.get("m_out") is not None:
        mats.append((layer["m_out"], np.float64(1.0)))
    return mats


def spectrum_adaptive_proxy(
    layers: Sequence[Layer], *, num_examples: float, L_phi: float = 1.13,
    grid_m: int | None = None, rank_tol: float = 1e-10,
) -> Bound:  # fmt: skip
    r"""The spectrum-adaptive proxy B, Schatten index chosen per matrix after training.

    Args:
      layers: one dict per layer (see :data:`Layer`), matrices as finite 2-D arrays.
      num_examples: the N of the formula (> 0; sample size in the theorem; the authors' scripts
        pass the width).
      L_phi: Lipschitz constant of the MLP activation (>= 0; 1.13 for GELU, as in the authors'
        code).
      grid_m: M of the p grid (default ceil(L + log N)).
      rank_tol: relative tolerance defining the rank at p = 0 (>= 0).

    Returns:
      Bound (kind "proxy") with terms ``p_opt`` and ``contribution`` (one per matrix, in the order
      layer, then qk heads, v heads, m_in, m_out), ``alpha`` per layer, ``leading`` and ``sqrt_L``.

    Raises:
      ValueError: naming the argument, for a bad matrix or a number outside its domain.
    """
    ins = Inputs(True)
    N, L_phi = ins.positive("num_examples", num_examples), ins.nonneg("L_phi", L_phi)
    rank_tol = float(ins.nonneg("rank_tol", rank_tol))
    layers = _check_layers(layers)
    L = len(layers)
    grid = p_grid(L, float(N), grid_m)
    alphas = _alphas(layers, float(L_phi))
    contribs, p_opt = [], []
    for l, layer in enumerate(layers):
        for W, gamma in _matrices_with_gamma(layer):
            s = np.linalg.svd(W, compute_uv=False)
            scale = max(gamma * alphas[l] * L, np.finfo(np.float64).tiny)
            sp = np.array([schatten_power(s, p, rank_tol) for p in grid])
            vals = (
                sp ** (1.0 / (grid + 2.0))
                * scale ** (grid / (grid + 2.0))
                * N ** ((grid + 1.0) / (grid + 2.0))
            )
            contribs.append(np.min(vals))
            p_opt.append(grid[np.argmin(vals)])
    leading = np.sum(contribs)
    return Bound(
        value=leading + math.sqrt(L),
        terms={
            "leading": leading,
            "sqrt_L": np.float64(math.sqrt(L)),
            "contribution": np.array(contribs),
            "p_opt": np.array(p_opt),
            "alpha": np.array(alphas),
        },
        hypotheses={},
        name="Sakai & Imaizumi spectrum-adaptive proxy",
        kind="proxy",
        provenance="rebuilt",
    )


def norm_based_proxy(layers: Sequence[Layer], *, L_phi: float = 1.13) -> Bound:
    r"""The authors' norm-based (Edelman-style) proxy $(1 + \sum_l\alpha_l^{2/3}\xi_l)^{3/2}$.

    Args:
      layers: as in :func:`spectrum_adaptive_proxy`.
      L_phi: MLP activation Lipschitz constant (>= 0).

    Returns:
      Bound (kind "proxy") with terms ``xi`` and ``alpha`` per layer.

    Raises:
      ValueError: naming the argument, for a bad matrix or a number outside its domain.
    """
    L_phi = float(Inputs(True).nonneg("L_phi", L_phi))
    layers = _check_layers(layers)
    alphas = _alphas(layers, L_phi)
    t = 2.0 / 3.0
    xis = []
    for layer in layers:
        ci, co = _c2_opt(layer, "m_in"), _c2_opt(layer, "m_out")
        xi = np.float64(0.0)
        for q, v in zip(layer["qk"], layer["v"], strict=True):
            xi = xi + (co * ci * _c2(v) * _n21(q)) ** t + (co * ci * _n21(v)) ** t
        if layer.get("m_in") is not None:
            xi = xi + (co * _n21(layer["m_in"])) ** t
        if layer.get("m_out") is not None:
            xi = xi + _n21(layer["m_out"]) ** t
        xis.append(xi)
    total = sum(a**t * x for a, x in zip(alphas, xis, strict=True))
    return Bound(
        value=(1.0 + total) ** 1.5,
        terms={"xi": np.array(xis), "alpha": np.array(alphas)},
        hypotheses={},
        name="Norm-based (Edelman-style) proxy",
        kind="proxy",
        provenance="rebuilt",
    )
