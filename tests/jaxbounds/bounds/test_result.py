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
    with pytest.raises(ValueError, match="B_w: expected a number"):
        Inputs(True).nonneg("B_w", "big")
    with pytest.raises(TypeError, match="B_w: bounds are computed eagerly in float64"):
        jax.jit(lambda x: Inputs(True).nonneg("B_w", x))(1.0)
    with pytest.raises(ValueError, match="strict: expected a bool"):
        Inputs(1)


def test_int_option():
    assert int_option("num_layers", 3) == 3
    for bad in (0, 2.0, True, "2"):
        with pytest.raises(ValueError, match="num_layers: expected an int >= 1"):
            int_option("num_layers", bad)
