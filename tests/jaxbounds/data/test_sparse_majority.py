"""sparse_majority: labels are the subset majority, embeddings orthogonal, shapes, encoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbounds.data import positional_encoding, sparse_majority


@pytest.fixture(scope="module")
def data():
    return sparse_majority(
        jax.random.key(0), num_examples=500, seq_len=12, sparsity=5, embed_dim=10
    )


def test_shapes_and_dtypes(data):
    assert data["inputs"].shape == (500, 13, 10)
    assert data["inputs"].dtype == jnp.result_type(float)
    assert data["labels"].shape == (500,)
    assert data["labels"].dtype == jnp.int32
    assert data["bits"].shape == (500, 12)
    assert data["subset"].shape == (5,)
    subset = np.asarray(data["subset"])
    assert np.all(np.diff(subset) > 0)
    assert subset.min() >= 0
    assert subset.max() < 12


def test_labels_are_majority_of_subset(data):
    bits = np.asarray(data["bits"])
    subset = np.asarray(data["subset"])
    expected = (bits[:, subset].sum(axis=1) > len(subset) / 2).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(data["labels"]), expected)
    # Both classes occur and bits are fair coins (500 * 12 bits: mean within 5 sd).
    assert 0 < expected.sum() < 500
    assert abs(bits.mean() - 0.5) < 5 * 0.5 / np.sqrt(bits.size)


def test_even_sparsity_ties_are_zero():
    d = sparse_majority(jax.random.key(1), num_examples=400, seq_len=6, sparsity=4, embed_dim=4)
    votes = np.asarray(d["bits"])[:, np.asarray(d["subset"])].sum(axis=1)
    labels = np.asarray(d["labels"])
    assert np.any(votes == 2)
    np.testing.assert_array_equal(labels[votes == 2], 0)
    np.testing.assert_array_equal(labels, (votes >= 3).astype(np.int32))


def test_encoding_is_orthonormal_tokens_plus_positions(data):
    tokens = np.asarray(data["inputs"]) - np.asarray(positional_encoding(13, 10))[None]
    bits = np.asarray(data["bits"])
    # Row 0 is [CLS] = e_2; row 1 + t is e_{bit_t}.
    np.testing.assert_allclose(tokens[:, 0], np.tile(np.eye(10)[2], (500, 1)), atol=1e-6)
    np.testing.assert_allclose(tokens[:, 1:], np.eye(10)[bits], atol=1e-6)
    emb = np.stack([tokens[bits[:, 0] == 0][0, 1], tokens[bits[:, 0] == 1][0, 1], tokens[0, 0]])
    np.testing.assert_allclose(emb @ emb.T, np.eye(3), atol=1e-6)


def test_positional_encoding_formula():
    pe = np.asarray(positional_encoding(7, 6, dtype=jnp.float64))
    j, i = 5, 2  # dims 4 (sin) and 5 (cos) share frequency 10000^(-4/6)
    w = 10000.0 ** (-(2 * i) / 6)
    np.testing.assert_allclose(pe[j, 2 * i], np.sin(j * w), rtol=1e-14)
    np.testing.assert_allclose(pe[j, 2 * i + 1], np.cos(j * w), rtol=1e-14)
    np.testing.assert_allclose(np.sum(pe**2, axis=1), 3.0, rtol=1e-14)  # d/2 for even d
    assert positional_encoding(3, 5).shape == (3, 5)


def test_subset_is_shared_and_keys_reproduce(data):
    again = sparse_majority(
        jax.random.key(0), num_examples=500, seq_len=12, sparsity=5, embed_dim=10
    )
    np.testing.assert_array_equal(again["inputs"], data["inputs"])
    test = sparse_majority(
        jax.random.key(7),
        num_examples=50,
        seq_len=12,
        sparsity=5,
        embed_dim=10,
        subset=data["subset"],
    )
    np.testing.assert_array_equal(test["subset"], data["subset"])
    assert not np.array_equal(test["bits"], data["bits"][:50])
    # Subsets are uniform: every index shows up across keys.
    seen = set()
    for s in range(40):
        d = sparse_majority(jax.random.key(s), num_examples=1, seq_len=12, sparsity=5, embed_dim=3)
        seen.update(np.asarray(d["subset"]).tolist())
    assert seen == set(range(12))


def test_float32_dtype():
    d = sparse_majority(
        jax.random.key(0), num_examples=3, seq_len=4, sparsity=1, embed_dim=4, dtype=jnp.float32
    )
    assert d["inputs"].dtype == jnp.float32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_examples": 0}, "num_examples"),
        ({"seq_len": 0}, "seq_len"),
        ({"sparsity": 0}, "sparsity"),
        ({"sparsity": 9}, "sparsity"),
        ({"embed_dim": 2}, "embed_dim"),
        ({"subset": [0, 0, 1]}, "subset"),
        ({"subset": [0, 1]}, "subset"),
        ({"subset": [0, 1, 8]}, "subset"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"num_examples": 4, "seq_len": 8, "sparsity": 3, "embed_dim": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        sparse_majority(jax.random.key(0), **args)
