"""The production model: `ChatOpenAI` on any OpenAI-compatible endpoint, configured from the
environment and strict about streamed answers.

Why a subclass and not plain `ChatOpenAI`: langchain parses streamed tool-call arguments with a
partial-JSON parser, so a stream that stops early (the body closes cleanly after
`{"order_id": "O-42"`) aggregates into a well-formed tool call the model never finished. The
runtime must execute only complete calls (architecture invariant 2), and only the protocol's own
end marker says a call is complete: `response.completed` / `response.incomplete` on the Responses
API, a `finish_reason` on Chat Completions. `StrictChatOpenAI` raises `IncompleteModelOutput`
when a stream ends without it, or when an answer (streamed or not, with tool calls or without)
was cut at the output-token limit, so no half answer reaches the run's history.

Why stateless Responses requests (`store=False`): the run's checkpoint is the record of the
conversation, not the provider. A run resumed days later on another worker replays its history;
with a reasoning effort configured, reasoning items come back with `encrypted_content` and are
sent back verbatim, ahead of the function calls they produced, as the API requires.

Retries live in one layer, the OpenAI client (`max_retries`): 408, 409, 429 and 5xx answers and
connection errors before an answer starts are retried there, honouring `Retry-After`.

Every request ends by the clock: the model step waits for it at most until its bound (the
budget's, what the run's deadline leaves, and `timeout_s`, this model's `request_limit_s`: the
total of one request, retries included), and the client's transport (`bounded_http`) makes the
request itself end there, whatever bytes keep coming. `max_tokens` is sent from what the run's
budget leaves (`core.budget.REQUEST_BOUNDS`; Chat Completions: `max_completion_tokens` to
OpenAI itself, `max_tokens` to a custom base URL, the name llama.cpp, vLLM and Ollama document;
Responses: `max_output_tokens`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from loopwright.core import tls
from loopwright.core.budget import REQUEST_BOUNDS
from loopwright.models.bounded_http import BoundedTransport

API_ENV = "LOOPWRIGHT_OPENAI_API"
RETRIES_ENV = "LOOPWRIGHT_MODEL_RETRIES"
TIMEOUT_ENV = "LOOPWRIGHT_MODEL_TIMEOUT_S"
STREAM_ENV = "LOOPWRIGHT_OPENAI_STREAM"
REASONING_ENV = "LOOPWRIGHT_OPENAI_REASONING"
TEMPERATURE_ENV = "LOOPWRIGHT_OPENAI_TEMPERATURE"
# Keyless local servers (vLLM, llama.cpp, Ollama) still need some key for the client to start.
PLACEHOLDER_KEY = "unused"


class OpenAISettings(BaseModel):
    """How to reach one OpenAI-compatible model. `from_env` reads the documented variables."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1)
    api: Literal["responses", "chat"] = "responses"
    base_url: str | None = None
    api_key: SecretStr = SecretStr(PLACEHOLDER_KEY)
    max_retries: int = Field(default=2, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    streaming: bool = False
    # For reasoning models ("low", "medium", ...). Responses: also asks for encrypted reasoning.
    reasoning_effort: str | None = None
    # Sent only when set: reasoning models refuse it.
    temperature: float | None = Field(default=None, ge=0, le=2)

    @classmethod
    def from_env(cls, model: str, env: Mapping[str, str] | None = None) -> OpenAISettings:
        """Settings for `model` from `env` (default `os.environ`).

        Unset and empty variables take the defaults. A bad value raises ValueError naming the
        variable, so the CLI can say in one line what to fix.
        """
        env = os.environ if env is None else env
        raw = {field: env.get(name) for field, name in _ENV_OF_FIELD.items()}
        try:
            return cls.model_validate({"model": model, **{k: v for k, v in raw.items() if v}})
        except ValidationError as exc:
            problems = "; ".join(
                f"{_ENV_OF_FIELD.get(str(e['loc'][0]), e['loc'][0])}={e['input']!r}: {e['msg']}"
                for e in exc.errors()
            )
            raise ValueError(f"bad OpenAI model settings: {problems}") from exc


_ENV_OF_FIELD = {
    "api": API_ENV,
    "base_url": "OPENAI_BASE_URL",
    "api_key": "OPENAI_API_KEY",
    "max_retries": RETRIES_ENV,
    "timeout_s": TIMEOUT_ENV,
    "streaming": STREAM_ENV,
    "reasoning_effort": REASONING_ENV,
    "temperature": TEMPERATURE_ENV,
}


def recorded_settings(settings: OpenAISettings) -> dict[str, Any]:
    """The settings as a run records them (V): everything but the key."""
    return settings.model_dump(mode="json", exclude={"api_key"})


def settings_from_record(
    recorded: dict[str, Any], env: Mapping[str, str] | None = None
) -> OpenAISettings:
    """The recorded settings, with the key of this process's environment."""
    key = (os.environ if env is None else env).get("OPENAI_API_KEY") or PLACEHOLDER_KEY
    return OpenAISettings.model_validate({**recorded, "api_key": key})


class IncompleteModelOutput(RuntimeError):
    """The model's answer ended before the protocol said it was complete.

    Nothing of it may be acted on: its tool calls may be prefixes of what the model meant.
    """


@dataclass
class StreamEnd:
    """What a stream said about its own end, seen chunk by chunk; `check` once it is over.

    The end markers: a chunk at position "last" (Responses `response.completed` or
    `response.incomplete`, the latter with status "incomplete"), or a `finish_reason` (Chat
    Completions, "length" when the output limit cut the answer).
    """

    api: str
    finished: bool = False
    truncated: bool = False
    tool_fragments: int = 0

    def see(self, chunk: ChatGenerationChunk) -> None:
        message = chunk.message
        if isinstance(message, AIMessageChunk):
            self.tool_fragments += len(message.tool_call_chunks)
            if message.chunk_position == "last":  # response.completed / response.incomplete
                self.finished = True
                self.truncated = message.response_metadata.get("status") == "incomplete"
        finish_reason = (chunk.generation_info or {}).get("finish_reason")
        if finish_reason:  # Chat Completions
            self.finished = True
            self.truncated = finish_reason == "length"

    def check(self) -> None:
        if not self.finished:
            raise IncompleteModelOutput(
                f"the {self.api} stream ended without its completion event; "
                f"{self.tool_fragments} tool-call fragments discarded"
            )
        if self.truncated:
            what = "in the middle of tool calls" if self.tool_fragments else "mid-answer"
            raise IncompleteModelOutput(f"the {self.api} answer was cut at the output limit {what}")


class StrictChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` that fails a streamed answer which did not end as the protocol requires,
    and bounds every request by what the run's budget leaves it."""

    # What it was made from: recorded in a run's V, so that a resumed run gets the same model.
    settings: OpenAISettings | None = Field(default=None, exclude=True)

    @property
    def request_limit_s(self) -> float:
        """The total time one request may take, retries included (`LOOPWRIGHT_MODEL_TIMEOUT_S`):
        the model step bounds the request by it as well as by the budget."""
        return _seconds(self.request_timeout)

    def _stream_api(self) -> str:
        return "Responses" if self.use_responses_api else "Chat Completions"

    def _get_request_payload(
        self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        bounds = REQUEST_BOUNDS.get()
        if bounds is None:
            return payload
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            payload.pop(name, None)
        if self.use_responses_api:
            payload["max_output_tokens"] = bounds.max_output_tokens
        elif self.openai_api_base:  # a local server: the name they document
            payload["max_tokens"] = bounds.max_output_tokens
        else:
            payload["max_completion_tokens"] = bounds.max_output_tokens
        return payload

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        result = super()._generate(*args, **kwargs)
        for generation in result.generations:
            info = {**(generation.generation_info or {}), **generation.message.response_metadata}
            if info.get("finish_reason") == "length" or info.get("status") == "incomplete":
                raise IncompleteModelOutput(
                    f"the {self._stream_api()} answer was cut at the output limit"
                )
        return result

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        end = StreamEnd(self._stream_api())
        for chunk in super()._stream(*args, **kwargs):
            end.see(chunk)
            yield chunk
        end.check()

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        end = StreamEnd(self._stream_api())
        async for chunk in super()._astream(*args, **kwargs):
            end.see(chunk)
            yield chunk
        end.check()


def _seconds(timeout: Any) -> float:
    """The client's configured timeout, in seconds (it may be a number, a pair, or None)."""
    if isinstance(timeout, int | float):
        return float(timeout)
    if isinstance(timeout, tuple) and timeout and isinstance(timeout[0], int | float):
        return float(timeout[0])
    return float("inf")


def make_openai_model(settings: OpenAISettings) -> StrictChatOpenAI:
    """The chat model for `settings`, speaking the Responses API or Chat Completions."""
    common: dict[str, Any] = {
        "settings": settings,
        "model": settings.model,
        "base_url": settings.base_url,
        "api_key": settings.api_key,
        "max_retries": settings.max_retries,
        "timeout": settings.timeout_s,
        "http_client": httpx.Client(
            transport=BoundedTransport(verify=tls.context()), timeout=settings.timeout_s
        ),
        "streaming": settings.streaming,
        "temperature": settings.temperature,
    }
    effort = settings.reasoning_effort
    if settings.api == "responses":
        return StrictChatOpenAI(
            **common,
            use_responses_api=True,
            # Explicit, so LC_OUTPUT_VERSION cannot move reasoning items out of the content.
            output_version="responses/v1",
            store=False,
            reasoning={"effort": effort} if effort else None,
            include=["reasoning.encrypted_content"] if effort else None,
        )
    return StrictChatOpenAI(
        **common,
        use_responses_api=False,
        # Off by default for custom base URLs; without it a streamed answer has no usage (B).
        stream_usage=True,
        reasoning_effort=effort,
    )
