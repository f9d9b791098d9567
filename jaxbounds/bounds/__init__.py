"""Closed-form generalization bounds of the papers, evaluated post hoc on trained weights.

One module per paper: :mod:`covering` (linear covers, budgets, Dudley, Rademacher to risk),
:mod:`trauger_tewari`, :mod:`edelman`, :mod:`shallow_gd`, :mod:`pac_bayes`, :mod:`spectral`.
Every calculator validates its inputs, computes in float64 whatever the global JAX setting, and
returns a :class:`Bound` with each term, the checked hypotheses (:class:`Check`) and a
three-state :class:`Status` (valid and non-vacuous, valid and vacuous, not valid);
:func:`from_model` evaluates every applicable bound for one of our models.
"""

from jaxbounds.bounds import covering, edelman, pac_bayes, shallow_gd, spectral, trauger_tewari
from jaxbounds.bounds._result import Bound, Check, Status
from jaxbounds.bounds.from_model import from_model

__all__ = [
    "Bound",
    "Check",
    "Status",
    "covering",
    "edelman",
    "from_model",
    "pac_bayes",
    "shallow_gd",
    "spectral",
    "trauger_tewari",
]
