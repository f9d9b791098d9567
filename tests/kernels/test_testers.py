"""Degree and sparsity testers: exact functions accepted, far ones rejected at the exact rate.

The black-box function is a table lookup; the tables are passed as traced arguments to jitted
wrappers so that one compilation serves every function of a given configuration.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import testers
from kernels.walsh import fwht

N = 6
WEIGHTS = 2 ** jnp.arange(N, dtype=jnp.int32)
KEYS = jax.random.split(jax.random.key(0), 400)
BIG_KEYS = jax.random.split(jax.random.key(1), 8000)


def _table_fn(values):
    return lambda x: values[jnp.sum(x * WEIGHTS)]


@functools.partial(jax.jit, static_argnames=("degree", "num_trials", "chunk_size"))
def _ldt(values, key, degree, num_trials, chunk_size=None):
    return testers.low_degree_test(
        _table_fn(values), N, key, degree=degree, num_trials=num_trials, chunk_size=chunk_size
    )


@functools.partial(jax.jit, static_argnames=("degree", "num_trials"))
def _ldt_many(values, keys, degree, num_trials):
    return jax.vmap(lambda k: _ldt(values, k, degree, num_trials))(keys)


_rate = jax.jit(testers.degree_rejection_rate, static_argnames=("degree",))


@functools.partial(jax.jit, static_argnames=("sparsity", "num_restrict", "num_trials"))
def _st_many(values, keys, sparsity, num_restrict, num_trials):
    fn = _table_fn(values)
    return jax.vmap(
        lambda k: testers.sparsity_test(
            fn, N, k, sparsity=sparsity, num_restrict=num_restrict, num_trials=num_trials
        )
    )(keys)


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
        assert bool(jnp.all(_ldt_many(values, BIG_KEYS, d, 1)))  # 8000 trials at each degree
        assert float(_rate(values, degree=d)) == 0.0
    assert float(_rate(values, degree=N - 1)) == 0.0


@pytest.mark.parametrize(("k", "d"), [(3, 1), (3, 2), (4, 2), (6, 1)])
def test_far_functions_rejected_at_the_exact_rate(k, d):
    values = _random_degree(10 + k, k)
    exact = float(_rate(values, degree=d))
    # the theory's lower bound: C(k, d+1)/C(n, d+1) * 2^{-(k-d-1)}
    lower = math.comb(k, d + 1) / math.comb(N, d + 1) * 2.0 ** (-(k - d - 1))
    assert exact >= lower - 1e-12
    acc = np.asarray(_ldt_many(values, BIG_KEYS, d, 1), dtype=bool)  # one trial per key
    rej = 1.0 - acc.astype(float)
    se = math.sqrt(exact * (1 - exact) / rej.size)
    assert abs(rej.mean() - exact) <= 5 * se + 1e-12
    # amplified: t = num_trials_for(exact, delta) independent trials accept with prob <= delta
    t = testers.num_trials_for(exact, 0.05)
    groups = acc[: (acc.size // t) * t].reshape(-1, t).all(axis=1)
    assert groups.size >= 200
    assert groups.mean() <= 0.05 + 5 * math.sqrt(0.05 * 0.95 / groups.size)


def test_parity_has_fourier_degree_n_not_gf2_degree_1():
    """PARITY of n bits has GF(2) degree 1; the coordinate-direction test sees Fourier degree n."""
    parity = lambda x: jnp.sum(x) % 2  # noqa: E731  (integer outputs are accepted)
    table = jnp.asarray([bin(x).count("1") % 2 for x in range(2**N)], dtype=jnp.int32)
    for d in range(N):
        assert float(_rate(table, degree=d)) == 1.0
    assert not bool(testers.low_degree_test(parity, N, jax.random.key(1), degree=1, num_trials=1))


def test_degree_sweep_finds_the_degree():
    sweep = jax.jit(
        lambda v, key: testers.degree_sweep(
            _table_fn(v), N, key, max_degree=N - 1, eps=0.05, delta=0.01
        )
    )
    for k in (1, 2, 4):
        assert int(sweep(_random_degree(20 + k, k), jax.random.key(k))) == k


def test_chunking_does_not_change_the_result():
    coef = np.zeros(2**N)
    coef[[0, 1, 3, 7]] = [0.3, 1.0, -0.5, 0.8]  # one degree-3 set {0,1,2}: rate 1/C(6,3) at d=2
    values = _values_from_coefficients(coef)
    assert float(_rate(values, degree=2)) == pytest.approx(1 / 20)
    keys = KEYS[:50]
    ref = _ldt_many(values, keys, 2, 8)
    chunked = jax.vmap(lambda k: _ldt(values, k, 2, 8, chunk_size=3))(keys)
    np.testing.assert_array_equal(ref, chunked)
    assert 0 < int(jnp.sum(ref)) < 50  # both outcomes occur, so the comparison has teeth


def test_eager_matches_jit():
    values = _random_degree(4, 3)
    fn = _table_fn(values)
    for i in range(3):
        key = KEYS[i]
        eager = testers.low_degree_test(fn, N, key, degree=2, num_trials=2)
        assert bool(eager) == bool(_ldt(values, key, 2, 2))


def test_bad_arguments():
    fn = _table_fn(_random_degree(0, 1))
    with pytest.raises(ValueError, match="degree"):
        testers.low_degree_test(fn, N, jax.random.key(0), degree=N, num_trials=1)
    with pytest.raises(ValueError, match="num_trials"):
        testers.low_degree_test(fn, N, jax.random.key(0), degree=1, num_trials=0)
    with pytest.raises(ValueError, match="num_restrict"):
        testers.sparsity_test(
            fn, N, jax.random.key(0), sparsity=1, num_restrict=N + 1, num_trials=1
        )
    with pytest.raises(ValueError, match="eps"):
        testers.num_trials_for(0.0, 0.1)


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
    assert bool(jnp.all(_st_many(values, KEYS[:100], s, r, 2)))
    assert _exact_sparsity_rejection(values, s, r) == 0.0


def test_non_sparse_rejected_at_the_exact_rate():
    """f = chi_0 + 0.7 chi_1 + 0.4 chi_2 is 3-sparse; tested at s = 2 with r = 2 a trial rejects
    iff J holds two of {0, 1, 2} (otherwise two characters collapse): rate C(3,2)/C(6,2) = 0.2."""
    coef = np.zeros(2**N)
    coef[[1, 2, 4]] = [1.0, 0.7, 0.4]
    values = _values_from_coefficients(coef)
    exact = _exact_sparsity_rejection(values, 2, 2)
    assert exact == pytest.approx(0.2)
    rej = 1.0 - np.asarray(_st_many(values, KEYS, 2, 2, 1), dtype=float)
    se = math.sqrt(exact * (1 - exact) / rej.size)
    assert abs(rej.mean() - exact) <= 5 * se


def test_sparsity_sweep_full_restriction_is_exact():
    sweep = jax.jit(
        lambda v, key: testers.sparsity_sweep(
            _table_fn(v), N, key, sparsities=(1, 7, 14, 20), num_restrict=N, num_trials=1
        )
    )
    for s in (1, 7, 14, 20):
        assert int(sweep(_sparse(30 + s, s), jax.random.key(s))) == s
    assert int(sweep(_sparse(99, 30), jax.random.key(0))) == -1
