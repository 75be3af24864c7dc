"""A write to a downstream without idempotency keys, whose request was lost or is late.

Store credit (`loopwright_refunds.store_credit`) cannot be deduped, but every request carries a
deadline the credits service honours. Reconciliation that finds the credit absent therefore waits
until the deadline (plus the clocks' skew) has passed before it sends the same intent again: a
first request still on its way applies before its deadline (and is then found, not repeated) or
is refused after it. Without a declared way to re-send, an absent credit goes to a person. Each
case ends with the credit made exactly once, or with `needs_human`: never COMPLETED without it.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from loopwright import ResendAfterDeadline, Runner, RunOutcome
from loopwright.core import tls
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.reports import EXIT_CODES
from loopwright_refunds.services.admin import set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.keyless_agent import TASK, with_resend
from tests.keyless_agent import agent as keyless
from tests.runtime_fixtures import PATIENCE_S, RunnerFactory, cli, principal, release_crashed

WAIT_LIMIT_S = PATIENCE_S


def credit_entries(services: ServiceEndpoints) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = httpx.get(
        f"{services.payments}/credits/u-1", verify=tls.context()
    ).json()["entries"]
    return entries


def statuses(runner: Runner, outcome: RunOutcome) -> list[str]:
    [history] = runner.history(outcome.run_id).values()
    return [e.to_status for e in history]


def settled(runner: Runner, outcome: RunOutcome) -> RunOutcome:
    """Parked runs are resumed whenever due, within the bound (`wait=`): none is left parked."""
    assert outcome.phase != "RECONCILING", outcome
    return outcome


def test_a_lost_request_is_sent_again_only_after_its_deadline_and_credited_once(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "fail_before_commit")  # nothing applied, no answer worth trusting
    with open_test_runner(agent=keyless) as runner:
        sent = time.monotonic()
        outcome = settled(runner, runner.start(TASK, principal(task=TASK), wait=WAIT_LIMIT_S))
        waited = time.monotonic() - sent
        [history] = runner.history(outcome.run_id).values()
    assert outcome.stop_reason == "completed", outcome.stop_detail
    # The history tells the re-send from a reconciliation that found it applied.
    assert [(e.to_status, e.attempt, e.found) for e in history] == [
        ("PLANNED", 0, None),
        ("DISPATCHED", 1, None),
        ("UNKNOWN", 1, None),
        ("RECONCILING", 1, None),
        ("DISPATCHED", 2, "absent"),
        ("SUCCEEDED", 2, None),
    ]
    [action] = outcome.actions
    assert action.attempts == 2
    assert waited >= 6.0  # never re-sent before the first request's deadline had passed
    assert [e["amount"] for e in credit_entries(services)] == ["20.00"]


def test_a_first_request_that_arrives_late_but_in_time_is_found_not_repeated(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Held up 4 s (the client gives up at 3 s), it applies before its 6 s deadline."""
    set_fault(services, "latency", delay_s=4)
    with open_test_runner(agent=keyless) as runner:
        outcome = settled(runner, runner.start(TASK, principal(task=TASK), wait=WAIT_LIMIT_S))
        [history] = runner.history(outcome.run_id).values()
    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert [(e.to_status, e.attempt, e.found) for e in history] == [
        ("PLANNED", 0, None),
        ("DISPATCHED", 1, None),
        ("UNKNOWN", 1, None),
        ("RECONCILING", 1, None),
        ("SUCCEEDED", 1, "applied"),
    ]
    assert [e["amount"] for e in credit_entries(services)] == ["20.00"]


def test_a_first_request_that_arrives_after_its_deadline_is_refused_and_the_resend_counts(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Held up 4 s with a 2 s deadline: the service refuses it, the re-send makes the credit."""
    set_fault(services, "latency", delay_s=4)
    short = with_resend(ResendAfterDeadline(seconds=2.0, skew_s=0.5))
    with open_test_runner(agent=short) as runner:
        outcome = settled(runner, runner.start(TASK, principal(task=TASK), wait=WAIT_LIMIT_S))
        time.sleep(1.5)  # the held-up first request has reached the service and been refused
    assert outcome.stop_reason == "completed", outcome.stop_detail
    [action] = outcome.actions
    assert action.attempts == 2
    assert [e["amount"] for e in credit_entries(services)] == ["20.00"]


def test_without_a_way_to_resend_an_absent_keyless_write_goes_to_a_person(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    set_fault(services, "fail_before_commit")
    with open_test_runner(agent=with_resend(None)) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
        history = statuses(runner, outcome)
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "needs_human")
    assert history[-1] == "ESCALATED"
    [action] = outcome.actions
    # Proven absent, not "could not tell": a person decides whether to send it again.
    assert outcome.stop_detail.startswith(
        f"{action.action_id} proven absent: a person decides whether to send it again ("
    ), outcome.stop_detail
    assert credit_entries(services) == []


def test_a_crash_before_the_send_is_resumed_and_credited_once(
    database_url: str, services: ServiceEndpoints, tmp_path: Any
) -> None:
    """Killed after DISPATCHED was journaled, before the request left: a new process finds the
    credit absent, waits out the deadline it journaled (it cannot know nothing was sent), and
    sends it once."""
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    agent = ("--agent", "tests.keyless_agent:agent", "--db", database_url)
    crashed = cli(
        *("run", TASK, "--user", "u-1", "--run-id", "credit-1", *agent),
        env={**env, CRASH_ENV: "executor:after_dispatch_record"},
    )
    release_crashed(crashed, database_url, "credit-1")
    assert credit_entries(services) == []
    resumed = cli("resume", "credit-1", *agent, env=env)
    give_up = time.monotonic() + WAIT_LIMIT_S
    while "COMPLETED" not in resumed.stdout:  # parked until the deadline: resume when due
        assert time.monotonic() < give_up and "RECONCILING" in resumed.stdout, resumed.stdout
        assert resumed.returncode == EXIT_CODES["unfinished"], resumed.stderr
        time.sleep(1.0)
        resumed = cli("resume", "credit-1", *agent, env=env)
    assert resumed.returncode == EXIT_CODES["completed"], resumed.stderr
    assert [e["amount"] for e in credit_entries(services)] == ["20.00"]
