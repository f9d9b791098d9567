"""Fail early when the ``kernels`` package on the path is not this project's.

The package registry also serves an unrelated distribution whose import name is ``kernels``
(compute kernels for PyTorch from a model hub). Installed into the same environment, one
overwrites the other's files. ``import jaxbounds`` calls :func:`check_kernels_package` so such an
environment fails with one line saying what happened and how to fix it.
"""

from __future__ import annotations

import importlib

_MARKER = "__jaxbounds_kernels__"


class KernelsPackageError(ImportError):
    """The importable ``kernels`` package is not the one shipped with jaxbounds."""


def check_kernels_package() -> None:
    """Raise :class:`KernelsPackageError` unless ``import kernels`` gives jaxbounds' kernels."""
    try:
        module = importlib.import_module("kernels")
    except ImportError as err:
        raise KernelsPackageError(
            f"jaxbounds: cannot import its 'kernels' package ({err}); reinstall with "
            "`pip install --force-reinstall jaxbounds` (or `pip install -e .` in a checkout)"
        ) from err
    if not getattr(module, _MARKER, False):
        where = getattr(module, "__file__", None) or "an unknown location"
        raise KernelsPackageError(
            f"jaxbounds: the 'kernels' package found at {where} is not jaxbounds' own (another "
            "distribution with the import name 'kernels' is installed, e.g. the hub's PyTorch "
            "kernels); use a separate virtual environment, or `pip uninstall kernels` and then "
            "`pip install --force-reinstall jaxbounds`"
        )
