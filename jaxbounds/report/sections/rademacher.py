r"""Section ``rademacher`` (model ``scalar``): measured Rademacher complexities.

For the trained ``scalar`` model on its training sample $S = (X_1, \dots, X_m)$:

- **search lower bound**: $\mathrm{Rad}_S$ of the class $\{f_\theta : \|\theta_\ell\|_F \le
  \|\hat\theta_\ell\|_F$ for every parameter array $\ell\}$, the norm ball the trained weights
  $\hat\theta$ define, bounded *below* by :func:`kernels.rademacher.rademacher_search`
  (projected gradient ascent per sign vector, from $\hat\theta$ and one random start). Since
  $\|Y_{[CLS]}\|_2 \le 1$, $|f_\theta| \le \|w\|_2 \le \|\hat w\|_2 = b$, which gives the
  one-sided McDiarmid lower confidence bound reported as ``lower``.
- **linear class on the inputs**: $\mathrm{Rad}_S\{X \mapsto \langle W, X\rangle_F :
  \|W\|_F \le 1\}$ on the flattened input sequences, exact sups by the dual norm
  (:func:`kernels.rademacher.rademacher_linear`), with its two-sided McDiarmid interval, and
  the Jensen upper bound $\sqrt{\sum_i\|X_i\|_F^2}/m$ beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxbounds.report.facts import Run
from jaxbounds.report.rows import Row
from kernels.norms import project_lp_ball, tree_norm
from kernels.rademacher import rademacher_linear, rademacher_search

__all__ = ["FULL", "QUICK", "RademacherSizes", "rademacher_section"]

_SECTION = "rademacher"


@dataclasses.dataclass(frozen=True)
class RademacherSizes:
    """Monte Carlo budgets of the section.

    Attributes:
      search_draws: sign vectors of the search lower bound.
      search_steps: projected ascent steps per sign vector and start.
      search_restarts: starts per sign vector (the trained weights, then random ones).
      search_chunk: sign vectors per vectorised batch of the search.
      linear_draws: sign vectors of the linear class.
    """

    search_draws: int
    search_steps: int
    search_restarts: int
    search_chunk: int
    linear_draws: int


#: Budgets of the default run (about 10-20 s on 2 CPU cores).
QUICK = RademacherSizes(
    search_draws=8, search_steps=12, search_restarts=2, search_chunk=4, linear_draws=4096
)
#: Budgets of ``--full``.
FULL = RademacherSizes(
    search_draws=64, search_steps=40, search_restarts=3, search_chunk=8, linear_draws=65536
)


def _ball_projection(params: Any) -> Any:
    """Projection onto the product of per-leaf Frobenius balls of radius ||leaf||."""
    radii = jax.tree_util.tree_map(tree_norm, params)

    def project(p: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x, r: project_lp_ball(x, p=2, radius=r) if x.size > 0 else x, p, radii
        )

    return project


def _search_row(run: Run, key: jax.Array, cfg: RademacherSizes) -> Row:
    """The search lower bound on the trained-norm ball, with its McDiarmid lower end."""
    inputs = jnp.asarray(run.train["inputs"])
    m = int(inputs.shape[0])
    total = float(tree_norm(run.params))
    bound = float(jnp.linalg.norm(run.facts.quantities.readout))  # |f| <= ||w||_2

    # params and inputs enter the compiled program as arguments, not as folded constants
    def search(k: jax.Array, params: Any, inputs: jax.Array) -> Any:
        return rademacher_search(
            run.apply_fn, params, inputs, k, project=_ball_projection(params),
            num_draws=cfg.search_draws, num_steps=cfg.search_steps, step_size=0.5 * total,
            num_restarts=cfg.search_restarts, chunk_size=cfg.search_chunk, output_bound=bound,
        )  # fmt: skip

    est = jax.jit(search)(key, run.params, inputs)
    note = (
        f"lower bound: projected gradient ascent over {{||theta_l||_F <= ||trained_l||_F}}, "
        f"{cfg.search_draws} sign vectors x {cfg.search_restarts} starts x "
        f"{cfg.search_steps} steps, m = {m}"
        f"; lower: one-sided 95% McDiarmid, |f| <= ||w||_2 = {bound:.4g}"
    )
    lower = None if est.lower is None else float(est.lower)
    name = "Rad_S lower bound (search, trained-norm ball)"
    return Row(_SECTION, name, float(est.mean), float(est.stderr), lower, None, note=note)


def rademacher_section(run: Run, *, sizes: RademacherSizes | None = None) -> list[Row]:
    """Search lower bound on the trained-norm ball and the linear-class value of the inputs.

    Args:
      run: a ``scalar`` run (its facts give the readout norm that bounds |f|).
      sizes: Monte Carlo budgets (default :data:`QUICK` or :data:`FULL` after ``run.quick``).
    """
    cfg = sizes or (QUICK if run.quick else FULL)
    s = _SECTION
    k_search, k_linear = jax.random.split(run.section_key(s))
    rows = [_search_row(run, k_search, cfg)]
    inputs = jnp.asarray(run.train["inputs"])
    flat = inputs.reshape(inputs.shape[0], -1)
    lin = jax.jit(
        lambda k, x: rademacher_linear(x, k, norm=2, radius=1.0, num_draws=cfg.linear_draws)
    )(k_linear, flat)
    rows.append(
        Row.from_estimate(
            s,
            "Rad_S linear class {<W, X>_F : ||W||_F <= 1} on the inputs",
            lin,
            note=f"exact sups (dual norm), {cfg.linear_draws} sign vectors; 95% McDiarmid interval",
        )
    )
    jensen = float(tree_norm(flat)) / flat.shape[0]
    name = "linear class Jensen upper bound sqrt(sum ||X_i||_F^2) / m"
    rows.append(Row(s, name, jensen, note="closed form"))
    return rows
