r"""Log covers of linear classes, covering budgets, Dudley's integral, risk from Rademacher.

Every cover here is of the form
$\log N_\infty(\mathcal F, \epsilon, N, \|\cdot\|_2) \le C/\epsilon^2$;
the calculators return the coefficient ``C`` as ``terms["C"]`` and ``C / eps^2`` as ``value``.
All functions are pure ``jnp``: differentiable and broadcasting over their numeric inputs
(same-rank arrays), so a sweep over sample sizes or norms is one call.

References:
  Trauger & Tewari 2024, "Sequence length independent norm-based generalization bounds for
  Transformers", arXiv:2310.13088 (Lemmas 3.3, 3.4, 3.6).
  Edelman, Goel, Kakade & Zhang 2022, "Inductive biases and variable creation in self-attention
  mechanisms", arXiv:2110.10090 (Lemma 4.6, Lemma A.8).
  Dudley 1967; Bartlett & Mendelson 2002 (Rademacher to generalization gap).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxbounds.bounds._result import Bound, floats

__all__ = [
    "budget_optimisation",
    "dudley_numeric",
    "dudley_rademacher",
    "edelman_lemma_4_6_log_cover",
    "lemma_3_3_log_cover",
    "lemma_3_4_log_cover",
    "lemma_3_6_log_cover",
    "rademacher_to_gap",
]


def _cover(C: jax.Array, eps: jax.Array, name: str, status: str, hyp: dict) -> Bound:
    return Bound(
        value=C / eps**2,
        terms={"C": C, "eps": eps},
        hypotheses=hyp,
        vacuous=jnp.zeros(jnp.shape(C), dtype=bool),
        name=name,
        kind="log_cover",
        status=status,
    )


def lemma_3_3_log_cover(*, B_x, B_w, d, k, eps=1.0, num_points=None) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{1,\infty} \le B_w\}$ with $\|x\|_1 \le B_x$.

    $W \in \mathbb R^{k\times d}$:

    $$\log N_\infty(\mathcal F, \epsilon, N, \|\cdot\|_2)
      \le \frac{d B_w^2 B_x^2 \log(2k+1)}{\epsilon^2},$$
    an upper bound for any number of points ``N >= d`` (Lemma 3.2 reduces any N inputs to the
    d scaled basis vectors). Proof: Maurey's lemma per column.

    Args:
      B_x: bound on the inputs' l1 norm.
      B_w: bound on ``||W||_{1,inf}`` (max column l1 norm).
      d: input dimension.
      k: output dimension.
      eps: resolution (default 1, so ``value == terms["C"]``).
      num_points: N, if given the hypothesis ``N >= d`` is checked.

    Returns:
      Bound with ``terms["C"]`` the coefficient of 1/eps^2.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.3.

    >>> float(lemma_3_3_log_cover(B_x=1.0, B_w=2.0, d=3, k=4).value)  # 3*4*log(9)
    26.366694...
    """
    B_x, B_w, d, k, eps = floats(B_x, B_w, d, k, eps)
    C = d * B_w**2 * B_x**2 * jnp.log(2.0 * k + 1.0)
    hyp = {} if num_points is None else {"N >= d": jnp.asarray(num_points) >= d}
    return _cover(C, eps, "Trauger & Tewari Lemma 3.3", "paper", hyp)


def lemma_3_4_log_cover(*, B_x, B_w, d, k, eps=1.0, num_points=None) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{2,1} \le B_w\}$ with $\|x\|_1 \le B_x$.

    $$\log N_\infty \lesssim \frac{B_w^2 B_x^2 \log(dk)}{\epsilon^2}$$
    (Lemma 3.5 = Edelman et al. Lemma 4.6 at the d basis vectors; the paper's $\lesssim$ hides
    log factors other than d, k, T, which are dropped here).

    Args:
      B_x: bound on the inputs' l1 norm.
      B_w: bound on ``||W||_{2,1}`` (sum of column l2 norms).
      d: input dimension.
      k: output dimension.
      eps: resolution.
      num_points: N, if given the hypothesis ``N > d`` is checked.

    Returns:
      Bound with ``terms["C"]``.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.4.
    """
    B_x, B_w, d, k, eps = floats(B_x, B_w, d, k, eps)
    C = B_w**2 * B_x**2 * jnp.log(d * k)
    hyp = {} if num_points is None else {"N > d": jnp.asarray(num_points) > d}
    return _cover(C, eps, "Trauger & Tewari Lemma 3.4", "paper", hyp)


def lemma_3_6_log_cover(*, B_x, B_w, d, k, eps=1.0, num_points=None) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{1,1} \le B_w\}$ with $\|x\|_2 \le B_x$.

    $$\log N_\infty \le \frac{B_x^2 B_w^2 \log(2dk+1)}{\epsilon^2}$$
    (Maurey's lemma on the flattened matrix; no dependence on the number of points).

    Args:
      B_x: bound on the inputs' l2 norm.
      B_w: bound on ``||W||_{1,1}`` (sum of absolute entries).
      d: input dimension.
      k: output dimension.
      eps: resolution.
      num_points: N, if given the hypothesis ``N >= d`` is checked.

    Returns:
      Bound with ``terms["C"]``.

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.6.

    >>> float(lemma_3_6_log_cover(B_x=1.0, B_w=1.0, d=2, k=2).value)  # log(9)
    2.197224...
    """
    B_x, B_w, d, k, eps = floats(B_x, B_w, d, k, eps)
    C = B_x**2 * B_w**2 * jnp.log(2.0 * d * k + 1.0)
    hyp = {} if num_points is None else {"N >= d": jnp.asarray(num_points) >= d}
    return _cover(C, eps, "Trauger & Tewari Lemma 3.6", "paper", hyp)


def edelman_lemma_4_6_log_cover(*, B_x, B_w, d, num_points, eps=1.0) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{2,1} \le B_w\}$ on n points with $\|x\|_2 \le B_x$.

    $$\log N_\infty(\mathcal F, \epsilon, \{x_i\}_{i=1}^n, \|\cdot\|_2) \lesssim
      \frac{B_w^2 B_x^2 \log(d n)}{\epsilon^2}.$$
    For a Transformer the points are the ``n = m T`` tokens, which is where log T enters.
    Status: rebuilt from its restatement in Trauger & Tewari (hidden log factors dropped).

    Args:
      B_x: bound on the points' l2 norm.
      B_w: bound on ``||W||_{2,1}``.
      d: input dimension.
      num_points: n, the number of points covered (m T tokens).
      eps: resolution.

    Returns:
      Bound with ``terms["C"]``.

    References:
      Edelman et al. 2022, arXiv:2110.10090, Lemma 4.6; Trauger & Tewari 2024, Lemma 3.5.
    """
    B_x, B_w, d, n, eps = floats(B_x, B_w, d, num_points, eps)
    C = B_w**2 * B_x**2 * jnp.log(d * n)
    return _cover(C, eps, "Edelman et al. Lemma 4.6", "rebuilt", {})


def budget_optimisation(C: jax.Array, beta: jax.Array, eps=1.0) -> Bound:
    r"""Split a covering budget (Lemma A.8).

    Minimise $\sum_i C_i/\epsilon_i^2$ s.t. $\sum_i \beta_i\epsilon_i = \epsilon$.

    The minimum is $\gamma^3/\epsilon^2$ with $\gamma = \sum_i C_i^{1/3}\beta_i^{2/3}$, reached at
    $\epsilon_i = (\epsilon/\gamma)(C_i/\beta_i)^{1/3}$ (exact, by Lagrange / Hölder).

    Args:
      C: coefficients C_i >= 0, shape (n,) (the last axis is summed).
      beta: weights beta_i > 0, same shape.
      eps: total resolution.

    Returns:
      Bound with value gamma^3/eps^2 and terms ``gamma`` and ``eps_i``.

    References:
      Edelman et al. 2022, arXiv:2110.10090, Lemma A.8 (Trauger & Tewari Lemma E.1).

    >>> import jax.numpy as jnp
    >>> float(budget_optimisation(jnp.array([1.0, 8.0]), jnp.array([1.0, 1.0])).value)  # (1+2)^3
    27.0...
    """
    C, beta, eps = floats(C, beta, eps)
    gamma = jnp.sum(C ** (1.0 / 3.0) * beta ** (2.0 / 3.0), axis=-1)
    eps_i = (eps / gamma)[..., None] * (C / beta) ** (1.0 / 3.0)
    return Bound(
        value=gamma**3 / eps**2,
        terms={"gamma": gamma, "eps_i": eps_i},
        hypotheses={},
        vacuous=jnp.zeros(jnp.shape(gamma), dtype=bool),
        name="Lemma A.8 budget",
        kind="log_cover",
    )


def dudley_rademacher(*, C, A, num_samples, constant_delta=4.0, constant_integral=12.0) -> Bound:
    r"""Dudley's entropy integral for a class with $\log N(\epsilon) \le C/\epsilon^2$ and radius A.

    $$\mathrm{Rad} \le \inf_{\delta \ge 0}\Big(c_0\delta + c_1\int_\delta^A \sqrt{C/(n\epsilon^2)}\,
      d\epsilon\Big) = c_1\sqrt{C/n}\,\Big(1 + \ln\frac{c_0 A\sqrt n}{c_1\sqrt C}\Big)$$
    when the minimiser $\delta^* = (c_1/c_0)\sqrt{C/n}$ is below A, else $c_0 A$. With the standard
    constants $c_0 = 4, c_1 = 12$: $12\sqrt{C/n}(1 + \ln(A\sqrt n/(3\sqrt C)))$. A bound on the
    empirical Rademacher complexity (exact evaluation of the inf).

    Args:
      C: cover coefficient (log N <= C/eps^2).
      A: radius of the class (sup of |f| or of the empirical l2 norm).
      num_samples: n.
      constant_delta: c_0 (4 in the standard statement; 1 gives the paper's O(.) form).
      constant_integral: c_1 (12 standard).

    Returns:
      Bound (kind "rademacher") with terms ``delta_star`` and ``sqrt_C_over_n``.

    References:
      Dudley 1967; Bartlett, Foster & Telgarsky 2017 (arXiv:1706.08498), Lemma A.5.

    >>> float(dudley_rademacher(C=1.0, A=3.0, num_samples=1).value)  # 12 (1 + ln 1)
    12.0
    """
    C, A, n, c0, c1 = floats(C, A, num_samples, constant_delta, constant_integral)
    s = jnp.sqrt(C / n)
    delta_star = (c1 / c0) * s
    inside = delta_star < A
    safe_s = jnp.where(inside, s, 1.0)
    formula = c1 * safe_s * (1.0 + jnp.log(jnp.where(inside, A / delta_star, 1.0)))
    value = jnp.where(inside, formula, c0 * A)
    return Bound(
        value=value,
        terms={"delta_star": jnp.minimum(delta_star, A), "sqrt_C_over_n": s},
        hypotheses={},
        vacuous=value >= A,
        name="Dudley integral (C/eps^2 cover)",
        kind="rademacher",
    )


def dudley_numeric(
    log_cover: Callable[[jax.Array], jax.Array],
    *,
    A,
    num_samples,
    num_points: int = 2048,
    constant_delta=4.0,
    constant_integral=12.0,
    min_scale: float = 1e-9,
) -> jax.Array:
    r"""Dudley's integral evaluated numerically for any log covering function ``eps -> log N``.

    $$\inf_{\delta}\Big(c_0\delta + c_1\int_\delta^A\sqrt{\log N(\epsilon)/n}\,d\epsilon\Big),$$
    trapezoid rule on a geometric grid of ``num_points`` scales in [min_scale A, A], the inf
    taken over the grid points (a cross-check of :func:`dudley_rademacher`; accurate to about
    ``(ln(1/min_scale)/num_points)^2`` relative).

    Args:
      log_cover: vectorised ``eps -> log N(eps)`` (non-increasing).
      A: radius of the class.
      num_samples: n.
      num_points: grid size. Static.
      constant_delta: c_0.
      constant_integral: c_1.
      min_scale: smallest delta considered, as a fraction of A. Static.

    Returns:
      The numeric value (scalar array).
    """
    A, n, c0, c1 = floats(A, num_samples, constant_delta, constant_integral)
    t = jnp.linspace(jnp.log(min_scale), 0.0, num_points, dtype=A.dtype)
    eps = A * jnp.exp(t)
    g = jnp.sqrt(jnp.maximum(log_cover(eps), 0.0) / n) * eps  # integrand in d(log eps)
    seg = 0.5 * (g[1:] + g[:-1]) * (t[1:] - t[:-1])
    tail = jnp.concatenate([jnp.cumsum(seg[::-1])[::-1], jnp.zeros((1,), A.dtype)])
    return jnp.min(c0 * eps + c1 * tail)


def rademacher_to_gap(
    *, rademacher, num_samples, delta, lipschitz=1.0, loss_bound=1.0, empirical_risk=0.0
) -> Bound:
    r"""Generalization bound from an (empirical) Rademacher complexity.

    For a loss in [0, c] that is rho-Lipschitz in the prediction, with probability >= 1 - delta
    $$L_D \le L_S + 2\rho\,\mathrm{Rad}_S + 3c\sqrt{\ln(2/\delta)/(2n)}.$$
    Vacuous when the right-hand side is >= c (the trivial bound).

    Args:
      rademacher: bound on the empirical Rademacher complexity of the predictor class.
      num_samples: n.
      delta: failure probability in (0, 1).
      lipschitz: rho.
      loss_bound: c.
      empirical_risk: L_S.

    Returns:
      Bound (kind "risk") with terms ``complexity`` and ``confidence``.

    References:
      Bartlett & Mendelson 2002, JMLR 3:463-482, Theorem 8; Mohri et al., Foundations of ML,
      Theorem 3.5.
    """
    rad, n, delta, rho, c, ls = floats(
        rademacher, num_samples, delta, lipschitz, loss_bound, empirical_risk
    )
    complexity = 2.0 * rho * rad
    confidence = 3.0 * c * jnp.sqrt(jnp.log(2.0 / delta) / (2.0 * n))
    value = ls + complexity + confidence
    return Bound(
        value=value,
        terms={"empirical_risk": ls, "complexity": complexity, "confidence": confidence},
        hypotheses={},
        vacuous=value >= c,
        name="Rademacher generalization bound",
        kind="risk",
        assumed=("loss in [0, c]", "loss rho-Lipschitz in the prediction"),
    )
