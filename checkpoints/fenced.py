"""Checkpointers that refuse a stale worker's writes, in the transaction that writes, and commit
a node's writes and the checkpoint after them in one transaction.

A fencing check in a separate transaction would leave a gap: the lease could change hands
between the check and the write, and the stale worker's checkpoint would fork the run. So every
durable write of a fenced saver is one transaction on the saver's connection that locks the
run's lw_runs row (shared), checks the fence, and writes with langgraph's own statements. A
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
arrive after the `put` of their superstep (LangGraph submits both calls to a thread pool). A
superstep's held writes go with the first of these, so an interrupted or failed superstep keeps
its finished tasks' writes as the stock saver would.

On Postgres the commit is two round trips: BEGIN, the fence row's lock, the writes, the blobs and
the checkpoint go out in one pipeline; the fence is judged on the locked row when it comes back
with their results, and only then is COMMIT sent (or ROLLBACK for a stale writer). Statements
are prepared on first use (`connect_postgres`), so the hot path is bind and execute. The stock
statements run on the commit's cursor (`_cursor`), not in pipelines of their own, each of which
would sync. On SQLite it is one BEGIN IMMEDIATE ... COMMIT (one fsync), the stock statements
kept from committing on their own (`cursor`).

Crash points inside the commit (`checkpoint:commit:<stage>:<node>`, see `graph.crashpoints`):
after the fence row's lock, after the writes, and after every statement (fence checked) before
COMMIT. On Postgres an armed point first syncs the pipeline, so the server has executed the
statements before the process dies.

Everything else (reads, `get_delta_channel_history` for `DeltaChannel` state, pruning) is the
stock saver's, untouched. The worker sets `saver.fence = Fence.of(lease)` after it claims a run;
the graph's thread id is the run id. With `fence=None` nothing is checked.

Only the sync savers are fenced: their async methods are not implemented by langgraph, so no
write path bypasses the check.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

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
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from pydantic import BaseModel, ConfigDict

from loopwright.checkpoints.leases import (
    Lease,
    RunRecord,
    RunWatch,
    StaleWriter,
    lock_run,
    lock_run_sql,
)
from loopwright.checkpoints.sql import Database
from loopwright.graph.crashpoints import armed, crash_point

# LangGraph names the durability a graph runs with in its config (CONFIG_KEY_DURABILITY), and
# writes that belong to no task (resume values, updates) are NULL_TASK_ID's.
DEFERRING_DURABILITY = "sync"
# The held writes of this many supersteps, and the last saved superstep of as many (thread,
# namespace) pairs, are remembered: a worker advances many runs with one saver, and runs it
# abandoned must not grow it forever. A superstep's own tasks are never dropped.
REMEMBERED = 256

Point = Callable[[str], None]
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

    def check(self, db: Database, run_id: str) -> RunRecord:
        """Refuse unless the run is still ours at this fence and the lease is live; the row.

        Call inside the writing transaction: the run's row stays locked until it commits.
        """
        self.check_thread(run_id)
        return self.check_row(run_id, lock_run(db, run_id))

    def check_thread(self, run_id: str) -> None:
        if run_id != self.run_id:
            raise StaleWriter(run_id, self.fence, None, f"the saver is fenced for {self.run_id}")

    def check_row(self, run_id: str, run: RunRecord | None) -> RunRecord:
        """Refuse unless `run`, the run's row as locked by the writing transaction, is ours."""
        if run is None:
            raise StaleWriter(run_id, self.fence, None, "the run is not registered")
        if run.fence != self.fence or run.owner != self.owner:
            raise StaleWriter(run_id, self.fence, run.fence, f"the run is held by {run.owner}")
        if not run.lease_live:
            raise StaleWriter(run_id, self.fence, run.fence, "the lease has expired")
        return run


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


def _remember[K, V](memory: dict[K, V], key: K, value: V) -> None:
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > REMEMBERED:
        memory.pop(next(iter(memory)))


class FencedSaver(BaseCheckpointSaver[str]):
    """The fencing and the one-transaction commit shared by both backends; mixed in before the
    stock saver class."""

    fence: Fence | None
    # Told what each commit's fence check read of a cancel (the attempt's `RunWatch`, set and
    # cleared with `fence`): the run's row is read under lock anyway, so the nodes need not.
    watch: RunWatch | None
    lock: threading.Lock  # the stock saver's lock on its connection
    _fence_db: Database
    # The backend's transaction around a commit, the fence checked in it: (thread, node) ->
    # a context that yields the commit's crash points.
    _transaction: Callable[[str, str], AbstractContextManager[Point]]

    def _init_fencing(
        self, conn: psycopg.Connection[DictRow] | sqlite3.Connection, fence: Fence | None
    ) -> None:
        # The stock saver takes its lock around each statement batch, and so again inside our
        # commit, which must hold the connection throughout: make it re-entrant.
        rlock = threading.RLock()
        self.lock = rlock  # type: ignore[assignment]  # an RLock has the Lock interface
        self.fence = fence
        self.watch = None
        self._fence_db = Database(conn, lock=rlock)
        self._held: dict[WriteKey, dict[str, TaskWrites]] = {}
        self._saved_after: dict[tuple[str, str], str] = {}  # (thread, ns) -> last put's parent
        self._held_lock = threading.Lock()
        self._committer: int | None = None  # the thread whose commit is open

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
        with self._held_lock:
            held = list(self._held.pop((thread, ns, str(parent)), {}).values())
            # Held writes of another checkpoint of this namespace belong to a superstep that
            # was abandoned: they will not be saved.
            for key in [k for k in self._held if k[:2] == (thread, ns)]:
                del self._held[key]
            if parent is not None:
                _remember(self._saved_after, (thread, ns), str(parent))

        def save() -> RunnableConfig:
            return super(FencedSaver, self).put(config, checkpoint, metadata, new_versions)

        saved = self._commit(thread, held, save)
        assert saved is not None
        return saved

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
                _remember(self._held, task.key, superstep)
                return
            held = [t for t in self._held.pop(task.key, {}).values() if t.task_id != task_id]
        self._commit(thread, [*held, task], None)
        # The window between writes saved alone and the checkpoint that may follow them.
        crash_point(f"checkpoint:after_writes:{task.node}")

    def _commit(
        self, thread: str, tasks: Sequence[TaskWrites], save: Callable[[], RunnableConfig] | None
    ) -> RunnableConfig | None:
        """Write `tasks`' writes and then `save()` the checkpoint (if any), in one transaction
        with the fence check."""
        node = tasks[0].node if tasks else ""
        with self._transaction(thread, node) as point:
            self._committer = threading.get_ident()
            try:
                for task in tasks:
                    super().put_writes(task.config, task.writes, task.task_id, task.task_path)
                point(f"checkpoint:commit:after_writes:{node}")
                return save() if save is not None else None
            finally:
                self._committer = None

    def _in_commit(self) -> bool:
        return self._committer == threading.get_ident()

    def _seen(self, run: RunRecord) -> None:
        watch = self.watch
        if watch is not None:
            watch.seen(run.cancel_requested_at is not None)


class FencedPostgresSaver(FencedSaver, PostgresSaver):
    """`PostgresSaver` with fencing and a commit in one pipelined transaction."""

    def __init__(
        self,
        conn: psycopg.Connection[DictRow],
        *,
        fence: Fence | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_fencing(conn, fence)
        self._pg = conn
        self._lock_sql = self._fence_db.spell(lock_run_sql())
        self._commit_cursor: psycopg.Cursor[DictRow] | None = None

    @contextmanager
    def _transaction(self, thread: str, node: str) -> Iterator[Point]:
        # BEGIN and COMMIT are sent as statements of the pipeline: psycopg's transaction()
        # would sync the pipeline on entering and on leaving, a round trip each.
        fence = self.fence
        if fence is not None:
            fence.check_thread(thread)
        with (
            self.lock,
            self._pg.pipeline() as pipeline,
            self._pg.cursor(row_factory=dict_row) as fence_cursor,
            self._pg.cursor(binary=True, row_factory=dict_row) as cursor,
        ):

            def point(name: str) -> None:
                if name in armed():
                    pipeline.sync()  # the statements so far executed, uncommitted
                    crash_point(name)

            self._pg.execute("BEGIN")
            try:
                if fence is not None:
                    fence_cursor.execute(self._lock_sql, (thread,))
                point(f"checkpoint:commit:after_fence:{node}")
                self._commit_cursor = cursor
                try:
                    yield point
                finally:
                    self._commit_cursor = None
                if fence is not None:
                    row = fence_cursor.fetchone()  # the first round trip: everything so far
                    self._seen(
                        fence.check_row(thread, RunRecord.model_validate(row) if row else None)
                    )
                point(f"checkpoint:commit:before_commit:{node}")
                self._pg.execute("COMMIT")
            except BaseException:
                self._roll_back(pipeline)
                raise
        # Leaving the pipeline syncs it: COMMIT's round trip, the second.

    def _roll_back(self, pipeline: psycopg.Pipeline) -> None:
        """End a refused or failed commit's transaction. The server skips a pipeline's
        statements after an error until its sync, so sync first, then roll back."""
        with contextlib.suppress(psycopg.Error):
            pipeline.sync()
            if self._pg.info.transaction_status is not TransactionStatus.IDLE:
                self._pg.execute("ROLLBACK")
                pipeline.sync()

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor[DictRow]]:
        """The stock saver's statements: on the commit's cursor inside a commit (no pipeline
        of their own, which would sync), else as the stock saver runs them."""
        with self.lock:
            if self._in_commit() and self._commit_cursor is not None:
                yield self._commit_cursor
            else:
                with super()._cursor(pipeline=pipeline) as cursor:
                    yield cursor


class FencedSqliteSaver(FencedSaver, SqliteSaver):
    """`SqliteSaver` with fencing and a commit in one BEGIN IMMEDIATE transaction."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        fence: Fence | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_fencing(conn, fence)
        # SqliteSaver sets its tables up lazily with executescript, which commits whatever
        # transaction is open; doing it now keeps that from ever ending a commit.
        self.setup()

    @contextmanager
    def _transaction(self, thread: str, node: str) -> Iterator[Point]:
        with self._fence_db.transaction():
            if self.fence is not None:
                self._seen(self.fence.check(self._fence_db, thread))
            crash_point(f"checkpoint:commit:after_fence:{node}")
            yield crash_point
            crash_point(f"checkpoint:commit:before_commit:{node}")

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """The stock saver's cursor; inside a commit its statements do not commit on their own."""
        with self.lock, super().cursor(transaction=transaction and not self._in_commit()) as cur:
            yield cur
