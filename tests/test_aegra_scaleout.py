"""Scale-out on Aegra: two instances on one Postgres and one Redis, one writer per run.

Aegra (an Agent Protocol server) runs loopwright's langgraph.json as is. It queues runs in
Redis for whichever instance's workers are free, re-queues a run whose instance died, and does
not keep one run per thread. loopwright's run leases and fencing are what keep one writer per
run there. This module checks:

* 20 runs spread over both instances; one instance killed with SIGKILL in the middle; the other
  finishes every run, each with exactly one refund;
* two runs forced onto one thread at the same time: one writer, no lost update, one refund;
* `loopwright serve --engine aegra --instances 2` itself: an instance killed while it writes
  is started again and never takes the other down; SIGTERM drains both.

Skipped where Aegra is not installed or Redis is unreachable.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph_sdk.client import SyncLangGraphClient

from loopwright.attempt import CLAIM_POLL_S
from loopwright.server import cluster as cluster_module
from loopwright.server.admissions import PER_PRINCIPAL, PER_PRINCIPAL_ENV
from loopwright.server.bearer_tokens import hashed_table
from loopwright.server.waker import STRANDED_AFTER_ENV
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import create_order, list_refunds, set_fault, slow_down
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.ports import reserved_port, reserved_ports
from tests.runtime_fixtures import PATIENCE_S, REPO, sdk_client, wait_for
from tests.test_readme_walkthrough import reachable_aegra
from tests.test_server_langgraph import (
    GRAPH,
    TOKENS,
    decision_for,
    parked_then_woken,
    status_of,
    values_of,
)

REDIS = ("127.0.0.1", 6379)
REDIS_URL = f"redis://{REDIS[0]}:{REDIS[1]}/0"
RUNS = 20


def redis_reachable() -> bool:
    try:
        with socket.create_connection(REDIS, timeout=1):
            return True
    except OSError:
        return False


# What a test that starts Aegra needs: the engine installed and a Redis to queue runs in
# (`pytest.param("aegra", marks=AEGRA)` where a test runs on both engines).
AEGRA = [
    pytest.mark.skipif(
        importlib.util.find_spec("aegra_api") is None,
        reason="aegra-api is not installed (pip install -e '.[dev]')",
    ),
    pytest.mark.skipif(not redis_reachable(), reason=f"no Redis at {REDIS[0]}:{REDIS[1]}"),
]

pytestmark = [
    pytest.mark.postgres,
    *AEGRA,
]


@dataclass
class Instance:
    running: cluster_module.Instance

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.running.process

    @property
    def url(self) -> str:
        return self.running.url

    def client(self, token: str = "t-u1") -> SyncLangGraphClient:
        return sdk_client(url=self.url, headers={"Authorization": f"Bearer {token}"})

    def stop(self) -> None:
        self.running.stop()


@dataclass
class Cluster:
    database_url: str
    services: ServiceEndpoints
    env: dict[str, str]
    workdir: Path
    instances: list[Instance]

    def start(self, name: str) -> Instance:
        return self.start_with(name)

    def start_with(self, name: str, **env: str) -> Instance:
        """An instance whose environment also has `env` (e.g. an armed crash point)."""
        with reserved_port() as port:  # held until the instance listens on it
            running = cluster_module.start_instance(
                self.workdir,
                {**self.env, **env},
                index=len(self.instances) + 1,
                host="127.0.0.1",
                port=port,
            )
        instance = Instance(running)
        self.instances.append(instance)
        return instance

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


@contextmanager
def deployment(postgres_server_url: str, workdir: Path) -> Iterator[Cluster]:
    """A deployment as `loopwright serve --engine aegra` makes one (its environment, with the
    handover settings it states) on a database of its own, its instances started by the test
    and stopped with it."""
    with (
        fresh_database(postgres_server_url, prefix="lw_test") as url,
        start_services(workdir / "services") as services,
    ):
        base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        extra = {
            **services.endpoints.to_env(),
            "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
            # Two instances' workers on CI's two cores.
            "WORKER_COUNT": "2",
            "N_JOBS_PER_WORKER": "6",
            # The handover tests start many runs of one customer at once; the bound's own test
            # starts its instances with the default.
            PER_PRINCIPAL_ENV: "32",
        }
        env = cluster_module.instance_env(
            base,
            database_url=url,
            redis_url=REDIS_URL,
            config=cluster_module.write_config(workdir),
            extra=extra,
        )
        cluster = Cluster(url, services.endpoints, env, workdir, [])
        try:
            yield cluster
        finally:
            for instance in cluster.instances:
                instance.stop()
            cluster_module.forget_keys(REDIS_URL, cluster_module.deployment_prefix(url))


@pytest.fixture
def cluster(postgres_server_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with deployment(postgres_server_url, tmp_path) as cluster:
        yield cluster


def openapi_document(cluster: Cluster) -> dict[str, Any]:
    """The API Aegra serves loopwright's config with, as its app documents it (the app is the
    inbox's, which serves no document of its own: read in a process of the deployment's)."""
    script = "import json; from aegra_api.main import app; print(json.dumps(app.openapi()))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cluster.workdir,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
        check=True,
    )
    document: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return document


def refund_task(order_id: str) -> str:
    return f"Check whether order {order_id} can be refunded and refund it if so."


def writers_by_thread(cluster: Cluster) -> dict[str, set[str]]:
    """Which processes wrote each thread's checkpoints (the served graph stamps lw_writer)."""
    rows = cluster.sql(
        "SELECT DISTINCT thread_id, metadata->>'lw_writer' FROM checkpoints"
        " WHERE metadata ? 'lw_writer'"
    )
    found: dict[str, set[str]] = {}
    for thread_id, writer in rows:
        found.setdefault(thread_id, set()).add(writer)
    return found


def pid_of(writer: str) -> int:
    return int(writer.split(":")[1])


def mid_run(cluster: Cluster, instance: Instance) -> list[str]:
    """Runs `instance` holds, has written checkpoints of, and has not refunded yet: were it to
    die now, another instance would have to write the rest of them."""
    me = f"%:{instance.process.pid}:%"
    return [
        run_id
        for (run_id,) in cluster.sql(
            "SELECT r.run_id FROM lw_runs r WHERE r.owner LIKE %s"
            " AND EXISTS (SELECT 1 FROM checkpoints c"
            "  WHERE c.thread_id = r.run_id AND c.metadata->>'lw_writer' LIKE %s)"
            " AND NOT EXISTS (SELECT 1 FROM lw_actions a"
            "  WHERE a.run_id = r.run_id AND a.status = 'SUCCEEDED')",
            me,
            me,
        )
    ]


def kill_mid_run(cluster: Cluster, instance: Instance) -> None:
    """SIGKILL `instance` while it is in the middle of a run (see `mid_run`), not merely when it
    has claimed one: a claim alone may not have written anything yet. The instance is stopped
    (SIGSTOP) and asked about again before the kill, so that it cannot finish the run between
    the question and the kill; a statement it had already sent lands meanwhile."""
    pid = instance.process.pid
    deadline = time.monotonic() + PATIENCE_S
    while True:
        assert time.monotonic() < deadline, "instance 1 never got a run under way"
        if mid_run(cluster, instance):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.5)
            if mid_run(cluster, instance):
                break
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    instance.process.wait()


def test_a_killed_instance_s_runs_are_finished_by_the_other(cluster: Cluster) -> None:
    first = cluster.start("aegra-1")
    second = cluster.start("aegra-2")
    orders = [f"O-{5000 + i}" for i in range(RUNS)]
    for order_id in orders:
        create_order(cluster.services, order_id, "u-1", "20.00")  # under the approval threshold
    slow_down(cluster.services.orders, 0.3)  # every order read takes 0.3 s: runs take seconds
    threads = []
    for i, order_id in enumerate(orders):
        client = (first if i % 2 == 0 else second).client()
        thread = client.threads.create()
        client.runs.create(thread["thread_id"], GRAPH, input={"task": refund_task(order_id)})
        threads.append(thread["thread_id"])

    kill_mid_run(cluster, first)

    deadline = time.monotonic() + PATIENCE_S
    while (
        cluster.sql(
            "SELECT 1 FROM lw_runs WHERE run_id = ANY(%s) AND phase <> 'COMPLETED'", threads
        )
        or len(cluster.sql("SELECT 1 FROM lw_runs WHERE run_id = ANY(%s)", threads)) < RUNS
    ):
        assert time.monotonic() < deadline, cluster.sql(
            "SELECT t, r.phase, r.owner FROM unnest(%s::text[]) t"
            " LEFT JOIN lw_runs r ON r.run_id = t WHERE r.phase IS DISTINCT FROM 'COMPLETED'",
            threads,
        )
        time.sleep(0.25)

    for order_id in orders:
        assert len(list_refunds(cluster.services, order_id)) == 1, order_id
    writers = writers_by_thread(cluster)
    pids = {thread: {pid_of(w) for w in found} for thread, found in writers.items()}
    assert any(first.process.pid in p for p in pids.values()), "instance 1 ran nothing"
    assert any(second.process.pid in p for p in pids.values()), "instance 2 ran nothing"
    taken_over = [t for t, p in pids.items() if p == {first.process.pid, second.process.pid}]
    assert taken_over, "no run was finished by the other instance"
    states = [values_of(second.client(), t) for t in threads]
    assert all(s["stop_reason"] == "completed" and s["verification"]["verified"] for s in states)
    for thread_id in taken_over:  # every takeover bumped the fence
        ((fence,),) = cluster.sql("SELECT fence FROM lw_runs WHERE run_id = %s", thread_id)
        assert fence >= 2


def test_two_runs_sent_onto_one_thread_at_once_are_one_run_and_one_409(cluster: Cluster) -> None:
    """Aegra starts every run it is given, whatever the multitask strategy: a second run on a
    busy thread would take a job slot and wait there for the first one's lease. The instances
    admit one run per thread between them: of two sent at once, through two instances, one
    runs (one writer, one refund) and the other is refused."""
    first, second = cluster.start("aegra-1"), cluster.start("aegra-2")
    create_order(cluster.services, "O-6000", "u-1", "20.00")
    slow_down(cluster.services.orders, 0.5)
    thread_id = first.client().threads.create()["thread_id"]
    task = {"task": refund_task("O-6000")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        sent = [
            pool.submit(
                status_of, functools.partial(i.client().runs.create, thread_id, GRAPH, input=task)
            )
            for i in (first, second)
        ]
    assert sorted(s.result() for s in sent) == [200, 409]
    [run] = first.client().runs.list(thread_id)
    first.client().runs.join(thread_id, run["run_id"])

    state = values_of(first.client(), thread_id)
    assert state["stop_reason"] == "completed" and state["verification"]["verified"]
    assert len(writers_by_thread(cluster)[thread_id]) == 1  # one writer advanced the run
    assert len(state["journal"]) == 1
    assert len(list_refunds(cluster.services, "O-6000")) == 1


def test_one_customer_holds_up_nobody_across_the_instances(cluster: Cluster) -> None:
    """A customer has at most PER_PRINCIPAL runs in flight across every instance (a 429 past
    it, whichever instance is asked) and none waiting behind a busy thread (409): another
    customer's run starts at once, and once the first customer's runs end they may start
    more."""
    bound = {PER_PRINCIPAL_ENV: str(PER_PRINCIPAL)}
    first, second = cluster.start_with("aegra-1", **bound), cluster.start_with("aegra-2", **bound)
    slow_down(cluster.services.payments, 2.0, ("POST",))  # each refund in flight for 2 s
    orders = [f"O-{6100 + i}" for i in range(PER_PRINCIPAL + 2)]
    for order_id in orders:
        create_order(cluster.services, order_id, "u-1", "20.00")  # no approval needed
    held = []
    for order_id, instance in zip(orders[:PER_PRINCIPAL], itertools.cycle((first, second))):
        client = instance.client("t-u1")
        thread_id = client.threads.create()["thread_id"]
        client.runs.create(thread_id, GRAPH, input={"task": refund_task(order_id)})
        held.append(thread_id)
    more = orders[PER_PRINCIPAL]
    for instance in (first, second):
        client = instance.client("t-u1")
        thread_id = client.threads.create()["thread_id"]
        new_run = functools.partial(
            client.runs.create, thread_id, GRAPH, input={"task": refund_task(more)}
        )
        assert status_of(new_run) == 429
        behind = functools.partial(
            client.runs.create,
            held[0],
            GRAPH,
            input={"task": refund_task(more)},
            multitask_strategy="enqueue",
        )
        assert status_of(behind) == 409

    create_order(cluster.services, "O-6199", "u-2", "20.00")
    other = second.client("t-u2")
    thread_id = other.threads.create()["thread_id"]
    since = time.monotonic()
    run = other.runs.create(thread_id, GRAPH, input={"task": refund_task("O-6199")})
    while other.runs.get(thread_id, run["run_id"])["status"] == "pending":
        time.sleep(0.05)
    print(f"\nanother customer's run started {time.monotonic() - since:.2f} s on")
    wait_until_completed(cluster, [*held, thread_id])

    client = first.client("t-u1")  # their runs ended: they may start again
    again = client.threads.create()["thread_id"]
    client.runs.wait(again, GRAPH, input={"task": refund_task(orders[-1])})
    wait_until_completed(cluster, [again])
    for order_id in [*orders[:PER_PRINCIPAL], orders[-1], "O-6199"]:
        assert len(list_refunds(cluster.services, order_id)) == 1, order_id
    assert list_refunds(cluster.services, more) == []


def taken_over(
    cluster: Cluster, run_ids: list[str], gone: Instance, timeout: float = PATIENCE_S
) -> float:
    """Seconds until every run in `run_ids` is held, or finished, by a process other than
    `gone`'s (whose lease on it is no longer live)."""
    started = time.monotonic()
    while True:
        left = cluster.sql(
            "SELECT run_id FROM lw_runs WHERE run_id = ANY(%s) AND phase <> 'COMPLETED'"
            " AND (owner IS NULL OR owner LIKE %s)",
            run_ids,
            f"%:{gone.process.pid}:%",
        )
        if not left:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"not taken over: {left}"
        time.sleep(0.05)


def test_a_stopped_instance_hands_its_runs_back_with_their_leases(cluster: Cluster) -> None:
    """SIGTERM: the instance lets its runs go on for the drain, then each stops at its next step
    boundary and gives loopwright's lease up before Aegra re-queues it, so the other instance
    continues it at once (not after the lease's time to live); one refund each."""
    first = cluster.start("aegra-1")
    second = cluster.start("aegra-2")
    orders = [f"O-{7000 + i}" for i in range(6)]
    for order_id in orders:
        create_order(cluster.services, order_id, "u-1", "20.00")
    slow_down(cluster.services.orders, 0.5)  # runs take seconds: longer than the drain
    client = first.client()
    threads = []
    for order_id in orders:
        thread_id = client.threads.create()["thread_id"]
        client.runs.create(thread_id, GRAPH, input={"task": refund_task(order_id)})
        threads.append(thread_id)
    deadline = time.monotonic() + PATIENCE_S
    while not (held := mid_run(cluster, first)):
        assert time.monotonic() < deadline, "instance 1 never got a run under way"
        time.sleep(0.05)

    first.process.send_signal(signal.SIGTERM)
    first.process.wait(timeout=PATIENCE_S)
    # Given up as the runs were handed back: no lease of the stopped instance is live.
    leases = cluster.sql(
        "SELECT run_id FROM lw_runs WHERE owner LIKE %s AND lease_expires_at > now()",
        f"%:{first.process.pid}:%",
    )
    assert leases == [], f"the stopped instance still holds {leases}"
    seconds = taken_over(cluster, held, first)
    print(f"\nSIGTERM: {len(held)} run(s) handed back, continued {seconds:.2f} s after the exit")

    wait_until_completed(cluster, threads)
    for order_id in orders:
        assert len(list_refunds(cluster.services, order_id)) == 1, order_id
    writers = writers_by_thread(cluster)
    assert all(second.process.pid in {pid_of(w) for w in writers[t]} for t in held)


def wait_until_completed(cluster: Cluster, threads: list[str], timeout: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout
    while cluster.sql(
        "SELECT 1 FROM lw_runs WHERE run_id = ANY(%s) AND phase <> 'COMPLETED'", threads
    ) or len(cluster.sql("SELECT 1 FROM lw_runs WHERE run_id = ANY(%s)", threads)) < len(threads):
        assert time.monotonic() < deadline, cluster.sql(
            "SELECT t, r.phase, r.owner FROM unnest(%s::text[]) t"
            " LEFT JOIN lw_runs r ON r.run_id = t WHERE r.phase IS DISTINCT FROM 'COMPLETED'",
            threads,
        )
        time.sleep(0.25)


def test_a_killed_instance_s_runs_go_on_elsewhere_whatever_they_were_doing(
    cluster: Cluster,
) -> None:
    """Instance 1 dies (a real process, at the `executor:after_send` crash point: the payment
    service applied its refund, the answer never read) with runs mid-read and one waiting for
    its approval. Instance 2 continues the runs in flight once the engine's and loopwright's
    leases run out (the handover settings), reconciles the unknown refund as applied, and the
    waiting run is decided through it: one refund per order."""
    waiting_order = "O-7100"
    create_order(cluster.services, waiting_order, "u-1", "80.00")  # waits for an approval
    orders = [f"O-{7101 + i}" for i in range(6)]
    for order_id in orders:
        create_order(cluster.services, order_id, "u-1", "20.00")
    first = cluster.start_with("aegra-1", LOOPWRIGHT_CRASH_AT="executor:after_send")
    second = cluster.start("aegra-2")
    client = first.client()
    waiting = client.threads.create()["thread_id"]
    client.runs.wait(waiting, GRAPH, input={"task": refund_task(waiting_order)})
    [interrupt] = client.threads.get_state(waiting)["interrupts"]
    slow_down(cluster.services.orders, 0.3)
    threads = []
    for order_id in orders:
        thread_id = client.threads.create()["thread_id"]
        client.runs.create(thread_id, GRAPH, input={"task": refund_task(order_id)})
        threads.append(thread_id)

    assert first.process.wait(timeout=PATIENCE_S) == 137  # the crash point, reached
    held = [
        run_id
        for (run_id,) in cluster.sql(
            "SELECT run_id FROM lw_runs WHERE owner LIKE %s AND phase <> 'COMPLETED'",
            f"%:{first.process.pid}:%",
        )
    ]
    assert held, "instance 1 held no run as it died"
    # How long the handover took is printed, not judged: on a loaded machine every process is
    # slower than the settings' arithmetic (test_the_stated_handover_bounds_follow_from_the_settings).
    seconds = taken_over(cluster, held, first)
    print(f"\nkilled: {len(held)} run(s) continued by instance 2 {seconds:.2f} s after the death")

    wait_until_completed(cluster, threads)
    unknown = cluster.sql(
        "SELECT DISTINCT e.action_id FROM lw_action_events e JOIN lw_actions a USING (action_id)"
        " WHERE a.run_id = ANY(%s) AND e.to_status = 'UNKNOWN'",
        threads,
    )
    # The write the crash cut off (and any other in flight as the instance died), reconciled.
    assert unknown, "no write went unknown at the crash"
    ended = cluster.sql("SELECT DISTINCT status FROM lw_actions WHERE run_id = ANY(%s)", threads)
    assert ended == [("SUCCEEDED",)], ended
    for order_id in orders:
        assert len(list_refunds(cluster.services, order_id)) == 1, order_id
    decision = decision_for(dict(interrupt), "approve", "a-1")
    second.client("t-a1").runs.wait(waiting, GRAPH, command={"resume": decision})
    assert values_of(second.client(), waiting)["stop_reason"] == "completed"
    assert len(list_refunds(cluster.services, waiting_order)) == 1


def test_the_stated_handover_bounds_follow_from_the_settings() -> None:
    """The bounds `loopwright serve --engine aegra` states are the settings' arithmetic: a
    killed instance's run is re-queued once the engine's lease has run out and its reaper has
    looked, and claimed once loopwright's lease has run out too (claims tried every
    CLAIM_POLL_S); a SIGTERM'd one's is handed back after the drain. The tests above measure
    the handovers and print them (a quiet machine takes about half the bound, a loaded one
    longer: no test judges how long it took)."""
    settings = {name: float(value) for name, value in cluster_module.HANDOVER_SETTINGS.items()}
    heartbeat, engine_lease = (
        settings["HEARTBEAT_INTERVAL_SECONDS"],
        settings["LEASE_DURATION_SECONDS"],
    )
    assert engine_lease > 2 * heartbeat  # one late heartbeat does not lose a live run
    requeued = engine_lease + settings["REAPER_INTERVAL_SECONDS"]
    claimed = max(requeued, settings["LOOPWRIGHT_LEASE_TTL_S"]) + CLAIM_POLL_S
    assert claimed <= cluster_module.KILLED_HANDOVER_S
    assert settings["WORKER_DRAIN_TIMEOUT"] < cluster_module.STOPPED_HANDOVER_S


def test_a_parked_run_is_woken_by_an_instance_when_due(cluster: Cluster) -> None:
    """On the engine, as on LangGraph's server: the parked run is woken through an instance
    (whichever asks first: one wake-up per due time), its thread ends idle."""
    cluster.start("i-1")
    instance = cluster.start("i-2")
    create_order(cluster.services, "O-7700", "u-1", "20.00")
    set_fault(cluster.services, "processing", delay_s=4)
    parked_then_woken(instance.client("t-u1"), cluster.sql)
    assert [r["status"] for r in list_refunds(cluster.services, "O-7700")] == ["succeeded"]


def test_a_run_its_engine_gives_up_is_woken_and_ends_once(cluster: Cluster) -> None:
    """Aegra marks a run failed once its worker lease was lost more than `BG_JOB_MAX_RETRIES`
    times, and starts it no more, though loopwright's run has not ended. Here the engine gives
    up at the first loss: the instance sending the run's refund is killed. Once nothing has held
    the run for the stranded bound, an instance's waker asks the engine to go on with it: the
    run completes, the order refunded once."""
    settings = {"BG_JOB_MAX_RETRIES": "0", STRANDED_AFTER_ENV: "3"}
    instances = [cluster.start_with(f"i-{i}", **settings) for i in (1, 2)]
    create_order(cluster.services, "O-7900", "u-1", "20.00")
    # The refund in flight for 3 s, its tool's timeout, until its sender is killed; then at
    # once (a resend as slow would time out as well, as often as not, and the run escalate).
    slow_down(cluster.services.payments, 3.0, ("POST",))
    client = instances[0].client()
    thread = client.threads.create()["thread_id"]
    client.runs.create(thread, GRAPH, input={"task": refund_task("O-7900")})
    ports = {int(i.url.rsplit(":", 1)[1]): i for i in instances}
    sender = ports[
        sending_instance(cluster.database_url, thread, {p: i.process.pid for p, i in ports.items()})
    ]
    os.kill(sender.process.pid, signal.SIGKILL)
    sender.process.wait()
    slow_down(cluster.services.payments, 0.0, ("POST",))

    given_up = "SELECT 1 FROM runs WHERE thread_id::text = %s AND status = 'error'"
    wait_for(
        lambda: cluster.sql(given_up, thread), said=lambda: records(cluster.database_url, [thread])
    )
    wait_for(
        lambda: phases(cluster.database_url, [thread]) == ["COMPLETED"],
        said=lambda: records(cluster.database_url, [thread]),
    )
    assert [r["status"] for r in list_refunds(cluster.services, "O-7900")] == ["succeeded"]
    # The engine's records say so too, once it has heard the run end: the run it gave up, then
    # the one it was asked for.
    statuses = "SELECT status FROM runs WHERE thread_id::text = %s ORDER BY created_at"
    wait_for(
        lambda: [s for (s,) in cluster.sql(statuses, thread)] == ["error", "success"],
        said=lambda: records(cluster.database_url, [thread]),
    )


def instances_of(serving: subprocess.Popen[bytes]) -> dict[int, int]:
    """The Aegra instances `loopwright serve` runs now: pid by port."""
    found: dict[int, int] = {}
    for pid in Path(f"/proc/{serving.pid}/task/{serving.pid}/children").read_text().split():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except FileNotFoundError:
            continue  # gone meanwhile
        if "loopwright.server.aegra" in args:
            found[int(args[args.index("--port") + 1])] = int(pid)
    return found


def test_serve_starts_a_killed_instance_again_and_the_other_serves_on(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """`loopwright serve --engine aegra --instances 2`, a run waiting for its approval and
    another in the middle of its refund: the instance sending the refund is killed (SIGKILL).
    The command goes on; the other instance takes the write over and the approval is decided
    through it; each order is refunded once; the killed instance is started again on its port.
    Then SIGTERM drains both and the command exits 0. Its Redis keys are under the prefix it
    was given."""
    prefix = f"lw-test-{uuid.uuid4().hex[:8]}"
    output = tmp_path / "serve.out"
    with (
        fresh_database(postgres_server_url, prefix="lw_test") as url,
        start_services(tmp_path / "services") as services,
        reserved_ports(2) as port,
        output.open("wb") as out,
    ):
        urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_TOKENS")},
            **services.endpoints.to_env(),
            "LOOPWRIGHT_TOKENS": json.dumps(hashed_table(TOKENS)),
            "LOOPWRIGHT_HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(REPO),
            "WORKER_COUNT": "2",  # two instances' workers on CI's two cores
            "N_JOBS_PER_WORKER": "6",
        }
        serving = subprocess.Popen(
            [
                *(sys.executable, "-m", "loopwright", "serve", "--engine", "aegra"),
                *("--instances", "2", "--port", str(port), "--db", url),
                *("--redis", REDIS_URL, "--redis-prefix", prefix),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
        )
        try:
            wait_for(lambda: serving.poll() is not None or all(map(reachable_aegra, urls)))
            assert serving.poll() is None, output.read_text()
            started = instances_of(serving)
            assert sorted(started) == [port, port + 1]
            queue = f"WORKER_QUEUE_KEY={prefix}:jobs".encode()
            assert all(
                queue in Path(f"/proc/{pid}/environ").read_bytes() for pid in started.values()
            )

            create_order(services.endpoints, "O-8000", "u-1", "80.00")  # waits for an approval
            create_order(services.endpoints, "O-8001", "u-1", "20.00")
            customer = sdk_client(url=urls[0], headers={"Authorization": "Bearer t-u1"})
            waiting = customer.threads.create()["thread_id"]
            customer.runs.wait(waiting, GRAPH, input={"task": refund_task("O-8000")})
            [interrupt] = customer.threads.get_state(waiting)["interrupts"]
            # The refund in flight for 3 s (its tool's timeout) until its sender is killed.
            slow_down(services.endpoints.payments, 3.0, ("POST",))
            writing = customer.threads.create()["thread_id"]
            customer.runs.create(writing, GRAPH, input={"task": refund_task("O-8001")})
            sender = sending_instance(url, writing, started)

            os.kill(started[sender], signal.SIGKILL)
            slow_down(services.endpoints.payments, 0.0, ("POST",))
            other = urls[1 - [port, port + 1].index(sender)]
            approver = sdk_client(url=other, headers={"Authorization": "Bearer t-a1"})
            decision = decision_for(dict(interrupt), "approve", "a-1")
            approver.runs.wait(waiting, GRAPH, command={"resume": decision})
            wait_for(
                lambda: phases(url, [waiting, writing]) == ["COMPLETED", "COMPLETED"],
                said=lambda: (
                    records(url, [waiting, writing]) + endings(customer, [waiting, writing])
                ),
            )
            assert serving.poll() is None, output.read_text()
            for order_id in ("O-8000", "O-8001"):
                assert len(list_refunds(services.endpoints, order_id)) == 1, order_id

            wait_for(lambda: instances_of(serving).get(sender) not in (None, started[sender]))
            killed = f"http://127.0.0.1:{sender}"
            wait_for(lambda: reachable_aegra(killed))
            back = sdk_client(url=killed, headers={"Authorization": "Bearer t-u1"})
            assert back.threads.create()["thread_id"]
            index = [port, port + 1].index(sender) + 1
            # The command says so once its own check of the instance has passed, which may be
            # after this test's.
            wait_for(lambda: f"instance {index} ({killed}) is back" in output.read_text())
            said = output.read_text()
            assert f"instance {index} ({killed}) was killed (SIGKILL); starting it again" in said

            running = list(instances_of(serving).values())
            serving.send_signal(signal.SIGTERM)
            assert serving.wait(timeout=PATIENCE_S) == 0, output.read_text()
            assert not any(Path(f"/proc/{pid}").exists() for pid in running)
            assert not any(map(reachable_aegra, urls))
        finally:
            if serving.poll() is None:
                serving.kill()
                serving.wait()
            cluster_module.forget_keys(REDIS_URL, f"{prefix}:")
            print(output.read_text())  # what the command said, shown if the test failed
            for log in sorted((tmp_path / "home" / "aegra").glob("aegra-*.log")):
                print(log.name, *log.read_text().splitlines()[-60:], sep="\n")


def sending_instance(database_url: str, run_id: str, instances: dict[int, int]) -> int:
    """The port of the instance whose process has sent `run_id`'s refund and not heard back."""
    deadline = time.monotonic() + PATIENCE_S
    by_pid = {pid: port for port, pid in instances.items()}
    while time.monotonic() < deadline:
        with psycopg.connect(database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT r.owner FROM lw_runs r JOIN lw_actions a USING (run_id)"
                " WHERE r.run_id = %s AND a.status = 'DISPATCHED'",
                (run_id,),
            ).fetchall()
        if rows and rows[0][0] and pid_of(rows[0][0]) in by_pid:
            return by_pid[pid_of(rows[0][0])]
        time.sleep(0.05)
    raise AssertionError(f"run {run_id}'s refund was never seen in flight")


def records(database_url: str, threads: list[str]) -> str:
    """Where the runs on `threads` stand by the engine's records and by loopwright's: what a
    test that waited for them in vain says."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        engine = conn.execute(
            "SELECT thread_id, run_id, status, error_message, execution_params->>'_retry_count'"
            " FROM runs WHERE thread_id::text = ANY(%s) ORDER BY created_at",
            (threads,),
        ).fetchall()
        ours = conn.execute(
            "SELECT run_id, phase, owner, fence, failures, last_error, lease_expires_at > now()"
            " FROM lw_runs WHERE run_id = ANY(%s)",
            (threads,),
        ).fetchall()
        journal = conn.execute(
            "SELECT a.run_id, a.tool, e.from_status, e.to_status, e.fence, e.at"
            " FROM lw_actions a JOIN lw_action_events e USING (action_id)"
            " WHERE a.run_id = ANY(%s) ORDER BY e.at",
            (threads,),
        ).fetchall()
    return f"the engine's runs {engine}; loopwright's {ours}; the journal's {journal}"


def endings(client: SyncLangGraphClient, threads: list[str]) -> str:
    """How the runs on `threads` ended, by their state: what a test that waited in vain says."""
    said = []
    for thread in threads:
        values = client.threads.get_state(thread)["values"]
        assert isinstance(values, dict)
        said.append(f"{thread}: {values.get('stop_reason')} {values.get('stop_detail')!r}")
    return "; ".join(said)


def phases(database_url: str, run_ids: list[str]) -> list[str | None]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, phase FROM lw_runs WHERE run_id = ANY(%s)", (run_ids,)
        ).fetchall()
    found: dict[str, str] = dict(rows)
    return [found.get(run_id) for run_id in run_ids]
