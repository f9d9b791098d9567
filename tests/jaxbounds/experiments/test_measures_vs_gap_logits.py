"""Adaptive sharpness's logit normalisation in ``measures-vs-gap`` (SPEC section 8).

Andriushchenko et al. normalise the logits before the loss: per example for class logits (as
their code), by the batch's root mean square for this study's scalar logits. Checked here on hand
cases, and by the invariance it buys: a model whose readout is scaled by c > 0 has the same
adaptive sharpness (average and worst case) as the unscaled one, to float64 rounding, while the
unnormalised measure changes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from jaxbounds.experiments import measures_vs_gap as mvg
from jaxbounds.experiments.measures_vs_gap import programs, training


def test_scalar_logits_are_divided_by_their_rms_over_the_batch():
    z = jnp.array([1.0, -2.0, 2.0], jnp.float64)
    rms = math.sqrt((1.0 + 4.0 + 4.0) / 3.0)
    want = [math.sqrt(2.0) * v / rms for v in (1.0, -2.0, 2.0)]
    np.testing.assert_allclose(training.normalize_logits(z), want, rtol=1e-15)
    # every |z_i| equal: their two-class normalisation of (-z/2, z/2), i.e. sqrt(2) sign(z)
    r2 = math.sqrt(2.0)
    got = training.normalize_logits(jnp.array([-0.3, 0.3, 0.3]))
    np.testing.assert_allclose(got, [-r2, r2, r2], rtol=1e-15)
    # all zero: the floor keeps them zero (no NaN)
    np.testing.assert_array_equal(training.normalize_logits(jnp.zeros(4)), np.zeros(4))


def test_class_logits_are_centred_and_normalised_per_example():
    z = jnp.array([[0.0, 3.0, 6.0], [2.0, 2.0, 2.0], [1.0, 0.0, -1.0]])
    h = 1.0 / math.sqrt(2.0)
    want = [[-h, 0.0, h], [0.0, 0.0, 0.0], [h, 0.0, -h]]
    np.testing.assert_allclose(training.normalize_logits(z), want, rtol=1e-15, atol=1e-300)
    with pytest.raises(ValueError, match="scores"):
        training.normalize_logits(jnp.ones((2, 1)))


def test_the_normalised_loss_on_a_hand_case():
    """Logistic loss of sqrt(2) z / rms(z) with labels (1, 1, 0), written out."""
    fns = training._fns(mvg.MNIST, None, None)
    params = {"W_Q": jnp.eye(2), "W_K": jnp.eye(2), "W_V": jnp.eye(2), "w_O": jnp.ones(2)}
    x = jnp.zeros((3, 1, 2))  # one token of zeros: relu(0) features, every score 0
    batch = {"x": x, "y": jnp.array([1, 1, 0], jnp.int32)}
    assert float(fns.normalized_loss(params, batch)) == pytest.approx(math.log(2.0), rel=1e-15)
    scores = jnp.array([1.0, -2.0, 2.0])
    signs = np.array([1.0, 1.0, -1.0])
    margins = signs * math.sqrt(2.0) * np.array([1.0, -2.0, 2.0]) / math.sqrt(3.0)
    want = np.mean([math.log1p(math.exp(-m)) for m in margins])
    loss = training._normalized_loss_of(lambda p, x: p * x)
    got = loss(jnp.asarray(1.0), {"x": scores, "y": batch["y"]})
    assert float(got) == pytest.approx(want, rel=1e-14)
    assert float(loss(jnp.asarray(7.5), {"x": scores, "y": batch["y"]})) == pytest.approx(
        want, rel=1e-14)  # fmt: skip


def _family_model(family: str):
    """A smoke unit of ``family``: its config, float64 initial weights and measure set."""
    unit = next(u for u in mvg.plan_units(mvg.SCALES["smoke"], [0])
                if u.config["family"] == family)  # fmt: skip
    cfg = unit.config
    train, _ = training._unit_data(cfg, unit.seed)
    m = mvg.measure_size(cfg)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64),
                                    training._init(cfg, unit.seed))  # fmt: skip
    meas = {"x": jnp.asarray(train["x"][:m], jnp.float64), "y": jnp.asarray(train["y"][:m])}
    return cfg, params, meas


def _scaled_readout(family: str, params, c: float):
    readout = "w" if family == mvg.SPARSE else "w_O"
    return {**params, readout: params[readout] * c}


@pytest.mark.parametrize("family", [mvg.SPARSE, mvg.MNIST])
def test_adaptive_sharpness_is_invariant_to_scaling_the_readout(family):
    cfg, params, meas = _family_model(family)
    fns = training._family_fns(cfg)
    items = tuple((k, programs._freeze(cfg[k])) for k in programs._PROGRAM_KEYS)
    sigma = cfg["adaptive_sigmas"][0]
    names = ["worst_adaptive_linf", "worst_adaptive_l2"]
    with kernels.runtime_checks(False):
        fn = {n: jax.jit(programs._lane_program(n, fns, items)) for n in names}
        avg = jax.jit(programs._lane_program(f"adaptive_sharpness_{sigma:g}", fns, items))

        def measures(p):
            out = {n: fn[n](p, meas, programs._key(0, n))["mean"] for n in names}
            out["average"] = avg(p, meas, programs._key(0, "avg"), jnp.float64(sigma))["mean"]
            out["loss"] = fns.normalized_loss(p, meas)
            return {k: float(v) for k, v in out.items()}

        base = measures(params)
        for c in (3.0, 0.25):
            scaled = measures(_scaled_readout(family, params, c))
            for k, v in base.items():
                assert scaled[k] == pytest.approx(v, rel=1e-9, abs=1e-13), (c, k)
        assert all(abs(v) > 1e-4 for v in base.values()), base  # not trivially equal
        # without the normalisation the same measure changes with c: the test can fail
        plain = kernels.average_sharpness(
            fns.loss, params, meas, programs._key(0, "avg"),
            perturbation=kernels.Perturbation("gaussian", jnp.float64(sigma), adaptive=True),
            num_samples=cfg["sharpness_pairs"]).mean  # fmt: skip
        plain3 = kernels.average_sharpness(
            fns.loss, _scaled_readout(family, params, 3.0), meas, programs._key(0, "avg"),
            perturbation=kernels.Perturbation("gaussian", jnp.float64(sigma), adaptive=True),
            num_samples=cfg["sharpness_pairs"]).mean  # fmt: skip
        assert abs(float(plain3) - float(plain)) > 1e-3 * abs(float(plain))
