"""execute: run the calls validate made ready.

Reads run directly. Writes go through the journaled executor, and are checked once more right
before they are sent (authorisation and scope may have changed while the call waited). A write
met again after a crash is never sent from here: DISPATCHED without an outcome becomes UNKNOWN
and reconcile asks the business system. A write whose outcome is UNKNOWN gets no answer here;
reconcile answers it once the business system has told us what happened.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime

from graph.context import RunContext
from graph.crashpoints import crash_point
from graph.protocol import ToolEnvelope
from graph.state import Action, ActionStatus, CallVerdict, PendingCall, Phase, RunState
from graph.views import (
    dump_actions,
    dump_pending,
    pending_of,
    principal_of,
    started_at,
    stop,
    tool_result,
    usage_of,
)
from nodes.validate import Refusal, check_call
from tools.contract import Effect
from tools.executor import dispatch_write, envelope_of, run_read, settle_reentry


def _write(call: PendingCall, state: RunState, context: RunContext) -> Action:
    assert call.action_id is not None
    action = context.journal.get(call.action_id)
    assert action is not None, f"journal lost action {call.action_id}"
    action = settle_reentry(action, context.journal, context.fence)
    if action.status not in (ActionStatus.PLANNED, ActionStatus.APPROVED):
        return action  # already settled, or UNKNOWN: never sent twice from here
    try:
        contract, _ = check_call(call, principal_of(state), context)
    except Refusal as refusal:
        return context.journal.transition(
            action.action_id,
            action.status,
            ActionStatus.REJECTED,
            fence=context.fence,
            outcome={"error": refusal.error},
            detail={"stage": "pre-dispatch re-check"},
        )
    return dispatch_write(contract, action, context.env, context.journal, context.fence)


def execute(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:execute:start")
    context = runtime.context
    usage = usage_of(state)
    calls: list[PendingCall] = []
    answers: list[ToolMessage] = []
    evidence: list[dict[str, Any]] = []
    actions: list[Action] = []
    for call in pending_of(state):
        if call.verdict is not CallVerdict.READY:
            calls.append(call)
            continue
        exceeded = context.budget.check_before_tool_call(usage, started_at(state), context.now())
        if exceeded is not None:
            return {
                **stop(exceeded.reason, exceeded.detail),
                "usage": usage.model_dump(mode="json"),
            }
        contract = context.tools.get(call.tool)
        assert contract is not None, "validate admits only known tools"
        if contract.effect is Effect.READ:
            read = run_read(
                contract, contract.args_model.model_validate(call.args), context.env, call.call_id
            )
            usage = usage.model_copy(
                update={
                    "tool_calls": usage.tool_calls + 1,
                    "tool_attempts": usage.tool_attempts + read.attempts,
                    "tool_result_bytes": usage.tool_result_bytes + read.result_bytes,
                }
            )
            if read.evidence is not None:
                evidence.append(read.evidence.model_dump(mode="json"))
            answer: ToolEnvelope | None = read.envelope
        else:
            action = _write(call, state, context)
            actions.append(action)
            usage = usage.model_copy(
                update={
                    "tool_calls": usage.tool_calls + 1,
                    "tool_attempts": usage.tool_attempts + 1,
                }
            )
            answer = None if action.status is ActionStatus.UNKNOWN else envelope_of(action)
        if answer is not None:
            answers.append(tool_result(call, answer))
            call = call.model_copy(update={"verdict": CallVerdict.DONE})
        calls.append(call)
    unknown = any(a.status is ActionStatus.UNKNOWN for a in actions)
    return {
        "pending": dump_pending(calls),
        "history": answers,
        "evidence": evidence,
        "journal": dump_actions(actions),
        "usage": usage.model_dump(mode="json"),
        "phase": Phase.RECONCILING.value if unknown else Phase.READY.value,
    }
