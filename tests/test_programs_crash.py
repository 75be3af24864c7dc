"""Program actions under kill -9: a program's run killed at each crash point while the program
is between calls, while one of its writes is in flight, and while it waits for an approval,
then taken on by new processes (`loopwright resume`, `loopwright approvals approve`).

Each case ends COMPLETED and verified, with exactly one refund of each order in the payments
service's own storage, the model asked as often as in an uncrashed run (the program is never
written again), and the program's four calls made once each: the program resumed where it
stood, from its committed snapshot, never from its start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import ToolMessage

from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.core.protocol import parse_tool_content
from loopwright.core.views import program_of_message
from loopwright.runner import LEASE_TTL_ENV
from loopwright.tools.faults import Fault
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.program_agent import TASK, agent
from tests.runtime_fixtures import RunnerFactory, cli, on_backend
from tests.test_crash_matrix import crash_and_resume

AGENT = {"LOOPWRIGHT_AGENT": "tests.program_agent:agent"}
# The process that starts the run: compile_context, model_step (the program), validate (the
# program started, paused at get_order(O-42)), validate (its check), execute, validate (resumed
# to submit_refund(O-42), which waits for a person). The approver's process: approval,
# validate, execute (the refund of O-42), validate (resumed to get_order(O-43)), execute,
# validate (submit_refund(O-43)), execute, validate (the program ends), then the model answers.
CASES: dict[str, tuple[str, ...]] = {
    # Between calls: the program committed, paused, its next call unchecked or unsent.
    "program started, its first call unchecked": ("node:validate:start#2",),
    "the first call checked, not run": ("node:execute:start",),
    "a read answered, the program not resumed": ("node:validate:start#3",),
    "resumed, inside validate's commit": ("checkpoint:commit:before_commit:validate#3",),
    "a read's answer inside execute's commit": ("checkpoint:commit:before_commit:execute",),
    # Waiting for a person: the approval asked, decided, its decision saved alone.
    "waiting for the approval": ("node:approval:start",),
    "the decision saved, not applied": ("checkpoint:after_writes:approval",),
    # One of its writes in flight, in the approver's process.
    "a write journaled, not sent": ("executor:after_dispatch_record",),
    "a write sent and applied, its answer unread": ("executor:after_send",),
    "the second write sent and applied": ("executor:after_send#2",),
    "a write's answer read, not recorded": ("executor:before_outcome_record",),
    "reconciling the write the program waits on": (
        "executor:after_dispatch_record",
        "reconcile:after_settle",
    ),
    # The program ended, its answer committed, the model not asked yet (in the approver's
    # process: nothing is armed in the first, "").
    "the program ended": ("", "node:compile_context:start"),
}
# The write windows meet each backend's own transactions: both; the others one each in turn.
BOTH = {"a write sent and applied, its answer unread", "resumed, inside validate's commit"}
MATRIX = [
    on_backend(backend, case)
    for number, case in enumerate(CASES)
    for backend in (
        ("sqlite", "postgres") if case in BOTH else (("sqlite", "postgres")[number % 2],)
    )
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "database_url"), MATRIX, indirect=["database_url"])
def test_a_program_killed_at_a_crash_point_resumes_where_it_stood(
    case: str,
    database_url: str,
    services: ServiceEndpoints,
    tmp_path: Path,
    open_test_runner: RunnerFactory,
) -> None:
    env = {**services.to_env(), **AGENT, "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    run_id = "run-program-crash"
    first = cli(
        "run", TASK, "--user", "u-1", "--db", database_url, "--run-id", run_id,
        env={**env, CRASH_ENV: CASES[case][0]},
    )  # fmt: skip
    output = crash_and_resume(first, CASES[case], run_id, database_url, env)
    assert "COMPLETED" in output, output

    with open_test_runner(agent=agent) as runner:
        outcome = runner.outcome(run_id)
        state = runner.state(run_id)
    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert [len(list_refunds(services, order)) for order in ("O-42", "O-43")] == [1, 1]
    assert state["usage"]["model_requests"] == 2
    calls = state["program"]["calls"]
    answered = [m for m in state["history"] if isinstance(m, ToolMessage) and program_of_message(m)]
    assert [m.tool_call_id for m in answered] == [c["call_id"] for c in calls]
    assert [
        (c["tool"], parse_tool_content(str(m.content)).result["order_id"], c["outcome"])
        for c, m in zip(calls, answered, strict=True)
    ] == [
        ("get_order", "O-42", "ok"),
        ("submit_refund", "O-42", "ok"),
        ("get_order", "O-43", "ok"),
        ("submit_refund", "O-43", "ok"),
    ]
    assert [(a.args["order_id"], a.status) for a in outcome.actions] == [
        ("O-42", "SUCCEEDED"),
        ("O-43", "SUCCEEDED"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_faults_command_proves_a_program_holds_under_every_fault(
    database_url: str, tmp_path: Path
) -> None:
    """`loopwright faults` on the program's scenario: clean, then each fault at each of the
    program's two refunds (request lost, answer lost, late, delivered late, twice; the crash
    trials' processes killed at the refund's send), each trial on fresh services. Every trial
    ends with one refund per intent and COMPLETED: no duplicate, nothing unauthorised."""
    env = {**AGENT, "LOOPWRIGHT_HOME": str(tmp_path / "home"), LEASE_TTL_ENV: "30"}
    result = cli("faults", "--db", database_url, "--json", env=env, expect=0)
    document = json.loads(result.stdout)
    assert (document["agent"], document["held"], document["failures"]) == ("refunds", True, 0)
    trials = document["trials"]
    assert [(t["write"], t["tool"], t["fault"]) for t in trials] == [
        (None, None, None),
        *((write, "submit_refund", fault.value) for write in (1, 2) for fault in Fault),
    ]
    assert all(sorted(t["effects"].values()) == [1, 1] for t in trials), trials
    assert all(t["reached"] for t in trials), trials
    assert {t["stop_reason"] for t in trials} == {"completed"}
