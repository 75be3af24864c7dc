"""The stream chunks a served run hands its engine, with the history's messages already dumped.

A values chunk is the whole state, and its history (langchain messages, the one channel that is
not JSON-native) grows by a message or two a step. Both engines encode every chunk as it comes:
Aegra walks each message's `model_dump()` item by item (`GeneralSerializer`, for its Redis
broker and its SSE), LangGraph's server dumps it for orjson. So a run of n steps had its
messages dumped and walked some n²/2 times, the largest part of an Aegra instance's own work on
a run (`benchmarks.served_cost`). Here each message is dumped once an attempt and the chunk
carries the dump: both engines encode it to the same bytes (a dump is JSON-native where the
message's fields are; where one is not, the engine's encoder is still called for it).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

VALUES = "values"


class DumpedHistory:
    """Chunks of one attempt's stream, values chunks with their history dumped (each message
    once: a message object of the history is the same object from chunk to chunk)."""

    def __init__(self, stream_mode: Any) -> None:
        # A mode named alone streams its chunks bare; a list of modes as (mode, data), or with
        # subgraphs (namespace, mode, data).
        self._bare = stream_mode == VALUES
        self._dumps: dict[int, tuple[BaseMessage, dict[str, Any]]] = {}

    def __call__(self, chunk: Any) -> Any:
        if self._bare:
            return self._values(chunk)
        if isinstance(chunk, tuple) and len(chunk) >= 2 and chunk[-2] == VALUES:
            return (*chunk[:-1], self._values(chunk[-1]))
        return chunk

    def _values(self, data: Any) -> Any:
        history = data.get("history") if isinstance(data, dict) else None
        if not isinstance(history, list):
            return data
        return {**data, "history": [self._dump(message) for message in history]}

    def _dump(self, message: Any) -> Any:
        if not isinstance(message, BaseMessage):
            return message
        # The message itself is kept beside its dump, so that its id is not reused meanwhile.
        kept = self._dumps.get(id(message))
        if kept is None or kept[0] is not message:
            kept = self._dumps[id(message)] = (message, message.model_dump())
        return kept[1]
