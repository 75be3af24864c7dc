"""The tracer: configured once per process from the environment, and the spans opened with it.

Configuration (read at the first span, or set with `configure_tracing`):

  LOOPWRIGHT_TRACE=off              no tracing at all: every span helper returns at once
  LOOPWRIGHT_TRACE_FILE=PATH        the JSON-lines file (default $LOOPWRIGHT_HOME/traces.jsonl)
  LOOPWRIGHT_TRACE_RAW_ARGS=1       record tool arguments, sensitive fields still redacted
  OTEL_EXPORTER_OTLP_ENDPOINT=URL   also export over OTLP (http/protobuf; the `otlp` extra)

Each span reaches the file as it ends (one append of a line), so a process killed mid-run (kill
-9 included) leaves the spans of every node, model call and tool call it finished; only the spans
still open (its `run` span, the node it was in) die with it. Over OTLP, spans are batched and the
batch is sent as each node or run span ends, from a thread of its own (a slow collector never
holds a node up), and once more, waited for, as a run span ends (`run_span`) and at exit.
The journal and the checkpoints, not the trace, are the record of what happened.

Every span names the process that made it in its resource (what OpenTelemetry backends group
by): `service.instance.id` is `HOST:PID`, as the owner names of the leases it holds begin
(`loopwright.attempt.process_owner`), with `host.name`, `process.pid`, and the name a deployment
gives the process (`LOOPWRIGHT_INSTANCE`, e.g. `aegra-2` under `serve --engine aegra`) as
`loopwright.instance`. `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` override them.

Every root span of a run gets a trace id derived from the run id, so that all processes that
advance one run (start, approve, resume after a crash) add to one trace. The provider is this
module's own, not OpenTelemetry's global one: an application's own tracing is left alone.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from langgraph.errors import GraphBubbleUp
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from loopwright.core.home import loopwright_home
from loopwright.observability.jsonl import JsonLinesExporter

TRACE_ENV = "LOOPWRIGHT_TRACE"
TRACE_FILE_ENV = "LOOPWRIGHT_TRACE_FILE"
RAW_ARGS_ENV = "LOOPWRIGHT_TRACE_RAW_ARGS"
OTLP_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The name a deployment gives one of its processes (`serve --engine aegra`: aegra-1, aegra-2...).
INSTANCE_ENV = "LOOPWRIGHT_INSTANCE"
RUN_SPAN = "run"
NODE_SPAN_PREFIX = "node "
DEFAULT_TRACE_FILE = "traces.jsonl"
_NO = frozenset({"0", "off", "false", "no"})
_YES = frozenset({"1", "on", "true", "yes"})


@dataclass(frozen=True)
class TraceSettings:
    enabled: bool = True
    file: Path | None = None
    otlp: bool = False
    raw_args: bool = False

    @classmethod
    def from_env(cls) -> TraceSettings:
        """The settings the environment names; TraceSettingsError for a switch set to neither
        on nor off (`LOOPWRIGHT_TRACE=of` must not trace, nor `..._RAW_ARGS=ture` hide)."""
        if not _switch(TRACE_ENV, default=True):
            return cls(enabled=False)
        # Named, not made: the exporter makes the file's directory as it first writes, so that
        # checking the settings (`serve` before it starts anything) leaves no folder behind.
        file = os.environ.get(TRACE_FILE_ENV) or loopwright_home(create=False) / DEFAULT_TRACE_FILE
        return cls(
            file=Path(file),
            otlp=any(os.environ.get(name) for name in OTLP_ENDPOINT_ENVS),
            raw_args=_switch(RAW_ARGS_ENV, default=False),
        )


class TraceSettingsError(ValueError):
    """A tracing switch of the environment set to a value that is neither on nor off."""


def _switch(name: str, *, default: bool) -> bool:
    given = os.environ.get(name, "")
    value = given.strip().lower()
    if not value:
        return default
    if value in _YES or value in _NO:
        return value in _YES
    raise TraceSettingsError(f"{name}={given!r}: expected on or off (1 or 0, true or false)")


def run_trace_id(run_id: str) -> int:
    """The trace id of a run: the same in every process, and never the invalid id 0."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:32], 16) or 1


# The run a root span about to start belongs to (set by `span` around its start only).
_ROOT_RUN: ContextVar[str | None] = ContextVar("loopwright_root_run", default=None)


class _RunTraceIds(RandomIdGenerator):
    """Root spans that belong to a run get the run's trace id; others a random one."""

    def generate_trace_id(self) -> int:
        run_id = _ROOT_RUN.get()
        return run_trace_id(run_id) if run_id else super().generate_trace_id()


@dataclass(frozen=True)
class _Tracing:
    settings: TraceSettings
    provider: TracerProvider | None = None
    tracer: Tracer | None = None


def _otlp_exporter() -> SpanExporter | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        sys.stderr.write(
            "loopwright: OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not"
            " installed (pip install 'loopwright[otlp]'); tracing to the JSON-lines file only\n"
        )
        return None
    return OTLPSpanExporter()  # endpoint, headers and timeout from the OTEL_* environment


def process_instance(pid: int | None = None) -> str:
    """`HOST:PID` of process `pid` of this host (this process by default)."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


def instance_name() -> str | None:
    """The name this process's deployment gave it (`LOOPWRIGHT_INSTANCE`), if any."""
    return os.environ.get(INSTANCE_ENV) or None


def process_resource() -> Resource:
    """Who this process is, as every span it exports says (see the module docstring)."""
    attributes: dict[str, AttributeValue] = {
        "service.name": "loopwright",
        "service.instance.id": process_instance(),
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    if name := instance_name():
        attributes["loopwright.instance"] = name
    return Resource.create(attributes).merge(OTELResourceDetector().detect())


class _SentAsNodesEnd(SpanProcessor):
    """Batches spans for an exporter over the network, and has the batch sent each time a node
    or run span ends, by a thread of its own (a node never waits for a collector): what a
    process did reaches the collector node by node, not only as its run span ends."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.batch = BatchSpanProcessor(exporter)
        self._due = threading.Event()
        self._stopping = False
        self._sender = threading.Thread(
            target=self._send_when_due, name="loopwright-trace-sender", daemon=True
        )
        self._sender.start()

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        self.batch.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.batch.on_end(span)
        if span.name == RUN_SPAN or span.name.startswith(NODE_SPAN_PREFIX):
            self._due.set()

    def _send_when_due(self) -> None:
        while True:
            self._due.wait()
            if self._stopping:
                return
            self._due.clear()
            self.batch.force_flush()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.batch.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._stopping = True
        self._due.set()
        self._sender.join()
        self.batch.shutdown()


def _start(settings: TraceSettings) -> _Tracing:
    if not settings.enabled:
        return _Tracing(settings)
    provider = TracerProvider(resource=process_resource(), id_generator=_RunTraceIds())
    # Each span appended as it ends: a line costs one write(2), far less than the commit that
    # ends every node.
    file = JsonLinesExporter(settings.file or loopwright_home() / DEFAULT_TRACE_FILE)
    provider.add_span_processor(SimpleSpanProcessor(file))
    if settings.otlp and (otlp := _otlp_exporter()) is not None:
        provider.add_span_processor(_SentAsNodesEnd(otlp))
    return _Tracing(settings, provider, provider.get_tracer("loopwright"))


_current: _Tracing | None = None
_lock = threading.Lock()


def _tracing() -> _Tracing:
    current = _current
    if current is not None:
        return current
    with _lock:
        if _current is None:
            configure_tracing(TraceSettings.from_env())
        assert _current is not None
        return _current


def configure_tracing(settings: TraceSettings) -> None:
    """Trace with `settings` from now on; the spans of the previous setup are flushed first."""
    global _current
    previous, _current = _current, _start(settings)
    if previous is not None and previous.provider is not None:
        previous.provider.shutdown()


def active_tracer() -> Tracer | None:
    """The tracer, or None when tracing is off (callers then skip all work for spans)."""
    return _tracing().tracer


def capture_raw_args() -> bool:
    return _tracing().settings.raw_args


def flush_traces() -> None:
    provider = _tracing().provider
    if provider is not None:
        provider.force_flush()


@contextmanager
def span(
    name: str,
    *,
    run_id: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A span, current while the block runs; a non-recording one when tracing is off.

    An exception marks it as an error with its class in `error.type` (no message or stack:
    they may carry arguments); LangGraph's control flow (an interrupt) is not an error.
    """
    tracer = active_tracer()
    if tracer is None:
        yield INVALID_SPAN
        return
    token = _ROOT_RUN.set(run_id)
    try:
        opened = tracer.start_span(name, kind=kind, attributes=attributes)
    finally:
        _ROOT_RUN.reset(token)
    if run_id is not None:
        opened.set_attribute("loopwright.run_id", run_id)
    with trace.use_span(
        opened, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield opened
        except GraphBubbleUp:
            raise
        except BaseException as exc:
            record_error(exc)
            opened.set_status(Status(StatusCode.ERROR))
            raise


@contextmanager
def run_span(run_id: str, attributes: Mapping[str, AttributeValue]) -> Iterator[Span]:
    """The span of one process advancing a run; its spans are flushed when it ends."""
    try:
        with span(RUN_SPAN, run_id=run_id, attributes=attributes) as opened:
            yield opened
    finally:
        flush_traces()


def record_error(exc: BaseException) -> None:
    """Note an error's class (and a tool fault's code) on the current span, if it records."""
    current = trace.get_current_span()
    current.set_attribute("error.type", type(exc).__name__)
    if isinstance(code := getattr(exc, "code", None), str):
        current.set_attribute("loopwright.error.code", code)
