"""An attempt reports where it left the run as its checkpoints hold it.

The runner reads an attempt's outcome (state, pending interrupts) off LangGraph's stream rather
than from the checkpoints; `Runner.outcome` reads it from the checkpoints. The two must agree
wherever an attempt can stop: waiting for an approval (in the loop and in a specialist subgraph),
a parked reconciliation, a completed run, with and without a step listener.
"""

from __future__ import annotations

from typing import Any

from loopwright.outcome import RunOutcome
from loopwright.runner import Runner
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, decide, principal
from tests.test_handoff import AGENTS, triage


def as_checkpoints_hold(runner: Runner, outcome: RunOutcome) -> RunOutcome:
    assert outcome == runner.outcome(outcome.run_id)
    return outcome


def listener(steps: list[str]) -> Any:
    return lambda node, _update: steps.append(node)


def test_approval_wait_and_completion(open_test_runner: RunnerFactory) -> None:
    with open_test_runner() as runner:
        waiting = as_checkpoints_hold(runner, runner.start(DEMO_TASK, principal()))
        assert waiting.phase == "WAITING_APPROVAL" and len(waiting.interrupts) == 1
        # The run began when it was registered, by the database's clock.
        record = runner.leases.get(waiting.run_id)
        assert record is not None
        assert runner.state(waiting.run_id)["started_at"] == record.created_at.isoformat()
        # An answer waited for is not given: the attempt runs nothing and reports the same.
        assert as_checkpoints_hold(runner, runner.resume(waiting.run_id)) == waiting
        done = as_checkpoints_hold(runner, approve(runner, waiting))
        assert done.phase == "COMPLETED" and done.interrupts == []


def test_with_a_step_listener(open_test_runner: RunnerFactory) -> None:
    steps: list[str] = []
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal(), on_step=listener(steps))
        assert as_checkpoints_hold(runner, waiting).phase == "WAITING_APPROVAL"
        decision = decide(waiting, "approve", "a-1")
        done = runner.resume(waiting.run_id, decision, on_step=listener(steps))
        assert as_checkpoints_hold(runner, done).phase == "COMPLETED"
    assert steps[:2] == ["compile_context", "model_step"] and steps[-1] == "verify"


def test_an_approval_inside_a_specialist(open_test_runner: RunnerFactory) -> None:
    with open_test_runner(model=ScriptedChatModel(policy=triage), agents=AGENTS) as runner:
        waiting = as_checkpoints_hold(runner, runner.start(DEMO_TASK, principal()))
        assert waiting.phase == "WAITING_APPROVAL"
        assert as_checkpoints_hold(runner, approve(runner, waiting)).phase == "COMPLETED"


def test_a_parked_reconciliation(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "processing", delay_s=30)
    with open_test_runner() as runner:
        parked = as_checkpoints_hold(runner, approve(runner, runner.start(DEMO_TASK, principal())))
    assert parked.phase == "RECONCILING" and parked.next_attempt_at is not None
