"""The LangGraph server's checkpointer: langgraph's async Postgres saver, fenced by run leases.

langgraph.json names `checkpointer` (an async context manager) as the server's persistence. The
server reads every thread's state through it, and writes through it only outside loopwright's
own runs: a state update, a thread copy, the deletion of a rolled-back run's checkpoints. Runs
themselves are advanced by `server.graph.ServedGraph`, under a run lease, with the sync fenced
saver of `checkpoints.fenced`.

So the fence here is the other half of "one writer per run": a write that carries no lease is
refused while somebody holds the run's lease, in the transaction that would write (the run's
lw_runs row is locked shared, as the sync fenced savers do; a lease claim locks it exclusively
and so waits for the write to commit). Reads are the stock saver's.

The server also asks for `adelete_for_runs` (multitask strategy "rollback") and `acopy_thread`
(POST /threads/{id}/copy); both are implemented in SQL over langgraph's own tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow

from loopwright.checkpoints.database import aconnect_postgres
from loopwright.checkpoints.fenced import next_version
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import StaleWriter, open_lease_store
from loopwright.server.resources import server_database_url

_JOURNALED = "SELECT 1 FROM lw_actions WHERE run_id = ANY(%s) LIMIT 1"
_LIVE_LEASES = (
    "SELECT run_id, owner FROM lw_runs WHERE run_id = ANY(%s)"
    " AND owner IS NOT NULL AND lease_expires_at > now() FOR SHARE"
)


class _ReentrantLock:
    """An asyncio lock the task that holds it may take again.

    The stock saver takes its lock around each statement batch; the fenced write takes it
    first, around the whole transaction, so the stock code must be able to take it again.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None
        self._depth = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if self._owner is not task or task is None:
            await self._lock.acquire()
            self._owner = task
        self._depth += 1

    async def __aexit__(self, *_exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()


class FencedAsyncPostgresSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` whose writes are refused while a run's lease is held."""

    conn: AsyncConnection[DictRow]

    def __init__(self, conn: AsyncConnection[DictRow]) -> None:
        super().__init__(conn)
        self.lock = _ReentrantLock()  # type: ignore[assignment]  # same interface

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        return next_version(current)  # the form the run's own saver writes

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        async with self._unleased([str(config["configurable"]["thread_id"])]):
            return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        async with self._unleased([str(config["configurable"]["thread_id"])]):
            await super().aput_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        async with self._unleased([str(thread_id)]):
            await self._refuse_if_journaled([str(thread_id)])
            await super().adelete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Iterable[str]) -> None:
        """Delete the checkpoints (and their writes) that the given server runs wrote."""
        ids = [str(run_id) for run_id in run_ids]
        async with self.lock:
            rows = await self._fetch(
                "SELECT DISTINCT thread_id FROM checkpoints WHERE metadata->>'run_id' = ANY(%s)",
                (ids,),
            )
        async with self._unleased([row["thread_id"] for row in rows]):
            await self._refuse_if_journaled([row["thread_id"] for row in rows])
            await self.conn.execute(
                "DELETE FROM checkpoint_writes w USING checkpoints c"
                " WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns"
                " AND w.checkpoint_id = c.checkpoint_id AND c.metadata->>'run_id' = ANY(%s)",
                (ids,),
            )
            await self.conn.execute(
                "DELETE FROM checkpoints WHERE metadata->>'run_id' = ANY(%s)", (ids,)
            )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread to another, in one transaction."""
        source, target = str(source_thread_id), str(target_thread_id)
        async with self._unleased([target]):
            await self.conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id,"
                " parent_checkpoint_id, type, checkpoint, metadata)"
                " SELECT %s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,"
                " CASE WHEN metadata ? 'thread_id'"
                " THEN jsonb_set(metadata, '{thread_id}', to_jsonb(%s::text)) ELSE metadata END"
                " FROM checkpoints WHERE thread_id = %s",
                (target, target, source),
            )
            await self.conn.execute(
                "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type,"
                " blob) SELECT %s, checkpoint_ns, channel, version, type, blob"
                " FROM checkpoint_blobs WHERE thread_id = %s",
                (target, source),
            )
            await self.conn.execute(
                "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id,"
                " idx, channel, type, blob, task_path) SELECT %s, checkpoint_ns, checkpoint_id,"
                " task_id, idx, channel, type, blob, task_path"
                " FROM checkpoint_writes WHERE thread_id = %s",
                (target, source),
            )

    @asynccontextmanager
    async def _unleased(self, thread_ids: list[str]) -> AsyncIterator[None]:
        """A transaction that first makes sure no run lease is live on these threads."""
        async with self.lock, self.conn.transaction():
            if thread_ids:
                held = await self._fetch(_LIVE_LEASES, (thread_ids,))
                if held:
                    run = held[0]
                    raise StaleWriter(
                        run["run_id"], 0, None, f"the run is being advanced by {run['owner']}"
                    )
            yield

    async def _refuse_if_journaled(self, thread_ids: list[str]) -> None:
        """Nothing deletes the checkpoints of a run with journaled actions (a rollback, a
        thread or run deletion), whichever route asked: its record is what was done."""
        if thread_ids and await self._fetch(_JOURNALED, (thread_ids,)):
            raise PermissionError("a run with journaled actions keeps its checkpoints")

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[DictRow]:
        async with self.conn.cursor() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()


def _create_runtime_tables(url: str) -> None:
    """lw_runs (checked by every write here) and the journal, created if missing."""
    with open_lease_store(url), open_journal(url):
        pass


@asynccontextmanager
async def checkpointer() -> AsyncIterator[FencedAsyncPostgresSaver]:
    """The server's checkpointer on DATABASE_URL (langgraph.json `checkpointer.path`)."""
    url = server_database_url()
    await asyncio.to_thread(_create_runtime_tables, url)
    async with await aconnect_postgres(url) as conn:
        saver = FencedAsyncPostgresSaver(conn)
        await saver.setup()
        yield saver
