"""The refund tools as a typical agent implementation writes them: plain HTTP calls.

The baselines call the same reference services as loopwright, with the same timeouts, but the
way most agent code does: no journal, no intent key, no authorisation beyond what the service
itself checks. The payment service insists on an `Idempotency-Key` header, so each baseline
supplies one the usual way (the model's call id, or a fresh uuid per request). Store credit
(`POST /credits`) takes no key at all, and the baselines send it as a naive client does: the
order's owner looked up, the credit posted, no key and no deadline.

Results are returned as the envelope the scripted policy reads (`{"status": "ok", "result": ...}`);
failures raise, and the agent framework turns the exception into the error text the model sees.
The crash points of the runtime's executor are placed at the same moments of the write, so that
"crash after send" means the same thing for every system.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from langchain_core.tools import BaseTool, tool

from loopwright.graph.crashpoints import crash_point
from loopwright_refunds.agent import READ_TIMEOUT_S, agent
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.store_credit import CREDIT_TIMEOUT_S

_SUBMIT_REFUND = agent.tools.get("submit_refund")
assert _SUBMIT_REFUND is not None, "the refund agent's write"
WRITE_TIMEOUT_S = _SUBMIT_REFUND.timeout_s  # the runtime's own timeout for the same write


class ServiceRefused(Exception):
    """The service answered with an error status; its body is what the model gets to read."""


def _ok(response: httpx.Response) -> str:
    if response.status_code >= 400:
        raise ServiceRefused(f"HTTP {response.status_code}: {response.text}")
    return json.dumps({"status": "ok", "result": response.json()})


class RefundHttp:
    """The four refund tools and store credit over one HTTP client."""

    def __init__(self, endpoints: ServiceEndpoints, client: httpx.Client) -> None:
        self.endpoints = endpoints
        self.client = client

    def get_order(self, order_id: str) -> str:
        url = f"{self.endpoints.orders}/orders/{order_id}"
        return _ok(self.client.get(url, timeout=READ_TIMEOUT_S))

    def get_policy(self) -> str:
        url = f"{self.endpoints.policies}/policies/refunds"
        return _ok(self.client.get(url, timeout=READ_TIMEOUT_S))

    def get_refund_status(self, refund_id: str) -> str:
        url = f"{self.endpoints.payments}/refunds/{refund_id}"
        return _ok(self.client.get(url, timeout=READ_TIMEOUT_S))

    def submit_refund(self, args: dict[str, Any], idempotency_key: str) -> str:
        body = {k: args[k] for k in ("order_id", "amount", "currency", "reason")}
        request = self.client.build_request(
            "POST",
            f"{self.endpoints.payments}/refunds",
            json=body,
            headers={"Idempotency-Key": idempotency_key},
            timeout=WRITE_TIMEOUT_S,
        )
        return self._send(request)

    def issue_store_credit(self, args: dict[str, Any]) -> str:
        """Credit the order's owner: no idempotency key (the service takes none), no deadline."""
        order = self.client.get(
            f"{self.endpoints.orders}/orders/{args['order_id']}", timeout=READ_TIMEOUT_S
        )
        if order.status_code >= 400:
            raise ServiceRefused(f"HTTP {order.status_code}: {order.text}")
        body = {
            "user_id": order.json()["owner"],
            **{k: args[k] for k in ("amount", "currency", "note")},
        }
        request = self.client.build_request(
            "POST", f"{self.endpoints.payments}/credits", json=body, timeout=CREDIT_TIMEOUT_S
        )
        return self._send(request)

    def _send(self, request: httpx.Request) -> str:
        """Send a write, with the executor's crash points at the same moments as loopwright's."""
        crash_point("executor:after_dispatch_record")  # about to send; nothing recorded anywhere
        response = self.client.send(request, stream=True)
        try:
            crash_point("executor:after_send")  # the service applied it; the answer is unread
            response.read()
        finally:
            response.close()
        crash_point("executor:before_outcome_record")  # read, not yet handed to the model
        return _ok(response)


def read_tools(http: RefundHttp) -> list[BaseTool]:
    """The three reads as langchain tools, named and described as loopwright's contracts are."""

    @tool
    def get_order(order_id: str) -> str:
        """Read an order: status, amount, refundable balance, delivery date, version."""
        return http.get_order(order_id)

    @tool
    def get_policy() -> str:
        """Read the current refund policy document."""
        return http.get_policy()

    @tool
    def get_refund_status(refund_id: str) -> str:
        """Read a refund by its refund id."""
        return http.get_refund_status(refund_id)

    return [get_order, get_policy, get_refund_status]


def credit_tool(http: RefundHttp) -> BaseTool:
    """Store credit, as both baselines have it: there is no key to derive from anything."""

    @tool
    def issue_store_credit(order_id: str, amount: str, currency: str, note: str) -> str:
        """Give the customer store credit for an order. Moves money; cannot be deduped."""
        args = {"order_id": order_id, "amount": amount, "currency": currency, "note": note}
        return http.issue_store_credit(args)

    return issue_store_credit
