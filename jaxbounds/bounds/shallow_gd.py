r"""Generalization of a shallow Transformer trained by gradient descent (NTK regime).

Model $f(X) = \frac1{d_s}w_O^\top\sum_i\mathrm{relu}(W_V X^\top
\mathrm{softmax}(XW_K^\top W_Q x_i^\top/\sqrt{d_m}))$.
From a training record (initial weights, the largest distance $R_*$ of each matrix from its
initial value over training, $\alpha = \sigma_{\min}(F^0_{pre})$, N, $d_s$, $d_m$, $R_X$,
$\Phi(\theta^0) = \frac12\|f(\theta^0) - y\|^2$) the calculators evaluate Lemma 1 (Rademacher),
Lemma 4 (empirical loss) and Theorem 5 (population loss), and report which hypotheses hold on
that run ($d_m \ge N^3$ with the log factors of $\tilde\Omega$ dropped, and the two conditions on
alpha).

The statements hide constants ($\lesssim$, $O$); the values are the expressions with constant 1.

Note on Lemma 4: the paper prints the second term as $\alpha^3\eta_O/(32\rho^4\hat z\sqrt N)$, but
its own derivation ($\sqrt{2\Phi/N}$ with $\Phi \le \alpha^6\eta_O^2/(2048\rho^4z^2)$) gives
$\rho^2$, not $\rho^4$. ``value`` uses the derived $\rho^2$ form (what the proof supports); the
printed form is kept as the term ``second_printed``.

References:
  "Generalization of a shallow Transformer trained by gradient descent" (papers/
  shallow_transformer_gd_generalization.md), Lemma 1, Lemma 4, Theorem 5; Wu et al. 2024.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.bounds._result import Bound, floats

__all__ = ["alpha_from_features", "lemma_1", "lemma_4", "norms_from_weights", "theorem_5"]

_NAMES = ("Q", "K", "V", "O")


def alpha_from_features(features: jax.Array) -> jax.Array:
    r"""$\alpha = \sigma_{\min}(F^0_{pre})$, least singular value of the hidden features at init.

    Args:
      features: matrix of shape (N, p) (one row of hidden features per training example).

    >>> import jax.numpy as jnp
    >>> round(float(alpha_from_features(jnp.diag(jnp.array([3.0, 2.0])))), 12)
    2.0
    """
    s = jnp.linalg.svd(jnp.asarray(features), compute_uv=False)
    return s[..., min(features.shape[-2:]) - 1]


def norms_from_weights(init: dict[str, Any], radii: dict[str, Any]) -> dict[str, jax.Array]:
    r"""$\eta_* = \|W^0_*\|_F + R_*$ and $\xi_* = \|W^0_*\|_2 + R_*$ for * in Q, K, V, O.

    Args:
      init: initial weights ``{"Q": W_Q^0, "K": W_K^0, "V": W_V^0, "O": w_O^0}``.
      radii: ``{"Q": R_Q, ...}``, the largest Frobenius distance from init over training.

    Returns:
      ``{"eta_Q", ..., "xi_Q", ..., "R_Q", ...}``.
    """
    out = {}
    for n in _NAMES:
        W = jnp.asarray(init[n])
        (R,) = floats(radii[n])
        fro = jnp.sqrt(jnp.sum(W**2)).astype(R.dtype)
        spec = (fro if W.ndim < 2 else jnp.linalg.norm(W, ord=2)).astype(R.dtype)
        out[f"eta_{n}"] = fro + R
        out[f"xi_{n}"] = spec + R
        out[f"R_{n}"] = R
    return out


def lemma_1(*, eta_Q, eta_K, eta_V, eta_O, num_samples, d_s, d_m, R_X, loss_bound=1.0) -> Bound:
    r"""Lemma 1: $\mathrm{Rad}_S \lesssim \sqrt{P/N}(1 + \log(A\sqrt{N/P}))$.

    It is A where $A\sqrt{N/P} < 1$ (Dudley radius),

    with

    $$P = (\sqrt{d_s}R_X)^2\big((\sqrt{d_m}\eta_V)^{2/3}
      + (\sqrt{d_m}\eta_K\eta_Q\eta_V)^{2/3}\big)^3\log(Nd_s),
      \qquad A = \eta_O\eta_V\sqrt{d_s}R_X.$$

    Returns:
      Bound (kind "rademacher") with terms ``P`` and ``A``.

    References:
      Shallow-Transformer GD paper, Lemma 1.
    """
    eQ, eK, eV, eO, N, ds, dm, RX = floats(eta_Q, eta_K, eta_V, eta_O, num_samples, d_s, d_m, R_X)
    t = 2.0 / 3.0
    P = (
        (jnp.sqrt(ds) * RX) ** 2
        * ((jnp.sqrt(dm) * eV) ** t + (jnp.sqrt(dm) * eK * eQ * eV) ** t) ** 3
        * jnp.log(N * ds)
    )
    A = eO * eV * jnp.sqrt(ds) * RX
    ratio = A * jnp.sqrt(N / P)
    inside = ratio >= 1.0
    # Dudley with constants 1: when the optimal delta sqrt(P/N) exceeds the radius A the
    # integral is empty and the bound is A (the printed formula would go negative there).
    value = jnp.where(inside, jnp.sqrt(P / N) * (1.0 + jnp.log(jnp.where(inside, ratio, 1.0))), A)
    return Bound(
        value=value,
        terms={"P": P, "A": A, "dudley_inside": inside},
        hypotheses={},
        vacuous=2.0 * value >= loss_bound,
        name="Shallow GD Lemma 1",
        kind="rademacher",
        assumed=("inputs full rank", "||X_n||_F <= sqrt(d_s) R_X"),
    )


def lemma_4(
    *,
    alpha,
    phi0,
    num_samples,
    d_s,
    d_m,
    R_X,
    eta_Q,
    eta_K,
    eta_V,
    eta_O,
    xi_Q,
    xi_K,
    xi_V,
    R_Q,
    R_K,
    R_V,
    R_O,
    loss_bound=1.0,
) -> Bound:
    r"""Lemma 4: the empirical loss after GD.

    $\min(\frac{\alpha^2}{8\rho\hat M\sqrt N},
    \frac{\alpha^3\eta_O}{32\rho^2\hat z\sqrt N})$, $\rho = N^{1/2}d_s^{3/2}R_X$.

    $z = \eta_O^2(1 + \frac4{d_m}R_X^4d_s^2\xi_V^2(\xi_Q^2+\xi_K^2))$, $\hat z$ the same with eta;
    $M = \max(\xi_V/R_O, \eta_O/R_V, \frac2{\sqrt{d_m}}R_X^2d_s\xi_K\xi_V\eta_O/R_Q,
    \frac2{\sqrt{d_m}}R_X^2d_s\xi_Q\xi_V\eta_O/R_K)$, $\hat M$ the same with eta.
    Hypotheses reported: $d_m \ge N^3$, $\alpha^2 \ge 8\rho M\sqrt{2\Phi(\theta^0)}$,
    $\alpha^3 \ge 32\rho^2z\sqrt{2\Phi(\theta^0)}/\eta_O$. See the module note on $\rho^2$ vs
    $\rho^4$.

    Returns:
      Bound (kind "risk": a bound on the empirical loss) with every term.

    References:
      Shallow-Transformer GD paper, Lemma 4 and its proof.
    """
    (a, phi0, N, ds, dm, RX, eQ, eK, eV, eO, xQ, xK, xV, RQ, RK, RV, RO) = floats(
        alpha, phi0, num_samples, d_s, d_m, R_X, eta_Q, eta_K, eta_V, eta_O, xi_Q, xi_K, xi_V,
        R_Q, R_K, R_V, R_O,
    )  # fmt: skip
    rho = jnp.sqrt(N) * ds**1.5 * RX
    c = 2.0 / jnp.sqrt(dm) * RX**2 * ds
    z = eO**2 * (1.0 + 4.0 / dm * RX**4 * ds**2 * xV**2 * (xQ**2 + xK**2))
    z_hat = eO**2 * (1.0 + 4.0 / dm * RX**4 * ds**2 * eV**2 * (eQ**2 + eK**2))
    M = jnp.maximum(
        jnp.maximum(xV / RO, eO / RV), jnp.maximum(c * xK * xV * eO / RQ, c * xQ * xV * eO / RK)
    )
    M_hat = jnp.maximum(
        jnp.maximum(eV / RO, eO / RV), jnp.maximum(c * eK * eV * eO / RQ, c * eQ * eV * eO / RK)
    )
    first = a**2 / (8.0 * rho * M_hat * jnp.sqrt(N))
    second = a**3 * eO / (32.0 * rho**2 * z_hat * jnp.sqrt(N))
    second_printed = a**3 * eO / (32.0 * rho**4 * z_hat * jnp.sqrt(N))
    value = jnp.minimum(first, second)
    root = jnp.sqrt(2.0 * phi0)
    hyp = {
        "d_m >= N^3": dm >= N**3,
        "alpha^2 >= 8 rho M sqrt(2 Phi0)": a**2 >= 8.0 * rho * M * root,
        "alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O": a**3 >= 32.0 * rho**2 * z * root / eO,
    }
    return Bound(
        value=value,
        terms={
            "rho": rho,
            "z": z,
            "z_hat": z_hat,
            "M": M,
            "M_hat": M_hat,
            "first": first,
            "second": second,
            "second_printed": second_printed,
        },
        hypotheses=hyp,
        vacuous=value >= loss_bound,
        name="Shallow GD Lemma 4",
        kind="risk",
        assumed=("Assumption 3 (full row rank, weakly correlated inputs)", "step size <= 1/k"),
    )


def theorem_5(
    *,
    alpha,
    phi0,
    num_samples,
    d_s,
    d_m,
    R_X,
    init: dict[str, Any],
    radii: dict[str, Any],
    delta,
    loss_bound=1.0,
) -> Bound:
    r"""Theorem 5: population loss after GD.

    $L_D \lesssim \text{Lemma 4} + \sqrt{P/N}(1 + \log(A\sqrt{N/P})) + \sqrt{\log(R/\delta)/N}$.

    $R = \sqrt{R_Q^2 + R_K^2 + R_V^2 + R_O^2}$. Vacuous when >= ``loss_bound``.

    Args:
      alpha: sigma_min of the last hidden features at init (:func:`alpha_from_features`).
      phi0: Phi(theta^0) = ||f(theta^0) - y||^2 / 2.
      num_samples: N.
      d_s: sequence length (tokens per input).
      d_m: hidden width.
      R_X: token norm bound (||X_n||_F <= sqrt(d_s) R_X).
      init: initial weights ``{"Q", "K", "V", "O"}``.
      radii: largest distances from init ``{"Q", "K", "V", "O"}``.
      delta: confidence.
      loss_bound: trivial bound for the vacuous flag.

    Returns:
      Bound (kind "risk") with terms ``empirical``, ``rademacher``, ``confidence`` and the norms;
      ``hypotheses`` as in :func:`lemma_4`.

    References:
      Shallow-Transformer GD paper, Theorem 5.
    """
    norms = norms_from_weights(init, radii)
    common = {"num_samples": num_samples, "d_s": d_s, "d_m": d_m, "R_X": R_X}
    l1 = lemma_1(**{k: norms[k] for k in ("eta_Q", "eta_K", "eta_V", "eta_O")}, **common)
    l4 = lemma_4(
        alpha=alpha,
        phi0=phi0,
        **common,
        **{k: v for k, v in norms.items() if k != "xi_O"},
    )
    R = jnp.sqrt(sum(norms[f"R_{n}"] ** 2 for n in _NAMES))
    N, delta = floats(num_samples, delta)
    confidence = jnp.sqrt(jnp.log(R / delta) / N)
    value = l4.value + l1.value + confidence
    return Bound(
        value=value,
        terms={
            "empirical": l4.value,
            "rademacher": l1.value,
            "confidence": confidence,
            "R": R,
            **l1.terms,
            **l4.terms,
            **norms,
        },
        hypotheses=l4.hypotheses,
        vacuous=value >= loss_bound,
        name="Shallow GD Theorem 5",
        kind="risk",
        assumed=l4.assumed + l1.assumed,
    )
