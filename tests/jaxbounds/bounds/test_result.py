"""The Bound result: three-state status, failed hypotheses with reasons, rendering, input checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.bounds import Bound, Check, Status
from jaxbounds.bounds._result import Inputs, int_option


def test_three_states_scalar():
    ok = Bound(value=0.3, terms={}, hypotheses={"h": True}, trivial=1.0)
    assert ok.status is Status.NON_VACUOUS
    assert ok.is_valid
    assert not ok.is_vacuous
    vac = Bound(value=1.0, terms={}, hypotheses={}, trivial=1.0)  # at the trivial bound
    assert vac.status is Status.VACUOUS
    assert vac.is_valid
    assert vac.is_vacuous
    bad = Bound(value=0.3, terms={}, hypotheses={"m > d": Check.of(False, m=8, d=16)}, trivial=1.0)
    assert bad.status is Status.NOT_VALID
    assert not bad.is_valid
    assert not bad.is_vacuous  # not valid is not "valid and vacuous"
    assert bad.failed == ("m > d fails (m = 8, d = 16)",)


def test_not_valid_never_renders_as_a_number():
    bad = Bound(value=8.6e-22, terms={}, hypotheses={"d_m >= N^3": False}, trivial=1.0)
    for text in (str(bad), f"{bad}", f"{bad:.3g}", bad.format()):
        assert text.startswith("not valid: d_m >= N^3 fails")
        assert "8.6" not in text
    assert float(bad.value) == 8.6e-22  # kept for inspection
    assert str(Bound(value=0.25, terms={}, hypotheses={}, trivial=1.0)) == (
        "0.25 (valid, non-vacuous)"
    )
    assert (
        f"{Bound(value=2.0, terms={}, hypotheses={}, trivial=1.0):.2f}" == "2.00 (valid, vacuous)"
    )


def test_nan_value_is_not_valid():
    b = Bound(value=np.nan, terms={}, hypotheses={}, trivial=1.0)
    assert b.status is Status.NOT_VALID
    assert "the value is NaN" in str(b)


def test_covers_and_proxies_are_never_vacuous():
    b = Bound(value=1e9, terms={}, hypotheses={}, kind="log_cover")
    assert b.status is Status.NON_VACUOUS


def test_covers_and_proxies_never_read_non_vacuous():
    """No trivial bound, no comparison: shown as "no trivial bound", not as "non-vacuous"."""
    proxy = Bound(value=3.5, terms={}, hypotheses={}, kind="proxy")
    assert proxy.label == "valid, no trivial bound"
    assert str(proxy) == "3.5 (valid, no trivial bound)"
    assert "non-vacuous" not in f"{proxy:.2f}"
    bad = Bound(value=3.5, terms={}, hypotheses={"h": False}, kind="proxy")
    assert bad.label == "not valid"
    with pytest.raises(ValueError, match="label: defined for a scalar bound"):
        _ = Bound(value=np.ones(2), terms={}, hypotheses={}, kind="proxy").label


def test_array_status_elementwise():
    b = Bound(
        value=np.array([0.1, 2.0, 0.3]),
        terms={},
        hypotheses={"h": Check(np.array([True, True, False]), "h = [1, 1, 0]")},
        trivial=1.0,
    )
    np.testing.assert_array_equal(b.status, [0, 1, 2])
    np.testing.assert_array_equal(b.is_valid, [True, True, False])
    np.testing.assert_array_equal(b.is_vacuous, [False, True, False])
    text = str(b)
    assert text.startswith("[0.1, 2, not valid]")
    assert "h fails" in text


def test_terms_as_attributes_and_value_is_float64():
    b = Bound(value=jnp.float32(0.5), terms={"sigma": 2.0}, hypotheses={})
    assert b.sigma == 2.0
    assert b.value.dtype == np.float64
    with pytest.raises(AttributeError, match="nope"):
        _ = b.nope


def test_check_behaves_like_its_bool_array():
    c = Check.of(np.array([True, False]), x=np.array([1.0, 2.0]))
    assert not bool(c)
    np.testing.assert_array_equal(np.asarray(c), [True, False])
    assert c.detail.startswith("x = [1")


@pytest.mark.parametrize(
    ("method", "bad", "args"),
    [
        ("nonneg", -1.0, ()),
        ("nonneg", np.nan, ()),
        ("nonneg", np.inf, ()),
        ("positive", 0.0, ()),
        ("count", 0, ()),
        ("count", 2.5, ()),
        ("count", np.nan, ()),
        ("probability", 0.0, ()),
        ("probability", 1.0, ()),
        ("probability", 1.5, ()),
        ("real", np.nan, ()),
        ("within", -0.2, (0.0, 1.0, "[0, 1]")),
    ],
)
def test_inputs_strict_raises_naming_the_argument(method, bad, args):
    with pytest.raises(ValueError, match=r"^arg: expected "):
        getattr(Inputs(True), method)("arg", bad, *args)
    lax = Inputs(False)
    getattr(lax, method)("arg", bad, *args)
    (key,) = lax.failures
    assert key.startswith("arg: ")
    assert not bool(lax.failures[key])
    b = lax.bound(value=0.1, terms={}, hypotheses={}, trivial=1.0)
    assert b.status is Status.NOT_VALID
    assert str(b).startswith("not valid: arg: ")


def test_inputs_refuse_bools_non_numbers_and_traced_values():
    with pytest.raises(ValueError, match="d: expected a number, got a bool"):
        Inputs(True).count("d", True)
    with pytest.raises(ValueError, match=r"B_w: expected a real number .*got 'big' \(a str\)"):
        Inputs(True).nonneg("B_w", "big")
    with pytest.raises(TypeError, match="B_w: bounds are computed eagerly in float64"):
        jax.jit(lambda x: Inputs(True).nonneg("B_w", x))(1.0)
    with pytest.raises(ValueError, match="strict: expected a bool"):
        Inputs(1)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ("5", r"'5' \(a str\)"),
        (b"5", r"b'5' \(a bytes\)"),
        (None, r"None \(None\)"),
        (1 + 2j, r"\(1\+2j\) \(a complex\)"),
        (np.array([1.0 + 0j]), r"\(a complex inside\)"),
        ([0.5, "1"], r"\(a str inside\)"),
        ([0.5, None], r"\(None inside\)"),
        (object(), r"\(a object\)"),
    ],
)
def test_inputs_refuse_strings_and_other_non_numbers(bad, what):
    """``"5"`` used to be read as 5 (np.asarray(..., float64) parses strings); no longer."""
    for method in ("real", "nonneg", "positive", "count", "probability"):
        with pytest.raises(ValueError, match=rf"^kl: expected a real number .*{what}$"):
            getattr(Inputs(True), method)("kl", bad)
        with pytest.raises(ValueError, match=r"^kl: expected a real number"):  # strict=False too
            getattr(Inputs(False), method)("kl", bad)


def test_inputs_accept_real_number_types_and_refuse_overflowing_ints():
    from fractions import Fraction

    assert float(Inputs(True).real("x", Fraction(1, 4))) == 0.25
    np.testing.assert_array_equal(Inputs(True).real("x", [Fraction(1, 2), 2]), [0.5, 2.0])
    assert Inputs(True).count("n", 2**70).dtype == np.float64
    assert float(Inputs(True).real("x", np.float32(1.5))) == 1.5
    with pytest.raises(ValueError, match=r"x: expected a number within float64's range"):
        Inputs(True).real("x", 10**400)


def test_log_2x_plus_1_past_overflow_of_the_product():
    """ln(2dk + 1) with d k beyond float64: the sum of the logs (closed form)."""
    from jaxbounds.bounds._result import log_2x_plus_1

    assert float(log_2x_plus_1(4.0)) == pytest.approx(np.log(9.0), rel=1e-15)
    assert float(log_2x_plus_1(2.0, 3.0)) == pytest.approx(np.log(13.0), rel=1e-15)
    with np.errstate(over="ignore"):
        big = float(log_2x_plus_1(1e200, 1e200))
    assert big == pytest.approx(np.log(2.0) + 400.0 * np.log(10.0), rel=1e-15)


def test_int_option():
    assert int_option("num_layers", 3) == 3
    for bad in (0, 2.0, True, "2"):
        with pytest.raises(ValueError, match="num_layers: expected an int >= 1"):
            int_option("num_layers", bad)


def _calculators():
    """Every public bound calculator with valid keyword arguments (numbers only)."""
    from jaxbounds.bounds import covering, edelman, pac_bayes, shallow_gd, trauger_tewari

    pac = {"empirical_risk": 0.1, "kl": 5.0, "num_examples": 100, "delta": 0.05}
    semi = {"G_u": 1.0, "norm_sq": 2.0, "subgaussian_scale": 0.1, "num_examples": 100}
    parity = {"T": 4, "G_u": 1.0, "subgaussian_scale": 0.1, "num_examples": 100}
    cover = {"B_x": 1.0, "B_w": 1.0, "d": 3, "k": 2}
    tt41 = {"B_x": 1.0, "B_WQK": 1.0, "B_w": 1.0, "B_Wc": 1.0, "B_Wv": 1.0, "L_sigma": 1.0,
            "d": 3, "num_examples": 100}  # fmt: skip
    tt42 = {"C_1": 1.0, "C_Bx": 1.0, "num_layers": 2, "L_sigma": 1.0, "B_c2": 1.0, "B_v2": 1.0,
            "B_QK2": 1.0, "B_w": 1.0}  # fmt: skip
    tt42_norms = {k: v for k, v in tt42.items() if k not in ("C_1", "C_Bx")}
    head = dict.fromkeys(("L_sigma", "B_w", "B_X", "B_C21", "B_V", "B_V21", "B_C", "B_QK21"), 1.0)
    etas = {f"eta_{n}": 1.0 for n in "QKVO"}
    lemma4 = {"alpha": 1.0, "phi0": 1.0, "num_examples": 10, "d_s": 2, "d_m": 4, "R_X": 1.0}
    lemma4 |= {**etas, **{f"xi_{n}": 1.0 for n in "QKV"}, **{f"R_{n}": 0.1 for n in "QKVO"}}
    return [
        (pac_bayes.mcallester, pac),
        (pac_bayes.maurer, pac),
        (pac_bayes.catoni, pac),
        (pac_bayes.alquier, {**pac, "subgaussian_scale": 1.0}),
        (pac_bayes.semi_analytic, {**semi, "delta": 0.05}),
        (pac_bayes.optimal_sigma, semi),
        (pac_bayes.chain_of_thought_parity, parity),
        (pac_bayes.one_pass_parity, parity),
        (pac_bayes.kl_bernoulli, {"q": 0.1, "p": 0.2}),
        (pac_bayes.kl_inverse, {"q": 0.1, "c": 0.2}),
        (pac_bayes.construction_norm_bound, {"omega": 2, "D_f": 2, "T": 4}),
        (covering.lemma_3_3_log_cover, cover),
        (covering.lemma_3_4_log_cover, cover),
        (covering.lemma_3_6_log_cover, cover),
        (covering.edelman_lemma_4_6_log_cover, {"B_x": 1.0, "B_w": 1.0, "d": 3, "num_examples": 9}),
        (covering.budget_optimisation, {"C": [1.0, 2.0], "beta": [1.0, 1.0]}),
        (covering.dudley_rademacher, {"C": 1.0, "radius": 1.0, "num_examples": 10}),
        (covering.rademacher_to_gap, {"rademacher": 0.1, "num_examples": 10, "delta": 0.05}),
        (edelman.single_head_log_cover, {**head, "d": 2, "num_examples": 10, "seq_len": 4}),
        (trauger_tewari.theorem_4_1, {**{k: v for k, v in tt41.items() if k != "B_WQK"}, "C": 1.0}),
        (trauger_tewari.corollary_4_1_1, tt41),
        (trauger_tewari.corollary_d_0_1, tt41),
        (trauger_tewari.corollary_d_0_2, tt41),
        (trauger_tewari.corollary_4_2_1, {"B": 1.0, "B_x": 1.0, "d": 2, "k": 2, **tt42_norms}),
        (trauger_tewari.multi_layer_log_cover, tt42),
        (trauger_tewari.masked_word_rademacher, {"scalar_rademacher": 0.01, "vocab_size": 10}),
        (shallow_gd.lemma_1, {**etas, "num_examples": 10, "d_s": 2, "d_m": 4, "R_X": 1.0}),
        (shallow_gd.lemma_4, lemma4),
    ]


@pytest.mark.parametrize(("fn", "kwargs"), _calculators(), ids=lambda x: getattr(x, "__name__", ""))
def test_every_calculator_refuses_a_string_naming_the_argument(fn, kwargs):
    """Issue 26: ``pac_bayes.mcallester(kl='5')`` was accepted as 5. Every numeric argument of
    every calculator now refuses a string (and None), naming itself; the valid call works."""
    fn(**kwargs)
    for name, good in kwargs.items():
        if name == "num_layers":  # a static Python int option (int_option)
            bad = {**kwargs, name: "2"}
            with pytest.raises(ValueError, match=f"^{name}: expected an int"):
                fn(**bad)
            continue
        text = str(good) if np.ndim(good) == 0 else [str(g) for g in good]
        for bad_value in (text, None):
            with pytest.raises(ValueError, match=f"^{name}: expected a real number"):
                fn(**{**kwargs, name: bad_value})
