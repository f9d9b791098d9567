"""bounds.from_model on the typed records of our three models, against hand-called formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxbounds.bounds import pac_bayes, shallow_gd, trauger_tewari
from jaxbounds.bounds._result import Check, Status
from jaxbounds.bounds.from_model import (
    BOUNDS_OF,
    construction_bounds,
    from_model,
    scalar_bounds,
    shallow_bounds,
)
from jaxbounds.data.boolean import boolean_dataset, tiling_parities
from jaxbounds.models import (
    ScalarTransformer,
    ShallowTransformer,
    as_pure,
    construction,
    construction_quantities,
    scalar_quantities,
    shallow_quantities,
)


def _scalar(num_layers=1, num_heads=2, d=4, m=40, T=5):
    model = ScalarTransformer(
        d, num_layers=num_layers, num_heads=num_heads, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
    )
    x = jax.random.normal(jax.random.key(1), (m, T, d))
    _, params = as_pure(model)
    return params, x, scalar_quantities(params, x, activation_lipschitz=1.0)


def test_scalar_one_layer_norms_measured_from_weights():
    p, x, q = _scalar()
    out = from_model(q)
    B_x = np.linalg.norm(np.asarray(x).reshape(-1, 4), axis=1).max()
    w = np.asarray(p["w"])
    expected = 0.0
    for h in range(2):
        qk, wv, wc = (np.asarray(p["layers"][0][n][h]) for n in ("w_qk", "w_v", "w_c"))
        expected += float(
            trauger_tewari.corollary_4_1_1(
                B_x=B_x,
                B_WQK=np.abs(qk).sum(),
                B_w=np.abs(w).sum(),
                B_Wc=np.abs(wc).sum(axis=1).max(),  # ||W_c^T||_{1,inf}: max row l1 of W_c
                B_Wv=np.abs(wv).sum(axis=1).max(),
                L_sigma=1.0,
                d=4,
                num_examples=40,
            ).value
        )
    got = out["T&T Corollary 4.1.1 Rademacher"]
    assert float(got.value) == pytest.approx(expected, rel=1e-10)
    gap = out["T&T Corollary 4.1.1 gap"]
    assert float(gap.rademacher) == pytest.approx(expected, rel=1e-10)
    assert float(gap.value) >= float(gap.complexity)
    loss_bound = math.log1p(math.exp(float(np.linalg.norm(w))))
    assert float(got.trivial) == pytest.approx(loss_bound / 2)
    assert bool(got.is_valid) == all(bool(c) for c in got.hypotheses.values())
    if got.is_valid:
        assert got.is_vacuous == (2 * expected >= loss_bound)
    assert gap.is_valid == got.is_valid  # the gap carries the Rademacher bound's hypotheses
    assert float(gap.trivial) == pytest.approx(loss_bound)
    assert list(out) == [
        f"T&T Corollary {c} {kind}"
        for c in ("4.1.1", "D.0.1", "D.0.2")
        for kind in ("Rademacher", "gap")
    ] + [
        "T&T Corollary 4.2.1 log cover",
        "T&T Theorem 4.2 Rademacher",
        "T&T Theorem 4.2 gap",
        "Edelman multi-layer log cover",
        "Edelman multi-layer Rademacher",
        "Edelman multi-layer gap",
        "spectrum-adaptive proxy",
        "norm-based proxy",
    ]
    for b in out.values():
        assert bool(jnp.isfinite(b.value))
    assert bool(got.hypotheses["m > d"])  # m = 40 > d = 4


def test_scalar_multi_layer_cover_times_h_cubed():
    _, x, q = _scalar(num_layers=2, num_heads=2)
    out = scalar_bounds(q)
    assert "T&T Corollary 4.1.1 Rademacher" not in out  # Theorem 4.1 is one-layer only
    tt = out["T&T Corollary 4.2.1 log cover"]
    assert float(tt.head_factor) == 8.0
    assert tt.provenance == "rebuilt"
    assert float(tt.C) == pytest.approx(float(tt.value))
    longer = scalar_quantities(
        as_pure(
            ScalarTransformer(
                4, num_layers=2, num_heads=2, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
            )
        )[1],
        jnp.concatenate([x, jnp.zeros_like(x)], axis=1),
        activation_lipschitz=1.0,
    )
    b = scalar_bounds(longer)
    # Edelman's cover grows with T, Trauger & Tewari's does not
    assert float(b["Edelman multi-layer log cover"].value) > float(
        out["Edelman multi-layer log cover"].value
    )
    assert float(b["T&T Corollary 4.2.1 log cover"].value) == pytest.approx(float(tt.value))


def test_shallow_from_record():
    d, d_m, N, d_s = 3, 8, 12, 4
    model = ShallowTransformer(d, d_m, rngs=nnx.Rngs(0), dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(0), (N, d_s, d))
    y = jnp.arange(N) % 2
    radii = {"W_Q": 0.1, "W_K": 0.1, "W_V": 0.2, "w_O": 0.3}
    q = shallow_quantities(model.params_dict(), x, y, radii=radii)
    out = from_model(q, delta=0.1)
    ref = shallow_gd.theorem_5(
        alpha=shallow_gd.alpha_from_features(q.features0), phi0=q.phi0, num_examples=N, d_s=d_s,
        d_m=d_m, R_X=q.input_radius, init=q.init, radii=q.radii, delta=0.1,
    )  # fmt: skip
    assert float(out["shallow Theorem 5"].value) == pytest.approx(float(ref.value))
    assert not bool(out["shallow Theorem 5"].hypotheses["d_m >= N^3"])
    for name in ("shallow Lemma 4 empirical", "shallow Theorem 5"):  # d_m = 8 < N^3
        assert out[name].status == Status.NOT_VALID
        assert "d_m >= N^3 fails (d_m = 8, N^3 = 1728)" in out[name].failed
    assert list(out) == list(shallow_bounds(q))
    assert set(out) == {
        "shallow Lemma 1 Rademacher",
        "shallow Lemma 4 empirical",
        "shallow Theorem 5",
    }


def test_construction_semi_analytic_from_measured_quantities():
    T = 6
    f = tiling_parities(T, 2)
    model = construction(f, seq_len=T)
    apply_fn, params = as_pure(model)
    data = boolean_dataset(f, None, num_bits=T)
    q = construction_quantities(
        apply_fn, params, data["inputs"], empirical_risk=0.01, function=f, seq_len=T
    )
    out = construction_bounds(q, subgaussian_scale=0.02)
    ref = pac_bayes.semi_analytic(
        G_u=q.G_u, norm_sq=q.norm_sq, subgaussian_scale=0.02, num_examples=2**T, delta=0.05,
        empirical_risk=0.01,
    )  # fmt: skip
    assert float(out["semi-analytic (measured ||theta||^2, P = 0)"].value) == float(ref.value)
    L = pac_bayes.construction_norm_bound(f.sparsity, f.degree, T)
    ref_L = pac_bayes.semi_analytic(
        G_u=q.G_u, norm_sq=L, subgaussian_scale=0.02, num_examples=2**T, delta=0.05,
        empirical_risk=0.01,
    )  # fmt: skip
    assert float(out["semi-analytic (Theorem 10 L, P = 0)"].value) == float(ref_L.value)
    bare = construction_quantities(apply_fn, params, data["inputs"], empirical_risk=0.01)
    assert list(from_model(bare)) == ["semi-analytic (measured ||theta||^2, P = 0)"]


def test_float32_weights_with_float64_data_under_strict_promotion():
    """The engine's TypePromotionError case: float32 weights, float64 data, strict promotion."""
    model = ScalarTransformer(
        4, num_layers=1, num_heads=2, param_dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    _, params = as_pure(model)
    params64 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), params)
    x = jax.random.normal(jax.random.key(1), (40, 5, 4), jnp.float64)
    with jax.numpy_dtype_promotion("strict"):
        out = from_model(scalar_quantities(params, x, activation_lipschitz=1.0))
        ref = from_model(scalar_quantities(params64, x, activation_lipschitz=1.0))
    for name in ("spectrum-adaptive proxy", "norm-based proxy", "T&T Theorem 4.2 gap"):
        assert out[name].value.dtype == np.float64
        assert float(out[name].value) == pytest.approx(float(ref[name].value), rel=1e-5), name


def test_one_layer_hypotheses_hold_where_they_hold_for_every_head():
    """A hypothesis of the summed heads fails when it fails for one head, with that head named."""
    from jaxbounds.bounds.from_model import _all_heads

    per_head = [
        {"m > d": Check.of(True, m=40, d=4), "r": Check.of(True)},
        {"m > d": Check.of(False, m=3, d=4), "r": Check.of(True)},
    ]
    hyp = _all_heads(per_head)
    assert not hyp["m > d"]
    assert hyp["r"]
    assert hyp["m > d"].detail == "head 1: m = 3, d = 4"


def test_unknown_record_type():
    assert set(BOUNDS_OF.values()) == {scalar_bounds, shallow_bounds, construction_bounds}
    with pytest.raises(TypeError, match="no bounds for dict"):
        from_model({"G_u": 1.0})
