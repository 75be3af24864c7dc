"""Run leases, fencing tokens, and the fenced checkpointer refusing a stale worker."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from loopwright.checkpoints import compact, fenced
from loopwright.checkpoints.compact import Layout
from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.leases import (
    SERVER_ENGINE,
    LeaseHeld,
    LeaseLost,
    LeaseStore,
    RunNotFound,
    RunPruned,
    StaleWriter,
    lock_run,
    open_lease_store,
)
from loopwright.checkpoints.schema import UNENDED_RUNS
from loopwright.checkpoints.sql import open_database
from loopwright.core.state import ENDED_PHASES

RUN = "run-1"
CONFIG: RunnableConfig = {"configurable": {"thread_id": RUN}}


@pytest.fixture
def leases(database_url: str) -> Iterator[LeaseStore]:
    with open_lease_store(database_url) as store:
        store.register(RUN, task="refund O-42", user_id="u-1")
        yield store


def test_register_is_idempotent(leases: LeaseStore) -> None:
    again = leases.register(RUN, task="something else", user_id="u-2")
    assert (again.task, again.user_id, again.fence, again.owner) == ("refund O-42", "u-1", 0, None)
    assert again.phase == "READY"
    assert leases.get("run-missing") is None


def test_claim_renew_release(leases: LeaseStore) -> None:
    lease = leases.claim(RUN, "worker-a", ttl_s=30)
    assert (lease.owner, lease.fence) == ("worker-a", 1)
    run = leases.get(RUN)
    assert run is not None and run.lease_live and run.owner == "worker-a"

    extended = leases.claim(RUN, "worker-a", ttl_s=60)
    assert extended.fence == 1, "re-claiming a live lease extends it under the same fence"
    assert extended.expires_at > lease.expires_at

    renewed = leases.renew(extended)
    assert renewed.fence == 1 and renewed.expires_at >= extended.expires_at

    leases.release(renewed)
    run = leases.get(RUN)
    assert run is not None and run.owner is None and not run.lease_live
    with pytest.raises(LeaseLost):
        leases.renew(renewed)
    assert leases.claim(RUN, "worker-a", ttl_s=30).fence == 2, "a new claim bumps the fence"


def test_a_live_lease_is_held_against_other_owners(leases: LeaseStore) -> None:
    lease = leases.claim(RUN, "worker-a", ttl_s=30)
    with pytest.raises(LeaseHeld, match="worker-a") as refused:
        leases.claim(RUN, "worker-b", ttl_s=30)
    assert refused.value.owner == "worker-a"
    assert refused.value.expires_at == lease.expires_at


def test_takeover_after_expiry_bumps_the_fence(leases: LeaseStore) -> None:
    stale = leases.claim(RUN, "worker-a", ttl_s=0.2)
    time.sleep(0.3)
    taken = leases.claim(RUN, "worker-b", ttl_s=30)
    assert taken.fence == stale.fence + 1
    with pytest.raises(LeaseLost, match="now owner worker-b, fence 2"):
        leases.renew(stale)
    leases.release(stale)  # releasing a lost lease releases nothing
    assert leases.get(RUN).owner == "worker-b"  # type: ignore[union-attr]


def test_a_dead_process_s_lease_is_given_up_for_it_and_nobody_else_s(leases: LeaseStore) -> None:
    """A process reaped by its parent holds its run no longer: the parent gives the lease up
    for it, and the run is taken at once under a new fence (its writes, were any still on
    their way, refused). Another process's lease, or a process named by a prefix of its pid,
    is not given up."""
    dead = leases.claim(RUN, "host-1:4242:ab12cd", ttl_s=30)
    assert not leases.release_for_dead(RUN, "host-1:424:")
    assert not leases.release_for_dead(RUN, "host-2:4242:")
    assert leases.get(RUN).owner == dead.owner  # type: ignore[union-attr]
    assert leases.release_for_dead(RUN, "host-1:4242:")
    taken = leases.claim(RUN, "host-1:5151:ef34ab", ttl_s=30)
    assert taken.fence == dead.fence + 1
    assert not leases.release_for_dead(RUN, "host-1:4242:")  # it holds nothing any more
    assert leases.get(RUN).owner == taken.owner  # type: ignore[union-attr]


def test_reclaim_after_own_expiry_bumps_the_fence(leases: LeaseStore) -> None:
    first = leases.claim(RUN, "worker-a", ttl_s=0.2)
    time.sleep(0.3)
    assert leases.claim(RUN, "worker-a", ttl_s=30).fence == first.fence + 1


def test_an_attempt_s_record_can_give_the_run_up_with_it(leases: LeaseStore) -> None:
    lease = leases.claim(RUN, "worker-a", ttl_s=30)
    leases.record(lease, "RECONCILING", release=True)
    run = leases.get(RUN)
    assert run is not None and (run.phase, run.owner, run.lease_live) == (
        "RECONCILING",
        None,
        False,
    )
    # Given up, the lease is lost: a second record is refused and changes nothing.
    with pytest.raises(LeaseLost):
        leases.record(lease, "COMPLETED", release=True)
    assert leases.get(RUN).phase == "RECONCILING"  # type: ignore[union-attr]
    assert leases.claim(RUN, "worker-b", ttl_s=30).fence == lease.fence + 1


def test_a_parked_run_an_engine_hosts_is_woken_by_one_caller_and_never_by_a_worker(
    leases: LeaseStore,
) -> None:
    past = leases.now() - timedelta(seconds=1)
    for run_id, engine in (("served-1", SERVER_ENGINE), ("in-process-1", "")):
        _, lease = leases.begin(run_id, "w", 30, task="t", user_id="u-1", agent="a", engine=engine)
        assert lease is not None
        leases.record(lease, "RECONCILING", past, release=True)
    # A worker takes the in-process run only (and the fixture's, of no agent): the engine
    # continues its own (`server.waker`).
    assert [run.run_id for run in leases.due("a")] == [RUN, "in-process-1"]
    # Of two callers at once, one gets the served run, and it is not due again until the hold.
    assert [run.run_id for run in leases.wake("a", hold_s=30, stranded_after_s=60)] == ["served-1"]
    assert leases.wake("a", hold_s=30, stranded_after_s=60) == []
    assert leases.wake("other-agent", hold_s=30, stranded_after_s=60) == []
    held = leases.get("served-1")
    assert held is not None and held.next_attempt_at is not None
    assert held.next_attempt_at > leases.now() + timedelta(seconds=20)


def test_a_served_run_nobody_advances_is_woken_once_quiet_and_never_while_held_or_waiting(
    leases: LeaseStore,
) -> None:
    # The engine lost the run's attempt (its process died, or the engine gave the run up) and
    # started no other: nothing holds the run, nobody is asked anything about it.
    _, lost = leases.begin(
        "lost", "w", 0.2, task="t", user_id="u-1", agent="a", engine=SERVER_ENGINE
    )
    _, held = leases.begin(
        "held", "w", 30, task="t", user_id="u-1", agent="a", engine=SERVER_ENGINE
    )
    _, asks = leases.begin(
        "asks", "w", 30, task="t", user_id="u-1", agent="a", engine=SERVER_ENGINE
    )
    _, mine = leases.begin("mine", "w", 0.2, task="t", user_id="u-1", agent="a", engine="")
    assert lost is not None and held is not None and asks is not None and mine is not None
    leases.record(asks, "WAITING_APPROVAL", release=True)
    time.sleep(0.3)
    # Quiet for less than the bound: not yet (the engine's own recovery comes first).
    assert leases.wake("a", hold_s=30, stranded_after_s=60) == []
    # Quiet for longer: the lost run alone, taken by one caller, not again before the hold.
    assert [run.run_id for run in leases.wake("a", hold_s=30, stranded_after_s=0.1)] == ["lost"]
    assert leases.wake("a", hold_s=30, stranded_after_s=0.1) == []
    # Claimed again by the engine's attempt, it is held: never woken while so.
    again = leases.claim("lost", "w2", ttl_s=30)
    assert again.fence == lost.fence + 1
    assert leases.wake("a", hold_s=0, stranded_after_s=0) == []


def test_a_record_after_a_takeover_is_refused_and_changes_nothing(leases: LeaseStore) -> None:
    # The check and the change are one guarded UPDATE: a stale owner's record matches no row.
    stale = leases.claim(RUN, "worker-a", ttl_s=0.2)
    time.sleep(0.3)
    taken = leases.claim(RUN, "worker-b", ttl_s=30)
    with pytest.raises(LeaseLost, match="now owner worker-b, fence 2"):
        leases.record(stale, "COMPLETED", release=True)
    run = leases.get(RUN)
    assert run is not None
    assert (run.phase, run.owner, run.fence, run.lease_live) == ("READY", "worker-b", 2, True)
    assert leases.renew(taken).fence == 2


def test_a_new_run_is_registered_with_the_database_s_time(leases: LeaseStore) -> None:
    before = leases.now()
    run = leases.register("run-2", task="refund O-43", user_id="u-1")
    assert (run.fence, run.owner, run.phase, run.lease_live) == (0, None, "READY", False)
    assert before <= run.created_at <= leases.now()
    assert leases.get("run-2") == run


def test_a_new_run_begins_leased_as_a_first_claim_would_lease_it(leases: LeaseStore) -> None:
    before = leases.now()
    run, lease = leases.begin("run-2", "worker-a", 30, task="refund O-43", user_id="u-1")
    assert lease is not None and (lease.owner, lease.fence, lease.ttl_s) == ("worker-a", 1, 30)
    assert not lease.cancel_requested
    assert before <= run.created_at <= lease.granted_at <= leases.now()
    assert 29 <= (lease.expires_at - lease.granted_at).total_seconds() <= 30
    assert (run.owner, run.fence, run.lease_live, run.phase) == ("worker-a", 1, True, "READY")
    assert leases.get("run-2") == run
    with pytest.raises(LeaseHeld, match="worker-a"):
        leases.claim("run-2", "worker-b", ttl_s=30)
    assert leases.claim("run-2", "worker-a", ttl_s=30).fence == 1, "the same owner extends it"
    leases.release(leases.renew(lease))
    assert leases.claim("run-2", "worker-b", ttl_s=30).fence == 2, "the next holder fences it"


def test_beginning_a_registered_run_changes_nothing_and_leases_nothing(
    leases: LeaseStore,
) -> None:
    held = leases.claim(RUN, "worker-a", ttl_s=30)
    run, lease = leases.begin(RUN, "worker-b", 30, task="other", user_id="u-2")
    assert lease is None
    assert (run.task, run.user_id, run.owner, run.fence) == ("refund O-42", "u-1", "worker-a", 1)
    leases.renew(held)  # still worker-a's, under the same fence
    with pytest.raises(ValueError, match="ttl"):
        leases.begin("run-3", "worker-a", 0, task="t", user_id="u-1")
    assert leases.get("run-3") is None


def test_runs_are_listed_by_phase(leases: LeaseStore) -> None:
    leases.register("run-2", task="refund O-43", user_id="u-1")
    lease = leases.claim("run-2", "worker-a", ttl_s=30)
    leases.record(lease, "WAITING_APPROVAL", release=True)
    assert [r.run_id for r in leases.runs("WAITING_APPROVAL")] == ["run-2"]
    assert [r.run_id for r in leases.runs("READY")] == [RUN]
    assert {r.run_id for r in leases.runs()} == {RUN, "run-2"}


def test_a_poll_finds_the_unended_runs_by_their_index(
    leases: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's poll and the approvals list read the runs that have not ended through the
    partial index of them, not by scanning every run a database has kept."""
    ended = leases.claim(RUN, "worker-a", ttl_s=30)
    leases.record(ended, "COMPLETED", release=True)
    leases.register("run-2", task="t", user_id="u-1")
    asked: list[tuple[str, Any]] = []
    execute = leases.db.execute

    def recording(sql: str, params: Any = ()) -> list[dict[str, Any]]:
        asked.append((sql, params))
        return execute(sql, params)

    monkeypatch.setattr(leases.db, "execute", recording)
    assert [r.run_id for r in leases.due()] == [r.run_id for r in leases.unended()] == ["run-2"]
    monkeypatch.undo()
    db = leases.db
    assert f"phase NOT IN ({', '.join(repr(p) for p in sorted(ENDED_PHASES))})" == UNENDED_RUNS
    for sql, params in asked:
        if db.kind is DatabaseKind.POSTGRES:
            with db.transaction():  # too few rows for the planner to pick the index freely
                db.execute("SET LOCAL enable_seqscan = off")
                plan = str(db.execute("EXPLAIN " + sql, params))
        else:
            plan = str(db.execute("EXPLAIN QUERY PLAN " + sql, params))
        assert "lw_runs_unended" in plan, (sql, plan)


def test_unregistered_runs_cannot_be_claimed(leases: LeaseStore) -> None:
    with pytest.raises(RunNotFound):
        leases.claim("run-missing", "worker-a", ttl_s=30)


class Trail(TypedDict):
    trail: list[str]


def step(name: str, state: Trail) -> dict[str, Any]:
    return {"trail": [*state["trail"], name]}


def three_steps(saver: FencedSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    """one -> two -> three, pausing after one so that a second worker can take over."""
    builder = StateGraph(Trail)
    for name in ("one", "two", "three"):
        builder.add_node(name, partial(step, name))
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", "three")
    builder.add_edge("three", END)
    return builder.compile(checkpointer=saver, interrupt_after=["one"])


def lapse(leases: LeaseStore, run_id: str) -> None:
    """The run's lease lapses now, as its holder's would once it stopped renewing it: not after
    a short time to live that a loaded machine could use up before the holder has written."""
    leases.db.write("UPDATE lw_runs SET lease_expires_at = now() WHERE run_id = %s", (run_id,))


def checkpoint_ids(saver: FencedSaver) -> list[str]:
    return [c.config["configurable"]["checkpoint_id"] for c in saver.list(CONFIG)]


def test_a_stale_worker_cannot_write_checkpoints(database_url: str, leases: LeaseStore) -> None:
    with open_checkpointer(database_url) as saver_a, open_checkpointer(database_url) as saver_b:
        lease_a = leases.claim(RUN, "worker-a", ttl_s=30)
        saver_a.fence = Fence.of(lease_a)
        graph_a = three_steps(saver_a)
        assert graph_a.invoke({"trail": []}, CONFIG, durability="sync") == {"trail": ["one"]}
        written = checkpoint_ids(saver_a)
        pending = saver_a.get_tuple(CONFIG).pending_writes  # type: ignore[union-attr]

        lapse(leases, RUN)  # worker A stopped renewing it
        lease_b = leases.claim(RUN, "worker-b", ttl_s=30)
        with pytest.raises(StaleWriter, match=r"run-1: my fence 1, current fence 2"):
            graph_a.invoke(None, CONFIG, durability="sync")
        assert checkpoint_ids(saver_b) == written, "the refused write left no checkpoint"
        assert saver_b.get_tuple(CONFIG).pending_writes == pending  # type: ignore[union-attr]

        saver_b.fence = Fence.of(lease_b)
        final = three_steps(saver_b).invoke(None, CONFIG, durability="sync")
        assert final == {"trail": ["one", "two", "three"]}

        chain = list(saver_b.list(CONFIG))  # newest first
        for newer, older in itertools.pairwise(chain):
            assert newer.parent_config == older.config, "each checkpoint follows the previous one"
        assert chain[-1].parent_config is None
        assert len(chain) == len(written) + 2  # after two, after three


def test_a_saver_is_fenced_to_one_run(database_url: str, leases: LeaseStore) -> None:
    leases.register("run-2", task="other", user_id="u-1")
    lease = leases.claim(RUN, "worker-a", ttl_s=30)
    with open_checkpointer(database_url, fence=Fence.of(lease)) as saver:
        config: RunnableConfig = {"configurable": {"thread_id": "run-2", "checkpoint_ns": ""}}
        with pytest.raises(StaleWriter, match="fenced for run-1"):
            saver.put(config, empty_checkpoint(), {}, {})
        assert list(saver.list(config)) == []


class CommitGate:
    """Holds a commit open at its last point before COMMIT: every statement executed (the run's
    row locked, the fence checked, the rows written), nothing committed."""

    POINT = "checkpoint:commit:before_commit:"

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def __call__(self, name: str) -> None:
        if name == self.POINT:
            self.inside.set()
            assert self.release.wait(60)


@pytest.mark.parametrize("layout", list(Layout))
def test_a_takeover_waits_for_the_write_in_flight(
    database_url: str, leases: LeaseStore, monkeypatch: pytest.MonkeyPatch, layout: Layout
) -> None:
    gate = CommitGate()
    committer = compact if layout is Layout.COMPACT else fenced
    with (
        open_checkpointer(database_url, new_threads=layout) as saver,
        open_lease_store(database_url) as other,
    ):
        # Long enough for the commits below to reach their fence check however loaded the
        # machine; it lapses while the write is held (its row is locked: it cannot be lapsed).
        lease_a = leases.claim(RUN, "worker-a", ttl_s=2)
        saver.fence = Fence.of(lease_a)
        config = saver.put(
            {"configurable": {"thread_id": RUN, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        )
        monkeypatch.setattr(committer, "crash_point", gate)
        monkeypatch.setattr(committer, "armed", lambda: frozenset({CommitGate.POINT}))
        writer = threading.Thread(target=saver.put_writes, args=(config, [("x", "hold")], "t1"))
        writer.start()
        assert gate.inside.wait(30), "the write is in flight, its fence already checked"
        while leases.now() <= lease_a.expires_at:  # worker A's lease expires meanwhile
            time.sleep(0.05)

        claimed = []
        claimer = threading.Thread(target=lambda: claimed.append(other.claim(RUN, "b", 30)))
        claimer.start()
        claimer.join(0.3)
        assert claimer.is_alive(), "the takeover waits until the checked write commits"

        gate.release.set()
        writer.join(30)
        claimer.join(30)
        assert [lease.fence for lease in claimed] == [lease_a.fence + 1]
        assert [w[1:] for w in saver.get_tuple(config).pending_writes] == [("x", "hold")]  # type: ignore[union-attr]
        with pytest.raises(StaleWriter):
            saver.put_writes(config, [("y", 1)], "t2")


def test_a_claim_that_waited_for_a_prune_is_refused(database_url: str, leases: LeaseStore) -> None:
    """A claim waits for a prune that holds the run's row, and then judges the row as the
    prune left it: a pruned run is never claimed, whatever the claim had seen before."""
    with open_database(database_url) as pruner:
        refused: list[BaseException] = []

        def claim() -> None:
            try:
                leases.claim(RUN, "worker-a", ttl_s=30)
            except RunPruned as exc:
                refused.append(exc)

        claimer = threading.Thread(target=claim)
        with pruner.transaction():
            lock_run(pruner, RUN, exclusive=True)
            pruner.execute("UPDATE lw_runs SET pruned_at = now() WHERE run_id = %s", (RUN,))
            claimer.start()
            claimer.join(0.5)
            assert claimer.is_alive(), "the claim waits for the prune's transaction"
        claimer.join(30)
        run = leases.get(RUN)
    assert len(refused) == 1 and run is not None and (run.owner, run.fence) == (None, 0)


def test_an_unfenced_saver_is_the_stock_saver(database_url: str) -> None:
    with open_checkpointer(database_url) as saver:
        assert saver.fence is None
        config = saver.put(
            {"configurable": {"thread_id": "unleased", "checkpoint_ns": ""}},
            empty_checkpoint(),
            {},
            {},
        )
        saver.put_writes(config, [("x", 1)], "t1")
        assert saver.get_tuple(config).pending_writes == [("t1", "x", 1)]  # type: ignore[union-attr]
