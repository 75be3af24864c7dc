"""Who did what, on every engine: the operator's view of a run that changed hands.

Real processes advance one run each time: a CLI command killed at a crash point, a `loopwright
worker` killed (SIGKILL) while its refund is in flight, `loopwright serve` (langgraph dev) and
a `loopwright serve --engine aegra` instance killed while it sends a refund. For each:

* every attempt is a `run` span, the root of its node, model and tool spans, naming the process
  (and the Aegra instance) that made it; a killed process leaves the spans of every node it
  finished (each reached the file as it ended), and none of the node it was in;
* the served processes trace to the one file of the command's LOOPWRIGHT_HOME (here the
  default, `./.loopwright`), not to a home of their own under their working directory;
* `loopwright show` heads each writer's steps with the process (and instance) that wrote them,
  as the checkpoints' metadata names it, and marks a takeover.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from loopwright.attempt import process_owner
from loopwright.checkpoints.leases import open_lease_store
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.observability.jsonl import read_spans
from loopwright.observability.tracing import run_trace_id
from loopwright.processes import ChildProcess
from loopwright.server import cluster as cluster_module
from loopwright.server.bearer_tokens import hashed_table
from loopwright_refunds.scratch import fresh_database
from loopwright_refunds.services.admin import create_order, list_refunds, slow_down
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.services.launcher import start_services
from tests.ports import reserved_port, reserved_ports
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    REPO,
    cli,
    release_crashed,
    sdk_client,
    start_cli,
    wait_for,
)
from tests.test_aegra_scaleout import (
    AEGRA,
    REDIS_URL,
    instances_of,
    phases,
    refund_task,
    sending_instance,
)
from tests.test_readme_walkthrough import reachable, reachable_aegra
from tests.test_serve_lifecycle import clean_env, dev_server
from tests.test_server_langgraph import GRAPH, TOKENS, decision_for
from tests.test_tracing import HOST, attempts_of, owner_of, writers

pytestmark = pytest.mark.postgres

DEFAULT_TRACE = Path(".loopwright") / "traces.jsonl"


def actions_of(database_url: str, run_id: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT status FROM lw_actions WHERE run_id = %s", (run_id,))
        return [status for (status,) in rows.fetchall()]


def names_from(spans: list[dict[str, Any]], pid: int) -> set[str]:
    return {s["name"] for s in spans if s["resource"]["process.pid"] == pid}


def assert_died_sending(spans: list[dict[str, Any]], pid: int) -> None:
    """Process `pid` left the spans of the refund procedure's reads (each node as it ended) and
    died sending the refund: the last it finished is the refund's validation."""
    left = [s["name"] for s in spans if s["resource"]["process.pid"] == pid]
    assert {"execute_tool get_order", "execute_tool get_policy", "node execute"} <= set(left)
    assert left[-1] == "node validate" and "execute_tool submit_refund" not in left, left


def test_a_killed_worker_leaves_its_spans_and_show_names_each_process_that_took_over(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """A run started by a command that dies as validate starts; a worker takes it over and is
    killed while its refund is in flight; a `resume` takes it over from the worker and
    reconciles the refund: one refund, and three writers in the timeline."""
    trace = tmp_path / "traces.jsonl"
    env = {
        **services.to_env(),
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
        "LOOPWRIGHT_TRACE_FILE": str(trace),
    }
    db = ["--db", postgres_url]
    run_id = "run-worked"
    create_order(services, "O-9100", "u-1", "20.00")  # under the approval threshold
    task = refund_task("O-9100")
    started = cli(
        *("run", task, "--user", "u-1", "--run-id", run_id, *db),
        env={**env, CRASH_ENV: "node:validate:start"},
    )
    release_crashed(started, postgres_url, run_id)
    slow_down(services.payments, 10.0, ("POST",))  # the worker's refund is in flight for 10 s
    worker = start_cli("worker", *db, "--poll", "0.2", env=env)
    try:
        wait_for(lambda: actions_of(postgres_url, run_id) == ["DISPATCHED"])
    finally:
        worker.kill()
        worker.wait(timeout=PATIENCE_S)
    with open_lease_store(postgres_url) as leases:  # reaped: its lease need not run out
        leases.release_for_dead(run_id, process_owner(worker.pid))
    slow_down(services.payments, 0.0, ("POST",))
    resumed = cli("resume", run_id, *db, env=env, expect=0)
    assert "COMPLETED" in resumed.stdout, resumed.stdout
    assert len(list_refunds(services, "O-9100")) == 1

    spans = list(read_spans(trace))
    attempts = attempts_of(spans, run_id, died={started.pid, worker.pid})
    assert list(attempts) == [resumed.pid]
    assert [a["attributes"]["loopwright.advance"] for a in attempts[resumed.pid]] == ["resume"]
    # What each killed process finished is in the file; the node it died in is not.
    assert {"node compile_context", "node model_step"} <= names_from(spans, started.pid)
    assert "node validate" not in names_from(spans, started.pid)
    assert_died_sending(spans, worker.pid)
    assert "execute_tool submit_refund" in names_from(spans, resumed.pid)

    shown = cli("show", run_id, *db, env=env, expect=0).stdout
    first, dead_worker = f"{HOST}:{started.pid}:*", f"{HOST}:{worker.pid}:*"
    writers(
        shown,
        f"by {first} (fence 1)",
        f"taken over by {dead_worker} (fence 2), from {first} (fence 1)",
        f"taken over by {owner_of(spans, resumed.pid)} (fence 3), from {dead_worker} (fence 2)",
    )
    history = json.loads(cli("show", run_id, *db, "--json", env=env, expect=0).stdout)
    steps, named = history["steps"], history["writers"]
    assert [(w["how"], w["fence"], w["advance"]) for w in named] == [
        ("first", 1, "start"),
        ("taken_over", 2, "resume"),
        ("taken_over", 3, "resume"),
    ]
    assert [w["owner"].split(":")[1] for w in named] == [
        str(pid) for pid in (started.pid, worker.pid, resumed.pid)
    ]
    # Each from the step after the last its writer before wrote: the worker from validate on.
    assert named[0]["step"] == 1 and steps[named[1]["step"] - 1] == "validate"
    assert named[1]["step"] < named[2]["step"] <= len(steps)


def on_aegra[F: Callable[..., object]](test: F) -> F:
    """`test`, skipped where Aegra cannot run (`test_aegra_scaleout.AEGRA`)."""
    for mark in AEGRA:
        test = mark(test)
    return test


def no_home_env(**extra: str) -> dict[str, str]:
    """A command's environment with no LOOPWRIGHT_HOME: the default one, in its directory."""
    return {k: v for k, v in clean_env(**extra).items() if k != "LOOPWRIGHT_HOME"}


@contextmanager
def serving(
    command: list[str], cwd: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m loopwright COMMAND` in `cwd`, its output in `cwd/serve.out` (printed after
    the test), SIGTERM'd as the block ends."""
    output = cwd / "serve.out"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "loopwright", *command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        with ChildProcess(process):
            yield process
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=PATIENCE_S) == 0, output.read_text()
    finally:
        print(output.read_text())


def test_a_langgraph_served_run_is_one_run_span_per_attempt_in_the_command_s_home(
    postgres_url: str, tmp_path: Path
) -> None:
    """`loopwright serve` started with no LOOPWRIGHT_HOME: the run waits for its approval, an
    approver decides it; both attempts are run spans of the server's process (every node span
    under one of them) in `./.loopwright/traces.jsonl`, the one trace file there is, and
    `show` names both writers."""
    env = no_home_env(DATABASE_URL=postgres_url, PYTHONPATH=str(REPO))
    with reserved_port() as port:
        url = f"http://127.0.0.1:{port}"
        with serving(["serve", "--port", str(port)], tmp_path, env) as served:
            wait_for(lambda: reachable(url) or served.poll() is not None)
            assert served.poll() is None
            server = dev_server(served.pid)
            customer = sdk_client(url=url, headers={"Authorization": "Bearer dev-u1"})
            thread = customer.threads.create()["thread_id"]
            customer.runs.wait(thread, GRAPH, input={"task": DEMO_TASK})
            [interrupt] = customer.threads.get_state(thread)["interrupts"]
            approver = sdk_client(url=url, headers={"Authorization": "Bearer dev-a1"})
            decision = decision_for(dict(interrupt), "approve", "a-1")
            approver.runs.wait(thread, GRAPH, command={"resume": decision})
            assert phases(postgres_url, [thread]) == ["COMPLETED"]

    assert sorted(tmp_path.rglob("traces.jsonl")) == [tmp_path / DEFAULT_TRACE]
    spans = list(read_spans(tmp_path / DEFAULT_TRACE))
    attempts = attempts_of(spans, thread)
    assert list(attempts) == [server]
    made = attempts[server]
    assert [a["attributes"]["loopwright.advance"] for a in made] == ["start", "answer"]
    asked, decided = (a["attributes"]["loopwright.owner"] for a in made)

    shown = cli("show", thread, "--db", postgres_url, env={}, expect=0).stdout
    writers(
        shown,
        f"by {asked} (fence 1)",
        f"by {decided} (fence 2), with the answer the run waited for",
    )


@on_aegra
def test_an_aegra_instance_killed_mid_write_leaves_its_spans_named_by_instance(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """`loopwright serve --engine aegra --instances 2` started with no LOOPWRIGHT_HOME; the
    instance sending a run's refund is killed (SIGKILL) and the other takes the run over. Both
    instances traced to the command's one file, each span naming its instance (aegra-N) and
    process; the killed one left the spans of the nodes it finished; `show` names the two
    instances and marks the takeover."""
    prefix = f"lw-test-{uuid.uuid4().hex[:8]}"
    with (
        fresh_database(postgres_server_url, prefix="lw_test") as database_url,
        start_services(tmp_path / "services") as services,
        reserved_ports(2) as port,
    ):
        ports = [port, port + 1]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        env = no_home_env(
            **services.endpoints.to_env(),
            LOOPWRIGHT_TOKENS=json.dumps(hashed_table(TOKENS)),
            PYTHONPATH=str(REPO),
            WORKER_COUNT="2",
            N_JOBS_PER_WORKER="6",
        )
        command = [
            *("serve", "--engine", "aegra", "--instances", "2", "--port", str(port)),
            *("--db", database_url, "--redis", REDIS_URL, "--redis-prefix", prefix),
        ]
        try:
            with serving(command, tmp_path, env) as served:
                wait_for(lambda: served.poll() is not None or all(map(reachable_aegra, urls)))
                assert served.poll() is None
                started = instances_of(served)
                create_order(services.endpoints, "O-8101", "u-1", "20.00")
                # The refund in flight for 3 s (its tool's timeout) until its sender is killed.
                slow_down(services.endpoints.payments, 3.0, ("POST",))
                customer = sdk_client(url=urls[0], headers={"Authorization": "Bearer t-u1"})
                thread = customer.threads.create()["thread_id"]
                customer.runs.create(thread, GRAPH, input={"task": refund_task("O-8101")})
                sender = sending_instance(database_url, thread, started)
                os.kill(started[sender], signal.SIGKILL)
                slow_down(services.endpoints.payments, 0.0, ("POST",))
                wait_for(lambda: phases(database_url, [thread]) == ["COMPLETED"])
                assert len(list_refunds(services.endpoints, "O-8101")) == 1
        finally:
            cluster_module.forget_keys(REDIS_URL, f"{prefix}:")

        killed = started[sender]
        names = {pid: f"aegra-{ports.index(p) + 1}" for p, pid in started.items()}
        assert sorted(tmp_path.rglob("traces.jsonl")) == [tmp_path / DEFAULT_TRACE]
        spans = list(read_spans(tmp_path / DEFAULT_TRACE))
        attempts = attempts_of(spans, thread, died={killed})
        # Taken over by the other instance, or by the killed one started again (a new process
        # under the same name: its log's), whichever took the run from the queue first.
        [(taker, [taken])] = attempts.items()
        assert taker != killed
        names.setdefault(taker, names[killed])
        mine = [s for s in spans if s["trace_id"] == f"{run_trace_id(thread):032x}"]
        for item in mine:
            pid = item["resource"]["process.pid"]
            assert item["resource"]["loopwright.instance"] == names[pid], item
        assert_died_sending(mine, killed)
        with psycopg.connect(database_url, autocommit=True) as conn:
            query = "SELECT fence FROM lw_runs WHERE run_id = %s"
            ((fence,),) = conn.execute(query, (thread,)).fetchall()

        shown = cli("show", thread, "--db", database_url, env={}, expect=0).stdout
        dead = f"{names[killed]} ({HOST}:{killed}:*, fence 1)"
        writers(
            shown,
            f"by {dead}",
            f"taken over by {names[taker]} ({taken['attributes']['loopwright.owner']},"
            f" fence {fence}), from {dead}",
        )
