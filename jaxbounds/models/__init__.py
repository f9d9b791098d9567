"""Flax nnx models of the papers' Transformers, ``as_pure`` and what each exposes to the bounds."""

from jaxbounds.models.construction import (
    ConstructionQuantities,
    ConstructionTransformer,
    construction,
    construction_error_bound,
    construction_quantities,
)
from jaxbounds.models.pure import as_pure, set_params
from jaxbounds.models.scalar import ScalarQuantities, ScalarTransformer, scalar_quantities
from jaxbounds.models.shallow import ShallowQuantities, ShallowTransformer, shallow_quantities

__all__ = [
    "ConstructionQuantities",
    "ConstructionTransformer",
    "ScalarQuantities",
    "ScalarTransformer",
    "ShallowQuantities",
    "ShallowTransformer",
    "as_pure",
    "construction",
    "construction_error_bound",
    "construction_quantities",
    "scalar_quantities",
    "set_params",
    "shallow_quantities",
]
