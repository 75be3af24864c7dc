"""An agent whose one tool has a bug: it raises an error nothing in the runtime expects (not a
`ToolFault`), so every attempt at its runs fails until the run ends typed (the attempt's failure
rule, `loopwright.attempt`), whichever process or engine makes the attempts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright import Agent, Decision, ScriptedChatModel, ToolContext

TASK = "Read the ledger."
BUG = "ledger client bug"


def reads_the_ledger(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="Read.")
    return Decision(tool_calls=[("read_ledger", {})])


agent: Agent[None] = Agent(
    "buggy",
    instructions="Read the ledger when asked.",
    model=lambda: ScriptedChatModel(policy=reads_the_ledger),
)


class NoArgs(BaseModel):
    pass


class Ledger(BaseModel):
    entries: int


@agent.read()
def read_ledger(ctx: ToolContext[None], args: NoArgs) -> Ledger:
    """Read the ledger (its client has a bug)."""
    raise RuntimeError(BUG)
