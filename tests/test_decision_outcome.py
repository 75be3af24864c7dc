"""What the inbox says a decision did, for every way an action can stand after it.

The browser tests (tests/test_inbox_browser.py) reach sent-and-succeeded, sent-and-refused,
rejected and edited through a real server; these are the states a run reaches only with faults
(no answer, a person needed, cancelled), judged from the committed values alone. None of them
may read as done: only a write the business system confirmed is "succeeded".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loopwright.core.state import ApprovalRequest
from loopwright.server.decision_outcome import action_said, decision_result, run_said
from loopwright_refunds.agent import agent

REQUEST = ApprovalRequest(
    approval_id="apr_1",
    run_id="run-1",
    action_id="act_1",
    digest="0" * 64,
    tool="submit_refund",
    args={"order_id": "O-1", "amount": "5.00", "currency": "USD", "reason": "r"},
    summary="Refund 5.00 USD to order O-1",
    requested_by="u-1",
    expires_at=datetime.now(UTC) + timedelta(hours=1),
)


def action(status: str, outcome: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"action_id": "act_1", "tool": "submit_refund", "status": status, "outcome": outcome}


@pytest.mark.parametrize(
    ("status", "outcome", "said"),
    [
        (
            "SUCCEEDED",
            {"refund_id": "rf_7", "status": "succeeded"},
            "sent, succeeded: refund_id rf_7",
        ),
        (
            "FAILED",
            {"error": {"code": "amount_exceeds_refundable", "detail": "refundable now: 1.00"}},
            "sent, refused by the business system: amount_exceeds_refundable — refundable now: 1.00",
        ),
        (
            "REJECTED",
            {"error": {"code": "stale_plan", "detail": "order:O-1 changed"}},
            "not sent: stale_plan — order:O-1 changed",
        ),
        ("CANCELLED", {"error": {"code": "run_ended"}}, "not sent: run_ended"),
        (
            "UNKNOWN",
            None,
            "sent, no answer yet (UNKNOWN): the run asks the business system before anything else",
        ),
        (
            "ESCALATED",
            None,
            "sent, outcome unknown: a person must check it with the business system",
        ),
        ("APPROVED", None, "not sent yet (APPROVED)"),
    ],
)
def test_an_action_reads_as_done_only_when_the_business_system_confirmed_it(
    status: str, outcome: dict[str, Any] | None, said: str
) -> None:
    assert action_said(action(status, outcome), agent.tools) == said


def test_the_run_is_named_by_its_own_id_and_its_end_by_its_stop_reason() -> None:
    values = {
        "run_id": "run-1",
        "phase": "INCOMPLETE",
        "stop_reason": "not_done",
        "stop_detail": "submit_refund FAILED",
        "journal": {"act_1": action("FAILED", {"error": {"code": "declined"}})},
    }
    result = decision_result(values, REQUEST, "approve", agent.tools)
    assert result["run_id"] == "run-1"
    assert result["text"] == (
        "Approved apr_1 (run run-1) — sent, refused by the business system: declined. "
        "The run ended: not done (submit_refund FAILED)."
    )


def test_a_run_that_waits_again_says_for_what() -> None:
    waiting = {"approval_id": "apr_2", "summary": "Refund 2.00 USD to order O-2"}
    values = {
        "run_id": "run-1",
        "phase": "WAITING_APPROVAL",
        "pending": [{"verdict": "needs_approval", "approval": waiting}],
        "approvals": [{"approval_id": "apr_1"}],
    }
    assert run_said(values) == "The run waits for approval apr_2: Refund 2.00 USD to order O-2."


def test_a_completed_run_is_said_in_the_runtimes_words_never_the_models() -> None:
    """The page says what the business system holds (the runtime's account, its stop detail),
    not the model's answer; a run of an earlier release, without one, by its summary."""
    facts = {"model_answer": "All done, refunded twice!"}
    account = "no business effect: this run changed nothing in the business system"
    values = {
        "stop_reason": "completed",
        "stop_detail": account,
        "verification": {"summary": "no business effect", "facts": facts},
    }
    assert run_said(values) == f"The run completed: {account}."
    earlier = {**values, "stop_detail": ""}
    assert run_said(earlier) == "The run completed: no business effect."
