"""Report sections and model builders of ``jaxbounds estimate``; importing registers them all."""

import jaxbounds.sections.construction  # noqa: F401
import jaxbounds.sections.curvature as _curvature  # noqa: F401
import jaxbounds.sections.rademacher  # noqa: F401
import jaxbounds.sections.sharpness as _sharpness  # noqa: F401
from jaxbounds.sections import bounds as _bounds  # noqa: F401
from jaxbounds.sections import shallow  # noqa: F401
