"""The desk's scripted model: read the slot, book it, confirm it, say so (a module named like
LangGraph's own top-level module, on purpose)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loopwright import Decision, parse_tool_content

SLOT_IN_TASK = re.compile(r"\bslot ([0-9]{1,4})\b")
GUEST_IN_TASK = re.compile(r"\b(g-[0-9]{1,4})\b")


def book_then_confirm(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    task = next(m.text for m in messages if isinstance(m, HumanMessage))
    slot_match, guest_match = SLOT_IN_TASK.search(task), GUEST_IN_TASK.search(task)
    if slot_match is None or guest_match is None:
        return Decision(content="Name a slot and a guest, please.")
    slot, guest = slot_match[1], guest_match[1]
    names = {c["id"]: c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    results: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ToolMessage):
            results[names.get(message.tool_call_id, "")] = parse_tool_content(message.text)
    if "get_slot" not in results:
        return Decision(tool_calls=[("get_slot", {"slot": slot})])
    for tool, args in (
        ("book", {"slot": slot, "guest": guest}),
        ("confirm", {"slot": slot, "guest": guest}),
    ):
        if tool not in results:
            return Decision(tool_calls=[(tool, args)])
        if results[tool].status != "ok":
            return Decision(content=f"{tool} did not go through: {results[tool].error}")
    booking = results["book"].result["booking_id"]
    confirmation = results["confirm"].result["confirmation_id"]
    return Decision(content=f"Booked slot {slot} for {guest} ({booking}, {confirmation}).")
