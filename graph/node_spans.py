"""The span of each node step (`traced_node`): what the step committed, so that a trace answers
what the agent decided, what it did, what happened in the business system, and why it stopped,
without the model's text: the model's decision (tool, call id, argument digest), validation
verdicts, approvals (who, which digest, when), evidence ids, budget usage, the verification, the
stop reason; an interrupt (approval, parked reconciliation) as an event. The graph wraps each
node in one (`graph.build`).

Nothing here changes what a node returns or raises.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.messages import AIMessage
from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from opentelemetry.trace import Span

from loopwright.core.state import PendingCall, RunState, digest
from loopwright.observability.attributes import Attributes, args_attributes, usage_attributes
from loopwright.observability.tracing import NODE_SPAN_PREFIX, active_tracer, span
from loopwright.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from loopwright.nodes.context import RunContext


class Node(Protocol):
    """A node function of the loop, as LangGraph calls it."""

    def __call__(self, state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]: ...


def _sensitive(tools: ToolRegistry, name: str) -> frozenset[str]:
    contract = tools.get(name)
    return frozenset(contract.sensitive) if contract is not None else frozenset()


def _approval_digest(tools: ToolRegistry, tool: str, digest: str) -> Attributes:
    """An approval's digest, unless it was taken over sensitive arguments (see redaction)."""
    return {} if _sensitive(tools, tool) else {"loopwright.digest": digest}


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
        attributes |= usage_attributes(update["usage"])
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


def _note_decision(opened: Span, message: AIMessage, tools: ToolRegistry) -> None:
    for call in message.tool_calls:
        attributes: Attributes = {
            "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": str(call["id"]),
            **args_attributes(call["args"], _sensitive(tools, call["name"])),
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
