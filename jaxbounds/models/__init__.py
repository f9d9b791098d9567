"""Flax nnx models of the papers' Transformers and ``as_pure(model) -> (apply_fn, params)``."""

from jaxbounds.models.pure import as_pure, set_params
from jaxbounds.models.scalar import ScalarTransformer

__all__ = [
    "ScalarTransformer",
    "as_pure",
    "set_params",
]
