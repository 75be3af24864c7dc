"""A run's ending follows the business state, not the model's words: an effect that happened and
was verified completes a run whose model cannot phrase its last answer; an effect claimed that
the journal does not hold never completes one; and an ending that is not done names, in words,
the rule that refused the write."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Action, Decision
from loopwright.core.state import ActionStatus, digest
from loopwright.nodes.verify import NO_EFFECT_NOTE
from loopwright.outcome import EndingKind, RunOutcome, ending_of
from loopwright.reports import exit_code, run_document
from loopwright.runner import Runner
from loopwright.testing.scripted import ScriptedChatModel
from loopwright.timeline import MODEL_ANSWER, Redactor, ending_lines
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import refund_claims
from loopwright_refunds.procedure import RefundProcedure, Transcript
from loopwright_refunds.services.admin import create_order, list_refunds
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


# --- a claim in any words is never passed on as fact ------------------------------------------

# A family of ways to claim the refund of O-44 (80.00 USD, outside its window) that never
# happened: tenses, the passive, other word orders, other languages' word orders; each with
# the order and the amount written another way.
CLAIM_TEMPLATES = (
    "I have refunded {amount} for {order}.",
    "I refunded {order} ({amount}).",
    "I am refunding {amount} for {order} right now.",
    "I will refund {amount} for {order} today.",
    "{order} has been refunded {amount}.",
    "A refund of {amount} was issued for {order}.",
    "{amount} is being returned to you for {order}.",
    "Refund issued for {order} ({amount}).",
    "Done: {order} refunded in full.",
    "Your refund of {amount} for {order} is on its way.",
    "Refunded: {amount}, {order}.",
    "Thank you for your refund of {amount} on {order}.",
    "Die Erstattung von {amount} für {order} wurde ausgeführt.",
    "{order} の {amount} の返金が完了しました。",
    "Le remboursement de {amount} pour {order} a été effectué.",
    "Hemos reembolsado {amount} del pedido {order}.",
    "{order} için {amount} iade edildi.",
    "{order} {amount} 환불 완료.",
)
ORDER_FORMS = ("O-44", "order O-44", "#O-44", "O-44's order")
AMOUNT_FORMS = ("80.00 USD", "USD 80.00", "$80.00", "80.00")


def claims_of(templates: Sequence[str] = CLAIM_TEMPLATES) -> list[str]:
    """One phrasing a template, the order and the amount in a different form each time."""
    return [
        template.format(
            order=ORDER_FORMS[n % len(ORDER_FORMS)],
            amount=AMOUNT_FORMS[(n // len(ORDER_FORMS) + n) % len(AMOUNT_FORMS)],
        )
        for n, template in enumerate(templates)
    ]


class Claims:
    """A model that asks for `calls` (one a step), then says `claim` as its final answer."""

    def __init__(self, calls: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        self.calls = list(calls)
        self.claim = ""

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        asked = sum(isinstance(m, ToolMessage) for m in messages)
        if asked < len(self.calls):
            return Decision(tool_calls=[self.calls[asked]])
        return Decision(content=self.claim)


def refund(order_id: str, amount: str) -> tuple[str, dict[str, Any]]:
    args = {"order_id": order_id, "amount": amount, "currency": "USD", "reason": "asked"}
    return ("submit_refund", args)


def ended_without_the_claimed_effect(runner: Runner, outcome: RunOutcome) -> list[str]:
    """What is wrong with the ending of a run that made no refund: nothing if every form of
    it (the ending, the exit code, `--json`, the CLI's lines, `stop_detail`) states the
    business facts first and passes the model's claim on only as the model's, marked."""
    ending = ending_of(outcome, runner.tools)
    document = run_document(runner, outcome)
    # After the line that says how it ended (whose stop detail may quote a claim it refused).
    lines = ending_lines(outcome, Redactor(runner.tools))[1:]
    wrong = []
    if ending.kind is EndingKind.COMPLETED or exit_code(ending) == 0:
        wrong.append(f"ends {ending.kind}, exit {exit_code(ending)}")
    if document["ending"]["kind"] != ending.kind or document["exit_code"] != exit_code(ending):
        wrong.append("--json says another ending")
    if ending.effects or not ending.statement.startswith("no business effect"):
        wrong.append(f"the runtime's account says {ending.statement!r}")
    claim = ending.model_answer or ""
    if claim and claim in ending.statement:
        wrong.append("the claim is in the runtime's account")
    if outcome.stop_reason == "completed":
        if outcome.stop_detail != ending.statement:
            wrong.append(f"stop_detail {outcome.stop_detail!r}")
        if not ending.answer_notes or ending.answer_notes[0] != NO_EFFECT_NOTE:
            wrong.append(f"the answer is not marked: {ending.answer_notes}")
    shown = [i for i, line in enumerate(lines) if claim and claim in line]
    facts = [i for i, line in enumerate(lines) if "no business effect" in line]
    if any(not lines[i].startswith(f"  {MODEL_ANSWER}: ") for i in shown):
        wrong.append(f"the claim is shown unlabelled: {lines}")
    if not facts or (shown and min(shown) < min(facts)):
        wrong.append(f"the facts do not come first: {lines}")
    return wrong


@pytest.mark.parametrize(
    "calls",
    [(), (refund("O-44", "80.00"),)],
    ids=["claimed without acting", "claimed after a refusal"],
)
def test_a_refund_claimed_in_any_words_never_ends_as_a_refund(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, calls: tuple[Any, ...]
) -> None:
    """Whatever words the model claims the refund in, a run that made none never ends as
    one: the agent's claim check catches some phrasings (INCOMPLETE); the others complete as
    "no business effect" (exit 6) or "with a refusal" (exit 7, the rule and its reason said),
    the claim shown only as the model's, marked."""
    model = Claims(calls)
    failures = {}
    ended: list[str | None] = []
    with open_test_runner(model=ScriptedChatModel(policy=model)) as runner:
        for claim in claims_of():
            model.claim = claim
            outcome = runner.start(INELIGIBLE_TASK, principal(task=INELIGIBLE_TASK))
            ended.append(outcome.stop_reason)
            wrong = ended_without_the_claimed_effect(runner, outcome)
            refusal = "refused by a rule: submit_refund (outside_refund_window: "
            if calls and outcome.stop_reason == "completed" and refusal not in outcome.stop_detail:
                wrong.append(f"the refusal is not said: {outcome.stop_detail!r}")
            if wrong:
                failures[claim] = wrong
    assert failures == {}
    assert all_refunds(services) == []
    # Most phrasings get past the agent's claim check: the ending does not rest on it.
    assert ended.count("completed") > len(ended) // 2, ended


def test_a_claim_beyond_the_verified_refund_is_named_where_it_completes(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """One order refunded, the other refused by the refund window: an answer claiming both
    never reads as two refunds. Where the claim check misses it, the run completes "with a
    refusal" (exit 7): the one verified refund first, then the refusal, and the answer's
    naming of the other order is pointed out."""
    delivered = (datetime.now(UTC) - timedelta(days=90)).isoformat()
    templates = [t.replace("{order}", "{order} and {late}") for t in CLAIM_TEMPLATES[::3]]
    model = Claims()
    endings = {}
    with open_test_runner(model=ScriptedChatModel(policy=model)) as runner:
        for n, template in enumerate(templates):
            order, late = f"O-{700 + 2 * n}", f"O-{701 + 2 * n}"
            create_order(services, order, "u-1", "30.00")
            create_order(services, late, "u-1", "40.00", delivered_at=delivered)
            model.calls = [refund(order, "30.00"), refund(late, "40.00")]
            model.claim = template.format(order=order, late=late, amount="40.00 USD")
            task = f"Refund orders {order} and {late}."
            outcome = runner.start(task, principal(task=task))
            endings[model.claim] = (late, outcome, ending_of(outcome, runner.tools))
            assert [r["amount"] for r in list_refunds(services, order)] == ["30.00"]
            assert list_refunds(services, late) == []
    completed = 0
    for claim, (late, outcome, ending) in endings.items():
        assert [e["summary"][:14] for e in ending.effects] == ["Refund 30.00 U"], claim
        assert [(r["by"], r["code"]) for r in ending.refusals] == [
            ("rule", "outside_refund_window")
        ], claim
        if outcome.stop_reason != "completed":
            assert outcome.stop_reason in ("not_done", "no_progress"), claim
            continue
        completed += 1
        assert ending.kind is EndingKind.COMPLETED_WITH_REFUSAL, claim
        assert exit_code(ending) == 7
        assert ending.statement.startswith("verified in the business system: Refund 30.00")
        assert "; refused by a rule: submit_refund (outside_refund_window: " in ending.statement
        named = [f"it names {late!r}, which no verified effect of this run holds"]
        assert named[0] in ending.answer_notes, (claim, ending.answer_notes)
    assert completed > 0  # the agent's claim check is not what holds this up
