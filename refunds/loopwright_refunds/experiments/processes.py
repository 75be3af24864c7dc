"""Trials whose processes die: crash points armed in child processes, and SIGKILL.

Children are forked from a forkserver that has imported every system once, so a child starts in
milliseconds rather than the seconds a fresh interpreter spends importing LangGraph; the crash
is still a real process exit (`os._exit(137)` at the armed point, or SIGKILL from here), with
nothing flushed and no lease released. Each child writes its output to the trial's log.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path

from loopwright.graph.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.graph.crashpoints import EXIT_CODE as CRASHED
from loopwright_refunds.experiments.model import experiment_model
from loopwright_refunds.experiments.systems import Deployment, Job, make_system

# A trial gives up after this many processes: a recovery that keeps dying is a finding, not a loop.
MAX_PROCESSES = 5
CHILD_TIMEOUT_S = 180.0

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(
    [
        "loopwright_refunds.experiments.model",
        "loopwright_refunds.experiments.systems.loopwright",
        "loopwright_refunds.experiments.systems.prebuilt",
        "loopwright_refunds.experiments.systems.plain_loop",
    ]
)


class ChildFailed(RuntimeError):
    """A child process ended in an error of its own, not in the crash it was armed for."""


def _child(
    system: str, deployment: Deployment, job: Job, recover: bool, crash_at: str | None, log: Path
) -> None:
    with log.open("ab") as out:
        os.dup2(out.fileno(), sys.stdout.fileno())
        os.dup2(out.fileno(), sys.stderr.fileno())
    if crash_at is not None:
        os.environ[CRASH_ENV] = crash_at
    else:
        os.environ.pop(CRASH_ENV, None)
    target = make_system(system, deployment)
    model = experiment_model(job.ledger)
    (target.recover if recover else target.deliver)(job, model)


def _start(
    system: str, deployment: Deployment, job: Job, log: Path, *, recover: bool, crash_at: str | None
) -> BaseProcess:
    process = _context.Process(
        target=_child, args=(system, deployment, job, recover, crash_at, log), daemon=True
    )
    process.start()
    return process


def _finish(process: BaseProcess, log: Path) -> int:
    process.join(CHILD_TIMEOUT_S)
    if process.is_alive():
        process.kill()
        process.join()
        raise ChildFailed(f"a child did not finish in {CHILD_TIMEOUT_S:g} s; see {log}")
    assert process.exitcode is not None
    return process.exitcode


def crash_then_recover(
    system: str, deployment: Deployment, job: Job, points: tuple[str, ...], log: Path
) -> int:
    """Deliver the job with the first point armed; recover, arming the next, until done.

    Returns how many processes died at their crash point.
    """
    remaining = list(points)
    crashes = 0
    for _ in range(MAX_PROCESSES):
        armed = remaining[0] if remaining else None
        process = _start(system, deployment, job, log, recover=crashes > 0, crash_at=armed)
        code = _finish(process, log)
        if code == CRASHED and armed is not None:
            crashes += 1
            remaining.pop(0)
            continue
        if code != 0:
            raise ChildFailed(f"a child exited with {code}; see {log}")
        return crashes
    raise ChildFailed(f"the job was not done after {MAX_PROCESSES} processes; see {log}")


def kill_then_recover(
    system: str, deployment: Deployment, job: Job, kill_after_s: float, log: Path
) -> bool:
    """Deliver the job, SIGKILL the process after `kill_after_s` if it is still working, and
    recover in a new one. Returns whether the kill landed mid-run."""
    process = _start(system, deployment, job, log, recover=False, crash_at=None)
    process.join(kill_after_s)
    if not process.is_alive():
        if process.exitcode != 0:
            raise ChildFailed(f"a child exited with {process.exitcode}; see {log}")
        return False
    process.kill()
    process.join()
    code = _finish(_start(system, deployment, job, log, recover=True, crash_at=None), log)
    if code != 0:
        raise ChildFailed(f"the recovering child exited with {code}; see {log}")
    return True
