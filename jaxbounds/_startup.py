"""A Ctrl-C while the ``jaxbounds`` console script starts: one line and exit status 130.

Starting the command imports JAX (about half a second). Python's own SIGINT handler raises
``KeyboardInterrupt`` wherever the import is: a traceback, an error of a C extension's
initialisation taken for a broken install, an exception a garbage collector's callback only
reports (the command then runs on), or an abort. :func:`guard_startup`, called first thing by
``import jaxbounds``, installs a handler that writes one line and ends the process at once
(nothing has been done yet) when the process is the console script itself and SIGINT has
Python's default handler; the command line's :func:`release_startup` hands SIGINT back to
Python before any work (a Ctrl-C then swallowed by a garbage collector's callback is sent
again). A program that imports ``jaxbounds`` keeps its own handler.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["guard_startup", "release_startup"]

_MESSAGE = b"jaxbounds: interrupted by SIGINT while starting; nothing was done\n"


def _interrupted(signum: int, frame: object) -> None:
    del frame
    os.write(2, _MESSAGE)
    os._exit(128 + signum)  # no clean-up to run: the command has not started


def _is_console_script() -> bool:
    return bool(sys.argv) and os.path.basename(sys.argv[0] or "") == "jaxbounds"


def guard_startup() -> None:
    """Install the startup handler (the console script, main thread, default SIGINT only)."""
    if not _is_console_script() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def release_startup() -> None:
    """Give SIGINT back to Python's handler if the startup handler holds it.

    From here on a Ctrl-C raises ``KeyboardInterrupt``, which the command line turns into one
    line; one raised inside a garbage collector's callback (JAX has one), where Python only
    reports it and runs on, is sent again 0.05 s later (:func:`_swallowed`).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        previous = sys.unraisablehook
        sys.unraisablehook = lambda unraisable: _swallowed(unraisable, previous)


def _swallowed(unraisable: object, previous: object) -> None:
    """``sys.unraisablehook``: a ``KeyboardInterrupt`` Python could not raise is sent again."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        return
    previous(unraisable)  # type: ignore[operator]
