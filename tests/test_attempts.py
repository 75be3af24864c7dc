"""One attempt protocol (`loopwright.attempt`) for every process that advances a run: each
attempt holds its own lease and fence, so one process advances several runs at once, and a
takeover of one refuses that one's late writes while the others go on."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel

from loopwright import Agent, Decision, Principal, ScriptedChatModel, ToolContext
from loopwright.attempt import OWNERSHIP_LOST
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner, open_runner
from tests.runtime_fixtures import PATIENCE_S, wait_for

TASK = "Go through the gate."


class Gates:
    """Each run's tool call waits at its run's gate until the test opens it."""

    def __init__(self) -> None:
        self.arrived: dict[str, threading.Event] = {}
        self.open: dict[str, threading.Event] = {}

    def of(self, run_id: str) -> tuple[threading.Event, threading.Event]:
        return (
            self.arrived.setdefault(run_id, threading.Event()),
            self.open.setdefault(run_id, threading.Event()),
        )


GATES = Gates()


def through_the_gate(messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]) -> Decision:
    if any(isinstance(m, ToolMessage) for m in messages):
        return Decision(content="Through.")
    return Decision(tool_calls=[("pass_gate", {})])


gated: Agent[None] = Agent(
    "gated",
    instructions="Go through the gate.",
    model=lambda: ScriptedChatModel(policy=through_the_gate),
)


class NoArgs(BaseModel):
    pass


class Passed(BaseModel):
    run_id: str


@gated.read()
def pass_gate(ctx: ToolContext[None], args: NoArgs) -> Passed:
    """Wait at this run's gate until it opens."""
    arrived, opened = GATES.of(ctx.run_id)
    arrived.set()
    opened.wait(PATIENCE_S)
    return Passed(run_id=ctx.run_id)


@pytest.fixture
def runner(database_url: str) -> Iterator[Runner]:
    with open_runner(database_url, gated, deps=None) as opened:
        yield opened


def start(runner: Runner, pool: ThreadPoolExecutor, run_id: str) -> Future[RunOutcome]:
    ada = Principal(user_id="u-1")
    started = pool.submit(runner.start, TASK, ada, run_id=run_id)
    arrived, _ = GATES.of(run_id)
    wait_for(lambda: arrived.is_set() or started.done())
    return started


def test_one_runner_advances_two_runs_at_once_each_under_its_own_lease(runner: Runner) -> None:
    """Both runs in flight at once in one process, each committing under its own fence: both
    end completed, each at fence 1 (a fence kept on the shared saver had the second run's
    attempt fence the first run's commits)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = (start(runner, pool, run_id) for run_id in ("run-gate-a", "run-gate-b"))
        for run_id in ("run-gate-a", "run-gate-b"):
            GATES.of(run_id)[1].set()
        outcomes = [first.result(PATIENCE_S), second.result(PATIENCE_S)]
    assert [(o.run_id, o.phase) for o in outcomes] == [
        ("run-gate-a", "COMPLETED"),
        ("run-gate-b", "COMPLETED"),
    ]
    records = [runner.leases.get(run_id) for run_id in ("run-gate-a", "run-gate-b")]
    assert [(r.fence, r.owner) for r in records if r is not None] == [(1, None), (1, None)]


def test_a_takeover_of_one_run_refuses_its_late_writes_and_not_the_others(
    runner: Runner,
) -> None:
    """While both runs wait in their tools, run A is taken over by another process (its lease
    lapsed, another owner claimed it: fence 2): A's attempt ends refused as it commits, and B,
    advanced by the same process at the same time, completes."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        taken = start(runner, pool, "run-take-a")
        other = start(runner, pool, "run-take-b")
        runner.leases.db.write(
            "UPDATE lw_runs SET lease_expires_at = {after_seconds} WHERE run_id = %s",
            (-1, "run-take-a"),
        )
        thief = runner.leases.claim("run-take-a", "another-process", 30)
        assert thief.fence == 2
        for run_id in ("run-take-a", "run-take-b"):
            GATES.of(run_id)[1].set()
        with pytest.raises(OWNERSHIP_LOST):
            taken.result(PATIENCE_S)
        completed = other.result(PATIENCE_S)
    assert completed.phase == "COMPLETED"
    record = runner.leases.get("run-take-a")
    assert record is not None and (record.owner, record.fence) == ("another-process", 2)
    # The lapse counts once, as the takeover found it; the refused attempt adds nothing.
    assert record.failures == 1 and "(fence 1) ended before it recorded" in str(record.last_error)
