"""The one progress bar of the training loops: a single text line redrawn on a stream.

:class:`ProgressBar` was called ``Progress``, the name of :class:`jaxbounds.longrun.Progress`
(what a long run reports after each block); the old name works until 0.3, with a warning.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """A one-line text progress bar (``label [####....] done/total text elapsed``).

    Redraws at most every ``min_interval`` seconds, always on the last update; writes nothing
    when the stream is None.

    Args:
      total: number of units of work (steps or epochs).
      stream: a text stream, True for stderr, False or None for no output.
      label: prefix of the line.
      width: number of cells of the bar.
      min_interval: seconds between two redraws.

    >>> import io
    >>> out = io.StringIO()
    >>> bar = ProgressBar(2, out, "[demo]", width=4, min_interval=0.0)
    >>> bar.update(2, "loss 0.5")
    >>> bar.close()
    >>> out.getvalue().strip().split(" ")[:3]
    ['[demo]', '[####]', '2/2']
    """

    def __init__(
        self,
        total: int,
        stream: TextIO | bool | None,
        label: str,
        *,
        width: int = 30,
        min_interval: float = 0.2,
    ):
        self.total, self.label, self.width, self.min_interval = total, label, width, min_interval
        self.stream = sys.stderr if stream is True else (stream or None)
        self.start = time.perf_counter()
        self.last = -float("inf")

    def update(self, done: int, text: str = "") -> None:
        """Redraw the line after ``done`` units (throttled, except for the last one)."""
        now = time.perf_counter()
        if self.stream is None or (done < self.total and now - self.last < self.min_interval):
            return
        self.last = now
        filled = int(self.width * done / max(self.total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {done}/{self.total} {text} {now - self.start:.1f}s"
        )
        self.stream.flush()

    def close(self) -> None:
        """End the line."""
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def __getattr__(name: str) -> type:
    """``Progress``: the deprecated name of :class:`ProgressBar` (removed in 0.3)."""
    if name == "Progress":
        from kernels._names import warn_renamed

        warn_renamed("jaxbounds.training.Progress", "ProgressBar", stacklevel=2)
        return ProgressBar
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
