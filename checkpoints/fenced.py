"""Checkpointers that refuse a stale worker's writes, in the transaction that writes, and commit
a node's writes and the checkpoint after them in one transaction.

`FencedSaver` is what both layouts share: the fence, and the holding of a superstep's writes
until its checkpoint. The savers of LangGraph's own layout are here (`FencedPostgresSaver`,
`FencedSqliteSaver`: the server's runs, and runs begun before the compact layout); the runtime's
compact layout is `checkpoints.compact`, which routes a thread of LangGraph's layout to them.

A fencing check in a separate transaction would leave a gap: the lease could change hands
between the check and the write, and the stale worker's checkpoint would fork the run. So every
durable write of a fenced saver is one transaction on the saver's connection that locks the
run's lw_runs row (shared), checks the fence, and writes langgraph's own rows. A
takeover (`LeaseStore.claim`) needs that row exclusively and therefore waits for the write to
commit; the next write of the stale worker is refused.

One transaction per superstep. LangGraph saves a superstep in two calls: `put_writes` as each
task finishes, then `put` with the checkpoint after the superstep. With `durability="sync"` (the
loop's, `graph.build.RUN_DURABILITY`) the loop waits for that `put` before the next node starts,
so a task's ordinary writes need not be durable before it: they are held in memory and written
in `put`'s transaction, with the checkpoint. A node's commit is then all or nothing: a crash
before its COMMIT loses the whole superstep, which the resumed run executes again from the
previous checkpoint (as after a crash inside the node). Writes are saved at once, alone, where
no `put` follows or where the saver cannot tell that one will: an interrupt's, an error's, a
resume value or an update (`NULL_TASK_ID`), any durability but "sync", and a task's writes that
arrive after the `put` of their superstep. LangGraph hands both calls to its thread pool at
once, and for a quick node the `put` often starts first: so a checkpoint of the loop waits, at
most `WRITES_WAIT_S`, until the writes of every channel it says its superstep updated
(`updated_channels`) are held or saved. A superstep's held writes go with the first write saved
alone, so an interrupted or failed superstep keeps its finished tasks' writes as the stock saver
would.

On Postgres the commit is one statement, in autocommit its own transaction, in one round trip:
it locks and reads the run's row (shared) and writes everything, the writes, the blobs and the
checkpoint, each a multi-row INSERT over binary arrays in a data-modifying CTE guarded by the
fence (judged on the locked row: a stale writer's statement inserts nothing, and is refused when
the row comes back). The rows are the stock saver's (`_dump_writes`, `_dump_blobs`, the stock
split of channel values into inline values and blobs, but a long string in a blob: see
`INLINE_MAX_CHARS`), so every stock reader reads them; the statement is prepared on first use
(`connect_postgres`): the hot path is bind and execute. On SQLite it is one BEGIN IMMEDIATE ...
COMMIT (one fsync) of the fence check and the stock statements, kept from committing on their
own (`cursor`).

The crash point inside the commit (`checkpoint:commit:before_commit:<node>`, see
`core.crashpoints`) is after every statement, before COMMIT: armed on Postgres, the same
statement runs in an explicit transaction and the process dies before its COMMIT.

Channel versions are shorter than the stock savers' (`next_version`: 19 characters, not 52): a
version is written some 40 times a checkpoint, in its channel versions, versions seen and blob
keys. The server's saver (`loopwright.server.checkpointer`) writes the same form.

Everything else of LangGraph's layout (reads, `get_delta_channel_history` for `DeltaChannel`
state, pruning) is the stock saver's, untouched. An attempt at a run writes through
`saver.fenced(Fence.of(lease))`, a copy of the saver checking its own lease's fence
(`loopwright.attempt`); the graph's thread id is the run id. Unfenced, nothing is checked.

Only the sync savers are fenced: their async methods are not implemented by langgraph, so no
write path bypasses the check.
"""

from __future__ import annotations

import copy
import random
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONFIG_KEY_DURABILITY, NULL_TASK_ID
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    SerializerProtocol,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.checkpoint.sqlite import SqliteSaver
from psycopg import postgres
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict

from loopwright.checkpoints.leases import (
    FenceRow,
    Lease,
    RunWatch,
    StaleWriter,
    lock_fence,
    lock_fence_sql,
)
from loopwright.checkpoints.sql import UNFLUSHED_COMMIT, Database
from loopwright.core.crashpoints import armed, crash_point
from loopwright.observability.metrics import FENCE_REFUSALS, NODE_COMMIT_SECONDS

# LangGraph names the durability a graph runs with in its config (CONFIG_KEY_DURABILITY), and
# writes that belong to no task (resume values, updates) are NULL_TASK_ID's.
DEFERRING_DURABILITY = "sync"
# The held writes of this many supersteps, and the last saved superstep of as many (thread,
# namespace) pairs, are remembered: a worker advances many runs with one saver, and runs it
# abandoned must not grow it forever. A superstep's own tasks are never dropped.
REMEMBERED = 256
# How long a checkpoint waits for the writes of its superstep that have not reached the saver
# yet (they are on their way: see `FencedSaver.put`). Past it, the checkpoint is saved and the
# writes go alone when they come.
WRITES_WAIT_S = 0.25

# A string longer than this is stored in a blob, not in the checkpoint's JSON as the stock saver
# stores every primitive: that JSON is written again at every checkpoint, so a task (a customer's
# email pasted in), the run's id and its start time would be stored once per superstep; as a
# blob, once a version. Short ones stay inline: a phase changes at nearly every superstep, and a
# blob row of its own would cost more than its few characters in each checkpoint.
INLINE_MAX_CHARS = 16

WriteKey = tuple[str, str, str]  # thread id, checkpoint namespace, checkpoint id


class Fence(BaseModel):
    """What a fenced saver checks a write against: this owner holds this run at this fence."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    owner: str
    fence: int

    @classmethod
    def of(cls, lease: Lease) -> Fence:
        return cls(run_id=lease.run_id, owner=lease.owner, fence=lease.fence)

    def check(self, db: Database, run_id: str) -> FenceRow:
        """Refuse unless the run is still ours at this fence and the lease is live; the row.

        Call inside the writing transaction: the run's row stays locked until it commits.
        """
        self.check_thread(run_id)
        return self.check_row(run_id, lock_fence(db, run_id))

    def check_thread(self, run_id: str) -> None:
        if run_id != self.run_id:
            raise self._refused(run_id, None, f"the saver is fenced for {self.run_id}")

    def check_row(self, run_id: str, run: FenceRow | None) -> FenceRow:
        """Refuse unless `run`, the run's row as locked by the writing transaction, is ours."""
        if run is None:
            raise self._refused(run_id, None, "the run is not registered")
        if run.fence != self.fence or run.owner != self.owner:
            raise self._refused(run_id, run.fence, f"the run is held by {run.owner}")
        if not run.lease_live:
            raise self._refused(run_id, run.fence, "the lease has expired")
        return run

    def _refused(self, run_id: str, current: int | None, reason: str) -> StaleWriter:
        FENCE_REFUSALS.labels("checkpoint").inc()
        return StaleWriter(run_id, self.fence, current, reason)


@dataclass(frozen=True)
class TaskWrites:
    """One `put_writes` call, kept until it is written."""

    config: RunnableConfig
    writes: Sequence[tuple[str, Any]]
    task_id: str
    task_path: str

    @property
    def key(self) -> WriteKey:
        conf = self.config["configurable"]
        return str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"])

    @property
    def node(self) -> str:
        return self.task_path.rpartition(", ")[2]

    @property
    def deferrable(self) -> bool:
        """Ordinary writes of a task in a graph whose `put` is awaited before the next node."""
        return (
            self.config["configurable"].get(CONFIG_KEY_DURABILITY) == DEFERRING_DURABILITY
            and self.task_id != NULL_TASK_ID
            and not any(channel in WRITES_IDX_MAP for channel, _ in self.writes)
        )


def next_version(current: str | int | None) -> str:
    """The channel version after `current`: a 10-digit counter and a 32-bit random part.

    Versions are compared as strings, so the counter has a fixed width; any version of this
    form sorts after every version of the stock form (a 32-digit counter, which starts with 22
    zeros), so a thread written by the stock savers goes on correctly. The random part keeps a
    rewritten history apart from the old one: blobs are keyed by channel and version, and a
    history rewritten from an earlier checkpoint (a deleted server run, say) reaches the same
    counters again with other values.
    """
    number = 0 if current is None else int(str(current).split(".")[0])
    return f"{number + 1:010}.{random.getrandbits(32):08x}"


def remember[K, V](memory: dict[K, V], key: K, value: V, keep: int = REMEMBERED) -> None:
    """Keep `value` under `key` as the newest entry, forgetting the oldest past `keep`."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > keep:
        memory.pop(next(iter(memory)))


@dataclass(frozen=True)
class Save:
    """One `put` call: the checkpoint a commit saves after its writes."""

    config: RunnableConfig
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions

    @property
    def next_config(self) -> RunnableConfig:
        conf = self.config["configurable"]
        return {
            "configurable": {
                "thread_id": conf["thread_id"],
                "checkpoint_ns": conf["checkpoint_ns"],
                "checkpoint_id": self.checkpoint["id"],
            }
        }


@dataclass(frozen=True)
class Superstep:
    """A checkpoint (of the thread's namespace `checkpoint_ns`: "" for the graph, a subgraph's
    otherwise) and its pending writes, decoded (`FencedSaver.supersteps`): what the superstep
    run from it wrote, as (task id, task path, channel, value)."""

    checkpoint_ns: str
    checkpoint_id: str
    writes: Sequence[tuple[str, str, str, Any]]


def one_chain(links: Sequence[tuple[str, str | None]]) -> bool:
    """Whether (checkpoint id, parent id) pairs given oldest first are one chain from a root,
    with no other branch."""
    parents = [None, *(checkpoint_id for checkpoint_id, _ in links[:-1])]
    return bool(links) and all(
        parent == expected for (_, parent), expected in zip(links, parents, strict=True)
    )


def as_they_ran(supersteps: Iterable[Superstep]) -> list[Superstep]:
    """Supersteps of several namespaces as they ran: LangGraph's checkpoint ids grow with time,
    and a subgraph's checkpoints are made while its node runs in the parent."""
    return sorted(supersteps, key=lambda superstep: superstep.checkpoint_id)


class FencedSaver(BaseCheckpointSaver[str]):
    """The fencing and the holding of writes shared by both backends; mixed in before the
    stock saver class. Each backend commits (`_commit`) in its own way."""

    fence: Fence | None
    # Told what each commit's fence check read of a cancel (the attempt's `RunWatch`, given
    # with `fence`): the run's row is read under lock anyway, so the nodes need not.
    watch: RunWatch | None
    # The stock saver's lock on its connection, re-entrant: the stock statements take it again
    # inside a commit, and the compact saver (`checkpoints.compact`) shares it.
    lock: threading.Lock

    def _init_fencing(self, fence: Fence | None) -> None:
        self.fence = fence
        self.watch = None
        self.rederivable: frozenset[str] = frozenset()
        self._held: dict[WriteKey, dict[str, TaskWrites]] = {}
        self._saved_after: dict[tuple[str, str], str] = {}  # (thread, ns) -> last put's parent
        # Channels of the writes saved alone, by the checkpoint they belong to.
        self._saved_alone: dict[WriteKey, frozenset[str]] = {}
        self._held_lock = threading.Lock()
        self._arrived = threading.Condition(self._held_lock)  # a task's writes were held

    def fenced(
        self,
        fence: Fence,
        watch: RunWatch | None = None,
        *,
        rederivable: frozenset[str] = frozenset(),
    ) -> Self:
        """This saver, for one attempt: writing on the same connection, checking every commit
        against `fence` and telling `watch` what each fence check read. The writes a superstep
        holds are kept by thread, so attempts at different runs share them safely.

        `rederivable`: the nodes whose commits need not reach the disk before the run goes on
        (`Database.transaction`'s `flush`), because running the node again from the commit
        before makes them again and repeats nothing outside the run. Every other commit (an
        unnamed node's, writes saved alone) is flushed."""
        view = copy.copy(self)
        view._fence_with(fence, watch, rederivable)
        return view

    def _fence_with(
        self, fence: Fence, watch: RunWatch | None, rederivable: frozenset[str]
    ) -> None:
        self.fence = fence
        self.watch = watch
        self.rederivable = rederivable

    def _flushes(self, node: str, save: Save | None) -> bool:
        """Whether a commit of `node`'s waits for the disk: all but a rederivable node's
        checkpoint (writes saved alone are an interrupt's, an error's, a resume value)."""
        return save is None or node not in self.rederivable

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        return next_version(current)

    def supersteps(self, thread_id: str) -> list[Superstep] | None:
        """Every checkpoint of a thread, in every namespace (a subgraph's too), in the sequence
        they were made, with what the superstep run from it wrote, decoded, read in one pass: a
        run's timeline wants each task's writes, which `get_state_history` gets by rebuilding
        every checkpoint's values (the delta channels' from the root: quadratic in the run's
        length), one namespace at a time.

        None where a namespace is not one chain (a history forked), the thread holds nothing,
        or writes saved before LangGraph kept their task's path (which names the node): there
        `get_state_history` is the reader."""
        links, writes = self._thread_rows(thread_id)
        chains: dict[str, list[tuple[str, str | None]]] = {}
        for ns, checkpoint_id, parent_id in links:
            chains.setdefault(ns, []).append((checkpoint_id, parent_id))
        pathless = any(not path and task != NULL_TASK_ID for _, _, task, path, *_ in writes)
        if pathless or not chains or not all(map(one_chain, chains.values())):
            return None
        written: dict[tuple[str, str], list[tuple[str, str, str, Any]]] = {}
        for ns, checkpoint_id, task_id, path, channel, kind, blob in writes:
            value = self.serde.loads_typed((kind, blob))
            written.setdefault((ns, checkpoint_id), []).append((task_id, path, channel, value))
        return as_they_ran(
            Superstep(ns, checkpoint_id, written.get((ns, checkpoint_id), []))
            for ns, chain in chains.items()
            for checkpoint_id, _ in chain
        )

    def _thread_rows(self, thread: str) -> tuple[list[Link], list[StockWrite]]:
        """A thread's checkpoints (namespace, id, parent), each namespace's oldest first, and
        their writes, each checkpoint's in the sequence the stock saver hands them over
        (`writes_sort_key`)."""
        raise NotImplementedError

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        parent = conf.get("checkpoint_id")
        key = (thread, ns, str(parent))
        with self._held_lock:
            if (
                conf.get(CONFIG_KEY_DURABILITY) == DEFERRING_DURABILITY
                and metadata.get("source") == "loop"
            ):
                # LangGraph hands a task's writes and the checkpoint after it to its thread
                # pool together, and the checkpoint may come first: wait for the writes of the
                # channels it says the superstep updated, so that they go in its commit.
                updated = frozenset(checkpoint.get("updated_channels") or ())
                self._arrived.wait_for(lambda: updated <= self._written(key), WRITES_WAIT_S)
            held = list(self._held.pop(key, {}).values())
            # Held writes of another checkpoint of this namespace belong to a superstep that
            # was abandoned: they will not be saved.
            for abandoned in [k for k in self._held if k[:2] == (thread, ns)]:
                del self._held[abandoned]
            if parent is not None:
                remember(self._saved_after, (thread, ns), str(parent))
        save = Save(config, checkpoint, metadata, new_versions)
        with NODE_COMMIT_SECONDS.time():
            self._commit(thread, held, save)
        return save.next_config

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        task = TaskWrites(config, list(writes), task_id, task_path)
        thread, ns, checkpoint_id = task.key
        with self._held_lock:
            late = self._saved_after.get((thread, ns)) == checkpoint_id
            if task.deferrable and not late:
                # A task's later writes replace its earlier ones, as in LangGraph's loop.
                superstep = self._held.pop(task.key, {})
                superstep[task_id] = task
                remember(self._held, task.key, superstep)
                self._arrived.notify_all()
                return
            held = [t for t in self._held.pop(task.key, {}).values() if t.task_id != task_id]
            channels = frozenset(c for t in (*held, task) for c, _ in t.writes)
            remember(
                self._saved_alone, task.key, self._saved_alone.get(task.key, frozenset()) | channels
            )
        self._commit(thread, [*held, task], None)
        # The window between writes saved alone and the checkpoint that may follow them.
        crash_point(f"checkpoint:after_writes:{task.node}")

    def _written(self, key: WriteKey) -> frozenset[str]:
        """The channels written so far in the superstep after checkpoint `key`: held, or saved
        alone (call holding `_held_lock`)."""
        held = (c for task in self._held.get(key, {}).values() for c, _ in task.writes)
        return self._saved_alone.get(key, frozenset()).union(held)

    def _commit(self, thread: str, tasks: Sequence[TaskWrites], save: Save | None) -> None:
        """Write `tasks`' writes and then `save`'s checkpoint (if any), in one transaction with
        the fence check."""
        raise NotImplementedError

    def _seen(self, run: FenceRow) -> None:
        watch = self.watch
        if watch is not None:
            watch.seen(run.cancel_requested)


# A commit's statement: the run's row locked and read, and the rows of the commit, each table's
# as arrays (one multi-row INSERT each), written only if the run is still this writer's at its
# fence (`ours`, judged on the locked row). Ordinary writes keep the first value saved for a
# (task, idx), as the stock INSERT does; the writes of a task that are all special channels
# (interrupts, errors, resume values) replace it, as the stock UPSERT does.
_COMMIT_SQL = """
WITH run AS ({run}), ours AS ({ours}), kept AS (
    INSERT INTO checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(thread)s::text, %(ns)s::text, NULLIF(%(parent)s::text, ''), w.* FROM ours, unnest(
        %(k_task)b::text[], %(k_path)b::text[], %(k_idx)b::int[], %(k_channel)b::text[],
        %(k_type)b::text[], %(k_blob)b::bytea[]) AS w
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
), replaced AS (
    INSERT INTO checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(thread)s::text, %(ns)s::text, NULLIF(%(parent)s::text, ''), w.* FROM ours, unnest(
        %(r_task)b::text[], %(r_path)b::text[], %(r_idx)b::int[], %(r_channel)b::text[],
        %(r_type)b::text[], %(r_blob)b::bytea[]) AS w
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
), blobs AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(thread)s::text, %(ns)s::text, b.* FROM ours, unnest(
        %(b_channel)b::text[], %(b_version)b::text[], %(b_type)b::text[], %(b_blob)b::bytea[]) AS b
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING
), saved AS (
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    SELECT %(thread)s::text, %(ns)s::text, %(id)s::text, NULLIF(%(parent)s::text, ''),
           %(checkpoint)s::jsonb, %(metadata)s::jsonb
      FROM ours WHERE %(id)s::text <> ''
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
    DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
)
SELECT * FROM run
"""
# Fenced, the run's row is locked shared (a takeover waits for the commit) and the rows are ours
# while it names this writer at its fence with a live lease. Unfenced, there is no row to read
# (the database may have no lw_runs table) and the rows are always ours.
OURS_FENCED = (
    "SELECT 1 FROM run WHERE fence = %(fence)s::bigint AND owner = %(owner)s::text AND lease_live"
)
# The same, for a commit that need not wait for the disk (`FencedSaver.fenced`'s `rederivable`):
# the setting is made in the statement's transaction, once the rows are known to be ours.
OURS_FENCED_UNFLUSHED = f"{OURS_FENCED} AND {UNFLUSHED_COMMIT} IS NOT NULL"
_COMMIT_UNFENCED = _COMMIT_SQL.format(run="SELECT NULL WHERE FALSE", ours="SELECT 1")
# A thread's checkpoints and their writes in LangGraph's layout (`supersteps`), each write in
# the sequence the stock saver hands them over (`writes_sort_key`).
_STOCK_LINKS = (
    "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id FROM checkpoints"
    " WHERE thread_id = %s ORDER BY checkpoint_ns, checkpoint_id"
)
_STOCK_WRITES = (
    "SELECT checkpoint_ns, checkpoint_id, task_id, task_path, channel, type, {value}"
    " FROM {table} WHERE thread_id = %s"
    " ORDER BY checkpoint_ns, checkpoint_id, task_path, task_id, idx"
)
_PG_WRITES = _STOCK_WRITES.format(table="checkpoint_writes", value="blob")
_SQLITE_LINKS = _STOCK_LINKS.replace("%s", "?")
_SQLITE_WRITES = _STOCK_WRITES.format(table="writes", value="value").replace("%s", "?")
Link = tuple[str, str, str | None]  # a checkpoint's namespace, its id, its parent's
# A write's checkpoint (namespace, id), task (id, path), channel and value (type, bytes).
StockWrite = tuple[str, str, str, str, str, str, bytes]
WRITE_COLUMNS = ("task", "path", "idx", "channel", "type", "blob")
_BLOB_COLUMNS = ("channel", "version", "type", "blob")


class FencedPostgresSaver(FencedSaver, PostgresSaver):
    """`PostgresSaver` with fencing and a commit in one statement."""

    def __init__(
        self,
        conn: psycopg.Connection[DictRow],
        *,
        fence: Fence | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self.lock = threading.RLock()  # type: ignore[assignment]  # the Lock interface, re-entrant
        self._init_fencing(fence)
        self._pg = conn
        # (thread, ns) -> the version of each string channel whose blob this saver's commits
        # stored (`_rows`).
        self._strings: dict[tuple[str, str], dict[str, str]] = {}
        register_column_arrays(conn)
        lock = Database(conn).spell(lock_fence_sql(run_id="%(thread)s::text"))
        self._commit_fenced = {
            flush: _COMMIT_SQL.format(
                run=lock, ours=OURS_FENCED if flush else OURS_FENCED_UNFLUSHED
            )
            for flush in (True, False)
        }

    def _commit(self, thread: str, tasks: Sequence[TaskWrites], save: Save | None) -> None:
        fence = self.fence
        if fence is not None:
            fence.check_thread(thread)
        params, strings = self._rows(thread, tasks, save)
        if fence is not None:
            params |= {"fence": fence.fence, "owner": fence.owner}
        node = tasks[0].node if tasks else ""
        statement = (
            self._commit_fenced[self._flushes(node, save)]
            if fence is not None
            else _COMMIT_UNFENCED
        )
        point = f"checkpoint:commit:before_commit:{node}"
        with self.lock, self._pg.cursor(binary=True, row_factory=dict_row) as cursor:
            if point in armed():
                # The same statement in an explicit transaction, held open at the point (where
                # a crash test's process dies): what a crash at any moment of the commit leaves.
                with self._pg.transaction():
                    cursor.execute(statement, params)
                    crash_point(point)
            else:
                cursor.execute(statement, params)  # autocommit: its own transaction
            row = cursor.fetchone()
        if fence is not None:
            # Refused here, the statement inserted nothing: it was guarded by the same row.
            self._seen(fence.check_row(thread, FenceRow.of(row) if row else None))
        if save is not None:
            remember(self._strings, (thread, str(params["ns"])), strings)

    def _thread_rows(self, thread: str) -> tuple[list[Link], list[StockWrite]]:
        with self.lock, self._pg.cursor(binary=True, row_factory=tuple_row) as cursor:
            links = cast(list[Link], cursor.execute(_STOCK_LINKS, (thread,)).fetchall())
            writes = cast(list[StockWrite], cursor.execute(_PG_WRITES, (thread,)).fetchall())
        return links, writes

    def _rows(
        self, thread: str, tasks: Sequence[TaskWrites], save: Save | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The commit's parameters: its writes, blobs and checkpoint as the stock saver lays
        them out (`put_writes` and `put`); and the versions of the checkpoint's string blobs. No
        parameter is ever None, whose type psycopg leaves unknown (see `_ColumnArray`): an
        absent id is '' (NULL again in the statement), an absent checkpoint an empty JSON
        object."""
        ns = str((save.config if save else tasks[0].config)["configurable"]["checkpoint_ns"])
        params: dict[str, Any] = {"thread": thread, "ns": ns, "parent": "", "id": ""}
        kept: list[tuple[Any, ...]] = []
        replaced: list[tuple[Any, ...]] = []
        for task in tasks:
            rows = self._dump_writes(
                thread, ns, task.key[2], task.task_id, task.task_path, task.writes
            )
            replaces = all(channel in WRITES_IDX_MAP for channel, _ in task.writes)
            (replaced if replaces else kept).extend(row[3:] for row in rows)
            params["parent"] = task.key[2]
        params |= column_arrays("k", WRITE_COLUMNS, kept) | column_arrays(
            "r", WRITE_COLUMNS, replaced
        )
        blobs: list[tuple[Any, ...]] = []
        strings: dict[str, str] = {}
        params |= {"checkpoint": Jsonb({}), "metadata": Jsonb({})}
        if save is not None:
            inline, stored = _split_values(save.checkpoint)
            versions = {k: v for k, v in save.new_versions.items() if k in stored}
            # A long string's blob goes with a checkpoint that holds it, new or not, unless
            # this saver stored it: a thread written by a stock saver (or an earlier release)
            # kept it inline under its current version, so no blob of it need exist. Where one
            # does, the INSERT keeps it.
            current = save.checkpoint["channel_versions"]
            strings = {k: str(current[k]) for k, v in stored.items() if isinstance(v, str)}
            known = self._strings.get((thread, ns), {})
            versions |= {k: v for k, v in strings.items() if known.get(k) != v}
            # A version may be an int (ChannelVersions allows it; the stock saver's own statement
            # lets Postgres cast it): the blob's version column is text, sent as a text array.
            blobs = [
                (channel, str(version), *rest)
                for _, _, channel, version, *rest in self._dump_blobs(thread, ns, stored, versions)
            ]
            params |= {
                "parent": save.config["configurable"].get("checkpoint_id") or "",
                "id": save.checkpoint["id"],
                "checkpoint": Jsonb({**save.checkpoint, "channel_values": inline}),
                "metadata": Jsonb(get_serializable_checkpoint_metadata(save.config, save.metadata)),
            }
        return params | column_arrays("b", _BLOB_COLUMNS, blobs), strings


def column_arrays(
    prefix: str, names: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> dict[str, Any]:
    """Rows as one array parameter per column, named `<prefix>_<column>` (empty for no rows),
    each of its column's type (see `_ColumnArray`)."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return {
        f"{prefix}_{name}": _COLUMN_TYPES.get(name, _ColumnArray)(col)
        for name, col in zip(names, columns, strict=True)
    }


class _ColumnArray(list[Any]):
    """A column's values, sent as an array of the column's type whatever they are: psycopg sends
    an empty list untyped and a list of small ints as smallint[], and each spelling of the
    parameter types is the statement prepared anew (~1 ms on a run's connection). Text, unless
    a subclass says otherwise."""

    type_name = "text"


class _IntArray(_ColumnArray):
    type_name = "int4"


class _BytesArray(_ColumnArray):
    type_name = "bytea"


_COLUMN_TYPES: dict[str, type[_ColumnArray]] = {"idx": _IntArray, "blob": _BytesArray}


def _array_dumper(kind: type[_ColumnArray]) -> type[ListBinaryDumper]:
    info = postgres.types[kind.type_name]
    attributes = {"oid": info.array_oid, "element_oid": info.oid}
    return type(f"{kind.__name__}Dumper", (ListBinaryDumper,), attributes)


_COLUMN_DUMPERS = {kind: _array_dumper(kind) for kind in (_ColumnArray, _IntArray, _BytesArray)}


def register_column_arrays(conn: psycopg.Connection[Any]) -> None:
    """Dump each `_ColumnArray` kind as its fixed array type, on `conn` only."""
    for kind, dumper in _COLUMN_DUMPERS.items():
        conn.adapters.register_dumper(kind, dumper)


def _split_values(checkpoint: Checkpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's channel values as the stock Postgres saver stores them, primitives inline
    in the checkpoint's JSON and the rest in blobs (a delta channel's snapshot marked inline),
    except that a long string goes to a blob (`INLINE_MAX_CHARS`), as does one holding a NUL
    character, which JSONB cannot hold. Stock readers read either."""
    inline: dict[str, Any] = {}
    stored: dict[str, Any] = {}
    for channel, value in checkpoint["channel_values"].items():
        if isinstance(value, _DeltaSnapshot):
            stored[channel] = value
            inline[channel] = True
        elif isinstance(value, str) and (len(value) > INLINE_MAX_CHARS or "\x00" in value):
            stored[channel] = value  # long, or holding a NUL, which JSONB cannot
        elif value is None or isinstance(value, (str, int, float, bool)):
            inline[channel] = value
        else:
            stored[channel] = value
    return inline, stored


class FencedSqliteSaver(FencedSaver, SqliteSaver):
    """`SqliteSaver` with fencing and a commit in one BEGIN IMMEDIATE transaction of the stock
    statements."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        fence: Fence | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_fencing(fence)
        # The stock saver takes its lock around each statement batch, and so again inside our
        # commit, which must hold the connection throughout: make it re-entrant.
        rlock = threading.RLock()
        self.lock = rlock  # type: ignore[assignment]  # an RLock has the Lock interface
        self._fence_db = Database(conn, lock=rlock)
        self._committer: int | None = None  # the thread whose commit is open
        # SqliteSaver sets its tables up lazily with executescript, which commits whatever
        # transaction is open; doing it now keeps that from ever ending a commit.
        self.setup()

    def _commit(self, thread: str, tasks: Sequence[TaskWrites], save: Save | None) -> None:
        node = tasks[0].node if tasks else ""
        with self._fence_db.transaction(flush=self._flushes(node, save)):
            if self.fence is not None:
                self._seen(self.fence.check(self._fence_db, thread))
            self._committer = threading.get_ident()
            try:
                for task in tasks:
                    SqliteSaver.put_writes(
                        self, task.config, task.writes, task.task_id, task.task_path
                    )
                if save is not None:
                    SqliteSaver.put(
                        self, save.config, save.checkpoint, save.metadata, save.new_versions
                    )
            finally:
                self._committer = None
            crash_point(f"checkpoint:commit:before_commit:{node}")

    def _thread_rows(self, thread: str) -> tuple[list[Link], list[StockWrite]]:
        with self.cursor(transaction=False) as cursor:
            links = cursor.execute(_SQLITE_LINKS, (thread,)).fetchall()
            writes = cursor.execute(_SQLITE_WRITES, (thread,)).fetchall()
        return links, writes

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """The stock saver's cursor; inside a commit its statements do not commit on their own."""
        inside = self._committer == threading.get_ident()
        with self.lock, super().cursor(transaction=transaction and not inside) as cur:
            yield cur
