"""How a command that advances a run stops on SIGINT or SIGTERM: at once, in any phase.

A run is safe to stop anywhere: every step it committed is kept, a step in flight runs again
on resume, a write in flight is reconciled (the crash matrix proves each window). What must not
happen is a process that takes its time: a model request reading a stream that never ends, a
tool waiting on a slow service, while the run's lease, held by the dying process, keeps every
other process off the run until it expires.

So on either signal: every bounded call in flight (the model request) is woken at once
(`core.bounded.stop_all`), and KeyboardInterrupt unwinds the command, which gives the lease up
and tells the user how the run goes on. If the process has not exited within `GRACE_S` (a node
stuck in a call nobody can wake, which LangGraph's executor waits for), it gives up the leases
it holds, tells the same, and exits with 130 without unwinding further.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from loopwright.checkpoints.leases import give_up_kept_leases
from loopwright.core.bounded import stop_all

# From the signal to the hard exit, when unwinding has not ended the process by then.
GRACE_S = 1.0
# How long the hard exit waits for the leases to be given up (a database that hangs).
RELEASE_WAIT_S = 0.5
INTERRUPTED_EXIT = 130


@contextmanager
def stopping_at_once(tell: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop the command at once; `tell` says how the run
    goes on (called once, by whichever way of stopping gets there first)."""
    told = threading.Lock()

    def tell_once() -> None:
        if told.acquire(blocking=False):
            tell()

    def hard_exit() -> None:
        releasing = threading.Thread(target=give_up_kept_leases, daemon=True)
        releasing.start()
        releasing.join(RELEASE_WAIT_S)
        tell_once()
        sys.stderr.flush()
        os._exit(INTERRUPTED_EXIT)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_all()
        timer = threading.Timer(GRACE_S, hard_exit)
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt:
        tell_once()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
