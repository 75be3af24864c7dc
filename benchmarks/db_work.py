"""Database work as the wire shows it: transactions, round trips, statements and bytes.

libpq can trace every protocol message of a connection (PQtrace). `traced_connections` turns
that on for each psycopg connection opened inside it (the runner's saver, journal and lease
store alike), and `DbWork.read` counts the traces:

* round trips: the times a connection turned from sending to reading (an F message, then a B);
* statements: Execute messages (extended protocol) and Query messages (simple protocol);
* transactions: ReadyForQuery messages saying the session is idle: the end of an explicit
  transaction, or of a statement run in autocommit (each its own transaction);
* bytes: what the client sent.

Beside them, what the server wrote for it: the WAL between two readings of the server's insert
position (`wal_position`), which counts every client of the server: read it on an idle one.

Tracing slows the client down: count in a run of its own, never in a timed one.
"""

from __future__ import annotations

import itertools
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq


@dataclass(frozen=True)
class DbWork:
    transactions: int = 0
    round_trips: int = 0
    statements: int = 0
    bytes_sent: int = 0
    wal_bytes: int = 0  # WAL the server wrote meanwhile (not from the trace: `wal_position`)

    def __add__(self, other: DbWork) -> DbWork:
        return DbWork(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: DbWork) -> DbWork:
        return DbWork(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @classmethod
    def median(cls, works: Sequence[DbWork]) -> DbWork:
        """The median of each field."""
        columns = zip(*map(astuple, works), strict=True)
        return cls(*(int(statistics.median(column)) for column in columns))

    def per(self, n: float) -> str:
        return (
            f"{self.transactions / n:.1f} transactions, {self.round_trips / n:.1f} round trips, "
            f"{self.statements / n:.1f} statements, {self.bytes_sent / n:,.0f} bytes sent, "
            f"{self.wal_bytes / n:,.0f} bytes of WAL written"
        )

    @classmethod
    def read(cls, trace: Path) -> DbWork:
        """Count one connection's trace (written with timestamps suppressed)."""
        previous = ""
        transactions = round_trips = statements = sent = 0
        for line in trace.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) < 3 or fields[0] not in ("F", "B"):
                continue  # a continuation line of a long message
            direction, length, kind = fields[0], int(fields[1]), fields[2]
            if direction == "F":
                sent += length
                statements += kind in ("Execute", "Query")
            else:
                round_trips += previous == "F"
                transactions += kind == "ReadyForQuery" and fields[-1].strip() == "I"
            previous = direction
        return cls(transactions, round_trips, statements, sent)


def wal_position(url: str) -> int:
    """The Postgres server's WAL insert position in bytes: the difference of two readings is the
    WAL every client of the server wrote between them (records and full-page images)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Traces:
    """The connections traced so far: their trace files, and how to stop tracing them."""

    files: list[Path]
    stops: list[Callable[[], None]]

    def collect(self) -> DbWork:
        """Stop tracing every connection (flushing its trace) and count all of them."""
        for stop in self.stops:
            stop()
        self.stops.clear()
        work = DbWork()
        for path in self.files:
            work += DbWork.read(path)
        return work


@contextmanager
def traced_connections(directory: Path) -> Iterator[Traces]:
    """Trace each psycopg connection opened inside the block into a file under `directory`."""
    traces = Traces([], [])
    original = psycopg.Connection.connect

    def connect(cls: type[psycopg.Connection[Any]], *args: Any, **kwargs: Any) -> Any:
        conn = original.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined]
        # Connections open in several threads at once (the lease keeper's, the run's): each
        # its own file, numbered by a counter whose next() no two threads share.
        path = directory / f"connection-{next(numbers)}.trace"
        # libpq writes to a stream of its own on this descriptor, flushed when tracing stops:
        # before the connection closes, or at `collect`.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        close = conn.close

        def stop() -> None:
            if fd in open_fds:
                open_fds.remove(fd)
                if not conn.closed:
                    conn.pgconn.untrace()
                os.close(fd)

        def close_traced() -> None:
            stop()
            close()

        open_fds.add(fd)
        conn.close = close_traced
        traces.files.append(path)
        traces.stops.append(stop)
        return conn

    open_fds: set[int] = set()
    numbers = itertools.count()
    psycopg.Connection.connect = classmethod(connect)  # type: ignore[assignment, method-assign]
    try:
        yield traces
    finally:
        psycopg.Connection.connect = original  # type: ignore[method-assign]
        traces.collect()
