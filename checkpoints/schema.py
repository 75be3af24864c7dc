"""loopwright's own tables (lw_runs, the journal) and how a database gets to their current shape.

Each migration takes a database from one version to the next in one transaction; `migrate`
applies the ones it lacks, holding a lock meanwhile, so that processes starting together apply
each exactly once. The version is the one row of `lw_schema`. A database from before versions
were kept (it has lw_runs but no lw_schema) is at version 1, the shape migration 1 creates.

Migrations are written once, in Postgres spelling with the fragments of `checkpoints.sql`;
where the dialects cannot share a statement, the migration says so by `db.kind`. LangGraph's
checkpoint tables are the savers' own business (their `setup`), not versioned here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import psycopg

from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.sql import Database

# Postgres: a transaction-scoped advisory lock that every migrating process takes first.
# SQLite needs none: `Database.transaction` begins IMMEDIATE, which already excludes writers.
_MIGRATION_LOCK_KEY = 0x6C77_5343  # "lwSC"

_RUNS_V1 = """CREATE TABLE IF NOT EXISTS lw_runs (
    run_id TEXT PRIMARY KEY,
    owner TEXT,
    fence BIGINT NOT NULL,
    lease_expires_at {timestamp},
    phase TEXT NOT NULL,
    task TEXT NOT NULL,
    user_id TEXT NOT NULL,
    next_attempt_at {timestamp},
    cancel_requested_at {timestamp},
    created_at {timestamp} NOT NULL,
    updated_at {timestamp} NOT NULL
)"""
_ACTIONS_V1 = """CREATE TABLE IF NOT EXISTS lw_actions (
    action_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args {json} NOT NULL,
    args_digest TEXT NOT NULL,
    intent_key TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    fence BIGINT NOT NULL,
    outcome {json},
    created_at {timestamp} NOT NULL,
    updated_at {timestamp} NOT NULL
)"""
_EVENTS_V1 = """CREATE TABLE IF NOT EXISTS lw_action_events (
    action_id TEXT NOT NULL REFERENCES lw_actions (action_id),
    seq INTEGER NOT NULL,
    from_status TEXT,
    to_status TEXT NOT NULL,
    fence BIGINT NOT NULL,
    at {timestamp} NOT NULL,
    detail {json},
    PRIMARY KEY (action_id, seq)
)"""


def _v1_runs_and_journal(db: Database) -> None:
    """Runs with leases and fencing tokens; the action journal and its status history."""
    for statement in (
        _RUNS_V1,
        _ACTIONS_V1,
        "CREATE INDEX IF NOT EXISTS lw_actions_by_run ON lw_actions (run_id, created_at)",
        "CREATE INDEX IF NOT EXISTS lw_actions_by_status ON lw_actions (status)",
        _EVENTS_V1,
    ):
        db.execute(statement)


def _v2_failure_streak_and_json(db: Database) -> None:
    """A run's failure streak (attempts in a row that ended in an error, the last error); and
    journal values as JSON rather than JSONB in Postgres, which cannot hold a NUL character
    that a business system may answer with (SQLite stores text either way)."""
    db.execute("ALTER TABLE lw_runs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE lw_runs ADD COLUMN last_error TEXT")
    if db.kind is DatabaseKind.POSTGRES:
        for table, column in (
            ("lw_actions", "args"),
            ("lw_actions", "outcome"),
            ("lw_action_events", "detail"),
        ):
            db.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE JSON USING {column}::json")


def _v3_run_agent(db: Database) -> None:
    """Which agent (name and version) a run belongs to: a process of another agent never
    advances it, and an operator can list the runs still pinned to an old version. Runs from
    before agents were recorded have an empty name."""
    db.execute("ALTER TABLE lw_runs ADD COLUMN agent TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE lw_runs ADD COLUMN agent_version TEXT NOT NULL DEFAULT ''")


def _v4_run_summaries(db: Database) -> None:
    """How a run ended, kept by the retention job (`checkpoints.retention`) when it removes the
    run's checkpoints: a pruned run is its summary, its journal and its lw_runs row."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS lw_run_summaries (
    run_id TEXT PRIMARY KEY REFERENCES lw_runs (run_id),
    phase TEXT NOT NULL,
    stop_reason TEXT NOT NULL,
    stop_detail TEXT NOT NULL,
    verification {json},
    answer TEXT,
    actions {json} NOT NULL,
    steps INTEGER NOT NULL,
    usage {json} NOT NULL,
    checkpoints INTEGER NOT NULL,
    bytes BIGINT NOT NULL,
    ended_at {timestamp} NOT NULL,
    pruned_at {timestamp} NOT NULL
)"""
    )


def _v5_pruned_mark(db: Database) -> None:
    """A pruned run's row says so itself: a claim is then one guarded UPDATE, whose guard sees
    a prune that committed while the UPDATE waited for the row (Postgres re-reads the row it
    waited for, but not another table, under the statement's older snapshot)."""
    db.execute("ALTER TABLE lw_runs ADD COLUMN pruned_at {timestamp}")
    db.execute(
        "UPDATE lw_runs SET pruned_at = (SELECT s.pruned_at FROM lw_run_summaries s"
        " WHERE s.run_id = lw_runs.run_id)"
        " WHERE run_id IN (SELECT run_id FROM lw_run_summaries)"
    )


def _v6_summary_text_as_json(db: Database) -> None:
    """A pruned run's detail and answer as JSON strings: they are the model's and the business
    systems' text, which may hold a NUL character, and a Postgres TEXT column cannot (the run's
    checkpoints, now gone, kept it). Existing rows are converted, on SQLite too, where the
    column stays TEXT and now holds the JSON spelling."""
    if db.kind is DatabaseKind.POSTGRES:
        db.execute(
            "ALTER TABLE lw_run_summaries"
            " ALTER COLUMN stop_detail TYPE JSON USING to_json(stop_detail),"
            " ALTER COLUMN answer TYPE JSON USING to_json(answer)"
        )
    else:
        db.execute(
            "UPDATE lw_run_summaries SET stop_detail = json_quote(stop_detail),"
            " answer = CASE WHEN answer IS NULL THEN NULL ELSE json_quote(answer) END"
        )


def _v7_compact_checkpoints(db: Database) -> None:
    """The runtime's checkpoints in the compact layout (`checkpoints.frames`): a row per
    checkpoint, holding what changed since its parent and the writes of the superstep that made
    it; and the writes saved without a checkpoint after them (an interrupt's, an error's, a
    resume value). Threads LangGraph's own savers wrote stay in LangGraph's tables, where the
    runtime's saver still reads and writes them (`checkpoints.compact`)."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS lw_checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_id TEXT,
    keyframe BOOLEAN NOT NULL,
    body {blob} NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
)"""
    )
    db.execute(
        """CREATE TABLE IF NOT EXISTS lw_checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_path TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT NOT NULL,
    blob {blob} NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
)"""
    )


# Runs that have not ended, as the lease store's queries say it (`LeaseStore.due`, `unended`):
# a query uses a partial index only where its WHERE has the index's term (SQLite: as written).
UNENDED_RUNS = "phase NOT IN ('COMPLETED', 'INCOMPLETE')"


def _v8_unended_runs_index(db: Database) -> None:
    """The runs a worker polls for and a person may be asked about, indexed apart: a database's
    runs are mostly ended ones, which a poll would otherwise scan every time."""
    db.execute(
        f"CREATE INDEX IF NOT EXISTS lw_runs_unended ON lw_runs (updated_at) WHERE {UNENDED_RUNS}"
    )


def _v9_run_tenant_and_engine(db: Database) -> None:
    """Whose a run is, in full (a principal is a tenant's user: one user id may be two tenants'
    users), and whether a server engine hosts it (`engine`, "" for runs of the CLI and workers):
    a served run is resumed through its engine, whose own records must agree with lw_runs."""
    db.execute("ALTER TABLE lw_runs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'")
    db.execute("ALTER TABLE lw_runs ADD COLUMN engine TEXT NOT NULL DEFAULT ''")


def _v10_decision_claims(db: Database) -> None:
    """One decision per approval request across server instances (`checkpoints.decision_claims`):
    the first approver's claim on a request wins; it lapses at `claimed_until`."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS lw_decision_claims (
            run_id TEXT NOT NULL,
            approval_id TEXT NOT NULL,
            asked TEXT NOT NULL,
            approver TEXT NOT NULL,
            decision TEXT NOT NULL,
            claimed_until {timestamp} NOT NULL,
            PRIMARY KEY (run_id, approval_id, asked)
        )"""
    )


def _v11_admissions(db: Database) -> None:
    """The runs a multi-instance engine's auth hooks admitted, by thread and principal
    (`server.admissions.EngineAdmissions`): a run is admitted while none is on its thread and
    its principal holds fewer than the bound, whichever instance asks."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS lw_admissions (
            thread_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            user_id TEXT NOT NULL,
            admitted_at {timestamp} NOT NULL
        )"""
    )
    db.execute(
        "CREATE INDEX IF NOT EXISTS lw_admissions_principal ON lw_admissions (tenant, user_id)"
    )


def _v12_pruned_writers(db: Database) -> None:
    """Who wrote a pruned run's checkpoints, kept in its summary (`checkpoints.writers`): `show`
    still says where the run changed hands once its checkpoints are gone. NULL for a run pruned
    before: its writers went with its checkpoints."""
    db.execute("ALTER TABLE lw_run_summaries ADD COLUMN writers {json}")


MIGRATIONS: tuple[Callable[[Database], None], ...] = (
    _v1_runs_and_journal,
    _v2_failure_streak_and_json,
    _v3_run_agent,
    _v4_run_summaries,
    _v5_pruned_mark,
    _v6_summary_text_as_json,
    _v7_compact_checkpoints,
    _v8_unended_runs_index,
    _v9_run_tenant_and_engine,
    _v10_decision_claims,
    _v11_admissions,
    _v12_pruned_writers,
)
LATEST = len(MIGRATIONS)


def migrate(db: Database) -> int:
    """Bring loopwright's tables to the current version; returns how many migrations ran.

    Every process that opens the journal, the lease store or the checkpointer calls it, and
    nearly always finds the tables current: that is read first, without the lock (one
    statement, where the locked read is a transaction of four). A database behind, or one
    another process is migrating, is read again under the lock."""
    current = _version_if_kept(db)
    if current is not None and current >= LATEST:
        return 0
    applied = 0
    while True:
        with db.transaction():
            version = _locked_version(db)
            if version >= LATEST:
                return applied
            MIGRATIONS[version](db)
            db.execute("DELETE FROM lw_schema")
            db.execute("INSERT INTO lw_schema (version) VALUES (%s)", (version + 1,))
            applied += 1


def schema_version(db: Database) -> int:
    """The version of loopwright's tables in `db` (0: none of them yet)."""
    with db.transaction():
        return _locked_version(db)


def _locked_version(db: Database) -> int:
    """The version, read under the migration lock (call inside a transaction)."""
    if db.kind is DatabaseKind.POSTGRES:
        db.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
    db.execute("CREATE TABLE IF NOT EXISTS lw_schema (version INTEGER NOT NULL)")
    stored = _stored_version(db)
    if stored is not None:
        return stored
    return 1 if _has_table(db, "lw_runs") else 0


def _version_if_kept(db: Database) -> int | None:
    """The version lw_schema holds, or None if there is no lw_schema yet or no row in it (read
    outside any transaction: a failed statement on Postgres would end one)."""
    try:
        return _stored_version(db)
    except (psycopg.errors.UndefinedTable, sqlite3.OperationalError) as e:
        if isinstance(e, sqlite3.OperationalError) and "no such table" not in str(e):
            raise
        return None


def _stored_version(db: Database) -> int | None:
    """The version lw_schema holds (None: no row yet); the table must exist."""
    row = db.one("SELECT version FROM lw_schema")
    return None if row is None else int(row["version"])


def _has_table(db: Database, name: str) -> bool:
    if db.kind is DatabaseKind.POSTGRES:
        row = db.one("SELECT to_regclass(%s) IS NOT NULL AS found", (name,))
        return bool(row and row["found"])
    found = db.one(
        "SELECT 1 AS found FROM sqlite_master WHERE type = 'table' AND name = %s", (name,)
    )
    return found is not None
