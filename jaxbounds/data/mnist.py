"""MNIST digits 0 vs 1 from the standard IDX files, as sequences of 64-dimensional tokens.

The shallow-Transformer GD paper (appendix B) trains on the MNIST images of classes 0 and 1,
"each image of size 28 x 28 broken into tokens of dimension d = 64". This module:

- reads IDX files (raw or gzip-compressed) from a directory the user gives, validating the magic
  number, the element type, the number of dimensions and the exact byte size; nothing is ever
  downloaded;
- keeps the chosen classes (0 and 1 by default) with labels 0/1 in that order;
- scales pixels to [0, 1] and tokenises with :func:`tokenize`: each image is flattened row-major
  and cut into consecutive chunks of ``token_dim`` pixels; the last chunk is zero-padded. For
  28 x 28 = 784 pixels and ``token_dim=64`` that is 13 tokens, the 13th holding the last 16
  pixels (row 27, columns 12-27) followed by 48 zeros;
- without a directory, falls back to the 8 x 8 handwritten digits that scikit-learn ships
  (``pip install 'jaxbounds[digits]'``), tokenised by the same function, and says which data
  set was used. At ``token_dim=64`` an 8 x 8 image is a single token (the attention layer is then
  constant); pass a smaller ``token_dim`` (e.g. 16: four tokens of two rows) for a non-trivial
  sequence.

References:
  LeCun, Cortes, Burges, "The MNIST database of handwritten digits" (IDX format description);
  Alpaydin, Kaynak 1998, UCI optical recognition of handwritten digits (scikit-learn's digits).
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "MNIST_FILES",
    "BinaryDigits",
    "load_binary_digits",
    "load_digits_default",
    "load_mnist",
    "read_idx",
    "tokenize",
]

#: IDX element-type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

#: The standard file names per split: (images, labels). A ``.gz`` suffix is also accepted,
#: and so is the variant spelling with a dot (``train-images.idx3-ubyte``).
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (raw, or gzip-compressed when the name ends in ``.gz``).

    Format: magic ``00 00 TT NN`` (TT = element type, NN = number of dimensions), then NN
    big-endian uint32 sizes, then the elements in row-major order, big-endian.

    Args:
      path: the file.

    Returns:
      The array, in native byte order.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: for a bad magic number, an unknown element type, a truncated header, or a
        payload whose size differs from the header's (truncated file or trailing bytes).
    """
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except gzip.BadGzipFile as err:
        raise ValueError(f"{path}: not a valid gzip file ({err})") from err
    if len(data) < 4:
        raise ValueError(f"{path}: {len(data)} bytes, too short for the 4-byte IDX magic number")
    if data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{path}: bad IDX magic number {data[:4].hex()} (must start with 0000); "
            "not an IDX file (a .gz file must end in .gz)"
        )
    if data[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path}: bad IDX magic number {data[:4].hex()}: unknown element type 0x{data[2]:02x} "
            f"(expected one of {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})"
        )
    dtype = _IDX_DTYPES[data[2]]
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise ValueError(
            f"{path}: IDX header declares {ndim} dimensions but the file has only {len(data)} bytes"
            if ndim
            else f"{path}: IDX header declares 0 dimensions"
        )
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    payload = len(data) - header
    if payload != expected:
        what = "truncated" if payload < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: IDX file {what}: header shape {shape} of {dtype.name} needs {expected} "
            f"bytes of data, found {payload}"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def tokenize(images: np.ndarray, *, token_dim: int = 64) -> np.ndarray:
    """Cut images into tokens: flatten row-major, zero-pad to a multiple of ``token_dim``, split.

    Args:
      images: (N, H, W) (or (N, P) already flat) array.
      token_dim: pixels per token (the paper uses 64).

    Returns:
      (N, ceil(H*W / token_dim), token_dim) array; the last token ends with
      ``-H*W mod token_dim`` zeros (48 for 28 x 28 images at 64).

    Raises:
      ValueError: if ``token_dim`` < 1 or ``images`` has fewer than 2 axes.

    >>> tokenize(np.arange(1, 7).reshape(1, 2, 3), token_dim=4)
    array([[[1, 2, 3, 4],
            [5, 6, 0, 0]]])
    """
    if not isinstance(token_dim, int) or isinstance(token_dim, bool) or token_dim < 1:
        raise ValueError(f"token_dim: expected a positive int, got {token_dim!r}")
    images = np.asarray(images)
    if images.ndim < 2:
        raise ValueError(f"images: expected (N, H, W) or (N, P), got shape {images.shape}")
    flat = images.reshape(images.shape[0], -1)
    pad = -flat.shape[1] % token_dim
    if pad:
        flat = np.concatenate([flat, np.zeros((flat.shape[0], pad), dtype=flat.dtype)], axis=1)
    return flat.reshape(flat.shape[0], -1, token_dim)


def _find(directory: Path, name: str) -> Path:
    dotted = name.replace("-idx", ".idx")
    candidates = [directory / n for n in (name, name + ".gz", dotted, dotted + ".gz")]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{directory}: no MNIST file {name} (looked for "
        f"{', '.join(c.name for c in candidates)}); this package does not download data"
    )


def _select(
    images: np.ndarray, labels: np.ndarray, classes: Sequence[int], scale: float, token_dim: int
) -> dict[str, np.ndarray]:
    keep = np.isin(labels, classes)
    new_labels = np.zeros(labels.shape, dtype=np.int32)
    for i, c in enumerate(classes):
        new_labels[labels == c] = i
    pixels = images[keep].astype(np.float32) / np.float32(scale)
    return {
        "inputs": tokenize(pixels, token_dim=token_dim),
        "labels": new_labels[keep],
        "digits": labels[keep].astype(np.int32),
    }


def load_mnist(
    directory: str | os.PathLike,
    *,
    split: str = "train",
    classes: Sequence[int] = (0, 1),
    token_dim: int = 64,
) -> dict[str, np.ndarray]:
    """Load one MNIST split from the IDX files in ``directory``, tokenised.

    Args:
      directory: folder holding ``train-images-idx3-ubyte`` etc. (raw or ``.gz``).
      split: ``"train"`` or ``"test"`` (the ``t10k`` files).
      classes: digits to keep; label ``i`` is given to ``classes[i]`` (0 vs 1 by default).
      token_dim: pixels per token.

    Returns:
      dict with ``"inputs"`` (N, num_tokens, token_dim) float32 in [0, 1], ``"labels"`` (N,)
      int32 in ``range(len(classes))`` and ``"digits"`` (N,) the original digit.

    Raises:
      FileNotFoundError: if a file is missing.
      ValueError: for an unknown split, malformed files (see :func:`read_idx`), images that are
        not 3-D unsigned bytes, labels that are not 1-D, or image/label counts that differ.
    """
    images, labels = _read_split(directory, split)
    return _select(images, labels, tuple(classes), 255.0, token_dim)


def _read_split(directory: str | os.PathLike, split: str) -> tuple[np.ndarray, np.ndarray]:
    if split not in MNIST_FILES:
        raise ValueError(f"split: expected one of {sorted(MNIST_FILES)}, got {split!r}")
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"directory: {directory} is not a directory")
    img_path = _find(directory, MNIST_FILES[split][0])
    lab_path = _find(directory, MNIST_FILES[split][1])
    images = read_idx(img_path)
    labels = read_idx(lab_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{img_path}: expected 3-D unsigned-byte images (N, rows, cols), got "
            f"{images.ndim}-D {images.dtype}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(
            f"{lab_path}: expected 1-D unsigned-byte labels, got {labels.ndim}-D {labels.dtype}"
        )
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{img_path}, {lab_path}: {images.shape[0]} images but {labels.shape[0]} labels"
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"{lab_path}: labels must be digits 0-9, found {int(labels.max())}")
    return images, labels


def load_digits_default(
    *,
    classes: Sequence[int] = (0, 1),
    token_dim: int = 64,
    test_fraction: float = 0.25,
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """scikit-learn's 8 x 8 digits (classes 0 vs 1 by default), split into train / test.

    Pixels (0..16) are scaled to [0, 1] and tokenised with :func:`tokenize`. The split is a
    fixed permutation drawn from ``numpy.random.default_rng(seed)``.

    Returns:
      ``(train, test)`` dicts like :func:`load_mnist`.

    Raises:
      ImportError: if scikit-learn is not installed (the message says how to install it).
      ValueError: if ``test_fraction`` is not in (0, 1).
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError(
            "the embedded default data set (scikit-learn's 8x8 digits) needs scikit-learn: "
            "install it with `pip install 'jaxbounds[digits]'` (or `pip install scikit-learn`), "
            "or pass the directory of the MNIST IDX files instead"
        ) from err
    bunch = load_digits()
    images = np.asarray(bunch.images)
    labels = np.asarray(bunch.target)
    data = _select(images, labels, tuple(classes), 16.0, token_dim)
    num = data["labels"].shape[0]
    perm = np.random.default_rng(seed).permutation(num)
    num_test = max(1, round(test_fraction * num))
    test_idx, train_idx = np.sort(perm[:num_test]), np.sort(perm[num_test:])
    train = {k: v[train_idx] for k, v in data.items()}
    test = {k: v[test_idx] for k, v in data.items()}
    return train, test


@dataclasses.dataclass(frozen=True)
class BinaryDigits:
    """A two-class digits data set, tokenised.

    Attributes:
      train: dict with ``"inputs"`` (N, d_s, d), ``"labels"`` (N,) in {0, 1}, ``"digits"``.
      test: the same for the held-out split.
      source: ``"mnist"`` or ``"sklearn-digits"``.
      description: one human-readable line (what was loaded, sizes, tokenisation, padding).
    """

    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    source: str
    description: str


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def load_binary_digits(
    directory: str | os.PathLike | None = None,
    *,
    classes: Sequence[int] = (0, 1),
    token_dim: int = 64,
    num_train: int | None = None,
    num_test: int | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = _stderr,
) -> BinaryDigits:
    """Digits 0 vs 1: MNIST from ``directory`` if given, else scikit-learn's 8 x 8 digits.

    A message naming the data set actually used goes to ``log`` (stderr by default) and is kept
    in ``description``.

    Args:
      directory: folder with the MNIST IDX files, or None for the embedded default.
      classes: the two (or more) digits to keep.
      token_dim: pixels per token (64 as in the paper).
      num_train: keep the first ``num_train`` training examples (the paper uses 400, 1200,
        10000); None keeps all.
      num_test: likewise for the test split.
      seed: seed of the default data's train/test split.
      log: where the message goes; None for silence.

    Returns:
      A :class:`BinaryDigits`.

    Raises:
      ImportError: without ``directory`` when scikit-learn is missing (says how to install it).
      FileNotFoundError, ValueError: see :func:`load_mnist`.
    """
    if directory is not None:
        images, labels = _read_split(directory, "train")
        train = _select(images, labels, tuple(classes), 255.0, token_dim)
        test = load_mnist(directory, split="test", classes=classes, token_dim=token_dim)
        source, what, shape = "mnist", f"MNIST IDX files from {directory}", images.shape[1:]
    else:
        train, test = load_digits_default(classes=classes, token_dim=token_dim, seed=seed)
        source = "sklearn-digits"
        what = (
            "scikit-learn's 8x8 handwritten digits (embedded default; pass a directory of "
            "MNIST IDX files to use MNIST)"
        )
        shape = (8, 8)
    if num_train is not None:
        train = {k: v[:num_train] for k, v in train.items()}
    if num_test is not None:
        test = {k: v[:num_test] for k, v in test.items()}
    num_tokens, dim = train["inputs"].shape[1:]
    pad = num_tokens * dim - shape[0] * shape[1]
    description = (
        f"data: {what}; digits {' vs '.join(map(str, classes))}: {len(train['labels'])} train, "
        f"{len(test['labels'])} test; {shape[0]}x{shape[1]} images flattened row-major into "
        f"{num_tokens} token{'s' if num_tokens != 1 else ''} of dimension {dim} "
        f"({pad} zero pixels padded at the end)"
    )
    if log is not None:
        log(f"[jaxbounds] {description}")
    return BinaryDigits(train=train, test=test, source=source, description=description)
