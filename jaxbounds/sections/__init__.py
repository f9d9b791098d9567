"""Report sections and model builders of ``jaxbounds estimate``; importing registers them all."""

from jaxbounds.sections import shallow  # noqa: F401
