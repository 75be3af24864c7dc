"""A deterministic chat model whose replies come from a scripted policy.

langchain's fake chat models are not enough for this runtime: `FakeMessagesListChatModel` and
`GenericFakeChatModel` have no `bind_tools`, and the generic one loses tool calls when streamed.
`ScriptedChatModel` behaves like a provider model at the interface the runtime uses (bound
tools, tool calls with ids, invalid tool calls, usage, streaming with fragmented arguments) while
its decisions come from a `Policy` that reads the conversation. Everything it emits, ids
included, is a function of the conversation, so a crashed and resumed run can be compared with an
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    InvalidToolCall,
    ToolCall,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import PrivateAttr

from loopwright.core.state import canonical_json, digest
from loopwright.tools.program import PROGRAM_TOOL
from loopwright.tools.skills import SKILL_TOOL

# Streaming splits text and tool arguments into pieces of at most this many parts, so consumers
# are exercised on fragments the way a provider stream exercises them.
STREAM_FRAGMENTS = 3


@dataclass(frozen=True)
class Decision:
    """What the model says next: text, tool calls, or both.

    `raw_arguments` holds tool calls whose arguments are given as the literal JSON string the
    "provider" sent; it exists to script misbehaviour. A string that does not parse to a JSON
    object becomes an `invalid_tool_calls` entry, as langchain does for provider output. When
    streamed, langchain repairs a truncated prefix such as `{"a": "b"` with partial-JSON parsing
    (for real providers too), so a call meant to stay invalid in both modes needs arguments that
    are not a JSON prefix, e.g. `{"order_id": O-42}`.
    """

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    raw_arguments: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def program(cls, code: str, inputs: dict[str, Any] | None = None) -> Decision:
        """Answer with a program over the agent's tools (a program action: `run_program`),
        started with `inputs` as its global names."""
        return cls(tool_calls=[(PROGRAM_TOOL, {"code": code, "inputs": inputs or {}})])

    @classmethod
    def skill(cls, name: str) -> Decision:
        """Ask for one of the agent's skills (`load_skill`)."""
        return cls(tool_calls=[(SKILL_TOOL, {"name": name})])


@runtime_checkable
class Policy(Protocol):
    """Chooses the next `Decision` from the whole conversation and the bound tools.

    Runtime-checkable so that pydantic can validate the model's `policy` field by isinstance.
    """

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]], /
    ) -> Decision: ...


@dataclass(frozen=True)
class _RawCall:
    """One tool call as a provider would send it: id, name and the arguments string."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _split(text: str, parts: int = STREAM_FRAGMENTS) -> list[str]:
    """Cut `text` into at most `parts` non-empty consecutive pieces (none for empty text)."""
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _fingerprint(message: BaseMessage) -> list[Any]:
    calls = [c["id"] for c in message.tool_calls] if isinstance(message, AIMessage) else []
    return [message.type, message.text, calls]


def _prompt_chars(message: BaseMessage) -> int:
    """Characters a provider would bill for one input message: text plus tool call arguments."""
    chars = len(message.text)
    if isinstance(message, AIMessage):
        chars += sum(len(canonical_json(tc["args"])) for tc in message.tool_calls)
        chars += sum(len(itc.get("args") or "") for itc in message.invalid_tool_calls)
    return chars


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers with whatever its `policy` decides.

    Tool call ids and the message id are derived from the conversation (not random), and usage is
    a fixed function of message sizes (about four characters per token), so budgets and replays
    behave the same on every run. Stop sequences are ignored: the policy's text is final.
    """

    policy: Policy
    model_name: str = "scripted"

    _calls: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """The provider traces name the model by (`gen_ai.provider.name`): "scripted", not the
        name LangChain would make of the class's ("scriptedchatmodel")."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "scripted"
        return params

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    @property
    def calls(self) -> int:
        """How many times the policy was consulted by this instance (in-process only)."""
        return self._calls

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools in OpenAI format, the shape the policy receives.

        `tool_choice` is accepted for interface compatibility and ignored: the policy alone
        decides whether to call a tool.
        """
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        return self.bind(tools=formatted, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        content, calls, message_id = self._decide(messages, kwargs.get("tools", []))
        tool_calls: list[ToolCall] = []
        invalid_tool_calls: list[InvalidToolCall] = []
        for call in calls:
            parsed = _parse(call)
            if isinstance(parsed, str):
                invalid_tool_calls.append(make_invalid_tool_call(call.as_openai(), parsed))
            else:
                tool_calls.append(parsed)
        message = AIMessage(
            content=content,
            id=message_id,
            tool_calls=tool_calls,
            invalid_tool_calls=invalid_tool_calls,
            usage_metadata=self._usage(messages, content, calls),
            response_metadata=self._response_metadata(calls),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Stream like a provider: text pieces, then each call with its arguments in fragments.

        The first chunk of a call carries its id and name; later ones only the next arguments
        fragment under the same `index`. The last chunk carries usage and finish metadata.
        """
        content, calls, message_id = self._decide(messages, kwargs.get("tools", []))
        chunks = [AIMessageChunk(content=piece, id=message_id) for piece in _split(content)]
        for index, call in enumerate(calls):
            for n, fragment in enumerate(_split(call.arguments) or [""]):
                first = n == 0
                tcc = tool_call_chunk(
                    name=call.name if first else None,
                    args=fragment,
                    id=call.id if first else None,
                    index=index,
                )
                chunks.append(AIMessageChunk(content="", id=message_id, tool_call_chunks=[tcc]))
        chunks.append(
            AIMessageChunk(
                content="",
                id=message_id,
                usage_metadata=self._usage(messages, content, calls),
                response_metadata=self._response_metadata(calls),
                chunk_position="last",
            )
        )
        for chunk in chunks:
            generation = ChatGenerationChunk(message=chunk)
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=generation)
            yield generation

    def _decide(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> tuple[str, list[_RawCall], str]:
        """Ask the policy and give every call its deterministic id.

        An id depends on the conversation shown (every message's text and the ids of the calls
        in it), the call's position, its tool and its arguments: the same conversation always
        yields the same ids, while a repeated call in a later turn gets a fresh one, even when a
        compacted context shows as many turns as an earlier one did.
        """
        decision = self.policy(messages, tools)
        self._calls += 1
        turn = digest([_fingerprint(m) for m in messages])
        requested = [(name, canonical_json(args)) for name, args in decision.tool_calls]
        requested += decision.raw_arguments
        calls = [
            _RawCall(
                id="call_" + digest([turn, i, name, arguments])[:12], name=name, arguments=arguments
            )
            for i, (name, arguments) in enumerate(requested)
        ]
        message_id = "scripted-" + digest([turn, decision.content, requested])[:12]
        return decision.content, calls, message_id

    @staticmethod
    def _usage(
        messages: Sequence[BaseMessage], content: str, calls: Sequence[_RawCall]
    ) -> UsageMetadata:
        output_text = content + (
            canonical_json([c.as_openai()["function"] for c in calls]) if calls else ""
        )
        input_tokens = sum(_prompt_chars(m) for m in messages) // 4 + 1
        output_tokens = len(output_text) // 4 + 1
        return UsageMetadata(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        )

    def _response_metadata(self, calls: Sequence[_RawCall]) -> dict[str, Any]:
        return {"model_name": self.model_name, "finish_reason": "tool_calls" if calls else "stop"}


def _parse(call: _RawCall) -> ToolCall | str:
    """The parsed call, or why it is invalid (langchain's parser and error text).

    Arguments that are valid JSON but not an object are invalid too: a tool call's args must be
    a mapping.
    """
    try:
        parsed = parse_tool_call(call.as_openai(), return_id=True)
    except OutputParserException as exc:
        return str(exc)
    if parsed is None or not isinstance(parsed["args"], dict):
        return f"Function {call.name} arguments are not a JSON object: {call.arguments}"
    return ToolCall(name=parsed["name"], args=parsed["args"], id=parsed["id"], type="tool_call")
