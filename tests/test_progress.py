"""Progress of a long command (`loopwright_refunds.experiments.progress`), on an injected clock.

Piped, a command must say how far it is every `interval_s`, in lines that stand alone; in a
terminal, one line is redrawn with the time left. No test sleeps: the clock is a number the test
moves.
"""

from __future__ import annotations

import io
import re

import pytest

from loopwright_refunds.experiments.progress import Progress, duration
from tests.runtime_fixtures import DURATION


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_piped_progress_is_a_line_at_the_start_every_interval_and_at_the_end() -> None:
    clock, stream = Clock(), io.StringIO()
    with Progress("trials", 6, stream=stream, interval_s=10.0, terminal=False, clock=clock) as p:
        for status in ("a", "b", "c"):  # three quick items: nothing new is due before 10 s
            clock.now += 2.0
            p.advance(status)
        assert stream.getvalue().splitlines() == ["trials 0/6 (0%), 0s elapsed"]
        clock.now += 4.0  # 10 s since the last line
        p.advance("d")
        clock.now += 9.0  # 9 s since the last line: not yet
        p.advance("e")
        clock.now += 1.0
        p.update(status="still on the sixth")  # due without an item done: the wait is told too
        clock.now += 75.0
        p.advance("f")  # at the end, whether due or not: `close` tells the final state
    assert stream.getvalue().splitlines() == [
        "trials 0/6 (0%), 0s elapsed",
        "trials 4/6 (66%), 10s elapsed, ~5s left, d",
        "trials 5/6 (83%), 20s elapsed, ~4s left, still on the sixth",
        "trials 6/6 (100%), 1m35s elapsed, f",
    ]


def test_piped_progress_tells_where_a_command_stopped_early() -> None:
    clock, stream = Clock(), io.StringIO()
    with (
        pytest.raises(KeyboardInterrupt),
        Progress("runs", 10, stream=stream, terminal=False, clock=clock) as progress,
    ):
        clock.now += 3.0
        progress.update(3, "kills 1")
        raise KeyboardInterrupt
    assert stream.getvalue().splitlines()[-1] == "runs 3/10 (30%), 3s elapsed, ~7s left, kills 1"


def test_a_terminal_line_is_redrawn_in_place_with_the_time_left_and_ended_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    clock, stream = Clock(), io.StringIO()
    with Progress("trials", 4, stream=stream, terminal=True, clock=clock) as progress:
        clock.now += 30.0
        progress.advance("ok")
        clock.now += 0.1  # nothing done, redrawn a moment ago: no redraw
        progress.update()
    written = stream.getvalue()
    assert "\n" not in written[:-1] and written.endswith("\n")  # one line, ended at the close
    draws = written[:-1].split("\r")[1:]
    assert draws == [
        "[........................] trials 0/4 (0%), 0s elapsed\x1b[K",
        "[######..................] trials 1/4 (25%), 30s elapsed, ~1m30s left, ok\x1b[K",
        "[######..................] trials 1/4 (25%), 30s elapsed, ~1m30s left, ok\x1b[K",
    ]


def test_a_terminal_line_is_cut_to_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than the terminal would wrap, and `\\r` would then redraw only its tail."""
    monkeypatch.setenv("COLUMNS", "40")
    stream = io.StringIO()
    Progress("trials", 4, stream=stream, terminal=True, clock=Clock()).update(1, "x" * 100)
    [drawn] = stream.getvalue().split("\r")[1:]
    assert drawn == "[######..................] trials 1/4 (\x1b[K"  # 39 columns, then cleared


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.4, "0s"), (12, "12s"), (250, "4m10s"), (3725, "1h02m"), (-3, "0s")],
)
def test_durations_are_short_and_whole(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown
    # What the tests that read a command's progress lines accept as a duration, whatever it is.
    assert re.fullmatch(DURATION, shown)
