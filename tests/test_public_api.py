"""The public API: one curated namespace, documented, and what it refuses at definition time.

`docs/api.md` lists every name in `loopwright.__all__` with its one-line docstring; this test
regenerates it and fails if the page is out of date (`LOOPWRIGHT_WRITE_DOCS=1` rewrites it).
The README's first agent, and the pages' examples of proving a keyless write and of naming
roles, run here as written, so they cannot rot.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import sys
import types
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from pydantic import BaseModel, ConfigDict

import loopwright
from loopwright import (
    Action,
    Agent,
    Guarantee,
    ReconcileResult,
    ReconcileStatus,
    ResendAfterDeadline,
    ToolContext,
    ToolDefinitionError,
    write_tool,
)
from tests import docs_pages
from tests.runtime_fixtures import REPO

API_PAGE = REPO / "docs" / "api.md"
# Names whose objects cannot carry a docstring (type aliases).
ALIAS_DOCS = {"StepStatus": "The status of a plan step: todo, done, failed or skipped."}


def one_line(name: str) -> str:
    if name in ALIAS_DOCS:
        return ALIAS_DOCS[name]
    doc = inspect.getdoc(getattr(loopwright, name)) or ""
    return " ".join(doc.split("\n\n")[0].split())


def kind(value: Any) -> str:
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    return "function" if callable(value) else "type"


# An object's default shown in a signature without the address it happens to have.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def signature(value: Any, name: str) -> str:
    try:
        return name + _ADDRESS.sub("", str(inspect.signature(value)))
    except (TypeError, ValueError):
        return name


def own_methods(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties a class defines itself (not a base's, not a model's)."""
    found = []
    for attr, value in vars(cls).items():
        if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        found.append((attr, value))
    return found


def details(name: str) -> list[str]:
    """A name's section: its signature, its whole docstring, and its own methods'."""
    value = getattr(loopwright, name)
    lines = [f"### `{name}`", ""]
    if inspect.isclass(value) and issubclass(value, Enum):
        members = ", ".join(f"`{m.name}` = `{m.value}`" for m in value)
        lines += [f"`{name}`: {members}", ""]
    elif callable(value):
        lines += ["```python", signature(value, name), "```", ""]
    lines += [ALIAS_DOCS.get(name) or inspect.getdoc(value) or "", ""]
    if inspect.isclass(value):
        for attr, method in own_methods(value):
            shown = f"{name}.{attr}"
            if isinstance(method, property):
                lines += [f"- `{shown}` (property): {one_line_of(method)}"]
            else:
                lines += [f"- `{signature(method, shown)}`: {one_line_of(method)}"]
        if own_methods(value):
            lines.append("")
    return lines


def one_line_of(value: Any) -> str:
    doc = inspect.getdoc(value) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace("|", "\\|")


def api_reference() -> str:
    lines = [
        "# loopwright's public API",
        "",
        "Everything an application uses is importable from `loopwright` (`loopwright.__all__`).",
        "Generated from the docstrings by `tests/test_public_api.py`"
        " (`LOOPWRIGHT_WRITE_DOCS=1 pytest tests/test_public_api.py` rewrites it).",
        "",
        "| name | kind | what it is |",
        "| --- | --- | --- |",
    ]
    for name in loopwright.__all__:
        summary = one_line(name).replace("|", "\\|")
        lines.append(f"| `{name}` | {kind(getattr(loopwright, name))} | {summary} |")
    lines += ["", "## Signatures", ""]
    for name in loopwright.__all__:
        lines += details(name)
    return "\n".join(lines).rstrip("\n") + "\n"


def test_all_is_the_curated_namespace_and_every_name_is_documented() -> None:
    assert loopwright.__all__ == sorted(loopwright.__all__)
    assert set(loopwright.__all__) == set(loopwright._HOMES)
    undocumented = [n for n in loopwright.__all__ if not one_line(n)]
    assert undocumented == []
    assert loopwright.Agent.__module__ == "loopwright"  # one namespace, as httpx does
    with pytest.raises(AttributeError, match="no attribute 'ToolEnv'"):
        _ = loopwright.ToolEnv


def test_the_api_reference_page_lists_every_public_name() -> None:
    if os.environ.get("LOOPWRIGHT_WRITE_DOCS"):
        API_PAGE.write_text(api_reference())
    assert API_PAGE.read_text() == api_reference(), "regenerate: LOOPWRIGHT_WRITE_DOCS=1"


def test_importing_loopwright_loads_nothing_heavy() -> None:
    """The namespace is lazy: `import loopwright` (the CLI's first import) pulls in neither
    LangGraph nor LangChain until a name is used."""
    probe = "import sys, loopwright; print(sorted(m for m in sys.modules if m.startswith(('langgraph', 'langchain'))))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"


# --- definitions the runtime refuses -----------------------------------------------------


class Slot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slot: str


class Booked(BaseModel):
    booking_id: str


def book(ctx: ToolContext[None], args: Slot, intent_key: str) -> Booked:
    """Book a slot."""
    return Booked(booking_id="bk_1")


def asked(ctx: ToolContext[None], action: Action) -> ReconcileResult:
    return ReconcileResult(ReconcileStatus.APPLIED, outcome={"booking_id": "bk_1"})


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        ({"intent": None}, "a write needs its business intent key: intent=lambda run_id"),
        (
            {"guarantee": Guarantee.QUERYABLE},
            "guarantee queryable needs reconcile=... .* or declare guarantee=Guarantee.NONE",
        ),
        ({"guarantee": Guarantee.NONE}, "declare verify=..."),
        (
            {"guarantee": Guarantee.IDEMPOTENT_BY_KEY, "reconcile": asked, "produces": ["x"]},
            "produces names x, which Booked lacks",
        ),
        (
            {
                "guarantee": Guarantee.IDEMPOTENT_BY_KEY,
                "reconcile": asked,
                "produces": ["booking_id"],
            },
            "produces 'booking_id' has no pattern",
        ),
        (
            {"guarantee": Guarantee.IDEMPOTENT_BY_KEY, "reconcile": asked, "sensitive": ["card"]},
            "sensitive names card, which Slot lacks",
        ),
    ],
)
def test_a_write_without_what_it_needs_is_refused_at_definition(
    declared: dict[str, Any], problem: str
) -> None:
    declared = {"intent": lambda run_id, a: f"book:{run_id}:{a.slot}", **declared}
    with pytest.raises(ToolDefinitionError, match=f"tool book: {problem}"):
        write_tool(book, **declared)


def test_a_tool_function_must_be_typed_with_pydantic_models() -> None:
    def untyped(ctx: ToolContext[None], args: dict[str, str]) -> Booked:
        """Read a slot."""
        return Booked(booking_id="bk_1")

    agent: Agent[None] = Agent("desk", instructions="Book slots.")
    with pytest.raises(ToolDefinitionError, match="annotate its argument 'args' with a pydantic"):
        agent.read(untyped)

    def two_arguments(ctx: ToolContext[None], args: Slot) -> Booked:
        """Book a slot."""
        return Booked(booking_id="bk_1")

    with pytest.raises(ToolDefinitionError, match=r"takes \(ctx, args, intent_key\)"):
        agent.write(two_arguments, intent=lambda r, a: r)


async def async_read(ctx: ToolContext[None], args: Slot) -> Booked:
    """Read a slot."""
    return Booked(booking_id="bk_1")


async def async_book(ctx: ToolContext[None], args: Slot, intent_key: str) -> Booked:
    """Book a slot."""
    return Booked(booking_id="bk_1")


async def _async_rule(ctx: ToolContext[None], args: Any) -> Any:
    return False


# Typed as anything, as in an application without a type checker (mypy would refuse it).
async_rule: Any = _async_rule


class AsyncCall:
    async def __call__(self, ctx: ToolContext[None], args: Any) -> bool:
        return False


def sync_read(ctx: ToolContext[None], args: Slot) -> Booked:
    """Read a slot."""
    return Booked(booking_id="bk_1")


KEYED: dict[str, Any] = {"intent": lambda run_id, a: f"book:{run_id}:{a.slot}", "reconcile": asked}


@pytest.mark.parametrize(
    ("define", "problem"),
    [
        (lambda agent: agent.read(async_read), "tool async_read: the function"),
        (lambda agent: agent.write(async_book, **KEYED), "tool async_book: the function"),
        (lambda agent: agent.read(sync_read, authorize=async_rule), "tool sync_read: authorize"),
        (lambda agent: agent.read(sync_read, authorize=AsyncCall()), "tool sync_read: authorize"),
        (
            lambda agent: agent.write(book, **KEYED, preconditions=[lambda c, a: None, async_rule]),
            r"tool book: preconditions\[1\]",
        ),
        (
            lambda agent: agent.write(book, **{**KEYED, "reconcile": async_rule}),
            "tool book: reconcile",
        ),
        (lambda agent: agent.write(book, **KEYED, needs_approval=async_rule), "needs_approval"),
        (lambda _: Agent("desk", instructions="x", approvers=async_rule), "agent desk: approvers"),
        (lambda _: Agent("desk", instructions="x", boundary=async_rule), "agent desk: boundary"),
        (
            lambda _: Agent(
                "desk",
                instructions="x",
                scenarios=[loopwright.Scenario(task="t", user="u", effects=async_rule)],
            ),
            r"agent desk: scenarios\[0\].effects",
        ),
        (
            lambda _: loopwright.ToolContract(
                name="raw",
                description="A raw contract.",
                args_model=Slot,
                output_model=Booked,
                effect=loopwright.Effect.READ,
                run=lambda ctx, args, key: Booked(booking_id="bk_1"),
                authorize=async_rule,
            ),
            "tool raw: authorize",
        ),
    ],
)
def test_an_async_function_the_runtime_would_call_synchronously_is_refused_at_definition(
    define: Any, problem: str
) -> None:
    """loopwright calls a tool's functions and an agent's hooks from a worker thread, without
    awaiting: an async one would answer with a coroutine, which an `authorize` or an approver
    check would take for a yes and a precondition for no objection. Refused when defined."""
    agent: Agent[None] = Agent("desk", instructions="Book slots.")
    with pytest.raises(ToolDefinitionError, match=f"{problem} is an async function"):
        define(agent)
    assert agent.tools.names() == []


def test_authorize_and_preconditions_let_a_call_through_only_on_true_or_none() -> None:
    """`authorize` allows and a precondition holds on True or None only: any other answer
    refuses, False (a check written as a predicate), a truthy object (an order found, a list)
    or a falsy one. A precondition refuses by raising `PreconditionFailed` too."""
    ctx: ToolContext[None] = ToolContext(deps=None)
    args = Slot(slot="s1")
    answers: list[tuple[Any, bool]] = [(True, True), (None, True), (False, False), ([], False)]
    for answer, passes in [*answers, ("yes", False), (0, False)]:
        rule: Any = lambda c, a, answer=answer: answer  # noqa: E731 (a predicate, untyped)
        agent: Agent[None] = Agent("desk", instructions="Book slots.")
        agent.read(sync_read, authorize=rule)
        agent.write(book, **KEYED, preconditions=rule)
        read, write = agent.tools.get("sync_read"), agent.tools.get("book")
        assert read is not None and write is not None
        checks = [
            (read.check_authorized, loopwright.PermissionDenied, "sync_read"),
            (write.check_preconditions, loopwright.PreconditionFailed, "book: its precondition"),
        ]
        for check, refusal, says in checks:
            if passes:
                check(ctx, args)
            else:
                with pytest.raises(refusal, match=says):
                    check(ctx, args)


class Seat(BaseModel):
    seat: str
    passenger: str | None = None


def generic(ctx: ToolContext[None], args: Any, intent_key: str) -> Any:
    """Send a change to the airline."""
    return {"booking_id": f"bk_{intent_key}"}


def test_a_table_of_tools_is_defined_in_a_loop_with_explicit_models() -> None:
    """One function serves several tools: `args_model=` and `output_model=` give each its
    models, where an unannotated function alone is refused."""
    agent: Agent[None] = Agent("airline", instructions="Change bookings.")
    table: dict[str, type[BaseModel]] = {"book_seat": Seat, "book_slot": Slot}
    for name, model in table.items():
        agent.write(
            generic,
            name=name,
            args_model=model,
            output_model=Booked,
            intent=functools.partial(lambda tool, run_id, _a: f"{tool}:{run_id}", name),
            guarantee=Guarantee.IDEMPOTENT_BY_KEY,
            reconcile=asked,
        )
    contracts = {name: agent.tools.get(name) for name in table}
    assert {n: c.args_model.__name__ for n, c in contracts.items() if c} == {
        "book_seat": "Seat",
        "book_slot": "Slot",
    }
    seat = contracts["book_seat"]
    assert seat is not None and seat.output_model is Booked
    with pytest.raises(ValueError, match="extra"):  # closed: an argument it does not name
        seat.args_model.model_validate({"seat": "4A", "meal": "veg"})
    # Without the models, the same function is refused, naming what to add.
    with pytest.raises(ToolDefinitionError, match="annotate its argument 'args'"):
        agent.write(generic, name="book_meal", intent=lambda r, a: r)
    with pytest.raises(ToolDefinitionError, match="args_model= takes a pydantic model class"):
        agent.write(
            generic,
            name="book_meal",
            args_model=dict,  # type: ignore[arg-type]  # the mistake under test
            output_model=Booked,
            intent=lambda r, a: r,
        )


def test_a_write_without_a_summary_reads_as_its_name_and_arguments() -> None:
    contract = write_tool(
        book, intent=lambda r, a: r, guarantee=Guarantee.IDEMPOTENT_BY_KEY, reconcile=asked
    )
    assert contract.describe(Slot(slot="10:00")) == "book: slot 10:00"
    seat = write_tool(
        generic,
        name="seat",
        args_model=Seat,
        output_model=Booked,
        intent=lambda r, a: r,
        guarantee=Guarantee.IDEMPOTENT_BY_KEY,
        reconcile=asked,
        sensitive=["passenger"],
    )
    assert seat.describe(Seat(seat="4A", passenger="Ada")) == "seat: seat 4A, passenger [redacted]"


@pytest.mark.parametrize(
    ("seconds", "skew_s", "problem"),
    [
        (0, 5.0, "seconds must be > 0, not 0"),
        (-1, 5.0, "seconds must be > 0, not -1"),
        (float("nan"), 5.0, "seconds must be > 0, not nan"),
        (10, -1, "skew_s must be >= 0, not -1"),
        (10, float("inf"), "skew_s must be >= 0, not inf"),
    ],
)
def test_a_resend_deadline_that_could_let_a_late_request_apply_twice_is_refused(
    seconds: float, skew_s: float, problem: str
) -> None:
    with pytest.raises(ValueError, match=f"ResendAfterDeadline: {problem}"):
        ResendAfterDeadline(seconds, skew_s=skew_s)
    assert ResendAfterDeadline(0.5, skew_s=0).seconds == 0.5


def test_a_boundary_is_given_the_tool_context_its_tools_get() -> None:
    """`boundary(ctx, task)`: the deps and the principal as a tool sees them; the older
    `boundary(deps, principal, task)` draws the same scope."""
    seen: list[ToolContext[str]] = []

    def slots_of(ctx: ToolContext[str], task: str) -> set[str]:
        seen.append(ctx)
        return {f"slot:{ctx.user.user_id}:{word}" for word in task.split()}

    agent: Agent[str] = Agent("desk", instructions="Book slots.", boundary=slots_of)
    principal = agent.principal_for("the desk's client", "ana", "1 2")
    assert principal.scope == ("slot:ana:1", "slot:ana:2")
    [ctx] = seen
    assert (ctx.deps, ctx.user.user_id) == ("the desk's client", "ana")
    older = agent.replace(boundary=lambda deps, who, task: {f"slot:{who.user_id}:1"})
    assert older.principal_for("", "ana", "1").scope == ("slot:ana:1",)
    # What every entry point calls (the server's included): the three-argument form.
    assert agent.replace().principal_for("x", "bo", "3").scope == ("slot:bo:3",)


def test_an_agent_whose_tools_touch_resources_needs_a_boundary() -> None:
    agent: Agent[None] = Agent("desk", instructions="Book slots.")
    agent.write(
        book,
        intent=lambda run_id, a: f"book:{run_id}:{a.slot}",
        guarantee=Guarantee.IDEMPOTENT_BY_KEY,
        reconcile=asked,
        resources=lambda a: {f"slot:{a.slot}"},
    )
    with pytest.raises(ToolDefinitionError, match="declares no boundary"):
        agent.check()
    assert agent.replace(boundary=lambda deps, who, task: {"slot:1"}).tools.names() == ["book"]


def test_safe_defaults_of_a_write() -> None:
    contract = write_tool(
        book,
        intent=lambda run_id, a: f"book:{run_id}:{a.slot}",
        guarantee=Guarantee.IDEMPOTENT_BY_KEY,
        reconcile=asked,
    )
    ctx: ToolContext[None] = ToolContext(deps=None)
    args = Slot(slot="1")
    assert (
        contract.approval_reason(ctx, args) is not None
    )  # a person decides unless the team says otherwise
    assert contract.editable == frozenset()  # and may change nothing of it
    assert contract.args_model.model_config.get("extra") == "forbid"
    assert contract.verify is not None  # verified by asking the business system again
    action = Action(
        action_id="a",
        run_id="r",
        call_id="c",
        tool="book",
        args={"slot": "1"},
        args_digest="d",
        intent_key="book:r:1",
        status="SUCCEEDED",
    )
    assert contract.verify(ctx, action).verified


def test_langchain_tools_become_contracts() -> None:
    """A team moving from create_react_agent keeps its tools: a read as it is, a write only
    with the write's declarations."""

    @tool
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"sunny in {city}"

    @tool
    def send(to: str, text: str) -> str:
        """Send a message."""
        raise ConnectionError("gateway gone")

    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    agent: Agent[None] = Agent("weather", instructions="Answer about the weather.")
    agent.read(lookup)
    with pytest.raises(ToolDefinitionError, match=r"tool fetch: it is async only"):
        agent.read(tool(fetch))
    with pytest.raises(ToolDefinitionError, match="a write needs its business intent key"):
        agent.write(send)
    agent.write(
        send,
        intent=lambda run_id, a: f"send:{run_id}:{a.to}",
        guarantee=Guarantee.NONE,
        verify=lambda ctx, action: loopwright.VerifyResult(True, {}),
    )
    read, written = agent.tools.get("lookup"), agent.tools.get("send")
    assert read is not None and written is not None
    ctx: ToolContext[None] = ToolContext(deps=None)
    result = read.run(ctx, read.args_model.model_validate({"city": "Oslo"}), None)
    assert result.model_dump() == {"result": "sunny in Oslo"}  # type: ignore[union-attr]
    with pytest.raises(Exception, match="city"):
        read.args_model.model_validate({"town": "Oslo"})  # closed: nothing unnamed passes
    with pytest.raises(loopwright.OutcomeUnknown):  # a write that raised may have applied
        written.run(ctx, written.args_model.model_validate({"to": "a", "text": "b"}), "k")


# --- the examples of the README and the pages it leads to ---------------------------------


def run_blocks(code: list[str], name: str, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`code` run in order in a module of its own, as an application's is."""
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in code:
        exec(compile(block, page, "exec"), module.__dict__)


def test_the_readme_first_agent_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = docs_pages.blocks("README.md", "python", "Your first agent")
    assert len(blocks) == 2
    code = [
        line
        for line in blocks[0].splitlines()
        if line.strip() and not line.startswith(("from ", "import "))
    ]
    assert len(code) <= 32, len(code)  # the common case stays short
    monkeypatch.chdir(tmp_path)
    run_blocks(blocks, "readme_example", "README.md", monkeypatch)
    # What it prints: the run's ending and its effect.
    [printed] = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"completed \{'restart:[\w.:-]+:web': 'web'\}", printed), printed


def test_the_faults_page_proves_its_keyless_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page, title = "docs/faults.md", "In an application's own tests: `prove`"
    [block] = docs_pages.blocks(page, "python", title)
    monkeypatch.chdir(tmp_path)
    run_blocks([block], "faults_example", page, monkeypatch)
    # One line per trial: the clean run, then each network fault (crash trials need a path).
    trials = [line.split(" ", 2) for line in capsys.readouterr().out.splitlines()]
    assert [fault for fault, _, _ in trials] == [
        "clean",
        "request_lost",
        "answer_lost",
        "answer_late",
        "delivered_late",
    ], trials
    for _, ending, effects in trials:
        assert ending == "completed", trials
        assert re.fullmatch(r"\{'credit:[\w.:-]+:web': 1\}", effects), trials


def test_the_identities_page_roles_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    page, title = "docs/identities.md", "Roles: who may do what"
    [block] = docs_pages.blocks(page, "python", title)
    run_blocks([block], "roles_example", page, monkeypatch)
    desk = sys.modules["roles_example"].desk
    assert desk.roles.grants("operate", ["sre"]) and not desk.roles.grants("decide", ["sre"])


@pytest.mark.parametrize("name", ["desk\n", "Desk", "desk desk", ""])
def test_an_agent_name_is_the_whole_name(name: str) -> None:
    """Checked with fullmatch: `$` in a pattern lets a trailing newline through."""
    with pytest.raises(ToolDefinitionError, match="lowercase letters, digits, _ and -"):
        Agent(name, instructions="Book slots.")


@pytest.mark.parametrize("name", ["book\n", "book slot", "b" * 65])
def test_a_tool_name_is_what_a_model_may_call_a_function(name: str) -> None:
    declared: dict[str, Any] = {
        "intent": lambda run_id, a: f"book:{run_id}:{a.slot}",
        "guarantee": Guarantee.IDEMPOTENT_BY_KEY,
        "reconcile": asked,
    }
    with pytest.raises(ToolDefinitionError, match="is not a valid function name"):
        write_tool(book, name=name, **declared)
    assert write_tool(book, name="book_slot", **declared).name == "book_slot"
