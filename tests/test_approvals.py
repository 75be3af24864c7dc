"""Approvals bind one action's digest until expiry, and only an approver's decision counts.

In-process tests drive the graph through `Runner.decide`, or `Runner.resume` with a resume value
straight (`runtime_fixtures.answered`); the CLI tests run every command in a new process, the way a person
approving from another terminal (or the next morning) would.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loopwright import Budget
from loopwright.cli.approvals_command import pending_approvals
from loopwright.core.state import ActionStatus, ApprovalChoice, ApprovalDecision, ApprovalRequest
from loopwright.decisions import DecisionRefused
from loopwright.outcome import RunOutcome
from loopwright.reports import EXIT_CODES
from loopwright.runner import Runner, open_runner
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.misbehaving import AsksForMore
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import (
    DEMO_TASK,
    RunnerFactory,
    all_refunds,
    answered,
    cli,
    final_answer,
    principal,
    tool_errors,
)
from tests.test_cli import env_for

BIG_REFUND_TASK = "Check whether order O-46 can be refunded and refund it if so."  # 1,000.00
# What a command prints for a person to approve with (the demo names its approver).
APPROVE_COMMAND = re.compile(r"loopwright approvals approve (apr_\w+) --as (a-1|APPROVER)")


def answer(runner: Runner, outcome: RunOutcome, *args: Any, **kwargs: Any) -> RunOutcome:
    """Resume the run with a decision about the request it waits for (see `answered`)."""
    [request] = outcome.waiting_for_approval
    return runner.resume(outcome.run_id, answered(request, *args, **kwargs))


def nothing_done(outcome: RunOutcome) -> bool:
    """Ended `not_done`: the write the task needed did not happen, nothing changed in the
    business system, and the verification names the write (never "completed")."""
    facts = (outcome.verification or {}).get("facts", {})
    return (
        outcome.stop_reason == "not_done"
        and facts.get("writes") == []
        and [w["action_id"] for w in facts.get("not_done", [])]
        == [a.action_id for a in outcome.actions][-1:]
    )


def test_reject_ends_the_run_verified_with_nothing_done(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A rejection is final for the intent: the model is told, answers, and verify completes
    the run with nothing changed (the honest outcome of "refund it if so" when a human says no)."""
    with open_test_runner() as runner:
        outcome = answer(runner, runner.start(DEMO_TASK, principal()), "reject", "a-1", "no")
        state = runner.state(outcome.run_id)
    assert nothing_done(outcome)
    [action] = outcome.actions
    assert action.status is ActionStatus.REJECTED and action.attempts == 0
    assert [e["code"] for e in tool_errors(state)] == ["approval_rejected"]
    assert "approval_rejected" in final_answer(state)
    assert all_refunds(services) == []


def test_approval_of_100_never_executes_1000(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """After its approved 100.00 went through, the model asks for 1,000.00 for the same order:
    the same intent with changed parameters is refused, and nothing else is sent."""
    with open_test_runner(ScriptedChatModel(policy=AsksForMore(amount="1000.00"))) as runner:
        outcome = answer(runner, runner.start(DEMO_TASK, principal()), "approve", "a-1")
        state = runner.state(outcome.run_id)
    assert [e["code"] for e in tool_errors(state)] == ["intent_conflict"]
    [action] = outcome.actions
    assert (action.args["amount"], action.status) == ("100.00", ActionStatus.SUCCEEDED)
    assert [r["amount"] for r in all_refunds(services)] == ["100.00"]
    assert outcome.stop_reason == "completed"


def test_decision_naming_another_actions_digest_is_refused(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """An approval of the 100.00 refund replayed against the 1,000.00 one rejects the latter."""
    with open_test_runner() as runner:
        small = runner.start(DEMO_TASK, principal())
        big = runner.start(BIG_REFUND_TASK, principal(task=BIG_REFUND_TASK))
        [small_request], [big_request] = small.waiting_for_approval, big.waiting_for_approval
        forged = {**big_request, "digest": small_request["digest"]}
        big = runner.resume(big.run_id, answered(forged, "approve", "a-1"))
        state = runner.state(big.run_id)
        small = runner.outcome(small.run_id)
    assert [e["code"] for e in tool_errors(state)] == ["approval_mismatch"]
    [action] = big.actions
    assert action.status is ActionStatus.REJECTED and action.attempts == 0
    assert nothing_done(big)
    assert [a.status for a in small.actions] == [ActionStatus.NEEDS_APPROVAL]  # untouched
    assert all_refunds(services) == []


def test_expired_approval_executes_nothing(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    ttl = timedelta(milliseconds=50)
    with open_test_runner() as runner:
        build = runner.context
        monkeypatch.setattr(
            runner, "context", lambda *a, **kw: replace(build(*a, **kw), approval_ttl=ttl)
        )
        outcome = runner.start(DEMO_TASK, principal())
        time.sleep(2 * ttl.total_seconds())
        outcome = answer(runner, outcome, "approve", "a-1")
        state = runner.state(outcome.run_id)
    assert [e["code"] for e in tool_errors(state)] == ["approval_expired"]
    assert [a.status for a in outcome.actions] == [ActionStatus.REJECTED]
    assert nothing_done(outcome)
    assert all_refunds(services) == []


def test_a_persons_wait_does_not_spend_the_runs_deadline(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A run with a 2 s deadline waits 3 s for its approver: the wait is the person's, not the
    machine's, so the approved refund is made and the run completes."""
    with open_test_runner(budget=Budget(deadline_s=2.0)) as runner:
        waiting = runner.start(DEMO_TASK, principal())
        time.sleep(3.0)
        outcome = answer(runner, waiting, "approve", "a-1")
    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert [r["amount"] for r in all_refunds(services)] == ["100.00"]


def test_no_action_is_left_approved_with_nobody_to_send_it(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Approved, then the run ends before it could be sent (here: an approving process whose
    budget leaves no time): the action is CANCELLED with the reason, never left APPROVED."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
    with open_test_runner(budget=Budget(deadline_s=0.001)) as hurried:
        outcome = answer(hurried, waiting, "approve", "a-1")
        [action] = outcome.actions
        history = [e.to_status for e in hurried.journal.events(action.action_id)]
    assert outcome.stop_reason == "deadline_exceeded"
    assert history[-2:] == ["APPROVED", "CANCELLED"]
    assert all_refunds(services) == []


def test_expiry_is_judged_on_the_databases_clock_not_the_approvers(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approving process's clock runs 25 h ahead of everyone's: the fresh approval is not
    taken for expired (and a process behind would not take an expired one for fresh)."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        ahead = datetime.now(UTC) + timedelta(hours=25)
        monkeypatch.setattr("loopwright.core.state.utcnow", lambda: ahead)
        monkeypatch.setattr("loopwright.nodes.context.utcnow", lambda: ahead)
        outcome = answer(runner, waiting, "approve", "a-1")
    assert outcome.stop_reason == "completed", outcome.stop_detail
    assert [r["amount"] for r in all_refunds(services)] == ["100.00"]


def test_self_approval_is_refused_until_an_approver_decides(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        outcome = answer(runner, waiting, "approve", "u-1")  # the run's own user
        [request] = outcome.waiting_for_approval  # asked again: the same request
        assert (request["approval_id"], request["digest"]) == (
            waiting.waiting_for_approval[0]["approval_id"],
            waiting.waiting_for_approval[0]["digest"],
        )
        assert [a.status for a in outcome.actions] == [ActionStatus.NEEDS_APPROVAL]
        assert "u-1 cannot decide about their own run" in runner.state(outcome.run_id)["feedback"]
        assert all_refunds(services) == []

        outcome = answer(runner, outcome, "approve", "a-1")
    assert outcome.stop_reason == "completed"
    assert [r["amount"] for r in all_refunds(services)] == ["100.00"]


def test_only_an_approver_can_decide(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """The graph asks the user directory, not the caller: u-2 is a customer, not an approver."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        outcome = answer(runner, waiting, "approve", "u-2")
        assert [a.status for a in outcome.actions] == [ActionStatus.NEEDS_APPROVAL]
        assert "u-2 is not an approver" in runner.state(outcome.run_id)["feedback"]
        assert outcome.waiting_for_approval
    assert all_refunds(services) == []


def test_edit_rejects_the_original_and_needs_its_own_approval(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """An approver cuts the refund to 40.00. The 100.00 action is rejected before anything is
    sent; the 40.00 one is a new intent with its own digest and approval request (although it
    is under the threshold), and only its approval sends it. The model's later attempt at the
    original 100.00 maps to the rejected action: one effect, the one the approver approved."""
    with open_test_runner(ScriptedChatModel(policy=AsksForMore(amount="100.00"))) as runner:
        waiting = runner.start(DEMO_TASK, principal())
        [original] = waiting.waiting_for_approval
        edited = answer(runner, waiting, "edit", "a-1", changes={"amount": "40.00"})

        [request] = edited.waiting_for_approval
        assert request["summary"] == "Refund 40.00 USD to order O-42 (edited by a-1)"
        assert request["edited_by"] == ["a-1"]  # who may not approve it
        assert request["args"]["amount"] == "40.00"
        assert (request["approval_id"], request["digest"]) != (
            original["approval_id"],
            original["digest"],
        )
        rejected, planned = edited.actions
        assert rejected.status is ActionStatus.REJECTED and rejected.attempts == 0
        assert rejected.outcome == {
            "error": {"code": "edited_by_approver", "detail": "replaced by a-1's edit"}
        }
        assert planned.status is ActionStatus.NEEDS_APPROVAL
        assert planned.intent_key == f"{rejected.intent_key}:edit-1"
        assert all_refunds(services) == []

        done = answer(runner, edited, "approve", "a-2")  # another approver than the editor
        state = runner.state(done.run_id)
    assert done.stop_reason == "completed"
    [refund] = all_refunds(services)
    assert (refund["amount"], refund["idempotency_key"]) == ("40.00", planned.intent_key)
    assert [e["code"] for e in tool_errors(state)] == ["duplicate_intent"]
    assert [a.status for a in done.actions] == [ActionStatus.REJECTED, ActionStatus.SUCCEEDED]


def test_whoever_edited_an_action_cannot_approve_it(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Separation of duties: a-1 raises the refund and cannot approve their own edit, by any
    path (the answer the request builds, `Runner.decide`, a forged resume value straight to the
    run); an edit of the edit keeps both editors out; a-2, who edited nothing, approves."""
    with open_test_runner() as runner:
        waiting = runner.start(BIG_REFUND_TASK, principal(task=BIG_REFUND_TASK))
        edited = answer(runner, waiting, "edit", "a-1", changes={"amount": "900.00"})
        [request] = edited.waiting_for_approval
        assert request["edited_by"] == ["a-1"]
        refusal = "a-1 edited .* and cannot also approve it: another approver must"
        with pytest.raises(ValueError, match=refusal):
            answered(request, "approve", "a-1")
        with pytest.raises(DecisionRefused, match=refusal):
            runner.decide(edited.run_id, "approve", "a-1")
        forged = ApprovalDecision(
            approval_id=request["approval_id"],
            digest=request["digest"],
            decision="approve",
            approver="a-1",
        )
        after = runner.resume(edited.run_id, forged.model_dump(mode="json"))
        [still] = after.waiting_for_approval
        assert (still["approval_id"], still["digest"]) == (
            request["approval_id"],
            request["digest"],
        )
        assert any(re.search(refusal, f) for f in runner.state(after.run_id)["feedback"])
        assert [a.status for a in after.actions][-1] is ActionStatus.NEEDS_APPROVAL
        assert all_refunds(services) == []

        # a-2 edits a-1's edit: now neither may approve it (both wrote its arguments).
        again = answer(runner, after, "edit", "a-2", changes={"amount": "800.00"})
        [second] = again.waiting_for_approval
        assert second["edited_by"] == ["a-1", "a-2"]
        for editor in ("a-1", "a-2"):
            with pytest.raises(DecisionRefused):
                runner.decide(again.run_id, "approve", editor)
        assert all_refunds(services) == []
        # A rejection is always possible: it can only stop things.
        ended = runner.decide(again.run_id, "reject", "a-1", comment="too much after all")
    assert ended.stop_reason == "not_done" and all_refunds(services) == []


def test_an_approver_who_did_not_edit_approves_the_edit(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    with open_test_runner() as runner:
        waiting = runner.start(BIG_REFUND_TASK, principal(task=BIG_REFUND_TASK))
        edited = answer(runner, waiting, "edit", "a-1", changes={"amount": "900.00"})
        done = runner.decide(edited.run_id, "approve", "a-2")
    assert done.stop_reason == "completed", done.stop_detail
    assert [r["amount"] for r in all_refunds(services)] == ["900.00"]


def test_edit_may_not_retarget_the_action(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """Even to an order inside the task's boundary: an edit corrects an action, it does not
    start another one. A decision naming an argument the write does not let approvers change is
    refused by the run itself (whoever built it, not only by `ApprovalRequest.answer`), and the
    original is rejected all the same."""
    task = "Check whether order O-42 can be refunded and refund it if so; O-43 is fine as is."
    with open_test_runner() as runner:
        waiting = runner.start(task, principal(task=task))
        [request] = waiting.waiting_for_approval
        with pytest.raises(ValueError, match="cannot edit order_id"):
            ApprovalRequest.model_validate(request).answer(
                "edit", "a-1", changes={"order_id": "O-43"}
            )
        forged = ApprovalDecision(
            approval_id=request["approval_id"],
            digest=request["digest"],
            decision="edit",
            approver="a-1",
            args={**request["args"], "order_id": "O-43"},
        )
        outcome = runner.resume(waiting.run_id, forged.model_dump(mode="json"))
        state = runner.state(outcome.run_id)
    [error] = tool_errors(state)
    assert (error["code"], error["edit"]["code"]) == ("edit_refused", "edit_not_allowed")
    assert [a.status for a in outcome.actions] == [ActionStatus.REJECTED]
    assert nothing_done(outcome)
    assert all_refunds(services) == []


def test_a_decision_applied_again_after_a_crash_changes_nothing(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """validate writes the journal, then its checkpoint: a crash in between runs it again with
    the journal already moved. Simulated by moving the journal first: the step must not fail."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        [action] = waiting.actions
        runner.journal.transition(
            action.action_id, ActionStatus.NEEDS_APPROVAL, ActionStatus.APPROVED, fence=action.fence
        )
        outcome = answer(runner, waiting, "approve", "a-1")
        history = [e.to_status for e in runner.journal.events(action.action_id)]
    assert outcome.stop_reason == "completed"
    assert history == ["NEEDS_APPROVAL", "APPROVED", "DISPATCHED", "SUCCEEDED"]
    assert len(all_refunds(services)) == 1


def test_a_decision_that_comes_second_is_told_who_decided_first(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """The request a second approver read was decided meanwhile: refused (409), naming the
    decision the run took, and the run keeps it."""
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        [request] = waiting.waiting_for_approval
        approval_id = request["approval_id"]
        runner.decide(waiting.run_id, "approve", "a-1", approval_id=approval_id)
        with pytest.raises(DecisionRefused) as refused:
            runner.decide(waiting.run_id, "reject", "a-2", approval_id=approval_id)
        [record] = runner.state(waiting.run_id)["approvals"]
    assert refused.value.status == 409
    assert f"{approval_id} was decided already (approve by a-1 at" in str(refused.value)
    assert "did not take effect" in str(refused.value)
    assert (record["decision"], record["approver"]) == ("approve", "a-1")
    assert len(all_refunds(services)) == 1


@pytest.mark.postgres
def test_cli_reject_round_trip(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    """Run in one process, which exits waiting; reject in another; the run ends, verified."""
    env = env_for(services, tmp_path)
    started = cli(
        "run",
        DEMO_TASK,
        "--user",
        "u-1",
        "--db",
        postgres_url,
        env=env,
        expect=EXIT_CODES["waiting"],
    )
    assert "WAITING_APPROVAL" in started.stdout
    match = APPROVE_COMMAND.search(started.stdout)
    assert match is not None, started.stdout
    rejected = cli(
        "approvals",
        "reject",
        match[1],
        "--as",
        "a-1",
        "--comment",
        "not this one",
        "--db",
        postgres_url,
        env=env,
        expect=EXIT_CODES["incomplete"],
    )
    assert "INCOMPLETE" in rejected.stdout and "not_done" in rejected.stdout
    assert "not done: submit_refund" in rejected.stdout and "approval_rejected" in rejected.stdout
    assert list_refunds(services, "O-42") == []


@pytest.mark.postgres
def test_cli_edit_round_trip(postgres_url: str, services: ServiceEndpoints, tmp_path: Path) -> None:
    """Started here, decided in two other processes (an edit, then its own approval)."""
    env = env_for(services, tmp_path)
    with connect(services) as deps, open_runner(postgres_url, refunds, deps=deps) as runner:
        [request] = runner.start(DEMO_TASK, principal()).waiting_for_approval
    approval_id = request["approval_id"]
    decide_args = ("--as", "a-1", "--db", postgres_url)
    # An edit the write could not be planned with is refused before the run sees it: the
    # request still waits, untouched (a typo must not cost the refund).
    for bad, why in (
        ("amount=abc", "is invalid: amount"),
        ("amount=-5", "is invalid: amount"),
        ("amount=500.00", "breaks a rule: amount_exceeds_refundable"),
    ):
        refused = cli("approvals", "edit", approval_id, "--set", bad, *decide_args, env=env)
        assert refused.returncode == 2, refused.stdout
        assert why in refused.stderr and "still waits for a decision" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    listed = cli("approvals", "list", "--db", postgres_url, env=env, expect=0)
    assert approval_id in listed.stdout
    edited = cli(
        "approvals",
        "edit",
        approval_id,
        "--set",
        "amount=40.00",
        *decide_args,
        env=env,
        expect=EXIT_CODES["waiting"],
    )
    assert "WAITING_APPROVAL" in edited.stdout
    assert "Refund 40.00 USD to order O-42 (edited by a-1)" in edited.stdout
    match = APPROVE_COMMAND.search(edited.stdout)
    assert match is not None and match[1] != approval_id
    # The command it prints does not name the editor as the one to approve the edit.
    assert "approve " + match[1] + " --as a-1" not in edited.stdout
    assert "edited by a-1: another approver must approve it" in edited.stdout
    refused = cli("approvals", "edit", match[1], "--set", "iban=X", *decide_args, env=env)
    assert refused.returncode == 2
    assert "cannot edit iban: the editable arguments are amount, reason" in refused.stderr
    # Separation of duties: a-1 cannot approve their own edit (one line, exit 2, still pending).
    own = cli("approvals", "approve", match[1], *decide_args, env=env)
    assert own.returncode == 2, own.stdout
    [line] = own.stderr.strip().splitlines()
    assert line.startswith("loopwright: error: a-1 edited " + match[1])
    assert "another approver must" in line and "still waits for a decision" in line
    assert "COMPLETED" not in own.stdout and list_refunds(services, "O-42") == []
    assert match[1] in cli("approvals", "list", "--db", postgres_url, env=env, expect=0).stdout
    approved = cli(
        "approvals", "approve", match[1], "--as", "a-2", "--db", postgres_url, env=env, expect=0
    )
    assert "COMPLETED" in approved.stdout
    assert [r["amount"] for r in list_refunds(services, "O-42")] == ["40.00"]


REQUEST = ApprovalRequest(
    approval_id="apr_1",
    run_id="run-1",
    action_id="act_1",
    digest="0" * 64,
    tool="submit_refund",
    args={"order_id": "O-42", "amount": "100.00", "currency": "USD"},
    summary="Refund 100.00 USD to order O-42",
    requested_by="u-1",
    expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    editable=("amount",),
)


def test_an_edit_changes_only_the_arguments_it_names() -> None:
    edit = REQUEST.answer("edit", "a-1", "too much", {"amount": "40.00"})
    assert edit.args == {"order_id": "O-42", "amount": "40.00", "currency": "USD"}
    assert (edit.approval_id, edit.digest, edit.comment) == ("apr_1", "0" * 64, "too much")
    assert REQUEST.answer("approve", "a-1").args is None


@pytest.mark.parametrize(
    ("decision", "changes", "problem"),
    [
        ("edit", {}, "an edit changes at least one argument"),
        ("edit", {"iban": "X", "amount": "1.00"}, "cannot edit iban: the editable arguments are"),
        ("edit", {"currency": "EUR"}, "cannot edit currency: the editable arguments are amount"),
        ("approve", {"amount": "1.00"}, "only an edit changes arguments"),
        ("reject", {"amount": "1.00"}, "only an edit changes arguments"),
    ],
)
def test_a_decision_that_cannot_mean_anything_is_refused(
    decision: ApprovalChoice, changes: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        REQUEST.answer(decision, "a-1", changes=changes)


def test_a_write_that_declares_nothing_editable_cannot_be_edited() -> None:
    fixed = REQUEST.model_copy(update={"editable": ()})
    with pytest.raises(ValueError, match="submit_refund allows no edits"):
        fixed.answer("edit", "a-1", changes={"amount": "40.00"})


# The demo's approval behaviour does not depend on the backend; cross-process approval on each
# backend is covered by the round trips above and tests/test_cli.py. So one backend each: the
# embedded default for `make demo`, Postgres for a demo left waiting for another process.
def test_demo_yes_completes_with_one_refund(
    sqlite_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    demo = cli("demo", "--yes", "--db", sqlite_url, env=env_for(services, tmp_path), expect=0)
    assert "COMPLETED" in demo.stdout
    [refund] = list_refunds(services, "O-42")
    assert refund["refund_id"] in demo.stdout and refund["amount"] == "100.00"


@pytest.mark.postgres
def test_demo_without_a_terminal_waits_and_prints_the_command_that_approves(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = env_for(services, tmp_path)
    demo = cli(
        "demo", "--db", postgres_url, env=env, expect=EXIT_CODES["waiting"]
    )  # stdin is not a terminal
    assert "WAITING_APPROVAL" in demo.stdout
    printed = APPROVE_COMMAND.search(demo.stdout)
    assert printed is not None, demo.stdout
    assert list_refunds(services, "O-42") == []

    _, *command = printed[0].split()
    approved = cli(*command, "--db", postgres_url, env=env, expect=0)
    assert "COMPLETED" in approved.stdout
    assert len(list_refunds(services, "O-42")) == 1


@pytest.mark.postgres
def test_two_decisions_at_once_one_takes_effect_and_the_other_says_it_did_not(
    postgres_url: str, services: ServiceEndpoints, tmp_path: Path
) -> None:
    env = env_for(services, tmp_path)
    started = cli(
        "run",
        DEMO_TASK,
        "--user",
        "u-1",
        "--db",
        postgres_url,
        env=env,
        expect=EXIT_CODES["waiting"],
    )
    match = APPROVE_COMMAND.search(started.stdout)
    assert match is not None, started.stdout
    # Two processes at once, each forked from the command-line server (`runtime_fixtures.cli`).
    with ThreadPoolExecutor(max_workers=2) as pool:
        deciders = [
            pool.submit(
                cli, "approvals", *verb, match[1], "--as", who, "--db", postgres_url, env=env
            )
            for verb, who in ((("approve",), "a-1"), (("reject", "--comment", "no"), "a-2"))
        ]
        results = [(d.returncode, d.stdout, d.stderr) for d in (f.result() for f in deciders)]
    # One decision takes effect: an approval completes the run (0), a rejection ends it (4).
    codes = [code for code, _, _ in results]
    assert codes in ([0, 2], [2, EXIT_CODES["incomplete"]]), results
    [(_, loser_out, loser_err)] = [r for r in results if r[0] == 2]
    assert "did not take effect" in loser_err or "no pending approval" in loser_err
    assert "COMPLETED" not in loser_out  # the loser never reads as if it had decided
    with connect(services) as deps, open_runner(postgres_url, refunds, deps=deps) as runner:
        [record] = runner.state(runner.run_ids()[0])["approvals"]
    assert record["decision"] == ("approve" if results[0][0] == 0 else "reject")


def test_the_approvals_list_reads_only_the_runs_that_have_not_ended(
    open_test_runner: RunnerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database's runs are mostly ended ones: the list reads the state of those that are not
    (one each), whatever the others' number."""
    small = "Check whether order O-43 can be refunded and refund it if so."  # no approval
    with open_test_runner() as runner:
        waiting = runner.start(DEMO_TASK, principal())
        ended = [runner.start(small, principal(task=small)) for _ in range(2)]
        ended.append(runner.cancel(runner.start(DEMO_TASK, principal()).run_id))
        read: list[str] = []
        outcome = runner.outcome

        def reading(run_id: str) -> RunOutcome:
            read.append(run_id)
            return outcome(run_id)

        monkeypatch.setattr(runner, "outcome", reading)
        [request] = pending_approvals(runner)
        unended = [record.run_id for record in runner.leases.unended()]
    assert [e.phase for e in ended] == ["COMPLETED", "COMPLETED", "INCOMPLETE"]
    assert unended == read == [waiting.run_id]
    assert request["approval_id"] == waiting.waiting_for_approval[0]["approval_id"]
