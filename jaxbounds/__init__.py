"""jaxbounds: from a Flax model to measured curvature, complexity and generalization bounds."""

__version__ = "0.1.0"
