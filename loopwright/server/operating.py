"""What an operator's tooling asks a server (either engine): readiness, liveness, metrics.

* `GET /live`: 200 `{"status": "live"}` while the process answers at all.
* `GET /ready` (and `GET /health`, the path load balancers and Aegra's own docs use): 200
  `{"status": "ready"}` when the database (a new connection, and the one the process keeps),
  Redis (on Aegra, where the engine queues runs) and the agent's own dependencies
  (`Agent(health=...)`) answer within the probe's bound, else 503 `{"status": "not ready"}`.
  Unauthenticated, as probes are, so they say nothing else; why is in the server's log.
* `GET /loopwright/metrics`: loopwright's Prometheus metrics (`observability.metrics`,
  `loopwright.stored_state`), for a token of a role the agent's `Roles.operate` names only
  (401 without a token, 403 for any other role): they count every tenant's runs. LangGraph's
  server keeps `/metrics` (its own process metrics, served to anyone), hence a path of
  loopwright's own on both engines.

These routes are the server app's (`server.app`), which both engines serve before their own
routes and outside their auth: LangGraph's server applies its auth middleware to its own API
only (a custom app's routes unless `enable_custom_route_auth`), and Aegra matches a custom
app's routes before its own `/health`, `/ready` and `/live`, which answer without asking
loopwright's dependencies.
"""

from __future__ import annotations

import asyncio
import os

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from loopwright.core.bounded import call_by
from loopwright.readiness import (
    LIVE,
    NOT_READY,
    PROBE_BOUND_S,
    READY,
    Check,
    ReadinessLog,
    agent_answers,
    connections_answer,
    database_answers,
    failing,
)
from loopwright.server.cluster import REDIS_ENV, redis_unreachable
from loopwright.server.edge import admitted
from loopwright.server.identities import BEARER_REQUIRED
from loopwright.server.resources import resources, server_database_url
from loopwright.stored_state import scrape

METRICS_PATH = "/loopwright/metrics"
# Aegra's setting that it queues runs in Redis (`server.cluster` sets it on every instance).
REDIS_QUEUE_ENV = "REDIS_BROKER_ENABLED"
_log = ReadinessLog()


def queue_redis() -> str | None:
    """The Redis this process's engine queues runs in, if it does."""
    if os.environ.get(REDIS_QUEUE_ENV, "").lower() == "true":
        return os.environ.get(REDIS_ENV) or None
    return None


def _redis_answers(url: str) -> Check:
    def check() -> None:
        if (why := redis_unreachable(url, timeout=PROBE_BOUND_S)) is not None:
            raise ConnectionError(why)

    return check


def server_down() -> dict[str, str]:
    """What this server process cannot reach now (empty: it is ready); blocking."""
    try:
        # The first call opens what runs need (the agent's deps, the runner's connections).
        res = call_by(PROBE_BOUND_S, resources, what="opening the server's resources")
    except Exception as exc:
        return {"resources": f"{type(exc).__name__}: {str(exc)[:200]}"}
    checks = {
        "database": database_answers(res.database_url),
        "database connection": connections_answer(res.databases),
        "agent": agent_answers(res.agent, res.runner.deps),
    }
    if (redis := queue_redis()) is not None:
        checks["redis"] = _redis_answers(redis)
    return failing(checks)


async def live(_request: Request) -> Response:
    return JSONResponse(LIVE, headers={"Cache-Control": "no-store"})


_checking: asyncio.Future[dict[str, str]] | None = None


async def _down_now() -> dict[str, str]:
    """`server_down`, one check at a time: probes that come while one runs share its answer
    (an unauthenticated caller cannot make the process open connections faster than that)."""
    global _checking
    if _checking is None or _checking.done():
        _checking = asyncio.ensure_future(asyncio.to_thread(server_down))
    return await asyncio.shield(_checking)


async def ready(_request: Request) -> Response:
    down = await _down_now()
    _log.note(down)
    return JSONResponse(
        NOT_READY if down else READY,
        status_code=503 if down else 200,
        headers={"Cache-Control": "no-store"},
    )


async def metrics(_request: Request) -> Response:
    """For operators: the edge admits no one else to this route (`edge.routes`)."""
    passed = admitted()
    if passed is None or passed.user is None:  # not served through the edge: nobody
        return JSONResponse({"detail": BEARER_REQUIRED}, status_code=401)
    body = await asyncio.to_thread(scrape, server_database_url())
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
