"""A span exporter that appends one JSON object per line to a file, and its reader.

Every process of a run (the one that started it, the one that approved it, the one that resumed
it after a crash) appends to the same file. Each export is written with one write(2) on a
descriptor opened with O_APPEND, so concurrent writers append whole lines and never interleave
within one; the file is opened per export, so it may be rotated or removed between exports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.types import Attributes


def _time(unix_nano: int | None) -> str | None:
    if unix_nano is None:
        return None
    return datetime.fromtimestamp(unix_nano / 1e9, UTC).isoformat()


def _attributes(attributes: Attributes) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as plain JSON: ids in hex, times in ISO 8601 (UTC) and unix nanoseconds."""
    context = span.get_span_context()
    assert context is not None, "an ended SDK span has a context"
    start, end = span.start_time, span.end_time
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "start": _time(start),
        "end": _time(end),
        "start_unix_nano": start,
        "end_unix_nano": end,
        "duration_ms": (end - start) / 1e6 if start is not None and end is not None else None,
        "status": span.status.status_code.name,
        "attributes": _attributes(span.attributes),
        "events": [
            {"name": e.name, "time": _time(e.timestamp), "attributes": _attributes(e.attributes)}
            for e in span.events
        ],
        "resource": _attributes(span.resource.attributes),
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                data = memoryview(lines.encode())
                while data:  # a regular file takes it whole but for a full disk or a signal
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def read_spans(path: Path) -> Iterator[dict[str, Any]]:
    """The spans in a JSON-lines trace file, in the sequence they were written."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)
