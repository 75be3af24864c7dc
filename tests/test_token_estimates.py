"""Token estimates of a growing history: every step estimates the whole history again, so an AI
message's calls are spelled once (by its id), not at every step; the estimates stay the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loopwright.core import compaction
from loopwright.core.compaction import choose_window, estimate_tokens


@pytest.fixture
def spelled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The arguments `compaction` spells as JSON, in order; its memory starts empty."""
    calls: list[Any] = []
    real = compaction.canonical_json

    def counting(value: Any) -> str:
        calls.append(value)
        return real(value)

    monkeypatch.setattr(compaction, "canonical_json", counting)
    monkeypatch.setattr(compaction, "_CALL_CHARS", {})
    yield calls


def history(steps: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [HumanMessage("Read the orders.", id="task")]
    for n in range(steps):
        call = {"name": "get_order", "args": {"order_id": f"O-{n}"}, "id": f"call-{n}"}
        messages += [
            AIMessage("", tool_calls=[call], id=f"decision-{n}"),
            ToolMessage(f"order O-{n}: delivered", tool_call_id=f"call-{n}", id=f"result-{n}"),
        ]
    return messages


def test_a_decision_is_spelled_once_however_many_steps_estimate_it(spelled: list[Any]) -> None:
    messages = history(30)
    first = choose_window(messages, 10**9, [])
    assert len(spelled) == 30
    for _ in range(3):
        assert choose_window(messages, 10**9, []) == first
    assert len(spelled) == 30, "the history's decisions were spelled again"
    # The next step spells only the new decision.
    grown = messages + history(31)[-2:]
    choose_window(grown, 10**9, [])
    assert len(spelled) == 31


def test_estimates_are_the_same_remembered_or_not(spelled: list[Any]) -> None:
    messages = history(5)
    remembered = [estimate_tokens(m) for m in messages] + [estimate_tokens(m) for m in messages]
    compaction._CALL_CHARS.clear()
    fresh = [estimate_tokens(m) for m in messages]
    assert remembered == fresh + fresh


def test_an_id_used_again_for_other_calls_is_estimated_anew(spelled: list[Any]) -> None:
    one = AIMessage("", tool_calls=[{"name": "a", "args": {}, "id": "c1"}], id="same")
    two_calls = [
        {"name": "a", "args": {}, "id": "c1"},
        {"name": "bb", "args": {"x": 1}, "id": "c2"},
    ]
    two = AIMessage("", tool_calls=two_calls, id="same")
    assert estimate_tokens(two) > estimate_tokens(one)
    assert estimate_tokens(one) == estimate_tokens(AIMessage("", tool_calls=one.tool_calls))
