"""Fuzzed tool calls through the real graph: nothing raises out of it, nothing invalid runs.

Each example is one whole run (on SQLite: the checks do not depend on the backend, and a run
per example is the expensive part): a scripted model makes one step of one to three generated
calls (`benchmarks.fuzz_calls`: malformed JSON, wrong types, huge and odd strings, missing and
extra fields, unknown tools, valid calls too), then answers. The run must end typed or wait for
an approval nobody gives, and the ground truth must hold: evidence only from acceptable reads,
journal actions only for acceptable writes, executed only those that need no approval, and
payments holding exactly the refunds of this run's succeeded actions.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, ToolMessage

from benchmarks.fuzz_calls import (
    TASK,
    FuzzedCall,
    acceptable,
    decision_of,
    fuzzed_calls,
    runs_without_approval,
)
from loopwright.core.state import ActionStatus, StopReason
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.misbehaving import OneShot
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.runtime_fixtures import RunnerFactory, all_refunds, principal

NEVER_SENT = frozenset({ActionStatus.NEEDS_APPROVAL, ActionStatus.PLANNED, ActionStatus.REJECTED})


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@settings(
    max_examples=30,
    deadline=None,
    database=None,
    # The same 30 examples on every run: CI must not pass or fail by the draw. New draws are
    # the benchmark's (`python -m benchmarks.fuzz_calls --calls N --seed S`).
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(batch=st.lists(fuzzed_calls(), min_size=1, max_size=3))
def test_fuzzed_calls_never_raise_and_never_run_an_invalid_call(
    open_test_runner: RunnerFactory, services: ServiceEndpoints, batch: list[FuzzedCall]
) -> None:
    before = {r["refund_id"] for r in all_refunds(services)}
    with open_test_runner(ScriptedChatModel(policy=OneShot(decision_of(batch)))) as runner:
        outcome = runner.start(TASK, principal(task=TASK))  # raises nothing
        state = runner.state(outcome.run_id)
    assert outcome.stop_reason in set(StopReason) or outcome.waiting_for_approval

    step = next(m for m in state["history"] if isinstance(m, AIMessage))
    asked = {c["id"]: (c["name"], c["args"]) for c in step.tool_calls}
    answered = [m.tool_call_id for m in state["history"] if isinstance(m, ToolMessage)]
    assert len(answered) == len(set(answered))  # no call answered twice
    if not outcome.waiting_for_approval:
        assert set(answered) == set(asked) | {c["id"] for c in step.invalid_tool_calls}

    for item in state["evidence"]:
        assert runs_without_approval(*asked[item["call_id"]]), item["call_id"]
    for action in outcome.actions:
        assert acceptable(action.tool, action.args), action
        if action.status not in NEVER_SENT:
            assert runs_without_approval(action.tool, action.args), action
    made = {r["idempotency_key"] for r in all_refunds(services) if r["refund_id"] not in before}
    assert made == {a.intent_key for a in outcome.actions if a.status is ActionStatus.SUCCEEDED}
