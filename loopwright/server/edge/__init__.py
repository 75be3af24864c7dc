"""The served edge: every request to either engine is judged here first, by route and field,
and only what is judged reaches the engine (default-deny).

`Edge` is ASGI middleware on the server app (`server.app`), which both engines serve in front of
their own routes and their auth: outermost on LangGraph's server, inside only Aegra's request-id,
CORS and logging middleware (none of which reads a body). For each HTTP request it:

1. bounds the headers (431) before anything else;
2. matches the method and path to one route of `edge.routes` (404, 405), never guessing by the
   body's shape;
3. authenticates the caller (`server.identities`; 401) unless the route is public, and checks
   the route's access for their roles (403; a refused route: its status and why);
4. reads the body only up to the route's bound (413, before the rest is read), and validates it
   and the query against the route's models (`edge.bodies`; 422: an unclassified field is
   refused);
5. applies the rules that need the run or thread (`edge.threads`, `edge.runs`: whose it is,
   admission, decisions), and
6. hands the engine the normalised request: the body and query dumped again from the models,
   the passed headers only (`edge.http.PASSED_HEADERS`), the owner stamped into metadata.

The engine's auth hooks (`server.auth`) then only confirm that the edge admitted this request
as the resource and action the engine asks about (`admitted`), and return its filter. A
WebSocket is refused: neither engine serves one loopwright needs.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopwright.core.roles import Capability
from loopwright.core.text import validation_problems
from loopwright.server.edge import bodies
from loopwright.server.edge.http import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_QUERY_BYTES,
    Refused,
    answer,
    header,
    header_bytes,
    passed_on,
    read_body,
    replaying,
)
from loopwright.server.edge.routes import Access, Matched, NotRouted, match
from loopwright.server.edge.runs import admit_run, withdraw
from loopwright.server.edge.threads import (
    journaled,
    owner_filter,
    refuse_unless_own,
    refuse_unless_visible,
    stamp,
    thread_owner,
)
from loopwright.server.identities import IdentityRefused, authenticated_user
from loopwright.server.resources import hosted_roles
from loopwright.server.users import User


@dataclass(frozen=True)
class Admitted:
    """A request the edge let through: who made it (None on a public route), as what kind,
    and the filter the engine's hooks return for it."""

    user: User | None
    kind: str
    filter: dict[str, str] | None = None
    params: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None  # what the engine is sent, where a rule wrote it


_admitted: ContextVar[Admitted | None] = ContextVar("loopwright_edge_admitted", default=None)


def admitted() -> Admitted | None:
    """What the edge admitted the request being served as (None: it did not pass the edge)."""
    return _admitted.get()


class Edge:
    """ASGI middleware: the edge of the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # a WebSocket: closed before it is accepted (a 403)
            await send({"type": "websocket.close", "code": 1008})
            return
        try:
            passed, body, query = await _judge(scope, receive)
        except Refused as refused:
            await answer(send, refused.status, refused.detail)
            return
        token = _admitted.set(passed)
        if passed.kind == "runs.create":
            send = _withdrawing(passed.params["thread_id"], send)
        try:
            await self.app(passed_on(scope, body, query), replaying(body or b"", receive), send)
        finally:
            _admitted.reset(token)


def _withdrawing(thread_id: str, send: Send) -> Send:
    """`send`, withdrawing the run's admission when the engine refuses the run after all."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            await withdraw(thread_id)
        await send(message)

    return sending


async def _judge(scope: Scope, receive: Receive) -> tuple[Admitted, bytes | None, dict[str, Any]]:
    """The request as admitted, its normalised body (None: it takes none) and query."""
    if len(scope["headers"]) > MAX_HEADERS or header_bytes(scope) > MAX_HEADER_BYTES:
        raise Refused(431, f"at most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes in all")
    try:
        matched = match(scope["method"], scope["path"])
    except NotRouted as exc:
        raise Refused(exc.status, exc.detail) from None
    route = matched.route
    user = await _caller(scope, route.access)
    if route.access is Access.REFUSED:
        raise Refused(route.status, route.why)
    what = f"{route.method} {route.template}"
    query = _model(route.query, _query(scope), f"{what}'s query").normalised()
    raw = await read_body(scope, receive, route.max_body, what)
    if route.body is None:
        passed = await _rule(route.kind, user, matched, None)
        return passed, None, query
    value = _model(route.body, _json(raw), f"{what}'s body")
    passed = await _rule(route.kind, user, matched, value)
    body = passed.body if passed.body is not None else value.normalised()
    return passed, json.dumps(body).encode(), query


_NEEDS: dict[Access, Capability] = {Access.OPERATOR: "operate", Access.APPROVER: "decide"}


async def _caller(scope: Scope, access: Access) -> User | None:
    """The authenticated caller (None on a public route); 401 without an identity, 403 for a
    route their roles do not reach."""
    if access is Access.PUBLIC:
        return None
    try:
        user = await authenticated_user(header(scope, b"authorization"))
    except IdentityRefused as exc:
        raise Refused(exc.status, exc.detail) from None
    roles = await hosted_roles()
    needs: Capability | None = _NEEDS.get(access)
    if needs is not None and not roles.grants(needs, user.roles):
        raise Refused(403, roles.refusal(needs))
    return user


def _query(scope: Scope) -> dict[str, str]:
    raw: bytes = scope.get("query_string", b"")
    if len(raw) > MAX_QUERY_BYTES:
        raise Refused(414, f"a query string of at most {MAX_QUERY_BYTES} bytes")
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the query string is not URL-encoded UTF-8 text") from None
    query = dict(pairs)
    if len(query) != len(pairs):
        raise Refused(422, "a query parameter is given twice")
    return query


def _json(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused(
            422, "the body is not a JSON document of the size and depth a request has"
        ) from None


def _model(model: type[bodies.Closed], value: Any, what: str) -> bodies.Closed:
    """`value` as `model` takes it; 422 naming every field it refuses, and why."""
    if not isinstance(value, dict):
        raise Refused(422, f"{what} is a JSON object")
    refused = sorted(set(value) & set(bodies.REFUSED_FIELDS) - set(model.model_fields))
    if refused:
        name = refused[0]
        raise Refused(422, f"{name}: {bodies.REFUSED_FIELDS[name]}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise Refused(422, f"{what}: {validation_problems(exc)}") from None


async def _rule(
    kind: str, user: User | None, matched: Matched, value: bodies.Closed | None
) -> Admitted:
    """The rules that need the thread or run the request names, by kind."""
    params = matched.params
    if user is None:
        return Admitted(None, kind, params=params)
    roles = await hosted_roles()
    thread_id = params.get("thread_id")
    if kind == "threads.create":
        assert value is not None
        body = value.normalised()
        body["metadata"] = {**(body.get("metadata") or {}), **stamp(user.user_id, user.tenant)}
        return Admitted(user, kind, owner_filter(user, roles), params, body)
    if thread_id is None:
        return Admitted(user, kind, owner_filter(user, roles), params)
    if kind == "runs.create":
        assert isinstance(value, bodies.RunCreate)
        run = await admit_run(user, thread_id, value)
        return Admitted(user, kind, run.filter, params, run.body)
    owner = await thread_owner(thread_id)
    if kind == "threads.delete":
        refuse_unless_own(user, owner, thread_id, "this thread belongs to another user")
        if await journaled(thread_id):
            raise Refused(403, "this run has journaled actions: its record cannot be deleted")
        return Admitted(user, kind, stamp(user.user_id, user.tenant), params)
    if kind == "runs.cancel":
        refuse_unless_own(user, owner, thread_id, "only the run's own user may cancel it")
        return Admitted(user, kind, stamp(user.user_id, user.tenant), params)
    refuse_unless_visible(user, roles, owner, thread_id)
    return Admitted(user, kind, owner_filter(user, roles), params)
