"""bench/curvature.py's kernel ratios: each kernel call over the gradient timed beside it."""

import jax.numpy as jnp
import pytest

from bench import curvature


def test_each_kernel_call_follows_its_own_gradient_timings(monkeypatch):
    calls = []

    def program(name):
        def run(params, batch, key):
            calls.append(name)
            return jnp.zeros(())

        return run

    compiled = {name: program(name) for name in ("grad", "a", "b")}
    times, grads = curvature.paired_times(
        compiled, (None, None), curvature.jax.random.key(0), reps=2
    )
    unit = ["grad"] * curvature.GRAD_CALLS
    assert calls == [*unit, "a", *unit, "b"] * 2
    assert set(times) == set(grads) == {"a", "b"}
    assert all(len(v) == 2 for v in (*times.values(), *grads.values()))


def test_the_ratio_is_the_median_of_the_paired_ratios():
    # Rounds where the machine slowed kernel and gradient alike give the same ratio; dividing
    # the kernels' median by the gradients' median would not: (4 + 8 + 30) vs (1 + 1 + 3).
    times, grads = [4.0, 8.0, 30.0], [1.0, 2.0, 3.0]
    assert curvature.paired_ratio(times, grads, units=2) == pytest.approx(2.0)
    assert curvature.paired_ratio([3.0], [0.5], units=3) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="shorter"):
        curvature.paired_ratio([1.0, 2.0], [1.0], units=1)
