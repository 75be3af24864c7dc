"""Loop control: every typed stop reason, one retry layer, no-progress, parallel tools, cancel."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import pytest
from fastapi import FastAPI, Response
from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import open_lease_store
from loopwright.core.budget import Budget
from loopwright.core.protocol import parse_tool_content
from loopwright.core.state import ActionStatus, StopReason
from loopwright.nodes import validate as validate_node
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner, open_runner
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.tools.contract import Effect, ToolArgs, ToolContext, ToolContract
from loopwright.tools.http import read_json
from loopwright_refunds.agent import RefundServices, connect
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.long_task import KeepsReading
from loopwright_refunds.procedure import RefundProcedure
from loopwright_refunds.services.admin import (
    list_refunds,
    requests_seen,
    set_fault,
    slow_down,
    update_order,
)
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.store_credit import STORE_CREDIT
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, decide, principal, wait_for
from tests.stub_server import serve_app

# The loop's decisions do not depend on the backend (the storage suites cover both); SQLite only.
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

READ_TASK = "Read orders O-42, O-43 and O-44 in turn."


def scripted(policy: Any) -> ScriptedChatModel:
    return ScriptedChatModel(policy=policy)


def results(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [
        parse_tool_content(str(m.content)).model_dump()
        for m in messages
        if isinstance(m, ToolMessage)
    ]


def run(runner: Runner, task: str) -> RunOutcome:
    return runner.start(task, principal(task=task))


# --- the nine stop reasons -------------------------------------------------------------------


def test_completed_means_verified(open_test_runner: RunnerFactory) -> None:
    with open_test_runner() as runner:
        outcome = run(runner, "Check whether order O-44 can be refunded and refund it if so.")
    assert outcome.stop_reason == StopReason.COMPLETED
    assert outcome.verification is not None and outcome.verification["verified"]


def test_max_steps(open_test_runner: RunnerFactory) -> None:
    with open_test_runner(
        model=scripted(KeepsReading(reads=10)), budget=Budget(max_steps=3)
    ) as runner:
        outcome = run(runner, READ_TASK)
        assert runner.state(outcome.run_id)["usage"]["model_requests"] == 3
    assert outcome.stop_reason == StopReason.MAX_STEPS


def test_deadline_exceeded(open_test_runner: RunnerFactory) -> None:
    # Every other limit out of reach, however fast the machine gets through steps in 1 s.
    unlimited = {"max_steps": 10**6, "max_tool_attempts": 10**6, "max_input_tokens": 10**9}
    with open_test_runner(
        model=scripted(KeepsReading(reads=10**6)), budget=Budget(deadline_s=1.0, **unlimited)
    ) as runner:
        outcome = run(runner, READ_TASK)
    # The model reads forever and every other limit is out of reach: only the deadline ends it.
    assert outcome.stop_reason == StopReason.DEADLINE_EXCEEDED


def test_deadline_bounds_each_call_own_timeout(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call waits no longer than what is left of the run's deadline: the timeouts the
    tools were given, not how long the run took (which a loaded machine stretches)."""
    given: list[tuple[float, float]] = []  # (a tool's own timeout, the one it was given)
    own_timeout = ToolContext.timeout

    def recorded(ctx: ToolContext[Any], seconds: float) -> float:
        bounded = own_timeout(ctx, seconds)
        if ctx.deadline is not None:  # a call of the run's (not one made before it began)
            given.append((seconds, bounded))
        return bounded

    monkeypatch.setattr(ToolContext, "timeout", recorded)
    slow_down(services.policies, 8.0)  # slower than the read timeout, far past the deadline
    with open_test_runner(budget=Budget(deadline_s=1.5)) as runner:
        outcome = run(runner, DEMO_TASK)
    assert outcome.stop_reason == StopReason.DEADLINE_EXCEEDED
    assert given and all(bounded <= 1.5 for _, bounded in given), given
    assert any(own > 1.5 for own, _ in given), given  # not the 5 s read timeout


def submits_at_once(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """A refund of O-42 asked for before anything is read; then the end."""
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="Done.")
    args = {"order_id": "O-42", "amount": "20.00", "currency": "USD", "reason": "damaged"}
    return Decision(tool_calls=[("submit_refund", args)])


def test_a_writes_precondition_reads_are_bounded_by_the_runs_deadline(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a write's preconditions reads the business system (the refund's order and
    policy): those reads get what is left of the run's deadline, as a tool's own reads do, so a
    slow policy service cannot hold the run past it (they were given their own 5 s)."""
    given: list[tuple[bool, float, float]] = []  # (bounded by a deadline, own timeout, given)
    own_timeout = ToolContext.timeout

    def recorded(ctx: ToolContext[Any], seconds: float) -> float:
        bounded = own_timeout(ctx, seconds)
        # The validate node's reads (verify's, once the deadline has passed, are not bounded:
        # the run's ending must still say what it did).
        if any(frame.filename == validate_node.__file__ for frame in inspect.stack()):
            given.append((ctx.deadline is not None, seconds, bounded))
        return bounded

    monkeypatch.setattr(ToolContext, "timeout", recorded)
    slow_down(services.policies, 8.0)  # slower than the read timeout, far past the deadline
    with open_test_runner(model=scripted(submits_at_once), budget=Budget(deadline_s=1.5)) as runner:
        outcome = run(runner, DEMO_TASK)
    assert outcome.stop_reason == StopReason.DEADLINE_EXCEEDED
    assert given and all(deadline and bounded <= 1.5 for deadline, _, bounded in given), given
    assert any(own > 1.5 for _, own, _ in given), given  # not the 5 s read timeout
    assert list_refunds(services, "O-42") == []


def test_budget_exhausted_by_tokens(open_test_runner: RunnerFactory) -> None:
    with open_test_runner(
        model=scripted(KeepsReading(reads=100)), budget=Budget(max_input_tokens=2_000)
    ) as runner:
        outcome = run(runner, READ_TASK)
        used = runner.state(outcome.run_id)["usage"]["input_tokens"]
    assert outcome.stop_reason == StopReason.BUDGET_EXHAUSTED
    assert used >= 2_000


def same_read_forever(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    return Decision(tool_calls=[("get_order", {"order_id": "O-42"})])


def test_no_progress_nudges_once_then_stops(open_test_runner: RunnerFactory) -> None:
    with open_test_runner(model=scripted(same_read_forever)) as runner:
        outcome = run(runner, "Look at order O-42.")
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason == StopReason.NO_PROGRESS
    assert state["nudged"] is True
    # Three identical steps earn the strategy-change message; the fourth identical one stops.
    assert state["usage"]["model_requests"] == 4


def reads_other_users_order(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    return Decision(tool_calls=[("get_order", {"order_id": "O-99"})])


def test_permission_denied_is_not_retried(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner(model=scripted(reads_other_users_order)) as runner:
        outcome = run(runner, "Look at order O-99.")
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason == StopReason.PERMISSION_DENIED
    assert [r["error"]["code"] for r in results(state["history"])] == ["permission_denied"] * 2
    assert state["usage"]["model_requests"] == 2  # one corrective turn, then stop


def test_tool_unavailable_after_exactly_the_single_retry_layer(
    database_url: str, services: ServiceEndpoints
) -> None:
    hits: list[float] = []
    app = FastAPI()

    @app.get("/policies/refunds")
    async def down() -> Response:
        hits.append(time.monotonic())
        return Response(status_code=503, content=b'{"error":"unavailable"}')

    with serve_app(app) as url:
        broken = services.model_copy(update={"policies": url})
        with (
            connect(broken) as deps,
            open_runner(
                database_url, refunds, deps=deps, model=scripted(RefundProcedure())
            ) as runner,
        ):
            outcome = run(runner, DEMO_TASK)
    assert outcome.stop_reason == StopReason.TOOL_UNAVAILABLE
    # get_policy is tried max_attempts times by the one retry layer, never more.
    get_policy = refunds.tools.get("get_policy")
    assert get_policy is not None
    assert len(hits) == get_policy.max_attempts == 2


def test_needs_human_when_an_unknown_outcome_cannot_be_confirmed(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "accept_then_timeout", delay_s=6, no_query=True)
    with open_test_runner() as runner:
        outcome = approve(runner, run(runner, DEMO_TASK))
    assert outcome.stop_reason == StopReason.NEEDS_HUMAN


def test_cancel_during_a_slow_write_reconciles_it_and_starts_nothing_new(
    database_url: str, open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner() as runner:
        waiting = run(runner, DEMO_TASK)
        slow_down(services.payments, 2.0, methods=("POST",))

        failed: list[BaseException] = []

        def cancel_mid_write() -> None:
            # Once the refund is dispatched (its request then takes 2 s), not after a guess.
            try:
                with (
                    open_journal(database_url) as journal,
                    open_lease_store(database_url) as leases,
                ):
                    wait_for(
                        lambda: (
                            [a.status for a in journal.for_run(waiting.run_id)]
                            == [ActionStatus.DISPATCHED]
                        )
                    )
                    leases.request_cancel(waiting.run_id)
            except BaseException as exc:
                failed.append(exc)

        canceller = threading.Thread(target=cancel_mid_write)
        canceller.start()
        outcome = approve(runner, waiting)
        canceller.join()
        assert failed == []
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason == StopReason.CANCELLED
    [action] = outcome.actions
    assert action.status is ActionStatus.SUCCEEDED  # the write in flight was settled, not lost
    assert state["usage"]["model_requests"] == 3  # no model step after the cancel
    [refund] = list_refunds(services, "O-42")  # the business system agrees with the report
    assert refund["refund_id"] == action.outcome["refund_id"]  # type: ignore[index]
    assert outcome.compensations and "cannot be undone by the runtime" in outcome.compensations[0]


def test_cancel_while_waiting_for_approval_sends_nothing(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner() as runner:
        waiting = run(runner, DEMO_TASK)
        outcome = runner.cancel(waiting.run_id)
    assert outcome.stop_reason == StopReason.CANCELLED
    assert [a.status for a in outcome.actions] == [ActionStatus.CANCELLED]
    assert list_refunds(services, "O-42") == []


# --- polling is not a loop -------------------------------------------------------------------


class StatusArgs(ToolArgs):
    job: str


class Status(BaseModel):
    job: str
    status: str


def test_polling_a_pending_tool_is_not_mistaken_for_no_progress(
    open_test_runner: RunnerFactory,
) -> None:
    polls: list[float] = []
    app = FastAPI()

    @app.get("/jobs/{job}")
    async def job_status(job: str) -> Status:
        polls.append(time.monotonic())
        return Status(job=job, status="pending" if len(polls) <= 5 else "done")

    def poll_until_done(
        messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        seen = results(messages)
        if seen and seen[-1]["result"]["status"] == "done":
            return Decision(content="The job is done.")
        return Decision(tool_calls=[("job_status", {"job": "j-1"})])

    with serve_app(app) as url:

        def read_status(
            ctx: ToolContext[RefundServices], args: StatusArgs, _key: str | None
        ) -> dict[str, Any]:
            return read_json(ctx.deps.http, f"{url}/jobs/{args.job}", timeout=ctx.timeout(5.0))

        job_status_tool = ToolContract(
            name="job_status",
            description="Status of a background job.",
            args_model=StatusArgs,
            output_model=Status,
            effect=Effect.READ,
            run=read_status,
            poll_after=lambda result: 0.05 if result["status"] == "pending" else None,
        )
        with open_test_runner(model=scripted(poll_until_done), tools=[job_status_tool]) as runner:
            outcome = run(runner, "Wait for job j-1.")
    assert outcome.stop_reason == StopReason.COMPLETED
    assert len(polls) == 6
    assert min(b - a for a, b in pairwise(polls)) >= 0.05  # it waited as asked


# --- conflict-aware parallel execution ------------------------------------------------------


def overlapping(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["started"] < b["ended"] and b["started"] < a["ended"])


def two_reads_then_answer(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    if results(messages):
        return Decision(content="Read both.")
    return Decision(tool_calls=[("get_order", {"order_id": "O-42"}), ("get_policy", {})])


def test_two_reads_run_concurrently(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner(model=scripted(two_reads_then_answer)) as runner:
        # Each read takes 2 s at its service: run side by side, they overlap unless the second
        # starts 2 s after the first, which a loaded machine does not make of a thread start.
        slow_down(services.orders, 2.0)
        slow_down(services.policies, 2.0)
        outcome = run(runner, "Read order O-42 and the refund policy.")
    assert outcome.stop_reason == StopReason.COMPLETED
    order_read = [r for r in requests_seen(services.orders) if r["path"] == "/orders/O-42"][-1]
    policy_read = [r for r in requests_seen(services.policies) if r["path"] == "/policies/refunds"][
        -1
    ]
    assert overlapping(order_read, policy_read)


def two_writes_on_one_order(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    seen = results(messages)
    if not seen:
        return Decision(tool_calls=[("get_order", {"order_id": "O-43"})])
    if len(seen) == 1:
        # The credit leaves the order's version alone, so the refund after it is still current;
        # the other way round the refund would bump the version and the credit be refused stale.
        return Decision(
            tool_calls=[
                (
                    "issue_store_credit",
                    {"order_id": "O-43", "amount": "5.00", "currency": "USD", "note": "sorry"},
                ),
                (
                    "submit_refund",
                    {"order_id": "O-43", "amount": "10.00", "currency": "USD", "reason": "late"},
                ),
            ]
        )
    return Decision(content="Refunded and credited.")


def test_two_writes_on_one_order_never_overlap(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    tools = [*refunds.tools, STORE_CREDIT]
    with open_test_runner(model=scripted(two_writes_on_one_order), tools=tools) as runner:
        slow_down(services.payments, 0.5, methods=("POST",))
        outcome = run(runner, "Refund and credit order O-43.")
    assert [a.status for a in outcome.actions] == [ActionStatus.SUCCEEDED] * 2
    writes = [r for r in requests_seen(services.payments) if r["method"] == "POST"]
    assert len(writes) == 2
    assert not overlapping(writes[0], writes[1])


def test_write_planned_on_an_old_version_is_refused(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    def concurrent_change_then_refund(
        messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        seen = results(messages)
        if not seen:
            return Decision(tool_calls=[("get_order", {"order_id": "O-43"})])
        if len(seen) == 1:
            update_order(services, "O-43", amount="31.00")  # another agent changes the order
            return Decision(
                tool_calls=[
                    (
                        "submit_refund",
                        {"order_id": "O-43", "amount": "30.00", "currency": "USD", "reason": "x"},
                    )
                ]
            )
        return Decision(content="Stopped: the order changed.")

    with open_test_runner(model=scripted(concurrent_change_then_refund)) as runner:
        outcome = run(runner, "Refund order O-43.")
        answers = results(runner.state(outcome.run_id)["history"])
    error = answers[-1]["error"]
    assert error["code"] == "stale_plan"
    assert "version 1 when you read it, it is now 2" in error["detail"]
    assert [a.status for a in outcome.actions] == [ActionStatus.REJECTED]
    assert list_refunds(services, "O-43") == []


def test_a_stale_plan_read_again_is_planned_anew_and_refunds_once(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """The refused write was never sent, so the same refund after a fresh read is a new plan
    (not `duplicate_intent`), sent once under its own key."""

    def reads_again_after_a_stale_plan(
        messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        seen = results(messages)
        refund = {"order_id": "O-43", "amount": "30.00", "currency": "USD", "reason": "x"}
        if not seen:
            return Decision(tool_calls=[("get_order", {"order_id": "O-43"})])
        if len(seen) == 1:
            update_order(services, "O-43", amount="31.00")  # another agent changes the order
            return Decision(tool_calls=[("submit_refund", refund)])
        if len(seen) == 2:
            return Decision(tool_calls=[("get_order", {"order_id": "O-43"})])
        if len(seen) == 3:
            return Decision(tool_calls=[("submit_refund", refund)])
        return Decision(content="Refunded 30.00 on order O-43.")

    with open_test_runner(model=scripted(reads_again_after_a_stale_plan)) as runner:
        outcome = run(runner, "Refund order O-43.")
        answers = results(runner.state(outcome.run_id)["history"])
    assert answers[1]["error"]["code"] == "stale_plan"
    assert answers[3]["status"] == "ok"
    assert outcome.stop_reason == "completed"
    stale, sent = outcome.actions
    assert (stale.status, stale.attempts) == (ActionStatus.REJECTED, 0)
    assert (sent.status, sent.attempts) == (ActionStatus.SUCCEEDED, 1)
    assert sent.intent_key == f"{stale.intent_key}:replan-1"
    [refund] = list_refunds(services, "O-43")
    assert refund["amount"] == "30.00"


def test_an_approver_rejection_still_binds_the_intent(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Only a stale plan releases its key: a rejected refund proposed again is not re-planned."""

    def proposes_again_after_rejection(
        messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
    ) -> Decision:
        seen = results(messages)
        refund = {"order_id": "O-42", "amount": "80.00", "currency": "USD", "reason": "x"}
        if len(seen) < 2:
            return Decision(tool_calls=[("submit_refund", refund)])
        return Decision(content="The refund was refused.")

    with open_test_runner(model=scripted(proposes_again_after_rejection)) as runner:
        started = run(runner, "Refund 80.00 of order O-42.")
        outcome = runner.resume(started.run_id, decide(started, "reject"))
        answers = results(runner.state(outcome.run_id)["history"])
    assert [a["error"]["code"] for a in answers] == ["approval_rejected", "duplicate_intent"]
    assert [a.status for a in outcome.actions] == [ActionStatus.REJECTED]
    assert list_refunds(services, "O-42") == []
