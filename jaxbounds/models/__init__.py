"""Flax nnx models of the papers' Transformers, ``as_pure`` and what each exposes to the bounds."""

from jaxbounds.models.construction import (
    ConstructionQuantities,
    ConstructionTransformer,
    construction,
    construction_error_bound,
    construction_quantities,
)
from jaxbounds.models.decoder import (
    Decoder,
    DecoderConfig,
    abstract_decoder,
    decoder_batch_sharding,
    decoder_config,
    decoder_num_params,
    decoder_shardings,
    next_token_loss,
)
from jaxbounds.models.pure import as_pure, set_params
from jaxbounds.models.scalar import ScalarQuantities, ScalarTransformer, scalar_quantities
from jaxbounds.models.shallow import ShallowQuantities, ShallowTransformer, shallow_quantities

__all__ = [
    "ConstructionQuantities",
    "ConstructionTransformer",
    "Decoder",
    "DecoderConfig",
    "ScalarQuantities",
    "ScalarTransformer",
    "ShallowQuantities",
    "ShallowTransformer",
    "abstract_decoder",
    "as_pure",
    "construction",
    "construction_error_bound",
    "construction_quantities",
    "decoder_batch_sharding",
    "decoder_config",
    "decoder_num_params",
    "decoder_shardings",
    "next_token_loss",
    "scalar_quantities",
    "set_params",
    "shallow_quantities",
]
