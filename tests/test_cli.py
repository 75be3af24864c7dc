"""The command line as a user meets it, each command in a new process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from langchain_core.messages import AIMessage

from loopwright.checkpoints.database import redact
from loopwright.checkpoints.leases import open_lease_store
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.graph.build import NODES
from loopwright.reports import EXIT_CODES
from loopwright.runner import LEASE_TTL_ENV
from loopwright_refunds.services.admin import list_refunds, slow_down
from loopwright_refunds.services.endpoints import ENV_VAR, ServiceEndpoints
from tests import cli_forkserver
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    REPO,
    UNCRASHED_MODEL_CALLS,
    RunnerFactory,
    cli,
    release_crashed,
    start_cli,
    wait_for,
)


def env_for(services: ServiceEndpoints, tmp_path: Path) -> dict[str, str]:
    return {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}


def test_decision_is_committed_before_execute_and_never_asked_again(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    env = env_for(services, tmp_path)
    crashed = cli(
        "run",
        DEMO_TASK,
        "--user",
        "u-1",
        "--db",
        database_url,
        "--run-id",
        "run-c1",
        env={**env, CRASH_ENV: "node:validate:start"},
    )
    release_crashed(crashed, database_url, "run-c1")

    # A new process reads the checkpoint: the model's decision is there, nothing ran yet.
    with open_test_runner() as runner:
        state = runner.state("run-c1")
        last = state["history"][-1]
        assert isinstance(last, AIMessage)
        assert [c["name"] for c in last.tool_calls] == ["get_order"]
        assert [p["tool"] for p in state["pending"]] == ["get_order"]
        assert state["usage"]["model_requests"] == 1
        assert runner.journal.for_run("run-c1") == []

    resumed = cli("resume", "run-c1", "--db", database_url, env=env, expect=EXIT_CODES["waiting"])
    assert "WAITING_APPROVAL" in resumed.stdout
    listed = cli("approvals", "list", "--db", database_url, env=env, expect=0)
    approval_id = listed.stdout.split()[0]
    approved = cli(
        "approvals",
        "approve",
        approval_id,
        "--as",
        "a-1",
        "--db",
        database_url,
        env=env,
        expect=0,
    )
    assert "COMPLETED" in approved.stdout

    # As many decisions as an uncrashed run (tests/test_refund_run.py): none was asked twice.
    with open_test_runner() as runner:
        assert runner.state("run-c1")["usage"]["model_requests"] == UNCRASHED_MODEL_CALLS
    assert len(list_refunds(services, "O-42")) == 1


def test_graph_lists_all_eight_nodes(tmp_path: Path) -> None:
    result = cli("graph", env={"LOOPWRIGHT_HOME": str(tmp_path)}, expect=0)
    for node in NODES:
        assert node in result.stdout


def test_bad_input_ends_with_one_line_and_nonzero_exit(
    database_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = env_for(services, tmp_path)
    cases = {
        "unknown user": (
            ["run", DEMO_TASK, "--user", "u-404", "--db", database_url],
            "unknown user 'u-404'",
        ),
        "unknown order": (
            ["run", "Refund order O-777 please.", "--user", "u-1", "--db", database_url],
            "unknown order 'O-777'",
        ),
        "unreachable database": (
            [
                "run",
                DEMO_TASK,
                "--user",
                "u-1",
                "--db",
                "postgresql://postgres@127.0.0.1:1/nowhere",
            ],
            "unreachable",
        ),
        # A worker reconnects when a database it reached goes away, but not to one never there.
        "worker, unreachable database": (
            ["worker", "--db", "postgresql://postgres@127.0.0.1:1/nowhere"],
            "unreachable",
        ),
        "bad database url": (
            ["run", DEMO_TASK, "--user", "u-1", "--db", "mysql://x"],
            "database URL",
        ),
        "unknown run": (["resume", "run-nope", "--db", database_url], "no run run-nope"),
        "no run id": (["show", "", "--db", database_url], "no run '' in this database"),
        # Reading commands take a missing file for no database yet, never a directory.
        "runs, a directory": (["runs", "--db", f"sqlite:///{tmp_path}"], "is a directory"),
        "show, a directory": (["show", "r", "--db", f"sqlite:///{tmp_path}"], "is a directory"),
    }
    for name, (args, expected) in cases.items():
        result = cli(*args, env=env)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("loopwright: error:"), (name, result.stderr)
        assert expected.lower() in lines[0].lower(), (name, lines[0])
        assert "Traceback" not in result.stderr


# An application whose dependencies are configured wrong: its settings model refuses them.
MISCONFIGURED_APP = """
from contextlib import contextmanager
from pydantic import BaseModel, HttpUrl
from loopwright import Agent

class Settings(BaseModel):
    desk_url: HttpUrl
    retries: int

@contextmanager
def deps():
    yield Settings.model_validate({"desk_url": "not a url", "retries": "many"})

agent = Agent("desk", instructions="Answer tickets.", deps=deps)
"""


def test_dependencies_that_cannot_be_opened_are_said_in_one_line_with_what_is_wrong(
    tmp_path: Path,
) -> None:
    """Whatever the agent's dependencies raise, the user reads one line that says what is wrong
    with them: for a settings model's refusal, every field and its problem (not pydantic's first
    line, which only counts them), and the reference agent names its variable."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "desk.py").write_text(MISCONFIGURED_APP)
    home = {"LOOPWRIGHT_HOME": str(tmp_path / "home")}
    result = cli("run", "Help me.", "--user", "u-1", "--agent", "desk:agent", env=home, cwd=app)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("loopwright: error: agent desk: its dependencies could not be opened:")
    assert "Settings: desk_url: " in line and "; retries: " in line, line
    for given in ("[]", '{"orders": "http://127.0.0.1:1"}', "{not json"):
        result = cli("run", DEMO_TASK, "--user", "u-1", env={**home, ENV_VAR: given})
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"loopwright: error: agent refunds: its dependencies could not be opened: "
            f"{ENV_VAR}={given!r} is not a JSON object of the orders, policies and payments"
            " services' base URLs\n"
        )


NOWHERE = "http://127.0.0.1:1"
READ_ONLY = (("runs",), ("approvals", "list"), ("runs", "--json"), ("approvals", "list", "--json"))
# About a run or an approval that is not there, or a start no run could take: one line, exit 2,
# and nothing written or started (reject and edit decide through the same code as approve).
REFUSED = {
    ("show", "run-1"): "no run run-1",
    ("cancel", "run-1"): "no run run-1",
    ("resume", "run-1"): "no run run-1",
    ("approvals", "approve", "apr_1", "--as", "a-1"): "no pending approval 'apr_1'",
    ("run", " ", "--user", "u-1"): "the task is empty",
    ("run", DEMO_TASK, "--user", ""): "the user id is empty",
    ("run", DEMO_TASK, "--user", "u-1", "--tenant", "a b"): "the tenant 'a b' is not",
    ("run", DEMO_TASK, "--user", "u-1", "--run-id", "a b"): "the run id holds ' '",
}


def test_reads_and_refused_commands_create_nothing_and_start_no_service(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """In a directory with no database yet, they answer from nothing and write nothing, and so
    does a command about a run or an approval that is not there (cancel, resume, a decision), or
    a start no run could take (an empty task or user, a malformed tenant or run id): no
    database, no .loopwright folder, no business service started. On a database with runs,
    they read it without any business service (the agent's dependencies are never opened: a
    dead service address changes nothing). The first is a new interpreter, importing it all
    there (an import that wrote in its directory would show); the others are forked from the
    command-line server (`tests.cli_forkserver`), with the same environment and directory."""
    empty = tmp_path / "empty"
    empty.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LOOPWRIGHT_HOME")}
    clean["PYTHONPATH"] = str(REPO)
    for n, args in enumerate((*READ_ONLY, *REFUSED)):
        if n == 0:
            result = subprocess.run(
                [sys.executable, "-m", "loopwright", *args],
                cwd=empty,
                env=clean,
                capture_output=True,
                text=True,
                timeout=PATIENCE_S,
            )
        else:
            result = cli_forkserver.shared().run(list(args), clean, empty, PATIENCE_S)
        expected = 2 if args in REFUSED else 0
        assert result.returncode == expected, (args, result.stderr)
        if expected == 2:
            assert re.fullmatch(
                f"loopwright: error: {re.escape(REFUSED[args])}[^\n]*\n", result.stderr
            ), (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert list(empty.iterdir()) == [], args

    env = env_for(services, tmp_path)
    cli(
        "run", DEMO_TASK, "--user", "u-1", "--db", sqlite_url, env=env, expect=EXIT_CODES["waiting"]
    )
    dead = {
        ENV_VAR: ServiceEndpoints(
            orders=NOWHERE, policies=NOWHERE, payments=NOWHERE
        ).model_dump_json()
    }
    listed = {
        args: cli(*args, "--db", sqlite_url, env={**env, **dead}, expect=0) for args in READ_ONLY
    }
    assert "O-42" in listed[("approvals", "list")].stdout
    assert "u-1" in listed[("runs",)].stdout


def test_resume_says_whose_lease_it_waits_for_and_gives_up_at_the_bound(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    """A crashed run another process holds: `resume` says so at once (owner, until when), waits
    at most a lease's length (its own, 2 s here, + 1), then ends with one line and exit 2."""
    env = env_for(services, tmp_path)
    crashed = cli(
        "run",
        DEMO_TASK,
        *("--user", "u-1", "--run-id", "run-held", "--db", database_url),
        env={**env, CRASH_ENV: "node:validate:start"},
    )
    release_crashed(crashed, database_url, "run-held")
    with open_test_runner() as runner:
        runner.leases.claim("run-held", "worker-elsewhere", ttl_s=60)  # another owner's now
    resumed = cli(
        *("resume", "run-held", "--db", database_url),
        env={**env, LEASE_TTL_ENV: "2"},
        expect=EXIT_CODES["usage"],
    )
    first, *rest = resumed.stderr.strip().splitlines()
    assert first.startswith("run run-held is leased by worker-elsewhere until ")
    assert "waiting for it to finish or its lease to expire" in first
    assert rest == [f"loopwright: error: {rest[0].removeprefix('loopwright: error: ')}"]
    assert "run run-held is leased by worker-elsewhere" in rest[0]
    assert resumed.stdout == ""


def test_a_decision_numbers_its_steps_on_from_the_run_and_says_each_problem_once(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """The steps a decision prints go on from the run's own (as `show` numbers them), and a
    write not done is named once in the verify line, not once per place it is recorded."""
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    cli("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-n", env=env, expect=3)
    shown_before = cli("show", "run-n", env=env, expect=0).stdout
    [approval_id] = re.findall(r"apr_[0-9a-f]+", shown_before)[:1]
    rejected = cli(
        *("approvals", "reject", approval_id, "--as", "a-1", "--comment", "not this one"),
        env=env,
        expect=EXIT_CODES["incomplete"],
    )
    numbers = [int(m) for m in re.findall(r"^\s*(\d+) \w", rejected.stdout, re.MULTILINE)]
    steps_before = len(re.findall(r"^\s*\d+ \w", shown_before, re.MULTILINE))
    assert numbers == list(range(steps_before + 1, steps_before + 1 + len(numbers)))
    shown_after = cli("show", "run-n", env=env, expect=0).stdout
    for line in rejected.stdout.splitlines()[: len(numbers)]:
        if line.strip() and line.strip()[0].isdigit():
            assert line in shown_after  # the same step, under the same number
    verify = next(line for line in rejected.stdout.splitlines() if " verify " in line)
    assert verify.count("not done: submit_refund") == 1, verify


def test_an_idle_worker_says_what_it_waits_for(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    """Nothing due: the worker says so once, naming the run another owner holds (and until
    when) and the runs that wait for a person, instead of polling in silence."""
    env = {**env_for(services, tmp_path), "DATABASE_URL": database_url}
    cli("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-asks", env=env, expect=3)
    crashed = cli(
        *("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-held"),
        env={**env, CRASH_ENV: "node:validate:start"},
    )
    release_crashed(crashed, database_url, "run-held")
    with open_test_runner() as runner:
        runner.leases.claim("run-held", "worker-elsewhere", ttl_s=60)
    worker = start_cli(
        "worker", "--poll", "0.1", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert worker.stdout is not None
    output = worker.stdout
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(output.readline, "")))
    reader.start()
    try:
        wait_for(lambda: any(line.startswith("worker: nothing due") for line in lines))
    finally:
        worker.terminate()
        worker.wait(timeout=PATIENCE_S)
        reader.join(timeout=PATIENCE_S)
    [said] = [line for line in lines if line.startswith("worker: nothing due")]
    assert "run run-held leased by worker-elsewhere until " in said, said
    assert "1 waiting for a person" in said, said


def test_an_approval_the_write_asks_to_confirm_needs_yes_and_the_list_shows_its_facts(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """10,000.00 is above the refund agent's confirmation threshold: `approve` without a
    terminal and without --yes is refused in one line, the request waiting on, no refund; the
    list says so, with the facts the agent declares and the expiry in words."""
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    task = "Check whether order O-99 can be refunded and refund it if so."
    waiting = cli("run", task, "--user", "u-2", "--run-id", "run-big", env=env, expect=3)
    [approval_id] = set(re.findall(r"apr_[0-9a-f]+", waiting.stdout))
    assert f"approvals approve {approval_id} --as APPROVER --yes" in waiting.stdout
    listed = cli("approvals", "list", env=env, expect=0).stdout
    assert "  for u-2: " + task in listed and "  Refundable: 10,000.00 USD" in listed
    assert re.search(r"expires in 2[34] h; .*approving asks for a confirmation", listed), listed
    refused = cli("approvals", "approve", approval_id, "--as", "a-1", env=env, expect=2)
    assert refused.stderr.strip() == (
        "loopwright: error: approving 'Refund 10000.00 USD to order O-99' needs a confirmation:"
        f" add --yes; {approval_id} still waits for a decision"
    )
    assert list_refunds(services, "O-99") == []
    assert approval_id in cli("approvals", "list", env=env, expect=0).stdout
    cli("approvals", "approve", approval_id, "--as", "a-1", "--yes", env=env, expect=0)
    assert [r["amount"] for r in list_refunds(services, "O-99")] == ["10000.00"]


def test_a_principal_is_a_tenants_user_on_the_command_line(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """`--tenant` names the user's tenant, as a token does on the server: u-1 of bank-b is not
    the default tenant's u-1 (their order is refused, nothing started), and an approver of
    bank-b neither lists nor decides the default tenant's approval; lw_runs keeps each run's
    tenant. A name that is no tenant's is one line, exit 2."""
    env = {**env_for(services, tmp_path), "DATABASE_URL": sqlite_url}
    foreign = cli("run", DEMO_TASK, "--user", "u-1", "--tenant", "bank-b", env=env, expect=2)
    assert "tenant 'default', not 'bank-b'" in foreign.stderr, foreign.stderr
    odd = cli("run", DEMO_TASK, "--user", "u-1", "--tenant", "bank b", env=env, expect=2)
    assert odd.stderr.count("\n") == 1 and "is not a tenant's name" in odd.stderr
    waiting = cli("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-t", env=env, expect=3)
    [approval_id] = set(re.findall(r"apr_[0-9a-f]+", waiting.stdout))

    def listed(*tenant: str) -> str:
        return cli("approvals", "list", *tenant, env=env, expect=0).stdout

    assert approval_id in listed() and approval_id in listed("--tenant", "default")
    assert approval_id not in listed("--tenant", "bank-b")
    approve = ("approvals", "approve", approval_id, "--as", "a-1", "--yes")
    refused = cli(*approve, "--tenant", "bank-b", env=env, expect=2)
    assert f"no pending approval '{approval_id}' of tenant 'bank-b'" in refused.stderr
    assert list_refunds(services, "O-42") == []
    cli(*approve, env=env, expect=0)  # the default tenant's approver
    assert len(list_refunds(services, "O-42")) == 1
    with open_lease_store(sqlite_url) as leases:
        record = leases.get("run-t")
    assert record is not None and record.tenant == "default"


def test_ctrl_c_keeps_the_committed_steps_and_says_how_the_run_goes_on(
    database_url: str, services: ServiceEndpoints, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    """SIGINT while a tool waits on a slow service: exit 130, one line naming the run and the
    command that continues it, and `resume` goes on from the last committed step (no decision
    asked of the model again)."""
    env = env_for(services, tmp_path)
    slow_down(services.policies, 8.0)
    command = ("run", DEMO_TASK, "--user", "u-1", "--run-id", "run-int", "--db", database_url)
    started = start_cli(*command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert started.stdout is not None
    for line in started.stdout:  # the policy read is in flight once validate allowed it
        if "allows get_policy" in line:
            break
    started.send_signal(signal.SIGINT)
    _, stderr = started.communicate(timeout=PATIENCE_S)
    assert started.returncode == 130
    assert stderr.splitlines() == [
        "loopwright: interrupted: run run-int keeps the steps it committed; go on with:"
        f" loopwright resume run-int --db {redact(database_url)}"
    ]
    slow_down(services.policies, 0.0)
    cli("resume", "run-int", "--db", database_url, env=env, expect=EXIT_CODES["waiting"])
    with open_test_runner() as runner:
        # get_order, get_policy, submit_refund: each decided once.
        assert runner.state("run-int")["usage"]["model_requests"] == 3
