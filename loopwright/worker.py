"""A worker: claims and advances runs that need it, until told to stop.

Runs that need a worker are those whose lease is free or expired and that are neither finished
nor waiting for a person: runs submitted but never started, runs whose process died mid-flight,
and parked reconciliations whose next attempt is due. Several workers may share one database:
the lease decides who advances a run, and fencing refuses whatever a stalled worker writes late.
A run whose attempt fails with an error is retried with a growing backoff, and the worker goes
on with the other runs: one poisoned run never takes the workers down. A fault of the database
itself (`DATABASE_FAULTS`) is nobody's run's: `work` lets it out, and `loopwright worker`
reconnects and goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from loopwright.checkpoints.database import DATABASE_FAULTS
from loopwright.checkpoints.leases import LeaseHeld
from loopwright.runner import OWNERSHIP_LOST, Runner, RunOutcome, UnknownRun

# Called after each attempt: (run id, the outcome, or the error that ended the attempt).
WorkListener = Callable[[str, RunOutcome | Exception], None]


def work(
    runner: Runner,
    *,
    stop: threading.Event,
    poll_s: float = 0.5,
    on_attempt: WorkListener | None = None,
) -> int:
    """Advance due runs until `stop` is set. Returns how many attempts were made."""
    attempts = 0
    while not stop.is_set():
        due = runner.leases.due(agent=runner.agent.name)
        if not due:
            stop.wait(poll_s)
            continue
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
    return attempts
