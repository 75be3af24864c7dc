"""The reference agent with a model that asks for a refund the refund window forbids, then
claims it was made in words the agent's claim check does not know: what a script reading
`loopwright run --json` must still tell from a refund (tests/test_cli_json.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Decision, ScriptedChatModel
from loopwright_refunds.agent import agent as refunds

TASK = "Refund order O-44."  # delivered 90 days ago: outside the refund window
CLAIM = "Refund issued for O-44 (80.00 USD)."


def refunds_then_claims(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content=CLAIM)
    args = {"order_id": "O-44", "amount": "80.00", "currency": "USD", "reason": "asked"}
    return Decision(tool_calls=[("submit_refund", args)])


agent = refunds.replace(model=lambda: ScriptedChatModel(policy=refunds_then_claims))
