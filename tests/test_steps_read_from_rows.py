"""A run's steps are read from its rows in one pass, and are those LangGraph's history shows.

`loopwright show`, the inbox's timeline and the step numbers of `resume` read a run's node
steps (`Runner.steps`). LangGraph's history rebuilds every checkpoint's values, the delta
channels' from the root, so reading it grows with the square of a run's length; the compact
rows hold each superstep's writes, and are read once, as are LangGraph's own tables (the
server's runs). Every kind of run (approved, rejected, cancelled through a state update,
stopped by a limit, failed or unknown writes, handed to a specialist, longer than a keyframe's
span; crash-resumed runs in the crash matrix) must give the same steps both ways, and a history
that is not one chain is read from LangGraph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from loopwright.checkpoints.compact import CompactSaver, Layout
from loopwright.checkpoints.factory import open_checkpointer
from loopwright.checkpoints.frames import KEY_EVERY
from loopwright.checkpoints.journal import open_journal
from loopwright.checkpoints.leases import open_lease_store
from loopwright.core.budget import Budget
from loopwright.core.state import StopReason
from loopwright.outcome import RunOutcome
from loopwright.runner import Runner
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.agent import connect
from loopwright_refunds.long_task import KeepsReading
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    RunnerFactory,
    decide,
    history_steps,
    principal,
    refund_agent,
)
from tests.test_handoff import AGENTS, triage

pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)

READS = "Read orders O-42, O-43 and O-44 in turn, again and again."


Live = list[str]  # the nodes of the steps a run reported as it went (`on_step`)


def into(live: Live) -> Callable[[str, dict[str, Any]], None]:
    """A step listener that notes each step's node in `live`."""
    return lambda node, _update: live.append(node)


def approved(runner: Runner, live: Live) -> RunOutcome:
    waiting = runner.start(DEMO_TASK, principal(), on_step=into(live))
    return runner.resume(waiting.run_id, decide(waiting), on_step=into(live))


def rejected(runner: Runner, live: Live) -> RunOutcome:
    waiting = runner.start(DEMO_TASK, principal(), on_step=into(live))
    return runner.resume(waiting.run_id, decide(waiting, "reject"), on_step=into(live))


def cancelled_while_waiting(runner: Runner, live: Live) -> RunOutcome:
    waiting = runner.start(DEMO_TASK, principal(), on_step=into(live))
    return runner.cancel(waiting.run_id, on_step=into(live))


def start_reads(runner: Runner, live: Live) -> RunOutcome:
    return runner.start(READS, principal(task=READS), on_step=into(live))


RUNS: dict[str, tuple[Callable[[Runner, Live], RunOutcome], dict[str, object]]] = {
    "approved": (approved, {}),
    "rejected": (rejected, {}),
    "cancelled": (cancelled_while_waiting, {}),
    "max-steps": (
        start_reads,
        {"model": ScriptedChatModel(policy=KeepsReading(reads=10)), "budget": Budget(max_steps=4)},
    ),
    # Past a keyframe: four checkpoints a tool step.
    "long": (start_reads, {"model": ScriptedChatModel(policy=KeepsReading(reads=KEY_EVERY // 2))}),
    "handoff": (approved, {"model": ScriptedChatModel(policy=triage), "agents": AGENTS}),
}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_steps_read_from_the_rows_are_the_historys(
    kind: str, open_test_runner: RunnerFactory
) -> None:
    drive, options = RUNS[kind]
    live: Live = []
    with open_test_runner(**options) as runner:
        outcome = drive(runner, live)
        assert isinstance(runner.saver, CompactSaver)
        assert runner.saver.supersteps(outcome.run_id) is not None  # the rows
        steps = runner.steps(outcome.run_id)
        assert steps == history_steps(runner, outcome.run_id)
    assert outcome.stop_reason is not None
    assert [node for node, _ in steps] == live  # as the run reported them as it went
    assert live.count("model_step") >= 2


@pytest.mark.parametrize("fault", ["fail_before_commit", "accept_then_timeout"])
def test_a_failed_or_unknown_writes_steps_are_the_historys(
    fault: str, open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A refund that fails, or times out after the payment service took it: reconciled."""
    set_fault(services, fault, delay_s=6)
    with open_test_runner() as runner:
        outcome = approved(runner, [])
        steps = runner.steps(outcome.run_id)
        assert steps == history_steps(runner, outcome.run_id)
    assert "reconcile" in [node for node, _ in steps]


def test_a_forked_history_is_read_from_langgraph(open_test_runner: RunnerFactory) -> None:
    """A state update on an earlier checkpoint forks the thread: its rows are no longer one
    chain, and the steps are LangGraph's (an update is no task's step: the steps stay)."""
    with open_test_runner() as runner:
        outcome = approved(runner, [])
        config = runner.config(outcome.run_id)
        before = runner.steps(outcome.run_id)
        earlier = list(runner.graph.get_state_history(config))[3].config
        runner.graph.update_state(earlier, {}, as_node="guard")
        assert isinstance(runner.saver, CompactSaver)
        assert runner.saver.supersteps(outcome.run_id) is None
        steps = runner.steps(outcome.run_id)
        assert steps == history_steps(runner, outcome.run_id)
    assert outcome.stop_reason == StopReason.COMPLETED
    assert steps == before


@contextmanager
def stock_runner(database_url: str, services: ServiceEndpoints, **options: Any) -> Iterator[Runner]:
    """A runner whose new runs are written in LangGraph's own layout, as the server's are."""
    with ExitStack() as stack:
        yield Runner(
            saver=stack.enter_context(open_checkpointer(database_url, new_threads=Layout.STOCK)),
            journal=stack.enter_context(open_journal(database_url)),
            leases=stack.enter_context(open_lease_store(database_url)),
            agent=refund_agent(agents=options.pop("agents", None)),
            deps=stack.enter_context(connect(services)),
            **options,
        )


@pytest.mark.parametrize("kind", ["approved", "cancelled", "handoff", "long"])
def test_steps_in_langgraphs_layout_are_the_historys(
    kind: str, database_url: str, services: ServiceEndpoints
) -> None:
    """Read from LangGraph's own tables in one pass, on both backends."""
    drive, options = RUNS[kind]
    with stock_runner(database_url, services, **options) as runner:
        outcome = drive(runner, [])
        config = runner.config(outcome.run_id)
        saver = runner.saver
        assert isinstance(saver, CompactSaver) and saver.legacy.get_tuple(config) is not None
        assert saver.supersteps(outcome.run_id) is not None
        steps = runner.steps(outcome.run_id)
        assert steps == history_steps(runner, outcome.run_id)
    assert [node for node, _ in steps].count("model_step") >= 2


def test_writes_saved_without_their_task_path_are_read_from_the_history(
    database_url: str, services: ServiceEndpoints
) -> None:
    """Writes an older LangGraph saved (no task path, which names the node): the history."""
    with stock_runner(database_url, services) as runner:
        outcome = approved(runner, [])
        before = runner.steps(outcome.run_id)
        table = "checkpoint_writes" if database_url.startswith("postgresql") else "writes"
        with runner.leases.db.transaction():
            runner.leases.db.execute(f"UPDATE {table} SET task_path = ''")
        assert runner.saver.supersteps(outcome.run_id) is None
        assert runner.steps(outcome.run_id) == history_steps(runner, outcome.run_id) == before
