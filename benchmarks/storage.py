"""Checkpoint storage per step, up to 500 steps with ~1 KB observations, against the bare agent.

    python -m benchmarks.storage [--steps 500] [--backend postgres sqlite] [--db SERVER_URL]

Runs the reading task for N tool steps on loopwright (the fenced saver, durability "sync") and
on the bare prebuilt agent (the stock saver, durability "sync"), on Postgres and on SQLite (the
embedded default), and reads the bytes each thread holds in LangGraph's tables (Postgres:
checkpoints, blobs, writes, logical sizes before Postgres's own compression; SQLite: its
checkpoints, which hold every channel's value but the delta channels', and writes) after every
step. loopwright's history and evidence are delta
channels, so a step should add about the same bytes at step 500 as at step 1; the bare agent
stores its whole message list again at every step. Goals: bytes/step over the last 100 steps
within 1.2x of the first 100 (linear); loopwright's total at N steps <= 0.1x the bare agent's;
bytes per tool step <= 4x the observation's (the read's answer as the model sees it). The
script prints loopwright's bytes per tool step by table and channel.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

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
from benchmarks.step_time import Backend
from loopwright.checkpoints.database import sqlite_path
from loopwright.graph.state import REDUCED_CHANNELS

WINDOW = 100
LINEAR_GOAL = 1.2
BARE_GOAL = 0.1
PAYLOAD_GOAL = 4.0
BARE_SAMPLE_EVERY = 10  # the bare agent's size is read every 10 steps (its reads are slow)

BY_CHANNEL = """
SELECT 'blob ' || channel AS part, sum(octet_length(blob)) AS bytes
  FROM checkpoint_blobs WHERE thread_id = %(t)s GROUP BY channel
UNION ALL
SELECT 'write ' || channel, sum(octet_length(blob))
  FROM checkpoint_writes WHERE thread_id = %(t)s GROUP BY channel
UNION ALL
SELECT 'checkpoint rows', sum(octet_length(checkpoint::text) + octet_length(metadata::text))
  FROM checkpoints WHERE thread_id = %(t)s
ORDER BY bytes DESC
"""
# Whole rows, keys and row headers included, as Postgres stores them (pg_column_size: after its
# own compression of long values), beside the payload the figures above count. Postgres
# compresses a row's values only once the row passes about 2 KB (TOAST_TUPLE_THRESHOLD, whatever
# the table's toast_tuple_target): a checkpoint row under it is stored as it is, one over it
# often smaller than one under.
ROWS_BY_TABLE = """
SELECT 'checkpoints' AS tab, count(*), sum(pg_column_size(t.*))
  FROM checkpoints t WHERE thread_id = %(t)s
UNION ALL
SELECT 'checkpoint_blobs', count(*), sum(pg_column_size(t.*))
  FROM checkpoint_blobs t WHERE thread_id = %(t)s
UNION ALL
SELECT 'checkpoint_writes', count(*), sum(pg_column_size(t.*))
  FROM checkpoint_writes t WHERE thread_id = %(t)s
"""


SQLITE_BY_CHANNEL = """
SELECT 'write ' || channel AS part, sum(length(value)) AS bytes
  FROM writes WHERE thread_id = :t GROUP BY channel
UNION ALL
SELECT 'checkpoint rows', sum(length(checkpoint) + length(metadata))
  FROM checkpoints WHERE thread_id = :t
ORDER BY bytes DESC
"""
SQLITE_ROWS_BY_TABLE = """
SELECT 'checkpoints' AS tab, count(*), coalesce(sum(length(checkpoint) + length(metadata)), 0)
  FROM checkpoints WHERE thread_id = :t
UNION ALL
SELECT 'writes', count(*), coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = :t
"""


def loopwright_sizes(bench: Bench, backend: Backend, steps: int) -> tuple[list[int], str, int]:
    """Thread bytes after each model decision (index k: after k tool steps), the thread, and
    the median observation's bytes (a tool result as the model sees it)."""
    run_id = f"lw-storage-{time.time_ns()}"
    sizes: list[int] = []
    with open_reading_runner(backend.url, bench.endpoints, steps) as runner:

        def measure(node: str, _update: dict[str, Any]) -> None:
            if node == "model_step":
                sizes.append(backend.thread_bytes(run_id))

        outcome = runner.start(TASK, PRINCIPAL, run_id=run_id, on_step=measure)
        assert outcome.stop_reason == "completed", outcome.stop_detail
        observations = [
            len(str(m.content).encode())
            for m in runner.state(run_id)["history"]
            if isinstance(m, ToolMessage)
        ]
    return sizes, run_id, sorted(observations)[len(observations) // 2]


def bare_sizes(bench: Bench, backend: Backend, steps: int) -> list[tuple[int, int]]:
    """(tool steps done, thread bytes), every BARE_SAMPLE_EVERY steps and at the end."""
    thread = f"bare-storage-{time.time_ns()}"
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 10**6}
    sizes: list[tuple[int, int]] = []
    with backend.bare_saver() as saver, httpx.Client() as client:
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
    bare_total: int
    bare_series: list[tuple[int, int]]
    loopwright_series: list[int]
    breakdown: list[tuple[str, int]]
    rows: list[tuple[str, int, int]]  # table, rows, their bytes (pg_column_size)
    observation_bytes: int
    # Postgres: the run's bytes in layouts of loopwright's own, worked out from its rows.
    delta_versions_total: int | None = None
    without_replaced_writes_total: int | None = None

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


def measure(bench: Bench, backend: Backend, steps: int) -> StorageFigures:
    ours, run_id, observation_bytes = loopwright_sizes(bench, backend, steps)
    breakdown = [(str(p), int(b or 0)) for p, b in backend_rows(backend, BY_CHANNEL, run_id)]
    rows = [(str(t), int(n), int(b)) for t, n, b in backend_rows(backend, ROWS_BY_TABLE, run_id)]
    bare = bare_sizes(bench, backend, steps)
    window = min(WINDOW, steps // 2)
    return StorageFigures(
        backend=backend.name,
        steps=steps,
        first_per_step=(ours[window] - ours[0]) / window,
        last_per_step=(ours[steps] - ours[steps - window]) / window,
        loopwright_total=ours[-1],
        bare_total=bare[-1][1],
        bare_series=bare,
        loopwright_series=ours,
        breakdown=breakdown,
        rows=rows,
        observation_bytes=observation_bytes,
        **({} if backend.is_sqlite else layouts_of_our_own(backend.url, run_id)),
    )


# The writes of channels whose value the next checkpoint holds (blobs or inline): all but the
# delta channels' (their values are their writes) and LangGraph's own (routes, interrupts).
REPLACED_WRITE_BYTES = """
SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s
   AND channel <> ALL(%(delta)s) AND channel NOT LIKE 'branch:%%' AND channel NOT LIKE '\\_\\_%%'
"""


def layouts_of_our_own(url: str, thread: str) -> dict[str, int]:
    """The thread's bytes (as `thread_bytes` counts them) if each checkpoint kept only the channel
    versions and versions seen that changed since its parent (reconstructed on read), and then
    also without the writes of replaced channels: what a layout that stock readers cannot read
    would save, for the decision to write one."""
    with psycopg.connect(url, autocommit=True) as conn:
        saved = conn.execute(
            "SELECT checkpoint, octet_length(checkpoint::text) + octet_length(metadata::text)"
            " FROM checkpoints WHERE thread_id = %(t)s ORDER BY checkpoint_id",
            {"t": thread},
        ).fetchall()
        replaced = conn.execute(
            REPLACED_WRITE_BYTES, {"t": thread, "delta": sorted(REDUCED_CHANNELS)}
        ).fetchone()
        total = thread_bytes(conn, thread)
    assert replaced is not None
    spared, parent = 0, None
    for checkpoint, _size in saved:
        if parent is not None:
            for part in ("channel_versions", "versions_seen"):
                same = {k: v for k, v in checkpoint[part].items() if parent[part].get(k) == v}
                # Each unchanged entry, its key, value and separators, as the JSON text spells it.
                spared += sum(len(json.dumps({k: v})) - 1 for k, v in same.items())
        parent = checkpoint
    delta = total - spared
    return {
        "delta_versions_total": delta,
        "without_replaced_writes_total": delta - int(replaced[0]),
    }


def backend_rows(backend: Backend, postgres_query: str, thread: str) -> list[tuple[Any, ...]]:
    """`postgres_query` on the bench's Postgres database, or its SQLite counterpart on the file."""
    if backend.is_sqlite:
        sqlite_query = {BY_CHANNEL: SQLITE_BY_CHANNEL, ROWS_BY_TABLE: SQLITE_ROWS_BY_TABLE}
        with closing(sqlite3.connect(sqlite_path(backend.url))) as conn:
            return list(conn.execute(sqlite_query[postgres_query], {"t": thread}))
    with psycopg.connect(backend.url, autocommit=True) as conn:
        return list(conn.execute(postgres_query, {"t": thread}))


def report(figures: StorageFigures) -> list[str]:
    window = min(WINDOW, figures.steps // 2)
    linear_ok = figures.linearity <= LINEAR_GOAL
    bare_ok = figures.to_bare <= BARE_GOAL
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
    ]
    payload_ok = figures.to_payload <= PAYLOAD_GOAL
    lines += [
        f"bytes per tool step (last {window} steps) / the observation's "
        f"{figures.observation_bytes:,} B: {figures.to_payload:.1f}x (goal <= {PAYLOAD_GOAL}x) "
        f"{'met' if payload_ok else 'MISSED'}",
        f"loopwright's bytes per tool step by table and channel (totals over {figures.steps} "
        "steps / steps):",
    ]
    lines += [f"  {b / figures.steps:9,.0f} B  {part}" for part, b in figures.breakdown[:12] if b]
    if figures.delta_versions_total is not None and figures.without_replaced_writes_total:
        per_step = figures.observation_bytes * figures.steps
        lines.append(
            "in a layout of loopwright's own (stock readers could not read it), the whole run's"
            " bytes per tool step / the observation: only changed channel versions and versions seen"
            f" {figures.delta_versions_total / per_step:.1f}x, and no writes of replaced channels"
            f" {figures.without_replaced_writes_total / per_step:.1f}x"
        )
    lines.append(
        "rows per tool step and their bytes"
        + (
            " (SQLite: payload)"
            if figures.backend == "sqlite"
            else ", keys and headers included (pg_column_size)"
        )
        + ":"
    )
    lines += [
        f"  {n / figures.steps:5.1f} rows {b / figures.steps:9,.0f} B  {table}"
        for table, n, b in figures.rows
    ]
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
