"""Atomic file writes (every report and experiment output) and the runner's signal guard.

Every file is written to a temporary file in its own directory, flushed and ``fsync``-ed, then
renamed over the target with ``os.replace`` (atomic on POSIX and Windows), and the directory is
``fsync``-ed: a reader sees the old file or the new one, never a part of one, whatever kills the
writer. While a :class:`SignalGuard` is active, SIGINT and SIGTERM raise :class:`Interrupted`,
except inside a write, where they are held until the write is complete. It sits on the lowest
floor of ``jaxbounds`` (standard library only), so ``report`` and ``experiments`` both import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "Interrupted",
    "SignalGuard",
    "critical_section",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A run stopped by SIGINT or SIGTERM; finished units are kept on disk.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that ``except Exception`` in an
    experiment's code does not swallow it. The command line turns it into ``exit_code``.

    Attributes:
      signum: the signal number.
      exit_code: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM).

    >>> Interrupted(signal.SIGINT).exit_code
    130
    """

    def __init__(self, signum: int, message: str | None = None) -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(
            message or f"interrupted by {name}; finished units are kept, rerun to resume"
        )


class SignalGuard:
    """Context manager: SIGINT/SIGTERM raise :class:`Interrupted`, deferred during writes.

    Handlers are installed only in the main thread (elsewhere the guard does nothing) and the
    previous handlers are restored on exit. Writes of this module enter
    :meth:`critical` on the active guard, so a signal arriving mid-write raises right after the
    file is in place.
    """

    _active: SignalGuard | None = None

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}
        self._outer: SignalGuard | None = None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self.handle)
        self._outer, SignalGuard._active = SignalGuard._active, self
        return self

    def __exit__(self, *exc_info: object) -> None:
        SignalGuard._active = self._outer
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def handle(self, signum: int, frame: object) -> None:
        """The signal handler: raise :class:`Interrupted` now, or after the current write."""
        del frame
        if self._depth:
            self._pending = signum
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Hold SIGINT/SIGTERM until the block is done, then raise :class:`Interrupted`."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._pending is not None:
            signum, self._pending = self._pending, None
            raise Interrupted(signum)


def critical_section() -> contextlib.AbstractContextManager[None]:
    """Hold SIGINT/SIGTERM during the block if a :class:`SignalGuard` is active."""
    guard = SignalGuard._active
    return guard.critical() if guard is not None else contextlib.nullcontext()


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, ``os.replace``).

    Args:
      path: the target file; its directory is created if needed.
      data: the bytes.

    Returns:
      The path written.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_bytes_atomic(Path(d) / "a.txt", b"hi").read_bytes(), sorted(os.listdir(d))
    (b'hi', ['a.txt'])
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with critical_section():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text atomically (line endings as given); see :func:`write_bytes_atomic`.

    Args:
      path: the target file.
      text: the text.

    Returns:
      The path written.
    """
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], value: Any) -> Path:
    """Write ``value`` as indented JSON (key order kept, trailing newline) atomically.

    Args:
      path: the target file.
      value: JSON builtins (NaN is written as ``NaN``, which Python's ``json`` reads back).

    Returns:
      The path written.
    """
    return write_text_atomic(path, json.dumps(value, indent=1) + "\n")
