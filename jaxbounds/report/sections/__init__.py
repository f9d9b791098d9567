"""The report sections of ``jaxbounds estimate``, one module each: ``fn(run) -> list[Row]``.

Importing this package registers nothing; :mod:`jaxbounds.report.registry` lists the sections
and the models they apply to, in report order.
"""

from jaxbounds.report.sections.bounds import bounds_section
from jaxbounds.report.sections.construction import construction_section
from jaxbounds.report.sections.curvature import curvature_section
from jaxbounds.report.sections.rademacher import rademacher_section
from jaxbounds.report.sections.shallow import shallow_section
from jaxbounds.report.sections.sharpness import sharpness_section
from jaxbounds.report.sections.training import training_section

__all__ = [
    "bounds_section",
    "construction_section",
    "curvature_section",
    "rademacher_section",
    "shallow_section",
    "sharpness_section",
    "training_section",
]
