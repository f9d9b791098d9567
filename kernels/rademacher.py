r"""Empirical Rademacher complexity by Monte Carlo over sign vectors.

$$\mathrm{Rad}_S(\mathcal F) = \mathbb E_\sigma \sup_{f\in\mathcal F}
\frac1n\sum_{i=1}^n \sigma_i f(x_i), \qquad \sigma \sim \mathrm{Unif}\{\pm1\}^n,$$

with $n$ = ``num_examples``, the size of the sample $S$. Every estimator here averages a *sup
object* ``sup(signs[..., n]) -> values[...]`` (one value
$\sup_f \frac1n\langle\sigma, f(S)\rangle$ per sign vector), a registered frozen dataclass whose
arrays are pytree leaves and whose configuration (callables, sizes) is static:

- :class:`LinearSup` (:func:`linear_sup`): exact sup of a norm-ball linear class (dual norm);
- :class:`FiniteSup` (:func:`finite_sup`): exact sup of a finite class whose outputs
  ``outputs_fn(indices, batch)`` are produced on demand;
- :class:`SearchSup` (:func:`search_sup`): a *lower bound* of the sup over a constrained
  parameter set (projected gradient ascent);
- :class:`ReadoutSearchSup` (:func:`readout_search_sup`): the same lower bound for a class
  ending in a norm-bounded linear readout $w^\top\phi_V(x)$, $\|w\|_q \le B$, whose sup over
  $w$ is closed-form ($\frac Bn\|\sum_i\sigma_i\phi_V(x_i)\|_{q^*}$): the ascent runs over
  the inner parameters $V$ only.

:func:`rademacher_linear`, :func:`rademacher_finite`, :func:`rademacher_search` and
:func:`rademacher_readout_search` average them over ``num_samples`` random sign vectors;
:func:`rademacher_exact` enumerates all $2^n$.

Sign vectors and determinism
----------------------------
Draw $k$ uses its own key :func:`kernels.parallel.sample_key` ``(key, k)`` (``fold_in(key, k)``
for $k < 2^{32}$; past $2^{32}$ the hash of the 64-bit counter, so draws never repeat) and is
unpacked from $\lceil n/32\rceil$ raw 32-bit words (``jax.random.bits``): example $i$ gets bit
$i \bmod 32$ of word $\lfloor i/32\rfloor$, bit 1 meaning $-1$ (a shift, a mask and a bitcast
per sign, several times cheaper than ``jax.random.rademacher``). The key of a draw is derived
from its index inside the program (:func:`kernels.parallel.sample_statistics`), so neither
``chunk_size`` nor the device count changes which sign vector draw $k$ is (results differ only
by floating-point reassociation), and any chunk can be regenerated alone (:func:`sign_chunk`).
Up to $2^{53}$ draws, with JAX's x64 on or off; the means are accumulated in double-word
arithmetic, so a float32 estimate keeps its accuracy at $2^{30}$ draws and beyond. Random
restarts of the searches draw from :func:`kernels.parallel.reserved_key`, a key no sign vector
gets. "rbg" / "unsafe_rbg" keys work with the same invariances, their draws one at a time.

Chunks and memory
-----------------
Draws are processed ``chunk_size`` at a time (vectorised), each chunk reduced at once to a running
(count, mean, M2), so memory is that of one chunk whatever ``num_samples`` is; ``chunk_size=None``
runs one draw at a time (least memory). Chunks are spread over ``jax.devices()``. Defaults and
the memory of one chunk ($c$ = ``chunk_size``, $n$ examples, $d$ features, $s$ = itemsize):

========================= ======= ==============================================================
kernel                    default memory of one chunk
========================= ======= ==============================================================
rademacher_linear         "auto"  $c\,n\,s$ signs + $c\,d\,s$ products (1 MiB at n = 1024,
                                  float32); "auto" is 256 on a CPU, on a GPU/TPU the largest
                                  power of two up to 4096 with $c(n + d)s \le$ 1 GiB
rademacher_finite         256     $c\,n\,s$ signs + $c\,m\,s$ scores + $m\,n\,s$ outputs
                                  ($m$ = ``member_chunk_size``)
rademacher_search         8       $c\,R$ copies of the parameters and of one forward/backward
                                  pass of ``apply_fn`` on all $n$ examples ($R$ =
                                  ``num_restarts``)
rademacher_readout_search 8       $c\,R$ copies of the inner parameters and of one
                                  forward/backward pass of ``features_fn`` on all $n$ examples
rademacher_exact          4096    $c\,n\,s$ signs + what the sup object needs for $c$ sign
                                  vectors
========================= ======= ==============================================================

Compile once
------------
The entry points are compiled once per (callables, static options, shapes and dtypes)
(:func:`kernels._jit.compile_once`): data (``inputs``, ``batch``, ``params``), keys and array-valued
radii are dynamic arguments, so a second call with new data of the same shapes compiles nothing.
Callables (``apply_fn``, ``project``, ``outputs_fn``) are keyed by identity: create them once
and pass data through ``inputs`` / ``batch``. A Python float option (``radius``, ``step_size``,
``output_bound``) is static; pass ``jnp.asarray(value)`` to vary it without recompiling.

Checks
------
Non-finite data or parameters, a non-positive ``radius`` / ``readout_radius`` / ``step_size`` /
``output_bound`` and a sup that is non-finite on some sign vector raise an error naming the
argument, eagerly (``ValueError``) and inside ``jax.jit`` (``JaxRuntimeError``); see
:mod:`kernels._checks` for the switch that turns these runtime checks off. Integer or
half-precision data, an int ``key`` and empty samples raise ``ValueError`` at once. The body of the
searches' ascent loop is traced with the runtime checks off (a host callback per step, such as the
finiteness check of :func:`kernels.norms.project_lp_ball`, costs more than a step of a small
network on CPU): the starts are checked, and a NaN iterate makes its sign vector's value NaN,
reported as a non-finite sup. The runtime checks of one call form an ordered chain
(:mod:`kernels._ordered`): when several arguments are bad, the first in argument order is the
one named, on every backend, and ``project`` never sees a value that an argument's check refused.

Precision
---------
On a GPU, JAX's default float32 matmul is TF32 (about 10 significand bits). The searches' values
certify lower bounds, so their own products (the sign-weighted sum of outputs, the closed-form
readout sup $\frac Bn\|\Phi^\top\sigma\|_{q^*}$) run at ``Precision.HIGHEST`` whatever the
default; ``apply_fn`` / ``features_fn`` run at the user's precision. :func:`rademacher_linear`
(an unbiased estimate, whose TF32 rounding is zero-mean to first order) follows JAX's default
unless ``precision="highest"``, or ``"bf16x2"`` (two bfloat16 matmuls, 16 significand bits).

Confidence intervals
--------------------
Flipping one sign changes $\sup_f \frac1n\langle\sigma, f\rangle$ by at most $2b/n$ when
$|f(x_i)| \le b$; McDiarmid's inequality over the $nK$ independent signs of $K$ draws gives the
$(1-\delta)$ interval $\bar Y \pm 2b\sqrt{\ln(2/\delta)/(2nK)}$ for $\mathrm{Rad}_S$ around the
$K$-draw average $\bar Y$ of exact sups (:func:`mcdiarmid_halfwidth`).

References:
  Bartlett & Mendelson 2002, JMLR 3:463-482 (Rademacher complexity);
  McDiarmid 1989, "On the method of bounded differences";
  Chan, Golub, LeVeque 1979 (pairwise variance update);
  Joldes, Muller, Popescu 2017, doi:10.1145/3121432 (double-word sums).
"""

from __future__ import annotations

from kernels._rademacher import (
    _linear_chunk,  # noqa: F401
    mcdiarmid_halfwidth,
    rademacher_exact,
    rademacher_finite,
    rademacher_linear,
    rademacher_readout_search,
    rademacher_search,
)
from kernels._searches import (
    ReadoutSearchSup,
    SearchSup,
    _restart_key,  # noqa: F401
    readout_search_sup,
    search_sup,
)
from kernels._signs import (
    _check_float_array,  # noqa: F401
    _check_float_dtype,  # noqa: F401
    _mul_words,  # noqa: F401
    sign_chunk,
    sign_vectors,
)
from kernels._sups import FiniteSup, LinearSup, finite_sup, linear_sup

__all__ = [
    "FiniteSup",
    "LinearSup",
    "ReadoutSearchSup",
    "SearchSup",
    "finite_sup",
    "linear_sup",
    "mcdiarmid_halfwidth",
    "rademacher_exact",
    "rademacher_finite",
    "rademacher_linear",
    "rademacher_readout_search",
    "rademacher_search",
    "readout_search_sup",
    "search_sup",
    "sign_chunk",
    "sign_vectors",
]
