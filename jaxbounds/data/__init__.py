"""Data sets of the papers' experiments."""

from jaxbounds.data.mnist import load_binary_digits, load_mnist, read_idx, tokenize
from jaxbounds.data.sparse_majority import positional_encoding, sparse_majority

__all__ = [
    "load_binary_digits",
    "load_mnist",
    "positional_encoding",
    "read_idx",
    "sparse_majority",
    "tokenize",
]
