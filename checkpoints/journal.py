"""The action journal: one row per business intent, moved only along legal, fresh transitions.

The journal is what keeps one intent from becoming two effects. Its rules:

* An intent key maps to one action forever. Proposing it again with the same arguments (say,
  under a new model call id) returns the first action; with different arguments it is refused,
  because a write's parameters can never change under the same key.
* A status moves only along `TRANSITIONS`, by compare-and-set on the status the caller last saw,
  and only for a writer whose fence is current: for the action's row, and for the run's lease.
* Every move is its own committed transaction and leaves an event, so the full history of an
  action can be read back, and DISPATCHED is durable before the request it announces is sent.

The journal lives in the run's database, next to the checkpoints; `SqlJournal` is the one
implementation, for SQLite and Postgres alike (see `checkpoints.sql`). On Postgres a plan or a
move is one statement with its event, in one round trip; on SQLite a transaction of the two.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.leases import StaleWriter, refuse_if_superseded
from loopwright.checkpoints.schema import migrate
from loopwright.checkpoints.sql import Database, Row, open_database
from loopwright.core.state import TRANSITIONS, Action, ActionStatus
from loopwright.observability.metrics import FENCE_REFUSALS, note_transition

PLANNABLE_STATUSES = frozenset({ActionStatus.PLANNED, ActionStatus.NEEDS_APPROVAL})
# The key of an event's detail naming the agent version that decided the change.
VERSION_KEY = "version"

# Timestamps come last: they are not taken from the caller but from the database clock.
_WRITTEN = (
    "action_id",
    "run_id",
    "call_id",
    "tool",
    "args",
    "args_digest",
    "intent_key",
    "status",
    "attempts",
    "fence",
    "outcome",
)
_COLUMNS = ", ".join((*_WRITTEN, "created_at", "updated_at"))
_SELECT = "SELECT " + _COLUMNS + " FROM lw_actions"
_INSERT_NEW_INTENT = (
    f"INSERT INTO lw_actions ({_COLUMNS}) VALUES ({', '.join(['%s'] * len(_WRITTEN))},"
    f" now(), now()) ON CONFLICT (intent_key) DO NOTHING RETURNING {_COLUMNS}"
)
# Creation sequence; the id breaks ties between actions planned in the same clock tick.
_CREATED_ORDER = " ORDER BY created_at, action_id"
_NEXT_SEQ = "(SELECT COALESCE(MAX(seq), 0) + 1 FROM lw_action_events WHERE action_id = %s)"
_EVENT_COLUMNS = "(action_id, seq, from_status, to_status, fence, at, detail)"
# A move by compare-and-set: the status the caller last saw, a fence not behind the action's,
# nor the run's (a run nobody leased has no row, and is not checked).
_MOVE = (
    "UPDATE lw_actions SET status = %s, fence = %s, outcome = COALESCE(%s, outcome),"
    " attempts = attempts + %s, updated_at = now()"
    " WHERE action_id = %s AND status = %s AND fence <= %s AND NOT EXISTS ({superseded})"
    " RETURNING " + _COLUMNS
)
# On Postgres a plan and a move are each one statement with their event (a data-modifying CTE),
# their own transaction in one round trip, where a transaction of their statements costs five
# and seven. The run's row is locked shared, as `refuse_if_superseded` locks it: a takeover
# waits for the move, and a move that waited for a takeover reads the new fence.
_PG_PLAN = (
    f"WITH planned AS ({_INSERT_NEW_INTENT}), event AS (INSERT INTO lw_action_events"
    f" {_EVENT_COLUMNS} SELECT action_id, 1, NULL, status, fence, now(), CAST(%s AS JSON)"
    " FROM planned)"
    " SELECT * FROM planned"
)
_PG_MOVE = (
    "WITH run AS (SELECT r.fence FROM lw_runs r JOIN lw_actions a ON a.run_id = r.run_id"
    " WHERE a.action_id = %s FOR SHARE OF r), moved AS ("
    + _MOVE.format(superseded="SELECT 1 FROM run WHERE run.fence > %s")
    + f"), event AS (INSERT INTO lw_action_events {_EVENT_COLUMNS}"
    f" SELECT action_id, {_NEXT_SEQ}, %s, status, fence, now(), CAST(%s AS JSON) FROM moved)"
    " SELECT * FROM moved"
)
_SQLITE_MOVE = _MOVE.format(
    superseded="SELECT 1 FROM lw_runs r WHERE r.run_id = lw_actions.run_id AND r.fence > %s"
)


class ActionEvent(BaseModel):
    """One status change of an action (`Runner.history`); `from_status` is None for the
    planning event. `attempt` is the send it belongs to (0 before the first DISPATCHED);
    `found` what reconciliation learnt from the business system (`applied`, `absent`,
    `unconfirmable`, ...) where this change followed from it; `why` the reason journaled with
    it. A re-send reads DISPATCHED from RECONCILING, found `absent`, at the next attempt."""

    model_config = ConfigDict(frozen=True)

    action_id: str
    seq: int
    from_status: ActionStatus | None
    to_status: ActionStatus
    fence: int
    at: datetime
    detail: dict[str, Any] | None = None
    attempt: int = 0

    @property
    def found(self) -> str | None:
        return (self.detail or {}).get("reconciled")

    @property
    def why(self) -> str:
        return str((self.detail or {}).get("reason", ""))

    @property
    def version(self) -> str | None:
        """The agent version whose process made this change (`VersionedJournal`); None for a
        change journaled before versions were."""
        found = (self.detail or {}).get(VERSION_KEY)
        return None if found is None else str(found)


class ActionNotFound(LookupError):
    def __init__(self, action_id: str) -> None:
        self.action_id = action_id
        super().__init__(f"no action {action_id} in the journal")


class IntentConflict(RuntimeError):
    """The intent key is already journaled with different arguments."""

    def __init__(self, existing: Action, proposed: Action) -> None:
        self.existing = existing
        self.proposed = proposed
        super().__init__(
            f"intent {existing.intent_key} is journaled as action {existing.action_id} with"
            f" args digest {existing.args_digest}; refusing changed args digest"
            f" {proposed.args_digest}"
        )


class IllegalTransition(ValueError):
    """A move that `TRANSITIONS` does not allow, whatever the row says."""

    def __init__(self, from_status: ActionStatus | None, to_status: ActionStatus) -> None:
        self.from_status = from_status
        self.to_status = to_status
        start = from_status.value if from_status else "(new)"
        super().__init__(f"illegal action transition {start} -> {to_status.value}")


class StaleTransition(RuntimeError):
    """The row moved on since the caller read it (status changed, or a newer fence wrote it)."""

    def __init__(self, current: Action, expected: ActionStatus, fence: int) -> None:
        self.current = current
        super().__init__(
            f"stale transition on action {current.action_id}: expected {expected.value} at"
            f" fence {fence}, found {current.status.value} at fence {current.fence}"
        )


class ActionJournal(Protocol):
    """What the executor, reconciler and approval flow need from the journal."""

    def setup(self) -> None: ...

    def plan(self, action: Action, *, detail: dict[str, Any] | None = None) -> Action:
        """Journal a new intent, or return the action already journaled for it; `detail` is
        kept with the planning event."""
        ...

    def transition(
        self,
        action_id: str,
        expected: ActionStatus,
        to: ActionStatus,
        *,
        fence: int,
        outcome: dict[str, Any] | None = None,
        count_attempt: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> Action:
        """Compare-and-set the status; see `SqlJournal.transition`."""
        ...

    def get(self, action_id: str) -> Action | None: ...

    def by_intent(self, intent_key: str) -> Action | None: ...

    def for_run(self, run_id: str) -> list[Action]: ...

    def events(self, action_id: str) -> list[ActionEvent]: ...

    def in_status(self, statuses: Iterable[ActionStatus]) -> list[Action]:
        """Actions of any run in one of `statuses`, oldest first (those whose outcome is not
        known yet: `UNRESOLVED_STATUSES`)."""
        ...


class SqlJournal:
    """`ActionJournal` on the lw_actions / lw_action_events tables of a SQLite or Postgres db."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def setup(self) -> None:
        """Bring the journal tables, and lw_runs, which `transition` checks leases against, to
        the current version."""
        migrate(self.db)

    def plan(self, action: Action, *, detail: dict[str, Any] | None = None) -> Action:
        """Insert `action` unless its intent is journaled already; return the journaled action.

        Atomic under concurrency: of two writers planning one intent, one inserts and the other
        gets the first one's row (or `IntentConflict` if its arguments differ).
        """
        if action.status not in PLANNABLE_STATUSES:
            raise IllegalTransition(None, action.status)
        data = action.model_dump(mode="json")
        data["args"] = self.db.to_json(data["args"])
        data["outcome"] = self.db.to_json(data["outcome"])
        values = [data[column] for column in _WRITTEN]
        if self.db.kind is DatabaseKind.POSTGRES:
            inserted = self.db.one(_PG_PLAN, [*values, self.db.to_json(detail)])
        else:
            with self.db.transaction():
                inserted = self.db.one(_INSERT_NEW_INTENT, values)
                if inserted is not None:
                    self._append_event(action.action_id, None, action.status, action.fence, detail)
        if inserted is not None:
            return self._action(inserted)
        existing = self.by_intent(action.intent_key)
        assert existing is not None, "an intent key that conflicted has a row"
        if existing.args_digest != action.args_digest:
            raise IntentConflict(existing, action)
        return existing

    def transition(
        self,
        action_id: str,
        expected: ActionStatus,
        to: ActionStatus,
        *,
        fence: int,
        outcome: dict[str, Any] | None = None,
        count_attempt: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> Action:
        """Move an action from `expected` to `to`, in one committed transaction.

        Refuses with `IllegalTransition` if the move is not in `TRANSITIONS`; with
        `StaleTransition` if the row is no longer in `expected` or was written under a newer
        fence; with `StaleWriter` if the run's lease has moved past `fence`. `outcome=None`
        keeps the recorded outcome; `count_attempt` counts one more attempt (a send).
        """
        if to not in TRANSITIONS[expected]:
            raise IllegalTransition(expected, to)
        move = (to.value, fence, self.db.to_json(outcome), int(count_attempt), action_id)
        guard = (expected.value, fence, fence)
        while True:
            if self.db.kind is DatabaseKind.POSTGRES:
                event = (action_id, expected.value, self.db.to_json(detail))
                moved = self.db.one(_PG_MOVE, (action_id, *move, *guard, *event))
            else:
                with self.db.transaction():
                    moved = self.db.one(_SQLITE_MOVE, (*move, *guard))
                    if moved is not None:
                        self._append_event(action_id, expected, to, fence, detail)
            if moved is not None:
                note_transition(to.value, detail)
                return self._action(moved)
            self._refuse(action_id, expected, fence)

    def _refuse(self, action_id: str, expected: ActionStatus, fence: int) -> None:
        """Say why a move changed nothing, read after it; return if nothing says so any more
        (the action left `expected` and came back meanwhile: move it again)."""
        current = self.get(action_id)
        if current is None:
            raise ActionNotFound(action_id)
        if current.fence > fence:
            FENCE_REFUSALS.labels("journal").inc()
        if current.status != expected or current.fence > fence:
            raise StaleTransition(current, expected, fence)
        try:
            refuse_if_superseded(self.db, current.run_id, fence)
        except StaleWriter:
            FENCE_REFUSALS.labels("journal").inc()
            raise

    def get(self, action_id: str) -> Action | None:
        return self._first(_SELECT + " WHERE action_id = %s", action_id)

    def by_intent(self, intent_key: str) -> Action | None:
        return self._first(_SELECT + " WHERE intent_key = %s", intent_key)

    def for_run(self, run_id: str) -> list[Action]:
        rows = self.db.execute(_SELECT + " WHERE run_id = %s" + _CREATED_ORDER, (run_id,))
        return [self._action(row) for row in rows]

    def events(self, action_id: str) -> list[ActionEvent]:
        rows = self.db.execute(
            "SELECT action_id, seq, from_status, to_status, fence, at, detail"
            " FROM lw_action_events WHERE action_id = %s ORDER BY seq",
            (action_id,),
        )
        events, attempt = [], 0
        for row in rows:
            attempt += row["to_status"] == ActionStatus.DISPATCHED
            detail = self.db.from_json(row["detail"])
            events.append(ActionEvent.model_validate({**row, "detail": detail, "attempt": attempt}))
        return events

    def in_status(self, statuses: Iterable[ActionStatus]) -> list[Action]:
        values = sorted({ActionStatus(s).value for s in statuses})
        if not values:
            return []
        placeholders = ", ".join("%s" for _ in values)
        rows = self.db.execute(
            _SELECT + " WHERE status IN (" + placeholders + ")" + _CREATED_ORDER, values
        )
        return [self._action(row) for row in rows]

    def _append_event(
        self,
        action_id: str,
        from_status: ActionStatus | None,
        to_status: ActionStatus,
        fence: int,
        detail: dict[str, Any] | None,
    ) -> None:
        # Called inside the transaction that moved the action, which holds the action's row, so
        # no other writer can take the same sequence number.
        self.db.execute(
            f"INSERT INTO lw_action_events {_EVENT_COLUMNS}"
            f" VALUES (%s, {_NEXT_SEQ}, %s, %s, %s, now(), %s)",
            (
                action_id,
                action_id,
                from_status.value if from_status else None,
                to_status.value,
                fence,
                self.db.to_json(detail),
            ),
        )

    def _first(self, sql: str, key: str) -> Action | None:
        row = self.db.one(sql, (key,))
        return self._action(row) if row else None

    def _action(self, row: Row) -> Action:
        return Action.model_validate(
            {
                **row,
                "args": self.db.from_json(row["args"]),
                "outcome": self.db.from_json(row["outcome"]),
            }
        )


class JournalWrapper:
    """An `ActionJournal` that hands every call to the journal it wraps: the base of wrappers
    that add to what each event records (`_detail`) or tell of each event (`_journaled`)."""

    def __init__(self, journal: ActionJournal) -> None:
        self._journal = journal

    def _detail(self, detail: dict[str, Any] | None) -> dict[str, Any] | None:
        """The detail to journal with an event the caller gave `detail` for."""
        return detail

    def _journaled(
        self, expected: ActionStatus | None, action: Action, detail: dict[str, Any] | None
    ) -> None:
        """Called with each event journaled: the status moved from (None for a plan), the
        action as it now stands, and the caller's detail."""

    def setup(self) -> None:
        self._journal.setup()

    def plan(self, action: Action, *, detail: dict[str, Any] | None = None) -> Action:
        planned = self._journal.plan(action, detail=self._detail(detail))
        self._journaled(None, planned, detail)
        return planned

    def transition(
        self,
        action_id: str,
        expected: ActionStatus,
        to: ActionStatus,
        *,
        fence: int,
        outcome: dict[str, Any] | None = None,
        count_attempt: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> Action:
        moved = self._journal.transition(
            action_id,
            expected,
            to,
            fence=fence,
            outcome=outcome,
            count_attempt=count_attempt,
            detail=self._detail(detail),
        )
        self._journaled(expected, moved, detail)
        return moved

    def get(self, action_id: str) -> Action | None:
        return self._journal.get(action_id)

    def by_intent(self, intent_key: str) -> Action | None:
        return self._journal.by_intent(intent_key)

    def for_run(self, run_id: str) -> list[Action]:
        return self._journal.for_run(run_id)

    def events(self, action_id: str) -> list[ActionEvent]:
        return self._journal.events(action_id)

    def in_status(self, statuses: Iterable[ActionStatus]) -> list[Action]:
        return self._journal.in_status(statuses)


class VersionedJournal(JournalWrapper):
    """`journal` as one agent version's process writes it: every event it journals (a plan, a
    move) also records `version`, so that a run that changed hands during an upgrade tells
    which version decided each change of each action (`ActionEvent.version`)."""

    def __init__(self, journal: ActionJournal, version: str) -> None:
        super().__init__(journal)
        self._version = version

    def _detail(self, detail: dict[str, Any] | None) -> dict[str, Any]:
        return {**(detail or {}), VERSION_KEY: self._version}


@contextlib.contextmanager
def open_journal(url: str) -> Iterator[SqlJournal]:
    """A set-up journal on its own connection to the database at `url`."""
    with open_database(url) as db:
        journal = SqlJournal(db)
        journal.setup()
        yield journal
