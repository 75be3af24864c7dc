"""An MCP server's tools, declared one by one like any tool: what the server says is shown,
never trusted.

    desk = McpServer("desk", command=["python", "desk_server.py"])   # or url="https://.../mcp"
    get_account = desk.read("get_account", args_model=AccountRef, description="Read an account.")
    grant = desk.write("grant_quota", args_model=Grant, description="Grant CPUs.",
                       intent=..., guarantee=Guarantee.QUERYABLE, reconcile=..., ...)
    ops = Agent("ops", instructions=..., tools=[get_account, grant])

Each tool takes the options of any read or write (`ReadOptions`, `WriteOptions`) and becomes a
`ToolContract`, checked as every contract is. What the team declares, not what the server
claims, decides: a tool's annotations (`readOnlyHint`...) are its author's word and make nothing
a read. Left out, the declarations take the safe defaults of an MCP write: guarantee NONE (an
unknown outcome goes to a person), a person approves every call, the intent is the tool and its
canonical arguments within the run (the same call proposed again is the first action, never a
second effect), and a succeeded call is verified by the server's own answer (stated as such).
Only the declared tools are offered: one the server adds later is not, until it is declared.

Defining the agent opens nothing. The session is opened with the agent's dependencies, once per
process (`Agent.open_deps`, which every entry point enters), and opened again after it drops;
when it opens, each declared tool is checked against the server's listing: one the server does
not list, or whose arguments or answer no longer fit the declaration, or declared a read that
the server says is not read-only, is refused in one line. A write's intent key travels in the
call's `_meta` (`INTENT_KEY_META`), so a server can dedupe by it, as does the deadline of a
write declared `resend=ResendAfterDeadline(...)` (`SEND_BY_META`), which the server must honour.
A stdio server's stderr goes to a log file (`log=`, default `$LOOPWRIGHT_HOME/mcp/NAME.log`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

from mcp import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    CallToolResult,
    TextContent,
    Tool,
)
from pydantic import BaseModel, Field

from loopwright.core.home import loopwright_home
from loopwright.core.state import Action, digest
from loopwright.tools.contract import (
    DEFAULT_TIMEOUT_S,
    TOOL_NAME,
    Effect,
    OutcomeUnknown,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    ToolFault,
    VerifyResult,
)
from loopwright.tools.mcp_schemas import differences
from loopwright.tools.mcp_session import (
    CONNECT_TIMEOUT_S,
    McpSession,
    Stdio,
    StreamableHttp,
    Transport,
)
from loopwright.tools.options import ReadOptions, WriteOptions, known_options

# Where a write's intent key and its send-by deadline travel in a call's `_meta`.
INTENT_KEY_META = "loopwright/intent_key"
SEND_BY_META = "loopwright/send_by"
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Protocol errors in which the server refused the request itself: no tool ran. Any other error
# (the connection closed, no answer in time, the server's handler failed) leaves a write's
# outcome unknown.
REFUSED = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})


class McpAnswer(BaseModel):
    """An MCP tool's answer where no output contract is declared (`output_model=`): its
    structured content, if the server gave one, and its content blocks as the server sent them."""

    structured: dict[str, Any] | None = None
    content: list[dict[str, Any]] = Field(default_factory=list)


def _text(result: CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, TextContent)) or "no detail"


def _answer(result: CallToolResult, declared: bool) -> dict[str, Any]:
    """What a call answered: with an output contract declared, the structured content (checked
    against it by the executor); else both parts, as `McpAnswer`."""
    if declared:
        return dict(result.structured_content or {})
    blocks = [b.model_dump(mode="json", exclude_none=True) for b in result.content]
    return {"structured": result.structured_content, "content": blocks}


@dataclass(frozen=True)
class McpCall:
    """A contract's `run`: one tool of one server. A write sends its intent key (and the
    deadline of a write re-sent after one) in the call's `_meta`."""

    server: McpServer
    tool: str
    timeout_s: float
    declared_output: bool

    def __call__(self, ctx: ToolContext[Any], args: BaseModel, key: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if key is not None:
            meta[INTENT_KEY_META] = key
        if ctx.send_by is not None:
            meta[SEND_BY_META] = ctx.send_by.isoformat()
        arguments = args.model_dump(mode="json")
        result = self.server._send(
            self.tool, arguments, ctx.timeout(self.timeout_s), meta=meta, write=key is not None
        )
        return _answer(result, self.declared_output)


def _acknowledged(server: str) -> Any:
    def acknowledged(_ctx: ToolContext[Any], action: Action) -> VerifyResult:
        # No independent read is declared: the server's own successful answer, which met the
        # output contract, is the only evidence. Stated, not hidden.
        return VerifyResult(True, {"mcp_server": server, "verified_by": "server acknowledgement"})

    return acknowledged


def _default_intent(tool: str) -> Any:
    def intent(run_id: str, args: BaseModel) -> str:
        return f"mcp:{run_id}:{tool}:{digest(args.model_dump(mode='json'))[:16]}"

    return intent


class McpServer:
    """An MCP server an agent's tools are declared on: a `command` started as a process (stdio)
    or a `url` (streamable HTTP, sent `headers`). `env` and `cwd` are the stdio server's (its
    environment is otherwise the MCP SDK's safe default: HOME, PATH and a few more), `log` the
    file its stderr is appended to. Nothing is opened until the agent's dependencies are."""

    def __init__(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        headers: Mapping[str, str] | None = None,
        log: str | Path | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if not SERVER_NAME.fullmatch(name):
            raise ToolDefinitionError(f"MCP server name {name!r}: letters, digits, _ . and -")
        if (command is None) == (url is None) or (command is not None and not command):
            raise ToolDefinitionError(
                f"MCP server {name}: give it command=[...] (stdio) or url=... (streamable"
                " HTTP), one of the two"
            )
        if url is not None and (env is not None or cwd is not None or log is not None):
            raise ToolDefinitionError(
                f"MCP server {name}: env, cwd and log are a stdio server's (command=[...])"
            )
        if command is not None and headers is not None:
            raise ToolDefinitionError(f"MCP server {name}: headers are an HTTP server's (url=)")
        self.name = name
        self._command = list(command) if command is not None else None
        self._url = url
        self._env = dict(env) if env is not None else None
        self._cwd = str(cwd) if cwd is not None else None
        self._headers = dict(headers or {})
        self._log = Path(log) if log is not None else None
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.RLock()
        self._session: McpSession | None = None
        self._listing: dict[str, Tool] = {}
        # The contracts of the agents that have this server open, checked at every (re)open.
        self._users: list[Sequence[ToolContract]] = []
        self._closes_at_exit = False

    def __repr__(self) -> str:
        return f"McpServer({self.name!r}, {'url' if self._url else 'command'}=...)"

    # --- declarations --------------------------------------------------------------------------

    def read(self, tool: str, /, **options: Unpack[ReadOptions]) -> ToolContract:
        """Declare the server's tool `tool` a read of the agent, with a read's options:
        `args_model` (its arguments, as a pydantic model) and `description` (what the model
        reads of it: the team's words, not the server's) are required."""
        return self._declare(tool, Effect.READ, options)

    def write(self, tool: str, /, **options: Unpack[WriteOptions]) -> ToolContract:
        """Declare the server's tool `tool` a write of the agent, with a write's options
        (`args_model` and `description` required; see the module for the safe defaults)."""
        return self._declare(tool, Effect.WRITE, options)

    def _declare(self, tool: str, effect: Effect, options: Mapping[str, Any]) -> ToolContract:
        if not isinstance(tool, str) or not TOOL_NAME.fullmatch(tool):
            raise ToolDefinitionError(f"MCP tool name {tool!r} is not a valid function name")
        declared = known_options(options, options.get("name") or tool)
        name = declared.setdefault("name", tool)
        for needed, why in (
            ("args_model", "its arguments as a pydantic model, checked against the server's"),
            ("description", "what the model reads of it, in your words; the server's is in its"),
        ):
            if needed not in declared:
                raise ToolDefinitionError(
                    f"tool {name}: give it {needed}=... ({why} listing when the session opens)"
                )
        output = declared.setdefault("output_model", McpAnswer)
        run = McpCall(
            self, tool, declared.get("timeout_s", DEFAULT_TIMEOUT_S), output is not McpAnswer
        )
        if effect is Effect.WRITE:
            declared.setdefault("intent", _default_intent(tool))
            if "reconcile" not in declared and "verify" not in declared:
                declared["verify"] = _acknowledged(self.name)
        return ToolContract(effect=effect, run=run, connection=self.connected, **declared)

    # --- the process's session -----------------------------------------------------------------

    @contextlib.contextmanager
    def connected(self, contracts: Sequence[ToolContract] = ()) -> Iterator[McpServer]:
        """The server's session open in this process for as long as this is entered (entered
        again, it is shared; closed when the last leaves), with `contracts` (an agent's tools
        declared on it) checked against its listing now and at every reopen: a mismatch raises
        `ToolDefinitionError`, in one line."""
        mine = [c for c in contracts if isinstance(c.run, McpCall) and c.run.server is self]
        with self._lock:
            self._users.append(mine)
            try:
                self._open()
                self._check(mine)
            except BaseException:
                self._leave(mine)
                raise
        try:
            yield self
        finally:
            with self._lock:
                self._leave(mine)

    def _leave(self, contracts: Sequence[ToolContract]) -> None:
        self._users.remove(contracts)
        if not self._users:
            self.close()

    def close(self) -> None:
        """Close the session (a stdio server's process ends with it). Idempotent."""
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                session.close()

    def _open(self) -> McpSession:
        """This process's session: the one open, else a new one, checked against what every
        agent that has it open declared."""
        with self._lock:
            session = self._session
            if session is not None and session.alive and session.pid == os.getpid():
                return session
            self.close()
            session = McpSession(self._transport(), connect_timeout_s=self._connect_timeout_s)
            session.open()
            try:
                self._listing = {t.name: t for t in session.list_tools(self._connect_timeout_s)}
                for contracts in self._users:
                    self._check(contracts)
            except BaseException:
                session.close()
                raise
            self._session = session
            if not self._closes_at_exit:  # a session opened by a call outside `connected`
                atexit.register(self.close)
                self._closes_at_exit = True
            return session

    def _transport(self) -> Transport:
        if self._url is not None:
            return StreamableHttp(self._url, self._headers)
        assert self._command is not None
        log = self._log or loopwright_home() / "mcp" / f"{self.name}.log"
        command, *args = self._command
        return Stdio(command, tuple(args), self._env, self._cwd, log)

    def _check(self, contracts: Sequence[ToolContract]) -> None:
        problems = []
        for contract in contracts:
            assert isinstance(contract.run, McpCall)
            listed = self._listing.get(contract.run.tool)
            if listed is None:
                problems.append(f"{contract.run.tool} is not listed by the server")
                continue
            found = differences(contract, listed, output_declared=contract.run.declared_output)
            problems += [f"{contract.run.tool}: {p}" for p in found]
        if problems:
            raise ToolDefinitionError(f"MCP server {self.name}: {'; '.join(problems)}")

    # --- calls -----------------------------------------------------------------------------------

    def _send(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout_s: float,
        *,
        meta: Mapping[str, Any] | None = None,
        write: bool = False,
    ) -> CallToolResult:
        """Call `tool` on this process's session. Not sent (the session cannot be opened, or
        the tool is not listed): a `ToolFault`. Sent and no answer: for a write an unknown
        outcome (`OutcomeUnknown`), else a transient fault; a session that dropped is opened
        anew by the next call. An answer flagged as an error is a definitive `ToolFault`."""
        try:
            session = self._open()
        except ToolDefinitionError as exc:  # reopened, it no longer fits the declarations
            raise ToolFault("mcp_unavailable", str(exc)) from exc
        except Exception as exc:
            raise ToolFault(
                "mcp_unavailable", f"MCP server {self.name}: {exc!r}", transient=True
            ) from exc
        if tool not in self._listing:
            raise ToolFault("mcp_unavailable", f"MCP server {self.name} lists no tool {tool}")
        try:
            result = session.call_tool(tool, arguments, timeout_s, meta)
        except MCPError as exc:
            if exc.code in REFUSED:
                raise ToolFault("mcp_refused", f"{tool}: {exc}") from exc
            if exc.code == CONNECTION_CLOSED:
                self._dropped(session)
            raise self._no_answer(tool, exc, write) from exc
        except TimeoutError as exc:
            raise self._no_answer(tool, exc, write) from exc
        except Exception as exc:  # the transport broke: the next call opens a new session
            self._dropped(session)
            raise self._no_answer(tool, exc, write) from exc
        if result.is_error:
            raise ToolFault("mcp_tool_error", f"{tool}: {_text(result)}")
        return result

    @staticmethod
    def _no_answer(tool: str, exc: Exception, write: bool) -> Exception:
        """What a call that got no answer it can trust is: for a write an unknown outcome,
        else a transient fault."""
        if write:
            return OutcomeUnknown(f"MCP {tool}: no answer ({exc!r})")
        return ToolFault("mcp_unavailable", f"{tool}: {exc!r}", transient=True)

    def _dropped(self, session: McpSession) -> None:
        """A call on `session` broke (not a timeout): the next call opens a new one."""
        with self._lock:
            if self._session is session:
                self.close()

    def call(
        self, tool: str, arguments: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """Call a tool of this server from a tool's own functions (a reconcile or a pre-image
        asking a read of the same server): its structured content, else its content blocks
        (`{"content": [...]}`). Raises `ToolFault` as a read's call does."""
        result = self._send(tool, dict(arguments), timeout_s)
        if result.structured_content is not None:
            return dict(result.structured_content)
        return {"content": _answer(result, declared=False)["content"]}
