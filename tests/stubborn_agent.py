"""An agent whose one tool swallows KeyboardInterrupt (as some client libraries' retry loops
do) and waits two minutes: what tests/test_real_models.py stops with a signal, to show that no
code in a run's path can keep the process, or the run's lease, after SIGINT or SIGTERM."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright import Agent, Decision, ScriptedChatModel, ToolContext

TASK = "Wait it out."
WAIT_S = 3600.0  # an hour: longer than any test waits for the process
# A file the tool creates once it waits: where a test knows the wait is in flight.
STARTED_ENV = "STUBBORN_STARTED"


def waits(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="Waited.")
    return Decision(tool_calls=[("wait_it_out", {"seconds": WAIT_S})])


agent: Agent[None] = Agent(
    "stubborn",
    instructions="Wait as long as you are asked to.",
    model=lambda: ScriptedChatModel(policy=waits),
)


class Wait(BaseModel):
    seconds: float


class Waited(BaseModel):
    waited: float


@agent.read()
def wait_it_out(ctx: ToolContext[None], args: Wait) -> Waited:
    """Wait, whatever interrupts the wait."""
    if started := os.environ.get(STARTED_ENV):
        Path(started).touch()
    until = time.monotonic() + args.seconds
    while (left := until - time.monotonic()) > 0:
        try:
            time.sleep(min(left, 1.0))
        except KeyboardInterrupt:
            continue
    return Waited(waited=args.seconds)
