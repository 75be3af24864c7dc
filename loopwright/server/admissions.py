"""One run at a time on a thread, none queued behind it, and a bound per principal, on
LangGraph's server.

`langgraph dev` runs `RUN_SLOTS` runs at once (`loopwright serve` asks for them: its own
default is one), starts queued runs oldest first, and looks past none whose thread is busy. Its default multitask strategy is `enqueue`, decided before the auth hook is called:
so one client's second run on a thread with a run in flight would sit at the head of the queue
and hold up every other user's runs and every approver's decision until the first one ended.

The auth hook therefore admits a run on a thread only while no other is admitted there, and no
more than `PER_PRINCIPAL` runs of one principal at once (so no principal fills the slots
everyone shares: a 429 past it), and the served graph says when an admitted run starts and
ends (`ThreadAdmissions`).
A run admitted but never started (cancelled while pending, refused by the server after the
hook) stops counting after `UNSTARTED_S`. This is per process, as LangGraph's in-memory server
is one process; Aegra queues nothing behind a busy thread (it starts every run, and
loopwright's lease serialises two on one thread), so the hook does not track its runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum

# How long a run admitted on a thread may take to start before another may be admitted there.
UNSTARTED_S = 10.0
# Runs `langgraph dev` runs at once, and how many of them one principal may hold.
RUN_SLOTS = 10
PER_PRINCIPAL = 3


class Refusal(Enum):
    THREAD_BUSY = "a run is admitted on the thread and has not ended"
    PRINCIPAL_FULL = "the principal holds as many runs as one may"


@dataclass
class _Admission:
    principal: tuple[str, str]  # (tenant, user)
    at: float
    started: bool = False

    def holds(self, now: float, unstarted_s: float) -> bool:
        return self.started or now - self.at < unstarted_s


class ThreadAdmissions:
    """The runs this server process has admitted, by thread, until each ends."""

    def __init__(
        self, unstarted_s: float = UNSTARTED_S, per_principal: int = PER_PRINCIPAL
    ) -> None:
        self.unstarted_s = unstarted_s
        self.per_principal = per_principal
        self._lock = threading.Lock()
        self._admitted: dict[str, _Admission] = {}

    def admit(self, thread_id: str, principal: tuple[str, str]) -> Refusal | None:
        """Admit a run of `principal` (tenant, user) on the thread, or say why not."""
        now = time.monotonic()
        with self._lock:
            held = self._admitted.get(thread_id)
            if held is not None and held.holds(now, self.unstarted_s):
                return Refusal.THREAD_BUSY
            holding = sum(
                a.principal == principal and a.holds(now, self.unstarted_s)
                for a in self._admitted.values()
            )
            if holding >= self.per_principal:
                return Refusal.PRINCIPAL_FULL
            self._admitted[thread_id] = _Admission(principal, now)
            return None

    def started(self, thread_id: str) -> None:
        with self._lock:
            if (held := self._admitted.get(thread_id)) is not None:
                held.started = True

    def ended(self, thread_id: str) -> None:
        with self._lock:
            self._admitted.pop(thread_id, None)


admissions = ThreadAdmissions()
