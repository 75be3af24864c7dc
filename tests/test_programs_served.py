"""A program action served by `langgraph dev` (`loopwright serve`), through langgraph-sdk: the
customer's run pauses its program at a refund that needs an approver; the approver's decision,
sent by another client, resumes the program where it stood, on the same graph."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwright_refunds.services.admin import list_refunds
from tests.program_agent import REFUND_EACH, TASK
from tests.runtime_fixtures import REPO
from tests.test_server_langgraph import (
    GRAPH,
    TOKENS,
    Served,
    decision_for,
    serving,
    start_run,
    values_of,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir: Path = tmp_path_factory.mktemp("langgraph-dev-programs")
    hosted = {"LOOPWRIGHT_AGENT": "tests.program_agent:agent", "PYTHONPATH": str(REPO)}
    with serving(postgres_server_url, workdir, TOKENS, **hosted) as served:
        yield served


def test_an_approval_decided_by_another_client_resumes_the_served_program(
    served: Served,
) -> None:
    customer, approver = served.client("t-u1"), served.client("t-a1")
    thread_id, waiting = start_run(customer, TASK)
    [interrupt] = waiting["interrupts"]
    request = interrupt["value"]
    assert (request["tool"], request["args"]["order_id"]) == ("submit_refund", "O-42")
    facts = {f["label"]: f["value"] for f in request["facts"]}
    assert facts["Program source"] == REFUND_EACH
    assert facts["Program calls so far"] == "get_order ok"
    paused = waiting["values"]["program"]
    assert paused["status"] == "running" and paused["snapshot"]
    approver.runs.wait(
        thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", "a-1")}
    )
    values = values_of(customer, thread_id)
    assert values["stop_reason"] == "completed", values.get("stop_detail")
    assert values["usage"]["model_requests"] == 2
    program = values["program"]
    assert [(c["tool"], c["outcome"]) for c in program["calls"]] == [
        ("get_order", "ok"),
        ("submit_refund", "ok"),
        ("get_order", "ok"),
        ("submit_refund", "ok"),
    ]
    assert [len(list_refunds(served.services, o)) for o in ("O-42", "O-43")] == [1, 1]
