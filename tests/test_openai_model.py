"""`openai:<model>`: configured from the environment (bad settings fail before a run starts),
and strict about how a streamed answer ends."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from pydantic import SecretStr

from loopwright.models.factory import make_model
from loopwright.models.openai_chat import (
    API_ENV,
    PLACEHOLDER_KEY,
    REASONING_ENV,
    RETRIES_ENV,
    STREAM_ENV,
    TIMEOUT_ENV,
    IncompleteModelOutput,
    OpenAISettings,
    StreamEnd,
    StrictChatOpenAI,
    make_openai_model,
)


def test_environment_configures_a_stateless_responses_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-local",
        API_ENV: "responses",
        RETRIES_ENV: "5",
        TIMEOUT_ENV: "12.5",
        STREAM_ENV: "true",
        REASONING_ENV: "medium",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    model = make_model("openai:gpt-5-mini")

    assert isinstance(model, StrictChatOpenAI)
    assert (model.model_name, model.openai_api_base) == ("gpt-5-mini", "http://127.0.0.1:9/v1")
    assert isinstance(model.openai_api_key, SecretStr)
    assert model.openai_api_key.get_secret_value() == "sk-local"
    assert (model.max_retries, model.request_timeout, model.streaming) == (5, 12.5, True)
    assert model.use_responses_api is True and model.output_version == "responses/v1"
    assert model.store is False
    assert model.reasoning == {"effort": "medium"}
    assert model.include == ["reasoning.encrypted_content"]


def test_chat_completions_asks_for_usage_on_streams_too() -> None:
    settings = OpenAISettings.from_env("llama3", {API_ENV: "chat", STREAM_ENV: "1"})

    model = make_openai_model(settings)

    assert model.use_responses_api is False
    assert model.stream_usage is True  # otherwise a custom base URL streams without usage
    assert model.reasoning_effort is None and model.include is None


def test_defaults_suit_a_keyless_local_server() -> None:
    settings = OpenAISettings.from_env("qwen", {"OPENAI_BASE_URL": "", API_ENV: ""})

    assert settings == OpenAISettings(model="qwen")
    assert (settings.api, settings.max_retries, settings.streaming) == ("responses", 2, False)
    assert settings.api_key.get_secret_value() == PLACEHOLDER_KEY
    secret = OpenAISettings.from_env("qwen", {"OPENAI_API_KEY": "sk-secret"})
    assert "sk-secret" not in repr(secret)
    assert make_openai_model(settings).reasoning is None  # no reasoning asked of any model


@pytest.mark.parametrize(
    ("name", "value"),
    [(API_ENV, "completions"), (RETRIES_ENV, "-1"), (TIMEOUT_ENV, "0"), (STREAM_ENV, "maybe")],
)
def test_bad_settings_are_value_errors(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)

    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        make_model("openai:gpt-5-mini")


def tool_fragment(**extra: Any) -> ChatGenerationChunk:
    fragment = tool_call_chunk(name="get_order", args='{"order_id": "O-4', id="call_1", index=0)
    return ChatGenerationChunk(
        message=AIMessageChunk(content="", tool_call_chunks=[fragment]), **extra
    )


@pytest.mark.parametrize(
    "last",
    [
        ChatGenerationChunk(
            message=AIMessageChunk(content=""), generation_info={"finish_reason": "length"}
        ),
        ChatGenerationChunk(
            message=AIMessageChunk(
                content="", chunk_position="last", response_metadata={"status": "incomplete"}
            )
        ),
    ],
    ids=["chat-length", "responses-incomplete"],
)
def test_a_tool_call_cut_at_the_output_limit_is_incomplete(last: ChatGenerationChunk) -> None:
    end = StreamEnd("test")
    for chunk in (tool_fragment(), last):
        end.see(chunk)

    with pytest.raises(IncompleteModelOutput, match="output limit"):
        end.check()


def test_a_text_answer_cut_at_the_output_limit_is_a_protocol_failure_too() -> None:
    """A final answer cut short is not an answer: "Refunded" may have been going to say
    "Refunded nothing"; it never completes a run."""
    end = StreamEnd("test")
    end.see(
        ChatGenerationChunk(
            message=AIMessageChunk(content="Refunded"), generation_info={"finish_reason": "length"}
        )
    )
    with pytest.raises(IncompleteModelOutput, match="cut at the output limit mid-answer"):
        end.check()
