"""Recovery latency after kill -9: from the dead process's lease expiry to the resumed run's first
committed step, and the resume work alone.

    python -m benchmarks.recovery bench [--kills 3] [--db SERVER_URL]

A worker process (`loopwright.worker.work`, polling every 50 ms) is started first and left idle,
so its imports are not measured. Then, for each kill, a victim process starts a long reading run
with LOOPWRIGHT_LEASE_TTL_S=2 and is SIGKILLed once the run has committed a few dozen steps. The
worker claims the run as soon as the lease has expired and resumes it. Measured, from the
database: the lease's expiry (lw_runs, database clock), the worker's claim (it reports the time),
and the first checkpoint committed after the kill (its `ts`). Goal: recovery (kill to first
resumed step) <= lease TTL + 1 s.

`python -m benchmarks.recovery victim|worker ...` are the two child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import IO, Any

import psycopg

from benchmarks.perf_setup import (
    PRINCIPAL,
    TASK,
    Bench,
    bench_environment,
    open_reading_runner,
)
from loopwright.checkpoints.frames import stored_at
from loopwright.checkpoints.leases import Lease, LeaseStore, open_lease_store
from loopwright.runner import LEASE_TTL_ENV, Runner
from loopwright.worker import work
from loopwright_refunds.experiments.progress import Progress
from loopwright_refunds.services.endpoints import ServiceEndpoints

TTL_S = 2.0
STEPS = 2000  # far more than a victim lives through
KILL_AFTER_CHECKPOINTS = 60
POLL_S = 0.05
GOAL_S = TTL_S + 1.0
REPO = Path(__file__).resolve().parent.parent
LOG = Path(tempfile.gettempdir()) / "loopwright-recovery-bench.log"  # the children's stderr
CHECKPOINTS = "SELECT count(*) FROM lw_checkpoints WHERE thread_id = %s"
BODIES = "SELECT body FROM lw_checkpoints WHERE thread_id = %s"
LEASE = "SELECT lease_expires_at FROM lw_runs WHERE run_id = %s"
FINISHED = (
    "SELECT 1 FROM lw_runs WHERE run_id = %s AND owner IS NULL"
    " AND phase IN ('COMPLETED', 'INCOMPLETE')"
)


def _runner_session(
    database_url: str, endpoints: ServiceEndpoints
) -> AbstractContextManager[Runner]:
    return open_reading_runner(database_url, endpoints, STEPS)


def victim(database_url: str, run_id: str) -> None:
    """Start the long run; the parent kills this process somewhere in the middle of it."""
    endpoints = ServiceEndpoints.from_env()
    assert endpoints is not None
    with _runner_session(database_url, endpoints) as runner:
        runner.start(TASK, PRINCIPAL, run_id=run_id)


def worker(database_url: str) -> None:
    """Advance due runs; report each claim's time on stdout (one JSON line)."""
    endpoints = ServiceEndpoints.from_env()
    assert endpoints is not None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with _runner_session(database_url, endpoints) as runner:
        claim = runner.leases.claim

        def reporting_claim(run_id: str, *args: Any, **kwargs: Any) -> Lease:
            lease = claim(run_id, *args, **kwargs)
            print(json.dumps({"run_id": run_id, "claimed": time.time()}), flush=True)
            return lease

        runner.leases.claim = reporting_claim  # type: ignore[method-assign]
        print("ready", flush=True)
        work(runner, stop=stop, poll_s=POLL_S)


def _child(kind: str, args: list[str], bench: Bench) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        **bench.endpoints.to_env(),
        LEASE_TTL_ENV: str(TTL_S),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.recovery", kind, bench.database_url, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=LOG.open("a"),
        text=True,
    )


def _line(stream: IO[str]) -> str:
    line = stream.readline()
    if not line:
        raise RuntimeError(f"a benchmark child exited early; see {LOG}")
    return line.strip()


@dataclass(frozen=True)
class Recovery:
    kill_to_expiry_s: float
    expiry_to_first_step_s: float
    claim_to_first_step_s: float

    @property
    def kill_to_first_step_s(self) -> float:
        return self.kill_to_expiry_s + self.expiry_to_first_step_s


def _wait(predicate: Callable[[], bool | int], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark waited too long")
        time.sleep(0.01)


def one_kill(
    bench: Bench,
    conn: psycopg.Connection[tuple[Any, ...]],
    leases: LeaseStore,
    idle: subprocess.Popen[str],
) -> Recovery:
    """Start a victim, kill it mid-run, and time the worker's takeover.

    The worker is paused (SIGSTOP) while the victim starts. `Runner.start` registers a run
    unowned before it claims it and writes its first checkpoint; a worker polling in that window
    finds the run due, resumes it, and `loopwright.worker.work` dies on the UnknownRun it gets
    (a runtime problem, reported with this benchmark).
    """
    run_id = f"recovery-{time.time_ns()}"
    idle.send_signal(signal.SIGSTOP)
    process = _child("victim", [run_id], bench)

    def committed() -> int:
        row = conn.execute(CHECKPOINTS, (run_id,)).fetchone()
        return int(row[0]) if row else 0

    try:
        _wait(lambda: committed() >= KILL_AFTER_CHECKPOINTS)
    finally:
        idle.send_signal(signal.SIGCONT)
    process.send_signal(signal.SIGKILL)
    killed = datetime.now(UTC)
    process.wait()
    # Read before the worker's claim moves it: nobody renews a dead process's lease.
    row = conn.execute(LEASE, (run_id,)).fetchone()
    assert row is not None and isinstance(row[0], datetime)
    expiry = row[0]
    assert idle.stdout is not None
    claim = json.loads(_line(idle.stdout))
    assert claim["run_id"] == run_id, claim
    first: list[datetime] = []

    def resumed() -> bool:
        after = [
            t for (body,) in conn.execute(BODIES, (run_id,)) if (t := stored_at(body)) > killed
        ]
        if after:
            first.append(min(after))
        return bool(first)

    _wait(resumed)
    # Free the worker for the next kill: the run stops at its next step.
    leases.request_cancel(run_id)
    _wait(lambda: conn.execute(FINISHED, (run_id,)).fetchone() is not None)
    return Recovery(
        kill_to_expiry_s=(expiry - killed).total_seconds(),
        expiry_to_first_step_s=(first[0] - expiry).total_seconds(),
        claim_to_first_step_s=first[0].timestamp() - claim["claimed"],
    )


def measure(bench: Bench, kills: int) -> list[Recovery]:
    found = []
    with (
        psycopg.connect(bench.database_url, autocommit=True) as conn,
        open_lease_store(bench.database_url) as leases,
    ):
        conn.execute("SET TIME ZONE 'UTC'")
        idle = _child("worker", [], bench)
        try:
            assert idle.stdout is not None
            assert _line(idle.stdout) == "ready"
            with Progress("kills", kills) as progress:
                for _ in range(kills):
                    found.append(one_kill(bench, conn, leases, idle))
                    progress.advance(f"last recovery {found[-1].kill_to_first_step_s:.2f} s")
        finally:
            idle.send_signal(signal.SIGTERM)
            try:
                idle.wait(timeout=15)
            except subprocess.TimeoutExpired:
                idle.kill()
                idle.wait()
    return found


def report(recoveries: list[Recovery]) -> list[str]:
    def stats(values: list[float]) -> str:
        return f"median {median(values):.2f} s, max {max(values):.2f} s"

    total = [r.kill_to_first_step_s for r in recoveries]
    met = max(total) <= GOAL_S
    return [
        f"recovery after kill -9 ({len(recoveries)} kills, lease ttl {TTL_S:g} s, worker polling "
        f"every {POLL_S:g} s):",
        f"  kill to first resumed step: {stats(total)} (goal <= ttl + 1 s = {GOAL_S:g} s) "
        f"{'met' if met else 'MISSED'}",
        f"  of which kill to lease expiry: {stats([r.kill_to_expiry_s for r in recoveries])}",
        f"  lease expiry to first resumed step: "
        f"{stats([r.expiry_to_first_step_s for r in recoveries])}",
        f"  resume work alone (claim to first committed step): "
        f"{stats([r.claim_to_first_step_s for r in recoveries])}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    bench_args = sub.add_parser("bench")
    bench_args.add_argument("--kills", type=int, default=3)
    bench_args.add_argument("--db", help="Postgres server URL (a fresh database is made, dropped)")
    victim_args = sub.add_parser("victim")
    victim_args.add_argument("database_url")
    victim_args.add_argument("run_id")
    worker_args = sub.add_parser("worker")
    worker_args.add_argument("database_url")
    args = parser.parse_args(argv)
    if args.command == "victim":
        victim(args.database_url, args.run_id)
    elif args.command == "worker":
        worker(args.database_url)
    else:
        with bench_environment(getattr(args, "db", None)) as bench:
            recoveries = measure(bench, getattr(args, "kills", 3))
        print("\n".join(report(recoveries)))


if __name__ == "__main__":
    main()
