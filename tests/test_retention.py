"""The retention job: the one path that removes checkpoints of a run with journaled actions.

A finished run's checkpoints go; its journal, its lw_runs row and a final summary stay, so
`show` and `runs` still say how it ended; a run waiting for a person is untouched; --dry-run
changes nothing; a pruned run cannot be started over.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from loopwright.checkpoints.leases import RunPruned
from loopwright.checkpoints.retention import checkpoint_bytes, retain
from loopwright.checkpoints.sql import open_database
from loopwright.checkpoints.writers import ANSWER, RESUME, START, Writer, handed_over
from loopwright.decisions import DecisionRefused
from loopwright.reports import EXIT_CODES, run_history_document
from loopwright.timeline import Handover, kept_writers, render_pruned_run
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests import docs_pages
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, approve, cli, principal

WAITING_TASK = "Check whether order O-47 can be refunded and refund it if so."


def documented_commands() -> list[list[str]]:
    """The retention commands of docs/operating.md's Retention section, as argument lists."""
    [block] = docs_pages.blocks("docs/operating.md", "sh", "Retention")
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert lines and all(line[:2] == ["loopwright", "retention"] for line in lines), lines
    return [line[1:] for line in lines]


def journal_rows(url: str) -> list[Any]:
    with open_database(url) as db:
        return [
            db.execute("SELECT * FROM lw_actions ORDER BY action_id"),
            db.execute("SELECT * FROM lw_action_events ORDER BY action_id, seq"),
            db.execute("SELECT run_id, phase, task, user_id FROM lw_runs ORDER BY run_id"),
        ]


def sizes(url: str, *run_ids: str) -> list[tuple[int, int]]:
    """(checkpoints, bytes) of each run, then of the whole database."""
    with open_database(url) as db:
        return [*(checkpoint_bytes(db, run_id) for run_id in run_ids), checkpoint_bytes(db)]


def test_retention_keeps_the_journal_and_a_summary_and_never_touches_a_waiting_run(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    with open_test_runner() as runner:
        done = approve(runner, runner.start(DEMO_TASK, principal(), run_id="run-done"))
        assert done.stop_reason == "completed"
        waiting = runner.start(WAITING_TASK, principal(task=WAITING_TASK), run_id="run-waiting")
        assert waiting.waiting_for_approval
    journal = journal_rows(database_url)
    before = sizes(database_url, "run-done", "run-waiting")
    assert before[0][0] > 0 and before[1][0] > 0

    # Both ended (or stopped) just now: nothing is older than a day.
    recent = retain(database_url, 1)
    assert (recent.pruned, recent.kept) == ([], [])

    dry = retain(database_url, 0, dry_run=True)
    assert [run.run_id for run in dry.pruned] == ["run-done"]
    assert [(run.run_id, run.kept) for run in dry.kept] == [
        ("run-waiting", "not finished (waiting)")
    ]
    assert sizes(database_url, "run-done", "run-waiting") == before
    assert dry.bytes_after == dry.bytes_before == before[2][1]

    pruned = retain(database_url, 0)
    assert [run.run_id for run in pruned.pruned] == ["run-done"]
    after = sizes(database_url, "run-done", "run-waiting")
    assert after[0] == (0, 0)  # every checkpoint, write and blob of the finished run is gone
    assert after[1] == before[1]  # the waiting run's, untouched
    assert pruned.bytes_before - pruned.bytes_after == before[0][1] > 0
    print(f"\ncheckpoint bytes: {pruned.bytes_before} before, {pruned.bytes_after} after")
    assert journal_rows(database_url) == journal
    assert retain(database_url, 0).pruned == []  # a pruned run is pruned once

    with open_test_runner() as runner:
        outcome = runner.outcome("run-done")
        assert (outcome.phase, outcome.stop_reason) == ("COMPLETED", "completed")
        assert outcome.verification and outcome.verification["verified"]
        assert outcome.pruned is not None and outcome.pruned.answer
        assert outcome.pruned.actions == {a.action_id: "SUCCEEDED" for a in outcome.actions}
        with pytest.raises(RunPruned):  # from an empty state it would start over
            runner.start(DEMO_TASK, principal(), run_id="run-done")
        # Its decisions went with its checkpoints: one now is refused as for any other run.
        with pytest.raises(DecisionRefused, match="does not wait on this run") as refused:
            runner.decide("run-done", "approve", "a-2", approval_id="apr_0123456789abcdef")
        assert refused.value.status == 409
        # The waiting run still waits for the same approval.
        assert runner.outcome("run-waiting").waiting_for_approval == waiting.waiting_for_approval

    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    shown = cli("show", "run-done", "--db", database_url, env=env, expect=0)
    assert "pruned by the retention job" in shown.stdout
    assert "COMPLETED: completed" in shown.stdout and "SUCCEEDED" in shown.stdout
    history = json.loads(cli("show", "run-done", "--db", database_url, "--json", env=env).stdout)
    assert (history["stop_reason"], history["pruned"]["bytes"]) == ("completed", before[0][1])
    listed = json.loads(cli("runs", "--db", database_url, "--json", env=env, expect=0).stdout)
    ends = {run["run_id"]: (run["phase"], run["stop_reason"]) for run in listed["runs"]}
    assert ends == {
        "run-done": ("COMPLETED", "completed"),
        "run-waiting": ("WAITING_APPROVAL", None),
    }
    resumed = cli("resume", "run-done", "--db", database_url, env=env)
    assert resumed.returncode == EXIT_CODES["usage"]
    assert resumed.stderr.strip().count("\n") == 0 and "pruned" in resumed.stderr

    for line in documented_commands():  # the page's, on this database: nothing 90 days old
        result = cli(*line, "--db", database_url, env=env, expect=0)
        assert "0 runs" in result.stdout or json.loads(result.stdout)["pruned"] == []
    report = cli("retention", "--older-than", "0", "--db", database_url, "--json", env=env)
    document = json.loads(report.stdout)
    assert document["schema"] == "loopwright.retention/1"
    assert document["pruned"] == [] and document["kept"][0]["run_id"] == "run-waiting"


def test_retention_refuses_bad_input_in_one_line(sqlite_url: str, tmp_path: Path) -> None:
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home")}
    for args in (
        ["--older-than", "-1", "--db", sqlite_url],
        ["--db", sqlite_url],
        ["--older-than", "1", "--db", f"sqlite:///{tmp_path / 'none.db'}"],
    ):
        result = cli("retention", *args, env=env)
        assert result.returncode == EXIT_CODES["usage"], (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "none.db").exists()  # nothing is created where there is no database


def test_a_pruned_run_still_says_who_wrote_it(
    database_url: str, open_test_runner: RunnerFactory
) -> None:
    """Retention keeps who wrote the run's checkpoints, each writer from where it took the run:
    `show` of the pruned run names the same writers, taking the run the same ways, as it did
    before the run's steps went (only the step numbers go). A run pruned before summaries kept
    writers says they were not kept."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal(), run_id="run-two-writers")
    with open_test_runner() as runner:  # the approval is another attempt: another writer
        assert approve(runner, waiting).stop_reason == "completed"
        live = run_history_document(runner, runner.outcome("run-two-writers"))["writers"]
    assert [w["how"] for w in live] == ["first", "answered"]
    assert live[0]["owner"] != live[1]["owner"]

    assert [run.run_id for run in retain(database_url, 0).pruned] == ["run-two-writers"]
    with open_test_runner() as runner:
        outcome = runner.outcome("run-two-writers")
        kept = run_history_document(runner, outcome)["writers"]
        assert kept == [{**writer, "step": None} for writer in live]
        shown = Console(record=True, width=400)
        render_pruned_run(runner, outcome, shown)
        text = shown.export_text()
        assert f"── by {live[0]['owner']} (fence {live[0]['fence']})" in text
        assert f"── by {live[1]['owner']} (fence {live[1]['fence']}), with the answer" in text

        runner.leases.db.execute("UPDATE lw_run_summaries SET writers = NULL")  # pruned before
        outcome = runner.outcome("run-two-writers")
        assert run_history_document(runner, outcome)["writers"] is None
        shown = Console(record=True, width=400)
        render_pruned_run(runner, outcome, shown)
        assert "not kept: the run was pruned before summaries kept its writers" in (
            shown.export_text()
        )


def test_the_writers_kept_are_each_writer_from_where_it_took_the_run() -> None:
    """Checkpoints by the writer of the one before add no writer, nor do those written before
    writers were named; each writer kept takes the run as `show` heads a writer's steps."""
    first = Writer("h:1:a", 1, START, "aegra-1")
    other = Writer("h:2:b", 2, RESUME)
    again = Writer("h:2:b", 3, RESUME)
    answered = Writer("h:3:c", 4, ANSWER)
    stamps = [None, first.metadata(), first.metadata(), {"step": 2}, other.metadata()]
    stamps += [again.metadata(), again.metadata(), answered.metadata()]
    writers = handed_over(stamps)
    assert writers == [first, other, again, answered]
    assert kept_writers(writers) == [
        (Handover.FIRST, first, None),
        (Handover.TAKEN_OVER, other, first),
        (Handover.AGAIN, again, other),
        (Handover.ANSWERED, answered, again),
    ]
