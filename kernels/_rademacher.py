"""The Rademacher complexity estimators: Monte Carlo over sign vectors, McDiarmid intervals."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._backend import is_accelerator, tree_size
from kernels._checks import (
    check_key,
    check_positive_int,
    check_that,
)
from kernels._jit import compile_once
from kernels._names import renamed_kwargs
from kernels._ordered import CheckChain
from kernels._random import sign_vector as _draw_signs
from kernels._searches import (
    ReadoutSearchSup,
    SearchSup,
    _readout_search_sup,
    _restart_key,
    _search_sup,
)
from kernels._signs import _auto_chunk, _check_chunk, _check_delta, _check_float_dtype
from kernels._sups import FiniteSup, LinearSup, _finite_sup, _linear_sup
from kernels.estimate import Estimate
from kernels.norms import ldexp_exact, pow2_factors
from kernels.parallel import (
    SampleStats,
    check_num_samples,
    sample_statistics,
)

_MAX_EXACT_EXAMPLES = 20
# rademacher_linear's default chunk: 256 draws on a CPU (measured best there); on an accelerator
# the largest power of two up to 4096 whose signs and products fit _ACCEL_CHUNK_BYTES
_CPU_CHUNK = 256
_ACCEL_CHUNK = 4096
_ACCEL_CHUNK_BYTES = 1 << 30


# --------------------------------------------------------------------------- Monte Carlo driver


def _halfwidth_factor(num_examples: Any, num_samples: Any, delta: Any) -> float:
    r"""$2\sqrt{\ln(2/\delta)/(2nK)}$ with $\ln(2/\delta) = \ln 2 - \ln\delta$.

    (No overflow of $2/\delta$ for a subnormal $\delta$.)
    """
    n = check_positive_int(num_examples, "num_examples")
    k = check_num_samples(num_samples, "num_samples")
    delta = _check_delta(delta)
    if delta is None:
        raise ValueError("delta: expected a Python float in (0, 1), got None")
    return 2 * math.sqrt((math.log(2) - math.log(delta)) / (2 * n * k))


@renamed_kwargs(num_draws="num_samples")
def mcdiarmid_halfwidth(bound: Any, *, num_examples: int, num_samples: int, delta: float) -> Any:
    r"""Half-width $2b\sqrt{\ln(2/\delta)/(2nK)}$ of the McDiarmid interval for $\mathrm{Rad}_S$.

    Valid around the average of $K$ exact sups over i.i.d. sign vectors when $|f(x_i)| \le b$.
    $\ln(2/\delta)$ is computed as $\ln 2 - \ln\delta$, so any $\delta > 0$ down to the
    smallest subnormal double gives a finite width ($2/\delta$ overflowed at $\delta = 10^{-308}$).

    Args:
      bound: b >= 0 (float or array).
      num_examples: n. Static.
      num_samples: K in ``[1, 2**53]`` (``num_draws`` is its deprecated name). Static.
      delta: the interval has confidence $1 - \delta$, $\delta \in (0, 1)$.

    Raises:
      ValueError: on bad counts, delta, or a negative / non-finite bound (also under ``jit``).

    >>> round(float(mcdiarmid_halfwidth(1.0, num_examples=50, num_samples=2, delta=0.05)), 6)
    0.27162
    >>> round(float(mcdiarmid_halfwidth(1.0, num_examples=10_000, num_samples=1, delta=1e-308)), 6)
    0.3768
    """
    factor = _halfwidth_factor(num_examples, num_samples, delta)
    check_that(
        jnp.logical_and(jnp.isfinite(bound), jnp.asarray(bound) >= 0),
        "bound: expected a finite value >= 0",
    )
    return bound * factor


def _draw_statistics(
    per_draw: Callable[[jax.Array], jax.Array],
    key: jax.Array,
    sup: LinearSup | FiniteSup | SearchSup | ReadoutSearchSup,
    *,
    num_samples: int,
    chunk_size: int | None,
    name: str,
    chain: CheckChain,
) -> SampleStats:
    """Streaming statistics of ``per_draw(signs of draw k)`` over k < num_samples, checked."""

    def sample(draw_key: jax.Array) -> jax.Array:
        return per_draw(_draw_signs(draw_key, sup.num_examples, sup.dtype))

    stats = sample_statistics(sample, key, num_samples=num_samples, chunk_size=chunk_size)
    chain.require(
        stats.num_nonfinite == 0,
        f"{name}: non-finite value at {{}} of the {num_samples} sign vectors (NaN, or beyond "
        f"the range of {np.dtype(sup.dtype).name})",
        stats.num_nonfinite,
    )
    return stats


def _estimate(stats: SampleStats, index: int | None = None) -> Estimate:
    est = stats.estimate()
    if index is None:
        return est
    return Estimate(mean=est.mean[index], stderr=est.stderr[index], num_samples=est.num_samples)


def _with_interval(
    est: Estimate,
    bound: Any,
    *,
    num_examples: int,
    delta: float | None,
    one_sided: bool = False,
    valid: Any = None,
) -> Estimate:
    """Attach the McDiarmid interval; where ``valid`` is false the lower end is -inf."""
    if delta is None or bound is None:
        return est
    factor = _halfwidth_factor(num_examples, est.num_samples, delta)
    hw = jnp.asarray(bound, est.mean.dtype) * factor
    lower = est.mean - hw
    if valid is not None:
        lower = jnp.where(valid, lower, -jnp.inf)
    upper = jnp.full_like(est.mean, jnp.inf) if one_sided else est.mean + hw
    return dataclasses.replace(est, lower=lower, upper=upper, delta=delta)


def _exact_sup_estimate(
    sup: LinearSup | FiniteSup,
    key: jax.Array,
    bound: Callable[[], jax.Array],
    *,
    num_samples: int,
    chunk_size: int | None,
    delta: float | None,
    name: str,
    chain: CheckChain,
    per_draw: Callable[[jax.Array], jax.Array] | None = None,
    exponent: jax.Array | None = None,
) -> Estimate:
    r"""Mean of exact sups over sign vectors, with the McDiarmid interval of b = ``bound()``.

    Every sup lies in [-b, b]: the statistics are those of the sups times $2^{-e}$ with
    $2^{e-1} \le b < 2^e$ (exact), so their squares neither overflow nor underflow (float32
    inputs of 1e20 gave a NaN standard error), and the mean and standard error are scaled back
    by $2^e$ (bit for bit the unscaled result where that one did not overflow). With
    ``exponent`` $E$, ``per_draw`` (default: ``sup``) and ``bound`` are in working units
    ($2^{-E}$ times the sups, :meth:`LinearSup.unit`) and the mean, standard error and interval
    are scaled back by $2^E$ last (:func:`kernels.norms.ldexp_exact`: a result below the normal
    range keeps its subnormal value). A mean or standard error beyond the dtype's range raises
    naming ``name``.
    """
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, name=name, chain=chain)
    b = bound()
    per_draw = sup if per_draw is None else per_draw
    down, up = pow2_factors(b)
    stats = _draw_statistics(lambda signs: per_draw(signs) * down, key, sup, **kw)
    est = _estimate(stats)
    est = dataclasses.replace(est, mean=est.mean * up, stderr=est.stderr * up)
    est = _with_interval(est, None if delta is None else b, num_examples=sup.num_examples,
                         delta=delta)  # fmt: skip
    if exponent is not None:
        est = _scale_estimate(est, exponent)
    chain.require(
        jnp.logical_and(jnp.isfinite(est.mean), jnp.isfinite(est.stderr)),
        f"{name}: the Rademacher average or its standard error exceeds the range of "
        f"{np.dtype(sup.dtype).name} (scale the {name} or the radius down)",
    )
    return est


def _scale_estimate(est: Estimate, exponent: jax.Array) -> Estimate:
    r"""``est`` (mean, stderr and interval ends) times $2^{\text{exponent}}$, exactly."""
    out = {"mean": ldexp_exact(est.mean, exponent), "stderr": ldexp_exact(est.stderr, exponent)}
    for end in ("lower", "upper"):
        value = getattr(est, end)
        if value is not None:
            out[end] = ldexp_exact(value, exponent)
    return dataclasses.replace(est, **out)


def _check_counts(key: Any, num_samples: Any, chunk_size: Any, delta: Any) -> tuple[Any, ...]:
    check_key(key)
    return (
        check_num_samples(num_samples, "num_samples", minimum=2),
        _check_chunk(chunk_size),
        _check_delta(delta),
    )


# --------------------------------------------------------------------------- public estimators


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_linear(
    inputs: jax.Array,
    key: jax.Array,
    *,
    norm: Any,
    radius: Any,
    num_samples: int,
    chunk_size: int | str | None = "auto",
    readout: jax.Array | None = None,
    delta: float | None = 0.05,
    precision: str | None = None,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a norm-ball linear class (exact sups).

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_{k=1}^K \frac{B}{n}\Big\|\sum_i\sigma^{(k)}_i x_i
    \Big\|_{p^*}$$ (times $\|u\|_{q^*}$ for the matrix class, see :func:`linear_sup`): unbiased
    for $\mathrm{Rad}_S$. Each chunk of draws is generated from raw random bits, multiplied by
    ``inputs`` (one GEMM) and reduced in one pass, sharded over ``jax.devices()``.

    Args:
      inputs: ``[n, d]`` float32/float64 sample (its dtype is the compute dtype).
      key: PRNG key.
      norm: p in [1, inf] (vector class) or a pair (q, p) (matrix class, needs ``readout``).
      radius: B > 0 (float, or array scalar to vary it without recompiling).
      num_samples: $2 \le K \le 2^{53}$ sign vectors (draw $k$ uses
        :func:`kernels.parallel.sample_key` ``(key, k)``, distinct for every k); ``num_draws``
        is its deprecated name. Static.
      chunk_size: draws per vectorised chunk (memory ``chunk_size * (n + d) * itemsize``); None
        for one at a time; ``"auto"`` (default): 256 on a CPU (the fastest measured there), and
        on a GPU/TPU the largest power of two up to 4096 whose chunk fits 1 GiB (an H100 ran
        chunk 4096 2.9x faster than 256 at n = 4096, d = 512). Does not change the draws.
      readout: u for the matrix class.
      delta: confidence of the McDiarmid interval (None for no interval).
      precision: how each chunk's product $\sigma^\top X$ is computed: ``None`` (JAX's default
        matmul precision), ``"highest"``, or ``"bf16x2"`` (float32 inputs split into two
        bfloat16 parts, see :func:`linear_sup`; its error is far below the Monte Carlo error).
        Static.

    Returns:
      Estimate(mean, stderr, K, lower, upper, delta) with the McDiarmid $(1-\delta)$ interval.
      The mean is accumulated in double-word arithmetic (:mod:`kernels.parallel`): its
      summation error stays far below the standard error at any K, in float32 too.

    Raises:
      ValueError: on bad shapes, dtypes, exponents, sizes, key, empty or non-finite inputs, a
        non-positive radius (eagerly; ``JaxRuntimeError`` naming it inside ``jit``; the first
        bad argument is the one named), ``num_samples`` above ``2**53``, or a bad precision.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.eye(4)  # ||sum_i s_i e_i||_2 = 2 for every sign vector: Rad = B * 2 / 4
    >>> est = rademacher_linear(x, jax.random.key(0), norm=2, radius=1.0, num_samples=8)
    >>> float(est.mean), float(est.stderr)
    (0.5, 0.0)
    >>> tiny = rademacher_linear(1e-20 * x, jax.random.key(0), norm=2, radius=1e20, num_samples=8)
    >>> tiny.mean, (float(tiny.lower) < 0.5 < float(tiny.upper))  # norms scaled: no underflow
    (Array(0.5, dtype=float32), True)
    """
    chunk_size = _linear_chunk(chunk_size, inputs)
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    chain = CheckChain()
    sup = _linear_sup(inputs, norm, radius, readout, precision, chain)
    kw = dict(
        num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="inputs", chain=chain
    )
    return _exact_sup_estimate(
        sup, key, lambda: sup.unit_bound, per_draw=sup.unit, exponent=sup.exponent, **kw
    )


def _linear_chunk(chunk_size: Any, inputs: Any) -> Any:
    """``chunk_size`` with ``"auto"`` resolved for the backend and the problem (see the docs)."""
    if not (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    if not is_accelerator():
        return _CPU_CHUNK
    shape = jnp.shape(inputs)
    if len(shape) != 2:
        return _CPU_CHUNK  # the inputs check reports the shape
    per_draw = (shape[0] + shape[1]) * jnp.dtype(jnp.result_type(inputs)).itemsize
    chunk = _ACCEL_CHUNK
    while chunk > 1 and chunk * per_draw > _ACCEL_CHUNK_BYTES:
        chunk //= 2
    return chunk


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_finite(
    outputs_fn: Callable[[jax.Array, Any], jax.Array],
    batch: Any,
    key: jax.Array,
    *,
    num_samples: int,
    num_members: int | None = None,
    member_chunk_size: int | None = None,
    chunk_size: int | Literal["auto"] | None = 256,
    delta: float | None = 0.05,
) -> Estimate:
    r"""Monte Carlo empirical Rademacher complexity of a finite class given by its outputs.

    $$\widehat{\mathrm{Rad}} = \frac1K\sum_k \max_{j<M}\frac1n\langle\sigma^{(k)}, V_j\rangle,$$
    unbiased for $\mathrm{Rad}_S$, with $V_j$ = ``outputs_fn(indices, batch)[row]`` produced on
    demand ``member_chunk_size`` members at a time, so a class of $10^6$ members never needs its
    output matrix in memory (see :func:`finite_sup`). ``outputs_fn`` is traced three times on a
    first call (the first block, the bound pass, the sup pass) plus once by the Monte Carlo driver.

    Args:
      outputs_fn: ``(int32 indices[member_chunk_size], batch) -> [member_chunk_size, n]`` member
        outputs (a plain function, keyed by identity, or a registered pytree callable such as
        :func:`kernels.maurey.wqk_cover_outputs`, whose arrays are dynamic).
      batch: the data ``outputs_fn`` reads (any pytree, ``None`` for none).
      key: PRNG key.
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_members: M (default ``outputs_fn.num_members``). Static.
      member_chunk_size: members per block (default min(M, 1024)). Static.
      chunk_size: sign vectors per chunk (memory ``chunk_size * (n + member_chunk_size) * itemsize``
        plus ``member_chunk_size * n`` outputs); None for one at a time; ``"auto"``: the default on
        a CPU; on a GPU or TPU :func:`kernels._backend.default_chunk_size`
        ``("signs", size=n + member_chunk_size)``. Does not change the draws.
      delta: confidence of the McDiarmid interval (b = max |V|), None for none.

    Returns:
      Estimate with the McDiarmid $(1-\delta)$ interval.

    Raises:
      ValueError: on bad sizes, key, data or outputs, or non-finite outputs (also under ``jit``).

    >>> import jax, jax.numpy as jnp
    >>> V = jnp.array([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])  # all of {+-1}^2
    >>> est = rademacher_finite(lambda i, v: v[i], V, jax.random.key(0), num_samples=4,
    ...     num_members=4)
    >>> float(est.mean)  # max_j <s, V_j> / 2 = 1 for every s
    1.0
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    chain = CheckChain()
    sup, first = _finite_sup(outputs_fn, batch, num_members, member_chunk_size, chain)
    size = sup.num_examples + sup.member_chunk_size
    chunk_size = _auto_chunk(chunk_size, 256, "signs", size, sup.dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="outputs_fn")
    return _exact_sup_estimate(sup, key, lambda: sup.bound_from(first), chain=chain, **kw)


def _search_estimate(
    sup: SearchSup | ReadoutSearchSup,
    key: jax.Array,
    output_bound: Any,
    *,
    num_samples: int,
    chunk_size: int | None,
    delta: float | None,
    name: str = "apply_fn",
    chain: CheckChain,
) -> Estimate:
    """Search estimate; with ``output_bound``, its interval if no visited |f(x_i)| exceeds it."""
    if output_bound is not None:
        chain.positive(output_bound, "output_bound")
    b = None if output_bound is None or delta is None else jnp.asarray(output_bound, sup.dtype)

    def per_draw(signs: jax.Array) -> jax.Array:
        value, top = sup.search(signs)
        return value[None] if b is None else jnp.stack([value, (top > b).astype(sup.dtype)])

    kw = dict(num_samples=num_samples, chunk_size=chunk_size, name=name, chain=chain)
    stats = _draw_statistics(per_draw, key, sup, **kw)
    est = _estimate(stats, 0)
    if b is None:
        return est
    # the fraction of draws that exceeded b, as a count (exact up to 2**24 draws in float32,
    # clipped to int32 for the message; zero exactly when no draw exceeded it)
    count = jnp.minimum(jnp.round(stats.mean[1] * num_samples), jnp.asarray(2.0**31 - 1, sup.dtype))
    exceeded = jnp.where(stats.mean[1] > 0, jnp.maximum(count, 1), 0).astype(jnp.int32)
    chain.require(
        exceeded == 0,
        "output_bound: {} is exceeded by |f(x_i)| at parameters the search visited, for {} of "
        f"the {num_samples} sign vectors; it must bound every output of the class",
        b,
        exceeded,
    )
    valid = jnp.logical_and(exceeded == 0, jnp.logical_and(jnp.isfinite(b), b > 0))
    return _with_interval(
        est, b, num_examples=sup.num_examples, delta=delta, one_sided=True, valid=valid
    )


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_search(
    apply_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    num_samples: int,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    chunk_size: int | Literal["auto"] | None = 8,
    init_scale: Any = 1.0,
    output_bound: Any = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""A Monte Carlo **lower bound** on the Rademacher complexity of a constrained network class.

    Averages over K sign vectors the best $\frac1n\sum_i\sigma_i f_\theta(x_i)$ over the feasible
    iterates of projected gradient ascent (:func:`search_sup`): **at most** $\mathrm{Rad}_S$ in
    expectation; stderr over sign vectors. ``lower`` (given ``output_bound`` $b \ge |f_\theta(x_i)|$
    on $\Theta$): one-sided $(1-\delta)$ McDiarmid bound, ``upper`` $= \infty$; a visited
    $|f_\theta(x_i)| > b$ raises (also in ``jit``); runtime checks off: ``lower = -inf``.

    Args:
      apply_fn: ``(params, inputs) -> [n]`` (or ``[n, 1]``) outputs; keyed by identity.
      params: float32/float64 parameters; the first start and the structure of the class.
      inputs: the sample (any pytree; integer leaves allowed).
      key: PRNG key (sign vectors and random restarts).
      project: Euclidean projection onto the constraint set; keyed by identity.
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_steps: ascent steps. Static.
      step_size: first normalised step length eta_0 > 0, decaying to eta_0 / 100.
      num_restarts: starts per sign vector. Static.
      chunk_size: sign vectors vmapped at once (memory: ``chunk_size * num_restarts`` parameter
        copies and forward/backward passes on all n examples); None: one at a time; ``"auto"``: the
        default on a CPU; on a GPU or TPU :func:`kernels._backend.default_chunk_size`
        ``("probes", size=parameters * num_restarts)``.
      init_scale: relative scale > 0 of random restarts.
      output_bound: b > 0 for the McDiarmid lower confidence bound (optional).
      delta: its confidence (None for no interval).

    Returns:
      Estimate (``lower`` with ``output_bound`` and ``delta``).

    Raises:
      ValueError: bad sizes, key, dtypes, outputs; non-finite data; step_size/output_bound <= 0.

    >>> import jax, jax.numpy as jnp, kernels.norms as kn
    >>> est = rademacher_search(lambda w, x: x @ w, jnp.zeros(4), jnp.eye(4), jax.random.key(0),
    ...     project=lambda w: kn.project_lp_ball(w, p=2, radius=1.0), num_samples=4, num_steps=5,
    ...     step_size=2.0)
    >>> round(float(est.mean), 6)  # the exact sup is ||s||_2 / 4 = 0.5 for every s
    0.5
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    options = (project, num_steps, step_size, num_restarts, init_scale)
    chain = CheckChain()
    sup = _search_sup(apply_fn, params, inputs, _restart_key(key), *options, chain)
    size, dtype = tree_size(params)
    chunk_size = _auto_chunk(chunk_size, 8, "probes", size * num_restarts, dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, chain=chain)
    return _search_estimate(sup, key, output_bound, **kw)


@renamed_kwargs(num_draws="num_samples")
@compile_once
def rademacher_readout_search(
    features_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    inputs: Any,
    key: jax.Array,
    *,
    project: Callable[[Any], Any],
    readout_norm: float,
    readout_radius: Any,
    num_samples: int,
    num_steps: int,
    step_size: Any,
    num_restarts: int = 1,
    chunk_size: int | Literal["auto"] | None = 8,
    init_scale: Any = 1.0,
    output_bound: Any = None,
    delta: float | None = 0.05,
) -> Estimate:
    r"""A Monte Carlo **lower bound** on Rademacher complexity, readout sup in closed form.

    For the class $\{x \mapsto w^\top\phi_V(x) : V\in\mathcal V, \|w\|_q\le B\}$ averages
    over K sign vectors

    $$\max_{\text{iterates } V}\ \frac Bn\Big\|\sum_{i=1}^n\sigma_i\phi_V(x_i)\Big\|_{q^*}
    \;\le\; \sup_{V, \|w\|_q\le B}\frac1n\sum_i\sigma_i w^\top\phi_V(x_i)$$

    ($q^*$ the dual exponent), ascending over the inner parameters V only
    (:func:`readout_search_sup`): the same lower-bound semantics, standard error over sign
    vectors, interval, chunking and checks as :func:`rademacher_search` on
    ``apply_fn = lambda (V, w), x: features_fn(V, x) @ w``, with one parameter block fewer to
    search and the best readout for every V visited. **At most** $\mathrm{Rad}_S$ in
    expectation; exact (unbiased) when the features do not depend on V. ``lower`` (given
    ``output_bound`` $b \ge B\|\phi_V(x_i)\|_{q^*}$ on $\mathcal V$): one-sided $(1-\delta)$
    McDiarmid bound; a visited $B\|\phi_V(x_i)\|_{q^*} > b$ raises (also in ``jit``).

    Args:
      features_fn: ``(params, inputs) -> [n, k]`` features; keyed by identity.
      params: float32/float64 inner parameters V; the first start and the structure of
        $\mathcal V$.
      inputs: the sample (any pytree; integer leaves allowed).
      key: PRNG key (sign vectors and random restarts).
      project: Euclidean projection of V onto $\mathcal V$; keyed by identity.
      readout_norm: q in [1, inf], the norm of the readout ball. Static.
      readout_radius: B > 0, its radius (float, or array scalar to vary it without recompiling).
      num_samples: K >= 2 sign vectors (``num_draws`` is its deprecated name). Static.
      num_steps: ascent steps. Static.
      step_size: first normalised step length eta_0 > 0, decaying to eta_0 / 100.
      num_restarts: starts per sign vector. Static.
      chunk_size: sign vectors vmapped at once (memory: ``chunk_size * num_restarts`` copies of
        V and forward/backward passes of ``features_fn`` on all n examples); None: one at a
        time; ``"auto"``: the default on a CPU; on a GPU or TPU
        :func:`kernels._backend.default_chunk_size`
        ``("probes", size=parameters * num_restarts)``.
      init_scale: relative scale > 0 of random restarts.
      output_bound: b > 0 for the McDiarmid lower confidence bound (optional).
      delta: its confidence (None for no interval).

    Returns:
      Estimate (``lower`` with ``output_bound`` and ``delta``).

    Raises:
      ValueError: readout_norm not in [1, inf]; readout_radius, step_size or output_bound
        <= 0; bad sizes, key, dtypes, features; non-finite data.

    >>> import jax, jax.numpy as jnp
    >>> est = rademacher_readout_search(lambda v, x: x, jnp.zeros(1), jnp.eye(4),
    ...     jax.random.key(0), project=lambda v: v, readout_norm=2, readout_radius=1.0,
    ...     num_samples=4, num_steps=1, step_size=1.0)
    >>> float(est.mean)  # fixed features: the exact sup ||s||_2 / 4 = 0.5 for every s
    0.5
    """
    num_samples, chunk_size, delta = _check_counts(key, num_samples, chunk_size, delta)
    options = (project, readout_norm, readout_radius, num_steps, step_size, num_restarts)
    chain = CheckChain()
    sup = _readout_search_sup(
        features_fn, params, inputs, _restart_key(key), *options, init_scale, chain
    )
    size, dtype = tree_size(params)
    chunk_size = _auto_chunk(chunk_size, 8, "probes", size * num_restarts, dtype)
    kw = dict(num_samples=num_samples, chunk_size=chunk_size, delta=delta, name="features_fn")
    return _search_estimate(sup, key, output_bound, chain=chain, **kw)


def _exact_size(sup: Any, num_examples: Any) -> int:
    known = getattr(sup, "num_examples", None)
    if num_examples is None:
        if known is None:
            raise ValueError("num_examples: required when sup has no num_examples attribute")
        num_examples = known
    n = check_positive_int(num_examples, "num_examples")
    if known is not None and known != n:
        raise ValueError(f"num_examples: sup has {known} examples, got num_examples={n}")
    if n > _MAX_EXACT_EXAMPLES:
        raise ValueError(f"num_examples: enumeration needs n <= {_MAX_EXACT_EXAMPLES}, got {n}")
    return n


@compile_once
def rademacher_exact(
    sup: Callable[[jax.Array], jax.Array],
    *,
    num_examples: int | None = None,
    chunk_size: int | Literal["auto"] | None = 4096,
    dtype: Any = None,
) -> Estimate:
    r"""Exact empirical Rademacher average by enumerating all $2^n$ sign vectors ($n \le 20$).

    $$\mathrm{Rad}_S = 2^{-n}\sum_{\sigma\in\{\pm1\}^n} \mathrm{sup}(\sigma)$$ for any sup object
    of this module (:class:`LinearSup`, :class:`FiniteSup`; with :class:`SearchSup` it is the
    exact average of the search lower bound) or a function ``signs[c, n] -> values[c]``. Sign
    vector $t$ has $\sigma_i = -1$ iff bit $i$ of $t$ is set. The reference of the tests.

    Args:
      sup: a sup object or function of ``signs[c, n]``.
      num_examples: n <= 20 (default ``sup.num_examples``). Static.
      chunk_size: sign vectors per batch (memory ``chunk_size * n * itemsize`` signs plus the
        sup's own); None for one at a time; ``"auto"``: the default on a CPU; on a GPU or TPU
        :func:`kernels._backend.default_chunk_size`
        ``("signs", size=n)``.
      dtype: float32/float64 dtype of the signs (default ``sup.dtype``, else the default float).

    Returns:
      Estimate(mean, stderr=0, num_samples=2^n).

    Raises:
      ValueError: if n > 20 or not positive, on a bad chunk size or dtype, if ``sup`` does not
        return one value per sign vector (shape ``[c]`` for ``signs[c, n]``), or if the sup is
        non-finite at some sign vector (also under ``jit``).

    >>> import jax.numpy as jnp
    >>> from kernels.rademacher import linear_sup
    >>> est = rademacher_exact(linear_sup(jnp.eye(3), norm=1, radius=1.0))
    >>> round(float(est.mean), 6)  # ||s||_inf / 3
    0.333333
    """
    n = _exact_size(sup, num_examples)
    dtype = getattr(sup, "dtype", None) if dtype is None else dtype
    dtype = _check_float_dtype(jnp.result_type(float) if dtype is None else dtype, "dtype")
    total = 2**n
    chunk = _auto_chunk(_check_chunk(chunk_size), 4096, "signs", n, dtype)
    chunk = min(1 if chunk is None else chunk, total)
    bits = jnp.arange(n, dtype=jnp.uint32)
    one = jnp.ones((), dtype)

    def one_chunk(c: jax.Array) -> tuple[jax.Array, jax.Array]:
        t = c.astype(jnp.uint32) * jnp.uint32(chunk) + jnp.arange(chunk, dtype=jnp.uint32)
        signs = jnp.where(((t[:, None] >> bits[None, :]) & jnp.uint32(1)) == 1, -one, one)
        vals = jnp.asarray(sup(signs))
        if vals.shape != (chunk,):
            raise ValueError(
                f"sup: expected values of shape ({chunk},), one per sign vector of signs"
                f"[{chunk}, {n}], got shape {vals.shape}"
            )
        vals = vals.astype(dtype)
        real = t < jnp.uint32(total)
        bad = jnp.sum(jnp.logical_and(real, ~jnp.isfinite(vals)))
        return jnp.sum(jnp.where(real, vals, 0)), bad

    sums, bad = jax.lax.map(one_chunk, jnp.arange(-(-total // chunk), dtype=jnp.int32))
    check_that(
        jnp.sum(bad) == 0, f"sup: non-finite at {{}} of the {total} sign vectors", jnp.sum(bad)
    )
    mean = jnp.sum(sums) / jnp.asarray(total, dtype)
    return Estimate(mean=mean, stderr=jnp.zeros_like(mean), num_samples=total)
