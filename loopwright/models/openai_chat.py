"""The production model: `ChatOpenAI` on any OpenAI-compatible endpoint, configured from the
environment and strict about streamed answers.

Why a subclass and not plain `ChatOpenAI`: langchain parses streamed tool-call arguments with a
partial-JSON parser, so a stream that stops early (the body closes cleanly after
`{"order_id": "O-42"`) aggregates into a well-formed tool call the model never finished. The
runtime must execute only complete calls (architecture invariant 2), and only the protocol's own
end marker says a call is complete: `response.completed` / `response.incomplete` on the Responses
API, a `finish_reason` on Chat Completions. `StrictChatOpenAI` raises `IncompleteModelOutput`
when a stream ends without it, or when an answer with tool calls was cut at the output-token
limit, so the half call never reaches the run's history.

Why stateless Responses requests (`store=False`): the run's checkpoint is the record of the
conversation, not the provider. A run resumed days later on another worker replays its history;
with a reasoning effort configured, reasoning items come back with `encrypted_content` and are
sent back verbatim, ahead of the function calls they produced, as the API requires.

Retries live in one layer, the OpenAI client (`max_retries`): 408, 409, 429 and 5xx answers and
connection errors before an answer starts are retried there, honouring `Retry-After`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

API_ENV = "LOOPWRIGHT_OPENAI_API"
RETRIES_ENV = "LOOPWRIGHT_MODEL_RETRIES"
TIMEOUT_ENV = "LOOPWRIGHT_MODEL_TIMEOUT_S"
STREAM_ENV = "LOOPWRIGHT_OPENAI_STREAM"
REASONING_ENV = "LOOPWRIGHT_OPENAI_REASONING"
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
}


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
        if self.truncated and self.tool_fragments:
            raise IncompleteModelOutput(
                f"the {self.api} answer was cut at the output limit in the middle of tool calls"
            )


class StrictChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` that fails a streamed answer which did not end as the protocol requires."""

    def _stream_api(self) -> str:
        return "Responses" if self.use_responses_api else "Chat Completions"

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


def make_openai_model(settings: OpenAISettings) -> StrictChatOpenAI:
    """The chat model for `settings`, speaking the Responses API or Chat Completions."""
    common: dict[str, Any] = {
        "model": settings.model,
        "base_url": settings.base_url,
        "api_key": settings.api_key,
        "max_retries": settings.max_retries,
        "timeout": settings.timeout_s,
        "streaming": settings.streaming,
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
