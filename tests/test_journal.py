"""Conformance suite for the action journal: every backend must pass all of it."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from loopwright.checkpoints.journal import (
    ActionJournal,
    ActionNotFound,
    IllegalTransition,
    IntentConflict,
    StaleTransition,
    open_journal,
)
from loopwright.checkpoints.leases import StaleWriter, lock_run, open_lease_store
from loopwright.checkpoints.sql import open_database
from loopwright.core.state import TRANSITIONS, UNRESOLVED_STATUSES, Action, ActionStatus, digest
from tests.runtime_fixtures import PATIENCE_S

S = ActionStatus
INTENT = "refund:O-42:EUR:10.00"


@pytest.fixture
def journal(database_url: str) -> Iterator[ActionJournal]:
    with open_journal(database_url) as journal:
        yield journal


def proposed(
    intent_key: str = INTENT,
    *,
    run_id: str = "run-1",
    args: dict[str, Any] | None = None,
    status: ActionStatus = S.PLANNED,
    fence: int = 1,
) -> Action:
    args = {"order_id": "O-42", "amount": "10.00", "currency": "EUR"} if args is None else args
    return Action(
        action_id=f"act-{uuid.uuid4().hex[:8]}",
        run_id=run_id,
        call_id=f"call-{uuid.uuid4().hex[:8]}",
        tool="refund",
        args=args,
        args_digest=digest(args),
        intent_key=intent_key,
        status=status,
        fence=fence,
    )


def path_to(target: ActionStatus) -> list[ActionStatus]:
    """The shortest legal status path from a plannable status to `target`."""
    queue = deque([[S.PLANNED], [S.NEEDS_APPROVAL]])
    while queue:
        path = queue.popleft()
        if path[-1] == target:
            return path
        queue.extend([*path, nxt] for nxt in TRANSITIONS[path[-1]] if nxt not in path)
    raise AssertionError(f"{target} is unreachable")


def walk(
    journal: ActionJournal,
    path: list[ActionStatus],
    intent_key: str = INTENT,
    *,
    run_id: str = "run-1",
) -> Action:
    """Plan an action in path[0] and move it along the rest of `path`."""
    action = journal.plan(proposed(intent_key, run_id=run_id, status=path[0]))
    for before, after in itertools.pairwise(path):
        action = journal.transition(action.action_id, before, after, fence=1)
    return action


def test_plan_journals_a_new_intent(journal: ActionJournal) -> None:
    action = proposed()
    planned = journal.plan(action)
    assert planned.model_dump(exclude={"created_at", "updated_at"}) == action.model_dump(
        exclude={"created_at", "updated_at"}
    )
    assert planned.created_at.utcoffset() == timedelta(0)
    assert journal.get(action.action_id) == planned
    assert journal.by_intent(action.intent_key) == planned
    assert journal.get("act-missing") is None
    assert journal.by_intent("intent-missing") is None


def test_same_intent_with_a_new_call_id_maps_to_the_first_action(journal: ActionJournal) -> None:
    first = journal.plan(proposed())
    again = journal.plan(proposed())
    assert again == first
    assert [a.action_id for a in journal.for_run("run-1")] == [first.action_id]


def test_changed_args_under_the_same_intent_are_refused(journal: ActionJournal) -> None:
    first = journal.plan(proposed())
    changed = proposed(args={"order_id": "O-42", "amount": "99.00", "currency": "EUR"})
    with pytest.raises(IntentConflict, match=first.action_id):
        journal.plan(changed)
    assert journal.get(changed.action_id) is None


def test_plan_accepts_only_initial_statuses(journal: ActionJournal) -> None:
    assert journal.plan(proposed("a", status=S.NEEDS_APPROVAL)).status is S.NEEDS_APPROVAL
    with pytest.raises(IllegalTransition):
        journal.plan(proposed("b", status=S.DISPATCHED))


@pytest.mark.parametrize(
    ("source", "target"),
    [(source, target) for source, targets in TRANSITIONS.items() for target in sorted(targets)],
)
def test_every_legal_transition_is_accepted(
    journal: ActionJournal, source: ActionStatus, target: ActionStatus
) -> None:
    action = walk(journal, [*path_to(source), target])
    assert action.status is target
    assert journal.get(action.action_id) == action


def test_illegal_transitions_are_refused_and_change_nothing(journal: ActionJournal) -> None:
    action = journal.plan(proposed())
    for source in S:
        for target in set(S) - TRANSITIONS[source]:
            with pytest.raises(IllegalTransition):
                journal.transition(action.action_id, source, target, fence=1)
    assert journal.get(action.action_id) == action
    assert len(journal.events(action.action_id)) == 1


def test_a_stale_expected_status_is_refused(journal: ActionJournal) -> None:
    action = journal.plan(proposed())
    journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=1)
    with pytest.raises(StaleTransition, match="found DISPATCHED"):
        journal.transition(action.action_id, S.PLANNED, S.CANCELLED, fence=1)
    assert journal.get(action.action_id).status is S.DISPATCHED  # type: ignore[union-attr]
    assert len(journal.events(action.action_id)) == 2


def test_a_stale_fence_is_refused(journal: ActionJournal) -> None:
    action = journal.plan(proposed())
    journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=2)
    with pytest.raises(StaleTransition, match="at fence 2"):
        journal.transition(action.action_id, S.DISPATCHED, S.UNKNOWN, fence=1)
    newer = journal.transition(action.action_id, S.DISPATCHED, S.UNKNOWN, fence=3)
    assert newer.fence == 3


def test_a_writer_behind_the_runs_lease_is_refused(database_url: str) -> None:
    with open_journal(database_url) as journal, open_lease_store(database_url) as leases:
        leases.register("run-1", task="refund O-42", user_id="u-1")
        old = leases.claim("run-1", "worker-a", ttl_s=0.05)
        action = journal.plan(proposed(fence=old.fence))
        leases.release(old)
        new = leases.claim("run-1", "worker-b", ttl_s=30)
        with pytest.raises(StaleWriter, match="my fence 1, current fence 2"):
            journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=old.fence)
        moved = journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=new.fence)
        assert moved.fence == new.fence
        # Runs nobody leases are not checked against lw_runs.
        free = journal.plan(proposed("other", run_id="run-unleased", fence=0))
        journal.transition(free.action_id, S.PLANNED, S.DISPATCHED, fence=0)


def test_a_move_that_waited_for_a_takeover_is_refused(database_url: str) -> None:
    """A move waits for a takeover in flight (it holds the run's row), then reads the fence the
    takeover left: the old writer's move is refused, whatever the move had seen before."""
    with (
        open_journal(database_url) as journal,
        open_lease_store(database_url) as leases,
        open_database(database_url) as taker,
    ):
        leases.register("run-1", task="refund O-42", user_id="u-1")
        old = leases.claim("run-1", "worker-a", ttl_s=30)
        action = journal.plan(proposed(fence=old.fence))
        refused: list[BaseException] = []

        def move() -> None:
            try:
                journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=old.fence)
            except StaleWriter as exc:
                refused.append(exc)

        mover = threading.Thread(target=move)
        with taker.transaction():
            lock_run(taker, "run-1", exclusive=True)
            taker.execute("UPDATE lw_runs SET fence = fence + 1 WHERE run_id = 'run-1'")
            mover.start()
            mover.join(0.5)
            assert mover.is_alive(), "the move waits for the takeover's transaction"
        mover.join(30)
        assert len(refused) == 1
        assert journal.get(action.action_id).status is S.PLANNED  # type: ignore[union-attr]
        assert [e.to_status for e in journal.events(action.action_id)] == [S.PLANNED]


def test_transition_records_outcome_attempts_and_events(journal: ActionJournal) -> None:
    action = journal.plan(proposed())
    steps: list[tuple[ActionStatus, ActionStatus, dict[str, Any]]] = [
        (S.PLANNED, S.DISPATCHED, {"count_attempt": True}),
        (S.DISPATCHED, S.UNKNOWN, {"outcome": {"error": "timeout"}, "detail": {"why": "t/o"}}),
        (S.UNKNOWN, S.RECONCILING, {}),
        (S.RECONCILING, S.DISPATCHED, {"count_attempt": True}),
        (S.DISPATCHED, S.SUCCEEDED, {"outcome": {"refund_id": "R-900"}}),
    ]
    for before, after, options in steps:
        action = journal.transition(action.action_id, before, after, fence=1, **options)
        if after is S.RECONCILING:
            assert action.outcome == {"error": "timeout"}, "outcome=None keeps the outcome"
    assert action.attempts == 2
    assert action.outcome == {"refund_id": "R-900"}
    assert action.updated_at >= action.created_at

    events = journal.events(action.action_id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, S.PLANNED),
        *[(before, after) for before, after, _ in steps],
    ]
    assert events[2].detail == {"why": "t/o"}
    assert all(e.at.utcoffset() == timedelta(0) for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)


def test_transition_of_an_unknown_action(journal: ActionJournal) -> None:
    with pytest.raises(ActionNotFound):
        journal.transition("act-missing", S.PLANNED, S.DISPATCHED, fence=1)


def test_each_write_is_committed_when_it_returns(database_url: str) -> None:
    with open_journal(database_url) as writer, open_journal(database_url) as reader:
        action = writer.plan(proposed())
        writer.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=1)
        assert reader.get(action.action_id).status is S.DISPATCHED  # type: ignore[union-attr]


def plan_together(journals: list[ActionJournal], intent_key: str) -> list[Action]:
    """Each journal (its own connection) plans the same intent at the same moment."""
    barrier = threading.Barrier(len(journals))
    results: list[Action] = []

    def plan(journal: ActionJournal) -> None:
        barrier.wait()
        results.append(journal.plan(proposed(intent_key)))

    threads = [threading.Thread(target=plan, args=(journal,)) for journal in journals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=PATIENCE_S)
    return results


def test_concurrent_plans_of_one_intent_keep_one_row(database_url: str) -> None:
    rounds = 5
    with open_journal(database_url) as first, open_journal(database_url) as second:
        for n in range(rounds):
            results = plan_together([first, second], f"intent-{n}")
            assert len(results) == 2, "both plans returned"
            assert len({action.action_id for action in results}) == 1
        assert len(first.for_run("run-1")) == rounds


def test_for_run_lists_in_created_order(journal: ActionJournal) -> None:
    planned = [journal.plan(proposed(f"intent-{n}")).action_id for n in range(4)]
    journal.plan(proposed("elsewhere", run_id="run-2"))
    assert [a.action_id for a in journal.for_run("run-1")] == planned


def test_in_status_lists_the_actions_of_any_run_in_those_statuses(journal: ActionJournal) -> None:
    unresolved = (S.DISPATCHED, S.UNKNOWN, S.RECONCILING)
    expected = {
        walk(journal, path_to(s), f"i-{s}", run_id=f"run-{s}").action_id for s in unresolved
    }
    settled = {
        status: walk(journal, path_to(status), f"i-{status}", run_id="run-done").action_id
        for status in (S.PLANNED, S.APPROVED, S.SUCCEEDED, S.FAILED, S.ESCALATED)
    }
    assert {a.action_id for a in journal.in_status(UNRESOLVED_STATUSES)} == expected
    assert [a.action_id for a in journal.in_status([S.ESCALATED])] == [settled[S.ESCALATED]]
    assert journal.in_status([]) == []


def test_values_with_nul_characters_are_kept_exactly(journal: ActionJournal) -> None:
    """A business system may answer with a NUL character; the journal must record that answer
    as it came (Postgres JSONB cannot hold one, so the columns are JSON)."""
    args = {"order_id": "O-42", "note": "a\x00b"}
    action = journal.plan(proposed(args=args))
    journal.transition(action.action_id, S.PLANNED, S.DISPATCHED, fence=1, count_attempt=True)
    outcome = {"refund_id": "R-1\x00", "lines": [{"memo": "\x00"}]}
    done = journal.transition(
        action.action_id,
        S.DISPATCHED,
        S.SUCCEEDED,
        fence=1,
        outcome=outcome,
        detail={"raw": "\x00"},
    )
    assert done.args == args and done.outcome == outcome
    assert journal.get(action.action_id) == done
    assert journal.events(action.action_id)[-1].detail == {"raw": "\x00"}
