"""A run's attempt binds its tools to the model once per set of tools, not at every step."""

from __future__ import annotations

from typing import Any

import pytest

from loopwright.testing.scripted import ScriptedChatModel
from loopwright_refunds.long_task import KeepsReading
from tests.runtime_fixtures import RunnerFactory, principal

READS = 3


def test_one_binding_serves_every_model_step_of_an_attempt(
    open_test_runner: RunnerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound: list[list[str]] = []
    bind = ScriptedChatModel.bind_tools

    def counting(self: ScriptedChatModel, tools: Any, **kwargs: Any) -> Any:
        bound.append([tool["function"]["name"] for tool in tools])
        return bind(self, tools, **kwargs)

    monkeypatch.setattr(ScriptedChatModel, "bind_tools", counting)
    offered: list[list[str]] = []
    decide = ScriptedChatModel._decide

    def seeing(self: ScriptedChatModel, messages: Any, tools: Any) -> Any:
        offered.append([tool["function"]["name"] for tool in tools])
        return decide(self, messages, tools)

    monkeypatch.setattr(ScriptedChatModel, "_decide", seeing)
    task = "Read orders O-42, O-43 and O-44 in turn, again and again."
    with open_test_runner(model=ScriptedChatModel(policy=KeepsReading(reads=READS))) as runner:
        outcome = runner.start(task, principal(task=task))
    assert outcome.stop_reason == "completed", outcome.stop_detail
    # Every model step was offered the tools, from the one binding of the attempt.
    assert len(offered) == READS + 1 and all(names == offered[0] for names in offered)
    assert bound == [offered[0]] and "get_order" in offered[0]
