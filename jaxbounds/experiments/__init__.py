"""The reproductions of ``jaxbounds reproduce``: a resumable runner and one module per result.

``REGISTRY`` is the explicit ordered table of experiments (entries import lazily, so importing
this package runs no experiment code); :mod:`jaxbounds.experiments.runner` runs one.
"""

from jaxbounds.experiments.registry import REGISTRY

__all__ = ["REGISTRY"]
