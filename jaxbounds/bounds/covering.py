r"""Log covers of linear classes, covering budgets, Dudley's integral, risk from Rademacher.

Every cover here is of the form
$\log N_\infty(\mathcal F, \epsilon, N, \|\cdot\|_2) \le C/\epsilon^2$;
the calculators return the coefficient ``C`` as ``terms["C"]`` and ``C / eps^2`` as ``value``.
All calculators compute in float64 numpy (whatever the global JAX setting), broadcast over their
numeric inputs (same-shape arrays make a sweep one call), validate their inputs (``ValueError``
naming the argument; ``strict=False`` flags the bound not valid instead) and return a
:class:`~jaxbounds.bounds.Bound`. Dudley's integral is :mod:`kernels.dudley`, run in a float64
scope.

References:
  Trauger & Tewari 2024, "Sequence length independent norm-based generalization bounds for
  Transformers", arXiv:2310.13088 (Lemmas 3.3, 3.4, 3.6).
  Edelman, Goel, Kakade & Zhang 2022, "Inductive biases and variable creation in self-attention
  mechanisms", arXiv:2110.10090 (Lemma 4.6, Lemma A.8).
  Dudley 1967; Bartlett & Mendelson 2002 (Rademacher to generalization gap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from jaxbounds.bounds._result import (
    Bound,
    Check,
    Inputs,
    float64_scope,
    int_option,
    log_2x_plus_1,
    quiet,
)
from kernels import dudley as _kernels_dudley

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


def _kernel_inverse_square(
    C: float, *, num_examples: int, radius: float, coef_delta: float, coef_integral: float
) -> float:
    """``kernels.dudley.dudley_inverse_square`` in float64, as a Python float."""
    with float64_scope():
        out = _kernels_dudley.dudley_inverse_square(
            C,
            num_examples=num_examples,
            radius=radius,
            coef_delta=coef_delta,
            coef_integral=coef_integral,
        )
    return float(out)


def _kernel_integral(
    fn: Callable, *, num_examples: int, radius: float, num_grid: int, **options: Any
) -> tuple[float, float]:
    """``kernels.dudley.dudley_integral`` in float64, as ``(value, cutoff)`` floats."""
    with float64_scope():
        out = _kernels_dudley.dudley_integral(
            fn, num_examples=num_examples, radius=radius, num_grid=num_grid, **options
        )
    return float(out.value), float(out.cutoff)


def _cover(ins: Inputs, C: np.ndarray, eps: np.ndarray, name: str, provenance: str, hyp) -> Bound:
    return ins.bound(
        value=C / eps**2,
        terms={"C": C, "eps": eps},
        hypotheses=hyp,
        name=name,
        kind="log_cover",
        provenance=provenance,
    )


def _lemma_inputs(strict, B_x, B_w, d, k, eps) -> tuple[Inputs, np.ndarray, ...]:
    ins = Inputs(strict)
    return (
        ins,
        ins.nonneg("B_x", B_x),
        ins.nonneg("B_w", B_w),
        ins.count("d", d),
        ins.count("k", k),
        ins.positive("eps", eps),
    )


def _points(ins: Inputs, num_examples: Any, d: np.ndarray, strict_gt: bool) -> dict:
    """The Lemma 3.2 hypothesis ``N >= d`` (or ``N > d``) when the number of points is given."""
    if num_examples is None:
        return {}
    n = ins.count("num_examples", num_examples)
    if strict_gt:
        return {"N > d": Check.of(n > d, N=n, d=d)}
    return {"N >= d": Check.of(n >= d, N=n, d=d)}


@quiet
def lemma_3_3_log_cover(*, B_x, B_w, d, k, eps=1.0, num_examples=None, strict=True) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{1,\infty} \le B_w\}$ with $\|x\|_1 \le B_x$.

    $W \in \mathbb R^{k\times d}$:

    $$\log N_\infty(\mathcal F, \epsilon, N, \|\cdot\|_2)
      \le \frac{d B_w^2 B_x^2 \log(2k+1)}{\epsilon^2},$$
    an upper bound for any number of points ``N >= d`` (Lemma 3.2 reduces any N inputs to the
    d scaled basis vectors). Proof: Maurey's lemma per column.

    Args:
      B_x: bound on the inputs' l1 norm (>= 0).
      B_w: bound on ``||W||_{1,inf}`` (max column l1 norm, >= 0).
      d: input dimension (integer >= 1).
      k: output dimension (integer >= 1).
      eps: resolution (> 0; default 1, so ``value == terms["C"]``).
      num_examples: N, the number of points covered; if given, ``N >= d`` is checked.
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with ``terms["C"]`` the coefficient of 1/eps^2.

    Raises:
      ValueError: naming the argument, for a negative or non-finite norm, a count < 1 or
        ``eps <= 0`` (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.3.

    >>> float(lemma_3_3_log_cover(B_x=1.0, B_w=2.0, d=3, k=4).value)  # 3*4*log(9)
    26.366694...
    """
    ins, B_x, B_w, d, k, eps = _lemma_inputs(strict, B_x, B_w, d, k, eps)
    C = d * B_w**2 * B_x**2 * log_2x_plus_1(k)
    hyp = _points(ins, num_examples, d, strict_gt=False)
    return _cover(ins, C, eps, "Trauger & Tewari Lemma 3.3", "paper", hyp)


@quiet
def lemma_3_4_log_cover(*, B_x, B_w, d, k, eps=1.0, num_examples=None, strict=True) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{2,1} \le B_w\}$ with $\|x\|_1 \le B_x$.

    $$\log N_\infty \lesssim \frac{B_w^2 B_x^2 \log(dk)}{\epsilon^2}$$
    (Lemma 3.5 = Edelman et al. Lemma 4.6 at the d basis vectors; the paper's $\lesssim$ hides
    log factors other than d, k, T, which are dropped here).

    Args:
      B_x: bound on the inputs' l1 norm (>= 0).
      B_w: bound on ``||W||_{2,1}`` (sum of column l2 norms, >= 0).
      d: input dimension (integer >= 1).
      k: output dimension (integer >= 1).
      eps: resolution (> 0).
      num_examples: N, the number of points covered; if given, ``N > d`` is checked.
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with ``terms["C"]``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.4.

    >>> round(float(lemma_3_4_log_cover(B_x=1.0, B_w=1.0, d=2, k=2).value), 6)  # log(4)
    1.386294
    """
    ins, B_x, B_w, d, k, eps = _lemma_inputs(strict, B_x, B_w, d, k, eps)
    C = B_w**2 * B_x**2 * (np.log(d) + np.log(k))
    hyp = _points(ins, num_examples, d, strict_gt=True)
    return _cover(ins, C, eps, "Trauger & Tewari Lemma 3.4", "paper", hyp)


@quiet
def lemma_3_6_log_cover(*, B_x, B_w, d, k, eps=1.0, num_examples=None, strict=True) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{1,1} \le B_w\}$ with $\|x\|_2 \le B_x$.

    $$\log N_\infty \le \frac{B_x^2 B_w^2 \log(2dk+1)}{\epsilon^2}$$
    (Maurey's lemma on the flattened matrix; no dependence on the number of points).

    Args:
      B_x: bound on the inputs' l2 norm (>= 0).
      B_w: bound on ``||W||_{1,1}`` (sum of absolute entries, >= 0).
      d: input dimension (integer >= 1).
      k: output dimension (integer >= 1).
      eps: resolution (> 0).
      num_examples: N, the number of points covered; if given, ``N >= d`` is checked.
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with ``terms["C"]``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Trauger & Tewari 2024, arXiv:2310.13088, Lemma 3.6.

    >>> float(lemma_3_6_log_cover(B_x=1.0, B_w=1.0, d=2, k=2).value)  # log(9)
    2.197224...
    """
    ins, B_x, B_w, d, k, eps = _lemma_inputs(strict, B_x, B_w, d, k, eps)
    C = B_x**2 * B_w**2 * log_2x_plus_1(d, k)
    hyp = _points(ins, num_examples, d, strict_gt=False)
    return _cover(ins, C, eps, "Trauger & Tewari Lemma 3.6", "paper", hyp)


@quiet
def edelman_lemma_4_6_log_cover(*, B_x, B_w, d, num_examples, eps=1.0, strict=True) -> Bound:
    r"""Log cover of $\{x \mapsto Wx : \|W\|_{2,1} \le B_w\}$ on n points with $\|x\|_2 \le B_x$.

    $$\log N_\infty(\mathcal F, \epsilon, \{x_i\}_{i=1}^n, \|\cdot\|_2) \lesssim
      \frac{B_w^2 B_x^2 \log(d n)}{\epsilon^2}.$$
    For a Transformer the points are the ``n = m T`` tokens, which is where log T enters.
    Status: rebuilt from its restatement in Trauger & Tewari (hidden log factors dropped).

    Args:
      B_x: bound on the points' l2 norm (>= 0).
      B_w: bound on ``||W||_{2,1}`` (>= 0).
      d: input dimension (integer >= 1).
      num_examples: n, the number of points covered (m T tokens; integer >= 1).
      eps: resolution (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with ``terms["C"]``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Edelman et al. 2022, arXiv:2110.10090, Lemma 4.6; Trauger & Tewari 2024, Lemma 3.5.

    >>> round(float(edelman_lemma_4_6_log_cover(B_x=1.0, B_w=1.0, d=2, num_examples=5).value), 6)
    2.302585
    """
    ins = Inputs(strict)
    B_x, B_w = ins.nonneg("B_x", B_x), ins.nonneg("B_w", B_w)
    d, n, eps = ins.count("d", d), ins.count("num_examples", num_examples), ins.positive("eps", eps)
    C = B_w**2 * B_x**2 * (np.log(d) + np.log(n))
    return _cover(ins, C, eps, "Edelman et al. Lemma 4.6", "rebuilt", {})


@quiet
def budget_optimisation(C, beta, eps=1.0, *, strict=True) -> Bound:
    r"""Split a covering budget (Lemma A.8).

    Minimise $\sum_i C_i/\epsilon_i^2$ s.t. $\sum_i \beta_i\epsilon_i = \epsilon$.

    The minimum is $\gamma^3/\epsilon^2$ with $\gamma = \sum_i C_i^{1/3}\beta_i^{2/3}$, reached at
    $\epsilon_i = (\epsilon/\gamma)(C_i/\beta_i)^{1/3}$ (exact, by Lagrange / Hölder).

    Args:
      C: coefficients C_i >= 0, shape (n,) (the last axis is summed).
      beta: weights beta_i > 0, same shape.
      eps: total resolution (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with value gamma^3/eps^2 and terms ``gamma`` and ``eps_i``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Edelman et al. 2022, arXiv:2110.10090, Lemma A.8 (Trauger & Tewari Lemma E.1).

    >>> float(budget_optimisation([1.0, 8.0], [1.0, 1.0]).value)  # (1 + 2)^3
    27.0...
    """
    ins = Inputs(strict)
    C, beta, eps = ins.nonneg("C", C), ins.positive("beta", beta), ins.positive("eps", eps)
    gamma = np.sum(C ** (1.0 / 3.0) * beta ** (2.0 / 3.0), axis=-1)
    # all C_i = 0: any split works (value 0); take equal shares of the budget.
    share = np.where(gamma > 0, eps / np.where(gamma > 0, gamma, 1.0), 0.0)[..., None]
    eps_i = np.where(share > 0, share * (C / beta) ** (1.0 / 3.0), eps / (beta * C.shape[-1]))
    return ins.bound(
        value=gamma**3 / eps**2,
        terms={"gamma": gamma, "eps_i": eps_i},
        hypotheses={},
        name="Lemma A.8 budget",
        kind="log_cover",
    )


@quiet
def dudley_rademacher(
    *, C, radius, num_examples, coef_delta=4.0, coef_integral=12.0, strict=True
) -> Bound:
    r"""Dudley's entropy integral for a class with $\log N(\epsilon) \le C/\epsilon^2$, radius A.

    $$\mathrm{Rad} \le \inf_{\delta \ge 0}\Big(c_0\delta + c_1\int_\delta^A \sqrt{C/(n\epsilon^2)}\,
      d\epsilon\Big) = c_1\sqrt{C/n}\,\Big(1 + \ln\frac{c_0 A\sqrt n}{c_1\sqrt C}\Big)$$
    when the minimiser $\delta^* = (c_1/c_0)\sqrt{C/n}$ is below A, else $c_0 A$ (and 0 when
    C = 0). With the standard constants $c_0 = 4, c_1 = 12$:
    $12\sqrt{C/n}(1 + \ln(A\sqrt n/(3\sqrt C)))$. A bound on the empirical Rademacher complexity
    (exact evaluation of the inf), computed by :func:`kernels.dudley.dudley_inverse_square` in
    float64. Vacuous when >= A (``|f| <= A`` gives ``Rad <= A``).

    Args:
      C: cover coefficient (log N <= C/eps^2), >= 0.
      radius: A > 0, radius of the class (sup of |f| or of the empirical l2 norm).
      num_examples: n (integer >= 1).
      coef_delta: c_0 > 0 (4 in the standard statement; 1 gives the paper's O(.) form).
      coef_integral: c_1 > 0 (12 standard).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "rademacher") with terms ``delta_star`` and ``sqrt_C_over_n``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Dudley 1967; Bartlett, Foster & Telgarsky 2017 (arXiv:1706.08498), Lemma A.5.

    >>> float(dudley_rademacher(C=1.0, radius=3.0, num_examples=1).value)  # 12 (1 + ln 1)
    12.0
    """
    ins = Inputs(strict)
    C, A = ins.nonneg("C", C), ins.positive("radius", radius)
    n = ins.count("num_examples", num_examples)
    c0, c1 = ins.positive("coef_delta", coef_delta), ins.positive("coef_integral", coef_integral)
    C, A, n, c0, c1 = np.broadcast_arrays(C, A, n, c0, c1)
    value = np.full(C.shape, np.nan)
    for i in np.ndindex(C.shape):
        if C[i] == 0.0:
            value[i] = 0.0
        elif (
            np.isfinite(C[i])
            and C[i] > 0
            and A[i] > 0
            and min(c0[i], c1[i]) > 0
            and n[i] >= 1
            and n[i] == int(n[i])
        ):
            value[i] = _kernel_inverse_square(
                C[i], num_examples=int(n[i]), radius=A[i], coef_delta=c0[i], coef_integral=c1[i]
            )
    s = np.sqrt(C / n)
    return ins.bound(
        value=value,
        terms={"delta_star": np.minimum((c1 / c0) * s, A), "sqrt_C_over_n": s},
        hypotheses={},
        trivial=A,
        name="Dudley integral (C/eps^2 cover)",
        kind="rademacher",
    )


@quiet
def dudley_numeric(
    log_cover_fn: Callable,
    *,
    radius,
    num_examples,
    num_grid: int = 8192,
    coef_delta=4.0,
    coef_integral=12.0,
    min_ratio: float = 1e-12,
) -> Bound:
    r"""Dudley's integral evaluated numerically for any log covering function ``eps -> log N``.

    $$\inf_{\delta}\Big(c_0\delta + c_1\int_\delta^A\sqrt{\log N(\epsilon)/n}\,d\epsilon\Big),$$
    by :func:`kernels.dudley.dudley_integral` in float64 (a cross-check of
    :func:`dudley_rademacher`; accurate to about 1e-7 relative for smooth log N). Scalar inputs.

    Args:
      log_cover_fn: vectorised ``eps -> log N(eps)`` (non-increasing), traceable by JAX.
      radius: A > 0, radius of the class.
      num_examples: n (int >= 1).
      num_grid: grid size (int >= 8). Static.
      coef_delta: c_0.
      coef_integral: c_1.
      min_ratio: smallest delta considered, as a fraction of A.

    Returns:
      Bound (kind "rademacher") with term ``cutoff`` (the optimal delta).

    Raises:
      ValueError: naming the argument, for an input outside its domain.

    >>> round(float(dudley_numeric(lambda e: 1.0 / e**2, radius=1.0, num_examples=100).value), 5)
    2.64477
    """
    ins = Inputs(True)
    A = float(ins.positive("radius", radius))
    n = int_option("num_examples", num_examples)
    m = int_option("num_grid", num_grid, minimum=8)
    c0, c1 = ins.positive("coef_delta", coef_delta), ins.positive("coef_integral", coef_integral)
    r = ins.array("min_ratio", min_ratio)
    ins.require("min_ratio", r, (r > 0) & (r < 1), "a number in (0, 1)")
    value, cutoff = _kernel_integral(
        log_cover_fn, num_examples=n, radius=A, num_grid=m, coef_delta=float(c0),
        coef_integral=float(c1), min_ratio=float(r),
    )  # fmt: skip
    return ins.bound(
        value=value,
        terms={"cutoff": np.float64(cutoff)},
        hypotheses={},
        trivial=A,
        name="Dudley integral (numeric)",
        kind="rademacher",
    )


@quiet
def rademacher_to_gap(
    *,
    rademacher,
    num_examples,
    delta,
    lipschitz=1.0,
    loss_bound=1.0,
    empirical_risk=0.0,
    strict=True,
) -> Bound:
    r"""Generalization bound from an (empirical) Rademacher complexity.

    For a loss in [0, c] that is rho-Lipschitz in the prediction, with probability >= 1 - delta
    $$L_D \le L_S + 2\rho\,\mathrm{Rad}_S + 3c\sqrt{\ln(2/\delta)/(2n)}.$$
    Vacuous when the right-hand side is >= c (the trivial bound).

    Args:
      rademacher: bound on the empirical Rademacher complexity of the predictor class (>= 0).
      num_examples: n (integer >= 1).
      delta: failure probability in (0, 1).
      lipschitz: rho >= 0.
      loss_bound: c > 0.
      empirical_risk: L_S in [0, c].
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "risk") with terms ``complexity`` and ``confidence``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Bartlett & Mendelson 2002, JMLR 3:463-482, Theorem 8; Mohri et al., Foundations of ML,
      Theorem 3.5.

    >>> r = rademacher_to_gap(rademacher=0.01, num_examples=10**4, delta=0.05)
    >>> round(float(r.value), 6), str(r.status)
    (0.060743, 'valid, non-vacuous')
    """
    ins = Inputs(strict)
    rad, n = ins.nonneg("rademacher", rademacher), ins.count("num_examples", num_examples)
    delta, rho = ins.probability("delta", delta), ins.nonneg("lipschitz", lipschitz)
    c = ins.positive("loss_bound", loss_bound)
    ls = ins.within("empirical_risk", empirical_risk, 0.0, c, "[0, loss_bound]")
    complexity = 2.0 * rho * rad
    confidence = 3.0 * c * np.sqrt((np.log(2.0) - np.log(delta)) / (2.0 * n))
    return ins.bound(
        value=ls + complexity + confidence,
        terms={"empirical_risk": ls, "complexity": complexity, "confidence": confidence},
        hypotheses={},
        trivial=c,
        name="Rademacher generalization bound",
        kind="risk",
        assumed=("loss in [0, c]", "loss rho-Lipschitz in the prediction"),
    )
