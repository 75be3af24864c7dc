"""Tools of a real MCP server (started over stdio by the test) as contracts of the real graph.

The server (`tests/mcp_server.py`) offers a read tool and a write tool whose annotations claim it
is read-only. Only the operator's allow-list makes a tool a read; everything else is a write that
needs approval, is journaled and runs once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from langchain_core.messages import BaseMessage
from mcp import StdioServerParameters
from mcp.types import Tool
from pydantic import ValidationError

from loopwright import Agent
from loopwright.graph.state import ActionStatus, Principal
from loopwright.models.scripted import Decision, ScriptedChatModel
from loopwright.runner import open_runner
from loopwright.tools.contract import Effect, Guarantee
from loopwright.tools.mcp import McpSession, mcp_contract, mcp_contracts
from loopwright_refunds.procedure import Transcript
from tests.runtime_fixtures import approve, tool_errors

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
TASK = "Look up customer c-7 and note that we called back."


@pytest.fixture
def server_log(tmp_path: Path) -> Path:
    return tmp_path / "mcp-calls.jsonl"


@pytest.fixture
def mcp_session(server_log: Path) -> Iterator[McpSession]:
    server = StdioServerParameters(
        command=sys.executable, args=[str(SERVER_SCRIPT), str(server_log)]
    )
    with McpSession(server) as session:
        yield session


def executed(server_log: Path) -> list[dict[str, Any]]:
    """Every call that reached a tool of the MCP server, in order."""
    if not server_log.exists():
        return []
    return [json.loads(line) for line in server_log.read_text().splitlines()]


@dataclass(frozen=True)
class NotesPolicy:
    """Read the customer (and, in the same turn, add a note with a misnamed argument), then add
    the note properly, then answer."""

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        done = {o.tool for o in Transcript.read(messages).observations if o.envelope.status == "ok"}
        if "get_customer" not in done:
            return Decision(
                tool_calls=[
                    ("get_customer", {"customer_id": "c-7"}),
                    ("add_note", {"customer_id": "c-7", "note": "called back"}),
                ]
            )
        if "add_note" not in done:
            return Decision(
                tool_calls=[("add_note", {"customer_id": "c-7", "text": "called back"})]
            )
        return Decision(content="Customer c-7 has the note.")


def test_only_the_operator_makes_an_mcp_tool_a_read(mcp_session: McpSession) -> None:
    trusted = {c.name: c for c in mcp_contracts(mcp_session, read_tools={"get_customer"})}
    untrusted = {c.name: c for c in mcp_contracts(mcp_session)}

    assert trusted["get_customer"].effect is Effect.READ
    # add_note claims readOnlyHint=true: a claim, shown to the approver, not believed.
    for contract in (trusted["add_note"], *untrusted.values()):
        assert contract.effect is Effect.WRITE
        assert contract.guarantee is Guarantee.NONE
        args = contract.args_model.model_validate(
            {"customer_id": "c-7", "text": "x"}
            if contract.name == "add_note"
            else {"customer_id": "c-7"}
        )
        assert contract.needs_approval(args, None)  # type: ignore[arg-type]
    note = trusted["add_note"]
    args = note.args_model.model_validate({"customer_id": "c-7", "text": "called back"})
    assert "not trusted: read-only, not destructive, idempotent" in note.describe(args)
    # The intent is the tool and its canonical arguments, within the run.
    assert note.intent_key is not None
    same = note.args_model.model_validate({"text": "called back", "customer_id": "c-7"})
    other = note.args_model.model_validate({"customer_id": "c-7", "text": "again"})
    assert note.intent_key("r1", args) == note.intent_key("r1", same)
    assert note.intent_key("r1", args) != note.intent_key("r1", other)
    assert note.intent_key("r1", args) != note.intent_key("r2", args)
    with pytest.raises(ValueError, match="does not offer"):
        mcp_contracts(mcp_session, read_tools={"get_customers"})


def test_arguments_must_meet_the_servers_schema_exactly(mcp_session: McpSession) -> None:
    note = next(c for c in mcp_contracts(mcp_session) if c.name == "add_note")
    given = {"customer_id": "c-7", "text": "called back"}

    assert note.args_model.model_validate(given).model_dump(mode="json") == given
    for wrong in ({"customer_id": "c-7"}, {**given, "customer_id": 7}, {**given, "by": "me"}):
        with pytest.raises(ValidationError):
            note.args_model.model_validate(wrong)


def test_mcp_read_and_write_run_through_validate_journal_and_approval(
    database_url: str, mcp_session: McpSession, server_log: Path
) -> None:
    # An agent of MCP tools only: no dependencies of its own, approvers named outright.
    notes: Agent[None] = Agent(
        "notes",
        instructions="Keep notes on customers.",
        tools=mcp_contracts(mcp_session, read_tools={"get_customer"}),
        model=ScriptedChatModel(policy=NotesPolicy()),
        approvers={"a-1"},
    )
    with open_runner(database_url, notes, deps=None) as runner:
        outcome = runner.start(TASK, Principal(user_id="u-1"))

        # The read ran; the misnamed write was refused by validate; the write waits for a human.
        assert outcome.phase == "WAITING_APPROVAL"
        assert executed(server_log) == [{"tool": "get_customer", "customer_id": "c-7"}]
        state = runner.state(outcome.run_id)
        assert [e["code"] for e in tool_errors(state)] == ["invalid_arguments"]
        assert [e["source"] for e in state["evidence"]] == ["get_customer"]
        [request] = outcome.waiting_for_approval
        assert request["tool"] == "add_note"
        assert "not trusted: read-only" in request["summary"]
        [action] = outcome.actions
        assert action.status is ActionStatus.NEEDS_APPROVAL
        assert action.intent_key.startswith(f"mcp:{outcome.run_id}:add_note:")

        outcome = approve(runner, outcome)

    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert executed(server_log) == [
        {"tool": "get_customer", "customer_id": "c-7"},
        {"tool": "add_note", "customer_id": "c-7", "text": "called back"},
    ]
    [action] = outcome.actions
    assert (action.status, action.attempts) == (ActionStatus.SUCCEEDED, 1)
    assert action.outcome == {"customer_id": "c-7", "note_id": 1}
    [write] = outcome.verification["facts"]["writes"]  # type: ignore[index]
    assert write["verified_by"] == "server acknowledgement"


@pytest.mark.parametrize("name", ["get_customer\n", "get customer", "x" * 65])
def test_a_server_tool_name_no_model_may_call_is_refused(name: str) -> None:
    """A name the server offers is checked whole (a trailing newline would pass a `$`), before
    anything else: a model provider refuses the whole request for one bad function name."""
    offered = Tool(name=name, inputSchema={"type": "object"})
    with pytest.raises(ValueError, match="is not a valid function name"):
        mcp_contract(cast(McpSession, None), offered, read=True)
