"""The shared argument checks: what a kernel says for inputs it cannot use."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels


class _Model:
    """Stands for a model object passed whole (an equinox module, a flax module)."""


def _quadratic(params, batch):
    del batch
    return jnp.sum(params["w"] ** 2)


_BAD_LEAVES = [("relu", jax.nn.relu), ("model", _Model()), ("text", "relu")]


@pytest.mark.parametrize(("what", "leaf"), _BAD_LEAVES, ids=[w for w, _ in _BAD_LEAVES])
@pytest.mark.parametrize("kernel", ["hessian_trace", "average_sharpness", "hutchinson_like"])
def test_non_array_leaves_are_refused_naming_the_argument(kernel, what, leaf):
    params = {"w": jnp.ones(3), "extra": leaf}
    key = jax.random.key(0)
    calls = {
        "hessian_trace": lambda: kernels.hessian_trace(_quadratic, params, (), key, num_matvecs=2),
        "average_sharpness": lambda: kernels.average_sharpness(
            _quadratic, params, (), key, perturbation=kernels.Perturbation("gaussian", 0.1),
            num_samples=2,
        ),
        "hutchinson_like": lambda: kernels.hutchinson_trace(
            lambda v: v, params, key, num_probes=2
        ),
    }
    name = "like" if kernel == "hutchinson_like" else "params"
    with pytest.raises(ValueError, match=rf"^{name}: leaf \['extra'\] is a .*eqx\.partition"):
        calls[kernel]()


def test_rademacher_refuses_non_array_parameters():
    inputs = jnp.ones((4, 2))
    with pytest.raises(ValueError, match=r"^params: leaf \['act'\] is a str"):
        kernels.search_sup(
            lambda p, x: x @ p["w"], {"w": jnp.ones(2), "act": "relu"}, inputs,
            jax.random.key(0), project=lambda p: p, num_steps=1, step_size=0.1,
        )


def test_numbers_and_arrays_are_accepted():
    kernels._checks.check_array_leaves({"a": 1.0, "b": np.ones(2), "c": jnp.ones(2), "d": 3}, "x")
