"""SQLite plumbing shared by the services: one WAL-mode file per service.

Handlers are ``async def`` and touch SQLite synchronously, so every statement of a service runs
on the event-loop thread and a transaction never interleaves with another request's. Each
transaction is short and contains no ``await``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path


def open_database(path: Path, schema: str) -> sqlite3.Connection:
    """Open (creating if needed) a service's database and apply its idempotent schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    return db


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back if the block raises (a ServiceError included)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def utc_now() -> datetime:
    return datetime.now(UTC)
