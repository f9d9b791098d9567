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

Both testers run ``num_trials`` independent trials (one PRNG key each, mapped with
:func:`kernels.parallel.map_samples`, so ``chunk_size`` never changes the result) and accept iff
every trial accepts. If one trial rejects f with probability >= ``eps``, then
``num_trials >= ln(1/delta)/eps`` trials reject it with probability >= 1 - delta;
:func:`num_trials_for` gives that count.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_positive_int
from kernels.parallel import map_samples
from kernels.walsh import fwht

__all__ = [
    "degree_rejection_rate",
    "degree_sweep",
    "low_degree_test",
    "num_trials_for",
    "sparsity_sweep",
    "sparsity_test",
]


def num_trials_for(eps: float, delta: float) -> int:
    """Trials needed so that a per-trial rejection rate >= eps rejects w.p. >= 1 - delta.

    ``ceil(ln(1/delta) / eps)`` (since (1 - eps)^t <= exp(-eps t)).

    >>> num_trials_for(0.1, 0.01)
    47
    """
    if not (0.0 < eps <= 1.0):
        raise ValueError(f"eps: expected a value in (0, 1], got {eps!r}")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta: expected a value in (0, 1), got {delta!r}")
    return max(1, math.ceil(math.log(1.0 / delta) / eps))


def _as_float(values: jax.Array) -> jax.Array:
    """Integer / boolean outputs (e.g. a parity) as the default float dtype."""
    values = jnp.asarray(values)
    if jnp.issubdtype(values.dtype, jnp.floating):
        return values
    return values.astype(jnp.result_type(float))


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


def _degree_trial(fn, num_bits: int, degree: int, rtol: float, atol: float):
    k = degree + 1
    signs, bits = _subset_signs_and_masks(k)

    def trial(key):
        x, coords = _point_and_coords(key, num_bits, k)
        onehot = (coords[:, None] == jnp.arange(num_bits, dtype=coords.dtype)[None, :]).astype(
            jnp.int32
        )  # (k, n)
        flips = bits @ onehot  # (2^k, n): vertex S flips the coordinates of S
        values = _as_float(jax.vmap(fn)(jnp.bitwise_xor(x[None, :], flips)))
        alt = jnp.sum(signs.astype(values.dtype) * values)
        scale = jnp.sum(jnp.abs(values))
        return jnp.abs(alt) <= atol + rtol * scale

    return trial


def low_degree_test(
    fn: Callable[[jax.Array], jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    degree: int,
    num_trials: int,
    rtol: float = 1e-6,
    atol: float = 0.0,
    chunk_size: int | None = None,
) -> jax.Array:
    r"""Test whether f has Fourier degree <= ``degree`` (coordinate-direction cube test).

    Each trial queries $2^{d+1}$ points and accepts iff
    $|\Delta_D f(x)| \le \text{atol} + \text{rtol}\sum_S|f(x \oplus e_S)|$ (the tolerance absorbs
    rounding of real-valued models). Returns True iff all trials accept. Exact degree-<=d
    functions are always accepted; see the module docstring for the rejection rate.

    Args:
      fn: ``x -> f(x)`` on one int32 0/1 vector of shape (num_bits,), returning a real scalar;
        must be traceable (it is vmapped).
      num_bits: n. Static.
      key: PRNG key.
      degree: d, 0 <= d < n. Static.
      num_trials: number of independent trials (see :func:`num_trials_for`). Static.
      rtol: relative tolerance of the zero test.
      atol: absolute tolerance of the zero test.
      chunk_size: trials vectorised at a time (memory bound); does not change the result.

    Returns:
      Boolean scalar array: accepted.

    Raises:
      ValueError: for non-positive sizes or degree >= num_bits.

    References:
      Alon, Kaufman, Krivelevich, Litsyn & Ron 2003, "Testing low-degree polynomials over GF(2)",
      doi:10.1007/978-3-540-45198-3_17; SPEC.md section 5 (Fourier-degree caution).

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: (x[0] * x[1]).astype(jnp.float32)  # degree 2
    >>> bool(low_degree_test(f, 4, jax.random.key(0), degree=2, num_trials=20))
    True
    >>> bool(low_degree_test(f, 2, jax.random.key(0), degree=1, num_trials=20))  # n=2: always hit
    False
    """
    num_bits = check_positive_int(num_bits, "num_bits")
    degree = check_positive_int(degree, "degree", minimum=0)
    num_trials = check_positive_int(num_trials, "num_trials")
    if degree >= num_bits:
        raise ValueError(f"degree: expected < num_bits = {num_bits}, got {degree}")
    trial = _degree_trial(fn, num_bits, degree, rtol, atol)
    keys = jax.random.split(key, num_trials)
    return jnp.all(map_samples(trial, keys, chunk_size=chunk_size))


def degree_rejection_rate(
    values: jax.Array, *, degree: int, rtol: float = 1e-9, atol: float = 0.0
) -> jax.Array:
    r"""Exact one-trial rejection rate $\rho_d(f)$ of :func:`low_degree_test`, by enumeration.

    Averages the zero test over every base point x and every set D of d+1 distinct coordinates
    (the trial draws D uniformly, as a random permutation's first d+1 entries). For small n
    (values of length 2^n, little-endian index order of :mod:`kernels.walsh`).

    Args:
      values: f on the cube, shape (2^n,).
      degree: d. Static.
      rtol: relative tolerance (as in the tester).
      atol: absolute tolerance.

    Returns:
      Scalar array in [0, 1].
    """
    values = _as_float(values)
    n = values.shape[-1].bit_length() - 1
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


def degree_sweep(
    fn: Callable[[jax.Array], jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    max_degree: int,
    eps: float,
    delta: float,
    rtol: float = 1e-6,
    atol: float = 0.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """The first degree d in 0..max_degree that :func:`low_degree_test` accepts (Appendix H).

    Each degree gets ``num_trials_for(eps, delta)`` trials with its own key (``fold_in(key, d)``).
    Returns ``max_degree + 1`` when none is accepted.

    Args:
      fn: black-box function, as in :func:`low_degree_test`.
      num_bits: n. Static.
      key: PRNG key.
      max_degree: largest degree tried (< n). Static.
      eps: per-trial rejection rate to detect.
      delta: allowed miss probability per degree.
      rtol: relative tolerance.
      atol: absolute tolerance.
      chunk_size: trials at a time.

    Returns:
      Integer scalar array.
    """
    t = num_trials_for(eps, delta)
    accepted = jnp.stack(
        [
            low_degree_test(
                fn, num_bits, jax.random.fold_in(key, d), degree=d, num_trials=t, rtol=rtol,
                atol=atol, chunk_size=chunk_size,
            )
            for d in range(max_degree + 1)
        ]
    )  # fmt: skip
    return jnp.where(jnp.any(accepted), jnp.argmax(accepted), max_degree + 1)


def _sparsity_trial(fn, num_bits: int, num_restrict: int, sparsity: int, eps: float):
    r = num_restrict
    _, bits = _subset_signs_and_masks(r)

    def trial(key):
        x, coords = _point_and_coords(key, num_bits, r)
        onehot = (coords[:, None] == jnp.arange(num_bits, dtype=coords.dtype)[None, :]).astype(
            jnp.int32
        )  # (r, n)
        in_J = jnp.sum(onehot, axis=0, dtype=jnp.int32)  # (n,) 0/1
        pts = x[None, :] * (1 - in_J)[None, :] + bits @ onehot  # y on J, x elsewhere
        values = _as_float(jax.vmap(fn)(pts))
        coef = fwht(values)  # 2^r times the restricted Fourier coefficients
        energy = jnp.sort(coef**2)[::-1]
        total = jnp.sum(energy)
        tail = total - jnp.sum(energy[:sparsity])
        return tail <= eps * total

    return trial


def sparsity_test(
    fn: Callable[[jax.Array], jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    sparsity: int,
    num_restrict: int,
    num_trials: int,
    eps: float = 1e-6,
    chunk_size: int | None = None,
) -> jax.Array:
    r"""Test whether f is s-sparse in the Fourier-Walsh basis (random restrictions + WHT).

    One trial: random point x, random set J of r = ``num_restrict`` coordinates, the $2^r$ values of
    $y \mapsto f(x_{\bar J}, y_J)$, its Walsh-Hadamard spectrum $c$; accept iff the energy outside
    the s largest $c_S^2$ is at most ``eps`` times the total. A restriction of
    $f = \sum_{t\le s}\hat f(A_t)\chi_{A_t}$ is $\sum_t \pm\hat f(A_t)\chi_{A_t\cap J}$, at most s
    terms, so s-sparse functions are always accepted. Accepts iff every trial accepts.

    Args:
      fn: ``x -> f(x)`` on one int32 0/1 vector of shape (num_bits,); traceable.
      num_bits: n. Static.
      key: PRNG key.
      sparsity: s >= 1. Static.
      num_restrict: r, 1 <= r <= n (2^r queries per trial; r = n: exact full transform). Static.
      num_trials: trials. Static.
      eps: relative energy tolerance (> 0; absorbs rounding).
      chunk_size: trials at a time; does not change the result.

    Returns:
      Boolean scalar array: accepted.

    Raises:
      ValueError: for bad sizes.

    References:
      Gopalan, O'Donnell, Servedio, Shpilka & Wimmer 2011, "Testing Fourier dimensionality and
      sparsity", SIAM J. Comput. 40(4), doi:10.1137/100785429.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda x: jnp.where((x[0] + x[2]) % 2 == 0, 1.0, 0.0)  # (1 + chi_{0,2})/2: 2-sparse
    >>> k = jax.random.key(1)
    >>> bool(sparsity_test(f, 5, k, sparsity=2, num_restrict=3, num_trials=10))
    True
    >>> bool(sparsity_test(f, 5, k, sparsity=1, num_restrict=5, num_trials=1))
    False
    """
    num_bits = check_positive_int(num_bits, "num_bits")
    sparsity = check_positive_int(sparsity, "sparsity")
    num_restrict = check_positive_int(num_restrict, "num_restrict")
    num_trials = check_positive_int(num_trials, "num_trials")
    if num_restrict > num_bits:
        raise ValueError(f"num_restrict: expected <= num_bits = {num_bits}, got {num_restrict}")
    if not eps > 0:
        raise ValueError(f"eps: expected a value > 0, got {eps!r}")
    trial = _sparsity_trial(fn, num_bits, num_restrict, sparsity, eps)
    keys = jax.random.split(key, num_trials)
    return jnp.all(map_samples(trial, keys, chunk_size=chunk_size))


def sparsity_sweep(
    fn: Callable[[jax.Array], jax.Array],
    num_bits: int,
    key: jax.Array,
    *,
    sparsities: Sequence[int],
    num_restrict: int,
    num_trials: int,
    eps: float = 1e-6,
    chunk_size: int | None = None,
) -> jax.Array:
    """The first sparsity in ``sparsities`` (increasing) that :func:`sparsity_test` accepts.

    Returns ``-1`` when none is accepted. Each candidate uses ``fold_in(key, i)``.

    Args:
      fn: black-box function.
      num_bits: n. Static.
      key: PRNG key.
      sparsities: increasing candidates (e.g. (1, 7, 14, 20) as in Appendix H). Static.
      num_restrict: r. Static.
      num_trials: trials per candidate. Static.
      eps: relative energy tolerance.
      chunk_size: trials at a time.

    Returns:
      Integer scalar array.
    """
    accepted = jnp.stack(
        [
            sparsity_test(
                fn, num_bits, jax.random.fold_in(key, i), sparsity=s, num_restrict=num_restrict,
                num_trials=num_trials, eps=eps, chunk_size=chunk_size,
            )
            for i, s in enumerate(sparsities)
        ]
    )  # fmt: skip
    values = jnp.asarray(list(sparsities))
    return jnp.where(jnp.any(accepted), values[jnp.argmax(accepted)], -1)
