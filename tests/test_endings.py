"""A run's ending follows the business state, not the model's words: an effect that happened and
was verified completes a run whose model cannot phrase its last answer; an effect claimed that
the journal does not hold never completes one; and an ending that is not done names, in words,
the rule that refused the write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Action, Decision
from loopwright.graph.state import ActionStatus, digest
from loopwright.models.scripted import ScriptedChatModel
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import refund_claims
from loopwright_refunds.procedure import RefundProcedure, Transcript
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import RunnerFactory, all_refunds, principal

ELIGIBLE_TASK = "Check whether order O-43 can be refunded and refund it if so."
INELIGIBLE_TASK = "Refund order O-44."  # delivered 90 days ago: outside the refund window
WRITTEN_CALL = '```json\n{"name": "submit_refund", "arguments": {"order_id": "O-43"}}\n```'
FALSE_CLAIM = (
    "I have refunded O-42. The refund of 100.00 USD was submitted successfully and confirmed."
)


class WritesItsLastAnswerAsACall(RefundProcedure):
    """Does the task right, then writes its final answer as a call, every time it is asked."""

    def plan(self, seen: Transcript) -> Decision:
        decision = super().plan(seen)
        return decision if decision.tool_calls else Decision(content=WRITTEN_CALL)


def claims_without_acting(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    return Decision(content=FALSE_CLAIM)


def refunds_at_once_then_owns_up(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    """Asks for the refund without reading anything, then says honestly that it failed."""
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="The refund could not be made.")
    args = {"order_id": "O-44", "amount": "80.00", "currency": "USD", "reason": "asked"}
    return Decision(tool_calls=[("submit_refund", args)])


def test_a_verified_effect_completes_the_run_whose_last_answer_is_malformed(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    model = ScriptedChatModel(policy=WritesItsLastAnswerAsACall())
    with open_test_runner(model=model) as runner:
        outcome = runner.start(ELIGIBLE_TASK, principal(task=ELIGIBLE_TASK))
        state = runner.state(outcome.run_id)
    [refund] = all_refunds(services)
    facts = (outcome.verification or {})["facts"]
    assert (outcome.phase, outcome.stop_reason) == ("COMPLETED", "completed")
    assert facts["answer"].startswith("verified in the business system: Refund 30.00 USD")
    assert refund["refund_id"] in facts["answer"] and facts["answer"] == outcome.stop_detail
    assert facts["model_answer"] == WRITTEN_CALL  # kept, not shown as the answer
    assert state["history"][-1].text == WRITTEN_CALL  # and in the trace
    assert state["refused_answers"] == 1  # asked once to put it right


def test_an_effect_claimed_that_the_journal_lacks_never_completes(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner(model=ScriptedChatModel(policy=claims_without_acting)) as runner:
        outcome = runner.start(INELIGIBLE_TASK, principal(task=INELIGIBLE_TASK))
        state = runner.state(outcome.run_id)
    assert outcome.phase == "INCOMPLETE" and outcome.stop_reason != "completed"
    assert "the answer claims a refund ('I have refunded O-42.') where this run made none" in (
        outcome.stop_detail
    )
    assert all_refunds(services) == []
    assert (state["usage"]["model_requests"], state["refused_answers"]) == (2, 2)  # told first


def test_the_default_rule_a_run_whose_every_write_was_refused_by_a_rule_is_not_done(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """An agent without a completion check or a claim check: its one write refused at validate
    by the refund window, the model owns up, and still the run does not end COMPLETED; its
    ending names the rule."""
    agent = refunds.replace(done=None, claims=None)
    model = ScriptedChatModel(policy=refunds_at_once_then_owns_up)
    with open_test_runner(model=model, agent=agent) as runner:
        outcome = runner.start(INELIGIBLE_TASK, principal(task=INELIGIBLE_TASK))
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "not_done")
    assert "not done: submit_refund refused: outside_refund_window: " in outcome.stop_detail
    assert all_refunds(services) == []


def test_the_agents_completion_check_says_not_done_and_the_ending_names_the_rule(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """O-43 may be refunded, but not 10000.00 of it: the refund agent's check finds the refund
    owed and missing, and the ending says which rule refused the one asked for."""

    def too_much(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
        if any(isinstance(m, ToolMessage) for m in messages):
            return Decision(content="The refund could not be made.")
        args = {"order_id": "O-43", "amount": "10000.00", "currency": "USD", "reason": "asked"}
        return Decision(tool_calls=[("submit_refund", args)])

    with open_test_runner(model=ScriptedChatModel(policy=too_much)) as runner:
        outcome = runner.start(ELIGIBLE_TASK, principal(task=ELIGIBLE_TASK))
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "not_done")
    assert "not done: submit_refund refused: " in outcome.stop_detail
    assert "completion check finds an effect it needs missing" not in outcome.stop_detail
    assert all_refunds(services) == []


def _refund(order_id: str, amount: str) -> Action:
    args = {"order_id": order_id, "amount": amount, "currency": "USD", "reason": "asked"}
    return Action(
        action_id=f"act_{order_id}",
        run_id="run-1",
        call_id="call-1",
        tool="submit_refund",
        args=args,
        args_digest=digest(args),
        intent_key=f"refund:{order_id}",
        status=ActionStatus.SUCCEEDED,
    )


@pytest.mark.parametrize(
    ("answer", "claimed"),
    [
        ("I have refunded O-43: 30.00 USD.", []),  # what the journal holds
        ("Order O-44 could not be refunded: it is outside the window.", []),  # negated
        ("O-44 can be refunded once it is delivered.", []),  # no refund said to have happened
        ("No refund was made for O-44.", []),
        ("I have refunded O-42.", ["a refund of order O-42 ('I have refunded O-42.')"]),
        (
            "The refund of 100.00 USD was submitted successfully.",
            ["a refund of 100.00 ('The refund of 100.00 USD was submitted successfully.')"],
        ),
    ],
)
def test_the_refund_agents_claim_check_names_what_the_journal_lacks(
    answer: str, claimed: list[str]
) -> None:
    assert refund_claims(None, answer, [_refund("O-43", "30.00")]) == claimed


def test_a_refund_claimed_where_none_succeeded_is_a_false_claim() -> None:
    failed = _refund("O-43", "30.00").model_copy(update={"status": ActionStatus.FAILED})
    assert refund_claims(None, "Refunded 30.00 USD to O-43.", [failed]) == [
        "a refund ('Refunded 30.00 USD to O-43.') where this run made none"
    ]
