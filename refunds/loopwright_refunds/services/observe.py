"""What every reference service exposes beside its business routes: a health check (`GET
/health`, what the refund agent's readiness asks), and for tests a request log and a slow-down
knob.

Concurrency claims ("two reads ran side by side", "two writes to one order never overlapped")
are checked where they happen, at the service: each request's method, path and start/end times
are logged (`GET /admin/requests`). `POST /admin/slow {"seconds": s, "methods": [...]}` delays
requests of those methods, so that overlaps, or their absence, are observable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field

ADMIN = "/admin/"
HEALTH = "/health"


class Slowness(BaseModel):
    seconds: float = Field(default=0, ge=0, le=30)
    methods: list[str] = Field(default_factory=lambda: ["GET"])


class LoggedRequest(BaseModel):
    method: str
    path: str
    started: float  # time.monotonic() in the service process
    ended: float


def install(app: FastAPI) -> None:
    log: list[LoggedRequest] = []
    slowness = Slowness()

    @app.middleware("http")
    async def observe(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path.startswith(ADMIN) or request.url.path == HEALTH:
            return await call_next(request)  # not business: neither logged nor slowed down
        started = time.monotonic()
        if request.method in slowness.methods and slowness.seconds:
            await asyncio.sleep(slowness.seconds)
        response = await call_next(request)
        log.append(
            LoggedRequest(
                method=request.method,
                path=request.url.path,
                started=started,
                ended=time.monotonic(),
            )
        )
        return response

    @app.get(HEALTH)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/admin/requests")
    async def requests() -> list[LoggedRequest]:
        return log

    @app.post("/admin/slow")
    async def slow(setting: Slowness) -> Slowness:
        nonlocal slowness
        slowness = setting
        return slowness
