"""A long task for the scripted model: read the same order N times, then answer.

Used to measure how checkpoint storage grows with the number of steps (tests and benchmarks):
every step adds one AI message, one tool result and one evidence item of about the same size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from models.refund_procedure import Transcript
from models.scripted import Decision


@dataclass(frozen=True)
class KeepsReading:
    """A `Policy` that calls get_order on the task's order `reads` times, then answers."""

    reads: int

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        done = sum(1 for m in messages if isinstance(m, AIMessage))
        order_id = Transcript.read(messages).order_id or "O-42"
        if done < self.reads:
            return Decision(tool_calls=[("get_order", {"order_id": order_id})])
        return Decision(content=f"Read order {order_id} {self.reads} times.")
