"""Report sections and model builders of ``jaxbounds estimate``; importing registers them all.

Sections run in import order; ``bounds`` comes last because it reads what the model sections
leave in ``ctx.extra`` (e.g. the construction's G_u and error).
"""

# ruff: noqa: I001  (import order is the report order)
from jaxbounds.sections import (  # noqa: F401  (imported to register)
    curvature,
    sharpness,
    rademacher,
    shallow,
    construction,
    bounds,
)
