"""`--json` and exit codes: what scripts read from each command, as docs/cli.md documents.

Every command runs in a new process, as a script would run it. stdout must be one JSON
document and nothing else (no timeline, no prompt), the exit code must say where the run
stands (`loopwright.reports.EXIT_CODES`), and a sensitive value must not appear in any
document.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from loopwright.reports import EXIT_CODES
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests import claiming_agent as claiming
from tests import docs_pages
from tests.card_payments import CARD
from tests.card_payments import TASK as CARD_TASK
from tests.runtime_fixtures import DEMO_TASK, PATIENCE_S, REPO, cli
from tests.test_cli import env_for

OTHER_TASK = "Check whether order O-46 can be refunded and refund it if so."  # 1,000.00


def document(*args: str, env: dict[str, str], expect: int, schema: str) -> dict[str, Any]:
    """The one JSON document `loopwright ARGS --json` prints, after checking its exit code."""
    result = cli(*args, "--json", env=env, expect=expect)
    parsed: dict[str, Any] = json.loads(result.stdout)  # the whole of stdout: nothing else
    assert parsed["schema"] == schema, parsed
    return parsed


def test_a_run_that_waits_is_approved_read_back_and_listed_in_json(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    started = document(
        *("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-j1"),
        env=env,
        expect=EXIT_CODES["waiting"],
        schema="loopwright.run/1",
    )
    assert (started["run_id"], started["phase"], started["stop_reason"]) == (
        "run-j1",
        "WAITING_APPROVAL",
        None,
    )
    assert (started["agent"], started["exit_code"]) == ("refunds", EXIT_CODES["waiting"])
    [request] = started["waiting_for_approval"]
    assert request["args"]["order_id"] == "O-42" and request["run_id"] == "run-j1"
    [waiting] = started["actions"]
    assert (waiting["tool"], waiting["status"]) == ("submit_refund", "NEEDS_APPROVAL")

    listed = document("approvals", "list", env=env, expect=0, schema="loopwright.approvals/1")
    assert [a["approval_id"] for a in listed["approvals"]] == [request["approval_id"]]

    approved = document(
        *("approvals", "approve", request["approval_id"], "--as", "a-1"),
        env=env,
        expect=EXIT_CODES["completed"],
        schema="loopwright.run/1",
    )
    assert (approved["phase"], approved["stop_reason"]) == ("COMPLETED", "completed")
    [refund] = list_refunds(services, "O-42")
    [done] = approved["actions"]
    assert done["status"] == "SUCCEEDED" and done["outcome"]["refund_id"] == refund["refund_id"]
    assert approved["verification"]["verified"] is True
    assert approved["waiting_for_approval"] == []

    shown = document("show", "run-j1", env=env, expect=0, schema="loopwright.run-history/1")
    assert (shown["task"], shown["user"]) == (DEMO_TASK, "u-1")
    assert (
        shown["steps"][:2] == ["compile_context", "model_step"] and shown["steps"][-1] == "verify"
    )
    assert "approval" in shown["steps"]
    [history] = [a["history"] for a in shown["actions"]]
    assert [e["to"] for e in history] == ["NEEDS_APPROVAL", "APPROVED", "DISPATCHED", "SUCCEEDED"]

    # Resuming a run that has ended changes nothing and says again where it stands.
    again = document("resume", "run-j1", env=env, expect=0, schema="loopwright.run/1")
    assert again["stop_reason"] == "completed" and len(list_refunds(services, "O-42")) == 1

    runs = document("runs", env=env, expect=0, schema="loopwright.runs/1")
    [line] = runs["runs"]
    assert (line["run_id"], line["phase"], line["task"], line["unconfirmed"]) == (
        "run-j1",
        "COMPLETED",
        DEMO_TASK,
        [],
    )


def test_a_rejected_and_a_cancelled_run_end_incomplete_with_their_stop_reason(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    waiting = {}
    for run_id, task in (("run-rej", DEMO_TASK), ("run-can", OTHER_TASK)):
        started = document(
            *("run", task, "--user", "u-1", "--run-id", run_id),
            env=env,
            expect=EXIT_CODES["waiting"],
            schema="loopwright.run/1",
        )
        waiting[run_id] = started["waiting_for_approval"][0]["approval_id"]

    rejected = document(
        *("approvals", "reject", waiting["run-rej"], "--as", "a-1", "--comment", "no"),
        env=env,
        expect=EXIT_CODES["incomplete"],
        schema="loopwright.run/1",
    )
    assert (rejected["phase"], rejected["stop_reason"]) == ("INCOMPLETE", "not_done")
    assert [a["status"] for a in rejected["actions"]] == ["REJECTED"]

    cancelled = document(
        "cancel", "run-can", env=env, expect=EXIT_CODES["incomplete"], schema="loopwright.run/1"
    )
    assert (cancelled["phase"], cancelled["stop_reason"]) == ("INCOMPLETE", "cancelled")
    assert list_refunds(services, "O-42") == list_refunds(services, "O-46") == []


def test_an_unknown_run_is_a_usage_error_with_nothing_on_stdout(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    for command in ("show", "resume", "cancel"):
        result = cli(command, "nope", "--json", env=env, expect=EXIT_CODES["usage"])
        assert result.stdout == "" and result.stderr.startswith("loopwright: error:"), command


def test_the_demo_prints_its_document_alone(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = env_for(services, tmp_path)
    # Without --yes and without a terminal, the demo asks no one: it waits, and says so.
    waiting = document(
        *("demo", "--db", f"sqlite:///{tmp_path / 'other.sqlite3'}"),
        env=env,
        expect=EXIT_CODES["waiting"],
        schema="loopwright.run/1",
    )
    assert waiting["waiting_for_approval"][0]["args"]["order_id"] == "O-42"
    demo = document(
        "demo", "--yes", "--db", sqlite_url, env=env, expect=0, schema="loopwright.run/1"
    )
    [refund] = list_refunds(services, "O-42")
    assert demo["actions"][0]["outcome"]["refund_id"] == refund["refund_id"]


def test_a_sensitive_value_is_in_no_document(sqlite_url: str, tmp_path: Path) -> None:
    """The card number is in the task, the arguments, the outcome and the answer: it is
    redacted in arguments and outcomes by field, and blanked by value everywhere else."""
    env = {
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
        "DATABASE_URL": sqlite_url,
        "LOOPWRIGHT_AGENT": "tests.card_payments:paying",
    }
    run = cli("run", CARD_TASK, "--user", "u-1", "--run-id", "run-card", "--json", env=env)
    shown = cli("show", "run-card", "--json", env=env, expect=0)
    runs = cli("runs", "--json", env=env, expect=0)
    assert run.returncode == EXIT_CODES["completed"], run.stderr
    for printed in (run.stdout, shown.stdout, runs.stdout):
        assert CARD not in printed and "[redacted]" in printed, printed
    history = json.loads(shown.stdout)
    assert history["actions"][0]["args"]["card_number"] == "[redacted]"
    assert history["task"] == "Pay 10.00 for order O-42 with card [redacted]."


def test_the_cli_page_script_approves_what_waits_and_reads_completed(
    services: ServiceEndpoints, tmp_path: Path
) -> None:
    """As a user pastes it: in a directory of their own, on the embedded default database."""
    home = tmp_path / "home"
    env = {
        **os.environ,
        **services.to_env(),
        "LOOPWRIGHT_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        ["bash", "-c", docs_pages.block_with("docs/cli.md", "sh", "--json > run.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed", result.stdout + result.stderr
    assert [r["amount"] for r in list_refunds(services, "O-46")] == ["1000.00"]


def test_completed_with_effects_with_no_effect_and_with_a_refusal_exit_apart(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """A script tells the three completed endings apart by the exit code and `ending.kind`
    alone, and reads what happened from the runtime's account, never from the model's answer:
    a refund refused by the refund window and then claimed in words ends 7, not 0."""
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    ask = ("run", claiming.TASK, "--user", "u-1")
    nothing = document(*ask, env=env, expect=6, schema="loopwright.run/1")
    refused = document(
        *ask, "--agent", "tests.claiming_agent:agent", env=env, expect=7, schema="loopwright.run/1"
    )
    for ended, kind in ((nothing, "completed_no_effect"), (refused, "completed_with_refusal")):
        assert (ended["stop_reason"], ended["exit_code"]) == ("completed", EXIT_CODES[kind])
        ending = ended["ending"]
        assert ending["kind"] == kind and ending["effects"] == []
        assert ended["stop_detail"] == ending["statement"]
        assert ending["statement"].startswith("no business effect: ")
        assert ending["answer_notes"][0].startswith("this run made no business effect")
    [rule] = refused["ending"]["refusals"]
    assert (rule["by"], rule["tool"], rule["code"]) == (
        "rule",
        "submit_refund",
        "outside_refund_window",
    )
    assert refused["ending"]["model_answer"] == claiming.CLAIM
    assert claiming.CLAIM not in refused["stop_detail"]
    assert (
        "it names 'O-44', which no verified effect of this run holds"
        in (refused["ending"]["answer_notes"])
    )

    text = cli(*ask, "--agent", "tests.claiming_agent:agent", env=env, expect=7).stdout
    report = text[text.index("\nCOMPLETED run ") :].splitlines()[2:]
    assert report[0] == "  no business effect: this run changed nothing in the business system"
    assert report[1].startswith("  refused by a rule: submit_refund (outside_refund_window: ")
    assert report[2] == (
        "  the model's answer (its own words; loopwright vouches only for the lines above): "
        + claiming.CLAIM
    )

    made = document("demo", "--yes", env=env, expect=0, schema="loopwright.run/1")
    assert made["ending"]["kind"] == "completed" and made["ending"]["effects"][0]["verified"]
    assert made["stop_detail"].startswith("verified in the business system: Refund 100.00 USD")
    assert list_refunds(services, "O-44") == []
