"""The run context: what nodes use but the checkpoint does not hold.

LangGraph injects it into every node (`Runtime[RunContext]`). It carries live objects (the model,
the journal, the HTTP client) and the trusted principal. Nothing in it is ever derived from model
output. A resumed run gets a fresh context from its new process; the principal of a run is taken
from the context once, on the run's first step, and kept in state (P) from then on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from langchain_core.language_models import BaseChatModel

from loopwright.checkpoints.journal import ActionJournal
from loopwright.graph.agents import PRIMARY, AgentProfile
from loopwright.graph.budget import Budget
from loopwright.graph.plan import Planner
from loopwright.graph.state import Principal, utcnow
from loopwright.tools.contract import ToolEnv
from loopwright.tools.registry import ToolRegistry

PROMPT_VERSION = "refund-agent/1"


@dataclass
class RunContext:
    model: BaseChatModel
    tools: ToolRegistry
    env: ToolEnv
    journal: ActionJournal
    principal: Principal | None = None
    budget: Budget = field(default_factory=Budget)
    approval_ttl: timedelta = timedelta(hours=24)
    prompt_version: str = PROMPT_VERSION
    # The writer's fencing token; journal writes carry it (a stale writer's are refused).
    fence: int = 0
    # A deterministic planner that stands in for the model on a fixed procedure (hybrid runs).
    planner: Planner | None = None
    # Agents that can own the run (handoff); without any, one agent uses every tool.
    agents: dict[str, AgentProfile] = field(default_factory=dict)
    # Whether a user may decide approvals (the trusted directory's answer, not the decision's).
    is_approver: Callable[[str], bool] = field(default=lambda _user: False)
    # Whether someone asked for the run to stop (read at every step, from outside the state).
    cancel_requested: Callable[[], bool] = field(default=lambda: False)

    def now(self) -> datetime:
        return utcnow()

    def agent(self, owner: str | None) -> AgentProfile | None:
        return self.agents.get(owner or PRIMARY)

    @property
    def model_id(self) -> str:
        """The run's first model, recorded in V."""
        return model_name(self.model)


def model_name(model: BaseChatModel) -> str:
    """A model's own name (e.g. "gpt-4.1", "scripted-refund-v1"): what its usage is priced by."""
    return str(getattr(model, "model_name", None) or type(model).__name__)
