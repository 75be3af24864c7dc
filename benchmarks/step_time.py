"""Tool-step wall time: loopwright against the bare prebuilt agent, side by side, and the cost
of one node commit against a raw Postgres INSERT + COMMIT of the same bytes.

    python -m benchmarks.step_time [--steps 100] [--db SERVER_URL]

Both run the reading task (one model decision and one ~1 KB read per tool step) with the
zero-latency scripted model, on LangGraph's Postgres saver with durability "sync" (loopwright's
is the fenced subclass), against the same orders service, in this one process. A loopwright tool
step is five committed nodes (guard, compile_context, model_step, validate, execute); the bare
agent's is two (agent, tools). Goals: loopwright / bare <= 1.5x per tool step; a node commit
<= 2x a raw INSERT + COMMIT of the same bytes. Where loopwright misses a goal the script says
where the time goes (cProfile, top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver

from benchmarks.perf_setup import (
    PRINCIPAL,
    TASK,
    Bench,
    bare_agent,
    bare_tools,
    bench_environment,
    open_reading_runner,
    reading_model,
    thread_bytes,
)
from loopwright.checkpoints.fenced import FencedSaver

STEP_GOAL = 1.5
COMMIT_GOAL = 2.0
LOOPWRIGHT_NODES_PER_STEP = 5
BARE_NODES_PER_STEP = 2


@dataclass
class CommitTimer:
    """Time spent in a saver's durable writes (put_writes and put), and how many there were."""

    seconds: float = 0.0
    puts: int = 0


@contextmanager
def timed_commits(saver: FencedSaver | PostgresSaver) -> Iterator[CommitTimer]:
    """Wrap the saver's writes on this instance only."""
    timer = CommitTimer()
    put, put_writes = saver.put, saver.put_writes

    def timed(write: Callable[..., Any], counts: bool) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return write(*args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - started
                timer.puts += counts

        return call

    saver.put = timed(put, True)  # type: ignore[method-assign]
    saver.put_writes = timed(put_writes, False)  # type: ignore[method-assign]
    try:
        yield timer
    finally:
        del saver.put, saver.put_writes


@dataclass(frozen=True)
class Measured:
    seconds: float
    steps: int
    commits: CommitTimer
    bytes_written: int

    @property
    def per_step_ms(self) -> float:
        return 1000 * self.seconds / self.steps


def run_loopwright(bench: Bench, steps: int, profile: cProfile.Profile | None = None) -> Measured:
    run_id = f"lw-steps-{time.time_ns()}"
    with (
        open_reading_runner(bench.database_url, bench.endpoints, steps) as runner,
        timed_commits(runner.saver) as commits,
        psycopg.connect(bench.database_url) as conn,
    ):
        started = time.perf_counter()
        # Since Python 3.12 cProfile hooks sys.monitoring, which sees every thread: LangGraph's
        # executor threads that run the nodes, and the pool execute runs tool calls on.
        if profile is not None:
            profile.enable()
        outcome = runner.start(TASK, PRINCIPAL, run_id=run_id)
        if profile is not None:
            profile.disable()
        elapsed = time.perf_counter() - started
        assert outcome.stop_reason == "completed", outcome.stop_detail
        return Measured(elapsed, steps, commits, thread_bytes(conn, run_id))


def run_bare(bench: Bench, steps: int) -> Measured:
    thread = f"bare-steps-{time.time_ns()}"
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 10**6}
    with (
        PostgresSaver.from_conn_string(bench.database_url) as saver,
        httpx.Client() as client,
        timed_commits(saver) as commits,
        psycopg.connect(bench.database_url) as conn,
    ):
        saver.setup()
        agent = bare_agent(reading_model(steps), bare_tools(bench.endpoints, client), saver)
        started = time.perf_counter()
        agent.invoke({"messages": [HumanMessage(TASK)]}, config, durability="sync")
        elapsed = time.perf_counter() - started
        return Measured(elapsed, steps, commits, thread_bytes(conn, thread))


def raw_commit_ms(database_url: str, payload_bytes: int, repeats: int = 300) -> float:
    """One INSERT of `payload_bytes` and its COMMIT, on an autocommit connection with an explicit
    transaction, as the savers write."""
    payload = bytes(range(256)) * (payload_bytes // 256 + 1)
    payload = payload[:payload_bytes]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, payload bytea)")
        started = time.perf_counter()
        for _ in range(repeats):
            with conn.transaction():
                conn.execute("INSERT INTO bench_raw (payload) VALUES (%s)", (payload,))
        elapsed = time.perf_counter() - started
        conn.execute("DROP TABLE bench_raw")
    return 1000 * elapsed / repeats


def round_trips(profile: cProfile.Profile) -> int:
    """How many times psycopg waited for the server: one per round trip to Postgres."""
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(
        calls
        for (path, _line, name), (_cc, calls, *_rest) in stats.items()
        if name == "wait" and path.endswith("psycopg/connection.py")
    )


# Where a thread only waits for another (LangGraph's stream waiting for its executor): not work.
WAITING = ("SimpleQueue' objects}", "lock' objects}", "threading.py")


def top_functions(profile: cProfile.Profile, limit: int = 15) -> str:
    """The functions with the most own time over every thread, waits for other threads left out."""
    stats = pstats.Stats(profile)
    rows = [
        (tottime, calls, f"{func[0]}:{func[1]}({func[2]})")
        for func, (_cc, calls, tottime, _ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    rows = [row for row in rows if not any(w in row[2] for w in WAITING)]
    rows.sort(reverse=True)
    return "\n".join(
        f"  {1000 * tottime:9.1f} ms {calls:8d} calls  {name}"
        for tottime, calls, name in rows[:limit]
    )


@dataclass(frozen=True)
class StepFigures:
    loopwright_ms: float
    bare_ms: float
    bare_commit_ms: float
    commit_ms: float
    commit_bytes: int
    raw_ms: float
    round_trips_per_commit: float

    @property
    def step_ratio(self) -> float:
        return self.loopwright_ms / self.bare_ms

    @property
    def commit_ratio(self) -> float:
        return self.commit_ms / self.raw_ms


def measure(bench: Bench, steps: int) -> tuple[StepFigures, cProfile.Profile]:
    """Warm both up (imports, connections, the services' caches), then measure side by side:
    bare, loopwright, and loopwright again under the profiler (which slows it down)."""
    run_loopwright(bench, 5)
    run_bare(bench, 5)
    bare = run_bare(bench, steps)
    ours = run_loopwright(bench, steps)
    profile = cProfile.Profile()
    profiled = run_loopwright(bench, steps, profile)
    commit_bytes = ours.bytes_written // max(1, ours.commits.puts)
    figures = StepFigures(
        loopwright_ms=ours.per_step_ms,
        bare_ms=bare.per_step_ms,
        bare_commit_ms=1000 * bare.commits.seconds / max(1, bare.commits.puts),
        commit_ms=1000 * ours.commits.seconds / max(1, ours.commits.puts),
        commit_bytes=commit_bytes,
        raw_ms=raw_commit_ms(bench.database_url, commit_bytes),
        round_trips_per_commit=round_trips(profile) / max(1, profiled.commits.puts),
    )
    return figures, profile


def report(figures: StepFigures, steps: int, profile: cProfile.Profile) -> list[str]:
    lines = [
        f"tool step, {steps} steps: loopwright {figures.loopwright_ms:.1f} ms, bare prebuilt agent "
        f"{figures.bare_ms:.1f} ms: ratio {figures.step_ratio:.2f}x (goal <= {STEP_GOAL}x) "
        f"{'met' if figures.step_ratio <= STEP_GOAL else 'MISSED'}",
        f"node commit (fenced put_writes + put): {figures.commit_ms:.2f} ms for "
        f"{figures.commit_bytes} bytes; raw INSERT + COMMIT of as many bytes {figures.raw_ms:.2f} "
        f"ms: ratio {figures.commit_ratio:.2f}x (goal <= {COMMIT_GOAL}x) "
        f"{'met' if figures.commit_ratio <= COMMIT_GOAL else 'MISSED'}",
        f"  a loopwright tool step commits {LOOPWRIGHT_NODES_PER_STEP} nodes: "
        f"{LOOPWRIGHT_NODES_PER_STEP * figures.commit_ms:.1f} ms of its "
        f"{figures.loopwright_ms:.1f} ms are commits; the bare agent commits "
        f"{BARE_NODES_PER_STEP} nodes at {figures.bare_commit_ms:.2f} ms each (stock saver, "
        f"its whole message list in every commit)",
        f"  a node commit is two transactions (put_writes, then put), each first locking the "
        f"run's lease row to check the fence: {figures.round_trips_per_commit:.1f} round trips "
        f"to Postgres per node commit (psycopg waits in the profiled run), against 3 for the raw "
        f"INSERT (BEGIN, INSERT, COMMIT)",
    ]
    if figures.step_ratio > STEP_GOAL or figures.commit_ratio > COMMIT_GOAL:
        lines += [
            "where loopwright's time goes (cProfile over every thread, own time, a thread's wait "
            "for another left out):",
            top_functions(profile),
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        figures, profile = measure(bench, args.steps)
    print("\n".join(report(figures, args.steps, profile)))


if __name__ == "__main__":
    main()
