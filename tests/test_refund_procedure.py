"""RefundProcedure, driven by hand with fabricated tool results."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from loopwright.core.protocol import ToolEnvelope, render_tool_content
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.procedure import RefundProcedure

NOW = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
TASK = "Check whether order O-42 can be refunded and refund it if so."

Responder = Callable[[str, dict[str, Any]], ToolEnvelope]


def order(**changes: Any) -> dict[str, Any]:
    return {
        "order_id": "O-42",
        "owner": "u-1",
        "status": "delivered",
        "amount": "100.00",
        "currency": "EUR",
        "refunded": "20.00",
        "refundable": "80.00",
        "delivered_at": (NOW - timedelta(days=3)).isoformat(),
        "version": 7,
        **changes,
    }


POLICY = {
    "name": "standard",
    "version": 3,
    "window_days": 30,
    "requires_delivery": True,
    "approval_threshold": "500.00",
    "text": "Delivered orders can be refunded within 30 days.",
    "created_at": "2025-01-01T00:00:00+00:00",
}


def ok(result: dict[str, Any]) -> ToolEnvelope:
    return ToolEnvelope(status="ok", result=result)


def error(code: str, message: str) -> ToolEnvelope:
    return ToolEnvelope(status="error", error={"code": code, "message": message})


def services(**overrides: Callable[[dict[str, Any]], ToolEnvelope]) -> Responder:
    """A well-behaved backend, with some tools replaced by `overrides`."""
    handlers: dict[str, Callable[[dict[str, Any]], ToolEnvelope]] = {
        "get_order": lambda args: ok(order()),
        "get_policy": lambda args: ok(POLICY),
        "submit_refund": lambda args: ok(
            {
                "refund_id": "R-9",
                "idempotency_key": "k-1",
                "order_id": args["order_id"],
                "amount": args["amount"],
                "currency": args["currency"],
                "status": "pending",
            }
        ),
        "get_refund_status": lambda args: ok(
            {
                "refund_id": args["refund_id"],
                "order_id": "O-42",
                "amount": "80.00",
                "currency": "EUR",
                "status": "succeeded",
            }
        ),
        **overrides,
    }
    return lambda tool, args: handlers[tool](args)


def run(
    respond: Responder, *, task: str = TASK, max_steps: int = 10
) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """Play the procedure to its final answer; return the tool calls it made and the answer."""
    procedure = RefundProcedure(clock=lambda: NOW)
    messages: list[BaseMessage] = [SystemMessage("You handle refunds."), HumanMessage(task)]
    calls: list[tuple[str, dict[str, Any]]] = []
    for step in range(max_steps):
        decision = procedure(messages, [])
        assert procedure(messages, []) == decision, "the procedure must be deterministic"
        if not decision.tool_calls:
            return calls, decision.content
        [(tool, args)] = decision.tool_calls
        calls.append((tool, args))
        call_id = f"call-{step}"
        messages.append(AIMessage("", tool_calls=[{"name": tool, "args": args, "id": call_id}]))
        content = render_tool_content(tool, call_id, respond(tool, args))
        messages.append(ToolMessage(content, tool_call_id=call_id, name=tool))
    raise AssertionError(f"no final answer after {max_steps} steps: {calls}")


def names(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [tool for tool, _ in calls]


def test_eligible_order_is_refunded_and_confirmed() -> None:
    calls, answer = run(services())

    assert names(calls) == ["get_order", "get_policy", "submit_refund", "get_refund_status"]
    assert calls[0][1] == {"order_id": "O-42"}
    assert calls[2][1] == {
        "order_id": "O-42",
        "amount": order()["refundable"],
        "currency": "EUR",
        "reason": "eligible under refund policy v3",
    }
    assert calls[3][1] == {"refund_id": "R-9"}
    assert answer == "Refunded 80.00 EUR to order O-42 (refund R-9, status succeeded)."


def test_order_delivered_outside_the_window_is_not_refunded() -> None:
    late = order(delivered_at=(NOW - timedelta(days=31)).isoformat())
    calls, answer = run(services(get_order=lambda args: ok(late)))

    assert names(calls) == ["get_order", "get_policy"]
    assert answer == (
        "Order O-42 cannot be refunded: it was delivered on 2025-05-15, outside the 30-day "
        "refund window of policy v3."
    )


def test_undelivered_order_is_not_refunded() -> None:
    shipped = order(status="shipped", delivered_at=None)
    calls, answer = run(services(get_order=lambda args: ok(shipped)))

    assert names(calls) == ["get_order", "get_policy"]
    assert answer == "Order O-42 cannot be refunded: it has not been delivered (status shipped)."


def test_fully_refunded_order_is_not_refunded_again() -> None:
    spent = order(refunded="100.00", refundable="0.00")
    calls, answer = run(services(get_order=lambda args: ok(spent)))

    assert "submit_refund" not in names(calls)
    assert answer == "Order O-42 cannot be refunded: nothing is left to refund."


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("approval_rejected", "rejected by approver a-7"),
        ("permission_denied", "principal u-2 may not refund O-42"),
        ("validation_error", "amount exceeds refundable"),
    ],
)
def test_submit_error_ends_without_a_second_submit(code: str, message: str) -> None:
    calls, answer = run(services(submit_refund=lambda args: error(code, message)))

    assert names(calls) == ["get_order", "get_policy", "submit_refund"]
    assert answer == f"The refund for order O-42 was not made: {code}: {message}."


def test_unknown_submit_outcome_is_reported_unconfirmed_and_not_resent() -> None:
    pending = ToolEnvelope(status="unknown", error={"code": "outcome_unknown"})
    calls, answer = run(services(submit_refund=lambda args: pending))

    assert names(calls).count("submit_refund") == 1
    assert "not confirmed" in answer and "O-42" in answer


def test_read_error_is_retried_once_then_reported() -> None:
    down = error("tool_unavailable", "orders service timed out")
    calls, answer = run(services(get_order=lambda args: down))

    assert names(calls) == ["get_order", "get_order"]
    assert answer == (
        "I could not finish the refund check: get_order failed 2 times "
        "(tool_unavailable: orders service timed out)."
    )


def test_read_that_recovers_on_retry_continues_the_procedure() -> None:
    attempts: list[int] = []

    def flaky_policy(args: dict[str, Any]) -> ToolEnvelope:
        attempts.append(1)
        return ok(POLICY) if len(attempts) > 1 else error("tool_unavailable", "try again")

    calls, answer = run(services(get_policy=flaky_policy))

    assert names(calls) == [
        "get_order",
        "get_policy",
        "get_policy",
        "submit_refund",
        "get_refund_status",
    ]
    assert answer.startswith("Refunded 80.00 EUR to order O-42")


def test_task_without_an_order_id_gets_an_answer_and_no_calls() -> None:
    calls, answer = run(services(), task="Refund my last purchase please.")
    assert calls == []
    assert "order id" in answer


def test_scripted_model_plays_the_procedure_with_reproducible_ids() -> None:
    """Through the model, the same conversation gives the same calls and ids on a rerun."""

    def play() -> tuple[list[AIMessage], str]:
        model = ScriptedChatModel(policy=RefundProcedure(clock=lambda: NOW))
        respond = services()
        messages: list[BaseMessage] = [HumanMessage(TASK)]
        replies: list[AIMessage] = []
        while True:
            reply = model.invoke(messages)
            replies.append(reply)
            messages.append(reply)
            if not reply.tool_calls:
                return replies, reply.text
            for tc in reply.tool_calls:
                envelope = respond(tc["name"], tc["args"])
                content = render_tool_content(tc["name"], tc["id"] or "", envelope)
                messages.append(ToolMessage(content, tool_call_id=tc["id"] or "", name=tc["name"]))

    first, answer = play()
    second, _ = play()

    assert [tc["name"] for r in first for tc in r.tool_calls] == [
        "get_order",
        "get_policy",
        "submit_refund",
        "get_refund_status",
    ]
    assert answer == "Refunded 80.00 EUR to order O-42 (refund R-9, status succeeded)."
    assert [r.tool_calls for r in second] == [r.tool_calls for r in first]
    assert [r.id for r in second] == [r.id for r in first]
