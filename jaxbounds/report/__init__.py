"""The ``jaxbounds estimate`` job: run builders, report sections, their registry, rendering.

Floors inside the package: ``rows`` and ``facts`` (data types) <- ``runs`` and ``sections/``
<- ``registry`` <- ``job``; ``render`` reads ``rows`` only.
"""

from jaxbounds.report.facts import (
    ConstructionFacts,
    Run,
    ScalarConfig,
    ScalarFacts,
    ShallowFacts,
)
from jaxbounds.report.job import JobConfig, job_config, run_estimate
from jaxbounds.report.registry import (
    MODELS,
    SECTIONS,
    Section,
    model_names,
    section_names,
    sections_for,
    using,
)
from jaxbounds.report.render import format_table, format_value, to_json, write_json
from jaxbounds.report.rows import Report, Row

__all__ = [
    "MODELS",
    "SECTIONS",
    "ConstructionFacts",
    "JobConfig",
    "Report",
    "Row",
    "Run",
    "ScalarConfig",
    "ScalarFacts",
    "Section",
    "ShallowFacts",
    "format_table",
    "format_value",
    "job_config",
    "model_names",
    "run_estimate",
    "section_names",
    "sections_for",
    "to_json",
    "using",
    "write_json",
]
