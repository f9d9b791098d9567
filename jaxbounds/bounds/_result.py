"""The result type of every bound calculator, and small numeric helpers shared by the modules."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Bound"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Bound:
    """A closed-form bound (or log cover, or complexity proxy) with every term kept apart.

    Array fields are pytree children, so a ``Bound`` passes through ``jit``, ``vmap`` and ``grad``.
    Terms are also readable as attributes: ``result.sigma`` is ``result.terms["sigma"]``.

    Attributes:
      value: the total (the bound itself), an array broadcast over the numeric inputs.
      terms: every intermediate term by name (the formula's pieces).
      hypotheses: each checkable hypothesis of the theorem -> whether it holds (bool arrays).
      vacuous: True where the bound says nothing (at or above the trivial bound, e.g. the loss
        range for a risk bound, or the probability 1 for a failure probability).
      name: which result this is (``"Trauger & Tewari Theorem 4.1"``).
      kind: ``"log_cover"`` (coefficient of 1/eps^2 or log N at eps), ``"rademacher"``,
        ``"risk"`` (a bound on the population risk), ``"probability"`` or ``"proxy"``.
      status: ``"paper"``, ``"checked"`` or ``"rebuilt"`` as in SPEC.md; rebuilt formulas are
        reconstructions, not the authors' statement.
      assumed: hypotheses taken on trust (not checkable from the numbers given).
    """

    value: jax.Array
    terms: dict[str, Any]
    hypotheses: dict[str, Any]
    vacuous: jax.Array
    name: str = dataclasses.field(default="", metadata={"static": True})
    kind: str = dataclasses.field(default="", metadata={"static": True})
    status: str = dataclasses.field(default="paper", metadata={"static": True})
    assumed: tuple[str, ...] = dataclasses.field(default=(), metadata={"static": True})

    def __getattr__(self, item: str) -> Any:
        """Terms as attributes (``result.sigma``)."""
        if item.startswith("__"):
            raise AttributeError(item)
        terms = object.__getattribute__(self, "terms")
        if item in terms:
            return terms[item]
        raise AttributeError(f"{type(self).__name__} has no attribute or term {item!r}")

    @property
    def hypotheses_hold(self) -> jax.Array:
        """True where every checkable hypothesis holds."""
        out = jnp.asarray(True)
        for v in self.hypotheses.values():
            out = jnp.logical_and(out, jnp.asarray(v))
        return out


def _dtype(*xs: Any) -> jnp.dtype:
    """Common floating dtype: the widest floating array input, else the default float dtype."""
    dts = [jnp.asarray(x).dtype for x in xs if isinstance(x, jax.Array | np.ndarray | np.generic)]
    fl = [d for d in dts if jnp.issubdtype(d, jnp.floating)]
    if fl:
        return max(fl, key=lambda d: d.itemsize)
    return jnp.dtype(jnp.result_type(float))


def floats(*xs: Any) -> tuple[jax.Array, ...]:
    """Convert numeric inputs to arrays of one floating dtype (no silent int/float mixing)."""
    dt = _dtype(*xs)
    return tuple(jnp.asarray(x, dtype=dt) for x in xs)


def as_float(x: Any, like: jax.Array) -> jax.Array:
    """``x`` as an array of ``like``'s dtype."""
    return jnp.asarray(x, dtype=like.dtype)
