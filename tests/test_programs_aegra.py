"""A program action served by Aegra on two instances: the customer's run pauses its program at
a refund that needs an approver, on one instance; the approver decides through the other, and
the program resumes there where it stood (its snapshot in the shared database), never running
an earlier call again."""

from __future__ import annotations

from typing import Any

from loopwright_refunds.services.admin import list_refunds
from tests.program_agent import TASK
from tests.runtime_fixtures import REPO
from tests.test_aegra_scaleout import Cluster, cluster, pytestmark
from tests.test_server_langgraph import GRAPH, decision_for, values_of

__all__ = ["cluster", "pytestmark"]  # the fixture and the skip conditions, used here

AGENT = {"LOOPWRIGHT_AGENT": "tests.program_agent:agent", "PYTHONPATH": str(REPO)}


def test_an_approval_decided_on_another_instance_resumes_the_program(cluster: Cluster) -> None:
    first = cluster.start_with("aegra-program-1", **AGENT)
    second = cluster.start_with("aegra-program-2", **AGENT)
    customer = first.client("t-u1")
    thread_id = customer.threads.create()["thread_id"]
    customer.runs.wait(thread_id, GRAPH, input={"task": TASK})
    interrupts: list[Any] = customer.threads.get_state(thread_id)["interrupts"]
    [interrupt] = interrupts
    assert interrupt["value"]["args"]["order_id"] == "O-42"
    calls = values_of(customer, thread_id)["program"]["calls"]
    assert [c["outcome"] for c in calls] == ["ok", "waiting"]
    second.client("t-a1").runs.wait(
        thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", "a-1")}
    )
    values = values_of(second.client("t-u1"), thread_id)
    assert values["stop_reason"] == "completed", values.get("stop_detail")
    assert values["usage"]["model_requests"] == 2
    assert [(c["tool"], c["outcome"]) for c in values["program"]["calls"]] == [
        ("get_order", "ok"),
        ("submit_refund", "ok"),
        ("get_order", "ok"),
        ("submit_refund", "ok"),
    ]
    assert [len(list_refunds(cluster.services, o)) for o in ("O-42", "O-43")] == [1, 1]
