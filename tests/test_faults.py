"""`loopwright faults`: an agent proven under every fault injected around its writes' sends.

The store-credit agent's credit has no idempotency key; it is declared right (queryable, re-sent
only after a deadline the credits service honours) and wrong (idempotent by key, which the
service is not). The proof must tell them apart: right, every trial ends with one credit per
intent; wrong, the request delivered late, after the runtime re-sent it, makes a second credit.
The reference agent's refund is proven by the command itself, through its demo.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopwright import Fault, prove
from loopwright.reports import EXIT_CODES
from loopwright.runner import LEASE_TTL_ENV
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.keyless_agent import CREDIT_SCENARIO, wrongly_keyed
from tests.keyless_agent import agent as keyless
from tests.runtime_fixtures import cli


def test_a_keyless_write_declared_right_holds_under_every_fault(
    database_url: str, services: ServiceEndpoints
) -> None:
    proof = prove(keyless, database_url=database_url, scenarios=[CREDIT_SCENARIO])
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
    proof = prove(
        wrongly_keyed,
        database_url=database_url,
        scenarios=[CREDIT_SCENARIO],
        faults=[Fault.DELIVERED_LATE],
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
    # The lease's usual time to live: a crash trial's dead process's lease is given up for it.
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home"), LEASE_TTL_ENV: "30"}
    result = cli("faults", "--db", database_url, "--json", env=env, expect=0)
    document = json.loads(result.stdout)
    assert document["proof"].startswith("faults-")
    assert all(t["run_id"].startswith(f"{document['proof']}-s1-") for t in document["trials"])
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


def test_the_faults_command_gives_the_same_verdict_again_on_the_same_database(
    tmp_path: Path,
) -> None:
    """`loopwright faults` twice in one directory (the embedded database): the second proves on
    trials of its own, not the first one's finished runs judged against new business data."""
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home"), "DATABASE_URL": "", LEASE_TTL_ENV: "30"}
    first, again = (cli("faults", env=env, cwd=tmp_path, expect=0) for _ in range(2))
    lines, more = first.stdout.splitlines(), again.stdout.splitlines()
    assert lines[-1] == more[-1] == "refunds: held under every fault tried: 8 trials, 0 failed"
    trials = [line for line in lines if line.startswith("s1 ")]
    assert len(trials) == 8 and trials == [line for line in more if line.startswith("s1 ")]
    [runs], [other_runs] = (
        [line for line in out if "trials' runs" in line] for out in (lines, more)
    )
    assert runs != other_runs  # each proof's runs are its own


def test_the_faults_command_fails_a_wrong_declaration_with_exit_1(
    database_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """From the command line, with the crash trials: the credit declared idempotent by key
    fails under late and twice delivery (two credits each), holds under the rest."""
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home"), LEASE_TTL_ENV: "30"}
    agent = ("--agent", "tests.keyless_agent:wrongly_keyed", "--db", database_url)
    result = cli("faults", *agent, env=env, timeout=600)
    assert result.returncode == 1 != EXIT_CODES["usage"], result.stdout + result.stderr
    lines = result.stdout.splitlines()
    failed = [line.split()[4] for line in lines if "fail:" in line]
    assert failed == ["delivered_late", "duplicate"], result.stdout
    assert all(line.endswith("fail: duplicate effect") for line in lines if "fail:" in line)
    crashes = [line for line in lines if "crash_" in line]
    assert len(crashes) == 2 and all(line.endswith(" ok") for line in crashes), result.stdout
    assert lines[-1] == "refunds: did not hold: 2 of 8 trials failed"
    assert lines[-2].startswith("the trials' runs: faults-")
