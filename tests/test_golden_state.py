"""Golden serialized run states, one per state schema version, replayed against the current code.

A run checkpointed by an older release must still be readable and routable by this one. Each
file in tests/golden/ is the state of the demo run waiting for approval, as that schema version
wrote it. When the schema changes, bump STATE_SCHEMA_VERSION, keep the old files, and add the
new one with `LOOPWRIGHT_WRITE_GOLDEN=1 pytest tests/test_golden_state.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, message_to_dict, messages_from_dict

from loopwright.checkpoints.journal import open_journal
from loopwright.core.state import STATE_SCHEMA_VERSION, Action, CallVerdict, RunState, Versions
from loopwright.core.views import actions_of, pending_of, principal_of, usage_of
from loopwright.graph.build import after_guard, after_validate
from loopwright.nodes.compile_context import system_text
from loopwright.nodes.context import RunContext
from loopwright_refunds.agent import agent as refunds
from tests.runtime_fixtures import DEMO_TASK, RunnerFactory, principal

GOLDEN = Path(__file__).parent / "golden"


def to_json(state: RunState) -> dict[str, Any]:
    return {**state, "history": [message_to_dict(m) for m in state["history"]]}


def from_json(raw: dict[str, Any]) -> RunState:
    return RunState(**{**raw, "history": messages_from_dict(raw["history"])})  # type: ignore[typeddict-item]


@pytest.mark.skipif(
    not os.environ.get("LOOPWRIGHT_WRITE_GOLDEN"), reason="writes golden files on request"
)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_write_golden_state(open_test_runner: RunnerFactory) -> None:
    with open_test_runner() as runner:
        outcome = runner.start(DEMO_TASK, principal(), run_id="run-golden")
        state = runner.state(outcome.run_id)
    path = GOLDEN / f"state-v{STATE_SCHEMA_VERSION}-waiting-approval.json"
    path.write_text(json.dumps(to_json(state), indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("state-v*.json")), ids=lambda p: p.name)
def test_golden_state_is_readable_and_routes_to_approval(path: Path, sqlite_url: str) -> None:
    state = from_json(json.loads(path.read_text()))
    assert state["schema_version"] <= STATE_SCHEMA_VERSION
    assert principal_of(state).user_id == "u-1"
    assert usage_of(state).model_requests == 3
    Versions.model_validate(state["versions"])
    [action] = actions_of(state)
    assert isinstance(action, Action) and action.status == "NEEDS_APPROVAL"
    [call] = pending_of(state)
    assert call.verdict is CallVerdict.NEEDS_APPROVAL
    assert call.approval is not None and call.approval.digest == action.digest
    assert isinstance(state["history"][-1], AIMessage)
    assert after_validate(state) == "approval"
    assert after_guard(state) == "compile_context"
    with open_journal(sqlite_url) as journal:
        context = RunContext(
            model=refunds.chat_model(),
            tools=refunds.tools,
            journal=journal,
            agent_name=refunds.name,
            instructions=refunds.instructions,
        )
        assert "NOT DONE" in system_text(state, ["get_order"], context)
