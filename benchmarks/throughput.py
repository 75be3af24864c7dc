"""Throughput of `loopwright worker` processes on one Postgres: 1, 2 and 4 workers, and where it
stops growing, and why.

    python -m benchmarks.throughput [--runs 150] [--workers 1 2 4] [--db SERVER_URL]

For each worker count, on one database and with runs of its own: submit N runs
(`Runner.submit`) of an eligible small refund, each on its own order created with
`services.admin.create_order` (20.00, under the approval threshold, so no run waits for a
person), held back from the workers (their `next_attempt_at` a day ahead); start the workers
and wait until they poll; release every run at once (one UPDATE) and wait until all are
COMPLETED. Every order must end with exactly one refund. The queue of due runs is full from the
release on, so what is timed is the workers' throughput, not a submitter's: the rate is taken
over the steady part, from the 10th to the 90th percentile of the runs' completion times
(lw_runs.updated_at, the database's clock), with the rate of each quarter of it as the spread.

Over that window `benchmarks.worker_time` samples, from outside the workers, every 20 ms:

- each worker's time: on a CPU, waiting for a CPU (runnable: /proc/PID/schedstat), blocked on
  Postgres, blocked on the reference services (HTTP), or idle (sleeping between polls);
- its Postgres backends (pg_stat_activity): executing, waiting on a row lock (another worker's
  claim or commit on lw_runs), waiting on the WAL (a commit's flush), idle in a transaction;
- CPU per second of the machine, of the database's Postgres backends, of the workers, of the
  services and of this process (the sampler among it), the rest as other processes', and the
  time some task waited for a CPU (/proc/pressure/cpu).

Next to runs/s: node commits/s (checkpoints written meanwhile) against the ceiling, raw
single-row INSERT + COMMITs of a node commit's bytes from as many connections as there are
workers, for a few seconds. The report then says where throughput stops growing (the first
doubling of workers that gains less than `SCALES`) and what the workers wait on there: the
machine's CPU, Postgres (row locks, the WAL's flush, its execution; against the commit
ceiling), the reference services, or the claim path (idle while runs are due); and what the
database would carry with the CPU to itself (its CPU per run).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from benchmarks.perf_setup import Bench, bench_environment
from benchmarks.worker_time import Sampler, Window
from loopwright.checkpoints.frames import stored_at
from loopwright.runner import open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.scratch import with_application_name
from loopwright_refunds.services.admin import create_order, list_refunds

TASK = "Check whether order {order_id} can be refunded and refund it if so."
AMOUNT = "20.00"
REPO = Path(__file__).resolve().parent.parent
READY = "polling every"
# The agent the workers host (named, so that no $LOOPWRIGHT_AGENT or pyproject setting applies).
AGENT = "loopwright_refunds.agent:agent"
WORKER_COUNTS = (1, 2, 4)
RUNS = 150  # ~10 s a worker count on 2 cores
POLL_S = 0.1
RAW_SECONDS = 3.0
STEADY = 0.1  # the share of completions left out at each end: ramp-up and drain
QUARTERS = 4
SCALES = 1.25  # a doubling of workers that gains less than this has hit a limit
CPU_LIMIT_SHARE = 0.85  # the machine's CPU counts as used up from this share on
COMMIT_LIMIT_SHARE = 0.8  # the database's commit rate counts as used up from this share on
CORES = os.cpu_count() or 1
APP = "lw-throughput-w"  # the workers' application_name prefix: worker n's backends are APP + n
# Postgres backends serving this database, other than the one asking.
BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()"
)
# Node commits so far, and the bytes of all of them (as benchmarks.perf_setup counts a thread's).
COMMITS = """
SELECT (SELECT count(*) FROM lw_checkpoints) AS commits,
  (SELECT coalesce(sum(octet_length(body)), 0) FROM lw_checkpoints)
+ (SELECT coalesce(sum(octet_length(blob)), 0) FROM lw_checkpoint_writes) AS bytes
"""
# A worker's log line for each attempt that returned an outcome (see `loopwright worker`).
ATTEMPT = re.compile(r"^run-\S+: ", re.MULTILINE)


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


def _start_worker(bench: Bench, n: int, home: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **bench.endpoints.to_env(),
        # Named, so that the sampler can tell this worker's backends apart.
        "DATABASE_URL": with_application_name(bench.database_url, f"{APP}{n}"),
        "LOOPWRIGHT_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "loopwright", "worker", "--agent", AGENT, "--poll", str(POLL_S)],
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
    steady_runs: int
    seconds: float  # the steady window
    quarter_rates: tuple[float, ...]
    duplicates: int
    claims_per_run: float
    attempts_per_run: float
    commits: int  # node commits in the steady window
    commit_bytes: int
    raw_commits_per_s: float
    time: Window

    @property
    def runs_per_s(self) -> float:
        return self.steady_runs / self.seconds

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.seconds

    def cpu(self, group: str) -> float:
        """`group`'s CPU as a share of the machine's over the steady window."""
        return self.time.cpu_per_s.get(group, 0.0) / CORES

    @property
    def others(self) -> float:
        ours = sum(self.cpu(g) for g in ("postgres", "workers", "services", "benchmark"))
        return max(0.0, self.cpu("machine") - ours)

    def per_run_ms(self, group: str) -> float:
        return 1000 * self.time.cpu_per_s.get(group, 0.0) / self.runs_per_s

    @property
    def waits(self) -> dict[str, float]:
        """Shares of a worker's time, by what it is doing (they add up to 1)."""
        share = self.time.worker
        runnable = share["cpu"]
        return {
            "on a CPU": runnable * (1 - self.time.runqueue_share),
            "waiting for a CPU": runnable * self.time.runqueue_share,
            "on Postgres": share["database"],
            "on the services": share["services"],
            "idle": share["idle"],
        }


def _completions(url: str, run_ids: list[str]) -> list[float]:
    """When each run was last written (its completion, for a COMPLETED run), sorted."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM updated_at) FROM lw_runs WHERE run_id = ANY(%s)",
            (run_ids,),
        ).fetchall()
    return sorted(float(row[0]) for row in rows)


def _completed(url: str, run_ids: list[str]) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM lw_runs WHERE run_id = ANY(%s) AND phase = 'COMPLETED'",
            (run_ids,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _hold(url: str, run_ids: list[str], held: bool) -> None:
    """Keep the runs from the workers (due a day from now), or let them all go at once."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE lw_runs SET next_attempt_at = CASE WHEN %s THEN now() + interval '1 day' END"
            " WHERE run_id = ANY(%s)",
            (held, run_ids),
        )


def _commits_between(url: str, run_ids: list[str], start: float, end: float) -> int:
    with psycopg.connect(url) as conn:
        bodies = conn.execute(
            "SELECT body FROM lw_checkpoints WHERE thread_id = ANY(%s)", (run_ids,)
        ).fetchall()
    return sum(start <= stored_at(body).timestamp() <= end for (body,) in bodies)


def submitted(bench: Bench, orders: list[str]) -> tuple[list[str], float]:
    """A run of the task on each order submitted as `Runner.submit` submits one (the
    user's principal, the task's boundary checked with the orders service, the run
    registered), and the submitting thread's CPU seconds per run for it."""
    with (
        connect(bench.endpoints) as deps,
        open_runner(bench.database_url, refunds, deps=deps) as runner,
    ):
        tasks = [TASK.format(order_id=order_id) for order_id in orders]
        started = time.thread_time()
        run_ids = [runner.submit(task, runner.principal_for("u-1", task)) for task in tasks]
        used = time.thread_time() - started
    return run_ids, used / len(run_ids)


def measure_workers(bench: Bench, workers: int, runs: int, first_order: int) -> Throughput:
    orders = [f"O-{first_order + i}" for i in range(runs)]
    for order_id in orders:
        create_order(bench.endpoints, order_id, "u-1", AMOUNT)
    url = bench.database_url
    run_ids, _ = submitted(bench, orders)
    _hold(url, run_ids, held=True)
    with tempfile.TemporaryDirectory(prefix="lw-throughput-") as tmp:
        logs = [Path(tmp) / f"worker-{n}.log" for n in range(workers)]
        processes = [_start_worker(bench, n, Path(tmp), log) for n, log in enumerate(logs)]
        try:
            deadline = time.monotonic() + 60
            while not all(READY in log.read_text() for log in logs):
                if time.monotonic() > deadline:
                    raise TimeoutError("the workers did not start")
                time.sleep(0.05)
            backends = backend_pids(url)
            worker_pids = [p.pid for p in processes]
            services = sorted(descendants(os.getpid()) - set(worker_pids))
            groups = {
                "postgres": lambda: backends,
                "workers": lambda: worker_pids,
                "services": lambda: services,
                "benchmark": lambda: [os.getpid()],
            }
            ports = {urlsplit(u).port or 80 for u in bench.endpoints.model_dump().values()}
            database_port = urlsplit(url).port or 5432
            sampler = Sampler(url, worker_pids, APP, database_port, ports, groups)
            with sampler as samples:
                _hold(url, run_ids, held=False)
                while (done := _completed(url, run_ids)) < runs:
                    if time.monotonic() > deadline + 600:
                        raise TimeoutError(f"{runs - done} runs did not finish")
                    time.sleep(0.2)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)
        attempts = sum(len(ATTEMPT.findall(log.read_text())) for log in logs)
    duplicates = sum(max(0, len(list_refunds(bench.endpoints, o)) - 1) for o in orders)
    with psycopg.connect(url) as conn:
        # Every acquisition of a run bumps its fence: more than one a run is a worker claiming
        # a run another already finished or holds.
        row = conn.execute(
            "SELECT avg(fence) FROM lw_runs WHERE run_id = ANY(%s)", (run_ids,)
        ).fetchone()
    assert row is not None
    ends = _completions(url, run_ids)
    skip = int(STEADY * len(ends))
    steady = ends[skip : len(ends) - skip]
    start, end = steady[0], steady[-1]
    quarter = max(1, (len(steady) - 1) // QUARTERS)
    quarter_rates = tuple(
        quarter / (steady[i + quarter] - steady[i])
        for i in range(0, len(steady) - quarter, quarter)
        if steady[i + quarter] > steady[i]
    )
    commits, total_bytes = commits_and_bytes(url)
    return Throughput(
        workers=workers,
        runs=runs,
        steady_runs=len(steady) - 1,
        seconds=end - start,
        quarter_rates=quarter_rates,
        duplicates=duplicates,
        claims_per_run=float(row[0]),
        attempts_per_run=attempts / runs,
        commits=_commits_between(url, run_ids, start, end),
        commit_bytes=total_bytes // max(1, commits),
        raw_commits_per_s=raw_commit_rate(url, workers, total_bytes // max(1, commits)),
        time=samples.window(start, end),
    )


def measure(
    bench: Bench, runs: int, worker_counts: Sequence[int] = WORKER_COUNTS
) -> list[Throughput]:
    # Each count on runs of its own; the first worker count also warms up the services.
    return [measure_workers(bench, n, runs, 200_000 + 10_000 * n) for n in worker_counts]


def _shares(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{what} {100 * share:.0f}%" for what, share in shares.items())


def describe(t: Throughput) -> list[str]:
    spread = f"{min(t.quarter_rates):.1f}-{max(t.quarter_rates):.1f}" if t.quarter_rates else "?"
    backend = t.time.backend
    return [
        f"throughput, {t.workers} worker{'s' if t.workers > 1 else ''}: {t.runs} runs; steady "
        f"{t.steady_runs} in {t.seconds:.1f} s = {t.runs_per_s:.2f} runs/s (quarters {spread}), "
        f"{t.commits_per_s:.0f} node commits/s ({t.duplicates} duplicate refunds; "
        f"{t.claims_per_run:.2f} lease acquisitions and {t.attempts_per_run:.2f} attempts a run)",
        f"  ceiling: raw INSERT + COMMIT of {t.commit_bytes} bytes from {t.workers} "
        f"connection{'s' if t.workers > 1 else ''}: {t.raw_commits_per_s:.0f}/s; node commits "
        f"use {100 * t.commits_per_s / t.raw_commits_per_s:.0f}% of it",
        f"  CPU of the {CORES}-core machine: {100 * t.cpu('machine'):.0f}% busy: Postgres "
        f"backends {100 * t.cpu('postgres'):.0f}%, workers {100 * t.cpu('workers'):.0f}%, "
        f"services {100 * t.cpu('services'):.0f}%, this benchmark {100 * t.cpu('benchmark'):.0f}%"
        f", other processes {100 * t.others:.0f}%; some task waited for a CPU "
        f"{100 * t.time.cpu_per_s.get('pressure', 0.0):.0f}% of the time",
        f"  per run: worker CPU {t.per_run_ms('workers'):.1f} ms, Postgres "
        f"{t.per_run_ms('postgres'):.1f} ms, services {t.per_run_ms('services'):.1f} ms; "
        f"{t.commits_per_s / t.runs_per_s:.0f} node commits",
        f"  a worker's time ({t.time.samples} samples): {_shares(t.waits)}; its backends: "
        f"{_shares({k: backend[k] for k in ('executing', 'lock', 'wal')})} (WAL: a commit's "
        f"flush), idle in a transaction {100 * backend['idle in transaction']:.0f}%",
    ]


def saturation(found: list[Throughput]) -> Throughput | None:
    """The first count at which more workers gained less than SCALES a doubling of them."""
    for fewer, more in itertools.pairwise(found):
        doublings = math.log2(more.workers / fewer.workers)
        if more.runs_per_s < fewer.runs_per_s * SCALES**doublings:
            return more
    return None


def why(t: Throughput) -> str:
    """What the workers at `t` wait on most, with the figures that show it."""
    waits = t.waits
    busy = t.cpu("machine")
    pressure = t.time.cpu_per_s.get("pressure", 0.0)
    ceiling = t.commits_per_s / t.raw_commits_per_s
    postgres_runs_per_s = 1000 * CORES / t.per_run_ms("postgres") if t.per_run_ms("postgres") else 0
    database = (
        f"the database alone: {t.per_run_ms('postgres'):.1f} ms of Postgres CPU a run, i.e. "
        f"~{postgres_runs_per_s:.0f} runs/s on {CORES} cores to itself; node commits at "
        f"{100 * ceiling:.0f}% of the raw commit ceiling"
    )
    worst = max(
        ("waiting for a CPU", "on Postgres", "on the services", "idle"), key=lambda k: waits[k]
    )
    if busy >= CPU_LIMIT_SHARE or worst == "waiting for a CPU":
        return (
            f"the machine's {CORES} cores: {100 * busy:.0f}% busy ({100 * t.others:.0f}% other "
            f"processes'), a task waiting for a CPU {100 * pressure:.0f}% of the time; a worker "
            f"is on a CPU {100 * waits['on a CPU']:.0f}% and waits for one "
            f"{100 * waits['waiting for a CPU']:.0f}% of its time ({database})"
        )
    if worst == "on Postgres":
        backend = t.time.backend
        cause = max(("lock", "wal", "executing"), key=lambda k: backend[k])
        what = {
            "lock": "row locks (workers' claims and commits on lw_runs)",
            "wal": "the WAL's flush at each commit",
            "executing": "Postgres executing statements",
        }[cause]
        if ceiling >= COMMIT_LIMIT_SHARE:
            what = "the database's commit rate (near the raw ceiling)"
        return (
            f"{what}: a worker waits on Postgres {100 * waits['on Postgres']:.0f}% of its time "
            f"(its backends: executing {100 * backend['executing']:.0f}%, on a row lock "
            f"{100 * backend['lock']:.0f}%, on the WAL {100 * backend['wal']:.0f}%); {database}"
        )
    if worst == "on the services":
        return (
            f"the reference services: a worker waits on them {100 * waits['on the services']:.0f}%"
            f" of its time; their one process uses {100 * t.cpu('services') * CORES:.0f}% of a "
            f"core ({database})"
        )
    return (
        f"the claim path: a worker is idle {100 * waits['idle']:.0f}% of its time while runs are "
        f"due (polls every {POLL_S:g} s; {t.attempts_per_run:.2f} attempts a run) ({database})"
    )


def report(found: list[Throughput]) -> list[str]:
    lines = [line for t in found for line in describe(t)]
    for fewer, more in itertools.pairwise(found):
        lines.append(
            f"  {more.workers} workers / {fewer.workers}: "
            f"{more.runs_per_s / fewer.runs_per_s:.2f}x runs/s"
        )
    if found:
        limit = saturation(found)
        if limit is None:
            last = found[-1]
            lines.append(
                f"  still growing at {last.workers} worker{'s' if last.workers > 1 else ''}; "
                f"there, the workers wait most on: {why(last)}"
            )
        else:
            lines.append(
                f"  saturates at {limit.workers} worker{'s' if limit.workers > 1 else ''}: "
                f"{why(limit)}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKER_COUNTS))
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        found = measure(bench, args.runs, args.workers)
    print("\n".join(report(found)))


if __name__ == "__main__":
    main()
