"""Reproduced experiments, one module per result."""

from jaxbounds.experiments.ntk_regime import NTKRegimeResult, ntk_regime

__all__ = ["NTKRegimeResult", "ntk_regime"]
