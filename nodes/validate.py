"""validate: a model's tool call is a request, not a permission.

Every call passes, one after the other: a known tool allowed now, arguments valid against the contract's
schema (and free of NUL characters, which C-string based business systems cut short), the task
boundary (scope: a resource the call touches must be in it; an empty boundary admits none),
authorisation from the trusted principal, and, for writes, the write's business preconditions
on current data, the journal's intent check (the same intent proposed again maps to the first
action; changed parameters under the same intent are refused) and the approval rule.

A refused call is answered at once with a structured, model-readable error. Validate runs again
after every approval decision, which it applies: a decision counts only for the digest it names
and only before it expires. Applying one is idempotent (a step that crashed after writing the
journal and before its checkpoint committed is run again), and:

* approve  the call passes every check again (the world may have changed while it waited), then
           it is ready to execute;
* reject   the action is REJECTED for good and the model is told `approval_rejected`. The run goes
           on: the model may answer (verify then completes with no business effect) but cannot
           get the same intent through again, since the journal maps it to the rejected action;
* edit     the approver's arguments replace the model's. The original action is REJECTED
           (`edited_by_approver`) before anything else happens, so it can never be dispatched;
           the edited call becomes a new intent (its key carries the call's revision) with its
           own digest and its own approval request, whatever the amount. An edit may not change
           what the call touches (its resources): it corrects an action, it does not start one.

A write refused at dispatch because its plan was stale (its target changed since the model
read it) was never sent: the same intent proposed again after a fresh read is planned anew, under
the key's next `:replan-N`, and needs its own approval where the rule asks for one.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from langgraph.runtime import Runtime
from pydantic import BaseModel, ValidationError

from loopwright.checkpoints.journal import IntentConflict
from loopwright.core.crashpoints import crash_point
from loopwright.core.protocol import ToolEnvelope
from loopwright.core.state import (
    Action,
    ActionStatus,
    ApprovalRecord,
    ApprovalRequest,
    CallVerdict,
    EvidenceNote,
    Fact,
    PendingCall,
    Phase,
    Principal,
    RunState,
    digest,
)
from loopwright.core.views import (
    dump_actions,
    dump_pending,
    evidence_of,
    pending_of,
    principal_of,
    tool_result,
)
from loopwright.nodes import program, skills
from loopwright.nodes.context import RunContext
from loopwright.tools.contract import Effect, ToolContext, ToolContract, ToolFault

# An unknown tool's name is echoed back to the model this long at most (names can be huge).
ECHOED_NAME_CHARS = 64


class Refusal(Exception):
    def __init__(self, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.error = {"code": code, "detail": detail, **extra}


def _nul_fields(value: Any, path: str = "") -> list[str]:
    """Where a NUL character hides in validated arguments (nested mappings and lists included)."""
    if isinstance(value, str):
        return [path] if "\x00" in value else []
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _nul_fields(v, f"{path}.{k}".lstrip("."))]
    if isinstance(value, list | tuple):
        return [f for i, v in enumerate(value) for f in _nul_fields(v, f"{path}.{i}".lstrip("."))]
    return []


def check_call(
    call: PendingCall,
    ctx: ToolContext[Any],
    context: RunContext,
    *,
    allowed: Collection[str] | None = None,
    preconditions: bool = True,
) -> tuple[ToolContract, BaseModel]:
    """The checks every call passes before anything runs; raises Refusal.

    `ctx` is the call's tool context (its principal is the run's). `allowed` is the tool set
    offered to the model for this step (the run's current agent and phase); a known tool outside
    it is refused like an unknown one. A write's preconditions are checked here too (unless the
    caller checks them itself, as planning does), so a call that breaks a business rule is
    refused before anyone is asked to approve it, and again after approval and before the send.
    """
    if call.error is not None:
        raise Refusal(call.error["code"], call.error["detail"])
    contract = context.tools.get(call.tool)
    if contract is None:
        raise Refusal(
            "unknown_tool",
            f"there is no tool {call.tool[:ECHOED_NAME_CHARS]!r}",
            allowed=context.tools.names(),
        )
    if allowed is not None and call.tool not in allowed:
        raise Refusal(
            "tool_not_allowed_now",
            f"{call.tool} is not available to this agent now",
            allowed=sorted(allowed),
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
    if nul := _nul_fields(args.model_dump(mode="json")):
        raise Refusal(
            "invalid_arguments",
            f"arguments of {call.tool} are invalid",
            errors=[{"field": f, "problem": "contains a NUL character"} for f in nul],
        )
    principal = ctx.user
    outside = sorted(r for r in contract.resources_of(args) if not principal.covers(r))
    if outside:
        raise Refusal("out_of_scope", f"{', '.join(outside)} is outside this task's boundary")
    try:
        contract.check_authorized(ctx, args)
        if preconditions and contract.effect is Effect.WRITE:
            contract.check_preconditions(ctx, args)
    except ToolFault as fault:
        raise Refusal(fault.code, fault.detail) from fault
    return contract, args


def passed_checks(
    contract: ToolContract, args: BaseModel, principal: Principal, key: str
) -> tuple[str, ...]:
    """The checks a write passed before a person is asked to approve it, in words: those
    `check_call` and planning make, each as this contract declares it."""
    resources = sorted(contract.resources_of(args))
    rules = [getattr(r, "__name__", type(r).__name__) for r in contract.rules]
    return (
        f"{contract.name} is offered to this run, and its arguments are valid",
        f"inside the task's boundary: {', '.join(resources)}"
        if resources
        else "touches no resource the task's boundary governs",
        f"authorised for {principal.user_id} ({principal.tenant})"
        if contract.declares_authorize
        else "no authorisation rule of its own: any principal of the run may ask",
        f"business rules hold now: {', '.join(rules)}" if rules else "no business rules declared",
        f"a new intent: the journal holds no other with key {key}",
    )


def intent_key(contract: ToolContract, run_id: str, args: BaseModel, revision: int) -> str:
    """The business intent key of a write; an approver's edit number `revision` is a new intent.

    The suffix cannot collide with a key the contract computes itself (it never ends in
    ":edit-N"), so the model can never reach an edited intent, nor an edit a model's one.
    """
    assert contract.intent is not None
    key = contract.intent(run_id, args)
    return f"{key}:edit-{revision}" if revision else key


# Refusals made at dispatch time because the world moved on since the plan (nodes/execute.py):
# nothing was sent, and the model is told to read again and propose anew.
REPLANNABLE = frozenset({"stale_plan", "stale_check_failed"})


def _released(action: Action) -> bool:
    """An intent refused before it was ever sent because its basis was stale: planning it again
    cannot repeat an effect, so the key no longer binds it. An approver's rejection binds."""
    error = (action.outcome or {}).get("error") or {}
    return action.status is ActionStatus.REJECTED and error.get("code") in REPLANNABLE


def open_intent_key(key: str, context: RunContext) -> str:
    """`key`, or `key:replan-N` after N plans of the intent were released (see `_released`).

    Deterministic, so a validate step run again after a crash finds its own action again."""
    candidate, replans = key, 0
    while (existing := context.journal.by_intent(candidate)) is not None and _released(existing):
        replans += 1
        candidate = f"{key}:replan-{replans}"
    return candidate


def _plan_write(
    call: PendingCall,
    contract: ToolContract,
    args: BaseModel,
    state: RunState,
    context: RunContext,
    *,
    edited_by: str | None = None,
) -> tuple[PendingCall, Action, ToolEnvelope | None]:
    """Journal the write's intent. Returns the call, its action, and an answer if already settled.

    An intent the journal has already is answered from the journal (the same call again, or
    changed parameters), whatever the business rules say now; a new one must meet them."""
    key = open_intent_key(intent_key(contract, state["run_id"], args, call.revision), context)
    ctx = context.tool_context(state, bounded=True)
    if context.journal.by_intent(key) is None:
        try:
            contract.check_preconditions(ctx, args)
        except ToolFault as fault:
            raise Refusal(fault.code, fault.detail) from fault
    canonical = args.model_dump(mode="json")
    # An approver's edit always needs its own approval: nobody approved these arguments yet.
    why = (
        f"an edit by {edited_by} needs another approver's approval"
        if edited_by is not None
        else contract.approval_reason(ctx, args)
    )
    needs_approval = why is not None
    proposed = Action(
        action_id=f"act_{digest(key)[:16]}",
        run_id=state["run_id"],
        call_id=call.call_id,
        tool=contract.name,
        args=canonical,
        args_digest=digest(canonical),
        intent_key=key,
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
        now = context.now()
        summary = contract.describe(args)
        # What the approver decides from: only what the run has committed (its task and
        # evidence), so this step, run again after a crash, asks the very same question.
        evidence = evidence_of(state)
        request = ApprovalRequest(
            approval_id=f"apr_{action.digest[:16]}",
            run_id=state["run_id"],
            action_id=action.action_id,
            digest=action.digest,
            tool=contract.name,
            args=canonical,
            summary=f"{summary} (edited by {edited_by})" if edited_by else summary,
            requested_by=principal_of(state).user_id,
            expires_at=now + context.approval_ttl,
            requested_at=now,
            editable=tuple(sorted(contract.editable)),
            task=state["task"],
            facts=tuple(Fact(label=k, value=v) for k, v in contract.facts_of(args, evidence)),
            evidence=EvidenceNote.of_run(evidence),
            confirm=contract.needs_confirmation(args),
            why=why or "",
            checks=passed_checks(contract, args, ctx.user, key),
        )
        verdict = CallVerdict.NEEDS_APPROVAL
        call = call.model_copy(update={"approval": request})
    else:
        verdict = CallVerdict.READY
    return call.model_copy(update={"verdict": verdict, "action_id": action.action_id}), action, None


def _settle(action: Action, to: ActionStatus, context: RunContext, **record: Any) -> Action:
    """Move an awaiting action to `to`, unless an earlier attempt of this step already did."""
    if action.status is to:
        return action
    return context.journal.transition(
        action.action_id, action.status, to, fence=context.fence, **record
    )


def _refused(
    call: PendingCall,
    action: Action,
    error: dict[str, Any],
    record: ApprovalRecord,
    context: RunContext,
) -> tuple[PendingCall, list[Action], ToolEnvelope]:
    action = _settle(
        action,
        ActionStatus.REJECTED,
        context,
        outcome={"error": error},
        detail={"approval_id": record.approval_id, "approver": record.approver},
    )
    return (
        call.model_copy(update={"verdict": CallVerdict.REJECTED, "error": error}),
        [action],
        ToolEnvelope(status="error", error=error),
    )


def _decision_refusal(
    call: PendingCall, record: ApprovalRecord, action: Action
) -> dict[str, Any] | None:
    """Why a decision cannot authorise anything, whatever it says, or None."""
    assert call.approval is not None
    if record.decision == "reject":  # a rejection needs no proof: it can only stop things
        return {
            "code": "approval_rejected",
            "detail": f"rejected by {record.approver}: {record.comment}".rstrip(": "),
        }
    if record.digest != action.digest:
        return {"code": "approval_mismatch", "detail": "the decision names another action"}
    if record.decided_at > call.approval.expires_at:
        return {
            "code": "approval_expired",
            "detail": f"approval expired at {call.approval.expires_at}",
        }
    return None


def _apply_edit(
    call: PendingCall,
    record: ApprovalRecord,
    action: Action,
    state: RunState,
    context: RunContext,
) -> tuple[PendingCall, list[Action], ToolEnvelope | None]:
    """Reject the original, then plan the approver's arguments as a new intent awaiting approval."""
    edited = call.model_copy(
        update={"args": record.args or {}, "revision": call.revision + 1, "approval": None}
    )
    try:
        contract = context.tools.get(call.tool)
        changed = {
            k for k in {*edited.args, *action.args} if edited.args.get(k) != action.args.get(k)
        }
        if contract is not None and not changed.issubset(contract.editable):
            outside = ", ".join(sorted(changed.difference(contract.editable)))
            raise Refusal("edit_not_allowed", f"an approver may not change {outside}")
        # The edited call's business rules are checked where it is planned, below.
        contract, args = check_call(
            edited, context.tool_context(state, bounded=True), context, preconditions=False
        )
        if contract.resources_of(args) != contract.resources_of(
            contract.args_model.model_validate(action.args)
        ):
            raise Refusal("edit_changes_target", "an edit may not change what the action touches")
    except Refusal as refusal:
        error = {"code": "edit_refused", "detail": refusal.error["detail"], "edit": refusal.error}
        return _refused(call, action, error, record, context)
    original = _settle(
        action,
        ActionStatus.REJECTED,
        context,
        outcome={
            "error": {
                "code": "edited_by_approver",
                "detail": f"replaced by {record.approver}'s edit",
            }
        },
        detail={"approval_id": record.approval_id, "approver": record.approver},
    )
    edited, planned, answer = _plan_write(
        edited, contract, args, state, context, edited_by=record.approver
    )
    return edited, [original, planned], answer


def _apply_decision(
    call: PendingCall, record: ApprovalRecord, state: RunState, context: RunContext
) -> tuple[PendingCall, list[Action], ToolEnvelope | None]:
    """An approval decision counts only for the digest it names, before expiry, and after the
    call passes every check again (the world may have changed while it waited)."""
    assert call.approval is not None and call.action_id is not None
    action = context.journal.get(call.action_id)
    assert action is not None, f"journal lost action {call.action_id}"
    recorded = (action.outcome or {}).get("error") or {}
    if action.status is ActionStatus.REJECTED and recorded.get("code") != "edited_by_approver":
        # An earlier attempt of this step refused it and crashed before its checkpoint.
        return _refused(call, action, recorded, record, context)
    refusal = _decision_refusal(call, record, action)
    if refusal is None and record.decision == "edit":
        return _apply_edit(call, record, action, state, context)
    if refusal is None:
        try:
            check_call(call, context.tool_context(state, bounded=True), context)
        except Refusal as exc:
            refusal = exc.error
    if refusal is not None:
        return _refused(call, action, refusal, record, context)
    action = _settle(
        action,
        ActionStatus.APPROVED,
        context,
        detail={"approval_id": record.approval_id, "approver": record.approver},
    )
    return call.model_copy(update={"verdict": CallVerdict.READY}), [action], None


def _check_new(
    call: PendingCall,
    state: RunState,
    context: RunContext,
    allowed: list[str],
) -> tuple[PendingCall, list[Action], ToolEnvelope | None]:
    """The checks of a call met for the first time: refused with its answer, planned (a write,
    journaled; answered at once if the journal settles it), or ready."""
    ctx = context.tool_context(state, bounded=True)
    try:
        contract, args = check_call(call, ctx, context, allowed=allowed, preconditions=False)
        if contract.effect is Effect.WRITE:
            call, action, answer = _plan_write(call, contract, args, state, context)
            return call, [action], answer
        return call.model_copy(update={"verdict": CallVerdict.READY}), [], None
    except Refusal as refusal:
        call = call.model_copy(update={"verdict": CallVerdict.REJECTED, "error": refusal.error})
        return call, [], ToolEnvelope(status="error", error=refusal.error)


def validate(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:validate:start")
    context = runtime.context
    decisions = {
        r["approval_id"]: ApprovalRecord.model_validate(r) for r in state.get("approvals") or []
    }
    offered = (state.get("context") or {}).get("tools") or context.tools.names()
    programs = program.offered(context, offered)
    # A program's calls may name only the tools declared for programs (and offered now).
    for_programs = program.allowed_in(programs, offered) if programs else []
    calls: list[PendingCall] = []
    answered: dict[str, ToolEnvelope] = {}
    actions: list[Action] = []
    # The loop's own tools (programs, skills) are answered by the loop, below.
    own = {program.PROGRAM_TOOL} if programs else set()
    if skills.offered(context, offered):
        own.add(skills.SKILL_TOOL)
    for call in pending_of(state):
        answer: ToolEnvelope | None = None
        if call.verdict is None and call.tool not in own:
            allowed = for_programs if call.program else offered
            call, changed, answer = _check_new(call, state, context, allowed)
            actions.extend(changed)
        elif call.verdict is CallVerdict.NEEDS_APPROVAL and call.approval is not None:
            record = decisions.get(call.approval.approval_id)
            if record is not None:
                call, changed, answer = _apply_decision(call, record, state, context)
                actions.extend(changed)
        if answer is not None:
            answered[call.call_id] = answer
        calls.append(call)
    answers = [tool_result(c, answered[c.call_id]) for c in calls if c.call_id in answered]
    update: dict[str, Any] = {}
    if (loading := skills.load(state, context, calls, offered)) is not None:
        calls, answers = loading.calls, answers + loading.answers
        update |= loading.update
    driven = program.advance(
        state,
        context,
        calls,
        answered,
        offered,
        lambda made: _check_new(made, state, context, for_programs),
    )
    if driven is not None:
        calls, answers = driven.calls, answers + driven.answers
        actions.extend(driven.actions)
        if driven.program is not None:
            update["program"] = driven.program.model_dump(mode="json")
    waiting = any(c.verdict is CallVerdict.NEEDS_APPROVAL for c in calls)
    return {
        **update,
        "pending": dump_pending(calls),
        "history": answers,
        "journal": dump_actions(actions),
        "phase": Phase.WAITING_APPROVAL.value if waiting else Phase.WAITING_TOOLS.value,
        # A cancel requested from outside (lw_runs) stops the run before anything is executed.
        "cancel_requested": bool(state.get("cancel_requested"))
        or runtime.context.cancel_requested(),
    }
