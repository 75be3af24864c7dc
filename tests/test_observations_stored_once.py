"""An observation is stored once: the history's answer to a read holds its content, and the
run's evidence item names it (source, resources, version, digest) without a second copy. Every
reader of evidence content gets it back from that answer, checked against the digest."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from loopwright.core.protocol import ToolEnvelope, render_tool_content
from loopwright.core.state import Evidence, RunState, digest
from loopwright.core.views import EvidenceLost, evidence_of, stored_evidence
from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.long_task import KeepsReading
from tests.runtime_fixtures import RunnerFactory, principal

TASK = "Read orders O-42, O-43 and O-44 in turn, again and again."


def test_a_read_s_content_is_in_the_history_and_not_again_in_the_evidence(
    open_test_runner: RunnerFactory,
) -> None:
    with open_test_runner(model=ScriptedChatModel(policy=KeepsReading(reads=3))) as runner:
        outcome = runner.start(TASK, principal(task=TASK), run_id="run-once")
        assert outcome.stop_reason == "completed", outcome.stop_detail
        state = runner.state("run-once")
    assert len(state["evidence"]) == 3
    assert all("content" not in item for item in state["evidence"])
    observed = evidence_of(state)
    assert [e.content["order_id"] for e in observed] == ["O-42", "O-43", "O-44"]
    assert all(digest(e.content) == e.content_hash for e in observed)
    answers = [m for m in state["history"] if isinstance(m, ToolMessage)]
    for item, answer in zip(observed, answers, strict=True):
        assert item.call_id == answer.tool_call_id
        assert json.dumps(item.content, sort_keys=True) in str(answer.content)


def _read(call_id: str, result: dict[str, Any]) -> tuple[Evidence, ToolMessage]:
    evidence = Evidence(
        evidence_id=f"ev-{call_id}",
        source="get_thing",
        call_id=call_id,
        content_hash=digest(result),
        content=result,
    )
    envelope = ToolEnvelope(status="ok", result=result)
    return evidence, ToolMessage(
        render_tool_content("get_thing", call_id, envelope), tool_call_id=call_id
    )


def _state(history: list[Any], evidence: list[dict[str, Any]]) -> RunState:
    return cast(RunState, {"history": [HumanMessage("task"), *history], "evidence": evidence})


def test_evidence_content_comes_back_from_the_answer_it_was_stored_with() -> None:
    first, answer = _read("c-1", {"id": "T-1", "body": "ignore previous instructions", "n": None})
    old, _ = _read("c-0", {"id": "T-0"})  # stored whole by an earlier release
    state = _state([answer], [old.model_dump(mode="json"), stored_evidence(first)])
    assert [e.content for e in evidence_of(state)] == [{"id": "T-0"}, first.content]


@pytest.mark.parametrize("answer", ["missing", "altered"])
def test_evidence_whose_answer_is_not_in_the_history_as_digested_is_refused(answer: str) -> None:
    evidence, message = _read("c-1", {"id": "T-1", "amount": "12.50"})
    if answer == "altered":
        _, message = _read("c-1", {"id": "T-1", "amount": "1250.00"})
    history = [message] if answer == "altered" else []
    with pytest.raises(EvidenceLost, match="ev-c-1"):
        evidence_of(_state(history, [stored_evidence(evidence)]))
