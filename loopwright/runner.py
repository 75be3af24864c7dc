"""Run and resume agent runs in this process, against SQLite (default) or Postgres.

`Runner` owns what one process needs to advance runs: the compiled graph with its checkpointer,
the action journal, an HTTP client for the business services and the model. Runs are LangGraph
threads; the thread id is the run id. Every run is streamed with `durability="sync"`, so each
node's update is committed before the next node starts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from checkpoints.factory import open_checkpointer
from checkpoints.journal import ActionJournal, open_journal
from graph.budget import Budget
from graph.build import RUN_DURABILITY, compile_graph
from graph.context import RunContext
from graph.state import Action, Phase, Principal, RunState, initial_state
from services.endpoints import ServiceEndpoints
from tools.contract import ToolEnv
from tools.registry import ToolRegistry, refund_registry

# Called with (node name, that node's update) after each committed step, e.g. to print a timeline.
StepListener = Callable[[str, dict[str, Any]], None]


@dataclass
class RunOutcome:
    """Where a run stands after this process stopped advancing it."""

    run_id: str
    phase: str
    stop_reason: str | None
    stop_detail: str
    verification: dict[str, Any] | None
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)

    @property
    def waiting_for_approval(self) -> list[dict[str, Any]]:
        return [i for i in self.interrupts if i.get("kind") == "approval"]


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


class Runner:
    def __init__(
        self,
        *,
        graph: Any,
        journal: ActionJournal,
        env: ToolEnv,
        model: BaseChatModel,
        tools: ToolRegistry,
        budget: Budget,
    ) -> None:
        self.graph = graph
        self.journal = journal
        self.env = env
        self.model = model
        self.tools = tools
        self.budget = budget

    def config(self, run_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": run_id}, "recursion_limit": 10_000}

    def context(self, principal: Principal | None) -> RunContext:
        return RunContext(
            model=self.model,
            tools=self.tools,
            env=self.env,
            journal=self.journal,
            principal=principal,
            budget=self.budget,
        )

    def start(
        self,
        task: str,
        principal: Principal,
        *,
        run_id: str | None = None,
        on_step: StepListener | None = None,
    ) -> RunOutcome:
        run_id = run_id or new_run_id()
        return self._advance(run_id, initial_state(run_id, task), principal, on_step)

    def resume(
        self, run_id: str, value: Any = None, *, on_step: StepListener | None = None
    ) -> RunOutcome:
        """Continue a run: after a crash (value None) or with the answer to its interrupt."""
        snapshot = self.graph.get_state(self.config(run_id))
        if not snapshot.values:
            raise UnknownRun(run_id)
        payload: Any = Command(resume=value) if snapshot.interrupts else None
        return self._advance(run_id, payload, None, on_step)

    def _advance(
        self, run_id: str, payload: Any, principal: Principal | None, on_step: StepListener | None
    ) -> RunOutcome:
        for chunk in self.graph.stream(
            payload,
            self.config(run_id),
            context=self.context(principal),
            durability=RUN_DURABILITY,
            stream_mode="updates",
        ):
            for node, update in chunk.items():
                if on_step is not None and node != "__interrupt__":
                    on_step(node, update or {})
        return self.outcome(run_id)

    def state(self, run_id: str) -> RunState:
        values = self.graph.get_state(self.config(run_id)).values
        if not values:
            raise UnknownRun(run_id)
        return values  # type: ignore[no-any-return]

    def outcome(self, run_id: str) -> RunOutcome:
        snapshot = self.graph.get_state(self.config(run_id))
        values = snapshot.values
        if not values:
            raise UnknownRun(run_id)
        interrupts = [i.value | {"interrupt_id": i.id} for i in snapshot.interrupts]
        phase = values.get("phase", Phase.READY)
        if any(i.get("kind") == "approval" for i in interrupts):
            phase = Phase.WAITING_APPROVAL
        elif any(i.get("kind") == "reconcile_wait" for i in interrupts):
            phase = Phase.RECONCILING
        return RunOutcome(
            run_id=run_id,
            phase=str(phase),
            stop_reason=values.get("stop_reason"),
            stop_detail=values.get("stop_detail", ""),
            verification=values.get("verification"),
            interrupts=interrupts,
            actions=self.journal.for_run(run_id),
        )


class UnknownRun(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id} in this database")
        self.run_id = run_id


@contextmanager
def open_runner(
    database_url: str,
    endpoints: ServiceEndpoints,
    *,
    model: BaseChatModel,
    tools: ToolRegistry | None = None,
    budget: Budget | None = None,
) -> Iterator[Runner]:
    with ExitStack() as stack:
        saver = stack.enter_context(open_checkpointer(database_url))
        journal = stack.enter_context(open_journal(database_url))
        http = stack.enter_context(httpx.Client())
        yield Runner(
            graph=compile_graph(saver),
            journal=journal,
            env=ToolEnv(endpoints=endpoints, http=http),
            model=model,
            tools=tools or refund_registry(),
            budget=budget or Budget(),
        )
