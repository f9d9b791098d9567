"""MNIST IDX reader, tokenisation and the scikit-learn digits default (files written here)."""

import gzip
import struct
import sys
import types

import numpy as np
import pytest

from jaxbounds.data.mnist import (
    load_binary_digits,
    load_digits_default,
    load_mnist,
    read_idx,
    tokenize,
)

_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D}


def idx_bytes(arr: np.ndarray) -> bytes:
    """IDX encoding written independently of the reader: magic, big-endian sizes, data."""
    code = _CODES[arr.dtype.type]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write(path, data: bytes) -> None:
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def make_split(rng, num, side=28):
    images = rng.integers(0, 256, (num, side, side)).astype(np.uint8)
    labels = rng.integers(0, 10, num).astype(np.uint8)
    labels[:3] = [0, 1, 7]
    return images, labels


def write_mnist(directory, rng, *, gz=False, num_train=23, num_test=11, side=28):
    suffix = ".gz" if gz else ""
    out = {}
    for split, prefix, num in (("train", "train", num_train), ("test", "t10k", num_test)):
        images, labels = make_split(rng, num, side)
        write(directory / f"{prefix}-images-idx3-ubyte{suffix}", idx_bytes(images))
        write(directory / f"{prefix}-labels-idx1-ubyte{suffix}", idx_bytes(labels))
        out[split] = (images, labels)
    return out


def reference_tokens(images: np.ndarray, token_dim: int) -> np.ndarray:
    """Row-major pixel stream, zero-padded, cut into tokens (explicit loop)."""
    num = images.shape[0]
    flat = images.reshape(num, -1)
    num_tokens = -(-flat.shape[1] // token_dim)
    out = np.zeros((num, num_tokens, token_dim), dtype=flat.dtype)
    for n in range(num):
        for p in range(flat.shape[1]):
            out[n, p // token_dim, p % token_dim] = flat[n, p]
    return out


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        np.array([-3, 0, 5], dtype=np.int8),
        np.array([[-300, 2], [7, 32000]], dtype=np.int16),
        np.array([1, -2, 2**30], dtype=np.int32),
        np.array([0.5, -1.25, 3e7], dtype=np.float32),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path, arr, gz):
    path = tmp_path / ("x.idx" + (".gz" if gz else ""))
    write(path, idx_bytes(arr))
    got = read_idx(path)
    assert got.shape == arr.shape
    assert got.dtype == arr.dtype  # native byte order, same kind
    np.testing.assert_array_equal(got, arr)


def test_read_idx_bad_magic(tmp_path):
    data = bytearray(idx_bytes(np.zeros((2, 2), np.uint8)))
    data[0] = 0x1F
    (tmp_path / "a").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "a")


def test_read_idx_unknown_type(tmp_path):
    data = bytearray(idx_bytes(np.zeros((2, 2), np.uint8)))
    data[2] = 0x07
    (tmp_path / "a").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="element type 0x07"):
        read_idx(tmp_path / "a")


def test_read_idx_truncated_and_trailing(tmp_path):
    data = idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4))
    (tmp_path / "short").write_bytes(data[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "long").write_bytes(data + b"\x00")
    with pytest.raises(ValueError, match="trailing"):
        read_idx(tmp_path / "long")
    (tmp_path / "header").write_bytes(data[:9])  # 3 dims declared? no: 2 dims, 8-byte sizes cut
    with pytest.raises(ValueError, match="dimensions"):
        read_idx(tmp_path / "header")
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="too short"):
        read_idx(tmp_path / "tiny")


def test_read_idx_gzip_named_file_that_is_not_gzip(tmp_path):
    (tmp_path / "a.gz").write_bytes(idx_bytes(np.zeros(3, np.uint8)))
    with pytest.raises(ValueError, match="gzip"):
        read_idx(tmp_path / "a.gz")


def test_tokenize_matches_loop_and_pads_with_zeros():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, (3, 28, 28)).astype(np.uint8)
    tokens = tokenize(images, token_dim=64)
    assert tokens.shape == (3, 13, 64)
    np.testing.assert_array_equal(tokens, reference_tokens(images, 64))
    np.testing.assert_array_equal(tokens[:, -1, 16:], 0)  # 784 = 12*64 + 16: 48 padded zeros
    np.testing.assert_array_equal(tokens[:, -1, :16], images[:, 27, 12:])
    assert tokenize(images, token_dim=28).shape == (3, 28, 28)  # exact division: no padding


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_tokenize_bad_token_dim(bad):
    with pytest.raises(ValueError, match="token_dim"):
        tokenize(np.zeros((1, 2, 2)), token_dim=bad)


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_zero_vs_one(tmp_path, gz):
    written = write_mnist(tmp_path, np.random.default_rng(1), gz=gz)
    for split in ("train", "test"):
        images, labels = written[split]
        got = load_mnist(tmp_path, split=split)
        keep = (labels == 0) | (labels == 1)
        assert got["inputs"].shape == (keep.sum(), 13, 64)
        assert got["inputs"].dtype == np.float32
        np.testing.assert_array_equal(got["labels"], labels[keep].astype(np.int32))
        np.testing.assert_array_equal(got["digits"], labels[keep])
        expected = reference_tokens(images[keep].astype(np.float32) / 255.0, 64)
        np.testing.assert_allclose(got["inputs"], expected, rtol=0, atol=0)
        assert got["inputs"].max() <= 1.0


def test_load_mnist_other_classes_map_to_positions(tmp_path):
    _, labels = write_mnist(tmp_path, np.random.default_rng(2))["train"]
    got = load_mnist(tmp_path, classes=(7, 0), token_dim=49)
    keep = (labels == 7) | (labels == 0)
    np.testing.assert_array_equal(got["labels"], np.where(labels[keep] == 7, 0, 1))
    assert got["inputs"].shape == (keep.sum(), 16, 49)


def test_load_mnist_dotted_file_names(tmp_path):
    rng = np.random.default_rng(3)
    images, labels = make_split(rng, 5)
    write(tmp_path / "train-images.idx3-ubyte", idx_bytes(images))
    write(tmp_path / "train-labels.idx1-ubyte.gz", idx_bytes(labels))
    got = load_mnist(tmp_path)
    assert got["labels"].shape[0] == int(np.isin(labels, (0, 1)).sum())


def test_load_mnist_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_mnist(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not download"):
        load_mnist(tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_mnist(tmp_path, split="validation")
    rng = np.random.default_rng(4)
    images, labels = make_split(rng, 6)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(images))
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels[:5]))
    with pytest.raises(ValueError, match="6 images but 5 labels"):
        load_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.full(6, 11, np.uint8)))
    with pytest.raises(ValueError, match="digits 0-9"):
        load_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels.reshape(2, 3)))
    with pytest.raises(ValueError, match="1-D unsigned-byte labels"):
        load_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels))
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(images.astype(np.int16)))
    with pytest.raises(ValueError, match="3-D unsigned-byte images"):
        load_mnist(tmp_path)


def test_load_binary_digits_from_directory_says_mnist(tmp_path):
    write_mnist(tmp_path, np.random.default_rng(5), num_train=40, num_test=20)
    messages = []
    data = load_binary_digits(tmp_path, num_train=3, log=messages.append)
    assert data.source == "mnist"
    assert data.train["inputs"].shape == (3, 13, 64)
    assert len(messages) == 1
    assert "MNIST IDX files" in messages[0]
    assert "48 zero pixels padded" in messages[0]
    assert messages[0].endswith(data.description)


def fake_sklearn(monkeypatch, images, target):
    datasets = types.ModuleType("sklearn.datasets")
    datasets.load_digits = lambda: types.SimpleNamespace(images=images, target=target)
    package = types.ModuleType("sklearn")
    package.datasets = datasets
    monkeypatch.setitem(sys.modules, "sklearn", package)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", datasets)


def test_digits_default_with_scikit_learn(monkeypatch):
    rng = np.random.default_rng(6)
    target = np.repeat(np.arange(10), 8)
    images = rng.integers(0, 17, (80, 8, 8)).astype(np.float64)
    fake_sklearn(monkeypatch, images, target)
    messages = []
    data = load_binary_digits(token_dim=16, log=messages.append)
    assert data.source == "sklearn-digits"
    assert "scikit-learn's 8x8 handwritten digits" in messages[0]
    assert "4 tokens of dimension 16 (0 zero pixels padded" in messages[0]
    assert len(data.train["labels"]) == 12  # 16 images of classes 0/1, a quarter held out
    assert len(data.test["labels"]) == 4
    keep = target <= 1
    both = np.concatenate([data.train["inputs"], data.test["inputs"]])
    order = np.concatenate([data.train["digits"], data.test["digits"]])
    assert sorted(order.tolist()) == sorted(target[keep].tolist())
    expected = {tuple(t.ravel()) for t in tokenize(images[keep] / 16.0, token_dim=16)}
    assert {tuple(t.ravel()) for t in both.astype(np.float64)} == expected
    train2, _ = load_digits_default(token_dim=16)
    np.testing.assert_array_equal(train2["inputs"], data.train["inputs"])  # fixed split
    one_token, _ = load_digits_default()
    assert one_token["inputs"].shape[1:] == (1, 64)


def test_digits_default_without_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxbounds\[digits\]'"):
        load_binary_digits(log=None)
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits_default(test_fraction=1.0)
