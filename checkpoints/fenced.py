"""Checkpointers that refuse a stale worker's writes, in the transaction that writes.

A fencing check in a separate transaction would leave a gap: the lease could change hands
between the check and the write, and the stale worker's checkpoint would fork the run. So the
fenced savers subclass langgraph's own savers and run each `put` / `put_writes` inside one
transaction on the saver's connection that first locks the run's lw_runs row and checks the
fence, then performs the stock write. A takeover (`LeaseStore.claim`) needs that row exclusively
and therefore waits for the write to commit; the next write of the stale worker is refused.

Everything else (reads, `get_delta_channel_history` for `DeltaChannel` state, pruning) is the
stock saver's, untouched. With `fence=None` a fenced saver is exactly the stock saver. The
worker sets `saver.fence = Fence.of(lease)` after it claims a run; the graph's thread id is the
run id.

Only the sync savers are fenced: their async methods are not implemented by langgraph, so no
write path bypasses the check.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    SerializerProtocol,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from psycopg.rows import DictRow
from pydantic import BaseModel, ConfigDict

from loopwright.checkpoints.leases import Lease, StaleWriter, lock_run
from loopwright.checkpoints.sql import Database
from loopwright.graph.crashpoints import crash_point


class Fence(BaseModel):
    """What a fenced saver checks a write against: this owner holds this run at this fence."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    owner: str
    fence: int

    @classmethod
    def of(cls, lease: Lease) -> Fence:
        return cls(run_id=lease.run_id, owner=lease.owner, fence=lease.fence)

    def check(self, db: Database, run_id: str) -> None:
        """Refuse unless the run is still ours at this fence and the lease is live.

        Call inside the writing transaction: the run's row stays locked until it commits.
        """
        if run_id != self.run_id:
            raise StaleWriter(run_id, self.fence, None, f"the saver is fenced for {self.run_id}")
        run = lock_run(db, run_id)
        if run is None:
            raise StaleWriter(run_id, self.fence, None, "the run is not registered")
        if run.fence != self.fence or run.owner != self.owner:
            raise StaleWriter(run_id, self.fence, run.fence, f"the run is held by {run.owner}")
        if not run.lease_live:
            raise StaleWriter(run_id, self.fence, run.fence, "the lease has expired")


class FencedSaver(BaseCheckpointSaver[str]):
    """The fencing shared by both backends; mixed in before the stock saver class."""

    fence: Fence | None
    lock: threading.Lock  # the stock saver's lock on its connection
    _fence_db: Database

    def _init_fencing(
        self, conn: psycopg.Connection[DictRow] | sqlite3.Connection, fence: Fence | None
    ) -> None:
        # The stock saver takes its lock around each statement batch, and so again inside our
        # fencing transaction, which must hold the connection throughout: make it re-entrant.
        rlock = threading.RLock()
        self.lock = rlock  # type: ignore[assignment]  # an RLock has the Lock interface
        self.fence = fence
        self._fence_db = Database(conn, lock=rlock)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        with self._fenced(config):
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        with self._fenced(config):
            super().put_writes(config, writes, task_id, task_path)
        # The window between a node's saved writes and the checkpoint that would follow them.
        crash_point(f"checkpoint:after_writes:{task_path.rpartition(', ')[2]}")

    @contextmanager
    def _fenced(self, config: RunnableConfig) -> Iterator[None]:
        fence = self.fence
        if fence is None:
            yield
            return
        with self._fence_db.transaction():
            fence.check(self._fence_db, str(config["configurable"]["thread_id"]))
            yield


class FencedPostgresSaver(FencedSaver, PostgresSaver):
    """`PostgresSaver` with fencing. Its pipelined statements join the fencing transaction."""

    def __init__(
        self,
        conn: psycopg.Connection[DictRow],
        *,
        fence: Fence | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(conn, serde=serde)
        self._init_fencing(conn, fence)


class FencedSqliteSaver(FencedSaver, SqliteSaver):
    """`SqliteSaver` with fencing. Its statements run inside the fencing BEGIN IMMEDIATE."""

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
        # transaction is open; doing it now keeps that from ever ending a fencing transaction.
        self.setup()
