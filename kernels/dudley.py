r"""Dudley's entropy integral, numerically, with the optimal cut-off.

$$\mathrm{Rad}_n(\mathcal F) \le \inf_{0 \le \delta \le A}\Big(c_0\,\delta
+ c_1 \int_\delta^A \sqrt{\frac{\log N(\mathcal F, \varepsilon, n)}{n}}\, d\varepsilon\Big)$$

with the standard constants $c_0 = 4$, $c_1 = 12$, $n$ the number of examples and
$A \ge \sup_f \|f\|$ (the radius of the class in the empirical $L_2$ norm). For
$\log N = C/\varepsilon^2$ the infimum is at $\delta^* = (c_1/c_0)\sqrt{C/n}$ and equals
$c_1\sqrt{C/n}\,(1 + \ln(A\sqrt n/((c_1/c_0)\sqrt C)))$, i.e.
$12\sqrt{C/n}(1 + \ln(A\sqrt n/(3\sqrt C)))$ (SPEC.md section 1), when $\delta^* < A$.

References:
  Dudley 1967, doi:10.1016/0022-1236(67)90017-1; Bartlett, Foster, Telgarsky 2017,
  arXiv:1706.08498 (Lemma A.5, the constants 4 and 12).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_positive_int, describe
from kernels._jit import compile_once
from kernels._ordered import CheckChain

__all__ = ["DudleyIntegral", "dudley_integral", "dudley_inverse_square"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DudleyIntegral:
    r"""The numerical Dudley bound and the cut-off that attains it.

    Attributes:
      value: $\min_\delta \big(c_0\delta + c_1\int_\delta^A\sqrt{\log N(\varepsilon)/n}\,
        d\varepsilon\big)$ over the grid (an upper bound on the Rademacher complexity).
      cutoff: the minimising $\delta^*$ (equal to $A$ when the integral never pays off).
    """

    value: Any
    cutoff: Any


def _float_dtype(value: Any, name: str) -> Any:
    """The floating dtype a result follows: ``value``'s if it is a float32/64 array."""
    dtype = jnp.result_type(value)
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return jnp.result_type(float)
    if dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"{name}: expected a float32 or float64 value, got dtype {dtype}")
    return dtype


def _check_coefficients(coef_delta: Any, coef_integral: Any, chain: CheckChain) -> None:
    chain.positive(coef_delta, "coef_delta")
    chain.positive(coef_integral, "coef_integral")


def dudley_inverse_square(
    log_cover_coef: Any,
    *,
    num_examples: int,
    radius: Any,
    coef_delta: float = 4.0,
    coef_integral: float = 12.0,
) -> jax.Array:
    r"""Closed form of the Dudley bound for $\log N(\varepsilon) = C/\varepsilon^2$.

    $$c_1\sqrt{C/n}\,\big(1 + \ln\frac{A}{(c_1/c_0)\sqrt{C/n}}\big)$$ when
    $\delta^* = (c_1/c_0)\sqrt{C/n} < A$, else $c_0 A$ ($\delta = A$); $0$ when $C = 0$
    (a single function). Exact; elementwise over arrays of $C$ and $A$.

    Args:
      log_cover_coef: $C \ge 0$, finite (may be traced, or an array).
      num_examples: $n \ge 1$, the number of examples. Static.
      radius: $A > 0$, finite (may be traced).
      coef_delta: $c_0 > 0$ (default 4).
      coef_integral: $c_1 > 0$ (default 12).

    Returns:
      The bound, in the floating dtype of ``log_cover_coef`` (default float for ints).

    Raises:
      ValueError: if ``num_examples`` is not an int >= 1, ``log_cover_coef`` is negative or not
        finite, ``radius`` or a coefficient is not a finite value > 0 (eagerly and under ``jit``).

    >>> round(float(dudley_inverse_square(1.0, num_examples=100, radius=1.0)), 5)  # 1.2(1+ln(10/3))
    2.64477
    """
    n = check_positive_int(num_examples, "num_examples")
    chain = CheckChain()  # runtime checks in argument order (kernels._ordered)
    chain.positive(radius, "radius", scalar=False)
    _check_coefficients(coef_delta, coef_integral, chain)
    try:
        np.broadcast_shapes(np.shape(log_cover_coef), np.shape(radius))
    except ValueError:
        raise ValueError(
            f"log_cover_coef, radius: shapes {np.shape(log_cover_coef)} and {np.shape(radius)} do "
            "not broadcast (the bound is elementwise over them)"
        ) from None
    dtype = _float_dtype(log_cover_coef, "log_cover_coef")
    c = jnp.asarray(log_cover_coef).astype(dtype)
    chain.require(
        jnp.logical_and(jnp.isfinite(c), c >= 0),
        "log_cover_coef: expected a finite value >= 0",
    )
    a = jnp.asarray(radius).astype(dtype)
    s = jnp.sqrt(c / n)
    delta_star = coef_integral / coef_delta * s
    positive = delta_star > 0
    ratio = a / jnp.where(positive, delta_star, jnp.ones_like(delta_star))
    inside = jnp.where(positive, coef_integral * s * (1 + jnp.log(ratio)), jnp.zeros_like(s))
    out = jnp.where(delta_star < a, inside, coef_delta * a)
    return jnp.where(jnp.isnan(delta_star), delta_star, out)  # checks off: NaN stays NaN


def _tail_integrals(
    log_cover: Callable[[jax.Array], jax.Array],
    lo: jax.Array,
    hi: jax.Array,
    num_examples: int,
    num_grid: int,
    chain: CheckChain,
) -> tuple[jax.Array, jax.Array]:
    r"""Grid $\varepsilon_k$ log-spaced on [lo, hi] and $\int_{\varepsilon_k}^{hi}$ at each point.

    Trapezoid rule in $u = \ln\varepsilon$ on $\sqrt{\log N(\varepsilon)/n}\,\varepsilon$
    (negative $\log N$ read as 0).
    """
    dtype = lo.dtype
    u = jnp.linspace(jnp.log(lo), jnp.log(hi), num_grid, dtype=dtype)
    eps = jnp.exp(u)
    log_n = jnp.asarray(log_cover(eps))
    if log_n.shape != eps.shape:
        raise ValueError(
            f"log_cover_fn: must map an array of epsilon of shape {eps.shape} to log N of the "
            f"same shape, got shape {log_n.shape}"
        )
    log_n = log_n.astype(dtype)
    chain.require(
        jnp.all(jnp.isfinite(log_n)),
        "log_cover_fn: returned NaN or inf at {} of the grid points",
        jnp.sum(~jnp.isfinite(log_n)),
    )
    g = jnp.sqrt(jnp.maximum(log_n, 0) / num_examples) * eps
    seg = 0.5 * (g[1:] + g[:-1]) * (u[1:] - u[:-1])
    tail = jnp.concatenate([jnp.cumsum(seg[::-1])[::-1], jnp.zeros((1,), dtype)])
    return eps, tail


def _integral_args(
    num_examples: int,
    num_grid: int,
    min_ratio: float,
    radius: Any,
    c0: Any,
    c1: Any,
    chain: CheckChain,
) -> tuple[int, int, jax.Array]:
    """Checked n, grid size and radius (an array in the result dtype).

    The radius is cleaned (:meth:`CheckChain.clean`), so a bad radius is reported as
    ``radius``, never as NaN values of ``log_cover_fn`` on a grid built from it.
    """
    n = check_positive_int(num_examples, "num_examples")
    m = check_positive_int(num_grid, "num_grid", minimum=8)
    if not 0 < min_ratio < 1:
        raise ValueError(f"min_ratio: expected a value in (0, 1), got {describe(min_ratio)}")
    chain.positive(radius, "radius")
    _check_coefficients(c0, c1, chain)
    a = jnp.asarray(radius).astype(_float_dtype(radius, "radius"))
    return n, m, chain.clean(a)


@compile_once
def dudley_integral(
    log_cover_fn: Callable[..., jax.Array],
    *,
    num_examples: int,
    radius: Any,
    coef_delta: float = 4.0,
    coef_integral: float = 12.0,
    num_grid: int = 8192,
    min_ratio: float = 1e-12,
    args: Any = None,
) -> DudleyIntegral:
    r"""Numerical Dudley bound with the optimal cut-off delta (see the module docstring).

    $$\inf_\delta \big(c_0\delta + c_1\int_\delta^A\sqrt{\log N(\varepsilon)/n}\,d\varepsilon\big)$$

    The integral is a trapezoid rule in $u = \ln\varepsilon$ ($d\varepsilon = \varepsilon\,du$,
    which resolves the $1/\varepsilon$ singularity of $\sqrt{C}/\varepsilon$ integrands) on
    ``num_grid`` log-spaced points in [A * ``min_ratio``, A]; the cumulative integral gives
    the objective at every grid $\delta$ at once; the best grid point is refined once on a fine
    grid between its neighbours (the integral above them recomputed on its own grid). Accurate
    to about $10^{-7}$ relative for smooth $\log N$. Negative $\log N$ values count as 0.

    Compiled once per (``log_cover_fn``, static options, shapes): pass data the cover depends
    on through ``args`` (``log_cover_fn(eps, args)``) rather than a new ``lambda`` per call,
    and a ``radius`` that varies as an array, so a second call compiles nothing. Works inside
    ``jax.jit`` / ``vmap`` if ``log_cover_fn`` is traceable.

    Args:
      log_cover_fn: $\varepsilon \mapsto \log N(\mathcal F, \varepsilon, n)$, vectorised over a
        1-D array of $\varepsilon$ (non-increasing, finite for $\varepsilon > 0$); called as
        ``log_cover_fn(eps)``, or ``log_cover_fn(eps, args)`` when ``args`` is given.
      num_examples: n >= 1, the number of examples. Static.
      radius: A > 0, the class radius (the integral's upper limit); may be traced.
      coef_delta: $c_0 > 0$ (default 4).
      coef_integral: $c_1 > 0$ (default 12).
      num_grid: grid size (>= 8). Static.
      min_ratio: smallest $\delta / A$ considered, in (0, 1). Static.
      args: optional pytree of arrays passed to ``log_cover_fn`` (traced).

    Returns:
      DudleyIntegral(value, cutoff), in the dtype of ``radius`` (default float for Python
      numbers).

    Raises:
      ValueError: if ``num_examples`` or ``num_grid`` is not a positive int, ``min_ratio`` is
        not in (0, 1), ``log_cover_fn`` returns the wrong shape; if ``radius`` or a coefficient
        is not a finite value > 0, or ``log_cover_fn`` returns NaN/inf on the grid (runtime
        checks, eagerly and under ``jit``).

    >>> out = dudley_integral(lambda e: 1.0 / e**2, num_examples=100, radius=1.0)
    >>> round(float(out.value), 5), round(float(out.cutoff), 3)  # closed form: 2.64477 at 0.3
    (2.64477, 0.3)
    """
    chain = CheckChain()  # runtime checks in argument order (kernels._ordered)
    n, m, a = _integral_args(
        num_examples, num_grid, min_ratio, radius, coef_delta, coef_integral, chain
    )

    def tails(lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
        cover = (lambda e: log_cover_fn(e)) if args is None else (lambda e: log_cover_fn(e, args))
        return _tail_integrals(cover, lo, hi, n, m, chain)

    return _minimise(tails, a * min_ratio, a, coef_delta, coef_integral)


def _minimise(
    tails: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
    lo: jax.Array,
    a: jax.Array,
    c0: float,
    c1: float,
) -> DudleyIntegral:
    r"""Minimise $c_0\delta + c_1\int_\delta^A$ on a log grid on [lo, A], then refine once.

    The best grid point is refined on a fine grid between its neighbours, with the integral
    above the right neighbour recomputed on its own grid.
    """
    eps, tail = tails(lo, a)
    obj = c0 * eps + c1 * tail
    i = jnp.argmin(obj)
    left = eps[jnp.maximum(i - 1, 0)]
    right = eps[jnp.minimum(i + 1, eps.shape[0] - 1)]
    base = tails(right, a)[1][0]  # integral from `right` to A, on its own fine grid
    eps2, tail2 = tails(left, right)
    obj2 = c0 * eps2 + c1 * (tail2 + base)
    j = jnp.argmin(obj2)
    better = obj2[j] <= obj[i]
    return DudleyIntegral(
        value=jnp.where(better, obj2[j], obj[i]), cutoff=jnp.where(better, eps2[j], eps[i])
    )
