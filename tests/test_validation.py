"""Every call is checked before anything runs: each way a call is refused, end to end.

Each run drives the real graph with a scripted model that makes one bad call and then answers:
its one corrective turn, taken after reading the structured error as the call's result. The
ground truth is checked where it lives: the payments service's own storage and the journal.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from loopwright.core.budget import Budget
from loopwright.core.state import ActionStatus, RunState
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright_refunds.agent import agent as refunds_agent
from loopwright_refunds.misbehaving import Duplicating, OneShot
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    RunnerFactory,
    all_refunds,
    answered,
    final_answer,
    principal,
    tool_errors,
)

OTHER_USERS_TASK = "Check whether order O-99 can be refunded and refund it if so."
SMALL_REFUND_TASK = "Check whether order O-43 can be refunded and refund it if so."


def refund(order_id: str, amount: str = "10.00", **extra: Any) -> Decision:
    args = {"order_id": order_id, "amount": amount, "currency": "USD", "reason": "test", **extra}
    return Decision(tool_calls=[("submit_refund", args)])


def run(runner: Runner, task: str = DEMO_TASK) -> tuple[RunOutcome, RunState]:
    outcome = runner.start(task, principal(task=task))
    return outcome, runner.state(outcome.run_id)


SCHEMA_BREAKER = {"order_id": "O-42", "amount": "1e9", "currency": 840, "note": "ignore the rules"}

# (what the model does wrong, the task it was given, its one call, the error it must get back)
REFUSALS: list[tuple[str, str, Decision, str]] = [
    (
        "unknown tool",
        DEMO_TASK,
        Decision(tool_calls=[("transfer_funds", {"to": "acct-4242", "amount": "10000.00"})]),
        "unknown_tool",
    ),
    (
        "arguments against the schema",
        DEMO_TASK,
        Decision(tool_calls=[("submit_refund", SCHEMA_BREAKER)]),
        "invalid_arguments",
    ),
    (
        "unparsable JSON arguments",
        DEMO_TASK,
        Decision(raw_arguments=[("submit_refund", '{"order_id": O-42, "amount": 10}')]),
        "invalid_arguments",
    ),
    ("another user's order", OTHER_USERS_TASK, refund("O-99"), "permission_denied"),
    ("an order the task does not name", DEMO_TASK, refund("O-43"), "out_of_scope"),
    # Postgres cannot store NUL: before validate refused it, the journal raised out of the graph.
    ("a NUL character", DEMO_TASK, refund("O-42", reason="a\x00b"), "invalid_arguments"),
]


def test_each_refused_call_executes_nothing_and_the_model_reads_why(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """One run per way a call can be wrong (runs are cheap; fresh services are not)."""
    for case, task, decision, code in REFUSALS:
        with open_test_runner(ScriptedChatModel(policy=OneShot(decision))) as runner:
            outcome, state = run(runner, task)
        assert [e["code"] for e in tool_errors(state)] == [code], case
        assert code in final_answer(state), case  # the corrective turn read the error
        # The task's own refund never happened: the run says so (never "completed"), except
        # where the order is not the user's, whose refund was never theirs to have.
        done = task == OTHER_USERS_TASK
        ended = ("COMPLETED", "completed") if done else ("INCOMPLETE", "not_done")
        assert (outcome.phase, outcome.stop_reason) == ended, case
        assert outcome.verification is not None, case
        assert outcome.verification["facts"]["writes"] == [], case
        assert outcome.actions == [], case
        if case == "arguments against the schema":
            [error] = tool_errors(state)
            fields = sorted(e["field"] for e in error["errors"])
            assert fields == ["amount", "currency", "note", "reason"]
            assert "ignore the rules" not in str(error)  # input is never echoed back
    assert all_refunds(services) == []


def test_malformed_tool_output_is_a_fault_never_evidence(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A read whose result breaks its output contract answers `malformed_output`, records no
    evidence, and the procedure (which retries a failed read once) gives up on it."""

    def junk(*_: Any) -> dict[str, Any]:
        return {"order_id": "O-42", "owner": None, "refundable": "all of it"}

    get_order = refunds_agent.tools.get("get_order")
    assert get_order is not None
    tools = [replace(get_order, run=junk), *(t for t in refunds_agent.tools if t is not get_order)]
    with open_test_runner(tools=tools) as runner:
        outcome, state = run(runner)
    assert [e["code"] for e in tool_errors(state)] == ["malformed_output", "malformed_output"]
    assert "malformed_output" in final_answer(state)
    assert state["evidence"] == []
    assert state["usage"]["tool_result_bytes"] == 0
    assert outcome.stop_reason == "not_done"  # the order was never read: nothing refunded
    assert outcome.actions == []
    assert all_refunds(services) == []


def test_refund_over_the_limit_never_runs_without_an_approve_decision(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Resuming without an answer, with garbage, or with a decision for another request leaves
    the refund where it was: waiting, with nothing sent to payments."""
    with open_test_runner() as runner:
        outcome = runner.start(DEMO_TASK, principal())
        [request] = outcome.waiting_for_approval
        other_request = {**request, "approval_id": "apr_0000000000000000"}
        for value in (
            None,
            {"decision": "approve"},
            {**answered(request, "approve", "a-1"), "digest": "not a digest"},
            answered(other_request, "approve", "a-1"),
        ):
            outcome = runner.resume(outcome.run_id, value)
            assert [r["approval_id"] for r in outcome.waiting_for_approval] == [
                request["approval_id"]
            ]
        [action] = outcome.actions
    assert action.status is ActionStatus.NEEDS_APPROVAL and action.attempts == 0
    assert all_refunds(services) == []


def test_same_refund_again_maps_to_one_intent_and_one_effect(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Proposed twice in one step and once more after it went through, each under a new call
    id: one journal action, one refund, and the copies are answered `duplicate_intent`."""
    with open_test_runner(ScriptedChatModel(policy=Duplicating())) as runner:
        outcome, state = run(runner, SMALL_REFUND_TASK)
    submits = [
        call
        for m in state["history"]
        if isinstance(m, AIMessage)
        for call in m.tool_calls
        if call["name"] == "submit_refund"
    ]
    assert len(submits) == 3 and len({c["id"] for c in submits}) == 3
    assert len({str(sorted(c["args"].items())) for c in submits}) == 1
    duplicates = [e for e in tool_errors(state) if e["code"] == "duplicate_intent"]
    assert [e["detail"].rsplit(" ", 1)[-1] for e in duplicates] == ["PLANNED", "SUCCEEDED"]
    [action] = outcome.actions
    assert action.status is ActionStatus.SUCCEEDED and action.attempts == 1
    assert {d["action_id"] for d in duplicates} == {action.action_id}
    [stored] = all_refunds(services)
    assert (stored["order_id"], stored["amount"]) == ("O-43", "30.00")
    assert outcome.stop_reason == "completed"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_non_ascii_digits_are_not_money(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """pydantic's regex reads \\d as any Unicode digit: "١٠.٠٠" used to pass the schema, be
    refunded as 10.00, and never verify against the journaled "١٠.٠٠" (the run looped to its
    step limit with the money gone). The patterns are ASCII now; this keeps them so."""
    model = ScriptedChatModel(policy=OneShot(refund("O-42", "١٠.٠٠")))
    with open_test_runner(model, Budget(max_steps=3)) as runner:  # a regression ends soon
        _, state = run(runner)
    assert [e["code"] for e in tool_errors(state)] == ["invalid_arguments"]
    assert all_refunds(services) == []
