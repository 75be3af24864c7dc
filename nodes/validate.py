"""validate: a model's tool call is a request, not a permission.

Every call passes, in order: a known tool allowed now, arguments valid against the contract's
schema, the task boundary (scope), authorisation from the trusted principal, and, for writes,
the journal's intent check (the same intent proposed again maps to the first action; changed
parameters under the same intent are refused) and the approval policy.

A refused call is answered at once with a structured, model-readable error. Validate runs again
after every approval decision, which it applies: an approval counts only for the digest it names
and only before it expires.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime
from pydantic import BaseModel, ValidationError

from checkpoints.journal import IntentConflict
from graph.context import RunContext
from graph.crashpoints import crash_point
from graph.protocol import ToolEnvelope
from graph.state import (
    Action,
    ActionStatus,
    ApprovalRecord,
    ApprovalRequest,
    CallVerdict,
    PendingCall,
    Phase,
    Principal,
    RunState,
    digest,
)
from graph.views import dump_actions, dump_pending, pending_of, principal_of, tool_result
from tools.contract import Effect, ToolContract, ToolFault


class Refusal(Exception):
    def __init__(self, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.error = {"code": code, "detail": detail, **extra}


def check_call(
    call: PendingCall, principal: Principal, context: RunContext
) -> tuple[ToolContract, BaseModel]:
    """The checks every call passes before anything runs; raises Refusal."""
    if call.error is not None:
        raise Refusal(call.error["code"], call.error["detail"])
    contract = context.tools.get(call.tool)
    if contract is None:
        raise Refusal(
            "unknown_tool", f"there is no tool {call.tool!r}", allowed=context.tools.names()
        )
    try:
        args = contract.args_model.model_validate(call.args)
    except ValidationError as exc:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise Refusal(
            "invalid_arguments", f"arguments of {call.tool} are invalid", errors=errors
        ) from exc
    outside = sorted(contract.resources(args) - set(principal.scope)) if principal.scope else []
    if outside:
        raise Refusal("out_of_scope", f"{', '.join(outside)} is outside this task's boundary")
    try:
        contract.authorize(principal, args, context.env)
    except ToolFault as fault:
        raise Refusal(fault.code, fault.detail) from fault
    return contract, args


def _plan_write(
    call: PendingCall, contract: ToolContract, args: BaseModel, state: RunState, context: RunContext
) -> tuple[PendingCall, Action, ToolEnvelope | None]:
    """Journal the write's intent. Returns the call, its action, and an answer if already settled."""
    assert contract.intent_key is not None
    intent_key = contract.intent_key(state["run_id"], args)
    canonical = args.model_dump(mode="json")
    needs_approval = contract.needs_approval(args, context.env)
    proposed = Action(
        action_id=f"act_{digest(intent_key)[:16]}",
        run_id=state["run_id"],
        call_id=call.call_id,
        tool=contract.name,
        args=canonical,
        args_digest=digest(canonical),
        intent_key=intent_key,
        status=ActionStatus.NEEDS_APPROVAL if needs_approval else ActionStatus.PLANNED,
        fence=context.fence,
    )
    try:
        action = context.journal.plan(proposed)
    except IntentConflict as exc:
        raise Refusal(
            "intent_conflict",
            "this intent was already planned with other parameters; they cannot change",
        ) from exc
    if action.call_id != call.call_id:
        # The same intent again under a new call id: never a second effect.
        return (
            call.model_copy(update={"verdict": CallVerdict.DONE, "action_id": action.action_id}),
            action,
            ToolEnvelope(
                status="error",
                error={
                    "code": "duplicate_intent",
                    "detail": f"the same {contract.name} was already requested; status {action.status}",
                    "action_id": action.action_id,
                },
            ),
        )
    if action.status is ActionStatus.NEEDS_APPROVAL:
        request = ApprovalRequest(
            approval_id=f"apr_{action.digest[:16]}",
            run_id=state["run_id"],
            action_id=action.action_id,
            digest=action.digest,
            tool=contract.name,
            args=canonical,
            summary=contract.describe(args),
            requested_by=principal_of(state).user_id,
            expires_at=context.now() + context.approval_ttl,
        )
        verdict = CallVerdict.NEEDS_APPROVAL
        call = call.model_copy(update={"approval": request})
    else:
        verdict = CallVerdict.READY
    return call.model_copy(update={"verdict": verdict, "action_id": action.action_id}), action, None


def _apply_decision(
    call: PendingCall, record: ApprovalRecord, principal: Principal, context: RunContext
) -> tuple[PendingCall, Action, ToolEnvelope | None]:
    """An approval decision counts only for the digest it names, before expiry, and after the
    call passes every check again (the world may have changed while it waited)."""
    assert call.approval is not None and call.action_id is not None
    action = context.journal.get(call.action_id)
    assert action is not None, f"journal lost action {call.action_id}"
    refusal: dict[str, Any] | None = None
    if record.decision != "approve":
        refusal = {
            "code": "approval_rejected",
            "detail": f"rejected by {record.approver}: {record.comment}",
        }
    elif record.digest != action.digest:
        refusal = {"code": "approval_mismatch", "detail": "the approval names another action"}
    elif record.decided_at > call.approval.expires_at:
        refusal = {
            "code": "approval_expired",
            "detail": f"approval expired at {call.approval.expires_at}",
        }
    else:
        try:
            check_call(call, principal, context)
        except Refusal as exc:
            refusal = exc.error
    if refusal is not None:
        action = context.journal.transition(
            action.action_id,
            ActionStatus.NEEDS_APPROVAL,
            ActionStatus.REJECTED,
            fence=context.fence,
            outcome={"error": refusal},
            detail={"approval_id": record.approval_id},
        )
        return (
            call.model_copy(update={"verdict": CallVerdict.REJECTED, "error": refusal}),
            action,
            ToolEnvelope(status="error", error=refusal),
        )
    action = context.journal.transition(
        action.action_id,
        ActionStatus.NEEDS_APPROVAL,
        ActionStatus.APPROVED,
        fence=context.fence,
        detail={"approval_id": record.approval_id, "approver": record.approver},
    )
    return call.model_copy(update={"verdict": CallVerdict.READY}), action, None


def validate(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:validate:start")
    context = runtime.context
    principal = principal_of(state)
    decisions = {
        r["approval_id"]: ApprovalRecord.model_validate(r) for r in state.get("approvals") or []
    }
    calls: list[PendingCall] = []
    answers: list[ToolMessage] = []
    actions: list[Action] = []
    for call in pending_of(state):
        answer: ToolEnvelope | None = None
        if call.verdict is None:
            try:
                contract, args = check_call(call, principal, context)
                if contract.effect is Effect.WRITE:
                    call, action, answer = _plan_write(call, contract, args, state, context)
                    actions.append(action)
                else:
                    call = call.model_copy(update={"verdict": CallVerdict.READY})
            except Refusal as refusal:
                call = call.model_copy(
                    update={"verdict": CallVerdict.REJECTED, "error": refusal.error}
                )
                answer = ToolEnvelope(status="error", error=refusal.error)
        elif call.verdict is CallVerdict.NEEDS_APPROVAL and call.approval is not None:
            record = decisions.get(call.approval.approval_id)
            if record is not None:
                call, action, answer = _apply_decision(call, record, principal, context)
                actions.append(action)
        if answer is not None:
            answers.append(tool_result(call, answer))
        calls.append(call)
    waiting = any(c.verdict is CallVerdict.NEEDS_APPROVAL for c in calls)
    return {
        "pending": dump_pending(calls),
        "history": answers,
        "journal": dump_actions(actions),
        "phase": Phase.WAITING_APPROVAL.value if waiting else Phase.WAITING_TOOLS.value,
    }
