"""JWTs end to end on both served paths: `langgraph dev` (as `loopwright serve` runs it) and an
Aegra instance (`--engine aegra`), each taking the identity provider's keys from its loopback
JWKS URL. A customer's JWT starts a run that waits for an approval; an approver whose role and
tenant come from their JWT's claims decides it from the command line (`--server`, the inbox's
decision route); JWTs of another tenant see nothing of it; a JWT that is expired, or signed by
a key the provider does not publish, is a 401 saying so."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from langgraph_sdk.client import SyncLangGraphClient

from loopwright import tls
from loopwright.server.launch import server_env, start_server
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import create_order, list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.identity_provider import IdentityProvider, SigningKey
from tests.ports import reserved_port
from tests.runtime_fixtures import cli, sdk_client
from tests.test_aegra_scaleout import deployment, redis_reachable, refund_task
from tests.test_server_langgraph import GRAPH, status_of, values_of

pytestmark = pytest.mark.postgres

AEGRA_MISSING = importlib.util.find_spec("aegra_api") is None


@contextmanager
def langgraph_server(
    postgres_server_url: str, workdir: Path, identity_env: dict[str, str]
) -> Iterator[tuple[str, str, ServiceEndpoints]]:
    with (
        fresh_database(postgres_server_url, prefix="lw_test") as url,
        start_services(workdir / "services") as services,
    ):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPWRIGHT_TOK",))}
        env = server_env(
            {k: v for k, v in base.items() if k != "DATABASE_URL"},
            {"DATABASE_URL": url, **services.endpoints.to_env(), **identity_env},
        )
        with reserved_port() as port, start_server(workdir / "server", env, port=port) as server:
            yield server.url, url, services.endpoints


@contextmanager
def aegra_instance(
    postgres_server_url: str, workdir: Path, identity_env: dict[str, str]
) -> Iterator[tuple[str, str, ServiceEndpoints]]:
    with deployment(postgres_server_url, workdir) as cluster:
        instance = cluster.start_with("aegra-jwt", **identity_env)
        yield instance.url, cluster.database_url, cluster.services


SERVERS = {"langgraph": langgraph_server, "aegra": aegra_instance}


@pytest.mark.parametrize(
    "engine",
    [
        "langgraph",
        pytest.param(
            "aegra",
            marks=pytest.mark.skipif(
                AEGRA_MISSING or not redis_reachable(), reason="needs aegra-api and Redis"
            ),
        ),
    ],
)
def test_customers_and_approvers_by_their_jwts(
    engine: str, postgres_server_url: str, tmp_path: Path
) -> None:
    provider = IdentityProvider([SigningKey.new("key-1"), SigningKey.new("key-ec", "ES256")])
    with (
        provider.served() as jwks_url,
        SERVERS[engine](postgres_server_url, tmp_path, provider.env(jwks_url)) as served,
    ):
        url, database_url, services = served

        def client(token: str) -> SyncLangGraphClient:
            return sdk_client(url=url, headers={"Authorization": f"Bearer {token}"})

        def inbox(token: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.get(
                f"{url}/inbox/api/approvals", headers=headers, timeout=30, verify=tls.context()
            )

        order_id = f"O-7{len(engine)}"
        create_order(services, order_id, "u-1", "80.00")  # above the approval threshold
        ada = client(provider.token("u-1", ["customer"]))
        thread_id = ada.threads.create()["thread_id"]
        ada.runs.wait(thread_id, GRAPH, input={"task": refund_task(order_id)})
        [interrupt] = ada.threads.get_state(thread_id)["interrupts"]

        # Another tenant's JWTs, with the same user ids, see nothing of it.
        foreign_approver = provider.token("a-1", ["approver"], "bank-b", key=provider.keys[1])
        foreign_customer = provider.token("u-1", ["customer"], "bank-b")
        assert inbox(foreign_approver).json()["approvals"] == []
        for foreign in (client(foreign_approver), client(foreign_customer)):
            assert status_of(functools.partial(foreign.threads.get_state, thread_id)) == 404
            assert [t["thread_id"] for t in foreign.threads.search()] == []
        # A JWT the server cannot trust is a 401 saying why, on the API and the inbox.
        expired = provider.token("a-1", ["approver"], lifetime_s=-3600)
        refused = httpx.get(
            f"{url}/threads/{thread_id}",
            headers={"Authorization": f"Bearer {expired}"},
            verify=tls.context(),
        )
        assert refused.status_code == 401 and "the token has expired" in refused.text
        forged = provider.token("a-1", ["approver"], key=SigningKey.new("key-1"))
        assert inbox(forged).status_code == 401
        assert "signature does not verify" in inbox(forged).text

        # The approver of the tenant, by their JWT's claims, sees it and decides it.
        ann = provider.token("a-1", ["approver"], key=provider.keys[1])
        [listed] = inbox(ann).json()["approvals"]
        assert (listed["thread_id"], listed["interrupt_id"]) == (thread_id, interrupt["id"])
        approval_id = interrupt["value"]["approval_id"]
        command = ("approvals", "approve", approval_id, "--as", "a-1", "--db", database_url)
        decided = cli(*command, "--server", url, env={"LOOPWRIGHT_TOKEN": ann}, expect=0)
        assert "COMPLETED run" in decided.stdout, decided.stdout

        state = values_of(ada, thread_id)
        assert state["stop_reason"] == "completed" and state["verification"]["verified"]
        assert state["principal"]["user_id"] == "u-1"
        assert state["principal"]["tenant"] == "default"
        [approval] = [a for a in state["approvals"] if a["approval_id"] == approval_id]
        assert approval["approver"] == "a-1"
        assert len(list_refunds(services, order_id)) == 1
