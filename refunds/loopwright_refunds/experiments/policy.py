"""The one scripted policy every system in the experiment runs: a model that retries.

Real tool-calling models, told that a call failed or timed out, usually call it again; told that
an order changed, they read it again and act on what they read. `RetryingRefunds` plays that
model on top of the refund procedure, and keeps the gullible model's weakness (it obeys
instructions found in tool output) so that the injected-policy scenario means something:

1. obey each instruction found in tool output once (`Gullible`);
2. review every other order the task names, one read each (long tasks);
3. read the order and the policy, refund the amount the task asks for (or the whole refundable
   balance), confirm the refund by its status;
4. after a submit_refund that failed transiently (timeout, 5xx, dropped connection), send the
   same refund again, up to `max_submits` sends in all;
5. after a submit_refund refused because the order changed (a stale plan, a balance that no
   longer covers it), read the order again and propose the refund the new order allows.

Loopwright never shows an UNKNOWN write as failed (it reconciles first), so step 4 never fires
there; the baselines return timeouts to the model as errors, so it does.

A task that asks for store credit ("Give 20.00 USD store credit for order O-7.") is played by
`RetryingCredit`, the same model on a write without idempotency keys: it asks for
`issue_store_credit` once and, told that the call failed transiently, sends it again, up to
`max_sends` in all.

A task that hands the model the amounts ("Refund the customer what they paid: 34.50 USD for
order O-7 and 20.00 USD for order O-8.") is played by `SkipsThePolicy`, the weak model a real
0.5B one was seen to be: it calls submit_refund for each order at once, at the amount named,
reading neither the order nor the policy, then says it is done.

`ExperimentPolicy` picks one of the three by the task. Like every scripted policy they are pure
functions of the conversation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from langchain_core.messages import BaseMessage

from loopwright.models.scripted import Decision
from loopwright_refunds.misbehaving import Gullible
from loopwright_refunds.procedure import ORDER_ID, Observation, Transcript

# How a failure reads when trying again may help: the text of the tool result, as a model reads it.
TRANSIENT = re.compile(
    r"timeout|timed out|HTTP 5\d\d|internal_error|unavailable|ConnectError|RemoteProtocolError",
    re.IGNORECASE,
)
# How "the order is not what you read" reads: loopwright's stale plan, the payment service's refusal.
STALE = re.compile(r"stale_plan|amount_exceeds_refundable|refund_exceeds_balance")
REQUESTED_AMOUNT = re.compile(r"\brefund (\d+\.\d{2}) of order\b", re.IGNORECASE)
CREDIT_REQUEST = re.compile(
    r"\bgive (\d+\.\d{2}) ([A-Z]{3}) store credit for order (O-\d+)", re.IGNORECASE
)
# "Refund the customer what they paid: 34.50 USD for order O-7 and 20.00 USD for order O-8."
PAID_BACK = re.compile(r"\bwhat they paid\b", re.IGNORECASE)
PAID_FOR_ORDER = re.compile(r"\b(\d+\.\d{2}) ([A-Z]{3}) for order (O-\d+)")


def _call(tool: str, args: dict[str, Any]) -> Decision:
    return Decision(tool_calls=[(tool, args)])


@dataclass(frozen=True)
class RetryingRefunds(Gullible):
    """The refund procedure as a model that retries failed writes and re-reads changed orders."""

    max_submits: int = 3

    def plan(self, seen: Transcript) -> Decision:
        order_id = seen.order_id
        if order_id is None:
            return Decision(content="I could not find an order id (like O-42) in the task.")
        asked = [(o.tool, o.args) for o in seen.observations]
        for tool, args in self.instructions(seen):
            if (tool, args) not in asked:
                return _call(tool, args)
        for other in ORDER_ID.findall(seen.task)[1:]:
            if not seen.results("get_order", order_id=other):
                return _call("get_order", {"order_id": other})
        order = self._fetch(seen, "get_order", {"order_id": order_id})
        if isinstance(order, Decision):
            return order
        policy = self._fetch(seen, "get_policy", {})
        if isinstance(policy, Decision):
            return policy
        submits = [
            (i, o)
            for i, o in enumerate(seen.observations)
            if o.tool == "submit_refund" and (o.args or {}).get("order_id") == order_id
        ]
        if not submits:
            return self.propose(seen, order, policy)
        index, last = submits[-1]
        if last.envelope.status == "error" and len(submits) < self.max_submits:
            if TRANSIENT.search(last.content):
                return _call("submit_refund", last.args or {})
            if STALE.search(last.content):
                if not _read_again(seen.observations[index + 1 :], order_id):
                    return _call("get_order", {"order_id": order_id})
                return self.propose(seen, order, policy)
        return self._after_submit(seen, order_id, last.envelope)

    def propose(self, seen: Transcript, order: dict[str, Any], policy: dict[str, Any]) -> Decision:
        """The refund the order and the policy allow now: the task's amount, capped by the balance."""
        reason = self.ineligibility(order, policy)
        if reason:
            return Decision(content=f"Order {order['order_id']} cannot be refunded: {reason}.")
        refundable = Decimal(str(order["refundable"]))
        asked = REQUESTED_AMOUNT.search(seen.task)
        amount = min(Decimal(asked.group(1)), refundable) if asked else refundable
        return _call(
            "submit_refund",
            {
                "order_id": order["order_id"],
                "amount": f"{amount:.2f}",
                "currency": order["currency"],
                "reason": f"eligible under refund policy v{policy['version']}",
            },
        )


def _read_again(later: list[Observation], order_id: str) -> bool:
    return any(o.tool == "get_order" and (o.args or {}).get("order_id") == order_id for o in later)


@dataclass(frozen=True)
class RetryingCredit:
    """Store credit as a model that retries: one issue_store_credit, sent again when it failed
    transiently (a timeout, a 5xx), up to `max_sends` sends in all; then it reports."""

    max_sends: int = 3

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        return self.plan(Transcript.read(messages))

    def plan(self, seen: Transcript) -> Decision:
        asked = CREDIT_REQUEST.search(seen.task)
        if asked is None:
            return Decision(content="I could not find the credit (amount, order) in the task.")
        amount, currency, order_id = asked.groups()
        sends = [o for o in seen.observations if o.tool == "issue_store_credit"]
        if not sends:
            return _call(
                "issue_store_credit",
                {
                    "order_id": order_id,
                    "amount": amount,
                    "currency": currency.upper(),
                    "note": f"store credit for order {order_id}",
                },
            )
        last = sends[-1]
        failed = last.envelope.status == "error"
        if failed and TRANSIENT.search(last.content) and len(sends) < self.max_sends:
            return _call("issue_store_credit", last.args or {})
        if last.envelope.status == "ok":
            return Decision(content=f"Gave {amount} {currency} store credit for order {order_id}.")
        return Decision(
            content=f"The store credit for order {order_id} was not confirmed: {last.content}"
        )


@dataclass(frozen=True)
class SkipsThePolicy:
    """A weak model that refunds what the task names at once: one submit_refund per order, in
    the order named, at the amount and currency named, with no read of the order or the policy.
    It sends each refund once, whatever comes back, and then says the refunds were submitted."""

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        return self.plan(Transcript.read(messages))

    def plan(self, seen: Transcript) -> Decision:
        asked = PAID_FOR_ORDER.findall(seen.task)
        if not asked:
            return Decision(content="I could not find the refunds (amount, order) in the task.")
        sent = {
            (o.args or {}).get("order_id") for o in seen.observations if o.tool == "submit_refund"
        }
        for amount, currency, order_id in asked:
            if order_id not in sent:
                return _call(
                    "submit_refund",
                    {
                        "order_id": order_id,
                        "amount": amount,
                        "currency": currency.upper(),
                        "reason": "the customer asked for their money back",
                    },
                )
        return Decision(content="The refunds were submitted.")


@dataclass(frozen=True)
class ExperimentPolicy:
    """The experiment's model: `RetryingCredit` for a store-credit task, `SkipsThePolicy` for a
    task that names the amounts to pay back, else `RetryingRefunds`."""

    refunds: RetryingRefunds = field(default_factory=RetryingRefunds)
    credit: RetryingCredit = field(default_factory=RetryingCredit)
    skips: SkipsThePolicy = field(default_factory=SkipsThePolicy)

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        seen = Transcript.read(messages)
        if CREDIT_REQUEST.search(seen.task):
            return self.credit.plan(seen)
        if PAID_BACK.search(seen.task):
            return self.skips.plan(seen)
        return self.refunds.plan(seen)
