r"""Property testers for black-box $f: \{0,1\}^n \to \mathbb R$: Fourier degree and sparsity.

**Degree** (after Alon, Kaufman, Krivelevich, Litsyn & Ron 2003). One trial draws a base point
$x$ and $d+1$ *distinct coordinates* $D = \{i_0..i_d\}$, queries the $2^{d+1}$ vertices
$x \oplus e_S$, $S \subseteq D$, and rejects when the alternating sum
$$\Delta_D f(x) = \sum_{S\subseteq D}(-1)^{|S|} f(x\oplus e_S)
  = 2^{d+1}\sum_{A\supseteq D}\hat f(A)\chi_A(x)$$
is non-zero. With arbitrary F2 directions the same test would measure degree over GF(2)
(PARITY of n bits has GF(2) degree 1 but Fourier degree n); coordinate directions make it test
the real Fourier degree: $\Delta_D f \equiv 0$ for every D iff $\deg f \le d$. So a function of
degree <= d is always accepted (up to the rounding tolerance), and a function of degree k > d is
rejected by one trial with probability
$$\rho_d(f) = \Pr_{x,D}[\Delta_D f(x) \ne 0]
  \;\ge\; \binom{k}{d+1}\Big/\binom{n}{d+1}\cdot 2^{-(k-d-1)}$$
(choose D inside a top-degree set A; $\Delta_D f = 2^{d+1}\chi_D h$ with $h \ne 0$ of degree
<= k-d-1, non-zero on >= $2^{-(k-d-1)}$ of the cube).

**Sparsity** (after Gopalan, O'Donnell, Servedio, Shpilka & Wimmer 2011, simplified as in
SPEC.md section 5). One trial restricts f to r random coordinates (the others fixed at a random
point), takes the full Walsh-Hadamard transform of the $2^r$ restricted values and rejects when
the energy outside the s largest coefficients exceeds ``eps`` times the total. Restrictions of an
s-sparse function are s-sparse, so s-sparse functions are always accepted.

Both testers run ``num_trials`` independent trials (trial ``i`` gets the key
``jax.random.fold_in(key, i)``; :func:`kernels.parallel.sample_statistics` runs them
``chunk_size`` at a time over ``jax.devices()``, so neither the chunk size nor the device count
changes the result) and accept iff every trial accepts. They return a :class:`Verdict`: the
decision and the observed per-trial rejection rate with its standard error. If one trial
rejects f with probability >= ``eps``, then ``num_trials >= ln(1/delta)/eps`` trials reject it
with probability >= 1 - delta; :func:`num_trials_for` gives that count.

The black box is ``fn(x)``, or ``fn(x, args)`` when ``args`` is given: pass the function's data
(a lookup table, model parameters) as ``args`` so that one compiled program serves every new
table of the same shape (the testers compile once per ``fn``, static options and shapes).
Non-finite outputs of ``fn`` raise an error (eagerly and under ``jit``) saying in how many
trials they occurred.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_finite, check_key, check_positive_int, describe, ensure_that
from kernels._jit import compile_once
from kernels.estimate import Estimate
from kernels.parallel import MAX_SAMPLES, check_num_samples, sample_statistics
from kernels.walsh import _num_bits, fwht

__all__ = [
    "Sweep",
    "Verdict",
    "degree_rejection_rate",
    "degree_sweep",
    "low_degree_test",
    "num_trials_for",
    "sparsity_sweep",
    "sparsity_test",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of a property tester.

    Attributes:
      accepted: boolean scalar array, True iff every trial accepted.
      rejection_rate: the fraction of trials that rejected, an :class:`Estimate` of the
        one-trial rejection probability (``num_samples`` = trials, ``num_evaluations`` = queries
        of ``fn``).
    """

    accepted: Any
    rejection_rate: Estimate


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sweep:
    """The outcome of a sweep of a tester over increasing candidates.

    Attributes:
      value: the first accepted candidate (int scalar array), or the sweep's sentinel when none
        is accepted (``max_degree + 1`` for degrees, ``-1`` for sparsities).
      accepted: boolean array ``(len(candidates),)``, the verdict at every candidate.
      rejection_rates: an :class:`Estimate` with one rejection rate per candidate.
      candidates: the candidates tried, in order. Static.
    """

    value: Any
    accepted: Any
    rejection_rates: Estimate
    candidates: tuple[int, ...] = dataclasses.field(metadata={"static": True})


def num_trials_for(eps: float, delta: float) -> int:
    r"""Trials needed so that a per-trial rejection rate >= eps rejects w.p. >= 1 - delta.

    ``ceil(ln(1/delta) / eps)`` (since (1 - eps)^t <= exp(-eps t)), with $\ln(1/\delta)$ taken as
    $-\ln\delta$ (finite down to the smallest subnormal delta). Counts past ``2**31`` are fine
    (the testers' trial counts are exact up to ``2**53``, :mod:`kernels.parallel`); a count
    above ``2**53`` is refused.

    Raises:
      ValueError: if ``eps`` is not a number in (0, 1], ``delta`` not in (0, 1), or the count
        exceeds ``2**53``.

    >>> num_trials_for(0.1, 0.01)
    47
    >>> num_trials_for(1e-9, 0.1)  # past 2**31: runs (slowly), with exact counts
    2302585093
    """
    for name, value in (("eps", eps), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
            raise ValueError(f"{name}: expected a number, got {describe(value)}")
    if not (0.0 < eps <= 1.0):
        raise ValueError(f"eps: expected a value in (0, 1], got {describe(eps)}")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta: expected a value in (0, 1), got {describe(delta)}")
    trials = max(1, math.ceil(-math.log(delta) / eps))
    if trials > MAX_SAMPLES:
        raise ValueError(
            f"eps: {eps!r} needs {trials} trials at delta={delta!r}, more than 2**53 (the most a "
            "Monte Carlo kernel runs)"
        )
    return trials


def _as_float(values: jax.Array) -> jax.Array:
    """Integer / boolean outputs (e.g. a parity) as the default float dtype."""
    values = jnp.asarray(values)
    if jnp.issubdtype(values.dtype, jnp.floating):
        return values
    return values.astype(jnp.result_type(float))


def _query(fn: Callable[..., Any], args: Any, points: jax.Array) -> jax.Array:
    """``fn`` at every row of ``points`` (vmapped), as a float vector; checks the output shape."""
    values = jax.vmap(fn if args is None else lambda x: fn(x, args))(points)
    values = jnp.asarray(values)
    if values.shape != points.shape[:1]:
        raise ValueError(
            f"fn: must return a real scalar for one point of shape {points.shape[1:]}, got "
            f"shape {values.shape[1:]}"
        )
    if jnp.issubdtype(values.dtype, jnp.complexfloating):
        raise ValueError(f"fn: must return a real scalar, got dtype {values.dtype}")
    return _as_float(values)


def _point_and_coords(key: jax.Array, num_bits: int, k: int) -> tuple[jax.Array, jax.Array]:
    """A uniform point of {0,1}^n and k distinct uniform coordinates, from one draw of raw bits.

    (One ``random.bits`` call: the coordinates are the top k of n random 32-bit words.)
    """
    b = jax.random.bits(key, (2 * num_bits,), dtype=jnp.uint32)
    x = (b[:num_bits] & 1).astype(jnp.int32)
    coords = jax.lax.top_k(b[num_bits:], k)[1]
    return x, coords


def _subset_signs_and_masks(k: int) -> tuple[jax.Array, jax.Array]:
    """For the 2^k subsets S of k items: (-1)^{|S|} and the k-bit membership masks."""
    idx = jnp.arange(2**k, dtype=jnp.int32)
    bits = (idx[:, None] >> jnp.arange(k, dtype=jnp.int32)[None, :]) & 1
    signs = jnp.where(jnp.sum(bits, axis=1) % 2 == 0, 1, -1).astype(jnp.int32)
    return signs, bits


def _rejection(rejected: jax.Array, values: jax.Array) -> jax.Array:
    """1.0 if the trial rejected, 0.0 if it accepted, NaN if ``fn`` was not finite."""
    out = rejected.astype(values.dtype)
    return jnp.where(jnp.all(jnp.isfinite(values)), out, jnp.full_like(out, jnp.nan))


def _degree_trial(fn, args, num_bits: int, degree: int, rtol: float, atol: float):
    k = degree + 1
    signs, bits = _subset_signs_and_masks(k)

    def trial(key):
        x, coords = _point_and_coords(key, num_bits, k)
        onehot = (coords[:, None] == jnp.arange(num_bits, dtype=coords.dtype)[None, :]).astype(
            jnp.int32
        )  # (k, n)
        flips = bits @ onehot  # (2^k, n): vertex S flips the coordinates of S
        values = _query(fn, args, jnp.bitwise_xor(x[None, :], flips))
        alt = jnp.sum(signs.astype(values.dtype) * values)
        scale = jnp.sum(jnp.abs(values))
        return _rejection(jnp.abs(alt) > atol + rtol * scale, values)

    return trial


def _run_trials(trial, key: jax.Array, num_trials: int, queries: int, chunk_size) -> Verdict:
    """Run the trials, check ``fn`` stayed finite, and summarise them as a Verdict."""
    stats = sample_statistics(trial, key, num_samples=num_trials, chunk_size=chunk_size)
    estimate = stats.estimate(num_evaluations=num_trials * queries)
    accepted = stats.mean == 0  # exact: a sum of zeros (NaN compares False)
    accepted = ensure_that(
        accepted,
        stats.num_nonfinite == 0,
        f"fn: returned NaN or inf in {{}} of the {num_trials} trials",
        stats.num_nonfinite,
    )
    return Verdict(accepted=accepted, rejection_rate=estimate)


def _check_tolerance(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < np.inf:
        raise ValueError(f"{name}: expected a finite number >= 0, got {describe(value)}")


def _check_degree_args(num_bits: int, degree: int, rtol: float, atol: float) -> tuple[int, int]:
    num_bits = check_positive_int(num_bits, "num_bits")
    degree = check_positive_int(degree, "degree", minimum=0)
    if degree >= num_bits:
        raise ValueError(f"degree: expected < num_bits = {num_bits}, got {degree}")
    _check_tolerance(rtol, "rtol")
    _check_tolerance(atol, "atol")
    return num_bits, degree


def _low_degree(fn, num_bits, key, *, degree, num_trials, rtol, atol, chunk_size, args):
    """:func:`low_degree_test` without the compile-once wrapper (argument checks included)."""
    num_bits, degree = _check_degree_args(num_bits, degree, rtol, atol)
    num_trials = check_num_samples(num_trials, "num_trials")
    check_key(key)
    trial = _degree_trial(fn, args, num_bits, degree, rtol, atol)
    return _run_trials(trial, key, num_trials, 2 ** (degree + 1), chunk_size)


@compile_once
def low_degree_test(
    fn: Callable[..., jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    degree: int,
    num_trials: int,
    rtol: float = 1e-6,
    atol: float = 0.0,
    chunk_size: int | Literal["auto"] | None = None,
    args: Any = None,
) -> Verdict:
    r"""Test whether f has Fourier degree <= ``degree`` (coordinate-direction cube test).

    Each trial queries $2^{d+1}$ points and accepts iff
    $|\Delta_D f(x)| \le \text{atol} + \text{rtol}\sum_S|f(x \oplus e_S)|$ (the tolerance
    absorbs rounding of real-valued models). Accepts iff all trials accept. Exact degree-<=d
    functions are always accepted; see the module docstring for the rejection rate.

    Args:
      fn: ``x -> f(x)`` (or ``(x, args) -> f(x)``) on one int32 0/1 vector of shape
        (num_bits,), returning a real scalar; must be traceable (it is vmapped). Static.
      num_bits: n. Static.
      key: PRNG key.
      degree: d, 0 <= d < n. Static.
      num_trials: number of independent trials (see :func:`num_trials_for`). Static.
      rtol: relative tolerance of the zero test (finite, >= 0). Static.
      atol: absolute tolerance of the zero test (finite, >= 0). Static.
      chunk_size: trials vectorised at a time, an int >= 1; ``None``: one at a time; ``"auto"``:
        ``None`` on a CPU, 16 on a GPU or TPU (:func:`kernels.parallel.sample_statistics`). Does not
        change the result.
      args: optional pytree passed to ``fn`` as its second argument (traced).

    Returns:
      Verdict(accepted, rejection_rate).

    Raises:
      ValueError: for non-positive sizes, degree >= num_bits, negative tolerances, a bad key,
        ``fn`` not returning a real scalar; ``fn`` returning NaN/inf in some trial (runtime
        check, eagerly and under ``jit``).

    References:
      Alon, Kaufman, Krivelevich, Litsyn & Ron 2003, "Testing low-degree polynomials over GF(2)",
      doi:10.1007/978-3-540-45198-3_17; SPEC.md section 5 (Fourier-degree caution).

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: (x[0] * x[1]).astype(jnp.float32)  # degree 2
    >>> bool(low_degree_test(f, 4, jax.random.key(0), degree=2, num_trials=20).accepted)
    True
    >>> out = low_degree_test(f, 2, jax.random.key(0), degree=1, num_trials=20)  # n=2: always hit
    >>> bool(out.accepted), float(out.rejection_rate.mean), out.rejection_rate.num_evaluations
    (False, 1.0, 80)
    """
    return _low_degree(
        fn, num_bits, key, degree=degree, num_trials=num_trials, rtol=rtol, atol=atol,
        chunk_size=chunk_size, args=args,
    )  # fmt: skip


def degree_rejection_rate(
    values: jax.Array, *, degree: int, rtol: float = 1e-9, atol: float = 0.0
) -> jax.Array:
    r"""Exact one-trial rejection rate $\rho_d(f)$ of :func:`low_degree_test`, by enumeration.

    Averages the zero test over every base point x and every set D of d+1 distinct coordinates
    (the trial draws D uniformly, as a random permutation's first d+1 entries). For small n:
    memory $2^n \binom{n}{d+1} 2^{d+1}$ values (little-endian index order of
    :mod:`kernels.walsh`).

    Args:
      values: f on the cube, shape (2^n,), finite.
      degree: d, 0 <= d < n. Static.
      rtol: relative tolerance (as in the tester). Static.
      atol: absolute tolerance. Static.

    Returns:
      Scalar array in [0, 1].

    Raises:
      ValueError: if ``values`` is not a vector of length 2^n (n >= 1), ``degree`` is out of
        range, a tolerance is negative; if ``values`` has a NaN/inf entry (eagerly and under
        ``jit``).

    >>> import jax.numpy as jnp
    >>> float(degree_rejection_rate(jnp.array([0.0, 0.0, 0.0, 1.0]), degree=1))  # x0 x1
    1.0
    """
    values = _as_float(values)
    if values.ndim != 1:
        raise ValueError(f"values: expected a vector of length 2^n, got shape {values.shape}")
    n = _num_bits(values.shape[0], "values")
    _check_degree_args(n, degree, rtol, atol)
    check_finite(values, "values")
    k = degree + 1
    signs, _ = _subset_signs_and_masks(k)
    combos = list(itertools.combinations(range(n), k))
    masks = np.array(
        [[sum(1 << D[i] for i in range(k) if (s >> i) & 1) for s in range(2**k)] for D in combos],
        dtype=np.int32,
    )  # (num_D, 2^k)
    xs = np.arange(2**n, dtype=np.int32)
    vals = values[jnp.asarray(np.bitwise_xor(xs[:, None, None], masks[None, :, :]))]
    alt = vals @ signs.astype(values.dtype)
    rej = jnp.abs(alt) > atol + rtol * jnp.sum(jnp.abs(vals), axis=-1)
    return jnp.mean(rej.astype(values.dtype))


def _sweep(verdicts: list[Verdict], candidates: tuple[int, ...], none: int) -> Sweep:
    """Stack per-candidate verdicts; the value is the first accepted candidate, else ``none``."""
    accepted = jnp.stack([v.accepted for v in verdicts])
    rates = [v.rejection_rate for v in verdicts]
    estimate = Estimate(
        mean=jnp.stack([r.mean for r in rates]),
        stderr=jnp.stack([r.stderr for r in rates]),
        num_samples=rates[0].num_samples,
        num_evaluations=sum(r.num_evaluations for r in rates),
    )
    values = jnp.asarray(candidates, dtype=jnp.int32)
    value = jnp.where(jnp.any(accepted), values[jnp.argmax(accepted)], jnp.int32(none))
    return Sweep(value=value, accepted=accepted, rejection_rates=estimate, candidates=candidates)


@compile_once
def degree_sweep(
    fn: Callable[..., jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    max_degree: int,
    eps: float,
    delta: float,
    rtol: float = 1e-6,
    atol: float = 0.0,
    chunk_size: int | Literal["auto"] | None = None,
    args: Any = None,
) -> Sweep:
    """The first degree d in 0..max_degree that :func:`low_degree_test` accepts (Appendix H).

    Each degree gets ``num_trials_for(eps, delta)`` trials with its own key (``fold_in(key, d)``).
    The value is ``max_degree + 1`` when none is accepted.

    Args:
      fn: black-box function, as in :func:`low_degree_test`. Static.
      num_bits: n. Static.
      key: PRNG key.
      max_degree: largest degree tried (< n). Static.
      eps: per-trial rejection rate to detect, in (0, 1]. Static.
      delta: allowed miss probability per degree, in (0, 1). Static.
      rtol: relative tolerance. Static.
      atol: absolute tolerance. Static.
      chunk_size: trials at a time (int >= 1; ``None``: one at a time; ``"auto"`` as
        :func:`kernels.parallel.sample_statistics`).
      args: optional pytree passed to ``fn`` (traced).

    Returns:
      Sweep(value, accepted, rejection_rates, candidates=(0, ..., max_degree)).

    Raises:
      ValueError: if ``max_degree`` is not in [0, num_bits); as :func:`low_degree_test` and
        :func:`num_trials_for` otherwise.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: (x[0] * x[1]).astype(jnp.float32)  # degree 2
    >>> int(degree_sweep(f, 4, jax.random.key(0), max_degree=3, eps=0.1, delta=0.01).value)
    2
    """
    t = num_trials_for(eps, delta)
    num_bits = check_positive_int(num_bits, "num_bits")
    max_degree = check_positive_int(max_degree, "max_degree", minimum=0)
    if max_degree >= num_bits:
        raise ValueError(f"max_degree: expected < num_bits = {num_bits}, got {max_degree}")
    candidates = tuple(range(max_degree + 1))
    verdicts = [
        _low_degree(
            fn, num_bits, jax.random.fold_in(key, d), degree=d, num_trials=t, rtol=rtol,
            atol=atol, chunk_size=chunk_size, args=args,
        )
        for d in candidates
    ]  # fmt: skip
    return _sweep(verdicts, candidates, max_degree + 1)


def _sparsity_trial(fn, args, num_bits: int, num_restrict: int, sparsity: int, eps: float):
    r = num_restrict
    _, bits = _subset_signs_and_masks(r)

    def trial(key):
        x, coords = _point_and_coords(key, num_bits, r)
        onehot = (coords[:, None] == jnp.arange(num_bits, dtype=coords.dtype)[None, :]).astype(
            jnp.int32
        )  # (r, n)
        in_J = jnp.sum(onehot, axis=0, dtype=jnp.int32)  # (n,) 0/1
        pts = x[None, :] * (1 - in_J)[None, :] + bits @ onehot  # y on J, x elsewhere
        values = _query(fn, args, pts)
        coef = fwht(values)  # 2^r times the restricted Fourier coefficients
        energy = jnp.sort(coef**2)[::-1]
        total = jnp.sum(energy)
        tail = total - jnp.sum(energy[:sparsity])
        return _rejection(tail > eps * total, values)

    return trial


def _sparsity(fn, num_bits, key, *, sparsity, num_restrict, num_trials, eps, chunk_size, args):
    """:func:`sparsity_test` without the compile-once wrapper (argument checks included)."""
    num_bits = check_positive_int(num_bits, "num_bits")
    sparsity = check_positive_int(sparsity, "sparsity")
    num_restrict = check_positive_int(num_restrict, "num_restrict")
    num_trials = check_num_samples(num_trials, "num_trials")
    if num_restrict > num_bits:
        raise ValueError(f"num_restrict: expected <= num_bits = {num_bits}, got {num_restrict}")
    _check_tolerance(eps, "eps")
    if eps == 0:
        raise ValueError(f"eps: expected a value > 0, got {describe(eps)}")
    check_key(key)
    trial = _sparsity_trial(fn, args, num_bits, num_restrict, sparsity, eps)
    return _run_trials(trial, key, num_trials, 2**num_restrict, chunk_size)


@compile_once
def sparsity_test(
    fn: Callable[..., jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    sparsity: int,
    num_restrict: int,
    num_trials: int,
    eps: float = 1e-6,
    chunk_size: int | Literal["auto"] | None = None,
    args: Any = None,
) -> Verdict:
    r"""Test whether f is s-sparse in the Fourier-Walsh basis (random restrictions + WHT).

    One trial: random point x, random set J of r = ``num_restrict`` coordinates, the $2^r$ values of
    $y \mapsto f(x_{\bar J}, y_J)$, its Walsh-Hadamard spectrum $c$; accept iff the energy outside
    the s largest $c_S^2$ is at most ``eps`` times the total. A restriction of
    $f = \sum_{t\le s}\hat f(A_t)\chi_{A_t}$ is $\sum_t \pm\hat f(A_t)\chi_{A_t\cap J}$, at most s
    terms, so s-sparse functions are always accepted. Accepts iff every trial accepts.

    Args:
      fn: ``x -> f(x)`` (or ``(x, args) -> f(x)``) on one int32 0/1 vector of shape
        (num_bits,), returning a real scalar; traceable. Static.
      num_bits: n. Static.
      key: PRNG key.
      sparsity: s >= 1. Static.
      num_restrict: r, 1 <= r <= n (2^r queries per trial; r = n: exact full transform). Static.
      num_trials: trials. Static.
      eps: relative energy tolerance (finite, > 0; absorbs rounding). Static.
      chunk_size: trials at a time, an int >= 1; ``None``: one at a time; ``"auto"``: ``None`` on
        a CPU, 16 on a GPU or TPU (:func:`kernels.parallel.sample_statistics`). Does not change the
        result.
      args: optional pytree passed to ``fn`` as its second argument (traced).

    Returns:
      Verdict(accepted, rejection_rate).

    Raises:
      ValueError: for bad sizes, ``eps``, key, or ``fn`` not returning a real scalar; ``fn``
        returning NaN/inf in some trial (runtime check, eagerly and under ``jit``).

    References:
      Gopalan, O'Donnell, Servedio, Shpilka & Wimmer 2011, "Testing Fourier dimensionality and
      sparsity", SIAM J. Comput. 40(4), doi:10.1137/100785429.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: jnp.where((x[0] + x[2]) % 2 == 0, 1.0, 0.0)  # (1 + chi_{0,2})/2: 2-sparse
    >>> k = jax.random.key(1)
    >>> bool(sparsity_test(f, 5, k, sparsity=2, num_restrict=3, num_trials=10).accepted)
    True
    >>> bool(sparsity_test(f, 5, k, sparsity=1, num_restrict=5, num_trials=1).accepted)
    False
    """
    return _sparsity(
        fn, num_bits, key, sparsity=sparsity, num_restrict=num_restrict, num_trials=num_trials,
        eps=eps, chunk_size=chunk_size, args=args,
    )  # fmt: skip


@compile_once
def sparsity_sweep(
    fn: Callable[..., jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    sparsities: Sequence[int],
    num_restrict: int,
    num_trials: int,
    eps: float = 1e-6,
    chunk_size: int | Literal["auto"] | None = None,
    args: Any = None,
) -> Sweep:
    """The first sparsity in ``sparsities`` (increasing) that :func:`sparsity_test` accepts.

    The value is ``-1`` when none is accepted. Candidate ``i`` uses the key ``fold_in(key, i)``.

    Args:
      fn: black-box function, as in :func:`sparsity_test`. Static.
      num_bits: n. Static.
      key: PRNG key.
      sparsities: strictly increasing ints >= 1 (e.g. (1, 7, 14, 20) as in Appendix H). Static.
      num_restrict: r. Static.
      num_trials: trials per candidate. Static.
      eps: relative energy tolerance. Static.
      chunk_size: trials at a time (int >= 1; ``None``: one at a time; ``"auto"`` as
        :func:`kernels.parallel.sample_statistics`).
      args: optional pytree passed to ``fn`` (traced).

    Returns:
      Sweep(value, accepted, rejection_rates, candidates=tuple(sparsities)).

    Raises:
      ValueError: if ``sparsities`` is empty or not strictly increasing ints >= 1; as
        :func:`sparsity_test` otherwise.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: jnp.where((x[0] + x[2]) % 2 == 0, 1.0, 0.0)  # 2-sparse
    >>> out = sparsity_sweep(f, 4, jax.random.key(0), sparsities=(1, 2, 3), num_restrict=4,
    ...                      num_trials=2)
    >>> int(out.value), out.accepted.tolist()
    (2, [False, True, True])
    """
    candidates = tuple(check_positive_int(s, "sparsities") for s in sparsities)
    if not candidates or any(b <= a for a, b in itertools.pairwise(candidates)):
        raise ValueError(f"sparsities: expected strictly increasing ints >= 1, got {sparsities!r}")
    verdicts = [
        _sparsity(
            fn, num_bits, jax.random.fold_in(key, i), sparsity=s, num_restrict=num_restrict,
            num_trials=num_trials, eps=eps, chunk_size=chunk_size, args=args,
        )
        for i, s in enumerate(candidates)
    ]  # fmt: skip
    return _sweep(verdicts, candidates, -1)
