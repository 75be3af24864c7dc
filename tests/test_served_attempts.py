"""A served run is advanced by the same attempt protocol as a CLI run (`loopwright.attempt`),
on `langgraph dev` and on Aegra: attempts that keep failing end the run typed after as many
failures as a CLI run's, and a decision's claim lasts no longer than the attempt it resumed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright.attempt import MAX_FAILURES
from loopwright.core import tls
from tests import buggy_agent
from tests.engines import ENGINES, served_on
from tests.runtime_fixtures import PATIENCE_S
from tests.test_server_langgraph import (
    GRAPH,
    Served,
    decision_for,
    start_run,
    values_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parent.parent
BUGGY = {"LOOPWRIGHT_AGENT": "tests.buggy_agent:agent", "PYTHONPATH": str(REPO)}


@dataclass(frozen=True)
class Engines:
    """The same engine twice: hosting the buggy agent, and the reference agent."""

    name: str
    buggy: Served
    reference: Served


@pytest.fixture(scope="module", params=ENGINES)
def engines(
    request: pytest.FixtureRequest,
    postgres_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Engines]:
    workdir = tmp_path_factory.mktemp(request.param)
    with (
        served_on(request.param, postgres_server_url, workdir / "buggy", **BUGGY) as buggy,
        served_on(request.param, postgres_server_url, workdir / "reference") as reference,
    ):
        yield Engines(request.param, buggy, reference)


def continue_run(served: Served, thread_id: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{served.url}/threads/{thread_id}/runs/wait",
        json={"assistant_id": GRAPH, **body},
        headers={"Authorization": "Bearer t-u1"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )


def test_a_served_run_whose_attempts_keep_failing_ends_typed(engines: Engines) -> None:
    """Each attempt (the same task delivered again continues the run) fails on the tool's bug
    and is counted on the run; the one that makes `MAX_FAILURES` ends it INCOMPLETE
    needs_human, saying why, as a CLI run's would; an attempt after that finds it ended."""
    served = engines.buggy
    thread_id = served.client("t-u1").threads.create()["thread_id"]
    continue_run(served, thread_id, {"input": {"task": buggy_agent.TASK}})
    for _ in range(MAX_FAILURES - 1):
        failures = served.sql("SELECT failures FROM lw_runs WHERE run_id = %s", thread_id)
        assert failures and failures[0][0] >= 1
        continue_run(served, thread_id, {"input": {"task": buggy_agent.TASK}})
    ended = values_of(served.client("t-u1"), thread_id)
    assert (ended["phase"], ended["stop_reason"]) == ("INCOMPLETE", "needs_human")
    assert ended["stop_detail"] == (
        f"{MAX_FAILURES} attempts in a row did not go through; the last:"
        f" RuntimeError: {buggy_agent.BUG}"
    )
    assert served.sql("SELECT phase FROM lw_runs WHERE run_id = %s", thread_id) == [("INCOMPLETE",)]
    again = continue_run(served, thread_id, {"input": {"task": buggy_agent.TASK}})
    assert again.status_code == 200, again.text
    assert values_of(served.client("t-u1"), thread_id)["stop_reason"] == "needs_human"


def test_a_decisions_claim_lasts_no_longer_than_its_attempt(engines: Engines) -> None:
    """A decision keyed by an interrupt the run does not wait on is refused before anything is
    claimed, so another approver decides at once; and once a decision's run has ended, no claim
    of its run is left to hold anyone off."""
    served = engines.reference
    from loopwright_refunds.services.admin import create_order

    create_order(served.services, "O-2201", "u-1", "80.00")
    task = "Check whether order O-2201 can be refunded and refund it if so."
    thread_id, state = start_run(served.client("t-u1"), task)
    [interrupt] = state["interrupts"]
    [(_, value)] = decision_for(interrupt, "approve", "a-1").items()
    made_up = httpx.post(
        f"{served.url}/threads/{thread_id}/runs/wait",
        json={"assistant_id": GRAPH, "command": {"resume": {"f" * 32: value}}},
        headers={"Authorization": "Bearer t-a1"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )
    assert made_up.status_code == 409, made_up.text
    assert "is asked by interrupt" in made_up.json()["detail"]
    claims = "SELECT count(*) FROM lw_decision_claims WHERE run_id = %s"
    assert served.sql(claims, thread_id) == [(0,)]
    decided = served.client("t-a2").runs.wait(
        thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", "a-2")}
    )
    assert isinstance(decided, dict) and decided["stop_reason"] == "completed"
    assert served.sql(claims, thread_id) == [(0,)]
