"""Compaction: a long run in a small context keeps calls whole, cites evidence, never blurs plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from loopwright.core.budget import Budget
from loopwright.core.compaction import estimate_tokens
from loopwright.testing.scripted import Decision, ScriptedChatModel
from tests.runtime_fixtures import RunnerFactory, decide, principal

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

TASK = "Read orders O-42, O-43 and O-44 a few times, then refund order O-42 if you can."
READS = 12
CONTEXT_TOKENS = 700


class ReadsThenRefunds:
    """Reads the orders in turn, then asks for a refund; records every context it is shown."""

    def __init__(self) -> None:
        self.seen: list[list[BaseMessage]] = []

    def __call__(
        self, messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        self.seen.append(list(messages))
        steps = len(self.seen) - 1
        if steps < READS:
            return Decision(
                tool_calls=[("get_order", {"order_id": ("O-42", "O-43", "O-44")[steps % 3]})]
            )
        if steps == READS:
            refund = {
                "order_id": "O-42",
                "amount": "100.00",
                "currency": "USD",
                "reason": "eligible",
            }
            return Decision(tool_calls=[("submit_refund", refund)])
        return Decision(content="The refund was not approved; nothing was refunded.")


def assert_calls_whole(messages: Sequence[BaseMessage]) -> None:
    asked: set[str] = set()
    for message in messages:
        if isinstance(message, AIMessage):
            asked |= {str(c["id"]) for c in message.tool_calls}
        elif isinstance(message, ToolMessage):
            assert message.tool_call_id in asked, "a result shown without the call it answers"
            asked.discard(message.tool_call_id)
    assert not asked, f"calls shown without their results: {asked}"


def test_small_context_keeps_calls_whole_cites_evidence_and_never_shows_a_plan_as_done(
    open_test_runner: RunnerFactory,
) -> None:
    policy = ReadsThenRefunds()
    budget = Budget(max_context_tokens=CONTEXT_TOKENS)
    with open_test_runner(model=ScriptedChatModel(policy=policy), budget=budget) as runner:
        waiting = runner.start(TASK, principal(task=TASK))
        outcome = runner.resume(waiting.run_id, decide(waiting, "reject"))
        history = runner.state(outcome.run_id)["history"]
    # The rejected refund was the task's: told once, the model answers the same, and the run
    # says the task is not done.
    assert outcome.stop_reason == "not_done"
    assert len(policy.seen) == READS + 3

    for messages in policy.seen:
        assert isinstance(messages[0], SystemMessage)
        assert messages[1].text == TASK  # the task is always shown
        assert_calls_whole(messages[2:])
    late = policy.seen[-1]
    system = late[0].text
    # The hidden older steps are summarised with the evidence they produced.
    assert "Earlier steps, summarised" in system and "evidence ev_" in system
    assert len(late) < len(history) + 1  # it really was compacted
    shown = sum(estimate_tokens(m) for m in late[1:])
    newest = sum(estimate_tokens(m) for m in late[-2:])
    assert shown <= CONTEXT_TOKENS + newest
    # The refund was planned, then rejected: the journal's state is shown, never "done".
    assert "NOT DONE (rejected)" in system
    assert "DONE: submit_refund" not in system.replace("NOT DONE", "")
