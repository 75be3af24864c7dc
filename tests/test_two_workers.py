"""Two workers, one run: the lease keeps one writer, fencing refuses the stalled one's late writes."""

from __future__ import annotations

import os
import signal
import subprocess
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

from loopwright.checkpoints.leases import LeaseHeld
from loopwright.core import tls
from loopwright.core.state import ActionStatus
from loopwright.runner import LEASE_TTL_ENV
from loopwright_refunds.services.admin import list_refunds, set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    RunnerFactory,
    cli,
    start_cli,
    wait_for,
)


def fault_mode(services: ServiceEndpoints) -> str:
    """The payments fault still armed: "none" once a refund request has taken it."""
    mode: str = httpx.get(f"{services.payments}/admin/faults", verify=tls.context()).json()["mode"]
    return mode


@pytest.mark.slow
def test_stalled_worker_is_taken_over_and_its_late_writes_are_refused(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    # Leases of 3 s, renewed every second: A's stays live while the test checks it is held
    # (a 1 s lease is lost to a loaded machine's scheduling), and B waits at most 4 s for it.
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home"), LEASE_TTL_ENV: "3"}
    started = cli(
        "run", DEMO_TASK, "--user", "u-1", "--db", database_url, "--run-id", "run-2w", env=env
    )
    assert "WAITING_APPROVAL" in started.stdout, started.stdout + started.stderr
    approval_id = cli("approvals", "list", "--db", database_url, env=env).stdout.split()[0]

    # Worker A approves and advances the run; the refund request is slow to answer.
    set_fault(services, "latency", delay_s=4)
    worker_a = start_cli(
        *("approvals", "approve", approval_id, "--as", "a-1", "--db", database_url),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with open_test_runner() as runner:
            # Payments took the fault: A's refund request is there, A waits for its answer.
            wait_for(lambda: fault_mode(services) == "none")
            os.kill(worker_a.pid, signal.SIGSTOP)  # A stalls mid-write: its lease is not renewed
            [action] = runner.journal.for_run("run-2w")
            assert action.status is ActionStatus.DISPATCHED
            # While A's lease is live, nobody else may advance the run.
            with pytest.raises(LeaseHeld):
                runner.resume("run-2w")
            fence_a = runner.leases.get("run-2w").fence  # type: ignore[union-attr]

        # Worker B takes over once A's lease has expired, and finishes the run.
        taken_over = cli("resume", "run-2w", "--db", database_url, env=env)
        assert "COMPLETED" in taken_over.stdout, taken_over.stdout + taken_over.stderr
    finally:
        os.kill(worker_a.pid, signal.SIGCONT)
        out_a, err_a = worker_a.communicate(timeout=PATIENCE_S)

    # A woke up with its answer in hand; every durable write it tried was refused.
    assert worker_a.returncode == 2, out_a + err_a
    assert "stale" in err_a.lower(), err_a
    with open_test_runner() as runner:
        [action] = runner.journal.for_run("run-2w")
        events = runner.journal.events(action.action_id)
        history = list(reversed(list(runner.graph.get_state_history(runner.config("run-2w")))))
        outcome = runner.outcome("run-2w")
    assert outcome.stop_reason == "completed"
    assert action.status is ActionStatus.SUCCEEDED
    assert all(e.fence > fence_a for e in events if e.to_status == "SUCCEEDED")
    for parent, child in pairwise(history):  # one chain: no fork
        assert child.parent_config is not None
        assert (
            child.parent_config["configurable"]["checkpoint_id"]
            == parent.config["configurable"]["checkpoint_id"]
        )
    assert len(list_refunds(services, "O-42")) == 1
