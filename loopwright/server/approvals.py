"""The approvals that wait, as loopwright records them, for the inbox of any engine.

The inbox lists and decides approvals from loopwright's own records rather than the engine's
thread search: lw_runs says which runs wait for an approval (each attempt records where its
run stands), and each run's checkpoints hold its pending requests and its principal. Every
instance of every engine (LangGraph's server, Aegra) then lists the same, whichever instance
ran the run; Aegra's thread records carry no interrupts at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loopwright.checkpoints.leases import RunRecord
from loopwright.core.state import ApprovalRequest, Phase
from loopwright.runner import Runner, UnknownRun
from loopwright.server.users import User


@dataclass(frozen=True)
class Waiting:
    """A run that waits for approvals, as loopwright records it (whichever engine serves it)."""

    run_id: str
    user_id: str
    tenant: str
    requests: dict[str, ApprovalRequest]  # by interrupt id


def waiting_run(runner: Runner, record: RunRecord) -> Waiting:
    """The run's pending approval requests, from its own checkpoints (the engine's thread
    records differ: Aegra's carry no interrupts), and whose it is, from lw_runs."""
    requests = {
        str(request["interrupt_id"]): ApprovalRequest.model_validate(request)
        for request in runner.outcome(record.run_id).waiting_for_approval
    }
    return Waiting(record.run_id, record.user_id, record.tenant, requests)


# Why a request made before requests said why is waiting.
UNRECORDED_WHY = "the tool's approval rule asked for one (this request predates recorded reasons)"


def listing(
    thread_id: str, interrupt_id: str, req: ApprovalRequest, now: datetime
) -> dict[str, Any]:
    """One request as the inbox shows it: in the runtime's words, whatever the agent's domain
    (who requested it, what was asked, why a person must approve it, the checks it passed)."""
    return {
        **req.model_dump(mode="json"),
        "why": req.why or UNRECORDED_WHY,
        "thread_id": thread_id,
        "interrupt_id": interrupt_id,
        # The database's clock, by which expiry is judged (not the browser's, nor this
        # process's): the page says "expires in ..." from this.
        "expires_in_s": round((req.expires_at - now).total_seconds()),
        "expired": req.expires_at <= now,
        "timeline": f"/inbox/api/runs/{req.run_id}/timeline",
    }


def pending_for(runner: Runner, user: User) -> list[dict[str, Any]]:
    """The approvals waiting for `user`: those of their tenant's runs that lw_runs says wait
    for one (each attempt records where its run stands), but none of a run they started or a
    request they made. Read from loopwright's own records, so every instance of every engine
    lists the same."""
    now = runner.leases.now()
    found = []
    for record in runner.leases.runs(Phase.WAITING_APPROVAL.value):
        if record.agent not in ("", runner.agent.name) or record.tenant != user.tenant:
            continue
        if record.user_id == user.user_id:
            continue
        try:
            run = waiting_run(runner, record)
        except UnknownRun:  # pruned, or registered and never stepped
            continue
        for interrupt_id, req in run.requests.items():
            if req.requested_by != user.user_id:
                found.append(listing(run.run_id, interrupt_id, req, now))
    return sorted(found, key=lambda item: item["expires_at"])
