"""One intent, at most one effect: unknown outcomes are reconciled by asking the business system."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path
from typing import Any

from loopwright.core.state import ActionStatus, digest
from loopwright.outcome import RunOutcome
from loopwright.runner import LEASE_TTL_ENV, Runner
from loopwright.tools.contract import ToolContext
from loopwright_refunds.services.admin import list_refunds, set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.card_payments import PAY_WITH_CARD, TASK, PayArgs, card_runner
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    RunnerFactory,
    approve,
    principal,
    start_cli,
)


def start_and_approve(runner: Runner) -> RunOutcome:
    return approve(runner, runner.start(DEMO_TASK, principal()))


def statuses(runner: Runner, action_id: str) -> list[str]:
    return [event.to_status for event in runner.journal.events(action_id)]


def test_accept_then_timeout_is_unknown_then_reconciled_not_resent(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    # The payments service applies the refund, then answers after the client gave up (3 s).
    set_fault(services, "accept_then_timeout", delay_s=6)
    with open_test_runner() as runner:
        outcome = start_and_approve(runner)
        [action] = outcome.actions
        history = statuses(runner, action.action_id)
    assert outcome.stop_reason == "completed"
    assert history[-4:] == ["DISPATCHED", "UNKNOWN", "RECONCILING", "SUCCEEDED"]
    assert action.attempts == 1  # reconciled by asking, never sent again
    [refund] = list_refunds(services, "O-42")
    assert refund["idempotency_key"] == action.intent_key


def test_fail_before_commit_is_reconciled_as_absent_then_resent_under_the_same_key(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "fail_before_commit")
    with open_test_runner() as runner:
        outcome = start_and_approve(runner)
        [action] = outcome.actions
        history = statuses(runner, action.action_id)
    assert outcome.stop_reason == "completed"
    assert history[-5:] == ["DISPATCHED", "UNKNOWN", "RECONCILING", "DISPATCHED", "SUCCEEDED"]
    assert action.attempts == 2
    [refund] = list_refunds(services, "O-42")
    assert refund["idempotency_key"] == action.intent_key


def test_downstream_that_cannot_be_asked_escalates_to_needs_human(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "accept_then_timeout", delay_s=6, no_query=True)
    with open_test_runner() as runner:
        outcome = start_and_approve(runner)
    [action] = outcome.actions
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "needs_human")
    assert action.status is ActionStatus.ESCALATED
    assert action.attempts == 1
    # Not "proven absent": the operator is told nobody could tell whether it applied.
    assert outcome.stop_detail.startswith(
        f"{action.action_id} could not tell whether it applied: a person looks ("
    ), outcome.stop_detail
    assert len(list_refunds(services, "O-42")) == 1  # it did happen; nobody pretends otherwise


def test_still_processing_parks_the_run_and_a_worker_finishes_it(
    database_url: str, open_test_runner: RunnerFactory, services: ServiceEndpoints, tmp_path: Path
) -> None:
    # Processing for 6 s: the run parks, and the check below reads it still processing, well
    # before it settles even on a loaded machine.
    set_fault(services, "processing", delay_s=6)
    with open_test_runner() as runner:
        outcome = start_and_approve(runner)
        run_id = outcome.run_id
    assert outcome.phase == "RECONCILING"
    assert outcome.next_attempt_at is not None
    assert list_refunds(services, "O-42")[0]["status"] == "processing"

    # This process has let go of the run. A worker process picks it up once its wait is due.
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home"), LEASE_TTL_ENV: "2"}
    worker = start_cli(
        *("worker", "--db", database_url, "--poll", "0.2"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with open_test_runner() as runner:
            deadline = time.monotonic() + PATIENCE_S
            while runner.outcome(run_id).phase != "COMPLETED" and time.monotonic() < deadline:
                time.sleep(0.3)
            final = runner.outcome(run_id)
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=PATIENCE_S)
    assert final.stop_reason == "completed", output
    assert [a.status for a in final.actions] == [ActionStatus.SUCCEEDED]
    [refund] = list_refunds(services, "O-42")
    assert refund["status"] == "succeeded"


def _charge_with_nul(_ctx: ToolContext[None], args: PayArgs, key: str | None) -> dict[str, Any]:
    return {
        "payment_id": f"pay_{digest(key)[:8]}\x00",
        "card_number": args.card_number,
        "status": "ok",
    }


def test_a_business_answer_with_a_nul_character_is_recorded_as_it_came(database_url: str) -> None:
    """The write happened: its answer must be journaled whatever it holds, never lost to a
    storage error that would leave the action DISPATCHED and the run unable to go on."""
    tool = dataclasses.replace(PAY_WITH_CARD, run=_charge_with_nul)
    with card_runner(database_url, tool) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
        [action] = outcome.actions
        reread = runner.journal.get(action.action_id)
    assert outcome.stop_reason == "completed"
    assert action.status is ActionStatus.SUCCEEDED and action.attempts == 1
    assert reread is not None and reread.outcome is not None
    assert reread.outcome["payment_id"].endswith("\x00")
