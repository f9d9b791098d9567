"""Atomic file writes, the runner's signal guard and the lock of an output place.

Every file is written to a temporary file in its own directory, flushed and ``fsync``-ed, then
renamed over the target with ``os.replace`` (atomic on POSIX and Windows), and the directory is
``fsync``-ed: a reader sees the old file or the new one, never a part of one, whatever kills the
writer. While a :class:`SignalGuard` is active, a first SIGINT or SIGTERM asks the run to stop
(:func:`check_stop` raises :class:`Interrupted` between two steps) and a second one raises at
once, except inside a write, where it is held until the write is complete; a signal that was
ignored when the guard was entered (``SIG_IGN``: a job started in the background by a
non-interactive shell, ``nohup``) stays ignored, the Unix convention that ``jaxbounds estimate``
follows too. :func:`exclusive_lock` keeps a second process off an output place (``fcntl.flock``,
which the kernel releases when its holder dies, SIGKILL included: a lock never outlives its
process). It sits on the lowest floor of ``jaxbounds`` (standard library only), so ``report``,
``experiments`` and the command line all import it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "Interrupted",
    "LockBusy",
    "SignalGuard",
    "check_stop",
    "critical_section",
    "exclusive_lock",
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
    """Context manager: a first SIGINT/SIGTERM asks to stop, a second one stops at once.

    The first signal only records the request (the handler raises nothing, so no exception is
    thrown into a JAX callback or a compilation); :func:`check_stop`, called by the runner
    between two batches of units, then raises :class:`Interrupted`. A second signal raises
    :class:`Interrupted` at once, except inside a write of this module (:meth:`critical`),
    where it is held until the file is in place. This is the rule of ``jaxbounds estimate``
    too (first signal: stop after the current step; second: at once).

    Handlers are installed only in the main thread (elsewhere the guard does nothing), never for
    a signal whose disposition is ``SIG_IGN`` on entry (a background job's SIGINT stays
    ignored), and the previous handlers are restored on exit. A guard entered inside another
    takes over a stop already asked of the outer one.

    Args:
      hold: every signal is only recorded (the first in ``requested``), never raised: for the
        writes of a program's last outputs, which a signal must not cut short.
      raise_once: after the guard has raised :class:`Interrupted` once, later signals are only
        recorded: the program is stopping (writing its checkpoint, its result) and a burst of
        signals must not cut that short either.
    """

    _active: SignalGuard | None = None

    def __init__(self, *, hold: bool = False, raise_once: bool = False) -> None:
        self._depth = 0
        self._pending: int | None = None
        self.requested: int | None = None
        self._hold = hold
        self._raise_once = raise_once
        self._stopping = False  # raised once (raise_once): later signals are recorded only
        self._previous: dict[int, Any] = {}
        self._outer: SignalGuard | None = None
        self._hook: Any = sys.unraisablehook

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self.handle)
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        self._outer, SignalGuard._active = SignalGuard._active, self
        if self._outer is not None and self.requested is None:
            self.requested = self._outer.requested  # a stop asked outside holds inside
        return self

    def __exit__(self, *exc_info: object) -> None:
        SignalGuard._active = self._outer
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._hook
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def handle(self, signum: int, frame: object) -> None:
        """The signal handler: record a first signal; raise on a second (after a write)."""
        del frame
        if self.requested is None:
            self.requested = signum
            if sys.stderr.isatty() and not self._hold:
                name = signal.Signals(signum).name
                print(f"\njaxbounds: {name}: stopping after the current batch of units (send "
                      "it again to stop at once)", file=sys.stderr, flush=True)  # fmt: skip
            return
        if self._hold or self._stopping:
            return
        if self._depth:
            self._pending = signum
            return
        self._raise(signum)

    def _raise(self, signum: int) -> None:
        self._stopping = self._raise_once
        raise Interrupted(signum)

    def _unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook``: an :class:`Interrupted` Python could not raise is sent again.

        A second signal handled inside a garbage collector's or weak reference's callback, or
        a finaliser, raises there, and Python only reports such an exception and goes on (JAX
        has a collector callback): the signal is sent to this process again 0.05 s later, so
        that it stops the run where it can, without a traceback on stderr.
        """
        error = unraisable.exc_value
        if isinstance(error, Interrupted):
            self._stopping = False  # that raise was lost: the signal sent again must raise

            def again() -> None:
                if SignalGuard._active is self:  # else the run has stopped already
                    os.kill(os.getpid(), error.signum)

            threading.Timer(0.05, again).start()
            return
        self._hook(unraisable)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal asked to stop (call between two steps)."""
        if self.requested is not None:
            raise Interrupted(self.requested)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Hold a second SIGINT/SIGTERM until the block is done, then raise :class:`Interrupted`."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._pending is not None:
            signum, self._pending = self._pending, None
            self._raise(signum)


def check_stop() -> None:
    """Raise :class:`Interrupted` if a signal asked the active :class:`SignalGuard` to stop."""
    guard = SignalGuard._active
    if guard is not None:
        guard.check()


class LockBusy(RuntimeError):
    """Another live process holds the lock of an output place.

    Attributes:
      path: the lock (a file, or the output directory itself).
      pid: the holder's process id when it wrote one in the lock file, else None.
    """

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path, self.pid = Path(path), pid
        who = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"{who} holds the lock {self.path}")


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``path`` for the block, or raise :class:`LockBusy` at once.

    ``path`` is a directory (locked as it is, no file is created: ``jaxbounds estimate``'s
    output directory) or a lock file, created if needed, into which the holder writes its
    process id so that the next one can name it (``jaxbounds reproduce``'s
    ``units/.lock.process<i>``). The lock file is left in place (an unlocked file blocks
    nobody). The kernel drops an ``flock`` when its holder exits or is killed, so no stale lock
    can block a later run. Two opens in one process are two locks, so a second lock of the
    same path in the same process is refused as well. On a filesystem without ``flock`` (some
    network filesystems answer ``ENOLCK`` or ``EOPNOTSUPP``), and where there is no ``fcntl``
    (Windows), the block runs unlocked.

    Args:
      path: the directory or lock file.

    Yields:
      The path locked.

    Raises:
      LockBusy: if another holder has the lock.
      OSError: if the lock file cannot be opened.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, exclusive_lock(Path(d) / ".lock"):
    ...     try:
    ...         with exclusive_lock(Path(d) / ".lock"):
    ...             pass
    ...     except LockBusy as busy:
    ...         print(busy.pid == os.getpid())
    True
    """
    try:
        import fcntl
    except ImportError:  # not POSIX (Windows): no flock, the block runs unlocked
        yield Path(path)
        return
    path = Path(path)
    is_dir = path.is_dir()
    fd = os.open(path, os.O_RDONLY) if is_dir else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusy(path, None if is_dir else _holder(fd)) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
        else:
            if not is_dir:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _holder(fd: int) -> int | None:
    """The process id the holder wrote in the lock file (None if unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


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
