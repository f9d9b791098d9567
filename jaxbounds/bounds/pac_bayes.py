r"""PAC-Bayes bounds: McAllester, Maurer (kl), Catoni, Alquier, and the flat-construction bounds.

The last are those of "A Sharper Picture of Generalization in Transformers" (semi-analytic,
chain of thought, one-pass PARITY).

KL between the posterior N(theta, sigma^2 I) and the prior N(0, sigma^2 I) is
$\|\theta\|^2/(2\sigma^2)$; pass it as ``kl``. Grids over a free parameter (lambda, C, sigma) pay a
union bound: delta -> delta / |grid| (an additive ln|grid| in the confidence term).

The formulas of the flat-construction paper (arXiv 2605.20988) lost their math in extraction and
were **rebuilt** (SPEC.md section 5); the construction norm L(omega, D_f, T) and the sigma* / 0.239
check case reproduce the authors' reported numbers.

References:
  McAllester 1999 (COLT); Maurer 2004, arXiv:cs/0411099; Catoni 2007, "PAC-Bayesian supervised
  classification", Thm 1.2.6; Alquier, Ridgway & Chopin 2016, JMLR 17(236), Thm 4.3;
  Germain et al. 2016, arXiv:1605.08636 (sub-Gaussian losses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbounds.bounds._result import Bound, floats

__all__ = [
    "alquier",
    "catoni",
    "chain_of_thought_parity",
    "construction_norm_bound",
    "kl_bernoulli",
    "kl_inverse",
    "maurer",
    "mcallester",
    "one_pass_parity",
    "optimal_sigma",
    "semi_analytic",
    "sigma_mesh",
    "subgaussian_constant",
]

_BISECTION_STEPS = 200


def kl_bernoulli(q, p) -> jax.Array:
    r"""Binary relative entropy $\mathrm{kl}(q\|p) = q\ln\frac qp + (1-q)\ln\frac{1-q}{1-p}$.

    With 0 ln 0 = 0.

    >>> round(float(kl_bernoulli(0.0, 0.5)), 12)  # ln 2
    0.69314718056
    """
    q, p = floats(q, p)
    return (
        jax.scipy.special.xlogy(q, q)
        - jax.scipy.special.xlogy(q, p)
        + (jax.scipy.special.xlogy(1.0 - q, 1.0 - q) - jax.scipy.special.xlogy(1.0 - q, 1.0 - p))
    )


def _bisect(_, carry):
    q, c, lo, hi = carry
    mid = 0.5 * (lo + hi)
    over = kl_bernoulli(q, mid) > c
    return q, c, jnp.where(over, lo, mid), jnp.where(over, mid, hi)


@jax.custom_jvp
def _kl_inv(q: jax.Array, c: jax.Array) -> jax.Array:
    _, _, lo, _ = jax.lax.fori_loop(0, _BISECTION_STEPS, _bisect, (q, c, q, jnp.ones_like(q)))
    return lo


@_kl_inv.defjvp
def _kl_inv_jvp(primals, tangents):
    q, c = primals
    dq, dc = tangents
    p = _kl_inv(q, c)
    # Implicit function theorem on kl(q || p) = c.
    dkl_dp = (p - q) / (p * (1.0 - p))
    dkl_dq = jnp.log(jnp.where(q > 0, q, 1.0) / p) - jnp.log(
        jnp.where(q < 1, 1.0 - q, 1.0) / (1.0 - p)
    )
    ok = (dkl_dp > 0) & (p < 1.0)
    safe = jnp.where(ok, dkl_dp, 1.0)
    dp = jnp.where(ok, (dc - dkl_dq * dq) / safe, 0.0)
    return p, dp


def kl_inverse(q, c) -> jax.Array:
    r"""The largest $p \in [q, 1]$ with $\mathrm{kl}(q\|p) \le c$ (kl-inverse of Maurer's bound).

    Bracketed bisection on [q, 1] (200 halvings: exact to the floating-point resolution of the
    input dtype, float64 under x64); differentiable in q and c through the implicit function
    theorem. Closed form at q = 0: $1 - e^{-c}$.

    Args:
      q: empirical risk in [0, 1].
      c: budget >= 0.

    Returns:
      p, broadcast over q and c.

    References:
      Maurer 2004, arXiv:cs/0411099; Seeger 2002, JMLR 3:233-269.

    >>> round(float(kl_inverse(0.0, 1.0)), 12)  # 1 - exp(-1)
    0.632120558829
    """
    q, c = floats(q, c)
    q, c = jnp.broadcast_arrays(q, c)
    return _kl_inv(jnp.clip(q, 0.0, 1.0), jnp.maximum(c, 0.0))


def _grid(x: jax.Array, grid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x[..., None]`` and ``grid`` reshaped to broadcast against it (same rank)."""
    return x[..., None], grid.reshape((1,) * x.ndim + grid.shape)


def _risk(value, terms, hyp, name, status="paper", assumed=(), loss_bound=1.0) -> Bound:
    return Bound(
        value=value,
        terms=terms,
        hypotheses=hyp,
        vacuous=value >= loss_bound,
        name=name,
        kind="risk",
        status=status,
        assumed=assumed,
    )


def mcallester(*, empirical_risk, kl, num_samples, delta) -> Bound:
    r"""McAllester's bound (Maurer's constant).

    For a loss in [0, 1], with probability >= 1 - delta,
    $$\mathbb E_Q L_D \le \mathbb E_Q L_S
      + \sqrt{\frac{\mathrm{KL}(Q\|P) + \ln(2\sqrt N/\delta)}{2N}}.$$

    References:
      McAllester 1999; Maurer 2004, arXiv:cs/0411099.
    """
    ls, kl, n, delta = floats(empirical_risk, kl, num_samples, delta)
    budget = kl + jnp.log(2.0 * jnp.sqrt(n) / delta)
    slack = jnp.sqrt(budget / (2.0 * n))
    return _risk(
        ls + slack,
        {"empirical_risk": ls, "slack": slack, "budget": budget},
        {},
        "McAllester PAC-Bayes",
        assumed=("loss in [0, 1]", "prior chosen before the data"),
    )


def maurer(*, empirical_risk, kl, num_samples, delta) -> Bound:
    r"""Maurer / Seeger kl bound.

    $\mathbb E_Q L_D \le \mathrm{kl}^{-1}\big(\mathbb E_Q L_S,
    (\mathrm{KL} + \ln(2\sqrt N/\delta))/N\big)$, loss in [0, 1]. Always at least as tight as
    :func:`mcallester` (Pinsker).

    References:
      Maurer 2004, arXiv:cs/0411099; Seeger 2002.
    """
    ls, kl, n, delta = floats(empirical_risk, kl, num_samples, delta)
    budget = (kl + jnp.log(2.0 * jnp.sqrt(n) / delta)) / n
    value = kl_inverse(ls, budget)
    return _risk(
        value,
        {"empirical_risk": ls, "kl_budget": budget},
        {},
        "Maurer kl PAC-Bayes",
        assumed=("loss in [0, 1]", "prior chosen before the data"),
    )


def catoni(*, empirical_risk, kl, num_samples, delta, Cs=None) -> Bound:
    r"""Catoni's bound, minimised over a grid of C with a union bound.

    $$\mathbb E_Q L_D \le \min_{C\in\mathcal C}\frac{1 - \exp\big(-C\,\mathbb E_Q L_S
      - (\mathrm{KL} + \ln(|\mathcal C|/\delta))/N\big)}{1 - e^{-C}}.$$

    Args:
      empirical_risk: E_Q L_S in [0, 1].
      kl: KL(Q || P).
      num_samples: N.
      delta: confidence.
      Cs: the grid (default 20 points geometric in [0.01, 100]).

    References:
      Catoni 2007, Theorem 1.2.6; Germain et al. 2009 (ICML).
    """
    ls, kl, n, delta = jnp.broadcast_arrays(*floats(empirical_risk, kl, num_samples, delta))
    Cs = jnp.geomspace(0.01, 100.0, 20, dtype=ls.dtype) if Cs is None else jnp.asarray(Cs, ls.dtype)
    budget = kl + jnp.log(Cs.shape[0] / delta)
    ls_g, C = _grid(ls, Cs)
    b_g, _ = _grid(budget / n, Cs)
    vals = -jnp.expm1(-C * ls_g - b_g) / -jnp.expm1(-C)
    best = jnp.argmin(vals, axis=-1)
    value = jnp.min(vals, axis=-1)
    return _risk(
        value,
        {"empirical_risk": ls, "C": Cs[best], "budget": budget},
        {},
        "Catoni PAC-Bayes",
        assumed=("loss in [0, 1]", "prior chosen before the data"),
    )


def alquier(*, empirical_risk, kl, num_samples, delta, Sigma, lambdas=None) -> Bound:
    r"""Alquier's bound for a Sigma-sub-Gaussian loss, with a union bound over a lambda grid.

    $$\mathbb E_Q L_D \le \mathbb E_Q L_S + \min_{\lambda\in\Lambda}\Big(\frac{\lambda\Sigma^2}{2N}
      + \frac{\mathrm{KL} + \ln(|\Lambda|/\delta)}{\lambda}\Big).$$
    At the unconstrained optimum this is
    $\mathbb E_Q L_S + 2\sqrt{\Sigma^2(\mathrm{KL} + \ln(|\Lambda|/\delta))/(2N)}$.

    Args:
      empirical_risk: E_Q L_S.
      kl: KL(Q || P).
      num_samples: N.
      delta: confidence.
      Sigma: sub-Gaussian constant of the loss (see :func:`subgaussian_constant`).
      lambdas: grid (default 41 points, ``sqrt(N)/Sigma * geomspace(1e-3, 1e3)``).

    References:
      Alquier, Ridgway & Chopin 2016, JMLR 17(236), Theorem 4.3.
    """
    ls, kl, n, delta, S = jnp.broadcast_arrays(
        *floats(empirical_risk, kl, num_samples, delta, Sigma)
    )
    if lambdas is None:
        base = jnp.geomspace(1e-3, 1e3, 41, dtype=ls.dtype)
        lam_g = _grid(jnp.sqrt(n) / S, base)
        lam = lam_g[0] * lam_g[1]
        size = base.shape[0]
    else:
        base = jnp.asarray(lambdas, ls.dtype)
        lam = _grid(ls, base)[1]
        size = base.shape[0]
    budget = kl + jnp.log(size / delta)
    vals = lam * (S**2 / (2.0 * n))[..., None] + budget[..., None] / lam
    idx = jnp.argmin(vals, axis=-1)
    slack = jnp.min(vals, axis=-1)
    lam_best = jnp.take_along_axis(jnp.broadcast_to(lam, vals.shape), idx[..., None], axis=-1)[
        ..., 0
    ]
    return _risk(
        ls + slack,
        {"empirical_risk": ls, "slack": slack, "lambda": lam_best, "budget": budget},
        {},
        "Alquier sub-Gaussian PAC-Bayes",
        assumed=(
            "loss Sigma-sub-Gaussian under the data distribution",
            "prior chosen before the data",
        ),
        loss_bound=jnp.inf,
    )


def subgaussian_constant(losses, *, lambdas=None) -> jax.Array:
    r"""Smallest Sigma whose Gaussian MGF dominates the empirical MGF of the centred losses.

    $$\hat\Sigma^2 = \max_{\lambda\in\pm\Lambda}\frac{2}{\lambda^2}
      \ln\frac1n\sum_i e^{\lambda(\ell_i - \bar\ell)},$$
    so $\frac1n\sum_i e^{\lambda(\ell_i-\bar\ell)} \le e^{\lambda^2\hat\Sigma^2/2}$ on the grid. Use
    validation losses (held out), not training losses. An estimate, not a certified constant.

    Args:
      losses: shape (n,) per-example losses.
      lambdas: positive grid (default ``geomspace(1e-2, 10, 40) / std``); both signs are used.

    Returns:
      Scalar Sigma-hat (0 for constant losses).

    >>> import jax.numpy as jnp
    >>> x = jnp.array([0.0, 1.0])
    >>> round(float(subgaussian_constant(x, lambdas=jnp.array([1e-4]))), 6)  # ~ std
    0.5
    """
    (x,) = floats(losses)
    centred = x - jnp.mean(x)
    std = jnp.std(x)
    safe = jnp.where(std > 0, std, 1.0)
    lam = (
        jnp.geomspace(1e-2, 10.0, 40, dtype=x.dtype) / safe
        if lambdas is None
        else jnp.asarray(lambdas, x.dtype)
    )
    lam = jnp.concatenate([lam, -lam])
    log_mgf = jax.scipy.special.logsumexp(lam[:, None] * centred[None, :], axis=1) - jnp.log(
        jnp.asarray(x.shape[0], x.dtype)
    )
    s2 = jnp.max(2.0 * log_mgf / lam**2)
    return jnp.where(std > 0, jnp.sqrt(jnp.maximum(s2, 0.0)), 0.0)


def construction_norm_bound(omega, D_f, T) -> jax.Array:
    r"""Squared norm bound of the flat construction (Theorem 10) [checked].

    $$L(\omega, D_f, T) = 16D_f^2(D_f+1) + 8(D_f+1) + 1 + \omega + 4\omega(D_f+1)\ln^2 T.$$

    >>> round(float(construction_norm_bound(10, 2, 20)), 2)
    1303.93
    """
    w, D, T = floats(omega, D_f, T)
    return (
        16.0 * D**2 * (D + 1.0) + 8.0 * (D + 1.0) + 1.0 + w + 4.0 * w * (D + 1.0) * jnp.log(T) ** 2
    )


def sigma_mesh(num: int = 20, dtype=None) -> jax.Array:
    """The paper's sigma mesh: ``num`` geometric points from 1e-2 down to 1e-5."""
    return jnp.geomspace(1e-2, 1e-5, num, dtype=dtype or jnp.result_type(float))


def _mesh(sigmas, dtype) -> jax.Array:
    """The sigmas to choose from: the paper's mesh when ``sigmas`` is None."""
    return sigma_mesh(dtype=dtype) if sigmas is None else jnp.atleast_1d(jnp.asarray(sigmas, dtype))


def optimal_sigma(*, G_u, norm_sq, Sigma, num_samples, perturbation=0.0) -> jax.Array:
    r"""Continuous minimiser of $\sigma^2(G_u+P) + \Sigma\sqrt{L/m}/\sigma$.

    The confidence log is dropped:
    $\sigma^* = (\Sigma\sqrt{L/m}/(2(G_u+P)))^{1/3}$.

    >>> round(float(optimal_sigma(G_u=15524.0, norm_sq=1303.93, Sigma=0.01, num_samples=1e6)), 5)
    0.00227
    """
    G, L, S, m, P = floats(G_u, norm_sq, Sigma, num_samples, perturbation)
    return (S * jnp.sqrt(L / m) / (2.0 * (G + P))) ** (1.0 / 3.0)


def semi_analytic(
    *,
    G_u,
    norm_sq,
    Sigma,
    num_samples,
    delta,
    perturbation=0.0,
    sigmas=None,
    empirical_risk=0.0,
    loss_bound=1.0,
) -> Bound:
    r"""The semi-analytic PAC-Bayes bound of the flat construction [rebuilt], sigma on a mesh.

    $$\mathbb E_u L_D(\hat\theta + u) \le L_S + \sigma^2(G_u + P)
      + 2\sqrt{\frac{\Sigma^2}{2m}\Big(\frac{L}{2\sigma^2} + \ln\frac{K}{\delta}\Big)},$$
    minimised over the K mesh values of sigma (the union bound over the mesh is the $\ln K$).
    $\sigma^2 G_u$ bounds $(\sigma^2/2)\operatorname{tr}H$ at an interpolator (Theorems 13, 14);
    ``perturbation`` is P, the measured perturbation term divided by sigma^2 (scalar, or one value
    per mesh point); P = 0 gives the "no perturbation term" bound.

    Args:
      G_u: bound on ||grad_theta f||^2 over inputs (15524 reported at omega=10, D_f=2).
      norm_sq: L, the bound on ||theta||^2 (:func:`construction_norm_bound`).
      Sigma: sub-Gaussian constant of the loss.
      num_samples: m.
      delta: confidence.
      perturbation: P (default 0).
      sigmas: the mesh (default :func:`sigma_mesh`, 20 points 1e-2 .. 1e-5).
      empirical_risk: L_S at theta-hat (0 at an interpolator).
      loss_bound: trivial bound for the vacuous flag.

    Returns:
      Bound with ``.value``, ``.sigma`` (chosen), terms ``curvature``, ``complexity``,
      ``union_cost``, ``per_sigma`` (the bound at every mesh point), ``sigma_star``.

    References:
      "A Sharper Picture of Generalization in Transformers", arXiv:2605.20988, Section 5 / E.3
      (rebuilt); Alquier et al. 2016.
    """
    G, L, S, m, delta, ls = jnp.broadcast_arrays(
        *floats(G_u, norm_sq, Sigma, num_samples, delta, empirical_risk)
    )
    mesh = _mesh(sigmas, G.dtype)
    K = mesh.shape[0]
    (P,) = floats(perturbation)
    P = P.astype(G.dtype)
    G_g, s = _grid(G, mesh)
    P_g = P.reshape((1,) * G.ndim + (K,)) if P.ndim == 1 else P[..., None]
    curvature = s**2 * (G_g + P_g)
    complexity = 2.0 * jnp.sqrt(
        (S**2 / (2.0 * m))[..., None]
        * (L[..., None] / (2.0 * s**2) + jnp.log(K / delta)[..., None])
    )
    per_sigma = ls[..., None] + curvature + complexity
    idx = jnp.argmin(per_sigma, axis=-1)

    def pick(a):
        a = jnp.broadcast_to(a, per_sigma.shape)
        return jnp.take_along_axis(a, idx[..., None], axis=-1)[..., 0]

    value = pick(per_sigma)
    return Bound(
        value=value,
        terms={
            "sigma": pick(s),
            "curvature": pick(curvature),
            "complexity": pick(complexity),
            "union_cost": jnp.log(jnp.asarray(K, G.dtype)),
            "per_sigma": per_sigma,
            "sigma_star": optimal_sigma(G_u=G, norm_sq=L, Sigma=S, num_samples=m),
            "empirical_risk": ls,
        },
        hypotheses={},
        vacuous=value >= loss_bound,
        name="Flat construction semi-analytic PAC-Bayes",
        kind="risk",
        status="rebuilt",
        assumed=(
            "loss Sigma-sub-Gaussian",
            "theta-hat interpolates (tr H = 2||grad f||^2)",
            "||grad f||^2 <= G_u on the data",
        ),
    )


def _prob_on_mesh(log_terms: jax.Array, mesh: jax.Array, name: str, extra: dict) -> Bound:
    K = mesh.shape[0]
    log_total = log_terms + jnp.log(jnp.asarray(K, log_terms.dtype))
    idx = jnp.argmin(log_total, axis=-1)
    best = jnp.take_along_axis(log_total, idx[..., None], axis=-1)[..., 0]
    return Bound(
        value=jnp.exp(jnp.minimum(best, 0.0)),
        terms={"log_value": best, "sigma": mesh[idx], **extra},
        hypotheses={},
        vacuous=best >= 0.0,
        name=name,
        kind="probability",
        status="rebuilt",
        assumed=("loss Sigma-sub-Gaussian", "each step is the omega=1, D_f=2 construction"),
    )


def chain_of_thought_parity(
    *, T, G_u, Sigma, num_samples, norm_sq=None, perturbation=0.0, sigmas=None
) -> Bound:
    r"""Probability that a chain of thought for PARITY of length T goes wrong [rebuilt].

    $$P \le 4T\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2(2G_u(1,2) + P)}{4\Sigma^2}
      + \frac{L(1,2,T)}{2\sigma^2}\Big),$$
    minimised over the sigma mesh with a union factor K. Reported as a probability (clipped at 1;
    vacuous when >= 1).

    Args:
      T: sequence length.
      G_u: G_u(1, 2), the gradient bound of one step.
      Sigma: sub-Gaussian constant.
      num_samples: m.
      norm_sq: L(1, 2, T) (default :func:`construction_norm_bound`).
      perturbation: P.
      sigmas: mesh (default :func:`sigma_mesh`).

    References:
      arXiv:2605.20988 (rebuilt, SPEC.md section 5).
    """
    T, G, S, m, P = jnp.broadcast_arrays(*floats(T, G_u, Sigma, num_samples, perturbation))
    L = construction_norm_bound(1.0, 2.0, T) if norm_sq is None else floats(norm_sq)[0]
    mesh = _mesh(sigmas, G.dtype)
    _, s = _grid(G, mesh)
    log_terms = (
        jnp.log(4.0 * T)[..., None]
        - (m / (8.0 * S**2))[..., None]
        + (m * (2.0 * G + P) / (4.0 * S**2))[..., None] * s**2
        + (L / 2.0)[..., None] / s**2
    )
    return _prob_on_mesh(log_terms, mesh, "Chain-of-thought PARITY", {"norm_sq": L})


def one_pass_parity(
    *, T, G_u, Sigma, num_samples, norm_sq=None, perturbation=0.0, sigmas=None
) -> Bound:
    r"""Probability that one pass over PARITY of length T goes wrong [rebuilt].

    $$P \le 4\exp\Big(-\frac{m}{8\Sigma^2} + \frac{m\sigma^2T(2G_u(1,2) + P)}{4\Sigma^2}
      + \frac{T L(1,2,T)}{2\sigma^2}\Big),$$
    minimised over the sigma mesh with a union factor K.

    References:
      arXiv:2605.20988 (rebuilt, SPEC.md section 5).
    """
    T, G, S, m, P = jnp.broadcast_arrays(*floats(T, G_u, Sigma, num_samples, perturbation))
    L = construction_norm_bound(1.0, 2.0, T) if norm_sq is None else floats(norm_sq)[0]
    mesh = _mesh(sigmas, G.dtype)
    _, s = _grid(G, mesh)
    log_terms = (
        jnp.log(jnp.asarray(4.0, G.dtype))
        - (m / (8.0 * S**2))[..., None]
        + (m * T * (2.0 * G + P) / (4.0 * S**2))[..., None] * s**2
        + (T * L / 2.0)[..., None] / s**2
    )
    return _prob_on_mesh(log_terms, mesh, "One-pass PARITY", {"norm_sq": L})
