"""Slow, weak and chatty models end typed: never hang, never break a business rule, never
"complete" on garbage. Driven through the OpenAI-compatible path against the local server
(`tests/openai_server.py`), which plays what real servers and small models do.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, ToolMessage

from loopwright import Budget, Decision, open_runner
from loopwright.runner import ModelChanged
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests import stubborn_agent as stubborn
from tests.openai_server import HOLDS, MODEL, Hold, ModelFactory, OpenAIStub
from tests.runtime_fixtures import (
    BACKENDS,
    PATIENCE_S,
    RunnerFactory,
    all_refunds,
    on_backend,
    principal,
    start_cli,
    wait_for,
)

OUTSIDE_WINDOW_TASK = "Please refund 40.00 USD on my order O-44."  # delivered 90 days ago
TASK = "Check whether order O-43 can be refunded and refund it if so."


def refunds_straight_away(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]
) -> Decision:
    """A weak model: refunds what the user asks without reading the order or the policy."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        args = {"order_id": "O-44", "amount": "40.00", "currency": "USD", "reason": "asked"}
        return Decision(tool_calls=[("submit_refund", args)])
    return Decision(content="The refund was submitted successfully.")


def test_a_business_rule_holds_whatever_the_model_read(
    open_test_runner: RunnerFactory,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    services: ServiceEndpoints,
) -> None:
    openai_stub.policy = refunds_straight_away
    with open_test_runner(model=openai_model("chat")) as runner:
        task = OUTSIDE_WINDOW_TASK
        outcome = runner.start(task, principal(task=task))
    assert outcome.actions == []  # refused at validate: never planned, never approved, never sent
    assert all_refunds(services) == []
    state_errors = [r.body for r in openai_stub.recorded]
    assert "outside_refund_window" in str(state_errors[-1])  # the model was told the rule
    facts = (outcome.verification or {})["facts"]
    assert facts["writes"] == []  # whatever the answer says, the verification holds no refund


# (API, streamed, how the answer never ends): every hold on both APIs streamed; the two a
# request that is not streamed can meet (bytes that never finish a body, nothing at all).
HELD = [(api, True, how) for api in ("chat", "responses") for how in HOLDS] + [
    (api, False, how) for api in ("chat", "responses") for how in ("trickle", "silent")
]


# The bound is the HTTP client's: the database never sees it, so the backends take turns.
@pytest.mark.parametrize(
    ("api", "stream", "how", "database_url"),
    [on_backend(BACKENDS[i % len(BACKENDS)], *held) for i, held in enumerate(HELD)],
    indirect=["database_url"],
)
def test_a_model_request_ends_by_its_timeout_whatever_the_server_sends(
    open_test_runner: RunnerFactory,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    api: str,
    stream: bool,
    how: Hold,
) -> None:
    """LOOPWRIGHT_MODEL_TIMEOUT_S bounds one request, retries included, whatever bytes keep
    arriving; the run ends typed and lets go of its lease. Every answer after the held one would
    be served: one request means the client did not retry past its bound."""
    openai_stub.hold_next(how)
    model = openai_model(api, stream=stream, timeout_s=1.5, retries=2)
    with open_test_runner(model=model) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
        lease = runner.leases.get(outcome.run_id)
    # Ended by the bound (not by the run's deadline, whose stop reason this is not), after one
    # request (not a timeout per retry: see below).
    assert (outcome.phase, outcome.stop_reason) == ("INCOMPLETE", "tool_unavailable")
    assert "CallOutlasted: the model request was still going after its bound of 1.5 s" in (
        outcome.stop_detail
    )
    assert lease is not None and not lease.lease_live  # let go: nothing holds the run
    assert len(openai_stub.requests()) == 1


def test_the_budget_bounds_a_request_below_the_models_own_timeout(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    openai_stub.hold_next("trickle")
    model = openai_model("chat", stream=True)  # its own timeout: the default 60 s
    with open_test_runner(model=model, budget=Budget(max_model_request_s=1.0)) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
    assert "after its bound of 1 s" in outcome.stop_detail
    [request] = openai_stub.requests("/chat/completions")
    assert request["max_tokens"] == Budget().max_output_tokens_per_request


def test_the_re_ask_after_a_refused_answer_never_ends_with_the_models_own_message(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    """llama.cpp refuses a request that ends with an assistant message; the runtime's feedback
    goes last, as a user-role message."""
    openai_stub.refuse_trailing_assistant = True
    openai_stub.policy = refunds_straight_away
    with open_test_runner(model=openai_model("chat")) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
    assert 400 not in openai_stub.statuses
    last = [r["messages"][-1] for r in openai_stub.requests("/chat/completions")]
    assert [m["role"] for m in last] == ["user", "tool", "user"]
    assert last[-1]["content"].startswith("[runtime feedback")
    assert outcome.stop_reason in ("not_done", "no_progress")


def written_call(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    """How a small model on a server without tool-call parsing writes a call: as text."""
    text = '```json\n{"name": "submit_refund", "arguments": {"order_id": "O-43"}}\n```'
    return Decision(content=text)


def cut_short(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> Decision:
    return Decision(content="Refunded 30.00 USD to or")


def test_a_call_written_as_text_or_an_answer_cut_at_the_limit_never_completes(
    open_test_runner: RunnerFactory, openai_stub: OpenAIStub, openai_model: ModelFactory
) -> None:
    openai_stub.policy = written_call
    with open_test_runner(model=openai_model("chat")) as runner:
        written = runner.start(TASK, principal(task=TASK))
    assert written.stop_reason != "completed"
    problems = (written.verification or {}).get("problems", [])
    assert any("looks like a call of submit_refund written as text" in p for p in problems)

    openai_stub.policy = cut_short
    openai_stub.truncate_next()
    with open_test_runner(model=openai_model("chat")) as runner:
        cut = runner.start(TASK, principal(task=TASK))
    assert (cut.stop_reason, cut.verification) == ("tool_unavailable", None)
    assert "cut at the output limit" in cut.stop_detail


def test_a_run_keeps_the_model_it_was_started_with(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
) -> None:
    """Approved by a process that names no model, the run goes on with its own (recorded in
    V with its settings), not with the agent's default; one naming another model is refused."""
    openai_model("chat")  # points the environment at the stub
    spec = f"openai:{MODEL}"
    task = "Check whether order O-42 can be refunded and refund it if so."  # needs approval
    with connect(services) as deps:
        with open_runner(database_url, refunds, deps=deps, model_spec=spec) as starter:
            waiting = starter.start(task, principal(task=task))
            versions = starter.state(waiting.run_id)["versions"]
            second = starter.start(task, principal(task=task))
        assert (versions["model_spec"], versions["model_settings"]["api"]) == (spec, "chat")
        asked_before = len(openai_stub.requests())
        with open_runner(database_url, refunds, deps=deps) as approver:  # names no model
            done = approver.decide(waiting.run_id, "approve", "a-1")
        assert done.stop_reason == "completed"
        assert len(openai_stub.requests()) > asked_before  # the run's own model answered
        with (
            open_runner(database_url, refunds, deps=deps, model_spec="openai:other") as other,
            pytest.raises(ModelChanged, match=f"was started with {spec}"),
        ):
            other.decide(second.run_id, "approve", "a-1")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_run_waiting_on_its_model_at_once_and_gives_its_lease_up(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    tmp_path: Path,
    open_test_runner: RunnerFactory,
    sig: signal.Signals,
) -> None:
    """A model request that would go on for a minute (keep-alive comments, its timeout 60 s):
    the signal ends the process in its model step, the run's lease is free the moment it has
    exited (not at the lease's expiry), and the user is told how the run goes on."""
    openai_model("chat", stream=True, timeout_s=60)  # the stub's environment, as an operator's
    openai_stub.hold_next("keep_alive")
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    command = ["run", TASK, "--user", "u-1", "--run-id", "run-sig", "--db", database_url]
    started = start_cli(*command, "--model", f"openai:{MODEL}", env=env, stderr=subprocess.PIPE)
    wait_for(lambda: openai_stub.requests())  # the held request is in flight
    started.send_signal(sig)
    _, stderr = started.communicate(timeout=PATIENCE_S)
    with open_test_runner() as runner:
        lease = runner.leases.get("run-sig")
    assert started.returncode == 130, stderr
    assert lease is not None and not lease.lease_live  # given up, not left to expire
    assert stderr.splitlines()[-1].startswith(
        "loopwright: interrupted: run run-sig keeps the steps it committed; go on with:"
        " loopwright resume run-sig"
    )


def test_a_worker_told_to_stop_ends_the_model_request_in_flight_and_gives_the_run_up(
    database_url: str,
    services: ServiceEndpoints,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    tmp_path: Path,
    open_test_runner: RunnerFactory,
) -> None:
    """SIGTERM to a worker whose run waits on a model that would go on for a minute: the
    request ends now, the attempt unwinds, and the run is free for another worker at once."""
    openai_model("chat", stream=True, timeout_s=60)
    openai_stub.hold_next("keep_alive")
    with open_test_runner() as runner:
        run_id = runner.submit(TASK, principal(task=TASK))
    env = {**services.to_env(), "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    command = ["worker", "--db", database_url, "--poll", "0.2", "--model", f"openai:{MODEL}"]
    worker = start_cli(*command, env=env)
    try:
        wait_for(lambda: openai_stub.requests())  # the held request is in flight
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=PATIENCE_S)
    finally:
        worker.kill()
    with open_test_runner() as runner:
        lease = runner.leases.get(run_id)
    assert lease is not None and not lease.lease_live


def test_code_that_swallows_the_interrupt_cannot_keep_the_process_or_the_lease(
    database_url: str, tmp_path: Path, open_test_runner: RunnerFactory
) -> None:
    """A tool that ignores KeyboardInterrupt and would wait an hour: a second after
    SIGINT the process gives the run's lease up, says how to resume, and exits with 130."""
    waiting = tmp_path / "waiting"
    env = {"LOOPWRIGHT_HOME": str(tmp_path / "home"), stubborn.STARTED_ENV: str(waiting)}
    agent = ("--agent", "tests.stubborn_agent:agent", "--db", database_url)
    command = ["run", stubborn.TASK, "--user", "u-1", "--run-id", "run-stubborn", *agent]
    started = start_cli(*command, env=env, stderr=subprocess.PIPE)
    wait_for(waiting.exists)  # the wait is in flight
    started.send_signal(signal.SIGINT)
    _, stderr = started.communicate(timeout=PATIENCE_S)  # not the tool's hour
    with open_runner(database_url, stubborn.agent) as runner:
        lease = runner.leases.get("run-stubborn")
    assert started.returncode == 130
    assert lease is not None and not lease.lease_live
    assert stderr.splitlines()[-1].startswith(
        "loopwright: interrupted: run run-stubborn keeps the steps it committed; go on with:"
    )
