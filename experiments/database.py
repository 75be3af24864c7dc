"""A fresh Postgres database for one experiment or benchmark, dropped afterwards.

On the server named by `--db`, else DATABASE_URL, else the local server every developer machine
and CI run has (127.0.0.1:5432, user postgres).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def server_url(explicit: str | None = None) -> str:
    return explicit or os.environ.get("DATABASE_URL") or LOCAL_SERVER


@contextmanager
def fresh_database(server: str, prefix: str = "lw_exp") -> Iterator[str]:
    """Create a uniquely named database on `server`; drop it (even with open connections) after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))
