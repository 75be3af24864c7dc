"""History and evidence are appended to at every step: an append asks only the new items for
their keys, and still adds nothing it already holds (a node run again, a subgraph handing back
the history it was given)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from loopwright.core import state
from loopwright.core.state import append_evidence, append_messages


class CountingKey:
    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, item: dict[str, Any]) -> str:
        self.asked += 1
        return str(item["evidence_id"])


def evidence(n: int) -> dict[str, Any]:
    return {"evidence_id": f"ev-{n}", "call_id": f"call-{n}"}


def test_an_append_asks_only_the_new_items_for_their_keys() -> None:
    key = CountingKey()
    held = state._append_new([], [[evidence(n) for n in range(100)]], key)
    assert key.asked == 100
    for n in range(100, 110):
        held = state._append_new(held, [[evidence(n)]], key)
    assert key.asked == 110, "each append asked the whole list again"
    assert [e["evidence_id"] for e in held] == [f"ev-{n}" for n in range(110)]


def test_known_items_are_not_added_twice() -> None:
    history = append_messages([], [[HumanMessage("task", id="m-0")]])
    decision = AIMessage("", id="m-1")
    history = append_messages(history, [[decision]])
    again = append_messages(history, [[*history, AIMessage("", id="m-2")]])  # handed back whole
    assert [m.id for m in again] == ["m-0", "m-1", "m-2"]
    assert append_evidence(append_evidence([], [[evidence(1)]]), [[evidence(1)]]) == [evidence(1)]


def test_a_list_changed_in_place_is_asked_again() -> None:
    held = append_evidence([], [[evidence(1)]])
    held.append(evidence(2))  # not how LangGraph changes a channel, but never trusted stale
    assert append_evidence(held, [[evidence(2), evidence(3)]]) == [evidence(n) for n in (1, 2, 3)]


def test_an_appended_list_is_stored_and_compared_as_a_list() -> None:
    held = append_evidence([], [[evidence(1)]])
    assert held == [evidence(1)] and isinstance(held, list)
    serde = JsonPlusSerializer()
    assert type(serde.loads_typed(serde.dumps_typed(held))) is list
