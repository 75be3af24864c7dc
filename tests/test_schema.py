"""Schema versions: a fresh database and one made before versions were kept both end up at the
current shape, with their rows kept, and processes starting together migrate it once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from loopwright.checkpoints.database import DatabaseKind, connect_sqlite
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import RunPruned, open_lease_store
from loopwright.checkpoints.retention import summary_of
from loopwright.checkpoints.schema import LATEST, MIGRATIONS, migrate, schema_version
from loopwright.checkpoints.sql import Database, open_database
from loopwright.core.state import Action, ActionStatus, digest


def test_a_fresh_database_is_migrated_to_the_latest_version_once(empty_database_url: str) -> None:
    with open_database(empty_database_url) as db:
        assert schema_version(db) == 0
        assert migrate(db) == LATEST
        assert migrate(db) == 0
        assert schema_version(db) == LATEST


class FirstRelease(Database):
    """Spells journal values as the first release did: JSONB in Postgres."""

    def spell(self, sql: str) -> str:
        if self.kind is DatabaseKind.POSTGRES:
            sql = sql.replace("{json}", "JSONB")
        return super().spell(sql)


def _as_released_before_versions(db: Database) -> None:
    """The tables as the first release created them: version 1's shape, no lw_schema."""
    first = FirstRelease(db.conn)
    with first.transaction():
        MIGRATIONS[0](first)
    with db.transaction():
        db.execute(
            "INSERT INTO lw_runs (run_id, owner, fence, phase, task, user_id, created_at,"
            " updated_at) VALUES ('run-old', NULL, 3, 'COMPLETED', 'an old task', 'u-1',"
            " now(), now())"
        )


def test_a_database_from_before_versions_is_migrated_keeping_its_rows(
    empty_database_url: str,
) -> None:
    with open_database(empty_database_url) as db:
        _as_released_before_versions(db)
        assert schema_version(db) == 1
    with (
        open_lease_store(empty_database_url) as leases,
        open_journal(empty_database_url) as journal,
    ):
        old = leases.get("run-old")
        assert old is not None and (old.fence, old.task) == (3, "an old task")
        assert (old.failures, old.last_error) == (0, None)
        # What version 2 is for: a NUL character in a business answer is journaled as it came.
        args = {"order_id": "O-42", "amount": "1.00"}
        action = journal.plan(
            Action(
                action_id="act-nul",
                run_id="run-old",
                call_id="call-1",
                tool="refund",
                args=args,
                args_digest=digest(args),
                intent_key="refund:run-old:O-42",
                status=ActionStatus.PLANNED,
                fence=3,
            )
        )
        journal.transition(action.action_id, ActionStatus.PLANNED, ActionStatus.DISPATCHED, fence=3)
        done = journal.transition(
            action.action_id,
            ActionStatus.DISPATCHED,
            ActionStatus.SUCCEEDED,
            fence=3,
            outcome={"refund_id": "R-1\x00"},
        )
        assert done.outcome == {"refund_id": "R-1\x00"}
        assert schema_version(leases.db) == LATEST


def run_threads(count: int, target: Callable[[], None], timeout: float) -> None:
    """`target` in `count` threads at once, each waited for (at most `timeout` seconds)."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)


def test_processes_starting_together_migrate_once(empty_database_url: str) -> None:
    errors: list[BaseException] = []
    applied: list[int] = []
    start = threading.Barrier(4)

    def start_up() -> None:
        try:
            with open_database(empty_database_url) as db:
                start.wait(30)
                applied.append(migrate(db))
        except BaseException as exc:
            errors.append(exc)

    run_threads(4, start_up, 60)
    assert errors == []
    assert sum(applied) == LATEST  # each migration ran once, in whichever process got to it
    with open_database(empty_database_url) as db:
        assert db.execute("SELECT count(*) AS n, max(version) AS v FROM lw_schema") == [
            {"n": 1, "v": LATEST}
        ]
        if db.kind is DatabaseKind.POSTGRES:  # the journal's values are JSON, not JSONB
            types = db.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_name = 'lw_actions' AND column_name IN ('args', 'outcome')"
            )
            assert {t["data_type"] for t in types} == {"json"}


def at_version(db: Database, version: int) -> None:
    """Bring a new database to `version` of loopwright's tables, as a release of then left it."""
    for migration in MIGRATIONS[:version]:
        migration(db)
    db.execute("CREATE TABLE lw_schema (version INTEGER NOT NULL)")
    db.execute("INSERT INTO lw_schema (version) VALUES (%s)", (version,))


def test_a_run_pruned_before_version_5_is_marked_pruned_and_never_claimed(
    empty_database_url: str,
) -> None:
    with open_database(empty_database_url) as db, db.transaction():
        at_version(db, 4)
        for run_id in ("run-pruned", "run-kept"):
            db.execute(
                "INSERT INTO lw_runs (run_id, owner, fence, phase, task, user_id,"
                " created_at, updated_at) VALUES (%s, NULL, 2, 'COMPLETED', 't', 'u-1',"
                " now(), now())",
                (run_id,),
            )
        db.execute(
            "INSERT INTO lw_run_summaries (run_id, phase, stop_reason, stop_detail,"
            " actions, steps, usage, checkpoints, bytes, ended_at, pruned_at) VALUES"
            " ('run-pruned', 'COMPLETED', 'completed', '', %s, 3, %s, 9, 900, now(), now())",
            ("{}", "{}"),
        )
        summary = db.one("SELECT pruned_at FROM lw_run_summaries")
    with open_lease_store(empty_database_url) as leases:
        pruned, kept = leases.get("run-pruned"), leases.get("run-kept")
        assert summary is not None and pruned is not None and kept is not None
        assert pruned.pruned_at == TypeAdapter(datetime).validate_python(summary["pruned_at"])
        assert kept.pruned_at is None
        with pytest.raises(RunPruned):
            leases.claim("run-pruned", "worker-a", ttl_s=30)
        assert leases.claim("run-kept", "worker-a", ttl_s=30).fence == 3


def test_connections_opening_one_new_sqlite_database_together_all_open_it(
    tmp_path: Path,
) -> None:
    """Switching a new file to WAL is refused at once ("database is locked") to all but one of
    the connections asking together; each waits for it instead (1 file in 10 failed an open
    before, with 8 connections)."""
    failures: list[BaseException] = []
    for n in range(40):
        path = str(tmp_path / f"new-{n}.sqlite3")
        start = threading.Barrier(8)

        def open_it(path: str = path, start: threading.Barrier = start) -> None:
            start.wait(10)
            try:
                conn = connect_sqlite(path)
                assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                conn.close()
            except BaseException as exc:
                failures.append(exc)

        run_threads(8, open_it, 30)
    assert failures == []


def test_a_summary_kept_before_version_6_reads_back_as_it_was(empty_database_url: str) -> None:
    """Version 6 keeps a pruned run's detail and answer as JSON strings (a NUL character fits
    there, not in a Postgres TEXT column); the text of summaries kept before is converted."""
    detail, answer = 'ended: "needs_human" after 8 attempts', "Refunded 40.00\nto O-802."
    with open_database(empty_database_url) as db, db.transaction():
        at_version(db, 5)
        for run_id in ("run-answered", "run-silent"):
            db.execute(
                "INSERT INTO lw_runs (run_id, owner, fence, phase, task, user_id,"
                " created_at, updated_at, pruned_at) VALUES (%s, NULL, 2, 'COMPLETED', 't',"
                " 'u-1', now(), now(), now())",
                (run_id,),
            )
            db.execute(
                "INSERT INTO lw_run_summaries (run_id, phase, stop_reason, stop_detail, answer,"
                " actions, steps, usage, checkpoints, bytes, ended_at, pruned_at) VALUES"
                " (%s, 'COMPLETED', 'completed', %s, %s, %s, 3, %s, 9, 900, now(), now())",
                (run_id, detail, answer if run_id == "run-answered" else None, "{}", "{}"),
            )
    with open_database(empty_database_url) as db:
        assert migrate(db) == LATEST - 5
        answered, silent = summary_of(db, "run-answered"), summary_of(db, "run-silent")
    assert answered is not None and (answered.stop_detail, answered.answer) == (detail, answer)
    assert silent is not None and (silent.stop_detail, silent.answer) == (detail, None)
