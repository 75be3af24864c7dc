"""Database URLs and connections: which database a run lives in, and how to reach it.

loopwright keeps checkpoints, the action journal and run leases in one database, named by one
URL. With nothing configured it uses an embedded SQLite file under LOOPWRIGHT_HOME, so a first
run needs no server; DATABASE_URL (or an explicit URL) points it at Postgres instead.

Two URL forms, nothing else:

* `sqlite:///<path>`: everything after the third slash is the file path, so
  `sqlite:///rel/db.sqlite3` is relative and `sqlite:////abs/db.sqlite3` is absolute.
* `postgresql://...` or `postgres://...`: a libpq URL, passed to psycopg unchanged.

Messages never carry a password: the URL is redacted before it goes into an exception.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from loopwright.core.home import loopwright_home

SQLITE_PREFIX = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")
DEFAULT_SQLITE_FILE = "loopwright.sqlite3"
CONNECT_TIMEOUT_S = 5
# How long a run waits for a pooled connection (all in use, or the database unreachable).
POOL_WAIT_S = 30.0
SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_WAL_RETRY_S = 0.01  # between tries to switch a new database to WAL (`_use_wal`)


class DatabaseKind(StrEnum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"


class DatabaseUrlError(ValueError):
    """The URL names no database loopwright can use."""


class DatabaseUnavailable(RuntimeError):
    """The URL is well formed but the database cannot be reached or opened."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"database {url} is unreachable: {reason}")


# Faults of the database itself (unreachable, connection lost, lock or statement timeouts), not
# of a run: a worker reconnects and tries again; the run it was advancing is not blamed.
DATABASE_FAULTS: tuple[type[Exception], ...] = (
    DatabaseUnavailable,
    psycopg.OperationalError,
    sqlite3.OperationalError,
)


def resolve_database_url(explicit: str | None = None, *, create: bool = True) -> str:
    """The URL to use: `explicit` (never empty), else DATABASE_URL, else the embedded SQLite file.

    The default lives in `loopwright_home()`, created on first use so that the file can be
    opened right away (unless not `create`: a command that only reads creates nothing). The
    result is validated, so a bad URL fails at startup rather than at the first write.
    """
    if explicit is not None and not explicit.strip():
        # `--db "$DATABASE_URL"` with the variable unset: the default would be another database.
        raise DatabaseUrlError(
            "the database URL is empty: expected sqlite:///<path> or postgresql://..."
        )
    url = explicit or os.environ.get("DATABASE_URL") or _default_sqlite_url(create)
    database_kind(url)
    return url


def _default_sqlite_url(create: bool = True) -> str:
    return f"{SQLITE_PREFIX}{loopwright_home(create=create) / DEFAULT_SQLITE_FILE}"


def database_exists(url: str) -> bool:
    """Whether there is a database at `url` to read: a SQLite file is one only once written
    (opening one creates it); a server's database is assumed there (connecting tells), and so
    is anything else at the path (opening it says what it is: a directory, not a database)."""
    return database_kind(url) is DatabaseKind.POSTGRES or Path(sqlite_path(url)).exists()


def database_kind(url: str) -> DatabaseKind:
    if url.startswith(SQLITE_PREFIX) and len(url) > len(SQLITE_PREFIX):
        return DatabaseKind.SQLITE
    expected = "expected sqlite:///<path>, postgresql://... or postgres://..."
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:  # "Invalid IPv6 URL", a port that is not a number
        raise DatabaseUrlError(
            f"unreadable database URL {redact(url)!r} ({exc}): {expected}"
        ) from None
    if scheme in POSTGRES_SCHEMES:
        try:
            conninfo_to_dict(url)  # what libpq would refuse to parse: an unknown parameter, a bad %
        except psycopg.ProgrammingError as exc:
            raise DatabaseUrlError(
                f"unreadable database URL {redact(url)!r}: {_one_line(exc, url)}"
            ) from None
        return DatabaseKind.POSTGRES
    raise DatabaseUrlError(f"unsupported database URL {redact(url)!r}: {expected}")


def sqlite_path(url: str) -> str:
    if database_kind(url) is not DatabaseKind.SQLITE:
        raise DatabaseUrlError(f"not a SQLite URL: {redact(url)!r}")
    return url[len(SQLITE_PREFIX) :]


def redact(url: str) -> str:
    """The URL without its password (in the user info or as a `password=` query parameter)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = netloc.rpartition("@")[2]
            netloc = f"{parts.username}@{host}" if parts.username else host
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:  # unparsable (e.g. a bad port): show only the scheme
        return url.partition(":")[0] + "://..."


def _one_line(error: Exception, url: str) -> str:
    text = " ".join(str(error).split())
    password = _password(url)
    return text.replace(password, "***") if password else text


def _password(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        return parts.password or dict(parse_qsl(parts.query)).get("password")
    except ValueError:
        return None


# Executions of a statement on a connection before the next one prepares it (psycopg's
# prepare_threshold): see `connect_postgres`.
PREPARE_THRESHOLD = 2


def connect_postgres(url: str) -> psycopg.Connection[DictRow]:
    """An autocommit connection: every write opens its own explicit transaction.

    The session time zone is UTC so that timestamps read back are UTC-aware. A statement is
    prepared at its third execution on the connection (`PREPARE_THRESHOLD`): a checkpoint
    commit, run at every node, is then bind and execute only. Preparing costs a round trip of
    its own (psycopg sends the Parse and waits for it before it binds), so a statement a run
    makes once or twice (the session's set-up, the schema's version, registering and recording
    the run, the journal's reads for its outcome) is not prepared: one round trip, not two. A
    transaction-mode pooler must support prepared statements (pgbouncer does since 1.21).
    """
    try:
        conn = psycopg.Connection.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            prepare_threshold=PREPARE_THRESHOLD,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(redact(url), _one_line(e, url)) from None
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def _in_utc(conn: psycopg.Connection[DictRow]) -> None:
    conn.execute("SET TIME ZONE 'UTC'")


def postgres_pool(url: str, max_size: int) -> ConnectionPool[psycopg.Connection[DictRow]]:
    """Connections as `connect_postgres` makes them, kept for reuse by a process that advances
    many runs at once (a server): a run takes one for its life, so its statements are prepared
    once per connection rather than once per run, and the process never holds more than
    `max_size`. Opened on demand; while some stay unused, one is closed every 2 s (a burst's
    connections are given back within a minute or so); one broken
    meanwhile (the database restarted) is found on checkout and replaced. Use with `pooled`."""
    return ConnectionPool(
        url,
        connection_class=psycopg.Connection[DictRow],
        kwargs={
            "autocommit": True,
            "row_factory": dict_row,
            "prepare_threshold": PREPARE_THRESHOLD,
            "connect_timeout": CONNECT_TIMEOUT_S,
        },
        configure=_in_utc,
        check=ConnectionPool.check_connection,
        min_size=0,
        max_size=max_size,
        max_idle=2.0,
        timeout=POOL_WAIT_S,
        num_workers=1,
        name="loopwright-runs",
        open=True,
    )


@contextlib.contextmanager
def pooled(
    pool: ConnectionPool[psycopg.Connection[DictRow]], url: str
) -> Iterator[psycopg.Connection[DictRow]]:
    """A connection of `pool` (to the database at `url`) for the block; DatabaseUnavailable,
    as `connect_postgres` says it, where none comes within `POOL_WAIT_S`."""
    try:
        conn = pool.getconn()
    except PoolTimeout as e:
        detail = f"no connection within {POOL_WAIT_S:g} s: {e}"
        raise DatabaseUnavailable(redact(url), detail) from None
    try:
        yield conn
    finally:
        pool.putconn(conn)


async def aconnect_postgres(url: str) -> psycopg.AsyncConnection[DictRow]:
    """The async twin of `connect_postgres`, for langgraph's async saver."""
    try:
        return await psycopg.AsyncConnection.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            prepare_threshold=PREPARE_THRESHOLD,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(redact(url), _one_line(e, url)) from None


def connect_sqlite(path: str) -> sqlite3.Connection:
    """A connection shareable across threads (callers serialise use with a lock).

    WAL lets readers proceed while a writer commits; the busy timeout makes a second writer
    wait for the first instead of failing at once. synchronous is FULL, set rather than assumed
    (a build of SQLite may default WAL databases to NORMAL), so a committed journal write
    survives a power cut; a commit that need not be flushed says so (`Database.transaction`).
    """
    url = f"{SQLITE_PREFIX}{path}"
    where = Path(path)
    # What SQLite would only call "unable to open database file".
    if where.is_dir():
        raise DatabaseUnavailable(url, f"{path} is a directory, not a database file")
    if not where.parent.is_dir():
        raise DatabaseUnavailable(url, f"there is no directory {where.parent} for its file")
    try:
        conn = sqlite3.connect(path, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _use_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
    except sqlite3.Error as e:
        raise DatabaseUnavailable(url, _one_line(e, url)) from None
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode, waiting (up to the busy timeout) for others doing the same.

    Switching a new file to WAL takes its exclusive lock after reading its header; a connection
    that read the header too and then asks is told "database is locked" at once, not after the
    busy handler (SQLite's way out of two readers each waiting for the other): processes that
    open one new database together would fail one of them at random.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(SQLITE_WAL_RETRY_S)
