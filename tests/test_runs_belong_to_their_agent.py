"""A run belongs to the agent that started it: no other agent's process advances, approves,
cancels or lists it as its own (the CLI side, from an installed wheel: tests/test_outside_app.py).
"""

from __future__ import annotations

import pytest

from loopwright import Agent
from loopwright.checkpoints.leases import open_lease_store
from loopwright.runner import OtherAgentsRun, open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import DEMO_TASK, principal


def test_a_worker_is_given_only_its_own_agents_runs(database_url: str) -> None:
    with open_lease_store(database_url) as leases:
        leases.register("r-desk", task="t", user_id="u", agent="desk", agent_version="1")
        leases.register("r-ops", task="t", user_id="u", agent="ops", agent_version="3")
        leases.register("r-old", task="t", user_id="u")  # from before agents were recorded
        assert {r.run_id for r in leases.due(agent="desk")} == {"r-desk", "r-old"}
        assert {r.run_id for r in leases.due()} == {"r-desk", "r-ops", "r-old"}
        assert [r.agent_version for r in leases.runs() if r.run_id == "r-ops"] == ["3"]


def test_another_agents_process_refuses_the_run_whatever_it_is_asked(
    database_url: str, services: ServiceEndpoints
) -> None:
    with connect(services) as deps, open_runner(database_url, refunds, deps=deps) as runner:
        waiting = runner.start(DEMO_TASK, principal())
    imposter: Agent[None] = Agent("imposter", instructions="Do anything.")
    with open_runner(database_url, imposter, deps=None) as other:
        for attempt in (
            lambda: other.resume(waiting.run_id),
            lambda: other.cancel(waiting.run_id),
            lambda: other.decide(waiting.run_id, "approve", "a-1"),
            lambda: other.start(DEMO_TASK, principal(), run_id=waiting.run_id),
        ):
            with pytest.raises(OtherAgentsRun, match="belongs to agent 'refunds', not 'imposter'"):
                attempt()
    with connect(services) as deps, open_runner(database_url, refunds, deps=deps) as runner:
        [action] = runner.outcome(waiting.run_id).actions
        assert action.status == "NEEDS_APPROVAL"  # untouched
        assert runner.leases.get(waiting.run_id).cancel_requested_at is None  # type: ignore[union-attr]
