"""The engines' auth hooks (langgraph.json `auth`; Aegra's `auth`): they confirm the edge.

Every request reaches an engine through the edge (`server.edge`), which authenticates the
caller, judges the request by its route and fields, applies the run and thread rules and
hands on the normalised request. So the hooks decide nothing of their own: `authenticate` gives
the engine the user the edge authenticated, and each resource's handler checks that the edge
admitted this very request as the resource and action the engine asks about (an engine that
authorizes a route as something else, or a request that did not pass the edge, is refused), then
returns the edge's filter for the engine to apply where it applies filters.

The engine identity is the tenant (`server.engine`): the engine itself walls tenants off, and
an approver reaches every thread of their tenant.
"""

from __future__ import annotations

import os
from typing import Any

from langgraph_sdk import Auth

from loopwright.server import identities
from loopwright.server.edge import Admitted, admitted
from loopwright.server.engine import engine_identity, refuse_thread_ttl
from loopwright.server.identities import BEARER_REQUIRED

# What each kind of request the edge admits may have the engine ask its hooks: the action of
# the route itself, and the reads an engine makes along the way (Aegra checks the assistant a
# run names; LangGraph's server reads the thread a run is created on).
_ASKS: dict[str, frozenset[tuple[str, str]]] = {
    "threads.create": frozenset({("threads", "create")}),
    "threads.search": frozenset({("threads", "search")}),
    "threads.read": frozenset({("threads", "read"), ("threads", "search")}),
    "threads.delete": frozenset({("threads", "delete"), ("threads", "read")}),
    "runs.read": frozenset({("threads", "read"), ("threads", "search")}),
    "runs.create": frozenset(
        {("threads", "create_run"), ("threads", "read"), ("assistants", "read")}
    ),
    "runs.cancel": frozenset({("threads", "update"), ("threads", "read")}),
    "assistants.read": frozenset({("assistants", "read"), ("assistants", "search")}),
}

identities.configured()  # a broken identity configuration stops the server at its start
refuse_thread_ttl(os.environ)  # so does an engine set to delete runs' records by a timer
auth = Auth()


def _passed(resource: str, action: str) -> Admitted:
    passed = admitted()
    if passed is None or passed.user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail=BEARER_REQUIRED)
    if (resource, action) not in _ASKS.get(passed.kind, frozenset()):
        raise Auth.exceptions.HTTPException(
            status_code=403, detail=f"{resource}.{action} is not available"
        )
    return passed


@auth.authenticate
async def authenticate(headers: Any) -> Auth.types.MinimalUserDict:
    """The user the edge authenticated for this request. Takes `headers`, which Aegra passes
    whole, and reads none of them: the edge read the token, once."""
    passed = admitted()
    if passed is None or passed.user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail=BEARER_REQUIRED)
    user = passed.user
    return {
        "identity": engine_identity(user.tenant),
        "user_id": user.user_id,  # type: ignore[typeddict-unknown-key]  # kept on the user
        "roles": list(user.roles),
        "tenant": user.tenant,
        "permissions": list(user.roles),
    }


@auth.on.threads
async def on_threads(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType | None:
    """Threads, their state and history, and runs on them: as the edge admitted."""
    return _passed(ctx.resource, ctx.action).filter


@auth.on.assistants
async def on_assistants(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType | None:
    """The server's own assistant, read only."""
    _passed(ctx.resource, ctx.action)
    return None


@auth.on
async def closed(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType | None:
    """Everything else (the store, crons) is closed, as the edge refuses its routes."""
    raise Auth.exceptions.HTTPException(
        status_code=403, detail=f"{ctx.resource}.{ctx.action} is not available"
    )
