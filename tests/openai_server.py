"""A local OpenAI-compatible server for tests: scripted turns over real HTTP, every request kept.

It speaks `POST /v1/responses` and `POST /v1/chat/completions`, as JSON or as SSE streams, so the
runtime's real client (`ChatOpenAI` and the openai SDK under it) is exercised down to the wire.
What it answers comes from a `Policy` (default: the refund procedure): the request's input items
or messages are turned back into langchain messages and the policy decides the next turn, which
is rendered in the API's own format: on the Responses API with a reasoning item first (with
opaque `encrypted_content` when the request asks for it), then text and function calls.

It is also a referee. A request that breaks the protocol is refused with a 400, as OpenAI
refuses it: a tool output without its call, a call without its output, a function call sent back
without the reasoning item that came with it, an assistant's tool calls not answered before the
next message. A run that completes against it therefore carried its protocol items correctly.

Faults are scripted: N answers with a status (429, 503) before the next success, or a status for
ever; a stream that stops after some characters of a function call's arguments (no completion
event, no `[DONE]`; the body itself ends cleanly); and answers that never end (`hold_next`),
each with bytes that keep a read timeout from firing: SSE keep-alive comments, chunks with empty
`choices`, the other API's events, a trickle of text, or nothing at all after the headers.

It imports nothing of pytest: the benchmarks serve it too (the fixtures live in
`tests/runtime_fixtures.py`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    convert_to_messages,
)

from loopwright.core.state import digest
from loopwright.testing.scripted import Decision, Policy
from loopwright_refunds.procedure import RefundProcedure, Transcript
from tests.stub_server import serve_app

# Streams cut text and arguments into pieces of this many characters.
FRAGMENT_CHARS = 5
REASONING_TOKENS = 3
# Tells the SDK how long to wait before a retry: short, so fault tests stay fast.
RETRY_AFTER_MS = "5"
# How an answer that never ends keeps its connection busy (`OpenAIStub.hold_next`).
Hold = Literal["keep_alive", "empty_chunks", "other_protocol", "trickle", "silent"]
HOLDS: tuple[Hold, ...] = ("keep_alive", "empty_chunks", "other_protocol", "trickle", "silent")
# Seconds between the bytes of a held answer: far below any read timeout.
HOLD_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Recorded:
    """One request as received, the status it was answered with and, for a 200, the response
    or completion object it was answered with (for a stream: the object its events spell out,
    whole even where the stream was cut, to compare with)."""

    path: str
    body: dict[str, Any]
    status: int
    answer: dict[str, Any] | None = None

    @property
    def calls(self) -> list[Call]:
        """The function calls of the answer, in either API's format."""
        answer = self.answer or {}
        if "output" in answer:
            items = [i for i in answer["output"] if i["type"] == "function_call"]
            return [Call(i["call_id"], i["name"], i["arguments"]) for i in items]
        message = answer["choices"][0]["message"] if "choices" in answer else {}
        return [
            Call(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]


@dataclass(frozen=True)
class Turn:
    """One scripted answer, before it is rendered in an API's format."""

    number: int
    text: str
    calls: list[Call]
    input_tokens: int
    output_tokens: int


class ProtocolViolation(Exception):
    """A request the real API would refuse with a 400."""


def _text(content: Any) -> str:
    """Text of a message's content: a string or a list of text parts of any API."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def responses_input_to_messages(items: list[dict[str, Any]]) -> list[BaseMessage]:
    """The Responses API's input items as langchain messages, one AIMessage per model turn."""
    messages: list[BaseMessage] = []
    text: list[str] = []
    calls: list[ToolCall] = []
    in_turn = False

    def flush() -> None:
        nonlocal in_turn
        if in_turn:
            messages.append(AIMessage(content="".join(text), tool_calls=list(calls)))
        text.clear()
        calls.clear()
        in_turn = False

    for item in items:
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "message" and role in ("system", "developer"):
            flush()
            messages.append(SystemMessage(content=_text(item["content"])))
        elif kind == "message" and role == "user":
            flush()
            messages.append(HumanMessage(content=_text(item["content"])))
        elif kind == "function_call_output":
            flush()
            messages.append(ToolMessage(content=item["output"], tool_call_id=item["call_id"]))
        else:  # reasoning, assistant text and function calls: the model's turn
            in_turn = True
            if kind == "message":
                text.append(_text(item["content"]))
            elif kind == "function_call":
                args = json.loads(item["arguments"])
                calls.append(ToolCall(name=item["name"], args=args, id=item["call_id"]))
    flush()
    return messages


def chat_messages_to_messages(messages: list[dict[str, Any]]) -> list[BaseMessage]:
    return convert_to_messages([{**m, "content": _text(m.get("content"))} for m in messages])


def referee_responses(items: list[dict[str, Any]], issued: dict[str, tuple[str, str]]) -> None:
    """Refuse what the Responses API refuses. `issued`: call id -> (reasoning id, encrypted)."""
    reasoning: dict[str, str | None] = {}
    called: list[str] = []
    answered: set[str] = set()
    for item in items:
        kind = item.get("type")
        if kind == "reasoning":
            reasoning[item["id"]] = item.get("encrypted_content")
        elif kind == "function_call":
            call_id = item["call_id"]
            if call_id in issued and reasoning.get(issued[call_id][0]) != issued[call_id][1]:
                raise ProtocolViolation(
                    f"Item '{item.get('id')}' of type 'function_call' was provided without its "
                    f"required 'reasoning' item: '{issued[call_id][0]}'."
                )
            called.append(call_id)
        elif kind == "function_call_output":
            if item["call_id"] not in called:
                raise ProtocolViolation(
                    f"No tool call found for function call output with call_id {item['call_id']}."
                )
            answered.add(item["call_id"])
    for call_id in called:
        if call_id not in answered:
            raise ProtocolViolation(f"No tool output found for function call {call_id}.")


def referee_chat(messages: list[dict[str, Any]]) -> None:
    """Refuse what Chat Completions refuses: every tool call answered, before anything else."""
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            if message.get("tool_call_id") not in open_calls:
                raise ProtocolViolation(
                    "messages with role 'tool' must be a response to a preceding message with "
                    "'tool_calls'."
                )
            open_calls.discard(message["tool_call_id"])
            continue
        if open_calls:
            raise ProtocolViolation(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id': {sorted(open_calls)} have none."
            )
        if message["role"] == "assistant":
            open_calls = {call["id"] for call in message.get("tool_calls") or []}
    if open_calls:
        raise ProtocolViolation(f"tool calls {sorted(open_calls)} have no response messages.")


def _pieces(text: str) -> list[str]:
    return [text[i : i + FRAGMENT_CHARS] for i in range(0, len(text), FRAGMENT_CHARS)]


def _cut(arguments: str, budget: int | None) -> tuple[list[str], bool]:
    """The argument fragments to send, and whether the stream stops after them."""
    if budget is None or budget >= len(arguments):
        return _pieces(arguments), False
    return _pieces(arguments[:budget]), True


class OpenAIStub:
    """The server's script and memory. Tests set faults and read `recorded` and `usages`."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy: Policy = policy or RefundProcedure()
        self.recorded: list[Recorded] = []
        # Usage of every answer sent whole, as (input_tokens, output_tokens).
        self.usages: list[tuple[int, int]] = []
        self.url = ""
        self._faults: deque[int] = deque()
        self._persistent: int | None = None
        self._cut_after: int | None = None
        # Behaviours of real servers and weak models, scripted (see the methods below).
        self.refuse_trailing_assistant = False
        self._hold: Hold | None = None
        self._truncate = False
        self._turns = 0
        self._issued: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self.app = self._build_app()

    # --- the script -------------------------------------------------------------------------

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next `times` requests with `status` (then as usual)."""
        self._faults.extend([status] * times)

    def fail_always(self, status: int) -> None:
        self._persistent = status

    def cut_next_stream(self, after_chars: int) -> None:
        """End the next stream after `after_chars` characters of its first call's arguments."""
        self._cut_after = after_chars

    def hold_next(self, how: Hold = "trickle") -> None:
        """Make the next answer (streamed or not, on either API) never end, sending bytes as
        `how` says every HOLD_INTERVAL_S: SSE comments (`: keep-alive`), Chat Completions chunks
        with empty `choices`, the other API's events (Chat Completions chunks on /v1/responses,
        Responses events on /v1/chat/completions), a piece of text, or nothing after the
        headers. A held answer that is not streamed trickles whitespace, or sends nothing."""
        self._hold = how

    def truncate_next(self) -> None:
        """Answer the next request as if the output limit cut it (finish_reason "length")."""
        self._truncate = True

    def requests(self, path: str = "") -> list[dict[str, Any]]:
        """Bodies of the requests to `path` (all paths if empty), in order."""
        return [r.body for r in self.recorded if r.path.endswith(path)]

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.recorded]

    # --- deciding ---------------------------------------------------------------------------

    def _turn(
        self, messages: list[BaseMessage], tools: list[dict[str, Any]], body: dict[str, Any]
    ) -> Turn:
        decision: Decision = self.policy(messages, tools)
        self._turns += 1
        number = self._turns
        requested = [(name, json.dumps(args)) for name, args in decision.tool_calls]
        calls = [
            Call(call_id=f"call_{number:03d}_{i}", name=name, arguments=arguments)
            for i, (name, arguments) in enumerate(requested + decision.raw_arguments)
        ]
        output = decision.content + "".join(c.arguments for c in calls)
        return Turn(
            number=number,
            text=decision.content,
            calls=calls,
            input_tokens=len(json.dumps(body)) // 4 + 1,
            output_tokens=len(output) // 4 + 1 + REASONING_TOKENS,
        )

    def _record(
        self,
        path: str,
        body: dict[str, Any],
        status: int,
        answer: dict[str, Any] | None = None,
        usage: tuple[int, int] | None = None,
    ) -> None:
        with self._lock:
            self.recorded.append(Recorded(path, body, status, answer))
            if usage is not None:
                self.usages.append(usage)

    def _fault(self, path: str, body: dict[str, Any]) -> Response | None:
        with self._lock:
            status = self._persistent or (self._faults.popleft() if self._faults else None)
        if status is None:
            return None
        self._record(path, body, status)
        error = {"message": f"scripted fault {status}", "type": "server_error", "code": None}
        return JSONResponse(
            {"error": error}, status_code=status, headers={"retry-after-ms": RETRY_AFTER_MS}
        )

    def _refuse(self, path: str, body: dict[str, Any], violation: ProtocolViolation) -> Response:
        self._record(path, body, 400)
        error = {"message": str(violation), "type": "invalid_request_error", "code": None}
        return JSONResponse({"error": error}, status_code=400)

    def _send(
        self, path: str, body: dict[str, Any], answer: dict[str, Any], turn: Turn
    ) -> Response:
        self._record(path, body, 200, answer, (turn.input_tokens, turn.output_tokens))
        return JSONResponse(answer)

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        answer: dict[str, Any],
        turn: Turn,
        render: Callable[[int | None], Iterator[str]],
    ) -> Response:
        """Stream `answer` as `render` spells it; cut if `cut_next_stream` asked for it.

        A cut answer is recorded whole (to compare with) but its usage is not counted: the
        client never saw the final event that carries it.
        """
        with self._lock:
            cut, self._cut_after = self._cut_after, None
        whole = cut is None or not turn.calls or cut >= len(turn.calls[0].arguments)
        usage = (turn.input_tokens, turn.output_tokens) if whole else None
        self._record(path, body, 200, answer, usage)
        return StreamingResponse(render(cut), media_type="text/event-stream")

    # --- the Responses API ------------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> tuple[dict[str, Any], Turn]:
        items = body["input"]
        referee_responses(items, self._issued)
        turn = self._turn(responses_input_to_messages(items), body.get("tools") or [], body)
        reasoning: dict[str, Any] = {
            "type": "reasoning",
            "id": f"rs_{turn.number:03d}",
            "summary": [],
        }
        if "reasoning.encrypted_content" in (body.get("include") or []):
            secret = json.dumps({"turn": turn.number, "digest": digest(items)[:16]})
            reasoning["encrypted_content"] = base64.b64encode(secret.encode()).decode()
            for call in turn.calls:
                self._issued[call.call_id] = (reasoning["id"], reasoning["encrypted_content"])
        output: list[dict[str, Any]] = [reasoning]
        if turn.text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{turn.number:03d}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "text": turn.text,
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        output += [
            {
                "type": "function_call",
                "id": f"fc_{turn.number:03d}_{i}",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
            for i, call in enumerate(turn.calls)
        ]
        response = {
            "id": f"resp_{turn.number:03d}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body["model"],
            "output": output,
            "usage": {
                "input_tokens": turn.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": turn.output_tokens,
                "output_tokens_details": {"reasoning_tokens": REASONING_TOKENS},
                "total_tokens": turn.input_tokens + turn.output_tokens,
            },
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "temperature": 1.0,
            "top_p": 1.0,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "store": body.get("store", True),
            "text": {"format": {"type": "text"}},
        }
        return response, turn

    @staticmethod
    def _response_events(response: dict[str, Any], cut: int | None) -> Iterator[str]:
        """The SSE events OpenAI streams for `response`; stops early where `cut` says."""
        sequence = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal sequence
            sequence += 1
            data = json.dumps({"type": kind, "sequence_number": sequence, **fields})
            return f"event: {kind}\ndata: {data}\n\n"

        yield event(
            "response.created", response={**response, "status": "in_progress", "output": []}
        )
        for index, item in enumerate(response["output"]):
            position = {"item_id": item["id"], "output_index": index}
            if item["type"] == "reasoning":
                added = {k: v for k, v in item.items() if k != "encrypted_content"}
                yield event("response.output_item.added", output_index=index, item=added)
            elif item["type"] == "message":
                text = item["content"][0]["text"]
                empty = {"type": "output_text", "text": "", "annotations": []}
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                yield event("response.content_part.added", **position, content_index=0, part=empty)
                for piece in _pieces(text):
                    yield event(
                        "response.output_text.delta",
                        **position,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                yield event(
                    "response.output_text.done", **position, content_index=0, text=text, logprobs=[]
                )
                yield event(
                    "response.content_part.done",
                    **position,
                    content_index=0,
                    part=item["content"][0],
                )
            else:
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                pieces, stop = _cut(item["arguments"], cut)
                for piece in pieces:
                    yield event("response.function_call_arguments.delta", **position, delta=piece)
                if stop:
                    return
                cut = None  # only the first call is ever cut
                yield event(
                    "response.function_call_arguments.done",
                    **position,
                    arguments=item["arguments"],
                )
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)

    # --- Chat Completions -------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> tuple[dict[str, Any], Turn]:
        referee_chat(body["messages"])
        if self.refuse_trailing_assistant and body["messages"][-1]["role"] == "assistant":
            # llama.cpp's server takes a trailing assistant message for a prefill and refuses
            # the request ("Cannot have 2 or more assistant messages at the end of the list").
            raise ProtocolViolation(
                "Cannot have 2 or more assistant messages at the end of the list"
            )
        turn = self._turn(
            chat_messages_to_messages(body["messages"]), body.get("tools") or [], body
        )
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in turn.calls
            ]
        completion = {
            "id": f"chatcmpl-{turn.number:03d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self._finish_reason(turn),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": turn.input_tokens,
                "completion_tokens": turn.output_tokens,
                "total_tokens": turn.input_tokens + turn.output_tokens,
            },
        }
        return completion, turn

    def _finish_reason(self, turn: Turn) -> str:
        with self._lock:
            truncated, self._truncate = self._truncate, False
        return "length" if truncated else "tool_calls" if turn.calls else "stop"

    @staticmethod
    def _chat_chunks(
        completion: dict[str, Any], cut: int | None, include_usage: bool
    ) -> Iterator[str]:
        """The SSE chunks of a streamed chat completion; stops early where `cut` says."""
        base = {k: completion[k] for k in ("id", "created", "model")}
        choice = completion["choices"][0]

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            data = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            return f"data: {json.dumps(data)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(choice["message"]["content"] or ""):
            yield chunk({"content": piece})
        for index, call in enumerate(choice["message"].get("tool_calls") or []):
            function = call["function"]
            head = {"index": index, "id": call["id"], "type": "function"}
            yield chunk({"tool_calls": [{**head, "function": {"name": function["name"]}}]})
            pieces, stop = _cut(function["arguments"], cut)
            for piece in pieces:
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            if stop:
                return
            cut = None
        yield chunk({}, choice["finish_reason"])
        if include_usage:
            usage = {**base, "object": "chat.completion.chunk", "choices": []}
            yield f"data: {json.dumps({**usage, 'usage': completion['usage']})}\n\n"
        yield "data: [DONE]\n\n"

    # --- answers that never end -------------------------------------------------------------

    def _held(self, path: str, body: dict[str, Any]) -> Response | None:
        with self._lock:
            how, self._hold = self._hold, None
        if how is None:
            return None
        self._record(path, body, 200)
        if not body.get("stream"):
            idle = how == "silent"
            return StreamingResponse(_endless(b"" if idle else b" "), media_type="application/json")
        on_chat = path.endswith("/chat/completions")
        chat_chunk = {"id": "chatcmpl-held", "object": "chat.completion.chunk", "created": 0}
        piece = {
            "keep_alive": b": keep-alive\n\n",
            "empty_chunks": f"data: {json.dumps({**chat_chunk, 'choices': []})}\n\n".encode(),
            "other_protocol": _other_protocol_event(on_chat, chat_chunk),
            "trickle": _text_event(on_chat, chat_chunk),
            "silent": b"",
        }[how]
        return StreamingResponse(_endless(piece), media_type="text/event-stream")

    # --- HTTP -------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/responses")
        async def responses(request: Request) -> Response:
            path, body = request.url.path, await request.json()
            if (fault := self._fault(path, body)) is not None:
                return fault
            if (held := self._held(path, body)) is not None:
                return held
            try:
                response, turn = self._responses(body)
            except ProtocolViolation as violation:
                return self._refuse(path, body, violation)
            if not body.get("stream"):
                return self._send(path, body, response, turn)
            render = partial(self._response_events, response)
            return self._stream(path, body, response, turn, render)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            path, body = request.url.path, await request.json()
            if (fault := self._fault(path, body)) is not None:
                return fault
            if (held := self._held(path, body)) is not None:
                return held
            try:
                completion, turn = self._chat(body)
            except ProtocolViolation as violation:
                return self._refuse(path, body, violation)
            if not body.get("stream"):
                return self._send(path, body, completion, turn)
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            render = partial(self._chat_chunks, completion, include_usage=usage)
            return self._stream(path, body, completion, turn, render)

        return app

    @contextmanager
    def serving(self) -> Iterator[OpenAIStub]:
        """Serve on a free loopback port in a background thread; `url` is the API base URL."""
        with serve_app(self.app) as base_url:
            self.url = f"{base_url}/v1"
            yield self


async def _endless(piece: bytes) -> AsyncIterator[bytes]:
    """`piece` every HOLD_INTERVAL_S for ever (an empty piece: nothing, for ever)."""
    while True:
        if piece:
            yield piece
        await asyncio.sleep(HOLD_INTERVAL_S)


def _other_protocol_event(on_chat: bool, chat_chunk: dict[str, Any]) -> bytes:
    """What the other API streams: a Responses text delta on Chat Completions, a Chat
    Completions chunk on the Responses API."""
    if on_chat:
        delta = {"type": "response.output_text.delta", "item_id": "msg_held", "delta": "and "}
        return f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n".encode()
    choice = {"index": 0, "delta": {"content": "and "}, "finish_reason": None}
    return f"data: {json.dumps({**chat_chunk, 'choices': [choice]})}\n\n".encode()


def _text_event(on_chat: bool, chat_chunk: dict[str, Any]) -> bytes:
    """A piece of text, in the API's own events."""
    return _other_protocol_event(not on_chat, chat_chunk)


class ReadsTogether(RefundProcedure):
    """The refund procedure asking for the order and the policy in one turn: two function calls
    in one answer, so their pairing with two outputs is exercised."""

    def plan(self, seen: Transcript) -> Decision:
        if seen.order_id and not seen.observations:
            reads = [("get_order", {"order_id": seen.order_id}), ("get_policy", {})]
            return Decision(tool_calls=reads)
        return super().plan(seen)


# Priced in the tests' budgets; the stub answers under whatever model name it is asked for.
MODEL = "gpt-stub"
ModelFactory = Callable[..., BaseChatModel]
