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
from kernels.dudley import (
    dudley_integral,
    dudley_inverse_square,
)
from kernels.estimate import Estimate, estimate_from_samples
from kernels.maurey import (
    maurey_cover,
    maurey_cover_log_size,
    maurey_cover_point,
    maurey_error_bound,
    maurey_sparsify,
    wqk_cover_outputs,
)
from kernels.norms import (
    group_norm,
    operator_norm,
    project_group_ball,
    project_lp_ball,
    project_schatten_ball,
    project_spectral_ball,
    schatten_norm,
    spectral_norm,
    tree_group_norms,
    tree_norm,
    tree_project_lp_ball,
)
from kernels.parallel import map_chunked, map_samples
from kernels.rademacher import (
    finite_sup,
    linear_sup,
    rademacher_exact,
    rademacher_finite,
    rademacher_linear,
    rademacher_search,
    search_sup,
    sign_chunk,
    sign_vectors,
)
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
    "dudley_integral",
    "dudley_inverse_square",
    "estimate_from_samples",
    "finite_sup",
    "fwht",
    "group_norm",
    "hessian_trace",
    "hutchinson_trace",
    "hutchpp_trace",
    "hvp",
    "lanczos",
    "linear_sup",
    "map_chunked",
    "map_samples",
    "maurey_cover",
    "maurey_cover_log_size",
    "maurey_cover_point",
    "maurey_error_bound",
    "maurey_sparsify",
    "operator_norm",
    "project_group_ball",
    "project_lp_ball",
    "project_schatten_ball",
    "project_spectral_ball",
    "rademacher_exact",
    "rademacher_finite",
    "rademacher_linear",
    "rademacher_search",
    "schatten_norm",
    "search_sup",
    "sign_chunk",
    "sign_vectors",
    "slq_nodes",
    "spectral_density",
    "spectral_norm",
    "spectrum_degree",
    "spectrum_sparsity",
    "subset_sizes",
    "top_eigenvalues",
    "tree_group_norms",
    "tree_norm",
    "tree_project_lp_ball",
    "walsh_spectrum",
    "wqk_cover_outputs",
]
