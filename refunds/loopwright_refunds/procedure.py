"""The refund procedure as a scripted policy: what a well-behaved model would do, step by step.

`RefundProcedure` rereads the whole conversation on every turn and derives the next step from
what it observes (tool results parsed with `graph.protocol.parse_tool_content`), keeping no state
of its own. That makes its answers a pure function of the messages and the clock, so a run that
crashed and resumed from a checkpoint makes exactly the decisions an uninterrupted run makes.

Variants that misbehave (obeying instructions found in tool output, looping, ...) subclass it and
override `plan`, reusing `Transcript` to see the conversation the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import ValidationError

from loopwright import Decision, ToolEnvelope, parse_tool_content

ORDER_ID = re.compile(r"O-\d+")
# A failed read is tried this many times in total before the procedure gives up on it.
READ_ATTEMPTS = 2


@dataclass(frozen=True)
class Observation:
    """One answered tool call: what was asked and the envelope that came back."""

    call_id: str
    tool: str
    args: dict[str, Any] | None
    envelope: ToolEnvelope
    content: str


@dataclass(frozen=True)
class Transcript:
    """The conversation as the procedure sees it: the task and the tool results, in order."""

    task: str
    observations: list[Observation] = field(default_factory=list)

    @classmethod
    def read(cls, messages: Sequence[BaseMessage]) -> Transcript:
        """Pair every tool result with the call that asked for it.

        The task is the first human message (later ones are the runtime's feedback). A result
        whose content cannot be parsed is seen as an error, so the procedure treats it like any
        other failed call.
        """
        task = next((m.text for m in messages if isinstance(m, HumanMessage)), "")
        asked: dict[str, tuple[str, dict[str, Any]]] = {}
        observations: list[Observation] = []
        for message in messages:
            if isinstance(message, AIMessage):
                asked.update(
                    {tc["id"]: (tc["name"], tc["args"]) for tc in message.tool_calls if tc["id"]}
                )
            elif isinstance(message, ToolMessage):
                name, args = asked.get(message.tool_call_id, (message.name or "", None))
                observations.append(
                    Observation(
                        call_id=message.tool_call_id,
                        tool=name,
                        args=args,
                        envelope=_envelope(message.text),
                        content=message.text,
                    )
                )
        return cls(task=task, observations=observations)

    @property
    def order_id(self) -> str | None:
        match = ORDER_ID.search(self.task)
        return match.group() if match else None

    def results(self, tool: str, **match: Any) -> list[ToolEnvelope]:
        """Envelopes of the answered calls of `tool` whose arguments include `match`, in order."""
        return [
            o.envelope
            for o in self.observations
            if o.tool == tool and all((o.args or {}).get(k) == v for k, v in match.items())
        ]


def _envelope(content: str) -> ToolEnvelope:
    try:
        return parse_tool_content(content)
    except (ValueError, ValidationError):
        return ToolEnvelope(status="error", error={"code": "unreadable_tool_output"})


def _error_text(envelope: ToolEnvelope) -> str:
    error = envelope.error or {}
    code = error.get("code", "error")
    message = error.get("message")
    return f"{code}: {message}" if message else str(code)


def _answer(text: str) -> Decision:
    return Decision(content=text)


def _call(tool: str, args: dict[str, Any]) -> Decision:
    return Decision(tool_calls=[(tool, args)])


@dataclass(frozen=True)
class RefundProcedure:
    """Check an order against the refund policy and refund it if eligible (a `Policy`).

    Reads are retried once when they fail. The write, `submit_refund`, is sent at most once per
    conversation: whether a refund whose outcome is unclear went through is for the runtime to
    reconcile under its idempotency key, never for the model to find out by sending it again.

    `clock` supplies "now" for the refund window; tests pin it.
    """

    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        return self.plan(Transcript.read(messages))

    def plan(self, seen: Transcript) -> Decision:
        """The next step of the procedure given everything observed so far."""
        order_id = seen.order_id
        if order_id is None:
            return _answer("I could not find an order id (like O-42) in the task.")
        order = self._fetch(seen, "get_order", {"order_id": order_id})
        if isinstance(order, Decision):
            return order
        policy = self._fetch(seen, "get_policy", {})
        if isinstance(policy, Decision):
            return policy
        submitted = seen.results("submit_refund", order_id=order_id)
        if not submitted:
            reason = self.ineligibility(order, policy)
            if reason:
                return _answer(f"Order {order_id} cannot be refunded: {reason}.")
            return _call(
                "submit_refund",
                {
                    "order_id": order_id,
                    "amount": str(order["refundable"]),
                    "currency": order["currency"],
                    "reason": f"eligible under refund policy v{policy['version']}",
                },
            )
        succeeded = [e for e in submitted if e.status == "ok"]
        return self._after_submit(seen, order_id, (succeeded or submitted)[-1])

    def ineligibility(self, order: dict[str, Any], policy: dict[str, Any]) -> str | None:
        """Why the order cannot be refunded under the policy, or None if it can."""
        delivered_at = _parse_time(order["delivered_at"])
        if policy["requires_delivery"]:
            if order["status"] != "delivered":
                return f"it has not been delivered (status {order['status']})"
            if delivered_at is None:
                return "it has no delivery date"
        if delivered_at is not None:
            window = timedelta(days=int(policy["window_days"]))
            if self.clock() - delivered_at > window:
                return (
                    f"it was delivered on {delivered_at.date().isoformat()}, outside the "
                    f"{policy['window_days']}-day refund window of policy v{policy['version']}"
                )
        if Decimal(str(order["refundable"])) <= 0:
            return "nothing is left to refund"
        return None

    def _fetch(
        self, seen: Transcript, tool: str, args: dict[str, Any]
    ) -> dict[str, Any] | Decision:
        """The latest successful result of a read, or the step to take to get one."""
        results = seen.results(tool, **args)
        for envelope in reversed(results):
            if envelope.status == "ok" and isinstance(envelope.result, dict):
                return envelope.result
        if len(results) >= READ_ATTEMPTS:
            return _answer(
                f"I could not finish the refund check: {tool} failed "
                f"{len(results)} times ({_error_text(results[-1])})."
            )
        return _call(tool, args)

    def _after_submit(self, seen: Transcript, order_id: str, submit: ToolEnvelope) -> Decision:
        """Confirm a successful refund by its status; otherwise report, never resubmit."""
        if submit.status == "error":
            return _answer(f"The refund for order {order_id} was not made: {_error_text(submit)}.")
        refund_id = submit.result.get("refund_id") if isinstance(submit.result, dict) else None
        if submit.status == "unknown" or not refund_id:
            return _answer(
                f"A refund for order {order_id} was submitted but its outcome is not confirmed; "
                "it was not submitted again."
            )
        status = self._fetch(seen, "get_refund_status", {"refund_id": refund_id})
        if isinstance(status, Decision):
            return status
        return _answer(
            f"Refunded {status['amount']} {status['currency']} to order {order_id} "
            f"(refund {refund_id}, status {status['status']})."
        )


def _parse_time(value: Any) -> datetime | None:
    """An ISO timestamp as an aware datetime (naive ones are UTC), or None."""
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
