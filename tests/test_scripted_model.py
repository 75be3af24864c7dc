"""ScriptedChatModel behaves like a provider model: bound tools, ids, usage, streaming."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from functools import reduce
from operator import add
from typing import Any, TypedDict

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import START, StateGraph
from pydantic import SecretStr

from loopwright.models.factory import make_model
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright_refunds.agent import agent as refunds_agent
from loopwright_refunds.procedure import RefundProcedure

CALL_ID = re.compile(r"call_[0-9a-f]{12}")


def get_order(order_id: str) -> dict[str, Any]:
    """Fetch one order."""
    raise NotImplementedError


def get_policy() -> dict[str, Any]:
    """Fetch the refund policy."""
    raise NotImplementedError


class Recorder:
    """A policy that returns a fixed decision and remembers what it was shown."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.seen: list[tuple[list[BaseMessage], list[dict[str, Any]]]] = []

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        self.seen.append((list(messages), list(tools)))
        return self.decision


LOOKUP = Decision(
    content="Looking up the order and the policy.",
    tool_calls=[("get_order", {"order_id": "O-42"}), ("get_policy", {})],
)
PROMPT: list[BaseMessage] = [
    SystemMessage("You handle refunds."),
    HumanMessage("Check whether order O-42 can be refunded and refund it if so."),
]


def as_chunks(messages: Iterable[BaseMessage]) -> list[AIMessageChunk]:
    chunks = list(messages)
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    return [c for c in chunks if isinstance(c, AIMessageChunk)]


def aggregate(chunks: Sequence[AIMessageChunk]) -> AIMessageChunk:
    return reduce(add, chunks)


def test_invoke_with_bound_tools_returns_deterministic_calls_and_usage() -> None:
    policy = Recorder(LOOKUP)
    model = ScriptedChatModel(policy=policy)
    bound = model.bind_tools([get_order, get_policy])

    first = bound.invoke(PROMPT)
    second = bound.invoke(PROMPT)

    assert [tool["function"]["name"] for tool in policy.seen[0][1]] == ["get_order", "get_policy"]
    assert policy.seen[0][1][0]["type"] == "function"
    assert [(tc["name"], tc["args"]) for tc in first.tool_calls] == LOOKUP.tool_calls
    ids = [tc["id"] for tc in first.tool_calls]
    assert all(CALL_ID.fullmatch(i or "") for i in ids)
    assert len(set(ids)) == 2
    assert second.tool_calls == first.tool_calls
    assert second.id == first.id
    assert model.calls == 2

    prompt_chars = sum(len(m.text) for m in PROMPT)
    assert first.usage_metadata is not None
    assert first.usage_metadata["input_tokens"] == prompt_chars // 4 + 1
    assert first.usage_metadata["output_tokens"] > len(LOOKUP.content) // 4
    assert first.usage_metadata["total_tokens"] == (
        first.usage_metadata["input_tokens"] + first.usage_metadata["output_tokens"]
    )
    assert first.response_metadata == {
        "model_name": "scripted",
        "finish_reason": "tool_calls",
    }


def test_ids_change_with_the_turn_and_input_counts_tool_arguments() -> None:
    model = ScriptedChatModel(policy=Recorder(LOOKUP))
    first = model.invoke(PROMPT)
    results = [
        ToolMessage("{}", tool_call_id=tc["id"] or "", name=tc["name"]) for tc in first.tool_calls
    ]
    later = model.invoke([*PROMPT, first, *results])

    assert {tc["id"] for tc in later.tool_calls}.isdisjoint({tc["id"] for tc in first.tool_calls})
    assert later.id != first.id
    chars = (
        sum(len(m.text) for m in PROMPT)
        + len(first.content)
        + len('{"order_id":"O-42"}')
        + len("{}")
        + 2 * len("{}")
    )
    assert later.usage_metadata is not None
    assert later.usage_metadata["input_tokens"] == chars // 4 + 1


def test_stream_aggregates_to_the_invoke_result() -> None:
    model = ScriptedChatModel(policy=Recorder(LOOKUP)).bind_tools([get_order, get_policy])
    invoked = model.invoke(PROMPT)
    chunks = as_chunks(model.stream(PROMPT))
    streamed = aggregate(chunks)

    assert streamed.content == invoked.content
    assert streamed.tool_calls == invoked.tool_calls
    assert streamed.invalid_tool_calls == []
    assert streamed.usage_metadata == invoked.usage_metadata
    assert streamed.response_metadata == invoked.response_metadata
    assert streamed.id == invoked.id
    assert chunks[-1].chunk_position == "last"
    assert [c.chunk_position for c in chunks].count("last") == 1
    # The id and name come once, in the first chunk of each call; the arguments in fragments.
    for index, tool_call in enumerate(invoked.tool_calls):
        pieces = [tcc for c in chunks for tcc in c.tool_call_chunks if tcc["index"] == index]
        assert len(pieces) > 1
        assert [p["id"] for p in pieces] == [tool_call["id"]] + [None] * (len(pieces) - 1)
        assert pieces[0]["name"] == tool_call["name"]


def test_async_paths_match_sync() -> None:
    model = ScriptedChatModel(policy=Recorder(LOOKUP)).bind_tools([get_order, get_policy])

    async def both() -> tuple[AIMessage, AIMessageChunk]:
        return await model.ainvoke(PROMPT), aggregate(
            as_chunks([c async for c in model.astream(PROMPT)])
        )

    invoked, streamed = asyncio.run(both())
    assert streamed.tool_calls == invoked.tool_calls == model.invoke(PROMPT).tool_calls


def test_invoke_inside_a_graph_streamed_by_messages_goes_through_stream() -> None:
    """LangGraph's "messages" mode makes invoke() use _stream; the result must not change."""
    model = ScriptedChatModel(policy=Recorder(LOOKUP)).bind_tools([get_order, get_policy])
    replies: list[AIMessage] = []

    class State(TypedDict):
        done: bool

    def call_model(state: State) -> State:
        replies.append(model.invoke(PROMPT))
        return {"done": True}

    builder = StateGraph(State)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    streamed_chunks = list(builder.compile().stream({"done": False}, stream_mode="messages"))

    assert len(streamed_chunks) > 1
    [reply] = replies
    assert reply.tool_calls == model.invoke(PROMPT).tool_calls


def test_malformed_raw_arguments_become_invalid_tool_calls() -> None:
    broken = Decision(
        tool_calls=[("get_policy", {})],
        raw_arguments=[("get_order", '{"order_id": O-42}')],
    )
    model = ScriptedChatModel(policy=Recorder(broken)).bind_tools([get_order, get_policy])

    invoked = model.invoke(PROMPT)
    assert [tc["name"] for tc in invoked.tool_calls] == ["get_policy"]
    [invalid] = invoked.invalid_tool_calls
    assert invalid["name"] == "get_order"
    assert invalid["args"] == '{"order_id": O-42}'
    assert CALL_ID.fullmatch(invalid["id"] or "")
    assert "are not valid JSON" in (invalid["error"] or "")
    assert invoked.response_metadata["finish_reason"] == "tool_calls"

    streamed = aggregate(as_chunks(model.stream(PROMPT)))
    assert streamed.tool_calls == invoked.tool_calls
    assert [(i["id"], i["name"], i["args"]) for i in streamed.invalid_tool_calls] == [
        (invalid["id"], "get_order", '{"order_id": O-42}')
    ]


def test_json_that_is_not_an_object_is_an_invalid_tool_call() -> None:
    model = ScriptedChatModel(policy=Recorder(Decision(raw_arguments=[("get_order", "[1]")])))
    [invalid] = model.invoke(PROMPT).invalid_tool_calls
    assert invalid["args"] == "[1]"
    assert "not a JSON object" in (invalid["error"] or "")


def test_unbound_model_answers_without_tools() -> None:
    policy = Recorder(Decision(content="Nothing to do here."))
    model = ScriptedChatModel(policy=policy)

    answer = model.invoke("hello")
    assert answer.content == "Nothing to do here."
    assert answer.tool_calls == [] and answer.invalid_tool_calls == []
    assert answer.response_metadata["finish_reason"] == "stop"
    assert policy.seen[0][1] == []

    streamed = aggregate(as_chunks(model.stream("hello")))
    assert streamed.content == "Nothing to do here."
    assert streamed.tool_calls == []
    assert streamed.usage_metadata == answer.usage_metadata


def test_the_refund_agents_own_model_is_the_scripted_refund_procedure() -> None:
    """Without a model spec a run uses its agent's model: for the reference agent, the
    scripted refund procedure under its own name."""
    model = refunds_agent.chat_model()
    assert isinstance(model, ScriptedChatModel)
    assert isinstance(model.policy, RefundProcedure)
    assert model.model_name == "scripted-refund-v1"
    assert model.invoke(PROMPT).response_metadata["model_name"] == "scripted-refund-v1"


def test_make_model_builds_openai_from_spec_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from langchain_openai import ChatOpenAI

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("LOOPWRIGHT_OPENAI_API", "chat")
    monkeypatch.setenv("LOOPWRIGHT_MODEL_RETRIES", "5")

    model = make_model("openai:gpt-test")
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "gpt-test"
    assert model.openai_api_base == "http://127.0.0.1:9/v1"
    assert isinstance(model.openai_api_key, SecretStr)
    assert model.openai_api_key.get_secret_value() == "unused"
    assert model.use_responses_api is False
    assert model.max_retries == 5

    monkeypatch.delenv("LOOPWRIGHT_OPENAI_API")
    # A spec given to the agent replaces its own (scripted) model.
    responses = refunds_agent.chat_model("openai:gpt-other")
    assert isinstance(responses, ChatOpenAI)
    assert responses.model_name == "gpt-other"
    assert responses.use_responses_api is True


@pytest.mark.parametrize("spec", ["gpt-4o", "openai:", "anthropic:claude", "", "scripted"])
def test_make_model_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=r"expected one of: openai:<model>$"):
        make_model(spec)
