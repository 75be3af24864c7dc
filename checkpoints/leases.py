"""Run leases with fencing tokens: one writer per run, and a way to refuse the stale one.

A worker claims a run for a short time (the lease) and renews it while it works. If it stalls
past the expiry, another worker may take the run over. The stalled worker may wake up and keep
writing; the fencing token is what stops it: every (re)acquisition of a run bumps `fence`, every
durable write carries the writer's fence, and the checkpointer and the journal refuse a write
whose fence is behind the run's, in the same transaction that would write.

Expiry is compared in SQL against the database clock (`now()`), never against a worker's clock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from loopwright.checkpoints.schema import UNENDED_RUNS, migrate
from loopwright.checkpoints.sql import Database, Row, open_database
from loopwright.core.state import NEVER_STRANDED, Phase
from loopwright.observability.metrics import FENCE_REFUSALS, LEASE_TAKEOVERS

_LEASE_LIVE = "COALESCE(lease_expires_at > now(), FALSE) AS lease_live"  # on the database's clock
_RUN_COLUMNS = (
    "run_id, owner, fence, lease_expires_at, phase, task, user_id, tenant, engine,"
    " next_attempt_at, cancel_requested_at, failures, last_error, agent, agent_version,"
    " created_at, updated_at, pruned_at, " + _LEASE_LIVE
)
_SELECT_RUNS = "SELECT " + _RUN_COLUMNS + " FROM lw_runs"
# lw_runs.engine of a run a server's engine started and continues (an in-process run's is "").
SERVER_ENGINE = "server"
_SELECT_RUN = _SELECT_RUNS + " WHERE run_id = %s"
_LEASE_COLUMNS = (
    "run_id, owner, fence, lease_expires_at AS expires_at, now() AS granted_at, failures,"
    " last_error"
)
# A write under a lease changes the run's row only while it is still the lease's (owner and
# fence), checked and changed in one statement: the UPDATE locks the row as the check's lock
# would, and waits for a commit in flight that holds it shared, as a takeover does.
_HELD = " WHERE run_id = %s AND owner = %s AND fence = %s"
# A claim: the new owner, a new fence unless the owner renews its own live lease.
_CLAIM_SET = (
    "UPDATE lw_runs SET owner = %s,"
    " fence = fence + CASE WHEN owner = %s AND lease_expires_at > now() THEN 0 ELSE 1"
    " END, lease_expires_at = {after_seconds}, updated_at = now(),"
    " agent_version = COALESCE(%s, agent_version)"
)
# An attempt whose lease lapsed, or whose process was reaped, before it recorded where the run
# stood did not go through (its process died, most often): counted in the run's failure streak
# as the run is taken from it, so that a run that kills every process advancing it ends typed
# (`attempt`) rather than being taken over for ever. SET reads the row as it was.
_LAPSED = (
    ", failures = failures + 1, last_error = 'the attempt of ' || owner || ' (fence '"
    " || fence || ') ended before it recorded where the run stood: its process died or lost"
    " the run'"
)
_CLAIM_WHERE = " WHERE run_id = %s AND pruned_at IS NULL"
_CLAIMED = " RETURNING cancel_requested_at, " + _LEASE_COLUMNS
_NEVER_STRANDED = ", ".join(f"'{phase}'" for phase in sorted(NEVER_STRANDED))
# A run nobody holds, or the claimer does; another owner's expired lease, taken over.
_CLAIM_FREE = _CLAIM_SET + _CLAIM_WHERE + " AND (owner IS NULL OR owner = %s)" + _CLAIMED
_TAKE_OVER = (
    _CLAIM_SET + _LAPSED + _CLAIM_WHERE + " AND owner <> %s AND lease_expires_at <= now()"
) + _CLAIMED


class Lease(BaseModel):
    """A claim on a run: valid while the run's row still has this owner and fence."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    owner: str
    fence: int
    expires_at: datetime
    ttl_s: float
    # The database's clock when the lease was granted or last renewed, and whether someone had
    # asked the run to stop by then (read under the same lock): where an attempt's clock and
    # cancel check start from (`RunWatch`), so that its nodes need not read either again.
    granted_at: datetime
    cancel_requested: bool = False
    # The run's failure streak as the lease was granted: attempts in a row that did not go
    # through (`attempt` ends the run typed once it reaches the bound), and the last one's error.
    failures: int = 0
    last_error: str | None = None


class RunRecord(BaseModel):
    """A row of lw_runs. `lease_live` is as of the read, by the database clock."""

    run_id: str
    owner: str | None
    fence: int
    lease_expires_at: datetime | None
    lease_live: bool
    phase: str
    task: str
    user_id: str
    next_attempt_at: datetime | None
    # The tenant whose user the run acts for; the engine hosting it ("" for an in-process run:
    # the CLI's or a worker's; "server" for one a server's engine started and resumes).
    tenant: str = "default"
    engine: str = ""
    cancel_requested_at: datetime | None = None
    # Attempts in a row that did not go through (an error, or a process that died holding the
    # run), and the last one's error: a run that keeps failing is retried later and later
    # (`failure_backoff_s`), so it cannot keep every worker busy.
    failures: int = 0
    last_error: str | None = None
    # The agent the run belongs to ("" for runs from before agents were recorded).
    agent: str = ""
    agent_version: str = ""
    created_at: datetime
    updated_at: datetime
    # When the retention job removed the run's checkpoints (None: it has them).
    pruned_at: datetime | None = None


class RunNotFound(LookupError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} is not registered")


class RunPruned(RuntimeError):
    """The retention job removed the run's checkpoints: it ended, and nothing may advance it
    again (from an empty state it would start over). Its summary and journal remain."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id} was pruned by the retention job: it ended, and only its summary and"
            " journal remain (`loopwright show` prints them)"
        )
        self.run_id = run_id


class LeaseHeld(RuntimeError):
    """Another owner's lease on the run is still live."""

    def __init__(self, owner: str, expires_at: datetime | None, *, run_id: str) -> None:
        self.owner = owner
        self.expires_at = expires_at
        self.run_id = run_id
        super().__init__(f"run {run_id} is leased by {owner} until {expires_at}")


class LeaseLost(RuntimeError):
    """The run was released or taken over since this lease was granted."""

    def __init__(self, lease: Lease, current: RunRecord | None) -> None:
        self.lease = lease
        self.current = current
        now_held = f"owner {current.owner}, fence {current.fence}" if current else "no such run"
        super().__init__(
            f"lease on run {lease.run_id} lost: held as {lease.owner} with fence {lease.fence},"
            f" now {now_held}"
        )


class StaleWriter(RuntimeError):
    """A durable write refused because the writer's fence no longer owns the run."""

    def __init__(self, run_id: str, fence: int, current_fence: int | None, reason: str) -> None:
        self.run_id = run_id
        self.fence = fence
        self.current_fence = current_fence
        super().__init__(
            f"stale writer refused on run {run_id}: my fence {fence},"
            f" current fence {current_fence}: {reason}"
        )


def lock_run(db: Database, run_id: str, *, exclusive: bool = False) -> RunRecord | None:
    """Read a run's row and lock it until the transaction ends (call inside one).

    Writers that check a fence take the row shared; a claim takes it exclusively, so it waits
    until every write that checked the old fence has committed: a takeover can never slip in
    between a fence check and the write it guards.
    """
    row = db.one(lock_run_sql(exclusive=exclusive), (run_id,))
    return RunRecord.model_validate(row) if row else None


def lock_run_sql(*, exclusive: bool = False, run_id: str = "%s") -> str:
    """`lock_run`'s statement, for a caller that sends it with its writes; `run_id` is the
    placeholder of the run's id."""
    lock = "{for_update}" if exclusive else "{for_share}"
    return _SELECT_RUNS + f" WHERE run_id = {run_id}" + lock


class FenceRow(NamedTuple):
    """What a fenced write reads of its run's row, under the row's lock (`lock_fence_sql`):
    whose it is, at which fence, whether the lease is live, whether a cancel was asked for. A
    commit reads it every time, so it is these four values, not the whole row."""

    owner: str | None
    fence: int
    lease_live: bool
    cancel_requested: bool

    @classmethod
    def of(cls, row: Row) -> FenceRow:
        return cls(
            row["owner"], int(row["fence"]), bool(row["lease_live"]), bool(row["cancel_requested"])
        )


def lock_fence_sql(*, run_id: str = "%s") -> str:
    """The statement that locks a run's row shared and reads its `FenceRow`; `run_id` is the
    placeholder of the run's id."""
    return (
        f"SELECT owner, fence, {_LEASE_LIVE},"
        " cancel_requested_at IS NOT NULL AS cancel_requested"
        f" FROM lw_runs WHERE run_id = {run_id}{{for_share}}"
    )


def lock_fence(db: Database, run_id: str) -> FenceRow | None:
    """A run's `FenceRow`, its row locked until the transaction ends (call inside one)."""
    row = db.one(lock_fence_sql(), (run_id,))
    return FenceRow.of(row) if row else None


def refuse_if_superseded(db: Database, run_id: str, fence: int) -> None:
    """Refuse a write with `fence` if the run has moved to a later fence (inside a transaction).

    Runs without a row (not leased by any worker) are not checked.
    """
    run = lock_run(db, run_id)
    if run is not None and run.fence > fence:
        raise StaleWriter(run_id, fence, run.fence, f"the run was taken over by {run.owner}")


FAILURE_BACKOFF_BASE_S = 1.0
FAILURE_BACKOFF_CAP_S = 300.0


def failure_backoff_s(failures: int) -> float:
    """Seconds before a run that failed `failures` times in a row is due again: 1, 2, 4, ...
    up to five minutes."""
    return min(FAILURE_BACKOFF_CAP_S, FAILURE_BACKOFF_BASE_S * 2 ** max(0, failures - 1))


class LeaseStore:
    """Leases on runs, in the lw_runs table of the run's database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def setup(self) -> None:
        migrate(self.db)

    def register(
        self,
        run_id: str,
        *,
        task: str,
        user_id: str,
        agent: str = "",
        agent_version: str = "",
        tenant: str = "default",
        engine: str = "",
    ) -> RunRecord:
        """Record a run (unowned, fence 0, created now by the database's clock); the run's row.
        Registering an existing run changes nothing."""
        rows = self.db.write(
            "INSERT INTO lw_runs (run_id, owner, fence, phase, task, user_id, agent,"
            " agent_version, tenant, engine, created_at, updated_at)"
            " VALUES (%s, NULL, 0, %s, %s, %s, %s, %s, %s, %s, now(), now())"
            " ON CONFLICT (run_id) DO NOTHING RETURNING " + _RUN_COLUMNS,
            (run_id, Phase.READY.value, task, user_id, agent, agent_version, tenant, engine),
        )
        return RunRecord.model_validate(rows[0]) if rows else self._registered(run_id)

    def begin(
        self,
        run_id: str,
        owner: str,
        ttl_s: float,
        *,
        task: str,
        user_id: str,
        agent: str = "",
        agent_version: str = "",
        tenant: str = "default",
        engine: str = "",
    ) -> tuple[RunRecord, Lease | None]:
        """Register a new run already leased to `owner` (fence 1): a `register` and the first
        `claim` in one statement, where the two cost six round trips. Nobody can come between
        them: the row did not exist, and lw_runs rows are never deleted, so a new one is neither
        leased nor pruned. A run registered before is left as it is: its row, and no lease."""
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        rows = self.db.write(
            "INSERT INTO lw_runs (run_id, owner, fence, lease_expires_at, phase, task, user_id,"
            " agent, agent_version, tenant, engine, created_at, updated_at)"
            " VALUES (%s, %s, 1, {after_seconds}, %s, %s, %s, %s, %s, %s, %s, now(), now())"
            " ON CONFLICT (run_id) DO NOTHING RETURNING " + _RUN_COLUMNS + ", now() AS granted_at",
            (
                *(run_id, owner, ttl_s, Phase.READY.value, task, user_id),
                *(agent, agent_version, tenant, engine),
            ),
        )
        if not rows:
            return self._registered(run_id), None
        row = rows[0]
        lease = _lease({**row, "expires_at": row["lease_expires_at"]}, ttl_s, False)
        return RunRecord.model_validate(row), lease

    def _registered(self, run_id: str) -> RunRecord:
        existing = self.get(run_id)  # registered before: runs are never deleted
        if existing is None:
            raise RunNotFound(run_id)
        return existing

    def now(self) -> datetime:
        """The database's clock: what every lease, expiry and deadline is judged on (the
        processes that share a database may disagree about the time; it does not)."""
        row = self.db.one("SELECT now() AS now")
        assert row is not None
        moment = row["now"]
        parsed = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    def get(self, run_id: str) -> RunRecord | None:
        row = self.db.one(_SELECT_RUN, (run_id,))
        return RunRecord.model_validate(row) if row else None

    def claim(
        self, run_id: str, owner: str, ttl_s: float, *, agent_version: str | None = None
    ) -> Lease:
        """Lease the run to `owner` for `ttl_s` seconds.

        The same owner re-claiming a live lease extends it under the same fence. Any other
        acquisition (first claim, after a release, after expiry, or a takeover by a different
        owner) bumps the fence, so that every earlier holder's writes are refused from now on.
        `agent_version`: the version of the agent that advances the run under this lease, which
        becomes the run's (an upgrade's new version continuing a run begun by the old one).
        """
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        while True:
            # One guarded UPDATE: it locks the row, so it waits for a commit in flight that
            # checked the old fence (held shared), and on Postgres its guard is judged again on
            # the row as that commit or a prune left it. A run nobody holds (or we do) first;
            # only if that finds none, a takeover of another owner's expired lease, counted (a
            # takeover, and a failed attempt in the run's streak: `_LAPSED`).
            params = (owner, owner, ttl_s, agent_version, run_id, owner)
            if rows := self.db.write(_CLAIM_FREE, params):
                return _lease(rows[0], ttl_s, rows[0]["cancel_requested_at"] is not None)
            if rows := self.db.write(_TAKE_OVER, params):
                LEASE_TAKEOVERS.inc()
                return _lease(rows[0], ttl_s, rows[0]["cancel_requested_at"] is not None)
            run = self.get(run_id)
            if run is None:
                raise RunNotFound(run_id)
            if run.pruned_at is not None:
                raise RunPruned(run_id)
            if run.lease_live and run.owner is not None and run.owner != owner:
                raise LeaseHeld(run.owner, run.lease_expires_at, run_id=run_id)
            # Released or expired since the UPDATE looked: claim it again.

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its ttl, unless the run changed hands meanwhile (`LeaseLost`).

        A lease that expired but was not taken over can still be renewed: nobody else wrote
        under a newer fence, so continuing is safe.
        """
        rows = self.db.write(
            "UPDATE lw_runs SET lease_expires_at = {after_seconds}, updated_at = now()"
            + _HELD
            + " RETURNING cancel_requested_at, "
            + _LEASE_COLUMNS,
            (lease.ttl_s, *_held(lease)),
        )
        if not rows:
            raise self._lost(lease, self.get(lease.run_id))
        return _lease(rows[0], lease.ttl_s, rows[0]["cancel_requested_at"] is not None)

    def runs(self, phase: str | None = None) -> list[RunRecord]:
        """Every registered run (in `phase`, if given), newest first."""
        where, params = (" WHERE phase = %s", (phase,)) if phase else ("", ())
        return [
            RunRecord.model_validate(row)
            for row in self.db.execute(_SELECT_RUNS + where + " ORDER BY created_at DESC", params)
        ]

    def unended(self) -> list[RunRecord]:
        """Every registered run that has not ended, newest first: those a person or a worker
        may still be asked about (a database's runs are mostly ended ones)."""
        rows = self.db.execute(_SELECT_RUNS + f" WHERE {UNENDED_RUNS} ORDER BY created_at DESC")
        return [RunRecord.model_validate(row) for row in rows]

    def due(self, agent: str | None = None) -> list[RunRecord]:
        """Runs a worker should advance now: unowned or expired, and not finished or waiting
        for a person. A parked run (RECONCILING) is due once its next attempt time has come,
        unless a server's engine hosts it: the engine continues it (`wake`), so that its own
        records of the run stay true. With `agent`, only that agent's runs (and those from
        before agents were recorded)."""
        rows = self.db.execute(
            _SELECT_RUNS + f" WHERE {UNENDED_RUNS} AND phase <> 'WAITING_APPROVAL'"
            " AND (owner IS NULL OR lease_expires_at <= now())"
            " AND (next_attempt_at IS NULL OR next_attempt_at <= now())"
            " AND NOT (phase = 'RECONCILING' AND engine = %s)"
            " AND (CAST(%s AS TEXT) IS NULL OR agent = %s OR agent = '')"
            " ORDER BY updated_at",
            (SERVER_ENGINE, agent, agent),
        )
        return [RunRecord.model_validate(row) for row in rows]

    def wake(self, agent: str, hold_s: float, stranded_after_s: float) -> list[RunRecord]:
        """The runs a server's engine hosts that it must be asked to continue, each taken for
        waking by this caller alone: its next attempt is put off by `hold_s` in the same
        statement, so another instance asking at once gets none of them, and a run whose
        wake-up never started is due again after `hold_s`. They are the runs parked in a
        reconciliation and due now, and the runs the engine stopped advancing: neither ended nor
        waiting for a person, no attempt holding them, nothing written for `stranded_after_s`
        (their engine run was given up by the engine, or died with its process, and none
        followed it)."""
        rows = self.db.write(
            "UPDATE lw_runs SET next_attempt_at = {after_seconds}"
            f" WHERE {UNENDED_RUNS} AND engine = %s AND agent = %s"
            " AND (owner IS NULL OR lease_expires_at <= now())"
            " AND ((phase = 'RECONCILING' AND next_attempt_at <= now())"
            f" OR (phase NOT IN ({_NEVER_STRANDED})"
            " AND (next_attempt_at IS NULL OR next_attempt_at <= now())"
            " AND updated_at <= {before_seconds}))"
            " RETURNING " + _RUN_COLUMNS,
            (hold_s, SERVER_ENGINE, agent, stranded_after_s),
        )
        return [RunRecord.model_validate(row) for row in rows]

    def record(
        self,
        lease: Lease,
        phase: str,
        next_attempt_at: datetime | None = None,
        *,
        release: bool = False,
        agent_version: str | None = None,
    ) -> None:
        """Note where the run stands after an attempt that went through, for listings and
        workers; its failure streak is over. With `release`, the run is given up in the same
        transaction (as `release` does). `agent_version`: the version that wrote the run's last
        step, where the attempt knows it (an attempt that found nothing left to do leaves the
        run the version that did the work, not its own, which the claim recorded). Refused for
        a lost lease."""
        given_up = ", owner = NULL, lease_expires_at = NULL" if release else ""
        rows = self.db.write(
            "UPDATE lw_runs SET phase = %s, next_attempt_at = %s, failures = 0,"
            " agent_version = COALESCE(%s, agent_version),"
            f" last_error = NULL, updated_at = now(){given_up}" + _HELD + " RETURNING run_id",
            (phase, self.db.timestamp(next_attempt_at), agent_version, *_held(lease)),
        )
        if not rows:
            raise self._lost(lease, self.get(lease.run_id))

    def record_failure(self, lease: Lease, error: str) -> RunRecord:
        """Note an attempt that ended in an error, and when to try again: after
        `failure_backoff_s` of the streak so far. Refused for a lost lease."""
        with self.db.transaction():
            run = self._check_held(lease)
            self.db.execute(
                "UPDATE lw_runs SET failures = failures + 1, last_error = %s,"
                " next_attempt_at = {after_seconds}, updated_at = now() WHERE run_id = %s",
                (error, failure_backoff_s(run.failures + 1), lease.run_id),
            )
            return RunRecord.model_validate(self.db.execute(_SELECT_RUN, (lease.run_id,))[0])

    def _check_held(self, lease: Lease) -> RunRecord:
        run = lock_run(self.db, lease.run_id, exclusive=True)
        if run is None or run.fence != lease.fence or run.owner != lease.owner:
            raise self._lost(lease, run)
        return run

    @staticmethod
    def _lost(lease: Lease, current: RunRecord | None) -> LeaseLost:
        FENCE_REFUSALS.labels("lease").inc()
        return LeaseLost(lease, current)

    def request_cancel(self, run_id: str) -> RunRecord:
        """Ask for a run to stop. Not fenced: anyone allowed to cancel may, at any time; the
        run's writer sees the request at its next step (see `cancel_requested`)."""
        with self.db.transaction():
            self.db.execute(
                "UPDATE lw_runs SET cancel_requested_at = COALESCE(cancel_requested_at, now()),"
                " updated_at = now() WHERE run_id = %s",
                (run_id,),
            )
            run = self.get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    def cancel_requested(self, run_id: str) -> bool:
        """Whether someone asked the run to stop, read now (an attempt's nodes ask its
        `RunWatch` instead, which the commits keep up to date)."""
        row = self.db.one("SELECT cancel_requested_at FROM lw_runs WHERE run_id = %s", (run_id,))
        return bool(row and row["cancel_requested_at"])

    def release(self, lease: Lease) -> None:
        """Give the run up now rather than at expiry. A lease already lost releases nothing."""
        self.db.write(
            "UPDATE lw_runs SET owner = NULL, lease_expires_at = NULL, updated_at = now()" + _HELD,
            _held(lease),
        )

    def release_for_dead(self, run_id: str, process: str) -> bool:
        """Give the run up for its holder, a process known to be dead (`process`: the
        "host:pid:" that its owner names begin with: `attempt.process_owner`), rather than wait out
        the lease's time to live: a reaped process renews and writes nothing more. Only for a
        process the caller reaped itself; whether there was such a lease."""
        run = self.get(run_id)
        if run is None or run.owner is None or not run.owner.startswith(process):
            return False
        released = self.db.write(
            "UPDATE lw_runs SET owner = NULL, lease_expires_at = NULL, updated_at = now()"
            + _LAPSED
            + _HELD
            + " RETURNING run_id",
            (run_id, run.owner, run.fence),
        )
        return bool(released)


def _lease(row: dict[str, object], ttl_s: float, cancel_requested: bool) -> Lease:
    """The lease a claim or a renewal wrote (`row`, its RETURNING), with whether the run's row
    said, under the same lock, that someone asked it to stop."""
    return Lease.model_validate({**row, "ttl_s": ttl_s, "cancel_requested": cancel_requested})


def _held(lease: Lease) -> tuple[str, str, int]:
    """The parameters of `_HELD`."""
    return lease.run_id, lease.owner, lease.fence


class RunWatch:
    """What an attempt knows of its run without reading lw_runs again: the database's clock,
    and whether someone asked the run to stop. Its nodes ask several times a step; a read each
    time cost about six one-statement transactions a tool step (`SELECT now()`, the flag).

    The clock is the database's time at the lease's last grant or renewal, moved on by this
    process's monotonic clock since then. It is one clock, the database's, as a read each time
    would be: the process's wall clock never enters (a process 24 h off judges expiries and
    deadlines as every other does), and the anchor is taken again at every renewal (a third of
    the lease ttl), so what separates it from a fresh read is the monotonic clock's drift over
    that time (parts per million: microseconds) and the moment between the database reading
    its clock and the answer arriving (this clock is behind by it, never ahead). A process that
    stalls (a paused VM, whose monotonic clock stops) loses its lease, and its next commit is
    refused on the database's own judgement of expiry, whatever this clock says.

    The cancel flag is what the run's row said under lock at the claim, at each renewal and at
    each node's commit (the fence check reads that row anyway, `FencedSaver.watch`): a request
    committed while a node runs is seen by the next node, as a read at the next node's start
    would see it. A request only ever sets the flag, so once seen it stays set.

    Updated from the lease keeper's thread and the saver's: each update is one assignment.
    """

    def __init__(self, lease: Lease) -> None:
        self._anchor = (lease.granted_at, time.monotonic())
        self._cancelled = lease.cancel_requested

    def now(self) -> datetime:
        granted_at, at = self._anchor
        return granted_at + timedelta(seconds=time.monotonic() - at)

    def cancel_requested(self) -> bool:
        return self._cancelled

    def renewed(self, lease: Lease) -> None:
        """Take the clock's anchor and the cancel flag from a renewal."""
        self._anchor = (lease.granted_at, time.monotonic())
        self.seen(lease.cancel_requested)

    def seen(self, cancel_requested: bool) -> None:
        """What a read of the run's row under lock said of a cancel."""
        if cancel_requested:
            self._cancelled = True


class LeaseKeeper:
    """Renews a lease in the background (every third of its ttl) while a worker advances a run.

    If the lease is lost (taken over after a stall), renewal stops and `lost` is set; the worker's
    next durable write is refused by fencing anyway, so nothing depends on noticing it here.
    """

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        on_renew: Callable[[Lease], None] | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        # Told each renewed lease (an attempt's `RunWatch.renewed`).
        self.on_renew = on_renew
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"lease-{lease.run_id}", daemon=True
        )

    def _renew(self) -> None:
        while not self._stop.wait(self.lease.ttl_s / 3):
            try:
                self.lease = self.store.renew(self.lease)
            except LeaseLost:
                self.lost = True
                return
            if self.on_renew is not None:
                self.on_renew(self.lease)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        with _keeping_lock:
            _keeping.add(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Renew no more (before the lease is given up: a renewal must not race the release)."""
        with _keeping_lock:
            _keeping.discard(self)
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()


_keeping: set[LeaseKeeper] = set()
_keeping_lock = threading.Lock()


def give_up_kept_leases() -> None:
    """Release every lease a keeper of this process holds now: for a process about to exit
    without unwinding (a signal's last resort), so that no run waits for its lease's expiry."""
    with _keeping_lock:
        keepers = list(_keeping)
    for keeper in keepers:
        keeper._stop.set()
        keeper.store.release(keeper.lease)


@contextlib.contextmanager
def open_lease_store(url: str) -> Iterator[LeaseStore]:
    """A set-up `LeaseStore` on its own connection to the database at `url`."""
    with open_database(url) as db:
        store = LeaseStore(db)
        store.setup()
        yield store
