"""Model calls have one retry layer, the OpenAI client's: requests are counted at the server.

A transient answer (429, 5xx) is retried `LOOPWRIGHT_MODEL_RETRIES` times and no more; nothing
in the runtime adds attempts of its own. SQLite only: retries do not depend on the database.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from tests.openai_server import ModelFactory, OpenAIStub
from tests.runtime_fixtures import (
    DEMO_TASK,
    UNCRASHED_MODEL_CALLS,
    RunnerFactory,
    approve,
    principal,
)

# The stub's fixtures, bound here so that pytest finds them in this module.


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_rate_limited_twice_then_answered_is_three_requests_and_completes(
    openai_stub: OpenAIStub, openai_model: ModelFactory, open_test_runner: RunnerFactory
) -> None:
    model = openai_model("responses", retries=2)
    openai_stub.fail_next(429, times=2)

    with open_test_runner(model=model) as runner:
        outcome = approve(runner, runner.start(DEMO_TASK, principal()))
        usage = runner.state(outcome.run_id)["usage"]

    assert outcome.stop_reason == "completed"
    # The first model step took three requests; every later step one.
    assert openai_stub.statuses == [429, 429] + [200] * UNCRASHED_MODEL_CALLS
    assert usage["model_requests"] == UNCRASHED_MODEL_CALLS  # B counts answers, not attempts


@pytest.mark.parametrize(("api", "retries"), [("responses", 2), ("chat", 2), ("responses", 0)])
def test_persistent_503_is_retries_plus_one_requests_then_a_typed_stop(
    api: str,
    retries: int,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
) -> None:
    model = openai_model(api, retries=retries)
    openai_stub.fail_always(503)

    with open_test_runner(model=model) as runner:
        outcome = runner.start(DEMO_TASK, principal())
        state = runner.state(outcome.run_id)
        history = state["history"]

    assert openai_stub.statuses == [503] * (retries + 1)
    # The failed model step is in B: one request as the run sees it (the client's retries are its
    # own layer), with no tokens known for it.
    assert state["usage"]["model_requests"] == 1 and state["usage"]["input_tokens"] == 0
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "tool_unavailable")
    assert "Error code: 503" in outcome.stop_detail
    assert [type(m) for m in history] == [HumanMessage]
