"""The retention job (`loopwright retention`): an operator removes the checkpoints of runs that
ended long ago, and keeps how they ended.

It is the one path that deletes checkpoints of a run with journaled actions (the server's
delete and rollback routes are refused, and so are the checkpointer's deletions). For each run
it prunes, in one transaction: the run's final summary is written to `lw_run_summaries` (phase,
stop reason and detail, the verification, the final answer, each action's final status, steps,
usage, and who wrote its checkpoints, each writer from where it took the run), the run's row is
marked pruned, then every checkpoint, pending write and blob of the run's thread is deleted.
The journal (`lw_actions`, `lw_action_events`) and the run's `lw_runs` row stay, so `loopwright
show` and `loopwright runs` still say how it ended; a pruned run cannot be claimed again
(`leases.RunPruned`): nothing can start it over from an empty state.

A run is pruned only if it has finished: its latest checkpoint has a stop reason and its phase
is COMPLETED or INCOMPLETE, nothing waits in it (an approval, a parked reconciliation), every
action in the journal is settled (SUCCEEDED, FAILED, REJECTED, CANCELLED: an escalated or
unknown write is a person's to look at), nobody holds its lease, and it ended (lw_runs
`updated_at`, on the database's clock) before the cutoff. Every other run is listed with the
reason it was kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.leases import lock_run
from loopwright.checkpoints.schema import migrate
from loopwright.checkpoints.sql import Database, open_database
from loopwright.checkpoints.writers import Writer, handed_over
from loopwright.core.state import ENDED_PHASES, ActionStatus

SETTLED = frozenset(
    {ActionStatus.SUCCEEDED, ActionStatus.FAILED, ActionStatus.REJECTED, ActionStatus.CANCELLED}
)
# The furthest cutoff a database's date arithmetic is asked for (a thousand years): a longer
# one prunes the same runs, none, and would overflow its timestamps.
FURTHEST_CUTOFF_DAYS = 365_000.0

# The checkpoint tables per backend, both layouts' (a run's are in one of them: the compact
# layout's, or LangGraph's own for the server's runs), and the bytes a row takes.
_TABLES: dict[DatabaseKind, dict[str, str]] = {
    DatabaseKind.POSTGRES: {
        "lw_checkpoints": "pg_column_size(t.*)",
        "lw_checkpoint_writes": "pg_column_size(t.*)",
        "checkpoints": "pg_column_size(t.*)",
        "checkpoint_writes": "pg_column_size(t.*)",
        "checkpoint_blobs": "pg_column_size(t.*)",
    },
    DatabaseKind.SQLITE: {
        "lw_checkpoints": "length(t.body)",
        "lw_checkpoint_writes": "length(t.blob)",
        "checkpoints": "length(t.checkpoint) + length(t.metadata)",
        "writes": "length(t.value)",
    },
}
_CHECKPOINT_TABLES = ("lw_checkpoints", "checkpoints")  # a row of either is one checkpoint


@dataclass(frozen=True)
class Summary:
    """How a pruned run ended: what its last checkpoint and the journal said."""

    run_id: str
    phase: str
    stop_reason: str
    stop_detail: str
    verification: dict[str, Any] | None
    answer: str | None
    actions: dict[str, str]  # action id -> final status
    steps: int
    usage: dict[str, Any]
    ended_at: datetime | str
    pruned_at: datetime | str | None = None
    checkpoints: int = 0
    bytes: int = 0
    # Who wrote the run's checkpoints, each from where it took the run (`handed_over`); None for
    # a run pruned before summaries kept them.
    writers: tuple[Writer, ...] | None = None


@dataclass
class Candidate:
    run_id: str
    ended_at: datetime | str
    checkpoints: int
    bytes: int
    summary: Summary | None = None
    kept: str | None = None  # why the run stays as it is


@dataclass
class RetentionReport:
    older_than_days: float
    cutoff: datetime | str
    dry_run: bool
    pruned: list[Candidate] = field(default_factory=list)
    kept: list[Candidate] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0


def checkpoint_bytes(db: Database, run_id: str | None = None) -> tuple[int, int]:
    """(checkpoints, bytes) the checkpoint tables hold for `run_id`'s thread (or all)."""
    count, size = 0, 0
    where = " WHERE t.thread_id = %s" if run_id is not None else ""
    params: Sequence[Any] = (run_id,) if run_id is not None else ()
    for table, row_size in _TABLES[db.kind].items():
        row = db.one(
            f"SELECT count(*) AS n, coalesce(sum({row_size}), 0) AS size FROM {table} t{where}",
            params,
        )
        assert row is not None
        size += int(row["size"])
        if table in _CHECKPOINT_TABLES:
            count += int(row["n"])
    return count, size


def summary_of(db: Database, run_id: str) -> Summary | None:
    """The summary retention kept of a pruned run, or None if it was not pruned."""
    row = db.one("SELECT * FROM lw_run_summaries WHERE run_id = %s", (run_id,))
    if row is None:
        return None
    kept = db.from_json(row["writers"])
    return Summary(
        run_id=row["run_id"],
        phase=row["phase"],
        stop_reason=row["stop_reason"],
        stop_detail=db.from_json(row["stop_detail"]),
        verification=db.from_json(row["verification"]),
        answer=db.from_json(row["answer"]),
        actions=db.from_json(row["actions"]),
        steps=int(row["steps"]),
        usage=db.from_json(row["usage"]),
        ended_at=row["ended_at"],
        pruned_at=row["pruned_at"],
        checkpoints=int(row["checkpoints"]),
        bytes=int(row["bytes"]),
        writers=None if kept is None else tuple(Writer(**writer) for writer in kept),
    )


def _final_state(saver: Any, run_id: str) -> tuple[dict[str, Any], bool] | None:
    """The run's latest checkpoint values and whether anything is pending in it (an interrupt
    or a next step); None if the run has no checkpoint."""
    found = saver.get_tuple({"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    if found is None:
        return None
    pending = any(channel == "__interrupt__" for _, channel, _ in found.pending_writes or ())
    return found.checkpoint["channel_values"], pending


def _judge(db: Database, saver: Any, candidate: Candidate, row: dict[str, Any]) -> None:
    """Fill in why `candidate` is kept, or its summary if it may be pruned."""
    if row["lease_live"]:
        candidate.kept = f"leased by {row['owner']}"
        return
    final = _final_state(saver, candidate.run_id)
    if final is None:
        candidate.kept = "no checkpoint"
        return
    values, pending = final
    phase, stop_reason = values.get("phase"), values.get("stop_reason")
    if pending or phase not in ENDED_PHASES or not stop_reason:
        candidate.kept = f"not finished ({'waiting' if pending else phase})"
        return
    actions = {
        r["action_id"]: r["status"]
        for r in db.execute(
            "SELECT action_id, status FROM lw_actions WHERE run_id = %s ORDER BY created_at",
            (candidate.run_id,),
        )
    }
    unsettled = [f"{a} {s}" for a, s in actions.items() if s not in SETTLED]
    if unsettled:
        candidate.kept = f"writes not settled: {', '.join(unsettled)}"
        return
    verification = values.get("verification")
    # The model's final answer, kept as its own (the runtime's account is the verification's).
    facts = (verification or {}).get("facts") or {}
    answer = facts.get("model_answer", facts.get("answer"))
    candidate.summary = Summary(
        run_id=candidate.run_id,
        phase=str(phase),
        stop_reason=str(stop_reason),
        stop_detail=str(values.get("stop_detail") or ""),
        verification=verification,
        answer=answer if isinstance(answer, str) else None,
        actions=actions,
        steps=int(values.get("step") or 0),
        usage=dict(values.get("usage") or {}),
        ended_at=candidate.ended_at,
        checkpoints=candidate.checkpoints,
        bytes=candidate.bytes,
        writers=tuple(_writers(saver, candidate.run_id)),
    )


def _writers(saver: Any, run_id: str) -> list[Writer]:
    """Who wrote the run's checkpoints (every namespace's, oldest first: LangGraph's checkpoint
    ids sort by time), each from where it took the run."""
    saved = sorted(
        saver.list({"configurable": {"thread_id": run_id}}),
        key=lambda found: str(found.config["configurable"]["checkpoint_id"]),
    )
    return handed_over(found.metadata for found in saved)


def _prune(db: Database, summary: Summary) -> bool:
    """Record the summary and delete the run's checkpoints, in one transaction, unless the run
    was claimed meanwhile (False)."""
    with db.transaction():
        run = lock_run(db, summary.run_id, exclusive=True)
        if run is None or run.lease_live or run.pruned_at is not None:
            return False
        db.execute(
            "INSERT INTO lw_run_summaries (run_id, phase, stop_reason, stop_detail, verification,"
            " answer, actions, steps, usage, checkpoints, bytes, ended_at, writers, pruned_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now())",
            (
                summary.run_id,
                summary.phase,
                summary.stop_reason,
                db.to_json(summary.stop_detail),
                db.to_json(summary.verification),
                db.to_json(summary.answer),
                db.to_json(summary.actions),
                summary.steps,
                db.to_json(summary.usage),
                summary.checkpoints,
                summary.bytes,
                summary.ended_at,
                db.to_json(
                    None
                    if summary.writers is None
                    else [dataclasses.asdict(writer) for writer in summary.writers]
                ),
            ),
        )
        db.execute("UPDATE lw_runs SET pruned_at = now() WHERE run_id = %s", (summary.run_id,))
        # No request of it waits any more: its decision claims go with its checkpoints.
        db.execute("DELETE FROM lw_decision_claims WHERE run_id = %s", (summary.run_id,))
        for table in _TABLES[db.kind]:
            db.execute(f"DELETE FROM {table} WHERE thread_id = %s", (summary.run_id,))
    return True


def retain(url: str, older_than_days: float, *, dry_run: bool = False) -> RetentionReport:
    """Prune every finished run in the database at `url` that ended more than
    `older_than_days` ago (or, with `dry_run`, say which it would prune, changing nothing)."""
    if not older_than_days >= 0:  # NaN too
        raise ValueError(f"--older-than must be 0 or more days, got {older_than_days}")
    seconds = -min(older_than_days, FURTHEST_CUTOFF_DAYS) * 86_400
    with open_database(url) as db, open_checkpointer(url) as saver:
        migrate(db)
        cutoff_row = db.one("SELECT {after_seconds} AS cutoff", (seconds,))
        assert cutoff_row is not None
        report = RetentionReport(older_than_days, cutoff_row["cutoff"], dry_run)
        report.bytes_before = checkpoint_bytes(db)[1]
        rows = db.execute(
            "SELECT run_id, owner, updated_at,"
            " (owner IS NOT NULL AND lease_expires_at > now()) AS lease_live FROM lw_runs"
            " WHERE updated_at < {after_seconds}"
            " AND pruned_at IS NULL ORDER BY updated_at",
            (seconds,),
        )
        for row in rows:
            count, size = checkpoint_bytes(db, row["run_id"])
            candidate = Candidate(row["run_id"], row["updated_at"], count, size)
            _judge(db, saver, candidate, row)
            if candidate.summary is None:
                report.kept.append(candidate)
            elif dry_run or _prune(db, candidate.summary):
                report.pruned.append(candidate)
            else:
                candidate.kept = "claimed while retention ran"
                report.kept.append(candidate)
        report.bytes_after = checkpoint_bytes(db)[1]
    return report
