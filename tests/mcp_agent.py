"""An IT-operations agent whose tools are an MCP server's (tests/mcp_server.py), declared one by
one: a read, a keyless write that can be looked up (`grant_quota`, declared honestly: queryable,
a pre-image, reconciled by asking the server's own read, re-sent only after a deadline the server
honours; and wrongly: idempotent by key, which the server is not), with a business rule and an
approval above 16 CPUs.

What `loopwright faults --agent tests.mcp_agent:honest` (or `:wrong`) proves, in processes of
its own: the desk is reached over streamable HTTP at $LOOPWRIGHT_TEST_MCP_URL if set, else
started over stdio on the state file $LOOPWRIGHT_TEST_MCP_STATE.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel, Field

from loopwright import (
    Action,
    Agent,
    Decision,
    Guarantee,
    McpServer,
    PreconditionFailed,
    ReconcileResult,
    ReconcileStatus,
    ResendAfterDeadline,
    Scenario,
    ScriptedChatModel,
    ToolContext,
    ToolContract,
    VerifyResult,
)

SERVER = Path(__file__).with_name("mcp_server.py")
STATE_ENV = "LOOPWRIGHT_TEST_MCP_STATE"
URL_ENV = "LOOPWRIGHT_TEST_MCP_URL"
TASK = "Grant 4 CPUs to account a-1."
MAX_CPUS = 512


class AccountRef(BaseModel):
    account: str = Field(pattern=r"^a-\d{1,6}$")


class Account(BaseModel):
    account: str
    cpus: int
    grants: int


class Grant(BaseModel):
    account: str = Field(pattern=r"^a-\d{1,6}$")
    cpus: int = Field(ge=1, le=64)


class Granted(BaseModel):
    account: str
    cpus: int
    grant: int


def stdio_desk(state: Path | str) -> McpServer:
    return McpServer("it-desk", command=[sys.executable, str(SERVER), str(state)])


def http_desk(url: str) -> McpServer:
    return McpServer("it-desk", url=url)


def tools(desk: McpServer) -> tuple[ToolContract, ToolContract]:
    """`get_account` and the honest `grant_quota` of `desk`."""

    def account(ctx: ToolContext[Any], name: str) -> Account:
        answer = desk.call("get_account", {"account": name}, timeout_s=ctx.timeout(5))
        return Account.model_validate(answer)

    def within_quota(ctx: ToolContext[Any], args: Grant) -> None:
        if account(ctx, args.account).cpus + args.cpus > MAX_CPUS:
            raise PreconditionFailed("over_quota", f"{args.account} would pass {MAX_CPUS} CPUs")

    def before(ctx: ToolContext[Any], args: Grant) -> dict[str, Any]:
        return account(ctx, args.account).model_dump()

    def granted(
        ctx: ToolContext[Any], action: Action, pre: dict[str, Any] | None
    ) -> ReconcileResult:
        """Ask the desk's own read: how many grants the account gained since the send."""
        now = account(ctx, action.args["account"])
        new = now.grants - pre["grants"] if pre is not None else None
        if new == 0:
            return ReconcileResult(ReconcileStatus.ABSENT)
        if new == 1:
            outcome = {**action.args, "grant": now.grants}
            return ReconcileResult(ReconcileStatus.APPLIED, outcome=outcome)
        return ReconcileResult(ReconcileStatus.UNCONFIRMABLE, detail=f"{new} grants since")

    def there(ctx: ToolContext[Any], action: Action) -> VerifyResult:
        grants = account(ctx, action.args["account"]).grants
        return VerifyResult(grants >= (action.outcome or {}).get("grant", 1), {"grants": grants})

    get_account = desk.read(
        "get_account",
        args_model=AccountRef,
        output_model=Account,
        description="Read an account: its CPUs and how many grants it had.",
    )
    grant_quota = desk.write(
        "grant_quota",
        args_model=Grant,
        output_model=Granted,
        description="Grant CPUs to an account.",
        intent=lambda run_id, a: f"quota:{run_id}:{a.account}:{a.cpus}",
        guarantee=Guarantee.QUERYABLE,
        pre_image=before,
        reconcile=granted,
        verify=there,
        resend=ResendAfterDeadline(seconds=1.0, skew_s=0.2),
        preconditions=[within_quota],
        needs_approval=lambda ctx, a: a.cpus > 16,
    )
    return get_account, grant_quota


def grant_once(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    """Ask for the grant once; then report what the desk said."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return Decision(tool_calls=[("grant_quota", {"account": "a-1", "cpus": 4})])
    return Decision(content=f"Grant result: {results[-1].status}")


def grants_since(desk: McpServer) -> Any:
    """The effects of an intent in the desk: the grants its account gained since the pre-image
    of its first send (a count reconcile cannot give: it sees at most one)."""

    def effects(ctx: ToolContext[Any], action: Action, before: dict[str, Any] | None) -> int:
        assert before is not None
        now = desk.call("get_account", {"account": action.args["account"]})
        return int(now["grants"]) - int(before["grants"])

    return effects


def ops_agent(desk: McpServer, *, keyed: bool = False) -> Agent[None]:
    """The agent over `desk`; `keyed`: grant_quota declared idempotent by key (wrongly)."""
    get_account, grant_quota = tools(desk)
    if keyed:
        grant_quota = dataclasses.replace(
            grant_quota, guarantee=Guarantee.IDEMPOTENT_BY_KEY, resend=None
        )
    return Agent(
        "it-ops",
        instructions="Grant quota to the accounts you are asked to.",
        tools=[get_account, grant_quota],
        model=lambda: ScriptedChatModel(policy=grant_once),
        approvers={"a-1"},
        scenarios=[Scenario(task=TASK, user="u-1", approver="a-1", effects=grants_since(desk))],
    )


_DESK = (
    http_desk(os.environ[URL_ENV])
    if os.environ.get(URL_ENV)
    else stdio_desk(os.environ.get(STATE_ENV, os.devnull))
)
honest = ops_agent(_DESK)
wrong = ops_agent(_DESK, keyed=True)
