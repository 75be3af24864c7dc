"""The run savers write what the stock savers write: a graph run on each reads back the same.

Two layouts (`checkpoints.compact`, `checkpoints.fenced`): the compact one, in which the runtime
writes its runs, and LangGraph's own, in which the server's runs are written (its stock readers
read them) with statements of loopwright's own. Either must read back as if the stock saver had
written the run (LangGraph's loop, `get_state_history`, DeltaChannel replay); LangGraph's
layout must also be read by the stock savers themselves. The graph covers every kind of row:
inline and blob values, a DeltaChannel across its snapshot, writes held for the checkpoint, an
interrupt's writes saved alone and its resume value.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONFIG_KEY_DURABILITY
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from loopwright.checkpoints import compact
from loopwright.checkpoints.compact import Layout
from loopwright.checkpoints.database import (
    DatabaseKind,
    connect_postgres,
    connect_sqlite,
    database_kind,
    sqlite_path,
)
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import (
    WRITES_WAIT_S,
    Fence,
    FencedPostgresSaver,
    next_version,
)
from loopwright.checkpoints.leases import open_lease_store
from tests.runtime_fixtures import PATIENCE_S

STEPS = 24
SNAPSHOT_EVERY = 10  # the notes are stored whole at every tenth update, as deltas in between


def extend(old: list[str], new: list[list[str]]) -> list[str]:
    return [*old, *(note for batch in new for note in batch)]


# Set once, at the start: a string too long to be stored inline at every checkpoint.
BRIEF = "Read every note and keep count. " * 64


class Notebook(TypedDict):
    notes: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=SNAPSHOT_EVERY)]
    count: int
    totals: Annotated[dict[str, int], operator.or_]
    answer: str
    brief: str


def write(state: Notebook) -> dict[str, Any]:
    count = state.get("count", 0) + 1
    return {"notes": [f"note {count}"], "count": count, "totals": {f"k{count % 3}": count}}


def ask(state: Notebook) -> dict[str, Any]:
    return {"answer": str(interrupt({"question": f"after {state['count']} notes?"}))}


def route(state: Notebook) -> str:
    if state["count"] == STEPS // 2 and not state.get("answer"):
        return "ask"
    return END if state["count"] >= STEPS else "write"


def notebook(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(Notebook)
    builder.add_node("write", write)
    builder.add_node("ask", ask)
    builder.add_edge(START, "write")
    builder.add_conditional_edges("write", route, ["write", "ask", END])
    builder.add_edge("ask", "write")
    return builder.compile(checkpointer=saver)


def run_and_read(
    saver: BaseCheckpointSaver[Any], thread: str, resumer: BaseCheckpointSaver[Any] | None = None
) -> list[Any]:
    """Run the notebook to its interrupt, resume it to the end (on `resumer`, if given), read
    its whole history."""
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    notebook(saver).invoke(
        {"notes": ["start"], "count": 0, "totals": {}, "brief": BRIEF}, config, durability="sync"
    )
    graph = notebook(resumer or saver)
    graph.invoke(Command(resume="yes"), config, durability="sync")
    return [
        (
            snapshot.values,
            snapshot.next,
            [
                (task.name, task.result, [i.value for i in task.interrupts])
                for task in snapshot.tasks
            ],
            snapshot.metadata and {k: snapshot.metadata.get(k) for k in ("source", "step")},
        )
        for snapshot in graph.get_state_history(config)
    ]


@contextmanager
def stock_saver(url: str) -> Iterator[BaseCheckpointSaver[Any]]:
    if database_kind(url) is DatabaseKind.POSTGRES:
        with connect_postgres(url) as conn:
            saver: BaseCheckpointSaver[Any] = PostgresSaver(conn)
            yield saver
    else:
        with closing(connect_sqlite(sqlite_path(url))) as sconn:
            yield SqliteSaver(sconn)


@pytest.mark.parametrize("layout", list(Layout))
def test_a_fenced_run_reads_back_as_a_stock_run(database_url: str, layout: Layout) -> None:
    with open_lease_store(database_url) as leases:
        leases.register("fenced", task="notes", user_id="u-1")
        lease = leases.claim("fenced", "worker-a", ttl_s=60)
    with open_checkpointer(database_url, fence=Fence.of(lease), new_threads=layout) as fenced:
        ours = run_and_read(fenced, "fenced")
    with stock_saver(database_url) as stock:
        theirs = run_and_read(stock, "stock")
    assert len(ours) > STEPS
    assert ours == theirs
    if layout is Layout.STOCK:  # and the stock saver reads the fenced run as the fenced saver does
        with stock_saver(database_url) as stock:
            config: RunnableConfig = {"configurable": {"thread_id": "fenced"}}
            assert notebook(stock).get_state(config).values["notes"] == [
                "start",
                *(f"note {n}" for n in range(1, STEPS + 1)),
            ]


@pytest.mark.postgres
def test_a_long_string_is_stored_once_not_at_every_checkpoint(postgres_url: str) -> None:
    """The stock saver keeps every string inline in the checkpoint's JSON, which is written
    again at each checkpoint; the fenced saver stores a long one as a blob, once per version."""
    with open_checkpointer(postgres_url, new_threads=Layout.STOCK) as fenced:
        run_and_read(fenced, "long-brief")
    with psycopg.connect(postgres_url) as conn:
        inline, checkpoints = conn.execute(
            "SELECT count(*) FILTER (WHERE strpos(checkpoint::text, %s) > 0), count(*)"
            " FROM checkpoints WHERE thread_id = 'long-brief'",
            (BRIEF[:40],),
        ).fetchone() or (None, None)
        blobs = conn.execute(
            "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = 'long-brief'"
            " AND channel = 'brief'"
        ).fetchone()
    assert checkpoints and checkpoints > STEPS and inline == 0
    assert blobs == (1,)


@pytest.mark.postgres
def test_a_string_s_blob_is_sent_by_the_saver_that_stored_it_once(postgres_url: str) -> None:
    """A string kept unchanged is not sent again with every checkpoint by the saver that
    stored its blob; a saver that did not store it (a thread begun by another, say) sends it
    with its first checkpoint, in case the thread held it inline."""
    sent: list[list[str]] = []
    with (
        open_checkpointer(postgres_url, new_threads=Layout.STOCK) as first,
        open_checkpointer(postgres_url, new_threads=Layout.STOCK) as second,
    ):
        for saver in (first.legacy, second.legacy):
            assert isinstance(saver, FencedPostgresSaver)
            dump = saver._dump_blobs

            def counted(*args: Any, dump: Any = dump) -> Any:
                rows = dump(*args)
                sent.append([row[2] for row in rows])
                return rows

            saver._dump_blobs = counted  # type: ignore[method-assign, assignment]
        history = run_and_read(first, "brief-once", resumer=second)
    assert history[0][0]["brief"] == BRIEF and history[0][0]["count"] == STEPS
    # Once by the first saver (up to the interrupt), once by the second, of all the commits.
    assert sum(channels.count("brief") for channels in sent) == 2 < STEPS < len(sent)


@pytest.mark.postgres
@pytest.mark.parametrize("layout", list(Layout))
def test_every_commit_of_a_run_is_one_prepared_statement(postgres_url: str, layout: Layout) -> None:
    """Commits with and without writes, blobs, a checkpoint or a parent (the first), an
    interrupt's writes alone and a resume value bind the same parameter types: the commit is
    prepared once per connection, not once per spelling of its types. The compact layout has
    one statement for a checkpoint's row and one for writes saved alone (a node commit sends
    only the row's parameters), each prepared once."""
    with open_lease_store(postgres_url) as leases:
        leases.register("prepared", task="notes", user_id="u-1")
        lease = leases.claim("prepared", "worker-a", ttl_s=60)
    with open_checkpointer(postgres_url, fence=Fence.of(lease), new_threads=layout) as fenced:
        run_and_read(fenced, "prepared")
        stock = fenced.legacy
        assert isinstance(stock, FencedPostgresSaver)
        conn = stock.conn
        assert isinstance(conn, psycopg.Connection)  # the saver's own, not a pool
        prepared = conn.execute(
            "SELECT count(*) AS n FROM pg_prepared_statements"
            " WHERE ltrim(statement, E'\\n') LIKE 'WITH run AS%'"
        ).fetchone()
    assert prepared is not None and prepared["n"] == (2 if layout is Layout.COMPACT else 1)


def test_a_compact_run_reads_back_the_same_across_keyframes(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyframe every third row (every 64th in use): the run's history, its DeltaChannel
    across the snapshots and the interrupt read back as the stock saver's, the rows rebuilt
    from one keyframe or another."""
    monkeypatch.setattr(compact, "KEY_EVERY", 3)
    with open_checkpointer(database_url) as saver:
        ours = run_and_read(saver, "keyframed")
        [rows] = saver.db.execute(
            "SELECT count(*) AS n, sum(CASE WHEN keyframe THEN 1 ELSE 0 END) AS keyframes"
            " FROM lw_checkpoints WHERE thread_id = %s",
            ("keyframed",),
        )
    with stock_saver(database_url) as stock:
        theirs = run_and_read(stock, "stock")
    assert ours == theirs
    assert rows["n"] > STEPS and rows["keyframes"] >= rows["n"] // 3


def test_a_stock_thread_goes_on_under_the_fenced_saver(database_url: str) -> None:
    """A run begun by a stock saver (an older loopwright, the server's stock paths) resumes
    correctly under the runtime's saver, in LangGraph's layout; the fenced savers' shorter
    channel versions sort after the stock ones."""
    with open_checkpointer(database_url) as fenced, stock_saver(database_url) as stock:
        mixed = run_and_read(stock, "begun-stock", resumer=fenced)
        theirs = run_and_read(stock, "all-stock")
    assert mixed == theirs


def test_channel_versions_sort_by_their_counter() -> None:
    """LangGraph compares versions as strings: they must order by their counter, and every
    version of the fenced form must come after every version of the stock form."""
    stock = [f"{counter:032}.0.{counter}" for counter in (1, 7, 10**9, 10**20)]
    versions = [stock[0]]
    for _ in range(10_050):
        versions.append(next_version(versions[-1]))
    assert [int(v.split(".")[0]) for v in versions] == list(range(1, len(versions) + 1))
    assert sorted(versions) == versions
    assert max(stock) < next_version(None)


def _saver_with_a_checkpoint(
    saver: BaseCheckpointSaver[Any],
) -> tuple[RunnableConfig, list[Any]]:
    """A first checkpoint on the leased run, and a log of the saver's commits after it."""
    first = saver.put(
        {"configurable": {"thread_id": "fenced", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
    )
    commits: list[Any] = []
    commit = saver._commit  # type: ignore[attr-defined]

    def logged(thread: str, tasks: Any, save: Any) -> None:
        commits.append((len(tasks), save is not None))
        commit(thread, tasks, save)

    saver._commit = logged  # type: ignore[attr-defined]
    return {"configurable": {**first["configurable"], CONFIG_KEY_DURABILITY: "sync"}}, commits


def _next(updated: list[str]) -> Checkpoint:
    return {**empty_checkpoint(), "updated_channels": updated}


def test_a_checkpoint_waits_for_its_superstep_s_writes(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph may hand the saver a superstep's checkpoint before the writes that made it:
    the checkpoint waits for them, and both go in one commit. The writes are sent once the
    checkpoint waits, its bound out of their reach: nothing here depends on how fast they
    come."""
    monkeypatch.setattr("loopwright.checkpoints.fenced.WRITES_WAIT_S", PATIENCE_S)
    with open_lease_store(database_url) as leases:
        leases.register("fenced", task="notes", user_id="u-1")
        lease = leases.claim("fenced", "worker-a", ttl_s=60)
    with open_checkpointer(database_url, fence=Fence.of(lease)) as saver:
        parent, commits = _saver_with_a_checkpoint(saver)
        # The writes are sent once the checkpoint waits for them, not after a guessed delay.
        waiting = threading.Event()
        wait_for = saver._arrived.wait_for

        def signalled(*args: Any) -> Any:
            waiting.set()
            return wait_for(*args)

        saver._arrived.wait_for = signalled  # type: ignore[method-assign,assignment]

        def late() -> None:
            waiting.wait()
            saver.put_writes(parent, [("x", "a value")], "task-1")

        sender = threading.Thread(target=late)
        sender.start()
        saver.put(parent, _next(["x"]), {"source": "loop", "step": 1}, {})
        waited = waiting.is_set()
        waiting.set()  # a checkpoint that did not wait leaves the sender waiting no longer
        sender.join()
        saved = saver.get_tuple(parent)
    assert waited, "the checkpoint did not wait for its writes"
    assert commits == [(1, True)], "the writes and the checkpoint in one commit"
    assert saved is not None and [w[1:] for w in saved.pending_writes or ()] == [("x", "a value")]


def test_a_checkpoint_waits_no_longer_than_its_bound(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that never come (or come very late) keep a checkpoint for WRITES_WAIT_S at most
    (the wait it asks for, and what came of it, are recorded: no clock is read); they are
    saved alone when they come."""
    with open_lease_store(database_url) as leases:
        leases.register("fenced", task="notes", user_id="u-1")
        lease = leases.claim("fenced", "worker-a", ttl_s=60)
    with open_checkpointer(database_url, fence=Fence.of(lease)) as saver:
        parent, commits = _saver_with_a_checkpoint(saver)
        waits: list[tuple[float, bool]] = []
        wait_for = saver._arrived.wait_for

        def recorded(predicate: Callable[[], bool], timeout: float) -> bool:
            waits.append((timeout, came := wait_for(predicate, timeout)))
            return came

        monkeypatch.setattr(saver._arrived, "wait_for", recorded)
        saver.put(parent, _next(["y"]), {"source": "loop", "step": 1}, {})
        saver.put_writes(parent, [("y", "too late")], "task-1")
        saved = saver.get_tuple(parent)
    assert waits == [(WRITES_WAIT_S, False)], "one wait, bounded, that the writes never ended"
    assert commits == [(0, True), (1, False)]
    assert saved is not None and [w[1:] for w in saved.pending_writes or ()] == [("y", "too late")]


@pytest.mark.parametrize("layout", list(Layout))
def test_listing_one_checkpoint_by_id_finds_it(database_url: str, layout: Layout) -> None:
    """A checkpoint named by id (with or without its namespace) is listed, whatever row of a
    chain it is: LangGraph's `get_state_history` and time travel list by id."""
    with open_checkpointer(database_url, new_threads=layout) as saver:
        history = run_and_read(saver, "listed")
        config: RunnableConfig = {"configurable": {"thread_id": "listed"}}
        ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]
        for checkpoint_id in ids:
            for conf in ({"thread_id": "listed"}, {"thread_id": "listed", "checkpoint_ns": ""}):
                found = list(saver.list({"configurable": {**conf, "checkpoint_id": checkpoint_id}}))
                assert [t.checkpoint["id"] for t in found] == [checkpoint_id]
    assert len(ids) == len(history) > STEPS


@pytest.mark.postgres
def test_a_checkpoint_saved_again_under_its_id_replaces_its_row(postgres_url: str) -> None:
    """A node commit inserts its row without an upsert (which writes a WAL record more): a
    checkpoint saved again under its id, fenced, still replaces the row, as LangGraph's savers
    replace it, and leaves the thread one row."""
    with open_lease_store(postgres_url) as leases:
        leases.register("again", task="notes", user_id="u-1")
        lease = leases.claim("again", "worker-a", ttl_s=60)
    config: RunnableConfig = {"configurable": {"thread_id": "again", "checkpoint_ns": ""}}
    with open_checkpointer(postgres_url, fence=Fence.of(lease)) as saver:
        checkpoint = empty_checkpoint()
        for n, note in enumerate(("first", "second")):
            version: dict[str, str | int | float] = {"note": f"{n + 1:010}.00000000"}
            values = Checkpoint(
                **{**checkpoint, "channel_values": {"note": note}, "channel_versions": version}
            )
            saver.put(config, values, {"step": 0}, version)
        saved = saver.get_tuple(config)
        rows = saver.db.one("SELECT count(*) AS n FROM lw_checkpoints WHERE thread_id = 'again'")
    assert saved is not None and saved.checkpoint["channel_values"] == {"note": "second"}
    assert rows is not None and rows["n"] == 1
