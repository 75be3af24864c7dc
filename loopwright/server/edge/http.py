"""The edge's ASGI plumbing: bounded bodies, answers in one line, what is passed on.

Nothing here judges a request; it reads what the judging needs, within bounds, and hands on
what was judged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlencode

from starlette.types import Message, Receive, Scope, Send

# All of a request's headers together: a browser's or an SDK's are well under 4 KB; a token
# has its own, smaller bound (`server.identities`).
MAX_HEADER_BYTES = 16_384
MAX_HEADERS = 64
MAX_QUERY_BYTES = 2_048
# The headers an engine is handed. Any other is dropped: the engines copy `x-*` headers, the
# user agent and tracing baggage into every run's configuration (and so into its checkpoints).
PASSED_HEADERS = frozenset(
    {
        b"host",
        b"authorization",
        b"accept",
        b"accept-encoding",
        b"content-type",
        b"cache-control",
        b"connection",
        b"last-event-id",
        b"origin",
        b"access-control-request-method",
        b"access-control-request-headers",
    }
)


class Refused(Exception):
    """A request the edge refuses: its status, and one line saying why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def header_bytes(scope: Scope) -> int:
    return sum(len(name) + len(value) for name, value in scope["headers"])


def header(scope: Scope, name: bytes) -> bytes | None:
    """The one value of header `name` (lowercase); Refused (400) for one sent twice."""
    values = [value for key, value in scope["headers"] if key.lower() == name]
    if len(values) > 1:
        raise Refused(400, f"the {name.decode()} header is sent {len(values)} times")
    return values[0] if values else None


async def read_body(scope: Scope, receive: Receive, limit: int, what: str) -> bytes:
    """The request's body, read only while within `limit` bytes: Refused (413) as soon as it
    says or shows it is longer, before the rest is read."""
    length = header(scope, b"content-length")
    if length is not None:
        if not length.isdigit():
            raise Refused(400, "the content-length header is not a number")
        if int(length) > limit:
            raise _too_large(what, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            raise Refused(400, "the request ended before its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(what, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(what: str, limit: int) -> Refused:
    if limit == 0:
        return Refused(413, f"{what} takes no body")
    return Refused(413, f"{what} takes a body of at most {limit} bytes")


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands `body` on as the whole request, then what the client does next
    (a stream's handler listens for its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def passed_on(scope: Scope, body: bytes | None, query: dict[str, object]) -> Scope:
    """The request the engine sees: the passed headers only, the normalised query, and (when
    the body was read) the normalised body's length and type."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() in PASSED_HEADERS]
    if body is not None:
        headers = [(k, v) for k, v in headers if k.lower() != b"content-type"]
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    return {**scope, "headers": headers, "query_string": urlencode(list(_flat(query))).encode()}


def _flat(query: dict[str, object]) -> Iterable[tuple[str, str]]:
    for key, value in query.items():
        if isinstance(value, bool):
            yield key, "true" if value else "false"
        elif value is not None:
            yield key, str(value)


async def answer(send: Send, status: int, detail: str) -> None:
    """A one-line JSON answer (`{"detail": ...}`), as both engines give theirs, closing the
    connection: a refused request's body may not have been read, and a server keeping the
    connection would read it all to find the next request (300 MB drained per refusal)."""
    payload = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
