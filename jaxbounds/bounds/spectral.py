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
``src/bert_spectrum/bounds.py`` of ``manasakai/spectrum-adaptive-transformers``), where N is the
value passed as ``N`` (their scripts pass the hidden size). The sample-size factor of the full
theorem is unknown: both numbers are complexity proxies, not bounds (``vacuous`` is always False).

References:
  Sakai & Imaizumi 2026, spectrum-adaptive generalization bounds for Transformers (abstract).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.bounds._result import Bound

__all__ = ["Layer", "norm_based_proxy", "p_grid", "schatten_power", "spectrum_adaptive_proxy"]

Layer = dict[str, Any]
"""One layer: ``{"qk": [W_QK per head], "v": [W_V W_O per head], "m_in": M_in, "m_out": M_out}``.

``m_in`` / ``m_out`` may be missing or None for attention-only layers: they then contribute
no term, their spectral norms count as 1 and L_phi is not applied."""


def p_grid(num_layers: int, N: float, grid_m: int | None = None) -> jax.Array:
    """The post-hoc grid {0, 1/M, ..., 2} with M = ceil(L + log N) (or ``grid_m``)."""
    m = (
        grid_m
        if grid_m is not None
        else math.ceil(float(num_layers) + math.log(max(float(N), 2.0)))
    )
    m = max(int(m), 1)
    return jnp.arange(0, 2 * m + 1, dtype=jnp.result_type(float)) / m


def schatten_power(s: jax.Array, p: jax.Array, rank_tol: float = 1e-10) -> jax.Array:
    r"""$\|W\|_{S_p}^p = \sum_i s_i^p$ from singular values ``s``.

    At p = 0 it is the rank (number of s > rank_tol * max s).

    >>> import jax.numpy as jnp
    >>> float(schatten_power(jnp.array([3.0, 4.0, 0.0]), jnp.asarray(2.0)))
    25.0
    >>> float(schatten_power(jnp.array([3.0, 4.0, 0.0]), jnp.asarray(0.0)))
    2.0
    """
    nz = s > rank_tol * jnp.max(s)
    safe = jnp.where(nz, s, 1.0)
    return jnp.sum(jnp.where(nz, safe**p, 0.0), axis=-1)


def _c2(W):
    return jnp.linalg.norm(jnp.asarray(W), ord=2)


def _c2_opt(layer: Layer, name: str) -> jax.Array:
    """Spectral norm of an MLP matrix, 1 when the layer has no MLP (attention-only models)."""
    return _c2(layer[name]) if layer.get(name) is not None else jnp.asarray(1.0)


def _n21(W):
    return jnp.sum(jnp.sqrt(jnp.sum(jnp.asarray(W) ** 2, axis=0)))


def _alphas(layers: Sequence[Layer], L_phi: float) -> list[jax.Array]:
    factors = []
    for layer in layers:
        heads = sum(
            _c2(v) * (1.0 + 4.0 * _c2(q)) for q, v in zip(layer["qk"], layer["v"], strict=True)
        )
        lphi = L_phi if layer.get("m_in") is not None else 1.0
        factors.append(lphi * _c2_opt(layer, "m_in") * _c2_opt(layer, "m_out") * heads)
    out = []
    for l in range(len(layers)):
        prod = jnp.asarray(1.0)
        for k in range(l + 1, len(layers)):
            prod = prod * factors[k]
        out.append(prod)
    return out


def spectrum_adaptive_proxy(
    layers: Sequence[Layer], *, N: float, L_phi: float = 1.13, grid_m: int | None = None,
    rank_tol: float = 1e-10,
) -> Bound:  # fmt: skip
    r"""The spectrum-adaptive proxy B, Schatten index chosen per matrix after training.

    Args:
      layers: one dict per layer (see :data:`Layer`), matrices as arrays.
      N: the N of the formula (sample size in the theorem; the authors' scripts pass the width).
      L_phi: Lipschitz constant of the MLP activation (1.13 for GELU, as in the authors' code).
      grid_m: M of the p grid (default ceil(L + log N)).
      rank_tol: relative tolerance defining the rank at p = 0.

    Returns:
      Bound (kind "proxy") with terms ``p_opt`` and ``contribution`` (one per matrix, in the order
      layer, then qk heads, v heads, m_in, m_out), ``alpha`` per layer, ``leading`` and ``sqrt_L``.
    """
    L = len(layers)
    grid = p_grid(L, N, grid_m)
    alphas = _alphas(layers, L_phi)
    contribs, p_opt = [], []
    for l, layer in enumerate(layers):
        ci, co = _c2_opt(layer, "m_in"), _c2_opt(layer, "m_out")
        mats = [(q, 2.0 * _c2(v) * co * ci) for q, v in zip(layer["qk"], layer["v"], strict=True)]
        mats += [(v, co * ci) for v in layer["v"]]
        if layer.get("m_in") is not None:
            mats.append((layer["m_in"], co))
        if layer.get("m_out") is not None:
            mats.append((layer["m_out"], jnp.asarray(1.0)))
        for W, gamma in mats:
            s = jnp.linalg.svd(jnp.asarray(W), compute_uv=False)
            scale = jnp.maximum(gamma * alphas[l] * L, jnp.finfo(s.dtype).tiny)
            sp = jax.vmap(lambda p, s=s: schatten_power(s, p, rank_tol))(grid)
            vals = (
                sp ** (1.0 / (grid + 2.0))
                * scale ** (grid / (grid + 2.0))
                * jnp.asarray(N, s.dtype) ** ((grid + 1.0) / (grid + 2.0))
            )
            contribs.append(jnp.min(vals))
            p_opt.append(grid[jnp.argmin(vals)])
    leading = jnp.sum(jnp.stack(contribs))
    value = leading + math.sqrt(L)
    return Bound(
        value=value,
        terms={
            "leading": leading,
            "sqrt_L": jnp.asarray(math.sqrt(L)),
            "contribution": jnp.stack(contribs),
            "p_opt": jnp.stack(p_opt),
            "alpha": jnp.stack(alphas),
        },
        hypotheses={},
        vacuous=jnp.asarray(False),
        name="Sakai & Imaizumi spectrum-adaptive proxy",
        kind="proxy",
        status="rebuilt",
    )


def norm_based_proxy(layers: Sequence[Layer], *, L_phi: float = 1.13) -> Bound:
    r"""The authors' norm-based (Edelman-style) proxy $(1 + \sum_l\alpha_l^{2/3}\xi_l)^{3/2}$.

    Args:
      layers: as in :func:`spectrum_adaptive_proxy`.
      L_phi: MLP activation Lipschitz constant.

    Returns:
      Bound (kind "proxy") with terms ``xi`` and ``alpha`` per layer.
    """
    alphas = _alphas(layers, L_phi)
    t = 2.0 / 3.0
    xis = []
    for layer in layers:
        ci, co = _c2_opt(layer, "m_in"), _c2_opt(layer, "m_out")
        xi = jnp.asarray(0.0)
        for q, v in zip(layer["qk"], layer["v"], strict=True):
            xi = xi + (co * ci * _c2(v) * _n21(q)) ** t + (co * ci * _n21(v)) ** t
        if layer.get("m_in") is not None:
            xi = xi + (co * _n21(layer["m_in"])) ** t
        if layer.get("m_out") is not None:
            xi = xi + _n21(layer["m_out"]) ** t
        xis.append(xi)
    total = sum((a**t * x for a, x in zip(alphas, xis, strict=True)), jnp.asarray(0.0))
    value = (1.0 + total) ** 1.5
    return Bound(
        value=value,
        terms={"xi": jnp.stack(xis), "alpha": jnp.stack(alphas)},
        hypotheses={},
        vacuous=jnp.asarray(False),
        name="Norm-based (Edelman-style) proxy",
        kind="proxy",
        status="rebuilt",
    )
