r"""The flat Transformer construction for sparse Boolean functions and its learnable twin [rebuilt].

The paper ("A Sharper Picture of Generalization in Transformers", arXiv 2605.20988, appendix B)
lost its formulas in extraction; this module rebuilds the construction from its prose and from
SPEC.md section 5, and pins every rebuilt choice below.

**Target.** $f = \sum_{t=1}^{\omega} c_t \chi_{S_t}$ with $\chi_A$ the 0/1 even-parity
indicator (:class:`jaxbounds.data.boolean.FourierFunction`), all $|S_t| = D$ (= $D_f$), all
$c_t > 0$, $\omega \le T$; write $Z = \sum_t c_t$ and $s$ for the logit scale
(default $2\ln T$, $E = e^s$).

**Tokens.** $T + 1$ positions: the $T$ bits and an output ([CLS]) position $T$ whose bit is fixed to
0. Token $i$ is $x_i = [\,r_i;\; b_i;\; 0\,] \in \mathbb{R}^{p+2}$ where $r_i$ is the positional
code (one-hot $e_i$, $p = T+1$, hidden width $T+3$; or a Johnson-Lindenstrauss code, below),
coordinate $p$ holds the bit and coordinate $p+1$ is the parity/aggregation coordinate.

**Layers** ($X$ rows are tokens; parameter names in brackets):

1. Attention 1, no residual: $Y = \mathrm{softmax}(X W^{(1)}_{QK} X^\top) X W^{(1)}_V$ with
   $W^{(1)}_{QK}[t, j] = s$ for $j \in S_t$, $t < \omega$ (purely positional) [``w_qk1``] and
   $W^{(1)}_V[p, p] = 1$ [``w_v1``]. Active query $t$ puts weight $E/N_1$ on each member of
   $S_t$, $N_1 = DE + T + 1 - D$ ($=T^2/(DT^2+T+1-D)$ at the default), so its count coordinate
   is $u_t \approx k_t / D$ with $k_t$ the number of ones in $S_t$.
2. MLP with residual from the input: $H = X + \mathrm{relu}(Y W_{in} + b_{in}) W_{out}$,
   width $4(D+1)$ [``w_in``, ``b_in``, ``w_out``]. Four units per grid value $k/D$,
   $k = 0..D$: $W_{in}$ reads coordinate $p$ with weight 1, biases $-(k/D + o/(4D))$ for
   $o \in \{-3,-1,1,3\}$, output weights $2D\,[k \text{ even}]\,(+1,-1,-1,+1)$ into coordinate
   $p+1$. The sum is the trapezoid wave $g$ ($g(k/D) = [k$ even$]$, flat on
   $|u - k/D| \le 1/(4D)$, slope $\pm 2D$ in between, values in [0, 1]).
3. Attention 2, read only at the output position, no residual, scalar value:
   $y = \sum_j a_j\, (H_j W^{(2)}_V)$, $a = \mathrm{softmax}_j(H_T W^{(2)}_{QK} H_j^\top)$ with
   $W^{(2)}_{QK}[T, t] = s + \ln c_t$ for $t < \omega$ [``w_qk2``] and $W^{(2)}_V[p+1] = Z$
   [``w_v2``]. So $a_t = c_t E / N_2$ on active positions, $1/N_2$ elsewhere,
   $N_2 = ZE + T + 1 - \omega$, and $y \approx \sum_t c_t \chi_{S_t}(x)$.

Rebuilt choices: the count, the parity and the bit live in separate coordinates (the paper's
single last coordinate would add the bit to the MLP output through the residual); the MLP
residual comes from the input $X$ (the paper: "a residual connection after the MLP, but not
after the first attention layer", and attention 2 needs the positional codes in $H$).

**Error bound** (:func:`construction_error_bound`). With $\varepsilon_1 = (T+1-D)/N_1$ the
largest deviation $|u_t - k_t/D|$ (non-member bits leak weight $1/N_1$ each) and plateau radius
$\rho = 1/(4D)$, the active MLP outputs are off by at most $e_1 = 0$ if $\varepsilon_1 \le \rho$,
else $\min(1, 2D(\varepsilon_1 - \rho))$. Then, since the $T+1-\omega$ inactive positions have
$g \in [0, 1]$ and $0 \le f \le Z$,

$$|y(x) - f(x)| \le \frac{(T+1-\omega) Z}{ZE + T + 1 - \omega} + \frac{Z E}{N_2} Z e_1
\quad\Big(\le \frac{T+1-\omega}{T^2} = O(1/T) \text{ at } s = 2\ln T,\ T \ge 3\Big),$$

for every $x \in \{0,1\}^T$; $e_1 = 0$ at the default scale for all $T \ge 3$. At
$s = 6 \ln T$ it is $\le T^{-5}$ ($< 10^{-3}$ for $T \ge 4$).

**Johnson-Lindenstrauss variant** (``projection_dim=p``): $r_i$ = row $i$ of
$R \in \mathbb{R}^{(T+1) \times p}$ with i.i.d. $N(0, 1/p)$ entries and the positional blocks
become $R^\top M R$ (so logits are $(G M G)_{ij}$ with $G = R R^\top \approx I$). It is only
approximately exact; :func:`jl_width` gives the paper's width $p \ge 4\ln n / (\epsilon^2/2 -
\epsilon^3/3)$ for $n = T+1$ points (Dasgupta & Gupta 2003).

**Norm.** :func:`construction_norm_terms` gives each matrix's squared Frobenius norm;
:func:`jaxbounds.bounds.pac_bayes.construction_norm_bound` is Theorem 10's
$L(\omega, D, T) = 16D^2(D+1) + 8(D+1) + 1 + \omega + 4\omega(D+1)\ln^2 T$
[checked: 1303.93 at (10, 2, 20)]. Which terms of this
construction are below their term of $L$, and why: ``w_out`` is $16D^2 \cdot \#\{k \le D
\text{ even}\}$, not $16D^2(D+1)$ (odd grid values have output 0, so zero output weights);
``b_in`` is the actual sum of squared offsets, not the paper's $4(D+1)$ (entries up to
$1 + 3/(4D)$, so the paper's "each entry at most 1" is not literally true either); ``w_v2`` is
$Z^2 \le \omega$ (Cauchy-Schwarz, equality for equal coefficients); ``w_qk2`` is
$\sum_t (s + \ln c_t)^2 \le \omega s^2$ (equality only if all $c_t = 1$). ``w_in``
($4(D+1)$), ``w_v1`` (1) and ``w_qk1`` ($\omega D s^2$) match exactly.

References:
  arXiv 2605.20988, appendix B (construction), Theorem 10 (norm), Theorem 13 (Hessian trace);
  Dasgupta & Gupta 2003, doi:10.1002/rsa.10073 (JL lemma).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbounds.data.boolean import FourierFunction
from jaxbounds.models.ntk import ntk_diagonal
from kernels._checks import check_positive_int
from kernels.norms import tree_norm

__all__ = [
    "ConstructionQuantities",
    "ConstructionTransformer",
    "construction",
    "construction_error_bound",
    "construction_norm_paper_terms",
    "construction_norm_terms",
    "construction_quantities",
    "jl_width",
]


class _LayerNorm(nnx.Module):
    """LayerNorm over the last axis (scale 1, bias 0 at init; dtype-preserving, eps 1e-6).

    Written here because flax's LayerNorm promotes to float32 internally, which fails under
    strict dtype promotion with float64 inputs.
    """

    def __init__(self, width: int, dtype: Any) -> None:
        self.scale = nnx.Param(jnp.ones((width,), dtype))
        self.bias = nnx.Param(jnp.zeros((width,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + jnp.asarray(1e-6, x.dtype))
        shape = (1,) * (x.ndim - 1) + (x.shape[-1],)
        return y * self.scale[...].reshape(shape) + self.bias[...].reshape(shape)


class ConstructionTransformer(nnx.Module):
    r"""Two attention layers + one MLP on bits, as in the construction (the learnable twin).

    Same layers as :func:`construction` (module docstring), randomly initialised and trainable:
    every matrix is an ``nnx.Param`` with $N(0, 1/\text{fan-in})$ entries, zero MLP bias. The
    positional codes are fixed (an ``nnx.Variable``, not a parameter).

    Args:
      seq_len: T >= 1 bits (the model has T + 1 positions).
      mlp_width: MLP width (the construction uses 4(D+1)).
      projection_dim: width p of random Johnson-Lindenstrauss positional codes; None for one-hot
        codes (p = T + 1).
      extra_dims: extra hidden coordinates (zero in the input), e.g. to train wider models.
      layer_norm: apply a LayerNorm before each of the three sublayers (pre-LN); the hard-coded
        construction has none.
      rngs: ``nnx.Rngs`` (``params`` stream for the init and the projection).
      dtype: parameter dtype (default: the default float dtype).

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> model = ConstructionTransformer(5, mlp_width=8, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((3, 5), dtype=jnp.int32)).shape
    (3,)
    """

    def __init__(
        self,
        seq_len: int,
        *,
        mlp_width: int,
        projection_dim: int | None = None,
        extra_dims: int = 0,
        layer_norm: bool = False,
        rngs: nnx.Rngs,
        dtype: Any = None,
    ) -> None:
        for name, value, minimum in (
            ("seq_len", seq_len, 1),
            ("mlp_width", mlp_width, 1),
            ("extra_dims", extra_dims, 0),
        ):
            check_positive_int(value, name, minimum)
        dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        num_pos = seq_len + 1
        if projection_dim is None:
            codes = jnp.eye(num_pos, dtype=dtype)
        else:
            check_positive_int(projection_dim, "projection_dim")
            codes = jax.random.normal(rngs.params(), (num_pos, projection_dim), dtype)
            codes = codes / jnp.sqrt(jnp.asarray(projection_dim, dtype))
        p = codes.shape[1]
        d = p + 2 + extra_dims
        self.seq_len = seq_len
        self.bit_index = p
        self.parity_index = p + 1
        self.width = d
        self.positions = nnx.Variable(codes)

        def init(shape: tuple[int, ...], fan_in: int) -> nnx.Param:
            w = jax.random.normal(rngs.params(), shape, dtype) / jnp.sqrt(
                jnp.asarray(fan_in, dtype)
            )
            return nnx.Param(w)

        self.w_qk1 = init((d, d), d)
        self.w_v1 = init((d, d), d)
        self.w_in = init((d, mlp_width), d)
        self.b_in = nnx.Param(jnp.zeros((mlp_width,), dtype))
        self.w_out = init((mlp_width, d), mlp_width)
        self.w_qk2 = init((d, d), d)
        self.w_v2 = init((d,), d)
        if layer_norm:
            self.norms = nnx.List([_LayerNorm(d, dtype) for _ in range(3)])
        else:
            self.norms = None

    def embed(self, bits: jax.Array) -> jax.Array:
        """Tokens ``(batch, T+1, d)``: positional code, bit (0 at the output position), zeros."""
        bits = jnp.asarray(bits)
        if bits.ndim != 2 or bits.shape[1] != self.seq_len:
            raise ValueError(f"bits: expected shape (batch, {self.seq_len}), got {bits.shape}")
        codes = self.positions[...]
        batch = bits.shape[0]
        b = jnp.concatenate([bits.astype(codes.dtype), jnp.zeros((batch, 1), codes.dtype)], axis=1)
        pos = jnp.broadcast_to(codes[None], (batch, *codes.shape))
        rest = jnp.zeros((batch, codes.shape[0], self.width - codes.shape[1] - 1), codes.dtype)
        return jnp.concatenate([pos, b[:, :, None], rest], axis=2)

    def _norm(self, i: int, x: jax.Array) -> jax.Array:
        return x if self.norms is None else self.norms[i](x)

    def hidden(self, bits: jax.Array) -> dict[str, jax.Array]:
        """Intermediate activations: ``x`` (tokens), ``y`` (attention 1), ``h`` (after the MLP)."""
        x = self.embed(bits)
        z = self._norm(0, x)
        logits1 = jnp.einsum("bid,de,bje->bij", z, self.w_qk1[...], z)
        y = jax.nn.softmax(logits1, axis=-1) @ (z @ self.w_v1[...])
        pre = self._norm(1, y) @ self.w_in[...] + self.b_in[...][None, None, :]
        h = x + jax.nn.relu(pre) @ self.w_out[...]
        return {"x": x, "y": y, "h": h}

    def __call__(self, bits: jax.Array) -> jax.Array:
        """Outputs ``(batch,)`` for integer bits ``(batch, T)``."""
        h = self._norm(2, self.hidden(bits)["h"])
        query = h[:, self.seq_len, :]
        logits2 = jnp.einsum("bd,de,bje->bj", query, self.w_qk2[...], h)
        return jnp.einsum("bj,bj->b", jax.nn.softmax(logits2, axis=-1), h @ self.w_v2[...])


def _validate(f: FourierFunction, seq_len: int) -> tuple[int, int, np.ndarray]:
    if not isinstance(f, FourierFunction):
        raise ValueError(f"f: expected a FourierFunction, got {type(f).__name__}")
    check_positive_int(seq_len, "seq_len", 2)
    sizes = {len(s) for s in f.subsets}
    if f.sparsity < 1 or len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            f"f: expected >= 1 subsets, all of one size >= 1, got sizes {sorted(sizes)}"
        )
    if f.sparsity > seq_len:
        raise ValueError(f"f: sparsity {f.sparsity} exceeds seq_len={seq_len} (omega <= T)")
    if f.num_bits > seq_len:
        raise ValueError(f"seq_len: f uses bit {f.num_bits - 1}, expected seq_len >= {f.num_bits}")
    c = np.asarray(f.coefficients, dtype=np.float64)
    if not (np.all(np.isfinite(c)) and np.all(c > 0)):
        raise ValueError("f: the construction needs finite coefficients c_t > 0")
    return f.sparsity, sizes.pop(), c


def _scale(logit_scale: float | None, seq_len: int) -> float:
    s = 2.0 * math.log(seq_len) if logit_scale is None else float(logit_scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"logit_scale: expected a finite value > 0, got {logit_scale!r}")
    return s


def _mlp_grid(degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Biases (4(D+1),) and output weights (4(D+1),) of the trapezoid-wave MLP."""
    k = np.repeat(np.arange(degree + 1), 4)
    o = np.tile(np.array([-3.0, -1.0, 1.0, 3.0]), degree + 1)
    bias = -(k / degree + o / (4 * degree))
    sign = np.tile(np.array([1.0, -1.0, -1.0, 1.0]), degree + 1)
    out = 2.0 * degree * (k % 2 == 0) * sign
    return bias, out


def construction(
    f: FourierFunction,
    *,
    seq_len: int,
    logit_scale: float | None = None,
    projection_dim: int | None = None,
    key: jax.Array | None = None,
) -> ConstructionTransformer:
    r"""The hard-coded Transformer implementing $f$ on $\{0,1\}^T$ (module docstring) [rebuilt].

    Args:
      f: a FourierFunction with all subsets of one size $D \ge 1$, coefficients $> 0$,
        sparsity $\omega \le T$ and indices $< T$.
      seq_len: T >= 2.
      logit_scale: $s$; default $2 \ln T$ (the paper's). Larger is more exact (error bound
        $\approx (T+1-\omega) e^{-s}$), but enlarges the norm.
      projection_dim: use random JL positional codes of this width (needs ``key``).
      key: PRNG key of the projection.

    Returns:
      A :class:`ConstructionTransformer` (no LayerNorm, MLP width $4(D+1)$) with the
      constructed weights, in the coefficients' dtype.

    Raises:
      ValueError: for a function the construction does not cover, a bad scale, or a projection
        without a key.

    >>> import jax.numpy as jnp
    >>> from jaxbounds.data.boolean import tiling_parities
    >>> from kernels.walsh import cube_points
    >>> f = tiling_parities(6, 2)
    >>> model = construction(f, seq_len=6, logit_scale=6 * float(jnp.log(6.0)))
    >>> x = cube_points(6)
    >>> bool(jnp.max(jnp.abs(model(x) - f(x))) < 1e-3)
    True
    """
    _, degree, _ = _validate(f, seq_len)
    s = _scale(logit_scale, seq_len)
    if projection_dim is not None and key is None:
        raise ValueError("key: required when projection_dim is given")
    dtype, width = f.coefficients.dtype, 4 * (degree + 1)

    def abstract() -> ConstructionTransformer:
        return ConstructionTransformer(
            seq_len, mlp_width=width, projection_dim=projection_dim, rngs=nnx.Rngs(0), dtype=dtype
        )

    # An abstract module (no random init is computed); every value is set below.
    model = nnx.eval_shape(abstract)
    num_pos, p = seq_len + 1, model.bit_index
    if projection_dim is None:
        codes = np.eye(num_pos)
    else:
        codes = np.asarray(jax.random.normal(key, (num_pos, p), dtype)) / math.sqrt(p)
    model.positions.set_value(jnp.asarray(codes, dtype=dtype))

    weights = _construction_weights(f, codes, s, model.bit_index, model.width, degree)
    for name, value in weights.items():
        getattr(model, name).set_value(jnp.asarray(value, dtype=dtype))
    return model


def _construction_weights(
    f: FourierFunction, codes: np.ndarray, s: float, p: int, d: int, degree: int
) -> dict[str, np.ndarray]:
    """Every constructed matrix (module docstring), given the positional ``codes`` (T+1, p)."""
    num_pos, omega = codes.shape[0], f.sparsity
    c = np.asarray(f.coefficients, dtype=np.float64)
    m1 = np.zeros((num_pos, num_pos))
    for t, subset in enumerate(f.subsets):
        m1[t, list(subset)] = s
    m2 = np.zeros((num_pos, num_pos))
    m2[num_pos - 1, :omega] = s + np.log(c)
    out = {name: np.zeros((d, d)) for name in ("w_qk1", "w_v1", "w_qk2")}
    out["w_qk1"][:p, :p] = codes.T @ m1 @ codes
    out["w_v1"][p, p] = 1.0
    bias, grid = _mlp_grid(degree)
    out["w_in"] = np.zeros((d, bias.size))
    out["w_in"][p, :] = 1.0
    out["b_in"] = bias
    out["w_out"] = np.zeros((bias.size, d))
    out["w_out"][:, p + 1] = grid
    out["w_qk2"][:p, :p] = codes.T @ m2 @ codes
    out["w_v2"] = np.zeros((d,))
    out["w_v2"][p + 1] = c.sum()
    return out


def construction_error_bound(
    f: FourierFunction, *, seq_len: int, logit_scale: float | None = None
) -> float:
    r"""Upper bound on $\max_x |y(x) - f(x)|$ of the (unprojected) construction.

    $$\frac{(T+1-\omega)Z}{ZE + T+1-\omega} + \frac{ZE}{ZE + T+1-\omega}\, Z e_1,\qquad
    e_1 = \begin{cases} 0 & \varepsilon_1 \le \tfrac{1}{4D} \\
    \min(1, 2D(\varepsilon_1 - \tfrac{1}{4D})) & \text{else}\end{cases},\quad
    \varepsilon_1 = \frac{T+1-D}{DE + T+1-D},$$

    with $E = e^{s}$ (derivation in the module docstring). A bound, valid for every input.

    Raises:
      ValueError: as :func:`construction`.

    >>> from jaxbounds.data.boolean import tiling_parities
    >>> round(construction_error_bound(tiling_parities(10, 2), seq_len=10), 6)
    0.058432
    """
    omega, degree, c = _validate(f, seq_len)
    s = _scale(logit_scale, seq_len)
    e = math.exp(s)
    z = float(c.sum())
    n1 = degree * e + seq_len + 1 - degree
    eps1 = (seq_len + 1 - degree) / n1
    rho = 1.0 / (4 * degree)
    e1 = 0.0 if eps1 <= rho else min(1.0, 2 * degree * (eps1 - rho))
    n2 = z * e + seq_len + 1 - omega
    return (seq_len + 1 - omega) * z / n2 + z * e / n2 * z * e1


def construction_norm_terms(model: ConstructionTransformer) -> dict[str, float]:
    """Squared Frobenius norm of each parameter of ``model`` (and their ``"total"``)."""
    terms = {
        name: float(jnp.sum(getattr(model, name)[...] ** 2))
        for name in ("w_qk1", "w_v1", "w_in", "b_in", "w_out", "w_qk2", "w_v2")
    }
    if model.norms is not None:
        for leaf in jax.tree_util.tree_leaves(nnx.state(model.norms, nnx.Param)):
            terms["layer_norm"] = terms.get("layer_norm", 0.0) + float(jnp.sum(leaf**2))
    terms["total"] = sum(terms.values())
    return terms


def construction_norm_paper_terms(sparsity: int, degree: int, seq_len: int) -> dict[str, float]:
    """Theorem 10's per-matrix terms of L (same keys as :func:`construction_norm_terms`)."""
    s2 = (2 * math.log(seq_len)) ** 2
    terms = {
        "w_qk1": sparsity * degree * s2,
        "w_v1": 1.0,
        "w_in": 4.0 * (degree + 1),
        "b_in": 4.0 * (degree + 1),
        "w_out": 16.0 * degree**2 * (degree + 1),
        "w_qk2": sparsity * s2,
        "w_v2": float(sparsity),
    }
    terms["total"] = sum(terms.values())
    return terms


def jl_width(num_vectors: int, eps: float) -> int:
    r"""Johnson-Lindenstrauss width $\lceil 4 \ln n / (\epsilon^2/2 - \epsilon^3/3) \rceil$.

    Dasgupta & Gupta 2003: a Gaussian projection to this width keeps all pairwise squared
    distances of $n$ = ``num_vectors`` points within a factor $1 \pm \epsilon$ with positive
    probability.

    >>> jl_width(21, 0.5)
    147
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps: expected 0 < eps < 1, got {eps!r}")
    num_vectors = check_positive_int(num_vectors, "num_vectors", minimum=2)
    return math.ceil(4 * math.log(num_vectors) / (eps**2 / 2 - eps**3 / 3))


@dataclasses.dataclass(frozen=True)
class ConstructionQuantities:
    r"""What the PAC-Bayes paper's semi-analytic bound takes, measured on one model and data set.

    Built by :func:`construction_quantities`; read by
    :func:`jaxbounds.bounds.from_model.construction_bounds`.

    Attributes:
      G_u: $\max_x \|\nabla_\theta f_\theta(x)\|_2^2$ over the data.
      norm_sq: $\|\theta\|_2^2$.
      empirical_risk: the training loss the bound is stated for.
      num_examples: m.
      sparsity: $\omega$ of the target (None when the target is not a sparse function).
      degree: $D_f$ of the target (or None).
      seq_len: T (or None).
    """

    G_u: jax.Array
    norm_sq: jax.Array
    empirical_risk: jax.Array
    num_examples: int
    sparsity: int | None = None
    degree: int | None = None
    seq_len: int | None = None


def construction_quantities(
    apply_fn: Any,
    params: Any,
    inputs: jax.Array,
    *,
    empirical_risk: Any,
    grad_sq: jax.Array | None = None,
    function: FourierFunction | None = None,
    seq_len: int | None = None,
) -> ConstructionQuantities:
    r"""The :class:`ConstructionQuantities` of ``apply_fn`` at ``params`` on ``inputs``.

    Args:
      apply_fn: ``(params, inputs) -> (batch,)`` (``as_pure(model)[0]``).
      params: parameters (pytree).
      inputs: (m, T) bits (or any (m, ...) inputs).
      empirical_risk: the training loss at ``params``.
      grad_sq: the per-example $\|\nabla_\theta f(x)\|^2$ if already computed (else
        :func:`jaxbounds.models.ntk.ntk_diagonal` computes them).
      function: the target, for its sparsity and degree (optional).
      seq_len: T (with ``function``).

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[1.0, 0.0], [1.0, 2.0]])
    >>> q = construction_quantities(lambda p, x: x @ p["w"], {"w": jnp.array([3.0, 4.0])}, x,
    ...                             empirical_risk=0.0)
    >>> float(q.G_u), float(q.norm_sq), q.num_examples
    (5.0, 25.0, 2)
    """
    if grad_sq is None:
        grad_sq = jax.jit(lambda p, x: ntk_diagonal(apply_fn, p, x))(params, inputs)
    return ConstructionQuantities(
        G_u=jnp.max(grad_sq),
        norm_sq=tree_norm(params) ** 2,
        empirical_risk=jnp.asarray(empirical_risk),
        num_examples=int(inputs.shape[0]),
        sparsity=None if function is None else function.sparsity,
        degree=None if function is None else function.degree,
        seq_len=seq_len,
    )
