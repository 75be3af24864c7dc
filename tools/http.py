"""One place that turns HTTP outcomes into the runtime's outcome classes.

The classification is the whole point: for a read, any transport problem is a (transient) fault;
for a write, only "the request never left" (connect failure) or a definitive 4xx answer is a
known outcome. A timeout, a dropped connection or a 5xx after the request was sent means the
business system may have applied the write: OutcomeUnknown, never a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from loopwright.tools.contract import OutcomeUnknown, ToolFault


def _error_of(response: httpx.Response) -> ToolFault:
    try:
        body = response.json()
    except ValueError:
        body = {}
    code = body.get("error") if isinstance(body, dict) else None
    detail = body.get("detail", "") if isinstance(body, dict) else ""
    return ToolFault(code or f"http_{response.status_code}", detail or response.reason_phrase)


def read_json(client: httpx.Client, url: str, *, timeout: float) -> Any:
    """GET a JSON document: a transport fault or a 5xx is a transient ToolFault (the read may be
    retried), a 4xx a definitive one named by the answer's `error` field."""
    try:
        response = client.get(url, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ToolFault(
            "timeout", f"no answer from {url} within {timeout}s", transient=True
        ) from exc
    except httpx.TransportError as exc:
        raise ToolFault(
            "service_unavailable", str(exc) or type(exc).__name__, transient=True
        ) from exc
    if response.status_code >= 500:
        fault = _error_of(response)
        raise ToolFault(fault.code, fault.detail, transient=True)
    if response.status_code >= 400:
        raise _error_of(response)
    return response.json()


def write_json(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    *,
    idempotency_key: str | None,
    timeout: float,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """POST a write under a business idempotency key and classify what came back. `headers`
    go along (e.g. the deadline a downstream without keys honours); `idempotency_key=None`
    sends none, for a downstream that has no keys."""
    key = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    sent = {**key, **(headers or {})}
    request = client.build_request("POST", url, json=body, headers=sent, timeout=timeout)
    try:
        response = client.send(request, stream=True)
    except httpx.ConnectError as exc:
        # The connection was never established: nothing reached the business system.
        raise ToolFault(
            "service_unavailable", str(exc) or "connect failed", transient=True
        ) from exc
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        raise OutcomeUnknown(f"{type(exc).__name__} after sending to {url}") from exc
    try:
        response.read()
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        raise OutcomeUnknown(f"{type(exc).__name__} while reading the answer of {url}") from exc
    finally:
        response.close()
    if response.status_code >= 500:
        raise OutcomeUnknown(f"{url} answered {response.status_code}; the write may have applied")
    if response.status_code >= 400:
        raise _error_of(response)
    return response.json()
