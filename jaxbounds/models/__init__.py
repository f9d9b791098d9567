"""Flax nnx models of the papers' Transformers and ``as_pure(model) -> (apply_fn, params)``."""

from jaxbounds.models.construction import (
    ConstructionTransformer,
    construction,
    construction_error_bound,
    construction_norm_bound,
)
from jaxbounds.models.pure import as_pure, set_params
from jaxbounds.models.scalar import ScalarTransformer
from jaxbounds.models.shallow import ShallowTransformer

__all__ = [
    "ConstructionTransformer",
    "ScalarTransformer",
    "ShallowTransformer",
    "as_pure",
    "construction",
    "construction_error_bound",
    "construction_norm_bound",
    "set_params",
]
