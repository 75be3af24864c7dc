"""The refund procedure as a deterministic planner: the hybrid, workflow-style run.

It decides exactly what `RefundProcedure` would (the same reading of the conversation), but as a
`Planner`: no model call, no tokens, and a plan in state whose steps it revises from what the run
observed (an ineligible order skips the refund; a refused refund fails it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loopwright import PlannerDecision, PlanStep, RunState, StepStatus, ToolEnvelope
from loopwright_refunds.procedure import RefundProcedure, Transcript


def _status(results: list[ToolEnvelope], *, finished: bool) -> StepStatus:
    if any(r.status == "ok" for r in results):
        return "done"
    if results and finished:
        return "failed"
    return "skipped" if finished else "todo"


@dataclass(frozen=True)
class RefundWorkflow:
    name: str = "refund-workflow"
    procedure: RefundProcedure = field(default_factory=RefundProcedure)

    def decide(self, state: RunState) -> PlannerDecision:
        seen = Transcript.read(state["history"])
        decision = self.procedure.plan(seen)
        finished = not decision.tool_calls
        order = seen.order_id or "the order"
        plan = [
            PlanStep(
                step=f"read {order}", status=_status(seen.results("get_order"), finished=finished)
            ),
            PlanStep(
                step="read the refund policy",
                status=_status(seen.results("get_policy"), finished=finished),
            ),
            PlanStep(
                step=f"refund {order} if eligible",
                status=_status(seen.results("submit_refund"), finished=finished),
            ),
            PlanStep(
                step="confirm the refund",
                status=_status(seen.results("get_refund_status"), finished=finished),
            ),
            PlanStep(step="report the outcome", status="done" if finished else "todo"),
        ]
        return PlannerDecision(plan=plan, calls=decision.tool_calls, answer=decision.content)
