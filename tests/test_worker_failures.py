"""A run whose attempts fail with an error is retried with a growing backoff, and the worker goes
on with the other runs: one poisoned run never takes the workers down. A run whose attempts keep
failing, in an error or with their process, ends typed."""

from __future__ import annotations

import io
import json
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import BaseModel
from rich.console import Console

from loopwright.attempt import MAX_FAILURES
from loopwright.checkpoints.leases import RunRecord, failure_backoff_s, open_lease_store
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.state import ENDED_PHASES
from loopwright.outcome import RunOutcome
from loopwright.run_list import render_runs, run_lines
from loopwright.runner import Runner, open_runner
from loopwright.testing.scripted import Decision, ScriptedChatModel
from loopwright.timeline import render_run
from loopwright.tools.contract import Effect, ToolArgs, ToolContext, ToolContract
from loopwright.worker import work
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.scratch import with_application_name
from loopwright_refunds.services.admin import create_order, list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    PATIENCE_S,
    RunnerFactory,
    cli,
    principal,
    release_crashed,
    start_cli,
    wait_for,
)

POISONED = "Check the flaky ledger."
HEALTHY = "Say hello."


class NoArgs(ToolArgs):
    pass


class Nothing(BaseModel):
    pass


class Ledger:
    """A client with a bug that raises (not a ToolFault: nothing in the runtime expects it)."""

    fixed = False

    @classmethod
    def read(cls, _ctx: ToolContext[Any], _args: NoArgs, _key: str | None) -> dict[str, Any]:
        if not cls.fixed:
            raise RuntimeError("ledger client bug")
        return {}


BUGGY_READ = ToolContract(
    name="read_ledger",
    description="Read the ledger.",
    args_model=NoArgs,
    output_model=Nothing,
    effect=Effect.READ,
    run=Ledger.read,
)


def reads_the_ledger_when_asked(
    messages: Sequence[BaseMessage], _tools: Sequence[dict[str, Any]]
) -> Decision:
    task = str(messages[-1].content) if messages else ""
    if "ledger" in task and not any(isinstance(m, ToolMessage) for m in messages):
        return Decision(tool_calls=[("read_ledger", {})])
    return Decision(content="Hello.")


def test_backoff_doubles_up_to_five_minutes() -> None:
    assert [failure_backoff_s(n) for n in (1, 2, 3, 4, 10, 100)] == [1, 2, 4, 8, 300, 300]


def test_a_failing_run_is_noted_and_backed_off_while_the_worker_finishes_the_others(
    open_test_runner: RunnerFactory,
) -> None:
    model = ScriptedChatModel(policy=reads_the_ledger_when_asked)
    tools = [BUGGY_READ]
    with open_test_runner(model=model, tools=tools) as runner:
        poisoned = runner.submit(POISONED, principal(task=POISONED))
        healthy = runner.submit(HEALTHY, principal(task=HEALTHY))
        attempts: list[tuple[str, RunOutcome | Exception]] = []
        stop = threading.Event()
        thread = threading.Thread(
            target=work,
            args=(runner,),
            kwargs={"stop": stop, "poll_s": 0.05, "on_attempt": lambda *a: attempts.append(a)},
        )
        thread.start()
        try:
            wait_for(lambda: runner.outcome(healthy).phase == "COMPLETED")
            wait_for(lambda: _failures(runner, poisoned) >= 2)
        finally:
            stop.set()
            thread.join(timeout=PATIENCE_S)
        record = runner.leases.get(poisoned)

    assert not thread.is_alive()
    assert record is not None and record.owner is None  # released after each failed attempt
    assert record.last_error == "RuntimeError: ledger client bug"
    assert record.next_attempt_at is not None and record.next_attempt_at > record.updated_at
    # Backed off, not retried at every poll: two failures in ~1 s of 0.05 s polls.
    failed = [r for run_id, r in attempts if run_id == poisoned]
    assert all(isinstance(r, RuntimeError) for r in failed)
    assert len(failed) == record.failures <= 3
    [done] = [r for run_id, r in attempts if run_id == healthy]
    assert isinstance(done, RunOutcome) and done.phase == "COMPLETED"
    listed = io.StringIO()
    with open_test_runner(model=model, tools=tools) as runner:
        render_runs(run_lines(runner), Console(file=listed, width=200, soft_wrap=True))
    [line] = [line for line in listed.getvalue().splitlines() if line.startswith(poisoned)]
    assert line.endswith(f"(failed {record.failures}x in a row: RuntimeError: ledger client bug)")
    shown = io.StringIO()
    with open_test_runner(model=model, tools=tools) as runner:
        render_run(runner, poisoned, Console(file=shown, width=200, soft_wrap=True))
    [failing] = [line for line in shown.getvalue().splitlines() if line.startswith("failing:")]
    assert failing.startswith(f"failing: {record.failures} attempts in a row did not go through")
    assert failing.endswith(": RuntimeError: ledger client bug")


def test_a_run_that_goes_through_again_ends_its_failure_streak(
    open_test_runner: RunnerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedChatModel(policy=reads_the_ledger_when_asked)
    with open_test_runner(model=model, tools=[BUGGY_READ]) as runner:
        run_id = runner.submit(POISONED, principal(task=POISONED))
        with pytest.raises(RuntimeError):
            runner.resume(run_id)
        failed = runner.leases.get(run_id)
        monkeypatch.setattr(Ledger, "fixed", True)  # the bug is fixed and deployed
        outcome = runner.resume(run_id)
        healed = runner.leases.get(run_id)
    assert failed is not None and failed.failures == 1
    assert outcome.phase == "COMPLETED"
    assert healed is not None and (healed.failures, healed.last_error) == (0, None)


WORKER_APP = "lw-test-worker"
SMALL_REFUND = "Check whether order O-43 can be refunded and refund it if so."  # 30.00: no approval


def _worker_backends(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (WORKER_APP,)
        ).fetchall()
    return [row[0] for row in rows]


def _failures(runner: Runner, run_id: str) -> int:
    record = runner.leases.get(run_id)
    return record.failures if record is not None else 0


def test_a_run_that_keeps_failing_ends_typed_needs_human(
    open_test_runner: RunnerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not retried for ever: after `max_failures` in a row it stops, saying why, and no worker
    takes it again."""
    monkeypatch.setattr(Ledger, "fixed", False)
    model = ScriptedChatModel(policy=reads_the_ledger_when_asked)
    with open_test_runner(model=model, tools=[BUGGY_READ]) as runner:
        runner.max_failures = 2
        run_id = runner.submit(POISONED, principal(task=POISONED))
        for _ in range(2):
            with pytest.raises(RuntimeError):
                runner.resume(run_id)
        outcome = runner.outcome(run_id)
        record = runner.leases.get(run_id)
        due = [r.run_id for r in runner.leases.due()]
        again = runner.resume(run_id)  # a finished run just reports where it stands
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "needs_human")
    assert outcome.stop_detail == (
        "2 attempts in a row did not go through; the last: RuntimeError: ledger client bug"
    )
    assert record is not None and record.phase == "INCOMPLETE" and run_id not in due
    assert again.stop_reason == "needs_human"


@pytest.mark.postgres
def test_a_worker_outlives_its_database_connections(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """Postgres drops every connection of the worker's (a failover, a restart): the worker
    reconnects and goes on, and the run it meets afterwards is not blamed for it."""
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    tagged = with_application_name(postgres_url, WORKER_APP)  # to tell its connections apart
    worker = start_cli(
        *("worker", "--db", tagged, "--poll", "0.1"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with connect(services) as deps, open_runner(postgres_url, refunds, deps=deps) as runner:
            wait_for(lambda: len(_worker_backends(postgres_url)) >= 3)  # saver, journal, leases
            first = _worker_backends(postgres_url)
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (WORKER_APP,),
                )
            wait_for(lambda: len(set(_worker_backends(postgres_url)) - set(first)) >= 3)
            run_id = runner.submit(SMALL_REFUND, principal(task=SMALL_REFUND))
            wait_for(lambda: runner.outcome(run_id).phase == "COMPLETED")
            record = runner.leases.get(run_id)
        assert worker.poll() is None, "the worker is still running"
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=PATIENCE_S)
    assert "database fault" in output and "reconnecting in 1s" in output, output
    assert output.count("polling every") >= 2, output  # connected again
    assert record is not None and record.failures == 0


@pytest.mark.postgres
def test_a_run_that_kills_every_process_advancing_it_ends_typed(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """A run whose every attempt dies with its process (a crash armed as validate starts, as a
    segfault or an OOM kill would end it) is not taken up for ever: each death counts in its
    failure streak as the next process takes the run, and the attempt that finds the streak at
    `MAX_FAILURES` ends the run INCOMPLETE `needs_human`, naming the last dead attempt, without
    running a step. No refund was made; nothing is left to take up."""
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    crashing = {**env, CRASH_ENV: "node:validate:start"}
    db = ["--db", postgres_url]
    run_id = "run-killing"
    create_order(services, "O-9200", "u-1", "20.00")
    task = "Check whether order O-9200 can be refunded and refund it if so."
    crashed = cli("run", task, "--user", "u-1", "--run-id", run_id, *db, env=crashing)
    release_crashed(crashed, postgres_url, run_id)
    for died in range(1, MAX_FAILURES):
        record = lease_record(postgres_url, run_id)
        assert record.failures == died and record.phase not in ENDED_PHASES, record
        release_crashed(cli("resume", run_id, *db, env=crashing), postgres_url, run_id)

    # Unarmed: had this attempt run a step, it would have sent the refund.
    ended = cli("resume", run_id, *db, env=env, expect=4)
    assert "needs_human" in ended.stdout, ended.stdout
    record = lease_record(postgres_url, run_id)
    assert (record.phase, record.owner) == ("INCOMPLETE", None)
    shown = json.loads(cli("show", run_id, *db, "--json", env=env, expect=0).stdout)
    assert (shown["stop_reason"], shown["exit_code"]) == ("needs_human", 4)
    assert shown["stop_detail"].startswith(
        f"{MAX_FAILURES} attempts in a row did not go through; the last: the attempt of "
    ), shown["stop_detail"]
    assert "ended before it recorded where the run stood" in shown["stop_detail"]
    assert list_refunds(services, "O-9200") == []
    with open_lease_store(postgres_url) as leases:
        assert run_id not in [r.run_id for r in leases.unended()]


def lease_record(database_url: str, run_id: str) -> RunRecord:
    with open_lease_store(database_url) as leases:
        record = leases.get(run_id)
    assert record is not None
    return record
