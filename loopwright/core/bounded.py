"""Calls that end by the clock, whatever the other side does; and a process's stop, which ends
every such call at once.

Why a thread: a blocking call ends when its bytes stop, and some never stop. An HTTP client
reading a stream of SSE comments, of events it does not know, or of a byte a second is never
idle long enough for a read timeout, and its retries add up timeouts. `call_by` runs the call on
a daemon thread and waits for it at most until its bound: the caller goes on at the bound,
whatever the call is doing. The call is told it was abandoned (`BoundedCall.abandoned`, the
hooks it registered with `on_abandon`), so that it lets go of its sockets rather than read on,
and a daemon thread never holds the process at its exit.

Why threads kept between calls: starting a thread and waiting for it to start is a handoff of
the interpreter's lock and back, some 0.1-0.2 ms, as much as the rest of a scripted model step;
a model step makes one call a superstep. A thread whose call returned waits (`IDLE_S`) for the
next call instead of ending; one whose call was abandoned ends with it, so that nothing an
abandoned call left behind is carried into another. A thread is named `RUNNING` while it runs a
call, `IDLE` while it waits.

Why a process-wide stop: SIGINT or SIGTERM must end a run in any phase at once. The signal
reaches the main thread; a node may be running on LangGraph's pool thread, which the main
thread then waits for. `stop_all` (called by the CLI's signal handler) wakes every bounded call
in flight, which raises KeyboardInterrupt in its caller's thread, so the graph unwinds and the
run's lease is given up at once; a call begun after it raises at once too.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar

RUNNING = "bounded-call"
IDLE = "bounded-call (idle)"
IDLE_S = 60.0  # how long a thread whose call returned waits for another before it ends


class CallOutlasted(TimeoutError):
    """The call was still going at its bound: abandoned, its result (if any comes) ignored."""


class BoundedCall:
    """One call under `call_by`, as the call itself sees it (`current_call()`): when it must be
    over, whether it was abandoned, and the hooks that let go of what it holds."""

    def __init__(self, stop_by: float) -> None:
        self.stop_by = stop_by  # time.monotonic()
        self.over = threading.Event()  # the call returned, or its caller stopped waiting
        self.abandoned = False
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.stop_by - time.monotonic()

    def expired(self) -> bool:
        return self.abandoned or self.left() <= 0

    def on_abandon(self, hook: Callable[[], None]) -> None:
        """Run `hook` when the caller stops waiting (at once, if it has already)."""
        with self._lock:
            if not self.abandoned:
                self._hooks.append(hook)
                return
        hook()

    def abandon(self) -> None:
        with self._lock:
            self.abandoned, hooks, self._hooks = True, self._hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # a hook that fails lets go of nothing more; the caller goes on
                continue


_CURRENT: ContextVar[BoundedCall | None] = ContextVar("bounded_call", default=None)
_in_flight: set[BoundedCall] = set()
_stopping = threading.Event()
_registry = threading.Lock()


class _Worker:
    """A daemon thread running bounded calls one after another; between them it waits in
    `_idle` for the next, up to `IDLE_S`."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[BoundedCall, Callable[[], None]]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=RUNNING, daemon=True)

    def give(self, call: BoundedCall, job: Callable[[], None]) -> None:
        self._calls.put((call, job))

    def _serve(self) -> None:
        call, job = self._calls.get()
        while True:
            self.thread.name = RUNNING
            job()
            if call.abandoned:
                return  # its caller went on without it: nothing of it is carried further
            self.thread.name = IDLE
            with _registry:
                _idle.append(self)
            try:
                call, job = self._calls.get(timeout=IDLE_S)
            except queue.Empty:
                with _registry:
                    if self in _idle:
                        _idle.remove(self)
                        return
                # Taken from `_idle` as the wait ended: its call is on its way.
                call, job = self._calls.get()


def _run_on_a_thread(call: BoundedCall, job: Callable[[], None]) -> None:
    """`job` on an idle worker's thread, or on a new one's."""
    with _registry:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
        worker.give(call, job)
        worker.thread.start()
    else:
        worker.give(call, job)


def _forget_workers() -> None:
    """A forked child has none of its parent's threads: the workers it lists are not there, and
    a lock one of them held stays held."""
    global _registry
    _registry = threading.Lock()
    _idle.clear()


_idle: list[_Worker] = []
os.register_at_fork(after_in_child=_forget_workers)


def current_call() -> BoundedCall | None:
    """The bounded call this code runs in, if any: a client reads its bound and registers what
    to let go of when abandoned."""
    return _CURRENT.get()


def stopping() -> bool:
    return _stopping.is_set()


def stop_all() -> None:
    """Wake every bounded call in flight, and refuse new ones: the process is stopping."""
    _stopping.set()
    with _registry:
        calls = list(_in_flight)
    for call in calls:
        call.over.set()


def call_by[T](seconds: float, fn: Callable[[], T], *, what: str = "the call") -> T:
    """`fn()`, or CallOutlasted once `seconds` have passed, or KeyboardInterrupt once the process
    is stopping (`stop_all`). `fn` runs on a daemon thread (an idle one of an earlier call's, or
    a new one) in a copy of this context."""
    if _stopping.is_set():
        raise KeyboardInterrupt
    call = BoundedCall(time.monotonic() + max(0.0, seconds))
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        _CURRENT.set(call)
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed to the caller, whatever it is
            failure.append(exc)
        finally:
            call.over.set()

    with _registry:
        _in_flight.add(call)
    try:
        context = contextvars.copy_context()
        _run_on_a_thread(call, lambda: context.run(run))
        while not call.over.wait(max(0.0, call.left())) and call.left() > 0:
            pass  # a wait may wake early on some platforms
    finally:
        with _registry:
            _in_flight.discard(call)
    # A call that failed once its bound had passed was ended by the bound, whichever timer
    # fired first (a client reads the bound too, and its own timeout may win the race).
    if failure and call.left() > 0:
        raise failure[0]
    if outcome:
        return outcome[0]
    call.abandon()
    if _stopping.is_set():
        raise KeyboardInterrupt
    raise CallOutlasted(
        f"{what} was still going after its bound of {seconds:.3g} s: abandoned"
    ) from (failure[0] if failure else None)
