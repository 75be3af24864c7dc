"""The refund scenario end to end on the real graph, services and databases."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig

from loopwright.checkpoints.leases import Lease
from loopwright.core.state import ActionStatus, ApprovalDecision
from loopwright.graph.build import NODES, compile_graph
from loopwright.runner import RunExists, open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    UNCRASHED_MODEL_CALLS,
    RunnerFactory,
    approve,
    principal,
)


def test_demo_scenario_completes_verified_with_one_refund(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner() as runner:
        outcome = runner.start(DEMO_TASK, principal())
        assert outcome.phase == "WAITING_APPROVAL"
        assert outcome.waiting_for_approval[0]["summary"] == "Refund 100.00 USD to order O-42"
        assert list_refunds(services, "O-42") == []  # nothing moves before approval

        outcome = approve(runner, outcome)

        assert outcome.stop_reason == "completed"
        assert outcome.phase == "COMPLETED"
        writes = outcome.verification["facts"]["writes"]  # type: ignore[index]
        refunds = list_refunds(services, "O-42")
        assert len(refunds) == 1
        assert writes[0]["refund_id"] == refunds[0]["refund_id"]
        assert (writes[0]["amount"], writes[0]["currency"]) == ("100.00", "USD")
        [action] = outcome.actions
        assert action.status is ActionStatus.SUCCEEDED and action.attempts == 1
        assert runner.state(outcome.run_id)["usage"]["model_requests"] == UNCRASHED_MODEL_CALLS


def test_checkpoint_history_has_one_commit_per_node_step(open_test_runner: RunnerFactory) -> None:
    steps: list[str] = []

    def record(node: str, _update: dict[str, Any]) -> None:
        steps.append(node)

    with open_test_runner() as runner:
        outcome = runner.start(DEMO_TASK, principal(), on_step=record)
        request = outcome.waiting_for_approval[0]
        decision = ApprovalDecision(
            approval_id=request["approval_id"],
            digest=request["digest"],
            decision="approve",
            approver="a-1",
        )
        runner.resume(outcome.run_id, decision.model_dump(mode="json"), on_step=record)

        history = list(
            reversed(list(runner.graph.get_state_history(runner.config(outcome.run_id))))
        )
    # Step 0 holds the applied input; then one committed checkpoint after every node step, and
    # each checkpoint names exactly the node that ran next.
    loop_checkpoints = [s for s in history if s.metadata and s.metadata.get("source") == "loop"]
    assert [s.metadata["step"] for s in loop_checkpoints] == list(range(len(steps) + 1))
    assert [s.next for s in loop_checkpoints[:-1]] == [(node,) for node in steps]
    assert loop_checkpoints[-1].next == ()
    # One chain, no fork: every checkpoint's parent is the one before it.
    for parent, child in pairwise(history):
        assert child.parent_config is not None
        assert (
            child.parent_config["configurable"]["checkpoint_id"]
            == parent.config["configurable"]["checkpoint_id"]
        )
    # reconcile runs only for unknown outcomes, guard only for checkpoints of earlier releases.
    assert set(steps) == set(NODES) - {"reconcile", "guard"}


def test_ineligible_order_completes_without_effect(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    task = "Check whether order O-44 can be refunded and refund it if so."
    with open_test_runner() as runner:
        outcome = runner.start(task, principal(task=task))
        final = runner.state(outcome.run_id)["history"][-1]
    assert outcome.stop_reason == "completed"
    assert outcome.actions == []
    assert list_refunds(services, "O-44") == []
    assert isinstance(final, AIMessage) and "cannot be refunded" in final.text


def test_starting_a_run_again_resumes_it_and_never_asks_the_model_again(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A caller that retries `start` (it could not tell whether the first got through) must
    not begin the run a second time."""
    with open_test_runner() as runner:
        first = runner.start(DEMO_TASK, principal(), run_id="run-started-twice")
        requests = runner.state(first.run_id)["usage"]["model_requests"]
        again = runner.start(DEMO_TASK, principal(), run_id="run-started-twice")
        assert again.waiting_for_approval == first.waiting_for_approval
        assert runner.state(first.run_id)["usage"]["model_requests"] == requests

        done = approve(runner, again)
        restarted = runner.start(DEMO_TASK, principal(), run_id="run-started-twice")
        final = runner.state(first.run_id)
    assert done.stop_reason == restarted.stop_reason == "completed"
    assert final["usage"]["model_requests"] == UNCRASHED_MODEL_CALLS
    assert len(list_refunds(services, "O-42")) == 1


def test_a_new_run_is_advanced_under_the_lease_it_was_registered_with(
    open_test_runner: RunnerFactory,
) -> None:
    """Registering a new run leases it too: there is no moment at which it is registered and
    nobody's, and its first attempt neither claims it nor reads a state nobody could have
    written. Every later attempt claims it."""
    with open_test_runner() as runner:
        claimed: list[str] = []
        claim = runner.leases.claim

        def counted(
            run_id: str, owner: str, ttl_s: float, *, agent_version: str | None = None
        ) -> Lease:
            claimed.append(run_id)
            return claim(run_id, owner, ttl_s, agent_version=agent_version)

        runner.leases.claim = counted  # type: ignore[method-assign]
        outcome = runner.start(DEMO_TASK, principal(), run_id="run-new")
        record = runner.leases.get("run-new")
        assert outcome.phase == "WAITING_APPROVAL" and claimed == []
        assert record is not None and (record.fence, record.owner) == (1, None)
        assert approve(runner, outcome).stop_reason == "completed"
        assert claimed == ["run-new"]


def test_a_run_id_is_not_reused_for_another_task(open_test_runner: RunnerFactory) -> None:
    with open_test_runner() as runner:
        runner.start(DEMO_TASK, principal(), run_id="run-taken")
        other = "Refund order O-43."
        with pytest.raises(RunExists, match="run-taken exists already"):
            runner.start(other, principal(task=other), run_id="run-taken")
        with pytest.raises(RunExists):
            runner.start(DEMO_TASK, principal(user_id="u-2"), run_id="run-taken")
        assert runner.state("run-taken")["task"] == DEMO_TASK


def test_runners_in_one_process_keep_their_checkpoints_apart(
    services: ServiceEndpoints, tmp_path: Path
) -> None:
    """The graph is compiled once a process (`graph.build.compile_graph`): each runner's copy
    writes to its own database, and the one compiled graph holds none."""
    with (
        connect(services) as deps,
        open_runner(f"sqlite:///{tmp_path / 'a.sqlite3'}", refunds, deps=deps) as first,
        open_runner(f"sqlite:///{tmp_path / 'b.sqlite3'}", refunds, deps=deps) as second,
    ):
        outcome = first.start(DEMO_TASK, principal())
        config: RunnableConfig = {"configurable": {"thread_id": outcome.run_id}}
        assert first.graph.get_state(config).values["task"] == DEMO_TASK
        assert second.graph.get_state(config).values == {}
        assert first.graph.checkpointer is not second.graph.checkpointer
        assert compile_graph().checkpointer is None
