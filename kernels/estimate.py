"""The result type every Monte Carlo kernel returns.

One stream of samples has three containers, one per stage, and only this one is a result:
:class:`Estimate` (mean, standard error, sample count: what a kernel returns);
:class:`kernels.parallel.SampleStats` (the sums one program accumulates over its samples, inside
the kernel); :class:`kernels.blocks.MonteCarloState` (the same sums, mergeable across blocks,
processes and checkpoints, with the sample ranges they cover).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kernels._checks import describe

__all__ = ["Estimate", "estimate_from_samples"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Estimate:
    r"""A Monte Carlo estimate with its uncertainty.

    Registered as a pytree: ``mean``, ``stderr``, ``lower`` and ``upper`` are leaves (so an
    ``Estimate`` passes through ``jax.jit`` and ``jax.vmap``); ``num_samples`` and ``delta`` are
    static metadata.

    Attributes:
      mean: the estimate, $\hat\mu = \frac{1}{K}\sum_k Y_k$.
      stderr: its standard error, $s / \sqrt{K}$ with $s$ the sample standard deviation
        (``ddof=1``), unless a kernel's docstring says otherwise.
      num_samples: $K$, the number of independent Monte Carlo samples the standard error is
        computed from (probes, sign vectors, perturbations, or antithetic pairs).
      lower: lower end of a $(1-\delta)$ confidence interval where a kernel provides one
        (e.g. McDiarmid for Rademacher averages), else ``None``.
      upper: upper end of that interval, else ``None``.
      delta: the $\delta$ of that interval, else ``None``.
      num_evaluations: the number of function evaluations (loss evaluations, matrix-vector
        products) behind the estimate when it differs from ``num_samples`` (two per antithetic
        pair; all ``num_matvecs`` of Hutch++), else ``None``.
    """

    mean: Any
    stderr: Any
    num_samples: int = dataclasses.field(metadata={"static": True})
    lower: Any = None
    upper: Any = None
    delta: float | None = dataclasses.field(default=None, metadata={"static": True})
    num_evaluations: int | None = dataclasses.field(default=None, metadata={"static": True})

    def __repr__(self) -> str:
        def fmt(x: Any) -> str:
            try:
                return f"{float(x):.6g}"
            except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
                return repr(x)

        text = f"Estimate(mean={fmt(self.mean)}, stderr={fmt(self.stderr)}, n={self.num_samples}"
        if self.lower is not None:
            text += f", {1 - (self.delta or 0):g}-interval=[{fmt(self.lower)}, {fmt(self.upper)}]"
        return text + ")"


def estimate_from_samples(samples: jax.Array, axis: int = 0) -> Estimate:
    r"""Mean and standard error (``ddof=1``) of i.i.d. samples along ``axis``.

    $$\hat\mu = \frac1K\sum_k Y_k, \qquad
    \mathrm{se} = \sqrt{\frac{1}{K(K-1)}\sum_k (Y_k - \hat\mu)^2}.$$

    Holds all K samples in memory: Monte Carlo kernels stream theirs through
    :func:`kernels.parallel.sample_statistics` instead. Computed on the samples scaled by a power
    of two (exact) and shifted by the first one, so equal samples give a standard error of
    exactly 0 and neither the sum nor the squares overflow or underflow where the result is
    representable (float32 samples of 3e38 or 1e-30 included). NaN or infinite samples make
    the mean and stderr NaN or inf (they are not dropped; kernels check their samples first).

    Args:
      samples: float32/float64 array whose ``axis`` indexes i.i.d. Monte Carlo samples (at
        least 2); integer samples are read in the default float dtype.
      axis: the sample axis (negative values count from the end).

    Returns:
      Estimate(mean, stderr, num_samples), in the dtype of ``samples``.

    Raises:
      ValueError: if fewer than 2 samples are given, ``axis`` is out of range, or ``samples``
        is float16/bfloat16/complex.

    >>> import jax.numpy as jnp
    >>> estimate_from_samples(jnp.array([1.0, 2.0, 3.0]))
    Estimate(mean=2, stderr=0.57735, n=3)
    """
    samples = jnp.asarray(samples)
    if jnp.issubdtype(samples.dtype, jnp.integer) or jnp.issubdtype(samples.dtype, jnp.bool_):
        samples = samples.astype(jnp.result_type(float))
    if samples.dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"samples: expected float32 or float64 values, got dtype {samples.dtype}")
    ndim = samples.ndim
    if ndim == 0:
        raise ValueError("samples: expected an array with a sample axis, got a scalar")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(f"axis: expected an int in [-{ndim}, {ndim}), got {describe(axis)}")
    num = samples.shape[axis]
    if num < 2:
        raise ValueError(f"samples: need at least 2 samples along axis {axis}, got {num}")
    return _shifted_scaled_moments(samples, axis, num)


def _shifted_scaled_moments(samples: jax.Array, axis: int, num: int) -> Estimate:
    r"""Mean and standard error of ``samples`` computed on $y = 2^{-e} x$ shifted by $y_0$.

    $2^e$ (exact) is the power of two just above $\max|x|$ along ``axis``, so $|y| < 1$ and
    $d = y - y_0 \in (-2, 2)$: squares neither overflow (3e38 in float32) nor underflow
    (1e-30), and equal samples give $d = 0$, a standard error of exactly 0. The variance is the
    corrected two-pass sum $\sum r^2 - (\sum r)^2 / K$ with $r = d - \bar d$.
    """
    top = jax.lax.stop_gradient(jnp.max(jnp.abs(samples), axis=axis, keepdims=True))
    _, e = jnp.frexp(top)
    e = jnp.where(jnp.logical_and(jnp.isfinite(top), top > 0), e, 0)
    y = _times_pow2(samples, -e)
    shift = jax.lax.index_in_dim(y, 0, axis=axis, keepdims=True)
    d = y - shift
    d_mean = jnp.mean(d, axis=axis, keepdims=True)
    r = d - d_mean
    count = jnp.asarray(num, samples.dtype)
    squares = jnp.sum(r * r, axis=axis, keepdims=True)
    var = jnp.maximum(squares - jnp.sum(r, axis=axis, keepdims=True) ** 2 / count, 0) / (count - 1)
    mean = _times_pow2(shift + d_mean, e)
    stderr = _times_pow2(jnp.sqrt(var / count), e)
    return Estimate(
        mean=jnp.squeeze(mean, axis=axis), stderr=jnp.squeeze(stderr, axis=axis), num_samples=num
    )


def _times_pow2(x: jax.Array, e: jax.Array) -> jax.Array:
    """``x * 2**e`` as two products by normal powers of two (exact in the normal range)."""
    one = jnp.ones((), x.dtype)
    half = e // 2
    return x * jnp.ldexp(one, half) * jnp.ldexp(one, e - half)
