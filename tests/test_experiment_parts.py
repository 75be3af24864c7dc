"""The experiment's parts that need no services: the matrix, the retrying policy, the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loopwright.graph.crashpoints import POINTS
from loopwright_refunds.experiments.matrix import BASELINE_CRASH_POINTS, full_matrix, select
from loopwright_refunds.experiments.metrics import chain_success, measure, percentile
from loopwright_refunds.experiments.policy import RetryingRefunds
from loopwright_refunds.experiments.trials import TrialResult

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


def conversation(*results: tuple[str, dict[str, Any], str]) -> list[BaseMessage]:
    """The task, then each (tool, args, result text) as a call and its answer."""
    messages: list[BaseMessage] = [HumanMessage(TASK)]
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


def test_percentile_and_chain() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert chain_success(50) == pytest.approx(0.605, abs=1e-3)


def trial(success: bool, duplicates: int, crashed: bool) -> TrialResult:
    return TrialResult(
        system="prebuilt",
        scenario="partial",
        fault="none",
        fault_kind="none",
        repetition=0,
        seed="s",
        long=False,
        concurrent=False,
        success=success,
        duplicates=duplicates,
        unauthorized=0,
        unauthorized_reasons=[],
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


def test_outputs_are_written(tmp_path: Path) -> None:
    from loopwright_refunds.experiments.report import write_outputs

    write_outputs([trial(True, 0, False)], tmp_path)
    assert "| prebuilt | 1 |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "chain.png").exists()
