"""A synthetic two-class image set: the stand-in for digits 0 vs 1 when scikit-learn is missing."""

from __future__ import annotations

import numpy as np

from jaxbounds.data.mnist import BinaryDigits, tokenize
from kernels._checks import check_positive_int

__all__ = ["synthetic_digits"]


def synthetic_digits(*, num: int = 360, seed: int = 0, token_dim: int = 16) -> BinaryDigits:
    """8x8 rings (label 0) and vertical bars (label 1), tokenised like the digits.

    Each image is the class template, shifted by up to one pixel, times a random contrast in
    [0.6, 1], plus uniform noise in [0, 0.3], clipped to [0, 1]; 3/4 train, 1/4 test.

    Args:
      num: number of images, >= 4.
      seed: seed of the draws.
      token_dim: pixels per token (:func:`jaxbounds.data.mnist.tokenize`).

    Returns:
      A :class:`~jaxbounds.data.mnist.BinaryDigits` with ``source="synthetic"``.

    >>> data = synthetic_digits(num=8, seed=0)
    >>> data.train["inputs"].shape, data.test["labels"].shape, data.source
    ((6, 4, 16), (2,), 'synthetic')
    """
    check_positive_int(num, "num", 4)
    rng = np.random.default_rng(seed)
    ring = np.zeros((8, 8), np.float32)
    ring[1:7, 2] = ring[1:7, 5] = ring[1, 2:6] = ring[6, 2:6] = 1
    bar = np.zeros((8, 8), np.float32)
    bar[1:7, 3:5] = 1
    labels = rng.integers(0, 2, num).astype(np.int32)
    images = np.where(labels[:, None, None] == 0, ring, bar)
    shifts = rng.integers(-1, 2, (num, 2))
    images = np.stack(
        [np.roll(im, tuple(s), axis=(0, 1)) for im, s in zip(images, shifts, strict=True)]
    )
    contrast = rng.uniform(0.6, 1.0, (num, 1, 1)).astype(np.float32)
    images = np.clip(images * contrast + rng.uniform(0, 0.3, images.shape), 0, 1)
    inputs = tokenize(images.astype(np.float32), token_dim=token_dim)
    cut = (3 * num) // 4
    train = {"inputs": inputs[:cut], "labels": labels[:cut], "digits": labels[:cut]}
    test = {"inputs": inputs[cut:], "labels": labels[cut:], "digits": labels[cut:]}
    description = (
        "data: SYNTHETIC 8x8 rings vs bars (scikit-learn is not installed, so the embedded "
        "digits are unavailable; `pip install 'jaxbounds[digits]'` for real digits); "
        f"{cut} train, {num - cut} test, {inputs.shape[1]} tokens of dimension {token_dim}"
    )
    return BinaryDigits(train=train, test=test, source="synthetic", description=description)
