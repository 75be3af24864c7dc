"""`loopwright faults`: an agent proven under every fault injected around its writes' sends.

The store-credit agent's credit has no idempotency key; it is declared right (queryable, re-sent
only after a deadline the credits service honours) and wrong (idempotent by key, which the
service is not). The proof must tell them apart: right, every trial ends with one credit per
intent; wrong, the request delivered late, after the runtime re-sent it, makes a second credit.
The reference agent's refund is proven by the command itself, through its demo.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx

from loopwright import Action, Fault, Guarantee, Scenario, ToolContext, prove
from loopwright_refunds.services.endpoints import ServiceEndpoints
from loopwright_refunds.store_credit import STORE_CREDIT
from tests.keyless_agent import TASK
from tests.keyless_agent import agent as keyless
from tests.runtime_fixtures import cli


def credits_since(ctx: ToolContext[Any], action: Action, before: dict[str, Any] | None) -> int:
    """Credits the account gained since the pre-image of the intent's first send."""
    assert before is not None
    account = httpx.get(f"{ctx.deps.endpoints.payments}/credits/{before['user_id']}").json()
    return int(account["version"]) - int(before["version"])


CREDIT = Scenario(task=TASK, user="u-1", approver="a-1", effects=credits_since)


def test_a_keyless_write_declared_right_holds_under_every_fault(
    database_url: str, services: ServiceEndpoints
) -> None:
    proof = prove(keyless, database_url=database_url, scenarios=[CREDIT])
    # No duplicate delivery: without a key, a request delivered twice is two requests. No
    # crash: a scenario given here cannot be loaded by the process that would die.
    assert [(t.write, t.fault) for t in proof.trials] == [
        (None, None),
        *((1, f) for f in Fault if f is not Fault.DUPLICATE and not f.crash_point),
    ]
    assert [list(t.effects.values()) for t in proof.trials] == [[1]] * 5
    assert proof.skipped == [
        "crash faults: they need the agent's import path and its own scenarios "
        "(a new process loads both)"
    ]
    assert {t.stop_reason for t in proof.trials} == {"completed"}
    assert proof.held, [t.as_json() for t in proof.failures]


def test_a_keyless_write_declared_idempotent_by_key_shows_its_duplicate_under_late_delivery(
    database_url: str, services: ServiceEndpoints
) -> None:
    """Told it may re-send an absent intent under its key, the runtime re-sends at once; the
    first request, delivered late, is credited too: the proof fails, naming the trial."""
    wrong = dataclasses.replace(STORE_CREDIT, guarantee=Guarantee.IDEMPOTENT_BY_KEY, resend=None)
    agent = keyless.replace(tools=[*(c for c in keyless.tools if c.name != wrong.name), wrong])
    proof = prove(
        agent, database_url=database_url, scenarios=[CREDIT], faults=[Fault.DELIVERED_LATE]
    )
    clean, late = proof.trials
    assert (clean.verdict, list(clean.effects.values())) == ("ok", [1])
    assert (late.fault, late.tool, list(late.effects.values())) == (
        Fault.DELIVERED_LATE,
        "issue_store_credit",
        [2],
    )
    assert late.verdict == "fail: duplicate effect"
    assert not proof.held


def test_the_faults_command_proves_the_reference_agent_and_says_so(
    database_url: str, tmp_path: Path
) -> None:
    """The agent's scenario, on services started on fresh data for every trial; the crash
    trials' processes are killed at the refund's send and the run resumed by this one."""
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home")}
    result = cli("faults", "--db", database_url, "--json", env=env, expect=0)
    document = json.loads(result.stdout)
    assert (document["schema"], document["agent"], document["held"]) == (
        "loopwright.faults/1",
        "refunds",
        True,
    )
    trials = document["trials"]
    assert [(t["tool"], t["fault"]) for t in trials] == [
        (None, None),
        *(("submit_refund", fault.value) for fault in Fault),
    ]
    assert all(list(t["effects"].values()) == [1] for t in trials), trials
    assert all(t["reached"] for t in trials), trials  # each crash trial's process did die
    assert {t["stop_reason"] for t in trials} == {"completed"}
