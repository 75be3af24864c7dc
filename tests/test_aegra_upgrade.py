"""A rolling upgrade on Aegra: two instances of version 1 replaced by two of version 2 while
runs wait for a person and a write is in flight.

The roll starts the new instances first, then stops the old ones: one is killed while it holds
a write whose request is on its way (DISPATCHED journaled, the payment service slowed down, so
the answer never arrives), the other is stopped with SIGTERM (it hands its runs back). Any
instance continues any run (docs/architecture.md, "Upgrades"): the runs waiting for a person
are decided through a version 2 instance, the write cut off is reconciled there. Every run ends
once, with one refund per order, and the version that decided each step (checkpoint metadata)
and each change of each action (the journal) is the version of the process that made it.

Skipped where Aegra is not installed or Redis is unreachable.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopwright_refunds.services.admin import create_order, list_refunds, slow_down
from tests import test_aegra_scaleout
from tests.runtime_fixtures import REPO, cli
from tests.test_aegra_scaleout import (
    GRAPH,
    Cluster,
    Instance,
    deployment,
    pid_of,
    refund_task,
    wait_until_completed,
)
from tests.test_server_langgraph import decision_for, values_of

pytestmark = test_aegra_scaleout.pytestmark

VERSION_2 = {"LOOPWRIGHT_AGENT": "tests.upgraded_agent:agent", "PYTHONPATH": str(REPO)}


@pytest.fixture
def rolled(postgres_server_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with deployment(postgres_server_url, tmp_path / "deployment") as running:
        yield running


def unfinished_at(cluster: Cluster, version: str, tmp_path: Path) -> set[str]:
    """`loopwright runs --unfinished --version V`, as an operator runs it during a drain."""
    env = {"DATABASE_URL": cluster.database_url, "LOOPWRIGHT_HOME": str(tmp_path / "cli")}
    listed = cli("runs", "--unfinished", "--version", version, "--json", env=env, expect=0)
    return {run["run_id"] for run in json.loads(listed.stdout)["runs"]}


# Runs that write are started in waves until an old instance is caught with a write in flight:
# the engine hands each run to whichever instance takes it first, so one wave may go to the new
# instances alone (seen on a loaded machine: eight runs, none on an old instance).
WAVE, MAX_WAVES = 4, 10


def kill_with_a_write_in_flight(
    cluster: Cluster, old: list[Instance], start_writing: Callable[[int], list[str]]
) -> tuple[Instance, str]:
    """SIGKILL whichever of `old` first holds a run whose write is DISPATCHED and unanswered;
    the instance is stopped (SIGSTOP) and asked about again first, so that the write cannot be
    answered between the question and the kill. A wave of `start_writing` at a time, the next
    once every run of the last has completed without being caught. The instance and the run."""
    by_pid = {instance.process.pid: instance for instance in old}
    for _ in range(MAX_WAVES):
        wave = start_writing(WAVE)
        while not completed(cluster, wave):
            for owner, run_id in in_flight(cluster):
                instance = by_pid.get(pid_of(owner))
                if instance is None:
                    continue
                os.kill(instance.process.pid, signal.SIGSTOP)
                time.sleep(0.3)
                if (owner, run_id) in in_flight(cluster):
                    os.kill(instance.process.pid, signal.SIGKILL)
                    instance.process.wait()
                    return instance, run_id
                os.kill(instance.process.pid, signal.SIGCONT)
            time.sleep(0.05)
    pytest.fail(f"no old instance sent a write in {MAX_WAVES} waves of {WAVE} runs")


def completed(cluster: Cluster, threads: list[str]) -> bool:
    done = cluster.sql(
        "SELECT 1 FROM lw_runs WHERE run_id = ANY(%s) AND phase = 'COMPLETED'", threads
    )
    return len(done) == len(threads)


def in_flight(cluster: Cluster) -> list[tuple[str, str]]:
    """(owner, run) of every run whose write is DISPATCHED under a live lease."""
    rows = cluster.sql(
        "SELECT r.owner, r.run_id FROM lw_actions a JOIN lw_runs r USING (run_id)"
        " WHERE a.status = 'DISPATCHED' AND r.owner IS NOT NULL AND r.lease_expires_at > now()"
    )
    return [(str(owner), str(run_id)) for owner, run_id in rows]


def test_rolling_two_instances_to_version_2_ends_every_run_once(
    rolled: Cluster, tmp_path: Path
) -> None:
    cluster = rolled
    old = [cluster.start("v1-a"), cluster.start("v1-b")]
    customer, approver = old[0].client("t-u1"), old[0].client("t-a1")
    waiting: dict[str, str] = {}  # thread -> order
    for order_id in ("O-8000", "O-8001"):
        create_order(cluster.services, order_id, "u-1", "80.00")  # above the approval threshold
        thread_id = customer.threads.create()["thread_id"]
        customer.runs.wait(thread_id, GRAPH, input={"task": refund_task(order_id)})
        assert approver.threads.get_state(thread_id)["interrupts"]
        waiting[thread_id] = order_id
    assert unfinished_at(cluster, "1", tmp_path) == set(waiting)

    new = [cluster.start_with("v2-a", **VERSION_2), cluster.start_with("v2-b", **VERSION_2)]
    version_of = {i.process.pid: v for v, group in (("1", old), ("2", new)) for i in group}
    writing: dict[str, str] = {}
    slow_down(cluster.services.payments, 1.5, ("POST",))  # every refund's answer takes 1.5 s

    def start_writing(count: int) -> list[str]:
        wave = []
        for _ in range(count):
            order_id = f"O-{8010 + len(writing)}"
            create_order(cluster.services, order_id, "u-1", "20.00")  # no approval needed
            thread_id = customer.threads.create()["thread_id"]
            customer.runs.create(thread_id, GRAPH, input={"task": refund_task(order_id)})
            writing[thread_id] = order_id
            wave.append(thread_id)
        return wave

    killed, cut_off = kill_with_a_write_in_flight(cluster, old, start_writing)
    [stopped] = [instance for instance in old if instance is not killed]
    stopped.process.send_signal(signal.SIGTERM)
    stopped.process.wait(timeout=60)
    wait_until_completed(cluster, list(writing))
    new_approver = new[1].client("t-a1")
    for thread_id in waiting:
        [interrupt] = new_approver.threads.get_state(thread_id)["interrupts"]
        decision = decision_for(dict(interrupt), "approve", "a-1")
        new_approver.runs.wait(thread_id, GRAPH, command={"resume": decision})
    wait_until_completed(cluster, list(waiting))

    # Every run ended once: completed and verified, one refund per order.
    for thread_id, order_id in {**waiting, **writing}.items():
        state = values_of(new[0].client("t-u1"), thread_id)
        assert state["stop_reason"] == "completed" and state["verification"]["verified"]
        assert len(list_refunds(cluster.services, order_id)) == 1, order_id
    # Each step's version is the version of the process that wrote it, and the run's version in
    # lw_runs is that of the process that wrote its last step.
    steps = cluster.sql(
        "SELECT thread_id, metadata->>'lw_writer', metadata->>'lw_version' FROM checkpoints"
        " WHERE metadata ? 'lw_writer' ORDER BY thread_id, checkpoint_id"
    )
    last_version: dict[str, str] = {}
    for thread_id, writer, version in steps:
        assert version == version_of[pid_of(writer)], (thread_id, writer, version)
        last_version[thread_id] = version
    runs = dict(cluster.sql("SELECT run_id, agent_version FROM lw_runs"))
    assert runs == last_version
    assert all(runs[thread_id] == "2" for thread_id in [*waiting, cut_off])
    # The journal: a waiting run's refund was put to a person by version 1, approved, sent and
    # confirmed by version 2; the write cut off was sent by version 1 and found out by 2.
    events = journal_versions(cluster)
    for thread_id in waiting:
        assert events[thread_id] == [
            ("NEEDS_APPROVAL", "1"),
            ("APPROVED", "2"),
            ("DISPATCHED", "2"),
            ("SUCCEEDED", "2"),
        ]
    sent = [status for status, _ in events[cut_off]].index("DISPATCHED")
    assert {version for _, version in events[cut_off][: sent + 1]} == {"1"}
    after = events[cut_off][sent + 1 :]
    assert ("UNKNOWN", "2") in after and after[-1] == ("SUCCEEDED", "2")
    assert {version for _, version in after} == {"2"}
    # Drained: nothing unfinished is left at version 1 (nor at 2).
    assert unfinished_at(cluster, "1", tmp_path) == set()
    assert unfinished_at(cluster, "2", tmp_path) == set()


def journal_versions(cluster: Cluster) -> dict[str, list[tuple[str, str]]]:
    """Each run's journal changes in order, with the version that made each."""
    found: dict[str, list[tuple[str, str]]] = {}
    for run_id, status, version in cluster.sql(
        "SELECT a.run_id, e.to_status, e.detail->>'version' FROM lw_action_events e"
        " JOIN lw_actions a USING (action_id) ORDER BY a.run_id, a.created_at, e.seq"
    ):
        found.setdefault(run_id, []).append((status, version))
    return found
