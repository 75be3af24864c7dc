"""A long task for the scripted model: read orders in turn, N times, then answer.

Used to measure how checkpoint storage grows with the number of steps (tests and benchmarks):
every step adds one AI message, one tool result and one evidence item of about the same size.
It cycles through the orders the task names, so consecutive steps observe different things and
the run is not mistaken for one without progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from loopwright import Decision
from loopwright_refunds.procedure import ORDER_ID


@dataclass(frozen=True)
class KeepsReading:
    """A `Policy` that calls get_order `reads` times, cycling over the task's orders."""

    reads: int

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        done = sum(1 for m in messages if isinstance(m, AIMessage))
        task = next((m.text for m in messages if isinstance(m, HumanMessage)), "")
        orders = ORDER_ID.findall(task) or ["O-42"]
        if done < self.reads:
            return Decision(tool_calls=[("get_order", {"order_id": orders[done % len(orders)]})])
        return Decision(content=f"Read orders {', '.join(orders)} {self.reads} times in all.")
