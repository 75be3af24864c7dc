"""Faults injected by the runtime around a write's send, whatever transport the tool uses.

`loopwright faults` (`loopwright.testing.faults`) proves an agent under them: with a plan installed, the
executor's k-th send in this process meets the fault instead of a clean exchange. Every fault is
one a network or a downstream really produces, and each leaves the runtime what it would have:

  request_lost      the request never arrives: nothing applied, the client sees no answer
  answer_lost       the request applied, its answer never comes back
  answer_late       the answer arrives late, inside the timeout: a clean exchange, slower
  delivered_late    the client gives up; the request itself arrives later, right after the
                    next send this process makes (or when the trial ends): what a keyless
                    downstream declared idempotent re-sent too early turns into two effects
  duplicate         the request is delivered twice (the second answer is the one read); tried
                    on writes declared idempotent by key only: a downstream without keys cannot
                    tell a request delivered twice from two requests, whatever the sender does
  crash_before_send the process dies at `executor:after_dispatch_record#k` (DISPATCHED
                    journaled, nothing sent); a new process resumes the run
  crash_after_send  the process dies at `executor:after_send#k` (the downstream applied it,
                    nothing recorded); a new process resumes the run

Without a plan installed (every process but a fault trial's) `send` is the tool's own call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loopwright.core.crashpoints import CrashPoint
from loopwright.tools.contract import OutcomeUnknown, ToolFault

LATE_ANSWER_S = 0.2


class Fault(StrEnum):
    """A fault injected around one write's send (see `loopwright.testing.faults`)."""

    REQUEST_LOST = "request_lost"
    ANSWER_LOST = "answer_lost"
    ANSWER_LATE = "answer_late"
    DELIVERED_LATE = "delivered_late"
    DUPLICATE = "duplicate"
    CRASH_BEFORE_SEND = "crash_before_send"
    CRASH_AFTER_SEND = "crash_after_send"

    @property
    def crash_point(self) -> str | None:
        """The crash point this fault arms in a process of its own (None: injected here)."""
        return _CRASH_POINTS.get(self)


_CRASH_POINTS = {
    Fault.CRASH_BEFORE_SEND: CrashPoint.AFTER_DISPATCH_RECORD.value,
    Fault.CRASH_AFTER_SEND: CrashPoint.AFTER_SEND.value,
}


Send = Callable[[], Any]


@dataclass
class FaultPlan:
    """`fault` at the `at`-th send of this process (None: count the sends, inject nothing)."""

    fault: Fault | None = None
    at: int | None = None
    # The tool of each send this process made, first to last.
    tools: list[str] = field(default_factory=list)
    held: list[Send] = field(default_factory=list)

    def deliver_held(self) -> None:
        """Deliver requests held back (`delivered_late`): the downstream decides what they do
        (one past its deadline is refused; a refusal is no concern of the sender's)."""
        held, self.held = self.held, []
        for request in held:
            with contextlib.suppress(ToolFault, OutcomeUnknown):
                request()


_plan: FaultPlan | None = None


def install(plan: FaultPlan | None) -> None:
    """Install `plan` for this process's sends (None: none)."""
    global _plan
    _plan = plan


def send(tool: str, request: Send) -> Any:
    """Send one write's request, meeting the installed plan's fault if this is its send."""
    plan = _plan
    if plan is None:
        return request()
    plan.tools.append(tool)
    if plan.fault is None or len(plan.tools) != plan.at:
        try:
            return request()
        finally:
            plan.deliver_held()
    match plan.fault:
        case Fault.REQUEST_LOST:
            raise OutcomeUnknown("injected fault: the request was lost on its way")
        case Fault.ANSWER_LOST:
            request()
            raise OutcomeUnknown("injected fault: the answer was lost on its way back")
        case Fault.ANSWER_LATE:
            answer = request()
            time.sleep(LATE_ANSWER_S)
            return answer
        case Fault.DELIVERED_LATE:
            plan.held.append(request)
            raise OutcomeUnknown("injected fault: no answer in time; the request is on its way")
        case Fault.DUPLICATE:
            request()
            return request()
        case _:  # a crash fault: armed as a crash point in a process of its own
            return request()
