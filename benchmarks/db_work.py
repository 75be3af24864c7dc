"""Database work as the wire shows it: transactions, round trips, statements and bytes.

libpq can trace every protocol message of a connection (PQtrace). `traced_connections` turns
that on for each psycopg connection opened inside it (the runner's saver, journal and lease
store alike), and `DbWork.read` counts the traces:

* round trips: the times a connection turned from sending to reading (an F message, then a B);
* statements: Execute messages (extended protocol) and Query messages (simple protocol);
* transactions: ReadyForQuery messages saying the session is idle: the end of an explicit
  transaction, or of a statement run in autocommit (each its own transaction);
* bytes: what the client sent.

Each message carries libpq's timestamp, so that the work can also be split by phase of a run
(`Traces.phases`): the caller marks, with `time.time()`, when each phase began.

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
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

# When a phase of a run began (`time.time()`) and its name: a trace's messages from then until
# the next mark are that phase's.
Mark = tuple[float, str]
WHOLE = "whole"  # the one phase of a trace read without marks


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
    def read(cls, trace: Path, marks: Sequence[Mark] = ()) -> dict[str, DbWork]:
        """Count one connection's trace, by phase: a message's is the last mark at or before
        its timestamp (the first mark's if it came before every mark; `WHOLE` without marks)."""
        ordered = sorted(marks) or [(0.0, WHOLE)]
        phases: dict[str, list[int]] = {}
        previous = ""
        for line in trace.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) < 4 or fields[1] not in ("F", "B"):
                continue  # a continuation line of a long message
            when, direction, length, kind = _moment(fields[0]), fields[1], int(fields[2]), fields[3]
            phase = next((name for at, name in reversed(ordered) if at <= when), ordered[0][1])
            counts = phases.setdefault(phase, [0, 0, 0, 0])  # the first four fields
            if direction == "F":
                counts[3] += length
                counts[2] += kind in ("Execute", "Query")
            else:
                counts[1] += previous == "F"
                counts[0] += kind == "ReadyForQuery" and fields[-1].strip() == "I"
            previous = direction
        return {phase: cls(*counts) for phase, counts in phases.items()}


def _moment(stamp: str) -> float:
    """libpq's timestamp of a traced message (local time, to the microsecond) as `time.time()`."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


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
        return sum(self.phases().values(), DbWork())

    def phases(self, marks: Sequence[Mark] = ()) -> dict[str, DbWork]:
        """Stop tracing every connection and count all of them by phase (see `DbWork.read`)."""
        for stop in self.stops:
            stop()
        self.stops.clear()
        work: dict[str, DbWork] = {}
        for path in self.files:
            for phase, counted in DbWork.read(path, marks).items():
                work[phase] = work.get(phase, DbWork()) + counted
        return work


@contextmanager
def traced_connections(directory: Path) -> Iterator[Traces]:
    """Trace each psycopg connection opened inside the block into a file under `directory`:
    opened by `psycopg.Connection.connect`, as loopwright's are, or by `psycopg.connect`, as
    SQLAlchemy's psycopg dialect opens DBOS's (the module's name is bound to the class's method
    at import, so it is replaced as well)."""
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
        conn.pgconn.trace(fd)  # with each message's timestamp, for `Traces.phases`
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
    module_connect = psycopg.connect
    psycopg.Connection.connect = classmethod(connect)  # type: ignore[assignment, method-assign]
    psycopg.connect = psycopg.Connection.connect
    try:
        yield traces
    finally:
        psycopg.Connection.connect = original  # type: ignore[method-assign]
        psycopg.connect = module_connect
        traces.collect()
