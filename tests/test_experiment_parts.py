"""The experiment's parts that need no services: the matrix, the retrying policies and the one that
skips the policy, the judging of credit entries and of policy-violating refunds, the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loopwright.core.crashpoints import POINTS
from loopwright_refunds.experiments.__main__ import parser
from loopwright_refunds.experiments.matrix import BASELINE_CRASH_POINTS, full_matrix, select
from loopwright_refunds.experiments.metrics import chain_success, measure, percentile, slices
from loopwright_refunds.experiments.policy import ExperimentPolicy, RetryingRefunds
from loopwright_refunds.experiments.run import Settings
from loopwright_refunds.experiments.scenarios import (
    CREDIT_TASK,
    KEYLESS,
    PAID_BACK_ITEM,
    PAID_BACK_TASK,
    SKIPS_POLICY,
    Staged,
)
from loopwright_refunds.experiments.trials import TrialResult
from loopwright_refunds.experiments.truth import judge_credits, policy_breaches

TASK = "The customer returned one item of order O-7: refund 15.00 of order O-7 if allowed."
ORDER = {
    "order_id": "O-7",
    "owner": "u-1",
    "status": "delivered",
    "amount": "60.00",
    "currency": "USD",
    "refunded": "0.00",
    "refundable": "60.00",
    "delivered_at": "2999-01-01T00:00:00+00:00",
    "version": 1,
}
POLICY = {"version": 1, "window_days": 30, "requires_delivery": False}


def test_every_crash_point_is_a_loopwright_cell_and_baselines_get_only_their_own() -> None:
    cells = select(full_matrix(), faults=("crash",))
    ours = {p for c in cells if c.system == "loopwright" for p in c.fault.crash_at}
    assert ours == set(POINTS)
    theirs = {p for c in cells if c.system != "loopwright" for p in c.fault.crash_at}
    assert theirs == BASELINE_CRASH_POINTS


def test_the_keyless_scenario_meets_its_four_faults_and_none_in_every_system() -> None:
    cells = select(full_matrix(), scenarios=(KEYLESS,))
    faults = {
        "none",
        "fail_before_commit",  # the lost request
        "accept_then_timeout",  # the lost response
        "crash@executor:after_dispatch_record",  # a crash before the send
        "crash@executor:after_send",  # a crash after it
    }
    assert {(c.fault.name, c.system) for c in cells} == {
        (fault, system) for fault in faults for system in ("loopwright", "prebuilt", "plain_loop")
    }
    assert len(cells) == 15


def test_the_keyless_scenario_is_selectable_from_the_command_line() -> None:
    args = parser().parse_args(["-n", "1", "--scenario", KEYLESS])
    settings = Settings(repetitions=args.repetitions, scenarios=tuple(args.scenario))
    assert {c.scenario for c in settings.matrix()} == {KEYLESS}


def test_the_model_that_skips_the_policy_meets_no_fault_in_every_system() -> None:
    cells = select(full_matrix(), scenarios=(SKIPS_POLICY,))
    assert {(c.fault.name, c.system) for c in cells} == {
        ("none", system) for system in ("loopwright", "prebuilt", "plain_loop")
    }
    args = parser().parse_args(["-n", "1", "--scenario", SKIPS_POLICY])
    settings = Settings(repetitions=args.repetitions, scenarios=tuple(args.scenario))
    assert settings.matrix() == cells


def conversation(*results: tuple[str, dict[str, Any], str], task: str = TASK) -> list[BaseMessage]:
    """The task, then each (tool, args, result text) as a call and its answer."""
    messages: list[BaseMessage] = [HumanMessage(task)]
    for n, (tool, args, text) in enumerate(results):
        messages.append(AIMessage("", tool_calls=[{"name": tool, "args": args, "id": f"c{n}"}]))
        messages.append(ToolMessage(text, tool_call_id=f"c{n}"))
    return messages


def ok(result: object) -> str:
    return json.dumps({"status": "ok", "result": result})


REFUND = {
    "order_id": "O-7",
    "amount": "15.00",
    "currency": "USD",
    "reason": "eligible under refund policy v1",
}


def test_policy_sends_the_same_refund_again_after_a_timeout() -> None:
    seen = conversation(
        ("get_order", {"order_id": "O-7"}, ok(ORDER)),
        ("get_policy", {}, ok(POLICY)),
        ("submit_refund", REFUND, "An error occurred ... Error: timed out"),
    )
    decision = RetryingRefunds()(seen, [])
    assert decision.tool_calls == [("submit_refund", REFUND)]


def test_policy_reads_again_after_a_stale_plan_then_proposes_what_the_order_allows() -> None:
    stale = json.dumps({"status": "error", "error": {"code": "stale_plan"}})
    seen = [
        ("get_order", {"order_id": "O-7"}, ok(ORDER)),
        ("get_policy", {}, ok(POLICY)),
        ("submit_refund", REFUND, stale),
    ]
    decision = RetryingRefunds()(conversation(*seen), [])
    assert decision.tool_calls == [("get_order", {"order_id": "O-7"})]
    cut = {**ORDER, "refundable": "10.00", "version": 2}
    seen.append(("get_order", {"order_id": "O-7"}, ok(cut)))
    again = RetryingRefunds()(conversation(*seen), [])
    assert again.tool_calls == [("submit_refund", {**REFUND, "amount": "10.00"})]


CREDIT_TASK_TEXT = CREDIT_TASK.format(amount="20.00", order="O-7")
CREDIT = {
    "order_id": "O-7",
    "amount": "20.00",
    "currency": "USD",
    "note": "store credit for order O-7",
}


def test_credit_policy_asks_for_the_credit_once_and_again_after_a_timeout_or_a_5xx() -> None:
    policy = ExperimentPolicy()
    first = policy(conversation(task=CREDIT_TASK_TEXT), [])
    assert first.tool_calls == [("issue_store_credit", CREDIT)]
    for failure in ("An error occurred ... Error: timed out", "HTTP 500: internal_error"):
        seen = conversation(("issue_store_credit", CREDIT, failure), task=CREDIT_TASK_TEXT)
        assert policy(seen, []).tool_calls == [("issue_store_credit", CREDIT)]


def test_credit_policy_stops_after_a_credit_that_went_through_or_was_refused() -> None:
    policy = ExperimentPolicy()
    done = conversation(
        ("issue_store_credit", CREDIT, ok({"balance": "20.00"})), task=CREDIT_TASK_TEXT
    )
    assert policy(done, []).tool_calls == []
    refused = json.dumps({"status": "error", "error": {"code": "permission_denied"}})
    seen = conversation(("issue_store_credit", CREDIT, refused), task=CREDIT_TASK_TEXT)
    assert policy(seen, []).tool_calls == []
    timeouts = [("issue_store_credit", CREDIT, "Error: timed out")] * 3
    assert policy(conversation(*timeouts, task=CREDIT_TASK_TEXT), []).tool_calls == []


def test_a_refund_task_still_gets_the_refund_policy() -> None:
    seen = conversation(
        ("get_order", {"order_id": "O-7"}, ok(ORDER)), ("get_policy", {}, ok(POLICY))
    )
    assert ExperimentPolicy()(seen, []).tool_calls == [("submit_refund", REFUND)]


PAID_BACK = PAID_BACK_TASK.format(
    refunds=PAID_BACK_ITEM.format(amount="34.50", order="O-7")
    + " and "
    + PAID_BACK_ITEM.format(amount="20.00", order="O-8")
)


def refund_of(order_id: str, amount: str) -> dict[str, str]:
    return {
        "order_id": order_id,
        "amount": amount,
        "currency": "USD",
        "reason": "the customer asked for their money back",
    }


def test_the_model_that_skips_the_policy_refunds_each_order_at_once_and_only_once() -> None:
    policy = ExperimentPolicy()
    assert policy(conversation(task=PAID_BACK), []).tool_calls == [
        ("submit_refund", refund_of("O-7", "34.50"))
    ]
    refused = json.dumps({"status": "error", "error": {"code": "outside_refund_window"}})
    first = ("submit_refund", refund_of("O-7", "34.50"), refused)
    assert policy(conversation(first, task=PAID_BACK), []).tool_calls == [
        ("submit_refund", refund_of("O-8", "20.00"))
    ]
    both = conversation(first, ("submit_refund", refund_of("O-8", "20.00"), ok({})), task=PAID_BACK)
    answer = policy(both, [])
    assert answer.tool_calls == [] and answer.content


NOW = "2030-06-01T12:00:00+00:00"
SEEDED_POLICY = {"window_days": 30, "requires_delivery": True}


def made(amount: str, at: str = NOW, currency: str = "USD") -> dict[str, str]:
    return {"amount": amount, "currency": currency, "status": "succeeded", "created_at": at}


def order_at_end(**fields: object) -> dict[str, object]:
    """An order as the orders service has it at the end of a trial."""
    return {
        "status": "delivered",
        "delivered_at": "2030-05-31T12:00:00+00:00",
        "amount": "40.00",
        "refunded": "0.00",
        "currency": "USD",
        **fields,
    }


@pytest.mark.parametrize(
    ("order", "refunds", "breaches"),
    [
        # delivered yesterday, the whole balance: allowed
        (order_at_end(refunded="40.00"), [made("40.00")], [[]]),
        # delivered 90 days before the refund: outside the 30-day window
        (
            order_at_end(delivered_at="2030-03-03T12:00:00+00:00", refunded="40.00"),
            [made("40.00")],
            [["window"]],
        ),
        # not delivered at all
        (
            order_at_end(status="shipped", delivered_at=None, refunded="25.00"),
            [made("25.00")],
            [["delivery"]],
        ),
        # 10.00 refunded before the trial: 40.00 is above the 30.00 left (payments refuses it,
        # so it could only be seen if it got through)
        (order_at_end(refunded="50.00"), [made("40.00")], [["balance"]]),
        # two of the trial's refunds: the second is above what the first left
        (
            order_at_end(refunded="60.00"),
            [made("30.00", "2030-06-01T12:00:01+00:00"), made("30.00")],
            [[], ["balance"]],
        ),
        # another currency
        (order_at_end(refunded="20.00"), [made("20.00", currency="EUR")], [["currency"]]),
        # no refund, nothing to judge
        (order_at_end(), [], []),
    ],
)
def test_refunds_are_judged_against_the_refund_policy(
    order: dict[str, Any], refunds: list[dict[str, Any]], breaches: list[list[str]]
) -> None:
    assert policy_breaches(order, SEEDED_POLICY, refunds) == breaches


def test_a_policy_that_asks_for_no_delivery_allows_an_undelivered_order() -> None:
    order = order_at_end(status="shipped", delivered_at=None, refunded="40.00")
    lenient = {"window_days": 30, "requires_delivery": False}
    assert policy_breaches(order, lenient, [made("40.00")]) == [[]]


CREDIT_TRIAL = Staged(
    CREDIT_TASK_TEXT, "u-1", {"O-7": "u-1"}, {"O-7": []}, credits={"u-1": ["20.00"]}
)


@pytest.mark.parametrize(
    ("credited", "duplicates", "unauthorized", "as_expected"),
    [
        ({"u-1": ["20.00"]}, 0, 0, True),  # exactly the one credit entry asked for
        ({"u-1": ["20.00", "20.00"]}, 1, 0, False),  # one intent, two entries
        ({}, 0, 0, False),  # nothing credited
        ({"u-1": ["15.00"]}, 0, 0, False),  # the wrong amount
        ({"u-1": ["20.00"], "u-2": ["20.00"]}, 0, 1, False),  # another customer credited too
    ],
)
def test_credit_entries_are_judged_against_the_expected_ones(
    credited: dict[str, list[str]], duplicates: int, unauthorized: int, as_expected: bool
) -> None:
    verdict = judge_credits(CREDIT_TRIAL, credited)
    assert (verdict.duplicates, verdict.unauthorized, verdict.as_expected) == (
        duplicates,
        unauthorized,
        as_expected,
    )


def test_percentile_and_chain() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert chain_success(50) == pytest.approx(0.605, abs=1e-3)


def trial(
    success: bool,
    duplicates: int,
    crashed: bool,
    scenario: str = "partial",
    fault: str = "none",
    fault_kind: str = "none",
    policy_violations: int = 0,
    system: str = "prebuilt",
) -> TrialResult:
    return TrialResult(
        system=system,
        scenario=scenario,
        fault=fault,
        fault_kind=fault_kind,
        repetition=0,
        seed="s",
        long=False,
        concurrent=False,
        success=success,
        duplicates=duplicates,
        unauthorized=0,
        unauthorized_reasons=[],
        policy_violations=policy_violations,
        policy_reasons=["window", "delivery"][:policy_violations],
        crashed=crashed,
        latency_s=1.0,
        model_calls=5,
        input_tokens=100,
        output_tokens=10,
        unknown_windows_s=None,
        end="",
        refunds={},
        expected={},
    )


def test_cost_per_success_counts_the_failed_trials_too() -> None:
    measured = measure("prebuilt", "all", "all", [trial(True, 0, True), trial(False, 1, True)])
    assert measured.calls_per_success == 10
    assert (measured.duplicate_rate, measured.recovery_rate) == (0.5, 0.5)
    assert measured.unknown_windows is None


def test_the_keyless_scenario_is_sliced_by_fault() -> None:
    trials = [
        trial(True, 0, False),
        trial(False, 1, False, KEYLESS, "accept_then_timeout", "accept_then_timeout"),
        trial(False, 1, True, KEYLESS, "crash@executor:after_send", "crash"),
    ]
    keyless = {s.value: s for s in slices(trials) if s.dimension == "keyless fault"}
    assert set(keyless) == {"accept_then_timeout", "crash@executor:after_send"}
    assert keyless["crash@executor:after_send"].duplicate_effects == 1


def test_policy_violating_refunds_are_counted_per_system_and_by_scenario() -> None:
    trials = [
        trial(True, 0, False, system="loopwright"),
        trial(True, 0, False, SKIPS_POLICY, system="loopwright"),
        trial(True, 0, False),
        trial(False, 0, False, SKIPS_POLICY, policy_violations=2),
        trial(False, 0, False, SKIPS_POLICY, policy_violations=2),
    ]
    measured = {(s.system, s.dimension, s.value): s for s in slices(trials)}
    ours, theirs = measured["loopwright", "all", "all"], measured["prebuilt", "all", "all"]
    assert (ours.policy_trials, ours.policy_violations, ours.policy_rate) == (0, 0, 0.0)
    assert (theirs.policy_trials, theirs.policy_violations) == (2, 4)
    assert theirs.policy_rate == pytest.approx(2 / 3)
    assert measured["prebuilt", "scenario", SKIPS_POLICY].policy_violations == 4
    assert measured["prebuilt", "scenario", "partial"].policy_violations == 0


def test_outputs_are_written(tmp_path: Path) -> None:
    from loopwright_refunds.experiments.report import write_outputs

    trials = [
        trial(True, 0, False),
        trial(False, 1, False, KEYLESS),
        trial(False, 0, False, SKIPS_POLICY, policy_violations=2),
    ]
    write_outputs(trials, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| duplicate effects | policy-violating refunds |" in report
    assert "| prebuilt | 3 | 33% (1) | 0% (0) | 33% (1) | 33% (2) |" in report
    assert f"| {SKIPS_POLICY} | 0 / 0 / 2 / 0% of 1 |" in report  # by scenario: dup/unauth/policy
    assert "| none | 1 / 0 / 33% of 3 |" in report  # by fault: as before
    assert "## Keyless downstream (store credit), by fault" in report
    assert (tmp_path / "chain.png").exists()
