"""Plan-and-execute on the same loop: a plan is state, revisable, and never a permission.

A plan is a short list of steps with a status each. Whoever decides the run's next step (the
model, or a deterministic `Planner` standing in for it on fixed procedures) may revise it from
what the run has observed; compile_context shows it to the model as the current plan. It grants
nothing: every call a plan leads to still passes validate, approval and the journal.

A `Planner` makes the hybrid "workflow" case: a fixed procedure decides each step
deterministically (no model call, no tokens), through the same nodes, journal and checks.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from loopwright.core.state import RunState

StepStatus = Literal["todo", "done", "failed", "skipped"]
"""The status of a plan step."""


class PlanStep(BaseModel):
    """One step of a plan: what, its status, and a note (shown to the model, never a permission)."""

    step: str
    status: StepStatus = "todo"
    note: str = ""


class PlannerDecision(BaseModel):
    """The next step: tool calls to request, or a final answer; and the plan as revised."""

    plan: list[PlanStep]
    calls: list[tuple[str, dict[str, Any]]] = Field(default_factory=list)
    answer: str = ""


class Planner(Protocol):
    """Decides a run's next step without a model. Must be a pure function of the state."""

    name: str

    def decide(self, state: RunState) -> PlannerDecision: ...


def describe_plan(plan: list[dict[str, Any]]) -> list[str]:
    steps = [PlanStep.model_validate(p) for p in plan]
    return [f"- [{s.status}] {s.step}" + (f" ({s.note})" if s.note else "") for s in steps]
