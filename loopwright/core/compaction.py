"""Fit the model's context into its token budget without breaking the protocol or the truth.

The history is cut into exchanges: one model decision and the tool results that answer it. The
task message and the newest exchanges are kept whole, as many as fit; an exchange is never split,
so the model never sees a call without its result. Older exchanges are replaced by a summary
written from facts only (tool, arguments, status, error code, evidence ids), never from the
untrusted text the tools returned, so it can stand in the trusted part of the context. What is
done, planned or unknown is not summarised at all: it comes from the journal, every time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import canonical_json

# The characters of an AI message's tool calls, by the message's id: (how many calls, chars).
# Spelling every call's arguments is what an estimate costs, and each step estimates the whole
# history again, so a long run spelled its decisions over and over (0.83 ms a step at 400
# steps). History only grows, and a message never changes under its id; the count of calls
# guards against an id used again for another message. Emptied when full.
_CALL_CHARS: dict[str, tuple[int, int]] = {}
CALL_CHARS_KEPT = 65_536


def estimate_tokens(message: BaseMessage) -> int:
    """About four characters a token, the same rough rule as the scripted model's usage."""
    size = len(str(message.content))
    if isinstance(message, AIMessage) and message.tool_calls:
        size += _call_chars(message)
    return size // 4 + 1


def _call_chars(message: AIMessage) -> int:
    calls = len(message.tool_calls)
    known = _CALL_CHARS.get(message.id) if message.id else None
    if known is not None and known[0] == calls:
        return known[1]
    chars = sum(len(canonical_json(c["args"])) + len(c["name"]) for c in message.tool_calls)
    if message.id:
        if len(_CALL_CHARS) >= CALL_CHARS_KEPT:
            _CALL_CHARS.clear()
        _CALL_CHARS[message.id] = (calls, chars)
    return chars


@dataclass(frozen=True)
class Window:
    start: int  # index into history of the first message shown whole (after the task)
    summary: str  # what the older, hidden exchanges did, citing evidence ids


def exchange_starts(history: Sequence[BaseMessage]) -> list[int]:
    return [i for i, m in enumerate(history) if isinstance(m, AIMessage)]


def choose_window(
    history: Sequence[BaseMessage],
    budget_tokens: int,
    evidence: Sequence[Mapping[str, Any]],
) -> Window:
    """The newest whole exchanges that fit `budget_tokens` (the task always shown), and a summary
    of the rest. `evidence`: the run's evidence records, each naming the tool call it came from
    (`call_id`) and its id (`evidence_id`)."""
    starts = exchange_starts(history)
    if not starts:
        return Window(start=1, summary="")
    used = estimate_tokens(history[0])
    start = len(history)
    for begin in reversed(starts):
        cost = sum(estimate_tokens(m) for m in history[begin:start])
        if used + cost > budget_tokens and start != len(history):
            break
        used += cost
        start = begin
    return Window(start=start, summary=summarize(history[1:start], evidence))


def summarize(older: Sequence[BaseMessage], evidence: Sequence[Mapping[str, Any]]) -> str:
    if not older:
        return ""
    evidence_ids = {e["call_id"]: e["evidence_id"] for e in evidence}
    answered: dict[str, ToolMessage] = {
        m.tool_call_id: m for m in older if isinstance(m, ToolMessage)
    }
    lines = []
    for message in older:
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            lines.append(
                f"- {call['name']}({_args(call['args'])}): {_outcome(answered.get(str(call['id'])), evidence_ids.get(str(call['id'])))}"
            )
    return "Earlier steps, summarised (details in the cited evidence):\n" + "\n".join(lines)


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(args.items()))


def _outcome(result: ToolMessage | None, evidence_id: str | None) -> str:
    if result is None:
        return "no result recorded"
    envelope = parse_tool_content(str(result.content))
    if envelope.status == "ok":
        return f"ok, evidence {evidence_id}" if evidence_id else "ok"
    if envelope.status == "unknown":
        return "outcome unknown at the time (see task state)"
    return f"error {(envelope.error or {}).get('code', 'unknown_error')}"
