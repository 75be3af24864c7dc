"""What tracing costs per node step: the same refund runs with tracing off and to a JSONL file.

Each run refunds a fresh 20.00 order (below the approval threshold, so nobody is asked) against
the reference services, on a SQLite file: real checkpoints, journal writes and HTTP calls, which
is what a node step costs in practice. Runs alternate between the two modes so that drift on a
busy machine hits both alike; the figure per mode is the median over its runs.

    python -m benchmarks.tracing_overhead --runs 10

It prints the time per node step in each mode and their ratio (JSONL / off), and what the node
wrapper alone costs per call when tracing is off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from langgraph.runtime import Runtime

from loopwright.core.state import Principal, RunState, initial_state
from loopwright.graph.node_spans import Node, traced_node
from loopwright.nodes.context import RunContext
from loopwright.observability.jsonl import read_spans
from loopwright.observability.tracing import TraceSettings, configure_tracing
from loopwright.runner import Runner, open_runner
from loopwright_refunds.agent import agent as refunds
from loopwright_refunds.agent import connect, task_scope
from loopwright_refunds.experiments.progress import Progress
from loopwright_refunds.services.admin import create_order
from loopwright_refunds.services.launcher import start_services

TASK = "Check whether order {order_id} can be refunded and refund it if so."
FIRST_ORDER = 200_000  # clear of the seeded orders


def timed_run(runner: Runner, order_id: str) -> tuple[float, int]:
    """Seconds and node steps of one whole run."""
    steps = 0

    def count(_node: str, _update: object) -> None:
        nonlocal steps
        steps += 1

    task = TASK.format(order_id=order_id)
    started = time.perf_counter()
    outcome = runner.start(task, Principal(user_id="u-1", scope=task_scope(task)), on_step=count)
    elapsed = time.perf_counter() - started
    assert outcome.stop_reason == "completed", outcome
    return elapsed, steps


def disabled_wrapper_cost(calls: int = 200_000) -> float:
    """Microseconds a node wrapper adds per call with tracing off (what a disabled tracer costs)."""
    configure_tracing(TraceSettings(enabled=False))

    def node(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        return {}

    state = initial_state("run-bench", "bench")
    runtime = cast(Runtime[RunContext], None)  # never read: the node ignores it
    nodes: list[Node] = [node, traced_node("bench", node)]
    timings = []
    for fn in nodes:
        started = time.perf_counter()
        for _ in range(calls):
            fn(state, runtime)
        timings.append(time.perf_counter() - started)
    return (timings[1] - timings[0]) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per mode")
    runs = parser.parse_args().runs
    work = Path(tempfile.mkdtemp(prefix="lw-tracing-bench-"))
    trace = work / "traces.jsonl"
    modes = {"off": TraceSettings(enabled=False), "jsonl": TraceSettings(file=trace)}
    per_step: dict[str, list[float]] = {mode: [] for mode in modes}
    with (
        start_services(work / "services") as services,
        connect(services.endpoints) as deps,
        open_runner(
            f"sqlite:///{work / 'bench.sqlite3'}", refunds, deps=deps, model=refunds.chat_model()
        ) as runner,
    ):
        order = FIRST_ORDER
        with Progress("runs", runs * len(modes) + 1) as progress:
            for i in range(runs * len(modes) + 1):
                mode = list(modes)[i % len(modes)]
                configure_tracing(modes[mode])
                order_id = f"O-{order}"
                order += 1
                create_order(services.endpoints, order_id, "u-1", "20.00")
                seconds, steps = timed_run(runner, order_id)
                if i > 0:  # the first run warms caches and connections
                    per_step[mode].append(seconds / steps)
                progress.advance(f"last: {mode}, {1000 * seconds / steps:.1f} ms per step")
    configure_tracing(TraceSettings(enabled=False))  # flushes the JSONL exporter
    spans = sum(1 for _ in read_spans(trace))
    off = statistics.median(per_step["off"]) * 1e3
    jsonl = statistics.median(per_step["jsonl"]) * 1e3
    print(f"tracing overhead over {runs} runs per mode ({spans} spans written to {trace})")
    print(f"  off:   {off:.2f} ms per node step")
    print(f"  jsonl: {jsonl:.2f} ms per node step")
    print(f"  ratio: {jsonl / off:.3f}")
    print(f"  a node wrapper with tracing off adds {disabled_wrapper_cost():.2f} µs per call")


if __name__ == "__main__":
    main()
