"""The smallest graphs Aegra can serve: a chain of nodes that do nothing, no auth.

`benchmarks.served_cost` serves them on a plain Aegra instance to measure what the engine itself
spends on a run (its API, queue, worker lease, stream events, run records and a checkpoint a
superstep) whatever the graph: the floor under loopwright's served cost. `graph` is one node;
`chain` has `LOOPWRIGHT_FLOOR_NODES` of them (the instance's environment), as many supersteps
as the loopwright run it stands beside."""

from __future__ import annotations

import itertools
import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

NODES_ENV = "LOOPWRIGHT_FLOOR_NODES"


class Floor(TypedDict, total=False):
    task: str
    done: bool


def step(state: Floor) -> Floor:
    return {"done": True}


def chained(state: type[Any], node: Any, nodes: int) -> StateGraph[Any]:
    """`nodes` nodes running `node` over `state`, one after the other: a superstep each,
    `__start__`'s besides (uncompiled: `benchmarks.superstep_floor` compiles its chains with a
    saver)."""
    builder = StateGraph(state)
    names = [f"node_{i}" for i in range(max(1, nodes))]
    for name in names:
        builder.add_node(name, node)
    builder.add_edge(START, names[0])
    for before, after in itertools.pairwise(names):
        builder.add_edge(before, after)
    builder.add_edge(names[-1], END)
    return builder


def chain_of(nodes: int) -> CompiledStateGraph[Floor, None, Floor, Floor]:
    """`nodes` no-op nodes, one after the other."""
    return chained(Floor, step, nodes).compile()


graph = chain_of(1)
chain = chain_of(int(os.environ.get(NODES_ENV, "1")))
