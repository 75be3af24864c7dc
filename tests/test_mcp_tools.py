"""An MCP server's tools, declared one by one like any tool, over stdio and streamable HTTP.

The server (`tests/mcp_server.py`, a process of its own) is an IT desk: a read, a keyless write
that can be looked up, a write that dedupes by the intent key in `_meta`, and a write whose
annotations claim it is read-only. Declaring needs no session; the agent's deps open it and
check the declarations against the server's listing; a dropped session is opened again; and
`loopwright faults` proves the honest declaration of the keyless write and catches the wrong one,
over both transports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel, Field

from loopwright import (
    Agent,
    Effect,
    Guarantee,
    McpAnswer,
    McpServer,
    ToolContext,
    ToolDefinitionError,
    ToolFault,
    tls,
)
from loopwright.graph.state import ActionStatus, Principal
from loopwright.models.scripted import Decision, ScriptedChatModel
from loopwright.reports import EXIT_CODES
from loopwright.runner import LEASE_TTL_ENV, open_runner
from loopwright.tools.mcp import INTENT_KEY_META
from tests import docs_pages
from tests.mcp_agent import (
    SERVER,
    STATE_ENV,
    URL_ENV,
    AccountRef,
    Grant,
    http_desk,
    stdio_desk,
)
from tests.ports import reserved_port
from tests.runtime_fixtures import PATIENCE_S, approve, cli, tool_errors, wait_for


def calls(state: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """Every line of the desk's state (each call that reached a tool, each start), in order."""
    if not state.exists():
        return []
    found = [json.loads(line) for line in state.read_text().splitlines()]
    return [e for e in found if tool is None or e["tool"] == tool]


@dataclass
class HttpDesk:
    url: str
    process: subprocess.Popen[bytes]
    port: int
    state: Path


def _serve(state: Path, port: int) -> subprocess.Popen[bytes]:
    """The desk over streamable HTTP on `port`, ready to answer."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(state), "--http", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answering() -> bool:
        assert process.poll() is None, "the MCP server exited"
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1, verify=tls.context())
        except httpx.TransportError:
            return False
        return True

    wait_for(answering)
    return process


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "desk.jsonl"


@pytest.fixture
def served(state: Path) -> Iterator[HttpDesk]:
    with reserved_port() as port:
        process = _serve(state, port)
        desk = HttpDesk(f"http://127.0.0.1:{port}/mcp", process, port, state)
        try:
            yield desk
        finally:
            desk.process.terminate()
            desk.process.wait(timeout=PATIENCE_S)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def desk(transport: str, request: pytest.FixtureRequest, state: Path) -> McpServer:
    """The desk over each transport in turn (stdio: started by the session itself)."""
    if transport == "stdio":
        return stdio_desk(state)
    served: HttpDesk = request.getfixturevalue("served")
    return http_desk(served.url)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """LOOPWRIGHT_HOME of the test's own: where a stdio server's log goes."""
    monkeypatch.setenv("LOOPWRIGHT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Note(BaseModel):
    account: str = Field(pattern=r"^a-\d{1,6}$")
    text: str


class Notified(BaseModel):
    account: str
    notice: int


def notes_agent(desk: McpServer) -> Agent[None]:
    """The account read and `add_note`, declared with nothing but what it is: the safe
    defaults of an MCP write."""
    return Agent(
        "notes",
        instructions="Keep notes on accounts.",
        tools=[
            desk.read("get_account", args_model=AccountRef, description="Read an account."),
            desk.write("add_note", args_model=Note, description="Add a note to an account."),
        ],
        model=ScriptedChatModel(policy=NotesPolicy()),
        approvers={"a-1"},
    )


@dataclass(frozen=True)
class NotesPolicy:
    """Read the account (and, in the same turn, add a note with a misnamed argument), then add
    the note properly, then answer."""

    def __call__(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
    ) -> Decision:
        done = {m.name for m in messages if isinstance(m, ToolMessage) and m.status == "success"}
        if "get_account" not in done:
            return Decision(
                tool_calls=[
                    ("get_account", {"account": "a-7"}),
                    ("add_note", {"account": "a-7", "note": "called back"}),
                ]
            )
        if "add_note" not in done:
            return Decision(tool_calls=[("add_note", {"account": "a-7", "text": "called back"})])
        return Decision(content="Account a-7 has the note.")


def test_mcp_tools_are_declared_without_a_session_with_the_safe_defaults() -> None:
    """Defining the agent opens nothing (the server here does not even exist). A write declared
    with nothing but its arguments is a write that a person approves, with guarantee NONE, its
    intent the tool and its canonical arguments within the run, verified by the server's own
    answer, said so; what the team declares is what counts, whatever the server claims."""
    desk = McpServer("nowhere", command=["/nonexistent/mcp-server"])
    agent = notes_agent(desk)
    read, note = agent.tools.get("get_account"), agent.tools.get("add_note")
    assert read is not None and note is not None
    assert (read.effect, note.effect, note.guarantee) == (Effect.READ, Effect.WRITE, Guarantee.NONE)
    args = note.args_model.model_validate({"account": "a-7", "text": "called back"})
    ctx: ToolContext[None] = ToolContext(deps=None)
    assert note.approval_reason(ctx, args) is not None
    assert note.output_model is McpAnswer and note.intent is not None
    same = note.args_model.model_validate({"text": "called back", "account": "a-7"})
    other = note.args_model.model_validate({"account": "a-7", "text": "again"})
    assert note.intent("r1", args) == note.intent("r1", same) != note.intent("r1", other)
    assert note.intent("r1", args) != note.intent("r2", args)
    assert note.intent("r1", args).startswith("mcp:r1:add_note:")
    with pytest.raises(ValueError, match="extra"):  # closed, as every contract's arguments
        note.args_model.model_validate({"account": "a-7", "text": "x", "by": "me"})
    # Opened with the agent's deps: only then is the server started (here: there is none).
    with pytest.raises(OSError), agent.open_deps():
        pass


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (lambda d: d.read("get_account", description="Read."), "give it args_model=..."),
        (lambda d: d.read("get_account", args_model=AccountRef), "give it description=..."),
        (lambda d: d.read("get account", args_model=AccountRef, description="R."), "valid"),
        (
            lambda d: d.write("grant_quota", args_model=Grant, description="G.", intent=None),
            "intent",
        ),
        (
            lambda d: d.write(
                "grant_quota", args_model=Grant, description="G.", guarantee=Guarantee.QUERYABLE
            ),
            "guarantee queryable needs reconcile=",
        ),
        (
            lambda d: d.read("get_account", args_model=AccountRef, description="R.", summary=str),
            "summary: a write's declarations, and this tool is a read",
        ),
        (
            lambda d: d.write("grant_quota", args_model=Grant, description="G.", sumary=str),
            "sumary is no option",
        ),
    ],
)
def test_an_mcp_tool_declaration_is_checked_as_any_tools(declare: Any, problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        declare(McpServer("desk", command=["/nonexistent"]))


class Renamed(BaseModel):
    customer: str


class Counted(BaseModel):
    account: str
    cpus: str


@pytest.mark.parametrize(
    ("declare", "problem"),
    [
        (
            lambda d: d.read("get_accounts", args_model=AccountRef, description="R."),
            "get_accounts is not listed by the server",
        ),
        (
            lambda d: d.read("get_account", args_model=Renamed, description="R."),
            "get_account: argument customer is not in the server's schema; get_account: the"
            " server requires argument account, which the declaration lacks",
        ),
        (
            lambda d: d.read(
                "get_account", args_model=AccountRef, output_model=Counted, description="R."
            ),
            "get_account: its answer's field cpus may be integer, which the output model does not take",
        ),
        (
            lambda d: d.read("grant_quota", args_model=Grant, description="Grant."),
            "grant_quota: declared a read, but the server says it is not read-only",
        ),
    ],
)
def test_declarations_that_no_longer_fit_the_listing_are_refused_when_the_session_opens(
    desk: McpServer, state: Path, declare: Any, problem: str
) -> None:
    agent: Agent[None] = Agent("desk", instructions="Read accounts.", tools=[declare(desk)])
    with pytest.raises(ToolDefinitionError) as refused, agent.open_deps():
        pass
    said = str(refused.value)
    assert "\n" not in said and said == f"MCP server it-desk: {problem}"
    assert calls(state, "get_account") == []  # refused before anything is called


def test_mcp_reads_and_writes_run_through_validate_journal_and_approval(
    database_url: str,
    transport: str,
    desk: McpServer,
    state: Path,
    home: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """add_note claims to be read-only; declared a write, it is one: validated, journaled,
    approved, sent once. The server's stderr goes to its log, not to this process's output."""
    notes = notes_agent(desk)
    with open_runner(database_url, notes) as runner:
        outcome = runner.start("Look up a-7 and note the call.", Principal(user_id="u-1"))

        # The read ran; the misnamed write was refused by validate; the write waits for a human.
        assert outcome.phase == "WAITING_APPROVAL"
        assert calls(state, "get_account") == [{"tool": "get_account", "account": "a-7"}]
        assert calls(state, "add_note") == []
        state_now = runner.state(outcome.run_id)
        assert [e["code"] for e in tool_errors(state_now)] == ["invalid_arguments"]
        assert [e["source"] for e in state_now["evidence"]] == ["get_account"]
        [request] = outcome.waiting_for_approval
        assert (request["tool"], request["summary"]) == (
            "add_note",
            "add_note: account a-7, text called back",
        )
        [action] = outcome.actions
        assert action.status is ActionStatus.NEEDS_APPROVAL
        assert action.intent_key.startswith(f"mcp:{outcome.run_id}:add_note:")

        outcome = approve(runner, outcome)

    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert [(e["account"], e["text"]) for e in calls(state, "add_note")] == [("a-7", "called back")]
    [action] = outcome.actions
    assert (action.status, action.attempts) == (ActionStatus.SUCCEEDED, 1)
    assert action.outcome is not None and action.outcome["structured"] == {
        "account": "a-7",
        "note": 1,
    }
    [write] = outcome.verification["facts"]["writes"]  # type: ignore[index]
    assert write["verified_by"] == "server acknowledgement"
    if transport == "stdio":
        assert "it-desk: serving" in (home / "mcp" / "it-desk.log").read_text()
    assert "it-desk: serving" not in capfd.readouterr().err


def test_a_write_sends_its_intent_key_in_meta_so_a_server_can_dedupe(
    desk: McpServer, state: Path
) -> None:
    notify = desk.write(
        "notify",
        args_model=Note,
        output_model=Notified,
        description="Notify an account's owner.",
    )
    ctx: ToolContext[None] = ToolContext(deps=None)
    args = notify.args_model.model_validate({"account": "a-1", "text": "granted"})
    with Agent("n", instructions="Notify.", tools=[notify]).open_deps():
        answers = [notify.run(ctx, args, key) for key in ("k-1", "k-1", "k-2")]
    assert [a["notice"] for a in answers] == [1, 1, 2]  # type: ignore[index]
    assert [e["key"] for e in calls(state, "notify")] == ["k-1", "k-2"]
    assert INTENT_KEY_META == "loopwright/intent_key"


def test_a_session_that_drops_is_opened_again(
    transport: str, desk: McpServer, state: Path, request: pytest.FixtureRequest
) -> None:
    """The server dies (its process killed; over HTTP, started again on the same port): a call
    made meanwhile fails as a transient fault (a read) and the next one opens a new session,
    checked against the listing again."""
    agent: Agent[None] = Agent(
        "reader",
        instructions="Read accounts.",
        tools=[desk.read("get_account", args_model=AccountRef, description="Read an account.")],
    )
    with agent.open_deps():
        assert desk.call("get_account", {"account": "a-1"})["grants"] == 0
        [first] = calls(state, "started")
        if transport == "http":
            served: HttpDesk = request.getfixturevalue("served")
            served.process.terminate()
            served.process.wait(timeout=PATIENCE_S)
            with pytest.raises(ToolFault) as lost:
                desk.call("get_account", {"account": "a-1"})
            assert lost.value.transient
            served.process = _serve(state, served.port)
        else:
            os.kill(first["pid"], signal.SIGKILL)
        answers: list[dict[str, Any]] = []

        def answered() -> bool:
            try:
                answers.append(desk.call("get_account", {"account": "a-1"}))
            except ToolFault as fault:
                assert fault.code == "mcp_unavailable" and fault.transient
                return False
            return True

        wait_for(answered)
    assert answers[-1]["grants"] == 0
    assert len(calls(state, "started")) == 2


def test_the_declarations_page_mcp_section_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/declarations.md's "Tools of an MCP server" as a user follows it: the server's file
    written where the agent's code runs, then the agent's code, in a module of its own."""
    page, title = "docs/declarations.md", "Tools of an MCP server"
    server, *code = docs_pages.blocks(page, "python", title)
    assert server.startswith("# it_desk.py") and code
    (tmp_path / "it_desk.py").write_text(server)
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("docs_mcp")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in code:
        exec(compile(block, page, "exec"), module.__dict__)
    assert capsys.readouterr().out.splitlines() == ["completed {'account': 'a-1', 'grants': 1}"]
    [grant] = (tmp_path / "grants.jsonl").read_text().splitlines()
    assert json.loads(grant) == {"account": "a-1", "cpus": 4}
    # What it says it prints.
    assert "completed {'account': 'a-1', 'grants': 1}" in docs_pages.section(page, title)


# --- `loopwright faults` over both transports --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_faults_command_proves_the_honest_declaration_and_catches_the_wrong_one(
    transport: str, sqlite_url: str, tmp_path: Path, state: Path, request: pytest.FixtureRequest
) -> None:
    """grant_quota has no key: declared queryable, reconciled by asking the desk's own read and
    re-sent only after a deadline the desk honours, one grant per intent under every fault, the
    crash trials' processes included; declared idempotent by key, the request delivered late
    (after the runtime re-sent it) and the one delivered twice each make a second grant."""
    env = {
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
        LEASE_TTL_ENV: "30",
        STATE_ENV: str(state),
        URL_ENV: request.getfixturevalue("served").url if transport == "http" else "",
    }
    honest = cli(
        "faults",
        "--agent",
        "tests.mcp_agent:honest",
        "--db",
        sqlite_url,
        "--json",
        env=env,
        expect=0,
        timeout=600,
    )
    document = json.loads(honest.stdout)
    assert (document["agent"], document["held"]) == ("it-ops", True)
    trials = document["trials"]
    assert [t["fault"] for t in trials] == [
        None,
        "request_lost",
        "answer_lost",
        "answer_late",
        "delivered_late",
        "crash_before_send",
        "crash_after_send",
    ]
    assert all(list(t["effects"].values()) == [1] for t in trials), trials
    assert all(t["reached"] and t["stop_reason"] == "completed" for t in trials), trials
    assert "it-desk: serving" not in honest.stdout + honest.stderr  # the server's own lines

    wrong_db = f"sqlite:///{tmp_path / 'wrong.sqlite3'}"
    wrong = cli(
        "faults", "--agent", "tests.mcp_agent:wrong", "--db", wrong_db, env=env, timeout=600
    )
    assert wrong.returncode == 1 != EXIT_CODES["usage"], wrong.stdout + wrong.stderr
    lines = wrong.stdout.splitlines()
    failed = [line.split()[4] for line in lines if "fail:" in line]
    assert failed == ["delivered_late", "duplicate"], wrong.stdout
    assert all(line.endswith("fail: duplicate effect") for line in lines if "fail:" in line)
    assert lines[-1] == "it-ops: did not hold: 2 of 8 trials failed"
