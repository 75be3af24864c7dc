"""What the performance benchmarks share: a fresh database and services, the reading task with
~1 KB observations, and the bare prebuilt agent to compare with.

The reading task is `loopwright_refunds.long_task.KeepsReading`: every step is one model decision
and one `get_order` read, so a run of N steps is N tool steps. An order's JSON is about 300
bytes; the benchmarks read it through `get_order` contracts that pad the answer to about 1 KB
with a note that does not compress (base64 of a hash chain), so that neither Postgres's TOAST
compression nor a repeated value flatters either side.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10

from loopwright.checkpoints.compact import Layout
from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import open_lease_store
from loopwright.checkpoints.sql import Database
from loopwright.graph.budget import Budget
from loopwright.graph.state import Principal
from loopwright.models.scripted import ScriptedChatModel
from loopwright.runner import Runner
from loopwright.tools.contract import ToolContext, ToolContract
from loopwright_refunds.agent import Order, RefundServices, connect, fetch_order, task_scope
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.experiments.services import start_services
from loopwright_refunds.long_task import KeepsReading
from loopwright_refunds.scratch import fresh_database, server_url
from loopwright_refunds.services.endpoints import ServiceEndpoints

TASK = "Read orders O-42, O-43 and O-44 in turn, again and again."
PRINCIPAL = Principal(user_id="u-1", scope=task_scope(TASK))
NOTE_CHARS = 700  # pads an order (~300 bytes of JSON) to ~1 KB

# The payload bytes a thread holds in both layouts' tables (a thread is in one of them): in
# LangGraph's, each checkpoint's JSON and metadata, channel blobs and pending writes; in the
# compact layout (`checkpoints.compact`), each checkpoint's row body and the writes saved alone.
# Keys and row headers are not counted (see `benchmarks.storage` for whole rows).
THREAD_BYTES = {
    DatabaseKind.POSTGRES: """
SELECT
  (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
     FROM checkpoints WHERE thread_id = %s)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %s)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %s)
+ (SELECT coalesce(sum(octet_length(body)), 0) FROM lw_checkpoints WHERE thread_id = %s)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM lw_checkpoint_writes WHERE thread_id = %s)
  AS bytes""",
    DatabaseKind.SQLITE: """
SELECT
  (SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0)
     FROM checkpoints WHERE thread_id = %s)
+ (SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = %s)
+ (SELECT coalesce(sum(length(body)), 0) FROM lw_checkpoints WHERE thread_id = %s)
+ (SELECT coalesce(sum(length(blob)), 0) FROM lw_checkpoint_writes WHERE thread_id = %s)
  AS bytes""",
}


def note(order_id: str) -> str:
    """NOTE_CHARS of incompressible text, the same for the same order on both sides."""
    digest = hashlib.sha256(order_id.encode()).digest()
    chunks: list[str] = []
    while sum(len(chunk) for chunk in chunks) < NOTE_CHARS:
        digest = hashlib.sha256(digest).digest()
        chunks.append(base64.b64encode(digest).decode())
    return "".join(chunks)[:NOTE_CHARS]


class PaddedOrder(Order):
    note: str


def padded_order(ctx: ToolContext[RefundServices], order_id: str) -> dict[str, Any]:
    order = fetch_order(ctx, order_id).model_dump(mode="json")
    return {**order, "note": note(order_id)}


def _get_order() -> ToolContract:
    contract = refunds.tools.get("get_order")
    assert contract is not None, "the refund agent reads orders"
    return contract


# The refund agent's get_order with the padded answer: the same contract (name, arguments,
# authorisation, resources, timeouts, retries) but for its output.
PADDED_GET_ORDER = replace(
    _get_order(),
    output_model=PaddedOrder,
    run=lambda ctx, args, _key: padded_order(ctx, args.order_id),
)
# The refund agent with the padded read as its only tool: what the reading task needs.
READING_AGENT = refunds.replace(tools=[PADDED_GET_ORDER])


def bare_tools(endpoints: ServiceEndpoints, client: httpx.Client) -> list[BaseTool]:
    """The same padded read, with the same ownership check, as a plain langchain tool for the
    bare agent."""
    ctx = ToolContext(deps=RefundServices(endpoints, client))

    @tool
    def get_order(order_id: str) -> str:
        """Read an order: status, amount, refundable balance, delivery date, version."""
        # The check loopwright's get_order makes before it reads (its `authorize`: the order is
        # the user's), so that both agents do the same business work: two reads a tool step.
        if fetch_order(ctx, order_id).owner != PRINCIPAL.user_id:
            return f"order {order_id} is not an order of {PRINCIPAL.user_id}"
        return json.dumps(padded_order(ctx, order_id))

    return [get_order]


def reading_model(steps: int) -> ScriptedChatModel:
    return ScriptedChatModel(policy=KeepsReading(reads=steps))


def reading_budget(steps: int) -> Budget:
    """Room for `steps` reads; the context is never compacted, as the bare agent's is not."""
    return Budget(
        max_steps=steps + 5,
        max_tool_attempts=3 * steps,
        max_input_tokens=10**10,
        max_context_tokens=10**10,
        deadline_s=3600,
    )


@contextmanager
def open_reading_runner(
    database_url: str, endpoints: ServiceEndpoints, steps: int, layout: Layout = Layout.COMPACT
) -> Iterator[Runner]:
    """A runner of the reading agent on the services at `endpoints`, for a run of `steps` reads,
    writing its checkpoints in `layout` (LangGraph's own: as the server's runs, and the runtime's
    before the compact layout)."""
    with (
        connect(endpoints) as deps,
        open_checkpointer(database_url, new_threads=layout) as saver,
        open_journal(database_url) as journal,
        open_lease_store(database_url) as leases,
    ):
        yield Runner(
            saver=saver,
            journal=journal,
            leases=leases,
            agent=READING_AGENT,
            deps=deps,
            model=reading_model(steps),
            budget=reading_budget(steps),
        )


def bare_agent(
    model: BaseChatModel, tools: list[BaseTool], saver: BaseCheckpointSaver[str]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """LangGraph's stock tool-calling agent; its deprecation (for langchain's create_agent,
    which needs the langchain package) is not what is measured."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return create_react_agent(model, tools, checkpointer=saver)


def observation_bytes(runner: Runner, run_id: str) -> int:
    """The median observation of a finished run: a tool's answer as the model sees it (its
    message's content), in bytes."""
    observations = sorted(
        len(str(m.content).encode())
        for m in runner.state(run_id)["history"]
        if isinstance(m, ToolMessage)
    )
    return observations[len(observations) // 2]


def thread_bytes(db: Database, thread_id: str) -> int:
    """The payload bytes `thread_id` holds (`THREAD_BYTES`)."""
    sql = THREAD_BYTES[db.kind]
    row = db.one(sql, (thread_id,) * sql.count("%s"))
    assert row is not None
    return int(row["bytes"])


@dataclass(frozen=True)
class Bench:
    database_url: str
    endpoints: ServiceEndpoints


@contextmanager
def bench_environment(server: str | None = None) -> Iterator[Bench]:
    """A fresh database (dropped after) and the reference services on fresh storage."""
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(server_url(server), prefix="lw_bench"))
        storage = stack.enter_context(tempfile.TemporaryDirectory(prefix="lw-bench-services-"))
        services = stack.enter_context(start_services(Path(storage)))
        yield Bench(database_url=url, endpoints=services.endpoints)
