"""Data sets of the papers' experiments."""

from jaxbounds.data.sparse_majority import positional_encoding, sparse_majority

__all__ = [
    "positional_encoding",
    "sparse_majority",
]
