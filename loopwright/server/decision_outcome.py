"""What a decision in the inbox did, as the run recorded it, in words a person reads.

The inbox waits for the run to take the decision (`loopwright.decisions.check_taken` says
whether it recorded it at all), then reads the run's committed state back: what the run then did
with the action and where it stands (`decision_result`): sent and succeeded (with the identifiers the
write produced), sent and refused by the business system, not sent (the rules refused it when
checked again), a new request waiting (an edit), or the run's end. Nothing here knows a domain:
the words come from the journal, the contract's `produces` and the run's stop reason.
"""

from __future__ import annotations

from typing import Any

from loopwright.core.state import ActionStatus, ApprovalRequest
from loopwright.tools.registry import ToolRegistry

S = ActionStatus
DONE = {"approve": "Approved", "reject": "Rejected", "edit": "Edited"}


def _error(action: dict[str, Any]) -> str:
    error = (action.get("outcome") or {}).get("error") or {}
    code, detail = error.get("code", ""), error.get("detail", "")
    return f"{code} — {detail}" if code and detail else code or detail or "no reason recorded"


def action_said(action: dict[str, Any] | None, tools: ToolRegistry) -> str:
    """Where one action stands, as a person reads it: sent or not, and how it ended."""
    if action is None:
        return "not sent"
    status = S(action["status"])
    if status is S.SUCCEEDED:
        contract = tools.get(action["tool"])
        ids = contract.produced_ids(action.get("outcome")) if contract is not None else {}
        produced = ", ".join(f"{field} {value}" for field, value in ids.items())
        return "sent, succeeded" + (f": {produced}" if produced else "")
    if status is S.FAILED:
        return f"sent, refused by the business system: {_error(action)}"
    if status in (S.REJECTED, S.CANCELLED):
        return f"not sent: {_error(action)}"
    if status in (S.DISPATCHED, S.UNKNOWN, S.RECONCILING):
        return (
            f"sent, no answer yet ({status}): the run asks the business system before anything else"
        )
    if status is S.ESCALATED:
        return "sent, outcome unknown: a person must check it with the business system"
    return f"not sent yet ({status})"


def _waiting(values: dict[str, Any]) -> dict[str, Any] | None:
    """The approval request the run now waits for, if any."""
    decided = {r.get("approval_id") for r in values.get("approvals") or []}
    for call in values.get("pending") or []:
        request = call.get("approval")
        if (
            call.get("verdict") == "needs_approval"
            and request is not None
            and request.get("approval_id") not in decided
        ):
            return dict(request)
    return None


def run_said(values: dict[str, Any]) -> str:
    """Where the run stands, in one sentence."""
    stop_reason = values.get("stop_reason")
    if stop_reason == "completed":
        # The runtime's account (stop_detail), or, for a run of an earlier release, its summary.
        account = values.get("stop_detail") or (values.get("verification") or {}).get("summary")
        return "The run completed" + (f": {account}" if account else "") + "."
    if stop_reason:
        detail = values.get("stop_detail") or ""
        return f"The run ended: {stop_reason.replace('_', ' ')}" + (
            f" ({detail})." if detail else "."
        )
    waiting = _waiting(values)
    if waiting is not None:
        return f"The run waits for approval {waiting['approval_id']}: {waiting['summary']}."
    return f"The run is at {values.get('phase', 'an unknown phase')}."


def decision_result(
    values: dict[str, Any], request: ApprovalRequest, decision: str, tools: ToolRegistry
) -> dict[str, Any]:
    """What the decision did: one line for a person (`text`), and the parts it is made of."""
    journal = values.get("journal") or {}
    run_id = values.get("run_id", request.run_id)
    edited = _waiting(values) if decision == "edit" else None
    if edited is not None:
        said = f"{edited['summary']} waits for another approver (approval {edited['approval_id']})."
    else:
        said = f"{action_said(journal.get(request.action_id), tools)}. {run_said(values)}"
    return {
        "run_id": run_id,
        "text": f"{DONE[decision]} {request.approval_id} (run {run_id}) — {said}",
        "phase": values.get("phase"),
        "stop_reason": values.get("stop_reason"),
        "stop_detail": values.get("stop_detail", ""),
        "actions": [
            {"action_id": a.get("action_id"), "tool": a.get("tool"), "status": a.get("status")}
            for a in journal.values()
        ],
    }
