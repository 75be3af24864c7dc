"""Approvals on the multi-instance engine: seen and decided through any instance of Aegra.

A customer's refund above the approval threshold waits for an approver. The approver (not the
run's owner) sees it through the other instance than the one that ran it (the inbox's JSON
route and the SDK's state read), decides it there (through the inbox, or with the SDK's resume),
and the run completes, verified, with one refund. The engine's own records then say what
loopwright's say: its runs ended in success, its thread is idle, not `interrupted` for good.
Another customer of the tenant sees and decides nothing of it, nor does an approver of another
tenant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loopwright.core import tls
from loopwright.server.bearer_tokens import hashed_table
from loopwright_refunds.services.admin import create_order, list_refunds
from tests.runtime_fixtures import PATIENCE_S, cli, wait_for
from tests.test_aegra_scaleout import (
    Cluster,
    Instance,
    cluster,
    deployment,
    pytestmark,
    refund_task,
)
from tests.test_served_roles import DESK_AGENT, DESK_TOKENS
from tests.test_server_langgraph import (
    DECISION_ROUTES,
    GRAPH,
    decision_for,
    one_decision_taken,
    status_of,
    two_decisions_at_once,
    values_of,
    wait_for_end,
)

__all__ = ["cluster", "pytestmark"]  # the fixture and the skip conditions, used here


def inbox(instance: Instance, token: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(
        f"{instance.url}/inbox/api/approvals",
        headers=headers,
        timeout=PATIENCE_S,
        verify=tls.context(),
    )


def engine_records(cluster: Cluster, thread_id: str) -> tuple[str, list[str]]:
    """The engine's thread status and its runs' statuses on the thread, oldest first."""
    [(status,)] = cluster.sql("SELECT status FROM thread WHERE thread_id = %s", thread_id)
    runs = cluster.sql(
        "SELECT status FROM runs WHERE thread_id = %s ORDER BY created_at", thread_id
    )
    return status, [run for (run,) in runs]


def waiting_refund(cluster: Cluster, instance: Instance, order_id: str) -> tuple[str, Any]:
    """A customer's run, started on `instance`, waiting for its approval; (thread, interrupt)."""
    create_order(cluster.services, order_id, "u-1", "80.00")  # above the approval threshold
    ada = instance.client("t-u1")
    thread_id = ada.threads.create()["thread_id"]
    ada.runs.wait(thread_id, GRAPH, input={"task": refund_task(order_id)})
    [interrupt] = ada.threads.get_state(thread_id)["interrupts"]
    ((phase,),) = cluster.sql("SELECT phase FROM lw_runs WHERE run_id = %s", thread_id)
    assert phase == "WAITING_APPROVAL"
    return thread_id, interrupt


@pytest.fixture(scope="module")
def two_instances(
    postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, Instance, Instance]]:
    """A deployment of two instances for the tests of deciding through the other one: started
    once for them all (each test's run is on an order of its own), not two instances a test."""
    with deployment(postgres_server_url, tmp_path_factory.mktemp("aegra")) as cluster:
        yield cluster, cluster.start("aegra-1"), cluster.start("aegra-2")


ROUTES = ("inbox", "sdk", "cli")


@pytest.mark.parametrize("route", ROUTES)
def test_an_approval_is_seen_and_decided_through_another_instance(
    two_instances: tuple[Cluster, Instance, Instance], route: str
) -> None:
    cluster, first, second = two_instances
    order_id = f"O-61{ROUTES.index(route)}"
    thread_id, interrupt = waiting_refund(cluster, first, order_id)
    assert engine_records(cluster, thread_id) == ("interrupted", ["interrupted"])

    # Seen through the other instance: the inbox, and the SDK's state read.
    listed = inbox(second, "t-a1").json()["approvals"]
    assert [(a["thread_id"], a["interrupt_id"]) for a in listed] == [(thread_id, interrupt["id"])]
    ann = second.client("t-a1")
    assert ann.threads.get_state(thread_id)["interrupts"][0]["id"] == interrupt["id"]
    # ... and by no one else: another customer of the tenant, an approver of another tenant.
    ben = second.client("t-u2")
    assert status_of(lambda: ben.threads.get_state(thread_id)) in (403, 404)
    assert status_of(lambda: ben.runs.list(thread_id)) in (403, 404)
    assert inbox(second, "t-bank-b").json()["approvals"] == []
    foreign = second.client("t-bank-b")
    assert status_of(lambda: foreign.threads.get_state(thread_id)) == 404

    # Decided through the other instance.
    if route == "inbox":
        decision = {"thread_id": thread_id, "interrupt_id": interrupt["id"], "decision": "approve"}
        answer = httpx.post(
            f"{second.url}/inbox/api/decisions",
            json=decision,
            headers={"Authorization": "Bearer t-a1"},
            timeout=PATIENCE_S,
            verify=tls.context(),
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["stop_reason"] == "completed", answer.json()
    elif route == "sdk":
        resume = decision_for(interrupt, "approve", "a-1")
        ann.runs.wait(thread_id, GRAPH, command={"resume": resume})
    else:  # the command line hands it to the engine: it never resumes a served run itself
        approval_id = interrupt["value"]["approval_id"]
        command = ("approvals", "approve", approval_id, "--as", "a-1", "--db", cluster.database_url)
        refused = cli(*command, env={}, expect=2)
        assert "--server" in refused.stderr and thread_id in refused.stderr
        decided = cli(*command, "--server", second.url, env={"LOOPWRIGHT_TOKEN": "t-a1"}, expect=0)
        assert "COMPLETED run" in decided.stdout, decided.stdout

    state = values_of(second.client("t-u1"), thread_id)
    assert state["stop_reason"] == "completed" and state["verification"]["verified"]
    assert len(list_refunds(cluster.services, order_id)) == 1
    ((phase,),) = cluster.sql("SELECT phase FROM lw_runs WHERE run_id = %s", thread_id)
    assert phase == "COMPLETED"
    # The engine's records agree: the run that waited and the one that resumed both ended.
    assert engine_records(cluster, thread_id) == ("idle", ["interrupted", "success"])


@pytest.mark.parametrize("routes", DECISION_ROUTES, ids="+".join)
def test_two_approvers_deciding_at_once_on_two_instances_are_told_200_and_409(
    two_instances: tuple[Cluster, Instance, Instance], routes: tuple[str, str]
) -> None:
    """A decision is claimed where every instance sees it (the database), not in one instance's
    memory: a-1's approval on one instance and a-2's rejection on the other, sent at the same
    moment, are one 200 (the decision the run took) and one 409 (before: 200 twice)."""
    cluster, first, second = two_instances
    order_id = f"O-62{DECISION_ROUTES.index(routes)}"
    thread_id, interrupt = waiting_refund(cluster, first, order_id)
    answers = two_decisions_at_once((first.url, second.url), routes, thread_id, interrupt)
    values = wait_for_end(first.client("t-u1"), thread_id)["values"]
    refunds = len(list_refunds(cluster.services, order_id))
    one_decision_taken(answers, values, refunds, interrupt["value"]["approval_id"])
    # The run's state says it ended before the engine records so (it finalizes after the
    # stream).
    wait_for(
        lambda: engine_records(cluster, thread_id)[0] == "idle",
        said=lambda: str(engine_records(cluster, thread_id)),
    )


def test_an_instance_tells_an_outsider_nothing_but_that_it_is_up(cluster: Cluster) -> None:
    """Without a token an instance answers that it is up (its probes and root) and nothing else
    (before: its root and /info named the engine and its version to anyone)."""
    instance = cluster.start("aegra-1")
    for path in ("/", "/health"):
        answer = httpx.get(f"{instance.url}{path}", timeout=30, verify=tls.context())
        assert answer.status_code == 200 and "version" not in answer.text, (path, answer.text)
    assert httpx.get(f"{instance.url}/info", timeout=30, verify=tls.context()).status_code == 401
    thread_id, _ = waiting_refund(cluster, instance, "O-631")
    theirs = instance.client("t-bank-b-u1")
    assert status_of(lambda: theirs.threads.create(thread_id=thread_id)) == 422


def test_an_agents_own_role_names_grant_on_aegra_as_on_langgraphs_server(
    cluster: Cluster,
) -> None:
    """An instance hosting the desk (tests/desk_roles_agent.py): its `agent` starts a run and
    the runtime's `customer` does not; its `supervisor` decides through the SDK and an
    `approver` does not; its `sre` reads the metrics and an `operator` does not."""
    tokens = json.dumps(hashed_table(DESK_TOKENS))
    desk = cluster.start_with("aegra-desk", **DESK_AGENT, LOOPWRIGHT_TOKENS=tokens)
    create_order(cluster.services, "O-631", "u-1", "80.00")
    agent = desk.client("t-agent")
    thread_id = agent.threads.create()["thread_id"]
    agent.runs.wait(thread_id, GRAPH, input={"task": refund_task("O-631")})
    interrupts: list[Any] = agent.threads.get_state(thread_id)["interrupts"]
    [interrupt] = interrupts

    create_order(cluster.services, "O-632", "u-2", "80.00")
    customer = desk.client("t-customer")
    own = customer.threads.create()["thread_id"]
    task = {"task": refund_task("O-632")}
    assert status_of(lambda: customer.runs.wait(own, GRAPH, input=task)) == 403
    ann = desk.client("t-approver")
    resume = decision_for(interrupt, "approve", "a-2")
    assert status_of(lambda: ann.runs.wait(thread_id, GRAPH, command={"resume": resume})) == 403
    assert inbox(desk, "t-approver").status_code == 403

    sue = desk.client("t-supervisor")
    sue.runs.wait(thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", "a-1")})
    state = values_of(agent, thread_id)
    assert state["stop_reason"] == "completed" and state["verification"]["verified"]
    assert len(list_refunds(cluster.services, "O-631")) == 1
    metrics = f"{desk.url}/loopwright/metrics"
    for token, status in (("t-sre", 200), ("t-operator", 403), ("t-supervisor", 403)):
        headers = {"Authorization": f"Bearer {token}"}
        assert (
            httpx.get(
                metrics, headers=headers, timeout=PATIENCE_S, verify=tls.context()
            ).status_code
            == status
        )
