"""approval: a human decides about one action, through a LangGraph interrupt.

The node has no side effect before `interrupt()`: on resume it runs again from its start, so
everything before the interrupt must be a pure function of the committed state. The request
(approval id, action digest, summary, expiry) was fixed by validate and committed there, so the
human sees the same request however often this node runs. The decision is only recorded here;
validate applies it, checking digest, expiry and every rule again.

A decision is approve, reject or edit (with the complete new arguments; see `nodes.validate` for
what an edit does). A decision that does not parse, names another request, comes from the
run's own user, or approves an edit its own approver made (separation of duties: an edit is one
person's proposal, and it takes a second person to approve it) is not recorded: the run keeps
waiting for a valid one, and nothing executes.
"""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import ValidationError

from loopwright.core.crashpoints import crash_point
from loopwright.core.state import (
    ApprovalDecision,
    ApprovalRecord,
    CallVerdict,
    Phase,
    RunState,
)
from loopwright.core.views import pending_of, principal_of
from loopwright.nodes.context import RunContext


def editors_of(state: RunState, action_id: str) -> tuple[str, ...]:
    """The approvers who edited the call `action_id` carries out (every edit of that call so
    far, in the run's approval records). An edited call keeps its call id through its edits, so
    this needs nothing but the committed state: it holds for requests asked before the request
    carried `edited_by`, and whichever process reads the run."""
    journal = state.get("journal") or {}
    call_id = (journal.get(action_id) or {}).get("call_id")
    if call_id is None:
        return ()
    return tuple(
        sorted(
            {
                record["approver"]
                for record in state.get("approvals") or []
                if record.get("decision") == "edit"
                and (journal.get(record.get("action_id", "")) or {}).get("call_id") == call_id
            }
        )
    )


def approval(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:approval:start")
    decided = {r["approval_id"] for r in state.get("approvals") or []}
    waiting = [
        c.approval
        for c in pending_of(state)
        if c.verdict is CallVerdict.NEEDS_APPROVAL
        and c.approval is not None
        and c.approval.approval_id not in decided
    ]
    if not waiting:
        return {}
    # Who made these arguments is part of what the approver is asked (a pure function of the
    # committed state, so the payload is the same however often this node runs).
    request = waiting[0].model_copy(update={"edited_by": editors_of(state, waiting[0].action_id)})
    raw = interrupt(request.model_dump(mode="json"))
    try:
        decision = ApprovalDecision.model_validate(raw)
    except ValidationError as exc:
        return {
            "feedback": [
                f"approval {request.approval_id}: invalid decision ignored ({exc.error_count()} errors)"
            ]
        }
    if decision.approval_id != request.approval_id:
        return {
            "feedback": [
                f"decision for {decision.approval_id} ignored: waiting for {request.approval_id}"
            ]
        }
    if decision.approver == principal_of(state).user_id:
        return {"feedback": [f"{decision.approver} cannot decide about their own run"]}
    if not runtime.context.is_approver(decision.approver):
        return {"feedback": [f"{decision.approver} is not an approver"]}
    if (why := request.refusal(decision.decision, decision.approver)) is not None:
        return {"feedback": [why]}
    record = ApprovalRecord(
        approval_id=request.approval_id,
        action_id=request.action_id,
        digest=decision.digest,
        decision=decision.decision,
        approver=decision.approver,
        decided_at=runtime.context.now(),
        expires_at=request.expires_at,
        comment=decision.comment,
        args=decision.args,
    )
    asked_at = request.requested_at or (request.expires_at - runtime.context.approval_ttl)
    waited = max(0.0, (record.decided_at - asked_at).total_seconds())
    return {
        "approvals": [*(state.get("approvals") or []), record.model_dump(mode="json")],
        "phase": Phase.WAITING_TOOLS.value,
        # The person's wait is not the machine's: the run's deadline moves on by it.
        "paused_s": float(state.get("paused_s") or 0.0) + waited,
    }
