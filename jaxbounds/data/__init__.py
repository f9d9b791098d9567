"""Data sets of the papers' experiments (and a synthetic stand-in for the digits)."""

from jaxbounds.data.boolean import (
    FourierFunction,
    boolean_dataset,
    even_parity_function,
    parity,
    parity_cot_data,
    random_fourier_function,
    tiling_parities,
)
from jaxbounds.data.mnist import load_binary_digits, load_mnist, read_idx, tokenize
from jaxbounds.data.sparse_majority import positional_encoding, sparse_majority
from jaxbounds.data.synthetic import synthetic_digits

__all__ = [
    "FourierFunction",
    "boolean_dataset",
    "even_parity_function",
    "load_binary_digits",
    "load_mnist",
    "parity",
    "parity_cot_data",
    "positional_encoding",
    "random_fourier_function",
    "read_idx",
    "sparse_majority",
    "synthetic_digits",
    "tiling_parities",
    "tokenize",
]
