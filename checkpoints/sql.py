"""The one SQL helper the journal, the leases and the fenced savers share.

Each statement is written once, in Postgres spelling with `%s` placeholders plus a few named
fragments where the two dialects differ; `Database.spell` turns it into the backend's text:

    {for_update} {for_share}   row locks in Postgres; nothing in SQLite, whose BEGIN IMMEDIATE
                               already makes the writing transaction exclusive
    {json} {timestamp}         column types: JSON / TIMESTAMPTZ, or TEXT in SQLite. JSON, not
                               JSONB: it keeps the text as sent, NUL characters (\\u0000) included,
                               which a business system may return and JSONB cannot hold
    {blob}                     bytes: BYTEA / BLOB
    {after_seconds}            "now + %s seconds", for lease expiry
    {before_seconds}           "now - %s seconds", for what has been quiet that long

`now()` is the database clock in Postgres (the start of the transaction). SQLite has no such
function, so `Database` registers one on the connection that reads the Python clock and returns
fixed-width ISO-8601 UTC text; fixed width keeps string comparison chronological, so expiry
checks can stay in SQL on both backends.

Writes go through `transaction()` or `write()` only: one committed transaction per call, because
the executor relies on, e.g., DISPATCHED being durable before it sends a request.

A transaction's commit waits until it is on disk, unless it is one the caller could make again:
`transaction(flush=False)` returns once the commit is in the log, which the database writes
sequentially. Such a commit survives the process's crash; a crash of the machine (or of the
Postgres server) may take it back, and with it only commits after it that were not flushed
either: the next flushed commit, on any connection, puts the log up to itself on disk. What such
a crash leaves is what a crash just before the commit would have left.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.sql
from psycopg.rows import DictRow, dict_row

from loopwright.checkpoints.database import (
    DatabaseKind,
    connect_postgres,
    connect_sqlite,
    database_kind,
    sqlite_path,
)
from loopwright.core.state import canonical_json

Row = dict[str, Any]

# The setting, local to its transaction, that lets a Postgres commit return before it reaches the
# disk (`Database.transaction`); an expression, so a single-statement commit can carry it too.
UNFLUSHED_COMMIT = "set_config('synchronous_commit', 'off', true)"
# SQLite's counterpart, for the connection: in WAL mode NORMAL commits without syncing the log;
# FULL (every connection's setting otherwise, `connect_sqlite`) syncs it at each commit.
_SQLITE_SYNCHRONOUS = "PRAGMA synchronous={}"

_FRAGMENTS: dict[DatabaseKind, dict[str, str]] = {
    DatabaseKind.POSTGRES: {
        "for_update": " FOR UPDATE",
        "for_share": " FOR SHARE",
        "json": "JSON",
        "timestamp": "TIMESTAMPTZ",
        "blob": "BYTEA",
        "after_seconds": "now() + make_interval(secs => %s)",
        "before_seconds": "now() - make_interval(secs => %s)",
    },
    DatabaseKind.SQLITE: {
        "for_update": "",
        "for_share": "",
        "json": "TEXT",
        "timestamp": "TEXT",
        "blob": "BLOB",
        "after_seconds": "now_plus(%s)",
        "before_seconds": "now_plus(-%s)",
    },
}


@functools.lru_cache(maxsize=1024)
def _spelled(kind: DatabaseKind, sql: str) -> str:
    """`sql` in `kind`'s dialect: its fragments filled in, its placeholders SQLite's there. The
    statements are the code's own, a few hundred at most, and a node commit's fence check spells
    its statement at every commit."""
    text = sql.format(**_FRAGMENTS[kind])
    return text.replace("%s", "?") if kind is DatabaseKind.SQLITE else text


def _sqlite_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _sqlite_now() -> str:
    return _sqlite_timestamp(datetime.now(UTC))


def _sqlite_now_plus(seconds: float) -> str:
    return _sqlite_timestamp(datetime.now(UTC) + timedelta(seconds=seconds))


class Database:
    """A connection, the lock that serialises its use, and its SQL dialect.

    `lock` is re-entrant so that a transaction can call `execute` and, for the fenced savers,
    so that langgraph's own statements (which take the saver's lock) can run inside it.
    """

    def __init__(
        self,
        conn: psycopg.Connection[DictRow] | sqlite3.Connection,
        *,
        lock: threading.RLock | None = None,
    ) -> None:
        self.conn = conn
        self.kind = (
            DatabaseKind.SQLITE if isinstance(conn, sqlite3.Connection) else DatabaseKind.POSTGRES
        )
        self._lock = lock or threading.RLock()
        if isinstance(conn, sqlite3.Connection):
            conn.create_function("now", 0, _sqlite_now)
            conn.create_function("now_plus", 1, _sqlite_now_plus)

    @property
    def lost(self) -> bool:
        """Whether the connection was lost (the database restarted, the network dropped it): it
        can never be used again. The statement that found out failed as it would have; what
        holds a `Database` that is lost opens a new one."""
        return isinstance(self.conn, psycopg.Connection) and (self.conn.closed or self.conn.broken)

    def spell(self, sql: str) -> str:
        return _spelled(self.kind, sql)

    @contextmanager
    def transaction(self, *, flush: bool = True) -> Iterator[None]:
        """One committed transaction; rolled back if the block raises. Unless `flush`, its commit
        does not wait for the disk (see the module's docstring)."""
        with self._lock:
            if isinstance(self.conn, sqlite3.Connection):
                with self._sqlite_synchronous(flush):
                    # IMMEDIATE takes the write lock up front: a read-then-write
                    # (compare-and-set) cannot interleave with another writer, and waits on
                    # busy_timeout instead.
                    self.conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield
                    except BaseException:
                        self.conn.rollback()
                        raise
                    # commit() is a no-op if the block already committed (langgraph's
                    # SqliteSaver commits its own statements when they run inside a fenced
                    # transaction).
                    self.conn.commit()
            else:
                with self.conn.transaction():
                    if not flush:
                        self.conn.execute(f"SELECT {UNFLUSHED_COMMIT}")
                    yield

    @contextmanager
    def _sqlite_synchronous(self, flush: bool) -> Iterator[None]:
        """The connection's syncing as `flush` says for one transaction, FULL again after it
        (the setting cannot change inside a transaction)."""
        if flush:
            yield
            return
        self.conn.execute(_SQLITE_SYNCHRONOUS.format("NORMAL"))
        try:
            yield
        finally:
            self.conn.execute(_SQLITE_SYNCHRONOUS.format("FULL"))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one statement; its rows as dicts (empty for statements that return none)."""
        with self._lock:
            if isinstance(self.conn, sqlite3.Connection):
                with closing(self.conn.cursor()) as cur:
                    cur.row_factory = sqlite3.Row
                    cur.execute(self.spell(sql), params)
                    return [dict(row) for row in cur.fetchall()]
            with self.conn.cursor(row_factory=dict_row) as pcur:
                pcur.execute(self.spell(sql), params)
                return pcur.fetchall() if pcur.description else []

    def write(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement committed on its own; its rows (RETURNING). On Postgres the connection
        is in autocommit, so the statement is its own transaction in one round trip, where
        `transaction()` costs two more (BEGIN, COMMIT); a statement that must check a row and
        change it does both at once (a guarded UPDATE), so it needs no transaction around it."""
        if self.kind is DatabaseKind.POSTGRES:
            return self.execute(sql, params)
        with self.transaction():
            return self.execute(sql, params)

    def batch(self, statements: psycopg.sql.Composable) -> list[Row]:
        """Postgres statements sent together and run one after another, in one round trip (a
        transaction's BEGIN ... COMMIT included); the rows of the last one that returns rows.
        Values go in as `psycopg.sql.Literal`s: a batch takes no parameters. Each statement
        sees what was committed before it began, as any statement does, so one may wait for a
        lock the one before it took and then read what its last holder wrote."""
        if not isinstance(self.conn, psycopg.Connection):
            raise TypeError("a batch of statements is Postgres' (SQLite runs one at a time)")
        with self._lock, self.conn.cursor(row_factory=dict_row) as pcur:
            pcur.execute(statements.as_string(self.conn), prepare=False)
            rows: list[Row] = []
            while True:
                if pcur.description:
                    rows = pcur.fetchall()
                if not pcur.nextset():
                    return rows

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = self.execute(sql, params)
        return rows[0] if rows else None

    def to_json(self, value: Any) -> str | None:
        """A JSON parameter: text, stored as JSON by Postgres and as it is by SQLite."""
        return None if value is None else canonical_json(value)

    def timestamp(self, moment: datetime | None) -> datetime | str | None:
        """A timestamp parameter: TIMESTAMPTZ in Postgres, comparable fixed-width text in SQLite."""
        if moment is None or self.kind is DatabaseKind.POSTGRES:
            return moment
        return _sqlite_timestamp(moment)

    def from_json(self, value: Any) -> Any:
        if self.kind is DatabaseKind.SQLITE and value is not None:
            return json.loads(value)
        return value


@contextmanager
def open_database(url: str) -> Iterator[Database]:
    """A `Database` on its own connection, closed on exit."""
    if database_kind(url) is DatabaseKind.POSTGRES:
        with connect_postgres(url) as conn:
            yield Database(conn)
    else:
        with closing(connect_sqlite(sqlite_path(url))) as sconn:
            yield Database(sconn)
