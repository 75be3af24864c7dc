"""Traces that reconstruct a run, and the run's timeline read back from the database.

Every process of a run appends its spans to one JSON-lines file; a script rebuilds from them
what was decided, what was sent, what the business system did, and how the run ended.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from loopwright.checkpoints.writers import Writer
from loopwright.cli import ending
from loopwright.core.crashpoints import ENV_VAR as CRASH_ENV
from loopwright.observability.jsonl import JsonLinesExporter, read_spans
from loopwright.observability.redaction import REDACTED, redacted_digest
from loopwright.observability.tracing import (
    TraceSettings,
    configure_tracing,
    flush_traces,
    run_trace_id,
    span,
)
from loopwright.outcome import RunOutcome
from loopwright.reports import EXIT_CODES
from loopwright.run_spans import TracedJournal
from loopwright.runner import Runner, Step
from loopwright.timeline import Handover, TimelinePrinter, handover, render_run, writer_line
from loopwright_refunds.services.admin import list_refunds, set_fault
from loopwright_refunds.services.endpoints import ServiceEndpoints
from tests.card_payments import CARD, LOST_PAYMENT, PAY_WITH_CARD, TASK, card_runner
from tests.openai_server import MODEL, ModelFactory, OpenAIStub
from tests.runtime_fixtures import (
    DEMO_TASK,
    PATIENCE_S,
    RunnerFactory,
    approve,
    cli,
    principal,
    release_crashed,
    wait_for,
)

RUN_ID = "run-traced"
HOST = socket.gethostname()
WRITER_MARK = "── "


@pytest.fixture
def trace_to(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Trace this process into a file of the test's own, then back to the environment's."""

    def configure(**settings: Any) -> Path:
        path = tmp_path / "traces.jsonl"
        configure_tracing(TraceSettings(file=path, **settings))
        return path

    yield configure
    configure_tracing(TraceSettings.from_env())


def timeline(runner: Runner, run_id: str) -> str:
    output = io.StringIO()
    render_run(runner, run_id, Console(file=output, width=200, soft_wrap=True))
    return output.getvalue()


def action_histories(shown: str) -> dict[str, list[str]]:
    """The actions section of a timeline: each action id, and its status history lines."""
    section = shown.split("\nactions\n", 1)[1].split("\nwhere it stands\n", 1)[0]
    histories: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("act_"):
            histories[line.split()[0]] = []
        elif "fence" in line:
            histories[list(histories)[-1]].append(line.split(maxsplit=1)[1])
    return histories


def story(spans: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """What a script makes of a run's spans: its business steps in time order, each with the
    action id, intent key and process it came from."""
    steps = []
    for item in spans:
        if item["trace_id"] != f"{run_trace_id(run_id):032x}":
            continue
        pid = item["resource"]["process.pid"]
        for event in item["events"]:
            attributes = event["attributes"]
            step = {"at": event["time"], "pid": pid, "span": item["name"]}
            if event["name"] == "decision":
                step |= {"what": "decision", "tool": attributes["gen_ai.tool.name"]}
                step |= {"call_id": attributes["gen_ai.tool.call.id"]}
            elif event["name"].startswith("journal."):
                step |= {
                    "what": attributes["loopwright.to"],
                    "action_id": attributes["loopwright.action_id"],
                    "intent_key": attributes["loopwright.intent_key"],
                    "call_id": attributes["gen_ai.tool.call.id"],
                }
            else:
                continue
            steps.append(step)
        if item["name"] == "node verify" and item["attributes"].get("loopwright.verified"):
            verified = item["attributes"]["loopwright.verified_action_ids"]
            steps.append({"at": item["end"], "pid": pid, "what": "verified", "actions": verified})
    return sorted(steps, key=lambda step: step["at"])


def attempts_of(
    spans: list[dict[str, Any]], run_id: str, *, died: set[int] | frozenset[int] = frozenset()
) -> dict[int, list[dict[str, Any]]]:
    """The `run` spans of a run's trace by the process that made them, after checking the
    trace's shape: every span names its process (`service.instance.id` HOST:PID); every run
    span is a root naming its owner; every other span is under a run span of its own process,
    but for the processes in `died`, whose run span died with them: their spans' chain ends at
    a node span whose parent never reached the file, and each left some."""
    trace_id = f"{run_trace_id(run_id):032x}"
    mine = [s for s in spans if s["trace_id"] == trace_id]
    by_id = {s["span_id"]: s for s in mine}
    runs: dict[int, list[dict[str, Any]]] = {}
    left_by_the_dead: set[int] = set()
    for item in mine:
        pid = item["resource"]["process.pid"]
        assert item["resource"]["service.instance.id"] == f"{HOST}:{pid}", item
        top = item
        while top["parent_span_id"] in by_id:
            top = by_id[top["parent_span_id"]]
            assert top["resource"]["process.pid"] == pid, (item, top)
        if pid in died:
            assert top["name"].startswith("node ") and top["parent_span_id"], top
            left_by_the_dead.add(pid)
        else:
            assert top["name"] == "run" and top["parent_span_id"] is None, top
            assert top["attributes"]["loopwright.owner"].startswith(f"{HOST}:{pid}:"), top
        if item["name"] == "run":
            runs.setdefault(pid, []).append(item)
    assert left_by_the_dead == set(died), "a killed process left no span of what it did"
    return {pid: sorted(found, key=lambda s: s["start"]) for pid, found in runs.items()}


def owner_of(spans: list[dict[str, Any]], pid: int) -> str:
    """The lease owner process `pid`'s attempts named (a runner's is one per process)."""
    [owner] = {
        s["attributes"]["loopwright.owner"]
        for s in spans
        if s["name"] == "run" and s["resource"]["process.pid"] == pid
    }
    return str(owner)


def writers(shown: str, *expected: str) -> list[str]:
    """The lines of a timeline that head each writer's steps, each checked against its
    pattern in `expected` (fnmatch: `*` for what a test cannot know, a dead process's nonce)."""
    heads = [
        line.removeprefix(WRITER_MARK)
        for line in shown.splitlines()
        if line.startswith(WRITER_MARK)
    ]
    assert len(heads) == len(expected) and all(
        fnmatch.fnmatchcase(head, pattern) for head, pattern in zip(heads, expected, strict=True)
    ), heads
    return heads


def test_crashed_then_resumed_run_is_one_trace_and_shows_one_action_with_its_history(
    database_url: str,
    services: ServiceEndpoints,
    tmp_path: Path,
    open_test_runner: RunnerFactory,
) -> None:
    trace = tmp_path / "traces.jsonl"
    env = {
        **services.to_env(),
        "LOOPWRIGHT_HOME": str(tmp_path / "home"),
        "LOOPWRIGHT_TRACE_FILE": str(trace),
    }
    db = ["--db", database_url]
    # 1: the model decides; the refund waits for approval; the process exits normally.
    cli(
        "run",
        DEMO_TASK,
        "--user",
        "u-1",
        "--run-id",
        RUN_ID,
        *db,
        env=env,
        expect=EXIT_CODES["waiting"],
    )
    with open_test_runner() as runner:
        approval_id = runner.outcome(RUN_ID).waiting_for_approval[0]["approval_id"]
    # 2: approved, then killed as execute starts: its unflushed spans die with it.
    crashed = cli(
        "approvals", "approve", approval_id, "--as", "a-1", *db,
        env={**env, CRASH_ENV: "node:execute:start"},
    )  # fmt: skip
    release_crashed(crashed, database_url, RUN_ID)
    with open_test_runner() as runner:
        interrupted = timeline(runner, RUN_ID)
    assert "WAITING_TOOLS: not finished" in interrupted
    [history] = action_histories(interrupted).values()
    assert history[-1].startswith("NEEDS_APPROVAL -> APPROVED")
    # 3: resumed while payments applies the refund and answers too late: UNKNOWN, reconciled.
    set_fault(services, "accept_then_timeout", delay_s=6)
    resumed = cli("resume", RUN_ID, *db, env=env, expect=0)
    assert "COMPLETED" in resumed.stdout, resumed.stdout

    spans = list(read_spans(trace))
    steps = story(spans, RUN_ID)
    [decision] = [s for s in steps if s.get("tool") == "submit_refund"]
    planned = next(s for s in steps if s.get("call_id") == decision["call_id"] and "action_id" in s)
    action_id, intent_key = planned["action_id"], planned["intent_key"]
    business = [s["what"] for s in steps if s.get("action_id") == action_id or "actions" in s]
    # The approval made in the killed process is in the trace too: its node's spans reached
    # the file as the node ended, before the process died.
    assert business == [
        "NEEDS_APPROVAL",
        "APPROVED",
        "DISPATCHED",
        "UNKNOWN",
        "RECONCILING",
        "SUCCEEDED",
        "verified",
    ]
    by_what = {s["what"]: s for s in steps if s.get("action_id") == action_id}
    assert {s["intent_key"] for s in by_what.values()} == {intent_key}
    assert by_what["APPROVED"]["span"] == "node validate"  # validated again after approval
    assert by_what["DISPATCHED"]["span"] == "execute_tool submit_refund"
    assert by_what["SUCCEEDED"]["span"] == "node reconcile"
    assert steps[-1]["actions"] == [action_id]
    # Decided in one process, approved in a second (killed), sent and reconciled in a third:
    # one trace, one action, each process's spans under its own attempt's run span.
    started, approved, resumed = (
        decision["pid"],
        by_what["APPROVED"]["pid"],
        by_what["DISPATCHED"]["pid"],
    )
    assert planned["pid"] == started and len({started, approved, resumed}) == 3
    assert steps.index(decision) < steps.index(by_what["DISPATCHED"])
    attempts = attempts_of(spans, RUN_ID, died={approved})
    assert sorted(attempts) == sorted([started, resumed])
    assert [a["attributes"]["loopwright.advance"] for a in attempts[started]] == ["start"]
    assert [a["attributes"]["loopwright.advance"] for a in attempts[resumed]] == ["resume"]
    [refund] = list_refunds(services, "O-42")
    assert refund["idempotency_key"] == intent_key

    shown = cli("show", RUN_ID, *db, env=env, expect=0).stdout
    histories = action_histories(shown)
    assert list(histories) == [action_id]
    moves = [line.split("  fence")[0].strip() for line in histories[action_id]]
    assert moves == [
        "new -> NEEDS_APPROVAL",
        "NEEDS_APPROVAL -> APPROVED",
        "APPROVED -> DISPATCHED",
        "DISPATCHED -> UNKNOWN",
        "UNKNOWN -> RECONCILING",
        "RECONCILING -> SUCCEEDED",
    ]
    fences = [int(line.split("fence ")[1].split()[0]) for line in histories[action_id]]
    assert fences[1] < fences[2]  # approved by the killed process, sent by the resuming one
    assert "approved by a-1" in shown and "COMPLETED: completed" in shown
    # Each step names the process that wrote it; the resuming process took the run over.
    owners = {pid: owner_of(spans, pid) for pid in (started, resumed)}
    assert owners[started].startswith(f"{HOST}:{started}:")
    writers(
        shown,
        f"by {owners[started]} (fence 1)",
        f"by {HOST}:{approved}:* (fence 2), with the answer the run waited for",
        f"taken over by {owners[resumed]} (fence 3), from {HOST}:{approved}:* (fence 2)",
    )


@pytest.mark.parametrize("raw", [False, True], ids=["digest-only", "raw-capture"])
def test_a_card_number_never_reaches_the_trace_or_the_timeline(
    raw: bool, database_url: str, trace_to: Callable[..., Path]
) -> None:
    trace = trace_to(raw_args=raw)
    live = io.StringIO()
    with card_runner(database_url, PAY_WITH_CARD) as runner:
        printer = TimelinePrinter(Console(file=live, soft_wrap=True), runner.tools)
        outcome = runner.start(TASK, principal(task=TASK), on_step=printer)
        shown = timeline(runner, outcome.run_id)
    flush_traces()
    [action] = outcome.actions
    assert outcome.stop_reason == "completed"
    assert action.args["card_number"] == CARD  # the journal keeps what was sent

    for text in (trace.read_text(), live.getvalue(), shown):
        assert CARD not in text
    assert f"card_number={REDACTED}" in shown
    assert f"task: Pay 10.00 for order O-42 with card {REDACTED}." in shown
    assert f"answers: Charged card {REDACTED} for order O-42." in live.getvalue()
    [tool] = [s for s in read_spans(trace) if s["name"] == "execute_tool pay_with_card"]
    attributes = tool["attributes"]
    # The digest in the trace is taken over the redacted arguments: it cannot be reversed.
    traced_digest = attributes["loopwright.tool.args_digest"]
    assert traced_digest == redacted_digest(action.args, {"card_number"}) != action.args_digest
    if raw:
        recorded = json.loads(attributes["loopwright.tool.args"])
        assert recorded == {**action.args, "card_number": REDACTED}
    else:
        assert '"loopwright.tool.args":' not in trace.read_text()


def test_the_report_of_an_escalated_run_redacts_the_unconfirmed_write(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-of-run report lists writes nobody confirmed: with the card number blanked."""
    printed = io.StringIO()
    monkeypatch.setattr(ending, "console", Console(file=printed, soft_wrap=True))
    with card_runner(database_url, LOST_PAYMENT) as runner:
        printer = TimelinePrinter(ending.console, runner.tools)
        outcome = runner.start(TASK, principal(task=TASK), on_step=printer)
    ending.report(outcome, printer.redactor)

    assert outcome.stop_reason == "needs_human"
    [action] = outcome.actions
    assert action.args["card_number"] == CARD  # the journal keeps what was sent
    report = printed.getvalue().split("needs_human", 1)[1]
    assert f"unconfirmed write {action.action_id} pay_with_card(" in report
    assert f"card_number={REDACTED}" in report
    assert CARD not in printed.getvalue()


def test_a_disabled_tracer_writes_nothing_and_leaves_the_journal_alone(
    database_url: str, trace_to: Callable[..., Path]
) -> None:
    trace = trace_to(enabled=False)
    with card_runner(database_url, PAY_WITH_CARD) as runner:
        outcome = runner.start(TASK, principal(task=TASK))
        assert not isinstance(runner.context(outcome.run_id, 0).journal, TracedJournal)
    flush_traces()
    assert outcome.stop_reason == "completed"
    assert not trace.exists()


def test_concurrent_exports_append_whole_lines(tmp_path: Path) -> None:
    """Writers with their own descriptors, as separate processes have, never split a line."""
    captured = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    for i in range(20):  # lines far longer than a pipe's atomic write
        provider.get_tracer("test").start_span(f"s{i}", attributes={"pad": "x" * 20_000}).end()
    batch = captured.get_finished_spans()
    path = tmp_path / "traces.jsonl"
    writers, rounds = 8, 10

    def write() -> None:
        exporter = JsonLinesExporter(path)
        for _ in range(rounds):
            exporter.export(batch)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spans = list(read_spans(path))  # every line parses
    assert len(spans) == writers * rounds * len(batch)
    assert all(s["attributes"]["pad"] == "x" * 20_000 for s in spans)


class Collector:
    """An OTLP/HTTP collector on loopback: what it was sent, request by request."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path == "/v1/traces":
                    received.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def spans(self) -> list[Any]:
        return [
            exported
            for body in list(self.received)
            for r in ExportTraceServiceRequest.FromString(body).resource_spans
            for scope in r.scope_spans
            for exported in scope.spans
        ]

    def names(self) -> set[str]:
        return {exported.name for exported in self.spans()}


@pytest.fixture
def otlp_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    """This process tracing to a collector of the test's own (and a file), as an operator
    configures it: through the environment; back to the environment's tracing afterwards."""
    collector = Collector()
    threading.Thread(target=collector.server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("LOOPWRIGHT_TRACE_FILE", str(tmp_path / "traces.jsonl"))
    configure_tracing(TraceSettings.from_env())
    try:
        yield collector
    finally:
        monkeypatch.undo()
        configure_tracing(TraceSettings.from_env())
        collector.server.shutdown()


def test_otlp_export_when_an_endpoint_is_configured(otlp_to: Collector, tmp_path: Path) -> None:
    with span("run", run_id="run-otlp"):
        pass
    flush_traces()
    [exported] = otlp_to.spans()
    assert exported.name == "run"
    assert exported.trace_id == run_trace_id("run-otlp").to_bytes(16, "big")
    assert [s["name"] for s in read_spans(tmp_path / "traces.jsonl")] == ["run"]


def test_otlp_spans_are_sent_as_each_node_ends(
    otlp_to: Collector, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run held in its write's send: the collector already has every node before it (a
    process dying now would have sent what it did), and not the send, its node or the run.
    The batch's own schedule is put off for the test: nothing is sent but at a node's end."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", str(3_600_000))
    configure_tracing(TraceSettings.from_env())
    release = threading.Event()

    def charge_when_released(ctx: Any, args: Any, key: str | None) -> Any:
        release.wait(PATIENCE_S)
        return PAY_WITH_CARD.run(ctx, args, key)

    held = dataclasses.replace(PAY_WITH_CARD, run=charge_when_released)
    with card_runner(sqlite_url, held) as runner:
        outcomes: list[RunOutcome] = []
        running = threading.Thread(
            target=lambda: outcomes.append(runner.start(TASK, principal(task=TASK)))
        )
        running.start()
        try:
            wait_for(lambda: "node validate" in otlp_to.names())
            sent = otlp_to.names()
            assert {
                "node compile_context",
                "node model_step",
                "chat scripted",
                "node validate",
            } <= sent
            assert not sent & {"execute_tool pay_with_card", "node execute", "run"}
        finally:
            release.set()
            running.join()
    [outcome] = outcomes
    assert outcome.stop_reason == "completed"
    flush_traces()
    assert {"execute_tool pay_with_card", "node execute", "node verify", "run"} <= otlp_to.names()
    assert not any(CARD.encode() in body for body in otlp_to.received)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_model_spans_carry_the_genai_attributes_trace_viewers_read(
    api: str,
    openai_stub: OpenAIStub,
    openai_model: ModelFactory,
    open_test_runner: RunnerFactory,
    trace_to: Callable[..., Path],
) -> None:
    """Each model request is a CLIENT span named and attributed as OpenTelemetry's GenAI
    conventions say (operation, provider, requested and answering model, token usage as the
    endpoint counted it), under its node; no message content is in the trace."""
    trace = trace_to()
    with open_test_runner(model=openai_model(api)) as runner:
        outcome = approve(runner, runner.start(DEMO_TASK, principal()))
    assert outcome.stop_reason == "completed", outcome.stop_detail
    flush_traces()
    spans = [
        s for s in read_spans(trace) if s["trace_id"] == f"{run_trace_id(outcome.run_id):032x}"
    ]
    by_id = {s["span_id"]: s for s in spans}
    chats = sorted((s for s in spans if s["name"].startswith("chat ")), key=lambda s: s["start"])
    assert [
        (
            s["attributes"]["gen_ai.usage.input_tokens"],
            s["attributes"]["gen_ai.usage.output_tokens"],
        )
        for s in chats
    ] == openai_stub.usages
    for chat in chats:
        attributes = chat["attributes"]
        assert chat["name"] == f"chat {MODEL}" and chat["kind"] == "CLIENT"
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
        assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == MODEL
        assert attributes["gen_ai.response.id"]
        assert by_id[chat["parent_span_id"]]["name"] == "node model_step"
    if api == "chat":
        finish = [c["attributes"]["gen_ai.response.finish_reasons"] for c in chats]
        assert finish == [["tool_calls"]] * (len(chats) - 1) + [["stop"]]
    text = trace.read_text()
    assert DEMO_TASK not in text and '"gen_ai.input.messages"' not in text


def test_show_heads_each_writer_s_steps_by_how_it_took_the_run() -> None:
    """The four ways a step's writer can follow the one before: none before it; after the
    answer a node waited for; mid-way, another owner; mid-way, the same owner claiming the run
    again (a worker retrying its own failed attempt); and no line within a writer's steps."""
    first = Writer("h:1:a", 1, "start", "aegra-1")
    other = Writer("h:2:b", 2, "resume")
    again = Writer("h:2:b", 3, "resume")
    cases = [
        (None, Step("validate", {}, first), Handover.FIRST, "── by aegra-1 (h:1:a, fence 1)"),
        (first, Step("validate", {}, first), None, None),
        (first, Step("approval", {}, other, answered=True), Handover.ANSWERED, None),
        (first, Step("validate", {}, other), Handover.TAKEN_OVER, None),
        (other, Step("guard", {}, again), Handover.AGAIN, None),
        (first, Step("guard", {}, None), None, None),  # written before writers were named
    ]
    for before, step, how, line in cases:
        assert handover(before, step.writer, answered=step.answered) is how
        said = writer_line(before, step.writer, answered=step.answered)
        assert (said is None) == (how is None)
        if line is not None:
            assert said is not None and Console().render_str(said).plain == line
    taken = writer_line(first, other, answered=False)
    assert taken is not None
    assert Console().render_str(taken).plain == (
        "── taken over by h:2:b (fence 2), from aegra-1 (h:1:a, fence 1)"
    )
    assert Writer.of(first.metadata()) == first and Writer.of({"step": 3}) is None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_scripted_model_s_spans_name_it_as_their_provider(
    open_test_runner: RunnerFactory, trace_to: Callable[..., Path]
) -> None:
    """A trace of a scripted run says its model is the scripted one, by a provider name people
    read ("scripted"), not one LangChain makes of the class's name."""
    trace = trace_to()
    with open_test_runner() as runner:
        outcome = approve(runner, runner.start(DEMO_TASK, principal()))
    flush_traces()
    chats = [
        s
        for s in read_spans(trace)
        if s["trace_id"] == f"{run_trace_id(outcome.run_id):032x}"
        and s["name"].startswith("chat scripted")
    ]
    assert {s["attributes"]["gen_ai.provider.name"] for s in chats} == {"scripted"}
