"""The reading task as DBOS Transact's minimal durable workflow: the other durable choice, timed
by `benchmarks.step_time` in the same rounds as loopwright and the bare agent.

Each model decision is a DBOS step and each tool call another, as a DBOS user would write an
agent's loop: the same zero-latency scripted model and the same tool as the bare agent's (the
ownership check and the padded read, two GETs a tool call). DBOS checkpoints each step's output
in its system database before the workflow goes on, in a database of its own: a fresh Postgres
database on the bench's server (dropped after), or an SQLite file, as DBOS ships (its defaults:
on SQLite, the rollback journal; on Postgres, a pooled connection pinged before each use).

The same loop with the same model and tool and no durability at all (`read_in_turn` with plain
calls) is timed too: what each system costs above the work itself.

DBOS is a dev dependency and stays optional: without it `launched` yields None and the benchmark
says so, timing the rest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from benchmarks.perf_setup import TASK, bare_tools, reading_model
from loopwright import tls
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.endpoints import ServiceEndpoints

NOT_INSTALLED = "DBOS Transact is not installed (a dev dependency: pip install -e '.[dev]')"
# DBOS 3.4 stamps its SQLite rows with unixepoch('subsec') (ms since the epoch, over 1000),
# which SQLite evaluates to NULL before 3.42: its launch fails (NOT NULL constraint failed).
SUBSEC_SINCE = (3, 42, 0)
# Where DBOS keeps its checkpoints, as the report names it, by backend: as DBOS ships.
WHERE = {
    "postgres": "a Postgres database of its own on the same server, a pooled connection pinged "
    "before each use",
    "sqlite": "an SQLite file of its own, in its own journal mode (delete)",
}
SUBSEC_GIVEN = (
    f"SQLite {sqlite3.sqlite_version} has no unixepoch('subsec'), which DBOS stamps its rows "
    "with: a Python function gives it to DBOS's connections"
)
# Steps DBOS's workflow makes a tool step: the decision, the tool call.
STEPS_PER_TOOL_STEP = 2

Model = Runnable[LanguageModelInput, BaseMessage]
Decide = Callable[[Model, list[BaseMessage]], BaseMessage]
Call = Callable[[BaseTool, ToolCall], ToolMessage]


def decide(model: Model, messages: list[BaseMessage]) -> BaseMessage:
    """The model's next answer: tool calls, or the run's final text."""
    return model.invoke(messages)


def call(tool: BaseTool, request: ToolCall) -> ToolMessage:
    """One tool call, answered as the bare agent's tool node answers it."""
    answer = tool.invoke(request)
    assert isinstance(answer, ToolMessage)
    return answer


def read_in_turn(steps: int, tools: list[BaseTool], decide: Decide, call: Call) -> int:
    """The reading task's loop, as the bare agent runs it: the model decides, each tool call it
    asks for is made, until it answers in text. Returns how many tool calls were made."""
    model = reading_model(steps).bind_tools(tools)
    by_name = {tool.name: tool for tool in tools}
    messages: list[BaseMessage] = [HumanMessage(TASK)]
    calls = 0
    while True:
        answer = decide(model, messages)
        messages.append(answer)
        requests = answer.tool_calls if isinstance(answer, AIMessage) else []
        if not requests:
            return calls
        for request in requests:
            messages.append(call(by_name[request["name"]], request))
            calls += 1


@dataclass(frozen=True)
class Flow:
    """DBOS launched on its database: `run(steps)` runs one workflow of `steps` tool steps
    (its decisions and tool calls each a step) and `plain(steps)` the same loop undurably."""

    run: Callable[[int], int]
    plain: Callable[[int], int]
    version: str
    where: str  # its database, as the report names it


@contextmanager
def system_database(database_url: str, directory: Path) -> Iterator[str]:
    """Where DBOS keeps its checkpoints beside loopwright's database at `database_url`: a fresh
    Postgres database on the same server (dropped after), or an SQLite file in `directory`."""
    if database_url.startswith("sqlite:"):
        yield f"sqlite:///{directory / 'dbos.sqlite3'}"
    else:
        with fresh_database(database_url, prefix="lw_bench_dbos") as url:
            yield url


def unavailable(system_url: str) -> str | None:
    """Why DBOS cannot run on `system_url` in this process, if it cannot."""
    try:
        importlib.import_module("dbos")
    except ImportError:
        return NOT_INSTALLED
    return None


class SubsecConnection(sqlite3.Connection):
    """An SQLite connection where unixepoch('subsec') is what SQLite 3.42 made it: the time in
    seconds since the epoch, to the millisecond (an older SQLite has NULL for it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.create_function("unixepoch", 1, _unixepoch)


def _unixepoch(modifier: str) -> float:
    if modifier != "subsec":
        raise ValueError(f"unixepoch({modifier!r}): only 'subsec' is given")
    return round(time.time(), 3)


def _needs_subsec(system_url: str) -> bool:
    return system_url.startswith("sqlite:") and sqlite3.sqlite_version_info < SUBSEC_SINCE


@contextmanager
def launched(system_url: str, endpoints: ServiceEndpoints) -> Iterator[Flow | str]:
    """DBOS launched on `system_url` for as long as the block runs, the workflow's tool on a
    client of its own; where it cannot run here, why not.

    DBOS is one per process: `DBOS.destroy` ends it, and its registered workflows with it."""
    reason = unavailable(system_url)
    if reason is not None:
        yield reason
        return
    from dbos import DBOS, DBOSConfig

    with ExitStack() as stack:
        tools = bare_tools(endpoints, stack.enter_context(httpx.Client(verify=tls.context())))
        decide_step = DBOS.step(name="decide")(decide)
        call_step = DBOS.step(name="call")(call)

        @DBOS.workflow(name="read_in_turn")
        def workflow(steps: int) -> int:
            return read_in_turn(steps, tools, decide_step, call_step)

        config: DBOSConfig = {
            "name": "lw-bench",
            "system_database_url": system_url,
            "log_level": "WARNING",
        }
        if _needs_subsec(system_url):
            config["db_engine_kwargs"] = {"connect_args": {"factory": SubsecConnection}}
        DBOS(config=config)
        stack.callback(DBOS.destroy, destroy_registry=True)
        DBOS.launch()
        yield Flow(
            run=workflow,
            plain=lambda steps: read_in_turn(steps, tools, decide, call),
            version=importlib.metadata.version("dbos"),
            where=WHERE["sqlite" if system_url.startswith("sqlite:") else "postgres"]
            + (f"; {SUBSEC_GIVEN}" if _needs_subsec(system_url) else ""),
        )
