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

__all__ = ["FULL", "QUICK", "NormBallProjection", "RademacherSizes", "rademacher_section"]

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


def _leaf_norm(x: jax.Array) -> jax.Array:
    """Frobenius norm of one leaf (0 for an empty leaf, which ``tree_norm`` refuses)."""
    x = jnp.asarray(x)
    return tree_norm(x) if x.size > 0 else jnp.zeros((), x.dtype)


def _project_leaf(x: jax.Array, r: jax.Array) -> jax.Array:
    """``x`` projected onto the Frobenius ball of radius ``r``; the zero leaf when ``r == 0``.

    Projections refuse radius 0, so a zero-norm leaf (a ball that is a point) is projected
    with a stand-in radius 1 and the result replaced by 0.
    """
    if x.size == 0:
        return x
    positive = r > 0
    inside = project_lp_ball(x, p=2, radius=jnp.where(positive, r, jnp.ones_like(r)))
    return jnp.where(positive, inside, jnp.zeros_like(x))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NormBallProjection:
    """Projection onto the product of per-leaf Frobenius balls ``{||x_l||_F <= r_l}``.

    A registered pytree whose radii are leaves: passed as ``project`` to
    :func:`kernels.rademacher.rademacher_search`, new radii of the same structure compile
    nothing.

    Attributes:
      radii: pytree of 0-d arrays shaped like the parameters' structure (one radius per leaf).

    >>> import jax.numpy as jnp
    >>> proj = NormBallProjection.of({"a": jnp.array([3.0, 4.0]), "b": jnp.zeros(2)})
    >>> out = proj({"a": jnp.array([6.0, 8.0]), "b": jnp.array([1.0, 1.0])})
    >>> out["a"].tolist(), out["b"].tolist()
    ([3.0, 4.0], [0.0, 0.0])
    """

    radii: Any

    @classmethod
    def of(cls, params: Any) -> NormBallProjection:
        """The ball each of whose leaves has the norm of the same leaf of ``params``."""
        return cls(jax.tree_util.tree_map(_leaf_norm, params))

    def __call__(self, params: Any) -> Any:
        """``params`` projected leaf by leaf onto the balls."""
        return jax.tree_util.tree_map(_project_leaf, params, self.radii)


def _search_row(run: Run, key: jax.Array, cfg: RademacherSizes) -> Row:
    """The search lower bound on the trained-norm ball, with its McDiarmid lower end."""
    inputs = jnp.asarray(run.train["inputs"])
    m = int(inputs.shape[0])
    total = tree_norm(run.params)
    bound = jnp.linalg.norm(jnp.asarray(run.facts.quantities.readout))  # |f| <= ||w||_2
    # arrays (not Python floats) for every number, so that they are arguments of the compiled
    # program, not part of its cache key
    est = rademacher_search(
        run.apply_fn, run.params, inputs, key, project=NormBallProjection.of(run.params),
        num_samples=cfg.search_draws, num_steps=cfg.search_steps, step_size=0.5 * total,
        num_restarts=cfg.search_restarts, chunk_size=cfg.search_chunk,
        output_bound=jnp.asarray(bound),
    )  # fmt: skip
    note = (
        f"lower bound: projected gradient ascent over {{||theta_l||_F <= ||trained_l||_F}}, "
        f"{cfg.search_draws} sign vectors x {cfg.search_restarts} starts x "
        f"{cfg.search_steps} steps, m = {m}"
        f"; lower: one-sided 95% McDiarmid, |f| <= ||w||_2 = {float(bound):.4g}"
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
    lin = rademacher_linear(
        flat, k_linear, norm=2, radius=jnp.asarray(1.0, flat.dtype), num_samples=cfg.linear_draws
    )
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
