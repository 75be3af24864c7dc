"""Checkpoint storage per step, up to 500 steps with ~1 KB observations, against the bare agent.

    python -m benchmarks.storage [--steps 500] [--backend postgres sqlite] [--db SERVER_URL]

Runs the reading task for N tool steps on loopwright (the fenced saver, durability "sync") in
its compact layout (`checkpoints.compact`) and, side by side, in LangGraph's own layout (the
server's runs are written in it, and the runtime's were before), and on the bare prebuilt agent
(the stock saver, durability "sync"), on Postgres and on SQLite (the embedded default). After
every step it reads the payload bytes each thread holds (`perf_setup.THREAD_BYTES`: LangGraph's
checkpoints, blobs and writes, or the compact rows' bodies and the writes saved alone; keys and
row headers not counted; Postgres: logical sizes, before its own compression). loopwright's
history and evidence are delta channels, so a step should add about the same bytes at step 500
as at step 1; the bare agent stores its whole message list again at every step. Goals:
bytes/step over the last 100 steps within 1.2x of the first 100 (linear); loopwright's total at
N steps <= 0.1x the bare agent's; bytes per tool step <= 4x the observation's (the read's answer
as the model sees it). The script prints where a tool step's bytes go (each write by channel,
the keyframes, the rows' bookkeeping) and whole rows per table, keys and headers included,
and how long reading each loopwright run back takes in each layout (no goal): its state, what a
resumed run and `show` read first, and its whole history, what `timeline` reads.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from benchmarks.perf_setup import (
    PRINCIPAL,
    TASK,
    Bench,
    bare_agent,
    bare_tools,
    bench_environment,
    observation_bytes,
    open_reading_runner,
    reading_model,
)
from benchmarks.step_time import Backend
from loopwright.checkpoints.compact import Layout
from loopwright.checkpoints.database import DatabaseKind
from loopwright.checkpoints.frames import Row, packed, rebuild
from loopwright.checkpoints.sql import open_database
from loopwright.core import tls
from loopwright.runner import Runner

WINDOW = 100
LINEAR_GOAL = 1.2
BARE_GOAL = 0.1
PAYLOAD_GOAL = 4.0
BARE_SAMPLE_EVERY = 10  # the bare agent's size is read every 10 steps (its reads are slow)
STATE_READS = 5  # a state read is timed this many times (the median is printed)

# Whole rows per table, keys and row headers included: Postgres's own size of each (after its
# compression of long values, which starts once a row passes about 2 KB); SQLite's payload and
# keys (it has no per-row size to ask for).
ROWS_BY_TABLE = {
    DatabaseKind.POSTGRES: """
SELECT 'lw_checkpoints' AS tab, count(*) AS n, coalesce(sum(pg_column_size(t.*)), 0) AS bytes
  FROM lw_checkpoints t WHERE thread_id = %s
UNION ALL
SELECT 'lw_checkpoint_writes', count(*), coalesce(sum(pg_column_size(t.*)), 0)
  FROM lw_checkpoint_writes t WHERE thread_id = %s
UNION ALL
SELECT 'checkpoints', count(*), coalesce(sum(pg_column_size(t.*)), 0)
  FROM checkpoints t WHERE thread_id = %s
UNION ALL
SELECT 'checkpoint_blobs', count(*), coalesce(sum(pg_column_size(t.*)), 0)
  FROM checkpoint_blobs t WHERE thread_id = %s
UNION ALL
SELECT 'checkpoint_writes', count(*), coalesce(sum(pg_column_size(t.*)), 0)
  FROM checkpoint_writes t WHERE thread_id = %s
""",
    DatabaseKind.SQLITE: """
SELECT 'lw_checkpoints' AS tab, count(*) AS n, coalesce(sum(length(body)
       + length(thread_id) + length(checkpoint_ns) + length(checkpoint_id)
       + coalesce(length(parent_id), 0) + 1), 0) AS bytes
  FROM lw_checkpoints WHERE thread_id = %s
UNION ALL
SELECT 'lw_checkpoint_writes', count(*), coalesce(sum(length(blob) + length(thread_id)
       + length(checkpoint_ns) + length(checkpoint_id) + length(task_id) + length(task_path)
       + length(channel) + length(type) + 4), 0)
  FROM lw_checkpoint_writes WHERE thread_id = %s
UNION ALL
SELECT 'checkpoints', count(*), coalesce(sum(length(checkpoint) + length(metadata)
       + length(thread_id) + length(checkpoint_ns) + length(checkpoint_id)
       + coalesce(length(parent_checkpoint_id), 0)), 0)
  FROM checkpoints WHERE thread_id = %s
UNION ALL
SELECT 'writes', count(*), coalesce(sum(length(value) + length(thread_id)
       + length(checkpoint_ns) + length(checkpoint_id) + length(task_id) + length(channel)
       + length(type) + 4), 0)
  FROM writes WHERE thread_id = %s
""",
}


@dataclass(frozen=True)
class Reads:
    """How long reading a finished run back takes: its state (the median of STATE_READS reads),
    its whole history (read once: every checkpoint, LangGraph rebuilding each), and its steps
    as its timeline reads them (`Runner.steps`: from the rows in one pass where it can)."""

    state_s: float
    history_s: float
    checkpoints: int
    steps_s: float


def time_reads(runner: Runner, run_id: str) -> Reads:
    state_s: list[float] = []
    for _ in range(STATE_READS):
        started = time.perf_counter()
        runner.state(run_id)
        state_s.append(time.perf_counter() - started)
    started = time.perf_counter()
    history = list(runner.graph.get_state_history(runner.config(run_id)))
    history_s = time.perf_counter() - started
    started = time.perf_counter()
    runner.steps(run_id)
    steps_s = time.perf_counter() - started
    return Reads(statistics.median(state_s), history_s, len(history), steps_s)


@dataclass(frozen=True)
class LoopwrightRun:
    """Thread bytes after each model decision (index k: after k tool steps), the thread, the
    median observation's bytes (a tool result as the model sees it), and the run's reads."""

    sizes: list[int]
    run_id: str
    observation_bytes: int
    reads: Reads


def loopwright_run(bench: Bench, backend: Backend, steps: int, layout: Layout) -> LoopwrightRun:
    run_id = f"lw-storage-{layout}-{time.time_ns()}"
    sizes: list[int] = []
    with open_reading_runner(backend.url, bench.endpoints, steps, layout) as runner:

        def measure(node: str, _update: dict[str, Any]) -> None:
            if node == "model_step":
                sizes.append(backend.thread_bytes(run_id))

        outcome = runner.start(TASK, PRINCIPAL, run_id=run_id, on_step=measure)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        observation = observation_bytes(runner, run_id)
        reads = time_reads(runner, run_id)
    return LoopwrightRun(sizes, run_id, observation, reads)


def bare_sizes(bench: Bench, backend: Backend, steps: int) -> list[tuple[int, int]]:
    """(tool steps done, thread bytes), every BARE_SAMPLE_EVERY steps and at the end."""
    thread = f"bare-storage-{time.time_ns()}"
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 10**6}
    sizes: list[tuple[int, int]] = []
    with backend.bare_saver() as saver, httpx.Client(verify=tls.context()) as client:
        agent = bare_agent(reading_model(steps), bare_tools(bench.endpoints, client), saver)
        decisions = 0
        stream = agent.stream(
            {"messages": [HumanMessage(TASK)]}, config, stream_mode="updates", durability="sync"
        )
        for update in stream:
            if "agent" in update:
                decisions += 1
                if (decisions - 1) % BARE_SAMPLE_EVERY == 0:
                    sizes.append((decisions - 1, backend.thread_bytes(thread)))
        sizes.append((steps, backend.thread_bytes(thread)))
    return sizes


@dataclass(frozen=True)
class StorageFigures:
    backend: str
    steps: int
    first_per_step: float
    last_per_step: float
    loopwright_total: int
    stock_layout_per_step: float  # the same run in LangGraph's layout, its last window
    bare_total: int
    bare_series: list[tuple[int, int]]
    loopwright_series: list[int]
    breakdown: list[tuple[str, int]]  # part, bytes over the whole run
    rows: list[tuple[str, int, int]]  # table, rows, their bytes (keys and headers included)
    observation_bytes: int
    reads: Reads
    stock_layout_reads: Reads

    @property
    def to_payload(self) -> float:
        """Bytes per tool step (the last window's) over the observation's bytes."""
        return self.last_per_step / self.observation_bytes

    @property
    def linearity(self) -> float:
        return self.last_per_step / self.first_per_step

    @property
    def to_bare(self) -> float:
        return self.loopwright_total / self.bare_total

    @property
    def whole_rows_per_step(self) -> float:
        return sum(b for _, _, b in self.rows) / self.steps


def per_step(sizes: Sequence[int], steps: int) -> tuple[float, float]:
    """Bytes per tool step over the first and the last window of a run."""
    window = min(WINDOW, steps // 2)
    return (sizes[window] - sizes[0]) / window, (sizes[steps] - sizes[steps - window]) / window


def measure(bench: Bench, backend: Backend, steps: int) -> StorageFigures:
    ours = loopwright_run(bench, backend, steps, Layout.COMPACT)
    stock = loopwright_run(bench, backend, steps, Layout.STOCK)
    with open_database(backend.url) as db:
        breakdown = compact_breakdown(db.execute, ours.run_id)
        sql = ROWS_BY_TABLE[db.kind]
        rows = [
            (str(r["tab"]), int(r["n"]), int(r["bytes"]))
            for r in db.execute(sql, (ours.run_id,) * sql.count("%s"))
            if r["n"]
        ]
    bare = bare_sizes(bench, backend, steps)
    first, last = per_step(ours.sizes, steps)
    return StorageFigures(
        backend=backend.name,
        steps=steps,
        first_per_step=first,
        last_per_step=last,
        loopwright_total=ours.sizes[-1],
        stock_layout_per_step=per_step(stock.sizes, steps)[1],
        bare_total=bare[-1][1],
        bare_series=bare,
        loopwright_series=ours.sizes,
        breakdown=breakdown,
        rows=rows,
        observation_bytes=ours.observation_bytes,
        reads=ours.reads,
        stock_layout_reads=stock.reads,
    )


# What deflating the rows takes off their encoded bytes (`checkpoints.frames`): a negative part.
DEFLATED = "less: the rows deflated"


def compact_breakdown(execute: Any, thread: str) -> list[tuple[str, int]]:
    """Where the compact rows' bytes go, as encoded (before a row is deflated; what deflating
    takes off is a part of its own, negative): each write's value by channel, the keyframes
    (whole states), and the rest of the rows (versions, seen versions, metadata that differs from its
    prediction, task ids, values that are no write), largest first."""
    parts: Counter[str] = Counter()
    records = execute(
        "SELECT checkpoint_id, parent_id, keyframe, body FROM lw_checkpoints"
        " WHERE thread_id = %s ORDER BY checkpoint_id DESC",
        (thread,),
    )
    chain = [
        Row(r["checkpoint_id"], r["parent_id"], bool(r["keyframe"]), r["body"]) for r in records
    ]
    for row, frame in zip(reversed(chain), rebuild(chain), strict=True):
        written = 0
        for write in frame.writes:
            parts[f"write {write.channel}"] += len(write.value[1])
            written += len(write.value[1])
        rest = "keyframes, but their writes" if row.key else "bookkeeping of the other rows"
        encoded = len(packed(row.body))
        parts[rest] += encoded - written
        parts[DEFLATED] += len(row.body) - encoded
    for record in execute(
        "SELECT channel, blob FROM lw_checkpoint_writes WHERE thread_id = %s", (thread,)
    ):
        parts[f"write saved alone {record['channel']}"] += len(record["blob"])
    return parts.most_common()


def report(figures: StorageFigures) -> list[str]:
    window = min(WINDOW, figures.steps // 2)
    linear_ok = figures.linearity <= LINEAR_GOAL
    bare_ok = figures.to_bare <= BARE_GOAL
    payload_ok = figures.to_payload <= PAYLOAD_GOAL
    whole = figures.whole_rows_per_step
    lines = [
        f"{figures.backend}: checkpoint bytes per tool step (~1 KB observations): first {window} steps "
        f"{figures.first_per_step:,.0f} B, last {window} steps {figures.last_per_step:,.0f} B: "
        f"ratio {figures.linearity:.2f} (goal <= {LINEAR_GOAL}) {'met' if linear_ok else 'MISSED'}",
        f"total at {figures.steps} steps: loopwright {figures.loopwright_total / 1e6:,.1f} MB, "
        f"bare prebuilt agent {figures.bare_total / 1e6:,.1f} MB: ratio {figures.to_bare:.3f} "
        f"(goal <= {BARE_GOAL}) {'met' if bare_ok else 'MISSED'}",
        "  bare agent, MB by steps: "
        + ", ".join(
            f"{n}: {b / 1e6:.1f}"
            for n, b in figures.bare_series[:: max(1, len(figures.bare_series) // 6)]
        ),
        f"bytes per tool step (last {window} steps) / the observation's "
        f"{figures.observation_bytes:,} B: {figures.to_payload:.1f}x (goal <= {PAYLOAD_GOAL}x) "
        f"{'met' if payload_ok else 'MISSED'}; whole rows {whole:,.0f} B, "
        f"{whole / figures.observation_bytes:.1f}x",
        f"  the same run in LangGraph's layout (the server's runs'): "
        f"{figures.stock_layout_per_step:,.0f} B a tool step, "
        f"{figures.stock_layout_per_step / figures.observation_bytes:.1f}x; compact / LangGraph's "
        f"{figures.last_per_step / figures.stock_layout_per_step:.2f}",
        f"where a tool step's bytes go (over {figures.steps} steps, per step):",
    ]
    lines += [
        f"  {b / figures.steps:9,.0f} B  {part}"
        for part, b in figures.breakdown
        if round(b / figures.steps)
    ]
    lines.append(
        "rows per tool step and their bytes, keys and headers included"
        + (" (SQLite: payload and keys)" if figures.backend == "sqlite" else " (pg_column_size)")
        + ":"
    )
    lines += [
        f"  {n / figures.steps:5.1f} rows {b / figures.steps:9,.0f} B  {table}"
        for table, n, b in figures.rows
    ]
    ours, stock = figures.reads, figures.stock_layout_reads
    lines.append(
        f"reading the run back (no goal): its state {1000 * ours.state_s:,.0f} ms, its whole "
        f"history ({ours.checkpoints} checkpoints, LangGraph rebuilding each) "
        f"{ours.history_s:,.1f} s, its steps (the timeline, from the rows) "
        f"{1000 * ours.steps_s:,.0f} ms; in LangGraph's layout {1000 * stock.state_s:,.0f} ms, "
        f"{stock.history_s:,.1f} s and {1000 * stock.steps_s:,.0f} ms (the steps from its tables)"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.storage", description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--backend", nargs="+", choices=["postgres", "sqlite"], default=["postgres", "sqlite"]
    )
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        for figures in measure_all(bench, args.steps, args.backend):
            print("\n".join(report(figures)), flush=True)


def measure_all(bench: Bench, steps: int, backends: Sequence[str]) -> list[StorageFigures]:
    """`measure` on each backend: the bench's Postgres database, or a new SQLite file."""
    with tempfile.TemporaryDirectory(prefix="lw-storage-") as tmp:
        urls = {"postgres": bench.database_url, "sqlite": f"sqlite:///{Path(tmp) / 's.sqlite3'}"}
        return [measure(bench, Backend(name, urls[name]), steps) for name in backends]


if __name__ == "__main__":
    main()
