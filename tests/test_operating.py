"""What an operator's tooling asks: readiness and liveness on every served path, and metrics.

Each dependency is stopped in turn, for real: the database refuses connections (a database of
the test's own, `ALLOW_CONNECTIONS false`), Redis is a private `redis-server` the test kills,
the agent's business services are stopped (then started again on the same ports). The first
probe after each stop answers not ready; ready again once the dependency is back. The probes
answer a status word and nothing else, without a token.

The metrics test runs a scripted set of refund runs through a worker (some complete, one waits
for an approval, one's write goes UNKNOWN and is reconciled, one is taken over from an owner
that died), scrapes the worker's /metrics and checks every figure against lw_runs and the
journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from loopwright.core import tls
from loopwright.runner import LEASE_TTL_ENV, open_runner
from loopwright.server import cluster as cluster_module
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.launch import server_env, start_server
from loopwright.stored_state import exposition
from loopwright_refunds.agent import MODEL_NAME, agent, connect
from loopwright_refunds.scratch import fresh_database, with_application_name, with_database
from loopwright_refunds.services.admin import create_order, set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import RunningServices, start_services
from tests.cli_forkserver import Started
from tests.ports import reserved_port
from tests.runtime_fixtures import cli, start_cli, wait_for
from tests.test_aegra_scaleout import redis_reachable
from tests.test_server_langgraph import TOKENS as SERVER_TOKENS

pytestmark = pytest.mark.postgres

READY = {"status": "ready"}
NOT_READY = {"status": "not ready"}
TOKENS = {**SERVER_TOKENS, "t-o1": {"user_id": "o-1", "roles": ["operator"]}}
BACK_S = 60  # a dependency back: ready again well within this, however loaded the machine


def probe(url: str, path: str = "/ready") -> tuple[int, Any]:
    response = httpx.get(f"{url}{path}", timeout=30, verify=tls.context())
    return response.status_code, response.json()


def assert_ready(url: str) -> None:
    assert probe(url) == (200, READY)
    assert probe(url, "/health") == (200, READY)
    assert probe(url, "/live") == (200, {"status": "live"})


def wait_ready(url: str) -> None:
    wait_for(lambda: probe(url) == (200, READY), timeout=BACK_S)


@contextlib.contextmanager
def connections_refused(database_url: str) -> Iterator[None]:
    """The database refuses new connections (the ones open stay) until the block ends."""
    name = urlsplit(database_url).path.lstrip("/")  # a socket's host is in the query
    server = with_database(database_url, "postgres")
    alter = "ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL(alter.format("{}", "false")).format(sql.Identifier(name)))
        try:
            yield
        finally:
            admin.execute(sql.SQL(alter.format("{}", "true")).format(sql.Identifier(name)))


def connections_dropped(database_url: str) -> None:
    """The database drops every connection to it, as a restart or a failover does; those of
    the URL's `application_name` only, where it names one (a database the test shares)."""
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    application = dict(parse_qsl(parts.query)).get("application_name", "%")
    with psycopg.connect(with_database(database_url, "postgres"), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name LIKE %s AND pid <> pg_backend_pid()",
            (name, application),
        )


@contextlib.contextmanager
def ports_held(endpoints: ServiceEndpoints) -> Iterator[None]:
    """The services' ports, kept from any other process while they are stopped."""
    with contextlib.ExitStack() as stack:
        for url in endpoints.model_dump().values():
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", int(url.rpartition(":")[2])))
        yield


class Services:
    """The reference services, which a test stops and starts again where they were."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.running: RunningServices = start_services(data_dir)
        self.endpoints = self.running.endpoints

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        self.running.stop()
        with ports_held(self.endpoints):
            yield
        self.running = start_services(self.data_dir, endpoints=self.endpoints)

    def stop(self) -> None:
        self.running.stop()


def check_services_and_database(url: str, database_url: str, services: Services) -> None:
    assert_ready(url)
    with connections_refused(database_url):
        assert probe(url) == (503, NOT_READY)
        assert probe(url, "/live") == (200, {"status": "live"})  # alive, only not ready
    wait_ready(url)
    # Every connection the process keeps is dropped (the database restarted): it reconnects.
    connections_dropped(database_url)
    wait_ready(url)
    with services.stopped():
        assert probe(url) == (503, NOT_READY)
        assert probe(url, "/health") == (503, NOT_READY)
    wait_ready(url)


def test_langgraph_server_probes_and_operator_metrics(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """`loopwright serve`'s server: probes without a token (where /health, /ready and /live
    were 401), not ready while its database or the agent's services are down; metrics for an
    operator's token only."""
    services = Services(tmp_path / "services")
    try:
        with fresh_database(postgres_server_url, prefix="lw_test") as database_url:
            env = server_env(
                {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                {
                    "DATABASE_URL": database_url,
                    "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
                    **services.endpoints.to_env(),
                },
            )
            with reserved_port() as port, start_server(tmp_path, env, port=port) as server:
                check_services_and_database(server.url, database_url, services)
                metrics = f"{server.url}/loopwright/metrics"
                assert httpx.get(metrics, verify=tls.context()).status_code == 401
                for token in ("t-u1", "t-a1"):
                    headers = {"Authorization": f"Bearer {token}"}
                    assert (
                        httpx.get(metrics, headers=headers, verify=tls.context()).status_code == 403
                    )
                answer = httpx.get(
                    metrics, headers={"Authorization": "Bearer t-o1"}, verify=tls.context()
                )
                assert answer.status_code == 200
                figures = parsed(answer.text)
                assert figures["loopwright_database_up"][()] == 1
                assert figures["loopwright_approvals_waiting"][()] == 0
                # LangGraph's own /metrics (public) does not carry loopwright's.
                assert (
                    "loopwright_"
                    not in httpx.get(f"{server.url}/metrics", verify=tls.context()).text
                )
    finally:
        services.stop()


@contextlib.contextmanager
def private_redis(port: int, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of the test's own on `port`, no persistence, stopped after."""
    binary = shutil.which("redis-server")
    assert binary is not None
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_for(lambda: cluster_module.redis_unreachable(url) is None, timeout=30)
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
@pytest.mark.skipif(not redis_reachable(), reason="the Aegra tests' Redis is not there either")
def test_aegra_instance_probes_follow_its_database_redis_and_services(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """An Aegra instance: its own /health, /ready and /live said "healthy" with the business
    services stopped; loopwright's answer for them, and Redis counts too."""
    pytest.importorskip("aegra_api")
    services = Services(tmp_path / "services")
    try:
        with (
            reserved_port() as redis_port,
            fresh_database(postgres_server_url, prefix="lw_test") as database_url,
        ):
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            with private_redis(redis_port, tmp_path) as redis:
                env = cluster_module.instance_env(
                    {k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
                    database_url=database_url,
                    redis_url=redis_url,
                    config=cluster_module.write_config(tmp_path),
                    extra={
                        **services.endpoints.to_env(),
                        "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
                    },
                )
                with (
                    reserved_port() as port,
                    cluster_module.start_instance(
                        tmp_path, env, index=1, host="127.0.0.1", port=port
                    ) as instance,
                ):
                    check_services_and_database(instance.url, database_url, services)
                    redis.kill()
                    redis.wait()
                    assert probe(instance.url) == (503, NOT_READY)
                    with private_redis(redis_port, tmp_path):
                        wait_ready(instance.url)
                        answer = httpx.get(
                            f"{instance.url}/loopwright/metrics",
                            headers={"Authorization": "Bearer t-o1"},
                            verify=tls.context(),
                        )
                        assert answer.status_code == 200
                        assert parsed(answer.text)["loopwright_database_up"][()] == 1
    finally:
        services.stop()


def parsed(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Samples by name, then by their labels (sorted pairs)."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def worker_process(
    database_url: str, endpoints: ServiceEndpoints, port: int, home: Path
) -> Started:
    env = {"LOOPWRIGHT_HOME": str(home), LEASE_TTL_ENV: "2", **endpoints.to_env()}
    command = ["worker", "--db", database_url, "--poll", "0.2", "--metrics-port", str(port)]
    return start_cli(*command, env=env)


def rows(database_url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def refund_task(order_id: str) -> str:
    return f"Check whether order {order_id} can be refunded and refund it if so."


def test_a_worker_s_metrics_agree_with_lw_runs_and_the_journal(
    postgres_url: str, tmp_path: Path
) -> None:
    services = Services(tmp_path / "services")
    endpoints = services.endpoints
    try:
        for order_id, amount in (("O-901", "20.00"), ("O-902", "30.00"), ("O-903", "40.00")):
            create_order(endpoints, order_id, "u-1", amount)
        # The first refund sent is applied, then answered after the client gave up (3 s).
        set_fault(endpoints, "accept_then_timeout", delay_s=6)
        with connect(endpoints) as deps, open_runner(postgres_url, agent, deps=deps) as runner:
            for order_id in ("O-901", "O-902", "O-42"):  # O-42's 100.00 waits for an approval
                task = refund_task(order_id)
                runner.submit(task, runner.principal_for("u-1", task))
            task = refund_task("O-903")
            # Claimed by an owner that dies at once: its lease runs out, a worker takes it over.
            dead = runner.submit(task, runner.principal_for("u-1", task))
            lease = runner.leases.claim(dead, "dead-owner", 1.0)
            # Its connections named, to be dropped without the test's own.
            worker_url = with_application_name(postgres_url, "lw-test-worker")
            with reserved_port() as port:
                worker = worker_process(worker_url, endpoints, port, tmp_path / "home")
            url = f"http://127.0.0.1:{port}"
            try:
                settled = (
                    "SELECT count(*) FROM lw_runs"
                    " WHERE phase IN ('COMPLETED', 'WAITING_APPROVAL') AND owner IS NULL"
                )
                wait_for(lambda: rows(postgres_url, settled) == [(4,)], timeout=120)
                wait_ready(url)
                figures = parsed(httpx.get(f"{url}/metrics", timeout=30, verify=tls.context()).text)
                # Its probes: not ready while its database or the agent's services are down.
                check_services_and_database(url, worker_url, services)
                # The dead owner's late writes are refused (counted in this process).
                with pytest.raises(Exception, match="lost"):
                    runner.leases.renew(lease)
            finally:
                worker.terminate()
                worker.wait(timeout=60)
            here = parsed(exposition(None).decode())
            assert here["loopwright_fence_refusals_total"][(("store", "lease"),)] >= 1
    finally:
        services.stop()

    runs = rows(postgres_url, "SELECT agent, phase, count(*) FROM lw_runs GROUP BY agent, phase")
    assert sorted(runs) == [("refunds", "COMPLETED", 3), ("refunds", "WAITING_APPROVAL", 1)]
    for agent_name, phase, count in runs:
        assert figures["loopwright_runs"][(("agent", agent_name), ("phase", phase))] == count
    actions = rows(postgres_url, "SELECT status, count(*) FROM lw_actions GROUP BY status")
    assert {(("status", s),): n for s, n in actions} == figures["loopwright_actions"]
    [(waiting,)] = rows(
        postgres_url, "SELECT count(*) FROM lw_actions WHERE status = 'NEEDS_APPROVAL'"
    )
    assert figures["loopwright_approvals_waiting"][()] == waiting == 1
    [(waited,)] = rows(
        postgres_url,
        "SELECT extract(epoch FROM now() - min(updated_at)) FROM lw_actions"
        " WHERE status = 'NEEDS_APPROVAL'",
    )
    assert 0 < figures["loopwright_approval_oldest_age_seconds"][()] <= float(waited)
    # Events of this worker: every run it ended, the unknown write and its reconciliation.
    assert figures["loopwright_runs_ended_total"] == {(("stop_reason", "completed"),): 3}
    [(unknown,)] = rows(
        postgres_url, "SELECT count(*) FROM lw_action_events WHERE to_status = 'UNKNOWN'"
    )
    assert figures["loopwright_writes_unknown_total"][()] == unknown == 1
    reconciled = rows(
        postgres_url,
        "SELECT detail->>'reconciled', count(*) FROM lw_action_events"
        " WHERE detail->>'reconciled' IS NOT NULL GROUP BY 1",
    )
    assert reconciled == [("applied", 1)]
    assert figures["loopwright_writes_reconciled_total"] == {(("outcome", "applied"),): 1}
    assert figures["loopwright_writes_escalated_total"][()] == 0
    assert figures["loopwright_lease_takeovers_total"][()] == 1
    assert figures["loopwright_node_commit_seconds_count"][()] > 0
    model = (("model", MODEL_NAME),)
    assert figures["loopwright_model_request_seconds_count"][model] > 0
    assert figures["loopwright_database_up"][()] == 1


def test_a_metrics_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = f"sqlite:///{tmp_path / 'runs.sqlite3'}"
        result = cli("worker", "--db", db, "--metrics-port", str(port), env={}, expect=2)
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        f"--metrics-port {port}: cannot listen on 127.0.0.1: Address already in use"
    )
