"""reconcile: settle every write whose outcome is not known, by asking the business system.

Runs before anything else happens in the run (guard routes here while any action is unresolved).
For each such action, the business system is asked about the intent key:

  applied        -> SUCCEEDED, with the business system's record as the outcome
  absent         -> re-sent under the same key if the downstream dedupes by key; for one
                    without keys (queryable), only as the contract's `resend` makes safe: once
                    the deadline every request carried (plus the clocks' skew) has passed, so a
                    late-arriving first request can no longer apply -- until then the run
                    waits, parked; with no resend declared, ESCALATED: a person decides
  pending        -> the run parks: an interrupt with the time to look again. No process is held;
                    `loopwright resume` or a worker resumes it when that time has come. A
                    cancelled run does not park: it stops, reporting the write as unconfirmed
  unconfirmable  -> ESCALATED: a human must look; the run stops with needs_human

The journal table, not the state's projection, is read: after a crash it is the only record of
what was sent.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import interrupt
from pydantic import ValidationError

from loopwright.core.crashpoints import crash_point
from loopwright.core.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    CallVerdict,
    PendingCall,
    Phase,
    RunState,
    utcnow,
)
from loopwright.core.views import dump_actions, dump_pending, pending_of, tool_result
from loopwright.nodes.context import RunContext
from loopwright.tools.contract import (
    Guarantee,
    ReconcileStatus,
    ToolContext,
    ToolContract,
    ToolFault,
)
from loopwright.tools.executor import (
    dispatch_record,
    dispatch_write,
    envelope_of,
    settle_reentry,
)

MAX_SENDS = 3


def _escalate(
    action: Action, context: RunContext, why: str, found: ReconcileStatus | None = None
) -> Action:
    """A person decides. `found` is what the business system said (None: it was not asked),
    journaled so the run's stop can tell "proven absent" from "could not tell"."""
    detail: dict[str, Any] = {"reason": why}
    if found is not None:
        detail["reconciled"] = found.value
    return context.journal.transition(
        action.action_id,
        ActionStatus.RECONCILING,
        ActionStatus.ESCALATED,
        fence=context.fence,
        detail=detail,
    )


STRICTNESS = (Guarantee.NONE, Guarantee.QUERYABLE, Guarantee.IDEMPOTENT_BY_KEY)
# An absent intent may be sent again under these: the same key dedupes it, or (queryable) the
# contract's resend deadline has passed, so the first request can no longer apply.
RESENDABLE = frozenset({Guarantee.IDEMPOTENT_BY_KEY, Guarantee.QUERYABLE})


def _until_absence_is_final(contract: ToolContract, sent: dict[str, Any]) -> float:
    """Seconds until a keyless write's absence is final (0: it is, or the contract has keys)."""
    if contract.guarantee is not Guarantee.QUERYABLE or contract.resend is None:
        return 0.0
    if not sent.get("send_by"):
        return 0.0  # never sent (a crash before the send): nothing can arrive late
    final_at = datetime.fromisoformat(sent["send_by"]) + timedelta(seconds=contract.resend.skew_s)
    return max(0.0, (final_at - utcnow()).total_seconds())


def _weaker(a: Guarantee, b: Guarantee) -> Guarantee:
    return min(a, b, key=STRICTNESS.index)


def _not_the_contract_it_was_sent_under(
    contract: ToolContract | None, action: Action, sent: dict[str, Any]
) -> str | None:
    """Why this process cannot reconcile the write with the contract it has, or None.

    A deploy may have changed the tool since the write was sent: its reconcile still asks about
    the same intent if the write's journaled arguments are valid under it; if they are not, or
    the tool is gone, a person decides."""
    if contract is None:
        return f"{action.tool} is gone from this agent: nothing here can ask about the intent"
    if contract.reconcile is None or contract.guarantee is Guarantee.NONE:
        return "the downstream cannot be asked about this intent"
    if sent.get("contract") not in (None, contract.schema_hash):
        try:
            contract.args_model.model_validate(action.args)
        except ValidationError:
            return (
                f"{action.tool} changed since this write was sent (contract "
                f"{sent['contract']}, now {contract.schema_hash}) and its arguments no longer fit"
            )
    return None


def reconcile_action(
    action: Action, context: RunContext, ctx: ToolContext[Any]
) -> tuple[Action, float | None]:
    """Move one unresolved action as far as the business system's answer allows.

    Returns the action and, if the business system says "not finished yet", seconds to wait.
    A re-send of an intent the business system does not have is checked against the write's
    preconditions first, on current data: nothing is sent where a rule no longer holds.
    """
    contract = context.tools.get(action.tool)
    journal, fence = context.journal, context.fence
    action = settle_reentry(action, journal, fence)
    if action.status is ActionStatus.UNKNOWN:
        action = journal.transition(
            action.action_id, ActionStatus.UNKNOWN, ActionStatus.RECONCILING, fence=fence
        )
    sent = dispatch_record(journal, action.action_id)
    if (why := _not_the_contract_it_was_sent_under(contract, action, sent)) is not None:
        return _escalate(action, context, why), None
    assert contract is not None and contract.reconcile is not None
    # A re-send needs both the contract it was sent under and today's to say it is safe.
    guarantee = _weaker(Guarantee(sent.get("guarantee", contract.guarantee)), contract.guarantee)
    answer = contract.reconcile_intent(ctx, action, sent.get("pre_image"))
    match answer.status:
        case ReconcileStatus.APPLIED:
            return journal.transition(
                action.action_id,
                ActionStatus.RECONCILING,
                ActionStatus.SUCCEEDED,
                fence=fence,
                outcome=answer.outcome,
                detail={"reconciled": "applied"},
            ), None
        case ReconcileStatus.ABSENT if guarantee is Guarantee.QUERYABLE and contract.resend is None:
            return _escalate(
                action,
                context,
                "absent now, but without a key or a deadline the downstream honours, the "
                "request may still arrive and apply: a person decides whether to send it again",
                answer.status,
            ), None
        case ReconcileStatus.ABSENT if (wait := _until_absence_is_final(contract, sent)) > 0:
            # Sent to a downstream without keys: absent is final only once the request's
            # deadline (plus the clocks' skew) has passed; until then the run waits.
            return action, wait
        case ReconcileStatus.ABSENT if guarantee in RESENDABLE:
            if action.attempts >= MAX_SENDS:
                return _escalate(
                    action, context, f"still absent after {action.attempts} sends", answer.status
                ), None
            try:
                contract.check_preconditions(ctx, contract.args_model.model_validate(action.args))
            except ToolFault as fault:
                return journal.transition(
                    action.action_id,
                    ActionStatus.RECONCILING,
                    ActionStatus.FAILED,
                    fence=fence,
                    outcome={"error": fault.as_error()},
                    detail={"reconciled": "absent", "resend": "refused by a precondition"},
                ), None
            resent = {"reconciled": "absent", "reason": "absent: sent again"}
            action = dispatch_write(contract, action, ctx, journal, fence, found=resent)
            if action.status is ActionStatus.UNKNOWN:
                return reconcile_action(action, context, ctx)
            return action, None
        case ReconcileStatus.PENDING:
            return action, answer.retry_after_s
        case _:
            return _escalate(
                action, context, answer.detail or str(answer.status), answer.status
            ), None


def reconcile(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:reconcile:start")
    context = runtime.context
    # Not bounded by the run's deadline: an unknown write is settled whatever the clock says.
    ctx = context.tool_context(state)
    projected = state.get("journal") or {}
    settled: list[Action] = []
    waits: list[float] = []
    for action in context.journal.for_run(state["run_id"]):
        if action.status not in UNRESOLVED_STATUSES:
            if (projected.get(action.action_id) or {}).get("status") != action.status:
                # Settled by an earlier attempt of this step that died before its writes were
                # saved: the projection must catch up, or guard would route here forever.
                settled.append(action)
            continue
        action, wait = reconcile_action(action, context, ctx)
        crash_point("reconcile:after_settle")
        settled.append(action)
        if wait is not None:
            waits.append(wait)
    cancelled = bool(state.get("cancel_requested")) or context.cancel_requested()
    if waits and not cancelled:
        retry_at = context.now() + timedelta(seconds=min(waits))
        # Parks the run; resuming re-runs this node from its start, which asks again.
        interrupt(
            {"kind": "reconcile_wait", "run_id": state["run_id"], "retry_at": retry_at.isoformat()}
        )
    by_call = {a.call_id: a for a in settled}
    calls: list[PendingCall] = []
    answers: list[ToolMessage] = []
    for call in pending_of(state):
        answered = by_call.get(call.call_id)
        if answered is not None and call.verdict is not CallVerdict.DONE:
            answers.append(tool_result(call, envelope_of(answered)))
            call = call.model_copy(update={"verdict": CallVerdict.DONE})
        calls.append(call)
    return {
        "journal": dump_actions(settled),
        "pending": dump_pending(calls),
        "history": answers,
        "phase": Phase.READY.value,
        # A cancelled run asks once and does not wait: guard then stops it, reporting what is
        # still unconfirmed.
        "reconciled_for_cancel": cancelled,
    }
