"""What the server answers before any route or auth hook: the requests no hook could judge.

The engines answer some requests before loopwright's auth hooks see them, or call the hooks
with too little to judge them by:

* LangGraph's server serves its process metrics, its API description and its versions
  (`/metrics`, `/docs`, `/openapi.json`, `/info`) to anyone; they tell an outsider what runs
  and how busy it is. They need a known token here.
* A thread's id is the server's to choose. A client naming one (`POST /threads` with
  `thread_id`) learned, from the engine's 409 "already exists", that someone else's thread of
  that id exists; the create hook cannot tell a client's id from one the engine made up. A
  client's id is a 422, whoever's it would have been.
* A thread's copy (LangGraph's server) duplicates a run's record under another thread, which no
  client needs, and the engine answers a copy of a thread the caller may not see with its own
  409 where the read hook says 404: refused, the same for every thread.

Everything else passes through unchanged (the body of a `POST /threads` is read once here and
handed on as it came). A request without a known token is left to the engine's auth, so it is
a 401 as everywhere else.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopwright.server.auth import authorization_of
from loopwright.server.identities import IdentityRefused, authenticated_user

TOKEN_ONLY = frozenset({"/metrics", "/docs", "/redoc", "/openapi.json", "/info"})
NEW_THREAD = re.compile(r"^/threads/?$")
COPY = re.compile(r"^/threads/[^/]+/copy/?$")
CLIENT_THREAD_IDS = ("thread_id", "threadId")  # LangGraph's spelling, and Aegra's too


class Gate:
    """ASGI middleware: the refusals above, as one-line JSON 4xx answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        known = await _known(scope)
        refusal: tuple[int, str] | None = None
        if path in TOKEN_ONLY and not known:
            refusal = (401, "a valid bearer token is required")
        elif method == "POST" and known and COPY.match(path):
            refusal = (403, "threads are not copied: a run's record lives on its own thread only")
        elif method == "POST" and known and NEW_THREAD.match(path):
            body, receive = await _read_body(receive)
            if _names_thread(body):
                refusal = (
                    422,
                    "a thread's id is the server's to choose: create it without thread_id",
                )
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, detail = refusal
        payload = json.dumps({"detail": detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def _known(scope: Scope) -> bool:
    """Whether the request's bearer token proves an identity (`server.identities`)."""
    try:
        await authenticated_user(authorization_of(dict(scope["headers"])))
    except IdentityRefused:
        return False
    return True


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, and a `receive` that hands it on to the app as if unread."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: let the app see it
            return b"", _replay([message], receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()

    return replayed


def _names_thread(body: bytes) -> bool:
    try:
        value: Any = json.loads(body)
    except ValueError:  # not JSON: the engine says so itself
        return False
    return isinstance(value, dict) and any(value.get(key) for key in CLIENT_THREAD_IDS)
