"""Crash matrix: the demo run killed at every named crash point, then resumed by a new process.

Each case ends COMPLETED and verified, with exactly one refund in the payments service's own
storage and as many model calls as an uncrashed run: no committed decision is asked for again
and no effect is repeated. A crash inside a node's commit leaves none of it in the database.
Every crash inside a write is taken on SQLite and on Postgres, each node start on one of them
(`backends`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.crashpoints import EXIT_CODE as CRASH_EXIT
from loopwright.core.crashpoints import POINTS, UNREACHED_EXIT_CODE, CrashPoint
from loopwright.reports import EXIT_CODES
from loopwright.runner import Runner
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.cli_forkserver import Finished
from tests.runtime_fixtures import (
    BACKENDS,
    DEMO_TASK,
    PATIENCE_S,
    REPO,
    UNCRASHED_MODEL_CALLS,
    RunnerFactory,
    cli,
    history_steps,
    on_backend,
    release_crashed,
)

# A crash point is met at most once per case; "then" points are armed after the first crash.
IN_RECONCILE = ("node:reconcile:start", "reconcile:after_settle")
CASES: dict[str, tuple[str, ...]] = {
    point: (point,) for point in POINTS if point not in IN_RECONCILE
}
# reconcile only runs when an outcome is unknown: crash after DISPATCHED, then inside reconcile.
for point in IN_RECONCILE:
    CASES[point] = ("executor:after_dispatch_record", point)

# The backends each case crashes on. A crash inside a write (a node's commit, writes saved
# alone, the journal's records around the tool call, reconcile's) meets each backend's own
# transactions: those cases run on SQLite and on Postgres. A node's start comes after the
# previous node's commit, which the commit cases crash inside on both; what a node-start case
# adds is the node boundary the run resumes from, the same on either backend: each of those
# runs on one backend, taking turns, so that each backend still resumes from node starts.
NODE_STARTS = [point for point in CASES if point.startswith("node:") and point not in IN_RECONCILE]


def backends(case: str) -> tuple[str, ...]:
    if case in NODE_STARTS:
        return (BACKENDS[NODE_STARTS.index(case) % len(BACKENDS)],)
    return BACKENDS


MATRIX = [on_backend(backend, case) for case in sorted(CASES) for backend in backends(case)]


def advance(run_id: str, db: str, env: dict[str, str]) -> Finished:
    """One process step, as an operator would take it: start, approve what waits, or resume."""
    listed = cli("approvals", "list", "--db", db, env=env)
    if run_id in listed.stdout:
        approval_id = next(line.split()[0] for line in listed.stdout.splitlines() if run_id in line)
        return cli("approvals", "approve", approval_id, "--as", "a-1", "--db", db, env=env)
    return cli("resume", run_id, "--db", db, env=env)


def crash_and_resume(
    first: Finished, armed: Sequence[str], run_id: str, db: str, env: dict[str, str]
) -> str:
    """Take a run on from its first process (`first`, armed at `armed[0]`) as an operator
    would (`advance`), each next process armed at the next point once the last was reached,
    until it ends COMPLETED; the last process's output. `""` arms nothing in its process (a
    point to reach in a later one). Every point armed must be reached, each exactly once."""
    points, result, crashes = list(armed), first, 0
    for _ in range(10):
        code, output = result.returncode, result.stdout + result.stderr
        if code == CRASH_EXIT:
            crashes += 1
            release_crashed(result, db, run_id)
        else:
            # Resumed to an approval, a parked reconciliation, or the end (reports.EXIT_CODES);
            # a process that stopped so before its armed point says so.
            expected = (0, EXIT_CODES["waiting"], EXIT_CODES["unfinished"])
            assert code in ((UNREACHED_EXIT_CODE,) if points[0] else expected), output
            if "COMPLETED" in output:
                break
        if code == CRASH_EXIT or not points[0]:
            points.pop(0)
        points = points or [""]
        result = advance(run_id, db, {**env, CRASH_ENV: points[0]})
    reached = [point for point in armed if point]
    assert crashes == len(reached), f"crash points {reached} not all reached: {output}"
    return output


def assert_no_part_committed(runner: Runner, run_id: str, node: str) -> None:
    """A node's commit interrupted by a crash left none of itself: the last checkpoint is the
    one the node ran from, with none of its writes."""
    config = runner.config(run_id)
    assert runner.graph.get_state(config).next == (node,)
    saved = runner.saver.get_tuple(config)
    assert saved is not None and saved.pending_writes == []


@pytest.mark.slow
@pytest.mark.parametrize(("case", "database_url"), MATRIX, indirect=["database_url"])
def test_crash_at_point_then_resume_completes_with_one_refund(
    case: str,
    database_url: str,
    services: ServiceEndpoints,
    tmp_path: Path,
    open_test_runner: RunnerFactory,
) -> None:
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    run_id = "run-crash"
    first = cli(
        "run", DEMO_TASK, "--user", "u-1", "--db", database_url, "--run-id", run_id,
        env={**env, CRASH_ENV: CASES[case][0]},
    )  # fmt: skip
    if case.startswith("checkpoint:commit:"):
        assert first.returncode == CRASH_EXIT, first.stdout + first.stderr
        with open_test_runner() as runner:
            assert_no_part_committed(runner, run_id, node=case.rpartition(":")[2])
    output = crash_and_resume(first, CASES[case], run_id, database_url, env)
    assert "COMPLETED" in output, output

    with open_test_runner() as runner:
        outcome = runner.outcome(run_id)
        state = runner.state(run_id)
        # The timeline's steps, read from the rows, are those the resumed history shows.
        assert runner.steps(run_id) == history_steps(runner, run_id)
    assert outcome.stop_reason == "completed"
    assert outcome.verification is not None and outcome.verification["verified"]
    assert len(list_refunds(services, "O-42")) == 1
    assert state["usage"]["model_requests"] == UNCRASHED_MODEL_CALLS
    [action] = outcome.actions
    assert action.status == "SUCCEEDED"


def _process_passing(points: str, armed: str) -> subprocess.CompletedProcess[str]:
    """A process that passes `points` (comma separated) with `armed` armed, then ends."""
    passes = "; ".join(f"crash_point({p!r})" for p in points.split(","))
    return subprocess.run(
        [sys.executable, "-c", f"from loopwright import crash_point; {passes}"],
        env={**os.environ, "PYTHONPATH": str(REPO), CRASH_ENV: armed},
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )


def test_a_crash_point_armed_and_never_reached_fails_the_process_with_the_nearest_name() -> None:
    """A misspelt point would leave a crash test passing without its crash: the process says
    so as it ends, with the nearest name it knows, and exits with a code that is no success."""
    missed = _process_passing("mytool:after_x", "executor:after_dispach_record,mytool:after_y")
    assert missed.returncode == UNREACHED_EXIT_CODE
    assert missed.stderr.splitlines() == [
        "loopwright: crash point executor:after_dispach_record was armed and never reached"
        " (did you mean executor:after_dispatch_record?)",
        "loopwright: crash point mytool:after_y was armed and never reached"
        " (did you mean mytool:after_x?)",
    ]
    reached = _process_passing("mytool:after_x", "mytool:after_x")
    assert reached.returncode == CRASH_EXIT
    assert reached.stderr == "loopwright: crash point mytool:after_x reached, exiting hard\n"
    unarmed = _process_passing("mytool:after_x", "")
    assert (unarmed.returncode, unarmed.stderr) == (0, "")


def test_a_crash_point_armed_at_its_kth_passage_exits_there_and_not_before() -> None:
    """`NAME#k` aims at the k-th write, not the first: passages before k go on, the k-th exits,
    and a process that passes fewer than k times fails."""
    point = CrashPoint.AFTER_SEND
    assert point.nth(2) == "executor:after_send#2"
    twice = f"{point},mytool:marker,{point}"
    second = _process_passing(twice + ",mytool:after_exit", point.nth(2))
    assert second.returncode == CRASH_EXIT
    assert second.stderr == f"loopwright: crash point {point} reached, exiting hard\n"
    third = _process_passing(twice, point.nth(3))
    assert third.returncode == UNREACHED_EXIT_CODE
    assert third.stderr == (
        f"loopwright: crash point {point}#3 was armed and never reached (passed 2 of 3 times)\n"
    )
    malformed = _process_passing(twice, f"{point}#0")
    assert malformed.returncode == UNREACHED_EXIT_CODE
    assert "crash point executor:after_send#0 was armed and never reached" in malformed.stderr
