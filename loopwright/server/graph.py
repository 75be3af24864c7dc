"""The graph the server runs (langgraph.json `graphs.loopwright`): loopwright's graph, served.

`ServedGraph` is the compiled loopwright graph with one method replaced: `astream`, through which
every server run goes (`ainvoke` and `astream_events` call it too). LangGraph's server and Aegra
both take the graph object, copy it with their checkpointer and call `astream(input, config,
context=..., durability=..., stream_mode=...)`. A served run is one attempt of the protocol the
CLI's `Runner` follows (`loopwright.attempt`), in a thread of its own:

1. the principal is the user the server authenticated (`configurable.langgraph_auth_user`),
   never the run input or the client's context, and the input is reduced to what a client may
   ask (`server.inputs`);
2. the run's lease is claimed, or taken as a new run is registered (one writer per run, whatever
   the server does: Aegra does not keep one run per thread, and a re-queued run may race its
   first attempt);
3. the graph is streamed synchronously with `durability="sync"` and a saver fenced with the
   lease's token (a new thread in LangGraph's own layout, which the server's stock readers
   read, see `checkpoints.compact`), with a `RunContext` built here, and the chunks the server
   asked for are handed back to it;
4. where the run stands is recorded in lw_runs and the lease released; an attempt that failed
   is counted on the run, which ends typed after as many failures in a row as a CLI run's.

Running the sync stream in a thread (rather than the server's async stream) is what makes a
server-side stop safe. When the server stops a run it stops consuming our stream; a node may be
in the middle of sending a write, and an abandoned node thread would race anything started
after it. So the node always finishes, and then:

* a user's cancel (LangGraph's `runs.cancel`; Aegra's cancel endpoints) sets loopwright's own
  cancel flag (lw_runs; the run's next node sees it, read at each commit's fence check, as
  `RunContext.cancel_requested`) and waits for the run's typed end: guard settles writes in flight by reconciliation, then stops the run with
  `cancelled`;
* any other stop (the server shutting down or losing its own lease on the run) only pauses the
  run at the next step boundary, as a crash there would: the run is not cancelled, and the
  server's re-delivery continues it from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot
from pydantic import BaseModel, create_model

from loopwright._agent import TaskRefused
from loopwright.attempt import Claim, attempt, worker_name
from loopwright.checkpoints.compact import Layout
from loopwright.checkpoints.database import pooled
from loopwright.checkpoints.decision_claims import DecisionClaims
from loopwright.checkpoints.factory import fenced_saver
from loopwright.checkpoints.leases import SERVER_ENGINE, Lease
from loopwright.checkpoints.writers import ANSWER, RESUME, START
from loopwright.core.state import Phase, Principal, RunState
from loopwright.core.text import InvalidText
from loopwright.graph.build import RUN_DURABILITY, compile_graph
from loopwright.nodes.context import RunContext
from loopwright.observability.metrics import note_run_end
from loopwright.runner import OtherAgentsRun, UnknownRun, writer_version
from loopwright.server.chunks import DumpedHistory
from loopwright.server.inputs import (
    Continue,
    NewRun,
    Resume,
    RunRefused,
    RunRequest,
    parse_request,
    payload_for,
    principal_for_task,
    principal_of_user,
)
from loopwright.server.resources import ServerResources, aresources, host

log = logging.getLogger(__name__)

# How long a cancelled run may take to reach its typed end before the server is told it stopped
# (the run still gets there: its thread goes on).
CANCEL_SETTLE_S = 60.0
# How long a run handed back (a shutdown) may take to reach its next step boundary and give up
# its lease: a node always finishes (a write in flight is settled), so this is one step's time.
PAUSE_SETTLE_S = 30.0
INPUT_SCHEMA: dict[str, Any] = {
    "title": "LoopwrightRun",
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "title": "Task",
            "description": "What to do, in words (the agent decides what it may touch).",
        }
    },
    "required": ["task"],
}


def where_it_stands(snapshot: StateSnapshot) -> tuple[str, datetime | None]:
    """The phase to record in lw_runs, and when a parked reconciliation is due (as the CLI does)."""
    kinds = {i.value.get("kind"): i.value for i in snapshot.interrupts if isinstance(i.value, dict)}
    if "approval" in kinds:
        return Phase.WAITING_APPROVAL.value, None
    if "reconcile_wait" in kinds:
        waits = [
            i.value["retry_at"]
            for i in snapshot.interrupts
            if isinstance(i.value, dict) and i.value.get("kind") == "reconcile_wait"
        ]
        return Phase.RECONCILING.value, datetime.fromisoformat(min(waits))
    return str((snapshot.values or {}).get("phase", Phase.READY.value)), None


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_END = object()
_NO_CONFIG = create_model("LoopwrightConfig")


class ServedGraph(CompiledStateGraph[RunState, RunContext, RunState, RunState]):
    """The loopwright graph as the LangGraph server and Aegra run it; see the module docstring."""

    @classmethod
    def build(cls) -> ServedGraph:
        compiled = compile_graph()
        return cls(**{k: v for k, v in compiled.__dict__.items() if k != "__orig_class__"})

    async def aget_state_history(
        self,
        config: RunnableConfig,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AsyncIterator[StateSnapshot]:
        """LangGraph's history; `metadata` is what Aegra calls its history request's `filter`
        (passed under that name, LangGraph's own would refuse the call)."""
        async for snapshot in super().aget_state_history(
            config, filter=filter or metadata, before=before, limit=limit
        ):
            yield snapshot

    def get_input_jsonschema(self, config: RunnableConfig | None = None) -> dict[str, Any]:
        """What a client sends to start a run (Studio builds its input form from this)."""
        return INPUT_SCHEMA

    def get_context_jsonschema(self) -> dict[str, Any] | None:
        """No client context is taken: servers drop context keys this schema does not name."""
        return {"title": "LoopwrightContext", "type": "object", "properties": {}}

    def config_schema(self, *, include: Sequence[str] | None = None) -> type[BaseModel]:
        """No client configuration either (the run context's live objects have no schema)."""
        return _NO_CONFIG

    async def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        context: Any = None,
        stream_mode: Any = None,
        durability: Any = None,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        del context, durability  # never the client's: the run context and "sync" are ours
        # Nor where the run pauses: only where it asks a person (the auth hook refuses these).
        kwargs.pop("interrupt_before", None)
        kwargs.pop("interrupt_after", None)
        res = await aresources()
        run_config = _run_config(config)
        thread_id = str(run_config["configurable"]["thread_id"])
        principal = principal_of_user(run_config["configurable"].get("langgraph_auth_user"))
        request = parse_request(input, principal, roles=res.agent.roles)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        finished: asyncio.Future[None] = loop.create_future()
        pause = threading.Event()

        def emit(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                self._advance(
                    res, thread_id, request, principal, run_config, stream_mode, kwargs, emit, pause
                )
            except BaseException as exc:
                emit(_Failed(exc))
            finally:
                # Before the engine hears the run ended: a decision right after is admitted.
                try:
                    _ended(res, thread_id, request)
                finally:
                    emit(_END)
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_resolve, finished)

        res.admissions.started(thread_id)
        threading.Thread(target=work, name=f"loopwright-run-{thread_id}", daemon=True).start()
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        except BaseException as stopped:
            if not finished.done():
                if is_user_cancel(stopped, _server_run_id(run_config)):
                    await _cancel_and_settle(res, thread_id, finished)
                else:
                    # Handed back (a shutdown, a lost engine lease): the run stops at its next
                    # step boundary and gives its lease up before the engine re-queues it, so
                    # another instance takes it at once, not after the lease's time to live.
                    pause.set()
                    await _settled(thread_id, finished, PAUSE_SETTLE_S)
            raise

    def _advance(
        self,
        res: ServerResources,
        run_id: str,
        request: RunRequest,
        principal: Principal | None,
        config: RunnableConfig,
        stream_mode: Any,
        stream_kwargs: dict[str, Any],
        emit: Callable[[Any], None],
        pause: threading.Event,
    ) -> None:
        """Steps 2-4 of the module docstring, in the run's own thread."""
        owner = worker_name()
        lease: Lease | None = None
        try:
            if isinstance(request, NewRun) and principal is not None:
                principal = principal_for_task(res.agent, res.runner.deps, principal, request.task)
                # A new run is registered leased to this attempt; one registered before is
                # claimed.
                _, lease = res.runner.begin(
                    run_id, request.task, principal, owner, res.lease_ttl_s, engine=SERVER_ENGINE
                )
            else:
                res.runner.owned(run_id)
        except (TaskRefused, InvalidText, OtherAgentsRun) as exc:
            raise RunRefused(str(exc)) from None
        except UnknownRun:
            pass  # nothing registered: payload_for says there is no run to continue
        # A dead owner's lease is waited out (it expires after its time to live), no longer.
        how = Claim(owner, res.lease_ttl_s, res.agent.version, wait_s=res.lease_ttl_s + 1)
        with (
            pooled(res.run_connections, res.database_url) as conn,
            attempt(
                res.leases,
                run_id,
                # A new thread in LangGraph's layout: the server's own reads (its API, Studio)
                # and Aegra's are the stock saver's.
                graph=self.copy(update={"store": None}),
                saver=fenced_saver(conn, new_threads=Layout.STOCK),
                how=how,
                lease=lease,
                kind=_KINDS[type(request)],
                not_the_runs=(RunRefused,),
            ) as turn,
        ):
            # Each checkpoint names its writer, whatever the client's metadata says.
            run_config = turn.config({**config, "recursion_limit": 10_000})
            before = turn.graph.get_state(run_config)
            payload = payload_for(request, before, run_id, principal, turn.watch.now())
            context = turn.context(served_context(res, run_id, request, principal))
            ready = DumpedHistory(stream_mode)
            for chunk in turn.graph.stream(
                payload,
                run_config,
                context=context,
                durability=RUN_DURABILITY,
                stream_mode=stream_mode,
                **stream_kwargs,
            ):
                emit(ready(chunk))
                if pause.is_set():
                    break  # a step boundary: what ran is committed
            after = turn.graph.get_state(run_config)
            phase, next_attempt_at = where_it_stands(after)
            # The version that wrote the last step: not this attempt's where it found nothing
            # left to do (the engine handing a finished run out again).
            turn.record(phase, next_attempt_at, writer_version(after))
            note_run_end(before.values or {}, after.values or {})


def _ended(res: ServerResources, thread_id: str, request: RunRequest) -> None:
    """An attempt's end as the edge's records see it: a decision's claims given up (one the
    run did not take holds nobody off), then the thread's admission."""
    try:
        if isinstance(request, Resume):
            DecisionClaims(res.leases.db).released(thread_id)
    finally:
        res.admissions.ended(thread_id)


# What a served attempt was given, as `runner.advance_kind` names it.
_KINDS: dict[type[Any], str] = {NewRun: START, Resume: ANSWER, Continue: RESUME}


def served_context(
    res: ServerResources,
    run_id: str,
    request: RunRequest,
    user: Principal | None,
) -> RunContext:
    """The CLI's run context for this run, with the trust decisions the server's auth made.

    The principal (`user`, scoped to the task for a new run) is only given for a new run (guard
    fixes it on the first step; afterwards it is the run's, in state). A decision counts only
    if it comes from the authenticated user of this server run, whose identity holds a role the
    agent's `Roles` grants deciding by, and who is an approver by the agent's own rule.
    """
    context = res.runner.context(run_id, 0)  # the attempt's fence: `Turn.context`
    directory = context.is_approver

    def is_approver(user_id: str) -> bool:
        return (
            user is not None
            and user_id == user.user_id
            and res.agent.roles.grants("decide", user.roles)
            and directory(user_id)
        )

    principal = user if isinstance(request, NewRun) else None
    return dataclasses.replace(context, principal=principal, is_approver=is_approver)


def _run_config(config: RunnableConfig | None) -> RunnableConfig:
    """The server's config, checked, without the server's own checkpointer (ours is fenced)."""
    configurable = dict((config or {}).get("configurable") or {})
    if not configurable.get("thread_id"):
        raise ValueError("a loopwright run is a thread: the config names no thread_id")
    if configurable.get("checkpoint_id") or configurable.get("checkpoint_ns"):
        # A chosen checkpoint, or another namespace (an empty state to start over in), would
        # read a history other than the run's own: refused, whoever's auth let it through.
        raise PermissionError("a run continues from its own latest checkpoint, not a chosen one")
    configurable.pop(CONFIG_KEY_CHECKPOINTER, None)
    return {**(config or {}), "configurable": configurable}


def _server_run_id(config: RunnableConfig) -> str | None:
    run_id = config.get("run_id") or config["configurable"].get("run_id")
    return str(run_id) if run_id else None


# The reasons Aegra records before it cancels a run for its own sake (not a user's cancel).
_AEGRA_INFRA_STOPS = (
    "_lease_loss_cancellations",
    "_shutdown_cancellations",
    "_timeout_cancellations",
)


def is_user_cancel(stopped: BaseException, server_run_id: str | None) -> bool:
    """Whether the server stopped the run because someone cancelled it.

    LangGraph's server cancels with its `UserInterrupt` / `UserRollback` as the reason. Aegra
    cancels plainly, but notes its own reasons (shutdown, a lost worker lease, a timeout) in
    module-level sets first. Anything else is not taken for a cancel.
    """
    if not isinstance(stopped, asyncio.CancelledError):
        return False
    reasons = {type(arg).__name__ for arg in stopped.args if isinstance(arg, BaseException)}
    if reasons & {"UserInterrupt", "UserRollback"}:
        return True
    aegra = sys.modules.get("aegra_api.services.run_executor")
    if aegra is None or server_run_id is None:
        return False
    return not any(server_run_id in getattr(aegra, name, ()) for name in _AEGRA_INFRA_STOPS)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _cancel_and_settle(
    res: ServerResources, run_id: str, finished: asyncio.Future[None]
) -> None:
    """The server stopped the run: ask loopwright's run to stop, and wait for its typed end,
    both through any further cancel of the waiting task (as `_settled`)."""
    deadline = asyncio.get_running_loop().time() + CANCEL_SETTLE_S
    asked = asyncio.ensure_future(asyncio.to_thread(res.leases.request_cancel, run_id))
    if not await _outlasted(asked, deadline):
        log.warning("run %s: stopped by the server; its cancel is still being asked", run_id)
        return
    if asked.exception() is not None:
        log.error("run %s: could not request the cancel", run_id, exc_info=asked.exception())
        return
    if not await _outlasted(finished, deadline):
        log.warning("run %s: stopped by the server; it reaches its end on its own", run_id)


async def _settled(run_id: str, finished: asyncio.Future[None], timeout_s: float) -> None:
    """Wait (at most `timeout_s`) for the run's thread to stop and release its lease, however
    often the waiting task is cancelled meanwhile: an engine shutting down may cancel it again
    (a lost worker lease, its own deadline), and a process that exits while a run's thread is
    mid-step leaves that run's lease live, so no other instance takes the run until it lapses.
    The caller raises what stopped the run once this returns."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    if not await _outlasted(finished, deadline):
        log.warning("run %s: stopped by the server; it reaches its next step on its own", run_id)


async def _outlasted(future: asyncio.Future[Any], deadline: float) -> bool:
    """Whether `future` was done by `deadline` (the loop's clock), waited for through any
    number of cancels of the waiting task (each only ends one wait: the caller is already
    stopping, and what it waits for is what it must not leave half done)."""
    loop = asyncio.get_running_loop()
    while not future.done():
        try:
            await asyncio.wait_for(asyncio.shield(future), max(deadline - loop.time(), 0))
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            continue
        except Exception:
            break  # done, with an error: the caller reads it
    return True


graph = ServedGraph.build()


def graph_for(agent: str) -> ServedGraph:
    """The graph to name in a langgraph.json for the agent at `agent` ("module:attribute"):

        # myapp/served.py, named in langgraph.json as "graphs": {"myapp": "myapp/served.py:graph"}
        from loopwright.server.graph import graph_for
        graph = graph_for("myapp.agents:agent")

    The loop is the same for every agent; this names the agent the server process hosts (its
    tools, rules, model and dependencies), as `LOOPWRIGHT_AGENT` would. One per process."""
    host(agent)
    return graph
