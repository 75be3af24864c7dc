"""What every layer above counts and traces with: loopwright's Prometheus metrics (`metrics`),
spans and their export (`tracing`, `jsonl`: a JSON-lines file by default, OTLP when configured),
and what spans may say of a call's arguments (`redaction`, `attributes`).

What each span records is the business of the layer it traces, above this one: a node step's
(`graph.node_spans`), a model call's (`nodes.model_spans`), a tool call's (`tools.tool_spans`),
a run's and its journal's (`loopwright.run_spans`); the gauges of stored state are read at each
scrape by `loopwright.stored_state`.
"""
