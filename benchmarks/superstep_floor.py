"""What a superstep costs in LangGraph itself, before any node's work or any database: the part
of `benchmarks.step_time`'s ratio that only fewer supersteps could take away.

    python -m benchmarks.superstep_floor [--rounds 15]

A chain of no-op nodes over a one-key state runs in this process, without a checkpointer and
with LangGraph's in-memory saver at durability "sync" (as both agents of `benchmarks.step_time`
run, there with a database): the time per superstep, over interleaved rounds. With a
checkpointer a superstep also hands its writes and its checkpoint to LangGraph's thread pool and
waits for the checkpoint, whatever the saver does with them. What those hand-offs cost is timed
too: the chain with a saver that stores nothing, its saves handed to the pool as LangGraph
ships, and run in place on the loop's thread (`saves_in_place`, for this measurement only: the
runtime runs LangGraph as it ships).

`benchmarks.step_time` prints what the supersteps loopwright has more than the bare agent cost
at this rate: the part of its ratio that no work of the runtime's own could take away, short of
fewer supersteps.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.pregel._executor import BackgroundExecutor

from benchmarks.engine_floor import chained
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
    return chained(_Count, _step, nodes).compile(checkpointer=checkpointer)


class StoresNothing(InMemorySaver):
    """A saver whose writes cost nothing: what is left of a checkpointed superstep is
    LangGraph's own work."""

    def put(self, config: RunnableConfig, checkpoint: Any, *_: Any) -> RunnableConfig:
        return {
            **config,
            "configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]},
        }

    def put_writes(self, *_: Any, **__: Any) -> None:
        return None


# What LangGraph hands its thread pool to save a superstep: each task's writes and the
# checkpoint (after the one before it).
SAVES = frozenset({"put_writes", "_checkpointer_put_after_previous"})


@contextmanager
def saves_in_place() -> Iterator[None]:
    """While the block runs, what LangGraph hands its thread pool to save a superstep (its
    writes and its checkpoint) runs on the calling thread instead, a future already done: the
    supersteps without the hand-offs and the wait. Anything else (a task run beside another)
    goes to the pool as LangGraph ships. A measurement, never how the runtime runs LangGraph."""
    handed = BackgroundExecutor.submit

    def in_place(
        executor: BackgroundExecutor, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        if getattr(fn, "__name__", None) not in SAVES:
            return handed(executor, fn, *args, **kwargs)
        for flag in ("__name__", "__cancel_on_exit__", "__reraise_on_exit__", "__next_tick__"):
            kwargs.pop(flag, None)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed over as the pool would
            done.set_exception(exc)
        return done

    BackgroundExecutor.submit = in_place  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        BackgroundExecutor.submit = handed  # type: ignore[method-assign]


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
    """LangGraph's own time per superstep: with no checkpointer, with its in-memory saver, and
    with a saver that stores nothing, its saves handed to the thread pool and run in place."""

    bare_graph_ms: Spread
    checkpointed_ms: Spread
    handed_off_ms: Spread
    in_place_ms: Spread

    @property
    def hand_offs_ms(self) -> float:
        """What handing a superstep's saves to the thread pool and waiting costs, at the least."""
        return self.handed_off_ms.median - self.in_place_ms.median

    def cost_ms(self, supersteps: float) -> float:
        """What LangGraph's own work on this many supersteps costs at the least: a real graph's
        supersteps carry more state and more work than a no-op node's."""
        return supersteps * self.checkpointed_ms.median

    def show(self) -> str:
        return (
            f"LangGraph's own cost a superstep (a chain of {CHAIN_NODES} no-op nodes, in this "
            f"process): {self.checkpointed_ms.show(' ms')} with its in-memory saver and "
            f"durability sync; {self.bare_graph_ms.show(' ms')} with no checkpointer; "
            f"of it, handing a superstep's saves to its thread pool and waiting for them "
            f"{self.hand_offs_ms:.2f} ms (a saver that stores nothing: "
            f"{self.handed_off_ms.show(' ms')} as LangGraph ships, "
            f"{self.in_place_ms.show(' ms')} with its saves run in place)"
        )


def measure_floor(rounds: int = ROUNDS) -> Floor:
    """Every graph, interleaved, after a warm-up run of each."""
    graphs = {
        "bare": chain(None),
        "checkpointed": chain(InMemorySaver()),
        "handed off": chain(StoresNothing()),
        "in place": chain(StoresNothing()),
    }
    times: dict[str, list[float]] = {name: [] for name in graphs}

    def timed(name: str) -> float:
        if name != "in place":
            return superstep_ms(graphs[name])
        with saves_in_place():
            return superstep_ms(graphs[name])

    for name in graphs:
        timed(name)
    for _ in range(rounds):
        for name in graphs:
            times[name].append(timed(name))
    return Floor(*(Spread(tuple(times[name])) for name in graphs))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.superstep_floor", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    print(measure_floor(args.rounds).show())


if __name__ == "__main__":
    main()
