"""The synthetic digits stand-in: shapes, labels match the class templates, reproducible."""

import numpy as np
import pytest

from jaxbounds.data.synthetic import synthetic_digits


def test_shapes_split_and_reproducible():
    data = synthetic_digits(num=24, seed=1)
    assert data.train["inputs"].shape == (18, 4, 16)
    assert data.test["inputs"].shape == (6, 4, 16)
    assert data.source == "synthetic"
    assert "SYNTHETIC" in data.description
    again = synthetic_digits(num=24, seed=1)
    np.testing.assert_array_equal(again.train["inputs"], data.train["inputs"])
    assert not np.array_equal(
        synthetic_digits(num=24, seed=2).train["inputs"], data.train["inputs"]
    )
    for split in (data.train, data.test):
        assert set(np.unique(split["labels"])) <= {0, 1}
        np.testing.assert_array_equal(split["labels"], split["digits"])
        assert split["inputs"].min() >= 0
        assert split["inputs"].max() <= 1


def test_each_image_is_its_class_template_shifted():
    """Template pixels are >= 0.6 and background <= 0.3, so a 0.45 threshold recovers the shape."""
    ring = np.zeros((8, 8), bool)
    ring[1:7, 2] = ring[1:7, 5] = ring[1, 2:6] = ring[6, 2:6] = True
    bar = np.zeros((8, 8), bool)
    bar[1:7, 3:5] = True
    shifted = [
        {np.roll(t, (a, b), axis=(0, 1)).tobytes() for a in (-1, 0, 1) for b in (-1, 0, 1)}
        for t in (ring, bar)
    ]
    data = synthetic_digits(num=40, seed=0, token_dim=64)
    for split in (data.train, data.test):
        for image, label in zip(split["inputs"].reshape(-1, 8, 8), split["labels"], strict=True):
            assert (image > 0.45).tobytes() in shifted[label]


def test_bad_size():
    with pytest.raises(ValueError, match="num"):
        synthetic_digits(num=2)
