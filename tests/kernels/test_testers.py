"""Degree and sparsity testers: exact functions accepted, far ones rejected at the exact rate.

The black-box function is a table lookup ``table_fn(x, table)``; the table travels as the
testers' ``args``, so one compilation serves every table of a given configuration.
"""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import testers
from kernels._checks import runtime_checks
from kernels.walsh import fwht
from tests.helpers import TraceCounter, compiles_in, count_compiles

N = 6
WEIGHTS = 2 ** jnp.arange(N, dtype=jnp.int32)


def table_fn(x, table):
    """f(x) = table[index of x] (little-endian bits)."""
    return table[jnp.sum(x * WEIGHTS)]


def trial_keys(seed, num):
    return jax.random.split(jax.random.key(seed), num)


@functools.partial(jax.jit, static_argnames=("degree", "num_trials", "chunk_size"))
def _ldt(values, key, degree, num_trials, chunk_size=None):
    return testers.low_degree_test(
        table_fn, N, key, degree=degree, num_trials=num_trials, chunk_size=chunk_size,
        args=values,
    ).accepted  # fmt: skip


@functools.partial(jax.jit, static_argnames=("degree", "num_trials"))
def _ldt_many(values, keys, degree, num_trials):
    return jax.vmap(lambda k: _ldt(values, k, degree, num_trials))(keys)


_rate = jax.jit(testers.degree_rejection_rate, static_argnames=("degree",))


@functools.partial(jax.jit, static_argnames=("sparsity", "num_restrict", "num_trials"))
def _st_many(values, keys, sparsity, num_restrict, num_trials):
    return jax.vmap(
        lambda k: testers.sparsity_test(
            table_fn, N, k, sparsity=sparsity, num_restrict=num_restrict, num_trials=num_trials,
            args=values,
        ).accepted
    )(keys)  # fmt: skip


def _values_from_coefficients(coef):
    return fwht(jnp.asarray(coef, dtype=jnp.float64))  # f(x) = sum_S c_S (-1)^{|S & x|}


def _random_degree(seed, k, n=N):
    """Random coefficients on every set of size <= k (so the degree is exactly k)."""
    rng = np.random.default_rng(seed)
    coef = np.zeros(2**n)
    for S in range(2**n):
        if bin(S).count("1") <= k:
            coef[S] = rng.normal()
    return _values_from_coefficients(coef)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_exact_degree_functions_always_accepted(k):
    values = _random_degree(k, k)
    for d in (k, k + 1):
        assert bool(jnp.all(_ldt_many(values, trial_keys(1, 8000), d, 1)))  # 8000 trials each
        assert float(_rate(values, degree=d)) == 0.0
    assert float(_rate(values, degree=N - 1)) == 0.0


@pytest.mark.parametrize(("k", "d"), [(3, 1), (3, 2), (4, 2), (6, 1)])
def test_far_functions_rejected_at_the_exact_rate(k, d):
    values = _random_degree(10 + k, k)
    exact = float(_rate(values, degree=d))
    # the theory's lower bound: C(k, d+1)/C(n, d+1) * 2^{-(k-d-1)}
    lower = math.comb(k, d + 1) / math.comb(N, d + 1) * 2.0 ** (-(k - d - 1))
    assert exact >= lower - 1e-12
    acc = np.asarray(_ldt_many(values, trial_keys(1, 8000), d, 1), dtype=bool)  # one trial/key
    rej = 1.0 - acc.astype(float)
    se = math.sqrt(exact * (1 - exact) / rej.size)
    assert abs(rej.mean() - exact) <= 5 * se + 1e-12
    # amplified: t = num_trials_for(exact, delta) independent trials accept with prob <= delta
    t = testers.num_trials_for(exact, 0.05)
    groups = acc[: (acc.size // t) * t].reshape(-1, t).all(axis=1)
    assert groups.size >= 200
    assert groups.mean() <= 0.05 + 5 * math.sqrt(0.05 * 0.95 / groups.size)


def test_rejection_rate_estimate_matches_the_exact_rate():
    coef = np.zeros(2**N)
    coef[[0, 1, 3, 7, 11]] = [0.3, 1.0, -0.5, 0.8, 0.6]  # two degree-3 sets: 0 < rate < 1
    values = _values_from_coefficients(coef)
    exact = float(_rate(values, degree=2))
    assert 0.05 < exact < 0.5
    out = testers.low_degree_test(
        table_fn, N, jax.random.key(2), degree=2, num_trials=4000, chunk_size=500, args=values
    )
    assert not bool(out.accepted)
    est = out.rejection_rate
    assert est.num_samples == 4000
    assert est.num_evaluations == 4000 * 2**3
    closed_se = math.sqrt(exact * (1 - exact) / 4000)
    assert abs(float(est.mean) - exact) <= 5 * closed_se
    assert abs(float(est.stderr) / closed_se - 1) <= 0.2


def test_parity_has_fourier_degree_n_not_gf2_degree_1():
    """PARITY of n bits has GF(2) degree 1; the coordinate-direction test sees Fourier degree n."""
    parity = lambda x: jnp.sum(x) % 2  # noqa: E731  (integer outputs are accepted)
    table = jnp.asarray([bin(x).count("1") % 2 for x in range(2**N)], dtype=jnp.int32)
    for d in range(N):
        assert float(_rate(table, degree=d)) == 1.0
    out = testers.low_degree_test(parity, N, jax.random.key(1), degree=1, num_trials=1)
    assert not bool(out.accepted)


def test_degree_sweep_finds_the_degree():
    sweep = jax.jit(
        lambda v, key: testers.degree_sweep(
            table_fn, N, key, max_degree=N - 1, eps=0.05, delta=0.01, args=v
        )
    )
    for k in (1, 2, 4):
        out = sweep(_random_degree(20 + k, k), jax.random.key(k))
        assert int(out.value) == k
        assert out.candidates == tuple(range(N))
        assert out.accepted.tolist()[k - 1 :] == [False] + [True] * (N - k)
        assert out.rejection_rates.mean.shape == (N,)
        assert float(out.rejection_rates.mean[k]) == 0.0


@pytest.mark.slow
def test_chunking_does_not_change_the_result():
    coef = np.zeros(2**N)
    coef[[0, 1, 3, 7]] = [0.3, 1.0, -0.5, 0.8]  # one degree-3 set {0,1,2}: rate 1/C(6,3) at d=2
    values = _values_from_coefficients(coef)
    assert float(_rate(values, degree=2)) == pytest.approx(1 / 20)
    keys = trial_keys(0, 50)
    ref = _ldt_many(values, keys, 2, 8)
    for chunk in (3, 8):
        chunked = jax.vmap(lambda k, chunk=chunk: _ldt(values, k, 2, 8, chunk_size=chunk))(keys)
        np.testing.assert_array_equal(ref, chunked)
    assert 0 < int(jnp.sum(ref)) < 50  # both outcomes occur, so the comparison has teeth
    one = testers.low_degree_test(table_fn, N, keys[0], degree=2, num_trials=40, args=values)
    many = testers.low_degree_test(
        table_fn, N, keys[0], degree=2, num_trials=40, chunk_size=7, args=values
    )
    assert float(one.rejection_rate.mean) == float(many.rejection_rate.mean)


def test_eager_matches_jit():
    values = _random_degree(4, 3)
    keys = trial_keys(0, 3)
    for key in keys:
        eager = testers.low_degree_test(table_fn, N, key, degree=2, num_trials=2, args=values)
        assert bool(eager.accepted) == bool(_ldt(values, key, 2, 2))


@pytest.mark.parametrize("kind", ["degree", "sparsity"])
def test_second_call_with_new_table_compiles_nothing(kind):
    fn = TraceCounter(table_fn)
    if kind == "degree":
        call = functools.partial(testers.low_degree_test, fn, N, degree=2, num_trials=5)
    else:
        call = functools.partial(testers.sparsity_test, fn, N, sparsity=3, num_restrict=3,
                                 num_trials=5)  # fmt: skip
    call(jax.random.key(0), args=_random_degree(1, 2))
    traces = fn.count
    assert traces <= 2  # one trace for the output shape, one in the program
    new_table, new_key = _random_degree(2, 3), jax.random.key(1)
    with count_compiles() as log:
        call(new_key, args=new_table)
    assert compiles_in(log) == []
    assert fn.count == traces


def test_sweeps_compile_once():
    fn = TraceCounter(table_fn)
    sweep = functools.partial(testers.degree_sweep, fn, N, max_degree=2, eps=0.2, delta=0.1)
    sweep(jax.random.key(0), args=_random_degree(1, 1))
    traces = fn.count
    with count_compiles() as log:
        sweep(jax.random.key(1), args=_random_degree(2, 2))
    assert compiles_in(log) == []
    assert fn.count == traces


def nan_table(values):
    return values.at[5].set(jnp.nan)


@pytest.mark.parametrize("kind", ["degree", "sparsity"])
def test_nonfinite_outputs_raise_eagerly_and_under_jit(kind):
    def call(values, key):
        if kind == "degree":
            return testers.low_degree_test(table_fn, N, key, degree=1, num_trials=30, args=values)
        return testers.sparsity_test(
            table_fn, N, key, sparsity=2, num_restrict=N, num_trials=30, args=values
        )

    values = nan_table(_random_degree(3, 1))
    with pytest.raises(ValueError, match=r"^fn: returned NaN or inf in \d+ of the 30 trials"):
        call(values, jax.random.key(0))
    jitted = jax.jit(lambda v, k: call(v, k).accepted)
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: fn: returned"):
        jax.block_until_ready(jitted(values, jax.random.key(0)))
    batched = jax.jit(jax.vmap(lambda k: call(values, k).accepted))
    with pytest.raises(jax.errors.JaxRuntimeError, match="kernels check failed: fn: returned"):
        jax.block_until_ready(batched(trial_keys(0, 4)))
    with runtime_checks(False):  # switched off: a NaN never reads as an acceptance
        out = call(values, jax.random.key(0))
        assert not bool(out.accepted)
        assert np.isnan(float(out.rejection_rate.mean))


def test_results_are_frozen_registered_dataclasses():
    out = testers.low_degree_test(
        table_fn, N, jax.random.key(0), degree=1, num_trials=3, args=_random_degree(0, 1)
    )
    assert isinstance(out, testers.Verdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.accepted = True  # type: ignore[misc]
    assert len(jax.tree_util.tree_leaves(out)) == 3  # accepted, rate mean, rate stderr
    sweep = testers.sparsity_sweep(
        table_fn, N, jax.random.key(0), sparsities=[1, 2], num_restrict=2, num_trials=2,
        args=_random_degree(0, 0),
    )  # fmt: skip
    assert isinstance(sweep, testers.Sweep)
    assert sweep.candidates == (1, 2)
    assert int(sweep.value) == 1  # a constant is 1-sparse


def test_bad_arguments():
    values = _random_degree(0, 1)
    key = jax.random.key(0)
    ldt = functools.partial(testers.low_degree_test, table_fn, N, args=values)
    with pytest.raises(ValueError, match=r"^degree"):
        ldt(key, degree=N, num_trials=1)
    with pytest.raises(ValueError, match=r"^num_trials"):
        ldt(key, degree=1, num_trials=0)
    with pytest.raises(ValueError, match=r"^rtol"):
        ldt(key, degree=1, num_trials=1, rtol=-1.0)
    with pytest.raises(ValueError, match=r"^key"):
        ldt(0, degree=1, num_trials=1)
    with pytest.raises(ValueError, match=r"^chunk_size"):
        ldt(key, degree=1, num_trials=2, chunk_size=0)
    with pytest.raises(ValueError, match=r"^fn: must return a real scalar"):
        testers.low_degree_test(lambda x: x.astype(jnp.float64), N, key, degree=1, num_trials=1)
    with pytest.raises(ValueError, match=r"^num_restrict"):
        testers.sparsity_test(
            table_fn, N, key, sparsity=1, num_restrict=N + 1, num_trials=1, args=values
        )
    with pytest.raises(ValueError, match=r"^eps"):
        testers.sparsity_test(
            table_fn, N, key, sparsity=1, num_restrict=2, num_trials=1, eps=0.0, args=values
        )
    with pytest.raises(ValueError, match=r"^sparsities"):
        testers.sparsity_sweep(
            table_fn, N, key, sparsities=(3, 2), num_restrict=2, num_trials=1, args=values
        )
    with pytest.raises(ValueError, match=r"^max_degree"):
        testers.degree_sweep(table_fn, N, key, max_degree=N, eps=0.1, delta=0.1, args=values)
    with pytest.raises(ValueError, match=r"^eps"):
        testers.num_trials_for(0.0, 0.1)
    with pytest.raises(ValueError, match=r"^values: last axis"):
        testers.degree_rejection_rate(jnp.ones(6), degree=1)
    with pytest.raises(ValueError, match=r"^values: expected finite"):
        testers.degree_rejection_rate(jnp.ones(8).at[2].set(jnp.nan), degree=1)


# ------------------------------------------------------------------------ sparsity


def _sparse(seed, s, n=N):
    rng = np.random.default_rng(seed)
    coef = np.zeros(2**n)
    coef[rng.choice(2**n, size=s, replace=False)] = rng.normal(size=s)
    return _values_from_coefficients(coef)


def _hadamard(r):
    i = np.arange(2**r)
    return (-1.0) ** np.vectorize(lambda a: bin(a).count("1"))(i[:, None] & i[None, :])


def _exact_sparsity_rejection(values, s, r, eps=1e-6, n=N):
    """Exact per-trial rejection probability: average over all r-sets J and all base points x."""
    values = np.asarray(values)
    H = _hadamard(r)
    rates = []
    for J in itertools.combinations(range(n), r):
        offs = np.array([sum(1 << J[i] for i in range(r) if (y >> i) & 1) for y in range(2**r)])
        base = np.arange(2**n) & ~sum(1 << j for j in J)
        c = np.sort(((values[base[:, None] | offs[None, :]]) @ H) ** 2, axis=1)[:, ::-1]
        rates.append(np.mean(c.sum(1) - c[:, :s].sum(1) > eps * c.sum(1)))
    return float(np.mean(rates))


@pytest.mark.parametrize(("s", "r"), [(1, 2), (3, 4), (7, N)])
def test_sparse_functions_always_accepted(s, r):
    values = _sparse(s, s)
    assert bool(jnp.all(_st_many(values, trial_keys(0, 100), s, r, 2)))
    assert _exact_sparsity_rejection(values, s, r) == 0.0


def test_non_sparse_rejected_at_the_exact_rate():
    """f = chi_0 + 0.7 chi_1 + 0.4 chi_2 is 3-sparse; tested at s = 2 with r = 2 a trial rejects
    iff J holds two of {0, 1, 2} (otherwise two characters collapse): rate C(3,2)/C(6,2) = 0.2."""
    coef = np.zeros(2**N)
    coef[[1, 2, 4]] = [1.0, 0.7, 0.4]
    values = _values_from_coefficients(coef)
    exact = _exact_sparsity_rejection(values, 2, 2)
    assert exact == pytest.approx(0.2)
    rej = 1.0 - np.asarray(_st_many(values, trial_keys(0, 400), 2, 2, 1), dtype=float)
    se = math.sqrt(exact * (1 - exact) / rej.size)
    assert abs(rej.mean() - exact) <= 5 * se


def test_sparsity_sweep_full_restriction_is_exact():
    sweep = jax.jit(
        lambda v, key: (
            testers.sparsity_sweep(
                table_fn, N, key, sparsities=(1, 7, 14, 20), num_restrict=N, num_trials=1, args=v
            ).value
        )
    )
    for s in (1, 7, 14, 20):
        assert int(sweep(_sparse(30 + s, s), jax.random.key(s))) == s
    assert int(sweep(_sparse(99, 30), jax.random.key(0))) == -1


def test_num_trials_for_tiny_eps_and_delta():
    """eps <= 1e-9 asks for more than 2**31 trials: the exact count (the trial counts are exact
    up to 2**53); delta down to the smallest subnormal stays finite; past 2**53 is refused."""
    assert testers.num_trials_for(1e-9, 0.1) == math.ceil(math.log(10) / 1e-9) > 2**31
    assert testers.num_trials_for(0.5, 5e-324) == math.ceil(-math.log(5e-324) / 0.5)
    with pytest.raises(ValueError, match=r"^eps: .* more than 2\*\*53"):
        testers.num_trials_for(1e-20, 0.1)
    for bad in ("0.1", None, float("nan")):
        with pytest.raises(ValueError, match=r"^eps"):
            testers.num_trials_for(bad, 0.1)
    with pytest.raises(ValueError, match=r"^num_trials: at most 2\*\*53"):
        testers.low_degree_test(lambda x: jnp.sum(x), 4, jax.random.key(0), degree=1,
                                num_trials=2**53 + 1)  # fmt: skip
