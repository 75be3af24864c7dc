"""Progress of a long command: a status line redrawn in a terminal, plain lines when piped.

The experiment runs for about 12 minutes and the chaos benchmark for as long as asked; one that
says nothing until the end cannot be told from one that hangs. A bar redrawn in place is what a
person at a terminal wants, and exactly what a CI log or `| tee` cannot show (rich's bar, on a
stream that is no terminal, prints nothing until it stops). So on a terminal one line is redrawn
in place (bar, done/total, elapsed, time left, the caller's status), and elsewhere a plain line
goes out every `interval_s` and at the end, each complete in itself, so that a log read later or
grepped needs no earlier line:

    trials 120/381 (31%), 4m10s elapsed, ~9m29s left, <status>

Time left is the mean time per item so far times the items left: rough while the first, slower
or faster, items dominate, and marked "~" for that reason.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

BAR_WIDTH = 24
# A terminal line is redrawn when an item is done, and this often meanwhile (elapsed moves on).
REDRAW_S = 0.5


def duration(seconds: float) -> str:
    """`12s`, `4m10s`, `1h02m`: short enough for a status line, exact enough for a wait."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Progress:
    """How far a command of `total` items is, told on `stream` (stderr by default).

    `update` (or `advance`) as items get done, with a `status` of what the caller counts (the
    failures so far, the kills made...); use it as a context manager, so that the last state
    is told and a terminal's line is ended even when the command stops early.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.status = ""
        self._stream = stream or sys.stderr
        self._terminal = self._stream.isatty() if terminal is None else terminal
        self._interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._written_at: float | None = None  # when the last line or redraw went out
        self._written: tuple[int, str] | None = None  # (done, status) then

    def __enter__(self) -> Progress:
        self._write()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

    def update(self, done: int | None = None, status: str | None = None) -> None:
        """`done` items of `total` are done (default: as before); `status` replaces the last."""
        if done is not None:
            self.done = done
        if status is not None:
            self.status = status
        since = self._clock() - (self._written_at or self._started)
        if self._terminal:
            due = self._written is None or self._written[0] != self.done or since >= REDRAW_S
        else:
            due = since >= self._interval_s
        if due:
            self._write()

    def advance(self, status: str | None = None) -> None:
        """One more item is done."""
        self.update(self.done + 1, status)

    def close(self) -> None:
        """Tell the final state, and end a terminal's line (what follows starts on its own).
        Piped, a final state the last line already told is not told twice."""
        if self._terminal or self._written != (self.done, self.status):
            self._write()
        if self._terminal:
            self._stream.write("\n")
            self._stream.flush()

    def line(self) -> str:
        """The state as one plain line: label, done/total, elapsed, time left, status."""
        elapsed = self._clock() - self._started
        parts = [f"{self.label} {self.done}/{self.total} ({self._percent()}%)"]
        parts.append(f"{duration(elapsed)} elapsed")
        if 0 < self.done < self.total:
            parts.append(f"~{duration(elapsed / self.done * (self.total - self.done))} left")
        return ", ".join(parts + ([self.status] if self.status else []))

    def _percent(self) -> int:
        return 100 * self.done // self.total if self.total else 100

    def _write(self) -> None:
        if self._terminal:
            filled = BAR_WIDTH * self._percent() // 100
            bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"
            text = f"{bar} {self.line()}"
            width = shutil.get_terminal_size().columns - 1
            # Back to the line's start, the line cut to the terminal's width, the rest cleared.
            self._stream.write(f"\r{text[:width]}\x1b[K")
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()
        self._written_at = self._clock()
        self._written = (self.done, self.status)
