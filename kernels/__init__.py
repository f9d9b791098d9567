"""Pure-JAX kernels of jaxbounds: curvature, sharpness, Rademacher complexity, covers, norms.

Each kernel is a pure function of arrays, pytrees and callables with an explicit PRNG ``key``;
Monte Carlo kernels return an :class:`Estimate` with its standard error.
"""

from kernels.curvature import (
    dataset_hvp,
    hessian_trace,
    hutchinson_trace,
    hutchpp_trace,
    hvp,
    lanczos,
    slq_nodes,
    spectral_density,
    top_eigenvalues,
)
from kernels.estimate import Estimate, estimate_from_samples
from kernels.parallel import map_chunked, map_samples
from kernels.walsh import (
    cube_points,
    fwht,
    spectrum_degree,
    spectrum_sparsity,
    subset_sizes,
    walsh_spectrum,
)

__all__ = [
    "Estimate",
    "cube_points",
    "dataset_hvp",
    "estimate_from_samples",
    "fwht",
    "hessian_trace",
    "hutchinson_trace",
    "hutchpp_trace",
    "hvp",
    "lanczos",
    "map_chunked",
    "map_samples",
    "slq_nodes",
    "spectral_density",
    "spectrum_degree",
    "spectrum_sparsity",
    "subset_sizes",
    "top_eigenvalues",
    "walsh_spectrum",
]
