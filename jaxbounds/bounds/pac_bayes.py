r"""PAC-Bayes bounds: McAllester, Maurer (kl), Catoni, Alquier, and the flat-construction bounds.

The last are those of "A Sharper Picture of Generalization in Transformers" (semi-analytic,
chain of thought, one-pass PARITY).

KL between the posterior N(theta, sigma^2 I) and the prior N(0, sigma^2 I) is
$\|\theta\|^2/(2\sigma^2)$; pass it as ``kl``. Grids over a free parameter (lambda, C, sigma) pay a
union bound: delta -> delta / |grid| (an additive ln|grid| in the confidence term).

Everything is computed in float64 numpy whatever the global JAX setting (float32 loses 0.6% on
``kl_inverse(0, ln(40)/1e6)``), inputs are validated (``ValueError`` naming the argument, or a
not-valid bound with ``strict=False``), and calculators broadcast over array inputs.

The formulas of the flat-construction paper (arXiv 2605.20988) lost their math in extraction and
were **rebuilt** (SPEC.md section 5); the construction norm L(omega, D_f, T) and the sigma* / 0.239
check case reproduce the authors' reported numbers.

References:
  McAllester 1999 (COLT); Maurer 2004, arXiv:cs/0411099; Catoni 2007, "PAC-Bayesian supervised
  classification", Thm 1.2.6; Alquier, Ridgway & Chopin 2016, JMLR 17(236), Thm 4.3;
  Germain et al. 2016, arXiv:1605.08636 (sub-Gaussian losses).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxbounds.bounds._result import Bound, Inputs, int_option, quiet

__all__ = [
    "alquier",
    "catoni",
    "chain_of_thought_parity",
    "construction_norm_bound",
    "estimate_subgaussian_scale",
    "kl_bernoulli",
    "kl_inverse",
    "maurer",
    "mcallester",
    "one_pass_parity",
    "optimal_sigma",
    "semi_analytic",
    "sigma_mesh",
]

_MAX_HALVINGS = 1100  # enough to reach adjacent float64 numbers anywhere in [0, 1]
_PRIOR = ("loss in [0, 1]", "prior chosen before the data")


def _x_minus_log1p(x: np.ndarray) -> np.ndarray:
    """Return x - ln(1 + x) >= 0 (x >= -1) to full relative precision (series for |x| < 1/4)."""
    small = np.abs(x) < 0.25
    xs = np.where(small, x, 0.0)
    acc = np.zeros_like(xs)
    for k in range(40, 1, -1):  # sum_{k>=2} (-1)^k x^k / k, Horner; 0.25^40 < 1e-24
        acc = acc * xs + (-1.0) ** k / k
    return np.where(small, acc * xs**2, x - np.log1p(np.where(small, 0.0, x)))


def _log_ratio(a: Any, b: np.ndarray) -> np.ndarray:
    """Return ln(a / b) as ln a - ln b: finite for a tiny b (2 sqrt(N) / 1e-308 overflows)."""
    return np.log(np.asarray(a, dtype=np.float64)) - np.log(b)


def _log_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return ln(a / b) for a >= 0, b > 0: ln of a normal ratio, else ln a - ln b."""
    ratio = a / b
    normal = (ratio >= np.finfo(np.float64).tiny) & np.isfinite(ratio)
    return np.where(normal, np.log(np.where(normal, ratio, 1.0)), np.log(a) - np.log(b))


def _scaled_f(q: np.ndarray, r: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Return q f(r/q) for f(x) = x - ln(1 + x), with q > 0 and p = q + r >= 0 given exactly.

    The series / ``log1p`` form is used for x = r/q in [-1/2, inf); where x < -1/2 (p/q below
    1/2, where x rounds to -1 once p/q < 1e-16) or r/q overflows (a subnormal q such as 1e-310;
    inf - ln(inf) would be NaN) the equal form r - q ln(p/q) is used, with ln(p/q) taken from p
    itself (:func:`_log_div`), so no digit of p is lost.
    """
    x = r / q
    by_log = ~(x >= -0.5) | ~np.isfinite(x)
    direct = q * _x_minus_log1p(np.where(by_log, 0.0, x))
    return np.where(by_log, r - q * _log_div(p, q), direct)


def _kl(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """kl(q || p) in float64 to full relative precision, also for p close to q.

    With r = p - q, kl = q f(r/q) + (1 - q) f(-r/(1 - q)) for f(x) = x - ln(1 + x): two
    non-negative terms, no cancellation (the textbook form loses every digit as p -> q).
    0 ln 0 = 0 at q = 0 and q = 1; a subnormal q or p keeps its q ln(q/p) term
    (:func:`_scaled_f`).
    """
    inner = (q > 0) & (q < 1)
    qs = np.where(inner, q, 0.5)
    r = p - qs
    both = _scaled_f(qs, r, p) + _scaled_f(1.0 - qs, -r, 1.0 - p)
    return np.where(q == 0, -np.log1p(-p), np.where(q == 1, -np.log(p), both))


@quiet
def kl_bernoulli(q, p) -> np.ndarray:
    r"""Binary relative entropy $\mathrm{kl}(q\|p) = q\ln\frac qp + (1-q)\ln\frac{1-q}{1-p}$.

    With 0 ln 0 = 0, in float64 (``log1p`` for the second part, so small p keeps its digits).

    Raises:
      ValueError: if q or p is outside [0, 1].

    >>> round(float(kl_bernoulli(0.0, 0.5)), 12)  # ln 2
    0.69314718056
    """
    ins = Inputs(True)
    q = ins.within("q", q, 0.0, 1.0, "[0, 1]")
    p = ins.within("p", p, 0.0, 1.0, "[0, 1]")
    return _kl(q, p)


def _kl_inv(q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Bisection on [q, 1] for the crossing of kl(q || .) with c, to adjacent float64 numbers."""
    lo, hi = np.array(q, dtype=np.float64), np.ones_like(q, dtype=np.float64)
    for _ in range(_MAX_HALVINGS):
        mid = 0.5 * (lo + hi)
        active = (mid > lo) & (mid < hi)
        if not np.any(active):
            break
        over = _kl(q, mid) > c
        lo = np.where(active & ~over, mid, lo)
        hi = np.where(active & over, mid, hi)
    return np.where(_kl(q, hi) <= c, hi, lo)  # the whole bracket fits (c = inf, or q = 1)


@quiet
def kl_inverse(q, c) -> np.ndarray:
    r"""The largest $p \in [q, 1]$ with $\mathrm{kl}(q\|p) \le c$ (kl-inverse of Maurer's bound).

    Bracketed bisection on [q, 1] in float64 numpy, run until the bracket holds two adjacent
    float64 numbers (exact to float64 resolution whatever the global JAX setting). Closed form at
    q = 0: $1 - e^{-c}$.

    Args:
      q: empirical risk in [0, 1].
      c: budget >= 0 (``inf`` gives 1).

    Returns:
      p, broadcast over q and c (float64).

    Raises:
      ValueError: if q is outside [0, 1] or c is negative or NaN.

    References:
      Maurer 2004, arXiv:cs/0411099; Seeger 2002, JMLR 3:233-269.

    >>> round(float(kl_inverse(0.0, 1.0)), 12)  # 1 - exp(-1)
    0.632120558829
    """
    ins = Inputs(True)
    q = ins.within("q", q, 0.0, 1.0, "[0, 1]")
    c = ins.array("c", c)
    ins.require("c", c, c >= 0, "a number >= 0")
    q, c = np.broadcast_arrays(q, c)
    return _kl_inv(q, c)


def _risk(ins: Inputs, value, terms, name, provenance="paper", assumed=_PRIOR, trivial=1.0):
    return ins.bound(
        value=value,
        terms=terms,
        hypotheses={},
        trivial=trivial,
        name=name,
        kind="risk",
        provenance=provenance,
        assumed=assumed,
    )


def _pac_inputs(strict, empirical_risk, kl, num_examples, delta) -> tuple:
    """Validated (inputs, L_S in [0, 1], KL >= 0, N >= 1, delta in (0, 1))."""
    ins = Inputs(strict)
    ls = ins.within("empirical_risk", empirical_risk, 0.0, 1.0, "[0, 1]")
    kl = ins.nonneg("kl", kl)
    return ins, ls, kl, ins.count("num_examples", num_examples), ins.probability("delta", delta)


@quiet
def mcallester(*, empirical_risk, kl, num_examples, delta, strict=True) -> Bound:
    r"""McAllester's bound (Maurer's constant).

    For a loss in [0, 1], with probability >= 1 - delta,
    $$\mathbb E_Q L_D \le \mathbb E_Q L_S
      + \sqrt{\frac{\mathrm{KL}(Q\|P) + \ln(2\sqrt N/\delta)}{2N}}.$$

    Args:
      empirical_risk: E_Q L_S in [0, 1].
      kl: KL(Q || P) >= 0.
      num_examples: N (integer >= 1).
      delta: confidence in (0, 1).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      McAllester 1999; Maurer 2004, arXiv:cs/0411099.

    >>> r = mcallester(empirical_risk=0.0, kl=0.0, num_examples=100, delta=0.5)
    >>> round(float(r.value), 6)  # sqrt(ln(40)/200)
    0.13581
    """
    ins, ls, kl, n, delta = _pac_inputs(strict, empirical_risk, kl, num_examples, delta)
    budget = kl + _log_ratio(2.0 * np.sqrt(n), delta)
    slack = np.sqrt(budget / (2.0 * n))
    terms = {"empirical_risk": ls, "slack": slack, "budget": budget}
    return _risk(ins, ls + slack, terms, "McAllester PAC-Bayes")


@quiet
def maurer(*, empirical_risk, kl, num_examples, delta, strict=True) -> Bound:
    r"""Maurer / Seeger kl bound.

    $\mathbb E_Q L_D \le \mathrm{kl}^{-1}\big(\mathbb E_Q L_S,
    (\mathrm{KL} + \ln(2\sqrt N/\delta))/N\big)$, loss in [0, 1]. Always at least as tight as
    :func:`mcallester` (Pinsker). Float64 to full precision (:func:`kl_inverse`).

    Args:
      empirical_risk: E_Q L_S in [0, 1].
      kl: KL(Q || P) >= 0.
      num_examples: N (integer >= 1).
      delta: confidence in (0, 1).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Maurer 2004, arXiv:cs/0411099; Seeger 2002.

    >>> r = maurer(empirical_risk=0.0, kl=0.0, num_examples=100, delta=0.5)
    >>> round(float(r.value), 6)  # 1 - 40^(-1/100)
    0.036217
    """
    ins, ls, kl, n, delta = _pac_inputs(strict, empirical_risk, kl, num_examples, delta)
    budget = (kl + _log_ratio(2.0 * np.sqrt(n), delta)) / n
    q, c = np.broadcast_arrays(np.clip(ls, 0.0, 1.0), np.where(np.isnan(budget), np.inf, budget))
    value = np.where(np.isnan(ls + budget), np.nan, _kl_inv(q, c))
    terms = {"empirical_risk": ls, "kl_budget": budget}
    return _risk(ins, value, terms, "Maurer kl PAC-Bayes")


def _grid(ins: Inputs, name: str, grid: Any, default: np.ndarray) -> np.ndarray:
    """A free-parameter grid: 1-D, non-empty, finite and > 0."""
    if grid is None:
        return default
    g = np.atleast_1d(ins.array(name, grid))
    if g.ndim != 1 or g.size == 0 or not np.all(np.isfinite(g) & (g > 0)):
        raise ValueError(
            f"{name}: expected a non-empty 1-D grid of finite numbers > 0, got {grid!r}"
        )
    return g


@quiet
def catoni(*, empirical_risk, kl, num_examples, delta, Cs=None, strict=True) -> Bound:
    r"""Catoni's bound, minimised over a grid of C with a union bound.

    $$\mathbb E_Q L_D \le \min_{C\in\mathcal C}\frac{1 - \exp\big(-C\,\mathbb E_Q L_S
      - (\mathrm{KL} + \ln(|\mathcal C|/\delta))/N\big)}{1 - e^{-C}}.$$

    Args:
      empirical_risk: E_Q L_S in [0, 1].
      kl: KL(Q || P) >= 0.
      num_examples: N (integer >= 1).
      delta: confidence in (0, 1).
      Cs: the grid of C > 0 (default 20 points geometric in [0.01, 100]).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Catoni 2007, Theorem 1.2.6; Germain et al. 2009 (ICML).

    >>> r = catoni(empirical_risk=0.0, kl=0.0, num_examples=100, delta=0.5, Cs=[1.0])
    >>> round(float(r.value), 6)  # (1 - exp(-ln(2)/100)) / (1 - exp(-1))
    0.010928
    """
    ins, ls, kl, n, delta = _pac_inputs(strict, empirical_risk, kl, num_examples, delta)
    ls, kl, n, delta = np.broadcast_arrays(ls, kl, n, delta)
    Cs = _grid(ins, "Cs", Cs, np.geomspace(0.01, 100.0, 20))
    budget = kl + _log_ratio(Cs.shape[0], delta)
    vals = -np.expm1(-Cs * ls[..., None] - (budget / n)[..., None]) / -np.expm1(-Cs)
    best = np.argmin(np.where(np.isnan(vals), np.inf, vals), axis=-1)
    value = np.take_along_axis(vals, best[..., None], axis=-1)[..., 0]
    terms = {"empirical_risk": ls, "C": Cs[best], "budget": budget}
    return _risk(ins, value, terms, "Catoni PAC-Bayes")


@quiet
def alquier(
    *, empirical_risk, kl, num_examples, delta, subgaussian_scale, lambdas=None, strict=True
) -> Bound:
    r"""Alquier's bound for a sub-Gaussian loss, with a union bound over a lambda grid.

    With $\Sigma$ = ``subgaussian_scale``,
    $$\mathbb E_Q L_D \le \mathbb E_Q L_S + \min_{\lambda\in\Lambda}\Big(\frac{\lambda\Sigma^2}{2N}
      + \frac{\mathrm{KL} + \ln(|\Lambda|/\delta)}{\lambda}\Big).$$
    At the unconstrained optimum this is
    $\mathbb E_Q L_S + 2\sqrt{\Sigma^2(\mathrm{KL} + \ln(|\Lambda|/\delta))/(2N)}$. The loss is
    unbounded, so the bound is never vacuous.

    Args:
      empirical_risk: E_Q L_S (finite).
      kl: KL(Q || P) >= 0.
      num_examples: N (integer >= 1).
      delta: confidence in (0, 1).
      subgaussian_scale: Sigma > 0, sub-Gaussian constant of the loss
        (see :func:`estimate_subgaussian_scale`).
      lambdas: grid of lambda > 0 (default 41 points, ``sqrt(N)/Sigma * geomspace(1e-3, 1e3)``).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Alquier, Ridgway & Chopin 2016, JMLR 17(236), Theorem 4.3.
    """
    ins = Inputs(strict)
    ls, kl = ins.real("empirical_risk", empirical_risk), ins.nonneg("kl", kl)
    n, delta = ins.count("num_examples", num_examples), ins.probability("delta", delta)
    S = ins.positive("subgaussian_scale", subgaussian_scale)
    ls, kl, n, delta, S = np.broadcast_arrays(ls, kl, n, delta, S)
    base = np.geomspace(1e-3, 1e3, 41)
    lam = _grid(ins, "lambdas", lambdas, base)
    if lambdas is None:
        lam = (np.sqrt(n) / S)[..., None] * base
    budget = kl + _log_ratio(lam.shape[-1], delta)
    # lam * S^2 / (2N) as (lam S)(S / 2N): S^2 overflows for S > 1.3e154, lam S does not
    vals = (lam * S[..., None]) * (S / (2.0 * n))[..., None] + budget[..., None] / lam
    idx = np.argmin(np.where(np.isnan(vals), np.inf, vals), axis=-1)[..., None]
    slack = np.take_along_axis(vals, idx, axis=-1)[..., 0]
    lam_best = np.take_along_axis(np.broadcast_to(lam, vals.shape), idx, axis=-1)[..., 0]
    terms = {"empirical_risk": ls, "slack": slack, "lambda": lam_best, "budget": budget}
    assumed = (
        "loss Sigma-sub-Gaussian under the data distribution",
        "prior chosen before the data",
    )
    return _risk(ins, ls + slack, terms, "Alquier sub-Gaussian PAC-Bayes", "paper", assumed, None)


def estimate_subgaussian_scale(losses, *, lambdas=None) -> np.ndarray:
    r"""Smallest Sigma whose Gaussian MGF dominates the empirical MGF of the centred losses.

    $$\hat\Sigma^2 = \max_{\lambda\in\pm\Lambda}\frac{2}{\lambda^2}
      \ln\frac1n\sum_i e^{\lambda(\ell_i - \bar\ell)},$$
    so $\frac1n\sum_i e^{\lambda(\ell_i-\bar\ell)} \le e^{\lambda^2\hat\Sigma^2/2}$ on the grid. Use
    validation losses (held out), not training losses. An estimate, not a certified constant.
    Float64.

    Args:
      losses: shape (n,) per-example losses, finite, n >= 1.
      lambdas: positive grid (default ``geomspace(1e-2, 10, 40) / std``); both signs are used.

    Returns:
      Scalar Sigma-hat (0 for constant losses).

    Raises:
      ValueError: if ``losses`` is not a non-empty 1-D array of finite numbers, or ``lambdas``
        is not a grid of numbers > 0.

    >>> round(float(estimate_subgaussian_scale([0.0, 1.0], lambdas=[1e-4])), 6)  # ~ std
    0.5
    """
    ins = Inputs(True)
    x = ins.real("losses", losses)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"losses: expected a non-empty 1-D array, got shape {x.shape}")
    centred = x - np.mean(x)
    std = float(np.std(x))
    if std == 0.0:
        return np.float64(0.0)
    lam = _grid(ins, "lambdas", lambdas, np.geomspace(1e-2, 10.0, 40) / std)
    lam = np.concatenate([lam, -lam])
    z = lam[:, None] * centred[None, :]
    top = np.max(z, axis=1)
    log_mgf = top + np.log(np.mean(np.exp(z - top[:, None]), axis=1))
    return np.float64(np.sqrt(max(float(np.max(2.0 * log_mgf / lam**2)), 0.0)))


def construction_norm_bound(omega, D_f, T) -> np.ndarray:
    r"""Squared norm bound of the flat construction (Theorem 10) [checked].

    $$L(\omega, D_f, T) = 16D_f^2(D_f+1) + 8(D_f+1) + 1 + \omega + 4\omega(D_f+1)\ln^2 T.$$
    The single implementation in the project (float64).

    Args:
      omega: number of parities (sparsity), integer >= 1.
      D_f: their degree, integer >= 1.
      T: sequence length, integer >= 1.

    Raises:
      ValueError: naming the argument, for a count < 1 or not an integer.

    >>> round(float(construction_norm_bound(10, 2, 20)), 2)
    1303.93
    """
    ins = Inputs(True)
    return _norm_bound(ins.count("omega", omega), ins.count("D_f", D_f), ins.count("T", T))


def _norm_bound(w: Any, D: Any, T: Any) -> np.ndarray:
    return (
        16.0 * D**2 * (D + 1.0) + 8.0 * (D + 1.0) + 1.0 + w + 4.0 * w * (D + 1.0) * np.log(T) ** 2
    )


def sigma_mesh(num_grid: int = 20) -> np.ndarray:
    """The paper's sigma mesh: ``num_grid`` geometric points from 1e-2 down to 1e-5 (float64).

    >>> sigma_mesh(4)
    array([1.e-02, 1.e-03, 1.e-04, 1.e-05])
    """
    return np.geomspace(1e-2, 1e-5, int_option("num_grid", num_grid))


def _sigma_star(G, L, S, m, P) -> np.ndarray:
    return (S * np.sqrt(L / m) / (2.0 * (G + P))) ** (1.0 / 3.0)


@quiet
def optimal_sigma(*, G_u, norm_sq, subgaussian_scale, num_examples, remainder=0.0) -> np.ndarray:
    r"""Continuous minimiser of $\sigma^2(G_u+P) + \Sigma\sqrt{L/m}/\sigma$.

    The confidence log is dropped:
    $\sigma^* = (\Sigma\sqrt{L/m}/(2(G_u+P)))^{1/3}$, with $\Sigma$ = ``subgaussian_scale`` and
    P = ``remainder``.

    Raises:
      ValueError: naming the argument, for an input outside its domain or ``G_u + remainder <= 0``.

    >>> round(float(optimal_sigma(G_u=15524.0, norm_sq=1303.93, subgaussian_scale=0.01,
    ...                           num_examples=10**6)), 5)
    0.00227
    """
    ins = Inputs(True)
    G, L = ins.nonneg("G_u", G_u), ins.nonneg("norm_sq", norm_sq)
    S = ins.positive("subgaussian_scale", subgaussian_scale)
    m, P = ins.count("num_examples", num_examples), ins.real("remainder", remainder)
    ins.require("remainder", P, G + P > 0, "a number with G_u + remainder > 0")
    return _sigma_star(G, L, S, m, P)


def _mesh_remainder(ins: Inputs, remainder: Any, mesh: np.ndarray) -> np.ndarray:
    """P as a scalar (``P[..., None]``) or one value per mesh point (a 1-D array of length K)."""
    P = ins.real("remainder", remainder)
    if P.ndim == 1:
        if P.shape[0] != mesh.shape[0]:
            raise ValueError(
                f"remainder: a 1-D remainder gives one value per sigma, expected length "
                f"{mesh.shape[0]}, got {P.shape[0]}"
            )
        return P
    return P[..., None]


def _semi_analytic_inputs(strict, G_u, norm_sq, subgaussian_scale, num_examples, delta, lb, ls):
    ins = Inputs(strict)
    G, L = ins.nonneg("G_u", G_u), ins.nonneg("norm_sq", norm_sq)
    S = ins.positive("subgaussian_scale", subgaussian_scale)
    m, delta = ins.count("num_examples", num_examples), ins.probability("delta", delta)
    lb = ins.positive("loss_bound", lb)
    ls = ins.within("empirical_risk", ls, 0.0, lb, "[0, loss_bound]")
    return ins, *np.broadcast_arrays(G, L, S, m, delta, ls), lb


@quiet
def semi_analytic(
    *, G_u, norm_sq, subgaussian_scale, num_examples, delta, remainder=0.0, sigmas=None,
    empirical_risk=0.0, loss_bound=1.0, strict=True,
) -> Bound:  # fmt: skip
    r"""The semi-analytic PAC-Bayes bound of the flat construction [rebuilt], sigma on a mesh.

    $$\mathbb E_u L_D(\hat\theta + u) \le L_S + \sigma^2(G_u + P)
      + 2\sqrt{\frac{\Sigma^2}{2m}\Big(\frac{L}{2\sigma^2} + \ln\frac{K}{\delta}\Big)},$$
    minimised over the K mesh values of sigma (the union bound over the mesh is the $\ln K$).
    $\sigma^2 G_u$ bounds $(\sigma^2/2)\operatorname{tr}H$ at an interpolator (Theorems 13, 14);
    P = ``remainder`` is the remainder term of the Theorem 6/12 decomposition divided by
    sigma^2 (scalar, or one value per mesh point); P = 0 gives the "no remainder" bound.

    Args:
      G_u: bound on ||grad_theta f||^2 over inputs (>= 0; 15524 reported at omega=10, D_f=2).
      norm_sq: L >= 0, the bound on ||theta||^2 (:func:`construction_norm_bound`).
      subgaussian_scale: Sigma > 0, sub-Gaussian constant of the loss.
      num_examples: m (integer >= 1).
      delta: confidence in (0, 1).
      remainder: P (default 0; finite, scalar or a 1-D array with one value per sigma).
      sigmas: the mesh (default :func:`sigma_mesh`, 20 points 1e-2 .. 1e-5).
      empirical_risk: L_S at theta-hat in [0, loss_bound] (0 at an interpolator).
      loss_bound: trivial bound (> 0) for the vacuous state.
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound with ``.value``, ``.sigma`` (chosen), terms ``curvature``, ``complexity``,
      ``union_cost``, ``per_sigma`` (the bound at every mesh point), ``sigma_star``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Section 5 / E.3
      (rebuilt); Alquier et al. 2016.
    """
    ins, G, L, S, m, delta, ls, lb = _semi_analytic_inputs(
        strict, G_u, norm_sq, subgaussian_scale, num_examples, delta, loss_bound, empirical_risk
    )
    mesh = _grid(ins, "sigmas", sigmas, sigma_mesh())
    K = mesh.shape[0]
    curvature = mesh**2 * (G[..., None] + _mesh_remainder(ins, remainder, mesh))
    # 2 sqrt(S^2 X / 2m) as 2 S sqrt(X / 2m): S^2 would overflow for S > 1.3e154
    complexity = (2.0 * S)[..., None] * np.sqrt(
        (L[..., None] / (2.0 * mesh**2) + _log_ratio(K, delta)[..., None]) / (2.0 * m)[..., None]
    )
    per_sigma = ls[..., None] + curvature + complexity
    terms = _pick_sigma(per_sigma, sigma=mesh, curvature=curvature, complexity=complexity)
    terms.update(
        union_cost=np.log(np.float64(K)), per_sigma=per_sigma, empirical_risk=ls,
        sigma_star=_sigma_star(G, L, S, m, 0.0),
    )  # fmt: skip
    name = "Flat construction semi-analytic PAC-Bayes"
    return _risk(ins, terms.pop("value"), terms, name, "rebuilt", _SEMI_ASSUMED, lb)


_SEMI_ASSUMED = (
    "loss Sigma-sub-Gaussian",
    "theta-hat interpolates (tr H = 2||grad f||^2)",
    "||grad f||^2 <= G_u on the data",
)


def _pick_sigma(per_sigma: np.ndarray, **parts: np.ndarray) -> dict[str, np.ndarray]:
    """The bound (``value``) and each part at the best mesh point (NaN points never chosen)."""
    idx = np.argmin(np.where(np.isnan(per_sigma), np.inf, per_sigma), axis=-1)[..., None]

    def pick(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(np.broadcast_to(a, per_sigma.shape), idx, axis=-1)[..., 0]

    return {"value": pick(per_sigma), **{k: pick(v) for k, v in parts.items()}}


def _prob_on_mesh(ins: Inputs, log_terms: np.ndarray, mesh: np.ndarray, name: str, extra) -> Bound:
    """The least log failure probability over the mesh, plus ln K (union bound), as a Bound."""
    log_total = log_terms + np.log(np.float64(mesh.shape[0]))
    idx = np.argmin(np.where(np.isnan(log_total), np.inf, log_total), axis=-1)
    best = np.take_along_axis(log_total, idx[..., None], axis=-1)[..., 0]
    return ins.bound(
        value=np.exp(np.minimum(best, 0.0)),
        terms={"log_value": best, "sigma": mesh[idx], **extra},
        hypotheses={},
        trivial=1.0,
        name=name,
        kind="probability",
        provenance="rebuilt",
        assumed=("loss Sigma-sub-Gaussian", "each step is the omega=1, D_f=2 construction"),
    )


def _parity_inputs(strict, T, G_u, subgaussian_scale, num_examples, norm_sq, remainder, sigmas):
    """Validated inputs of the two PARITY bounds: (ins, T, G, S, m, P, L, mesh)."""
    ins = Inputs(strict)
    T, G = ins.count("T", T), ins.nonneg("G_u", G_u)
    S = ins.positive("subgaussian_scale", subgaussian_scale)
    m, P = ins.count("num_examples", num_examples), ins.real("remainder", remainder)
    T, G, S, m, P = np.broadcast_arrays(T, G, S, m, P)
    L = _norm_bound(1.0, 2.0, T) if norm_sq is None else ins.nonneg("norm_sq", norm_sq)
    return ins, T, G, S, m, P, L, _grid(ins, "sigmas", sigmas, sigma_mesh())


@quiet
def chain_of_thought_parity(
    *, T, G_u, subgaussian_scale, num_examples, norm_sq=None, remainder=0.0, sigmas=None,
    strict=True,
) -> Bound:  # fmt: skip
    r"""Probability that a chain of thought for PARITY of length T goes wrong [rebuilt].

    $$P \le 4T\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2(2G_u(1,2) + P)}{4\Sigma^2}
      + \frac{L(1,2,T)}{2\sigma^2}\Big),$$
    minimised over the sigma mesh with a union factor K. Reported as a probability (clipped at 1;
    vacuous when >= 1).

    Args:
      T: sequence length (integer >= 1).
      G_u: G_u(1, 2) >= 0, the gradient bound of one step.
      subgaussian_scale: Sigma > 0, sub-Gaussian constant.
      num_examples: m (integer >= 1).
      norm_sq: L(1, 2, T) >= 0 (default :func:`construction_norm_bound`).
      remainder: P (finite).
      sigmas: mesh (default :func:`sigma_mesh`).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      arXiv:2605.20988 (rebuilt, SPEC.md section 5).
    """
    ins, T, G, S, m, P, L, mesh = _parity_inputs(
        strict, T, G_u, subgaussian_scale, num_examples, norm_sq, remainder, sigmas
    )
    log_terms = (
        (np.log(4.0) + np.log(T))[..., None]
        - (m / (8.0 * S**2))[..., None]
        + (m * (2.0 * G + P) / (4.0 * S**2))[..., None] * mesh**2
        + (L / 2.0)[..., None] / mesh**2
    )
    return _prob_on_mesh(ins, log_terms, mesh, "Chain-of-thought PARITY", {"norm_sq": L})


@quiet
def one_pass_parity(
    *, T, G_u, subgaussian_scale, num_examples, norm_sq=None, remainder=0.0, sigmas=None,
    strict=True,
) -> Bound:  # fmt: skip
    r"""Probability that one pass over PARITY of length T goes wrong [rebuilt].

    $$P \le 4\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2T(2G_u(1,2) + P)}{4\Sigma^2}
      + \frac{T L(1,2,T)}{2\sigma^2}\Big),$$
    minimised over the sigma mesh with a union factor K. Arguments as in
    :func:`chain_of_thought_parity`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      arXiv:2605.20988 (rebuilt, SPEC.md section 5).
    """
    ins, T, G, S, m, P, L, mesh = _parity_inputs(
        strict, T, G_u, subgaussian_scale, num_examples, norm_sq, remainder, sigmas
    )
    log_terms = (
        np.log(4.0)
        - (m / (8.0 * S**2))[..., None]
        + (m * T * (2.0 * G + P) / (4.0 * S**2))[..., None] * mesh**2
        + (T * L / 2.0)[..., None] / mesh**2
    )
    return _prob_on_mesh(ins, log_terms, mesh, "One-pass PARITY", {"norm_sq": L})
