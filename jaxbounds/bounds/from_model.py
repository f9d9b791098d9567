"""Every applicable bound for a model, from the typed record of what was measured on it.

Each model module exposes the quantities its papers' bounds take as a frozen record, and this
module maps each record type to its bounds (:data:`BOUNDS_OF`); it imports no model class.

- :class:`~jaxbounds.models.scalar.ScalarQuantities` -> :func:`scalar_bounds`: Trauger & Tewari
  Theorem 4.1 and Corollaries 4.1.1 / D.0.1 / D.0.2 (one layer, heads summed), Theorem 4.2 via
  Corollary 4.2.1 (any depth), Edelman et al. multi-layer covers (log(d m T)), each turned into
  a generalization bound with :func:`covering.rademacher_to_gap`, plus the spectrum-adaptive and
  norm-based proxies. Norms are measured on the weights, input bounds on the data.
- :class:`~jaxbounds.models.shallow.ShallowQuantities` -> :func:`shallow_bounds`: Theorem 5
  (with Lemmas 1 and 4) from the GD run's record.
- :class:`~jaxbounds.models.construction.ConstructionQuantities` -> :func:`construction_bounds`:
  the semi-analytic PAC-Bayes bound with G_u and ||theta||^2 measured, beside the Theorem 10
  bound L(omega, D_f, T).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxbounds.bounds import covering, edelman, pac_bayes, shallow_gd, spectral, trauger_tewari
from jaxbounds.bounds._result import Bound, Check
from jaxbounds.models.construction import ConstructionQuantities
from jaxbounds.models.scalar import AttentionHead, ScalarQuantities
from jaxbounds.models.shallow import ShallowQuantities
from kernels.norms import group_norm, spectral_norm

__all__ = ["BOUNDS_OF", "construction_bounds", "from_model", "scalar_bounds", "shallow_bounds"]


def _gap(rad: Bound, *, num_examples: int, delta: float, lipschitz: float, loss_bound: float):
    """A Rademacher bound as a generalization-gap bound (``covering.rademacher_to_gap``)."""
    g = covering.rademacher_to_gap(
        rademacher=rad.value, num_examples=num_examples, delta=delta, lipschitz=lipschitz,
        loss_bound=loss_bound,
    )  # fmt: skip
    return Bound(
        value=g.value,
        terms={**g.terms, "rademacher": rad.value},
        hypotheses={**rad.hypotheses, **g.hypotheses},
        trivial=g.trivial,
        name=rad.name + " -> generalization gap",
        kind="risk",
        provenance=rad.provenance,
        assumed=rad.assumed + g.assumed,
    )


def _readout_norms(q: ScalarQuantities) -> tuple[Any, Any, float]:
    """``(B_w1, B_w2, loss_bound)``: the readout's largest column l1 / l2 norms and the loss range.

    ``|f| <= ||w||_2``, so the logistic loss lies in ``[0, log(1 + e^{||w||_2})]``.
    """
    b_w1 = jnp.max(jnp.sum(jnp.abs(q.readout), axis=0))
    b_w2 = jnp.max(jnp.linalg.norm(q.readout, axis=0))
    return b_w1, b_w2, float(np.logaddexp(0.0, float(b_w2)))  # float64; exp overflows past 88


def _one_layer(q: ScalarQuantities, loss_bound: float, b_w1: Any) -> dict[str, Bound]:
    """Theorem 4.1 via Corollaries 4.1.1, D.0.1, D.0.2, summed over the heads (Rademacher)."""
    heads = q.heads[0]
    out = {}
    for label, cor, b_x, qq, p in (
        ("Corollary 4.1.1", trauger_tewari.corollary_4_1_1, q.input_l2, 1, 1),
        ("Corollary D.0.1", trauger_tewari.corollary_d_0_1, q.input_l1, 1, math.inf),
        ("Corollary D.0.2", trauger_tewari.corollary_d_0_2, q.input_l1, 2, 1),
    ):
        per_head = [
            cor(
                B_x=b_x,
                B_WQK=group_norm(h.w_qk, q=qq, p=p),
                B_w=b_w1,
                B_Wc=group_norm(h.w_c.T, q=1, p=math.inf),  # ||W_c^T||_{1,inf}, W_c (k, d)
                B_Wv=group_norm(h.w_v.T, q=1, p=math.inf),  # ||W_v^T||_{1,inf}, W_v (d, k)
                L_sigma=q.activation_lipschitz,
                d=q.embed_dim,
                num_examples=q.num_examples,
            )
            for h in heads
        ]
        total = sum(b.value for b in per_head)
        hyp = _all_heads([b.hypotheses for b in per_head])
        out[label] = Bound(
            value=total,
            terms={"per_head": jnp.stack([b.value for b in per_head])},
            hypotheses=hyp,
            trivial=loss_bound / 2.0,
            name=f"Trauger & Tewari {label} (heads summed, O-constant 1)",
            kind="rademacher",
            assumed=per_head[0].assumed,
        )
    return out


def _all_heads(per_head: list[dict[str, Check]]) -> dict[str, Check]:
    """Each hypothesis holds for the sum where it holds for every head (the failing heads named).

    >>> h = _all_heads([{"m > d": Check.of(True, m=9)}, {"m > d": Check.of(False, m=2)}])
    >>> bool(h["m > d"]), h["m > d"].detail
    (False, 'head 1: m = 2')
    """
    out = {}
    for key in per_head[0]:
        checks = [hyp[key] for hyp in per_head]
        failing = [f"head {i}: {c.detail}" for i, c in enumerate(checks) if not c and c.detail]
        holds = np.all(np.stack([c.holds for c in checks]), axis=0)
        out[key] = Check(holds, "; ".join(failing) if failing else checks[0].detail)
    return out


def _matrix_norms(q: ScalarQuantities) -> tuple[dict[str, float], float, float]:
    """Spectral norms ``B_c2, B_v2, B_QK2`` and the largest ||.||_{1,1}, ||.||_{2,1} of all."""
    heads: list[AttentionHead] = [h for layer in q.heads for h in layer]
    spec = {
        "B_c2": max(float(spectral_norm(h.w_c.T)) for h in heads),
        "B_v2": max(float(spectral_norm(h.w_v.T)) for h in heads),
        "B_QK2": max(float(spectral_norm(h.w_qk)) for h in heads),
    }
    mats = [h.w_c for h in heads] + [h.w_v for h in heads] + [h.w_qk for h in heads]
    mats.append(q.readout)
    b11 = max(float(group_norm(x, q=1, p=1)) for x in mats)
    b21 = max(float(group_norm(x, q=2, p=1)) for x in mats)
    return spec, b11, b21


def _with_head_factor(b: Bound, num_heads: int, *, provenance: str, head_term: bool) -> Bound:
    """A log cover times H^3: the multi-head extension costs H^{1.5} in the complexity [rebuilt]."""
    factor = float(num_heads) ** 3
    terms = {**b.terms, "C": b.value * factor}
    if head_term:
        terms["head_factor"] = jnp.asarray(factor)
    return Bound(
        value=b.value * factor,
        terms=terms,
        hypotheses=b.hypotheses,
        name=b.name + f" (x H^3, H={num_heads})",
        kind="log_cover",
        provenance=provenance,
        assumed=b.assumed if head_term else (),
    )


def _multi_layer(q: ScalarQuantities, loss_bound: float, b_w2: Any) -> dict[str, Bound]:
    """Theorem 4.2 (T&T Corollary 4.2.1) and Edelman's multi-layer cover, with Rademacher."""
    spec, b11, b21 = _matrix_norms(q)
    common = {"B_x": q.input_l2, "d": q.embed_dim, "num_layers": q.num_layers}
    common |= {"L_sigma": q.activation_lipschitz, "B_w": b_w2, **spec}
    tt = trauger_tewari.corollary_4_2_1(B=b11, k=q.hidden_dim, **common)
    tt = _with_head_factor(
        tt, q.num_heads, provenance="paper" if q.num_heads == 1 else "rebuilt", head_term=True
    )
    ed = edelman.multi_layer_log_cover(
        B21=b21, num_examples=q.num_examples, seq_len=q.seq_len, **common
    )
    ed = _with_head_factor(ed, q.num_heads, provenance="rebuilt", head_term=False)
    m = q.num_examples
    return {
        "T&T Corollary 4.2.1 log cover": tt,
        "T&T Theorem 4.2 Rademacher": trauger_tewari.multi_layer_rademacher(
            cover=tt, B_w=b_w2, num_examples=m, loss_bound=loss_bound
        ),
        "Edelman multi-layer log cover": ed,
        "Edelman multi-layer Rademacher": edelman.rademacher(
            cover=ed, radius=b_w2, num_examples=m, loss_bound=loss_bound
        ),
    }


def scalar_bounds(q: ScalarQuantities, *, delta: float = 0.05) -> dict[str, Bound]:
    """Every bound of Trauger & Tewari and Edelman et al. for a scalar Transformer's record.

    Args:
      q: the measured quantities (:func:`jaxbounds.models.scalar.scalar_quantities`).
      delta: confidence of the high-probability bounds.

    Returns:
      Name -> :class:`Bound`, in a stable order (Theorem 4.1's corollaries only for one layer).
    """
    b_w1, b_w2, loss_bound = _readout_norms(q)
    lip = q.loss_lipschitz * (1.0 if q.num_classes == 1 else 2.0 * math.sqrt(q.num_classes))
    kw = {"num_examples": q.num_examples, "delta": delta, "lipschitz": lip}
    out: dict[str, Bound] = {}
    if q.num_layers == 1:
        for label, rad in _one_layer(q, loss_bound, b_w1).items():
            out[f"T&T {label} Rademacher"] = rad
            out[f"T&T {label} gap"] = _gap(rad, loss_bound=loss_bound, **kw)
    multi = _multi_layer(q, loss_bound, b_w2)
    for cover, rad in (
        ("T&T Corollary 4.2.1 log cover", "T&T Theorem 4.2"),
        ("Edelman multi-layer log cover", "Edelman multi-layer"),
    ):
        out[cover] = multi[cover]
        out[f"{rad} Rademacher"] = multi[f"{rad} Rademacher"]
        out[f"{rad} gap"] = _gap(multi[f"{rad} Rademacher"], loss_bound=loss_bound, **kw)
    layers = [
        {"qk": [h.w_qk for h in layer], "v": [h.w_v @ h.w_c for h in layer]} for layer in q.heads
    ]
    L = q.activation_lipschitz
    out["spectrum-adaptive proxy"] = spectral.spectrum_adaptive_proxy(
        layers, num_examples=q.num_examples, L_phi=L
    )
    out["norm-based proxy"] = spectral.norm_based_proxy(layers, L_phi=L)
    return out


def shallow_bounds(q: ShallowQuantities, *, delta: float = 0.05) -> dict[str, Bound]:
    """Lemma 1, Lemma 4 and Theorem 5 of the shallow-Transformer GD paper for a GD run's record.

    Args:
      q: the measured quantities (:func:`jaxbounds.models.shallow.shallow_quantities`).
      delta: confidence of Theorem 5.

    Returns:
      Name -> :class:`Bound`.
    """
    alpha = shallow_gd.alpha_from_features(jnp.asarray(q.features0))
    common = {"num_examples": q.num_examples, "d_s": q.d_s, "d_m": q.d_m, "R_X": q.input_radius}
    t5 = shallow_gd.theorem_5(
        alpha=alpha, phi0=q.phi0, init=q.init, radii=q.radii, delta=delta, **common
    )
    norms = shallow_gd.norms_from_weights(q.init, q.radii)
    l1 = shallow_gd.lemma_1(**{k: norms[k] for k in ("eta_Q", "eta_K", "eta_V", "eta_O")}, **common)
    l4 = shallow_gd.lemma_4(
        alpha=alpha, phi0=q.phi0, **common, **{k: v for k, v in norms.items() if k != "xi_O"}
    )
    return {
        "shallow Lemma 1 Rademacher": l1,
        "shallow Lemma 4 empirical": l4,
        "shallow Theorem 5": t5,
    }


def construction_bounds(
    q: ConstructionQuantities, *, delta: float = 0.05, subgaussian_scale: float = 0.01
) -> dict[str, Bound]:
    """The semi-analytic PAC-Bayes bound at the measured ||theta||^2 and at Theorem 10's L.

    Args:
      q: the measured quantities (:func:`jaxbounds.models.construction.construction_quantities`).
      delta: confidence.
      subgaussian_scale: the sub-Gaussian constant of the loss (the paper's 0.01).

    Returns:
      Name -> :class:`Bound`; the Theorem 10 row only when the record has the target's sparsity,
      degree and T.
    """
    kw = {
        "G_u": q.G_u,
        "subgaussian_scale": subgaussian_scale,
        "num_examples": q.num_examples,
        "delta": delta,
        "empirical_risk": q.empirical_risk,
    }
    out = {
        "semi-analytic (measured ||theta||^2, P = 0)": pac_bayes.semi_analytic(
            norm_sq=q.norm_sq, **kw
        )
    }
    if q.degree is not None and q.sparsity is not None and q.seq_len is not None:
        L = pac_bayes.construction_norm_bound(q.sparsity, q.degree, q.seq_len)
        out["semi-analytic (Theorem 10 L, P = 0)"] = pac_bayes.semi_analytic(norm_sq=L, **kw)
    return out


#: Record type -> its bounds: the one place that knows which bounds a model's record feeds.
BOUNDS_OF: dict[type, Callable[..., dict[str, Bound]]] = {
    ScalarQuantities: scalar_bounds,
    ShallowQuantities: shallow_bounds,
    ConstructionQuantities: construction_bounds,
}


def from_model(quantities: Any, *, delta: float = 0.05) -> dict[str, Bound]:
    """Every bound that applies to a model, from the record of its measured quantities.

    Args:
      quantities: a :class:`ScalarQuantities`, :class:`ShallowQuantities` or
        :class:`ConstructionQuantities` (see :data:`BOUNDS_OF`).
      delta: confidence of the high-probability bounds.

    Returns:
      Name -> :class:`Bound`, in a stable order.

    Raises:
      TypeError: for a record type without bounds.
    """
    bounds = BOUNDS_OF.get(type(quantities))
    if bounds is None:
        raise TypeError(f"quantities: no bounds for {type(quantities).__name__}")
    return bounds(quantities, delta=delta)
