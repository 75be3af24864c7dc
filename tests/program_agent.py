"""The reference agent answering with a program: what tests/test_programs*.py run, in this
process and in the processes they crash (`--agent tests.program_agent:agent`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from loopwright import Decision, Scenario, ScriptedChatModel, parse_tool_content
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import fresh_services

REPO = Path(__file__).resolve().parent.parent
SKILL_PROGRAM = "refunds/loopwright_refunds/skills/refund-eligible-orders/refund_eligible.py"

TASK = "Refund orders O-42 and O-43 in full."
# The reference agent's own skill program: refunds each delivered order of `orders` in full, a
# refused refund caught and reported. O-42 (100.00) needs an approver, O-43 (30.00) does not.
REFUND_EACH = (REPO / SKILL_PROGRAM).read_text()


class ProgramPolicy:
    """Answers the task with one program (`code`, started with `inputs`), then reports what the
    program returned: one model step for the work, one for the answer."""

    def __init__(self, code: str = REFUND_EACH, inputs: dict[str, Any] | None = None) -> None:
        self.code = code
        self.inputs = {"orders": ["O-42", "O-43"]} if inputs is None else inputs

    def __call__(
        self, messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        asked = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        if not asked:
            return Decision.program(self.code, self.inputs)
        envelope = parse_tool_content(str(answers[-1].content))
        if envelope.status == "ok":
            return Decision(content=f"The program returned {envelope.result['returned']}.")
        return Decision(content=f"The program ended with {envelope.error}.")


def program_model(code: str = REFUND_EACH, inputs: dict[str, Any] | None = None) -> Any:
    return lambda: ScriptedChatModel(policy=ProgramPolicy(code, inputs))


# What `loopwright faults --agent tests.program_agent:agent` proves: the task as one program,
# each trial on fresh services, every approval granted as a person would.
SCENARIO = Scenario(
    task=TASK,
    user="u-1",
    approver="a-1",
    deps=fresh_services,
    model=program_model(),
    env=lambda services: services.endpoints.to_env(),
)
agent = refunds.replace(model=program_model(), scenarios=[SCENARIO])
