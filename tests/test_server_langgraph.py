"""loopwright under `langgraph dev`, driven through langgraph-sdk as a client would.

One server per module (a subprocess on a port reserved for it, on a fresh Postgres database and
fresh reference services): runs with approvals, a cancel in the middle of a refund, a busy thread,
and who may do what (the auth hooks, the inbox's JSON routes, the served graph's own checks).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from langgraph_sdk.client import SyncLangGraphClient

from loopwright.checkpoints.retention import retain
from loopwright.core import tls
from loopwright.server.admissions import PER_PRINCIPAL
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.launch import server_env, start_server
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import create_order, list_refunds, set_fault, slow_down
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.ports import reserved_port
from tests.runtime_fixtures import PATIENCE_S, sdk_client, wait_for

pytestmark = pytest.mark.postgres

GRAPH = "loopwright"
TASK_O42 = "Check whether order O-42 can be refunded and refund it if so."
TOKENS = {
    "t-u1": {"user_id": "u-1", "roles": ["customer"]},
    "t-u2": {"user_id": "u-2", "roles": ["customer"]},
    "t-a1": {"user_id": "a-1", "roles": ["approver"]},
    "t-a2": {"user_id": "a-2", "roles": ["customer", "approver"]},
    # An approver by the token table only: the agent's directory does not know u-2 as one.
    "t-u2-approver": {"user_id": "u-2", "roles": ["approver"]},
    # An approver of another tenant: nothing of the default tenant's is theirs to see or decide.
    "t-bank-b": {"user_id": "a-1", "roles": ["approver"], "tenant": "bank-b"},
    # The same user id as t-u1's, of another tenant: another principal altogether.
    "t-bank-b-u1": {"user_id": "u-1", "roles": ["customer"], "tenant": "bank-b"},
}


@dataclass
class Served:
    url: str
    database_url: str
    services: ServiceEndpoints

    def client(self, token: str | None) -> SyncLangGraphClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return sdk_client(url=self.url, headers=headers)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


@contextlib.contextmanager
def serving(
    postgres_server_url: str, workdir: Path, tokens: dict[str, Any], **env: str
) -> Iterator[Served]:
    """`loopwright serve`'s server on a database and reference services of its own, taking
    `tokens` (hashed), with `env` added to its environment."""
    with (
        fresh_database(postgres_server_url, prefix="lw_test") as url,
        start_services(workdir / "services") as services,
    ):
        server_environment = server_env(
            {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
            {
                "DATABASE_URL": url,
                "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(tokens)),
                **env,
                **services.endpoints.to_env(),
            },
        )
        with (
            reserved_port() as port,
            start_server(workdir, server_environment, port=port) as server,
        ):
            yield Served(server.url, url, services.endpoints)


@pytest.fixture(scope="module")
def served(postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("langgraph-dev")
    with serving(postgres_server_url, workdir, TOKENS, LOOPWRIGHT_LEASE_TTL_S="5") as served:
        yield served


def start_run(client: SyncLangGraphClient, task: str, **extra_input: Any) -> tuple[str, Any]:
    """A new thread with a run of `task`, advanced to where it stops; (thread id, its state)."""
    thread = client.threads.create()
    client.runs.wait(thread["thread_id"], GRAPH, input={"task": task, **extra_input})
    return thread["thread_id"], client.threads.get_state(thread["thread_id"])


def values_of(client: SyncLangGraphClient, thread_id: str) -> dict[str, Any]:
    values = client.threads.get_state(thread_id)["values"]
    assert isinstance(values, dict)
    return values


def decision_for(interrupt: dict[str, Any], decision: str, approver: str) -> dict[str, Any]:
    value = interrupt["value"]
    return {
        interrupt["id"]: {
            "approval_id": value["approval_id"],
            "digest": value["digest"],
            "decision": decision,
            "approver": approver,
        }
    }


def wait_for_end(client: SyncLangGraphClient, thread_id: str, timeout: float = PATIENCE_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        state = client.threads.get_state(thread_id)
        values = state["values"]
        if (isinstance(values, dict) and values.get("stop_reason")) or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def post_run(
    served: Served, token: str, thread_id: str, body: dict[str, Any], route: str = "runs/wait"
) -> httpx.Response:
    """A run-creation request as a client writing its own HTTP sends it (the SDK raises on a
    4xx, whose status and detail are what the tests read)."""
    return httpx.post(
        f"{served.url}/threads/{thread_id}/{route}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=PATIENCE_S,
        verify=tls.context(),
    )


def test_refund_with_an_approval_through_the_sdk(served: Served) -> None:
    """The refund scenario end to end: interrupt payload, resume by interrupt id, verified end.

    A client's own `principal` in the input is refused (422, nothing started); its `approver`
    in the decision is overwritten: the run acts for the authenticated customer, and the
    decision is signed by the authenticated approver.
    """

    ada, ann = served.client("t-u1"), served.client("t-a1")
    forged = {"user_id": "u-2", "roles": ["customer", "approver"], "scope": []}
    with pytest.raises(httpx.HTTPStatusError) as refused:
        start_run(ada, TASK_O42, principal=forged)
    assert refused.value.response.status_code == 422
    assert "an input naming principal" in refused.value.response.text
    thread_id, waiting = start_run(ada, TASK_O42)
    interrupt = waiting["interrupts"][0]
    final = ann.runs.wait(
        thread_id, GRAPH, command={"resume": decision_for(interrupt, "approve", approver="u-2")}
    )
    assert isinstance(final, dict)
    assert waiting["next"] == ["approval"]
    request = waiting["interrupts"][0]["value"]
    assert request["kind"] == "approval" and request["tool"] == "submit_refund"
    assert request["args"]["amount"] == "100.00" and request["requested_by"] == "u-1"
    assert len(request["digest"]) == 64
    assert waiting["values"]["principal"]["user_id"] == "u-1"
    assert waiting["values"]["principal"]["scope"] == ["order:O-42"]
    assert final["phase"] == "COMPLETED" and final["stop_reason"] == "completed"
    assert final["verification"]["verified"] is True
    assert [a["approver"] for a in final["approvals"]] == ["a-1"]
    refunds = list_refunds(served.services, "O-42")
    assert [(r["amount"], r["status"]) for r in refunds] == [("100.00", "succeeded")]
    (phase, owner), *_ = served.sql(
        "SELECT phase, owner FROM lw_runs WHERE run_id = %s", final["run_id"]
    )
    assert (phase, owner) == ("COMPLETED", None)
    # The server's runs are in LangGraph's layout, which its own readers and Aegra's read.
    [(stock, compact)] = served.sql(
        "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %s),"
        " (SELECT count(*) FROM lw_checkpoints WHERE thread_id = %s)",
        thread_id,
        thread_id,
    )
    assert stock > 10 and compact == 0


def parked_then_woken(customer: SyncLangGraphClient, served_sql: Callable[..., Any]) -> None:
    """A refund the payment service is still processing (the fault is armed) parks its run;
    nobody resumes it, yet it ends completed: the server woke it through its own API when it
    was due (`server.waker`), so the engine's thread ends idle and its last run a success."""
    thread_id = customer.threads.create()["thread_id"]
    customer.runs.wait(thread_id, GRAPH, input=task_about("O-7700"))
    assert served_sql("SELECT phase FROM lw_runs WHERE run_id = %s", thread_id) == [
        ("RECONCILING",)
    ]
    # Parked (or, on a loaded machine, already being woken: the first wake-up is due in 1 s).
    assert customer.threads.get(thread_id)["status"] in ("interrupted", "busy")
    wait_for(
        lambda: (
            customer.threads.get(thread_id)["status"] == "idle"
            and served_sql("SELECT phase FROM lw_runs WHERE run_id = %s", thread_id)
            == [("COMPLETED",)]
        ),
        timeout=PATIENCE_S,
    )
    values = values_of(customer, thread_id)
    assert values["stop_reason"] == "completed" and values["verification"]["verified"]
    # The customer's run, and after it the wake-ups (newest first), the last a success.
    runs = customer.runs.list(thread_id)
    assert len(runs) >= 2 and runs[0]["status"] == "success"


def test_a_parked_run_is_woken_by_its_server_when_due(served: Served) -> None:
    create_order(served.services, "O-7700", "u-1", "20.00")  # no approval needed
    set_fault(served.services, "processing", delay_s=4)
    parked_then_woken(served.client("t-u1"), served.sql)
    assert [r["status"] for r in list_refunds(served.services, "O-7700")] == ["succeeded"]


def test_cancel_in_the_middle_of_a_refund_and_a_busy_thread(served: Served) -> None:
    """LangGraph's own cancel of a running run: the refund in flight is settled, then the run
    stops with `cancelled`. A second run on the busy thread is refused."""

    ada, ann = served.client("t-u1"), served.client("t-a1")
    task = "Check whether order O-46 can be refunded and refund it if so."
    thread_id, waiting = start_run(ada, task)
    set_fault(served.services, "latency", delay_s=3)  # the refund takes 3 s to answer
    approve = decision_for(waiting["interrupts"][0], "approve", "a-1")
    resumed = ann.runs.create(thread_id, GRAPH, command={"resume": approve})
    deadline = time.monotonic() + PATIENCE_S
    while not served.sql(
        "SELECT 1 FROM lw_actions WHERE run_id = %s AND status = 'DISPATCHED'", thread_id
    ):
        assert time.monotonic() < deadline, "the refund was never dispatched"
        time.sleep(0.05)
    with pytest.raises(httpx.HTTPStatusError) as busy:
        ada.runs.create(thread_id, GRAPH, input={"task": task}, multitask_strategy="reject")
    ada.runs.cancel(thread_id, resumed["run_id"])
    state = wait_for_end(ada, thread_id)
    # Refused: the thread is busy (409), or, until the decision's run records where it stands,
    # its run still waits for the approval, and a customer's run there is refused (403).
    assert busy.value.response.status_code in (403, 409)
    assert state["values"]["stop_reason"] == "cancelled"
    assert state["values"]["phase"] == "INCOMPLETE" and state["next"] == []
    actions = served.sql(
        "SELECT status FROM lw_actions WHERE run_id = %s", state["values"]["run_id"]
    )
    assert actions == [("SUCCEEDED",)]  # the write in flight was settled, not left UNKNOWN
    assert len(list_refunds(served.services, "O-46")) == 1
    assert served.sql(
        "SELECT 1 FROM lw_runs WHERE run_id = %s AND cancel_requested_at IS NOT NULL",
        state["values"]["run_id"],
    )
    assert ada.runs.get(thread_id, resumed["run_id"])["status"] == "interrupted"


@pytest.fixture(scope="module")
def waiting_run(served: Served) -> tuple[str, Any]:
    """A run of u-1 waiting for approval (of 80.00), for the who-may-do-what tests."""
    create_order(served.services, "O-800", "u-1", "80.00")
    task = "Check whether order O-800 can be refunded and refund it if so."
    return start_run(served.client("t-u1"), task)


def status_of(call: Callable[[], Any]) -> int:
    """The HTTP status a client call ends with (200 for any success)."""
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


def test_requests_without_a_known_token_get_401(served: Served) -> None:
    assert status_of(served.client(None).threads.search) == 401
    assert status_of(served.client("not-a-token").threads.create) == 401
    assert httpx.get(f"{served.url}/inbox/api/approvals", verify=tls.context()).status_code == 401


def test_a_customer_cannot_read_another_customers_thread(
    served: Served, waiting_run: tuple[str, Any]
) -> None:
    thread_id, _ = waiting_run
    bo = served.client("t-u2")
    assert status_of(lambda: bo.threads.get(thread_id)) == 403
    assert status_of(lambda: bo.threads.get_state(thread_id)) == 403
    assert status_of(lambda: served.client("t-u1").threads.get(thread_id)) == 200
    assert thread_id not in {t["thread_id"] for t in bo.threads.search()}


def test_a_customer_starts_runs_about_their_own_orders_only(served: Served) -> None:
    assert status_of(lambda: start_run(served.client("t-u2"), TASK_O42)) == 403
    assert status_of(lambda: start_run(served.client("t-a1"), TASK_O42)) == 403  # they decide


def test_only_approvers_see_the_inbox(served: Served, waiting_run: tuple[str, Any]) -> None:
    thread_id, waiting = waiting_run
    as_customer = httpx.get(
        f"{served.url}/inbox/api/approvals",
        headers={"Authorization": "Bearer t-u1"},
        verify=tls.context(),
    )
    assert as_customer.status_code == 403
    listed = httpx.get(
        f"{served.url}/inbox/api/approvals",
        headers={"Authorization": "Bearer t-a1"},
        verify=tls.context(),
    )
    assert listed.status_code == 200
    (item,) = [a for a in listed.json()["approvals"] if a["thread_id"] == thread_id]
    request = waiting["interrupts"][0]["value"]
    assert item["summary"] == request["summary"] and item["digest"] == request["digest"]
    assert (item["args"]["amount"], item["args"]["currency"]) == ("80.00", "USD")
    assert item["editable"] == ["amount", "reason"]
    assert item["expires_at"] and item["expired"] is False
    assert item["interrupt_id"] == waiting["interrupts"][0]["id"]


def test_the_inbox_lists_every_waiting_run_of_the_approvers_tenant(served: Served) -> None:
    """The inbox reads which runs wait for an approval from lw_runs and their requests from the
    runs' own checkpoints (not a search of the engine's threads, which stops at its limit and,
    on Aegra, carries no interrupts): every waiting run of the approver's tenant, none of
    another tenant's, nothing for a customer."""
    threads = []
    for order in ("O-951", "O-952", "O-953"):
        create_order(served.services, order, "u-1", "80.00")
        task = f"Check whether order {order} can be refunded and refund it if so."
        threads.append(start_run(served.client("t-u1"), task)[0])
    waiting = served.sql("SELECT run_id FROM lw_runs WHERE phase = 'WAITING_APPROVAL'")
    assert set(threads) <= {run_id for (run_id,) in waiting}

    def listed(token: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{served.url}/inbox/api/approvals", headers=headers, verify=tls.context())

    approvals = listed("t-a1").json()["approvals"]
    assert set(threads) <= {a["thread_id"] for a in approvals}
    assert all(a["interrupt_id"] and a["digest"] for a in approvals)
    assert not set(threads) & {a["thread_id"] for a in listed("t-bank-b").json()["approvals"]}
    assert listed("t-u2").status_code == 403


def test_an_approver_cannot_approve_their_own_run(served: Served) -> None:
    """a-2 is a customer and an approver: their own run's approval is refused everywhere."""
    create_order(served.services, "O-900", "a-2", "80.00")
    al = served.client("t-a2")
    task = "Check whether order O-900 can be refunded and refund it if so."
    thread_id, waiting = start_run(al, task)
    interrupt = waiting["interrupts"][0]
    own = decision_for(interrupt, "approve", "a-2")
    assert status_of(lambda: al.runs.wait(thread_id, GRAPH, command={"resume": own})) == 403
    headers = {"Authorization": "Bearer t-a2"}
    inbox = httpx.get(
        f"{served.url}/inbox/api/approvals", headers=headers, verify=tls.context()
    ).json()["approvals"]
    assert thread_id not in {a["thread_id"] for a in inbox}
    decided = httpx.post(
        f"{served.url}/inbox/api/decisions",
        headers=headers,
        json={"thread_id": thread_id, "interrupt_id": interrupt["id"], "decision": "approve"},
        verify=tls.context(),
    )
    assert decided.status_code == 403
    state = al.threads.get_state(thread_id)
    assert state["next"] == ["approval"] and list_refunds(served.services, "O-900") == []


def test_an_approvers_resume_that_is_no_decision_is_refused_saying_why(served: Served) -> None:
    """An approver (who starts no runs) resuming with text or a list of decisions is told what
    a decision looks like (403), not "only customers start runs"; a decision the run would not
    take (no digest, an unknown choice, a field no decision has) is a 422 saying which field,
    and one about another action or an approval that does not wait a 409, where each was a 200
    with the run still waiting. The approval waits on throughout."""
    create_order(served.services, "O-901", "u-1", "80.00")
    task = "Check whether order O-901 can be refunded and refund it if so."
    thread_id, waiting = start_run(served.client("t-u1"), task)
    [interrupt] = waiting["interrupts"]
    decision = decision_for(interrupt, "approve", "a-1")[interrupt["id"]]
    refused: list[tuple[Any, int, str]] = [
        ("approve", 403, "an approver's resume is a decision"),
        ([decision], 403, "an approver's resume is a decision"),
        ({}, 403, "an approver's resume is a decision"),
        ({"approval_id": decision["approval_id"]}, 422, "bad decision: digest: Field required"),
        ({**decision, "decision": "maybe"}, 422, "bad decision: decision: Input should be"),
        ({interrupt["id"]: {**decision, "amount": "1.00"}}, 422, "amount: Extra inputs"),
        # Well formed, and not what waits: the run would re-ask, the client be told 200.
        ({**decision, "digest": "0" * 64}, 409, "not that of the action approval apr_"),
        ({interrupt["id"]: {**decision, "approval_id": "apr_0"}}, 409, "apr_0 does not wait"),
    ]
    for resume, status, detail in refused:
        answer = post_run(
            served, "t-a1", thread_id, {"assistant_id": GRAPH, "command": {"resume": resume}}
        )
        assert answer.status_code == status, (resume, answer.text)
        assert detail in answer.json()["detail"] and "\n" not in answer.json()["detail"]
    state = served.client("t-a1").threads.get_state(thread_id)
    assert state["next"] == ["approval"] and list_refunds(served.services, "O-901") == []
    assert [i["id"] for i in state["interrupts"]] == [interrupt["id"]]


def test_an_approver_edits_the_amount_in_the_inbox_then_approves_the_edit(served: Served) -> None:
    create_order(served.services, "O-802", "u-1", "80.00")
    task = "Check whether order O-802 can be refunded and refund it if so."
    thread_id, waiting = start_run(served.client("t-u1"), task)
    interrupt = waiting["interrupts"][0]
    headers = {"Authorization": "Bearer t-a1"}

    def post(
        decision: str, interrupt_id: str, token: str = "t-a1", **changes: str
    ) -> httpx.Response:
        body = {"thread_id": thread_id, "interrupt_id": interrupt_id, "decision": decision}
        return httpx.post(
            f"{served.url}/inbox/api/decisions",
            headers={"Authorization": f"Bearer {token}"},
            json={**body, "changes": changes},
            timeout=PATIENCE_S,
            verify=tls.context(),
        )

    refused = post("edit", interrupt["id"], iban="DE00")
    assert refused.status_code == 422 and "cannot edit iban" in refused.json()["detail"]
    assert post("approve", interrupt["id"], amount="1.00").status_code == 422
    # An edit the write could not be planned with is refused in place; the approval waits on.
    for bad in ("abc", "-5", "500.00"):
        invalid = post("edit", interrupt["id"], amount=bad)
        assert invalid.status_code == 422, invalid.text
        assert "still waits for a decision" in invalid.json()["detail"]
    held = post("edit", interrupt["id"], amount="4\u00000.00")  # no run could keep it
    assert held.status_code == 422 and "holds a NUL character" in held.json()["detail"], held.text
    listed = httpx.get(
        f"{served.url}/inbox/api/approvals", headers=headers, verify=tls.context()
    ).json()
    assert [a["interrupt_id"] for a in listed["approvals"] if a["thread_id"] == thread_id] == [
        interrupt["id"]
    ]
    assert post("edit", interrupt["id"], amount="40.00").status_code == 200

    # The decision route waits for the run: the edited action's request is listed at once.
    listed = httpx.get(
        f"{served.url}/inbox/api/approvals", headers=headers, verify=tls.context()
    ).json()
    [item] = [a for a in listed["approvals"] if a["thread_id"] == thread_id]
    assert item["summary"] == "Refund 40.00 USD to order O-802 (edited by a-1)"
    assert item["interrupt_id"] != interrupt["id"] and item["args"]["amount"] == "40.00"
    assert item["edited_by"] == ["a-1"]
    # Separation of duties: the editor cannot approve the edit; another approver can.
    own = post("approve", item["interrupt_id"])
    assert own.status_code == 422
    assert own.json()["detail"] == (
        f"a-1 edited {item['approval_id']} and cannot also approve it: another approver must "
        f"(separation of duties); {item['approval_id']} still waits for a decision"
    )
    assert post("approve", item["interrupt_id"], token="t-a2").status_code == 200

    final = wait_for_end(served.client("t-u1"), thread_id)["values"]
    assert final["stop_reason"] == "completed"
    assert [r["amount"] for r in list_refunds(served.services, "O-802")] == ["40.00"]


def test_nobody_writes_a_threads_state_through_the_api(
    served: Served, waiting_run: tuple[str, Any]
) -> None:
    thread_id, _ = waiting_run
    forged = {"approvals": [{"approval_id": "x", "decision": "approve"}]}
    for token in ("t-u1", "t-a1"):
        update = functools.partial(served.client(token).threads.update_state, thread_id, forged)
        assert status_of(update) == 403


def test_a_customer_cannot_restart_their_waiting_run_in_another_checkpoint_namespace(
    served: Served,
) -> None:
    """A new run on the same thread under a namespace of the client's choosing would read an
    empty state there, start over and bury the approval that waits: refused, state untouched."""
    create_order(served.services, "O-804", "u-1", "80.00")
    thread_id, waiting = start_run(served.client("t-u1"), "Refund order O-804 if it can be.")
    ada = served.client("t-u1")
    attempts: list[Callable[[], Any]] = [
        functools.partial(
            ada.runs.wait,
            thread_id,
            GRAPH,
            input={"task": "Refund order O-804 now."},
            config={"configurable": {"checkpoint_ns": "x"}},
        ),
        functools.partial(
            ada.runs.wait,
            thread_id,
            GRAPH,
            input={"task": "Refund order O-804 now."},
            checkpoint={"checkpoint_ns": "x"},
        ),
    ]
    for attempt in attempts:
        assert status_of(attempt) == 422  # fields the edge does not take from a client
    after = ada.threads.get_state(thread_id)
    assert [i["id"] for i in after["interrupts"]] == [i["id"] for i in waiting["interrupts"]]
    assert values_of(ada, thread_id)["task"] == waiting["values"]["task"]
    [(status,)] = served.sql("SELECT status FROM lw_actions WHERE run_id = %s", thread_id)
    assert status == "NEEDS_APPROVAL"


def test_nobody_erases_the_record_of_a_run_with_journaled_actions(served: Served) -> None:
    create_order(served.services, "O-805", "u-1", "80.00")
    ada, ann = served.client("t-u1"), served.client("t-a1")
    thread_id, waiting = start_run(ada, "Check whether order O-805 can be refunded and refund it.")
    ann.runs.wait(
        thread_id,
        GRAPH,
        command={"resume": decision_for(waiting["interrupts"][0], "approve", "a-1")},
    )
    checkpoints = served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id)
    runs = ada.runs.list(thread_id)
    for token in ("t-u1", "t-a1"):
        client = served.client(token)
        for run in runs:
            assert status_of(functools.partial(client.runs.delete, thread_id, run["run_id"])) in (
                403,
                404,
            )
        assert status_of(functools.partial(client.threads.delete, thread_id)) in (403, 404)
    rollback = functools.partial(
        ada.runs.create,
        thread_id,
        GRAPH,
        input={"task": "Check whether order O-805 can be refunded and refund it."},
        multitask_strategy="rollback",
    )
    assert status_of(rollback) == 422
    assert (
        served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id)
        == checkpoints
    )
    assert values_of(ada, thread_id)["stop_reason"] == "completed"
    assert [r["amount"] for r in list_refunds(served.services, "O-805")] == ["80.00"]


def test_an_approver_the_agent_does_not_take_is_a_403_on_every_decision_route(
    served: Served,
) -> None:
    """The token says approver, the agent's own rule does not: the inbox and the SDK's route
    both refuse the decision (403) before anything is claimed, and the approval still waits for
    a real approver, who decides it at once."""
    create_order(served.services, "O-806", "u-1", "80.00")
    thread_id, waiting = start_run(served.client("t-u1"), "Refund order O-806 if it can be.")
    [interrupt] = waiting["interrupts"]
    body = {"thread_id": thread_id, "interrupt_id": interrupt["id"], "decision": "approve"}
    ignored = httpx.post(
        f"{served.url}/inbox/api/decisions",
        headers={"Authorization": "Bearer t-u2-approver"},
        json=body,
        verify=tls.context(),
    )
    assert ignored.status_code == 403, ignored.text
    assert "u-2 is not an approver" in ignored.json()["detail"]
    through_sdk = post_run(
        served,
        "t-u2-approver",
        thread_id,
        {"assistant_id": GRAPH, "command": {"resume": decision_for(interrupt, "approve", "u-2")}},
    )
    assert through_sdk.status_code == 403, through_sdk.text
    assert "u-2 is not an approver" in through_sdk.json()["detail"]
    [still] = served.client("t-u1").threads.get_state(thread_id)["interrupts"]
    assert still["value"]["approval_id"] == interrupt["value"]["approval_id"]  # still waiting
    decided = httpx.post(
        f"{served.url}/inbox/api/decisions",
        headers={"Authorization": "Bearer t-a1"},
        json={**body, "interrupt_id": still["id"]},
        verify=tls.context(),
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["result"]["stop_reason"] == "completed"


def test_an_approver_of_another_tenant_sees_and_decides_nothing_of_this_one(
    served: Served,
) -> None:
    create_order(served.services, "O-807", "u-1", "80.00")
    thread_id, waiting = start_run(served.client("t-u1"), "Refund order O-807 if it can be.")
    [interrupt] = waiting["interrupts"]
    other = served.client("t-bank-b")
    headers = {"Authorization": "Bearer t-bank-b"}
    listed = httpx.get(
        f"{served.url}/inbox/api/approvals", headers=headers, verify=tls.context()
    ).json()
    assert [a for a in listed["approvals"] if a["thread_id"] == thread_id] == []
    assert status_of(functools.partial(other.threads.get_state, thread_id)) in (403, 404)
    assert all(t["thread_id"] != thread_id for t in other.threads.search(limit=100))
    decide = functools.partial(
        other.runs.wait,
        thread_id,
        GRAPH,
        command={"resume": decision_for(interrupt, "approve", approver="a-1")},
    )
    assert status_of(decide) in (403, 404)
    [(status,)] = served.sql("SELECT status FROM lw_actions WHERE run_id = %s", thread_id)
    assert status == "NEEDS_APPROVAL"


def test_a_pruned_run_is_never_started_over_through_the_api(served: Served) -> None:
    """The retention job prunes a served run like any other: its summary and journal stay, its
    checkpoints go. The thread then reads as empty (not a server error), and a new run on it, or
    a decision, is refused (410): it would start the run over from an empty state."""
    create_order(served.services, "O-808", "u-1", "80.00")
    ada, ann = served.client("t-u1"), served.client("t-a1")
    task = "Check whether order O-808 can be refunded and refund it."
    thread_id, waiting = start_run(ada, task)
    ann.runs.wait(
        thread_id,
        GRAPH,
        command={"resume": decision_for(waiting["interrupts"][0], "approve", "a-1")},
    )
    run_id = values_of(ada, thread_id)["run_id"]
    assert run_id in [run.run_id for run in retain(served.database_url, 0).pruned]

    assert ada.threads.get_state(thread_id)["values"] == {}
    again = functools.partial(ada.runs.create, thread_id, GRAPH, input={"task": task})
    assert status_of(again) == 410
    decision = decision_for(waiting["interrupts"][0], "approve", "a-1")
    assert (
        status_of(
            functools.partial(ann.runs.create, thread_id, GRAPH, command={"resume": decision})
        )
        == 410
    )
    assert served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id) == [(0,)]
    assert served.sql("SELECT stop_reason FROM lw_run_summaries WHERE run_id = %s", run_id) == [
        ("completed",)
    ]
    assert served.sql("SELECT status FROM lw_actions WHERE run_id = %s", run_id) == [("SUCCEEDED",)]
    assert [r["amount"] for r in list_refunds(served.services, "O-808")] == ["80.00"]


def test_text_no_run_could_keep_is_a_422_and_starts_nothing(served: Served) -> None:
    """A task that is blank, too long, or holds what no store keeps (a NUL character; half a
    character, which the JSON body may spell as a lone surrogate escape), and metadata that
    holds a NUL (it goes into every checkpoint), are refused when the run is created."""
    ada = served.client("t-u1")
    thread_id = ada.threads.create()["thread_id"]
    refused: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
        ({"task": "Check order O-42\u0000 and refund it."}, None),
        ({"task": "  "}, None),
        ({"task": "Check order O-42. " + "x" * 2000}, None),
        ({"task": TASK_O42}, {"note": "from \u0000 the app"}),
    ]
    for run_input, metadata in refused:
        create = functools.partial(
            ada.runs.create, thread_id, GRAPH, input=run_input, metadata=metadata
        )
        assert status_of(create) == 422, run_input
    # The SDK cannot spell half a character; a client writing its own JSON can.
    body = b'{"assistant_id": "loopwright", "input": {"task": "Check order O-42 \\ud800."}}'
    raw = httpx.post(
        f"{served.url}/threads/{thread_id}/runs",
        content=body,
        headers={"Authorization": "Bearer t-u1", "Content-Type": "application/json"},
        verify=tls.context(),
    )
    assert 400 <= raw.status_code < 500, raw.text
    assert served.sql("SELECT count(*) FROM lw_runs WHERE run_id = %s", thread_id) == [(0,)]
    assert served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id) == [(0,)]
    assert status_of(lambda: ada.runs.wait(thread_id, GRAPH, input={"task": TASK_O42})) == 200


def test_an_input_that_is_no_run_is_a_422_that_says_what_a_new_run_takes(served: Served) -> None:
    """Text, a list, an object without a task, nothing, or a resume on a thread without a run:
    refused when the run is created, saying what a run takes (each was a 200 carrying "An
    internal error occurred"), and nothing is written."""
    thread_id = served.client("t-u1").threads.create()["thread_id"]
    for run_input in ("Check order O-42.", [TASK_O42], {}, {"tasks": TASK_O42}, None):
        response = post_run(served, "t-u1", thread_id, {"assistant_id": GRAPH, "input": run_input})
        assert response.status_code == 422, (run_input, response.text)
        assert response.json()["detail"].endswith('a new run takes {"task": "<what to do>"}')
    # A resume of no run: there is nothing to continue either (it was a run failing in the
    # engine, the thread left in error).
    for resume in ("yes", {"answer": 1}):
        response = post_run(
            served, "t-u1", thread_id, {"assistant_id": GRAPH, "command": {"resume": resume}}
        )
        assert response.status_code == 422, (resume, response.text)
        assert "the thread has no run to continue" in response.json()["detail"]
    assert served.client("t-u1").threads.get(thread_id)["status"] == "idle"
    assert served.sql("SELECT count(*) FROM lw_runs WHERE run_id = %s", thread_id) == [(0,)]
    assert served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id) == [(0,)]


def test_another_task_on_a_thread_that_carries_a_run_is_a_409_and_changes_nothing(
    served: Served,
) -> None:
    """A thread is one run: another task on it is refused when the run is created (it was a 200
    carrying "An internal error occurred", and the thread of a finished run was left in error,
    with a traceback in the server's log). The same task again continues the run, as a start
    delivered twice does."""
    ada = served.client("t-u1")
    task = "What is the refund policy?"
    thread_id, state = start_run(ada, task)
    assert state["values"]["stop_reason"] == "completed"
    runs = ada.runs.list(thread_id)
    checkpoints = served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id)
    for route in ("runs", "runs/wait", "runs/stream"):
        other_task = {"assistant_id": GRAPH, "input": {"task": "Refund order O-42."}}
        response = post_run(served, "t-u1", thread_id, other_task, route)
        assert response.status_code == 409, (route, response.text)
        assert "already carries a run of another task" in response.json()["detail"]
    assert ada.runs.list(thread_id) == runs
    assert ada.threads.get(thread_id)["status"] == "idle"
    assert served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id) == (
        checkpoints
    )
    again = ada.runs.wait(thread_id, GRAPH, input={"task": f"  {task} "})
    assert isinstance(again, dict) and again["stop_reason"] == "completed", again
    assert served.sql("SELECT count(*) FROM lw_runs WHERE run_id = %s", thread_id) == [(1,)]


def test_what_a_client_has_copied_into_every_checkpoint_is_bounded(served: Served) -> None:
    """LangGraph copies a run's metadata and configurable strings into every checkpoint's
    metadata: 8 KB of them made each of a one-step run's 13 checkpoints carry 8.7 KB. An input
    or a resume value is kept whole (a resume value as a write): each is bounded too."""
    ada = served.client("t-u1")
    task = {"task": "Read order O-42 and tell me its status."}
    big_thread = functools.partial(ada.threads.create, metadata={"mine": "y" * 1_100})
    assert status_of(big_thread) == 422  # a thread's metadata is copied into its checkpoints too
    thread_id = ada.threads.create(metadata={"team": "support"})["thread_id"]
    for extra in (
        {"metadata": {"mine": "y" * 1_100}},
        {"config": {"configurable": {"big": "x" * 1_100}}},
        {"metadata": {"a": "y" * 600}, "config": {"configurable": {"b": "x" * 600}}},
    ):
        create = functools.partial(ada.runs.create, thread_id, GRAPH, input=task, **extra)
        assert status_of(create) == 422, extra
    for big in ({"input": {**task, "notes": "z" * 17_000}}, {"command": {"resume": "z" * 17_000}}):
        create = functools.partial(ada.runs.create, thread_id, GRAPH, **big)
        assert status_of(create) == 422
    assert served.sql("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread_id) == [(0,)]
    # A task of 2,000 characters fits, whatever they are.
    wide = {"task": "Read order O-42 and tell me its status. " + "\U0001f600" * 1_900}
    ada.runs.wait(thread_id, GRAPH, input=wide, metadata={"source_app": "crm"})
    kept = served.sql(
        "SELECT DISTINCT metadata->>'source_app' FROM checkpoints WHERE thread_id = %s", thread_id
    )
    assert kept == [("crm",)]


def test_a_run_is_a_thread_nothing_is_started_without_one(served: Served) -> None:
    """A stateless run (its thread deleted as it stops: a waiting approval nobody could decide)
    and a run that creates its own thread are refused before anything is written."""
    create_order(served.services, "O-970", "u-1", "80.00")
    ada = served.client("t-u1")
    task = {"task": "Check whether order O-970 can be refunded and refund it if so."}
    before = served.sql("SELECT count(*) FROM lw_runs")
    for start in (
        lambda: ada.runs.wait(None, GRAPH, input=task),
        lambda: ada.runs.create(None, GRAPH, input=task),
        lambda: ada.runs.wait(str(uuid.uuid4()), GRAPH, input=task, if_not_exists="create"),
    ):
        try:
            start()
        except httpx.HTTPStatusError as exc:
            assert exc.response.status_code == 422, exc.response.text
            assert "create one first" in exc.response.text
        else:
            raise AssertionError("a run without a thread was started")
    assert served.sql("SELECT count(*) FROM lw_runs") == before


def test_no_customer_holds_up_another_customers_run(served: Served) -> None:
    """LangGraph's server runs a bounded number of runs at once and looks past no queued run
    whose thread is busy. u-1 keeps as many runs in flight as one user may (their refunds' sends
    held up by the payment service), then asks for one more (429) and for another behind a
    busy thread (409, whatever the strategy; a delayed one, 422): u-2's new run starts while
    all of u-1's are still in flight, not after them."""
    orders = [f"O-97{i}" for i in range(1, 6)]
    for order_id in orders:
        create_order(served.services, order_id, "u-1", "20.00")
    create_order(served.services, "O-979", "u-2", "20.00")
    ada, ben = served.client("t-u1"), served.client("t-u2")

    def task(order_id: str) -> dict[str, str]:
        return {"task": f"Check whether order {order_id} can be refunded and refund it if so."}

    slow_down(served.services.payments, 8.0, methods=("POST",))
    try:
        threads = [ada.threads.create()["thread_id"] for _ in orders]
        for thread, order_id in zip(threads[:3], orders, strict=False):
            ada.runs.create(thread, GRAPH, input=task(order_id))
        in_flight = threads[:3]
        journaled = "SELECT count(DISTINCT run_id) FROM lw_actions WHERE run_id = ANY(%s)"
        # Each one waits on its refund's send.
        wait_for(lambda: served.sql(journaled, in_flight) == [(len(in_flight),)])
        queue: Callable[..., Any] = functools.partial(
            ada.runs.create, threads[0], GRAPH, input=task(orders[0])
        )
        assert status_of(queue) == 409  # LangGraph's default strategy: enqueue
        assert status_of(functools.partial(queue, multitask_strategy="enqueue")) == 409
        assert status_of(functools.partial(queue, after_seconds=1)) == 422
        one_more = functools.partial(ada.runs.create, threads[3], GRAPH, input=task(orders[3]))
        assert status_of(one_more) == 429
        other = ben.threads.create()["thread_id"]
        started = time.monotonic()
        ben.runs.create(other, GRAPH, input=task("O-979"))
        wait_for(lambda: bool(served.sql("SELECT 1 FROM lw_runs WHERE run_id = %s", other)))
        waited = time.monotonic() - started
        phases = served.sql("SELECT phase FROM lw_runs WHERE run_id = ANY(%s)", in_flight)
        assert ("COMPLETED",) not in phases, "u-2's run started only once u-1's had ended"
        print(f"\nu-2's run started {waited:.2f} s after it was asked for, u-1's in flight")
    finally:
        slow_down(served.services.payments, 0, methods=("POST",))
    for thread in (*in_flight, other):
        wait_for_end(served.client("t-a1"), thread)


def test_an_approver_clears_the_inbox_faster_than_its_runs_end(served: Served) -> None:
    """The runs an approver resumes are their customers', not the approver's: deciding more
    approvals than one user may have runs in flight, while every decided run is still held up by
    the payment service, is a 200 each (before: the fourth was a 429, the approver's own bound).
    They count as the customer's runs in flight: the customer's next run waits (429); another
    customer's does not."""
    orders = [f"O-93{i}" for i in range(PER_PRINCIPAL + 1)]
    for order_id in orders:
        create_order(served.services, order_id, "u-1", "80.00")  # each needs an approval
    create_order(served.services, "O-939", "u-1", "20.00")
    create_order(served.services, "O-938", "u-2", "20.00")
    ada, ann, ben = served.client("t-u1"), served.client("t-a1"), served.client("t-u2")
    waiting = [start_run(ada, task_about(order_id)["task"]) for order_id in orders]
    slow_down(served.services.payments, 8.0, methods=("POST",))
    try:
        for thread_id, state in waiting:
            [interrupt] = state["interrupts"]
            approval = decision_for(interrupt, "approve", approver="a-1")
            ann.runs.create(thread_id, GRAPH, command={"resume": approval})
        decided = [thread_id for thread_id, _ in waiting]
        journaled = "SELECT count(DISTINCT run_id) FROM lw_actions WHERE run_id = ANY(%s)"
        wait_for(lambda: served.sql(journaled, decided) == [(len(decided),)])
        theirs = ada.threads.create()["thread_id"]
        assert status_of(lambda: ada.runs.create(theirs, GRAPH, input=task_about("O-939"))) == 429
        other = ben.threads.create()["thread_id"]
        ben.runs.create(other, GRAPH, input=task_about("O-938"))
        assert ("COMPLETED",) not in served.sql(
            "SELECT phase FROM lw_runs WHERE run_id = ANY(%s)", decided
        ), "the decided runs ended before the customer's next run was asked for"
    finally:
        slow_down(served.services.payments, 0, methods=("POST",))
    for thread_id in (*decided, other):
        assert wait_for_end(ann, thread_id)["values"]["stop_reason"] == "completed"
    assert all(len(list_refunds(served.services, order_id)) == 1 for order_id in orders)


def test_the_inbox_page_runs_only_its_own_script_in_no_frame(served: Served) -> None:
    """A page that framed the inbox could lay its own buttons over an approver's; an injected
    script would act with their token. The page allows its own inline script and style only
    (by their hashes), talks to its own origin only, and may be framed by nobody."""
    page = httpx.get(f"{served.url}/inbox", verify=tls.context())
    assert page.headers["x-frame-options"] == "DENY"
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    assert "unsafe-inline" not in policy and "connect-src 'self'" in policy
    [script] = re.findall(r"<script>(.*?)</script>", page.text, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy


def test_the_same_user_id_in_another_tenant_is_another_principal(served: Served) -> None:
    """u-1 of tenant bank-b is not u-1 of the default tenant: it neither refunds their orders
    (the reference business keeps the default tenant's) nor reads their runs."""
    create_order(served.services, "O-990", "u-1", "30.00")
    task = "Check whether order O-990 can be refunded and refund it if so."
    theirs, _ = start_run(served.client("t-u1"), task)
    impostor = served.client("t-bank-b-u1")
    thread = impostor.threads.create()["thread_id"]
    assert status_of(lambda: impostor.runs.wait(thread, GRAPH, input={"task": task})) == 403
    assert served.sql("SELECT 1 FROM lw_runs WHERE run_id = %s", thread) == []
    assert status_of(lambda: impostor.threads.get_state(theirs)) == 404
    assert len(list_refunds(served.services, "O-990")) == 1  # u-1's own, under the threshold


def test_a_decision_nested_past_any_decision_is_a_422(served: Served) -> None:
    """JSON nested deeper than the parser recurses was a 500 from the inbox's decision route;
    a body past any decision's size is a 413 before it is read."""
    headers = {"Authorization": "Bearer t-a1", "Content-Type": "application/json"}
    for depth, status, said in ((5_000, 422, "JSON"), (100_000, 413, "at most")):
        body = "[" * depth + "]" * depth
        answer = httpx.post(
            f"{served.url}/inbox/api/decisions", content=body, headers=headers, verify=tls.context()
        )
        assert answer.status_code == status, answer.text
        assert said in answer.json()["detail"]


def test_a_decision_the_request_does_not_allow_is_a_422_through_the_api(served: Served) -> None:
    """Through the server's own API as through the inbox: an edit of an argument the write
    keeps fixed, an edit its rules refuse, and an approval by the approver who edited the
    action are each a 422, and the approval still waits (before: 200, and the run ended the
    action not done, or asked again)."""
    create_order(served.services, "O-991", "u-1", "80.00")
    task = "Check whether order O-991 can be refunded and refund it if so."
    thread_id, state = start_run(served.client("t-u1"), task)
    [interrupt] = state["interrupts"]
    ann = served.client("t-a1")

    def decide(decision: str, **args: str) -> int:
        [(key, value)] = decision_for(interrupt, decision, "a-1").items()
        edited = {**interrupt["value"]["args"], **args} if args else None
        body = {key: {**value, **({"args": edited} if edited else {})}}
        return status_of(lambda: ann.runs.wait(thread_id, GRAPH, command={"resume": body}))

    assert decide("edit", order_id="O-42") == 422  # not an editable argument
    assert decide("edit", amount="900.00") == 422  # more than the order's refundable balance
    assert values_of(ann, thread_id)["phase"] == "WAITING_APPROVAL"
    assert decide("edit", amount="40.00") == 200  # the edited refund waits for another approver
    [interrupt] = ann.threads.get_state(thread_id)["interrupts"]
    assert interrupt["value"]["args"]["amount"] == "40.00"
    assert decide("approve") == 422  # whoever edited an action cannot approve it
    assert values_of(ann, thread_id)["phase"] == "WAITING_APPROVAL"


DECISION_ROUTES = (("sdk", "sdk"), ("inbox", "sdk"), ("inbox", "inbox"))


def decide_through(
    url: str, route: str, thread_id: str, interrupt: dict[str, Any], decision: str, approver: str
) -> tuple[int, str]:
    """One approver's decision through a route ("inbox": the inbox's JSON route; "sdk": a resume
    run through the server's own API); the HTTP status and the answer's text."""
    token = {"a-1": "t-a1", "a-2": "t-a2"}[approver]
    headers = {"Authorization": f"Bearer {token}"}
    if route == "inbox":
        body = {
            "thread_id": thread_id,
            "interrupt_id": interrupt["id"],
            "approval_id": interrupt["value"]["approval_id"],  # as the inbox's page sends it
            "decision": decision,
        }
        comment = {"comment": "not this one"} if decision == "reject" else {}
        answer = httpx.post(
            f"{url}/inbox/api/decisions",
            json=body | comment,
            headers=headers,
            timeout=120,
            verify=tls.context(),
        )
        return answer.status_code, answer.text
    client = sdk_client(url=url, headers=headers, timeout=120)
    try:
        client.runs.wait(
            thread_id, GRAPH, command={"resume": decision_for(interrupt, decision, approver)}
        )
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code, exc.response.text
    return 200, ""


def two_decisions_at_once(
    urls: tuple[str, str], routes: tuple[str, str], thread_id: str, interrupt: dict[str, Any]
) -> list[tuple[int, str]]:
    """a-1 approves through the first route and server, a-2 rejects through the second, both
    sent at the same moment."""
    barrier = threading.Barrier(2)

    def one(i: int) -> tuple[int, str]:
        decision, approver = (("approve", "a-1"), ("reject", "a-2"))[i]
        barrier.wait()
        return decide_through(urls[i], routes[i], thread_id, interrupt, decision, approver)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, (0, 1)))


def one_decision_taken(
    answers: list[tuple[int, str]], values: dict[str, Any], refunds: int, approval_id: str
) -> None:
    """Of two decisions at once, the run took the one told 200; the other was told 409."""
    assert sorted(status for status, _ in answers) == [200, 409], answers
    [loser] = [text for status, text in answers if status == 409]
    told = ("decided already", "no longer pending", "does not wait on this run")
    assert any(words in loser for words in told), loser
    taken = [r for r in values["approvals"] if r["approval_id"] == approval_id]
    winner = ("approve", "reject")[[status for status, _ in answers].index(200)]
    assert [r["decision"] for r in taken] == [winner]
    assert refunds == (1 if winner == "approve" else 0)


@pytest.mark.parametrize("routes", DECISION_ROUTES, ids="+".join)
def test_two_approvers_deciding_at_once_are_told_200_and_409(
    served: Served, routes: tuple[str, str]
) -> None:
    """An approval authorises one decision: a-1's approval and a-2's rejection sent at the same
    moment, through any pair of decision routes, are one 200 (the decision the run took) and
    one 409, never two 200s with one of them dropped."""
    order_id = f"O-96{DECISION_ROUTES.index(routes)}"
    create_order(served.services, order_id, "u-1", "80.00")
    thread_id, state = start_run(
        served.client("t-u1"),
        f"Check whether order {order_id} can be refunded and refund it if so.",
    )
    [interrupt] = state["interrupts"]
    answers = two_decisions_at_once((served.url, served.url), routes, thread_id, interrupt)
    values = wait_for_end(served.client("t-u1"), thread_id)["values"]
    refunds = len(list_refunds(served.services, order_id))
    one_decision_taken(answers, values, refunds, interrupt["value"]["approval_id"])


def test_a_decision_in_the_inbox_after_another_is_told_who_decided(served: Served) -> None:
    """The inbox's page names the approval it showed: an approver who decides after another
    did is told who decided it, and when (409), not only that nothing waits."""
    create_order(served.services, "O-985", "u-1", "80.00")
    task = "Check whether order O-985 can be refunded and refund it if so."
    thread_id, state = start_run(served.client("t-u1"), task)
    [interrupt] = state["interrupts"]
    first = decide_through(served.url, "inbox", thread_id, interrupt, "approve", "a-1")
    assert first[0] == 200, first
    status, text = decide_through(served.url, "inbox", thread_id, interrupt, "reject", "a-2")
    assert status == 409 and "was decided already (approve by a-1 at" in text, text
    assert len(list_refunds(served.services, "O-985")) == 1


def test_nothing_tells_an_outsider_what_runs_or_which_threads_exist(served: Served) -> None:
    """Without a token the server says it is up and nothing else: not its versions, metrics or
    API (before: /info, /metrics, /docs answered anyone). With one, no answer tells whether a
    thread the caller may not see exists: a client-chosen thread id is a 422 whoever's it would
    be (before: 409 "already exists" for another's), and a copy is a 403 for every thread
    (before: 404 for another tenant's thread with a run, 409 for one that does not exist)."""
    for path in ("/info", "/metrics", "/docs", "/openapi.json"):
        assert httpx.get(f"{served.url}{path}", verify=tls.context()).status_code == 401, path
    for path in ("/", "/ok"):
        answer = httpx.get(f"{served.url}{path}", verify=tls.context())
        assert answer.status_code == 200 and "version" not in answer.text, (path, answer.text)
    assert httpx.get(
        f"{served.url}/info", headers={"Authorization": "Bearer t-u1"}, verify=tls.context()
    ).is_success

    create_order(served.services, "O-993", "u-1", "20.00")
    mine, _ = start_run(served.client("t-u1"), "Refund order O-993 if it can be.")
    theirs = served.client("t-bank-b-u1")
    for thread_id in (mine, str(uuid.uuid4())):  # another's thread, and one that does not exist
        for if_exists in ("raise", "do_nothing"):
            made = functools.partial(
                theirs.threads.create, thread_id=thread_id, if_exists=if_exists
            )
            assert status_of(made) == 422
        assert status_of(functools.partial(theirs.threads.copy, thread_id)) == 403
    assert status_of(lambda: served.client("t-u1").threads.copy(mine)) == 403
    assert status_of(lambda: theirs.threads.create()) == 200  # a thread of the server's id


# One customer's requests, and what each may be told: never a 5xx, never a run accepted
# behind a busy thread, delayed, or without a thread.
STALL_ANSWERS = {
    "start": {200, 429},  # a run on a new thread; 429 past one user's bound
    "queue": {409},  # behind their busy thread, with the server's default strategy
    "queue-enqueue": {409},
    "queue-reject": {409},
    "queue-interrupt": {422},  # a run in flight stops by its user's cancel only
    "queue-rollback": {422},  # would erase a run's record
    "delayed": {422},
    "threadless-wait": {422},
    "threadless-create": {422},
    "threadless-stream": {422},
    "cancel": {200, 204, 404, 409},
}
THREADLESS_ROUTES = {"wait": "/runs/wait", "create": "/runs", "stream": "/runs/stream"}


def task_about(order_id: str) -> dict[str, str]:
    return {"task": f"Check whether order {order_id} can be refunded and refund it if so."}


@dataclass
class Customer:
    """One customer's threads and runs as generated requests leave them."""

    client: SyncLangGraphClient
    url: str
    busy: str  # a thread whose run is in flight
    threads: list[str]
    started: list[tuple[str, str]]  # runs they started besides the busy one: (thread, run)

    def request(self, operation: str, order_id: str, rng: random.Random) -> int:
        """Send one generated request; the HTTP status it was answered with."""
        kind, _, variant = operation.partition("-")
        new_run = functools.partial(self.client.runs.create, input=task_about(order_id))
        if kind in ("start", "delayed"):
            thread = self.client.threads.create()["thread_id"]
            self.threads.append(thread)
            if kind == "delayed":
                return status_of(functools.partial(new_run, thread, GRAPH, after_seconds=1))
            try:
                self.started.append((thread, new_run(thread, GRAPH)["run_id"]))
            except httpx.HTTPStatusError as exc:
                return exc.response.status_code
            return 200
        if kind == "queue":
            options = {"multitask_strategy": variant} if variant else {}
            return status_of(functools.partial(new_run, self.busy, GRAPH, **options))
        if kind == "threadless":
            return httpx.post(
                f"{self.url}{THREADLESS_ROUTES[variant]}",
                json={"assistant_id": GRAPH, **task_about(order_id)},
                headers={"Authorization": "Bearer t-u1"},
                timeout=30,
                verify=tls.context(),
            ).status_code
        if not self.started:
            return 404  # nothing of theirs to cancel
        thread, run_id = self.started[rng.randrange(len(self.started))]
        return status_of(functools.partial(self.client.runs.cancel, thread, run_id))


def test_no_ordering_of_one_customers_requests_holds_up_anyone_else(served: Served) -> None:
    """Generated orderings of one customer's requests (runs started, queued behind their busy
    thread with every multitask strategy, delayed, without a thread on every stateless route,
    cancelled), sent while their first run waits on its refund's send. LangGraph's server holds
    up everyone's runs behind a queued run whose thread is busy (it looks past none), so after
    each ordering: nothing of theirs is queued behind a busy thread, nothing was accepted
    delayed or without a thread, they hold no more runs than one user may; and another
    customer's new run and an approver's decision, asked for while u-1's runs are still in
    flight, start (neither is left pending behind them) and complete."""
    ada, ben, ann = served.client("t-u1"), served.client("t-u2"), served.client("t-a1")
    orderings = [(seed, random.Random(seed)) for seed in range(4)]
    generated = [
        (seed, rng, [rng.choice(list(STALL_ANSWERS)) for _ in range(6)]) for seed, rng in orderings
    ]
    for seed, _, operations in generated:
        for number in range(len(operations)):
            create_order(served.services, f"O-5{seed}{number}", "u-1", "20.00")
    for order_id, amount in (("O-590", "20.00"), ("O-591", "20.00"), ("O-580", "80.00")):
        create_order(served.services, order_id, "u-1" if order_id == "O-591" else "u-2", amount)
    waiting, state = start_run(ben, task_about("O-580")["task"])  # an approval, asked before
    [interrupt] = state["interrupts"]
    slow_down(served.services.payments, 8.0, methods=("POST",))
    try:
        busy = ada.threads.create()["thread_id"]
        ada.runs.create(busy, GRAPH, input=task_about("O-591"))
        journaled = "SELECT count(*) FROM lw_actions WHERE run_id = %s"
        wait_for(lambda: served.sql(journaled, busy) == [(1,)])  # waiting on its send
        customer = Customer(ada, served.url, busy, [busy], [])
        for seed, rng, operations in generated:
            answers = [
                (operation, customer.request(operation, f"O-5{seed}{number}", rng))
                for number, operation in enumerate(operations)
            ]
            unexpected = [(op, code) for op, code in answers if code not in STALL_ANSWERS[op]]
            assert not unexpected, f"{operations}: unexpected answers {unexpected}"
            for thread in customer.threads:  # at most one run not ended a thread: none queued
                statuses = [run["status"] for run in ada.runs.list(thread)]
                unended = [status for status in statuses if status in ("pending", "running")]
                assert len(unended) <= 1, f"{operations}: thread {thread} holds {statuses}"
    finally:
        slow_down(served.services.payments, 0, methods=("POST",))

    # Started at once: neither waits on a slot nor behind anything of u-1's.
    other = ben.threads.create()["thread_id"]
    asked = [(other, ben.runs.create(other, GRAPH, input=task_about("O-590"))["run_id"])]
    approve = decision_for(interrupt, "approve", "a-1")
    asked.append((waiting, ann.runs.create(waiting, GRAPH, command={"resume": approve})["run_id"]))
    since = time.monotonic()
    for thread, run_id in asked:
        wait_for(lambda: ann.runs.get(thread, run_id)["status"] != "pending", timeout=60)  # noqa: B023
    print(f"\nanother customer's run and a decision started {time.monotonic() - since:.2f} s on")
    for thread, _ in asked:
        values = wait_for_end(ann, thread)["values"]
        assert values["stop_reason"] == "completed", values.get("stop_detail")
    for thread in (busy, *(thread for thread, _ in customer.started)):
        if served.sql("SELECT 1 FROM lw_runs WHERE run_id = %s", thread):  # it got to start
            wait_for_end(ann, thread)


def test_the_inbox_reaches_its_server_at_no_address_a_request_names(served: Served) -> None:
    """A decision whose request names another host (`Host`, `X-Forwarded-Host`) and scheme
    (`X-Forwarded-Proto: https`, as a TLS-terminating proxy sends): the inbox calls its own
    server in process, so nothing connects to the named address (it once received the decision
    with the approver's token), and the decision is taken (https once made it a 500)."""
    create_order(served.services, "O-2301", "u-1", "80.00")
    task = "Check whether order O-2301 can be refunded and refund it if so."
    thread_id, waiting = start_run(served.client("t-u1"), task)
    [interrupt] = waiting["interrupts"]
    with socket.create_server(("127.0.0.1", 0)) as capture:
        capture.settimeout(0)
        named = f"127.0.0.1:{capture.getsockname()[1]}"
        decided = httpx.post(
            f"{served.url}/inbox/api/decisions",
            headers={
                "Authorization": "Bearer t-a1",
                "Host": named,
                "X-Forwarded-Host": named,
                "X-Forwarded-Proto": "https",
            },
            json={"thread_id": thread_id, "interrupt_id": interrupt["id"], "decision": "approve"},
            timeout=PATIENCE_S,
            verify=tls.context(),
        )
        with pytest.raises(BlockingIOError):
            capture.accept()  # nobody called the address the request named
    assert decided.status_code == 200, decided.text
    assert decided.json()["result"]["stop_reason"] == "completed"
