"""`benchmarks.step_time` judges a ratio by where its median lies, not by the median alone, and
sets it beside the floor LangGraph's own supersteps give it; it times DBOS Transact beside
loopwright where DBOS is installed, and says so where it is not."""

from __future__ import annotations

import cProfile
import math
import os
import queue
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.pregel._executor import BackgroundExecutor

from benchmarks import dbos_flow, step_time
from benchmarks.db_work import DbWork, wal_position
from benchmarks.spread import MEDIAN_CONFIDENCE, Spread, Verdict
from benchmarks.superstep_floor import Floor, StoresNothing, chain, saves_in_place
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.fenced import Fence, FencedSaver
from loopwright.checkpoints.leases import StaleWriter, open_lease_store
from loopwright_refunds.services.endpoints import ServiceEndpoints


def test_the_medians_interval_is_the_order_statistics_the_binomial_gives() -> None:
    # n = 15: x(4) and x(12), 96.5% sure (x(5) and x(11) would be only 88%).
    assert Spread(tuple(float(i) for i in range(1, 16))).interval == (4.0, 12.0)
    # Fewer than six rounds cannot be 95% sure of anything narrower than all of them.
    assert Spread((3.0, 1.0, 2.0, 5.0, 4.0)).interval == (1.0, 5.0)


def test_the_medians_interval_holds_the_true_median_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, held = 2000, 0
    for _ in range(trials):
        # Skewed like a machine's slow moments: the true median of lognormvariate(0, 1) is 1.
        spread = Spread(tuple(rng.lognormvariate(0, 1) for _ in range(30)))
        low, high = spread.interval
        held += low <= 1.0 <= high
    assert held / trials >= MEDIAN_CONFIDENCE - 0.015


def test_a_goal_inside_the_interval_is_neither_met_nor_missed() -> None:
    centred = Spread(tuple(1.20 + 0.01 * i for i in range(11)))  # 1.20 .. 1.30
    assert Verdict.of(centred, 1.25) is Verdict.AT_THE_GOAL
    assert Verdict.of(centred, 1.40) is Verdict.MET
    assert Verdict.of(centred, 1.10) is Verdict.MISSED


def test_the_floor_chain_is_one_superstep_a_node() -> None:
    # The floor is time per superstep: it holds only while each node is a superstep of its own, with
    # a checkpoint after it (and one for the input).
    saver = InMemorySaver()
    graph = chain(saver, nodes=5)
    config: RunnableConfig = {"configurable": {"thread_id": "floor"}}
    assert graph.invoke({"n": 0}, config, durability="sync") == {"n": 5}
    assert [c.metadata["step"] for c in saver.list(config)] == [5, 4, 3, 2, 1, 0, -1]


def test_the_floor_costs_each_superstep_the_checkpointed_chains_median_not_its_mean() -> None:
    one_slow_round = Spread((0.5, 1.3, 0.6))
    floor = Floor(
        bare_graph_ms=Spread((0.3,)),
        checkpointed_ms=one_slow_round,
        handed_off_ms=Spread((0.5, 0.55, 0.9)),
        in_place_ms=Spread((0.2, 0.25, 0.3)),
    )
    assert math.isclose(floor.cost_ms(2.2), 2.2 * 0.6)
    assert math.isclose(floor.hand_offs_ms, 0.55 - 0.25)


def test_the_hand_offs_are_timed_with_the_saves_run_in_place_and_only_then() -> None:
    threads: list[int] = []

    class Noting(StoresNothing):
        def put(self, config: RunnableConfig, checkpoint: Any, *rest: Any) -> RunnableConfig:
            threads.append(threading.get_ident())
            return super().put(config, checkpoint, *rest)

    graph = chain(Noting(), nodes=3)
    with saves_in_place():
        assert graph.invoke({"n": 0}, {"configurable": {"thread_id": "here"}}) == {"n": 3}
    assert set(threads) == {threading.get_ident()}
    threads.clear()
    graph.invoke({"n": 0}, {"configurable": {"thread_id": "pool"}}, durability="sync")
    assert threads and threading.get_ident() not in threads


def test_only_the_saves_run_in_place_tasks_beside_another_still_go_to_the_pool() -> None:
    """Two tasks of one superstep: LangGraph hands them to its pool, as it ships, and the
    measurement takes only the saves off it (a runtime run whose every hand-off ran in place
    waited for itself)."""
    ran: list[int] = []
    saved: list[int] = []

    def a(state: _Two) -> dict[str, int]:
        ran.append(threading.get_ident())
        return {"a": state["a"] + 1}

    def b(state: _Two) -> dict[str, int]:
        ran.append(threading.get_ident())
        return {"b": state["b"] + 1}

    class Noting(StoresNothing):
        def put(self, config: RunnableConfig, checkpoint: Any, *rest: Any) -> RunnableConfig:
            saved.append(threading.get_ident())
            return super().put(config, checkpoint, *rest)

    builder = StateGraph(_Two)
    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_edge(START, "a")
    builder.add_edge(START, "b")
    graph = builder.compile(checkpointer=Noting())
    with saves_in_place():
        graph.invoke({"a": 0, "b": 0}, {"configurable": {"thread_id": "two"}}, durability="sync")
    assert len(ran) == 2 and threading.get_ident() not in ran
    assert set(saved) == {threading.get_ident()}


def test_database_work_is_a_difference_and_a_median_field_by_field_wal_included() -> None:
    short, long = DbWork(40, 40, 30, 9_000, 20_000), DbWork(140, 140, 130, 60_000, 90_000)
    assert long - short == DbWork(100, 100, 100, 51_000, 70_000)
    works = [
        DbWork(4, 4, 4, 5_000, 8_000),
        DbWork(5, 3, 4, 5_200, 30_000),
        DbWork(4, 4, 4, 0, 9_000),
    ]
    assert DbWork.median(works) == DbWork(4, 4, 4, 5_000, 9_000)


@pytest.mark.postgres
def test_the_wal_position_moves_by_at_least_the_bytes_a_commit_stores(postgres_url: str) -> None:
    payload = os.urandom(200_000)  # random: Postgres cannot compress it below its size
    before = wal_position(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS wal_probe (payload bytea)")
        conn.execute("INSERT INTO wal_probe (payload) VALUES (%s)", (payload,))
        conn.execute("DROP TABLE wal_probe")
    assert wal_position(postgres_url) - before >= len(payload)


@pytest.mark.postgres
def test_the_benchmark_times_dbos_transact_beside_loopwright_on_both_backends(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As small as it runs: two rounds of two steps, the database work from one 2- and 4-step run.
    monkeypatch.setattr(step_time, "WORK_STEPS", 2)
    monkeypatch.setattr(step_time, "WORK_REPEATS", 1)
    step_time.main(
        ["--steps", "2", "--rounds", "2", "--max-rounds", "2", "--db", postgres_server_url]
    )
    out = capsys.readouterr().out
    for backend in ("postgres", "sqlite"):
        length = out.split(f"{backend}, 2 steps:")[1].split("\n", 1)[1].split("database work")[0]
        assert re.search(r"DBOS Transact [\d.]+ \(.*\): tool step [\d.]+ ms", length), out
        assert re.search(r"ratio loopwright / DBOS [\d.]+x .* \(goal <= 1.0x\)", length), out
        assert re.search(r"no durability \([\d.]+ ms a tool step\): loopwright -?[\d.]+ ms", length)
    # A node commit's WAL pages, by the table or index they belong to, add up to the whole.
    wal = re.search(r"WAL pages a commit: node commit ([\d.]+) \((.*?)\), raw insert", out)
    assert wal is not None, out
    parts = [float(part.rsplit(" ", 1)[1]) for part in wal[2].split(", ")]
    assert "lw_checkpoints" in wal[2], out
    assert math.isclose(sum(parts), float(wal[1]), abs_tol=0.05 + 0.005 * len(parts)), out
    # DBOS's connections are SQLAlchemy's, opened by psycopg.connect: traced as loopwright's are.
    dbos = re.search(r"DBOS Transact: ([\d.]+) transactions, ([\d.]+) round trips", out)
    assert dbos is not None, out
    assert float(dbos[1]) >= dbos_flow.STEPS_PER_TOOL_STEP, out
    assert "DBOS Transact's run besides its tool steps:" in out


@pytest.mark.postgres
def test_with_the_saves_in_place_both_agents_run_and_langgraph_ships_as_it_was_after(
    postgres_server_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--saves-in-place measures the runs with LangGraph's saves on the loop's thread: every
    run completes (a runtime run whose every hand-off ran in place waited for itself), and
    LangGraph's pool is its own again afterwards."""
    # Without DBOS: its one instance a process keeps the log stream of the test that made it.
    monkeypatch.setitem(sys.modules, "dbos", None)
    shipped = BackgroundExecutor.submit
    small = ["--steps", "2", "--rounds", "2", "--max-rounds", "2", "--backend", "sqlite"]
    step_time.main([*small, "--db", postgres_server_url, "--saves-in-place"])
    out = capsys.readouterr().out
    assert out.startswith("LangGraph's saves ran on the loop's thread"), out
    assert "sqlite, 2 steps: tool step loopwright" in out  # each of its runs completed
    assert BackgroundExecutor.submit is shipped


def test_without_dbos_the_benchmark_says_it_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "dbos", None)  # import dbos raises ImportError
    nowhere = "http://127.0.0.1:9"
    endpoints = ServiceEndpoints(orders=nowhere, policies=nowhere, payments=nowhere)
    with dbos_flow.launched(f"sqlite:///{tmp_path / 'dbos.sqlite3'}", endpoints) as flow:
        assert flow == dbos_flow.NOT_INSTALLED
    assert not (tmp_path / "dbos.sqlite3").exists()


def test_the_profile_leaves_out_a_thread_waiting_for_another_or_sleeping() -> None:
    answers: queue.SimpleQueue[int] = queue.SimpleQueue()

    def answer_later() -> None:
        time.sleep(0.05)
        answers.put(1)

    profile = cProfile.Profile()
    profile.enable()
    thread = threading.Thread(target=answer_later)
    thread.start()
    answers.get()  # 50 ms waiting for the thread, which sleeps meanwhile
    thread.join()
    profile.disable()
    shown = step_time.top_functions(profile, limit=100)
    assert "SimpleQueue" not in shown, shown
    assert "time.sleep" not in shown, shown
    assert "answer_later" in shown, shown


def test_the_timed_runs_write_through_the_attempts_fenced_saver(sqlite_url: str) -> None:
    # A run writes through a copy of the runner's saver fenced to its attempt's lease: the
    # timer must see those writes, and must not carry an unfenced write into the copy.
    run_id = "timed-run"
    with open_lease_store(sqlite_url) as leases, open_checkpointer(sqlite_url) as saver:
        leases.register(run_id, task="t", user_id="u-1")
        lease = leases.claim(run_id, "bench", ttl_s=60)
        stale = saver.fenced(Fence(run_id=run_id, owner="bench", fence=lease.fence + 1))
        config: RunnableConfig = {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}}
        with step_time.timed_commits(saver) as timer:
            with pytest.raises(StaleWriter):
                stale.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
            saver.fenced(Fence.of(lease)).put(
                config, empty_checkpoint(), {"source": "input", "step": -1}, {}
            )
        assert [name for name, _ in timer.calls] == ["put", "put"]
        assert timer.puts == 2
        assert type(saver).put is FencedSaver.put  # unwrapped after the block


def test_the_timed_saver_is_told_which_node_wrote_as_an_untimed_one_is(sqlite_url: str) -> None:
    # LangGraph hands a write's task path, which names its node (and so whether its commit waits
    # for the disk), only to a put_writes whose signature takes it: timing must not hide it.
    with open_checkpointer(sqlite_url) as saver, step_time.timed_commits(saver) as timer:
        builder = StateGraph(Counted)
        builder.add_node("count", lambda state: {"n": state["n"] + 1})
        builder.add_edge(START, "count")
        config: RunnableConfig = {"configurable": {"thread_id": "named"}}
        builder.compile(checkpointer=saver).invoke({"n": 0}, config, durability="sync")
    paths = [args[3] for name, args in timer.calls if name == "put_writes"]
    assert {path.rpartition(", ")[2] for path in paths} == {"__start__", "count"}


class _Two(TypedDict):
    a: int
    b: int


class Counted(TypedDict):
    n: int
