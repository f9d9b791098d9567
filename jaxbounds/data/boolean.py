r"""Boolean data: sparse Fourier-Walsh functions, tilings of parities, PARITY and its CoT.

Conventions (SPEC.md section 5, "A Sharper Picture of Generalization in Transformers"):

- Inputs are bits $x \in \{0,1\}^T$, stored as integer arrays of shape ``(batch, T)``.
- $\chi_A(x) = (1 + (-1)^{\sum_{i \in A} x_i}) / 2$ is the **even-parity indicator** (values 0/1;
  $\chi_\emptyset = 1$), and a target is $f = \sum_{t=1}^{\omega} c_t \chi_{S_t}$ with
  sparsity $\omega$ (number of terms) and degree $D_f = \max_t |S_t|$.
- In the $\pm 1$ Walsh convention of :mod:`kernels.walsh`, $\chi_A = (\chi^\pm_\emptyset +
  \chi^\pm_A)/2$, so :meth:`FourierFunction.walsh_coefficients` has $c_t/2$ at $S_t$ and
  $\sum_t c_t / 2$ at $\emptyset$.

References:
  "A Sharper Picture of Generalization in Transformers" (arXiv 2605.20988), section 2 and
  appendices E.3 and G (``shared/papers/sharper_picture_pac_bayes_transformers_math_stripped.txt``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernels._checks import check_positive_int
from kernels.walsh import cube_points, walsh_spectrum

__all__ = [
    "FourierFunction",
    "boolean_dataset",
    "even_parity_function",
    "parity",
    "parity_cot_data",
    "random_fourier_function",
    "tiling_parities",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FourierFunction:
    r"""$f(x) = \sum_{t=1}^{\omega} c_t \chi_{S_t}(x)$ with $\chi_A$ the 0/1 even-parity indicator.

    A pytree: ``coefficients`` is a leaf (so ``jax.grad`` with respect to them works), ``subsets``
    is static. Calling it on integer bits of shape ``(batch, T)`` (any ``T`` greater than every
    index in the subsets) returns ``(batch,)`` values in the coefficients' dtype.

    Attributes:
      subsets: tuple of sorted tuples of distinct bit indices $S_t$ (static).
      coefficients: array of shape ``(omega,)`` with the $c_t$.

    >>> import jax.numpy as jnp
    >>> f = FourierFunction(((0, 1),), jnp.array([1.0]))  # XNOR of bits 0 and 1
    >>> f(jnp.array([[0, 0, 1], [1, 0, 1], [1, 1, 0]]))
    Array([1., 0., 1.], dtype=float32)
    """

    subsets: tuple[tuple[int, ...], ...] = dataclasses.field(metadata={"static": True})
    coefficients: jax.Array

    def __post_init__(self) -> None:
        subsets = tuple(tuple(sorted(int(i) for i in s)) for s in self.subsets)
        for s in subsets:
            if len(set(s)) != len(s) or any(i < 0 for i in s):
                raise ValueError(f"subsets: expected distinct non-negative indices, got {s}")
        object.__setattr__(self, "subsets", subsets)
        coeff = self.coefficients
        # Validate concrete array-likes only (pytree unflattening may pass tracers or sentinels).
        if not isinstance(coeff, jax.core.Tracer) and isinstance(
            coeff, list | tuple | np.ndarray | jax.Array | float | int
        ):
            coeff = jnp.asarray(coeff)
            if not jnp.issubdtype(coeff.dtype, jnp.floating):
                coeff = coeff.astype(jnp.result_type(float))
            if coeff.shape != (len(subsets),):
                raise ValueError(
                    f"coefficients: expected shape ({len(subsets)},), got {coeff.shape}"
                )
            object.__setattr__(self, "coefficients", coeff)

    @property
    def sparsity(self) -> int:
        r"""$\omega$, the number of terms."""
        return len(self.subsets)

    @property
    def degree(self) -> int:
        r"""$D_f = \max_t |S_t|$ (0 for no terms)."""
        return max((len(s) for s in self.subsets), default=0)

    @property
    def num_bits(self) -> int:
        """The smallest T the function can be evaluated on (1 + largest index; 0 if none)."""
        return 1 + max((max(s) for s in self.subsets if s), default=-1)

    def masks(self, num_bits: int) -> jax.Array:
        """Inclusion matrix of shape ``(omega, num_bits)`` (int32): ``[t, i] = 1`` iff i in S_t."""
        if num_bits < self.num_bits:
            raise ValueError(f"num_bits: expected >= {self.num_bits}, got {num_bits}")
        m = np.zeros((self.sparsity, num_bits), dtype=np.int32)
        for t, s in enumerate(self.subsets):
            m[t, list(s)] = 1
        return jnp.asarray(m)

    def characters(self, bits: jax.Array) -> jax.Array:
        r"""The 0/1 values $\chi_{S_t}(x)$, shape ``(batch, omega)``, in the coefficients' dtype."""
        bits = jnp.asarray(bits)
        if bits.ndim != 2:
            raise ValueError(f"bits: expected shape (batch, T), got {bits.shape}")
        counts = bits.astype(jnp.int32) @ self.masks(bits.shape[1]).T
        return (1 - counts % 2).astype(self.coefficients.dtype)

    def __call__(self, bits: jax.Array) -> jax.Array:
        """Evaluate f on integer bits of shape ``(batch, T)``; returns ``(batch,)``."""
        return self.characters(bits) @ self.coefficients

    def values_on_cube(self, num_bits: int | None = None) -> jax.Array:
        """F on all ``2^T`` points in the index order of :func:`kernels.walsh.cube_points`."""
        n = self.num_bits if num_bits is None else num_bits
        return self(cube_points(n))

    def walsh_coefficients(self, num_bits: int | None = None) -> jax.Array:
        r"""The $\pm 1$ Walsh spectrum (:func:`kernels.walsh.walsh_spectrum`) on ``2^T`` points."""
        return walsh_spectrum(self.values_on_cube(num_bits))


def _distinct_subsets(key: jax.Array, n: int, d: int, w: int) -> tuple[tuple[int, ...], ...]:
    """``w`` distinct ``d``-subsets of range(n), uniformly without replacement."""
    total = math.comb(n, d)
    if total <= 200_000:
        combos = list(itertools.combinations(range(n), d))
        picks = np.asarray(jax.random.choice(key, total, (w,), replace=False))
        return tuple(combos[int(i)] for i in picks)
    chosen: list[tuple[int, ...]] = []  # rejection sampling of distinct subsets (w << total)
    i = 0
    while len(chosen) < w:
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, i), n))
        cand = tuple(sorted(int(j) for j in perm[:d]))
        if cand not in chosen:
            chosen.append(cand)
        i += 1
    return tuple(chosen)


def random_fourier_function(
    key: jax.Array,
    *,
    num_bits: int,
    degree: int,
    sparsity: int,
    normalization: Literal["unit_norm", "centred"] = "unit_norm",
) -> FourierFunction:
    r"""A random $f = \sum_{t=1}^{\omega} c_t \chi_{S_t}$ with all $|S_t| = D_f$ (paper recipe).

    The $\omega$ subsets are distinct, drawn uniformly without replacement among the
    $\binom{T}{D_f}$ subsets of size $D_f$ (the paper: "the initial elements of a permutation of all
    $D_f$-sized combinations"). Coefficients start as $|z_t|$, $z_t \sim N(0, 1)$, then

    - ``"unit_norm"`` (the theory's assumption, SPEC.md section 5): $c = |z| / \|z\|_2$, all
      positive with $\|c\|_2 = 1$;
    - ``"centred"`` (the paper's experiments, section 2): $c = (|z| - \mathrm{mean}) /
      \mathrm{std}$ (population std), centred with unit variance; some $c_t$ are negative. For
      $\omega = 1$ the std is 0 and $c = (1,)$ is returned instead.

    Args:
      key: PRNG key (must be concrete: the subsets are static Python tuples).
      num_bits: T >= 1. Static.
      degree: $D_f$, 1 <= degree <= T. Static.
      sparsity: $\omega$, 1 <= sparsity <= C(T, D_f). Static.
      normalization: ``"unit_norm"`` or ``"centred"``.

    Returns:
      A :class:`FourierFunction` with float coefficients of the default float dtype.

    Raises:
      ValueError: for sizes out of range or an unknown normalization.
    """
    n = check_positive_int(num_bits, "num_bits", 1)
    d = check_positive_int(degree, "degree", 1)
    w = check_positive_int(sparsity, "sparsity", 1)
    if d > n:
        raise ValueError(f"degree: expected <= num_bits={n}, got {d}")
    total = math.comb(n, d)
    if w > total:
        raise ValueError(f"sparsity: at most C({n}, {d}) = {total} distinct subsets, got {w}")
    if normalization not in ("unit_norm", "centred"):
        raise ValueError(f"normalization: expected 'unit_norm' or 'centred', got {normalization!r}")
    k_sub, k_coef = jax.random.split(key)
    subsets = _distinct_subsets(k_sub, n, d, w)
    z = jnp.abs(jax.random.normal(k_coef, (w,), dtype=jnp.result_type(float)))
    if normalization == "unit_norm":
        c = z / jnp.linalg.norm(z)
    elif w == 1:
        c = jnp.ones((1,), dtype=z.dtype)
    else:
        c = (z - jnp.mean(z)) / jnp.std(z)
    return FourierFunction(subsets, c)


def tiling_parities(num_bits: int, k: int) -> FourierFunction:
    r"""Tiling of $k$-parities: $f = \omega^{-1/2}\sum_{t=1}^{\omega} \chi_{\{(t-1)k,..,tk-1\}}$.

    $\omega = \lfloor T/k \rfloor$ disjoint blocks of $k$ consecutive bits, equal coefficients
    with $\|c\|_2 = 1$ (so $Z = \sum_t c_t = \sqrt{\omega}$). The paper's appendix E.3 case is
    $T = 20$, $k = 2$ ($\omega = 10$, $D_f = 2$). Not Boolean-valued for $\omega > 1$.

    Raises:
      ValueError: unless 1 <= k <= num_bits.

    >>> f = tiling_parities(4, 2)
    >>> f.subsets, [round(c, 6) for c in f.coefficients.tolist()]
    (((0, 1), (2, 3)), [0.707107, 0.707107])
    """
    n = check_positive_int(num_bits, "num_bits", 1)
    k = check_positive_int(k, "k", 1)
    if k > n:
        raise ValueError(f"k: expected <= num_bits={n}, got {k}")
    w = n // k
    subsets = tuple(tuple(range(t * k, (t + 1) * k)) for t in range(w))
    return FourierFunction(subsets, jnp.full((w,), 1.0 / math.sqrt(w)))


def even_parity_function(num_bits: int) -> FourierFunction:
    r"""$\chi_{[T]}$, the even-parity indicator of all T bits ($\omega = 1$, $D_f = T$).

    It equals ``1 - parity(x)``; the paper's PARITY task without chain of thought is this
    single degree-T character.
    """
    n = check_positive_int(num_bits, "num_bits", 1)
    return FourierFunction((tuple(range(n)),), jnp.ones((1,)))


def parity(bits: jax.Array) -> jax.Array:
    r"""PARITY: $x_1 \oplus \dots \oplus x_T$ (0/1, integer), shape ``(batch,)``.

    >>> import jax.numpy as jnp
    >>> parity(jnp.array([[1, 0, 1], [1, 1, 1]]))
    Array([0, 1], dtype=int32)
    """
    bits = jnp.asarray(bits)
    if bits.ndim != 2:
        raise ValueError(f"bits: expected shape (batch, T), got {bits.shape}")
    return jnp.sum(bits.astype(jnp.int32), axis=1, dtype=jnp.int32) % 2


def parity_cot_data(bits: jax.Array) -> dict[str, jax.Array]:
    r"""Chain-of-thought step data for PARITY (the paper's appendix G recipe) [rebuilt].

    Each step is the degree-2, sparsity-1 function $\chi_{\{0,1\}}$ (even parity of two bits)
    applied to the current input bit and the previous chain state, starting from the [CLS] bit
    $s_0 = 0$:

    $$s_j = \chi_{\{0,1\}}(x_j, s_{j-1}) = 1 \oplus x_j \oplus s_{j-1},\qquad j = 1, \dots, T,$$

    so $s_j = (x_1 \oplus \dots \oplus x_j) \oplus (j \bmod 2)$ and PARITY$(x) = s_T \oplus (T
    \bmod 2)$. A model of one step is ``construction(FourierFunction(((0, 1),), [1.0]),
    seq_len=2)`` applied to ``step_inputs[:, j]``.

    Args:
      bits: integer array ``(batch, T)``.

    Returns:
      dict with ``"step_inputs"`` ``(batch, T, 2)`` (pairs $(x_j, s_{j-1})$), ``"step_targets"``
      ``(batch, T)`` ($s_j$), ``"sequence"`` ``(batch, 2T)`` (the autoregressive sequence
      $x_1..x_T, s_1..s_T$) and ``"parity"`` ``(batch,)``; all int32.

    >>> import jax.numpy as jnp
    >>> parity_cot_data(jnp.array([[1, 1, 0]]))["step_targets"]
    Array([[0, 0, 1]], dtype=int32)
    """
    bits = jnp.asarray(bits)
    if bits.ndim != 2:
        raise ValueError(f"bits: expected shape (batch, T), got {bits.shape}")
    x = bits.astype(jnp.int32)

    def step(s_prev: jax.Array, x_j: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        s = 1 - (x_j + s_prev) % 2
        return s, (jnp.stack([x_j, s_prev], axis=-1), s)

    _, (pairs, states) = jax.lax.scan(step, jnp.zeros(x.shape[0], jnp.int32), x.T)
    step_inputs = jnp.swapaxes(pairs, 0, 1)
    step_targets = states.T
    return {
        "step_inputs": step_inputs,
        "step_targets": step_targets,
        "sequence": jnp.concatenate([x, step_targets], axis=1),
        "parity": parity(x),
    }


def boolean_dataset(
    f: FourierFunction,
    key: jax.Array | None,
    *,
    num_bits: int,
    num_examples: int | None = None,
) -> dict[str, jax.Array]:
    """Inputs and labels ``{"inputs": (m, T) int32, "labels": (m,)}`` of a Fourier function.

    ``num_examples=None`` enumerates all ``2^T`` inputs (index order of
    :func:`kernels.walsh.cube_points`; ``key`` is unused); otherwise ``num_examples`` uniform
    random bit strings are drawn with ``key``.

    Raises:
      ValueError: for bad sizes or a missing key.

    >>> boolean_dataset(tiling_parities(2, 2), None, num_bits=2)["labels"]
    Array([1., 0., 0., 1.], dtype=float32)
    """
    n = check_positive_int(num_bits, "num_bits", 1)
    if num_examples is None:
        inputs = cube_points(n, jnp.int32)
    else:
        m = check_positive_int(num_examples, "num_examples", 1)
        if key is None:
            raise ValueError("key: required when num_examples is given")
        inputs = jax.random.bernoulli(key, 0.5, (m, n)).astype(jnp.int32)
    return {"inputs": inputs, "labels": f(inputs)}
