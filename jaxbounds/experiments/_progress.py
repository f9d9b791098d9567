"""What the runner prints: wrapped lines on stderr, the progress bar and one line per unit."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import Any

#: The widest line the runner prints (a progress line, the ``--list`` listing), in columns.
PROGRESS_WIDTH = 100


def _emit(message: str) -> None:
    """Print a progress or warning line on stderr, wrapped at :data:`PROGRESS_WIDTH` columns.

    Continuation lines are indented; a path or other long word is never broken.
    """
    message = "\n".join(
        textwrap.fill(line, PROGRESS_WIDTH, subsequent_indent="  ", break_long_words=False,
                      break_on_hyphens=False) or line
        for line in message.splitlines() or [""]
    )  # fmt: skip
    try:
        from tqdm import tqdm
    except ImportError:
        print(message, file=sys.stderr, flush=True)
        return
    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()


@dataclasses.dataclass(frozen=True)
class _Log:
    quiet: bool

    def info(self, message: str) -> None:
        if not self.quiet:
            _emit(message)

    def warn(self, message: str) -> None:
        _emit(message)


class _NoBar:
    def update(self, n: int = 1) -> None:
        del n

    def close(self) -> None:
        pass


def _bar(total: int, initial: int, name: str, show: bool) -> Any:
    if not show:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(
        total=total, initial=initial, desc=name, unit="unit", file=sys.stderr, dynamic_ncols=True
    )


def _progress_line(head: str, label: str, tail: str, width: int = PROGRESS_WIDTH) -> str:
    """``head label tail`` cut to ``width`` columns (the label is shortened, with ``...``).

    >>> _progress_line("[1/9] toy", "a=1 " * 40, "0.5 s", width=30)
    '[1/9] toy a=1 a=1 a= ... 0.5 s'
    """
    room = width - len(head) - len(tail) - 2
    if len(label) > room:
        label = label[: max(room - 4, 0)].rstrip() + " ..."
    return f"{head} {label} {tail}"
