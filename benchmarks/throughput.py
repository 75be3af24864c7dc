"""Throughput of `loopwright worker` processes on one Postgres: 1, 2 and 4 workers.

    python -m benchmarks.throughput [--runs 30] [--workers 1 2 4] [--db SERVER_URL]

For each worker count, on one database and with runs of its own: start the workers and wait
until they poll, then submit N runs (`Runner.submit`) of an eligible small refund, each on its
own order created with `services.admin.create_order` (20.00, under the approval threshold, so
no run waits for a person), and time from the first submission to the last run COMPLETED. Every
order must end with exactly one refund.

Next to runs/s: node commits/s (checkpoints written meanwhile), the CPU share of the machine
taken by the database's Postgres backends, by the workers and by this process (the reference
services and the submitter), and the ceiling: raw single-row INSERT + COMMITs of a node
commit's bytes, from as many connections as there are workers, for a few seconds. The report
says where throughput stops growing and why: the machine's CPU, the database's commit rate, or
neither (then the workers wait on something else they share).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from benchmarks.perf_setup import Bench, bench_environment
from loopwright.graph.state import Principal
from loopwright.runner import open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect, task_scope
from loopwright_refunds.services.admin import create_order, list_refunds

TASK = "Check whether order {order_id} can be refunded and refund it if so."
AMOUNT = "20.00"
REPO = Path(__file__).resolve().parent.parent
READY = "polling every"
# The agent the workers host (named, so that no $LOOPWRIGHT_AGENT or pyproject setting applies).
AGENT = "loopwright_refunds.agent:agent"
WORKER_COUNTS = (1, 2, 4)
RAW_SECONDS = 3.0
CPU_LIMIT_SHARE = 0.85  # the machine's CPU counts as used up from this share on
COMMIT_LIMIT_SHARE = 0.8  # the database's commit rate counts as used up from this share on
CORES = os.cpu_count() or 1
# Postgres backends serving this database, other than the one asking.
BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()"
)
# Node commits so far, and the bytes of all of them (as benchmarks.perf_setup counts a thread's).
COMMITS = """
SELECT (SELECT count(*) FROM checkpoints) AS commits,
  (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
     FROM checkpoints)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes) AS bytes
"""


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU time of these processes so far (a process gone counts nothing)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / ticks


def descendants(root: int) -> set[int]:
    """Every process under `root` (children, theirs, ...), as /proc shows them now."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def commits_and_bytes(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(COMMITS).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def backend_pids(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [int(row[0]) for row in conn.execute(BACKENDS)]


def raw_commit_rate(url: str, connections: int, payload_bytes: int) -> float:
    """Single-row INSERT + COMMITs per second of `payload_bytes`, from `connections` at once."""
    payload = (bytes(range(256)) * (payload_bytes // 256 + 1))[:payload_bytes]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, payload bytea)")
    counts = [0] * connections
    start = threading.Barrier(connections)

    def commit(n: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            start.wait()
            deadline = time.monotonic() + RAW_SECONDS
            while time.monotonic() < deadline:
                with conn.transaction():
                    conn.execute("INSERT INTO bench_raw (payload) VALUES (%s)", (payload,))
                counts[n] += 1

    threads = [threading.Thread(target=commit, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_raw")
    return sum(counts) / RAW_SECONDS


def _start_worker(bench: Bench, home: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **bench.endpoints.to_env(),
        "DATABASE_URL": bench.database_url,
        "LOOPWRIGHT_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "loopwright", "worker", "--agent", AGENT, "--poll", "0.1"],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@dataclass(frozen=True)
class Throughput:
    workers: int
    runs: int
    seconds: float
    duplicates: int
    claims_per_run: float
    commits: int
    commit_bytes: int
    raw_commits_per_s: float
    postgres_cpu_s: float
    workers_cpu_s: float
    own_cpu_s: float

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.seconds

    def share(self, cpu_s: float) -> float:
        """`cpu_s` as a share of the machine's CPU over the measurement."""
        return cpu_s / (self.seconds * CORES)

    @property
    def cpu_share(self) -> float:
        return self.share(self.postgres_cpu_s + self.workers_cpu_s + self.own_cpu_s)

    @property
    def limit(self) -> str:
        if self.cpu_share >= CPU_LIMIT_SHARE:
            return (
                f"the machine's CPU: {100 * self.cpu_share:.0f}% of {CORES} cores in use "
                f"(Postgres {100 * self.share(self.postgres_cpu_s):.0f}%, workers "
                f"{100 * self.share(self.workers_cpu_s):.0f}%, services and submitter "
                f"{100 * self.share(self.own_cpu_s):.0f}%)"
            )
        if self.commits_per_s >= COMMIT_LIMIT_SHARE * self.raw_commits_per_s:
            return "the database's commit rate: node commits near the raw ceiling"
        return (
            f"neither the CPU ({100 * self.cpu_share:.0f}% in use) nor the database's commit rate "
            f"({100 * self.commits_per_s / self.raw_commits_per_s:.0f}% of the ceiling): the "
            "workers wait on something they share (the reference services, the queue of due "
            "runs), which this benchmark does not measure"
        )


def measure_workers(bench: Bench, workers: int, runs: int, first_order: int) -> Throughput:
    orders = [f"O-{first_order + i}" for i in range(runs)]
    for order_id in orders:
        create_order(bench.endpoints, order_id, "u-1", AMOUNT)
    with tempfile.TemporaryDirectory(prefix="lw-throughput-") as tmp:
        logs = [Path(tmp) / f"worker-{n}.log" for n in range(workers)]
        processes = [_start_worker(bench, Path(tmp), log) for log in logs]
        try:
            deadline = time.monotonic() + 60
            while not all(READY in log.read_text() for log in logs):
                if time.monotonic() > deadline:
                    raise TimeoutError("the workers did not start")
                time.sleep(0.05)
            with (
                connect(bench.endpoints) as deps,
                open_runner(bench.database_url, refunds, deps=deps) as runner,
            ):
                backends = backend_pids(bench.database_url)
                worker_pids = [p.pid for p in processes]
                worker_pids += [d for p in processes for d in descendants(p.pid)]
                # The reference services and anything else this script started.
                helper_pids = sorted(descendants(os.getpid()) - set(worker_pids))
                commits_before, bytes_before = commits_and_bytes(bench.database_url)
                cpu_before = (
                    cpu_seconds(backends),
                    cpu_seconds(worker_pids),
                    cpu_seconds(helper_pids) + time.process_time(),
                )
                started = time.monotonic()
                submitted = []
                for order_id in orders:
                    task = TASK.format(order_id=order_id)
                    principal = Principal(user_id="u-1", scope=task_scope(task))
                    submitted.append(runner.submit(task, principal))
                waiting = set(submitted)
                while waiting:
                    if time.monotonic() > deadline + 600:
                        raise TimeoutError(f"{len(waiting)} runs did not finish")
                    time.sleep(0.1)
                    waiting -= {r.run_id for r in runner.leases.runs() if r.phase == "COMPLETED"}
                elapsed = time.monotonic() - started
                cpu_after = (
                    cpu_seconds(backends),
                    cpu_seconds(worker_pids),
                    cpu_seconds(helper_pids) + time.process_time(),
                )
                commits_after, bytes_after = commits_and_bytes(bench.database_url)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)
    duplicates = sum(max(0, len(list_refunds(bench.endpoints, o)) - 1) for o in orders)
    with psycopg.connect(bench.database_url) as conn:
        # Every acquisition of a run bumps its fence: more than one a run is a worker claiming
        # a run another already finished or holds.
        row = conn.execute(
            "SELECT avg(fence) FROM lw_runs WHERE run_id = ANY(%s)",
            (list(submitted),),
        ).fetchone()
    assert row is not None
    commits = commits_after - commits_before
    commit_bytes = (bytes_after - bytes_before) // max(1, commits)
    return Throughput(
        workers=workers,
        runs=runs,
        seconds=elapsed,
        duplicates=duplicates,
        claims_per_run=float(row[0]),
        commits=commits,
        commit_bytes=commit_bytes,
        raw_commits_per_s=raw_commit_rate(bench.database_url, workers, commit_bytes),
        postgres_cpu_s=cpu_after[0] - cpu_before[0],
        workers_cpu_s=cpu_after[1] - cpu_before[1],
        own_cpu_s=cpu_after[2] - cpu_before[2],
    )


def measure(
    bench: Bench, runs: int, worker_counts: Sequence[int] = WORKER_COUNTS
) -> list[Throughput]:
    # Each count on runs of its own; the first worker count also warms up the services.
    return [measure_workers(bench, n, runs, 200_000 + 10_000 * n) for n in worker_counts]


def report(found: list[Throughput]) -> list[str]:
    lines = []
    for t in found:
        lines += [
            f"throughput, {t.workers} worker{'s' if t.workers > 1 else ''}: {t.runs} runs in "
            f"{t.seconds:.1f} s = {t.runs_per_s:.2f} runs/s, {t.commits_per_s:.0f} node commits/s "
            f"({t.duplicates} duplicate refunds; {t.claims_per_run:.2f} lease acquisitions a run)",
            f"  ceiling: raw INSERT + COMMIT of {t.commit_bytes} bytes from {t.workers} "
            f"connection{'s' if t.workers > 1 else ''}: {t.raw_commits_per_s:.0f}/s; node commits "
            f"use {100 * t.commits_per_s / t.raw_commits_per_s:.0f}% of it",
            f"  CPU of the {CORES}-core machine: Postgres backends "
            f"{100 * t.share(t.postgres_cpu_s):.0f}%, workers {100 * t.share(t.workers_cpu_s):.0f}%,"
            f" services and submitter {100 * t.share(t.own_cpu_s):.0f}%; a worker is busy "
            f"{100 * t.workers_cpu_s / (t.seconds * t.workers):.0f}% of the time (one core each)",
        ]
    for fewer, more in itertools.pairwise(found):
        lines.append(
            f"  {more.workers} workers / {fewer.workers}: "
            f"{more.runs_per_s / fewer.runs_per_s:.2f}x runs/s"
        )
    if found:
        last = found[-1]
        lines.append(
            f"  the limit at {last.workers} worker{'s' if last.workers > 1 else ''}: {last.limit}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKER_COUNTS))
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        found = measure(bench, args.runs, args.workers)
    print("\n".join(report(found)))


if __name__ == "__main__":
    main()
