"""Handoff: a second agent that takes ownership of the run, with its own scoped tools.

An `AgentProfile` names an agent, the tools it may use, its own instructions, and optionally its
own model or deterministic planner. The run's first agent hands off by calling the handoff tool
of a profile (`handoff_to_<name>`); the runtime records the new owner and runs the specialist as
a subgraph of the same loop. Owner and specialist share the run's budget and journal, so an intent
one of them planned is the same intent for the other: no second effect through a handoff.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from loopwright.core.plan import Planner
from loopwright.tools.contract import Effect, ToolArgs, ToolContext, ToolContract

HANDOFF_PREFIX = "handoff_to_"
PRIMARY = "primary"


@dataclass(frozen=True)
class AgentProfile:
    """A specialist within an agent: its name, the tools it may use, its own instructions and
    optionally its own model or planner. The run hands off to it with `handoff_to_<name>`."""

    name: str
    tools: tuple[str, ...]
    instructions: str = ""
    model: BaseChatModel | None = None
    planner: Planner | None = None
    can_hand_off_to: tuple[str, ...] = field(default_factory=tuple)

    @property
    def handoff_tool(self) -> str:
        return f"{HANDOFF_PREFIX}{self.name}"


class HandoffArgs(ToolArgs):
    reason: str = Field(min_length=1, max_length=500, description="Why this agent should take over")


class Handoff(BaseModel):
    owner: str
    reason: str


def handoff_contract(profile: AgentProfile) -> ToolContract:
    """The tool that passes ownership to `profile`. It touches no business system."""

    def run(_ctx: ToolContext[Any], args: Any, _key: str | None) -> dict[str, Any]:
        return Handoff(owner=profile.name, reason=args.reason).model_dump()

    return ToolContract(
        name=profile.handoff_tool,
        description=f"Hand the task over to the {profile.name} agent, which continues it.",
        args_model=HandoffArgs,
        output_model=Handoff,
        effect=Effect.READ,
        run=run,
    )


def handoff_target(tool: str) -> str | None:
    return tool.removeprefix(HANDOFF_PREFIX) if tool.startswith(HANDOFF_PREFIX) else None


def allowed_tools(
    owner: str | None, agents: dict[str, AgentProfile], all_tools: Iterable[str]
) -> list[str]:
    """The tools the run's current owner may use now. Without profiles: every tool."""
    names = sorted(all_tools)
    profile = agents.get(owner or PRIMARY)
    if profile is None:
        return names
    handoffs = {agents[n].handoff_tool for n in profile.can_hand_off_to if n in agents}
    return [n for n in names if n in profile.tools or n in handoffs]
