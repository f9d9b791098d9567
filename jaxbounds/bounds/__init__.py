"""Closed-form generalization bounds of the papers, evaluated post hoc on trained weights.

One module per paper: :mod:`covering` (linear covers, budgets, Dudley, Rademacher to risk),
:mod:`trauger_tewari`, :mod:`edelman`, :mod:`shallow_gd`, :mod:`pac_bayes`, :mod:`spectral`.
Every calculator returns a :class:`Bound` with each term, the hypotheses and a vacuous flag;
:func:`from_model` evaluates every applicable bound for one of our models.
"""

from jaxbounds.bounds import covering, edelman, pac_bayes, shallow_gd, spectral, trauger_tewari
from jaxbounds.bounds._result import Bound
from jaxbounds.bounds.from_model import from_model

__all__ = [
    "Bound",
    "covering",
    "edelman",
    "from_model",
    "pac_bayes",
    "shallow_gd",
    "spectral",
    "trauger_tewari",
]
