"""A worker: claims and advances runs that need it, until told to stop.

Runs that need a worker are those whose lease is free or expired and that are neither finished
nor waiting for a person: runs submitted but never started, runs whose process died mid-flight,
and parked reconciliations whose next attempt is due. Several workers may share one database:
the lease decides who advances a run, and fencing refuses whatever a stalled worker writes late.
A run whose attempt fails with an error is retried with a growing backoff, and the worker goes
on with the other runs: one poisoned run never takes the workers down. A fault of the database
itself (`DATABASE_FAULTS`) is nobody's run's: `work` lets it out, and `Worker` opens a new
session (new connections) after a pause and goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

from loopwright.attempt import OWNERSHIP_LOST
from loopwright.checkpoints.database import DATABASE_FAULTS, DatabaseUnavailable
from loopwright.checkpoints.leases import LeaseHeld, RunRecord
from loopwright.core.bounded import stop_all
from loopwright.core.state import ENDED_PHASES
from loopwright.outcome import RunOutcome
from loopwright.readiness import agent_answers, connections_answer, database_answers, failing
from loopwright.runner import Runner, UnknownRun

# Called after each attempt: (run id, the outcome, or the error that ended the attempt).
WorkListener = Callable[[str, RunOutcome | Exception], None]
# Called when the worker runs out of due runs: what it then waits for (`waiting_for`).
IdleListener = Callable[[str], None]
# Called when a session is lost to a database fault: its first line, and the pause before the
# worker opens a new one.
FaultListener = Callable[[str, float], None]
# A database that went away: the worker opens a new session after 1, 2, 4, ... up to 30 s.
RECONNECT_FIRST_S = 1.0
RECONNECT_MAX_S = 30.0


def worker_down(database_url: str, runner: Runner | None) -> dict[str, str]:
    """What a worker cannot reach now, each with why (empty: it is ready): its database (a new
    connection, and the one it keeps) and the agent's own dependencies. A worker without a
    session (reconnecting to its database) is not ready either."""
    checks = {"database": database_answers(database_url)}
    if runner is not None:
        checks["database connection"] = connections_answer(runner.databases)
        checks["agent"] = agent_answers(runner.agent, runner.deps)
    down = failing(checks)
    if runner is None:
        down["worker"] = "no session: reconnecting to the database"
    return down


def waiting_for(runs: list[RunRecord]) -> str:
    """What a worker with nothing due waits for, in one line: the agent's unfinished runs held
    by other owners (until when), parked until a time, or waiting for a person."""
    open_runs = [r for r in runs if r.phase not in ENDED_PHASES]
    leased = [(r.lease_expires_at, r) for r in open_runs if r.lease_live]
    parked = [(r.next_attempt_at, r) for r in open_runs if not r.lease_live and r.next_attempt_at]
    people = sum(1 for r in open_runs if r.phase == "WAITING_APPROVAL" and not r.lease_live)
    parts, more = [], 0
    for what, held in (("leased by {owner} until", leased), ("parked until", parked)):
        held.sort(key=lambda pair: pair[0] or datetime.max)
        parts += [f"run {r.run_id} {what.format(owner=r.owner)} {_clock(at)}" for at, r in held[:3]]
        more += len(held[3:])
    if people:
        parts.append(f"{people} waiting for a person")
    if more:
        parts.append(f"{more} more")
    return "nothing due; waiting for: " + ", ".join(parts) if parts else "nothing due: no run open"


def _clock(at: datetime | None) -> str:
    return at.strftime("%H:%M:%S UTC") if at else "?"


def work(
    runner: Runner,
    *,
    stop: threading.Event,
    poll_s: float = 0.5,
    on_attempt: WorkListener | None = None,
    on_idle: IdleListener | None = None,
) -> int:
    """Advance due runs until `stop` is set. Returns how many attempts were made. `on_idle` is
    told what the worker waits for each time it runs out of due runs (once, not every poll)."""
    attempts = 0
    idle = False
    while not stop.is_set():
        due = runner.leases.due(agent=runner.agent.name)
        if not due:
            if not idle and on_idle is not None:
                mine = [r for r in runner.leases.unended() if r.agent in (runner.agent.name, "")]
                on_idle(waiting_for(mine))
            idle = True
            stop.wait(poll_s)
            continue
        idle = False
        for run in due:
            if stop.is_set():
                break
            attempts += 1
            try:
                outcome: RunOutcome | Exception = runner.resume(run.run_id)
            except (LeaseHeld, UnknownRun):
                continue  # another worker got there first, or its creator has not written it yet
            except OWNERSHIP_LOST as exc:
                outcome = exc  # taken over while we worked: the new owner carries on
            except DATABASE_FAULTS:
                raise  # the worker's connections are suspect: its caller reconnects
            except Exception as exc:
                # This run's own failure, noted on it with a backoff (see Runner): the worker
                # goes on with the others rather than die and leave them all.
                outcome = exc
            if on_attempt is not None:
                on_attempt(run.run_id, outcome)
            # The rest of the list is as old as this attempt: other workers have taken or
            # finished its runs meanwhile, and resuming one of those reads its whole state
            # for nothing. Read the due runs again.
            break
    return attempts


class Worker:
    """`work` in sessions (a runner on the database, with the agent's dependencies open, from
    `connect`) until stopped: a database fault ends the session, not the worker, which opens a
    new one after a pause (`RECONNECT_FIRST_S`, doubled each time up to `RECONNECT_MAX_S`).

    A database never reached (`DatabaseUnavailable` before a first session) is a wrong URL or a
    database that is not there: raised. `runner` is the session's while there is one (what the
    worker's probes ask about)."""

    def __init__(
        self,
        connect: Callable[[], AbstractContextManager[Runner]],
        *,
        poll_s: float = 0.5,
        on_session: Callable[[Runner], None] | None = None,
        on_attempt: WorkListener | None = None,
        on_idle: IdleListener | None = None,
        on_fault: FaultListener | None = None,
    ) -> None:
        self.connect = connect
        self.poll_s = poll_s
        self.on_session = on_session
        self.on_attempt = on_attempt
        self.on_idle = on_idle
        self.on_fault = on_fault
        self.stopping = threading.Event()
        self.runner: Runner | None = None

    def run(self) -> None:
        reconnect_s = RECONNECT_FIRST_S
        connected = False
        while not self.stopping.is_set():
            try:
                with self.connect() as runner:
                    runner.lease_wait_s = 0  # a run held by another worker is theirs: skip it
                    connected, reconnect_s = True, RECONNECT_FIRST_S
                    self.runner = runner
                    if self.on_session is not None:
                        self.on_session(runner)
                    try:
                        work(
                            runner,
                            stop=self.stopping,
                            poll_s=self.poll_s,
                            on_attempt=self.on_attempt,
                            on_idle=self.on_idle,
                        )
                    finally:
                        self.runner = None
            except DATABASE_FAULTS as exc:
                if not connected and isinstance(exc, DatabaseUnavailable):
                    raise  # never reached: a wrong URL or a database that is not there
                # Reached, then lost (while starting up, too): the database is there. The
                # connections are suspect: open new ones (after a pause) rather than exit.
                if self.on_fault is not None:
                    self.on_fault(_first_line(exc), reconnect_s)
                self.stopping.wait(reconnect_s)
                reconnect_s = min(2 * reconnect_s, RECONNECT_MAX_S)

    def stop(self) -> None:
        """No run started after this; a model request in flight ends now (the attempt unwinds
        and gives its lease up), rather than at its timeout."""
        self.stopping.set()
        stop_all()

    def down(self, database_url: str) -> dict[str, str]:
        """What the worker cannot reach now (`worker_down`)."""
        return worker_down(database_url, self.runner)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
