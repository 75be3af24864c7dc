"""Slow, weak and chatty models end typed: never hang, never break a business rule, never
"complete" on garbage. Driven through the OpenAI-compatible path against the local server
(`tests/openai_server.py`), which plays what real servers and small models do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Budget, Decision, open_runner
from loopwright.runner import ModelChanged
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests import openai_server
from tests.openai_server import MODEL, ModelFactory, OpenAIStub
from tests.runtime_fixtures import RunnerFactory, all_refunds, principal

openai_stub = openai_server.openai_stub
openai_model = openai_server.openai_model

OUTSIDE_WINDOW_TASK = "Please refund 40.00 USD on my order O-44."  # delivered 90 days ago
TASK = "Check whether order O-43 can be refunded and refund it if so."


def refunds_straight_away(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    """A weak model: refunds what the user asks without reading the order or the policy."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        args = {"order_id": "O-44", "amount": "40.00", "currency": "USD", "reason": "asked"}
        return Decision(tool_calls=[("submit_refund", args)])
    return Decision(content="The refund was submitted successfully.")


def test_a_business_rule_holds_whatever_the_model_read(
    open_test_runner: RunnerFactory,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    services: ServiceEndpoints,
) -> None:
    openai_stub.policy = refunds_straight_away
    with open_test_runner(model=openai_model("chat")) as runner:
        task = OUTSIDE_WINDOW_TASK
        outcome = runner.start(task, principal(task=task))
    assert outcome.actions == []  # refused at validate: never planned, never approved, never sent
    assert all_refunds(services) == []
    state_errors = [r.body for r in openai_stub.recorded]
    assert "outside_refund_window" in str(state_errors[-1])  # the model was told the rule
    facts = (outcome.verification or {})["facts"]
    assert facts["writes"] == []  # whatever the answer says, the verification holds no refund


def test_an_endless_stream_is_cut_at_the_request_bound_and_the_run_ends_typed(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    openai_stub.stream_forever_next()
    model = openai_model("chat", stream=True)
    with open_test_runner(model=model, budget=Budget(max_model_request_s=2.0)) as runner:
        started = time.monotonic()
        outcome = runner.start(TASK, principal(task=TASK))
        took = time.monotonic() - started
        lease = runner.leases.get(outcome.run_id)
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "tool_unavailable")
    assert "ModelRequestOutlasted" in outcome.stop_detail
    assert took < 30  # cut at its 2 s bound, not left to run until the run's 300 s deadline
    assert lease is not None and not lease.lease_live  # let go: nothing holds the run
    [request] = openai_stub.requests("/chat/completions")
    assert request["max_tokens"] == Budget().max_output_tokens_per_request


def test_the_re_ask_after_a_refused_answer_never_ends_with_the_models_own_message(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    """llama.cpp refuses a request that ends with an assistant message; the runtime's feedback
    goes last, as a user-role message."""
    openai_stub.refuse_trailing_assistant = True
    openai_stub.policy = refunds_straight_away
    with open_test_runner(model=openai_model("chat")) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
    assert 400 not in openai_stub.statuses
    last = [r["messages"][-1] for r in openai_stub.requests("/chat/completions")]
    assert [m["role"] for m in last] == ["user", "tool", "user"]
    assert last[-1]["content"].startswith("[runtime feedback")
    assert outcome.stop_reason in ("not_done", "no_progress")


def written_call(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    """How a small model on a server without tool-call parsing writes a call: as text."""
    text = '```json\n{"name": "submit_refund", "arguments": {"order_id": "O-43"}}\n```'
    return Decision(content=text)


def cut_short(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    return Decision(content="Refunded 30.00 USD to or")


def test_a_call_written_as_text_or_an_answer_cut_at_the_limit_never_completes(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    openai_stub.policy = written_call
    with open_test_runner(model=openai_model("chat")) as runner:
        written = runner.start(TASK, principal(task=TASK))
    assert written.stop_reason != "completed"
    problems = (written.verification or {}).get("problems", [])
    assert any("looks like a call of submit_refund written as text" in p for p in problems)

    openai_stub.policy = cut_short
    openai_stub.truncate_next()
    with open_test_runner(model=openai_model("chat")) as runner:
        cut = runner.start(TASK, principal(task=TASK))
    assert (cut.stop_reason, cut.verification) == ("tool_unavailable", None)
    assert "cut at the output limit" in cut.stop_detail


def test_a_run_keeps_the_model_it_was_started_with(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
) -> None:
    """Approved by a process that names no model, the run goes on with its own (recorded in
    V with its settings), not with the agent's default; one naming another model is refused."""
    openai_model("chat")  # points the environment at the stub
    spec = f"openai:{MODEL}"
    task = "Check whether order O-42 can be refunded and refund it if so."  # needs approval
    with connect(services) as deps:
        with open_runner(database_url, refunds, deps=deps, model_spec=spec) as starter:
            waiting = starter.start(task, principal(task=task))
            versions = starter.state(waiting.run_id)["versions"]
            second = starter.start(task, principal(task=task))
        assert (versions["model_spec"], versions["model_settings"]["api"]) == (spec, "chat")
        asked_before = len(openai_stub.requests())
        with open_runner(database_url, refunds, deps=deps) as approver:  # names no model
            done = approver.decide(waiting.run_id, "approve", "a-1")
        assert done.stop_reason == "completed"
        assert len(openai_stub.requests()) > asked_before  # the run's own model answered
        with (
            open_runner(database_url, refunds, deps=deps, model_spec="openai:other") as other,
            pytest.raises(ModelChanged, match=f"was started with {spec}"),
        ):
            other.decide(second.run_id, "approve", "a-1")
