"""Handoff: a payments specialist takes ownership as a subgraph, sharing budget and journal."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from rich.console import Console

from loopwright.core.budget import Budget, Price
from loopwright.core.state import StopReason
from loopwright.nodes.agents import AgentProfile
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.timeline import render_run
from loopwright_refunds.procedure import RefundProcedure
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, decide, principal

pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)

REFUND = {"order_id": "O-42", "amount": "100.00", "currency": "USD", "reason": "eligible"}
PAYMENTS = AgentProfile(
    name="payments",
    tools=("get_order", "submit_refund", "get_refund_status"),
    instructions="You make and confirm refunds the triage agent found eligible.",
    model=ScriptedChatModel(policy=RefundProcedure(), model_name="scripted-payments"),
)
PRIMARY = AgentProfile(
    name="primary", tools=("get_order", "get_policy"), can_hand_off_to=("payments",)
)
# The runner hosts the refund agent with these specialists: each brings its own handoff tool.
AGENTS = {"primary": PRIMARY, "payments": PAYMENTS}


def triage(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Reads the order and the policy, then hands the refund to the payments agent."""
    answered = sum(isinstance(m, ToolMessage) for m in messages)
    steps: list[tuple[str, dict[str, Any]]] = [
        ("get_order", {"order_id": "O-42"}),
        ("get_policy", {}),
        ("handoff_to_payments", {"reason": "eligible; a refund is needed"}),
    ]
    return Decision(tool_calls=[steps[answered]])


def refunds_itself(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="I may not refund; someone else must.")
    return Decision(tool_calls=[("submit_refund", REFUND)])


def test_specialist_takes_over_with_its_own_tools_and_the_shared_journal(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    model = ScriptedChatModel(policy=triage)
    with open_test_runner(model=model, agents=AGENTS) as runner:
        waiting = runner.start(DEMO_TASK, principal())
        outcome = approve(runner, waiting)
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason == StopReason.COMPLETED
    assert state["owner"] == "payments"
    [record] = state["handoffs"]
    assert (record["from"], record["to"]) == ("primary", "payments")
    # One journal, one budget: the specialist's refund is the run's, counted in the run's usage.
    [action] = outcome.actions
    assert action.tool == "submit_refund" and action.status == "SUCCEEDED"
    assert state["usage"]["model_requests"] == 3 + 3
    assert len(list_refunds(services, "O-42")) == 1


def test_the_specialists_tokens_are_priced_at_its_own_models_price(
    open_test_runner: RunnerFactory,
) -> None:
    """Only the specialist's model has a price here: the run's cost is its tokens, nothing else."""
    price = Price(input_per_mtok=3.0, output_per_mtok=15.0)
    budget = Budget(prices={"scripted-payments": price})
    model = ScriptedChatModel(policy=triage)
    with open_test_runner(model=model, agents=AGENTS, budget=budget) as runner:
        outcome = approve(runner, runner.start(DEMO_TASK, principal()))
        state = runner.state(outcome.run_id)
    replies = [m for m in state["history"] if isinstance(m, AIMessage)]
    specialist = [
        m.usage_metadata
        for m in replies
        if m.response_metadata.get("model_name") == "scripted-payments" and m.usage_metadata
    ]
    assert len(specialist) == 3 and len(replies) == 6
    expected = sum(price.cost(u["input_tokens"], u["output_tokens"]) for u in specialist)
    assert expected > 0
    assert state["usage"]["cost_usd"] == pytest.approx(expected)


def test_the_primary_agent_cannot_use_the_specialists_tools(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    model = ScriptedChatModel(policy=refunds_itself)
    with open_test_runner(model=model, agents=AGENTS) as runner:
        outcome = runner.start(DEMO_TASK, principal())
        answer = runner.state(outcome.run_id)["history"][2]
    assert isinstance(answer, ToolMessage) and "tool_not_allowed_now" in str(answer.content)
    assert outcome.actions == []
    assert list_refunds(services, "O-42") == []


def test_the_timeline_shows_the_specialists_steps_after_the_handoff(
    open_test_runner: RunnerFactory,
) -> None:
    """`show` reads the specialist's steps from its subgraph's checkpoints, in the order they
    ran, numbered on from the primary agent's, as the run printed them live."""
    live: list[str] = []
    with open_test_runner(model=ScriptedChatModel(policy=triage), agents=AGENTS) as runner:
        waiting = runner.start(DEMO_TASK, principal(), on_step=lambda node, _: live.append(node))
        outcome = runner.resume(
            waiting.run_id, decide(waiting), on_step=lambda node, _: live.append(node)
        )
        shown = io.StringIO()
        render_run(runner, outcome.run_id, Console(file=shown, width=200, soft_wrap=True))
    steps = re.findall(r"^\s*(\d+) (\w+)\s+(.*)$", shown.getvalue(), re.MULTILINE)
    assert [node for _, node, _ in steps] == live
    assert [int(number) for number, _, _ in steps] == list(range(1, len(live) + 1))
    by_node = [(node, line) for _, node, line in steps]
    handoff = by_node.index(
        ("handoff", "passes the run from primary to payments: eligible; a refund is needed")
    )
    after = [node for node, _ in by_node[handoff + 1 :]]
    assert after[:5] == ["compile_context", "model_step", "validate", "approval", "validate"]
    assert after[-1] == "verify"
