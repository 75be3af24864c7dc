"""Plan-and-execute: a deterministic planner runs the refund procedure through the same loop."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loopwright.core.plan import PlannerDecision, PlanStep
from loopwright.core.state import RunState, StopReason
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.workflow import RefundWorkflow
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, principal

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def test_workflow_refund_completes_verified_without_a_model_call(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner(planner=RefundWorkflow()) as runner:
        waiting = runner.start(DEMO_TASK, principal())
        # The plan gives no permission: the refund still waits for a person.
        assert waiting.waiting_for_approval[0]["summary"] == "Refund 100.00 USD to order O-42"
        outcome = approve(runner, waiting)
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason == StopReason.COMPLETED
    assert [s["status"] for s in state["plan"]] == ["done"] * 5
    assert state["usage"]["model_requests"] == 0 and state["usage"]["steps"] == 5
    assert len(list_refunds(services, "O-42")) == 1


def test_the_plan_is_revised_by_what_the_run_observes(open_test_runner: RunnerFactory) -> None:
    task = "Check whether order O-44 can be refunded and refund it if so."
    with open_test_runner(planner=RefundWorkflow()) as runner:
        outcome = runner.start(task, principal(task=task))
        plan = runner.state(outcome.run_id)["plan"]
    assert outcome.stop_reason == StopReason.COMPLETED
    assert [s["status"] for s in plan] == ["done", "done", "skipped", "skipped", "done"]


@dataclass(frozen=True)
class OverreachingPlanner:
    """Plans a refund of someone else's order: the plan says so, validate says no."""

    name: str = "overreaching"

    def decide(self, state: RunState) -> PlannerDecision:
        tried = state.get("step", 0) > 0
        plan = [PlanStep(step="refund O-99", status="failed" if tried else "todo")]
        if tried:
            return PlannerDecision(plan=plan, answer="Could not refund O-99.")
        refund = {"order_id": "O-99", "amount": "10.00", "currency": "USD", "reason": "planned"}
        return PlannerDecision(plan=plan, calls=[("submit_refund", refund)])


def test_a_plan_never_grants_permission(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    task = "Refund order O-99."
    with open_test_runner(planner=OverreachingPlanner()) as runner:
        outcome = runner.start(task, principal(task=task))
        history = runner.state(outcome.run_id)["history"]
    assert "permission_denied" in str(history[2].content)
    assert outcome.actions == []
    assert list_refunds(services, "O-99") == []
