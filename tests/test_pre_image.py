"""A write without idempotency keys: its unknown outcome is settled by comparing with a pre-image.

(An absent one, and how it is sent again safely: tests/test_keyless_resend.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright.core import tls
from loopwright.core.state import ActionStatus
from loopwright.outcome import RunOutcome
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.tools.contract import Guarantee, ToolContract
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.store_credit import STORE_CREDIT
from tests.runtime_fixtures import RunnerFactory, principal

TASK = "Give 20.00 USD store credit for order O-43."
CREDIT = {"order_id": "O-43", "amount": "20.00", "currency": "USD", "note": "late delivery"}


def credit_once(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Ask for the credit once; then report what the runtime said."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return Decision(tool_calls=[("issue_store_credit", CREDIT)])
    return Decision(content=f"Store credit result: {results[-1].status}")


def credit_entries(services: ServiceEndpoints) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = httpx.get(
        f"{services.payments}/credits/u-1", verify=tls.context()
    ).json()["entries"]
    return entries


def run_credit(
    open_test_runner: RunnerFactory, tools: Iterable[ToolContract]
) -> tuple[RunOutcome, list[ActionStatus]]:
    model = ScriptedChatModel(policy=credit_once)
    with open_test_runner(model=model, tools=tools) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
        [action] = outcome.actions
        history = [e.to_status for e in runner.journal.events(action.action_id)]
        detail = runner.journal.events(action.action_id)[1].detail or {}
    assert detail["pre_image"]["version"] == 0  # journaled with DISPATCHED, before the send
    return outcome, history


def test_timeout_after_apply_is_reconciled_as_applied_by_the_pre_image(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "accept_then_timeout", delay_s=6)
    outcome, history = run_credit(open_test_runner, [*refunds.tools, STORE_CREDIT])
    assert history == ["PLANNED", "DISPATCHED", "UNKNOWN", "RECONCILING", "SUCCEEDED"]
    assert outcome.stop_reason == "completed"
    assert [e["amount"] for e in credit_entries(services)] == ["20.00"]


def test_without_any_guarantee_an_unknown_outcome_escalates(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    blind = dataclasses.replace(STORE_CREDIT, guarantee=Guarantee.NONE, resend=None)
    set_fault(services, "accept_then_timeout", delay_s=6)
    outcome, history = run_credit(open_test_runner, [*refunds.tools, blind])
    assert history[-1] == ActionStatus.ESCALATED
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "needs_human")
    assert len(credit_entries(services)) == 1  # it happened; the run says it cannot confirm it
