"""Program actions: the model answers with a program over the agent's tools, and every call the
program makes is a call of the run, with every guarantee of one.

Runs of the reference agent on its real services, its scripted model answering with a program
(`tests.program_agent`). What each test shows is in its name."""

from __future__ import annotations

import base64
import io
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from rich.console import Console

from loopwright import Decision, Programs, ScriptedChatModel, ToolDefinitionError
from loopwright.core.protocol import parse_tool_content
from loopwright.core.views import program_of_message
from loopwright.nodes.compile_context import render
from loopwright.observability.jsonl import read_spans
from loopwright.observability.tracing import TraceSettings, configure_tracing, flush_traces
from loopwright.runner import Runner
from loopwright.timeline import render_run
from loopwright.tools import sandbox
from loopwright_refunds.services.admin import list_refunds
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.program_agent import REFUND_EACH, TASK, ProgramPolicy, program_model
from tests.program_agent import agent as program_agent
from tests.runtime_fixtures import RunnerFactory, decide, principal


@pytest.fixture
def open_program_runner(open_test_runner: RunnerFactory) -> Any:
    def factory(code: str = REFUND_EACH, inputs: dict[str, Any] | None = None) -> Any:
        return open_test_runner(agent=program_agent.replace(model=program_model(code, inputs)))

    return factory


def program_answer(runner: Runner, run_id: str) -> dict[str, Any]:
    """The answer to the run's program action, as the model was given it."""
    state = runner.state(run_id)
    [answer] = [
        m
        for m in state["history"]
        if isinstance(m, ToolMessage) and m.name == "run_program" and not program_of_message(m)
    ]
    return parse_tool_content(str(answer.content)).model_dump()


def test_a_program_refunds_each_order_each_call_checked_approved_and_journaled(
    open_program_runner: Any, services: ServiceEndpoints
) -> None:
    with open_program_runner() as runner:
        waiting = runner.start(TASK, principal(task=TASK), run_id="run-program")
        # The program read O-42 and asked to refund it: 100.00 needs an approver, who is asked
        # about that one call, with its arguments, and told which call of which program it is.
        [request] = waiting.waiting_for_approval
        assert (request["tool"], request["args"]["order_id"]) == ("submit_refund", "O-42")
        facts = {f["label"]: f["value"] for f in request["facts"]}
        assert facts["Program call"].startswith("call 2 of a program of this run")
        assert facts["Program source"] == REFUND_EACH
        assert facts["Program calls so far"] == "get_order ok"
        assert list_refunds(services, "O-42") == []
        done = runner.resume("run-program", decide(waiting))
        state = runner.state("run-program")
        answer = program_answer(runner, "run-program")
    assert done.stop_reason == "completed", done.stop_detail
    # Two model steps for the whole task: the program, and the answer.
    assert state["usage"]["model_requests"] == 2
    assert state["usage"]["tool_calls"] == 4
    [first], [second] = list_refunds(services, "O-42"), list_refunds(services, "O-43")
    assert answer["result"]["returned"] == {"O-42": first["refund_id"], "O-43": second["refund_id"]}
    assert [(a.tool, a.args["order_id"], a.status) for a in done.actions] == [
        ("submit_refund", "O-42", "SUCCEEDED"),
        ("submit_refund", "O-43", "SUCCEEDED"),
    ]
    program = state["program"]
    assert program["status"] == "ended" and program["snapshot"] is None
    # The sandbox the program was paused in, as the run recorded it (V) and the program did.
    assert state["versions"]["sandbox"] == program["sandbox"] == sandbox.sandbox_version()
    assert [(c["tool"], c["outcome"]) for c in program["calls"]] == [
        ("get_order", "ok"),
        ("submit_refund", "ok"),
        ("get_order", "ok"),
        ("submit_refund", "ok"),
    ]
    # Each call is answered in the history, as the program's: its reads are the run's evidence,
    # and the model is shown what the program returned, not each call.
    inner = [m for m in state["history"] if program_of_message(m)]
    assert [m.tool_call_id for m in inner] == [c["call_id"] for c in program["calls"]]
    assert {e["call_id"] for e in state["evidence"]} == {
        inner[0].tool_call_id,
        inner[2].tool_call_id,
    }
    assert not any(program_of_message(m) for m in render(state))


REFUND_AND_REPORT = """\
outcomes = []
for order_id in orders:
    try:
        order = get_order(order_id=order_id)
        submit_refund(order_id=order_id, amount=order["refundable"], currency=order["currency"],
                      reason="refund requested")
        outcomes.append(order_id + " refunded")
    except PermissionError as refused:
        outcomes.append(order_id + " not allowed: " + str(refused))
    except Exception as refused:
        outcomes.append(order_id + " refused: " + str(refused))
outcomes
"""


def test_a_refused_call_reaches_the_program_as_an_exception_it_may_handle(
    open_program_runner: Any, services: ServiceEndpoints
) -> None:
    """O-44 was delivered outside the refund window (a precondition refuses it), O-99 is
    another user's (authorisation refuses it), O-42's refund is rejected by the approver: the
    program hears each as an exception naming the refusal, goes on, and refunds O-43."""
    orders = ["O-44", "O-99", "O-42", "O-43"]
    with open_program_runner(REFUND_AND_REPORT, {"orders": orders}) as runner:
        task = "Refund orders O-42, O-43 and O-44 in full."
        waiting = runner.start(task, principal(task=task), run_id="run-refused")
        [request] = waiting.waiting_for_approval
        assert request["args"]["order_id"] == "O-42"
        done = runner.resume("run-refused", decide(waiting, "reject"))
        answer = program_answer(runner, "run-refused")
    returned = answer["result"]["returned"]
    assert returned[0].startswith("O-44 refused: outside_refund_window: ")
    assert returned[1].startswith("O-99 not allowed: out_of_scope: order:O-99 is outside")
    assert returned[2].startswith("O-42 refused: approval_rejected: rejected by a-1")
    assert returned[3] == "O-43 refunded"
    assert [r["order_id"] for o in orders for r in list_refunds(services, o)] == ["O-43"]
    assert {(a.args["order_id"], a.status) for a in done.actions} == {
        ("O-42", "REJECTED"),
        ("O-43", "SUCCEEDED"),
    }
    # The run is not done (O-42 was rejected), and says why, naming the program's refusals.
    assert done.stop_reason == "not_done"
    assert "submit_refund refused: outside_refund_window" in done.stop_detail, done.stop_detail


@pytest.mark.parametrize(
    ("code", "ending"),
    [
        ("while True:\n    pass", "time_limit"),
        ("grow = []\nwhile True:\n    grow.append('x' * 10_000)", "memory_limit"),
        ("def down(n):\n    return down(n + 1)\ndown(0)", "recursion_limit"),
        (
            "while True:\n    try:\n        undefined_name\n    except NameError:\n        pass",
            "suspension_limit",
        ),
        ("def f(:\n    pass", "program_invalid"),
        ("raise ValueError('no')", "program_raised"),
    ],
)
def test_a_program_that_breaks_a_limit_ends_typed_and_the_run_goes_on(
    code: str, ending: str, open_program_runner: Any, services: ServiceEndpoints
) -> None:
    """The program ends with a typed error the model is shown; the run stays readable and
    goes on (the model answers), and the sandbox serves the next program."""
    with open_program_runner(code, {}) as runner:
        done = runner.start(TASK, principal(task=TASK), run_id="run-limit")
        answer = program_answer(runner, "run-limit")
    assert answer["status"] == "error" and answer["error"]["code"] == ending, answer
    assert done.stop_reason == "not_done"  # the model answered without the refunds
    after = sandbox.start(
        "get_order(order_id='O-1')",
        tools={"get_order"},
        limits=sandbox.SandboxLimits(),
        now=datetime.now(UTC),
        seed="next",
    )
    assert isinstance(after, sandbox.Paused) and after.args == {"order_id": "O-1"}


def run_alone(code: str) -> sandbox.Step:
    return sandbox.start(
        code,
        tools={"get_order"},
        limits=sandbox.SandboxLimits(seconds=1.0),
        now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        seed="seed",
    )


@pytest.mark.parametrize(
    ("code", "refused"),
    [
        ("open('/etc/passwd').read()", "PermissionError"),
        ("open('program.py', 'w').write('x')", "PermissionError"),
        ("import os\nos.environ['HOME']", "RuntimeError: 'os.environ' is not supported"),
        ("import os\nos.getenv('HOME')", "is not supported"),
        ("import socket", "ModuleNotFoundError"),
        ("import subprocess", "ModuleNotFoundError"),
        ("import urllib.request", "ModuleNotFoundError"),
        ("__import__('os')", "NameError"),
        ("submit_refund(order_id='O-42')", "NameError: name 'submit_refund' is not a tool"),
        ("get_order('O-42')", "TypeError: call get_order with keyword arguments only"),
    ],
)
def test_nothing_leaves_the_sandbox_but_the_calls_of_its_tools(code: str, refused: str) -> None:
    indented = code.replace("\n", "\n    ")
    step = run_alone(
        f"try:\n    {indented}\n    seen = 'escaped'\n"
        "except Exception as e:\n    seen = type(e).__name__ + ': ' + str(e)\nseen"
    )
    assert isinstance(step, sandbox.Finished), step
    assert refused in step.value


def test_a_programs_clock_and_random_are_the_runtimes() -> None:
    """The clock reads the instant the runtime passed; random numbers come from its seed: a
    program resumed anywhere makes the calls it made before."""
    code = "import datetime, random, time\n[datetime.datetime.now().isoformat(), time.time(), random.random()]"
    first, again = run_alone(code), run_alone(code)
    assert isinstance(first, sandbox.Finished) and first == again
    assert first.value[0].startswith("2026-01-02T03:04:05")


def test_a_program_paused_by_another_sandbox_version_ends_typed(
    open_program_runner: Any, services: ServiceEndpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run upgraded while its program waited: the snapshot is not loaded into a sandbox that
    did not make it. The program ends `sandbox_changed`, the call it waited on stands as done."""
    with open_program_runner() as runner:
        waiting = runner.start(TASK, principal(task=TASK), run_id="run-upgraded")
        monkeypatch.setattr(sandbox, "sandbox_version", lambda: "monty 9.9.9")
        done = runner.resume("run-upgraded", decide(waiting))
        answer = program_answer(runner, "run-upgraded")
    assert answer["error"]["code"] == "sandbox_changed", answer
    assert "monty 9.9.9" in answer["error"]["detail"]
    assert [(a.args["order_id"], a.status) for a in done.actions] == [("O-42", "SUCCEEDED")]
    assert done.stop_reason == "not_done"


def test_the_timeline_and_the_trace_show_the_program_and_the_call_being_approved(
    open_program_runner: Any, services: ServiceEndpoints, tmp_path: Path
) -> None:
    trace = tmp_path / "traces.jsonl"
    configure_tracing(TraceSettings(file=trace))
    try:
        with open_program_runner() as runner:
            waiting = runner.start(TASK, principal(task=TASK), run_id="run-seen")
            runner.resume("run-seen", decide(waiting))
            shown = io.StringIO()
            render_run(runner, "run-seen", Console(file=shown, width=400, soft_wrap=True))
    finally:
        flush_traces()
        configure_tracing(TraceSettings.from_env())
    lines = shown.getvalue()
    assert "decides run_program(code=# Refund each order in `orders`" in lines
    assert "program call_" in lines and "waits on call 2: submit_refund(order_id=O-42" in lines
    assert "Refund 100.00 USD to order O-42" in lines and ", a call of program call_" in lines
    assert (
        "ended after 4 calls; calls so far: get_order ok, submit_refund ok, get_order ok" in lines
    )
    events = [
        event["attributes"]
        for span in read_spans(trace)
        for event in span.get("events", [])
        if event["name"] == "program"
    ]
    assert [(e["loopwright.program.status"], e["loopwright.program.calls"]) for e in events] == [
        ("running", 1),
        ("running", 2),
        ("running", 3),
        ("running", 4),
        ("ended", 4),
    ]
    # Each time the program moved on (validate writes what changed), one source throughout.
    assert len({e["loopwright.program.source_digest"] for e in events}) == 1


@pytest.mark.parametrize("snapshot", ["not base64 at all!", "aGVsbG8=", None])
def test_a_snapshot_that_does_not_load_ends_the_program_typed(snapshot: str | None) -> None:
    """Bytes that are no paused program of this sandbox (damaged, or another format) end it
    `snapshot_unreadable`, whatever they hold; the sandbox serves the next one."""
    if snapshot is None:  # a real dump, cut short
        paused = run_alone("get_order(order_id='O-1')")
        assert isinstance(paused, sandbox.Paused)
        raw = zlib.decompress(base64.b64decode(paused.snapshot))
        snapshot = base64.b64encode(zlib.compress(raw[: len(raw) // 2])).decode()
    step = sandbox.resume(
        snapshot, sandbox.returns({}), tools={"get_order"}, limits=sandbox.SandboxLimits()
    )
    assert isinstance(step, sandbox.Failed) and step.code == "snapshot_unreadable", step
    assert isinstance(run_alone("get_order(order_id='O-2')"), sandbox.Paused)


def test_a_program_may_name_only_the_agents_tools_and_a_variant_keeps_those_it_has() -> None:
    typo = program_agent.replace(programs=Programs(tools=("get_order", "submit_refnud")))
    with pytest.raises(ToolDefinitionError, match="names submit_refnud, which are not tools"):
        typo.check()
    reads = program_agent.replace(tools=[t for t in program_agent.tools if t.name == "get_order"])
    reads.check()
    assert reads.programs is not None and reads.programs.tools == ("get_order",)
    assert "run_program" in reads.tools.names()
    none_left = program_agent.replace(tools=[])
    assert none_left.programs is None and "run_program" not in none_left.tools.names()
    with pytest.raises(ValueError, match="name the tools a program may call"):
        Programs(tools=())


def test_a_program_is_bounded_in_calls_and_in_what_it_returns(
    open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """`Programs(max_calls=2)`: the third call ends the program `call_limit` (the two before it
    ran, each a call of the run); a result over `max_result_bytes` ends it `result_too_large`."""
    code = "for n in range(3):\n    get_order(order_id='O-42')\n'x' * 20_000"
    for max_calls, ending in ((2, "call_limit"), (3, "result_too_large")):
        bounded = program_agent.replace(
            programs=Programs(tools=("get_order",), max_calls=max_calls),
            model=program_model(code, {}),
        )
        run_id = f"run-bounded-{max_calls}"
        with open_test_runner(agent=bounded) as runner:
            runner.start(TASK, principal(task=TASK), run_id=run_id)
            answer = program_answer(runner, run_id)
            state = runner.state(run_id)
        assert answer["error"]["code"] == ending, answer
        assert state["usage"]["tool_calls"] == max_calls
        assert [c["outcome"] for c in answer["error"]["calls"]] == ["ok"] * max_calls


def test_a_program_whose_agent_offers_programs_no_more_ends_typed_at_its_next_call(
    open_program_runner: Any, open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    """A release without programs resumes a run whose program waits for an approval: the call
    the person approved runs (it passed every check), then the program ends
    `program_withdrawn` and the model is told; the run goes on, it does not spin."""
    with open_program_runner() as runner:
        waiting = runner.start(TASK, principal(task=TASK), run_id="run-withdrawn")
    release = program_agent.replace(programs=None)
    assert "run_program" not in release.tools.names()
    with open_test_runner(agent=release) as runner:
        done = runner.resume("run-withdrawn", decide(waiting))
        answer = program_answer(runner, "run-withdrawn")
    assert answer["error"]["code"] == "program_withdrawn", answer
    assert [(c["tool"], c["outcome"]) for c in answer["error"]["calls"]] == [
        ("get_order", "ok"),
        ("submit_refund", "ok"),
    ]
    assert [(a.args["order_id"], a.status) for a in done.actions] == [("O-42", "SUCCEEDED")]
    assert done.stop_reason == "not_done"  # O-43 was never refunded


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({}, "give either code, or skill and program"),
        ({"code": "1", "skill": "s", "program": "p.py"}, "give either code, or skill and program"),
        ({"skill": "refund-eligible-orders", "program": "x.py"}, "is not loaded in this run"),
        ({"code": "1", "inputs": {"not a name": 1}}, "each input is named as a Python name"),
    ],
)
def test_a_program_call_that_names_no_program_is_refused_in_words(
    args: dict[str, Any], problem: str, open_test_runner: RunnerFactory, services: ServiceEndpoints
) -> None:
    class Once(ProgramPolicy):
        def __call__(self, messages: Any, tools: Any) -> Decision:
            if not any(isinstance(m, ToolMessage) for m in messages):
                return Decision(tool_calls=[("run_program", args)])
            return Decision(content="I could not run it.")

    agent = program_agent.replace(model=lambda: ScriptedChatModel(policy=Once()))
    with open_test_runner(agent=agent) as runner:
        runner.start(TASK, principal(task=TASK), run_id="run-no-program")
        answer = program_answer(runner, "run-no-program")
    assert answer["error"]["code"] == "invalid_program"
    assert problem in answer["error"]["detail"], answer
