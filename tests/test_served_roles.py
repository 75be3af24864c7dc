"""An agent's own role names on a served path: `loopwright serve`'s server (`langgraph dev`)
hosting the reference agent as a support desk names its people (`tests/desk_roles_agent.py`:
`agent` starts runs, `supervisor` decides approvals, `sre` reads the metrics).

Each capability is granted by the agent's names, on every route that decides it: the auth
hooks (starting a run, a decision through the SDK), the inbox's JSON routes and the metrics
route. The runtime's own words (`customer`, `approver`, `operator`) grant nothing here: a token
table written for them is refused with a 403 that names the role to hold. The Aegra engine's
check is in tests/test_aegra_approvals.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopwright.core import tls
from loopwright_refunds.services.admin import create_order, list_refunds
from tests.ports import reserved_ports
from tests.runtime_fixtures import PATIENCE_S, REPO, cli
from tests.test_server_langgraph import (
    GRAPH,
    Served,
    decision_for,
    serving,
    start_run,
    status_of,
    values_of,
)

pytestmark = pytest.mark.postgres

DESK_AGENT = {"LOOPWRIGHT_AGENT": "tests.desk_roles_agent:agent", "PYTHONPATH": str(REPO)}
# The desk's people by its own role names, and the same people by the runtime's words. a-1 and
# a-2 are approvers by the agent's own rule (the orders service's directory), whatever token.
DESK_TOKENS = {
    "t-agent": {"user_id": "u-1", "roles": ["agent"]},
    "t-supervisor": {"user_id": "a-1", "roles": ["supervisor"]},
    "t-sre": {"user_id": "o-1", "roles": ["sre"]},
    "t-customer": {"user_id": "u-2", "roles": ["customer"]},
    "t-approver": {"user_id": "a-2", "roles": ["approver"]},
    "t-operator": {"user_id": "o-2", "roles": ["operator"]},
}


@pytest.fixture(scope="module")
def desk(postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("desk-roles")
    with serving(postgres_server_url, workdir, DESK_TOKENS, **DESK_AGENT) as served:
        yield served


def refund_task(order_id: str) -> str:
    return f"Check whether order {order_id} can be refunded and refund it if so."


def waiting_refund(served: Served, order_id: str, user: str = "u-1") -> tuple[str, Any]:
    """A run of the desk's `agent` waiting for its approval (80.00: above the threshold)."""
    create_order(served.services, order_id, user, "80.00")
    thread_id, state = start_run(served.client("t-agent"), refund_task(order_id))
    [interrupt] = state["interrupts"]
    return thread_id, interrupt


def refusal(response: httpx.Response) -> str:
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    return detail


def test_the_agents_start_role_starts_runs_the_runtimes_word_does_not(desk: Served) -> None:
    thread_id, interrupt = waiting_refund(desk, "O-701")
    assert interrupt["value"]["tool"] == "submit_refund"
    principal = values_of(desk.client("t-agent"), thread_id)["principal"]
    assert (principal["user_id"], principal["roles"]) == ("u-1", ["agent"])  # as its identity had

    create_order(desk.services, "O-702", "u-2", "80.00")  # u-2's own order: only the role lacks
    thread = desk.client("t-customer").threads.create()
    started = httpx.post(
        f"{desk.url}/threads/{thread['thread_id']}/runs/wait",
        json={"assistant_id": GRAPH, "input": {"task": refund_task("O-702")}},
        headers={"Authorization": "Bearer t-customer"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )
    assert started.status_code == 403
    assert refusal(started) == "starting runs takes the role agent"
    assert status_of(lambda: start_run(desk.client("t-supervisor"), refund_task("O-702"))) == 403


def test_the_agents_decide_role_decides_through_the_sdk_and_the_inbox(desk: Served) -> None:
    """The desk's `supervisor` sees the approvals and decides them, through the SDK's resume
    and the inbox's JSON route; a-2, an approver by the agent's own rule whose token says
    `approver`, sees nothing and decides nothing: both must say yes."""
    by_sdk, sdk_interrupt = waiting_refund(desk, "O-711")
    by_inbox, inbox_interrupt = waiting_refund(desk, "O-712")

    def inbox(token: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(
            f"{desk.url}/inbox/api/approvals",
            headers=headers,
            timeout=PATIENCE_S,
            verify=tls.context(),
        )

    listed = {a["thread_id"] for a in inbox("t-supervisor").json()["approvals"]}
    assert {by_sdk, by_inbox} <= listed
    for token in ("t-approver", "t-agent"):
        assert inbox(token).status_code == 403
        assert refusal(inbox(token)) == "deciding approvals takes the role supervisor"

    ann = desk.client("t-approver")
    resume = decision_for(sdk_interrupt, "approve", "a-2")
    assert status_of(lambda: ann.runs.wait(by_sdk, GRAPH, command={"resume": resume})) == 403
    decision = {"thread_id": by_inbox, "interrupt_id": inbox_interrupt["id"], "decision": "approve"}
    refused = httpx.post(
        f"{desk.url}/inbox/api/decisions",
        json=decision,
        headers={"Authorization": "Bearer t-approver"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )
    assert refused.status_code == 403
    assert list_refunds(desk.services, "O-711") == list_refunds(desk.services, "O-712") == []

    sue = desk.client("t-supervisor")
    sue.runs.wait(by_sdk, GRAPH, command={"resume": decision_for(sdk_interrupt, "approve", "a-1")})
    decided = httpx.post(
        f"{desk.url}/inbox/api/decisions",
        json=decision,
        headers={"Authorization": "Bearer t-supervisor"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["result"]["stop_reason"] == "completed", decided.json()
    for thread_id, order_id in ((by_sdk, "O-711"), (by_inbox, "O-712")):
        state = values_of(desk.client("t-agent"), thread_id)
        assert state["stop_reason"] == "completed" and state["verification"]["verified"]
        [approval] = state["approvals"]
        assert approval["approver"] == "a-1"
        assert len(list_refunds(desk.services, order_id)) == 1


def test_only_the_agents_operate_role_reads_the_metrics(desk: Served) -> None:
    metrics = f"{desk.url}/loopwright/metrics"
    assert httpx.get(metrics, verify=tls.context()).status_code == 401
    for token in ("t-operator", "t-agent", "t-supervisor"):
        answer = httpx.get(
            metrics, headers={"Authorization": f"Bearer {token}"}, verify=tls.context()
        )
        assert answer.status_code == 403, token
        assert refusal(answer) == "reading the metrics takes the role sre"
    answer = httpx.get(metrics, headers={"Authorization": "Bearer t-sre"}, verify=tls.context())
    assert answer.status_code == 200 and "loopwright_database_up 1.0" in answer.text


def test_serving_the_desk_on_the_development_tokens_says_their_roles_grant_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    """The development table's people are the reference agent's (`customer`, `approver`,
    `operator`): `loopwright serve` falling back to it for the desk says they grant nothing
    there (an unreachable Redis then stops it before anything starts)."""
    pytest.importorskip("aegra_api")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_TOKENS")}
    with reserved_ports(2) as port:  # two instances, on port and the next
        served = cli(
            *("serve", "--engine", "aegra", "--dev-tokens", "--port", str(port)),
            *("--agent", DESK_AGENT["LOOPWRIGHT_AGENT"], "--db", postgres_url),
            *("--redis", "redis://127.0.0.1:1/0"),
            env=env,
            expect=2,
            cwd=tmp_path,
        )
    assert (
        "their roles approver, customer, operator grant nothing with this agent, whose roles"
        " are start: agent; decide: supervisor; operate: sre" in served.stderr
    ), served.stderr
    assert "--redis:" in served.stderr.splitlines()[-1]
