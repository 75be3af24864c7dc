"""The smallest graph Aegra can serve: one node that does nothing, no auth.

`benchmarks.served_cost` serves it on a plain Aegra instance to measure what the engine itself
spends on a run (its API, queue, worker lease, stream events and run records) whatever the
graph: the floor under loopwright's served cost."""

from __future__ import annotations

from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class Floor(TypedDict, total=False):
    task: str
    done: bool


def step(state: Floor) -> Floor:
    return {"done": True}


_builder = StateGraph(Floor)
_builder.add_node("step", step)
_builder.add_edge(START, "step")
_builder.add_edge("step", END)
graph = _builder.compile()
