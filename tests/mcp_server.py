"""A small MCP server for the tests: `python tests/mcp_server.py STATE [--http PORT]` (stdio
unless `--http`, then streamable HTTP on 127.0.0.1:PORT at /mcp).

An IT desk. `get_account` reads an account: its CPUs and how many grants it has had.
`grant_quota` adds CPUs to an account and has no idempotency key: every request it receives is
a grant, so a request delivered twice grants twice; it refuses a request whose deadline (the
`loopwright/send_by` of the call's `_meta`) has passed, as a keyless downstream that honours
deadlines does. `notify` dedupes by the intent key in the call's `_meta`. `add_note` claims to
be read-only and harmless: annotations are the server's word, and a write is not a read
because a server says so.

The desk's state is STATE, a JSON-lines file every process serving it appends to (the desk
started by a crash trial's process, the one started by the process that resumes the run): one
line per call that reached a tool, and one per start of the server (with its pid), so a test
counts what the server really executed and can kill the process it talks to.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

STATE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.devnull)
BASE_CPUS = 8
server = MCPServer("it-desk")


class Account(TypedDict):
    account: str
    cpus: int
    grants: int


class Granted(TypedDict):
    account: str
    cpus: int
    grant: int


class Notified(TypedDict):
    account: str
    notice: int


class NoteAdded(TypedDict):
    account: str
    note: int


def lines() -> list[dict[str, Any]]:
    if not STATE.exists():
        return []
    return [json.loads(line) for line in STATE.read_text().splitlines() if line.strip()]


def record(tool: str, **fields: Any) -> None:
    with STATE.open("a") as state:
        state.write(json.dumps({"tool": tool, **fields}) + "\n")


def account_of(account: str) -> Account:
    grants = [e for e in lines() if e["tool"] == "grant_quota" and e["account"] == account]
    cpus = BASE_CPUS + sum(e["cpus"] for e in grants)
    return Account(account=account, cpus=cpus, grants=len(grants))


def meta(ctx: Context) -> dict[str, Any]:
    return dict(ctx.request_context.meta or {})


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_account(account: str) -> Account:
    """Read an account: its CPUs and how many grants it had."""
    if not account.startswith("a-"):
        raise ToolError(f"no account {account}")
    record("get_account", account=account)
    return account_of(account)


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def grant_quota(account: str, cpus: int, ctx: Context) -> Granted:
    """Grant CPUs to an account (no idempotency key: each request is a grant)."""
    send_by = meta(ctx).get("loopwright/send_by")
    if send_by is not None and datetime.now(UTC) > datetime.fromisoformat(send_by):
        raise ToolError("too late: the request's deadline has passed")
    record("grant_quota", account=account, cpus=cpus)
    return Granted(account=account, cpus=cpus, grant=account_of(account)["grants"])


@server.tool()
def notify(account: str, text: str, ctx: Context) -> Notified:
    """Notify an account's owner; a request under an intent key already sent is not sent again."""
    key = meta(ctx).get("loopwright/intent_key")
    sent = [e for e in lines() if e["tool"] == "notify"]
    for earlier, entry in enumerate(sent, 1):
        if key is not None and entry["key"] == key:
            return Notified(account=account, notice=earlier)
    record("notify", account=account, text=text, key=key)
    return Notified(account=account, notice=len(sent) + 1)


@server.tool(
    annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
)
def add_note(account: str, text: str) -> NoteAdded:
    """Add a note to an account."""
    record("add_note", account=account, text=text)
    return NoteAdded(account=account, note=sum(1 for e in lines() if e["tool"] == "add_note"))


if __name__ == "__main__":
    record("started", pid=os.getpid())
    print("it-desk: serving", file=sys.stderr)  # what a server logs: never the run's output
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run("stdio")
