"""jaxbounds: from a Flax model to measured curvature, complexity and generalization bounds.

Importing it checks that the importable ``kernels`` package is this project's own (another
distribution on the package registry uses the import name ``kernels``): if not, the import fails
with one line saying what happened and how to fix it
(:func:`jaxbounds._kernels_check.check_kernels_package`).
"""

from jaxbounds._kernels_check import check_kernels_package as _check_kernels_package

__version__ = "0.1.0"

_check_kernels_package()
