"""Edelman et al. covers (rebuilt form): closed form, growth with T against Trauger & Tewari."""

import numpy as np
import pytest

from jaxbounds.bounds import Status, covering, edelman, trauger_tewari

ML = {"L_sigma": 1.0, "B_c2": 1.1, "B_v2": 0.9, "B_QK2": 0.5, "B_w": 1.7}
EDEL = {
    "L_sigma": 1.0, "B_w": 1.0, "B_X": 1.0, "B_C21": 2.0, "B_V": 1.0, "B_V21": 2.0, "B_C": 1.0,
    "B_QK21": 2.0, "d": 64, "num_examples": 300,
}  # fmt: skip


def test_edelman_single_head_closed_form():
    r = edelman.single_head_log_cover(**EDEL, seq_len=20)
    bracket = 2 ** (2 / 3) + 2 ** (2 / 3) + 4 ** (2 / 3)
    assert float(r.value) == pytest.approx(bracket**3 * np.log(64 * 300 * 20), rel=1e-13)
    assert r.provenance == "rebuilt"
    assert r.status is Status.NON_VACUOUS


def test_edelman_grows_with_T_trauger_tewari_does_not():
    """Side by side on the sparse-majority sizes (d=64, m=300, T=20..200)."""
    Ts = np.arange(20, 201, 20)
    ed = edelman.single_head_log_cover(**{**EDEL, "d": np.full(10, 64)}, seq_len=Ts)
    assert bool(np.all(np.diff(ed.value) > 0))
    ml = edelman.multi_layer_log_cover(
        B21=2.0, B_x=1.0, d=64, num_examples=300, seq_len=Ts, num_layers=2, **ML
    )
    assert bool(np.all(np.diff(ml.value) > 0))
    # Trauger & Tewari: the same norms give the same number for every T (no T argument at all).
    tt = [
        float(trauger_tewari.corollary_4_2_1(B=2.0, B_x=1.0, d=64, k=64, num_layers=2, **ML).value)
        for _ in Ts
    ]
    assert len(set(tt)) == 1
    # the Edelman multi-layer cover is the T&T Theorem 4.2 with the log(d m T) coefficient
    C = 4.0 * np.log(64 * 300 * 20)
    ref = trauger_tewari.multi_layer_log_cover(C_1=C, C_Bx=C, num_layers=2, **ML)
    assert float(ml.value[0]) == pytest.approx(float(ref.value), rel=1e-13)


def test_edelman_rademacher_is_dudley_of_the_cover():
    cover = edelman.single_head_log_cover(**EDEL, seq_len=20)
    rad = edelman.rademacher(cover=cover, radius=1.0, num_examples=300)
    ref = covering.dudley_rademacher(C=cover.value, radius=1.0, num_examples=300)
    assert float(rad.value) == float(ref.value)
    assert rad.status is Status.VACUOUS  # 4 A = 4 >= 1/2: says nothing at m = 300
    big = edelman.rademacher(cover=cover, radius=1.0, num_examples=10**9, loss_bound=1.0)
    assert big.status is Status.NON_VACUOUS


@pytest.mark.parametrize(
    ("arg", "bad"),
    [("B_X", -1.0), ("B_QK21", np.nan), ("d", 0), ("num_examples", 2.5), ("seq_len", 0)],
)
def test_edelman_validates(arg, bad):
    kw = {**EDEL, "seq_len": 20, arg: bad}
    with pytest.raises(ValueError, match=f"^{arg}: expected"):
        edelman.single_head_log_cover(**kw)
    assert edelman.single_head_log_cover(**kw, strict=False).status is Status.NOT_VALID
    ml = {"B21": 2.0, "B_x": 1.0, "d": 64, "num_examples": 300, "seq_len": 20, "num_layers": 2}
    if arg in ml:
        with pytest.raises(ValueError, match=f"^{arg}: expected"):
            edelman.multi_layer_log_cover(**{**ml, arg: bad}, **ML)
    cover = edelman.single_head_log_cover(**{**EDEL, "seq_len": 20})
    with pytest.raises(ValueError, match=r"^radius: expected a finite number > 0"):
        edelman.rademacher(cover=cover, radius=-1.0, num_examples=300)
