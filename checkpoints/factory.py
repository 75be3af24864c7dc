"""Checkpointers by URL: the embedded SQLite default or Postgres, set up and ready to use.

`open_checkpointer` is what the CLI and the workers use: a sync saver that can be fenced to a
run's lease (see `checkpoints.fenced`), writing new threads in the compact layout
(`checkpoints.compact`) and threads begun in LangGraph's own layout in that one. The stock
tables are set up too, for those. The LangGraph server's saver is `server.checkpointer`'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import psycopg

from loopwright.checkpoints.compact import CompactSaver, Layout
from loopwright.checkpoints.database import (
    DatabaseKind,
    connect_postgres,
    connect_sqlite,
    database_kind,
    sqlite_path,
)
from loopwright.checkpoints.fenced import Fence, FencedPostgresSaver, FencedSqliteSaver


@contextmanager
def open_checkpointer(
    url: str, *, fence: Fence | None = None, new_threads: Layout = Layout.COMPACT
) -> Iterator[CompactSaver]:
    """A set-up saver on its own connection to the database at `url`, closed on exit, that
    writes a new thread in `new_threads`' layout (the runtime's, `Layout.COMPACT`, or
    LangGraph's own, in which the server writes its runs) and a thread in the layout it began
    in."""
    if database_kind(url) is DatabaseKind.POSTGRES:
        with connect_postgres(url) as conn:
            saver = fenced_saver(conn, fence=fence, new_threads=new_threads)
            saver.setup()
            yield saver
    else:
        with closing(connect_sqlite(sqlite_path(url))) as sconn:
            saver = fenced_saver(sconn, fence=fence, new_threads=new_threads)
            saver.setup()
            yield saver


def fenced_saver(
    conn: psycopg.Connection[Any] | sqlite3.Connection,
    *,
    fence: Fence | None = None,
    new_threads: Layout = Layout.COMPACT,
) -> CompactSaver:
    """The fenced saver on `conn`, over both layouts (its tables set up elsewhere)."""
    legacy: FencedPostgresSaver | FencedSqliteSaver = (
        FencedPostgresSaver(conn, fence=fence)
        if isinstance(conn, psycopg.Connection)
        else FencedSqliteSaver(conn, fence=fence)
    )
    return CompactSaver(legacy, conn, fence=fence, new_threads=new_threads)
