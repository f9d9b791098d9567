"""Generalization measures against the gap over a table of trained models.

Kendall's tau per family (Jiang et al. 2020, eq. 3), Jiang's granulated Psi and per-axis psi,
their conditional-mutual-information test, Dziugaite et al. 2020's robust sign error over
environments, null baselines and two-way (configuration and seed) bootstrap intervals, for any
table of models (a list of rows, a mapping of columns or a CSV file): :func:`load_table`, then
:func:`analyze`, then :func:`render_report`.
"""

from jaxbounds.study._table import ModelTable, load_table
from jaxbounds.study.analysis import FamilyResult, MeasureResult, Study, analyze
from jaxbounds.study.bootstrap import Interval
from jaxbounds.study.cmi import CMI, conditional_mutual_information
from jaxbounds.study.nulls import NullBaseline, Summary
from jaxbounds.study.ranking import Psi, Tau, granulated_psi, kendall, psi_groups, tau_a
from jaxbounds.study.sign_error import (
    SignError,
    environments,
    hoeffding_weight,
    robust_sign_error,
    size_adjusted,
)

__all__ = [
    "CMI",
    "FamilyResult",
    "Interval",
    "MeasureResult",
    "ModelTable",
    "NullBaseline",
    "Psi",
    "SignError",
    "Study",
    "Summary",
    "Tau",
    "analyze",
    "conditional_mutual_information",
    "environments",
    "granulated_psi",
    "hoeffding_weight",
    "kendall",
    "load_table",
    "psi_groups",
    "robust_sign_error",
    "size_adjusted",
    "tau_a",
]
