"""Tools of an MCP server as tool contracts: what the server says is shown, never trusted.

An MCP server describes its tools (name, JSON schemas, annotations such as `readOnlyHint`), but a
server is outside the trust boundary, and a hint that a tool only reads is its author's claim.
So every MCP tool is a WRITE that needs approval, with guarantee "none" (an unknown outcome goes
to a human), unless the operator, not the server, lists it as a read (`read_tools`). The hints
are still shown to the approver, labelled as the server's claim.

Arguments are validated against the tool's own input schema (`jsonschema`, no coercion) and kept
exactly as the model gave them; an argument the schema does not name is refused, as for every
contract. A structured result is checked against the tool's output schema. A write's intent is
the tool and its canonical arguments within the run: the same call proposed again maps to the
first action, never a second effect. An MCP server knows nothing of the run's principal: what
stands for authorisation is the operator's allow-list (reads) and a person's approval (writes).

The MCP client is async and the runtime's nodes are synchronous. `McpSession` owns one event
loop in a background thread and one task that holds the client (and its stdio subprocess) open
from start to `close`, since the transport must be entered and left by the same task; calls are
submitted to that loop and awaited with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Collection, Coroutine
from types import TracebackType
from typing import Any, Self

from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent, Tool
from pydantic import BaseModel

from loopwright.graph.state import Action, digest
from loopwright.tools.contract import (
    Effect,
    Guarantee,
    OutcomeUnknown,
    ToolContext,
    ToolContract,
    ToolFault,
    VerifyResult,
)
from loopwright.tools.define import TOOL_NAME
from loopwright.tools.json_schema import schema_model

CONNECT_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0


class McpSession:
    """One MCP client session, usable from synchronous code; a context manager that closes it."""

    def __init__(
        self, server: StdioServerParameters, *, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ):
        self._server = server
        self._connect_timeout_s = connect_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._held: concurrent.futures.Future[None] | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        ready: concurrent.futures.Future[Client] = concurrent.futures.Future()
        self._held = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        try:
            self._client = ready.result(timeout=self._connect_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def _hold(self, ready: concurrent.futures.Future[Client]) -> None:
        """Keep the client open, in this one task, until `close` sets the stop event."""
        self._stop = asyncio.Event()
        try:
            async with Client(self._server) as client:
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

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
    def server_name(self) -> str:
        info = self._client.server_info if self._client is not None else None
        return info.name if info is not None else self._server.command

    def list_tools(self, timeout_s: float = CONNECT_TIMEOUT_S) -> list[Tool]:
        async def every_page(client: Client) -> list[Tool]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                if (cursor := page.next_cursor) is None:
                    return tools

        return self._call(every_page, timeout_s)

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> CallToolResult:
        return self._call(
            lambda client: client.call_tool(name, arguments, read_timeout_seconds=timeout_s),
            timeout_s + 1.0,
        )

    def close(self) -> None:
        """Close the client (the server's stdin, then the process) and stop the loop. Idempotent."""
        if self._held is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            # A failure of the session was already raised by __enter__ or by the call it broke.
            with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                self._held.result(timeout=CLOSE_TIMEOUT_S)
        self._held = self._client = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self._loop.is_running():
            self._loop.close()


class McpContent(BaseModel):
    """The result of a tool without an output schema: its content blocks, as the server sent."""

    content: list[dict[str, Any]]


def _hints(tool: Tool) -> str:
    hints = tool.annotations
    if hints is None:
        return "none"
    claims = [
        ("read-only", hints.read_only_hint),
        ("destructive", hints.destructive_hint),
        ("idempotent", hints.idempotent_hint),
        ("open-world", hints.open_world_hint),
    ]
    said = [name if value else f"not {name}" for name, value in claims if value is not None]
    return ", ".join(said) or "none"


def _text(result: CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, TextContent)) or "no detail"


def _runner(
    session: McpSession, tool: Tool, effect: Effect, structured: bool, timeout_s: float
) -> Callable[[ToolContext[Any], Any, str | None], dict[str, Any]]:
    """Call the tool. No answer (timeout, lost server, unreadable reply) is a transient fault
    for a read and an unknown outcome for a write; an answer flagged as an error is definitive."""

    def run(_ctx: ToolContext[Any], args: BaseModel, _key: str | None) -> dict[str, Any]:
        try:
            result = session.call_tool(tool.name, args.model_dump(mode="json"), timeout_s)
        except Exception as exc:
            if effect is Effect.WRITE:
                raise OutcomeUnknown(f"MCP {tool.name}: no answer ({exc!r})") from exc
            raise ToolFault("mcp_unavailable", f"{tool.name}: {exc!r}", transient=True) from exc
        if result.is_error:
            raise ToolFault("mcp_tool_error", f"{tool.name}: {_text(result)}")
        if structured:
            return result.structured_content
        return {"content": [b.model_dump(mode="json", exclude_none=True) for b in result.content]}

    return run


def mcp_contract(
    session: McpSession, tool: Tool, *, read: bool, timeout_s: float = 10.0
) -> ToolContract:
    """The contract of one MCP tool; `read` comes from the operator, never from the server."""
    if not TOOL_NAME.fullmatch(tool.name):  # other names are refused at startup
        raise ValueError(f"MCP tool name {tool.name!r} is not a valid function name")
    server = session.server_name
    effect = Effect.READ if read else Effect.WRITE
    output = tool.output_schema
    output_model: type[BaseModel] = McpContent
    if output is not None and output.get("type") == "object":
        output_model = schema_model(f"{tool.name}_result", output, closed=False)
    hints = _hints(tool)

    def summarize(args: BaseModel) -> str:
        return (
            f"{tool.name} on MCP server {server}: {args.model_dump_json()} "
            f"(the server's own hints, not trusted: {hints})"
        )

    def acknowledged(_ctx: ToolContext[Any], action: Action) -> VerifyResult:
        # No independent read exists for an arbitrary MCP write: its own successful answer,
        # which met the output contract, is the only evidence. Stated, not hidden.
        return VerifyResult(True, {"mcp_server": server, "verified_by": "server acknowledgement"})

    return ToolContract(
        name=tool.name,
        description=f"[MCP server {server}] {tool.description or tool.name}",
        args_model=schema_model(f"{tool.name}_args", tool.input_schema, closed=True),
        output_model=output_model,
        effect=effect,
        run=_runner(session, tool, effect, output_model is not McpContent, timeout_s),
        needs_approval=lambda _ctx, _args: not read,
        intent_key=(
            None
            if read
            else lambda run_id, args: (
                f"mcp:{run_id}:{tool.name}:{digest(args.model_dump(mode='json'))[:16]}"
            )
        ),
        verify=None if read else acknowledged,
        summarize=summarize,
        guarantee=Guarantee.NONE,
        timeout_s=timeout_s,
    )


def mcp_contracts(
    session: McpSession, *, read_tools: Collection[str] = (), timeout_s: float = 10.0
) -> list[ToolContract]:
    """Contracts for every tool the server offers. `read_tools` is the operator's allow-list of
    reads; a name the server does not offer is an error, so a typo cannot go unnoticed."""
    tools = session.list_tools()
    unknown = set(read_tools) - {t.name for t in tools}
    if unknown:
        raise ValueError(f"read_tools names tools the MCP server does not offer: {sorted(unknown)}")
    return [
        mcp_contract(session, tool, read=tool.name in read_tools, timeout_s=timeout_s)
        for tool in tools
    ]
