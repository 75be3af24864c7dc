"""One MCP client session, usable from synchronous code, over stdio or streamable HTTP.

The MCP client is async and the runtime's nodes are synchronous. A session owns one event loop
in a background thread and one task that holds the client (and, over stdio, the server's
process) open from start to `close`, since a transport must be entered and left by the same
task; calls are submitted to that loop and awaited with a timeout. A stdio server's stderr (its
log lines, the tracebacks of calls it refused) goes to a file, never to the output of the
process that started it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, Tool

CONNECT_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
# The MCP client's own HTTP timeouts (a server may hold a response stream open for long).
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@dataclass(frozen=True)
class Stdio:
    """A server the session starts as a process and talks to over its stdin and stdout; its
    stderr is appended to `log`."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    log: Path | None = None


@dataclass(frozen=True)
class StreamableHttp:
    """A server listening at `url` (streamable HTTP), sent `headers` (e.g. its credentials) on
    every request."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


Transport = Stdio | StreamableHttp


@contextlib.asynccontextmanager
async def _client(transport: Transport) -> AsyncIterator[Client]:
    if isinstance(transport, StreamableHttp):
        # The client the MCP SDK says to make for headers of one's own (its credentials).
        http = httpx2.AsyncClient(headers=dict(transport.headers), timeout=HTTP_TIMEOUT)
        async with http, Client(streamable_http_client(transport.url, http_client=http)) as client:
            yield client
        return
    params = StdioServerParameters(
        command=transport.command,
        args=list(transport.args),
        env=dict(transport.env) if transport.env is not None else None,
        cwd=transport.cwd,
    )
    log = transport.log or Path(os.devnull)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


class McpSession:
    """One client session, from `open` to `close` (a context manager that does both). Made in
    one process and used there only: `pid` says which."""

    def __init__(self, transport: Transport, *, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self._transport = transport
        self._connect_timeout_s = connect_timeout_s
        self.pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._held: concurrent.futures.Future[None] | None = None

    def open(self) -> Self:
        self._thread.start()
        ready: concurrent.futures.Future[Client] = concurrent.futures.Future()
        self._held = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        try:
            self._client = ready.result(timeout=self._connect_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def _hold(self, ready: concurrent.futures.Future[Client]) -> None:
        """Keep the client open, in this one task, until `close` sets the stop event."""
        self._stop = asyncio.Event()
        try:
            async with _client(self._transport) as client:
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    @property
    def alive(self) -> bool:
        """Whether the client is still held open (a stdio server that died ends it)."""
        return self._client is not None and self._held is not None and not self._held.done()

    def _call[T](self, work: Callable[[Client], Coroutine[Any, Any, T]], timeout_s: float) -> T:
        if self._client is None:
            raise RuntimeError("the MCP session is not open")
        future = asyncio.run_coroutine_threadsafe(work(self._client), self._loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    @property
    def server_name(self) -> str | None:
        info = self._client.server_info if self._client is not None else None
        return info.name if info is not None else None

    def list_tools(self, timeout_s: float = CONNECT_TIMEOUT_S) -> list[Tool]:
        async def every_page(client: Client) -> list[Tool]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                if (cursor := page.next_cursor) is None:
                    return tools

        return self._call(every_page, timeout_s)

    def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float,
        meta: Mapping[str, Any] | None = None,
    ) -> CallToolResult:
        """Call a tool; `meta` travels in the request's `_meta` (what a server may read, e.g. a
        write's intent key to dedupe by)."""
        given: Any = dict(meta) if meta else None
        return self._call(
            lambda client: client.call_tool(
                name, arguments, read_timeout_seconds=timeout_s, meta=given
            ),
            timeout_s + 1.0,
        )

    def close(self) -> None:
        """Close the client (a stdio server's stdin, then its process) and stop the loop.
        Idempotent; from another process (after a fork) only forgets it."""
        if os.getpid() != self.pid:
            self._held = self._client = None
            return
        if self._held is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            # A failure of the session was already raised by `open` or by the call it broke.
            with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                self._held.result(timeout=CLOSE_TIMEOUT_S)
        self._held = self._client = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
