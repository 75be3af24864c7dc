"""The runtime's checkpointer: LangGraph's saver interface over the compact layout.

A checkpoint is one row of `lw_checkpoints` (`checkpoints.frames`: what changed since its
parent, and the writes of the superstep that made it), so a node's commit is one row, written
with the fence check in one statement on Postgres and one BEGIN IMMEDIATE transaction on SQLite:
the holding of a superstep's writes until its checkpoint, the fence and the crash point inside
the commit are `checkpoints.fenced`'s, as for LangGraph's own layout. Writes that are saved
without a checkpoint after them (an interrupt's, an error's, a resume value) go to
`lw_checkpoint_writes`, as LangGraph's savers keep them.

Reading a checkpoint rebuilds it from its nearest keyframe on: one recursive query walks the
parent links back to it (at most `frames.KEY_EVERY` rows). A checkpoint's pending writes are
those saved alone at it and those its children's rows carry. A DeltaChannel's history (the
writes of every ancestor since its last snapshot) is read from the rows back to the root.

A writer remembers the last checkpoint of each thread it wrote or read (`Frame.as_parent`): the
next row is a delta on it. A parent it does not remember (another process wrote it, or a
history was forked from an older checkpoint that was not read first) gets a keyframe, which
needs none. It also keeps the last few chains it read back to their roots (`KEPT_CHAINS`):
rows never change once written, and a run's history asks for every checkpoint of one chain.

Threads that LangGraph's own layout holds (the server's runs, which its stock readers read;
runs begun before this layout) are read and written in that layout, by `legacy`, the fenced
stock saver on the same connection: a thread is in one layout for all its life, and a new one
begins in the saver's `new_threads` (the server's graph: LangGraph's; the runtime's: compact).
"""

from __future__ import annotations

import builtins
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.delta_history import ChainHistory, merged_writes
from loopwright.checkpoints.fenced import (
    OURS_FENCED,
    OURS_FENCED_UNFLUSHED,
    WRITE_COLUMNS,
    Fence,
    FencedPostgresSaver,
    FencedSaver,
    FencedSqliteSaver,
    Save,
    Superstep,
    TaskWrites,
    as_they_ran,
    column_arrays,
    one_chain,
    register_column_arrays,
    remember,
)
from loopwright.checkpoints.frames import (
    KEY_EVERY,
    Frame,
    Row,
    Write,
    encode,
    plain_metadata,
    rebuild,
    task_writes,
)
from loopwright.checkpoints.leases import FenceRow, RunWatch, lock_fence_sql
from loopwright.checkpoints.schema import LATEST, migrate
from loopwright.checkpoints.sql import Database
from loopwright.core.crashpoints import armed, crash_point


class Layout(StrEnum):
    """Where a thread's checkpoints live."""

    COMPACT = "compact"  # lw_checkpoints
    STOCK = "stock"  # LangGraph's own tables


TABLES = ("lw_checkpoints", "lw_checkpoint_writes")
# Chains read back to their roots that a saver keeps (a run's rows, some 1 KB each): a run's
# history asks for one chain over and over; a worker moves on to other runs.
KEPT_CHAINS = 4

# A chain of rows, newest first, from a checkpoint (by id, or the thread's latest) back to its
# keyframe (`NOT chain.keyframe`) or to the root (`chain.depth >= 0`), and in the same statement
# the writes saved alone at its first checkpoint or, for a walk to the root, at any (depth -1).
# Each step looks up the parent by its key: on Postgres through a LATERAL subquery kept from
# being flattened (LIMIT 1; flattened, a table with no statistics yet was planned as a scan of
# the thread's rows at every step, 0.2 s for 800 rows), on SQLite (which has no LATERAL) by a
# plain join, which it plans so.
_CHAIN = """
WITH RECURSIVE chain AS (
    SELECT checkpoint_id, parent_id, keyframe, body, 0 AS depth FROM lw_checkpoints
     WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = {anchor}
  UNION ALL
    SELECT c.checkpoint_id, c.parent_id, c.keyframe, c.body, chain.depth + 1
      FROM chain {parent}
     WHERE {more}
)
SELECT checkpoint_id, parent_id, keyframe, body, NULL AS task_id, NULL AS task_path,
       NULL AS idx, NULL AS channel, NULL AS type, depth
  FROM chain
UNION ALL
SELECT w.checkpoint_id, NULL, NULL, w.blob, w.task_id, w.task_path, w.idx, w.channel, w.type, -1
  FROM lw_checkpoint_writes w
 WHERE w.thread_id = %s AND w.checkpoint_ns = %s {alone_at}
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, {probe}
 WHERE NOT EXISTS (SELECT 1 FROM chain)
ORDER BY depth
"""
_AT_FIRST = "AND w.checkpoint_id = (SELECT checkpoint_id FROM chain WHERE depth = 0)"
# Found nowhere, where the thread's checkpoints are (`_layout`): -2 compact rows (another
# namespace), -3 LangGraph's layout, -4 none. Asked in the same statement, so that a new run's
# first read is one round trip.
_PROBE_DEPTH = """CASE
    WHEN EXISTS (SELECT 1 FROM lw_checkpoints WHERE thread_id = %s) THEN -2
    WHEN EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s) THEN -3
    ELSE -4 END"""
_FOUND_IN = {-2: Layout.COMPACT, -3: Layout.STOCK}
_PARENT = {
    DatabaseKind.POSTGRES: """CROSS JOIN LATERAL (
        SELECT checkpoint_id, parent_id, keyframe, body FROM lw_checkpoints
         WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = chain.parent_id
         LIMIT 1) c""",
    DatabaseKind.SQLITE: """JOIN lw_checkpoints c
        ON c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = chain.parent_id""",
}
_BY_ID, _LATEST = (
    "%s",
    ("(SELECT max(checkpoint_id) FROM lw_checkpoints WHERE thread_id = %s AND checkpoint_ns = %s)"),
)
_TO_KEYFRAME, _TO_ROOT = "NOT chain.keyframe", "chain.depth >= 0"
# Children have later ids (LangGraph's ids grow with time, as its "latest" assumes).
_CHILDREN = (
    "SELECT checkpoint_id, parent_id, keyframe, body FROM lw_checkpoints"
    " WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id > %s AND parent_id = %s"
    " ORDER BY checkpoint_id"
)
_ALONE = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob"
    " FROM lw_checkpoint_writes"
)
_ROWS = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, keyframe, body FROM lw_checkpoints"
)
_OF_THREAD = " WHERE thread_id = %s ORDER BY checkpoint_ns, checkpoint_id"
# The versions of both layouts' tables: LangGraph's migrations and loopwright's schema.
_VERSIONS = (
    "SELECT (SELECT max(v) FROM checkpoint_migrations) AS stock,"
    " (SELECT max(version) FROM lw_schema) AS ours"
)
# Where a thread's checkpoints are, asked once a thread (unless a read found out on the way).
_PROBE = f"SELECT {_PROBE_DEPTH} AS depth"

# A commit on Postgres: the run's row locked and read, and (if it is still this writer's, or
# the saver is unfenced) the checkpoint's row (`_SAVE`) or the writes saved alone (`_ALONE_WRITES`):
# one statement for each kind, so that a node's commit, the one run at every node, sends the
# row's parameters alone, not a dozen empty arrays of writes beside them. A checkpoint's row is
# a plain INSERT: an upsert inserts speculatively, a WAL record more each commit (48 bytes),
# for a checkpoint saved again under its id, which a run never does; where it is (LangGraph's
# savers replace such a checkpoint), the INSERT fails on the key and the upsert (`_SAVE_AGAIN`)
# follows. Ordinary writes keep the first value saved for a (task, idx), special ones (all of a
# task's writes interrupts, errors, resume values) replace it, as LangGraph's savers do.
_COMMIT_SQL = """
WITH run AS ({run}), ours AS ({ours}){writes}
SELECT * FROM run
"""
_SAVE = """, saved AS (
    INSERT INTO lw_checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_id, keyframe, body)
    SELECT %(thread)s::text, %(ns)s::text, %(id)s::text, NULLIF(%(parent)s::text, ''),
           %(keyframe)s::boolean, %(body)b::bytea
      FROM ours{again}
)"""
_AGAIN = """
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_id = EXCLUDED.parent_id, keyframe = EXCLUDED.keyframe, body = EXCLUDED.body"""


class _Kind(StrEnum):
    """What a commit statement writes."""

    ROW = "row"  # a checkpoint's row, new
    ROW_AGAIN = "row again"  # a checkpoint's row, replacing one saved under its id
    ALONE = "alone"  # writes saved alone


_ALONE_WRITES = """, kept AS (
    INSERT INTO lw_checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(thread)s::text, %(ns)s::text, %(at)s::text, w.* FROM ours, unnest(
        %(k_task)b::text[], %(k_path)b::text[], %(k_idx)b::int[], %(k_channel)b::text[],
        %(k_type)b::text[], %(k_blob)b::bytea[]) AS w
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
), replaced AS (
    INSERT INTO lw_checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(thread)s::text, %(ns)s::text, %(at)s::text, w.* FROM ours, unnest(
        %(r_task)b::text[], %(r_path)b::text[], %(r_idx)b::int[], %(r_channel)b::text[],
        %(r_type)b::text[], %(r_blob)b::bytea[]) AS w
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
)"""
_UNFENCED = {"run": "SELECT NULL WHERE FALSE", "ours": "SELECT 1"}


def _commit_statements(fenced: dict[str, str]) -> dict[tuple[bool, _Kind], str]:
    """The commit statements by (whether fenced, what it writes), given how a fenced one locks
    and judges the run's row."""
    writes = {
        _Kind.ROW: _SAVE.format(again=""),
        _Kind.ROW_AGAIN: _SAVE.format(again=_AGAIN),
        _Kind.ALONE: _ALONE_WRITES,
    }
    return {
        (is_fenced, kind): _COMMIT_SQL.format(
            **(fenced if is_fenced else _UNFENCED), writes=writes[kind]
        )
        for is_fenced in (False, True)
        for kind in _Kind
    }


_SQLITE_SAVE = (
    "INSERT INTO lw_checkpoints"
    " (thread_id, checkpoint_ns, checkpoint_id, parent_id, keyframe, body)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)"
    " DO UPDATE SET parent_id = excluded.parent_id, keyframe = excluded.keyframe,"
    " body = excluded.body"
)
_SQLITE_WRITE = (
    "INSERT INTO lw_checkpoint_writes"
    " (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT"
    " (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO {action}"
)
_SQLITE_KEEP = _SQLITE_WRITE.format(action="NOTHING")
_SQLITE_REPLACE = _SQLITE_WRITE.format(
    action="UPDATE SET channel = excluded.channel, type = excluded.type, blob = excluded.blob"
)


@dataclass(frozen=True)
class _Commit:
    """What one commit writes: a checkpoint's row (with its superstep's writes in it), or the
    writes of a checkpoint (`at`) saved alone, ordinary ones (`kept`: the first saved stays)
    and special ones (`replaced`)."""

    thread: str
    ns: str
    row: Row | None
    at: str
    kept: Sequence[Write]
    replaced: Sequence[Write]
    node: str
    flush: bool  # whether the commit waits for the disk (`FencedSaver._flushes`)

    @property
    def crash_point(self) -> str:
        return f"checkpoint:commit:before_commit:{self.node}"


def _row(record: Mapping[str, Any]) -> Row:
    return Row(
        record["checkpoint_id"], record["parent_id"], bool(record["keyframe"]), record["body"]
    )


def _alone(record: Mapping[str, Any], value: str = "blob") -> Write:
    """A write saved alone, read from its table (or from a chain's query: `value="body"`)."""
    return Write(
        record["task_id"],
        record["task_path"],
        int(record["idx"]),
        record["channel"],
        (record["type"], bytes(record[value])),
    )


def _write_row(write: Write) -> tuple[Any, ...]:
    return (write.task_id, write.task_path, write.idx, write.channel, *write.value)


@dataclass
class _Namespace:
    """The rows of one thread's namespace, rebuilt on demand (`list`)."""

    rows: dict[str, Row] = field(default_factory=dict)
    children: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))
    alone: dict[str, list[Write]] = field(default_factory=lambda: defaultdict(list))
    frames: dict[str, Frame] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows[row.checkpoint_id] = row
        if row.parent_id is not None:
            self.children[row.parent_id].append(row)

    def frame(self, checkpoint_id: str) -> Frame | None:
        """A row's frame, rebuilt from the nearest keyframe or frame already rebuilt (each met
        on the way is kept); None if the chain breaks before a keyframe."""
        chain: list[Row] = []
        at: str | None = checkpoint_id
        base: Frame | None = None
        while at is not None:
            if at in self.frames:
                base = self.frames[at]
                break
            row = self.rows.get(at)
            if row is None:
                return None
            chain.append(row)
            if row.key:
                break
            at = row.parent_id
        else:
            return None  # a root that is no keyframe
        for row in reversed(chain):
            base = self.frames[row.checkpoint_id] = Frame.apply(base, row)
        return base

    def pending(self, checkpoint_id: str) -> list[Write]:
        children = sorted(self.children.get(checkpoint_id, []), key=lambda r: r.checkpoint_id)
        carried = [f.writes for row in children if (f := self.frame(row.checkpoint_id))]
        return merged_writes(self.alone.get(checkpoint_id, []), carried)


class CompactSaver(FencedSaver):
    """The runtime's fenced saver (see the module's docstring), on Postgres or SQLite;
    `legacy` is the fenced saver of LangGraph's layout on the same connection."""

    def __init__(
        self,
        legacy: FencedPostgresSaver | FencedSqliteSaver,
        conn: psycopg.Connection[Any] | sqlite3.Connection,
        *,
        fence: Fence | None = None,
        new_threads: Layout = Layout.COMPACT,
    ) -> None:
        super().__init__(serde=legacy.serde)
        self.legacy = legacy
        self.new_threads = new_threads
        # One lock for the connection, which both layouts' statements take (re-entrant).
        self.lock = legacy.lock
        self.db = Database(conn, lock=cast(threading.RLock, legacy.lock))
        self._init_fencing(fence)
        self._layouts: dict[str, Layout] = {}
        self._frames: dict[tuple[str, str], Frame] = {}  # each namespace's last checkpoint
        # The chains last read back to their roots (DeltaChannel histories), by namespace.
        self._histories: dict[tuple[str, str], ChainHistory] = {}
        self._chains = {
            (latest, to_root): self.db.spell(
                _CHAIN.format(
                    anchor=_LATEST if latest else _BY_ID,
                    parent=_PARENT[self.db.kind],
                    more=_TO_ROOT if to_root else _TO_KEYFRAME,
                    alone_at="" if to_root else _AT_FIRST,
                    probe=_PROBE_DEPTH,
                )
            )
            for latest in (False, True)
            for to_root in (False, True)
        }
        self._pg = conn if isinstance(conn, psycopg.Connection) else None
        if self._pg is not None:
            register_column_arrays(self._pg)
            lock = self.db.spell(lock_fence_sql(run_id="%(thread)s::text"))
            # By whether the commit waits for the disk (`FencedSaver._flushes`).
            self._commits = {
                flush: _commit_statements(
                    {"run": lock, "ours": OURS_FENCED if flush else OURS_FENCED_UNFLUSHED}
                )
                for flush in (True, False)
            }

    def _fence_with(
        self, fence: Fence, watch: RunWatch | None, rederivable: frozenset[str]
    ) -> None:
        self.legacy = self.legacy.fenced(fence, watch, rederivable=rederivable)
        self.rederivable = rederivable

    # The fence and the attempt's watch are the legacy saver's too: one writer, two layouts.
    @property
    def fence(self) -> Fence | None:
        return self.legacy.fence

    @fence.setter
    def fence(self, fence: Fence | None) -> None:
        self.legacy.fence = fence

    @property
    def watch(self) -> RunWatch | None:
        return self.legacy.watch

    @watch.setter
    def watch(self, watch: RunWatch | None) -> None:
        self.legacy.watch = watch

    def setup(self) -> None:
        """Both layouts' tables: LangGraph's (its saver's own `setup`), the compact ones
        (loopwright's schema, `checkpoints.schema`). Every process that opens a saver calls it
        and nearly always finds both current: on Postgres that is asked first, in one statement
        (LangGraph's `setup` alone is two, and loopwright's check a third)."""
        if self._pg is not None and self._current():
            return
        self.legacy.setup()
        migrate(self.db)

    def _current(self) -> bool:
        """Whether both layouts' tables are at their latest versions (False: either's version
        table is missing, or behind)."""
        try:
            found = self.db.one(_VERSIONS)
        except psycopg.errors.UndefinedTable:
            return False
        return (
            found is not None
            and found["stock"] is not None
            and found["ours"] is not None
            and found["stock"] >= len(PostgresSaver.MIGRATIONS) - 1
            and found["ours"] >= LATEST
        )

    # -- reading ---------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = _thread_ns(config)
        if self._layouts.get(thread) is Layout.STOCK:
            return self.legacy.get_tuple(config)
        with self.lock:
            found, where = self._compact_tuple(thread, ns, get_checkpoint_id(config))
        if where is Layout.STOCK:
            return self.legacy.get_tuple(config)
        # Found nowhere, the thread is new, and which layout it begins in is its first
        # writer's: another saver (the server's graph, say) may write it first.
        return found

    def _chain(
        self, thread: str, ns: str, checkpoint_id: str | None, *, to_root: bool
    ) -> tuple[builtins.list[Row], dict[str, builtins.list[Write]], Layout | None]:
        """The rows from a checkpoint (the latest if None) back to its keyframe or the root,
        newest first; the writes saved alone at the first, or at any (to the root), by
        checkpoint; and where the thread's checkpoints are (None: nowhere)."""
        anchor = (thread, ns) if checkpoint_id is None else (checkpoint_id,)
        params = (thread, ns, *anchor, thread, ns, thread, ns, thread, thread)
        rows: builtins.list[Row] = []
        alone: dict[str, builtins.list[Write]] = defaultdict(list)
        for record in self.db.execute(self._chains[(checkpoint_id is None, to_root)], params):
            depth = record["depth"]
            if depth >= 0:
                rows.append(_row(record))
            elif depth == -1:
                alone[record["checkpoint_id"]].append(_alone(record, "body"))
            elif depth in _FOUND_IN:
                remember(self._layouts, thread, _FOUND_IN[depth])
        if rows:
            remember(self._layouts, thread, Layout.COMPACT)
        return rows, alone, self._layouts.get(thread)

    def _compact_tuple(
        self, thread: str, ns: str, checkpoint_id: str | None
    ) -> tuple[CheckpointTuple | None, Layout | None]:
        """The checkpoint, if the compact layout has it; and where the thread is."""
        rows, alone_at, where = self._chain(thread, ns, checkpoint_id, to_root=False)
        if not rows:
            return None, where
        frame = rebuild(rows)[-1]
        alone = alone_at.get(frame.checkpoint_id, [])
        carried: builtins.list[builtins.list[Write]] = []
        if checkpoint_id is not None:  # the latest has no children
            for record in self.db.execute(_CHILDREN, (thread, ns, checkpoint_id, checkpoint_id)):
                child = _row(record)
                carried.append(Frame.apply(None if child.key else frame, child).writes)
        remember(self._frames, (thread, ns), frame.as_parent())
        return self._tuple(thread, ns, frame, merged_writes(alone, carried)), Layout.COMPACT

    def _tuple(
        self, thread: str, ns: str, frame: Frame, pending: builtins.list[Write]
    ) -> CheckpointTuple:
        def config(checkpoint_id: str) -> RunnableConfig:
            ids = {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
            return {"configurable": ids}

        return CheckpointTuple(
            config(frame.checkpoint_id),
            frame.checkpoint(self.serde),
            cast(CheckpointMetadata, plain_metadata(frame.metadata)),
            config(frame.parent_id) if frame.parent_id else None,
            [w.pending(self.serde) for w in pending],
        )

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        thread = str(config["configurable"]["thread_id"]) if config else None
        found: builtins.list[CheckpointTuple] = []
        if thread is None or self._layouts.get(thread) is not Layout.STOCK:
            found = self._compact_list(config, filter, before)[:limit]
            yield from found
            if thread is not None and (found or self._layout(thread) is not Layout.STOCK):
                return
        # A thread of LangGraph's layout, or (every thread) those of it after the compact ones.
        left = None if limit is None else limit - len(found)
        if left is None or left > 0:
            yield from self.legacy.list(config, filter=filter, before=before, limit=left)

    def _compact_list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
    ) -> builtins.list[CheckpointTuple]:
        """The matching checkpoints, newest first (by id, as LangGraph's savers list them)."""
        conf = config["configurable"] if config else {}
        # The rows of the thread's namespaces (or every thread's): a checkpoint asked for by id
        # is rebuilt from the rows before it, and is picked out after.
        where, params = [], []
        for column in ("thread_id", "checkpoint_ns"):
            if conf.get(column) is not None:
                where.append(f"{column} = %s")
                params.append(str(conf[column]))
        filters = " WHERE " + " AND ".join(where) if where else ""
        only = conf.get("checkpoint_id")
        below = get_checkpoint_id(before) if before else None
        spaces: dict[tuple[str, str], _Namespace] = defaultdict(_Namespace)
        with self.lock:
            for record in self.db.execute(_ROWS + filters, params):
                spaces[(record["thread_id"], record["checkpoint_ns"])].add(_row(record))
            for w in self.db.execute(_ALONE + filters, params):
                if (space := spaces.get((w["thread_id"], w["checkpoint_ns"]))) is not None:
                    space.alone[w["checkpoint_id"]].append(_alone(w))
        found: builtins.list[CheckpointTuple] = []
        for (thread, ns), space in spaces.items():
            for checkpoint_id in space.rows:
                if (only and checkpoint_id != only) or (below and checkpoint_id >= below):
                    continue
                frame = space.frame(checkpoint_id)
                if frame is None or (filter and not _contains(frame.metadata, filter)):
                    continue
                found.append(self._tuple(thread, ns, frame, space.pending(checkpoint_id)))
        found.sort(key=lambda t: t.config["configurable"]["checkpoint_id"], reverse=True)
        return found

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Each channel's writes since its last stored value, oldest first, along the target's
        ancestors (the target's own pending writes are the next superstep's), and that value
        (`seed`) if an ancestor stores one (`checkpoints.delta_history`)."""
        if not channels:
            return {}
        thread, ns = _thread_ns(config)
        if self._layouts.get(thread) is Layout.STOCK:
            return self.legacy.get_delta_channel_history(config=config, channels=channels)
        checkpoint_id = get_checkpoint_id(config)
        with self.lock:
            chain = self._histories.get((thread, ns))
            if chain is None or checkpoint_id not in chain.position:
                chain = self._chain_history(thread, ns, checkpoint_id)
        if chain is None:
            if self._layout(thread) is Layout.STOCK:
                return self.legacy.get_delta_channel_history(config=config, channels=channels)
            return {channel: {"writes": []} for channel in channels}
        target = checkpoint_id or chain.steps[-1].row.checkpoint_id
        result: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            writes, seed = chain.history(target, channel)
            entry: DeltaChannelHistory = {"writes": [w.pending(self.serde) for w in writes]}
            if seed is not None:
                entry["seed"] = self.serde.loads_typed(seed)
            result[channel] = entry
        return result

    def _chain_history(
        self, thread: str, ns: str, checkpoint_id: str | None
    ) -> ChainHistory | None:
        """The chain from a checkpoint (the latest if None) back to its root, kept for the next
        call (a run's history asks for every checkpoint of it, newest first)."""
        rows, alone, _ = self._chain(thread, ns, checkpoint_id, to_root=True)
        if not rows:
            return None
        chain = ChainHistory(rows, alone)
        remember(self._histories, (thread, ns), chain, keep=KEPT_CHAINS)
        return chain

    def supersteps(self, thread_id: str) -> builtins.list[Superstep] | None:
        """From the compact rows, each namespace's chain with its writes decoded once
        (`ChainHistory`); a thread of LangGraph's layout from its tables (`legacy`)."""
        if self._layouts.get(thread_id) is Layout.STOCK:
            return self.legacy.supersteps(thread_id)
        spaces: dict[str, _Namespace] = defaultdict(_Namespace)
        with self.lock:
            for record in self.db.execute(_ROWS + _OF_THREAD, (thread_id,)):
                spaces[record["checkpoint_ns"]].add(_row(record))
            for record in self.db.execute(_ALONE + " WHERE thread_id = %s", (thread_id,)):
                if (space := spaces.get(record["checkpoint_ns"])) is not None:
                    space.alone[record["checkpoint_id"]].append(_alone(record))
        if not spaces and self._layout(thread_id) is Layout.STOCK:
            return self.legacy.supersteps(thread_id)
        found: builtins.list[Superstep] = []
        for ns, space in spaces.items():
            rows = builtins.list(space.rows.values())  # oldest first
            if not one_chain([(row.checkpoint_id, row.parent_id) for row in rows]):
                return None
            if not rows[0].key:  # a root that is no keyframe: nothing to read it from
                return None
            chain = ChainHistory(rows[::-1], space.alone)
            for step, pending in zip(chain.steps, chain.pending, strict=True):
                writes = [
                    (w.task_id, w.task_path, w.channel, self.serde.loads_typed(w.value))
                    for w in pending
                ]
                found.append(Superstep(ns, step.row.checkpoint_id, writes))
        return as_they_ran(found) if found else None

    def _layout(self, thread: str) -> Layout | None:
        """Where the thread's checkpoints are (None: nowhere yet), asked once a thread."""
        with self.lock:
            if thread not in self._layouts:
                found = self.db.one(_PROBE, (thread, thread))
                if found and found["depth"] in _FOUND_IN:
                    remember(self._layouts, thread, _FOUND_IN[found["depth"]])
            return self._layouts.get(thread)

    # -- writing ---------------------------------------------------------------------------

    def _commit(self, thread: str, tasks: Sequence[TaskWrites], save: Save | None) -> None:
        # A thread's layout is known once it was read (LangGraph reads a thread before it
        # writes it) or written; else it is new, and begins in `new_threads`' layout unless it
        # has compact rows (asked once: the compact layout is the one that needs no asking).
        layout = self._layouts.get(thread)
        if layout is None and self.new_threads is Layout.STOCK:
            layout = self._layout(thread) or Layout.STOCK
        if layout is Layout.STOCK:
            with self.lock:
                remember(self._layouts, thread, Layout.STOCK)
            self.legacy._commit(thread, tasks, save)
            return
        fence = self.fence
        if fence is not None:
            fence.check_thread(thread)
        ns = str((save.config if save else tasks[0].config)["configurable"]["checkpoint_ns"])
        node = tasks[0].node if tasks else ""
        # A task's writes replace those saved before for it if they are all special ones
        # (errors, interrupts, resume values), as LangGraph's savers treat them.
        kept: builtins.list[Write] = []
        replaced: builtins.list[Write] = []
        for task in tasks:
            writes = task_writes(task.task_id, task.task_path, task.writes, self.serde)
            special = all(channel in WRITES_IDX_MAP for channel, _ in task.writes)
            (replaced if special else kept).extend(writes)
        with self.lock:
            row: Row | None = None
            frame: Frame | None = None
            at = "" if save is not None else tasks[0].key[2]
            if save is not None:  # the superstep's writes go in the checkpoint's row
                row, frame = self._encode(thread, ns, save, [*kept, *replaced])
                kept, replaced = [], []
            write = self._commit_postgres if self._pg is not None else self._commit_sqlite
            flush = self._flushes(node, save)
            run = write(_Commit(thread, ns, row, at, kept, replaced, node, flush))
            if fence is not None:
                self._seen(fence.check_row(thread, run))
            if frame is not None:
                remember(self._frames, (thread, ns), frame.as_parent())
            self._histories.pop((thread, ns), None)  # writes saved alone may have joined it
            remember(self._layouts, thread, Layout.COMPACT)

    def _encode(
        self, thread: str, ns: str, save: Save, writes: builtins.list[Write]
    ) -> tuple[Row, Frame]:
        """The checkpoint's row: a delta on its parent if this saver knows the parent's frame
        and the chain's keyframe is recent enough, else a keyframe."""
        parent_id = save.config["configurable"].get("checkpoint_id")
        known = self._frames.get((thread, ns))
        delta = (
            known is not None
            and parent_id is not None
            and known.checkpoint_id == parent_id
            and known.since_key + 1 < KEY_EVERY
        )
        return encode(
            known if delta else None,
            str(save.checkpoint["id"]),
            str(parent_id) if parent_id else None,
            save.checkpoint,
            get_serializable_checkpoint_metadata(save.config, save.metadata),
            save.new_versions,
            writes,
            self.serde,
        )

    def _commit_postgres(self, commit: _Commit) -> FenceRow | None:
        """One statement, its own transaction (autocommit), in one round trip."""
        assert self._pg is not None
        row = commit.row
        params: dict[str, Any] = {"thread": commit.thread, "ns": commit.ns}
        if row is not None:
            params |= {
                "id": row.checkpoint_id,
                "parent": row.parent_id or "",
                "keyframe": row.key,
                "body": row.body,
            }
        else:
            params["at"] = commit.at
            params |= column_arrays("k", WRITE_COLUMNS, [_write_row(w) for w in commit.kept])
            params |= column_arrays("r", WRITE_COLUMNS, [_write_row(w) for w in commit.replaced])
        fence = self.fence
        if fence is not None:
            params |= {"fence": fence.fence, "owner": fence.owner}
        fenced = fence is not None
        kind = _Kind.ROW if row is not None else _Kind.ALONE
        point = commit.crash_point
        statements = self._commits[commit.flush]
        with self._pg.cursor(binary=True, row_factory=dict_row) as cursor:
            if point in armed():
                # The statement in an explicit transaction, held open where a crash test's
                # process dies: what a crash at any moment of the commit leaves.
                kind = _Kind.ROW_AGAIN if row is not None else kind
                with self._pg.transaction():
                    cursor.execute(statements[(fenced, kind)], params)
                    crash_point(point)
            else:
                try:
                    cursor.execute(statements[(fenced, kind)], params)
                except psycopg.errors.UniqueViolation:
                    if row is None:
                        raise
                    # The row's key is taken: the checkpoint is saved again (autocommit: the
                    # failed statement changed nothing).
                    cursor.execute(statements[(fenced, _Kind.ROW_AGAIN)], params)
            record = cursor.fetchone()
        return FenceRow.of(record) if record else None

    def _commit_sqlite(self, commit: _Commit) -> FenceRow | None:
        """One BEGIN IMMEDIATE transaction: the fence check and the rows, one fsync (none for a
        commit that need not be flushed)."""
        conn = self.db.conn
        assert isinstance(conn, sqlite3.Connection)
        run: FenceRow | None = None
        thread, ns, row = commit.thread, commit.ns, commit.row
        with self.db.transaction(flush=commit.flush):
            fence = self.fence
            if fence is not None:
                run = fence.check(self.db, thread)
            with closing(conn.cursor()) as cursor:
                if row is not None:
                    values = (thread, ns, row.checkpoint_id, row.parent_id, row.key, row.body)
                    cursor.execute(_SQLITE_SAVE, values)
                for statement, writes in (
                    (_SQLITE_KEEP, commit.kept),
                    (_SQLITE_REPLACE, commit.replaced),
                ):
                    if writes:
                        rows = [(thread, ns, commit.at, *_write_row(w)) for w in writes]
                        cursor.executemany(statement, rows)
            crash_point(commit.crash_point)
        return run

    # -- removing --------------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        thread = str(thread_id)
        with self.db.transaction():
            for table in TABLES:
                self.db.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread,))
        self.legacy.delete_thread(thread)
        self._forget(thread)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`"delete"` removes the threads' checkpoints and writes; `"keep_latest"` keeps each
        namespace's latest checkpoint (rewritten as a keyframe with no parent) and the writes
        saved alone at it, and refuses, before pruning any, a thread whose state has a
        DeltaChannel (whose value is the writes of the checkpoints it would remove), as
        LangGraph's savers do."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        threads = [str(t) for t in thread_ids]
        compact = [t for t in threads if self._layout(t) is Layout.COMPACT]
        stock = [t for t in threads if self._layout(t) is Layout.STOCK]
        if strategy == "delete":
            for thread in compact:
                self.delete_thread(thread)
        else:
            latest = {thread: self._latest_frames(thread) for thread in compact}
            if any(
                "counters_since_delta_snapshot" in frame.metadata
                for frames in latest.values()
                for _, frame in frames
            ):
                raise NotImplementedError(
                    "keep_latest cannot prune a thread whose state has a DeltaChannel"
                )
            for thread, frames in latest.items():
                self._keep_only(thread, frames)
        if stock:
            self.legacy.prune(stock, strategy=strategy)

    def _latest_frames(self, thread: str) -> builtins.list[tuple[str, Frame]]:
        """Each namespace of the thread and its latest checkpoint."""
        with self.lock:
            namespaces = self.db.execute(
                "SELECT DISTINCT checkpoint_ns FROM lw_checkpoints WHERE thread_id = %s",
                (thread,),
            )
            return [
                (
                    r["checkpoint_ns"],
                    rebuild(self._chain(thread, r["checkpoint_ns"], None, to_root=False)[0])[-1],
                )
                for r in namespaces
            ]

    def _keep_only(self, thread: str, frames: Sequence[tuple[str, Frame]]) -> None:
        with self.db.transaction():
            for ns, frame in frames:
                row, _ = encode(
                    None,
                    frame.checkpoint_id,
                    None,
                    frame.checkpoint(self.serde),
                    frame.metadata,
                    {},
                    [],
                    self.serde,
                )
                where = " WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id"
                ids = (thread, ns, frame.checkpoint_id)
                for table in TABLES:
                    self.db.execute(f"DELETE FROM {table}{where} <> %s", ids)
                self.db.execute(
                    f"UPDATE lw_checkpoints SET parent_id = NULL, keyframe = %s, body = %s{where} = %s",
                    (True, row.body, *ids),
                )
        self._forget(thread)

    def _forget(self, thread: str) -> None:
        """What this saver remembers of a thread whose rows it removed (or rewrote)."""
        with self.lock:
            self._layouts.pop(thread, None)
            for memory in (self._frames, self._histories):
                for key in [k for k in memory if k[0] == thread]:
                    del memory[key]


def _thread_ns(config: RunnableConfig) -> tuple[str, str]:
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))


def _contains(metadata: Mapping[str, Any], filter: Mapping[str, Any]) -> bool:
    """Whether `metadata` holds every key of `filter` with its value (a dict within a dict),
    as LangGraph's Postgres saver matches a filter (`@>`)."""
    for key, wanted in filter.items():
        if key not in metadata:
            return False
        value = metadata[key]
        if isinstance(wanted, Mapping) and isinstance(value, Mapping):
            if not _contains(value, wanted):
                return False
        elif value != wanted:
            return False
    return True
