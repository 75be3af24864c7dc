"""Child processes the runtime starts (a LangGraph server, an agent's business services): one
way to start them and one way to stop them, so that none outlives the command that started it,
even a command that is killed.

A child started by `spawn` gets a lifeline: the read end of a pipe whose only write end its
parent holds. Nothing is ever written to it; the child (`exit_with_parent`) reads it until end
of file, which comes when the parent closes it (`ChildProcess.stop`) or the parent dies however
it dies (SIGKILL, `os._exit` at a crash point): the kernel closes a dead process's descriptors.
A pipe rather than Linux's PR_SET_PDEATHSIG because that fires when the parent *thread* exits
(an agent's dependencies may be opened from a worker thread, as the server does) and exists on
Linux only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

LIFELINE_ENV = "LOOPWRIGHT_LIFELINE"  # the child's file descriptor of its lifeline
# How long a child (a server, the business services) may take to start answering before it is
# given up on. A child that exits is told at once; this bound is for one that hangs, and is
# generous because a loaded machine takes minutes to import a server that starts in seconds.
START_TIMEOUT_S = 300.0


class ChildProcess:
    """A child process; a context manager that stops it (`terminate`, after `grace_s`).

    Started by `spawn`, it holds the write end of the child's lifeline, closed once the child
    is stopped."""

    grace_s = 5.0

    def __init__(self, process: subprocess.Popen[bytes], lifeline: int | None = None) -> None:
        self.process = process
        self._lifeline = lifeline

    @property
    def pid(self) -> int:
        return self.process.pid

    def close_lifeline(self) -> None:
        """Let go of the child's lifeline: a child that still runs stops (`exit_with_parent`)."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def stop(self) -> None:
        """Terminate gracefully; kill if that takes more than `grace_s`. Safe to call twice."""
        stop_together([self])

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def stop_together(children: Sequence[ChildProcess]) -> None:
    """Stop `children` side by side: SIGTERM to each at once (each runs its own shutdown, a
    server handing its runs back), then each waited for until its `grace_s` from now has
    passed, and killed if still running. Safe to call twice."""
    deadlines = [time.monotonic() + child.grace_s for child in children]
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    for child, deadline in zip(children, deadlines, strict=True):
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
        child.close_lifeline()


def terminate(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if the child has not exited within `grace_s`. Safe to call twice."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def spawn(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, **options: Any
) -> tuple[subprocess.Popen[bytes], int]:
    """`subprocess.Popen(command, ...)` with a lifeline; returns the process and the lifeline's
    write end, for `ChildProcess` to hold while the child should live.

    The write end is not inheritable (os.pipe's default), so no other child keeps it open; the
    read end reaches this child only (`pass_fds`), named in its environment."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            command,
            env={**(os.environ if env is None else env), LIFELINE_ENV: str(read_end)},
            pass_fds=(read_end,),
            **options,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return process, write_end


def exit_with_parent(grace_s: float = ChildProcess.grace_s) -> None:
    """In a child started by `spawn`: once its parent is gone, stop as the parent's `stop`
    would have stopped it (SIGTERM to itself, so its own shutdown runs), and exit hard if that
    has not ended the process within `grace_s`. Nothing for a process started otherwise (by
    hand, in the foreground). The variable is removed so that no grandchild reads it."""
    fd = os.environ.pop(LIFELINE_ENV, None)
    if fd is not None:
        watcher = threading.Thread(
            target=_watch_lifeline, args=(int(fd), grace_s), name="lifeline", daemon=True
        )
        watcher.start()


def _watch_lifeline(fd: int, grace_s: float) -> None:
    with open(fd, "rb", buffering=0) as lifeline:
        lifeline.read()  # nothing is ever written: this returns at end of file
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)
