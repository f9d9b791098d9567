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

Lemma 4 and Theorem 5 hold only under their hypotheses: where one fails on the given run the
bound's status is ``NOT_VALID`` (never shown as a number). Float64 numpy, validated inputs
(``ValueError`` naming the argument, or a not-valid bound with ``strict=False``).

References:
  "Generalization of a shallow Transformer trained by gradient descent" (papers/
  shallow_transformer_gd_generalization.md), Lemma 1, Lemma 4, Theorem 5; Wu et al. 2024.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxbounds.bounds._result import Bound, Check, Inputs, in_float64, quiet
from kernels.norms import spectral_norm, tree_norm

__all__ = ["alpha_from_features", "lemma_1", "lemma_4", "norms_from_weights", "theorem_5"]

_NAMES = ("Q", "K", "V", "O")


def alpha_from_features(features: Any) -> np.float64:
    r"""$\alpha = \sigma_{\min}(F^0_{pre})$, least singular value of the hidden features at init.

    Args:
      features: finite matrix of shape (N, p) (one row of hidden features per training example).

    Raises:
      ValueError: if ``features`` is not a non-empty finite 2-D array.

    >>> round(float(alpha_from_features([[3.0, 0.0], [0.0, 2.0]])), 12)
    2.0
    """
    F = Inputs(True).real("features", features)
    if F.ndim != 2 or F.size == 0:
        raise ValueError(f"features: expected a non-empty 2-D array, got shape {F.shape}")
    return np.float64(np.linalg.svd(F, compute_uv=False)[min(F.shape) - 1])


def norms_from_weights(init: dict[str, Any], radii: dict[str, Any]) -> dict[str, np.ndarray]:
    r"""$\eta_* = \|W^0_*\|_F + R_*$ and $\xi_* = \|W^0_*\|_2 + R_*$ for * in Q, K, V, O.

    Args:
      init: initial weights ``{"Q": W_Q^0, "K": W_K^0, "V": W_V^0, "O": w_O^0}`` (finite).
      radii: ``{"Q": R_Q, ...}``, the largest Frobenius distance from init over training (>= 0).

    Returns:
      ``{"eta_Q", ..., "xi_Q", ..., "R_Q", ...}`` (float64).

    Raises:
      ValueError: naming the entry, for a missing key, a non-finite weight or a negative radius.
    """
    ins = Inputs(True)
    out = {}
    for n in _NAMES:
        if n not in init or n not in radii:
            raise ValueError(f"init, radii: expected the keys Q, K, V, O, missing {n!r}")
        W = ins.real(f"init[{n!r}]", init[n])
        R = ins.nonneg(f"radii[{n!r}]", radii[n])
        fro = in_float64(tree_norm, W)
        out[f"eta_{n}"] = fro + R
        out[f"xi_{n}"] = (fro if W.ndim < 2 else in_float64(spectral_norm, W)) + R
        out[f"R_{n}"] = R
    return out


@quiet
def lemma_1(
    *, eta_Q, eta_K, eta_V, eta_O, num_examples, d_s, d_m, R_X, loss_bound=1.0, strict=True
) -> Bound:
    r"""Lemma 1: $\mathrm{Rad}_S \lesssim \sqrt{P/N}(1 + \log(A\sqrt{N/P}))$.

    It is A where $A\sqrt{N/P} < 1$ (Dudley radius), and 0 when P = 0, with
    $$P = (\sqrt{d_s}R_X)^2\big((\sqrt{d_m}\eta_V)^{2/3}
      + (\sqrt{d_m}\eta_K\eta_Q\eta_V)^{2/3}\big)^3\log(Nd_s),
      \qquad A = \eta_O\eta_V\sqrt{d_s}R_X.$$
    Vacuous when ``2 * value >= loss_bound``.

    Args:
      eta_Q: ``||W_Q^0||_F + R_Q`` (>= 0); likewise ``eta_K``, ``eta_V``, ``eta_O``.
      eta_K: see ``eta_Q``.
      eta_V: see ``eta_Q``.
      eta_O: see ``eta_Q``.
      num_examples: N (integer >= 1).
      d_s: tokens per input (integer >= 1).
      d_m: hidden width (integer >= 1).
      R_X: token norm bound (>= 0).
      loss_bound: range of the loss (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "rademacher") with terms ``P`` and ``A``.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Shallow-Transformer GD paper, Lemma 1.
    """
    ins = Inputs(strict)
    eQ, eK, eV, eO = (
        ins.nonneg(f"eta_{n}", v) for n, v in zip(_NAMES, (eta_Q, eta_K, eta_V, eta_O), strict=True)
    )
    N, ds, dm = (
        ins.count("num_examples", num_examples),
        ins.count("d_s", d_s),
        ins.count("d_m", d_m),
    )
    RX, lb = ins.nonneg("R_X", R_X), ins.positive("loss_bound", loss_bound)
    terms = _lemma_1_terms(eQ, eK, eV, eO, N, ds, dm, RX)
    return ins.bound(
        value=terms.pop("value"),
        terms=terms,
        hypotheses={},
        trivial=lb / 2.0,
        name="Shallow GD Lemma 1",
        kind="rademacher",
        assumed=("inputs full rank", "||X_n||_F <= sqrt(d_s) R_X"),
    )


def _lemma_1_terms(eQ, eK, eV, eO, N, ds, dm, RX) -> dict[str, np.ndarray]:
    """P, A, which Dudley branch applies, and the value of Lemma 1."""
    t = 2.0 / 3.0
    P = (ds * RX**2) * ((np.sqrt(dm) * eV) ** t + (np.sqrt(dm) * eK * eQ * eV) ** t) ** 3
    P = P * (np.log(N) + np.log(ds))
    A = eO * eV * np.sqrt(ds) * RX
    # ln(A sqrt(N / P)) as a sum of logs (N / P overflows for a subnormal P); +inf at P = 0.
    positive = P > 0
    log_ratio = np.where(
        positive, np.log(A) + 0.5 * (np.log(N) - np.log(np.where(positive, P, 1.0))), np.inf
    )
    inside = log_ratio >= 0.0
    # Dudley with constants 1: when the optimal delta sqrt(P/N) exceeds the radius A the
    # integral is empty and the bound is A (the printed formula would go negative there).
    formula = np.sqrt(P) / np.sqrt(N) * (1.0 + np.where(inside & positive, log_ratio, 0.0))
    return {"value": np.where(inside, formula, A), "P": P, "A": A, "dudley_inside": inside}


def _lemma_4_inputs(ins: Inputs, kw: dict[str, Any]) -> dict[str, np.ndarray]:
    """Validated float64 inputs of Lemma 4 by name."""
    out = {"alpha": ins.nonneg("alpha", kw["alpha"]), "phi0": ins.nonneg("phi0", kw["phi0"])}
    for name in ("num_examples", "d_s", "d_m"):
        out[name] = ins.count(name, kw[name])
    for name in ("R_X", "eta_O", "R_Q", "R_K", "R_V", "R_O"):
        out[name] = ins.positive(name, kw[name])
    for name in ("eta_Q", "eta_K", "eta_V", "xi_Q", "xi_K", "xi_V"):
        out[name] = ins.nonneg(name, kw[name])
    out["loss_bound"] = ins.positive("loss_bound", kw["loss_bound"])
    return out


def _lemma_4_terms(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """rho, z, z_hat, M, M_hat and the two terms of Lemma 4 (names as in the paper)."""
    N, ds, dm, RX = v["num_examples"], v["d_s"], v["d_m"], v["R_X"]
    eQ, eK, eV, eO, xQ, xK, xV = (
        v[k] for k in ("eta_Q", "eta_K", "eta_V", "eta_O", "xi_Q", "xi_K", "xi_V")
    )
    RQ, RK, RV, RO, a = v["R_Q"], v["R_K"], v["R_V"], v["R_O"], v["alpha"]
    rho = np.sqrt(N) * ds**1.5 * RX
    c = 2.0 / np.sqrt(dm) * RX**2 * ds
    t = {"rho": rho}
    t["z"] = eO**2 * (1.0 + 4.0 / dm * RX**4 * ds**2 * xV**2 * (xQ**2 + xK**2))
    t["z_hat"] = eO**2 * (1.0 + 4.0 / dm * RX**4 * ds**2 * eV**2 * (eQ**2 + eK**2))
    t["M"] = np.maximum(
        np.maximum(xV / RO, eO / RV), np.maximum(c * xK * xV * eO / RQ, c * xQ * xV * eO / RK)
    )
    t["M_hat"] = np.maximum(
        np.maximum(eV / RO, eO / RV), np.maximum(c * eK * eV * eO / RQ, c * eQ * eV * eO / RK)
    )
    t["first"] = a**2 / (8.0 * rho * t["M_hat"] * np.sqrt(N))
    t["second"] = a**3 * eO / (32.0 * rho**2 * t["z_hat"] * np.sqrt(N))
    t["second_printed"] = a**3 * eO / (32.0 * rho**4 * t["z_hat"] * np.sqrt(N))
    return t


def _lemma_4_hypotheses(v: dict[str, np.ndarray], t: dict[str, np.ndarray]) -> dict[str, Check]:
    N, a, eO = v["num_examples"], v["alpha"], v["eta_O"]
    root = np.sqrt(2.0 * v["phi0"])
    lhs2, rhs2 = a**2, 8.0 * t["rho"] * t["M"] * root
    lhs3, rhs3 = a**3, 32.0 * t["rho"] ** 2 * t["z"] * root / eO
    return {
        "d_m >= N^3": Check.of(v["d_m"] >= N**3, d_m=v["d_m"], **{"N^3": N**3}),
        "alpha^2 >= 8 rho M sqrt(2 Phi0)": Check.of(
            lhs2 >= rhs2, **{"alpha^2": lhs2, "8 rho M sqrt(2 Phi0)": rhs2}
        ),
        "alpha^3 >= 32 rho^2 z sqrt(2 Phi0) / eta_O": Check.of(
            lhs3 >= rhs3, **{"alpha^3": lhs3, "32 rho^2 z sqrt(2 Phi0) / eta_O": rhs3}
        ),
    }


@quiet
def lemma_4(
    *, alpha, phi0, num_examples, d_s, d_m, R_X, eta_Q, eta_K, eta_V, eta_O, xi_Q, xi_K, xi_V,
    R_Q, R_K, R_V, R_O, loss_bound=1.0, strict=True,
) -> Bound:  # fmt: skip
    r"""Lemma 4: the empirical loss after GD.

    $\min(\frac{\alpha^2}{8\rho\hat M\sqrt N},
    \frac{\alpha^3\eta_O}{32\rho^2\hat z\sqrt N})$, $\rho = N^{1/2}d_s^{3/2}R_X$.

    $z = \eta_O^2(1 + \frac4{d_m}R_X^4d_s^2\xi_V^2(\xi_Q^2+\xi_K^2))$, $\hat z$ the same with eta;
    $M = \max(\xi_V/R_O, \eta_O/R_V, \frac2{\sqrt{d_m}}R_X^2d_s\xi_K\xi_V\eta_O/R_Q,
    \frac2{\sqrt{d_m}}R_X^2d_s\xi_Q\xi_V\eta_O/R_K)$, $\hat M$ the same with eta.
    Hypotheses checked (the bound is ``NOT_VALID`` where one fails): $d_m \ge N^3$,
    $\alpha^2 \ge 8\rho M\sqrt{2\Phi(\theta^0)}$,
    $\alpha^3 \ge 32\rho^2z\sqrt{2\Phi(\theta^0)}/\eta_O$. See the module note on $\rho^2$ vs
    $\rho^4$.

    Args:
      alpha: sigma_min of the hidden features at init (>= 0).
      phi0: Phi(theta^0) = ||f(theta^0) - y||^2 / 2 (>= 0).
      num_examples: N (integer >= 1).
      d_s: tokens per input (integer >= 1).
      d_m: hidden width (integer >= 1).
      R_X: token norm bound (> 0).
      eta_Q: ``||W_Q^0||_F + R_Q`` (>= 0; ``eta_O`` > 0); likewise ``eta_K``, ``eta_V``.
      eta_K: see ``eta_Q``.
      eta_V: see ``eta_Q``.
      eta_O: see ``eta_Q``.
      xi_Q: ``||W_Q^0||_2 + R_Q`` (>= 0); likewise ``xi_K``, ``xi_V``.
      xi_K: see ``xi_Q``.
      xi_V: see ``xi_Q``.
      R_Q: largest distance of W_Q from init over training (> 0); likewise the others.
      R_K: see ``R_Q``.
      R_V: see ``R_Q``.
      R_O: see ``R_Q``.
      loss_bound: trivial bound on the loss (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "risk": a bound on the empirical loss) with every term.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Shallow-Transformer GD paper, Lemma 4 and its proof.
    """
    kw = dict(locals())
    ins = Inputs(strict)
    v = _lemma_4_inputs(ins, kw)
    t = _lemma_4_terms(v)
    return ins.bound(
        value=np.minimum(t["first"], t["second"]),
        terms=t,
        hypotheses=_lemma_4_hypotheses(v, t),
        trivial=v["loss_bound"],
        name="Shallow GD Lemma 4",
        kind="risk",
        assumed=("Assumption 3 (full row rank, weakly correlated inputs)", "step size <= 1/k"),
    )


@quiet
def theorem_5(
    *, alpha, phi0, num_examples, d_s, d_m, R_X, init: dict[str, Any], radii: dict[str, Any],
    delta, loss_bound=1.0, strict=True,
) -> Bound:  # fmt: skip
    r"""Theorem 5: population loss after GD.

    $L_D \lesssim \text{Lemma 4} + \sqrt{P/N}(1 + \log(A\sqrt{N/P})) + \sqrt{\log(R/\delta)/N}$.

    $R = \sqrt{R_Q^2 + R_K^2 + R_V^2 + R_O^2}$; the last term comes from a union bound over the
    radii 1, ..., R, so R < 1 counts as 1 (``R_union = max(R, 1)``). The hypotheses are those of
    :func:`lemma_4` (the bound is ``NOT_VALID`` where one fails). Vacuous when >= ``loss_bound``.

    Args:
      alpha: sigma_min of the last hidden features at init (:func:`alpha_from_features`).
      phi0: Phi(theta^0) = ||f(theta^0) - y||^2 / 2.
      num_examples: N.
      d_s: sequence length (tokens per input).
      d_m: hidden width.
      R_X: token norm bound (||X_n||_F <= sqrt(d_s) R_X).
      init: initial weights ``{"Q", "K", "V", "O"}``.
      radii: largest distances from init ``{"Q", "K", "V", "O"}`` (> 0).
      delta: confidence in (0, 1).
      loss_bound: trivial bound (> 0).
      strict: raise on a bad input (default); ``False`` returns a not-valid bound instead.

    Returns:
      Bound (kind "risk") with terms ``empirical``, ``rademacher``, ``confidence`` and the norms;
      ``hypotheses`` as in :func:`lemma_4`.

    Raises:
      ValueError: naming the argument, for an input outside its domain (when ``strict``).

    References:
      Shallow-Transformer GD paper, Theorem 5.
    """
    ins = Inputs(strict)
    N, delta = ins.count("num_examples", num_examples), ins.probability("delta", delta)
    lb = ins.positive("loss_bound", loss_bound)
    norms = norms_from_weights(init, radii)
    common = {"num_examples": N, "d_s": d_s, "d_m": d_m, "R_X": R_X, "strict": strict}
    l1 = lemma_1(**{k: norms[k] for k in ("eta_Q", "eta_K", "eta_V", "eta_O")}, **common)
    l4 = lemma_4(
        alpha=alpha, phi0=phi0, **common, **{k: v for k, v in norms.items() if k != "xi_O"}
    )
    R = np.sqrt(sum(norms[f"R_{n}"] ** 2 for n in _NAMES))
    R_union = np.maximum(R, 1.0)
    confidence = np.sqrt((np.log(R_union) - np.log(delta)) / N)
    return ins.bound(
        value=l4.value + l1.value + confidence,
        terms={"empirical": l4.value, "rademacher": l1.value, "confidence": confidence, "R": R,
               "R_union": R_union, **l1.terms, **l4.terms, **norms},
        hypotheses={**l1.hypotheses, **l4.hypotheses},
        trivial=lb,
        name="Shallow GD Theorem 5",
        kind="risk",
        assumed=l4.assumed + l1.assumed,
    )  # fmt: skip
