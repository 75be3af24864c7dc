"""Typed reads of the plain-data run state, and the small updates every node builds.

Channels hold JSON-native values (see `core.state`); nodes go through these helpers so that the
parsing and the shape of common updates live in one place.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from loopwright.core.budget import Usage
from loopwright.core.protocol import ToolEnvelope, parse_tool_content, render_tool_content
from loopwright.core.state import (
    NOT_DONE_STATUSES,
    Action,
    Evidence,
    PendingCall,
    Phase,
    Principal,
    RunState,
    StopReason,
    digest,
)


def principal_of(state: RunState) -> Principal:
    return Principal.model_validate(state["principal"])


def usage_of(state: RunState) -> Usage:
    return Usage.model_validate(state.get("usage") or {})


def started_at(state: RunState) -> datetime:
    """Where the run's machine time is counted from: its start, moved on by the time it waited
    for people (approvals), so a person's wait does not spend the end-to-end deadline."""
    started = datetime.fromisoformat(state["started_at"])
    return started + timedelta(seconds=float(state.get("paused_s") or 0.0))


class EvidenceLost(RuntimeError):
    """An observation's content is not in the run's history as its digest says it was."""


def stored_evidence(evidence: Evidence) -> dict[str, Any]:
    """An observation as the run state holds it: without its content, which the history's
    answer to the same call holds already (stored once, not twice: see `evidence_of`)."""
    return evidence.model_dump(mode="json", exclude={"content"})


def evidence_of(state: RunState) -> list[Evidence]:
    """The run's observations, each with its content, read back from the history's answer to
    its call and checked against its digest. Items stored whole (by earlier releases) are
    taken as they are."""
    items = state["evidence"]
    wanted = {item["call_id"] for item in items if "content" not in item}
    answers: dict[str, list[Any]] = {}
    for message in state["history"] if wanted else ():
        if isinstance(message, ToolMessage) and message.tool_call_id in wanted:
            result = parse_tool_content(str(message.content)).result
            answers.setdefault(message.tool_call_id, []).append(result)
    out = []
    for item in items:
        if "content" not in item:
            found = [
                r for r in answers.get(item["call_id"], ()) if digest(r) == item["content_hash"]
            ]
            if not found:
                raise EvidenceLost(
                    f"{item['evidence_id']}: no answer to {item['call_id']} holds it"
                )
            item = {**item, "content": found[0]}
        out.append(Evidence.model_validate(item))
    return out


def pending_of(state: RunState) -> list[PendingCall]:
    return [PendingCall.model_validate(p) for p in state.get("pending") or []]


def actions_of(state: RunState) -> list[Action]:
    return [Action.model_validate(a) for a in (state.get("journal") or {}).values()]


def messages_of(state: RunState) -> list[BaseMessage]:
    return list(state["history"])


def dump_pending(calls: list[PendingCall]) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json") for c in calls]


def dump_actions(actions: list[Action]) -> dict[str, dict[str, Any]]:
    """A journal-projection update: merged into J by action id."""
    return {a.action_id: a.model_dump(mode="json") for a in actions}


# Where the answer to a program's call says which program made it: the model never asked for
# that call and is not shown its answer (it sees what the program returns).
PROGRAM_KEY = "loopwright_program"


def tool_result(call: PendingCall, envelope: ToolEnvelope) -> ToolMessage:
    """The protocol item that answers one tool call, rendered as untrusted data."""
    return ToolMessage(
        content=render_tool_content(call.tool, call.call_id, envelope),
        tool_call_id=call.call_id,
        name=call.tool,
        status="error" if envelope.status == "error" else "success",
        additional_kwargs={PROGRAM_KEY: call.program} if call.program else {},
    )


def program_of_message(message: BaseMessage) -> str | None:
    """The program action whose call `message` answers, if a program's."""
    return message.additional_kwargs.get(PROGRAM_KEY) if isinstance(message, ToolMessage) else None


# Suffixes validate adds to a write's intent key: an approver's edit, a plan made anew after a
# stale one. The intent is the same business effect; its latest action is where it stands.
_REVISION = re.compile(r"(:edit-[0-9]+|:replan-[0-9]+)+$")


def latest_per_intent(actions: list[Action]) -> list[Action]:
    """Each business intent's latest action (actions in the journal's sequence), edits and replans
    folded into the intent they revise."""
    latest: dict[str, Action] = {}
    for action in actions:
        latest[_REVISION.sub("", action.intent_key)] = action
    return list(latest.values())


def not_done(actions: list[Action]) -> list[Action]:
    """The intents the run planned that did not happen (failed, rejected, cancelled, escalated
    in their latest action)."""
    return [a for a in latest_per_intent(actions) if a.status in NOT_DONE_STATUSES]


# Refusals of how a call was made, not of what it asked for: the model can put them right by
# asking again, and no business rule said no (an intent the journal has is answered from it).
FORM_REFUSALS = frozenset(
    {"invalid_arguments", "unknown_tool", "tool_not_allowed_now", "duplicate_intent"}
)


def why_not(action: Action) -> str:
    error = (action.outcome or {}).get("error") or {}
    reason = ": ".join(str(x) for x in (error.get("code"), error.get("detail")) if x)
    return f"{action.tool} {action.action_id} {action.status}" + (f" ({reason})" if reason else "")


def stop(reason: StopReason, detail: str) -> dict[str, Any]:
    """The update that ends a run as INCOMPLETE with a typed reason."""
    return {"phase": Phase.INCOMPLETE.value, "stop_reason": reason.value, "stop_detail": detail}
