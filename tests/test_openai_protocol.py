"""The refund scenario through `ChatOpenAI` against a real OpenAI-compatible HTTP endpoint.

The endpoint is the local stub (`tests/openai_server.py`), which plays the refund procedure and
refuses, as OpenAI does, any request that breaks the protocol. These tests look at the exact
requests the runtime sent: protocol items carried across tool steps, streams assembled before
anything runs, usage and cost taken from the answers. The model protocol does not depend on the
database, so these runs use SQLite only; the persistence tests cover every backend.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from loopwright.core.budget import Budget, Price
from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import RunState
from loopwright_refunds.agent import agent as refunds_agent
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.openai_server import FRAGMENT_CHARS, MODEL, ModelFactory, OpenAIStub, ReadsTogether
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, principal

# The stub's fixtures, bound here so that pytest finds them in this module.

PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0)
PRICED = Budget(prices={MODEL: PRICE})
# What a cut-off stream delivers of get_order's arguments: all but the closing brace. A partial-
# JSON parser reads it as the complete call {"order_id": "O-42"}.
CUT_ARGUMENTS = '{"order_id": "O-42"'


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def run_refund(open_test_runner: RunnerFactory, model: BaseChatModel) -> RunState:
    """The demo task to the end: the refund is approved when asked for; must complete."""
    with open_test_runner(model=model, budget=PRICED) as runner:
        outcome = runner.start(DEMO_TASK, principal())
        assert outcome.phase == "WAITING_APPROVAL", outcome.stop_detail
        outcome = approve(runner, outcome)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        return runner.state(outcome.run_id)


def assert_usage_is_the_servers(state: RunState, stub: OpenAIStub) -> None:
    """B holds exactly the usage the server reported, priced; V names the model and prompt."""
    sent_in = sum(tokens for tokens, _ in stub.usages)
    sent_out = sum(tokens for _, tokens in stub.usages)
    usage = state["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (sent_in, sent_out)
    assert usage["model_requests"] == len(stub.usages)
    assert usage["cost_usd"] == pytest.approx(PRICE.cost(sent_in, sent_out))
    assert usage["cost_usd"] > 0
    assert state["versions"]["model_id"] == MODEL
    assert state["versions"]["prompt_version"] == refunds_agent.prompt_version


def of_type(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item.get("type") == kind]


def test_responses_api_carries_reasoning_and_calls_across_tool_steps(
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
    services: ServiceEndpoints,
) -> None:
    openai_stub.policy = ReadsTogether()  # two function calls in the first answer

    state = run_refund(open_test_runner, openai_model("responses"))

    assert len(list_refunds(services, "O-42")) == 1
    recorded = openai_stub.recorded
    assert [r.status for r in recorded] == [200] * 4  # reads, submit, status, answer
    first, second, last = recorded[0], recorded[1], recorded[-1]
    assert first.answer is not None
    reasoning = first.answer["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
    calls = first.calls
    assert [c.name for c in calls] == ["get_order", "get_policy"]
    # The request after the tool step: the answer's items as they came, then one output per call.
    task_and_after = second.body["input"][1:]
    assert task_and_after[0] == {"role": "user", "content": DEMO_TASK, "type": "message"}
    assert task_and_after[1] == reasoning  # id and opaque encrypted_content, byte for byte
    assert [(i["type"], i["call_id"], i["name"], i["arguments"]) for i in task_and_after[2:4]] == [
        ("function_call", c.call_id, c.name, c.arguments) for c in calls
    ]
    outputs = task_and_after[4:]
    assert [(o["type"], o["call_id"]) for o in outputs] == [
        ("function_call_output", c.call_id) for c in calls
    ]
    assert parse_tool_content(outputs[0]["output"]).result["order_id"] == "O-42"
    # Every reasoning item ever returned is still carried on the last step.
    assert of_type(last.body["input"], "reasoning") == [
        r.answer["output"][0] for r in recorded[:-1] if r.answer is not None
    ]
    # Stateless: the checkpoint, not the provider, holds the conversation.
    for body in openai_stub.requests():
        assert body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["reasoning"] == {"effort": "low"}
    assert_usage_is_the_servers(state, openai_stub)


def test_chat_completions_answers_every_tool_call_by_its_id(
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
    services: ServiceEndpoints,
) -> None:
    openai_stub.policy = ReadsTogether()

    state = run_refund(open_test_runner, openai_model("chat"))

    assert len(list_refunds(services, "O-42")) == 1
    recorded = openai_stub.recorded
    assert [r.status for r in recorded] == [200] * 4
    calls = recorded[0].calls
    messages = recorded[1].body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in messages[2]["tool_calls"]
    ] == [(c.call_id, c.name, json.loads(c.arguments)) for c in calls]
    assert [m["tool_call_id"] for m in messages[3:]] == [c.call_id for c in calls]
    assert all(r.path == "/v1/chat/completions" for r in recorded)
    assert_usage_is_the_servers(state, openai_stub)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_streamed_arguments_are_whole_before_anything_runs(
    api: str,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
) -> None:
    openai_stub.policy = ReadsTogether()  # two streamed calls in one answer

    state = run_refund(open_test_runner, openai_model(api, stream=True))

    assert all(body["stream"] for body in openai_stub.requests())
    assert [len(r.calls) for r in openai_stub.recorded] == [2, 1, 1, 0]
    sent = [call for r in openai_stub.recorded for call in r.calls]
    assert [c.name for c in sent] == [
        "get_order",
        "get_policy",
        "submit_refund",
        "get_refund_status",
    ]
    # Every call with arguments crossed the wire in several fragments ...
    assert all(len(c.arguments) > FRAGMENT_CHARS for c in sent if c.arguments != "{}")
    # ... and what the runtime decided and answered is exactly the whole calls.
    history = state["history"]
    decided = [tc for m in history if isinstance(m, AIMessage) for tc in m.tool_calls]
    assert [(tc["id"], tc["name"], tc["args"]) for tc in decided] == [
        (c.call_id, c.name, json.loads(c.arguments)) for c in sent
    ]
    answered = [m.tool_call_id for m in history if isinstance(m, ToolMessage)]
    assert answered == [c.call_id for c in sent]
    # Usage arrives only at the end of a stream (Chat Completions: only when asked for).
    assert_usage_is_the_servers(state, openai_stub)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_cut_off_stream_runs_nothing_and_stops_typed(
    api: str,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
) -> None:
    model = openai_model(api, stream=True)
    openai_stub.cut_next_stream(after_chars=len(CUT_ARGUMENTS))

    with open_test_runner(model=model, budget=PRICED) as runner:
        outcome = runner.start(DEMO_TASK, principal())
        state = runner.state(outcome.run_id)

    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "tool_unavailable")
    assert "IncompleteModelOutput" in outcome.stop_detail
    assert openai_stub.statuses == [200]  # one request: a protocol failure is not retried
    assert [type(m) for m in state["history"]] == [HumanMessage]  # no decision recorded
    assert not state.get("pending") and state["evidence"] == [] and outcome.actions == []
    assert state.get("usage", {}).get("tool_calls", 0) == 0


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_without_the_guard_a_cut_off_stream_reads_as_a_whole_call(
    api: str, openai_stub: OpenAIStub
) -> None:
    """Why `StrictChatOpenAI` exists: plain `ChatOpenAI` turns the same cut stream into a call."""
    plain = ChatOpenAI(
        model=MODEL,
        base_url=openai_stub.url,
        api_key="sk-test",
        streaming=True,
        use_responses_api=api == "responses",
    )
    openai_stub.cut_next_stream(after_chars=len(CUT_ARGUMENTS))
    schemas = [c.openai_schema() for c in refunds_agent.tools]

    reply = plain.bind_tools(schemas).invoke([HumanMessage(content=DEMO_TASK)])

    assert [(tc["name"], tc["args"]) for tc in reply.tool_calls] == [
        ("get_order", {"order_id": "O-42"})
    ]


def test_the_stub_refuses_what_openai_refuses(
    openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    """The referee is not vacuous: a call sent back without its reasoning item, or without its
    output, is a 400, so the runs above completing means they carried both."""
    model = openai_model("responses").bind_tools([c.openai_schema() for c in refunds_agent.tools])
    task = HumanMessage(content=DEMO_TASK)
    first = model.invoke([task])
    assert isinstance(first, AIMessage) and isinstance(first.content, list)
    output = ToolMessage(content="{}", tool_call_id=first.tool_calls[0]["id"])
    blocks = [b for b in first.content if isinstance(b, dict) and b.get("type") != "reasoning"]
    without_reasoning = first.model_copy(update={"content": blocks})

    with pytest.raises(openai.BadRequestError, match="without its required 'reasoning' item"):
        model.invoke([task, without_reasoning, output])
    with pytest.raises(openai.BadRequestError, match="No tool output found"):
        model.invoke([task, first])
    model.invoke([task, first, output])
    assert openai_stub.statuses == [200, 400, 400, 200]
