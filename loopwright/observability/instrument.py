"""What the runtime puts on its spans: a trace that answers what the agent decided, what it did,
what happened in the business system, and why it stopped, without the model's text.

* `traced_node`: a `node NAME` span per node step, with what the step committed: the model's
  decision (tool, call id, argument digest), validation verdicts, approvals (who, which digest,
  when), evidence ids, budget usage, the verification, the stop reason; an interrupt (approval,
  parked reconciliation) as an event.
* `model_span` / `note_model_reply`: a `chat MODEL` span around the model call, with the
  OpenTelemetry GenAI attributes trace viewers read (operation, provider, requested and
  answering model, token usage, finish reasons, the request's temperature and token limit where
  the model says them), the prompt version, latency (the span's duration) and error class. No
  message content: the prompt holds what tools returned, arguments marked sensitive included.
* `tool_span`: an `execute_tool NAME` span per tool call: schema hash, argument digest (the
  arguments themselves only with raw capture, sensitive fields always redacted), and for writes
  the action id, intent key and attempt.
* `TracedJournal`: every journal status change, whoever makes it (the executor, reconcile,
  validate, guard), as a `journal.transition` event on the span current at that moment.

Nothing here changes what a node returns or raises.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel

from loopwright.checkpoints.journal import ActionJournal, JournalWrapper
from loopwright.core.state import (
    UNRESOLVED_STATUSES,
    Action,
    ActionStatus,
    PendingCall,
    RunState,
    canonical_json,
    digest,
)
from loopwright.nodes.context import model_name
from loopwright.observability.redaction import redact, redacted_digest
from loopwright.observability.tracing import (
    NODE_SPAN_PREFIX,
    active_tracer,
    capture_raw_args,
    span,
)
from loopwright.outcome import RunOutcome
from loopwright.tools.contract import ToolContract
from loopwright.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from loopwright.nodes.context import RunContext


class Node(Protocol):
    """A node function of the loop, as LangGraph calls it."""

    def __call__(self, state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]: ...


Attributes = dict[str, AttributeValue]
# Actions a person may have to look at: outcome not confirmed, or escalated.
_UNSETTLED = UNRESOLVED_STATUSES | {ActionStatus.ESCALATED}
# Journal event details that say why a status moved; the others (a pre-image) are business data.
_DETAIL_KEYS = ("reason", "reconciled", "stage", "approval_id", "approver", "version")


def _args(args: Mapping[str, Any], sensitive: frozenset[str]) -> Attributes:
    """The digest of a call's arguments, and the (redacted) arguments with raw capture on."""
    attributes: Attributes = {"loopwright.tool.args_digest": redacted_digest(args, sensitive)}
    if capture_raw_args():
        attributes["loopwright.tool.args"] = canonical_json(redact(args, sensitive))
    return attributes


def _sensitive(tools: ToolRegistry, name: str) -> frozenset[str]:
    contract = tools.get(name)
    return frozenset(contract.sensitive) if contract is not None else frozenset()


def _approval_digest(tools: ToolRegistry, tool: str, digest: str) -> Attributes:
    """An approval's digest, unless it was taken over sensitive arguments (see redaction)."""
    return {} if _sensitive(tools, tool) else {"loopwright.digest": digest}


# --- node steps ------------------------------------------------------------------------------


def traced_node(name: str, node: Node) -> Node:
    """`node`, run inside a `node NAME` span that records what the step committed."""

    @functools.wraps(node)
    def traced(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        if active_tracer() is None:
            return node(state, runtime)
        attributes: Attributes = {"loopwright.node": name, "loopwright.step": state.get("step", 0)}
        with span(
            f"{NODE_SPAN_PREFIX}{name}", run_id=state.get("run_id"), attributes=attributes
        ) as opened:
            try:
                update = node(state, runtime)
            except GraphInterrupt as interrupted:
                _note_interrupts(opened, interrupted, runtime.context.tools)
                raise
            _note_update(opened, name, state, update, runtime.context.tools)
            return update

    return traced


def _note_interrupts(opened: Span, interrupted: GraphInterrupt, tools: ToolRegistry) -> None:
    for pending in interrupted.args[0] if interrupted.args else ():
        value = pending.value if isinstance(pending.value, dict) else {}
        keys = ("kind", "approval_id", "action_id", "retry_at")
        attributes: Attributes = {f"loopwright.{k}": str(value[k]) for k in keys if k in value}
        if "digest" in value:
            attributes |= _approval_digest(tools, str(value.get("tool")), str(value["digest"]))
        opened.add_event("interrupt", attributes)


def _note_update(
    opened: Span, node: str, state: RunState, update: dict[str, Any], tools: ToolRegistry
) -> None:
    attributes: Attributes = {}
    if update.get("phase"):
        attributes["loopwright.phase"] = str(update["phase"])
    if update.get("stop_reason"):
        attributes["loopwright.stop_reason"] = str(update["stop_reason"])
        attributes["loopwright.stop_detail"] = str(update.get("stop_detail", ""))
    if update.get("usage"):
        attributes |= _usage(update["usage"])
    if update.get("evidence"):
        attributes["loopwright.evidence_ids"] = [e["evidence_id"] for e in update["evidence"]]
    if update.get("verification"):
        verification = update["verification"]
        writes = verification.get("facts", {}).get("writes", [])
        attributes["loopwright.verified"] = bool(verification.get("verified"))
        attributes["loopwright.verified_action_ids"] = [w["action_id"] for w in writes]
        attributes["loopwright.verification.problems"] = len(verification.get("problems", []))
    opened.set_attributes(attributes)
    for message in update.get("history") or []:
        if isinstance(message, AIMessage):
            _note_decision(opened, message, tools)
    if node == "validate":
        for raw in update.get("pending") or []:
            _note_verdict(opened, PendingCall.model_validate(raw), tools)
        _note_program(opened, update)
    pending = state.get("pending") or []
    decided = {r["approval_id"] for r in state.get("approvals") or []}
    asked = {c["approval"]["approval_id"]: c["tool"] for c in pending if c.get("approval")}
    for record in update.get("approvals") or []:
        if record["approval_id"] not in decided:
            tool = asked.get(record["approval_id"], "")
            opened.add_event(
                "approval",
                {
                    "loopwright.approval_id": record["approval_id"],
                    "loopwright.action_id": record["action_id"],
                    "loopwright.decision": record["decision"],
                    "loopwright.approver": record["approver"],
                    "loopwright.decided_at": record["decided_at"],
                    **_approval_digest(tools, tool, record["digest"]),
                },
            )


def _note_program(opened: Span, update: dict[str, Any]) -> None:
    """A program action where validate left it (its source's digest, where it stands, how many
    calls it made, the one it waits on), and each skill the run loaded, with its version."""
    program = update.get("program")
    if program:
        calls = program.get("calls") or []
        attributes: Attributes = {
            "loopwright.program.call_id": program["call_id"],
            "loopwright.program.status": program["status"],
            "loopwright.program.source_digest": digest(program["source"])[:16],
            "loopwright.program.sandbox": program["sandbox"],
            "loopwright.program.calls": len(calls),
        }
        if program.get("skill"):
            attributes["loopwright.program.skill"] = program["skill"]
        if calls and calls[-1]["outcome"] == "waiting":
            attributes["loopwright.program.waiting_on"] = calls[-1]["call_id"]
        opened.add_event("program", attributes)
    for name, version in ((update.get("versions") or {}).get("skills") or {}).items():
        opened.add_event("skill", {"loopwright.skill": name, "loopwright.skill.version": version})


def _usage(usage: Mapping[str, Any]) -> Attributes:
    return {f"loopwright.usage.{k}": v for k, v in usage.items() if isinstance(v, int | float)}


def _note_decision(opened: Span, message: AIMessage, tools: ToolRegistry) -> None:
    for call in message.tool_calls:
        attributes: Attributes = {
            "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": str(call["id"]),
            **_args(call["args"], _sensitive(tools, call["name"])),
        }
        opened.add_event("decision", attributes)
    for invalid in message.invalid_tool_calls:
        opened.add_event(
            "decision",
            {
                "gen_ai.tool.name": str(invalid.get("name")),
                "gen_ai.tool.call.id": str(invalid.get("id")),
                "loopwright.invalid": True,
            },
        )
    if not message.tool_calls and not message.invalid_tool_calls:
        opened.add_event("answer", {"loopwright.answer_chars": len(message.text)})


def _note_verdict(opened: Span, call: PendingCall, tools: ToolRegistry) -> None:
    attributes: Attributes = {
        "gen_ai.tool.name": call.tool,
        "gen_ai.tool.call.id": call.call_id,
        "loopwright.verdict": str(call.verdict or ""),
    }
    if call.error is not None:
        attributes["loopwright.error.code"] = str(call.error.get("code"))
    if call.action_id is not None:
        attributes["loopwright.action_id"] = call.action_id
    if call.program is not None:
        attributes["loopwright.program.call_id"] = call.program
    if call.approval is not None:
        attributes["loopwright.approval_id"] = call.approval.approval_id
        attributes |= _approval_digest(tools, call.tool, call.approval.digest)
    opened.add_event("verdict", attributes)


# --- model and tool calls --------------------------------------------------------------------


def model_span(model: BaseChatModel, prompt_version: str) -> AbstractContextManager[Span]:
    if active_tracer() is None:
        return nullcontext(INVALID_SPAN)
    model_id = model_name(model)
    return span(
        f"chat {model_id}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model_id,
            **_request_params(model),
            "loopwright.prompt_version": prompt_version,
        },
    )


# What LangChain says of a model's requests (`_get_ls_params`, the hook its own tracing reads),
# as the GenAI conventions name it.
_REQUEST_PARAMS = {
    "ls_temperature": "gen_ai.request.temperature",
    "ls_max_tokens": "gen_ai.request.max_tokens",
}


def _request_params(model: BaseChatModel) -> Attributes:
    """The model's provider (under the conventions' current name and the one older viewers
    read), and the temperature and token limit it asks with, where it says them."""
    try:
        params: Mapping[str, Any] = model._get_ls_params()
    except Exception:  # a model of the user's own that cannot say: the span goes without
        return {}
    attributes: Attributes = {}
    if provider := params.get("ls_provider"):
        attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = str(provider)
    for key, name in _REQUEST_PARAMS.items():
        if isinstance(value := params.get(key), int | float) and not isinstance(value, bool):
            attributes[name] = value
    return attributes


def note_model_reply(opened: Span, reply: object) -> None:
    if not opened.is_recording() or not isinstance(reply, AIMessage):
        return
    attributes: Attributes = {"loopwright.tool_calls": len(reply.tool_calls)}
    if reply.usage_metadata:
        attributes["gen_ai.usage.input_tokens"] = reply.usage_metadata["input_tokens"]
        attributes["gen_ai.usage.output_tokens"] = reply.usage_metadata["output_tokens"]
    metadata = reply.response_metadata
    if answered_by := metadata.get("model_name") or metadata.get("model"):
        attributes["gen_ai.response.model"] = str(answered_by)
    if reply.id:
        attributes["gen_ai.response.id"] = reply.id
    if finish := metadata.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = [str(finish)]
    opened.set_attributes(attributes)


def tool_span(
    contract: ToolContract,
    args: BaseModel | Mapping[str, Any],
    *,
    call_id: str,
    action: Action | None = None,
) -> AbstractContextManager[Span]:
    """The span of one tool call (a read, or one send of a write: `action`)."""
    if active_tracer() is None:
        return nullcontext(INVALID_SPAN)
    values = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
    attributes: Attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": contract.name,
        "gen_ai.tool.call.id": call_id,
        "loopwright.tool.effect": contract.effect.value,
        "loopwright.tool.schema_hash": contract.schema_hash,
        **_args(values, frozenset(contract.sensitive)),
    }
    if action is not None:
        attributes |= {
            "loopwright.action_id": action.action_id,
            "loopwright.intent_key": action.intent_key,
            "loopwright.attempt": action.attempts + 1,
        }
    return span(
        f"execute_tool {contract.name}",
        run_id=action.run_id if action is not None else None,
        attributes=attributes,
    )


# --- runs ------------------------------------------------------------------------------------


def note_run(opened: Span, outcome: RunOutcome, state: RunState) -> None:
    """Where the run stands as this process lets go of it."""
    if not opened.is_recording():
        return
    versions = state.get("versions") or {}
    unresolved = [a for a in outcome.actions if a.status in _UNSETTLED]
    opened.set_attributes(
        {
            "loopwright.phase": outcome.phase,
            "loopwright.stop_reason": outcome.stop_reason or "",
            "loopwright.stop_detail": outcome.stop_detail,
            "loopwright.model_id": versions.get("model_id", ""),
            "loopwright.prompt_version": versions.get("prompt_version", ""),
            "loopwright.interrupts": [str(i.get("kind")) for i in outcome.interrupts],
            "loopwright.unresolved_action_ids": [a.action_id for a in unresolved],
            **_usage(state.get("usage") or {}),
        }
    )


def traced_journal(journal: ActionJournal) -> ActionJournal:
    """`journal`, noting its status changes on spans when tracing is on."""
    return journal if active_tracer() is None else TracedJournal(journal)


class TracedJournal(JournalWrapper):
    """An `ActionJournal` that notes every status change as an event on the current span."""

    def _journaled(
        self, expected: ActionStatus | None, action: Action, detail: dict[str, Any] | None
    ) -> None:
        name = "journal.plan" if expected is None else "journal.transition"
        _note_move(name, expected, action, detail)


def _note_move(
    name: str, before: ActionStatus | None, action: Action, detail: Mapping[str, Any] | None
) -> None:
    current = trace.get_current_span()
    if not current.is_recording():
        return
    attributes: Attributes = {
        "loopwright.action_id": action.action_id,
        "loopwright.intent_key": action.intent_key,
        "loopwright.run_id": action.run_id,
        "gen_ai.tool.name": action.tool,
        "gen_ai.tool.call.id": action.call_id,
        "loopwright.to": action.status.value,
        "loopwright.fence": action.fence,
        "loopwright.attempts": action.attempts,
        "loopwright.at": action.updated_at.isoformat(),
    }
    if before is not None:
        attributes["loopwright.from"] = before.value
    for key in _DETAIL_KEYS:
        if detail and key in detail:
            attributes[f"loopwright.{key}"] = str(detail[key])
    current.add_event(name, attributes)
