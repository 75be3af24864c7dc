"""The loop as a LangGraph graph: topology and routing.

```
START -> compile_context -+-> model_step -+- tool calls -> validate -+-> approval -> validate
              ^           |               |                          +-> execute -+-> reconcile -> compile_context
              |           +-> reconcile   |                          |            +-> compile_context
              |           +-> END         |                          +-> compile_context (all answered)
              |                           +- final answer -> verify -+-> END (completed, verified)
              |                                                      +-> compile_context (not verified)
guard (next in checkpoints of earlier releases) -> compile_context, reconcile or END
```

One node per superstep and `durability="sync"` (see `RUN_DURABILITY`): each node's update is
committed before the next node starts. guard's gate (`nodes.guard.gate`: stop, reconcile first,
or go on, with its book-keeping, the run's first step included) is the first thing
compile_context does, so it costs no superstep of its own: a tool step is four (compile_context,
model_step, validate, execute), and a run begins with compile_context. compile_context routes as
the gate decides (`after_compile_context`). The guard node, the gate alone, is kept for the
checkpoints of earlier releases whose next node is guard, and is the node a run's end is written
as when its attempts keep failing (`attempt.give_up`). Every INCOMPLETE end passes through the
gate; the only COMPLETED end is verify's.

Each node runs inside a span of its own (`graph.node_spans.traced_node`); with tracing
off the wrapper only calls the node. A node's writes that would change nothing (a count still
0, no new journal entries) are left out of its update (`loop_node`): each would cost a row in
the node's commit. A node that branches returns its route with its update
(`routed`: a `Command` whose goto is the `after_*` function applied to the state the update
leaves), rather than through a conditional edge, for which LangGraph copies every channel of the
state to read it fresh after each node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command

from loopwright.core.crashpoints import NODE_NAMES
from loopwright.core.state import CallVerdict, Phase, RunState, StopReason, changes
from loopwright.core.views import pending_of
from loopwright.graph.node_spans import Node, traced_node
from loopwright.nodes.agents import handoff_target
from loopwright.nodes.approval import approval
from loopwright.nodes.compile_context import compile_context
from loopwright.nodes.context import RunContext
from loopwright.nodes.execute import execute
from loopwright.nodes.guard import guard
from loopwright.nodes.handoff import handoff
from loopwright.nodes.model_step import model_step
from loopwright.nodes.reconcile import reconcile
from loopwright.nodes.validate import validate
from loopwright.nodes.verify import verify

RUN_DURABILITY: Literal["sync"] = "sync"
# The nodes whose commit the run need not wait on the disk for (`FencedSaver.fenced`): run again
# from the commit before, each makes it again and repeats nothing outside the run. compile_context
# derives the context from the state; validate's journal entries and execute's (a write's plan,
# its dispatch before it is sent, its outcome) are flushed commits of their own, and a re-run
# finds them there; what is read again is only read. A later flushed commit (the model's
# decision, an interrupt, a journal entry, the run's end) puts them on disk with it, so a crash
# of the machine takes back at most these, as a crash before them would have. The model's
# decision is never among them: a run must not ask the model again for an answer it had.
REDERIVABLE_NODES = frozenset({"compile_context", "validate", "execute"})
NODES = NODE_NAMES  # the loop's nodes
# With handoff configured, ownership passes through these to a specialist running the same loop.
SPECIALIST_NODE = "specialist"  # the subgraph node that runs the specialist's loop
HANDOFF_NODES = ("handoff", SPECIALIST_NODE)


def program_running(state: RunState) -> bool:
    """Whether a program action of the run waits on one of its calls (`nodes.program`)."""
    return any(c.verdict is CallVerdict.RUNNING for c in pending_of(state))


def after_guard(state: RunState) -> Literal["compile_context", "reconcile", "__end__"]:
    if state.get("stop_reason"):
        return "__end__"
    if state.get("phase") == Phase.RECONCILING:
        return "reconcile"
    return "compile_context"


def after_compile_context(
    state: RunState,
) -> Literal["model_step", "validate", "reconcile", "__end__"]:
    """guard's routes, once the gate inside compile_context has decided. A running program
    goes on (validate) rather than the model being asked while its program waits."""
    route = after_guard(state)
    if route == "compile_context":
        return "validate" if program_running(state) else "model_step"
    return route


def after_model_step(state: RunState) -> Literal["validate", "verify", "compile_context"]:
    if state.get("stop_reason"):
        return "compile_context"
    return "validate" if state.get("pending") else "verify"


def after_validate(
    state: RunState,
) -> Literal["approval", "execute", "validate", "compile_context"]:
    if state.get("cancel_requested"):
        return "compile_context"  # a run cancelled while waiting for approval stops there
    verdicts = {c.verdict for c in pending_of(state)}
    if CallVerdict.NEEDS_APPROVAL in verdicts:
        return "approval"
    if CallVerdict.READY in verdicts:
        return "execute"
    if None in verdicts:
        return "validate"  # a program's first call, committed with the program, unchecked
    return "compile_context"


def after_execute(
    state: RunState,
) -> Literal["reconcile", "handoff", "validate", "compile_context"]:
    if state.get("phase") == Phase.RECONCILING:
        return "reconcile"
    if program_running(state) and not state.get("stop_reason"):
        return "validate"  # the program goes on with its call's answer
    handed_off = any(
        c.verdict is CallVerdict.DONE and handoff_target(c.tool) for c in pending_of(state)
    )
    return "handoff" if handed_off and not state.get("stop_reason") else "compile_context"


def after_reconcile(state: RunState) -> Literal["validate", "compile_context"]:
    """A program whose write's outcome was unknown goes on once reconcile settled it; the gate
    (in compile_context) first, if anything else is unresolved or the run is stopping."""
    if (
        program_running(state)
        and state.get("phase") == Phase.READY
        and not (state.get("cancel_requested") or state.get("stop_reason"))
    ):
        return "validate"
    return "compile_context"


def after_verify(state: RunState) -> Literal["compile_context", "__end__"]:
    return "__end__" if state.get("stop_reason") == StopReason.COMPLETED else "compile_context"


Route = Callable[[RunState], str]


def routed(
    node: Node, route: Route, names: Mapping[str, str] | None = None
) -> Callable[..., Command[str]]:
    """`node`, then where the run goes from there (`route`, its answer renamed by `names`),
    decided on the state its update leaves. The routes read only channels an update replaces
    (phase, stop reason, pending calls, cancel flag), never the appended ones (history,
    evidence, journal), so the update laid over the state is that state."""

    def run(state: RunState, runtime: Runtime[RunContext]) -> Command[str]:
        update = node(state, runtime)
        goto = route(cast(RunState, {**state, **update}))
        return Command(update=update, goto=names.get(goto, goto) if names else goto)

    return run


def loop_node(name: str, node: Node) -> Node:
    """`node` in its span, its update less the writes that would change nothing
    (`core.state.changes`): the span records what the step commits."""

    def changes_only(state: RunState, runtime: Runtime[RunContext]) -> dict[str, Any]:
        return changes(state, node(state, runtime))

    return traced_node(name, functools.wraps(node)(changes_only))


def build_graph(*, with_handoff: bool = True) -> StateGraph[RunState, RunContext]:
    """The loop. With `with_handoff`, a handoff call passes the run to the specialist subgraph:
    the same loop, run by the agent that now owns the run, on the same state (journal, budget,
    history), to the run's end. The specialist itself does not hand off again."""
    builder = StateGraph(RunState, context_schema=RunContext)

    def add(
        name: str,
        node: Node,
        route: Route,
        to: tuple[str, ...],
        names: Mapping[str, str] | None = None,
    ) -> None:
        builder.add_node(name, routed(loop_node(name, node), route, names), destinations=to)

    add("guard", guard, after_guard, ("compile_context", "reconcile", END))
    add(
        "compile_context",
        compile_context,
        after_compile_context,
        ("model_step", "validate", "reconcile", END),
    )
    add("model_step", model_step, after_model_step, ("validate", "verify", "compile_context"))
    add(
        "validate",
        validate,
        after_validate,
        ("approval", "execute", "validate", "compile_context"),
    )
    builder.add_node("approval", loop_node("approval", approval))
    add("reconcile", reconcile, after_reconcile, ("validate", "compile_context"))
    add("verify", verify, after_verify, ("compile_context", END))
    builder.add_edge(START, "compile_context")
    builder.add_edge("approval", "validate")
    if with_handoff:
        builder.add_node("handoff", loop_node("handoff", handoff))
        specialist = build_graph(with_handoff=False).compile(name=SPECIALIST_NODE)
        builder.add_node(SPECIALIST_NODE, specialist)
        builder.add_edge("handoff", SPECIALIST_NODE)
        builder.add_edge(SPECIALIST_NODE, END)
        add(
            "execute",
            execute,
            after_execute,
            ("reconcile", "handoff", "validate", "compile_context"),
        )
    else:
        add(
            "execute",
            execute,
            after_execute,
            ("reconcile", "validate", "compile_context"),
            {"handoff": "compile_context"},
        )
    return builder


Compiled = CompiledStateGraph[RunState, RunContext, RunState, RunState]


def compile_graph(checkpointer: BaseCheckpointSaver | None = None) -> Compiled:
    """The loop, compiled, its checkpoints kept by `checkpointer`. Building and compiling it
    costs 10-20 ms of CPU, more than opening the rest of a runner: that is done once per
    process, and each caller gets a copy that holds its own checkpointer (`Pregel.copy`, as
    the LangGraph server gives each run its own), sharing the nodes, which hold no state."""
    return _compiled().copy(update={"checkpointer": checkpointer})


@functools.cache
def _compiled() -> Compiled:
    return build_graph().compile(name="loopwright")
