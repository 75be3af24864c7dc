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
there; the baselines return timeouts to the model as errors, so it does. Like every scripted
policy it is a pure function of the conversation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

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
