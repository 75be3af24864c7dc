"""Throughput of `loopwright worker` processes on one Postgres: 1 worker, then 2.

    python -m benchmarks.throughput [--runs 30] [--db SERVER_URL]

For each worker count, on one database and with runs of its own: start the workers and wait until they poll, then
submit N runs (`Runner.submit`) of an eligible small refund, each on its own order created with
`services.admin.create_order` (20.00, under the approval threshold, so no run waits for a
person), and time from the first submission to the last run COMPLETED. Every order must end
with exactly one refund. The machine has two cores, shared by the workers, Postgres, the
reference services and this script.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds


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
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=30)
    duplicates = sum(max(0, len(list_refunds(bench.endpoints, o)) - 1) for o in orders)
    return Throughput(workers, runs, elapsed, duplicates)


def measure(bench: Bench, runs: int) -> list[Throughput]:
    # Each count on runs of its own; the first worker count also warms up the services.
    return [measure_workers(bench, n, runs, 200_000 + 10_000 * n) for n in (1, 2)]


def report(found: list[Throughput]) -> list[str]:
    lines = [
        f"throughput, {t.workers} worker{'s' if t.workers > 1 else ''}: {t.runs} runs in "
        f"{t.seconds:.1f} s = {t.runs_per_s:.2f} runs/s ({t.duplicates} duplicate refunds)"
        for t in found
    ]
    if len(found) == 2:
        lines.append(f"  2 workers / 1 worker: {found[1].runs_per_s / found[0].runs_per_s:.2f}x")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--db", help="Postgres server URL (a fresh database is made and dropped)")
    args = parser.parse_args(argv)
    with bench_environment(args.db) as bench:
        found = measure(bench, args.runs)
    print("\n".join(report(found)))


if __name__ == "__main__":
    main()
