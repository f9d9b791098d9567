"""jaxbounds: from a Flax model to measured curvature, complexity and generalization bounds.

Importing it checks that the importable ``kernels`` package is this project's own (another
distribution on the package registry uses the import name ``kernels``): if not, the import fails
with one line saying what happened and how to fix it
(:func:`jaxbounds._kernels_check.check_kernels_package`).
"""

from jaxbounds._startup import guard_startup as _guard_startup

_guard_startup()  # the console script: a Ctrl-C while JAX is imported is one line, exit 130

from jaxbounds._kernels_check import check_kernels_package as _check_kernels_package  # noqa: E402

__version__ = "0.1.0"

_check_kernels_package()
