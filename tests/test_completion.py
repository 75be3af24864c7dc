""" "Completed" means the task's effects happened, verified in the business system.

A run whose planned write failed or was refused does not end COMPLETED (the model is told,
then the run ends `not_done` naming the write); several writes on one resource verify as the
run's final intended state and each write's own outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright import (
    Action,
    Agent,
    Decision,
    Guarantee,
    ReconcileResult,
    ReconcileStatus,
    ScriptedChatModel,
    ToolContext,
    ToolDefinitionError,
    ToolFault,
    VerifyResult,
    open_runner,
)
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.services.admin import create_order
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import RunnerFactory, all_refunds, principal

SMALL_REFUND_TASK = "Check whether order O-43 can be refunded and refund it if so."


def refused_by_payments(ctx: ToolContext[Any], args: Any, key: str | None) -> dict[str, Any]:
    raise ToolFault("amount_exceeds_refundable", "payments says nothing is left to refund")


def test_a_refund_the_downstream_refuses_never_ends_completed(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    submit = refunds.tools.get("submit_refund")
    assert submit is not None
    refusing = dataclasses.replace(submit, run=refused_by_payments)
    tools = [refusing if t.name == "submit_refund" else t for t in refunds.tools]
    with open_test_runner(tools=tools) as runner:
        outcome = runner.start(SMALL_REFUND_TASK, principal(task=SMALL_REFUND_TASK))
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "not_done")
    [action] = outcome.actions
    assert action.status == "FAILED"
    assert (
        action.action_id in outcome.stop_detail
        and "amount_exceeds_refundable" in outcome.stop_detail
    )
    facts = (outcome.verification or {})["facts"]
    assert facts["writes"] == [] and facts["task_done"] is False
    # What the model said, kept apart from the runtime's account of the run.
    assert "was not made" in facts["model_answer"]
    assert facts["answer"].startswith("no business effect: ")
    refused = "refused by the business system: submit_refund (amount_exceeds_refundable"
    assert refused in facts["answer"]
    assert all_refunds(services) == []


def test_a_business_record_the_agents_check_cannot_read_ends_the_run_typed(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """An order whose currency holds markup: the refund agent's completion check raises on it.
    The run ends INCOMPLETE, its detail naming the check and what it refused, where verify
    crashed (a served run was left in READY with no stop reason)."""
    create_order(services, "O-701", "u-1", "20.00", currency="<b>USD</b>")
    task = "Check whether order O-701 can be refunded and refund it if so."
    with open_test_runner() as runner:
        outcome = runner.start(task, principal(task=task))
    assert outcome.phase == "INCOMPLETE" and outcome.stop_reason is not None
    assert "completion check failed: ValidationError: currency" in outcome.stop_detail
    assert all_refunds(services) == []


# --- two writes on one resource -------------------------------------------------------------


@dataclass
class Switchboard:
    """An in-memory business system: each service has one status, and a log of changes."""

    status: dict[str, str] = field(default_factory=dict)
    changes: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (name, status)


class SetStatus(BaseModel):
    name: str
    status: str


def set_status(ctx: ToolContext[Switchboard], args: SetStatus, intent_key: str) -> SetStatus:
    """Set a service's status."""
    ctx.deps.changes.setdefault(intent_key, (args.name, args.status))
    ctx.deps.status[args.name] = args.status
    return args


def applied(ctx: ToolContext[Switchboard], action: Action) -> ReconcileResult:
    if action.intent_key in ctx.deps.changes:
        return ReconcileResult(ReconcileStatus.APPLIED, outcome=action.args)
    return ReconcileResult(ReconcileStatus.ABSENT)


def status_is_as_set(ctx: ToolContext[Switchboard], action: Action) -> VerifyResult:
    """Verified against today's status: true of the latest change only."""
    now = ctx.deps.status.get(action.args["name"])
    if now == action.args["status"]:
        return VerifyResult(True, {"status": now})
    return VerifyResult(False, {}, f"{action.args['name']} is {now}, not {action.args['status']}")


def down_then_up(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    done = sum(isinstance(m, ToolMessage) for m in messages)
    steps = [("set_status", {"name": "web", "status": s}) for s in ("down", "up")]
    return Decision(tool_calls=[steps[done]]) if done < len(steps) else Decision(content="Done.")


def switchboard(*, replaces: tuple[str, ...]) -> Agent[Switchboard]:
    ops: Agent[Switchboard] = Agent(
        "switchboard",
        instructions="Take the service down for maintenance, then up again.",
        boundary=lambda deps, principal, task: {"service:web"},
        model=ScriptedChatModel(policy=down_then_up),
    )
    ops.write(
        set_status,
        intent=lambda run_id, a: f"status:{run_id}:{a.name}:{a.status}",
        guarantee=Guarantee.IDEMPOTENT_BY_KEY,
        reconcile=applied,
        verify=status_is_as_set,
        needs_approval=False,
        resources=lambda a: {f"service:{a.name}"},
        replaces=replaces,
    )
    return ops


def test_writes_on_one_resource_verify_as_the_runs_final_intended_state(tmp_path: Path) -> None:
    """A status set again replaces the first (declared): the latest is checked against the
    system, the earlier by its own outcome."""
    board = Switchboard()
    ops = switchboard(replaces=("set_status",))
    with open_runner(f"sqlite:///{tmp_path / 'db.sqlite3'}", ops, deps=board) as runner:
        task = "maintenance on web"
        outcome = runner.start(task, runner.principal_for("ana", task))
    assert outcome.stop_reason == "completed", outcome.stop_detail
    first, second = (outcome.verification or {})["facts"]["writes"]
    assert first["superseded_by"] == second["action_id"]  # checked by its own outcome
    assert second["status"] == "up"  # the final state, checked against the system
    assert board.status == {"web": "up"}


def test_writes_that_only_share_a_resource_are_each_verified(tmp_path: Path) -> None:
    """Without `replaces`, touching one resource is no replacement: the first write's verify
    runs too (a credit and a close of one ticket are two effects). Here it finds the status
    changed since, so the run is not taken for verified."""
    board = Switchboard()
    ops = switchboard(replaces=())
    with open_runner(f"sqlite:///{tmp_path / 'db.sqlite3'}", ops, deps=board) as runner:
        task = "maintenance on web"
        outcome = runner.start(task, runner.principal_for("ana", task))
    assert outcome.stop_reason != "completed"
    assert "web is up, not down" in outcome.stop_detail, outcome.stop_detail
    assert board.status == {"web": "up"}


def test_a_write_replacing_a_tool_the_agent_does_not_have_is_refused() -> None:
    with pytest.raises(ToolDefinitionError, match="replaces names set_state, which agent"):
        switchboard(replaces=("set_state",)).check()
