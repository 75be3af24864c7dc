"""What a superstep costs in LangGraph itself, before any node's work or any database: the part
of `benchmarks.step_time`'s ratio that only fewer supersteps could take away.

    python -m benchmarks.superstep_floor [--rounds 15]

A chain of no-op nodes over a one-key state runs in this process, without a checkpointer and
with LangGraph's in-memory saver at durability "sync" (as both agents of `benchmarks.step_time`
run, there with a database): the time per superstep, over interleaved rounds. With a
checkpointer a superstep also hands its writes and its checkpoint to LangGraph's thread pool and waits for the
checkpoint, whatever the saver does with them.

`benchmarks.step_time` prints what the supersteps loopwright has more than the bare agent cost
at this rate: the part of its ratio that no work of the runtime's own could take away, short of
fewer supersteps.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from benchmarks.spread import Spread

CHAIN_NODES = 40
ROUNDS = 15


class _Count(TypedDict):
    n: int


Chain = CompiledStateGraph[_Count, None, _Count, _Count]


def _step(state: _Count) -> _Count:
    return {"n": state["n"] + 1}


def chain(checkpointer: BaseCheckpointSaver[Any] | None, nodes: int = CHAIN_NODES) -> Chain:
    """A graph of `nodes` no-op nodes, one after the other: a superstep each."""
    builder = StateGraph(_Count)
    names = [f"node_{i}" for i in range(nodes)]
    for name in names:
        builder.add_node(name, _step)
    builder.add_edge(START, names[0])
    for before, after in itertools.pairwise(names):
        builder.add_edge(before, after)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=checkpointer)


def superstep_ms(graph: Chain) -> float:
    """One run of `graph` (a fresh thread), in ms per superstep: one a node, `__start__`'s
    included, the run's setup shared out among them."""
    config: RunnableConfig = {"configurable": {"thread_id": f"floor-{time.time_ns()}"}}
    # LangGraph warns that durability means nothing without a checkpointer: ask only with one.
    durability: dict[str, Any] = {"durability": "sync"} if graph.checkpointer else {}
    started = time.perf_counter()
    graph.invoke({"n": 0}, config, **durability)
    return 1000 * (time.perf_counter() - started) / len(graph.nodes)


@dataclass(frozen=True)
class Floor:
    """LangGraph's own time per superstep: with no checkpointer, and with its in-memory saver."""

    bare_graph_ms: Spread
    checkpointed_ms: Spread

    def cost_ms(self, supersteps: float) -> float:
        """What LangGraph's own work on this many supersteps costs at the least: a real graph's
        supersteps carry more state and more work than a no-op node's."""
        return supersteps * self.checkpointed_ms.median

    def show(self) -> str:
        return (
            f"LangGraph's own cost a superstep (a chain of {CHAIN_NODES} no-op nodes, in this "
            f"process): {self.checkpointed_ms.show(' ms')} with its in-memory saver and "
            f"durability sync; {self.bare_graph_ms.show(' ms')} with no checkpointer"
        )


def measure_floor(rounds: int = ROUNDS) -> Floor:
    """Both graphs, interleaved, after a warm-up run of each."""
    graphs = {"bare": chain(None), "checkpointed": chain(InMemorySaver())}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for graph in graphs.values():
        superstep_ms(graph)
    for _ in range(rounds):
        for name, graph in graphs.items():
            times[name].append(superstep_ms(graph))
    return Floor(Spread(tuple(times["bare"])), Spread(tuple(times["checkpointed"])))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.superstep_floor", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    print(measure_floor(args.rounds).show())


if __name__ == "__main__":
    main()
