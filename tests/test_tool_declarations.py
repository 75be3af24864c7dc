"""Every way a tool enters an agent passes the same declaration checks, with the same options.

A contract is made by `@agent.write` / `agent.read` on a function, by `write_tool` / `read_tool`
(then `agent.add` or `Agent(tools=...)`), by `dataclasses.replace` of another contract, by
`ToolContract(...)` itself, from a LangChain tool, or from an MCP server's tool. Each bad
declaration is refused on every path, with the same words, when the contract is made: no path
lets through what another refuses (`replace(contract, guarantee=QUERYABLE)` without a reconcile
once passed `agent.add` and `agent.check()` while `@agent.write` refused it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.tools import tool
from pydantic import BaseModel

import loopwright.tools.contract as contract_module
import loopwright.tools.options as options_module
from loopwright import (
    Action,
    Agent,
    Effect,
    Guarantee,
    McpServer,
    ReadOptions,
    ReconcileResult,
    ReconcileStatus,
    ResendAfterDeadline,
    ToolContext,
    ToolContract,
    ToolDefinitionError,
    VerifyResult,
    WriteOptions,
    read_tool,
    write_tool,
)
from loopwright.tools.options import ToolOptions

KINDS = (ToolOptions, ReadOptions, WriteOptions)


class Slot(BaseModel):
    slot: str


class Booked(BaseModel):
    slot: str


def book(ctx: ToolContext[None], args: Slot, intent_key: str) -> Booked:
    """Book a slot."""
    return Booked(slot=args.slot)


def look(ctx: ToolContext[None], args: Slot) -> Booked:
    """Look at a slot."""
    return Booked(slot=args.slot)


@tool
def lc_book(slot: str) -> str:
    """Book a slot."""
    return slot


@tool
def lc_look(slot: str) -> str:
    """Look at a slot."""
    return slot


def asked(ctx: ToolContext[None], action: Action) -> ReconcileResult:
    return ReconcileResult(ReconcileStatus.APPLIED, outcome=action.args)


def acknowledged(ctx: ToolContext[None], action: Action) -> VerifyResult:
    return VerifyResult(True, {})


def before(ctx: ToolContext[None], args: Any) -> dict[str, Any]:
    return {}


async def _async_rule(ctx: ToolContext[None], args: Any) -> None:
    return None


async_rule: Any = _async_rule  # as in an application without a type checker

# A write that passes every check: a downstream that cannot be asked, so a person decides.
GOOD_WRITE: dict[str, Any] = {
    "intent": lambda run_id, a: f"book:{run_id}:{a.slot}",
    "guarantee": Guarantee.NONE,
    "verify": acknowledged,
}

BAD_WRITES: list[tuple[dict[str, Any], str]] = [
    ({"guarantee": Guarantee.QUERYABLE}, "guarantee queryable needs reconcile="),
    ({"intent": None}, "a write needs its business intent key"),
    (
        {
            "guarantee": Guarantee.IDEMPOTENT_BY_KEY,
            "reconcile": asked,
            "resend": ResendAfterDeadline(1),
        },
        "resend= is for a downstream without keys",
    ),
    ({"pre_image": before, "verify": None}, "declare verify="),
    ({"sensitive": ["card"]}, r"sensitive names card, which \w+ lacks"),
    ({"editable": ["amount"]}, r"editable names amount, which \w+ lacks"),
    ({"produces": ["booking_id"]}, r"produces names booking_id, which \w+ lacks"),
    ({"preconditions": [async_rule]}, r"preconditions\[0\] is an async function"),
    (
        {"needs_approval": "yes"},
        "needs_approval is 'yes': True .always., False .never. or a condition",
    ),
    ({"max_attempts": 3}, "max_attempts: a read's declarations, and this tool is a write"),
    ({"timeout_s": 0}, "timeout_s must be a number above 0, not 0"),
    ({"sumary": str}, "sumary"),
]
BAD_READS: list[tuple[dict[str, Any], str]] = [
    ({"summary": str}, "summary: a write's declarations, and this tool is a read"),
    ({"intent": lambda run_id, a: run_id}, "intent: a write's declarations"),
    ({"guarantee": Guarantee.QUERYABLE}, "guarantee: a write's declarations"),
    ({"sensitive": ["card"]}, r"sensitive names card, which \w+ lacks"),
    ({"authorize": async_rule}, "authorize is an async function"),
    ({"max_result_bytes": -1}, "max_result_bytes must be a number above 0"),
]

MCP = McpServer("desk", command=["/nonexistent/mcp-server"])  # declaring opens nothing


def _replaced(contract: ToolContract, bad: dict[str, Any]) -> ToolContract:
    return dataclasses.replace(contract, **bad)


WRITE_PATHS: dict[str, Callable[[dict[str, Any]], object]] = {
    "decorator": lambda bad: Agent("a", instructions="x").write(book, **{**GOOD_WRITE, **bad}),
    "write_tool then add": lambda bad: Agent("a", instructions="x").add(
        write_tool(book, **{**GOOD_WRITE, **bad})
    ),
    "replace then add": lambda bad: Agent("a", instructions="x").add(
        _replaced(write_tool(book, **GOOD_WRITE), bad)
    ),
    "replace then Agent(tools=)": lambda bad: Agent(
        "a", instructions="x", tools=[_replaced(write_tool(book, **GOOD_WRITE), bad)]
    ),
    "ToolContract": lambda bad: ToolContract(
        **{
            "name": "book",
            "description": "Book a slot.",
            "args_model": Slot,
            "output_model": Booked,
            "effect": Effect.WRITE,
            "run": lambda ctx, args, key: Booked(slot=args.slot),
            **GOOD_WRITE,
            **bad,
        }
    ),
    "LangChain tool": lambda bad: Agent("a", instructions="x").write(
        lc_book, **{**GOOD_WRITE, **bad}
    ),
    "MCP tool": lambda bad: MCP.write(
        "book", args_model=Slot, description="Book a slot.", **{**GOOD_WRITE, **bad}
    ),
}
READ_PATHS: dict[str, Callable[[dict[str, Any]], object]] = {
    "decorator": lambda bad: Agent("a", instructions="x").read(look, **bad),
    "read_tool then add": lambda bad: Agent("a", instructions="x").add(read_tool(look, **bad)),
    "replace then add": lambda bad: Agent("a", instructions="x").add(
        _replaced(read_tool(look), bad)
    ),
    "LangChain tool": lambda bad: Agent("a", instructions="x").read(lc_look, **bad),
    "MCP tool": lambda bad: MCP.read("look", args_model=Slot, description="Look.", **bad),
}


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_every_path_makes_the_good_write(path: str) -> None:
    WRITE_PATHS[path]({})


@pytest.mark.parametrize(("bad", "problem"), BAD_WRITES, ids=[p for _, p in BAD_WRITES])
@pytest.mark.parametrize("path", WRITE_PATHS)
def test_every_path_refuses_each_bad_write_alike(
    path: str, bad: dict[str, Any], problem: str
) -> None:
    with pytest.raises(TypeError, match=problem) as refused:  # ToolDefinitionError is one
        WRITE_PATHS[path](bad)
    if "sumary" not in bad or path in ("decorator", "write_tool then add", "MCP tool"):
        # Every declaration the contract checks is refused as a ToolDefinitionError; a keyword
        # no dataclass has is Python's own TypeError where a contract is made directly.
        assert isinstance(refused.value, ToolDefinitionError), refused.value


@pytest.mark.parametrize(("bad", "problem"), BAD_READS, ids=[p for _, p in BAD_READS])
@pytest.mark.parametrize("path", READ_PATHS)
def test_every_path_refuses_each_bad_read_alike(
    path: str, bad: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        READ_PATHS[path](bad)


def test_the_issues_example_is_refused_where_it_once_passed() -> None:
    """`replace(contract, guarantee=QUERYABLE)` with no reconcile: refused when made, so no
    agent can hold it, through `add` or otherwise."""
    agent: Agent[None] = Agent("a", instructions="Book slots.")
    contract = write_tool(book, **GOOD_WRITE)
    with pytest.raises(ToolDefinitionError, match="guarantee queryable needs reconcile="):
        agent.add(dataclasses.replace(contract, guarantee=Guarantee.QUERYABLE))
    agent.add(contract)
    agent.check()
    assert agent.tools.names() == ["book"]


def test_options_and_contract_fields_are_one_set_with_one_name_and_type_each() -> None:
    """What `Agent.read/write`, `read_tool/write_tool`, LangChain and MCP tools take is what a
    contract holds: no renames between the layers, no option one path lacks."""
    contract = typing.get_type_hints(ToolContract, globalns=vars(contract_module))
    identity = {"effect", "run", "connection"}
    hints = {kind: typing.get_type_hints(kind, globalns=vars(options_module)) for kind in KINDS}
    options = hints[ReadOptions] | hints[WriteOptions]
    assert set(options) == set(contract) - identity
    assert {name: contract[name] for name in options} == options
    # What a read and a write share is every tool's; the rest is one kind's own.
    assert set(hints[ReadOptions]) & set(hints[WriteOptions]) == set(hints[ToolOptions])
