"""Upgrades with runs in flight, in one process per version: a run begun by version 1 and
continued by version 2 is version 2's from then on (lw_runs), and the version that decided each
step (checkpoint metadata) and each change of each action (the journal) is recorded;
`loopwright runs --unfinished --version 1` lists what an upgrade still has to see through.
The same on Aegra instances rolled from one version to the next: tests/test_aegra_upgrade.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopwright.checkpoints.leases import open_lease_store
from loopwright.checkpoints.writers import VERSION_METADATA_KEY
from loopwright.run_list import run_lines
from loopwright.runner import Runner, open_runner
from loopwright_refunds.agent import agent as version_1
from loopwright_refunds.agent import connect
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import DEMO_TASK, approve, cli, principal
from tests.test_cli import env_for
from tests.upgraded_agent import agent as version_2

OTHER_TASK = "Check whether order O-46 can be refunded and refund it if so."


def step_versions(runner: Runner, run_id: str) -> list[str | None]:
    """The agent version that wrote each of the run's checkpoints, oldest first."""
    history = runner.graph.get_state_history(runner.config(run_id))
    return [s.metadata.get(VERSION_METADATA_KEY) for s in reversed(list(history)) if s.metadata]


def event_versions(runner: Runner, run_id: str) -> list[tuple[str, str | None]]:
    """Each journal change of the run's actions, with the version that made it."""
    return [
        (event.to_status.value, event.version)
        for events in runner.history(run_id).values()
        for event in events
    ]


def unfinished(runner: Runner, version: str) -> list[str]:
    return [
        line.record.run_id for line in run_lines(runner, version=version, unfinished=True).lines
    ]


def test_a_run_continued_by_a_new_version_records_which_version_decided_what(
    database_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    with connect(services) as deps, open_runner(database_url, version_1, deps=deps) as old:
        approved = old.start(DEMO_TASK, principal(), run_id="run-up-1")
        waiting = old.start(OTHER_TASK, principal(task=OTHER_TASK), run_id="run-up-2")
        assert approved.phase == waiting.phase == "WAITING_APPROVAL"
        assert unfinished(old, "1") == ["run-up-2", "run-up-1"]
        assert unfinished(old, "2") == []

    with connect(services) as deps, open_runner(database_url, version_2, deps=deps) as new:
        done = approve(new, approved)
        assert done.stop_reason == "completed"
        record = new.leases.get("run-up-1")
        assert record is not None and record.agent_version == "2"
        # Begun by version 1 (V in its first checkpoint), continued and ended by version 2.
        assert new.state("run-up-1")["versions"]["agent_version"] == "1"
        versions = step_versions(new, "run-up-1")
        first_2 = versions.index("2")
        assert set(versions[:first_2]) <= {"1", None} and "1" in versions[:first_2]
        assert set(versions[first_2:]) == {"2"}
        # The refund was planned and put to a person by version 1; approved, sent and confirmed
        # by version 2.
        assert event_versions(new, "run-up-1") == [
            ("NEEDS_APPROVAL", "1"),
            ("APPROVED", "2"),
            ("DISPATCHED", "2"),
            ("SUCCEEDED", "2"),
        ]
        assert len(list_refunds(services, "O-42")) == 1
        # What version 1 still holds: the run that waits, not the ended one.
        assert unfinished(new, "1") == ["run-up-2"]
        assert unfinished(new, "2") == []
        assert [line.record.run_id for line in run_lines(new, version="2").lines] == ["run-up-1"]

    env = {**env_for(services, tmp_path), "DATABASE_URL": database_url}
    listed = json.loads(cli("runs", "--unfinished", "--version", "1", "--json", env=env).stdout)
    assert [(r["run_id"], r["agent_version"]) for r in listed["runs"]] == [("run-up-2", "1")]
    assert (
        json.loads(cli("runs", "--unfinished", "--version", "2", "--json", env=env).stdout)["runs"]
        == []
    )
    with open_lease_store(database_url) as leases:
        assert {r.run_id: r.agent_version for r in leases.runs()} == {
            "run-up-1": "2",
            "run-up-2": "1",
        }

    # A run whose last writer died before noting its end in lw_runs is noted by whichever process
    # looks at it next: the run stays the version that wrote its last step, not that process's.
    with open_lease_store(database_url) as leases:
        leases.db.write("UPDATE lw_runs SET phase = 'VERIFYING' WHERE run_id = 'run-up-1'")
    with connect(services) as deps, open_runner(database_url, version_1, deps=deps) as old:
        assert old.resume("run-up-1").stop_reason == "completed"
        record = old.leases.get("run-up-1")
        assert record is not None and (record.phase, record.agent_version) == ("COMPLETED", "2")
