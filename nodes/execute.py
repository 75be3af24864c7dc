"""execute: run the calls validate made ready, as concurrently as their resources allow.

Scheduling: two calls conflict when they touch a common resource (from the tool contract) and
at least one of them writes. Conflicting calls form a lane and run one at a time, in the sequence
the model asked for them; lanes run concurrently, up to the budget's parallel-tool limit. So
reads run side by side and two writes to one resource never overlap.

Writes go through the journaled executor and are checked once more right before they are sent:
authorisation, scope and the write's business preconditions again, on current data, and the
version of every resource the write touches against the version the model last observed (a
write planned on version 17 of a ticket is refused when the ticket is now at version 18, and
the model is told why). A write met again after a crash is never
sent from here: DISPATCHED without an outcome becomes UNKNOWN and reconcile asks the business
system; a write whose outcome is UNKNOWN gets no answer until reconcile has one.

A cancel request stops new actions: calls not started yet are answered "cancelled". A read whose
tool stays unavailable after the retry layer stops the run with `tool_unavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables.config import ContextThreadPoolExecutor
from langgraph.runtime import Runtime
from pydantic import ValidationError

from loopwright.core.crashpoints import crash_point
from loopwright.core.protocol import ToolEnvelope
from loopwright.core.state import (
    Action,
    ActionStatus,
    CallVerdict,
    EvidenceNote,
    PendingCall,
    Phase,
    RunState,
    StopReason,
)
from loopwright.core.views import (
    dump_actions,
    dump_pending,
    pending_of,
    started_at,
    stop,
    stored_evidence,
    tool_result,
    usage_of,
)
from loopwright.nodes.context import RunContext
from loopwright.nodes.validate import Refusal, check_call
from loopwright.tools.contract import ToolContext, ToolContract, ToolFault
from loopwright.tools.executor import (
    ReadResult,
    dispatch_write,
    envelope_of,
    run_read,
    settle_reentry,
)

CANCELLED = ToolEnvelope(
    status="error", error={"code": "cancelled", "detail": "the run was cancelled; not started"}
)


@dataclass
class Done:
    """What running one call produced."""

    call: PendingCall
    answer: ToolEnvelope | None
    read: ReadResult | None = None
    action: Action | None = None


def observed_versions(
    evidence: Sequence[dict[str, Any]], resources: frozenset[str]
) -> dict[str, str]:
    """The version of each resource as the model last saw it (the newest evidence wins)."""
    seen: dict[str, str] = {}
    for raw in evidence:
        item = EvidenceNote.model_validate(raw)
        if item.version is None:
            continue
        for resource in resources.intersection(item.resources):
            seen[resource] = item.version
    return seen


def stale_basis(
    contract: ToolContract, args: Any, state: RunState, ctx: ToolContext[Any]
) -> dict[str, Any] | None:
    """The refusal for a write planned on an outdated observation, or None if it is current."""
    if contract.current_versions is None:
        return None
    basis = observed_versions(state["evidence"], contract.resources_of(args))
    if not basis:
        return None
    try:
        current = contract.current_versions(ctx, args)
    except ToolFault as fault:
        return {"code": "stale_check_failed", "detail": fault.detail}
    changed = {r: (v, current.get(r)) for r, v in basis.items() if current.get(r) != v}
    if not changed:
        return None
    what = "; ".join(
        f"{r} was version {old} when you read it, it is now {new}"
        for r, (old, new) in changed.items()
    )
    return {"code": "stale_plan", "detail": f"{what}. Read it again before acting."}


def _write(call: PendingCall, state: RunState, context: RunContext) -> Action:
    assert call.action_id is not None
    action = context.journal.get(call.action_id)
    assert action is not None, f"journal lost action {call.action_id}"
    action = settle_reentry(action, context.journal, context.fence)
    if action.status not in (ActionStatus.PLANNED, ActionStatus.APPROVED):
        return action  # already settled, or UNKNOWN: never sent twice from here
    ctx = context.tool_context(state, bounded=True)
    try:
        contract, args = check_call(call, ctx, context)
        refusal = stale_basis(contract, args, state, ctx)
    except Refusal as exc:
        refusal = exc.error
    if refusal is not None:
        return context.journal.transition(
            action.action_id,
            action.status,
            ActionStatus.REJECTED,
            fence=context.fence,
            outcome={"error": refusal},
            detail={"stage": "pre-dispatch re-check"},
        )
    return dispatch_write(contract, action, ctx, context.journal, context.fence)


def _cancel_unsent(call: PendingCall, context: RunContext) -> Done:
    action = None
    if call.action_id is not None:
        action = context.journal.get(call.action_id)
        if action is not None and action.status in (ActionStatus.PLANNED, ActionStatus.APPROVED):
            action = context.journal.transition(
                action.action_id,
                action.status,
                ActionStatus.CANCELLED,
                fence=context.fence,
                detail={"reason": "run cancelled before this action was sent"},
            )
    return Done(call, CANCELLED, action=action)


def changed_since_decided(tool: str, state: RunState, context: RunContext) -> bool:
    """Whether the call may have been decided under code other than this process's, which must
    check it again before it runs: the tool's contract differs from the one the run recorded
    (V) when it began, or the run began under another version of its agent (a decision of any
    version in between, newer or older, may rest on a contract V does not hold)."""
    versions = state.get("versions") or {}
    recorded = versions.get("tool_schemas") or {}
    contract = context.tools.get(tool)
    if versions.get("agent_version", context.agent_version) != context.agent_version:
        return True
    return contract is None or recorded.get(tool) != contract.schema_hash


def run_call(call: PendingCall, state: RunState, context: RunContext) -> Done:
    # A write's effect leaves the system: a cancel asked while an earlier call of this step ran
    # (a lane's calls run one after another) stops it, so that flag is read afresh for it.
    writes = call.action_id is not None
    if context.cancel_requested_now() if writes else context.cancel_requested():
        return _cancel_unsent(call, context)
    if not writes:  # a read: writes are journaled when they are planned
        ctx = context.tool_context(state, bounded=True)
        contract = context.tools.get(call.tool)
        try:
            if contract is None or changed_since_decided(call.tool, state, context):
                # A decision made under another contract (or for a tool gone since): valid
                # only if it passes every check of the current one.
                contract, args = check_call(call, ctx, context)
            else:
                args = contract.args_model.model_validate(call.args)
        except Refusal as refusal:
            return Done(call, ToolEnvelope(status="error", error=refusal.error))
        read = run_read(contract, args, ctx, call.call_id)
        return Done(call, read.envelope, read=read)
    # A write goes by its journal: settled or in flight, it is never sent again from here;
    # otherwise it passes every check of the current contract first (`_write`).
    action = _write(call, state, context)
    answer = None if action.status is ActionStatus.UNKNOWN else envelope_of(action)
    return Done(call, answer, action=action)


def _touches(call: PendingCall, context: RunContext) -> set[str]:
    """The resources a call touches, by today's contract (none known for a call that no longer
    fits one: it is refused when it runs)."""
    contract = context.tools.get(call.tool)
    if contract is None:
        return set()
    try:
        return set(contract.resources_of(contract.args_model.model_validate(call.args)))
    except ValidationError:
        return set()


def lanes(calls: Sequence[PendingCall], context: RunContext) -> list[list[PendingCall]]:
    """Group calls that conflict (a shared resource, one of them a write), keeping their sequence."""
    lanes: list[list[PendingCall]] = []
    touched: list[tuple[set[str], bool]] = []  # per lane: resources, and whether it writes
    for call in calls:
        resources = _touches(call, context)
        writes = call.action_id is not None
        hits = [
            i
            for i, (res, lane_writes) in enumerate(touched)
            if res & resources and (writes or lane_writes)
        ]
        if not hits:
            lanes.append([call])
            touched.append((resources, writes))
            continue
        # Merge every lane this call conflicts with into the first, then append the call.
        first = hits[0]
        for i in reversed(hits[1:]):
            lanes[first] += lanes.pop(i)
            res, lane_writes = touched.pop(i)
            touched[first] = (touched[first][0] | res, touched[first][1] or lane_writes)
        lanes[first].append(call)
        touched[first] = (touched[first][0] | resources, touched[first][1] or writes)
    return lanes


def execute(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:execute:start")
    context = runtime.context
    usage = usage_of(state)
    ready = [c for c in pending_of(state) if c.verdict is CallVerdict.READY]
    exceeded = context.budget.check_before_tool_call(
        usage, started_at(state), context.now(), calls=len(ready)
    )
    if exceeded is not None:
        return stop(exceeded.reason, exceeded.detail)

    def run_lane(lane: list[PendingCall]) -> list[Done]:
        return [run_call(call, state, context) for call in lane]

    grouped = lanes(ready, context)
    workers = min(context.budget.max_parallel_tools, len(grouped))
    if workers <= 1:
        # Lanes that would run one after another anyway (one lane: the usual single call) run
        # here, each in a copy of this context as a pool's thread would be: no pool to start.
        results = [copy_context().run(run_lane, lane) for lane in grouped]
    else:
        # Context-carrying threads: each tool call's span stays a child of this node's span.
        with ContextThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool") as pool:
            results = list(pool.map(run_lane, grouped))
    done = {d.call.call_id: d for lane in results for d in lane}

    calls: list[PendingCall] = []
    answers: list[ToolMessage] = []
    evidence: list[dict[str, Any]] = []
    actions: list[Action] = []
    unavailable: list[str] = []
    for call in pending_of(state):
        result = done.get(call.call_id)
        if result is None:
            calls.append(call)
            continue
        update: dict[str, Any] = {}
        usage = usage.model_copy(update={"tool_calls": usage.tool_calls + 1})
        if result.read is not None:
            read = result.read
            usage = usage.model_copy(
                update={
                    "tool_attempts": usage.tool_attempts + read.attempts,
                    "tool_result_bytes": usage.tool_result_bytes + read.result_bytes,
                }
            )
            if read.evidence is not None:
                evidence.append(stored_evidence(read.evidence))
            if read.exhausted:
                unavailable.append(call.tool)
            update["poll_after_s"] = read.poll_after_s
        if result.action is not None:
            actions.append(result.action)
            if result.answer is not CANCELLED:
                usage = usage.model_copy(update={"tool_attempts": usage.tool_attempts + 1})
        if result.answer is not None:
            answers.append(tool_result(call, result.answer))
            update["verdict"] = CallVerdict.DONE
        calls.append(call.model_copy(update=update))
    unknown = any(a.status is ActionStatus.UNKNOWN for a in actions)
    outcome: dict[str, Any] = {
        "pending": dump_pending(calls),
        "history": answers,
        "evidence": evidence,
        "journal": dump_actions(actions),
        "usage": usage.model_dump(mode="json"),
        "phase": Phase.RECONCILING.value if unknown else Phase.READY.value,
    }
    if unavailable and not unknown:
        late = context.budget.check_deadline(started_at(state), context.now())
        tools = ", ".join(sorted(set(unavailable)))
        outcome |= (
            stop(late.reason, f"{late.detail} while waiting for {tools}")
            if late is not None
            else stop(StopReason.TOOL_UNAVAILABLE, f"{tools} unavailable after retries")
        )
    return outcome
