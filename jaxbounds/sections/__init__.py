"""Report sections and model builders of ``jaxbounds estimate``; importing registers them all."""
