"""model_step: ask the model once and commit its decision.

With durability="sync" the update returned here (the AI message and its tool calls) is committed
before validate starts, so a crash from here on never asks the model again for this decision.
Only complete, parsed calls become pending calls; unparsable ones are recorded as such and are
answered with an error by validate, never executed.

The request ends by the clock (`core.bounded.call_by`): at the budget's bound for one request,
what the run's deadline leaves, or the model's own `request_limit_s` if it declares one
(`StrictChatOpenAI`: `LOOPWRIGHT_MODEL_TIMEOUT_S`), whichever comes first, whatever the model's
server keeps sending; a process stopping (SIGINT, SIGTERM) ends it at once.

Where the run context has a deterministic planner (the hybrid, workflow case), the planner
decides instead of the model, and its decision takes the same path: the same protocol item in
history, the same validation, approvals and journal. Its revised plan is committed with it.
"""

from __future__ import annotations

import math
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from loopwright.core.bounded import call_by
from loopwright.core.budget import REQUEST_BOUNDS
from loopwright.core.crashpoints import crash_point
from loopwright.core.plan import Planner
from loopwright.core.state import PendingCall, Phase, RunState, StopReason, digest
from loopwright.core.views import dump_pending, started_at, stop, usage_of
from loopwright.nodes.compile_context import render
from loopwright.nodes.context import RunContext, model_name
from loopwright.nodes.model_spans import model_span, note_model_reply
from loopwright.observability.metrics import MODEL_REQUEST_SECONDS


def _pending_calls(message: AIMessage) -> list[PendingCall]:
    calls = [
        PendingCall(call_id=str(c["id"]), tool=c["name"], args=dict(c["args"]))
        for c in message.tool_calls
    ]
    calls += [
        PendingCall(
            call_id=str(c.get("id")),
            tool=str(c.get("name")),
            args={},
            error={
                "code": "invalid_arguments",
                "detail": f"unparsable arguments: {c.get('error')}",
            },
        )
        for c in message.invalid_tool_calls
    ]
    return calls


def _planned(state: RunState, planner: Planner) -> tuple[AIMessage, list[dict[str, Any]]]:
    """A deterministic planner's decision, as the same protocol item a model would produce."""
    decision = planner.decide(state)
    step = state.get("step", 0)
    calls = [
        {
            "name": name,
            "args": args,
            "id": f"call_{digest([step, i, name, args])[:12]}",
            "type": "tool_call",
        }
        for i, (name, args) in enumerate(decision.calls)
    ]
    message = AIMessage(
        content=decision.answer,
        tool_calls=calls,
        name=planner.name,
        id=f"{planner.name}-{state['run_id']}-{step}",
        usage_metadata={"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    )
    return message, [p.model_dump(mode="json") for p in decision.plan]


def model_step(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    crash_point("node:model_step:start")
    context = runtime.context
    compiled = state.get("context") or {}
    allowed = [c for c in context.tools if c.name in compiled.get("tools", [])]
    agent = context.agent(state.get("owner"))
    planner = agent.planner if agent is not None and agent.planner else context.planner
    model = agent.model if agent is not None and agent.model else context.model
    plan: list[dict[str, Any]] | None = None
    if planner is not None:
        reply, plan = _planned(state, planner)
    else:
        bounds = context.budget.request_bounds(usage_of(state), started_at(state), context.now())
        seconds = min(
            (bounds.stop_by - context.now()).total_seconds(),
            getattr(model, "request_limit_s", math.inf),
        )
        bound = REQUEST_BOUNDS.set(bounds)
        try:
            with (
                model_span(model, context.prompt_version) as span,
                MODEL_REQUEST_SECONDS.labels(model_name(model)).time(),
            ):
                bound_model = context.with_tools(model, allowed)
                messages = render(state)
                reply = call_by(
                    seconds, lambda: bound_model.invoke(messages), what="the model request"
                )
                note_model_reply(span, reply)
        except Exception as exc:  # the model client already retried transient faults (one layer)
            # The request was made (and may be billed) though nothing came back of it.
            failed = usage_of(state).after_failed_model_request()
            late = context.budget.check_deadline(started_at(state), context.now())
            reason = StopReason.DEADLINE_EXCEEDED if late else StopReason.TOOL_UNAVAILABLE
            return {
                **stop(reason, f"model unavailable: {type(exc).__name__}: {exc}"[:1000]),
                "usage": failed.model_dump(mode="json"),
            }
        finally:
            REQUEST_BOUNDS.reset(bound)
    if not isinstance(reply, AIMessage):
        return stop(StopReason.TOOL_UNAVAILABLE, f"model returned {type(reply).__name__}")
    usage = usage_of(state)
    if planner is not None:
        usage = usage.model_copy(update={"steps": usage.steps + 1})  # a step, but no model call
    else:
        # Priced by the model that answered: a specialist agent may have its own.
        meta = reply.usage_metadata or {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        usage = usage.after_model_request(
            meta["input_tokens"], meta["output_tokens"], context.budget.price(model_name(model))
        )
    pending = _pending_calls(reply)
    return {
        **({"plan": plan} if plan is not None else {}),
        "history": [reply],
        "pending": dump_pending(pending),
        "usage": usage.model_dump(mode="json"),
        "step": state.get("step", 0) + 1,
        "feedback": [],
        "phase": Phase.WAITING_TOOLS.value if pending else Phase.VERIFYING.value,
        # Asking for tools again is new work: the count of refused final answers starts over.
        **({"refused_answers": 0} if pending else {}),
    }
