"""guard: the loop's gate. Every iteration passes it before the model is asked again, the first
included: `gate` is the start of compile_context, so that it costs no superstep of its own. The
guard node is the gate alone, for checkpoints of earlier releases whose next node is guard.

On the first step it fixes the run's principal, versions and task message. The principal comes
from the trusted caller only: in the run's input (the CLI writes it there, so it is committed
before any node runs and a crash before the first step loses nothing) or in the run context (a
server's auth). Then it decides, in this sequence: a run that is
already stopping stops; an escalated action needs a human; any action whose outcome is not known
is reconciled before anything else happens (a cancelled run's too); once per model decision, a
second permission refusal stops and a step repeated without progress gets one strategy-change
message, then stops; a cancel request stops; a spent budget stops.
Otherwise the loop goes on to compile the next context.
"""

from __future__ import annotations

import time
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from loopwright.core.progress import check_progress, error_codes, last_step, step_signature
from loopwright.core.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    Phase,
    RunState,
    StopReason,
    Versions,
)
from loopwright.core.views import (
    actions_of,
    dump_actions,
    not_done,
    pending_of,
    started_at,
    stop,
    usage_of,
    why_not,
)
from loopwright.nodes.context import RunContext
from loopwright.tools.program import PROGRAM_TOOL
from loopwright.tools.sandbox import sandbox_version

# A refused permission is not retried: the model hears why once; a second refusal stops.
MAX_DENIALS = 2
NOT_YET_SENT = frozenset({ActionStatus.PLANNED, ActionStatus.NEEDS_APPROVAL, ActionStatus.APPROVED})


def _first_step(state: RunState, context: RunContext) -> dict[str, Any]:
    principal = state.get("principal") or (
        context.principal and context.principal.model_dump(mode="json")
    )
    if not principal:
        return stop(StopReason.PERMISSION_DENIED, "the run has no trusted principal")
    versions = Versions(
        agent=context.agent_name,
        agent_version=context.agent_version,
        model_id=context.model_id,
        model_spec=context.model_spec,
        model_settings=context.model_settings,
        prompt_version=context.prompt_version,
        tool_schemas=context.tools.schema_hashes(),
        sandbox=sandbox_version() if context.tools.get(PROGRAM_TOOL) else "",
    )
    return {
        "principal": principal,
        "versions": versions.model_dump(mode="json"),
        "history": [HumanMessage(content=state["task"])],
    }


def _cancel(state: RunState) -> dict[str, Any]:
    """Stop for a cancel request: actions not yet sent never will be (`guard` releases them as
    for every end); sent ones are reported."""
    unconfirmed = [a.action_id for a in actions_of(state) if a.status in UNRESOLVED_STATUSES]
    detail = "cancel requested"
    if unconfirmed:
        detail += f"; outcome not confirmed for {', '.join(unconfirmed)}"
    return stop(StopReason.CANCELLED, detail)


def _after_step(state: RunState, context: RunContext) -> dict[str, Any]:
    """Book-keeping on the step that just finished: permission refusals, progress, polling."""
    decision, results = last_step(state["history"])
    if decision is None or not decision.tool_calls:
        return {}
    denials = state.get("denials", 0) + error_codes(results).count("permission_denied")
    if denials >= MAX_DENIALS:
        return stop(StopReason.PERMISSION_DENIED, f"{denials} calls refused for lack of permission")
    poll_after = [c.poll_after_s for c in pending_of(state) if c.poll_after_s is not None]
    if poll_after:
        # The tool asked to be polled later: wait (within the deadline), and do not count the
        # repetition as a loop without progress.
        remaining = (context.budget.deadline(started_at(state)) - context.now()).total_seconds()
        time.sleep(max(0.0, min(min(poll_after), remaining)))
        return {"denials": denials}
    check = check_progress(
        state.get("progress") or [],
        step_signature(state["history"]),
        nudged=state.get("nudged", False),
    )
    if check.stop:
        return stop(StopReason.NO_PROGRESS, f"the same step repeated {check.repeats} times")
    update: dict[str, Any] = {"denials": denials, "progress": check.signatures}
    if check.nudge is not None:
        update |= {"nudged": True, "feedback": [check.nudge]}
    return update


def guard(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    return gate(state, runtime.context)


def gate(state: RunState, context: RunContext) -> dict[str, Any]:
    """guard's decision and book-keeping, without a superstep of its own: the guard node's
    body, and the first thing compile_context does (every loop iteration but the first reaches
    the gate there). Phase READY means go on; anything else is where guard routes."""
    update = _guard(state, context) | _model_change(state, context)
    if update.get("phase") == Phase.INCOMPLETE.value:
        # A run that ends leaves no action for nobody to send: not sent yet, never will be.
        reason = update.get("stop_reason") or state.get("stop_reason") or "stopped"
        released = _release_unsent(state, context, str(reason))
        update["journal"] = {**(update.get("journal") or {}), **dump_actions(released)}
    return update


def _model_change(state: RunState, context: RunContext) -> dict[str, Any]:
    """The change of model an operator asked for (`context.model_change`), recorded in V before
    the changed model is asked anything: the run's model is from now on the context's."""
    versions = state.get("versions")
    if not context.model_change or not versions:
        return {}
    was = (versions.get("model_spec", ""), versions.get("model_settings") or {})
    now = (context.model_spec, context.model_settings)
    if was == now:
        return {}
    change = {
        "at": context.now().isoformat(),
        "from": {"spec": was[0], "settings": was[1]},
        "to": {"spec": now[0], "settings": now[1]},
    }
    return {
        "versions": {
            **versions,
            "model_spec": now[0],
            "model_settings": now[1],
            "model_changes": [*(versions.get("model_changes") or []), change],
        }
    }


def _release_unsent(state: RunState, context: RunContext, reason: str) -> list[Action]:
    """CANCEL the run's actions not sent yet (planned, waiting for or given an approval)."""
    released = []
    for action in context.journal.for_run(state["run_id"]):
        if action.status in NOT_YET_SENT:
            released.append(
                context.journal.transition(
                    action.action_id,
                    action.status,
                    ActionStatus.CANCELLED,
                    fence=context.fence,
                    detail={"reason": f"the run ended ({reason}) before this action was sent"},
                )
            )
    return released


def _escalated_because(action: Action, context: RunContext) -> str:
    """What a person is asked to decide about an escalated write: one the business system
    proved absent (send it again or not) is not one nobody could tell about (look first)."""
    events = context.journal.events(action.action_id)
    last = (events[-1].detail or {}) if events else {}
    why = last.get("reason") or "no reason was journaled"
    if last.get("reconciled") == "absent":
        return (
            f"{action.action_id} proven absent: a person decides whether to send it again ({why})"
        )
    return f"{action.action_id} could not tell whether it applied: a person looks ({why})"


def _guard(state: RunState, context: RunContext) -> dict[str, Any]:
    if state.get("stop_reason"):
        return {"phase": Phase.INCOMPLETE.value}
    update: dict[str, Any] = {}
    if not state["history"]:
        update = _first_step(state, context)
        if "stop_reason" in update:
            return update
    actions = actions_of(state)
    escalated = [a for a in actions if a.status is ActionStatus.ESCALATED]
    if escalated:
        why = "; ".join(_escalated_because(a, context) for a in escalated)
        return stop(StopReason.NEEDS_HUMAN, why)
    cancel = bool(state.get("cancel_requested")) or context.cancel_requested()
    unresolved = any(a.status in UNRESOLVED_STATUSES for a in actions)
    if unresolved and not (cancel and state.get("reconciled_for_cancel")):
        # In-flight writes are settled first, cancelled run or not.
        return {**update, "phase": Phase.RECONCILING.value, "cancel_requested": cancel}
    decision, _ = last_step(state["history"])
    if decision is not None and decision.id != state.get("checked_step"):
        update |= {**_after_step(state, context), "checked_step": decision.id}
        if "stop_reason" in update:
            return update
    if cancel:
        return _cancel(state)
    exceeded = context.budget.check_before_request(
        usage_of(state), started_at(state), context.now()
    )
    if exceeded is not None:
        missing = not_done(actions)
        detail = exceeded.detail + "".join(f"; not done: {why_not(a)}" for a in missing)
        return stop(exceeded.reason, detail)
    return {**update, "phase": Phase.READY.value}
