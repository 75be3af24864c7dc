"""Traces of runs: OpenTelemetry spans for runs, node steps, model calls and tool calls.

`observability.tracing` configures the tracer from the environment (JSON lines by default, OTLP
when configured) and opens spans; `observability.instrument` puts what a node committed, and every
journal status change, on them; `observability.redaction` keeps sensitive arguments out.
"""
