"""Synchronous helpers for the services' admin and inspection endpoints.

Tests and the CLI use these to stage a scenario (arm a fault, change an order, publish a
policy) and to check the ground truth in a service's own storage (the refunds it holds).
"""

from __future__ import annotations

from typing import Any

import httpx

from loopwright_refunds.services.endpoints import ServiceEndpoints, tls_context

TIMEOUT_S = 5.0


def set_fault(
    endpoints: ServiceEndpoints,
    mode: str,
    delay_s: float = 0,
    times: int = 1,
    *,
    no_query: bool = False,
) -> dict[str, Any]:
    """Arm a payments fault (see `services.faults`); mode "none" disarms."""
    body = {"mode": mode, "delay_s": delay_s, "times": times, "no_query": no_query}
    return _post(f"{endpoints.payments}/admin/faults", body)


def list_refunds(endpoints: ServiceEndpoints, order_id: str) -> list[dict[str, Any]]:
    """Every refund the payments service stored for the order."""
    response = httpx.get(
        f"{endpoints.payments}/refunds",
        params={"order_id": order_id},
        timeout=TIMEOUT_S,
        verify=tls_context(),
    )
    response.raise_for_status()
    refunds: list[dict[str, Any]] = response.json()["refunds"]
    return refunds


def create_order(
    endpoints: ServiceEndpoints, order_id: str, owner: str, amount: str, **fields: Any
) -> dict[str, Any]:
    """Create an order (currency, status, delivered_at optional; by default refundable now)."""
    return _post(
        f"{endpoints.orders}/admin/orders",
        {"order_id": order_id, "owner": owner, "amount": amount, **fields},
    )


def update_order(endpoints: ServiceEndpoints, order_id: str, **fields: Any) -> dict[str, Any]:
    """Change an order (status, amount, delivered_at, owner) as a concurrent actor would."""
    return _post(f"{endpoints.orders}/admin/orders/{order_id}", fields)


def publish_policy(endpoints: ServiceEndpoints, name: str, **fields: Any) -> dict[str, Any]:
    """Publish the next version of a policy; `text` is required, other fields are copied."""
    return _post(f"{endpoints.policies}/admin/policies/{name}", fields)


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=TIMEOUT_S, verify=tls_context())
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def slow_down(endpoints_url: str, seconds: float, methods: tuple[str, ...] = ("GET",)) -> None:
    """Delay a service's requests of these methods (see `services.observe`)."""
    _post(f"{endpoints_url}/admin/slow", {"seconds": seconds, "methods": list(methods)})


def requests_seen(endpoints_url: str) -> list[dict[str, Any]]:
    """The requests a service has served so far, with start and end times."""
    response = httpx.get(f"{endpoints_url}/admin/requests", timeout=TIMEOUT_S, verify=tls_context())
    response.raise_for_status()
    log: list[dict[str, Any]] = response.json()
    return log
