"""The run context: what nodes use but the checkpoint does not hold.

LangGraph injects it into every node (`Runtime[RunContext]`). It carries live objects (the model,
the journal, the application's dependencies), what the run's agent says (its instructions, tool
contracts, who may approve) and the trusted principal. Nothing in it is ever derived from model
output. A resumed run gets a fresh context from its new process; the principal of a run is taken
from the context once, on the run's first step, and kept in state (P) from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable

from loopwright.checkpoints.journal import ActionJournal
from loopwright.core.budget import Budget
from loopwright.core.plan import Planner
from loopwright.core.state import Action, Principal, RunState, utcnow
from loopwright.core.views import principal_of, started_at
from loopwright.nodes.agents import PRIMARY, AgentProfile
from loopwright.tools.contract import ToolContext, ToolContract
from loopwright.tools.registry import ToolRegistry


@dataclass
class RunContext:
    model: BaseChatModel
    tools: ToolRegistry
    journal: ActionJournal
    # What the model was built from ("" for the agent's own) and its settings, recorded in V on
    # the run's first step.
    model_spec: str = ""
    model_settings: dict[str, Any] = field(default_factory=dict)
    # The operator changes a resumed run's model to this one (`--model-change`): the gate
    # records the change in V before the model is asked anything.
    model_change: bool = False
    # The application's own dependencies (what its agent's `deps` factory opened), passed to
    # every tool function as `ctx.deps`. The runtime never looks inside.
    deps: Any = None
    # The run's agent: who it is (recorded in V) and what it tells the model.
    agent_name: str = ""
    agent_version: str = ""
    instructions: str = ""
    prompt_version: str = ""
    principal: Principal | None = None
    budget: Budget = field(default_factory=Budget)
    approval_ttl: timedelta = timedelta(hours=24)
    # The writer's fencing token; journal writes carry it (a stale writer's are refused).
    fence: int = 0
    # A deterministic planner that stands in for the model on a fixed procedure (hybrid runs).
    planner: Planner | None = None
    # Agents that can own the run (handoff); without any, one agent uses every tool.
    agents: dict[str, AgentProfile] = field(default_factory=dict)
    # Whether a user may decide approvals (the agent's answer, not the decision's).
    is_approver: Callable[[str], bool] = field(default=lambda _user: False)
    # The agent's completion check: whether the task is done given the task and the run's
    # writes (each intent's latest action). None: done when every write planned happened.
    done: Callable[[ToolContext[Any], str, list[Action]], bool] | None = None
    # The agent's claim check: the effects a final answer claims that the writes do not hold.
    claims: Callable[[ToolContext[Any], str, list[Action]], list[str]] | None = None
    # The clock every expiry and deadline is judged on: the database's (one clock for every
    # process of a run; the Python clock only where no database is at hand). In a runner's
    # attempt, the database's time at the lease's last renewal moved on by the monotonic clock
    # (`checkpoints.leases.RunWatch`): no read per step.
    clock: Callable[[], datetime] = utcnow
    # Whether someone asked for the run to stop (from outside the state), asked at every step.
    # In a runner's attempt, as of the last commit's read of the run's row (`RunWatch`): a
    # request committed while a node runs is seen by the next node.
    cancel_requested: Callable[[], bool] = field(default=lambda: False)
    # The same question read from the database at the call: asked just before a write is
    # sent, where a request made during an earlier call of the same step must count.
    cancel_requested_now: Callable[[], bool] = field(default=lambda: False)
    # Models with tools bound, by model and tool names (see `with_tools`).
    _bound: dict[tuple[int, tuple[str, ...]], Runnable[LanguageModelInput, AIMessage]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def now(self) -> datetime:
        return self.clock()

    def agent(self, owner: str | None) -> AgentProfile | None:
        return self.agents.get(owner or PRIMARY)

    def with_tools(
        self, model: BaseChatModel, tools: Sequence[ToolContract]
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """`model` with `tools` bound, once per context (a run's attempt): binding copies and
        converts every tool's schema, at every step otherwise. Keyed by the model's identity,
        which the context keeps alive (its own model or an agent's), and the tools' names."""
        key = (id(model), tuple(tool.name for tool in tools))
        if key not in self._bound:
            self._bound[key] = model.bind_tools([tool.openai_schema() for tool in tools])
        return self._bound[key]

    @property
    def model_id(self) -> str:
        """The run's first model, recorded in V."""
        return model_name(self.model)

    def tool_context(
        self, state: RunState, *, bounded: bool = False, principal: Principal | None = None
    ) -> ToolContext[Any]:
        """What this run's tool functions are given: deps, run id, principal; with `bounded`,
        the run's deadline too, so that every call's timeout is bounded by it."""
        deadline = self.budget.deadline(started_at(state)) if bounded else None
        return ToolContext(
            deps=self.deps,
            run_id=state["run_id"],
            principal=principal or principal_of(state),
            deadline=deadline,
        )


def model_name(model: BaseChatModel) -> str:
    """A model's own name (e.g. "gpt-4.1", "scripted"): what its usage is priced by."""
    return str(getattr(model, "model_name", None) or type(model).__name__)
