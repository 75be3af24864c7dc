"""guard: the loop's gate. Every iteration passes here before the model is asked again.

On the first step it fixes the run's principal, versions and task message. The principal comes
from the trusted caller only: in the run's input (the CLI writes it there, so it is committed
before any node runs and a crash before the first step loses nothing) or in the run context (a
server's auth). Then it decides, in this order: a run that is
already stopping stops; a cancel request stops; an escalated action needs a human; any action
whose outcome is not known is reconciled before anything else happens; a spent budget stops.
Otherwise the loop goes on to compile the next context.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from graph.context import RunContext
from graph.crashpoints import crash_point
from graph.state import UNRESOLVED_STATUSES, ActionStatus, Phase, RunState, StopReason, Versions
from graph.views import actions_of, started_at, stop, usage_of


def _first_step(state: RunState, context: RunContext) -> dict[str, Any]:
    principal = state.get("principal") or (
        context.principal and context.principal.model_dump(mode="json")
    )
    if not principal:
        return stop(StopReason.PERMISSION_DENIED, "the run has no trusted principal")
    versions = Versions(
        model_id=context.model_id,
        prompt_version=context.prompt_version,
        tool_schemas=context.tools.schema_hashes(),
    )
    return {
        "principal": principal,
        "versions": versions.model_dump(mode="json"),
        "history": [HumanMessage(content=state["task"])],
    }


def guard(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:guard:start")
    context = runtime.context
    if state.get("stop_reason"):
        return {"phase": Phase.INCOMPLETE.value}
    update: dict[str, Any] = {}
    if not state["history"]:
        update = _first_step(state, context)
        if "stop_reason" in update:
            return update
    if state.get("cancel_requested"):
        return stop(StopReason.CANCELLED, "cancel requested")
    actions = actions_of(state)
    escalated = [a for a in actions if a.status is ActionStatus.ESCALATED]
    if escalated:
        ids = ", ".join(a.action_id for a in escalated)
        return stop(StopReason.NEEDS_HUMAN, f"outcome of {ids} could not be confirmed")
    if any(a.status in UNRESOLVED_STATUSES for a in actions):
        return {**update, "phase": Phase.RECONCILING.value}
    exceeded = context.budget.check_before_request(
        usage_of(state), started_at(state), context.now()
    )
    if exceeded is not None:
        return stop(exceeded.reason, exceeded.detail)
    return {**update, "phase": Phase.READY.value}
